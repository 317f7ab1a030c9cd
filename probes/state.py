"""DeviceState: one snapshot of every probe, and the Sampler that takes it.

The Sampler is synchronous (NVML init can take seconds, a battery read can
ask the embedded controller): the agent calls `sample()` in a thread. CPU
load is a delta between two samples, so the first sample of a Sampler has
no load; the one-shot CLI samples twice, 0.2 s apart.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from probes.accelerators import AcceleratorProbe, AcceleratorState
from probes.cpu import CpuProbe, CpuState
from probes.drm import DrmClients
from probes.gpu import GpuProbe, GpuState, Nvml
from probes.memory import MemoryProbe, MemoryState
from probes.power_mode import PowerModeProbe, PowerModeState
from probes.power_profiles import PowerProfiles
from probes.power_supply import PowerSupplyProbe, PowerSupplyState
from probes.process_tree import ProcessTree
from probes.sysfs import KernelFiles
from probes.thermal import ThermalProbe, ThermalState
from probes.tree_cpu import TreeCpu
from probes.uevents import Uevents

TICKS_PER_SAMPLE = 10  # run-queue snapshots (Sampler.tick) per sample interval
# How long a power-supply reading stands where the kernel's uevents say when one changes (a battery's level
# moves by a percent in minutes); read every sample where they are not heard.
POWER_SUPPLY_EVERY_S = 30.0
ONE_SHOT_WINDOW_S = 0.2  # the window a one-shot reader samples over (load is a delta between two samples)


@dataclass(frozen=True)
class DeviceState:
    thermal: ThermalState
    battery: PowerSupplyState
    power: PowerModeState
    cpu: CpuState
    memory: MemoryState
    gpus: tuple[GpuState, ...] = ()  # NVML's GPUs (the contract's `gpus`)
    accelerators: tuple[AcceleratorState, ...] = ()  # every GPU and NPU, NVML's included
    notes: tuple[str, ...] = ()  # what could not be seen, and why (local only)
    taken_at: float = field(default_factory=time.time)  # wall clock, seconds since the epoch

    @property
    def power_mode(self) -> str | None:
        return self.power.power_mode

    @property
    def stale(self) -> dict[str, float]:
        """Every value that is a last good one rather than fresh, with its age in seconds."""
        ages: dict[str, float] = {}
        for part in (self.thermal, self.battery, self.power, self.cpu, self.memory):
            ages.update(part.stale)
        for gpu in self.gpus:
            ages.update({f"gpus.{gpu.index}.{k}": v for k, v in gpu.stale.items()})
        for acc in self.accelerators:
            ages.update({f"accelerators.{acc.id}.{k}": v for k, v in acc.stale.items()})
        return ages

    def accelerator(self, id_: str) -> AcceleratorState | None:
        return next((a for a in self.accelerators if a.id == id_), None)

    def to_json(self) -> dict[str, Any]:
        """The `daop-agent state --json` object: the contract's fields first, then the details."""
        t, b, p, c, m = self.thermal, self.battery, self.power, self.cpu, self.memory
        return {
            "thermal": {
                "max_temp_c": t.max_temp_c,
                "throttling": t.throttling,
                "cpu_throttling": t.cpu_throttling,
                "source": t.source,
                "throttle_count": t.throttle_count,
                "throttle_events": t.throttle_events,
                "zones": [
                    {"name": z.name, "type": z.type, "temp_c": z.temp_c, "passive_c": z.passive_c,
                     "throttling": z.throttling, "trips": z.trips}
                    for z in t.zones
                ],
                "cooling": [dataclasses.asdict(cd) for cd in t.cooling],
            },
            "battery": {
                "present": b.present,
                "percent": b.percent,
                "plugged": b.plugged,
                "charging": b.charging,
                "batteries": [{"name": x.name, "percent": x.percent, "status": x.status} for x in b.batteries],
                "adapters": [dataclasses.asdict(a) for a in b.adapters],
            },
            "power_mode": p.power_mode,
            "power": {
                "platform_profile": p.platform_profile,
                "platform_profile_choices": list(p.platform_profile_choices),
                "ppd_profile": p.ppd_profile,
                "ppd_degraded": p.ppd_degraded,
                "governor": p.governor,
                "epp": p.epp,
            },
            "cpu": {
                "load": c.load,
                "cores": c.cores,
                "busy_cores": c.busy_cores,
                "others_busy_cores": c.others_busy_cores,
                "own_cores": c.own_cores,
                "runnable_others": c.runnable_others,
                "steal": c.steal,
                "psi_some_avg10": c.psi_some_avg10,
                "cur_mhz": c.cur_mhz,
                "max_mhz": c.max_mhz,
                "limit_mhz": c.limit_mhz,
                "clock_ratio": None if c.clock_ratio is None else round(c.clock_ratio, 3),
                "interval_s": c.interval_s,
            },
            "memory": {
                "total_bytes": m.total_bytes,
                "available_bytes": m.available_bytes,
                "psi_some_avg10": m.psi_some_avg10,
            },
            "gpus": [
                {
                    "index": g.index, "name": g.name, "util_percent": g.util_percent,
                    "memory_util_percent": g.memory_util_percent, "memory_total_bytes": g.memory_total_bytes,
                    "memory_used_bytes": g.memory_used_bytes, "memory_free_bytes": g.memory_free_bytes,
                    "temp_c": g.temp_c, "power_w": g.power_w, "power_limit_w": g.power_limit_w,
                    "sm_clock_mhz": g.sm_clock_mhz, "sm_clock_max_mhz": g.sm_clock_max_mhz,
                    "event_reasons": g.event_reasons, "thermal_throttling": g.thermal_throttling,
                    "power_capping": g.power_capping, "hw_slowdown": g.hw_slowdown,
                }
                for g in self.gpus
            ],
            "accelerators": [accelerator_json(a) for a in self.accelerators],
            "stale": self.stale,
            "notes": list(self.notes),
            "taken_at": round(self.taken_at, 3),
        }


