"""A stand-in for the `pynvml` module (nvidia-ml-py) for machines without an NVIDIA GPU.

It has the functions probes/gpu.py calls, with pynvml's names, units and
error class (the real `pynvml.NVMLError`, so error handling is exercised as
it is with a driver). The simulated device and the tests set GPU figures, make
a function fail midway (`fail`), or make init fail as on a machine without a
driver (`init_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

NVMLError = pynvml.NVMLError
NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND


@dataclass
class StandinGpu:
    name: str = "NVIDIA Stand-in 24GB"
    util: int = 0  # %
    memory_util: int = 0  # %
    total: int = 24 * 2**30  # bytes
    used: int = 2**30
    temp: int = 45  # C
    power_mw: int = 60_000
    limit_mw: int = 300_000
    sm_mhz: int = 1800
    sm_max_mhz: int = 2100
    reasons: int = 0x01  # GPU idle
    bus_id: str = "00000000:01:00.0"  # nvmlPciInfo_t.busId: an 8-digit domain
    processes: dict[int, int] = field(default_factory=dict)  # pid -> SM utilisation % (nvmlProcessUtilizationSample_t)
    timestamp_us: int = 1_000_000  # the last sample's; moves on by a second at each read


@dataclass
class NvmlStandin:
    gpus: list[StandinGpu] = field(default_factory=lambda: [StandinGpu()])
    init_error: int | None = None  # an NVML_ERROR_* that nvmlInit raises
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML_ERROR_* it raises
    calls: int = 0
    initialised: bool = False

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND

    def _check(self, function: str) -> None:
        self.calls += 1
        if function in self.fail:
            raise NVMLError(self.fail[function])
        if function != "nvmlInit" and not self.initialised:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: int) -> StandinGpu:
        return self.gpus[handle]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._check("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check("nvmlDeviceGetName")
        return self._gpu(handle).name

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        self._check("nvmlDeviceGetUtilizationRates")
        gpu = self._gpu(handle)
        return SimpleNamespace(gpu=gpu.util, memory=gpu.memory_util)

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        self._check("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature")
        return self._gpu(handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return self._gpu(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit")
        return self._gpu(handle).limit_mw

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        self._check("nvmlDeviceGetClockInfo")
        return self._gpu(handle).sm_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo")
        return self._gpu(handle).sm_max_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        self._check("nvmlDeviceGetCurrentClocksEventReasons")
        return self._gpu(handle).reasons

    def nvmlDeviceGetProcessUtilization(self, handle: int, last_seen_us: int) -> list[SimpleNamespace]:
        """One sample per process that used the GPU since `last_seen_us`; NOT_FOUND when none did."""
        self._check("nvmlDeviceGetProcessUtilization")
        gpu = self._gpu(handle)
        gpu.timestamp_us += 1_000_000
        if not gpu.processes:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=pid, smUtil=util, memUtil=0, encUtil=0, decUtil=0, timeStamp=gpu.timestamp_us)
                for pid, util in gpu.processes.items()]

    def nvmlDeviceGetPciInfo(self, handle: int):
        self._check("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=self._gpu(handle).bus_id.encode())


NVML_FUNCTIONS = tuple(name for name in vars(NvmlStandin) if name.startswith("nvml"))  # every call a probe makes
