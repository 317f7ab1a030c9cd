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


def named_command(argv: Sequence[str]) -> str | None:
    """The command the arguments name (the first that is not an option: the top level has no option with a
    value), or None."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given `command`, only that command's module is imported (the others' parsers stay bare), so
    that `daop-agent run` does not load what `estimate` or `simulate` need (the graph importers, onnx)."""
    parser = _Parser(prog="daop-agent", description="Dynamic AI Offloading Protocol agent for this device.")
    parser.add_argument("--version", action="version", version=f"daop-agent {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        if command is not None and name != command:
            sub.add_parser(name)
            continue
        module = importlib.import_module(f"agent.commands.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(named_command(argv)).parse_args(argv)
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
