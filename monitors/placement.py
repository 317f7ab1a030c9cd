"""Which accelerator can run a graph: onnxruntime's execution providers, the accelerators each drives, and the
WebNN context hints mapped onto them.

Pure mapping. The installed providers come from probes/providers.py, the accelerators from
probes/accelerators.py. The estimator has one calibrated device per calibrated provider: `cpu`
(CPUExecutionProvider) and `gpu` (CUDAExecutionProvider, on CUDA device 0: NVML's GPU 0). Any other
accelerator (an Intel or AMD GPU, an NPU) can be seen and its load read, but no estimate runs on it
until its provider is calibrated; `no_provider_line` says so in one line.

The WebNN hints (MLContextOptions) as the Working Group discusses them:
- `deviceType`: "cpu", "gpu" or "npu"; removed from the spec in 2025 (webnn#809), kept by implementations
  and here as the explicit choice (`--device`);
- `powerPreference`: "default", "high-performance", "low-power", and the proposed "fallback"
  (webnn#923: maximum compatibility, typically the CPU);
- `accelerated`: the proposed boolean (webnn#895, true by default): false asks for no massively parallel
  accelerator, that is the CPU.
They map as webnn#815 sketches: low-power prefers an NPU, then an integrated GPU, then the CPU, then a
discrete GPU; high-performance and default take the fastest estimate among the calibrated devices;
fallback or `accelerated: false` take the CPU; `accelerated: true` prefers an accelerator to the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from monitors.errors import BadInput

if TYPE_CHECKING:  # data only: monitors/ does no I/O
    from probes.accelerators import AcceleratorState

DEVICE_TYPES = ("cpu", "gpu", "npu")
POWER_PREFERENCES = ("default", "high-performance", "low-power", "fallback")


@dataclass(frozen=True)
class Provider:
    name: str
    kinds: frozenset[str]  # cpu, gpu, npu
    vendors: frozenset[str] | None  # None: any vendor's
    calibrated_as: str | None = None  # the estimator's device this provider is calibrated as; None: not calibrated


def _p(name: str, kinds: str, vendors: str | None, calibrated_as: str | None = None) -> Provider:
    return Provider(name, frozenset(kinds.split()), frozenset(vendors.split()) if vendors else None, calibrated_as)


PROVIDERS: tuple[Provider, ...] = (
    _p("CPUExecutionProvider", "cpu", None, "cpu"),
    _p("CUDAExecutionProvider", "gpu", "nvidia", "gpu"),
    _p("TensorrtExecutionProvider", "gpu", "nvidia"),
    _p("NvTensorRTRTXExecutionProvider", "gpu", "nvidia"),
    _p("MIGraphXExecutionProvider", "gpu", "amd"),
    _p("ROCMExecutionProvider", "gpu", "amd"),
    _p("OpenVINOExecutionProvider", "cpu gpu npu", "intel"),
    _p("VitisAIExecutionProvider", "npu", "amd"),
    _p("QNNExecutionProvider", "gpu npu", "qualcomm"),
    _p("RknpuExecutionProvider", "npu", "rockchip"),
    _p("CANNExecutionProvider", "npu", "huawei"),
    _p("WebGpuExecutionProvider", "gpu", None),
    _p("DmlExecutionProvider", "gpu npu", None),
)
BY_NAME = {p.name: p for p in PROVIDERS}
CALIBRATED = tuple(p.name for p in PROVIDERS if p.calibrated_as)


@dataclass(frozen=True)
class ContextHints:
    device_type: str | None = None  # "cpu", "gpu", "npu"; None: not given
    power_preference: str = "default"
    accelerated: bool | None = None  # None: not given (the proposal's default is true)

    def __post_init__(self) -> None:
        if self.device_type is not None and self.device_type not in DEVICE_TYPES:
            raise BadInput(f"deviceType {self.device_type!r}: expected one of {', '.join(DEVICE_TYPES)}")
        if self.power_preference not in POWER_PREFERENCES:
            raise BadInput(f"powerPreference {self.power_preference!r}: expected one of {', '.join(POWER_PREFERENCES)}")
        wants_cpu = self.power_preference == "fallback" or self.accelerated is False
        if wants_cpu and self.device_type in ("gpu", "npu"):
            why = "powerPreference fallback" if self.power_preference == "fallback" else "accelerated false"
            raise BadInput(f"deviceType {self.device_type} contradicts {why} (which asks for the CPU)")


@dataclass(frozen=True)
class Placement:
    device: str  # what the estimator runs: "cpu", "gpu", or "auto" (the fastest of the calibrated devices)
    accelerator: str | None  # the accelerator's id when the device is one (gpu0)
    notes: tuple[str, ...] = ()  # a preferred device that cannot run it, and why: one line each


def providers_for(acc: AcceleratorState, installed: Iterable[str]) -> list[str]:
    """The installed providers that can drive this accelerator."""
    return [name for name in installed if name in BY_NAME and _drives(BY_NAME[name], acc)]


def _drives(provider: Provider, acc: AcceleratorState) -> bool:
    return acc.kind in provider.kinds and (provider.vendors is None or acc.vendor in provider.vendors)


def device_accelerator(device: str, accelerators: Iterable[AcceleratorState]) -> AcceleratorState | None:
    """The accelerator a calibrated device runs on: `gpu` is CUDA device 0, NVML's GPU 0 (else the first NVIDIA
    GPU seen)."""
    if device != "gpu":
        return None
    nvidia = [a for a in accelerators if a.kind == "gpu" and a.vendor == "nvidia"]
    indexed = sorted((a for a in nvidia if a.nvml_index is not None), key=lambda a: a.nvml_index or 0)
    candidates = indexed or nvidia
    return candidates[0] if candidates else None


def calibrated_device(acc: AcceleratorState, accelerators: Iterable[AcceleratorState],
                      installed: Iterable[str]) -> str | None:
    """The estimator's device that runs on this accelerator, where its calibrated provider is installed."""
    names = set(installed)
    for provider in PROVIDERS:
        if provider.calibrated_as and provider.calibrated_as != "cpu" and provider.name in names \
                and _drives(provider, acc) and device_accelerator(provider.calibrated_as, accelerators) is acc:
            return provider.calibrated_as
    return None


