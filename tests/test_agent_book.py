"""agent/book.py: the monitors in memory, pure: owners and room, leases, what apps report, one tick."""

from __future__ import annotations

import time

import pytest

from agent.book import MonitorBook
from agent.store import Running, StoredMonitor, StoredWorkload
from monitors.errors import BadInput
from monitors.requirements import Requirement
from monitors.speed.present import PresentSpeed, Speed
from monitors.table import MonitorRules


def stored(monitor: str, owner: str = "", *names: str, lease_s: float | None = None, base_ms: float = 10.0,
           deadline_ms: float = 14.0) -> StoredMonitor:
    requirement = Requirement.parse({"requiredDeadlineMs": deadline_ms})
    workloads = [StoredWorkload(name, requirement, "cpu", {}, {"cpu": base_ms}, 0) for name in names or ("",)]
    return StoredMonitor(monitor, workloads, 1, True, owner=owner, lease_s=lease_s)


def code(call) -> str:
    with pytest.raises(BadInput) as refused:
        call()
    return refused.value.code


def test_an_owner_s_share_of_the_room_and_its_monitors_are_its_own():
    book = MonitorBook(MonitorRules(), max_monitors=3, max_per_owner=2)
    book.add(stored("a1", "app"))
    book.add(stored("a2", "app"))
    assert code(lambda: book.check_room("a3", "app")) == "too_many_monitors"
    book.check_room("a1", "app")  # a replace takes no room
    book.check_room("b1", "other")
    book.add(stored("b1", "other"))
    assert code(lambda: book.check_room("b2", "other")) == "too_many_monitors"  # the device's limit
    assert code(lambda: book.check_owner("a1", "other")) == "monitor_taken"
    assert code(lambda: book.record("a1", "other")) == "unknown_monitor"
    assert book.record("a1", "app").owner == "app" and book.record("a1").monitor == "a1"


def test_a_lease_runs_out_unless_its_owner_renews_it():
    book = MonitorBook(MonitorRules(), max_monitors=10)
    start = time.monotonic()
    book.add(stored("leased", "app", lease_s=10.0))
    book.add(stored("kept", "app"))
    assert book.next_expiry() == pytest.approx(start + 10.0, abs=1.0)
    assert [m.monitor for m in book.expired(start + 11.0)] == ["leased"]
    assert book.renew(["leased", "kept", "nobody"], "other", start + 5.0) == ([], ["leased", "kept", "nobody"])
    assert book.renew(["leased", "kept"], "app", start + 5.0) == (["leased", "kept"], [])
    assert book.expired(start + 11.0) == [] and book.lease_ends("leased") == start + 15.0
    book.forget("leased")
    assert book.next_expiry() == float("inf")


def test_reports_teach_only_their_own_monitor_and_nonsense_is_refused():
    book = MonitorBook(MonitorRules(dwell_s=0.0), max_monitors=10)
    book.add(stored("mine", "app"))
    book.add(stored("group", "app", "a", "b"))
    book.add(stored("theirs", "other"))
    present = PresentSpeed.at(Speed())
    assert book.tick(present, 0.0, False) == []
    assert code(lambda: book.report("group", None, [20.0], 1.0, "app")) == "bad_workload"
    assert code(lambda: book.report("group", "c", [20.0], 1.0, "app")) == "bad_workload"
    assert code(lambda: book.report("mine", None, [-1.0], 1.0, "app")) == "bad_report"
    assert code(lambda: book.report("theirs", None, [20.0], 1.0, "app")) == "unknown_monitor"
    for _ in range(5):
        book.report("mine", None, [20.0] * 10, time.time(), "app")  # twice the 10 ms estimate
    assert [(c.monitor, c.meets) for c in book.tick(present, 1.0, False)] == [("mine", False)]


def test_a_monitor_its_app_runs_has_a_class_of_its_own_while_it_runs():
    book = MonitorBook(MonitorRules(), max_monitors=10)
    running = stored("run", "app")
    running.running = Running(True, 30.0, 4242)
    book.add(running)
    book.add(stored("idle", "app"))
    assert book.running_pids() == frozenset({4242})
    book.tick(PresentSpeed.at(Speed()), 0.0, False)
    assert len(book.table.speeds) == 2  # the device's, and the run's own class
    running.running = None
    book.tick(PresentSpeed.at(Speed()), 1.0, False)
    assert len(book.table.speeds) == 1 and book.running_pids() == frozenset()
