"""The simulated device: fixture /sys and /proc trees of a device profile, its GPU and its warm refresh."""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

from agent.simulation.app import AppProcess
from agent.simulation.load import Load
from agent.simulation.nvml import NVML_ERROR_GPU_IS_LOST, NVML_FUNCTIONS, NvmlStandin, StandinGpu
from agent.simulation.scenario import BATTERY_KEYS, CPUFREQ_KEYS, Scenario
from agent.simulation.trees import BUILDERS, stat_with_ticks, write_atomic
from monitors.errors import BadInput
from monitors.speed.prediction import contention_factor
from probes.refresh import HANDOFF_KEY, LOCKSTEP_KEY, STREAM_KEY, WarmRefresh
from probes.state import Sampler

HZ = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20


# Where a profile's conditions live in its tree (trees.py): the zone a scenario's temperature drives and its
# passive trip, or the hwmon sensor a desktop has instead of zones.
PACKAGE_ZONE = {"laptop": "class/thermal/thermal_zone1", "server": "class/thermal/thermal_zone0"}
DESKTOP_PACKAGE_SENSOR = "class/hwmon/hwmon2/temp1_input"
PROCESSOR_COOLING = "class/thermal/cooling_device0"
SYSTEM_BATTERIES = {"BAT0": 50_000_000, "CMB1": 30_000_000}  # the laptop's, with their energy_full (uWh)
ADAPTER = "class/power_supply/ADP1"
EPP = {"laptop": "balance_performance", "desktop": "performance", "server": None}
GPU_TOTAL_MB = 24576


