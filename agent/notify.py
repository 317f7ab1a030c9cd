"""systemd's notify protocol without a library: one datagram per message to $NOTIFY_SOCKET.

READY=1 once the agent has started locally (not when the broker answers: a
broker that is down must not make systemd kill the unit), WATCHDOG=1 from the
event loop so that a stalled loop gets the unit restarted, STATUS= lines for
`systemctl status`, STOPPING=1 on a clean stop. Outside systemd every call is
a no-op.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._address: str | None = None
        if address:
            # '@' names a socket in the abstract namespace: a leading NUL byte.
            self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *fields: str) -> bool:
        """Send `KEY=value` fields in one datagram; False (logged once) when it cannot."""
        if self._address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode("utf-8"), self._address)
            return True
        except OSError as exc:
            log.warning("systemd notify to %r failed: %s", self._address.replace("\0", "@"), exc)
            return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec (from $WATCHDOG_USEC) when it is meant for us, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None
