"""Workloads, pure: rates and deadlines, groups that share the device, an app's own run left out of its own
monitor's price, and learning from reported latencies (WARM)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from agent.simulation.trees import laptop
from monitors.pricing.tiers import bound_ms
from monitors.requirements import Requirement
from monitors.speed.present import PresentSpeed, Share, Speed, expected_share, measured_share, speed_from_state, without
from monitors.table import Member, MonitorRules, MonitorTable, initial_answer
from monitors.tick import Run, Taught, tick
from monitors.warm import MAX_LOG_CORRECTION, Learnt, reduce
from probes.cpu import TreeShare
from probes.state import Sampler

RULES = MonitorRules(margin=0.1, dwell_s=0.0, max_events_per_minute=60)
NO_LOAD = dataclasses.replace  # (readability in the tests below)


def speed(cpu: float = 1.0):

    return Speed(cpu=cpu)


def member(base_ms: float, requirement: Requirement) -> Member:
    return Member(base_ms, "cpu", requirement.deadline_ms, requirement.sustained_hz)


# -- rates and deadlines ----------------------------------------------------------------------------------------------

def test_a_frame_rate_bounds_each_run_by_its_period_and_the_device_time_it_takes():
    thirty = Requirement(rate_hz=30.0)
    assert thirty.deadline_ms == pytest.approx(1000 / 30) and thirty.sustained_hz == 30.0
    # 20 ms a frame at 30 fps: 60 % of the device, each run within 33 ms: met
    assert initial_answer([20.0], [member(20.0, thirty)]) == (True, (True,))
    # 31 ms: within its 33 ms period, but 93 % of the device leaves no room (the bound is 90 %)
    assert initial_answer([31.0], [member(31.0, thirty)]) == (False, (True,))
    # a tighter deadline than the period: 20 ms within 16 ms fails the run, not the rate
    assert initial_answer([20.0], [member(20.0, Requirement(rate_hz=30.0, deadline=16.0))]) == (False, (False,))


def test_a_rate_monitor_flips_on_its_period_with_hysteresis():
    t = MonitorTable(RULES)
    t.add("cam", [member(10.0, Requirement(rate_hz=30.0))], meets=True, seq=1)
    assert t.evaluate(0.0, speed(2.9)) == []  # 29 ms, 87 % of the device: inside both bands
    (change,) = t.evaluate(1.0, speed(3.5))  # 35 ms: within 33 ms x 1.1, but 105 % of the device: false
    assert change.meets is False and change.members is None  # a lone workload's answer is the monitor's
    assert t.evaluate(2.0, speed(2.8)) == []  # 84 % and 28 ms: not yet below 81 % and 30 ms
    assert t.evaluate(3.0, speed(2.4))[0].meets is True  # 72 %, 24 ms


# -- groups ----------------------------------------------------------------------------------------------------------

CALL = [("blur", Requirement(rate_hz=30.0), 12.0), ("noise", Requirement(rate_hz=100.0, deadline=5.0), 1.0),
        ("captions", Requirement(rate_hz=1.0), 120.0)]


def group(blur_rate: float = 30.0) -> list[Member]:
    members = []
    for name, requirement, base in CALL:
        if name == "blur":
            requirement = Requirement(rate_hz=blur_rate)
        members.append(member(base, requirement))
    return members


def test_a_group_fits_then_stops_fitting_when_a_member_s_rate_doubles():
    """Blur at 30 fps (12 ms), noise suppression at 100 Hz (1 ms, within 5 ms), captions at 1 Hz (120 ms): 36 +
    10 + 12 = 58 % of the device, and each run within its deadline even stretched by the others' share. Blur
    at 60 fps: 94 % of the device, over the 90 % bound, and noise suppression's run, stretched by the 84 %
    the others take, misses its 5 ms."""
    latencies = [base for _, _, base in CALL]
    assert initial_answer(latencies, group(30.0)) == (True, (True, True, True))
    assert initial_answer(latencies, group(60.0)) == (False, (True, False, True))
    t = MonitorTable(RULES)
    t.add("call", group(30.0), meets=True, seq=1)
    assert t.evaluate(0.0, speed(1.3)) == []  # 76 %: still fits
    (change,) = t.evaluate(1.0, speed(2.0))  # 116 %
    assert change.meets is False and change.members == (False, False, False)


def test_a_group_s_members_answer_apart_and_an_event_goes_out_when_one_moves():
    t = MonitorTable(RULES)
    t.add("call", group(), meets=True, seq=1)
    t.add("solo", [member(11.5, Requirement("excellent"))], meets=True, seq=2)
    # 1.5x slower: 18 ms blur (54 %), 1.5 ms noise (15 %), 180 ms captions (18 %): 87 %, under the bound with
    # its margin; blur's run, stretched by the others' 33 %, is 26.9 ms, within its 33 ms; noise's, stretched by
    # 72 %, is 5.4 ms: past 5 ms but within its margin; captions' 180 ms within a second. Then 1.6x: noise's
    # 6.2 ms misses: its answer moves, the monitor's with it, and the solo one (18.4 ms) misses 16 ms too
    assert t.evaluate(0.0, speed(1.5)) == []
    changes = {c.monitor: c for c in t.evaluate(1.0, speed(1.6))}
    assert changes["call"].meets is False and changes["call"].members == (True, False, True)
    assert changes["solo"].meets is False and changes["solo"].members is None
    assert t.member_meets("call") == changes["call"].members


def test_a_veto_turns_every_workload_false():
    t = MonitorTable(RULES)
    t.add("call", group(), meets=True, seq=1)
    (change,) = t.evaluate(0.0, speed(1.0), veto=True)
    assert change.meets is False and change.members == (False, False, False)


def test_removing_a_group_keeps_the_other_monitors_members():
    t = MonitorTable(RULES)
    t.add("a", [member(10.0, Requirement("good"))], meets=True, seq=1)
    t.add("call", group(), meets=True, seq=2)
    t.add("b", [member(50.0, Requirement("good"))], meets=True, seq=3)
    t.remove("call")
    assert t.latencies(speed(1.0)).tolist() == [10.0, 50.0]
    assert t.evaluate(0.0, speed(2.5)) == [("b", False, 4, None)]  # 125 ms: b only


# -- an app's own run -------------------------------------------------------------------------------------------------

@pytest.fixture
def busy_laptop(tmp_path):
    """A laptop fixture tree's state with 1.6 cores kept busy by others and 2.2 tasks wanting a CPU, of which an
    app (pid 4242) that runs its monitor's model took 0.9 cores and 1.2 tasks."""
    tree = laptop(tmp_path)
    tree.set_stat(busy=1000, idle=9000)
    sampler = Sampler(tree.sys, tree.proc)
    sampler.sample()
    tree.set_stat(busy=1160, idle=9040)
    state = sampler.sample()
    cpu = dataclasses.replace(state.cpu, others_busy_cores=1.6, busy_cores=1.6, runnable_others=2.2,
                              tracked={4242: TreeShare(0.9, 0.3)})
    return dataclasses.replace(state, cpu=cpu)


