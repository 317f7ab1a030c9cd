"""`daop-agent files [NAME]`: where the installed package keeps its scenarios, examples and systemd unit."""

from __future__ import annotations

import argparse
from pathlib import Path

from monitors.errors import BadInput

HELP = ("Print the path of a file the package carries (scenarios/, examples/, systemd/, webextension/), "
        "or list them all.")
SHARE = Path(__file__).resolve().parent.parent / "share"  # links to the checkout's folders; files in a wheel


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="e.g. systemd/daop-agent.service or scenarios/laptop-heats-up.toml (default: list them all)")


def packaged() -> list[str]:
    """Every file the package carries, as FOLDER/NAME."""
    return sorted(str(p.relative_to(SHARE)) for p in SHARE.glob("*/*") if p.is_file())


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        for name in packaged():
            print(SHARE / name)
        return 0
    if args.name not in packaged():
        raise BadInput(f"no packaged file {args.name!r}; daop-agent files lists them")
    print(SHARE / args.name)
    return 0
