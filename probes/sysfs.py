"""Fallible reads of small kernel files (sysfs, procfs) under one root.

Every read can fail: the file vanished, the driver answered EAGAIN or EIO,
or the text is garbage. A failed read gives the last good value with its
age (for at most `stale_after_s`), or None; never a made-up 0, never an
exception. All paths go through one root so that tests can run the real
code on a fixture tree.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# Sysfs attributes are a page at most; the ones we read are a few bytes.
_MAX_BYTES = 4096


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A value and how old it is: age 0.0 is fresh, > 0 is a last good value, None when never read."""

    value: T | None
    age_s: float | None

    @property
    def stale(self) -> bool:
        return self.value is not None and bool(self.age_s)


NOTHING: Reading = Reading(None, None)


class LastGood:
    """Remembers the last good value per key, and for how long it may stand in for a failed read."""

    def __init__(self, stale_after_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._values: dict[str, tuple[object, float]] = {}

    def good(self, key: str, value: T) -> Reading[T]:
        self._values[key] = (value, self.clock())
        return Reading(value, 0.0)

    def failed(self, key: str) -> Reading:
        held = self._values.get(key)
        if held is None:
            return NOTHING
        value, at = held
        age = self.clock() - at
        if age > self.stale_after_s:
            del self._values[key]
            return NOTHING
        return Reading(value, max(age, 1e-6))

    def forget(self, prefix: str) -> None:
        """Drop remembered values of a device that went away."""
        for key in [k for k in self._values if k.startswith(prefix)]:
            del self._values[key]


def take(reading: Reading[T], key: str, stale: dict[str, float]) -> T | None:
    """The reading's value; records its age under `key` when it is a last good value."""
    if reading.stale:
        stale[key] = round(reading.age_s or 0.0, 3)
    return reading.value


INT_LIMIT = 2**64  # the kernel writes at most 64-bit integers; anything wider is garbage (and overflows a float)


def parse_int(text: str) -> int | None:
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if -INT_LIMIT < value < INT_LIMIT else None


def parse_float(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_word(text: str) -> str | None:
    """One printable word or short phrase (a type, a status, a profile name)."""
    text = text.strip()
    if not text or len(text) > 64 or not text.isprintable():
        return None
    return text


STATIC_TTL_S = 60.0  # what rarely changes (a zone's type, trip points, max clocks, the devices) is read this often


class KernelFiles:
    """Reads files below `root` with last-good fallback and a per-path cache.

    `ttl_s` on a read lets attributes that rarely change (a zone's type, trip
    points, max clocks) be read once a minute (STATIC_TTL_S) instead of every
    tick, and on a listing the devices themselves; a read
    that took longer than `slow_read_s` (some battery drivers ask the
    embedded controller) is not repeated for `slow_backoff_s`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        stale_after_s: float = 60.0,
        slow_read_s: float = 0.05,
        slow_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = os.fspath(root).rstrip("/") or "/"
        self.clock = clock
        self.last_good = LastGood(stale_after_s, clock)
        self.slow_read_s = slow_read_s
        self.slow_backoff_s = slow_backoff_s
        self._cache: dict[str, tuple[Reading, float]] = {}
        self._listings: dict[str, tuple[list[str], float]] = {}
        self._slow_until: dict[str, float] = {}

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def listdir(self, rel: str, prefix: str = "", ttl_s: float = 0.0) -> list[str]:
        """Sorted entries of a directory starting with `prefix`; [] when it is missing or unreadable. `ttl_s`: a
        listing of hardware (thermal zones, cpufreq policies) is taken again only that often."""
        now = self.clock()
        cached = self._listings.get(rel) if ttl_s > 0 else None
        if cached is not None and now - cached[1] < ttl_s:
            names = cached[0]
        else:
            try:
                names = os.listdir(self.path(rel))
            except OSError:
                names = []
            if ttl_s > 0:
                self._listings[rel] = (names, now)
        return sorted((n for n in names if n.startswith(prefix)), key=_natural_key)

    def readlink(self, rel: str) -> str | None:
        """A symbolic link's target as written (`/dev/dri/renderD128`, `../../../0000:00:02.0`), or None."""
        try:
            return os.readlink(self.path(rel))
        except OSError:
            return None

    def resolved_name(self, rel: str) -> str | None:
        """The last part of the path `rel` resolves to: a sysfs class entry's `device` link gives the device's
        own name (`0000:00:02.0` for a PCI device, `fde60000.gpu` for a platform one); None when it is missing."""
        path = self.path(rel)
        if not os.path.exists(path):
            return None
        return os.path.basename(os.path.realpath(path)) or None

    def read_raw(self, rel: str, max_bytes: int = _MAX_BYTES) -> str | None:
        """The file's text, or None on any failure. Never blocks on a FIFO (O_NONBLOCK)."""
        try:
            fd = os.open(self.path(rel), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, max_bytes)
        except OSError:  # EAGAIN, EIO, ENODATA, EISDIR, ...
            return None
        finally:
            os.close(fd)
        if not data:
            return None
        try:
            return data.decode("ascii")
        except UnicodeDecodeError:
            return None

    def read(
        self, rel: str, parse: Callable[[str], T | None], ttl_s: float = 0.0, max_bytes: int = _MAX_BYTES
    ) -> Reading[T]:
        """Read and parse one file; a failure gives the last good value with its age, or None."""
        now = self.clock()
        if ttl_s > 0:
            cached = self._cache.get(rel)
            if cached is not None and now - cached[1] < ttl_s:
                return cached[0]
        slow_until = self._slow_until.get(rel)
        if slow_until is not None and now < slow_until:
            return self.last_good.failed(rel)
        text = self.read_raw(rel, max_bytes)
        took = self.clock() - now
        if took > self.slow_read_s:
            self._slow_until[rel] = now + self.slow_backoff_s
        value = parse(text) if text is not None else None
        reading = self.last_good.good(rel, value) if value is not None else self.last_good.failed(rel)
        if ttl_s > 0 and value is not None:
            self._cache[rel] = (reading, now)
        return reading

    def read_int(self, rel: str, ttl_s: float = 0.0) -> Reading[int]:
        return self.read(rel, parse_int, ttl_s)

    def read_float(self, rel: str, ttl_s: float = 0.0) -> Reading[float]:
        return self.read(rel, parse_float, ttl_s)

    def read_word(self, rel: str, ttl_s: float = 0.0) -> Reading[str]:
        return self.read(rel, parse_word, ttl_s)


def _natural_key(name: str) -> tuple:
    """thermal_zone2 before thermal_zone10."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)