def test_laptop_fixture_tree_an_app_s_own_run_is_left_out_of_its_own_monitor_s_speed(busy_laptop):
    share = measured_share(busy_laptop, 4242)
    assert share == Share(0.9, 1.2)
    assert measured_share(busy_laptop, 7) is None  # not measured: not tracked
    seen_by_app = without(busy_laptop, share)
    assert seen_by_app.cpu.others_busy_cores == pytest.approx(0.7)
    assert seen_by_app.cpu.runnable_others == pytest.approx(1.0)
    everyone = speed_from_state(busy_laptop, 4)
    present = PresentSpeed(threads=4)
    present.observe(busy_laptop, 0.0)
    assert present.for_share(share).cpu < everyone.cpu  # its own run is not contention against itself
    assert present.speed == everyone  # everyone else still sees the app's run as load


def test_laptop_fixture_tree_one_tick_prices_the_monitor_its_app_runs_at_a_speed_without_that_run(busy_laptop):
    """monitors/tick.py: two monitors of the same model and deadline; the app of one says it runs it here (pid
    4242): only the other turns false under a load that the first's app makes itself."""
    present = PresentSpeed(threads=4)
    present.observe(busy_laptop, 0.0)
    own = present.for_share(measured_share(busy_laptop, 4242))
    assert own.cpu < 0.9 * present.speed.cpu  # the app's run is most of the load
    base = 10.0
    deadline = base * (own.cpu + present.speed.cpu) / 2 / (1 + RULES.margin)  # stops met between the two speeds
    table = MonitorTable(RULES)
    for monitor in ("mine", "theirs"):
        table.add(monitor, [Member(base, "cpu", deadline)], True, 1)
    run = Run("mine", (Member(base, "cpu", deadline),), pid=4242)
    changes = tick(table, present, [run], [], now=1.0, wall=0.0, veto=False)
    assert [(c.monitor, c.meets) for c in changes] == [("theirs", False)]
    assert table.speed_of("mine") == own and table.speed_of("theirs") == present.speed
    assert [c.monitor for c in tick(table, present, [], [], now=2.0, wall=0.0, veto=False)] == ["mine"]  # no run
    assert table.speed_of("mine") == present.speed


