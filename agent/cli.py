"""`daop-agent`: one subcommand per module in agent/commands/.

Each command module defines `HELP`, `add_arguments(parser)` and
`run(args) -> int`. Bad input anywhere becomes exit status 2 and one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from monitors.errors import BadInput

COMMANDS = ("estimate", "calibrate", "state", "run", "monitor", "simulate")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (argparse prints two)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="daop-agent", description="Dynamic AI Offloading Protocol agent for this device.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"agent.commands.{name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except BadInput as exc:
        print(f"daop-agent {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
