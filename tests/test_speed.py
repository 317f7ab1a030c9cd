"""monitors/speed/: from DeviceState (sampled from fixture trees) and warm-refresh readings to a latency multiplier."""

from __future__ import annotations

import dataclasses
import itertools
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.simulation.nvml import NvmlStandin, StandinGpu
from agent.simulation.trees import (
    AGENT_PID,
    BROWSER_PID,
    amd_laptop,
    amdgpu_fdinfo,
    desktop,
    i915_fdinfo,
    intel_laptop,
    laptop,
    nvidia_desktop,
    server,
    vm,
)
from monitors.graphs.importer import load_graph
from monitors.speed.prediction import (
    POWER_SAVING_FACTOR,
    UNSIZED_THROTTLING_FACTOR,
    contention_factor,
    lockstep_penalty,
    predict_accelerator,
)
from monitors.speed.present import (
    GEMM_NOISE,
    MAX_GEMM,
    MAX_HANDOFF_MS_PER_MB,
    MAX_MEMORY,
    MEMORY_NOISE,
    MIN_GEMM,
    MIN_MEMORY,
    Measurement,
    Speed,
    blend,
    combine,
    fastest,
    gemm_multiplier,
    memory_multiplier,
    speed_from_state,
)
from probes.refresh import gemm_probe, handoff_probe
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


def m(slowdown: float | None, predicted: float = 1.0, contention: float = 1.0,
      handoff: float | None = None) -> Measurement:
    """A warm refresh's reading, taken where the signals predicted `predicted` (`contention` of it time slicing)."""
    return Measurement(slowdown, handoff, predicted, contention)


def with_cpu(state, **changes):
    return dataclasses.replace(state, cpu=dataclasses.replace(state.cpu, **changes))


def test_desktop_fixture_tree_quiet_is_calibrated_speed(tmp_path):
    speed = speed_from_state(sampled(desktop(tmp_path)), 8)
    assert isinstance(speed, Speed)
    assert speed.cpu == 1.0 and speed.gpu is None and speed.gpu_free_bytes is None and speed.reasons == ()


def test_lockstep_penalty_is_continuous_monotone_and_spares_one_thread():
    assert lockstep_penalty(1.0, 2) == 1.0 and lockstep_penalty(0.8, 4) == 1.0
    assert lockstep_penalty(3.0, 1) == 1.0  # one thread waits for nobody
    assert lockstep_penalty(1.01, 2) == pytest.approx(1.0, rel=0.02)  # no jump at the edge of oversubscription
    values = [contention_factor(threads=2, others=i / 20, cores=2) for i in range(60)]
    assert values == sorted(values) and all(b - a < 0.15 for a, b in itertools.pairwise(values))
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
    speed = speed_from_state(sampled(desktop(tmp_path), busy=50, idle=50), 8)
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
    assert speed_from_state(state, 2).cpu == pytest.approx(lockstep(4.0, 2))  # (2 + 6) / 2, not (2 + 2) / 2


def test_vm_fixture_tree_steal_time_slows_cpu(tmp_path):
    state = sampled(vm(tmp_path), busy=0, idle=75, steal=25)
    speed = speed_from_state(state, 2)
    assert speed.cpu == pytest.approx(1 / 0.75, rel=1e-3)
    assert any("steal" in r for r in speed.reasons)


def test_laptop_fixture_tree_low_power_profile(tmp_path):
    speed = speed_from_state(sampled(laptop(tmp_path)), 4)
    assert speed.cpu == pytest.approx(POWER_SAVING_FACTOR)
    assert any("low-power" in r for r in speed.reasons)


def test_laptop_fixture_tree_thermal_throttling_uses_clock_ratio(tmp_path):
    tree = laptop(tmp_path)
    tree.set("firmware/acpi/platform_profile", "balanced")
    tree.set("class/thermal/thermal_zone1/temp", "92000")
    tree.cpufreq(cur_khz=2_100_000, max_khz=4_200_000, governor="powersave", epp="balance_performance")
    # busy cores (2 of 4, by others): the current clock is the throttled one
    speed = speed_from_state(sampled(tree, busy=50, idle=50), 4)
    assert speed.cpu == pytest.approx(2.0 * lockstep(1.5, 4))  # 4.2 GHz / 2.1 GHz, times (4 + 2) / 4 contended
    assert any("thermal throttling, clock 2100" in r for r in speed.reasons)
    # idle cores clock down anyway: the clock says nothing, a guess until measured
    idle = speed_from_state(sampled(tree), 4)
    assert idle.cpu == pytest.approx(UNSIZED_THROTTLING_FACTOR)


