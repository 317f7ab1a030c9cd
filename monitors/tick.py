"""One tick of the device's monitors: the present speed of each workload class, and what each monitor answers now.

One function, `tick`, owns that step. It takes what the agent holds after reading the device: the present
speed (monitors/speed/present.py, made from the readings and the agent's own work), the apps' declared runs
and what their reports taught (monitors/warm.py), and the monitor table (monitors/table.py), the one holder
of each monitor's answer, seq, class and correction. It returns the monitors whose answer changed. Nothing
here reads the device or writes a file: the agent stores the changes, then sends them (agent/registry.py).

A workload class is a speed the monitors are priced at: class 0 is the device as everyone sees it; each
monitor whose app says it runs its workloads here now has a class of its own, whose speed leaves that run
out (its CPU as measured from its process tree when the app gave its pid, else what its rate and latency
say it takes) and frees the memory its workloads hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monitors.speed.present import PresentSpeed, Speed, expected_share, fastest, measured_share
from monitors.table import Change, Member, MonitorTable
from monitors.warm import Learnt


@dataclass(frozen=True)
class Run:
    """An app's declared run of one monitor's workloads here now."""

    monitor: str
    members: tuple[Member, ...]
    pid: int | None = None  # its process, measured by the CPU probe (None: not said)
    rate_hz: float = 0.0  # runs a second it said (0: its workloads' sustained rates)


@dataclass(frozen=True)
class Taught:
    """What an app's reports taught one monitor: a Learnt for each of its members, in their order."""

    monitor: str
    members: tuple[Member, ...]
    learnt: tuple[Learnt, ...]


def present_ms(member: Member, speed: Speed) -> float:
    """A member's latency at `speed` before any learnt correction (inf where it does not fit in memory now)."""
    return fastest({member.device: member.base_ms}, speed, member.memory_bytes, member.written_mb,
                   member.stream_ms, member.gemm_ms)[0]


def class_speeds(present: PresentSpeed, runs: Sequence[Run]) -> tuple[list[Speed], dict[str, int]]:
    """The speed of each class ([0]: the device as everyone sees it) and the class of each monitor an app runs
    (the others are in class 0)."""
    general = present.speed
    speeds = [general]
    classes: dict[str, int] = {}
    state = present.priced
    for run in runs:
        share = measured_share(state, run.pid) if state is not None and run.pid else None
        if share is None:  # not measured (no pid, or not yet): what its rate and latency say it takes
            rate = run.rate_hz or sum(m.rate_hz for m in run.members)
            latency = sum(fastest({m.device: m.base_ms}, general)[0] for m in run.members)
            share = expected_share(rate, latency, present.threads, None if state is None else state.cpu.cores)
        classes[run.monitor] = len(speeds)
        held = {d: sum(m.memory_bytes for m in run.members if m.device == d) for d in ("cpu", "gpu")}
        speeds.append(present.for_share(share).holding(held["cpu"], held["gpu"]))
    return speeds, classes


def corrections(taught: Taught, speed: Speed, now: float) -> list[float]:
    """Its members' log-corrections at `speed` (wall-clock `now`): learning fades as the state moves away from
    the one it was taught in."""
    return [x.correction(present_ms(m, speed) / m.base_ms, now)
            for m, x in zip(taught.members, taught.learnt, strict=True)]


def tick(table: MonitorTable, present: PresentSpeed, runs: Sequence[Run], taught: Sequence[Taught],
         now: float, wall: float, veto: bool) -> list[Change]:
    """Each monitor's class and speed, the taught monitors' corrections at them, then every answer: the monitors
    that changed (monotonic `now`, wall-clock `wall`; `veto`: the user's policy forbids local inference)."""
    speeds, classes = class_speeds(present, runs)
    table.set_classes(speeds, classes)
    for t in taught:
        table.set_corrections(t.monitor, corrections(t, table.speed_of(t.monitor), wall))
    return table.evaluate(now, speeds, veto)
