"""Monitors: when does `meetsRequirement` change, and when must it not.

Pure computation over numpy arrays so that 10,000 monitors are re-evaluated in well under 10 ms per tick.

A monitor is one or more members (workloads). Each member has a calibrated latency at rest, a deadline (a
tier's bound, `1000 / rate` for a frame rate, or an explicit deadline) and, for a rate, the runs a second it
must sustain. A member's present latency is its calibrated latency priced at its monitor's speed
(monitors/speed/present.py: latencies_ms, the formula every estimate uses), times the correction learnt from
its app's reports (monitors/warm.py). The members of a group share the device: each one's response time is
its latency stretched by the device time the others take (`latency / (1 - U_others)`, U the share of the
device a member keeps busy: rate x latency), and together they must leave room: their utilisation sum stays
under UTILISATION_BOUND. A member meets its requirement while its response time is under its deadline; the
monitor, while every member does and the utilisation fits.

Each monitor is priced at a speed of its own class: class 0 is the device as everyone sees it; an app that
runs its monitor's graph locally gets a class whose speed leaves its own run out (the agent makes it).

Three rules keep noise near a boundary from flapping:

- hysteresis: a member that meets its deadline only stops when its response time reaches
  `deadline * (1 + margin)`, and one that does not only starts again below `deadline * (1 - margin)`; the
  utilisation bound likewise;
- minimum dwell: after a change a monitor keeps its new value for at least `dwell_s` seconds (the first
  change after creation is not delayed, so an event still reaches subscribers within a sample interval or
  two);
- a rate cap: at most `max_events_per_minute` changes per monitor in any 60 s.

A policy veto (e.g. power-saver mode) forces `meetsRequirement` false without the margin; dwell and the
rate cap still apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from monitors.devices import DEVICE_INDEX
from monitors.speed.present import AT_REST, Speed, latencies_ms

RATE_WINDOW_S = 60.0
UTILISATION_BOUND = 0.9  # the share of the device a group may keep busy, room left for the unexpected


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


@dataclass(frozen=True)
class Member:
    """One workload of a monitor, as the table prices it."""

    base_ms: float  # calibrated latency at rest on `device`
    device: str
    deadline_ms: float  # a run must end within this (inf: the `poor` tier, any finite latency)
    rate_hz: float = 0.0  # runs a second it must sustain beside the others (0: none)
    memory_bytes: int = 0
    written_mb: float = 0.0
    stream_ms: float = 0.0  # what its CPU latency gains per unit of memory slowdown
    gemm_ms: float = 0.0  # ... and per unit of gemm slowdown


class Answer(NamedTuple):
    """What a monitor answers now: meetsRequirement, the seq of its latest value, and each member's answer in
    their order (a lone member's is the monitor's)."""

    seq: int
    meets: bool
    members: tuple[bool, ...]


class Change(NamedTuple):
    """One monitor whose answer changed on this tick; `seq` is its new sequence number; `members` its
    members' answers when it has more than one."""

    monitor: str
    meets: bool
    seq: int
    members: tuple[bool, ...] | None = None


_MONITOR_ARRAYS = ("_meets", "_seq", "_last_change", "_events", "_ring", "_class")
_MEMBER_ARRAYS = ("_of", "_pos", "_base", "_device", "_mem", "_written", "_stream", "_gemm", "_rate", "_deadline",
                  "_corr", "_mmeets")


