"""Progress of a long step (a calibration): a bar on a terminal, a few lines elsewhere, or lines in the log."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TextIO

from agent.ratelog import RateLimit

LOG_NAME = "daop-agent"


def setup_logging(level: str = "info") -> None:
    """The agent's log on stderr; under systemd the journal adds the time, so lines stay short there."""
    fmt = "%(levelname)s %(message)s" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s %(levelname)s %(message)s"
    logging.basicConfig(level=getattr(logging, level.upper()), format=fmt, stream=sys.stderr)
    logging.getLogger("mqtt").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RateLimit) for f in handler.filters):
            handler.addFilter(RateLimit(handler))


class ProgressBar:
    """On a terminal, one bar redrawn in place; elsewhere (a pipe, a file, CI) a line at each quarter."""

    def __init__(self, title: str, stream: TextIO = sys.stderr, width: int = 30, step: float = 0.25) -> None:
        self.title = title
        self.stream = stream
        self.width = width
        self.step = step
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._next = 0.0  # the fraction at which the next line is written (not on a terminal)

    def __call__(self, label: str, done: int, total: int) -> None:
        frac = min(done / total, 1.0) if total else 1.0
        elapsed = time.monotonic() - self.started
        if self.tty:
            filled = int(frac * self.width)
            bar = "#" * filled + "-" * (self.width - filled)
            self.stream.write(f"\r{self.title} [{bar}] {frac:4.0%} {label:<10} {elapsed:5.1f}s")
            if done >= total:
                self.stream.write("\n")
            self.stream.flush()
        elif frac >= self._next:
            self._next = min(1.0, (int(frac / self.step) + 1) * self.step) if frac < 1.0 else 2.0
            self.stream.write(f"{self.title}: {frac:4.0%} {label} ({elapsed:.1f}s)\n")
            self.stream.flush()


class LogProgress:
    """A calibration's progress in the agent's log, a line each `step` of the way (it runs in a process of its
    own: the log is set up there first)."""

    def __init__(self, title: str, step: float = 0.1) -> None:
        if not logging.getLogger().handlers:
            setup_logging()
        self.log = logging.getLogger(LOG_NAME)
        self.title = title
        self.step = step
        self.started = time.monotonic()
        self._next = 0.0

    def __call__(self, label: str, done: int, total: int) -> None:
        frac = min(done / total, 1.0) if total else 1.0
        if frac >= self._next:
            self._next = (int(frac / self.step) + 1) * self.step if frac < 1.0 else 2.0
            self.log.info("%s: %.0f%% (%s, %.0f s)", self.title, 100 * frac, label, time.monotonic() - self.started)
