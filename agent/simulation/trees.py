"""Fixture /sys and /proc trees for devices this machine is not: a laptop, a desktop, a GPU server, a bare VM,
and machines with accelerators (an Intel laptop on i915 or xe with its NPU, an AMD laptop with its NPU, an
NVIDIA desktop). The tests read them as they are; the simulated device (device.py) starts from them and
changes them along a scenario's timeline.

The probes run unchanged against these trees (`Sampler(tree.sys, tree.proc)`,
`daop-agent state --sysfs-root tree.sys --procfs-root tree.proc`). Values
follow the kernel's formats: millidegrees, microwatt-hours, kHz, USER_HZ ticks;
devices sit under `devices/` with `class/` links to them, as sysfs has them,
and DRM clients are `/proc/<pid>/fd/<n>` links with `/proc/<pid>/fdinfo/<n>`
files as the drivers write them (Documentation/gpu/drm-usage-stats.rst).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Tree:
    sys: Path
    proc: Path
    cores: int

    def set(self, rel: str, text: str | bytes) -> Path:
        """Write a sysfs attribute (a newline is added to text, as the kernel does)."""
        return write_atomic(self.sys / rel, text if isinstance(text, bytes) else (text + "\n").encode())

    def set_proc(self, rel: str, text: str) -> Path:
        return write_atomic(self.proc / rel, text.encode())

    def remove(self, rel: str) -> None:
        (self.sys / rel).unlink()

    def set_stat(self, busy: int, idle: int, steal: int = 0, running: int = 1) -> None:
        """/proc/stat with these totals (ticks) spread over the cores: busy as user time, idle as idle;
        `running` tasks runnable right now (procs_running; 1 = only the reader)."""
        per = lambda total, i: total // self.cores + (1 if i < total % self.cores else 0)  # noqa: E731
        lines = [f"cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0"]
        for i in range(self.cores):
            lines.append(f"cpu{i} {per(busy, i)} 0 0 {per(idle, i)} 0 0 0 {per(steal, i)} 0 0")
        lines += ["intr 12345 0 0", "ctxt 999", "btime 1700000000", "processes 1000", f"procs_running {running}",
                  "procs_blocked 0"]
        self.set_proc("stat", "\n".join(lines) + "\n")
        self.set_proc("loadavg", f"0.50 0.40 0.30 {running}/300 4242\n")

    def set_psi(self, cpu_some_avg10: float, memory_some_avg10: float = 0.0, cpu_some_total_us: int = 1000) -> None:
        """PSI's averages; `cpu_some_total_us`: the time so far some task waited for a CPU."""
        self.set_proc("pressure/cpu", f"some avg10={cpu_some_avg10:.2f} avg60=0.00 avg300=0.00 "
                                      f"total={cpu_some_total_us}\n"
                                      "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        self.set_proc("pressure/memory", f"some avg10={memory_some_avg10:.2f} avg60=0.00 avg300=0.00 total=10\n"
                                         "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")

    def set_meminfo(self, total_kib: int, available_kib: int) -> None:
        self.set_proc("meminfo", f"MemTotal:       {total_kib} kB\nMemFree:        {available_kib // 2} kB\n"
                                 f"MemAvailable:   {available_kib} kB\nBuffers:          1000 kB\n")

    # -- builders of common parts --

    def zone(self, index: int, type_: str, temp_mc: int, trips: list[tuple[str, int]], mode: str | None = None) -> None:
        base = f"class/thermal/thermal_zone{index}"
        self.set(f"{base}/type", type_)
        self.set(f"{base}/temp", str(temp_mc))
        if mode is not None:
            self.set(f"{base}/mode", mode)
        for i, (kind, at) in enumerate(trips):
            self.set(f"{base}/trip_point_{i}_type", kind)
            self.set(f"{base}/trip_point_{i}_temp", str(at))

    def cooling(self, index: int, type_: str, cur: int, top: int) -> None:
        base = f"class/thermal/cooling_device{index}"
        self.set(f"{base}/type", type_)
        self.set(f"{base}/cur_state", str(cur))
        self.set(f"{base}/max_state", str(top))

    def cpufreq(self, cur_khz: int, max_khz: int, limit_khz: int | None = None, governor: str = "powersave",
                epp: str | None = "balance_performance") -> None:
        for i in range(self.cores):
            base = f"devices/system/cpu/cpufreq/policy{i}"
            self.set(f"{base}/scaling_cur_freq", str(cur_khz))
            self.set(f"{base}/cpuinfo_max_freq", str(max_khz))
            self.set(f"{base}/scaling_max_freq", str(limit_khz or max_khz))
            self.set(f"{base}/scaling_governor", governor)
            if epp is not None:
                self.set(f"{base}/energy_performance_preference", epp)

    def cpus(self, throttle_counters: bool) -> None:
        for i in range(self.cores):
            base = f"devices/system/cpu/cpu{i}"
            self.set(f"{base}/topology/physical_package_id", "0")
            if throttle_counters:
                self.set(f"{base}/thermal_throttle/package_throttle_count", "12")
                self.set(f"{base}/thermal_throttle/core_throttle_count", "3")

    def supply(self, name: str, **attrs: str | int) -> None:
        for attr, value in attrs.items():
            self.set(f"class/power_supply/{name}/{attr}", str(value))

    def link(self, rel: str, target: str) -> None:
        """A symbolic link in the sysfs tree (relative targets, as sysfs writes them)."""
        path = self.sys / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)

    def pci_device(self, slot: str, pci_id: str, driver: str, nodes: tuple[str, ...] = ()) -> str:
        """A PCI device `devices/pci0000:00/<slot>` bound to `driver`, with class nodes (`drm/card0`,
        `drm/renderD128`, `accel/accel0`) linked from `class/`; returns the device's directory."""
        dev = f"devices/pci0000:00/{slot}"
        vendor, device = pci_id.lower().split(":")
        self.set(f"{dev}/vendor", f"0x{vendor}")
        self.set(f"{dev}/device", f"0x{device}")
        self.set(f"{dev}/uevent", f"DRIVER={driver}\nPCI_CLASS=30000\nPCI_ID={pci_id.upper()}\n"
                                  f"PCI_SUBSYS_ID=17AA:22E6\nPCI_SLOT_NAME={slot}\nMODALIAS=pci:v0000{vendor.upper()}")
        self.link(f"{dev}/driver", f"../../../bus/pci/drivers/{driver}")
        for node in nodes:
            cls, name = node.split("/")
            self.set(f"{dev}/{node}/dev", "226:0")
            self.link(f"{dev}/{node}/device", "../../../" + slot)
            self.link(f"class/{cls}/{name}", f"../../{dev}/{node}")
        return dev

    def process(self, pid: int, ppid: int, comm: str) -> None:
        """`/proc/<pid>/stat` (its parent read by the agent's process tree) and an empty fd table."""
        self.set_proc(f"{pid}/stat", f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 1000 0 0 0 50 20 0 0 20 0 "
                                     f"4 0 12345 1000000 500 18446744073709551615\n")
        (self.proc / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "fdinfo").mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        siblings = self.proc / str(ppid) / "task" / str(ppid) / "children"
        if siblings.parent.is_dir():
            siblings.write_text((siblings.read_text() if siblings.exists() else "") + f"{pid} ")

    def drm_client(self, pid: int, fd: int, device_node: str, fdinfo: str) -> None:
        """fd `fd` of process `pid` open on `/dev/<device_node>` (`dri/renderD128`, `accel/accel0`), and its fdinfo."""
        link = self.proc / str(pid) / "fd" / str(fd)
        if link.is_symlink():
            link.unlink()
        os.symlink(f"/dev/{device_node}", link)
        self.set_proc(f"{pid}/fdinfo/{fd}", f"pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t{1000 + fd}\n" + fdinfo)

    def plain_fd(self, pid: int, fd: int, target: str) -> None:
        """An fd that is no DRM client (a file, a socket), with the fdinfo every fd has."""
        os.symlink(target, self.proc / str(pid) / "fd" / str(fd))
        self.set_proc(f"{pid}/fdinfo/{fd}", "pos:\t0\nflags:\t02\nmnt_id:\t22\nino:\t77\n")


