"""The calibration: what the micro-benchmarks measured, and what they depend on.

Pure data: probes/microbench.py produces it, agent/calibration_store.py keeps
it in the state dir, monitors/costmodel.py turns it into latencies. When the
fingerprint (CPU model, core count, onnxruntime version, format) no longer
matches the device, the calibration is redone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

FORMAT_VERSION = 7  # 2: per-op tables for memory-bound kernels, cache size; 3: weight streaming rate;
# 4: the cache size measured, not reported; overheads from the wall clock alone; 5: the read rates over
# working sets around the cache; every reading the fastest of three passes; 6: read rates by
# onnxruntime's own MatMul, out to eight times the reported cache; 7: the warm refresh's reference is the
# wall time of a lock-stepped multi-threaded probe


@dataclass(frozen=True)
class FamilyTable:
    """Measured kernel times over one family's grid; unmeasured grid points are extrapolated."""

    axes: tuple[tuple[float, ...], ...]
    points: tuple[tuple[tuple[float, ...], float], ...]  # (grid coordinates, seconds)


@dataclass(frozen=True)
class Calibration:
    fingerprint: dict[str, str]
    tables: dict[str, FamilyTable]
    per_kernel_s: float
    per_run_s: float
    quick: bool = False
    seconds: float = 0.0  # how long calibrating took
    created: float = 0.0  # unix time
    refresh_reference: dict[str, float] = field(default_factory=dict)  # warm-refresh probe: fastest during and right after
    stream_bytes_per_s: float = 0.0  # weights read from memory when they cannot stay cached (0: unmeasured)
    cache_bytes: int = 0  # the cache weights stay in between inferences, as measured (0: unmeasured)
    read_rates: tuple[tuple[int, float], ...] = ()  # (working set bytes, bytes/s read cyclically over it)

    @property
    def device(self) -> str:
        return self.fingerprint.get("device", "cpu")

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_VERSION,
                "fingerprint": self.fingerprint,
                "tables": {
                    name: {"axes": [list(a) for a in t.axes], "points": [[list(p), s] for p, s in t.points]}
                    for name, t in self.tables.items()
                },
                "per_kernel_s": self.per_kernel_s,
                "per_run_s": self.per_run_s,
                "quick": self.quick,
                "seconds": self.seconds,
                "created": self.created,
                "refresh_reference": self.refresh_reference,
                "stream_bytes_per_s": self.stream_bytes_per_s,
                "cache_bytes": self.cache_bytes,
                "read_rates": [list(r) for r in self.read_rates],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        """Raises ValueError (or KeyError/TypeError) on anything malformed."""
        d = json.loads(text)
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"calibration format {d.get('format')!r}, expected {FORMAT_VERSION}")
        tables = {
            name: FamilyTable(
                axes=tuple(tuple(float(v) for v in a) for a in t["axes"]),
                points=tuple((tuple(float(v) for v in p), float(s)) for p, s in t["points"]),
            )
            for name, t in d["tables"].items()
        }
        return cls(
            fingerprint={str(k): str(v) for k, v in d["fingerprint"].items()},
            tables=tables,
            per_kernel_s=float(d["per_kernel_s"]),
            per_run_s=float(d["per_run_s"]),
            quick=bool(d.get("quick", False)),
            seconds=float(d.get("seconds", 0.0)),
            created=float(d.get("created", 0.0)),
            refresh_reference={str(k): float(v) for k, v in d.get("refresh_reference", {}).items()},
            stream_bytes_per_s=float(d.get("stream_bytes_per_s", 0.0)),
            cache_bytes=int(d.get("cache_bytes", 0)),
            read_rates=tuple((int(size), float(rate)) for size, rate in d.get("read_rates", ())),
        )