def test_laptop_fixture_tree_fan_running_is_throttling_but_no_slowdown(tmp_path):
    tree = laptop(tmp_path)
    tree.set("firmware/acpi/platform_profile", "balanced")
    tree.cpufreq(cur_khz=1_400_000, max_khz=4_200_000, governor="powersave", epp="balance_performance")
    tree.set("class/thermal/cooling_device1/cur_state", "1")  # the Fan
    state = sampled(tree)
    assert state.thermal.throttling is True and state.thermal.cpu_throttling is False
    assert speed_from_state(state, 4).cpu == 1.0


def test_desktop_fixture_tree_clock_cap(tmp_path):
    tree = desktop(tmp_path)
    tree.cpufreq(cur_khz=2_000_000, max_khz=4_000_000, limit_khz=2_000_000, governor="powersave",
                 epp="balance_performance")
    assert speed_from_state(sampled(tree), 8).cpu == pytest.approx(2.0)


def test_vm_fixture_tree_throttling_without_clocks_is_a_guess(tmp_path):
    state = sampled(vm(tmp_path))
    hot = dataclasses.replace(state, thermal=dataclasses.replace(state.thermal, throttling=True, cpu_throttling=True))
    assert speed_from_state(hot, 2).cpu == pytest.approx(UNSIZED_THROTTLING_FACTOR)


def test_server_fixture_tree_nvml_standin_gpu_busy_and_capped(tmp_path):
    nvml = NvmlStandin([StandinGpu(util=50, used=20 * 2**30, sm_mhz=1050, sm_max_mhz=2100, reasons=0x04)])
    speed = speed_from_state(sampled(server(tmp_path), nvml), 16)
    assert speed.gpu == pytest.approx(1.5 * 2.0)
    assert speed.gpu_free_bytes == 4 * 2**30
    assert any("gpu 50 % busy" in r for r in speed.reasons) and any("power capping" in r for r in speed.reasons)


def test_server_fixture_tree_nvml_standin_idle_gpu(tmp_path):
    speed = speed_from_state(sampled(server(tmp_path), NvmlStandin()), 16)
    assert speed.gpu == 1.0 and speed.gpu_free_bytes == 23 * 2**30


def test_nvidia_desktop_fixture_tree_gpu_speed_from_its_card_with_nvml(tmp_path):
    """The `gpu` device is CUDA device 0: NVML's GPU 0, here on its DRM card."""
    nvml = NvmlStandin([StandinGpu(util=30, used=23 * 2**30, reasons=0x20, sm_mhz=1400, sm_max_mhz=2100)])
    speed = speed_from_state(sampled(nvidia_desktop(tmp_path), nvml), 8)
    assert speed.gpu == pytest.approx(1.3 * 1.5) and speed.gpu_free_bytes == 2**30
    assert any("gpu thermal capping, clock 1400 of 2100 MHz" in r for r in speed.reasons)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def accelerator(tree, id_, change=None):
    """An accelerator sampled twice from a fixture tree, 1 s apart by the accelerator probe's clock; its idle
    counters move by a whole second unless `change` (the tree between the samples) says otherwise."""
    sampler = Sampler(tree.sys, tree.proc, own_pids=lambda: {AGENT_PID})
    clock = Clock()
    sampler.accelerators.clock = sampler.accelerators.drm.clock = clock
    sampler.sample()
    clock.now += 1.0
    for counter in tree.sys.glob("devices/*/*/drm/card*/gt/gt0/rc6_residency_ms"):
        counter.write_text(str(int(counter.read_text()) + 1000))
    for counter in tree.sys.glob("devices/*/*/tile0/gt0/gtidle/idle_residency_ms"):
        counter.write_text(str(int(counter.read_text()) + 1000))
    if change:
        change(tree)
    state = sampler.sample()
    return state.accelerator(id_), state


