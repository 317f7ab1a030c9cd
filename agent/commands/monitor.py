"""`daop-agent monitor MODEL --tier TIER`: register a monitor with a running agent and print its events."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from monitors.errors import BadInput
from monitors.tiers import TIER_NAMES

HELP = "Register a monitor with a running agent and print its change events until interrupted."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a .onnx, .webnn or .json (webnn-graph-json) model")
    p.add_argument("--tier", required=True, choices=TIER_NAMES, help="the required tier")
    p.add_argument("--broker", metavar="URL", default="mqtt://localhost:1883",
                   help="mqtt://[user:pass@]host[:port] or mqtts://... (default mqtt://localhost:1883)")
    p.add_argument("--device-id", metavar="ID", help="the agent's device id (default: this hostname)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=1x3x224x224[:float32]",
                   help="bind an input's shape (and data type); repeat for several inputs")
    p.add_argument("--monitor", metavar="ID", help="the monitor's id (default: a random one)")
    p.add_argument("--keep", action="store_true", help="leave the monitor registered on exit")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.add_argument("--timeout", metavar="S", type=float, default=60.0, help="wait this long for the agent's answer")


def run(args: argparse.Namespace) -> int:
    from monitors.importer import parse_input_spec

    inputs = dict(parse_input_spec(text) for text in args.input)
    path = Path(args.model)
    if path.suffix.lower() not in (".onnx", ".webnn", ".json"):
        raise BadInput(f"{path}: a model is .onnx, .webnn or .json")
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    try:
        return asyncio.run(_monitor(args, path, inputs))
    except KeyboardInterrupt:
        return 0


def _print(args: argparse.Namespace, obj: dict, text: str) -> None:
    print(json.dumps(obj) if args.json else text, flush=True)


async def _monitor(args: argparse.Namespace, path: Path, inputs: dict) -> int:
    import aiomqtt

    from agent.client import DaopClient, DaopError

    try:
        async with DaopClient(args.broker, args.device_id, timeout_s=args.timeout) as daop:
            try:
                monitor = await daop.create_monitor(path, args.tier, monitor=args.monitor, inputs=inputs)
            except DaopError as exc:
                raise BadInput(f"the agent refused the monitor: {exc.message} ({exc.code})") from None
            _print(args, {"monitor": monitor.id, "requiredTier": args.tier, "meetsRequirement": monitor.meets},
                   f"monitor {monitor.id} on {daop.device_id}: {args.tier} "
                   f"{'met' if monitor.meets else 'NOT met'}; waiting for changes (Ctrl-C to stop)")
            try:
                async for event in monitor:
                    _print(args, {"monitor": event.monitor, "meetsRequirement": event.meets, "seq": event.seq,
                                  "ts": event.ts},
                           f"{event.ts or ''} seq {event.seq}: {args.tier} {'met' if event.meets else 'NOT met'}")
            except asyncio.CancelledError:
                pass
            finally:
                if not args.keep:
                    try:
                        await asyncio.wait_for(asyncio.shield(monitor.delete()), 5)
                    except (DaopError, TimeoutError, aiomqtt.MqttError, asyncio.CancelledError):
                        print(f"daop-agent monitor: could not delete monitor {monitor.id}", file=sys.stderr)
    except aiomqtt.MqttError as exc:
        raise BadInput(f"cannot reach the broker {args.broker}: {exc}") from None
    except OSError as exc:
        raise BadInput(f"{exc}") from None
    return 0
