"""monitors/speed.py: from DeviceState (sampled from fixture trees) to a latency multiplier."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nvml_standin import NvmlStandin, StandinGpu
from sysfs_trees import desktop, laptop, server, vm

from monitors.speed import (MAX_HANDOFF_MS_PER_MB, POWER_SAVING_FACTOR, UNSIZED_THROTTLING_FACTOR, Speed, blend,
                            combine, contention_factor, lockstep_penalty, speed_from_state)
from probes.state import Sampler


def sampled(tree, nvml=None, busy=0, idle=100, steal=0):
    """A DeviceState of a fixture tree with load from a /proc/stat delta of busy/idle/steal ticks."""
    tree.set_stat(busy=1000, idle=9000, steal=100)
    sampler = Sampler(tree.sys, tree.proc, nvml)
    sampler.sample()
    tree.set_stat(busy=1000 + busy, idle=9000 + idle, steal=100 + steal)
    return sampler.sample()


def lockstep(fair: float, threads: int) -> float:
    """A fair-share slowdown with the straggler penalty, all other tasks busy."""
    return fair * lockstep_penalty(fair, threads)


def with_cpu(state, **changes):
    return dataclasses.replace(state, cpu=dataclasses.replace(state.cpu, **changes))


def test_desktop_fixture_tree_quiet_is_calibrated_speed(tmp_path):
    speed = speed_from_state(sampled(desktop(tmp_path)), None, cores=8)
    assert isinstance(speed, Speed)
    assert speed.cpu == 1.0 and speed.gpu is None and speed.gpu_free_bytes is None and speed.reasons == ()


def test_lockstep_penalty_is_continuous_monotone_and_spares_one_thread():
    assert lockstep_penalty(1.0, 2) == 1.0 and lockstep_penalty(0.8, 4) == 1.0
    assert lockstep_penalty(3.0, 1) == 1.0  # one thread waits for nobody
    assert lockstep_penalty(1.01, 2) == pytest.approx(1.0, rel=0.02)  # no jump at the edge of oversubscription
    values = [contention_factor(threads=2, others=i / 20, cores=2) for i in range(60)]
    assert values == sorted(values) and all(b - a < 0.15 for a, b in zip(values, values[1:]))
    assert lockstep_penalty(2.0, 8) > lockstep_penalty(2.0, 2)  # more threads, more to wait for


def test_contention_factor_model():
    assert contention_factor(threads=2, others=0, cores=2) == 1.0
    assert contention_factor(threads=1, others=1, cores=2) == 1.0  # a free core each
    assert contention_factor(threads=1, others=3, cores=2) == pytest.approx(2.0)  # fair share: 2 cores for 4
    # fair share (threads + others) / cores, with the penalty of lock-stepped threads
    assert contention_factor(threads=2, others=1, cores=2) == pytest.approx(lockstep(1.5, 2)) \
        == pytest.approx(2.4)
    assert contention_factor(threads=2, others=4, cores=2) == pytest.approx(lockstep(3.0, 2))
    assert contention_factor(threads=4, others=4, cores=8) == 1.0  # free cores
    assert contention_factor(threads=8, others=4, cores=8) == pytest.approx(lockstep(1.5, 8))
    assert contention_factor(threads=16, others=0, cores=8) == 1.0  # more threads than cores: still all cores
    assert contention_factor(threads=2, others=1000, cores=2) == pytest.approx(50.0)  # capped


def test_desktop_fixture_tree_busy_others_slow_cpu(tmp_path):
    # 8 cores, 50 of 100 ticks busy: 4 cores busy with others; 8 intra-op threads
    speed = speed_from_state(sampled(desktop(tmp_path), busy=50, idle=50), None, cores=8)
    assert speed.cpu == pytest.approx(lockstep(1.5, 8))
    assert any("4.0 other tasks want a CPU" in r for r in speed.reasons)


def test_vm_fixture_tree_runnable_tasks_beyond_busy_cores(tmp_path):
    """Busy cores saturate at 2 of 2; procs_running tells 6 other runnable tasks."""
    tree = vm(tmp_path)
    tree.set_stat(busy=1000, idle=9000, steal=100, running=7)
    sampler = Sampler(tree.sys, tree.proc)
    sampler.sample()
    tree.set_stat(busy=1100, idle=9000, steal=100, running=7)
    state = sampler.sample()
    assert state.cpu.others_busy_cores == pytest.approx(2.0) and state.cpu.runnable_others == pytest.approx(6.0)
    assert speed_from_state(state, None, cores=2).cpu == pytest.approx(lockstep(4.0, 2))  # (2 + 6) / 2, not (2 + 2) / 2


def test_vm_fixture_tree_steal_time_slows_cpu(tmp_path):
    state = sampled(vm(tmp_path), busy=0, idle=75, steal=25)
    speed = speed_from_state(state, None, cores=2)
    assert speed.cpu == pytest.approx(1 / 0.75, rel=1e-3)
    assert any("steal" in r for r in speed.reasons)


def test_laptop_fixture_tree_low_power_profile(tmp_path):
    speed = speed_from_state(sampled(laptop(tmp_path)), None, cores=4)
    assert speed.cpu == pytest.approx(POWER_SAVING_FACTOR)
    assert any("low-power" in r for r in speed.reasons)


def test_laptop_fixture_tree_thermal_throttling_uses_clock_ratio(tmp_path):
    tree = laptop(tmp_path)
    tree.set("firmware/acpi/platform_profile", "balanced")
    tree.set("class/thermal/thermal_zone1/temp", "92000")
    tree.cpufreq(cur_khz=2_100_000, max_khz=4_200_000, governor="powersave", epp="balance_performance")
    # busy cores (2 of 4, by others): the current clock is the throttled one
    speed = speed_from_state(sampled(tree, busy=50, idle=50), None, cores=4)
    assert speed.cpu == pytest.approx(2.0 * lockstep(1.5, 4))  # 4.2 GHz / 2.1 GHz, times (4 + 2) / 4 contended
    assert any("thermal throttling, clock 2100" in r for r in speed.reasons)
    # idle cores clock down anyway: the clock says nothing, a guess until measured
    idle = speed_from_state(sampled(tree), None, cores=4)
    assert idle.cpu == pytest.approx(UNSIZED_THROTTLING_FACTOR)


def test_laptop_fixture_tree_fan_running_is_throttling_but_no_slowdown(tmp_path):
    tree = laptop(tmp_path)
    tree.set("firmware/acpi/platform_profile", "balanced")
    tree.cpufreq(cur_khz=1_400_000, max_khz=4_200_000, governor="powersave", epp="balance_performance")
    tree.set("class/thermal/cooling_device1/cur_state", "1")  # the Fan
    state = sampled(tree)
    assert state.thermal.throttling is True and state.thermal.cpu_throttling is False
    assert speed_from_state(state, None, cores=4).cpu == 1.0


def test_desktop_fixture_tree_clock_cap(tmp_path):
    tree = desktop(tmp_path)
    tree.cpufreq(cur_khz=2_000_000, max_khz=4_000_000, limit_khz=2_000_000, governor="powersave", epp="balance_performance")
    assert speed_from_state(sampled(tree), None, cores=8).cpu == pytest.approx(2.0)


def test_vm_fixture_tree_throttling_without_clocks_is_a_guess(tmp_path):
    state = sampled(vm(tmp_path))
    hot = dataclasses.replace(state, thermal=dataclasses.replace(state.thermal, throttling=True, cpu_throttling=True))
    assert speed_from_state(hot, None, cores=2).cpu == pytest.approx(UNSIZED_THROTTLING_FACTOR)


def test_server_fixture_tree_nvml_standin_gpu_busy_and_capped(tmp_path):
    nvml = NvmlStandin([StandinGpu(util=50, used=20 * 2**30, sm_mhz=1050, sm_max_mhz=2100, reasons=0x04)])
    speed = speed_from_state(sampled(server(tmp_path), nvml), None, cores=16)
    assert speed.gpu == pytest.approx(1.5 * 2.0)
    assert speed.gpu_free_bytes == 4 * 2**30
    assert any("gpu 50 % busy" in r for r in speed.reasons) and any("power capping" in r for r in speed.reasons)


def test_server_fixture_tree_nvml_standin_idle_gpu(tmp_path):
    speed = speed_from_state(sampled(server(tmp_path), NvmlStandin()), None, cores=16)
    assert speed.gpu == 1.0 and speed.gpu_free_bytes == 23 * 2**30


def test_combination_rule():
    # no measurement: the prediction
    assert combine(1.5, None, measured_current=False) == 1.5
    # measurement older than the last marked change: the slower view
    assert combine(2.0, 1.0, measured_current=False) == 2.0
    assert combine(1.0, 1.8, measured_current=False) == 1.8
    # measurement taken in the present state: mostly the measurement
    blended = combine(2.0, 1.2, measured_current=True)
    assert 1.2 < blended < 2.0 and abs(blended - 1.2) < abs(blended - 2.0)
    assert combine(1.0, 1.0, measured_current=True) == pytest.approx(1.0)


def test_desktop_fixture_tree_measured_slowdown_confirmed(tmp_path):
    state = sampled(desktop(tmp_path), busy=50, idle=50)
    predicted = lockstep(1.5, 8)
    stale = speed_from_state(state, 1.0, cores=8, measured_current=False)
    fresh = speed_from_state(state, 1.0, cores=8, measured_current=True)
    assert stale.cpu == pytest.approx(predicted) and stale.predicted_cpu == pytest.approx(predicted)
    assert 1.0 < fresh.cpu < stale.cpu
    # the measurement weighs 0.5 / the square of the slowdown the signals put down to time slicing (here all)
    assert fresh.cpu == pytest.approx(predicted ** (1 - 0.5 / predicted ** 2), rel=1e-3)


def test_a_current_measurement_weighs_less_the_more_time_slicing_the_signals_see():
    # no contention: half and half (a throttled clock the signals miss, a host's other tenants)
    assert combine(1.0, 2.0, measured_current=True) == pytest.approx(math.sqrt(2.0))
    assert combine(1.5, 2.0, measured_current=True, contention=1.0) == pytest.approx(math.sqrt(3.0))
    # four busy processes on two cores: the probe read 2.3x where apps ran about 5x; the prediction 4.8x leads
    sliced = combine(4.8, 2.3, measured_current=True, contention=4.8)
    weight = 0.5 / 4.8 ** 2
    assert sliced == pytest.approx(math.exp(weight * math.log(2.3) + (1 - weight) * math.log(4.8)))
    assert 4.6 < sliced < 4.8
    assert combine(4.8, 2.3, measured_current=True, contention=0.5) == combine(4.8, 2.3, measured_current=True)


def test_vm_fixture_tree_handoff_extra_is_the_measurement_s_and_bounded(tmp_path):
    state = sampled(vm(tmp_path))
    assert speed_from_state(state, 1.0, cores=2, measured_current=True).handoff_ms_per_mb == 0.0  # none measured
    measured = speed_from_state(state, 1.02, cores=2, measured_current=True, handoff_ms_per_mb=0.12)
    assert measured.handoff_ms_per_mb == pytest.approx(0.12)
    assert measured.cpu == pytest.approx(math.sqrt(1.02), rel=1e-3)  # the multiplier is the compute probe's alone
    assert any("hand data across cores" in r for r in measured.reasons)
    # kept after a marked change too: no signal says whether the host's phase moved
    assert speed_from_state(state, 1.02, cores=2, handoff_ms_per_mb=0.12).handoff_ms_per_mb == pytest.approx(0.12)
    for wild, bounded in ((math.nan, 0.0), (-1.0, 0.0), (1e9, MAX_HANDOFF_MS_PER_MB)):
        assert speed_from_state(state, 1.0, cores=2, handoff_ms_per_mb=wild).handoff_ms_per_mb == bounded


def test_estimate_adds_the_handoff_extra_for_the_bytes_the_cpu_plan_writes(estimator):
    from monitors.importer import load_graph
    from probes.refresh import handoff_probe

    plan = estimator.plan(load_graph(handoff_probe()[0], fmt="onnx"), "cpu")
    quiet = Speed(cpu=1.5, gpu=None, gpu_free_bytes=None, reasons=())
    phase = dataclasses.replace(quiet, handoff_ms_per_mb=0.1)
    at_rest = estimator.estimate(plan, device="cpu").latency_ms
    assert estimator.estimate(plan, device="cpu", speed=quiet).latency_ms == pytest.approx(1.5 * at_rest)
    assert estimator.estimate(plan, device="cpu", speed=phase).latency_ms == pytest.approx(
        1.5 * at_rest + 0.1 * plan.written_mb)


@given(load=st.floats(0, 1), steal=st.floats(0, 1), psi=st.floats(0, 100), measured=st.one_of(st.none(), st.floats(0.01, 100)),
       current=st.booleans(), threads=st.integers(1, 64))
def test_speed_is_bounded_and_finite(load, steal, psi, measured, current, threads):
    state = _VM_STATE
    state = with_cpu(state, load=load, others_busy_cores=load * 2, steal=steal, psi_some_avg10=psi)
    speed = speed_from_state(state, measured, cores=threads, measured_current=current)
    assert math.isfinite(speed.cpu) and 0.8 <= speed.cpu <= 50.0


def _vm_state():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        return sampled(vm(Path(d)))


_VM_STATE = _vm_state()


def test_stale_measurement_is_carried_over_by_how_the_prediction_moved():
    # measured 3.5x under load the signals put at 3.2x, all of it time slicing: the agent took it as
    # blend(3.2, 3.5, 3.2) then. Now the signals say 1.1x: the load has gone, believed at once rather
    # than at the next warm refresh (the correction fading with the 3.2x slowdown it corrected: 1.1 is
    # log 1.1 / log 3.2 of it)
    then = blend(3.2, 3.5, contention=3.2)
    assert combine(1.1, 3.5, measured_current=False, predicted_then=3.2, contention_then=3.2) == pytest.approx(
        1.1 * (then / 3.2) ** (math.log(1.1) / math.log(3.2)))
    assert combine(1.0, 7.0, measured_current=False, predicted_then=3.0, contention_then=3.0) == pytest.approx(1.0)
    # more load: the correction kept
    assert combine(4.0, 4.5, measured_current=False, predicted_then=3.0, contention_then=3.0) == pytest.approx(
        4.0 * blend(3.0, 4.5, contention=3.0) / 3.0)
    # measured 1.5x where the signals saw nothing (say, throttling they miss): what the agent made of it
    # (the square root, nothing contending) is kept through changes
    assert combine(1.05, 1.5, measured_current=False, predicted_then=1.0) == pytest.approx(1.05 * math.sqrt(1.5))
    # measured quiet (1.0 at 1.0); load arrives (3.2): the prediction is believed at once too
    assert combine(3.2, 1.0, measured_current=False, predicted_then=1.0) == pytest.approx(3.2)
    # the measurement saw more than the signals: the surplus the agent believed is kept through the change
    assert combine(2.0, 3.0, measured_current=False, predicted_then=2.0) == pytest.approx(math.sqrt(6.0))
    # without the prediction of the time: the slower of the two, as before
    assert combine(1.1, 3.5, measured_current=False) == pytest.approx(3.5)


def test_a_carried_measurement_continues_the_multiplier_the_agent_had():
    """No jump at a marked change: where the prediction has not moved, the carried measurement gives what
    the agent had before the change (or the prediction, where that is slower)."""
    for predicted, measured, contention in ((1.0, 1.47, 1.0), (1.3, 2.0, 1.0), (2.4, 3.7, 2.4), (4.8, 2.3, 4.8)):
        current = combine(predicted, measured, measured_current=True, contention=contention)
        carried = combine(predicted, measured, measured_current=False, predicted_then=predicted,
                          contention_then=contention)
        assert carried == pytest.approx(max(predicted, current))
    # a burst of load that came and went at rest (a client starting up): the 1.47x reading stays the agent's
    # 1.21x, not 1.47x until the next warm refresh
    assert combine(1.0, 1.47, measured_current=False, predicted_then=1.0) == pytest.approx(1.2124, abs=1e-4)
    # one busy process, the probe over-reading it (3.7x at 2.4x): when the load grows to 4.8x the estimate
    # grows with it, and not by the probe's 1.54x surplus that the agent had weighed at 9 %
    assert combine(4.8, 3.7, measured_current=False, predicted_then=2.4, contention_then=2.4) < 4.8 * 1.05


def test_straggler_penalty_needs_cores_really_kept_busy_not_a_runnable_snapshot():
    # idle device: the runnable snapshot reads one other task, but nothing kept a core busy
    assert contention_factor(threads=2, others=1.0, cores=2, busy_others=0.02) == pytest.approx(1.5, rel=0.02)
    # one busy process: most of a core kept busy, so the lock-stepped threads pay for it
    assert contention_factor(threads=2, others=1.0, cores=2, busy_others=0.9) > 2.2
