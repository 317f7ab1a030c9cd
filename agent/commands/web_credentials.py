"""`daop-agent web-credentials`: what a web page needs to reach the agent's local broker over WebSockets."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from agent.config import STATE_DIR_HELP, load_config
from agent.local_broker import read_web_credentials, web_credentials_path

HELP = ("Print the URL, device id, username and password with which web pages reach the agent "
        "(daop-agent run --local-broker; docs/web.md).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", metavar="DIR", help=f"the agent's state dir ({STATE_DIR_HELP})")
    p.add_argument("--config", metavar="FILE", help="the agent's TOML configuration, for its state dir")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: the options of the JS client's connect()")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, {"state_dir": args.state_dir})
    creds = read_web_credentials(cfg.state_dir)
    if args.json:
        print(json.dumps(asdict(creds)))
    else:
        print(f"url        {creds.url}\n"
              f"device id  {creds.deviceId}\n"
              f"username   {creds.username}\n"
              f"password   {creds.password}\n"
              f"(from {web_credentials_path(cfg.state_dir)}; the agent rewrites it at each start)")
    return 0