def test_intel_laptop_fixture_tree_igpu_busy_with_others_and_power_capped(tmp_path):
    def load(tree):
        tree.drm_client(BROWSER_PID, 30, "dri/renderD128", i915_fdinfo(7, render_ns=10_000_000_000 + 10**12))
        gt = "devices/pci0000:00/0000:00:02.0/drm/card0/gt/gt0"
        tree.set(f"{gt}/throttle_reason_status", "1")
        tree.set(f"{gt}/throttle_reason_pl1", "1")
        tree.set(f"{gt}/rps_act_freq_mhz", "650")

    gpu, state = accelerator(intel_laptop(tmp_path), "gpu0", load)
    assert gpu.others_busy == 1.0  # the browser's render engine: a whole interval's worth and more
    factor, free, reasons = predict_accelerator(gpu, state.memory.available_bytes)
    assert factor == pytest.approx(2.0 * 2.0)  # time slicing with a busy client, 650 of 1300 MHz
    assert free == state.memory.available_bytes == 12 * 2**30  # an integrated GPU: the system's memory
    assert reasons == ["gpu 100 % busy", "gpu power capping, clock 650 of 1300 MHz"]


def test_intel_laptop_fixture_tree_clock_cap_and_unsized_throttling(tmp_path):
    tree = intel_laptop(tmp_path / "capped")
    tree.set("devices/pci0000:00/0000:00:02.0/drm/card0/gt/gt0/rps_max_freq_mhz", "650")  # a user's cap
    gpu, _ = accelerator(tree, "gpu0")
    assert gpu.others_busy == 0.0
    assert predict_accelerator(gpu) == (pytest.approx(2.0), None, ["gpu clock capped at 650 of 1300 MHz"])

    def idle_but_throttled(tree):
        throttle = "devices/pci0000:00/0000:00:02.0/tile0/gt0/freq0"
        tree.set(f"{throttle}/throttle/status", "1")
        tree.set(f"{throttle}/throttle/reason_thermal", "1")
        tree.set(f"{throttle}/act_freq", "0")  # in RC6: the clock cannot size it
        tree.set("devices/pci0000:00/0000:00:02.0/tile0/gt0/gtidle/idle_residency_ms", str(500_000 + 50_000))

    gpu, _ = accelerator(intel_laptop(tmp_path / "xe", "xe"), "gpu0", idle_but_throttled)
    factor, _, reasons = predict_accelerator(gpu)
    assert gpu.busy == 0.0 and factor == pytest.approx(UNSIZED_THROTTLING_FACTOR) and reasons == ["gpu thermal capping"]


def test_amd_laptop_fixture_tree_agent_own_load_is_not_a_slowdown(tmp_path):

    def own_load(tree):
        tree.drm_client(AGENT_PID + 1, 5, "dri/renderD128", amdgpu_fdinfo(14, gfx_ns=10**12, vram_kib=1024))

    gpu, _ = accelerator(amd_laptop(tmp_path), "gpu0", own_load)
    assert gpu.busy == 0.35 and gpu.own_busy == 1.0 and gpu.others_busy == 0.0
    factor, free, reasons = predict_accelerator(gpu)
    assert factor == 1.0 and free == 312 * 2**20 and reasons == []


def test_combination_rule():
    # no measurement: the prediction
    assert combine(1.5, 1.0, None, current=False) == 1.5
    # measurement older than the last marked change: the slower view of the prediction and what the agent
    # made of the measurement then (half and half in log space, where nothing contended)
    assert combine(2.0, 1.0, m(1.0), current=False) == 2.0
    assert combine(1.0, 1.0, m(1.8), current=False) == pytest.approx(math.sqrt(1.8))
    # measurement taken in the present state: blended with the prediction
    blended = combine(2.0, 1.0, m(1.2), current=True)
    assert blended == pytest.approx(math.sqrt(2.4))
    assert combine(1.0, 1.0, m(1.0), current=True) == pytest.approx(1.0)


