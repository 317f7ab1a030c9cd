"""Warm refresh: real onnxruntime probes, slowdown, the handoff extra, and the refresh policy (fixture-tree states)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest
from sysfs_trees import laptop

from probes import refresh
from probes.refresh import (HANDOFF_KEY, HANDOFF_MB, LOCKSTEP_KEY, MIN_RUNS, RefreshPolicy, WarmRefresh,
                            handoff_ms_per_mb, handoff_probe, slowdown)
from probes.state import Sampler


def test_measure_runs_two_real_multithreaded_onnxruntime_probes_with_cached_sessions():
    warm = WarmRefresh(threads=2, cpu_budget_s=0.02)
    sessions = [session for session, _ in warm._probes]
    first = warm.measure()
    second = warm.measure()
    assert set(first) == set(second) == {LOCKSTEP_KEY, HANDOFF_KEY, "threads", "cores"}
    assert 0 < first[LOCKSTEP_KEY] < 1.0 and 0 < first[HANDOFF_KEY] < 1.0
    assert first["threads"] == 2.0 and first["cores"] == os.cpu_count()
    assert [session for session, _ in warm._probes] == sessions  # created once, reused
    assert warm.last_cpu_s is not None and warm.last_cpu_s > 0
    assert warm.last_runs >= MIN_RUNS


def test_measure_stops_at_its_wall_limit():
    warm = WarmRefresh(threads=2, cpu_budget_s=100.0, max_wall_s=0.1)
    start = time.perf_counter()
    warm.measure()
    assert time.perf_counter() - start < 2.0


def test_measure_stops_at_its_cpu_budget():
    warm = WarmRefresh(threads=1, cpu_budget_s=0.01, max_wall_s=10.0)
    warm.measure()
    one_run = warm.last_cpu_s / (warm.last_runs + 1)  # the untimed run included
    assert warm.last_cpu_s < 0.01 + 3 * one_run + 0.02  # stops at the first run past the budget


def test_reference_keeps_the_fastest_refresh():
    readings = iter([3e-3, 1e-3, 2e-3])

    class Scripted(WarmRefresh):
        def measure(self):
            return {LOCKSTEP_KEY: next(readings), "threads": 2.0, "cores": 2.0}

    assert Scripted(threads=1).reference()[LOCKSTEP_KEY] == 1e-3


def test_reference_keeps_each_probe_s_fastest_reading():
    readings = iter([(3e-3, 0.5e-3), (1e-3, 0.9e-3), (2e-3, 0.6e-3)])

    class Scripted(WarmRefresh):
        def measure(self):
            lockstep, handoff = next(readings)
            return {LOCKSTEP_KEY: lockstep, HANDOFF_KEY: handoff, "threads": 2.0, "cores": 2.0}

    reference = Scripted(threads=1).reference([{LOCKSTEP_KEY: 4e-3}])  # an older probe's reading: no handoff
    assert (reference[LOCKSTEP_KEY], reference[HANDOFF_KEY]) == (1e-3, 0.5e-3)


def test_handoff_extra_is_the_handoff_probe_s_time_beyond_the_compute_probe_s_slowdown():
    reference = {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 0.5e-3}
    # a slow phase: the compute probe as calibrated, the handoff probe 1.2845 ms slower = 0.1 ms per MB it writes
    phase = {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 0.5e-3 + HANDOFF_MB * 1e-4}
    assert handoff_ms_per_mb(phase, reference) == pytest.approx(0.1)
    # time slicing slows both 3x: no handoff extra; 3x plus the slow phase: the same 0.1 ms/MB on top
    assert handoff_ms_per_mb({LOCKSTEP_KEY: 3e-3, HANDOFF_KEY: 1.5e-3}, reference) == pytest.approx(0.0)
    both = {LOCKSTEP_KEY: 3e-3, HANDOFF_KEY: 1.5e-3 + HANDOFF_MB * 1e-4}
    assert handoff_ms_per_mb(both, reference) == pytest.approx(0.1)
    # the handoff probe faster than the slowdown says (noise): 0, never a negative extra
    assert handoff_ms_per_mb({LOCKSTEP_KEY: 3e-3, HANDOFF_KEY: 1e-3}, reference) == 0.0
    # a reference or reading of the probe before it had a handoff probe: no figure
    assert handoff_ms_per_mb(phase, {LOCKSTEP_KEY: 1e-3}) is None
    assert handoff_ms_per_mb({LOCKSTEP_KEY: 1e-3}, reference) is None


def test_handoff_mb_is_what_the_cost_model_counts_for_the_handoff_probe():
    """The extra per MB must be in the estimator's bytes, or a model would be charged at the wrong rate."""
    from monitors.importer import load_graph
    from monitors.planner import plan

    blob, _ = handoff_probe()
    assert plan(load_graph(blob, fmt="onnx")).written_mb == pytest.approx(HANDOFF_MB, rel=1e-3)


