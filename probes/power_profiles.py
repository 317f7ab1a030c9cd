"""power-profiles-daemon (ppd): the power profile the user chose, and whether the daemon degraded it.

ppd lives on the system D-Bus. Where the bus is there, a thread of its own holds a connection to it
(dbus-fast): it reads the daemon's properties once, again whenever the daemon starts or restarts, and then
takes each PropertiesChanged signal as it comes and says so (`on_change`: the sampler samples at once, so a
switch to power-saver reaches the policy within a sample's time, not at the next poll). Between changes the
thread sleeps in the kernel. While it is not connected (no dbus-fast, a bus that refuses it, the bus
restarting: it tries again every `interval_s`), the daemon is asked through `busctl` (else `gdbus`) every
`interval_s` in a background thread instead. Where neither the daemon nor the tools exist, that is a normal
state, not an error. `current()` never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from probes.sysfs import parse_word

log = logging.getLogger("daop-agent")

SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"
PPD_INTERVAL_S = 30.0  # between polls, and between tries to connect to the bus

# (bus name, object path, interface): the current name, then the old one (ppd < 0.20).
PPD_NAMES = (
    ("org.freedesktop.UPower.PowerProfiles", "/org/freedesktop/UPower/PowerProfiles",
     "org.freedesktop.UPower.PowerProfiles"),
    ("net.hadess.PowerProfiles", "/net/hadess/PowerProfiles", "net.hadess.PowerProfiles"),
)
DBUS = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
PROPERTIES = "org.freedesktop.DBus.Properties"


@dataclass(frozen=True)
class PpdAnswer:
    active_profile: str | None
    degraded: str | None  # PerformanceDegraded's reason ("" = not degraded)


def system_bus_address() -> str | None:
    """The system bus's address: $DBUS_SYSTEM_BUS_ADDRESS, else the standard socket; None where there is none."""
    address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS")
    if address:
        return address
    return f"unix:path={SYSTEM_BUS_SOCKET}" if os.path.exists(SYSTEM_BUS_SOCKET) else None


# -- asked with a command-line tool --------------------------------------------------------------------------------

