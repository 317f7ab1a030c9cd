"""`daop-agent`: one subcommand per module in agent/commands/.

Each command module (`web-credentials` lives in web_credentials.py) defines `HELP`, `add_arguments(parser)` and
`run(args) -> int`. Bad input anywhere becomes exit status 2 and one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from monitors.errors import BadInput

COMMANDS = ("estimate", "calibrate", "state", "run", "monitor", "simulate", "web-credentials", "web-bridge", "files")


def version() -> str:
    try:
        return importlib.metadata.version("daop-agent")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (argparse prints two)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="daop-agent", description="Dynamic AI Offloading Protocol agent for this device.")
    parser.add_argument("--version", action="version", version=f"daop-agent {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"agent.commands.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except BadInput as exc:
        hint = getattr(exc, "cli_hint", "")  # an input's shape to give: how, on the command line
        print(f"daop-agent {args.command}: error: {exc}{'; ' + hint if hint else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `daop-agent estimate --kernels | head`: the reader has gone, nothing to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return 141  # as a shell reports a command ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
