"""`daop-agent run`: the agent itself (what the systemd unit starts)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import replace

from agent.config import CALIBRATIONS, PROTOCOLS, STATE_DIR_HELP, load_config, option, parse_broker_url
from agent.local_broker import DEFAULT_PORT, LocalBroker
from agent.mosquitto import port_in_use
from agent.mqtt_link import max_packet_bytes
from agent.progress import setup_logging
from monitors.errors import BadInput

HELP = "Run the agent: device monitors and the MQTT API (what the systemd unit starts)."


def default(name: str) -> str:
    """A key's declared default, as its flag's help shows it."""
    return str(option(name).default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML configuration (see examples/agent.toml)")
    p.add_argument("--broker", metavar="URL", action="append",
                   help="mqtt://[user:pass@]host[:port] or mqtts://...; repeat it for a cluster's nodes: after a loss "
                        "the agent connects to the next one")
    p.add_argument("--protocol", choices=PROTOCOLS,
                   help=f"MQTT version (default {default('broker.protocol')}; 3.1.1 for brokers without v5)")
    p.add_argument("--session-expiry", metavar="S", type=int,
                   help=f"keep the agent's MQTT session on the broker S seconds after a loss "
                        f"(default {default('broker.session_expiry_s')}; 0: clean)")
    p.add_argument("--device-id", metavar="ID",
                   help=f"topic base daop/<ID>/ (default: {option('agent.device_id').unset})")
    p.add_argument("--state-dir", metavar="DIR", help=f"monitors, calibration, the private broker's files "
                                                      f"({STATE_DIR_HELP})")
    p.add_argument("--sysfs-root", metavar="DIR", help=f"read DIR instead of {default('agent.sysfs_root')}")
    p.add_argument("--procfs-root", metavar="DIR", help=f"read DIR instead of {default('agent.procfs_root')}")
    p.add_argument("--sample-interval", metavar="S", type=float,
                   help=f"seconds between device samples (default {default('agent.sample_interval_s')})")
    p.add_argument("--local-broker", metavar="PORT", nargs="?", type=int, const=DEFAULT_PORT,
                   help=f"start a private Mosquitto on 127.0.0.1:PORT (default {DEFAULT_PORT}) for the agent and stop "
                        "it on exit")
    p.add_argument("--web-port", metavar="PORT", type=int,
                   help="with --local-broker: MQTT over WebSockets for web pages on 127.0.0.1:PORT, password "
                        f"required (default: the broker's port + 1, {DEFAULT_PORT + 1}; 0: none); see daop-agent "
                        "web-credentials")
    p.add_argument("--calibration", choices=CALIBRATIONS,
                   help=f"default {default('agent.calibration')}. full: a quick calibration found at start is redone "
                        "in full in the background; quick: serve on a quick one as it is (and make a quick one "
                        "where there is none)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, {
        "broker": args.broker, "protocol": args.protocol, "session_expiry_s": args.session_expiry,
        "device_id": args.device_id, "state_dir": args.state_dir,
        "sysfs_root": args.sysfs_root, "procfs_root": args.procfs_root,
        "sample_interval_s": args.sample_interval, "local_broker": args.local_broker is not None or None,
        "web_port": args.web_port, "calibration": args.calibration,
    })
    if args.web_port is not None and not cfg.local_broker:
        raise BadInput("--web-port needs --local-broker; to serve web pages through your own broker, give it a "
                       "websockets listener (docs/web.md)")
    setup_logging(args.log_level)
    from agent.service import run_agent  # noqa: PLC0415 - the service's imports (aiomqtt, the probes) only for `run`

    try:
        cfg.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = cfg.state_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise BadInput(f"state dir {cfg.state_dir} is not writable: {exc.strerror or exc}") from None
    broker = None
    if cfg.local_broker:

        log = logging.getLogger("daop-agent")
        port = args.local_broker or DEFAULT_PORT
        web_port = port + 1 if cfg.web_port is None else cfg.web_port
        if cfg.web_port is None and (web_port > 65535 or port_in_use(web_port)):  # a taken default: no web, still run
            log.warning("port %d on 127.0.0.1 is not free: no WebSockets listener for web pages "
                        "(pick a port with --web-port)", web_port)
            web_port = 0
        broker = LocalBroker(cfg.state_dir, port, web_port=web_port or None, device_id=cfg.device_id,
                             max_packet=max_packet_bytes(cfg.limits.max_request_bytes))
        broker.start()
        cfg = replace(cfg, brokers=(parse_broker_url(broker.url),))
        log.info("private broker at %s (try: daop-agent monitor MODEL --tier good --broker %s --device-id %s)",
                 broker.url, broker.url, cfg.device_id)
        if broker.web_url:
            log.info("web pages: %s, password required (daop-agent web-credentials --state-dir %s)",
                     broker.web_url, cfg.state_dir)
    try:
        return asyncio.run(run_agent(cfg))
    finally:
        if broker is not None:
            broker.stop()
