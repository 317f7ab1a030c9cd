"""`daop-agent run`: the agent itself (what the systemd unit starts)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import replace

from agent.config import CALIBRATIONS, load_config, parse_broker_url
from monitors.errors import BadInput

HELP = "Run the agent: device monitors and the MQTT API (what the systemd unit starts)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML configuration (see examples/agent.toml)")
    p.add_argument("--broker", metavar="URL", help="mqtt://[user:pass@]host[:port] or mqtts://...")
    p.add_argument("--device-id", metavar="ID", help="topic base daop/<ID>/ (default: the hostname)")
    p.add_argument("--state-dir", metavar="DIR", help="monitors and calibration (default: $STATE_DIRECTORY "
                                                      "or ~/.local/state/daop-agent)")
    p.add_argument("--sysfs-root", metavar="DIR", help="read DIR instead of /sys")
    p.add_argument("--procfs-root", metavar="DIR", help="read DIR instead of /proc")
    p.add_argument("--sample-interval", metavar="S", type=float, help="seconds between device samples (default 1)")
    p.add_argument("--local-broker", metavar="PORT", nargs="?", type=int, const=18830,
                   help="start a private Mosquitto on 127.0.0.1:PORT (default 18830) for the agent and stop it on exit")
    p.add_argument("--calibration", choices=CALIBRATIONS,
                   help="full (default): a quick calibration found at start is redone in full in the background; "
                        "quick: serve on a quick one as it is (and make a quick one where there is none)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _setup_logging(level: str) -> None:
    # Under systemd the journal adds the time: keep lines short there.
    fmt = "%(levelname)s %(message)s" if os.environ.get("JOURNAL_STREAM") else \
        "%(asctime)s %(levelname)s %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)
    logging.getLogger("mqtt").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, {
        "broker": args.broker, "device_id": args.device_id, "state_dir": args.state_dir,
        "sysfs_root": args.sysfs_root, "procfs_root": args.procfs_root,
        "sample_interval_s": args.sample_interval, "local_broker": args.local_broker is not None or None,
        "calibration": args.calibration,
    })
    _setup_logging(args.log_level)
    from agent.service import Agent  # heavy imports only for this command

    try:
        cfg.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = cfg.state_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise BadInput(f"state dir {cfg.state_dir} is not writable: {exc.strerror or exc}") from None
    broker = None
    if cfg.local_broker:
        from agent.local_broker import DEFAULT_PORT, LocalBroker

        broker = LocalBroker(cfg.state_dir, args.local_broker or DEFAULT_PORT)
        broker.start()
        cfg = replace(cfg, broker=parse_broker_url(broker.url))
        logging.getLogger("daop-agent").info(
            "private broker at %s (try: daop-agent monitor MODEL --tier good --broker %s --device-id %s)",
            broker.url, broker.url, cfg.device_id)
    try:
        return asyncio.run(Agent(cfg).run())
    finally:
        if broker is not None:
            broker.stop()
