"""GPU probe: NVIDIA GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

NVML's init can take seconds, so this probe is synchronous and the agent
runs the sampler in a thread, never on the event loop. No NVML library, no
driver or no GPU is a normal state (no GPUs), not an error. An NVML error
midway makes that one reading its last good value (with its age) or None.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from probes.sysfs import LastGood, Reading

# nvmlClocksEventReason* bits (nvml.h)
REASON_SW_POWER_CAP = 0x04
REASON_HW_SLOWDOWN = 0x08
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
THERMAL_REASONS = REASON_SW_THERMAL | REASON_HW_THERMAL
POWER_REASONS = REASON_SW_POWER_CAP | REASON_HW_POWER_BRAKE


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str | None
    util_percent: float | None
    memory_util_percent: float | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    temp_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    event_reasons: int | None  # nvmlDeviceGetCurrentClocksEventReasons bitmask
    stale: dict[str, float] = field(default_factory=dict)
    pci_slot: str | None = None  # `0000:01:00.0`, as sysfs and `drm-pdev` write it: ties NVML's GPU to its DRM card
    # each process's share of the SM time since the last sample, 0..1 (nvmlDeviceGetProcessUtilization); None where
    # the driver does not say (consumer boards, old drivers): the agent's own share cannot then be told apart
    process_busy: dict[int, float] | None = None

    @property
    def thermal_throttling(self) -> bool | None:
        return None if self.event_reasons is None else bool(self.event_reasons & THERMAL_REASONS)

    @property
    def power_capping(self) -> bool | None:
        return None if self.event_reasons is None else bool(self.event_reasons & POWER_REASONS)

    @property
    def hw_slowdown(self) -> bool | None:
        return None if self.event_reasons is None else bool(self.event_reasons & REASON_HW_SLOWDOWN)


class Nvml(Protocol):
    """The part of pynvml this probe calls; tests and the simulator pass stand-ins with the same names.

    Handles and NVML's result structs (utilization, memory, PCI info) are opaque ctypes objects that pynvml
    leaves untyped: Any here, read only through the attributes named where they are used.
    nvmlDeviceGetCurrentClocks{Event,Throttle}Reasons and nvmlDeviceGetProcessUtilization vary with the
    pynvml version and are looked up with getattr."""

    NVMLError: type[Exception]
    NVML_TEMPERATURE_GPU: int
    NVML_CLOCK_SM: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> float: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> float: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> float: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> float: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> float: ...


@dataclass(frozen=True)
class _Gpu:
    """One device NVML listed at init."""

    index: int
    handle: Any  # NVML's opaque device handle
    name: str | None
    slot: str | None


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[GpuState, ...]
    note: str | None  # why there are no GPUs, when there are none for a reason


class GpuProbe:
    """Samples every NVML device; `nvml` is the pynvml module or a stand-in with the same functions."""

    def __init__(
        self,
        nvml: Nvml | None = None,
        *,
        retry_s: float = 300.0,
        stale_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self.retry_s = retry_s
        self.clock = clock
        self.last_good = LastGood(stale_after_s, clock)
        self._gpus: list[_Gpu] | None = None  # set by a successful init, with self._nvml
        self._note: str | None = None
        self._tried_at: float | None = None
        self._process_seen_us: dict[int, int] = {}  # per GPU: the newest per-process sample read

    def sample(self) -> GpuReport:
        if self._gpus is None:
            self._init()
        if self._gpus is None or self._nvml is None:
            return GpuReport((), self._note)
        nvml = self._nvml
        return GpuReport(tuple(self._device(nvml, gpu) for gpu in self._gpus), None)

    def close(self) -> None:
        if self._gpus is not None and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        self._gpus = None

    def _init(self) -> bool:
        now = self.clock()
        if self._tried_at is not None and now - self._tried_at < self.retry_s:
            return False
        self._tried_at = now
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - optional: without nvidia-ml-py there are no GPUs, not an error
            except ImportError:
                self._note = "nvml: nvidia-ml-py is not installed"
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(_Gpu(index, handle, _name(nvml, handle), _pci_slot(nvml, handle)))
        except nvml.NVMLError as exc:
            self._note = f"nvml: {exc}"
            return False
        except OSError as exc:  # a broken libnvidia-ml
            self._note = f"nvml: {exc}"
            return False
        self._gpus = gpus
        self._note = None if gpus else "nvml: no GPUs"
        return True

    def _read(self, nvml: Nvml, key: str, call: Callable[[], Any], stale: dict[str, float]) -> Any:
        """One NVML reading; on NVMLError the last good value (age noted) or None."""
        try:
            value = call()
        except nvml.NVMLError:
            reading: Reading = self.last_good.failed(key)
            if reading.stale:
                stale[key.split(".", 1)[1]] = round(reading.age_s or 0.0, 3)
            return reading.value
        return self.last_good.good(key, value).value

    def _device(self, nvml: Nvml, gpu: _Gpu) -> GpuState:
        index, handle = gpu.index, gpu.handle
        stale: dict[str, float] = {}
        key = f"gpu{index}"

        def util() -> tuple[float, float]:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            return float(rates.gpu), float(rates.memory)

        def memory() -> tuple[int, int, int]:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.total), int(info.used), int(info.free)

        def reasons() -> int:
            getter = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))  # older pynvml
            if getter is None:
                raise AttributeError("pynvml has neither nvmlDeviceGetCurrentClocks{Event,Throttle}Reasons")
            return int(getter(handle))

        def temperature() -> float:
            return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

        def sm_clock() -> float:
            return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))

        def sm_clock_max() -> float:
            return float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))

        rates = self._read(nvml, f"{key}.util", util, stale)
        mem = self._read(nvml, f"{key}.memory", memory, stale)
        temp = self._read(nvml, f"{key}.temp_c", temperature, stale)
        power = self._read(nvml, f"{key}.power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, stale)
        limit = self._read(nvml, f"{key}.power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                           stale)
        sm = self._read(nvml, f"{key}.sm_clock_mhz", sm_clock, stale)
        sm_max = self._read(nvml, f"{key}.sm_clock_max_mhz", sm_clock_max, stale)
        mask = self._read(nvml, f"{key}.event_reasons", reasons, stale)
        return GpuState(
            index=index,
            name=gpu.name,
            util_percent=rates[0] if rates else None,
            memory_util_percent=rates[1] if rates else None,
            memory_total_bytes=mem[0] if mem else None,
            memory_used_bytes=mem[1] if mem else None,
            memory_free_bytes=mem[2] if mem else None,
            temp_c=temp,
            power_w=power,
            power_limit_w=limit,
            sm_clock_mhz=sm,
            sm_clock_max_mhz=sm_max,
            event_reasons=mask,
            stale=stale,
            pci_slot=gpu.slot,
            process_busy=self._processes(nvml, index, handle),
        )

    def _processes(self, nvml: Nvml, index: int, handle: Any) -> dict[int, float] | None:
        """Each process's mean SM share over the samples NVML took since the last read ({} when none used it)."""
        getter = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
        if getter is None:
            return None
        try:
            samples = getter(handle, self._process_seen_us.get(index, 0))
        except nvml.NVMLError as exc:
            return {} if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", -1) else None
        shares: dict[int, list[float]] = {}
        for sample in samples:
            shares.setdefault(int(sample.pid), []).append(min(100.0, max(0.0, float(sample.smUtil))) / 100.0)
            self._process_seen_us[index] = max(self._process_seen_us.get(index, 0), int(sample.timeStamp))
        return {pid: round(sum(v) / len(v), 4) for pid, v in shares.items()}


def _name(nvml: Nvml, handle: Any) -> str | None:
    try:
        name = nvml.nvmlDeviceGetName(handle)
    except nvml.NVMLError:
        return None
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def _pci_slot(nvml: Nvml, handle: Any) -> str | None:
    try:
        info = nvml.nvmlDeviceGetPciInfo(handle)
    except (nvml.NVMLError, AttributeError):
        return None
    bus_id = info.busId.decode(errors="replace") if isinstance(info.busId, bytes) else str(info.busId)
    return pci_slot(bus_id)


def pci_slot(bus_id: str) -> str | None:
    """NVML's bus id (`00000000:01:00.0`, an 8-digit domain) as sysfs writes it (`0000:01:00.0`)."""
    domain, colon, rest = bus_id.strip().lower().partition(":")
    try:
        number = int(domain, 16)
    except ValueError:
        return None
    bus, _, device = rest.partition(":")
    if not colon or len(bus) != 2 or len(device) != 4 or device[2] != ".":
        return None
    return f"{number:04x}:{bus}:{device}"
