"""Monitors: when does `meetsRequirement` change, and when must it not.

Pure computation over numpy arrays so that 10,000 monitors are re-evaluated in
well under 10 ms per tick. A monitor's present latency is its calibrated base
latency on its device times that device's present slow-down factor, plus the
MB its plan writes times the device's handoff extra (monitors/speed.py); it
meets its requirement while that latency is under its tier's bound.

Three rules keep noise near a boundary from flapping:

- hysteresis: a monitor that meets its requirement only stops when the latency
  reaches `bound * (1 + margin)`, and one that does not only starts again
  below `bound * (1 - margin)`;
- minimum dwell: after a change a monitor keeps its new value for at least
  `dwell_s` seconds (the first change after creation is not delayed, so an
  event still reaches subscribers within a sample interval or two);
- a rate cap: at most `max_events_per_minute` changes per monitor in any 60 s.

A policy veto (e.g. power-saver mode) forces `meetsRequirement` false without
the margin; dwell and the rate cap still apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

DEVICES: tuple[str, ...] = ("cpu", "gpu")
DEVICE_INDEX = {name: i for i, name in enumerate(DEVICES)}
RATE_WINDOW_S = 60.0


@dataclass(frozen=True)
class MonitorRules:
    margin: float = 0.10
    dwell_s: float = 2.0
    max_events_per_minute: int = 6

    def __post_init__(self) -> None:
        if not (0.0 <= self.margin < 1.0):
            raise ValueError(f"hysteresis margin must be in [0, 1), got {self.margin}")
        if not (self.dwell_s >= 0.0 and math.isfinite(self.dwell_s)):
            raise ValueError(f"dwell must be a non-negative number of seconds, got {self.dwell_s}")
        if self.max_events_per_minute < 1:
            raise ValueError(f"max events per minute must be at least 1, got {self.max_events_per_minute}")


class Change(NamedTuple):
    """One monitor whose `meetsRequirement` flipped on this tick; `seq` is its new sequence number."""

    monitor: str
    meets: bool
    seq: int


class MonitorTable:
    """All monitors of one device as parallel arrays (swap-remove on delete)."""

    def __init__(self, rules: MonitorRules | None = None, capacity: int = 64) -> None:
        self.rules = rules or MonitorRules()
        self._n = 0
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self.last_seq = 0  # one counter for all monitors: a monitor's seq never goes back, even re-created
        self._alloc(max(1, capacity))

    # -- storage -----------------------------------------------------------------

    def _alloc(self, capacity: int) -> None:
        cap = self.rules.max_events_per_minute
        old = getattr(self, "_base", None)
        arrays = {
            "_base": np.zeros(capacity, dtype=np.float64),
            "_device": np.zeros(capacity, dtype=np.int8),
            "_mem": np.zeros(capacity, dtype=np.float64),
            "_written": np.zeros(capacity, dtype=np.float64),
            "_bound": np.zeros(capacity, dtype=np.float64),
            "_meets": np.zeros(capacity, dtype=bool),
            "_seq": np.zeros(capacity, dtype=np.int64),
            "_last_change": np.full(capacity, -math.inf, dtype=np.float64),
            "_events": np.full((capacity, cap), -math.inf, dtype=np.float64),
            "_ring": np.zeros(capacity, dtype=np.int64),
        }
        for name, arr in arrays.items():
            if old is not None:
                arr[: self._n] = getattr(self, name)[: self._n]
            setattr(self, name, arr)

    def __len__(self) -> int:
        return self._n

    def __contains__(self, monitor: str) -> bool:
        return monitor in self._index

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def add(self, monitor: str, base_ms: float, device: str, bound_ms: float, meets: bool, seq: int,
            memory_bytes: int = 0, written_mb: float = 0.0) -> None:
        """Add (or replace) a monitor with its present value and sequence number."""
        if monitor in self._index:
            self.remove(monitor)
        if self._n == len(self._base):
            self._alloc(2 * len(self._base))
        i = self._n
        self._base[i] = base_ms
        self._device[i] = DEVICE_INDEX[device]
        self._mem[i] = memory_bytes
        self._written[i] = written_mb
        self._bound[i] = bound_ms
        self._meets[i] = meets
        self._seq[i] = seq
        self._last_change[i] = -math.inf
        self._events[i, :] = -math.inf
        self._ring[i] = 0
        self._ids.append(monitor)
        self._index[monitor] = i
        self._n += 1
        self.last_seq = max(self.last_seq, seq)

    def remove(self, monitor: str) -> None:
        i = self._index.pop(monitor)
        last = self._n - 1
        if i != last:
            for name in ("_base", "_device", "_mem", "_written", "_bound", "_meets", "_seq", "_last_change", "_events",
                         "_ring"):
                arr = getattr(self, name)
                arr[i] = arr[last]
            moved = self._ids[last]
            self._ids[i] = moved
            self._index[moved] = i
        self._ids.pop()
        self._n -= 1

    def meets(self, monitor: str) -> bool:
        return bool(self._meets[self._index[monitor]])

    def seq(self, monitor: str) -> int:
        return int(self._seq[self._index[monitor]])

    def next_seq(self) -> int:
        """Take the next sequence number (for a new monitor's first value)."""
        self.last_seq += 1
        return self.last_seq

    def snapshot(self) -> dict[str, tuple[int, bool]]:
        """id -> (seq, meets) of every monitor, for persistence."""
        n = self._n
        return dict(zip(self._ids, zip(self._seq[:n].tolist(), self._meets[:n].tolist())))

    def set_base(self, monitor: str, base_ms: float) -> None:
        self._base[self._index[monitor]] = base_ms

    # -- evaluation ----------------------------------------------------------------

    def latencies(self, factors: np.ndarray, gpu_free_bytes: float | None = None,
                  handoffs: np.ndarray | None = None) -> np.ndarray:
        """Present latency of every monitor: base latency times its device's factor, plus the MB its plan
        writes times its device's handoff extra (ms per MB).

        A GPU monitor whose weights and activations do not fit in the GPU's
        free memory cannot run there now: infinite latency.
        """
        n = self._n
        device = self._device[:n]
        lat = self._base[:n] * factors[device]
        if handoffs is not None:
            lat += self._written[:n] * handoffs[device]
        if gpu_free_bytes is not None:
            lat[(device == DEVICE_INDEX["gpu"]) & (self._mem[:n] > gpu_free_bytes)] = math.inf
        return lat

    def evaluate(self, now: float, factors: np.ndarray, veto: bool = False,
                 gpu_free_bytes: float | None = None, handoffs: np.ndarray | None = None) -> list[Change]:
        """Apply one tick; return the monitors that changed, with their new seq.

        `factors[d]` is device d's present slow-down (inf when the device is
        unusable), `handoffs[d]` its handoff extra in ms per MB written (none: 0);
        `veto` forces meetsRequirement false (a user policy).
        """
        n = self._n
        if n == 0:
            return []
        r = self.rules
        lat = self.latencies(factors, gpu_free_bytes, handoffs)
        bound = self._bound[:n]
        meets = self._meets[:n]
        if veto:
            want_true = np.zeros(n, dtype=bool)
            want_false = np.ones(n, dtype=bool)
        else:
            # inf bound ('poor') is met by every finite latency.
            want_true = lat < bound * (1.0 - r.margin)
            want_false = lat >= bound * (1.0 + r.margin)
        flip = np.where(meets, want_false, want_true)
        if not flip.any():
            return []
        flip &= (now - self._last_change[:n]) >= r.dwell_s
        oldest = self._events[np.arange(n), self._ring[:n]]
        flip &= (now - oldest) >= RATE_WINDOW_S
        idx = np.flatnonzero(flip)
        if idx.size == 0:
            return []
        meets[idx] = ~meets[idx]
        self._seq[idx] = self.last_seq + np.arange(1, idx.size + 1)
        self.last_seq += int(idx.size)
        self._last_change[idx] = now
        self._events[idx, self._ring[idx]] = now
        self._ring[idx] = (self._ring[idx] + 1) % r.max_events_per_minute
        ids = self._ids
        return list(map(Change._make, zip([ids[i] for i in idx.tolist()], meets[idx].tolist(), self._seq[idx].tolist())))


def initial_meets(latency_ms: float, bound: float, veto: bool = False) -> bool:
    """A new monitor's first value: a plain comparison, no hysteresis yet."""
    return bool((not veto) and latency_ms < bound)