class MonitorTable:
    """All monitors of one device as parallel arrays, monitors and their members apart (swap-remove)."""

    # Per monitor (_MONITOR_ARRAYS), sized by _alloc_monitors.
    _meets: npt.NDArray[np.bool_]
    _seq: npt.NDArray[np.int64]
    _last_change: npt.NDArray[np.float64]
    _events: npt.NDArray[np.float64]  # (monitor, max_events_per_minute): times of its latest changes, a ring
    _ring: npt.NDArray[np.int64]  # the ring's next slot
    _class: npt.NDArray[np.int64]  # the class of speed it is priced at (evaluate's `speeds`, set_classes)
    # Per member (_MEMBER_ARRAYS), sized by _alloc_members.
    _of: npt.NDArray[np.int64]  # its monitor's row
    _pos: npt.NDArray[np.int64]  # its place among its monitor's members
    _base: npt.NDArray[np.float64]
    _device: npt.NDArray[np.int8]
    _mem: npt.NDArray[np.float64]
    _written: npt.NDArray[np.float64]
    _stream: npt.NDArray[np.float64]
    _gemm: npt.NDArray[np.float64]
    _rate: npt.NDArray[np.float64]
    _deadline: npt.NDArray[np.float64]
    _corr: npt.NDArray[np.float64]  # learnt log-correction of its latency (monitors/warm.py)
    _mmeets: npt.NDArray[np.bool_]

    def __init__(self, rules: MonitorRules | None = None, capacity: int = 64) -> None:
        self.rules = rules or MonitorRules()
        self._n = 0  # monitors
        self._k = 0  # members
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self.last_seq = 0  # one counter for all monitors: a monitor's seq never goes back, even re-created
        self.speeds: list[Speed] = [AT_REST]  # each class's speed, as the last tick priced it (set_classes)
        self._alloc_monitors(max(1, capacity))
        self._alloc_members(max(1, capacity))

    # -- storage ----------------------------------------------------------------------------------------------------

    def _alloc_monitors(self, capacity: int) -> None:
        cap = self.rules.max_events_per_minute
        self._grow({
            "_meets": np.zeros(capacity, dtype=bool),
            "_seq": np.zeros(capacity, dtype=np.int64),
            "_last_change": np.full(capacity, -math.inf),
            "_events": np.full((capacity, cap), -math.inf),
            "_ring": np.zeros(capacity, dtype=np.int64),
            "_class": np.zeros(capacity, dtype=np.int64),
        }, self._n)

    def _alloc_members(self, capacity: int) -> None:
        self._grow({
            "_of": np.zeros(capacity, dtype=np.int64),
            "_pos": np.zeros(capacity, dtype=np.int64),
            "_base": np.zeros(capacity),
            "_device": np.zeros(capacity, dtype=np.int8),
            "_mem": np.zeros(capacity),
            "_written": np.zeros(capacity),
            "_stream": np.zeros(capacity),
            "_gemm": np.zeros(capacity),
            "_rate": np.zeros(capacity),
            "_deadline": np.zeros(capacity),
            "_corr": np.zeros(capacity),
            "_mmeets": np.zeros(capacity, dtype=bool),
        }, self._k)

    def _grow(self, arrays: dict[str, np.ndarray], used: int) -> None:
        for name, arr in arrays.items():
            old = getattr(self, name, None)
            if old is not None:
                arr[:used] = old[:used]
            setattr(self, name, arr)

    def __len__(self) -> int:
        return self._n

    def __contains__(self, monitor: str) -> bool:
        return monitor in self._index

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def _rows(self, i: int) -> np.ndarray:
        """Monitor row i's member rows, in their order."""
        rows = np.flatnonzero(self._of[: self._k] == i)
        return rows[np.argsort(self._pos[rows])]

    def add(self, monitor: str, members: Sequence[Member], meets: bool, seq: int,
            member_meets: Sequence[bool] | None = None) -> None:
        """Add (or replace) a monitor with its present value and sequence number."""
        if not members:
            raise ValueError("a monitor has at least one member")
        if monitor in self._index:
            self.remove(monitor)
        if self._n == len(self._meets):
            self._alloc_monitors(2 * len(self._meets))
        while self._k + len(members) > len(self._base):
            self._alloc_members(2 * len(self._base))
        i = self._n
        self._meets[i], self._seq[i], self._last_change[i] = meets, seq, -math.inf
        self._events[i, :], self._ring[i], self._class[i] = -math.inf, 0, 0
        for pos, m in enumerate(members):
            j = self._k + pos
            self._of[j], self._pos[j], self._base[j] = i, pos, m.base_ms
            self._device[j], self._mem[j], self._written[j] = DEVICE_INDEX[m.device], m.memory_bytes, m.written_mb
            self._stream[j], self._gemm[j] = m.stream_ms, m.gemm_ms
            self._rate[j], self._deadline[j], self._corr[j] = m.rate_hz, m.deadline_ms, 0.0
            self._mmeets[j] = meets if member_meets is None else member_meets[pos]
        self._k += len(members)
        self._ids.append(monitor)
        self._index[monitor] = i
        self._n += 1
        self.last_seq = max(self.last_seq, seq)

    def hold(self) -> None:
        """Every monitor held now keeps its answer until `release()`: the agent's own restart, until its present
        speed has a full reading again, must not read as a change of the device (a first sample is partial)."""
        self._last_change[:self._n] = math.inf

    def release(self) -> None:
        """The held monitors follow the present speed again (dwell and rate limits as before the hold)."""
        held = self._last_change[:self._n] == math.inf
        self._last_change[:self._n][held] = -math.inf

    def remove(self, monitor: str) -> None:
        i = self._index.pop(monitor)
        for j in sorted(self._rows(i).tolist(), reverse=True):  # its members first, from the end
            self._move_member(self._k - 1, j)
            self._k -= 1
        last = self._n - 1
        if i != last:
            for name in _MONITOR_ARRAYS:
                arr = getattr(self, name)
                arr[i] = arr[last]
            self._of[: self._k][self._of[: self._k] == last] = i
            moved = self._ids[last]
            self._ids[i] = moved
            self._index[moved] = i
        self._ids.pop()
        self._n -= 1

    def _move_member(self, src: int, dst: int) -> None:
        if src != dst:
            for name in _MEMBER_ARRAYS:
                arr = getattr(self, name)
                arr[dst] = arr[src]

    def member_rows(self, monitor: str) -> list[int]:
        """Its members' rows (in `latencies`), in their order."""
        return self._rows(self._index[monitor]).tolist()

    def meets(self, monitor: str) -> bool:
        return bool(self._meets[self._index[monitor]])

    def member_meets(self, monitor: str) -> tuple[bool, ...]:
        return tuple(self._mmeets[self._rows(self._index[monitor])].tolist())

    def seq(self, monitor: str) -> int:
        return int(self._seq[self._index[monitor]])

    def next_seq(self) -> int:
        """Take the next sequence number (for a new monitor's first value)."""
        self.last_seq += 1
        return self.last_seq

    def answers(self) -> dict[str, Answer]:
        """Every monitor's present answer, its seq and its members' answers (one pass over the members)."""
        n, k = self._n, self._k
        if n == 0:
            return {}
        order = np.lexsort((self._pos[:k], self._of[:k]))  # by monitor, then by place
        members = np.split(self._mmeets[:k][order], np.cumsum(np.bincount(self._of[:k], minlength=n))[:-1])
        return {monitor: Answer(seq, meets, tuple(m.tolist())) for monitor, seq, meets, m in
                zip(self._ids, self._seq[:n].tolist(), self._meets[:n].tolist(), members, strict=True)}

    def answer(self, monitor: str) -> Answer:
        """One monitor's present answer."""
        i = self._index[monitor]
        return Answer(int(self._seq[i]), bool(self._meets[i]), tuple(self._mmeets[self._rows(i)].tolist()))

    def set_base(self, monitor: str, bases: Sequence[float], streams: Sequence[float] | None = None,
                 gemms: Sequence[float] | None = None) -> None:
        """Its members' calibrated latencies (and stream_ms, gemm_ms) again (a calibration was redone)."""
        rows = self._rows(self._index[monitor])
        self._base[rows] = bases
        if streams is not None:
            self._stream[rows] = streams
        if gemms is not None:
            self._gemm[rows] = gemms

    def streams(self, share: float) -> bool:
        """Whether any CPU member's streamed time is at least `share` of its calibrated latency (a memory slowdown
        would move it; the GPU's memory no probe reads)."""
        k = self._k
        stream, cpu = self._stream[:k], self._device[:k] == DEVICE_INDEX["cpu"]
        return bool(np.any(cpu & (stream > 0) & (stream >= share * self._base[:k])))

    def set_corrections(self, monitor: str, log_corrections: Sequence[float]) -> None:
        """Its members' learnt log-corrections (monitors/warm.py)."""
        self._corr[self._rows(self._index[monitor])] = log_corrections

    def speed_of(self, monitor: str) -> Speed:
        """The speed the monitor was last priced at (its class's, as `set_classes` last said)."""
        return self.speeds[int(self._class[self._index[monitor]])]

    def set_classes(self, speeds: Sequence[Speed], classes: dict[str, int]) -> None:
        """The speed of each class (`speeds[c]`, evaluate's) and every monitor's class: those in `classes` as
        given, the others 0 (the device as everyone sees it)."""
        self.speeds = list(speeds)
        self._class[:self._n] = 0
        for monitor, speed_class in classes.items():
            self._class[self._index[monitor]] = speed_class

    # -- evaluation -------------------------------------------------------------------------------------------------

    def latencies(self, speeds: Speed | Sequence[Speed]) -> np.ndarray:
        """Present latency of every member (member rows), each at its monitor's speed, with its correction.

        A member that does not fit in its device's free memory cannot run there now: infinite. On the CPU,
        only while its monitor is not met: once met, its own app may be what holds that memory (an LLM's
        weights and KV cache), and its own success must not turn it false. (An app that says it runs its
        workload gets its memory back in its own speed: monitors/tick.py.)"""
        speeds = (speeds,) if isinstance(speeds, Speed) else speeds
        k = self._k
        lat = np.empty(k)
        member_class = self._class[self._of[:k]]
        held = self._meets[self._of[:k]] & (self._device[:k] == DEVICE_INDEX["cpu"])
        memory = np.where(held, 0.0, self._mem[:k])
        for c in np.unique(member_class).tolist():
            at = member_class == c
            lat[at] = latencies_ms(self._base[:k][at], self._device[:k][at], memory[at], self._written[:k][at],
                                   speeds[c], self._stream[:k][at], self._gemm[:k][at])
        return lat * np.exp(self._corr[:k])

    def evaluate(self, now: float, speeds: Speed | Sequence[Speed], veto: bool = False) -> list[Change]:
        """Apply one tick at the present speed(s); return the monitors that changed, with their new seq.

        `speeds[c]` prices the monitors of speed class c (a single Speed: every monitor); `veto` forces
        meetsRequirement false (a user policy).
        """
        n, k = self._n, self._k
        if n == 0:
            return []
        r = self.rules
        want, new_members, flip, members = self._wanted(speeds, veto)
        if not flip.any():
            return []
        meets, member_meets = self._meets[:n], self._mmeets[:k]
        flip &= (now - self._last_change[:n]) >= r.dwell_s
        oldest = self._events[np.arange(n), self._ring[:n]]
        flip &= (now - oldest) >= RATE_WINDOW_S
        idx = np.flatnonzero(flip)
        if idx.size == 0:
            return []
        meets[idx] = want[idx]
        moving = flip[self._of[:k]]
        member_meets[moving] = new_members[moving]  # a lone workload's answer moves with its monitor's
        self._seq[idx] = self.last_seq + np.arange(1, idx.size + 1)
        self.last_seq += int(idx.size)
        self._last_change[idx] = now
        self._events[idx, self._ring[idx]] = now
        self._ring[idx] = (self._ring[idx] + 1) % r.max_events_per_minute
        grouped = members[idx] > 1  # only a group lists its members' answers
        changes = []
        for i, seq, group in zip(idx.tolist(), self._seq[idx].tolist(), grouped.tolist(), strict=True):
            answers = tuple(member_meets[self._rows(i)].tolist()) if group else None
            changes.append(Change(self._ids[i], bool(meets[i]), seq, answers))
        return changes

    def would_change(self, speeds: Speed | Sequence[Speed], veto: bool = False) -> bool:
        """Whether any monitor's answer would move at these speeds, dwell and rate cap aside: a dry run of
        `evaluate` that changes nothing (monitors/steady.py asks it at the edges of a band of speeds)."""
        return self._n > 0 and bool(self._wanted(speeds, veto)[2].any())

    def _wanted(self, speeds: Speed | Sequence[Speed], veto: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """At these speeds: each monitor's wanted answer, each member's, which monitors would flip (their answer
        or, in a group, a member's), and each monitor's member count. Hysteresis applies; dwell and the rate cap
        are evaluate's."""
        n, k = self._n, self._k
        r = self.rules
        response, utilisation = response_times(self.latencies(speeds), self._rate[:k], self._of[:k], n)
        meets, member_meets = self._meets[:n], self._mmeets[:k]
        if veto:
            new_members = np.zeros(k, dtype=bool)
            fits = np.zeros(n, dtype=bool)
        else:
            deadline = self._deadline[:k]
            # an infinite deadline ('poor') is met by every finite response
            new_members = np.where(member_meets, response < deadline * (1.0 + r.margin),
                                   response < deadline * (1.0 - r.margin))
            fits = np.where(meets, utilisation < UTILISATION_BOUND * (1.0 + r.margin),
                            utilisation < UTILISATION_BOUND * (1.0 - r.margin))
        failing = np.bincount(self._of[:k], weights=~new_members, minlength=n)
        want = fits & (failing == 0)
        members = np.bincount(self._of[:k], minlength=n)
        # a group's workloads' answers are published too: one moving is a change; a lone workload's is the
        # monitor's own, which `want` covers
        member_moved = (np.bincount(self._of[:k], weights=new_members != member_meets, minlength=n) > 0) & (members > 1)
        return want, new_members, (want != meets) | member_moved, members

    def on_cpu_only(self) -> bool:
        """Whether every member runs on the CPU (no accelerator's load or memory prices any)."""
        return bool(np.all(self._device[:self._k] == DEVICE_INDEX["cpu"]))

    def uniform_class(self) -> bool:
        """Whether every monitor is priced at the device's speed as everyone sees it (class 0: no app runs its own)."""
        return not np.any(self._class[:self._n])


def response_times(latency_ms: np.ndarray, rate_hz: np.ndarray, monitor_of: np.ndarray,
                   monitors: int) -> tuple[np.ndarray, np.ndarray]:
    """Each member's response time (its latency stretched by the device time its group's other members take:
    latency / (1 - U_others)) and each monitor's utilisation (the share of the device its members keep busy,
    rate x latency summed; a member without a rate takes no sustained share)."""
    busy = np.multiply(rate_hz, latency_ms / 1000.0, out=np.zeros_like(latency_ms), where=rate_hz > 0)
    utilisation = np.bincount(monitor_of, weights=busy, minlength=monitors)
    others = utilisation[monitor_of] - busy
    with np.errstate(divide="ignore", invalid="ignore"):
        response = np.where(others < 1.0, latency_ms / np.maximum(1.0 - others, 1e-12), math.inf)
    return response, utilisation


def initial_answer(latencies_ms: Sequence[float], members: Sequence[Member], veto: bool = False,
                   ) -> tuple[bool, tuple[bool, ...]]:
    """A new monitor's first value and its members', from their present latencies: plain comparisons, no
    hysteresis yet."""
    lat = np.asarray(latencies_ms, dtype=np.float64)
    response, utilisation = response_times(lat, np.array([m.rate_hz for m in members]),
                                           np.zeros(len(members), dtype=np.int64), 1)
    member_meets = tuple((not veto) and bool(r < m.deadline_ms) for r, m in zip(response, members, strict=True))
    return (not veto) and bool(utilisation[0] < UTILISATION_BOUND) and all(member_meets), member_meets


def initial_meets(latency_ms: float, bound: float, veto: bool = False) -> bool:
    """A one-member monitor's first value: a plain comparison, no hysteresis yet."""
    return bool((not veto) and latency_ms < bound)
