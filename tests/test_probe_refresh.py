"""Warm refresh: real onnxruntime micro-benchmarks, slowdown, and the refresh policy (fixture-tree states)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from monitors.speed import lockstep
from sysfs_trees import laptop

from probes import refresh
from probes.refresh import RefreshPolicy, WarmRefresh, demand_from_share, slowdown
from probes.state import Sampler


PROBES = {"cpu_matmul_256", "cpu_conv3x3_32ch_28px", "cpu_add_8mb"}


def test_measure_runs_real_onnxruntime_probes_with_cached_sessions():
    warm = WarmRefresh(threads=2, window_s=0.02)
    sessions = list(warm._sessions)
    first = warm.measure()
    second = warm.measure()
    assert set(first) == set(second) == PROBES | {"share", "threads", "cores"}
    assert all(0 < first[k] < 1.0 for k in PROBES)
    assert 0 < first["share"] <= 1.0 and first["threads"] == 2.0 and first["cores"] == os.cpu_count()
    assert warm._sessions == sessions  # created once, reused
    assert warm.last_cpu_s is not None and warm.last_cpu_s > 0
    assert warm.last_runs >= 3  # at least MIN_ROUNDS rounds of every probe in every thread


def test_measure_stops_at_its_wall_limit():
    warm = WarmRefresh(threads=2, window_s=100.0, cpu_budget_s=100.0, max_wall_s=0.1)
    start = time.perf_counter()
    warm.measure()
    assert time.perf_counter() - start < 2.0


def test_measure_sees_real_busy_processes_as_demand():
    """Real busy processes, one per core, lower the probe threads' share of a core below what they get alone."""
    warm = WarmRefresh(threads=1, window_s=0.3)
    alone = warm.measure()["share"]
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
    assert loaded["share"] < alone
    assert demand_from_share(loaded) >= cores - 1 - 0.5  # `cores` busy processes, minus noise


def test_module_measure_reuses_one_instance():
    refresh.measure()
    instance = refresh._default
    refresh.measure()
    assert refresh._default is instance


def _m(share: float, matmul: float = 1e-3, threads: int = 2, cores: int = 2) -> dict[str, float]:
    return {"cpu_matmul_256": matmul, "cpu_conv3x3_32ch_28px": matmul / 2, "cpu_add_8mb": matmul * 2,
            "share": share, "threads": float(threads), "cores": float(cores)}


def test_slowdown_per_cpu_second_and_contention():
    quiet = _m(share=1.0)
    assert slowdown(quiet, quiet) == pytest.approx(1.0)
    # twice the CPU time per run (clocks halved), no contention
    assert slowdown(_m(1.0, matmul=2e-3), quiet) == pytest.approx(2.0)
    # share 0.5 with 2 threads on 2 cores: 2 other tasks; time slicing makes it twice as slow, and the
    # lock-stepped threads wait for each other on top (monitors.speed.lockstep)
    assert demand_from_share(_m(0.5)) == pytest.approx(2.0)
    assert slowdown(_m(0.5), quiet) == pytest.approx(lockstep(2.0, 2))
    assert slowdown(_m(0.5, threads=1), quiet) == pytest.approx(2.0)
    assert slowdown(_m(0.25, matmul=2e-3), quiet) == pytest.approx(2.0 * lockstep(4.0, 2))  # both parts multiply
    # calibration keeps the fastest runs: contention while the reference was taken does not count
    assert slowdown(_m(0.5), _m(0.5)) == pytest.approx(lockstep(2.0, 2))
    assert slowdown(_m(1.0), _m(0.25)) == pytest.approx(1.0)


def test_slowdown_without_common_probes_or_share():
    quiet = _m(1.0)
    assert slowdown({"other": 1.0}, quiet) is None
    old_format = {"matmul_384": 1e-3}  # a reference from an older version: nothing to compare
    assert slowdown(quiet, old_format) is None
    no_share = {k: v for k, v in quiet.items() if k.startswith("cpu_")}
    assert slowdown(_m(1.0, matmul=3e-3), no_share) == pytest.approx(3.0)
    assert slowdown({"cpu_matmul_256": float("nan")}, quiet) is None


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
