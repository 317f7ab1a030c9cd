"""GPU probe through the NVML stand-in (no NVIDIA GPU here) and the real pynvml on this machine."""

from __future__ import annotations

import pytest

from agent.simulation.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NvmlStandin,
    StandinGpu,
)
from probes.gpu import GpuProbe


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nvml_standin_readings_in_units():
    nvml = NvmlStandin([StandinGpu(util=40, used=6 * 2**30, reasons=0x20 | 0x04)])
    report = GpuProbe(nvml).sample()
    assert report.note is None and len(report.gpus) == 1
    g = report.gpus[0]
    assert g.name == "NVIDIA Stand-in 24GB" and g.util_percent == 40.0
    assert g.memory_total_bytes == 24 * 2**30 and g.memory_free_bytes == 18 * 2**30
    assert g.power_w == 60.0 and g.power_limit_w == 300.0 and g.temp_c == 45.0
    assert g.sm_clock_mhz == 1800.0 and g.sm_clock_max_mhz == 2100.0
    assert g.thermal_throttling is True and g.power_capping is True and g.hw_slowdown is False


def test_nvml_standin_idle_is_not_throttling():
    g = GpuProbe(NvmlStandin()).sample().gpus[0]
    assert g.thermal_throttling is False and g.power_capping is False


@pytest.mark.parametrize("error", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED])
def test_nvml_standin_no_driver_is_no_gpus_not_an_error(error):
    report = GpuProbe(NvmlStandin(init_error=error)).sample()
    assert report.gpus == () and report.note.startswith("nvml: ")


def test_nvml_standin_init_retried_only_after_retry_interval():
    clock = Clock()
    nvml = NvmlStandin(init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    probe = GpuProbe(nvml, retry_s=300, clock=clock)
    assert probe.sample().gpus == ()
    nvml.init_error = None  # the driver got loaded
    clock.now = 10
    assert probe.sample().gpus == ()  # not asked again so soon: init can take seconds
    clock.now = 301
    assert len(probe.sample().gpus) == 1


def test_nvml_standin_error_midway_gives_last_good_then_none():
    clock = Clock()
    nvml = NvmlStandin([StandinGpu(util=30, temp=60)])
    probe = GpuProbe(nvml, stale_after_s=60, clock=clock)
    probe.sample()
    nvml.fail["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_GPU_IS_LOST
    nvml.fail["nvmlDeviceGetTemperature"] = NVML_ERROR_GPU_IS_LOST
    clock.now = 5
    g = probe.sample().gpus[0]
    assert g.util_percent == 30.0 and g.temp_c == 60.0  # last good
    assert g.stale == {"util": 5.0, "temp_c": 5.0}
    assert g.memory_free_bytes is not None and "memory" not in g.stale  # other readings still fresh
    clock.now = 100
    g = probe.sample().gpus[0]
    assert g.util_percent is None and g.temp_c is None  # too old: unknown, never 0


def test_nvml_standin_name_error_is_tolerated():
    nvml = NvmlStandin(fail={"nvmlDeviceGetName": NVML_ERROR_GPU_IS_LOST})
    g = GpuProbe(nvml).sample().gpus[0]
    assert g.name is None and g.util_percent == 0.0


def test_nvml_standin_two_gpus():
    nvml = NvmlStandin([StandinGpu(), StandinGpu(name="second", util=90)])
    gpus = GpuProbe(nvml).sample().gpus
    assert [g.index for g in gpus] == [0, 1] and gpus[1].util_percent == 90.0


def test_real_pynvml_on_this_machine_is_a_normal_state():
    """Without a driver (as on this VM) the real pynvml gives no GPUs and a note; with one, GPUs."""
    report = GpuProbe().sample()
    assert report.gpus or (report.note or "").startswith("nvml: ")
