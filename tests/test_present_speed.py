"""The present speed's holder and its refresh policy, on states sampled from fixture trees.

PresentSpeed pairs a warm refresh's reading with the state sampled after it, carries it over marked
changes, and keeps the speed it had through a state sampled while the agent's own heavy work ran.
"""

from __future__ import annotations

import dataclasses

import pytest

from monitors.speed.present import (
    AT_REST,
    Measurement,
    PresentSpeed,
    Share,
    blend,
    gemm_multiplier,
    memory_multiplier,
    speed_from_state,
)
from monitors.speed.refresh_policy import RefreshPolicy


@pytest.fixture
def states(quiet_laptop):
    """quiet, hot (throttling) and loaded (1 core by others) states of a laptop fixture tree."""
    quiet = quiet_laptop
    hot = dataclasses.replace(quiet, thermal=dataclasses.replace(quiet.thermal, throttling=True, cpu_throttling=True))
    loaded = dataclasses.replace(quiet, cpu=dataclasses.replace(quiet.cpu, others_busy_cores=1.0, load=0.25))
    slightly = dataclasses.replace(quiet, cpu=dataclasses.replace(quiet.cpu, others_busy_cores=0.3, load=0.075))
    unplugged = dataclasses.replace(quiet, battery=dataclasses.replace(quiet.battery, plugged=True))
    return quiet, hot, loaded, slightly, unplugged


def test_laptop_fixture_tree_policy_first_refresh_then_periodic(states):
    quiet = states[0]
    policy = RefreshPolicy(period_s=60)
    policy.observe(quiet, 0.0)
    assert policy.due(0.0) and not policy.measurement_current()
    policy.refreshed(quiet, 0.0, cpu_s=0.05)
    assert policy.measurement_current()
    assert not policy.due(30.0)
    assert policy.due(60.0)


def test_laptop_fixture_tree_policy_at_rest_backs_off_and_a_change_brings_the_period_back(states):
    """Each refresh that no change called for doubles the period, up to max_period_s; a marked change asks for
    a refresh at once and the period starts again from period_s."""
    quiet, hot = states[0], states[1]
    policy = RefreshPolicy(period_s=60, max_period_s=240)
    policy.observe(quiet, 0.0)
    policy.refreshed(quiet, 0.0, cpu_s=0.5)  # the first: no backoff yet
    times = []
    now = 0.0
    while now < 690.0:
        now += 1.0
        policy.observe(quiet, now)
        if policy.due(now):
            policy.refreshed(quiet, now, cpu_s=0.5)
            times.append(now)
    assert times == [60.0, 180.0, 420.0, 660.0]  # 60, 120, 240, then capped at 240
    assert policy.observe(hot, 720.0) == "throttling"
    assert policy.due(720.0), "a change is refreshed as soon as the budget allows, whatever the period"
    policy.refreshed(hot, 720.0, cpu_s=0.5)
    assert not policy.due(779.0) and policy.due(780.0), "the period is period_s again"


def test_laptop_fixture_tree_policy_without_max_period_keeps_its_period(states):
    quiet = states[0]
    policy = RefreshPolicy(period_s=60)
    policy.observe(quiet, 0.0)
    for t in (0.0, 60.0, 120.0, 180.0):
        assert policy.due(t)
        policy.refreshed(quiet, t, cpu_s=0.05)


@pytest.mark.parametrize("which", [1, 2, 4])  # hot, loaded, plugged
def test_laptop_fixture_tree_policy_marked_change_asks_for_refresh(states, which):
    quiet, changed = states[0], states[which]
    policy = RefreshPolicy(period_s=60)
    policy.observe(quiet, 0.0)
    policy.refreshed(quiet, 0.0, cpu_s=0.05)
    assert policy.observe(changed, 10.0) is not None
    assert not policy.measurement_current()  # the signals' slowdown is not confirmed yet
    assert policy.due(10.0)
    policy.refreshed(changed, 10.5, cpu_s=0.05)
    assert policy.measurement_current() and not policy.due(11.0)
    assert policy.observe(changed, 12.0) is None  # nothing new against the new baseline


def test_laptop_fixture_tree_policy_small_load_change_is_not_marked(states):
    quiet, slightly = states[0], states[3]
    policy = RefreshPolicy()
    policy.observe(quiet, 0.0)
    policy.refreshed(quiet, 0.0, cpu_s=0.05)
    assert policy.observe(slightly, 5.0) is None and policy.measurement_current()