def stat_with_ticks(real: str, ticks: float, children_ticks: float = 0.0) -> str | None:
    """A process's real /proc/<pid>/stat line with its CPU time as a simulated device counts it (utime; stime
    and cstime 0; cutime: its ended children's, as the kernel adds them when it reaps them); None where `real`
    is no stat line."""
    head, sep, rest = real.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 15:
        return None
    fields[11:15] = [str(int(ticks)), "0", str(int(children_ticks)), "0"]  # utime stime cutime cstime
    return f"{head}) {' '.join(fields)}\n"


def write_atomic(path: Path, data: bytes) -> Path:
    """Atomically, as the kernel's attributes change: a reader (an agent sampling the tree) sees the old value or
    the new one, never half of one. Each writer's temporary file is its own: the simulated device writes one file
    from two threads (a step's conditions, the load's ticks), and with one name for both, the second rename found
    the first had taken it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def _tree(root: Path, cores: int) -> Tree:
    tree = Tree(sys=root / "sys", proc=root / "proc", cores=cores)
    (tree.sys / "class").mkdir(parents=True)
    tree.proc.mkdir(parents=True)
    tree.set_stat(busy=1000 * cores, idle=9000 * cores)
    tree.set_meminfo(16 * 1024 * 1024, 12 * 1024 * 1024)
    return tree


def laptop(root: Path, cores: int = 4) -> Tree:
    """Two system batteries (BAT0, CMB1) giving 37.0 % by energy, a mouse battery (scope Device),
    adapter ADP1 (not AC) unplugged, a USB-C port, zones with passive trips at 71.5 C max, fans and
    processor cooling idle, platform profile low-power, x86 throttle counters."""
    tree = _tree(root, cores)
    tree.zone(0, "acpitz", 52000, [("critical", 105000), ("passive", 95000), ("active", 60000)])
    tree.zone(1, "x86_pkg_temp", 71500, [("passive", 90000), ("passive", 85000), ("critical", 100000)])
    tree.zone(2, "iwlwifi_1", 999000, [], mode="disabled")
    tree.cooling(0, "Processor", 0, 10)
    tree.cooling(1, "Fan", 0, 1)
    tree.cooling(2, "intel_powerclamp", 0, 50)
    tree.supply("BAT0", type="Battery", present=1, status="Discharging", capacity=44,
                energy_now=22_200_000, energy_full=50_000_000, technology="Li-ion")
    tree.supply("CMB1", type="Battery", present=1, status="Discharging", capacity=25,
                energy_now=7_400_000, energy_full=30_000_000)
    tree.supply("hidpp_battery_0", type="Battery", scope="Device", status="Discharging", capacity=5)
    tree.supply("ADP1", type="Mains", online=0)
    tree.supply("ucsi-source-psy-USBC000:001", type="USB", online=0, scope="Unknown")
    tree.set("firmware/acpi/platform_profile", "low-power")
    tree.set("firmware/acpi/platform_profile_choices", "low-power balanced performance")
    tree.cpufreq(cur_khz=1_400_000, max_khz=4_200_000, governor="powersave", epp="power")
    tree.cpus(throttle_counters=True)
    tree.set_psi(1.5, 0.0)
    return tree


def desktop(root: Path, cores: int = 8) -> Tree:
    """No battery, no thermal zones (hwmon coretemp instead), performance governor, no platform profile."""
    tree = _tree(root, cores)
    (tree.sys / "class/power_supply").mkdir(parents=True)
    (tree.sys / "class/thermal").mkdir(parents=True)
    base = "class/hwmon/hwmon2"
    tree.set(f"{base}/name", "coretemp")
    for i, (label, temp) in enumerate((("Package id 0", 48000), ("Core 0", 46000), ("Core 1", 49000)), start=1):
        tree.set(f"{base}/temp{i}_label", label)
        tree.set(f"{base}/temp{i}_input", str(temp))
        tree.set(f"{base}/temp{i}_max", "80000")
        tree.set(f"{base}/temp{i}_crit", "100000")
    tree.cpufreq(cur_khz=3_600_000, max_khz=4_700_000, governor="performance", epp="performance")
    tree.cpus(throttle_counters=True)
    tree.set_psi(0.0, 0.0)
    return tree


def server(root: Path, cores: int = 16) -> Tree:
    """A GPU server: one package zone and a processor cooling device, no battery, mains only through no
    power_supply at all (GPUs via NVML stand-in)."""
    tree = _tree(root, cores)
    tree.zone(0, "x86_pkg_temp", 58000, [("passive", 95000), ("critical", 105000)])
    tree.cooling(0, "Processor", 0, 10)
    tree.cpufreq(cur_khz=2_900_000, max_khz=3_500_000, governor="performance", epp=None)
    tree.cpus(throttle_counters=True)
    tree.set_psi(0.0, 0.0)
    return tree


def vm(root: Path, cores: int = 2) -> Tree:
    """A virtual machine with nothing: no thermal, no power_supply, no cpufreq, no PSI; steal time in /proc/stat."""
    tree = Tree(sys=root / "sys", proc=root / "proc", cores=cores)
    (tree.sys / "class").mkdir(parents=True)  # a VM's /sys has classes, none of them thermal or power_supply
    for i in range(cores):
        (tree.sys / f"devices/system/cpu/cpu{i}").mkdir(parents=True)
    tree.proc.mkdir(parents=True)
    tree.set_stat(busy=5000, idle=14000, steal=1000)
    tree.set_meminfo(4 * 1024 * 1024, 3 * 1024 * 1024)
    return tree


BUILDERS = {"laptop": laptop, "desktop": desktop, "server": server, "vm": vm}

# -- machines with accelerators --

AGENT_PID = 4000  # the agent in these trees; its child 4001 is one of its analysis workers
BROWSER_PID = 2000


def i915_fdinfo(client_id: int, render_ns: int, video_ns: int = 0, memory_kib: int = 55160) -> str:
    """An i915 client (Documentation/gpu/i915.rst, client usage stats)."""
    return (f"drm-driver:\ti915\ndrm-client-id:\t{client_id}\ndrm-pdev:\t0000:00:02.0\n"
            f"drm-total-system0:\t{memory_kib} KiB\ndrm-shared-system0:\t0\ndrm-active-system0:\t0\n"
            f"drm-resident-system0:\t{memory_kib} KiB\ndrm-purgeable-system0:\t0\ndrm-total-stolen-system0:\t0\n"
            f"drm-engine-render:\t{render_ns} ns\ndrm-engine-copy:\t0 ns\ndrm-engine-video:\t{video_ns} ns\n"
            f"drm-engine-capacity-video:\t2\ndrm-engine-video-enhance:\t0 ns\n")


def xe_fdinfo(client_id: int, rcs_cycles: int, total_cycles: int, ccs_cycles: int = 0) -> str:
    """An xe client (Documentation/gpu/xe/xe-drm-usage-stats.rst): busy cycles against elapsed GPU cycles."""
    return (f"drm-driver:\txe\ndrm-client-id:\t{client_id}\ndrm-pdev:\t0000:00:02.0\n"
            f"drm-total-system:\t0\ndrm-shared-system:\t0\ndrm-active-system:\t0\ndrm-resident-system:\t0\n"
            f"drm-purgeable-system:\t0\ndrm-total-gtt:\t192 KiB\ndrm-shared-gtt:\t0\ndrm-active-gtt:\t0\n"
            f"drm-resident-gtt:\t192 KiB\ndrm-total-stolen:\t0\n"
            f"drm-cycles-rcs:\t{rcs_cycles}\ndrm-total-cycles-rcs:\t{total_cycles}\n"
            f"drm-cycles-bcs:\t0\ndrm-total-cycles-bcs:\t{total_cycles}\n"
            f"drm-cycles-vcs:\t0\ndrm-total-cycles-vcs:\t{total_cycles}\ndrm-engine-capacity-vcs:\t2\n"
            f"drm-cycles-vecs:\t0\ndrm-total-cycles-vecs:\t{total_cycles}\ndrm-engine-capacity-vecs:\t2\n"
            f"drm-cycles-ccs:\t{ccs_cycles}\ndrm-total-cycles-ccs:\t{total_cycles}\ndrm-engine-capacity-ccs:\t4\n")


def amdgpu_fdinfo(client_id: int, gfx_ns: int, compute_ns: int = 0, vram_kib: int = 25040) -> str:
    """An amdgpu client: the older drm-memory-* keys, amd-* driver keys, engines in ns."""
    return (f"drm-driver:\tamdgpu\ndrm-client-id:\t{client_id}\ndrm-pdev:\t0000:c4:00.0\npasid:\t32782\n"
            f"drm-memory-vram:\t{vram_kib} KiB\ndrm-memory-gtt: \t2048 KiB\ndrm-memory-cpu: \t0 KiB\n"
            f"amd-memory-visible-vram:\t{vram_kib} KiB\namd-evicted-vram:\t0 KiB\n"
            f"amd-requested-vram:\t{vram_kib} KiB\namd-requested-gtt:\t2048 KiB\n"
            f"drm-engine-gfx:\t{gfx_ns} ns\ndrm-engine-compute:\t{compute_ns} ns\ndrm-engine-dma:\t0 ns\n"
            f"drm-engine-dec:\t0 ns\ndrm-engine-enc:\t0 ns\n")


def amdxdna_fdinfo(client_id: int, npu_ns: int) -> str:
    """An AMD NPU client (amdxdna)."""
    return (f"drm-driver:\tamdxdna_accel_driver\ndrm-client-id:\t{client_id}\ndrm-pdev:\t0000:c5:00.1\n"
            f"drm-engine-npu-amdxdna:\t{npu_ns} ns\ndrm-total-memory:\t4096 KiB\ndrm-shared-memory:\t0\n"
            f"drm-active-memory:\t0\ndrm-resident-memory:\t4096 KiB\ndrm-purgeable-memory:\t0\n")


def _agent_processes(tree: Tree) -> None:
    tree.process(1, 0, "systemd")
    tree.process(BROWSER_PID, 1, "firefox")
    tree.process(AGENT_PID, 1, "daop-agent")
    tree.process(AGENT_PID + 1, AGENT_PID, "python3")  # an analysis worker of the agent


def intel_laptop(root: Path, driver: str = "i915") -> Tree:
    """The laptop, with an Intel integrated GPU at 0000:00:02.0 on `driver` (i915 or xe) and an Intel NPU
    (intel_vpu) at 0000:00:0b.0. The GPU runs at 1100 of 1300 MHz (RP0), its maximum set to 1300, no
    throttling. A browser (pid 2000) is a client of the GPU; so is the agent's worker (pid 4001)."""
    tree = laptop(root)
    gpu = tree.pci_device("0000:00:02.0", "8086:a7a0", driver, ("drm/card0", "drm/renderD128"))
    _agent_processes(tree)
    if driver == "i915":
        card = f"{gpu}/drm/card0"
        for name, value in (("act", 1100), ("cur", 1100), ("max", 1300), ("min", 100), ("RP0", 1300),
                            ("RPn", 100), ("boost", 1300)):
            tree.set(f"{card}/gt_{name}_freq_mhz", str(value))
            tree.set(f"{card}/gt/gt0/rps_{name}_freq_mhz", str(value))
        for reason in ("status", "pl1", "pl2", "pl4", "thermal", "prochot", "ratl", "vr_thermalert", "vr_tdc"):
            tree.set(f"{card}/gt/gt0/throttle_reason_{reason}", "0")
        tree.set(f"{card}/gt/gt0/rc6_residency_ms", "800000")
        tree.set(f"{card}/power/rc6_residency_ms", "800000")
        tree.drm_client(BROWSER_PID, 30, "dri/renderD128", i915_fdinfo(7, render_ns=10_000_000_000))
        tree.drm_client(AGENT_PID + 1, 5, "dri/renderD128", i915_fdinfo(9, render_ns=1_000_000_000))
    else:
        freq = f"{gpu}/tile0/gt0/freq0"
        for name, value in (("act", 1100), ("cur", 1100), ("max", 1300), ("min", 100), ("rp0", 1300),
                            ("rpe", 700), ("rpn", 100)):
            tree.set(f"{freq}/{name}_freq", str(value))
        for reason in ("status", "reason_pl1", "reason_pl2", "reason_pl4", "reason_thermal", "reason_prochot",
                       "reason_ratl", "reason_vr_thermalert", "reason_vr_tdc"):
            tree.set(f"{freq}/throttle/{reason}", "0")
        tree.set(f"{gpu}/tile0/gt0/gtidle/name", "gt0-rc")
        tree.set(f"{gpu}/tile0/gt0/gtidle/idle_status", "gt-c6")
        tree.set(f"{gpu}/tile0/gt0/gtidle/idle_residency_ms", "500000")
        tree.drm_client(BROWSER_PID, 30, "dri/renderD128",
                        xe_fdinfo(3, rcs_cycles=28_257_900, total_cycles=7_655_183_225))
        tree.drm_client(AGENT_PID + 1, 5, "dri/renderD128", xe_fdinfo(4, rcs_cycles=0, total_cycles=7_655_183_225))
    tree.plain_fd(BROWSER_PID, 3, "/home/user/.mozilla/places.sqlite")
    tree.plain_fd(BROWSER_PID, 4, "socket:[12345]")
    npu = tree.pci_device("0000:00:0b.0", "8086:7d1d", "intel_vpu", ("accel/accel0",))
    tree.set(f"{npu}/npu_busy_time_us", "1000000")
    tree.set(f"{npu}/npu_current_frequency_mhz", "0")  # idle: power-gated
    tree.set(f"{npu}/npu_max_frequency_mhz", "1950")
    tree.set(f"{npu}/npu_memory_utilization", "0")
    tree.set(f"{npu}/sched_mode", "HW")
    return tree