class SimulatedDevice:
    """One device profile's fixture /sys and /proc trees (trees.py, the tests' own), changed along a scenario's
    timeline, with its real load, its apps and, where it has one, a GPU through the NVML stand-in."""

    def __init__(self, root: Path, scenario: Scenario) -> None:
        self.profile = scenario.device
        host = sorted(os.sched_getaffinity(0))
        self.cores = scenario.cores or len(host)
        if self.cores > len(host):
            raise BadInput(f"the scenario's device has {self.cores} CPUs; this host has only {len(host)} to give it")
        self.cpus = host[:self.cores]  # the real CPUs its load and its apps run on (pinned)
        self.tree = BUILDERS[self.profile](root, cores=self.cores)
        self.sys, self.proc = self.tree.sys, self.tree.proc
        self.cpu_max_mhz = scenario.cpu_max_mhz
        self.nvml = NvmlStandin([StandinGpu(name="Simulated GPU", total=GPU_TOTAL_MB * MiB)]) if scenario.gpu else None
        self.load = Load(cpus=self.cpus)
        self.apps: list[AppProcess] = []  # real app processes, started and stopped by the runner
        self.app_cores = 0.0  # the cores they used over the last /proc update
        self._app_runnable = 0.0  # dithering: their runnable share, as whole tasks in procs_running
        self.scale_file = root / "app-scale"  # what the apps emulate: the device's speed, its clock, a hidden slowdown
        self.app_speed = 1.0  # an app's run on the device at rest over the same run on the host (DeviceSpeed)
        self.hidden_slowdown = 1.0
        self.host_share = 1.0  # how much longer a run takes here than it would without the host's other tenants
        self.conditions: dict[str, Any] = {"busy": 0, "memory_mb": 0, "steal": 0.0}
        self._ticks = {"busy": 0, "idle": 0, "steal": 0}
        self._host = HostShare(self.cpus)
        self._app_ticks: dict[int, float] = {}  # each app's CPU time on the device (ticks), as its /proc/<pid> says
        self._stat_at = time.monotonic()
        self._mem_total, self._mem_available = _real_meminfo()
        self._build()

    def _build(self) -> None:
        """The profile at rest: clocks at the scenario's maximum, no cap, a balanced profile, cool, plugged."""
        if self.profile != "vm":
            khz = int(self.cpu_max_mhz * 1000)
            self.tree.cpufreq(khz, khz, governor="powersave" if self.profile == "laptop" else "performance",
                              epp=EPP[self.profile])
            self.tree.set("firmware/acpi/platform_profile_choices", "low-power balanced performance")
        at_rest: dict[str, Any] = {"busy": 0, "memory_mb": 0, "steal": 0.0}
        if self.profile != "vm":
            at_rest |= {"temp_c": 50, "cpu_mhz": self.cpu_max_mhz, "cpu_limit_mhz": self.cpu_max_mhz,
                        "power_profile": "balanced"}
        if self.profile in PACKAGE_ZONE:
            at_rest |= {"passive_c": 95, "cooling": 0}
        if self.profile == "laptop":
            at_rest |= {"battery_percent": 80, "plugged": True}
        if self.nvml is not None:
            at_rest |= {"gpu_util": 0, "gpu_memory_used_mb": 1024, "gpu_fail": False}
        self.apply(at_rest)
        self.update_proc()

    def apply(self, conditions: dict[str, Any]) -> None:
        """Set conditions (validated by parse_scenario); real load starts or stops here."""
        self.conditions.update(conditions)
        c, t = self.conditions, self.tree
        if "temp_c" in conditions:
            millidegrees = str(int(round(c["temp_c"] * 1000)))
            t.set(f"{PACKAGE_ZONE[self.profile]}/temp" if self.profile in PACKAGE_ZONE else DESKTOP_PACKAGE_SENSOR,
                  millidegrees)
        if "passive_c" in conditions:
            t.set(f"{PACKAGE_ZONE[self.profile]}/trip_point_0_temp", str(int(round(c["passive_c"] * 1000))))
        if "cooling" in conditions:
            t.set(f"{PROCESSOR_COOLING}/cur_state", str(c["cooling"]))
        if CPUFREQ_KEYS & set(conditions):
            for i in range(self.cores):
                t.set(f"devices/system/cpu/cpufreq/policy{i}/scaling_cur_freq", str(int(c["cpu_mhz"] * 1000)))
                t.set(f"devices/system/cpu/cpufreq/policy{i}/scaling_max_freq", str(int(c["cpu_limit_mhz"] * 1000)))
        if "power_profile" in conditions:
            t.set("firmware/acpi/platform_profile", c["power_profile"])
        if BATTERY_KEYS & set(conditions):
            pct = float(c["battery_percent"])
            status = "Full" if c["plugged"] and pct >= 99.5 else "Charging" if c["plugged"] else "Discharging"
            for name, full in SYSTEM_BATTERIES.items():
                t.supply(name, capacity=int(round(pct)), energy_now=int(full * pct / 100), status=status)
            t.set(f"{ADAPTER}/online", "1" if c["plugged"] else "0")
        if self.nvml is not None:
            gpu = self.nvml.gpus[0]
            gpu.util = int(c.get("gpu_util", gpu.util))
            gpu.memory_util, gpu.temp = min(100, gpu.util), 40 + gpu.util // 3
            gpu.power_mw, gpu.reasons = 50_000 + 2_500 * gpu.util, 0 if gpu.util else 0x01  # 0x01: idle
            gpu.used = min(gpu.total, int(c.get("gpu_memory_used_mb", gpu.used // MiB)) * MiB)
            self.nvml.fail = dict.fromkeys(NVML_FUNCTIONS, NVML_ERROR_GPU_IS_LOST) if c.get("gpu_fail") else {}
        if "busy" in conditions:
            self.load.set_busy(int(c["busy"]))
        if "memory_mb" in conditions and int(c["memory_mb"]) != self.load.held_mb:
            self.load.set_memory(int(c["memory_mb"]))
            self.update_proc()
        self.update_scale()

    def start_app(self, app: AppProcess) -> None:
        """A real app on this device: its CPU is the device's load, and its process can be read under /proc."""
        self.apps.append(app)
        self._app_ticks[app.pid] = 0.0
        self._write_app_proc(app)

    def stop_app(self, app: AppProcess) -> None:
        app.stop()
        self.apps.remove(app)
        self._app_ticks.pop(app.pid, None)
        shutil.rmtree(self.proc / str(app.pid), ignore_errors=True)

    def _write_app_proc(self, app: AppProcess) -> None:
        """The app's /proc/<pid> on the device: its CPU time as the device's /proc/stat counts it (scaled as
        HostShare scales it, so that the agent's reading of the app's own share matches its reading of the load),
        its threads' run-queue waits as the host's kernel reports them, no child processes."""
        where = self.proc / str(app.pid)
        try:
            real = Path(f"/proc/{app.pid}/stat").read_text()
            tids = [t for t in os.listdir(f"/proc/{app.pid}/task") if t.isdigit()]
        except OSError:
            return  # gone: the runner stops it
        stat = stat_with_ticks(real, self._app_ticks.get(app.pid, 0.0))
        if stat is not None:
            write_atomic(where / "stat", stat.encode())
        for tid in tids:
            try:
                schedstat = Path(f"/proc/{app.pid}/task/{tid}/schedstat").read_bytes()
            except OSError:
                continue
            write_atomic(where / "task" / tid / "schedstat", schedstat)
            if tid == str(app.pid):
                write_atomic(where / "task" / tid / "children", b"")

    def update_scale(self) -> None:
        """How long the apps' runs take on the device against the real CPU: its own speed, the capped clock, and
        any hidden slowdown; and the host's share, which their measured times are taken out of (app.py)."""
        scale = self.app_speed * self.hidden_slowdown / self.clock_ratio
        write_atomic(self.scale_file, f"{scale:.4f} {self.host_share:.4f}".encode())

    def update_proc(self) -> None:
        """/proc/stat, /proc/meminfo and PSI from the real load, the apps and the simulated steal time."""
        now = time.monotonic()
        elapsed = now - self._stat_at
        capacity = max(0, int(round(self.cores * elapsed * HZ)))
        self._stat_at = now
        # The hypervisor takes its share first; the guest's processes get at most the rest.
        steal = int(round(capacity * float(self.conditions.get("steal", 0.0))))
        by_app = [(app, app.take_ticks()) for app in self.apps]
        app_ticks = sum(ticks for _, ticks in by_app)
        load_ticks = self.load.take_ticks()
        share = self._host.share(load_ticks + app_ticks)  # the host's other tenants are not on the device
        if abs(share - self.host_share) > 0.02 * self.host_share:
            self.host_share = share
            self.update_scale()
        for app, ticks in by_app:
            self._app_ticks[app.pid] = self._app_ticks.get(app.pid, 0.0) + ticks * share
            self._write_app_proc(app)
        self.app_cores = app_ticks * share / HZ / elapsed if elapsed > 0 else 0.0
        busy = min(capacity - steal, int(round((load_ticks + app_ticks) * share)))
        t = self._ticks
        t["busy"] += busy
        t["steal"] += steal
        t["idle"] += capacity - busy - steal
        per = lambda total, i: total // self.cores + (1 if i < total % self.cores else 0)  # noqa: E731
        lines = [f"cpu  {t['busy']} 0 0 {t['idle']} 0 0 0 {t['steal']} 0 0"]
        lines += [f"cpu{i} {per(t['busy'], i)} 0 0 {per(t['idle'], i)} 0 0 0 {per(t['steal'], i)} 0 0"
                  for i in range(self.cores)]
        self._app_runnable += self.app_cores
        apps_now = int(self._app_runnable)  # whole tasks now, the fractions carried: their mean is the apps' cores
        self._app_runnable -= apps_now
        running = 1 + self.load.running + apps_now
        lines += ["intr 0", "ctxt 0", "btime 1700000000", "processes 1",
                  f"procs_running {running}", "procs_blocked 0"]
        self.tree.set_proc("stat", "\n".join(lines))
        self.tree.set_proc("loadavg", f"0.00 0.00 0.00 {running}/100 4242")
        available = max(0, self._mem_available - self.load.held_mb * 1024)
        self.tree.set_proc("meminfo", f"MemTotal:       {self._mem_total} kB\nMemFree:        {available} kB\n"
                                      f"MemAvailable:   {available} kB\n")
        memory_some = 0.0 if available > 0.1 * self._mem_total else 25.0
        self.tree.set_proc("pressure/memory", f"some avg10={memory_some:.2f} avg60=0.00 avg300=0.00 total=0\n"
                                              "full avg10=0.00 avg60=0.00 avg300=0.00 total=0")

    @property
    def clock_ratio(self) -> float:
        """Simulated clock over the maximum (1.0 on a vm): what a CPU-bound probe's CPU time scales by."""
        c = self.conditions
        if "cpu_mhz" not in c:
            return 1.0
        return max(0.05, min(1.0, min(c["cpu_mhz"], c["cpu_limit_mhz"]) / self.cpu_max_mhz))

    def sampler(self) -> Any:
        return Sampler(self.sys, self.proc, nvml=self.nvml, gpus=self.nvml is not None, ppd=False)

    def close(self) -> None:
        for app in list(self.apps):
            self.stop_app(app)
        self.load.stop()


class HostShare:
    """How much more CPU the device's processes would have had without the host's other tenants.

    The device's processes (its busy processes, its apps) run on its CPUs of the host, which the host's other
    tenants may share: there they get less than on the device, where they would be alone. Over each interval,
    the host's CPU time on those CPUs that is not theirs is taken out of the capacity, and their CPU time is
    scaled up to the whole: three busy processes that got half of two CPUs beside a neighbour's work count as
    the two CPUs they would have kept busy. So the simulated /proc shows the device's load, not the host's."""

    MAX = 20.0  # a host that leaves the device a twentieth of its CPUs is not simulating it any more
    WINDOW = 20  # intervals (of 0.05 s): a kernel counts CPU time in ticks of 10 ms, too coarse for one

    def __init__(self, cpus: list[int]) -> None:
        self.cpus = {f"cpu{i}" for i in cpus}
        self._last = self._read()
        self._recent: deque[tuple[int, int]] = deque(maxlen=self.WINDOW)  # (others' ticks, total ticks)

    def _read(self) -> tuple[int, int] | None:
        """(busy, total) ticks of the host's /proc/stat over the device's CPUs; None where unreadable."""
        try:
            busy = total = 0
            for line in Path("/proc/stat").read_text().splitlines():
                name, *fields = line.split()
                if name in self.cpus:
                    values = [int(v) for v in fields[:8]]
                    total += sum(values)
                    busy += sum(values) - values[3] - values[4]  # all but idle and iowait
            return busy, total
        except (OSError, ValueError):
            return None

    def share(self, own_ticks: int) -> float:
        """The factor to scale the device's processes' `own_ticks` of the last interval by (>= 1), from the
        tenants' share of the device's CPUs over the last WINDOW intervals."""
        now, last = self._read(), self._last
        self._last = now
        if now is not None and last is not None and now[1] > last[1]:
            self._recent.append((max(0, now[0] - last[0] - own_ticks), now[1] - last[1]))
        others = sum(o for o, _ in self._recent)
        total = sum(t for _, t in self._recent)
        if total <= 0:
            return 1.0
        left = total - others
        return min(self.MAX, total / left) if left > 0 else self.MAX


def _real_meminfo() -> tuple[int, int]:
    """MemTotal and MemAvailable of the host, kB (the simulated device has the host's memory)."""
    found = {"MemTotal": 8 << 20, "MemAvailable": 6 << 20}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in found:
                found[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return found["MemTotal"], found["MemAvailable"]


def simulated_probe() -> WarmRefresh:
    """The simulated device's refresh probe (smaller than the agent's: see SimulatedRefresh)."""
    return WarmRefresh(cpu_budget_s=0.03, max_wall_s=0.25)


class SimulatedRefresh:
    """The warm refresh of the simulated device.

    The real probe runs on the real CPU, so that a refresh costs real CPU
    time and the refresh policy's budget holds as on a device. What it
    reports is the simulated device's reading: each probe's reference time per
    run (the host at rest), times the simulated clock's slowdown (maximum /
    limit) and the contention of the scenario's busy processes
    (monitors.speed.prediction.contention_factor). The host's other tenants are left
    out, as they are left out of the simulated /proc/stat, so that the run
    does not depend on what else shares the host.

    Smaller than the agent's default (a CPU budget of 30 ms instead of 150 ms)
    so that the refresh policy's 1 %-of-a-core budget lets it run every few
    seconds and follow a timeline compressed into tens of seconds.
    """

    def __init__(self, device: SimulatedDevice, reference: dict[str, float], bench: WarmRefresh | None = None) -> None:
        self.device = device
        self.reference = reference
        self.bench = bench or simulated_probe()

    def measure(self, stream: bool = False) -> dict[str, float]:
        out = self.bench.measure(stream)
        others = self.device.load.running + self.device.app_cores  # busy processes and the apps' runs
        contention = contention_factor(self.bench.threads, others, self.device.cores)
        # all probes alike: the simulated device hands data and streams memory as calibrated
        for key in (LOCKSTEP_KEY, HANDOFF_KEY, STREAM_KEY):
            if key in self.reference and key in out:
                out[key] = self.reference[key] * contention / self.device.clock_ratio
        return out


