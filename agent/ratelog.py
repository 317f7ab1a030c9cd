"""A rate limit on the agent's log: a burst of lines of one kind collapses into a few and one line with a count.

A flood of bad requests, or a disk that refuses every save, must not write tens of thousands of lines (the
journal rotates away what matters, and writing them costs the device). Lines are of one kind when they come
from the same call (logger, level, message template); each kind may write BURST lines per WINDOW_S seconds;
what it held back is said in one line when its window ends (at the next line of any kind, or by a timer set
when the first line was held back, whichever comes first).
"""

from __future__ import annotations

import logging
import threading
import time

BURST = 10
WINDOW_S = 10.0
SWEEP_S = 1.0  # how often ended windows are looked for


class RateLimit(logging.Filter):
    """Attached to a handler: lets BURST lines of a kind through per window, then counts the rest. A window that
    held lines back is said when it ends: at the next line, or by a timer where none comes (an agent at rest logs
    little)."""

    def __init__(self, handler: logging.Handler, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.handler = handler
        self.burst = burst
        self.window_s = window_s
        self._kinds: dict[tuple[str, int, str], list[float | int]] = {}  # kind -> [window start, lines, held]
        self._last_sweep = 0.0
        self._lock = threading.Lock()  # lines come from any thread, the timer from its own
        self._timer: threading.Timer | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "rate_summary", False):
            return True
        now = time.monotonic()
        kind = (record.name, record.levelno, str(record.msg))
        with self._lock:
            ended = self._ended(now) if now - self._last_sweep >= SWEEP_S else []
            seen = self._kinds.get(kind)
            if seen is None or now - seen[0] >= self.window_s:
                if seen is not None and seen[2]:
                    ended.append((kind, int(seen[2])))
                self._kinds[kind] = [now, 1, 0]
                passes = True
            else:
                seen[1] += 1
                passes = seen[1] <= self.burst
                if not passes:
                    seen[2] += 1
                    self._sweep_later(float(seen[0]) + self.window_s - now)
        for held_kind, held in ended:
            self._summary(held_kind, held)
        return passes

    def _ended(self, now: float) -> list[tuple[tuple[str, int, str], int]]:
        """Windows that ended, forgotten, with what they held back (under the lock)."""
        self._last_sweep = now
        ended = []
        for kind, (start, _, held) in list(self._kinds.items()):
            if now - start >= self.window_s:
                del self._kinds[kind]
                if held:
                    ended.append((kind, int(held)))
        return ended

    def _sweep_later(self, delay_s: float) -> None:
        """A sweep when this window ends, unless one is set already (under the lock)."""
        if self._timer is None:
            self._timer = threading.Timer(max(0.0, delay_s) + 0.01, self._sweep)
            self._timer.daemon = True
            self._timer.start()

    def _sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._timer = None
            ended = self._ended(now)
            waiting = [float(start) + self.window_s - now for start, _, held in self._kinds.values() if held]
            if waiting:
                self._sweep_later(min(waiting))
        for kind, held in ended:
            self._summary(kind, held)

    def _summary(self, kind: tuple[str, int, str], held: int) -> None:
        name, level, template = kind
        text = template if len(template) <= 100 else template[:97] + "..."
        record = logging.LogRecord(name, level, __file__, 0, "%d more line(s) like %r in %g s held back",
                                   (held, text, self.window_s), None)
        record.rate_summary = True
        self.handler.handle(record)