def _ppd_property_busctl(busctl: str, names: tuple[str, str, str], prop: str, timeout: float) -> str | None:
    bus, path, iface = names
    out = subprocess.run(
        [busctl, "--system", "get-property", bus, path, iface, prop],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    # prints: s "balanced"
    text = out.stdout.strip()
    if out.returncode != 0 or not text.startswith("s "):
        return None
    return text[2:].strip().strip('"')


def _ppd_property_gdbus(gdbus: str, names: tuple[str, str, str], prop: str, timeout: float) -> str | None:
    bus, path, iface = names
    out = subprocess.run(
        [gdbus, "call", "--system", "--dest", bus, "--object-path", path,
         "--method", f"{PROPERTIES}.Get", iface, prop],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    # prints: (<'balanced'>,)
    text = out.stdout.strip()
    if out.returncode != 0 or not text.startswith("(<'"):
        return None
    return text[3:].split("'", 1)[0]


def query_ppd(timeout: float = 2.0) -> PpdAnswer | None:
    """Ask power-profiles-daemon over the system bus; None when it is not there."""
    if system_bus_address() is None:
        return None
    busctl, gdbus = shutil.which("busctl"), shutil.which("gdbus")
    if busctl:
        ask = lambda names, prop: _ppd_property_busctl(busctl, names, prop, timeout)  # noqa: E731
    elif gdbus:
        ask = lambda names, prop: _ppd_property_gdbus(gdbus, names, prop, timeout)  # noqa: E731
    else:
        return None
    for names in PPD_NAMES:
        try:
            profile = ask(names, "ActiveProfile")
            if profile is None:
                continue
            return PpdAnswer(parse_word(profile), ask(names, "PerformanceDegraded"))
        except (OSError, subprocess.SubprocessError):
            return None
    return None


class PpdWatcher:
    """Cached power-profiles-daemon answer, asked again in a background thread every `interval_s`."""

    def __init__(self, interval_s: float = PPD_INTERVAL_S, query=query_ppd, clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self._query = query
        self._clock = clock
        self._lock = threading.Lock()
        self._answer: PpdAnswer | None = None
        self._asked_at: float | None = None
        self._thread: threading.Thread | None = None

    def current(self) -> PpdAnswer | None:
        """The latest answer; starts a refresh in the background when it is due."""
        with self._lock:
            due = self._asked_at is None or self._clock() - self._asked_at >= self.interval_s
            running = self._thread is not None and self._thread.is_alive()
            if due and not running:
                self._asked_at = self._clock()
                self._thread = threading.Thread(target=self._refresh, name="ppd-query", daemon=True)
                self._thread.start()
            return self._answer

    def wait(self, timeout: float) -> PpdAnswer | None:
        """For one-shot use (the CLI): ask now and wait up to `timeout` s for the answer."""
        self.current()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._answer

    def _refresh(self) -> None:
        try:
            answer = self._query()
        except Exception:  # noqa: BLE001 - an injected query (gdbus by default): a broken bus must not stop the sampler
            answer = None
        with self._lock:
            self._answer = answer


# -- followed over D-Bus -------------------------------------------------------------------------------------------

def _nothing() -> None:
    """No one to tell."""


def _match_rules() -> list[str]:
    """The signals the connection asks the bus for: ppd's property changes, and its name changing owner."""
    rules = [f"type='signal',interface='{PROPERTIES}',member='PropertiesChanged',path='{path}',arg0='{iface}'"
             for _, path, iface in PPD_NAMES]
    rules += [f"type='signal',sender='{DBUS[0]}',interface='{DBUS[2]}',member='NameOwnerChanged',arg0='{name}'"
              for name, _, _ in PPD_NAMES]
    return rules


def _text(props: dict[str, Any], key: str) -> str | None:
    value = props.get(key)
    value = getattr(value, "value", value)  # a Variant
    return value if isinstance(value, str) else None


class PowerProfiles:
    """power-profiles-daemon's answer, followed over the system bus (at `address`, else the system's) where it
    can connect, else polled (PpdWatcher). `on_change` is told, from the watching thread, when the answer
    changed; `close()` ends the thread."""

    def __init__(self, on_change: Callable[[], None] = _nothing, address: str | None = None,
                 interval_s: float = PPD_INTERVAL_S, poll: PpdWatcher | None = None) -> None:
        self.address = address or system_bus_address()
        self.interval_s = interval_s
        self.on_change = on_change
        self.following = False  # connected, subscribed and read: the answer is the signals'
        self._poll = poll or PpdWatcher(interval_s)
        self._answer: PpdAnswer | None = None
        self._read = threading.Event()  # the first connection read the daemon (or could not connect)
        self._stop = asyncio.Event()  # set in the watching thread's loop (close)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if self.address is not None and _dbus_fast() is not None:
            self._loop = asyncio.new_event_loop()  # made here: a close() before the thread runs still reaches it
            self._thread = threading.Thread(target=self._run, args=(self._loop,), name="daop-ppd", daemon=True)
            self._thread.start()
        else:
            self._read.set()

    def current(self) -> PpdAnswer | None:
        return self._answer if self.following else self._poll.current()

    def wait(self, timeout: float) -> PpdAnswer | None:
        """For one-shot use (the CLI): the answer once the daemon has been read, waiting up to `timeout` s."""
        self._read.wait(timeout)
        return self._answer if self.following else self._poll.wait(timeout)

    def close(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # its loop has ended already
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(2.0)

    # -- the watching thread --------------------------------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_until_complete(self._follow_forever())
        finally:
            loop.close()

    async def _follow_forever(self) -> None:
        while not self._stop.is_set():
            try:
                await self._follow()
            except Exception as exc:  # noqa: BLE001 - no bus, a refusal, a dropped connection: polled meanwhile
                log.debug("power-profiles-daemon: not followed over D-Bus (%s: %s); asked every %g s",
                          type(exc).__name__, exc, self.interval_s)
            self.following = False
            self._read.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    async def _follow(self) -> None:
        """One connection: subscribe, read, then take the signals until it drops or the watcher closes."""
        dbus = _dbus_fast()
        assert dbus is not None
        bus = await dbus.aio.MessageBus(bus_address=self.address, bus_type=dbus.BusType.SYSTEM).connect()
        try:
            rereads: set[asyncio.Task[None]] = set()

            def reread() -> None:
                task = asyncio.get_running_loop().create_task(self._reread(bus))
                rereads.add(task)
                task.add_done_callback(rereads.discard)

            def on_message(message: Any) -> None:
                if message.message_type != dbus.MessageType.SIGNAL:
                    return
                if message.member == "PropertiesChanged" and message.body[0] in {i for _, _, i in PPD_NAMES}:
                    _, changed, invalidated = message.body
                    if invalidated:
                        reread()
                    else:
                        old = self._answer or PpdAnswer(None, None)
                        profile = _text(changed, "ActiveProfile")
                        degraded = _text(changed, "PerformanceDegraded")
                        self._set(PpdAnswer(old.active_profile if profile is None else parse_word(profile),
                                            old.degraded if degraded is None else degraded))
                elif message.member == "NameOwnerChanged":  # ppd started, restarted or left
                    reread()

            bus.add_message_handler(on_message)
            for rule in _match_rules():
                await self._call(bus, *DBUS, "AddMatch", "s", [rule])
            await self._reread(bus)
            self.following = True
            self._read.set()
            waits = {asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(bus.wait_for_disconnect())}
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                task.result()  # a dropped connection raises: said, then polled until the next try
        finally:
            bus.disconnect()

    async def _reread(self, bus: Any) -> None:
        """All of ppd's properties, under whichever name it answers (None: it is not running)."""
        for name, path, iface in PPD_NAMES:
            reply = await self._call(bus, name, path, PROPERTIES, "GetAll", "s", [iface], check=False)
            if reply is not None:
                props = reply.body[0]
                profile = _text(props, "ActiveProfile")
                self._set(PpdAnswer(None if profile is None else parse_word(profile),
                                    _text(props, "PerformanceDegraded")))
                return
        self._set(None)

    async def _call(self, bus: Any, destination: str, path: str, interface: str, member: str, signature: str,
                    body: list[Any], check: bool = True) -> Any:
        """A method call's reply; an error reply raises (`check`) or is None."""
        dbus = _dbus_fast()
        assert dbus is not None
        reply = await bus.call(dbus.Message(destination=destination, path=path, interface=interface, member=member,
                                            signature=signature, body=body))
        if reply.message_type == dbus.MessageType.ERROR:
            if check:
                raise RuntimeError(f"{member}: {reply.error_name}")
            return None
        return reply

    def _set(self, answer: PpdAnswer | None) -> None:
        if answer != self._answer:
            self._answer = answer
            if self.following:
                self.on_change()


@functools.cache
def _dbus_fast() -> ModuleType | None:
    """dbus-fast, imported only where a system bus is there to follow; None where it is not installed (then ppd
    is polled)."""
    try:
        import dbus_fast.aio  # noqa: PLC0415 - 3.5 MB and 60 ms of import, only where there is a bus
    except ImportError:
        return None
    return dbus_fast
