"""Kernel uevents: the kernel says at once when a power supply or a thermal zone changes.

A charger plugged or pulled, a battery's status or level, a thermal zone's trip crossed: the kernel sends a
uevent on its netlink socket (NETLINK_KOBJECT_UEVENT, multicast group 1, as udev reads it) for each. A thread
of its own blocks on that socket and says so (`on_event`: the sampler samples at once instead of at its next
interval); between events it sleeps in the kernel. What changed is still read from sysfs by the probes: an
event only says when to look. Where the socket cannot be opened (a sandbox without AF_NETLINK, a kernel
without it), the probes' reads every sample interval are all there is, as on a fixture tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Collection

log = logging.getLogger("daop-agent")

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1  # the kernel's own events (udev re-sends them, tagged "libudev", on group 2)
SUBSYSTEMS = frozenset({"power_supply", "thermal"})
RECEIVE_BYTES = 1 << 16  # a uevent is at most a few KiB (UEVENT_BUFFER_SIZE 2048)


def parse(datagram: bytes) -> dict[str, str] | None:
    """A kernel uevent's keys ("ACTION@DEVPATH", then NUL-separated KEY=VALUE); None for anything else."""
    head, _, rest = datagram.partition(b"\0")
    if b"@" not in head:
        return None
    keys = {}
    for field in rest.split(b"\0"):
        key, sep, value = field.partition(b"=")
        if sep:
            keys[key.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    return keys


class Uevents:
    """Tells `on_event` (from its own thread) of each kernel uevent of `subsystems`, with its subsystem (None:
    events were lost, any may have changed). `listening`: the socket is open; `close()` ends the thread."""

    def __init__(self, on_event: Callable[[str | None], None], subsystems: Collection[str] = SUBSYSTEMS) -> None:
        self.on_event = on_event
        self.subsystems = frozenset(subsystems)
        self._sock: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        sock = None
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
            sock.bind((0, KERNEL_GROUP))
        except (OSError, AttributeError) as exc:  # AttributeError: a platform without AF_NETLINK
            if sock is not None:
                sock.close()
            log.debug("kernel uevents: not heard (%s); power supplies and thermal zones read each sample only", exc)
            return
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name="daop-uevents", daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(2.0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._sock is not None:
            self._sock.close()

    def _run(self) -> None:
        assert self._sock is not None
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                datagram = self._sock.recv(RECEIVE_BYTES)
            except OSError as exc:  # ENOBUFS: events were lost while the thread was away; look now
                log.debug("kernel uevents: %s", exc)
                self.on_event(None)
                continue
            keys = parse(datagram)
            if keys is not None and keys.get("SUBSYSTEM") in self.subsystems:
                self.on_event(keys["SUBSYSTEM"])