def accelerator_json(a: AcceleratorState) -> dict[str, Any]:
    """One accelerator in `state --json`: what it is, then its load, memory, clocks and power."""
    return {
        "id": a.id, "kind": a.kind, "vendor": a.vendor, "driver": a.driver, "name": a.name, "pci_slot": a.pci_slot,
        "node": a.node, "nvml_index": a.nvml_index, "shares_system_memory": a.shares_system_memory,
        "busy": a.busy, "others_busy": a.others_busy, "own_busy": a.own_busy, "busy_source": a.busy_source,
        "engines": a.engines, "clients": a.clients, "own_clients": a.own_clients,
        "memory_total_bytes": a.memory_total_bytes, "memory_used_bytes": a.memory_used_bytes,
        "memory_free_bytes": a.memory_free_bytes, "others_memory_bytes": a.others_memory_bytes,
        "gtt_total_bytes": a.gtt_total_bytes, "gtt_used_bytes": a.gtt_used_bytes,
        "clock_mhz": a.clock_mhz, "clock_max_mhz": a.clock_max_mhz, "clock_limit_mhz": a.clock_limit_mhz,
        "throttled": a.throttled, "throttle_reasons": list(a.throttle_reasons),
        "power_w": a.power_w, "power_limit_w": a.power_limit_w, "temp_c": a.temp_c,
    }