def test_desktop_fixture_tree_measured_slowdown_confirmed(tmp_path):
    state = sampled(desktop(tmp_path), busy=50, idle=50)
    predicted = lockstep(1.5, 8)
    stale = speed_from_state(state, 8, m(1.0), current=False)
    fresh = speed_from_state(state, 8, m(1.0), current=True)
    assert stale.cpu == pytest.approx(predicted) and stale.predicted_cpu == pytest.approx(predicted)
    assert 1.0 < fresh.cpu < stale.cpu
    # the measurement weighs 0.5 / the square of the slowdown the signals put down to time slicing (here all)
    assert fresh.cpu == pytest.approx(predicted ** (1 - 0.5 / predicted ** 2), rel=1e-3)


def test_a_current_measurement_weighs_less_the_more_time_slicing_the_signals_see():
    # no contention: half and half (a throttled clock the signals miss, a host's other tenants)
    assert combine(1.0, 1.0, m(2.0), current=True) == pytest.approx(math.sqrt(2.0))
    assert combine(1.5, 1.0, m(2.0), current=True) == pytest.approx(math.sqrt(3.0))
    # four busy processes on two cores: the probe read 2.3x where apps ran about 5x; the prediction 4.8x leads
    sliced = combine(4.8, 4.8, m(2.3), current=True)
    weight = 0.5 / 4.8 ** 2
    assert sliced == pytest.approx(math.exp(weight * math.log(2.3) + (1 - weight) * math.log(4.8)))
    assert 4.6 < sliced < 4.8
    assert combine(4.8, 0.5, m(2.3), current=True) == combine(4.8, 1.0, m(2.3), current=True)


def test_vm_fixture_tree_handoff_extra_is_the_measurement_s_and_bounded(tmp_path):
    state = sampled(vm(tmp_path))
    assert speed_from_state(state, 2, m(1.0), current=True).handoff_ms_per_mb == 0.0  # none measured
    measured = speed_from_state(state, 2, m(1.02, handoff=0.12), current=True)
    assert measured.handoff_ms_per_mb == pytest.approx(0.12)
    assert measured.cpu == pytest.approx(math.sqrt(1.02), rel=1e-3)  # the multiplier is the compute probe's alone
    assert any("hand data across cores" in r for r in measured.reasons)
    # kept after a marked change too: no signal says whether the host's phase moved
    assert speed_from_state(state, 2, m(1.02, handoff=0.12)).handoff_ms_per_mb == pytest.approx(0.12)
    for wild, bounded in ((math.nan, 0.0), (-1.0, 0.0), (1e9, MAX_HANDOFF_MS_PER_MB)):
        assert speed_from_state(state, 2, m(1.0, handoff=wild)).handoff_ms_per_mb == bounded


def test_vm_fixture_tree_memory_multiplier_is_the_stream_probe_s_and_stretches_only_streamed_time(tmp_path):
    state = sampled(vm(tmp_path))
    assert speed_from_state(state, 2, m(1.0), current=True).memory == 1.0  # none read
    slow = speed_from_state(state, 2, Measurement(1.0, None, memory=1.6), current=True)
    assert slow.memory == pytest.approx(1.6 / MEMORY_NOISE, rel=1e-3)
    assert any("memory streams 1.43x slower" in r for r in slow.reasons)
    assert speed_from_state(state, 2, Measurement(1.0, None, memory=0.01)).memory == MIN_MEMORY * MEMORY_NOISE
    # a decode step of 30 ms that streams 25 of them, and a convolution net of 30 ms that streams none
    speed = Speed(cpu=2.0, gpu=None, memory=1.6)
    assert fastest({"cpu": 30.0}, speed, stream_ms=25.0)[0] == pytest.approx(2.0 * (30.0 + 0.6 * 25.0))
    assert fastest({"cpu": 30.0}, speed)[0] == pytest.approx(60.0)
    assert fastest({"gpu": 30.0}, dataclasses.replace(speed, gpu=1.0), stream_ms=25.0)[0] == 30.0  # the CPU's


def test_memory_multiplier_is_bounded_and_a_steady_host_s_noise_moves_nothing():
    assert memory_multiplier(None) == memory_multiplier(math.nan) == 1.0
    for steady in (1.0, 1.1, 1 / 1.1, MEMORY_NOISE, 1 / MEMORY_NOISE):
        assert memory_multiplier(steady) == pytest.approx(1.0)
    assert memory_multiplier(2.0) == pytest.approx(2.0 / MEMORY_NOISE)
    assert memory_multiplier(0.6) == pytest.approx(0.6 * MEMORY_NOISE)
    assert memory_multiplier(1e9) == MAX_MEMORY / MEMORY_NOISE and memory_multiplier(0.0) == MIN_MEMORY * MEMORY_NOISE
    # continuous at the band's edges
    assert memory_multiplier(MEMORY_NOISE * 1.0001) == pytest.approx(1.0, abs=1e-3)


