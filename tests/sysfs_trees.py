"""Fixture /sys and /proc trees for devices this machine is not: a laptop, a desktop, a GPU server, a bare VM.

The probes run unchanged against these trees (`Sampler(tree.sys, tree.proc)`,
`daop-agent state --sysfs-root tree.sys --procfs-root tree.proc`). Values
follow the kernel's formats: millidegrees, microwatt-hours, kHz, USER_HZ ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Tree:
    sys: Path
    proc: Path
    cores: int

    def set(self, rel: str, text: str | bytes) -> Path:
        """Write a sysfs attribute (a newline is added to text, as the kernel does)."""
        path = self.sys / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text + "\n")
        return path

    def set_proc(self, rel: str, text: str) -> Path:
        path = self.proc / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def remove(self, rel: str) -> None:
        (self.sys / rel).unlink()

    def set_stat(self, busy: int, idle: int, steal: int = 0, running: int = 1) -> None:
        """/proc/stat with these totals (ticks) spread over the cores: busy as user time, idle as idle;
        `running` tasks runnable right now (procs_running; 1 = only the reader)."""
        per = lambda total, i: total // self.cores + (1 if i < total % self.cores else 0)  # noqa: E731
        lines = [f"cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0"]
        for i in range(self.cores):
            lines.append(f"cpu{i} {per(busy, i)} 0 0 {per(idle, i)} 0 0 0 {per(steal, i)} 0 0")
        lines += ["intr 12345 0 0", "ctxt 999", "btime 1700000000", "processes 1000", f"procs_running {running}", "procs_blocked 0"]
        self.set_proc("stat", "\n".join(lines) + "\n")
        self.set_proc("loadavg", f"0.50 0.40 0.30 {running}/300 4242\n")

    def set_psi(self, cpu_some_avg10: float, memory_some_avg10: float = 0.0) -> None:
        self.set_proc("pressure/cpu", f"some avg10={cpu_some_avg10:.2f} avg60=0.00 avg300=0.00 total=1000\n"
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


def _tree(root: Path, cores: int) -> Tree:
    tree = Tree(sys=root / "sys", proc=root / "proc", cores=cores)
    (tree.sys / "class").mkdir(parents=True)
    tree.proc.mkdir(parents=True)
    tree.set_stat(busy=1000 * cores, idle=9000 * cores)
    tree.set_meminfo(16 * 1024 * 1024, 12 * 1024 * 1024)
    return tree


def laptop(root: Path) -> Tree:
    """Two system batteries (BAT0, CMB1) giving 37.0 % by energy, a mouse battery (scope Device),
    adapter ADP1 (not AC) unplugged, a USB-C port, zones with passive trips at 71.5 C max, fans and
    processor cooling idle, platform profile low-power, x86 throttle counters."""
    tree = _tree(root, cores=4)
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


def desktop(root: Path) -> Tree:
    """No battery, no thermal zones (hwmon coretemp instead), performance governor, no platform profile."""
    tree = _tree(root, cores=8)
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


def server(root: Path) -> Tree:
    """A GPU server: one package zone, no battery, mains only through no power_supply at all (GPUs via NVML stand-in)."""
    tree = _tree(root, cores=16)
    tree.zone(0, "x86_pkg_temp", 58000, [("passive", 95000), ("critical", 105000)])
    tree.cpufreq(cur_khz=2_900_000, max_khz=3_500_000, governor="performance", epp=None)
    tree.cpus(throttle_counters=True)
    tree.set_psi(0.0, 0.0)
    return tree


def vm(root: Path) -> Tree:
    """A virtual machine with nothing: no thermal, no power_supply, no cpufreq, no PSI; steal time in /proc/stat."""
    tree = Tree(sys=root / "sys", proc=root / "proc", cores=2)
    (tree.sys / "devices/system/cpu/cpu0").mkdir(parents=True)
    (tree.sys / "devices/system/cpu/cpu1").mkdir(parents=True)
    tree.proc.mkdir(parents=True)
    tree.set_stat(busy=5000, idle=14000, steal=1000)
    tree.set_meminfo(4 * 1024 * 1024, 3 * 1024 * 1024)
    return tree


BUILDERS = {"laptop": laptop, "desktop": desktop, "server": server, "vm": vm}