class Sampler:
    """Reads every probe; one instance per agent (it keeps deltas and last good values between ticks).

    `nvml`: a pynvml-like module (tests pass a stand-in); None imports pynvml
    when this is the real device, and skips GPUs on a fixture tree unless
    `gpus=True`. power-profiles-daemon is followed on the real device, or wherever $DBUS_SYSTEM_BUS_ADDRESS
    names a system bus (the tests' private one); the kernel's uevents are heard on the real device only
    (`uevents=True`: on a fixture tree too). Where they are heard, the power supplies are read when one
    changes and every POWER_SUPPLY_EVERY_S otherwise.
    `own_pids`: pids whose GPU and NPU clients are the agent's own, beside this process and its
    descendants (which count on the real /proc only).
    """

    def __init__(
        self,
        sysfs_root: str | os.PathLike[str] = "/sys",
        procfs_root: str | os.PathLike[str] = "/proc",
        nvml: Nvml | None = None,
        *,
        gpus: bool | None = None,
        ppd: bool | None = None,
        uevents: bool | None = None,
        stale_after_s: float = 60.0,
        own_pids: Callable[[], Collection[int]] | None = None,
    ) -> None:
        real_sys = os.path.realpath(sysfs_root) == "/sys"
        self.sys_files = KernelFiles(sysfs_root, stale_after_s=stale_after_s)
        self.proc_files = KernelFiles(procfs_root, stale_after_s=stale_after_s)
        # the agent's own tree is taken out where the /proc read shows it: the real one, or a mirror of it (the
        # real-agent tests' device /proc, tests/device_proc.py); a fixture tree without it has no own work
        real_proc = os.path.realpath(procfs_root) == "/proc" or self.proc_files.exists(f"{os.getpid()}/stat")
        # set when the device says something changed (ppd's signals, the kernel's power-supply and thermal
        # uevents): the sampling thread samples at once
        self.changed = threading.Event()
        self._supplies_changed = True  # a power-supply uevent since the last sample (read at the first)
        follow_ppd = (real_sys or bool(os.environ.get("DBUS_SYSTEM_BUS_ADDRESS"))) if ppd is None else ppd
        self.ppd = PowerProfiles(self.changed.set) if follow_ppd else None
        follow_uevents = real_sys if uevents is None else uevents  # the kernel's events are the real /sys's
        self.uevents = Uevents(self.heard) if follow_uevents else None
        self.thermal = ThermalProbe(self.sys_files)
        listening = self.uevents is not None and self.uevents.listening
        self.power_supply = PowerSupplyProbe(self.sys_files, every_s=POWER_SUPPLY_EVERY_S if listening else 0.0)
        self.power_mode = PowerModeProbe(self.sys_files, self.ppd)
        tree = ProcessTree(self.proc_files, os.getpid() if real_proc else None, own_pids)
        self.cpu = CpuProbe(self.sys_files, self.proc_files, own=TreeCpu(self.proc_files, tree) if real_proc else None)
        self.memory = MemoryProbe(self.proc_files)
        use_gpus = (nvml is not None or real_sys) if gpus is None else gpus
        self.gpu = GpuProbe(nvml, stale_after_s=stale_after_s) if use_gpus else None
        self.accelerators = AcceleratorProbe(self.sys_files, DrmClients(self.proc_files, tree))

    def sample(self) -> DeviceState:
        notes: list[str] = []
        gpus: tuple[GpuState, ...] = ()
        if self.gpu is not None:
            report = self.gpu.sample()
            gpus = report.gpus
            if report.note:
                notes.append(report.note)
        accelerators, more = self.accelerators.sample(gpus)
        notes += more
        if not os.path.isdir(self.sys_files.path("class")):
            notes.append(f"sysfs: nothing at {self.sys_files.root}")
        supplies_changed, self._supplies_changed = self._supplies_changed, False  # cleared before the read
        return DeviceState(
            thermal=self.thermal.sample(),
            battery=self.power_supply.sample(changed=supplies_changed),
            power=self.power_mode.sample(),
            cpu=self.cpu.sample(),
            memory=self.memory.sample(),
            gpus=gpus,
            accelerators=accelerators,
            notes=tuple(notes),
        )

    def heard(self, subsystem: str | None) -> None:
        """A kernel uevent of `subsystem` (None: some were lost): sample now, reading the power supplies again."""
        if subsystem != "thermal":
            self._supplies_changed = True
        self.changed.set()

    def track(self, pids: frozenset[int]) -> None:
        """Measure these apps' process trees too (CpuState.tracked): they run monitored workloads here."""
        self.cpu.track(pids)

    def tick(self) -> None:
        """Called several times per sample interval while wants_ticks(): run-queue snapshots (CpuProbe.tick)."""
        self.cpu.tick()

    def wants_ticks(self) -> bool:
        """Whether ticks are worth taking before the next sample (CpuProbe.wants_ticks: only while tasks wait)."""
        return self.cpu.wants_ticks()

    def sample_over(self, window_s: float = ONE_SHOT_WINDOW_S) -> DeviceState:
        """The state over a window of its own, for one-shot readers (`state`, `estimate`): load is a
        delta between two samples, and the run queue a mean of TICKS_PER_SAMPLE snapshots across the
        window; one snapshot alone often catches a stray task on an idle device."""
        self.sample()
        for _ in range(TICKS_PER_SAMPLE):
            time.sleep(window_s / TICKS_PER_SAMPLE)
            self.tick()
        return self.sample()

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
        if self.ppd is not None:
            self.ppd.close()
        if self.uevents is not None:
            self.uevents.close()