def test_vm_fixture_tree_gemm_multiplier_is_the_gemm_probe_s_and_stretches_only_the_float_products(tmp_path):
    state = sampled(vm(tmp_path))
    assert speed_from_state(state, 2, m(1.0), current=True).gemm == 1.0  # none read
    # calibrated in a spell, read out of it: below 1
    fast = speed_from_state(state, 2, Measurement(1.0, None, gemm=0.8), current=True)
    assert fast.gemm == pytest.approx(0.8 * GEMM_NOISE)
    # read in a spell: one reading may be a few seconds' state, and never raises an estimate (or moves a monitor)
    slow = speed_from_state(state, 2, Measurement(1.0, None, gemm=1.3), current=True)
    assert slow.gemm == 1.0 and slow.reasons == fast.reasons
    # a transformer of 30 ms whose products take 24 of them, and a convolution net of 30 ms with none
    speed = Speed(cpu=1.1, gpu=None, gemm=0.8)
    assert fastest({"cpu": 30.0}, speed, gemm_ms=24.0)[0] == pytest.approx(1.1 * (30.0 - 0.2 * 24.0))
    assert fastest({"cpu": 30.0}, speed)[0] == pytest.approx(33.0)
    assert fastest({"gpu": 30.0}, dataclasses.replace(speed, gpu=1.0), gemm_ms=24.0)[0] == 30.0  # the CPU's


def test_gemm_multiplier_is_bounded_and_a_steady_host_s_noise_moves_nothing():
    assert gemm_multiplier(None) == gemm_multiplier(math.nan) == 1.0
    for steady in (1.0, 1.03, 1 / 1.03, GEMM_NOISE, 1 / GEMM_NOISE):
        assert gemm_multiplier(steady) == pytest.approx(1.0)
    assert gemm_multiplier(1e9) == MAX_GEMM == 1.0 and gemm_multiplier(0.0) == MIN_GEMM * GEMM_NOISE


def test_estimate_stretches_a_plan_s_float_products_by_the_gemm_multiplier_and_nothing_else(estimator):
    product = estimator.plan(load_graph(gemm_probe()[0], fmt="onnx"), "cpu")
    convolutions = estimator.plan(load_graph(handoff_probe()[0], fmt="onnx"), "cpu")
    cal = estimator.calibrations["cpu"]
    overhead_ms = 1000.0 * (cal.per_run_s + cal.per_kernel_s)
    at_rest = estimator.estimate(product, device="cpu").latency_ms
    assert estimator.gemm_ms(product) == pytest.approx(at_rest - overhead_ms, rel=1e-6)  # the product computes
    assert estimator.gemm_ms(convolutions) == 0.0
    assert estimator.gemm_ms(product, device="gpu") == 0.0
    spell = Speed(cpu=1.0, gpu=None, gemm=1.3)
    assert estimator.estimate(product, device="cpu", speed=spell).latency_ms == pytest.approx(
        at_rest + 0.3 * (at_rest - overhead_ms), rel=1e-6)
    assert estimator.estimate(convolutions, device="cpu", speed=spell).latency_ms == pytest.approx(
        estimator.estimate(convolutions, device="cpu").latency_ms)


def test_estimate_adds_the_handoff_extra_for_the_bytes_the_cpu_plan_writes(estimator):

    plan = estimator.plan(load_graph(handoff_probe()[0], fmt="onnx"), "cpu")
    quiet = Speed(cpu=1.5, gpu=None, gpu_free_bytes=None, reasons=())
    phase = dataclasses.replace(quiet, handoff_ms_per_mb=0.1)
    at_rest = estimator.estimate(plan, device="cpu").latency_ms
    assert estimator.estimate(plan, device="cpu", speed=quiet).latency_ms == pytest.approx(1.5 * at_rest)
    assert estimator.estimate(plan, device="cpu", speed=phase).latency_ms == pytest.approx(
        1.5 * at_rest + 0.1 * plan.written_mb)


