"""`daop-agent simulate SCENARIO`: the real agent on a simulated device, along a scenario's timeline."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from agent.commands.files import SHARE, packaged
from agent.config import default_state_dir
from agent.simulation.report import format_record
from agent.simulation.runner import run_scenario
from agent.simulation.scenario import load_scenario

HELP = "Run the real agent on a simulated device along a scenario (TOML) and check the events it expects."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario file (TOML), or the name of a packaged one (laptop-heats-up: "
                                          "daop-agent files lists them); see docs/simulate.md")
    p.add_argument("--broker", metavar="URL", help="use this broker instead of a private Mosquitto")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="run the timeline X times faster (the agent's dwell and rate limits are not scaled)")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    p.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                   help="where this host's CPU calibration is kept (read only; copied for the run)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="the agent's log on stderr (default: warnings only)")


def run(args: argparse.Namespace) -> int:
    path = Path(args.scenario)
    if not path.exists() and f"scenarios/{args.scenario}.toml" in packaged():  # a packaged one, by name
        path = SHARE / "scenarios" / f"{args.scenario}.toml"
    scenario = load_scenario(path)  # a malformed file: BadInput, exit 2
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("mqtt").setLevel(logging.WARNING)

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record) if args.json else format_record(record), flush=True)

    state_dir = args.state_dir or default_state_dir()
    outcome = asyncio.run(run_scenario(scenario, emit=emit, broker=args.broker, speed=args.speed,
                                       calibration_from=state_dir))
    return 0 if outcome.passed else 1
