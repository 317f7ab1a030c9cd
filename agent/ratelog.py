"""A rate limit on the agent's log: a burst of lines of one kind collapses into a few and one line with a count.

A flood of bad requests, or a disk that refuses every save, must not write tens of thousands of lines (the
journal rotates away what matters, and writing them costs the device). Lines are of one kind when they come
from the same call (logger, level, message template); each kind may write BURST lines per WINDOW_S seconds;
what it held back is said in one line when its window ends (at its next line, or any other line, whichever
comes first).
"""

from __future__ import annotations

import logging
import time

BURST = 10
WINDOW_S = 10.0
SWEEP_S = 1.0  # how often ended windows are looked for


class RateLimit(logging.Filter):
    """Attached to a handler: lets BURST lines of a kind through per window, then counts the rest."""

    def __init__(self, handler: logging.Handler, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.handler = handler
        self.burst = burst
        self.window_s = window_s
        self._kinds: dict[tuple[str, int, str], list[float | int]] = {}  # kind -> [window start, lines, held]
        self._last_sweep = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "rate_summary", False):
            return True
        now = time.monotonic()
        if now - self._last_sweep >= SWEEP_S:
            self._sweep(now)
        kind = (record.name, record.levelno, str(record.msg))
        seen = self._kinds.get(kind)
        if seen is None or now - seen[0] >= self.window_s:
            if seen is not None and seen[2]:
                self._summary(kind, int(seen[2]), record.levelno)
            self._kinds[kind] = [now, 1, 0]
            return True
        seen[1] += 1
        if seen[1] <= self.burst:
            return True
        seen[2] += 1
        return False

    def _sweep(self, now: float) -> None:
        """Windows that ended: their held-back counts said, their kinds forgotten."""
        self._last_sweep = now
        for kind, (start, _, held) in list(self._kinds.items()):
            if now - start >= self.window_s:
                del self._kinds[kind]
                if held:
                    self._summary(kind, int(held), kind[1])

    def _summary(self, kind: tuple[str, int, str], held: int, level: int) -> None:
        name, _, template = kind
        text = template if len(template) <= 100 else template[:97] + "..."
        record = logging.LogRecord(name, level, __file__, 0, "%d more line(s) like %r in %g s held back",
                                   (held, text, self.window_s), None)
        record.rate_summary = True
        self.handler.handle(record)