def test_laptop_fixture_tree_policy_flapping_state_stays_within_cpu_budget(states):
    """A state flipping every tick cannot make refreshes cost more than 1 % of a core."""
    quiet, hot = states[0], states[1]
    policy = RefreshPolicy(budget_fraction=0.01, period_s=60)
    cpu_s, spent, now = 0.2, 0.0, 0.0
    while now < 3600:
        policy.observe(hot if int(now) % 2 else quiet, now)
        if policy.due(now):
            policy.refreshed(hot if int(now) % 2 else quiet, now, cpu_s)
            spent += cpu_s
        now += 1.0
    assert spent / 3600 <= 0.01
    assert spent > 0.2 * 60  # yet it kept refreshing


def test_laptop_fixture_tree_policy_change_during_refresh_stays_pending(states):
    quiet, hot, loaded = states[0], states[1], states[2]
    policy = RefreshPolicy(min_gap_s=0.0)
    policy.observe(quiet, 0.0)
    policy.refreshed(quiet, 0.0, cpu_s=0.0)
    policy.observe(hot, 5.0)
    policy.observe(loaded, 6.0)  # another change, after the refresh started at 5.5
    policy.refreshed(hot, 5.5, cpu_s=0.0)
    assert policy.change_pending() and not policy.measurement_current()
    assert policy.last_change == "load"


def test_laptop_fixture_tree_present_speed_pairs_a_reading_with_the_next_state(states):
    quiet, _, loaded = states[0], states[1], states[2]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=60))
    assert present.speed == AT_REST
    present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    assert not present.start_refresh(0.1)  # one at a time
    present.refreshed(2.0, 0.05, started_at=0.0, cpu_s=0.1)
    assert present.measurement is None  # not before the state of its interval
    speed = present.observe(loaded, 1.0)
    m = present.measurement
    assert m is not None and m.slowdown == 2.0
    expected = speed_from_state(loaded, 4)  # the prediction the reading was paired with
    assert m.predicted == pytest.approx(expected.predicted_cpu, rel=1e-3) and m.predicted > 1.0
    assert present.measurement_current
    assert speed.cpu == pytest.approx(blend(m.predicted, 2.0, m.contention), rel=1e-3)
    assert m.handoff_ms_per_mb is None and speed.handoff_ms_per_mb == 0.0  # read beside a busy core: not the host's


def test_laptop_fixture_tree_present_speed_takes_the_handoff_extra_only_from_a_refresh_without_contention(states):
    """A handoff reading beside others' threads (an app's own frames among them) is the scheduler's: the one read
    without contention stays, for everyone and for an app whose own run is left out."""
    quiet, loaded = states[0], states[2]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=1))
    present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    present.refreshed(1.0, 0.05, started_at=0.0, cpu_s=0.01)
    assert present.observe(quiet, 1.0).handoff_ms_per_mb == pytest.approx(0.05)
    assert present.start_refresh(5.0)
    present.refreshed(2.5, 0.3, started_at=5.0, cpu_s=0.01)
    speed = present.observe(loaded, 6.0)
    assert present.measurement is not None and present.measurement.slowdown == 2.5  # the slowdown is taken
    assert speed.handoff_ms_per_mb == pytest.approx(0.05)
    assert present.for_share(Share(cores=1.0, runnable=1.0)).handoff_ms_per_mb == pytest.approx(0.05)
    assert Measurement.taken_in(loaded, 4, 2.5, 0.3).handoff_ms_per_mb is None  # the CLI's one-shot reading too
    assert Measurement.taken_in(quiet, 4, 1.0, 0.3).handoff_ms_per_mb == 0.3
    assert present.start_refresh(10.0)
    present.refreshed(1.0, 0.01, started_at=10.0, cpu_s=0.01)
    assert present.observe(quiet, 11.0).handoff_ms_per_mb == pytest.approx(0.01)  # a quiet reading replaces it


def test_laptop_fixture_tree_present_speed_keeps_the_last_quiet_memory_reading_until_a_quiet_refresh_reads_it_again(
        states):
    quiet, loaded = states[0], states[2]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=1))
    present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    present.refreshed(1.0, 0.0, started_at=0.0, cpu_s=0.01, memory=1.5)
    assert present.observe(quiet, 1.0).memory == pytest.approx(memory_multiplier(1.5), rel=1e-3)
    assert present.start_refresh(5.0)
    present.refreshed(2.5, None, started_at=5.0, cpu_s=0.01, memory=3.0)  # beside busy processes: not memory's
    assert present.observe(loaded, 6.0).memory == pytest.approx(memory_multiplier(1.5), rel=1e-3)
    assert present.start_refresh(8.0)
    present.refreshed(1.0, 0.0, started_at=8.0, cpu_s=0.01)  # no monitor streams: the stream probe not run
    assert present.observe(quiet, 9.0).memory == pytest.approx(memory_multiplier(1.5), rel=1e-3)
    assert present.start_refresh(10.0)
    present.refreshed(1.0, 0.0, started_at=10.0, cpu_s=0.01, memory=1.0)
    assert present.observe(quiet, 11.0).memory == 1.0  # the neighbour has gone