def amd_laptop(root: Path) -> Tree:
    """The laptop, with an AMD APU: its GPU (amdgpu) at 0000:c4:00.0, 512 MiB carved out as VRAM and
    gpu_busy_percent 35, hwmon at 9 of 15 W, and its NPU (amdxdna) at 0000:c5:00.1. The browser is a GPU
    client; so is the agent's worker; another process (pid 2100) uses the NPU."""
    tree = laptop(root)
    gpu = tree.pci_device("0000:c4:00.0", "1002:15bf", "amdgpu", ("drm/card1", "drm/renderD128"))
    tree.set(f"{gpu}/gpu_busy_percent", "35")
    tree.set(f"{gpu}/mem_busy_percent", "4")
    tree.set(f"{gpu}/mem_info_vram_total", str(512 << 20))
    tree.set(f"{gpu}/mem_info_vram_used", str(200 << 20))
    tree.set(f"{gpu}/mem_info_vis_vram_total", str(512 << 20))
    tree.set(f"{gpu}/mem_info_gtt_total", str(8 << 30))
    tree.set(f"{gpu}/mem_info_gtt_used", str(300 << 20))
    tree.set(f"{gpu}/pp_dpm_sclk", "0: 800Mhz\n1: 1500Mhz *\n2: 2700Mhz")
    hw = f"{gpu}/hwmon/hwmon5"
    tree.set(f"{hw}/name", "amdgpu")
    tree.set(f"{hw}/temp1_input", "52000")
    tree.set(f"{hw}/temp1_label", "edge")
    tree.set(f"{hw}/power1_input", "9000000")
    tree.set(f"{hw}/power1_cap", "15000000")
    npu = tree.pci_device("0000:c5:00.1", "1022:1502", "amdxdna", ("accel/accel0",))
    tree.set(f"{npu}/vbnv", "RyzenAI-npu1")
    tree.set(f"{npu}/device_type", "1")
    tree.set(f"{npu}/fw_version", "1.5.5.391")
    _agent_processes(tree)
    tree.process(2100, 1, "npu-app")
    tree.drm_client(BROWSER_PID, 30, "dri/renderD128", amdgpu_fdinfo(13, gfx_ns=5_000_000_000))
    tree.drm_client(BROWSER_PID, 31, "dri/renderD128", amdgpu_fdinfo(13, gfx_ns=5_000_000_000))  # a dup: one client
    tree.drm_client(AGENT_PID + 1, 5, "dri/renderD128", amdgpu_fdinfo(14, gfx_ns=0, vram_kib=1024))
    tree.drm_client(2100, 7, "accel/accel0", amdxdna_fdinfo(2, npu_ns=3_000_000_000))
    return tree


def nvidia_desktop(root: Path) -> Tree:
    """The desktop, with an NVIDIA GPU on the proprietary driver at 0000:01:00.0 (its figures from the NVML
    stand-in, whose bus id is that slot)."""
    tree = desktop(root)
    tree.pci_device("0000:01:00.0", "10de:2684", "nvidia", ("drm/card0", "drm/renderD128"))
    _agent_processes(tree)
    return tree


ACCELERATOR_BUILDERS = {"intel-laptop-i915": intel_laptop, "intel-laptop-xe": lambda root: intel_laptop(root, "xe"),
                        "amd-laptop": amd_laptop, "nvidia-desktop": nvidia_desktop}
