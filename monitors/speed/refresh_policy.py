"""When to run a warm refresh: periodically, and soon after the device's state changes markedly.

Pure: the caller passes each sampled state and the time. A refresh costs CPU, so the policy keeps
refreshes within a budget of a core however much the state flaps (docs/device-state.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from probes.state import DeviceState


@dataclass(frozen=True)
class Marks:
    """The parts of a DeviceState whose change calls for a new measurement."""

    throttling: bool | None
    demand: float | None  # other tasks wanting a CPU (CpuState.demand)
    power_mode: str | None
    plugged: bool | None
    limit_mhz: float | None
    epp: str | None

    @classmethod
    def of(cls, state: DeviceState) -> Marks:
        return cls(
            throttling=state.thermal.cpu_throttling,
            demand=state.cpu.demand,
            power_mode=state.power.power_mode,
            plugged=state.battery.plugged,
            limit_mhz=state.cpu.limit_mhz,
            epp=state.power.epp,
        )

    def differs(self, other: Marks, load_delta_cores: float) -> str | None:
        """Why `other` is markedly different from these marks, or None."""
        if bool(self.throttling) != bool(other.throttling):
            return "throttling"
        a, b = self.demand, other.demand
        if a is not None and b is not None and abs(a - b) > load_delta_cores:
            return "load"
        if self.power_mode != other.power_mode:
            return "power mode"
        if self.plugged != other.plugged:
            return "plugged"
        if self.epp != other.epp:
            return "energy/performance preference"
        x, y = self.limit_mhz, other.limit_mhz
        if (x is None) != (y is None) or (x and y and abs(x - y) > 0.05 * max(x, y)):
            return "clock limit"
        return None


# The agent's max_period_s, in periods: at rest, each refresh wakes onnxruntime's threads hundreds of times.
REFRESH_BACKOFF = 8


@dataclass
class RefreshPolicy:
    """When to run a warm refresh (pure: the caller passes the time).

    Due every `period_s`, and as soon as the budget allows after a marked state
    change (throttling flips, load by others moves by more than
    `load_delta_cores` since the last measurement, power mode, plugged, EPP or
    clock limit changes). After a refresh that cost `cpu_s` of CPU, the next
    one waits at least cpu_s / budget_fraction, so that refreshes never take
    more than `budget_fraction` of a core on average, however much the state
    flaps.

    With `max_period_s` above `period_s`, a refresh that no marked change
    called for doubles the period (up to `max_period_s`): at rest, with the
    state unchanged, refreshes grow rare; a marked change brings the period
    back to `period_s` and a refresh as soon as the budget allows.
    """

    period_s: float = 60.0
    max_period_s: float | None = None  # None: the period stays `period_s`
    current_period_s: float = field(default=0.0)  # the period now (0: `period_s`, set in __post_init__)
    load_delta_cores: float = 0.5
    budget_fraction: float = 0.01
    min_gap_s: float = 2.0
    last_refresh_at: float | None = None
    last_change_at: float | None = None
    last_change: str | None = None
    next_allowed_at: float = -math.inf
    _baseline: Marks | None = field(default=None, repr=False)  # the state of the last measurement
    _changed_to: Marks | None = field(default=None, repr=False)  # the state that last marked a change

    def __post_init__(self) -> None:
        if not self.current_period_s:
            self.current_period_s = self.period_s

    def observe(self, state: DeviceState, now: float) -> str | None:
        """Feed each sampled state; returns what changed markedly (and records when), or None."""
        marks = Marks.of(state)
        if self._baseline is None:
            self._baseline = marks
            return None
        why = self._baseline.differs(marks, self.load_delta_cores)
        if why is None:
            return None
        if self._changed_to is not None and self._changed_to.differs(marks, self.load_delta_cores) is None:
            return None  # the same change as before, still pending
        self._changed_to = marks
        self.last_change_at = now
        self.last_change = why
        self.current_period_s = self.period_s
        return why

    def change_pending(self) -> bool:
        if self.last_change_at is None:
            return False
        return self.last_refresh_at is None or self.last_change_at > self.last_refresh_at

    def due(self, now: float) -> bool:
        if now < self.next_allowed_at:
            return False
        if self.last_refresh_at is None or self.change_pending():
            return True
        return now - self.last_refresh_at >= self.current_period_s

    def next_due(self) -> float:
        """When `due` turns true if the state stays as it is (-inf: it is already, or no refresh has run yet)."""
        if self.last_refresh_at is None or self.change_pending():
            return -math.inf
        return max(self.next_allowed_at, self.last_refresh_at + self.current_period_s)

    @property
    def baseline(self) -> Marks | None:
        """The marks of the last measurement's state: one that differs from them markedly is a change to measure."""
        return self._baseline

    def refreshed(self, state: DeviceState, started_at: float, cpu_s: float) -> None:
        """Record a refresh that started at `started_at` (in `state`) and cost `cpu_s` of CPU."""
        periodic = self.last_refresh_at is not None and not self.change_pending()
        if periodic and self.max_period_s is not None:
            self.current_period_s = min(self.max_period_s, max(self.period_s, 2.0 * self.current_period_s))
        self.last_refresh_at = started_at
        self._baseline = Marks.of(state)
        self._changed_to = None
        self.next_allowed_at = started_at + max(self.min_gap_s, cpu_s / self.budget_fraction)

    def failed(self, started_at: float, cpu_s: float) -> None:
        """Record a refresh that measured nothing (it failed, or overlapped the agent's own work): its CPU
        counts against the budget; the last measurement and its state stay as they were."""
        self.next_allowed_at = started_at + max(self.min_gap_s, cpu_s / self.budget_fraction)

    def measurement_current(self) -> bool:
        """True when the latest measurement was taken after the last marked state change."""
        return self.last_refresh_at is not None and not self.change_pending()
