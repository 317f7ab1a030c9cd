"""Where an agent is: the broker's address and the device id, with the defaults `./run.sh` serves.

`DAOP_BROKER` in the environment replaces the default broker, so a script written against `./run.sh` runs
unchanged against another one.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

DEFAULT_BROKER = "mqtt://127.0.0.1:18830"  # what `./run.sh` (`daop-agent run --local-broker`) serves
DEVICE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # one topic level, matched whole


@dataclass(frozen=True)
class Address:
    """A broker's address as a URL gives it (credentials only where the URL has them)."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        """The address without credentials (safe to print)."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker_url(url: str) -> Address:
    """mqtt://[user[:pass]@]host[:port] (1883) or mqtts://... (8883); ValueError with one clear line."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"broker URL {url!r} is malformed: {exc}") from None
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"broker URL must start with mqtt:// or mqtts://, not {url!r}")
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"broker URL {url!r} must be only scheme, credentials, host and port")
    tls = parts.scheme == "mqtts"
    return Address(parts.hostname, port or (8883 if tls else 1883), tls,
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None)


def default_broker() -> str:
    """`$DAOP_BROKER`, else the broker `./run.sh` serves."""
    return os.environ.get("DAOP_BROKER") or DEFAULT_BROKER


def default_device_id() -> str:
    """The hostname, reduced to the characters a topic level may use here: the agent's default too."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64].strip("-")
    return name or "device"


def check_device_id(value: Any) -> str:
    if not isinstance(value, str) or not DEVICE_ID_RE.fullmatch(value):
        raise ValueError(f"device id must be 1 to 64 of A-Z a-z 0-9 _ -, not {value!r}")
    return value
