"""`daop-agent web-bridge`: the browser extension's native messaging host, and the command that registers it.

    daop-agent web-bridge install [--browser chromium|chrome] [--broker URL] [--device-id ID]
    daop-agent web-bridge uninstall [--browser ...]
    daop-agent web-bridge host --broker URL --device-id ID     (what the browser starts)

`install` writes the extension (clients/js/extension/ with its page script assembled) to load unpacked, the
host's launcher, and the host's manifest where the browser looks for it, allowing only that extension.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

from agent.web_bridge import NAME, serve
from daop_client import DEFAULT_BROKER
from daop_client.address import check_device_id, default_broker, default_device_id, parse_broker_url
from monitors.errors import BadInput

HELP = ("The browser extension's native messaging host (host), and its registration with the browser (install, "
        "uninstall): web pages ask the agent with no password, each origin its own owner (docs/web.md).")
SOURCE = Path(__file__).resolve().parent.parent / "share" / "webextension"  # clients/js/extension in a checkout
DATA = Path.home() / ".local" / "share" / "daop-agent"
HOSTS_DIRS = {  # where each browser looks for a user's native messaging hosts (Linux)
    "chromium": Path.home() / ".config" / "chromium" / "NativeMessagingHosts",
    "chrome": Path.home() / ".config" / "google-chrome" / "NativeMessagingHosts",
}
EXTENSION_FILES = ("manifest.json", "background.js", "content.js")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("install", "uninstall", "host"),
                   help="install: register the host and write the extension; uninstall: remove them; host: what "
                        "the browser starts")
    p.add_argument("--broker", metavar="URL",
                   help=f"the agent's broker (default: $DAOP_BROKER, else {DEFAULT_BROKER}, what ./run.sh serves)")
    p.add_argument("--device-id", metavar="ID",
                   help="the agent's device id (default: this host's name, as the agent's)")
    p.add_argument("--browser", choices=tuple(HOSTS_DIRS), default="chromium",
                   help="whose native messaging registry (default: chromium)")
    p.add_argument("--hosts-dir", metavar="DIR", type=Path,
                   help="the browser's NativeMessagingHosts folder (default: the browser's per-user one; "
                        "<user-data-dir>/NativeMessagingHosts for a browser started with --user-data-dir)")
    p.add_argument("--extension-dir", metavar="DIR", type=Path, default=DATA / "webextension",
                   help=f"where to write the extension to load unpacked (default: {DATA / 'webextension'})")


def extension_id(manifest: dict) -> str:
    """The id the browser gives the extension: from the public key in its manifest, as Chromium computes it."""
    digest = hashlib.sha256(base64.b64decode(manifest["key"])).hexdigest()[:32]
    return "".join(chr(ord("a") + int(c, 16)) for c in digest)


def page_script() -> str:
    """page.js: webnn.js's code (its exports as plain declarations) and the page bridge, in one classic script, as
    a page's world takes it."""
    webnn = re.sub(r"^export ", "", (SOURCE / "webnn.js").read_text(), flags=re.MULTILINE)
    bridge = (SOURCE / "page-bridge.js").read_text()
    return ("// Written by `daop-agent web-bridge install`: clients/js/webnn.js, then extension/page-bridge.js.\n"
            f"(() => {{\n'use strict';\n{webnn}\n{bridge}\n}})();\n")


def run(args: argparse.Namespace) -> int:
    broker = args.broker or default_broker()
    try:
        parse_broker_url(broker)
        device_id = check_device_id(args.device_id or default_device_id())
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    hosts_dir = args.hosts_dir or HOSTS_DIRS[args.browser]
    if args.action == "host":
        asyncio.run(serve(broker, device_id, sys.stdin.buffer, sys.stdout.buffer))
        return 0
    manifest_path = hosts_dir / f"{NAME}.json"
    launcher = args.extension_dir.parent / "web-bridge-host"
    if args.action == "uninstall":
        for path in (manifest_path, launcher):
            path.unlink(missing_ok=True)
        if (args.extension_dir / "manifest.json").is_file():
            shutil.rmtree(args.extension_dir)
        print(f"removed {manifest_path}, {launcher} and {args.extension_dir}")
        return 0
    manifest = json.loads((SOURCE / "manifest.json").read_text())
    try:
        args.extension_dir.mkdir(parents=True, exist_ok=True)
        for name in EXTENSION_FILES:
            shutil.copyfile(SOURCE / name, args.extension_dir / name)
        (args.extension_dir / "page.js").write_text(page_script())
        launcher.write_text("#!/bin/sh\n# The browser starts it for the DAOP extension (web-bridge install)\n"
                            f"exec {shlex.quote(sys.executable)} -m agent web-bridge host "
                            f"--broker {shlex.quote(broker)} --device-id {shlex.quote(device_id)}\n")
        launcher.chmod(0o755)
        hosts_dir.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps({
            "name": NAME, "description": "daop-agent: DAOP answers for web pages, each origin its own owner",
            "path": str(launcher.resolve()), "type": "stdio",
            "allowed_origins": [f"chrome-extension://{extension_id(manifest)}/"]}, indent=2) + "\n")
    except OSError as exc:
        raise BadInput(f"cannot install the web bridge: {exc}") from None
    print(f"native messaging host  {manifest_path}\n"
          f"its launcher           {launcher} (the agent of {device_id} on {broker})\n"
          f"the extension          {args.extension_dir} (id {extension_id(manifest)})\n"
          f"load it: {args.browser} -> chrome://extensions -> Developer mode -> Load unpacked -> {args.extension_dir}")
    return 0
