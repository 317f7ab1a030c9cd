"""The device's monitors as the agent holds them in memory: each one's record, who owns it, its lease, what its
app taught it, and the monitor table with its answers. No I/O: the registry (agent/registry.py) loads them
from disk, saves each change before it is sent, and calls these under its lock.

A monitor belongs to the client that created it (its owner, from the request's topic; "" for the shared
topics): only that owner lists, replaces, deletes, reports on or says it runs it. To anyone else it is not
there.

Apps tell the agent two things about their own monitors. That they run its workloads here now (`running`):
the monitor is then priced at a speed of its own class, which leaves the app's own run out (monitors/tick.py).
And what they measured (`report`): a bounded correction of each workload's estimate is learnt from it
(monitors/warm.py) and moves that monitor's answers only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from agent.store import StoredMonitor
from monitors.errors import BadInput
from monitors.speed.present import PresentSpeed
from monitors.table import Change, MonitorRules, MonitorTable
from monitors.tick import Run, Taught, tick
from monitors.warm import Learnt, reduce


class MonitorBook:
    """Every monitor's record and what its app taught it, its lease, and the table of their answers."""

    def __init__(self, rules: MonitorRules, max_monitors: int, max_per_owner: int | None = None) -> None:
        self.table = MonitorTable(rules)  # the one holder of each monitor's answer, seq, class and correction
        self.records: dict[str, StoredMonitor] = {}
        self.learnt: dict[str, list[Learnt]] = {}  # monitor -> one per workload
        self.max_monitors = max_monitors
        self.max_per_owner = max_per_owner  # None: no share below max_monitors
        self._taught: set[str] = set()  # the monitors whose learnt corrections hold reports
        self._expires: dict[str, float] = {}  # a leased monitor -> when it is deleted unless renewed (monotonic)

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, monitor: str) -> bool:
        return monitor in self.records

    def add(self, m: StoredMonitor, learnt: list[Learnt] | None = None) -> None:
        """A monitor as loaded or created (its lease full from now), with what its app taught it (None: nothing)."""
        self.records[m.monitor] = m
        if m.lease_s is not None:
            self._expires[m.monitor] = time.monotonic() + m.lease_s
        self.table.add(m.monitor, [w.member() for w in m.workloads], m.meets, m.seq, m.member_meets)
        self.set_learnt(m.monitor, learnt or [Learnt() for _ in m.workloads])

    def forget(self, monitor: str) -> None:
        self.records.pop(monitor, None)
        self._expires.pop(monitor, None)
        self.learnt.pop(monitor, None)
        self._taught.discard(monitor)
        if monitor in self.table:
            self.table.remove(monitor)

    def set_learnt(self, monitor: str, learnt: list[Learnt]) -> None:
        self.learnt[monitor] = learnt
        if any(x.reports for x in learnt):
            self._taught.add(monitor)
        else:
            self._taught.discard(monitor)

    # -- owners and room --------------------------------------------------------------------------------------------

    def record(self, monitor: str, owner: str | None = None) -> StoredMonitor:
        """The monitor, as its owner asks for it (None: the agent's own look-up). Another owner's is not there."""
        rec = self.records.get(monitor)
        if rec is None or (owner is not None and rec.owner != owner):
            raise BadInput(f"no monitor {monitor!r} of yours on this device", "unknown_monitor")
        return rec

    def check_owner(self, monitor: str, owner: str) -> None:
        """A monitor id another owner holds cannot be taken over."""
        rec = self.records.get(monitor)
        if rec is not None and rec.owner != owner:
            raise BadInput(f"monitor id {monitor!r} is taken by another client; pick another", "monitor_taken")

    def check_room(self, monitor: str, owner: str = "") -> None:
        """Room for one more monitor: on the device (`max_monitors`) and in its owner's share
        (`max_per_owner`), so that one app cannot take every monitor the device holds."""
        if monitor in self.records:
            return
        if len(self.records) >= self.max_monitors:
            raise BadInput(f"this device already has {len(self.records)} monitors, the limit", "too_many_monitors")
        if self.max_per_owner is not None:
            mine = sum(1 for r in self.records.values() if r.owner == owner)
            if mine >= self.max_per_owner:
                raise BadInput(f"you already have {mine} monitors on this device, one client's limit",
                               "too_many_monitors")

    # -- leases -----------------------------------------------------------------------------------------------------

    def renew(self, monitors: Sequence[str], owner: str, now: float) -> tuple[list[str], list[str]]:
        """The owner's leased monitors among `monitors` live `lease_s` from `now` (monotonic) again: (renewed,
        unknown). A monitor without a lease needs none: it counts as renewed."""
        renewed, unknown = [], []
        for monitor in monitors:
            rec = self.records.get(monitor)
            if rec is None or rec.owner != owner:
                unknown.append(monitor)
                continue
            if rec.lease_s is not None:
                self._expires[monitor] = now + rec.lease_s
            renewed.append(monitor)
        return renewed, unknown

    def next_expiry(self) -> float:
        """When the next leased monitor is deleted unless renewed (monotonic; inf: none is leased)."""
        return min(self._expires.values(), default=math.inf)

    def lease_ends(self, monitor: str) -> float:
        """When the monitor is deleted unless renewed (monotonic; inf: it has no lease)."""
        return self._expires.get(monitor, math.inf)

    def expired(self, now: float) -> list[StoredMonitor]:
        """The leased monitors nobody renewed in time (their clients have gone)."""
        return [self.records[m] for m, at in self._expires.items() if at <= now]

    # -- what apps say ----------------------------------------------------------------------------------------------

    def report(self, monitor: str, workload: str | None, latencies_ms: Sequence[float], now: float,
               owner: str = "") -> None:
        """Latencies the app measured running one of the monitor's workloads here, learnt against the agent's
        estimate at the speed its class was last priced at (what it answers now, before any correction)."""
        rec = self.record(monitor, owner)
        names = [w.name for w in rec.workloads]
        if workload is None and len(names) > 1:
            raise BadInput(f"monitor {monitor!r} is a group: say which workload, one of {', '.join(names)}",
                           "bad_workload")
        if workload is not None and workload not in names:
            raise BadInput(f"monitor {monitor!r} has no workload {workload!r}", "bad_workload")
        w = rec.workloads[names.index(workload) if workload is not None else 0]
        estimate = w.present_ms(self.table.speed_of(monitor))
        try:
            learnt = reduce(latencies_ms, estimate, estimate / w.base_ms[w.device], now)
        except ValueError as exc:
            raise BadInput(str(exc), "bad_report") from None
        self.learnt[monitor][rec.workloads.index(w)].add(learnt)
        self.set_learnt(monitor, self.learnt[monitor])

    def running_pids(self) -> frozenset[int]:
        """The processes of apps that run their monitors' workloads here now and said which (to be measured)."""
        return frozenset(r.running.pid for r in self.records.values() if r.running and r.running.pid)

    # -- the tick ---------------------------------------------------------------------------------------------------

    def tick(self, present: PresentSpeed, now: float, veto: bool) -> list[Change]:
        """One tick of every monitor at the present speed (monitors/tick.py): those whose answer changed."""
        runs = [Run(rec.monitor, tuple(w.member() for w in rec.workloads), rec.running.pid or None,
                    rec.running.rate_hz or 0.0)
                for rec in self.records.values() if rec.running is not None]
        taught = [Taught(m, tuple(w.member() for w in self.records[m].workloads), tuple(self.learnt[m]))
                  for m in self._taught]
        return tick(self.table, present, runs, taught, now, time.time(), veto)

    def estimates_ms(self) -> dict[str, list[float]]:
        """Each monitor's workloads' present latencies, as its monitor prices them at the last tick's speeds
        (local only: figures)."""
        latencies = self.table.latencies(self.table.speeds)
        return {monitor: [round(float(latencies[j]), 3) for j in self.table.member_rows(monitor)]
                for monitor in self.records}