def test_one_tick_applies_what_an_app_taught_its_monitor_at_its_class_s_speed():
    """The app measured twice the estimate: only its monitor turns false; the same reports learnt at a far
    slower state teach little here (learning fades as the state moves away)."""
    present = PresentSpeed.at(speed(1.0))
    m = Member(10.0, "cpu", 14.0)  # taught 1.64x (five reports of 2x against a prior of two): 16.4 ms
    table = MonitorTable(RULES)
    table.add("taught", [m], True, 1)
    table.add("other", [m], True, 2)
    learnt = Learnt()
    for i in range(5):
        learnt.add(reduce([20.0] * 10, 10.0, 1.0, at=float(i)))
    taught = Taught("taught", (m,), (learnt,))
    assert [(c.monitor, c.meets) for c in tick(table, present, [], [taught], 1.0, 5.0, False)] == [("taught", False)]
    far = Learnt()
    for i in range(5):
        far.add(reduce([200.0] * 10, 100.0, 10.0, at=float(i)))  # learnt where everything ran 10x slower
    table.add("far", [m], True, 3)
    assert tick(table, present, [], [Taught("far", (m,), (far,))], 2.0, 5.0, False) == []


def test_expected_share_is_rate_times_latency_across_the_threads_at_most_the_device():
    assert expected_share(30.0, 10.0, threads=2, cores=4) == Share(0.6, 0.6)
    assert expected_share(30.0, 100.0, threads=2, cores=4) == Share(2.0, 2.0)  # at most its threads' width
    assert expected_share(30.0, math.inf, threads=8, cores=2) == Share(2.0, 2.0)


# -- learning from real runs (WARM) ------------------------------------------------------------------------------------

def test_reports_bring_a_40_percent_off_estimate_within_10_percent_and_halve_its_error_within_20():
    """The agent says 10 ms where the app measures 14: the estimate, corrected by what the reports teach."""
    learnt = Learnt()
    errors = []
    for i in range(20):
        corrected = 10.0 * math.exp(learnt.correction(1.0, now=float(i)))
        errors.append(abs(corrected / 14.0 - 1))
        learnt.add(reduce([13.5, 14.0, 14.5, 40.0], estimate_ms=10.0, multiplier=1.0, at=float(i)))
    final = abs(10.0 * math.exp(learnt.correction(1.0, now=20.0)) / 14.0 - 1)
    assert errors[0] == pytest.approx(0.4 / 1.4, rel=1e-6)
    assert next(i for i, e in enumerate(errors) if e <= errors[0] / 2) <= 20
    assert final <= 0.10


def test_one_wild_report_moves_little_and_the_correction_is_bounded():
    learnt = Learnt()
    learnt.add(reduce([500.0], estimate_ms=10.0, multiplier=1.0, at=0.0))  # one stray run: a tenth of a report
    assert learnt.correction(1.0, now=0.0) == pytest.approx(math.log(50.0) * 0.1 / 2.1, rel=1e-6)
    for i in range(50):
        learnt.add(reduce([10.0], estimate_ms=10.0, multiplier=1.0, at=float(i)))
    assert abs(learnt.correction(1.0, now=50.0)) < 0.01  # the median of what was learnt: the wild one is gone
    many = Learnt()
    for _ in range(64):
        many.add(reduce([1e5], estimate_ms=1.0, multiplier=1.0, at=0.0))
    assert many.correction(1.0, now=0.0) == MAX_LOG_CORRECTION


def test_what_was_learnt_fades_as_the_device_state_moves_away_and_with_time():
    learnt = Learnt()
    for _ in range(20):
        learnt.add(reduce([14.0], estimate_ms=10.0, multiplier=1.0, at=0.0))  # learnt at rest
    at_rest = learnt.correction(1.0, now=0.0)
    assert learnt.correction(3.0, now=0.0) < 0.2 * at_rest  # under a 3x slowdown it says little
    assert learnt.correction(1.0, now=6 * 3600.0) < at_rest  # six hours later it counts for less
    assert Learnt.from_json(learnt.to_json()).correction(1.0, now=0.0) == pytest.approx(at_rest)
    with pytest.raises(ValueError):
        Learnt.from_json([[1.0, "x", 0]])


def test_nonsense_reports_are_refused():
    for latencies in ([], [0.0], [-1.0], [math.nan], [1.0] * 1001):
        with pytest.raises(ValueError):
            reduce(latencies, estimate_ms=10.0, multiplier=1.0, at=0.0)
    with pytest.raises(ValueError):
        reduce([1.0], estimate_ms=math.inf, multiplier=1.0, at=0.0)


def test_a_table_monitor_is_priced_with_its_learnt_correction():
    t = MonitorTable(RULES)
    t.add("m", [member(12.0, Requirement("excellent"))], meets=True, seq=1)
    t.set_corrections("m", [math.log(1.5)])
    assert t.latencies(speed(1.0)).tolist() == pytest.approx([18.0])
    assert t.evaluate(0.0, speed(1.0))[0].meets is False  # 18 ms: past 16 ms and its margin
    assert bound_ms("excellent") == 16.0