def test_laptop_fixture_tree_present_speed_keeps_the_last_quiet_gemm_reading_until_a_quiet_refresh_reads_it_again(
        states):
    """Calibrated while float products ran slow, the host read out of that spell: the products' time falls."""
    quiet, loaded = states[0], states[2]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=1))
    present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    present.refreshed(1.0, 0.0, started_at=0.0, cpu_s=0.01, gemm=0.7)
    assert gemm_multiplier(0.7) < 0.8
    assert present.observe(quiet, 1.0).gemm == pytest.approx(gemm_multiplier(0.7), rel=1e-3)
    assert present.start_refresh(5.0)
    present.refreshed(2.5, None, started_at=5.0, cpu_s=0.01, gemm=1.0)  # beside busy processes: not the host's
    assert present.observe(loaded, 6.0).gemm == pytest.approx(gemm_multiplier(0.7), rel=1e-3)
    assert present.start_refresh(10.0)
    present.refreshed(1.0, 0.0, started_at=10.0, cpu_s=0.01, gemm=1.0)
    assert present.observe(quiet, 11.0).gemm == 1.0  # the host runs them as calibrated again


def test_laptop_fixture_tree_present_speed_holds_through_the_agent_s_own_work(states):
    """A state sampled during a calibration moves nothing: the speed stays what it was, and a warm refresh
    paired with it is dropped (its reading is the agent's own work)."""
    quiet, loaded = states[0], states[2]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=60))
    before = present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    present.refreshed(3.0, None, started_at=0.0, cpu_s=0.1)
    held = present.observe(loaded, 1.0, own_work=True)
    assert held == before and present.held
    assert present.measurement is None  # dropped
    assert not present.start_refresh(5.0, own_work=True)  # none during the agent's own work
    assert present.observe(loaded, 6.0).cpu > before.cpu  # its own work over: the load is believed
    assert not present.held


def test_laptop_fixture_tree_present_speed_without_a_clean_state_prices_what_it_has(states):
    """At a fresh start the agent calibrates before any clean sample: until one comes, the speed is made
    from the states it has by CPU time (the CPU probe leaves the agent's own process tree out of it), not by
    the run queue, where its own threads cannot all be told from others'; after a clean one, held."""
    quiet, loaded = states[0], states[2]
    present = PresentSpeed(threads=4)
    assert present.observe(quiet, 0.0, own_work=True) == speed_from_state(quiet, 4)
    # one slower reading alone is not believed (the agent's processes ending can misread as others' for one
    # interval); the next that agrees is
    assert present.observe(loaded, 0.5, own_work=True) == speed_from_state(quiet, 4)
    assert present.observe(loaded, 1.0, own_work=True) == speed_from_state(loaded, 4)
    assert present.observe(quiet, 1.2, own_work=True) == speed_from_state(quiet, 4)  # a faster one at once
    cores = quiet.cpu.cores
    calibrating = dataclasses.replace(quiet, cpu=dataclasses.replace(  # every core busy with the agent's own work
        quiet.cpu, busy_cores=float(cores), own_cores=float(cores), others_busy_cores=0.0, load=0.0))
    queued = dataclasses.replace(calibrating, cpu=dataclasses.replace(calibrating.cpu, runnable_others=4.8))
    assert speed_from_state(queued, 4).cpu > 1.5 * speed_from_state(calibrating, 4).cpu  # what its threads read as
    present.observe(queued, 1.4, own_work=True)
    assert present.observe(queued, 1.5, own_work=True) == speed_from_state(
        dataclasses.replace(queued, cpu=dataclasses.replace(queued.cpu, runnable_others=None)), 4)
    clean = present.observe(quiet, 2.0)
    assert present.observe(loaded, 3.0, own_work=True) == clean


def test_laptop_fixture_tree_present_speed_forgets_a_reading_against_an_old_calibration(states):
    quiet = states[0]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=60))
    present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    present.refreshed(2.0, None, started_at=0.0, cpu_s=0.1)
    present.observe(quiet, 1.0)
    assert present.measurement is not None
    present.forget_measurement()
    assert present.observe(quiet, 2.0) == speed_from_state(quiet, 4)  # the prediction alone


def test_laptop_fixture_tree_present_speed_charges_a_failed_refresh_and_frees_the_next(states):
    quiet = states[0]
    present = PresentSpeed(threads=4, policy=RefreshPolicy(period_s=60, min_gap_s=2.0))
    present.observe(quiet, 0.0)
    assert present.start_refresh(0.0)
    present.refresh_failed(0.0)
    assert not present.start_refresh(1.0)  # the policy's gap: its CPU counts against the budget
    present.observe(quiet, 10.0)
    assert present.start_refresh(10.0)  # nothing measured yet: due again, not a period later
