"""monitors/placement.py: which accelerator runs a graph, for --device and the WebNN context hints, on the
accelerators sampled from fixture trees (no such hardware here) and given lists of installed providers."""

from __future__ import annotations

import pytest

from agent.simulation.nvml import NvmlStandin, StandinGpu
from agent.simulation.trees import amd_laptop, intel_laptop, nvidia_desktop, vm
from monitors.errors import BadInput
from monitors.placement import (
    ContextHints,
    Placement,
    calibrated_device,
    device_accelerator,
    no_provider_line,
    place,
    providers_for,
)
from probes.state import Sampler

CPU_ONLY = ("CPUExecutionProvider",)
CUDA = ("CUDAExecutionProvider", "CPUExecutionProvider")
OPENVINO = ("OpenVINOExecutionProvider", "CPUExecutionProvider")


def accelerators(tree, nvml=None):
    return Sampler(tree.sys, tree.proc, nvml, gpus=nvml is not None).sample().accelerators


@pytest.fixture
def intel(tmp_path):
    return accelerators(intel_laptop(tmp_path / "intel"))


@pytest.fixture
def nvidia(tmp_path):
    return accelerators(nvidia_desktop(tmp_path / "nvidia"), NvmlStandin())


def test_providers_drive_accelerators_by_kind_and_vendor(intel, nvidia, tmp_path):
    gpu, npu = intel
    assert providers_for(gpu, OPENVINO) == ["OpenVINOExecutionProvider"] and providers_for(npu, CUDA) == []
    assert providers_for(nvidia[0], CUDA + ("TensorrtExecutionProvider",)) == ["CUDAExecutionProvider",
                                                                              "TensorrtExecutionProvider"]
    amd_gpu, amd_npu = accelerators(amd_laptop(tmp_path / "amd"))
    assert providers_for(amd_gpu, ("MIGraphXExecutionProvider",)) == ["MIGraphXExecutionProvider"]
    available = ("VitisAIExecutionProvider", "MIGraphXExecutionProvider")
    assert providers_for(amd_npu, available) == ["VitisAIExecutionProvider"]


def test_only_cuda_device_0_is_calibrated(nvidia, intel):
    assert device_accelerator("gpu", nvidia) is nvidia[0]
    assert calibrated_device(nvidia[0], nvidia, CUDA) == "gpu"
    assert calibrated_device(nvidia[0], nvidia, CPU_ONLY) is None  # a CUDA-less onnxruntime
    assert calibrated_device(intel[0], intel, OPENVINO) is None  # OpenVINO is not calibrated
    assert device_accelerator("gpu", intel) is None


def test_second_nvidia_gpu_is_not_the_calibrated_one(tmp_path):
    nvml = NvmlStandin([StandinGpu(), StandinGpu(name="second", bus_id="00000000:41:00.0")])
    accs = accelerators(nvidia_desktop(tmp_path), nvml)
    assert [calibrated_device(a, accs, CUDA) for a in accs] == ["gpu", None]
    assert "CUDA device 0 only" in no_provider_line(accs[1], CUDA)


def test_no_provider_line_is_one_clear_line(intel, tmp_path):
    gpu, npu = intel
    line = no_provider_line(npu, CPU_ONLY)
    assert "\n" not in line and line.startswith("npu0 (")
    assert "OpenVINOExecutionProvider would drive it and is not installed" in line
    assert "calibrates CPUExecutionProvider and CUDAExecutionProvider" in line
    assert "OpenVINOExecutionProvider is installed but not calibrated" in no_provider_line(gpu, OPENVINO)
    amd_gpu, _ = accelerators(amd_laptop(tmp_path / "amd"))
    assert "MIGraphXExecutionProvider or ROCMExecutionProvider would drive it" in no_provider_line(amd_gpu, CPU_ONLY)


def test_default_hints_take_the_fastest_calibrated_device(nvidia, intel):
    assert place(ContextHints(), nvidia, CUDA) == Placement("auto", None)
    assert place(ContextHints(power_preference="high-performance"), nvidia, CUDA) == Placement("auto", None)
    on_intel = place(ContextHints(), intel, OPENVINO)
    assert on_intel.device == "cpu" and len(on_intel.notes) == 2  # the iGPU and the NPU: why neither is used
    assert on_intel.notes[0].startswith("gpu0 (") and on_intel.notes[1].startswith("npu0 (")


def test_fallback_and_not_accelerated_take_the_cpu(nvidia):
    assert place(ContextHints(power_preference="fallback"), nvidia, CUDA) == Placement("cpu", None)
    assert place(ContextHints(accelerated=False), nvidia, CUDA) == Placement("cpu", None)
    assert place(ContextHints(device_type="cpu"), nvidia, CUDA) == Placement("cpu", None)


def test_accelerated_prefers_an_accelerator_to_the_cpu(nvidia, intel):
    assert place(ContextHints(accelerated=True), nvidia, CUDA) == Placement("gpu", "gpu0")
    assert place(ContextHints(accelerated=True), nvidia, CPU_ONLY).device == "cpu"  # none can run: the CPU, said why
    assert place(ContextHints(accelerated=True), intel, CPU_ONLY).notes


def test_low_power_prefers_npu_then_integrated_gpu_then_cpu_then_discrete(intel, nvidia):
    placed = place(ContextHints(power_preference="low-power"), intel, CPU_ONLY)
    assert placed.device == "cpu" and [n.split(" ", 1)[0] for n in placed.notes] == ["npu0", "gpu0"]
    # a discrete GPU last
    assert place(ContextHints(power_preference="low-power"), nvidia, CUDA) == Placement("cpu", None)


def test_explicit_device_type_without_a_calibrated_provider_is_bad_input(intel, tmp_path):
    with pytest.raises(BadInput, match=r"^npu0 \(.*OpenVINOExecutionProvider would drive it"):
        place(ContextHints(device_type="npu"), intel, CPU_ONLY)
    with pytest.raises(BadInput, match="gpu0"):
        place(ContextHints(device_type="gpu"), intel, OPENVINO)
    none = accelerators(vm(tmp_path / "vm"))
    with pytest.raises(BadInput, match="no GPU on this device"):
        place(ContextHints(device_type="gpu"), none, CUDA)
    with pytest.raises(BadInput, match="no NPU on this device"):
        place(ContextHints(device_type="npu"), none, CUDA)


def test_explicit_gpu_on_the_calibrated_one(nvidia):
    assert place(ContextHints(device_type="gpu"), nvidia, CUDA) == Placement("gpu", "gpu0")


@pytest.mark.parametrize("hints", [dict(device_type="tpu"), dict(power_preference="fast"),
                                   dict(device_type="gpu", power_preference="fallback"),
                                   dict(device_type="npu", accelerated=False)])
def test_bad_or_contradictory_hints_are_bad_input(hints):
    with pytest.raises(BadInput):
        ContextHints(**hints)