@given(load=st.floats(0, 1), steal=st.floats(0, 1), psi=st.floats(0, 100),
       measured=st.one_of(st.none(), st.floats(0.01, 100)), current=st.booleans(), threads=st.integers(1, 64))
def test_speed_is_bounded_and_finite(load, steal, psi, measured, current, threads):
    state = _VM_STATE
    state = with_cpu(state, load=load, others_busy_cores=load * 2, steal=steal, psi_some_avg10=psi)
    speed = speed_from_state(state, threads, None if measured is None else m(measured), current)
    assert math.isfinite(speed.cpu) and 0.8 <= speed.cpu <= 50.0


def _vm_state():

    with tempfile.TemporaryDirectory() as d:
        return sampled(vm(Path(d)))


_VM_STATE = _vm_state()


def test_stale_measurement_is_carried_over_by_how_the_prediction_moved():
    # measured 3.5x under load the signals put at 3.2x, all of it time slicing: the agent took it as
    # blend(3.2, 3.5, 3.2) then. Now the signals say 1.1x: the load has gone, believed at once rather
    # than at the next warm refresh (the correction fading with the 3.2x slowdown it corrected: 1.1 is
    # log 1.1 / log 3.2 of it)
    then = blend(3.2, 3.5, contention=3.2)
    assert combine(1.1, 1.0, m(3.5, 3.2, 3.2), current=False) == pytest.approx(
        1.1 * (then / 3.2) ** (math.log(1.1) / math.log(3.2)))
    assert combine(1.0, 1.0, m(7.0, 3.0, 3.0), current=False) == pytest.approx(1.0)
    # more load: the correction kept
    expected = 4.0 * blend(3.0, 4.5, contention=3.0) / 3.0
    assert combine(4.0, 4.0, m(4.5, 3.0, 3.0), current=False) == pytest.approx(expected)
    # measured 1.5x where the signals saw nothing (say, throttling they miss): what the agent made of it
    # (the square root, nothing contending) is kept through changes
    assert combine(1.05, 1.0, m(1.5), current=False) == pytest.approx(1.05 * math.sqrt(1.5))
    # measured quiet (1.0 at 1.0); load arrives (3.2): the prediction is believed at once too
    assert combine(3.2, 3.2, m(1.0), current=False) == pytest.approx(3.2)
    # the measurement saw more than the signals: the surplus the agent believed is kept through the change
    assert combine(2.0, 1.0, m(3.0, 2.0), current=False) == pytest.approx(math.sqrt(6.0))


def test_a_carried_measurement_continues_the_multiplier_the_agent_had():
    """No jump at a marked change: where the prediction has not moved, the carried measurement gives what
    the agent had before the change (or the prediction, where that is slower)."""
    for predicted, measured, contention in ((1.0, 1.47, 1.0), (1.3, 2.0, 1.0), (2.4, 3.7, 2.4), (4.8, 2.3, 4.8)):
        current = combine(predicted, contention, m(measured, predicted, contention), current=True)
        carried = combine(predicted, contention, m(measured, predicted, contention), current=False)
        assert carried == pytest.approx(max(predicted, current))
    # a burst of load that came and went at rest (a client starting up): the 1.47x reading stays the agent's
    # 1.21x, not 1.47x until the next warm refresh
    assert combine(1.0, 1.0, m(1.47), current=False) == pytest.approx(1.2124, abs=1e-4)
    # one busy process, the probe over-reading it (3.7x at 2.4x): when the load grows to 4.8x the estimate
    # grows with it, and not by the probe's 1.54x surplus that the agent had weighed at 9 %
    assert combine(4.8, 4.8, m(3.7, 2.4, 2.4), current=False) < 4.8 * 1.05


def test_straggler_penalty_needs_cores_really_kept_busy_not_a_runnable_snapshot():
    # idle device: the runnable snapshot reads one other task, but nothing kept a core busy
    assert contention_factor(threads=2, others=1.0, cores=2, busy_others=0.02) == pytest.approx(1.5, rel=0.02)
    # one busy process: most of a core kept busy, so the lock-stepped threads pay for it
    assert contention_factor(threads=2, others=1.0, cores=2, busy_others=0.9) > 2.2
