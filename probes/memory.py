"""Memory probe: available memory and memory pressure (PSI).

A model whose weights and activations do not fit in available memory pages
to swap or fails; pressure stalls also slow a model that does fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probes.cpu import parse_psi_some_avg10
from probes.sysfs import KernelFiles, take


@dataclass(frozen=True)
class MemoryState:
    total_bytes: int | None
    available_bytes: int | None
    psi_some_avg10: float | None  # % of the last 10 s some task stalled on memory
    stale: dict[str, float] = field(default_factory=dict)


def parse_meminfo(text: str) -> dict[str, int] | None:
    """MemTotal and MemAvailable in bytes; None unless both are there."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            parts = rest.split()
            if not parts or not parts[0].isdigit():
                return None
            found[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    if len(found) != 2 or found["MemAvailable"] > found["MemTotal"] or found["MemTotal"] == 0:
        return None
    return found


class MemoryProbe:
    def __init__(self, proc_files: KernelFiles) -> None:
        self.proc = proc_files

    def sample(self) -> MemoryState:
        stale: dict[str, float] = {}
        info = take(self.proc.read("meminfo", parse_meminfo, max_bytes=16384), "memory.available_bytes", stale)
        psi = take(self.proc.read("pressure/memory", parse_psi_some_avg10), "memory.psi_some_avg10", stale)
        return MemoryState(
            total_bytes=info["MemTotal"] if info else None,
            available_bytes=info["MemAvailable"] if info else None,
            psi_some_avg10=psi,
            stale=stale,
        )
