"""GPU probe: NVIDIA GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

NVML's init can take seconds, so this probe is synchronous and the agent
runs the sampler in a thread, never on the event loop. No NVML library, no
driver or no GPU is a normal state (no GPUs), not an error. An NVML error
midway makes that one reading its last good value (with its age) or None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

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

    @property
    def thermal_throttling(self) -> bool | None:
        return None if self.event_reasons is None else bool(self.event_reasons & THERMAL_REASONS)

    @property
    def power_capping(self) -> bool | None:
        return None if self.event_reasons is None else bool(self.event_reasons & POWER_REASONS)

    @property
    def hw_slowdown(self) -> bool | None:
        return None if self.event_reasons is None else bool(self.event_reasons & REASON_HW_SLOWDOWN)


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[GpuState, ...]
    note: str | None  # why there are no GPUs, when there are none for a reason


class GpuProbe:
    """Samples every NVML device; `nvml` is the pynvml module or a stand-in with the same functions."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        retry_s: float = 300.0,
        stale_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self.retry_s = retry_s
        self.clock = clock
        self.last_good = LastGood(stale_after_s, clock)
        self._handles: list[tuple[int, Any, str | None]] | None = None
        self._note: str | None = None
        self._tried_at: float | None = None

    def sample(self) -> GpuReport:
        if self._handles is None and not self._init():
            return GpuReport((), self._note)
        return GpuReport(tuple(self._device(i, h, name) for i, h, name in self._handles or ()), None)

    def close(self) -> None:
        if self._handles is not None and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        self._handles = None

    def _init(self) -> bool:
        now = self.clock()
        if self._tried_at is not None and now - self._tried_at < self.retry_s:
            return False
        self._tried_at = now
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                self._note = "nvml: nvidia-ml-py is not installed"
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            handles = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                handles.append((index, handle, self._name(handle)))
        except nvml.NVMLError as exc:
            self._note = f"nvml: {exc}"
            return False
        except OSError as exc:  # a broken libnvidia-ml
            self._note = f"nvml: {exc}"
            return False
        self._handles = handles
        self._note = None if handles else "nvml: no GPUs"
        return True

    def _name(self, handle: Any) -> str | None:
        try:
            name = self._nvml.nvmlDeviceGetName(handle)
        except self._nvml.NVMLError:
            return None
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def _read(self, key: str, call: Callable[[], Any], stale: dict[str, float]) -> Any:
        """One NVML reading; on NVMLError the last good value (age noted) or None."""
        try:
            value = call()
        except self._nvml.NVMLError:
            reading: Reading = self.last_good.failed(key)
            if reading.stale:
                stale[key.split(".", 1)[1]] = round(reading.age_s or 0.0, 3)
            return reading.value
        return self.last_good.good(key, value).value

    def _device(self, index: int, handle: Any, name: str | None) -> GpuState:
        nvml = self._nvml
        stale: dict[str, float] = {}
        key = f"gpu{index}"

        def util() -> tuple[float, float]:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            return float(rates.gpu), float(rates.memory)

        def memory() -> tuple[int, int, int]:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.total), int(info.used), int(info.free)

        def reasons() -> int:
            getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            return int(getter(handle))

        rates = self._read(f"{key}.util", util, stale)
        mem = self._read(f"{key}.memory", memory, stale)
        temp = self._read(f"{key}.temp_c", lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)), stale)
        power = self._read(f"{key}.power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, stale)
        limit = self._read(f"{key}.power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, stale)
        sm = self._read(f"{key}.sm_clock_mhz", lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)), stale)
        sm_max = self._read(f"{key}.sm_clock_max_mhz", lambda: float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)), stale)
        mask = self._read(f"{key}.event_reasons", reasons, stale)
        return GpuState(
            index=index,
            name=name,
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
        )