def no_provider_line(acc: AcceleratorState, installed: Iterable[str]) -> str:
    """Why no estimate runs on this accelerator, in one line."""
    names = list(installed)
    present = providers_for(acc, names)
    known = [p.name for p in PROVIDERS if p.vendors and _drives(p, acc)]
    if "CUDAExecutionProvider" in present:
        why = "CUDAExecutionProvider is calibrated on CUDA device 0 only"
    elif present:
        why = f"{', '.join(present)} {'is' if len(present) == 1 else 'are'} installed but not calibrated"
    elif known:
        why = f"{' or '.join(known)} would drive it and {'is' if len(known) == 1 else 'are'} not installed"
    else:
        why = "no onnxruntime execution provider drives it"
    return (f"{acc.id} ({acc.name or acc.driver or acc.kind}): no calibrated onnxruntime execution provider "
            f"({why}; daop-agent calibrates {' and '.join(CALIBRATED)})")


def _targets(hints: ContextHints, accelerators: list[AcceleratorState]) -> tuple[list[AcceleratorState | None], bool]:
    """The devices the hints ask for, in order (None: the CPU), and whether the fastest of them is wanted
    (else the first that can run)."""
    gpus = [a for a in accelerators if a.kind == "gpu"]
    integrated = [a for a in gpus if a.shares_system_memory]
    discrete = [a for a in gpus if not a.shares_system_memory]
    npus = [a for a in accelerators if a.kind == "npu"]
    if hints.power_preference == "fallback" or hints.accelerated is False or hints.device_type == "cpu":
        return [None], False
    if hints.device_type == "gpu":
        ordered = integrated + discrete if hints.power_preference == "low-power" else discrete + integrated
        return list(ordered), hints.power_preference != "low-power"
    if hints.device_type == "npu":
        return list(npus), False
    if hints.power_preference == "low-power":
        return [*npus, *integrated, None, *discrete], False
    return [*discrete, *integrated, *npus, None], True


def place(hints: ContextHints, accelerators: Iterable[AcceleratorState], installed: Iterable[str]) -> Placement:
    """Where the estimator runs a graph for these hints. An explicit `deviceType` that no calibrated provider
    serves is bad input; a preference that cannot be met falls back, with a note."""
    accs = list(accelerators)
    names = list(installed)
    targets, fastest = _targets(hints, accs)
    runnable: list[tuple[str, AcceleratorState | None]] = []
    notes: list[str] = []
    for target in targets:
        if target is None:
            runnable.append(("cpu", None))
            continue
        device = calibrated_device(target, accs, names)
        if device is not None:
            runnable.append((device, target))
        elif not runnable or fastest:
            notes.append(no_provider_line(target, names))
    if hints.device_type is not None and not runnable:
        kind = hints.device_type
        if not targets:
            raise BadInput(f"no {kind.upper()} on this device (none under /sys/class/"
                           f"{'accel' if kind == 'npu' else 'drm'}{' nor in NVML' if kind == 'gpu' else ''})")
        raise BadInput(notes[0] if len(notes) == 1
                       else f"no {kind.upper()} here can run an estimate: " + "; ".join(notes))
    if not runnable:  # every preferred accelerator lacks a provider: the CPU runs everything
        return Placement("cpu", None, tuple(notes))
    if hints.accelerated and any(acc is not None for _, acc in runnable):
        runnable = [r for r in runnable if r[1] is not None]
    if fastest and len({device for device, _ in runnable}) > 1:
        return Placement("auto", None, tuple(notes))
    device, acc = runnable[0]
    return Placement(device, acc.id if acc is not None else None, tuple(notes))
