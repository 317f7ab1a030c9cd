"""`daop-agent monitor MODEL --tier TIER`: register a monitor with a running agent and print its events.

It talks to what `./run.sh` serves unless told otherwise (`--broker`, `$DAOP_BROKER`; device id: the host
name, as the agent's). A lost broker is said on stderr and reconnected to (the monitor lives on the agent
meanwhile, and a change made while away is printed once back); Ctrl-C and SIGTERM delete the monitor (unless
`--keep`) before exiting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import aiomqtt

from daop_client import DaopClient, DaopError, Monitor, default_broker
from daop_client.address import DEFAULT_BROKER
from monitors.errors import BadInput
from monitors.graphs.importer import parse_input_spec
from monitors.pricing.tiers import TIER_NAMES
from monitors.requirements import Requirement

HELP = "Register a monitor with a running agent and print its change events until interrupted."
DELETE_WAIT_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a .onnx, .webnn or .json (webnn-graph-json) model")
    need = p.add_argument_group("the requirement (a tier, or a rate and/or a deadline)")
    need.add_argument("--tier", choices=TIER_NAMES, help="the required tier")
    need.add_argument("--rate", metavar="HZ", type=float, help="runs a second the device must sustain")
    need.add_argument("--deadline-ms", metavar="MS", type=float, help="the bound on one run, in milliseconds")
    p.add_argument("--broker", metavar="URL", default=None,
                   help=f"mqtt://[user:pass@]host[:port] or mqtts://... (default: $DAOP_BROKER, else "
                        f"{DEFAULT_BROKER}, what ./run.sh serves)")
    p.add_argument("--device-id", metavar="ID",
                   help="the agent's device id (default: this host's name, as the agent's)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=1x3x224x224[:float32]",
                   help="bind an input's shape (and data type); repeat for several inputs")
    p.add_argument("--prompt-tokens", type=int, metavar="N",
                   help="an LLM: monitor a whole generation after a prompt of N tokens (instead of --input)")
    p.add_argument("--output-tokens", type=int, metavar="N", default=1, help="... answering N tokens (default 1)")
    p.add_argument("--monitor", metavar="ID", help="the monitor's id (default: a random one)")
    p.add_argument("--running", action="store_true",
                   help="say that the app runs this model here now (at --rate), so that its own run is not read as "
                        "contention against it")
    p.add_argument("--pid", metavar="PID", type=int,
                   help="with --running: the app's process, whose own CPU is then measured (default: none given; the "
                        "agent then counts the share its --rate takes)")
    p.add_argument("--keep", action="store_true", help="leave the monitor registered on exit")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.add_argument("--timeout", metavar="S", type=float, default=60.0, help="wait this long for the agent's answer")


def run(args: argparse.Namespace) -> int:
    if args.tier is None and args.rate is None and args.deadline_ms is None:
        raise BadInput("give the requirement: --tier, or --rate and/or --deadline-ms")
    if args.tier is not None and (args.rate is not None or args.deadline_ms is not None):
        raise BadInput("--tier goes alone, without --rate or --deadline-ms")
    if args.pid is not None and not args.running:
        raise BadInput("--pid goes with --running")
    inputs = dict(parse_input_spec(text) for text in args.input)
    path = Path(args.model)
    if path.suffix.lower() not in (".onnx", ".webnn", ".json"):
        raise BadInput(f"{path}: a model is .onnx, .webnn or .json")
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    try:
        client = DaopClient(args.broker or default_broker(), args.device_id, timeout_s=args.timeout,
                            on_connection=_tell)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return asyncio.run(_main(args, client, path, inputs))


def _tell(what: str, detail: str) -> None:
    """The connection's news, on stderr (stdout stays the monitor's values)."""
    text = {"lost": f"lost the broker {detail}; reconnecting",
            "reconnected": f"reconnected to {detail}",
            "offline": f"the agent of device {detail} went offline (its monitor stays registered there)",
            "online": f"the agent of device {detail} is online"}[what]
    print(f"daop-agent monitor: {text}", file=sys.stderr, flush=True)


def _requirement(args: argparse.Namespace) -> str:
    if args.tier is not None:
        return str(args.tier)
    parts = [f"{args.rate:g} Hz"] if args.rate is not None else []
    if args.deadline_ms is not None:
        parts.append(f"{args.deadline_ms:g} ms")
    return " within ".join(parts)


def _print(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    print(json.dumps(obj) if args.json else text, flush=True)


async def _main(args: argparse.Namespace, client: DaopClient, path: Path, inputs: dict[str, Any]) -> int:
    """Runs until Ctrl-C or SIGTERM (both end it cleanly, the monitor deleted)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await _monitor(args, client, path, inputs)
    except asyncio.CancelledError:
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _monitor(args: argparse.Namespace, client: DaopClient, path: Path, inputs: dict[str, Any]) -> int:
    requirement = _requirement(args)
    try:
        await client.__aenter__()
    except (aiomqtt.MqttError, OSError) as exc:
        raise BadInput(f"cannot reach the broker {client.address.url}: {exc}") from None
    monitor: Monitor | None = None
    try:
        try:
            generation = None if args.prompt_tokens is None else (args.prompt_tokens, args.output_tokens)
            monitor = await client.create_monitor(path, args.tier, args.monitor, inputs, rate=args.rate,
                                                  deadline_ms=args.deadline_ms, generation=generation)
            if args.running:
                await monitor.running(args.rate, args.pid)
        except DaopError as exc:
            what = "the agent refused the monitor" if monitor is None and exc.code not in (
                "timeout", "no_agent", "offline", "disconnected") else "no monitor"
            hint = "; bind inputs with --input NAME=DIMS" if exc.code == "bad_inputs" else ""
            raise BadInput(f"{what}: {exc.message} ({exc.code}){hint}") from None
        _print(args, {"monitor": monitor.id, **_fields(args), "meetsRequirement": monitor.meets},
               f"monitor {monitor.id} on {client.device_id}: {requirement} "
               f"{'met' if monitor.meets else 'NOT met'}; waiting for changes (Ctrl-C to stop)")
        async for event in monitor:
            _print(args, {"monitor": event.monitor, "meetsRequirement": event.meets, "seq": event.seq, "ts": event.ts},
                   f"{event.ts or '(while away)'} seq {event.seq}: {requirement} {'met' if event.meets else 'NOT met'}")
        return 0
    finally:
        if monitor is not None and not args.keep:
            await _delete(client, monitor)
        await client.__aexit__(None, None, None)


async def _delete(client: DaopClient, monitor: Monitor) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(monitor.delete()), DELETE_WAIT_S)
    except (DaopError, TimeoutError, aiomqtt.MqttError, asyncio.CancelledError) as exc:
        print(f"daop-agent monitor: could not delete monitor {monitor.id} ({exc or 'no answer'}); it stays "
              f"registered on {client.device_id}", file=sys.stderr)


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return Requirement(args.tier, args.rate, args.deadline_ms).to_json()

