"""A steady device: the band of states inside which no monitor's answer moves, so a sample inside it needs no
evaluation.

The agent samples the device every interval, but at rest almost every sample says what the last one said. After
each evaluation it asks `band` for the states that would change nothing: the CPU's present speed within BAND of
today's either way, the memory available within MEMORY_BAND, the same marks (throttling, power mode, plug, clock
limit, EPP: monitors/speed/refresh_policy.py) and the same battery. Inside that band no monitor flips: a dry run
of the monitor table at the band's slow and fast edges says so, and a monitor's answer moves monotonically with
the speed. A sample inside the band is not handed to the evaluation (the sampler's thread asks
`Steady.holds`); the first one outside it is, at once, so a load that matters is seen as quickly as before.

No band is made where it could hide a change: while a monitor waits out its dwell or rate cap, where a member
runs on an accelerator (its load is not in the band) or an app runs its own monitored workload (its share moves
with every sample), and for longer than MAX_SKIPPED samples, a refresh's due time or a lease's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from monitors.speed.present import Measurement, Speed, speed_from_state
from monitors.speed.refresh_policy import Marks, RefreshPolicy
from monitors.table import MonitorTable
from probes.state import DeviceState

BAND = 1.05  # the CPU's speed may move by this factor either way
MEMORY_BAND = 0.05  # the memory available may move by this share either way
MAX_SKIPPED = 4  # samples in a row that may go unevaluated; the next one is evaluated whatever it says


def _power(state: DeviceState) -> tuple[object, ...]:
    """What the agent's power policy reads (agent/policy.py): a veto moves with it."""
    b = state.battery
    return b.percent, b.present, b.plugged, state.power.power_mode


@dataclass(frozen=True)
class Steady:
    """The band made at one evaluation (`number`: the sample it evaluated), good until `until` (monotonic)."""

    number: int
    until: float
    threads: int  # what prices the CPU (PresentSpeed.threads)
    measurement: Measurement | None
    current: bool  # the measurement was taken in this state (RefreshPolicy.measurement_current)
    marks: tuple[Marks | None, ...]  # the evaluated state's, and the last measurement's (RefreshPolicy.baseline)
    load_delta_cores: float  # a move of others' demand that marks a change (RefreshPolicy)
    power: tuple[object, ...]
    cpu: tuple[float, float]  # the band of the CPU's speed
    available: tuple[float, float]  # ... and of the memory available (bytes; inf where unknown)

    def holds(self, state: DeviceState, now: float) -> bool:
        """Whether `state`, sampled at `now`, lies inside the band: no monitor's answer can have moved."""
        if now >= self.until or _power(state) != self.power:
            return False
        marks = Marks.of(state)
        if any(m is not None and m.differs(marks, self.load_delta_cores) is not None for m in self.marks):
            return False
        speed = speed_from_state(state, self.threads, self.measurement, self.current)
        available = math.inf if speed.mem_available_bytes is None else float(speed.mem_available_bytes)
        return self.cpu[0] <= speed.cpu <= self.cpu[1] and self.available[0] <= available <= self.available[1]


def band(table: MonitorTable, state: DeviceState, speed: Speed, number: int, now: float, interval_s: float,
         expiry: float, *, threads: int, measurement: Measurement | None, current: bool,
         policy: RefreshPolicy | None, veto: bool) -> Steady | None:
    """The band around `state` (priced at `speed`, evaluated as sample `number` at `now`, one every `interval_s`)
    inside which no monitor's answer moves: good for MAX_SKIPPED samples, and until `expiry` (a lease's end) and
    the next refresh at most; None where no band is safe (module docstring)."""
    until = min(now + (MAX_SKIPPED + 0.5) * interval_s, expiry)
    if policy is not None:
        until = min(until, policy.next_due())
    if until <= now or not table.on_cpu_only() or not table.uniform_class() or table.would_change(speed, veto):
        return None
    available = speed.mem_available_bytes
    slow = replace(speed, cpu=speed.cpu * BAND,
                   mem_available_bytes=None if available is None else int(available * (1 - MEMORY_BAND)))
    fast = replace(speed, cpu=speed.cpu / BAND,
                   mem_available_bytes=None if available is None else int(available * (1 + MEMORY_BAND)))
    if table.would_change(slow, veto) or table.would_change(fast, veto):
        return None
    memory = (math.inf, math.inf) if available is None else \
        (available * (1 - MEMORY_BAND), available * (1 + MEMORY_BAND))
    return Steady(number, until, threads, measurement, current,
                  (Marks.of(state), None if policy is None else policy.baseline),
                  RefreshPolicy.load_delta_cores if policy is None else policy.load_delta_cores, _power(state),
                  (speed.cpu / BAND, speed.cpu * BAND), memory)