def test_the_real_handoff_probe_writes_far_more_bytes_per_ms_than_the_compute_probe():
    """What lets one refresh tell the two apart: the handoff probe is bytes, the compute probe is FLOPs."""
    from monitors.importer import load_graph
    from monitors.planner import plan
    from probes.refresh import compute_probe

    reading = WarmRefresh(threads=2, cpu_budget_s=0.05).measure()
    compute_mb = plan(load_graph(compute_probe()[0], fmt="onnx")).written_mb
    assert HANDOFF_MB / reading[HANDOFF_KEY] > 3 * compute_mb / reading[LOCKSTEP_KEY]


def test_reference_keeps_an_earlier_faster_refresh_and_skips_old_format_ones():
    """Refreshes taken during calibration (a host's fast phase) count; readings of an older probe do not."""
    readings = iter([3e-3, 2e-3, 2.5e-3])

    class Scripted(WarmRefresh):
        def measure(self):
            return {LOCKSTEP_KEY: next(readings), "threads": 2.0, "cores": 2.0}

    earlier = [{LOCKSTEP_KEY: 4e-3}, {LOCKSTEP_KEY: 1.5e-3, "threads": 2.0}, {"share": 0.1}]
    assert Scripted(threads=1).reference(earlier) == {LOCKSTEP_KEY: 1.5e-3, "threads": 2.0}
    readings = iter([3e-3, 2e-3, 2.5e-3])
    assert Scripted(threads=1).reference([{LOCKSTEP_KEY: 4e-3}])[LOCKSTEP_KEY] == 2e-3


def test_a_real_quick_calibration_reads_the_probe_in_its_pass_and_keeps_the_fastest(monkeypatch):
    """The reference describes the same quiet device as the tables: read in the pass too, not only after."""
    from probes import microbench

    readings = iter([1e-3, 3e-3, 2e-3, 2.5e-3])  # the pass's reading first, then the three after it
    given = []

    def scripted(self):
        given.append(next(readings))
        return {LOCKSTEP_KEY: given[-1], "threads": 2.0, "cores": 2.0}

    monkeypatch.setattr(WarmRefresh, "measure", scripted)
    cal = microbench.calibrate(quick=True)
    assert len(given) == 4
    assert cal.refresh_reference[LOCKSTEP_KEY] == 1e-3


def test_real_busy_processes_slow_the_probe_down():
    """As many real busy processes as cores: each probe thread gets about half a core, and waits for the other."""
    warm = WarmRefresh()
    quiet = warm.reference()
    cores = os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.3)
        loaded = warm.measure()
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    assert slowdown(loaded, quiet) > 1.5


def test_module_measure_reuses_one_instance():
    refresh.measure()
    instance = refresh._default
    refresh.reference()
    assert refresh._default is instance


def test_slowdown_is_the_ratio_of_wall_times_per_run():
    quiet = {LOCKSTEP_KEY: 1e-3, "threads": 2.0, "cores": 2.0}
    assert slowdown(quiet, quiet) == pytest.approx(1.0)
    assert slowdown({**quiet, LOCKSTEP_KEY: 2.5e-3}, quiet) == pytest.approx(2.5)
    assert slowdown({**quiet, LOCKSTEP_KEY: 0.9e-3}, quiet) == pytest.approx(0.9)  # the floor is monitors.speed's


def test_slowdown_without_a_common_probe_is_none():
    quiet = {LOCKSTEP_KEY: 1e-3, "threads": 2.0, "cores": 2.0}
    old_format = {"cpu_matmul_256": 1e-3, "share": 1.0}  # a reference from an older version: nothing to compare
    assert slowdown(quiet, old_format) is None
    assert slowdown(old_format, quiet) is None
    assert slowdown({LOCKSTEP_KEY: float("nan")}, quiet) is None
    assert slowdown({LOCKSTEP_KEY: 0.0}, quiet) is None


@pytest.fixture
def states(tmp_path):
    """quiet, hot (throttling) and loaded (1 core by others) states of a laptop fixture tree."""
    tree = laptop(tmp_path)
    tree.set_stat(busy=1000, idle=9000)
    sampler = Sampler(tree.sys, tree.proc)
    sampler.sample()
    tree.set_stat(busy=1000, idle=9100)
    quiet = sampler.sample()
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
