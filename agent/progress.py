"""A dependency-free progress bar on stderr (a line per stage when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, title: str, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.title = title
        self.stream = stream
        self.width = width
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._last_label = ""

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
        elif label != self._last_label or done >= total:
            self._last_label = label
            self.stream.write(f"{self.title}: {frac:4.0%} {label} ({elapsed:.1f}s)\n")
            self.stream.flush()
