"""Accelerator probe: every GPU (`/sys/class/drm/card*`) and NPU (`/sys/class/accel/accel*`), by the kernel's
own accounting, with NVML's readings where an NVIDIA GPU has them.

Per device, what its driver writes in sysfs:
- amdgpu: `gpu_busy_percent`, `mem_info_vram_{total,used}`, `mem_info_gtt_{total,used}`, `pp_dpm_sclk`
  (the shader clock's levels, the current one starred), hwmon `temp1_input`, `power1_average` (or
  `power1_input`) and `power1_cap`;
- i915: `gt/gt0/rps_{act,max,RP0}_freq_mhz` (or the card's `gt_{act,max,RP0}_freq_mhz`),
  `gt/gt0/throttle_reason_*`, and `gt/gt0/rc6_residency_ms` (or the card's `power/rc6_residency_ms`:
  the time the GT slept, whose complement over an interval is its busy share);
- xe: `device/tile0/gt0/freq0/{act,max,rp0}_freq`, `freq0/throttle/{status,reason_*}`, and
  `gtidle/idle_residency_ms` (the GT's idle time, whose complement over an interval is its busy share);
- intel_vpu (Intel NPU): `npu_busy_time_us`, `npu_{current,max}_frequency_mhz`, `npu_memory_utilization`;
- amdxdna (AMD NPU): `vbnv` (its name);
and for every device the DRM clients' busy time and memory (probes/drm.py), which tells others' load
from the agent's own. Each reading is fallible and stands alone: a driver that lacks a file, or writes
garbage, leaves that reading None and the others go on. Busy times read as counters are deltas between
samples: the first sample has none.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from probes.drm import DeviceUsage, DrmClients
from probes.gpu import POWER_REASONS, REASON_HW_SLOWDOWN, THERMAL_REASONS, GpuState
from probes.sysfs import STATIC_TTL_S, KernelFiles, parse_int, take
from probes.thermal import parse_millidegrees

DRM = "class/drm"
ACCEL = "class/accel"
PCI_VENDORS = {"8086": "intel", "1002": "amd", "1022": "amd", "10de": "nvidia", "17cb": "qualcomm", "5143": "qualcomm",
               "1e3e": "habana", "13b5": "arm"}
DRIVER_VENDORS = {"i915": "intel", "xe": "intel", "intel_vpu": "intel", "habanalabs": "intel", "amdgpu": "amd",
                  "radeon": "amd", "amdxdna": "amd", "nvidia": "nvidia", "nouveau": "nvidia", "msm": "qualcomm",
                  "qaic": "qualcomm", "panfrost": "arm", "panthor": "arm", "lima": "arm", "ethosu": "arm",
                  "v3d": "broadcom", "etnaviv": "vivante", "rocket": "rockchip", "powervr": "imagination"}
# DRM drivers that only drive a display (firmware framebuffers, virtual and server graphics): nothing to run a
# model on.
DISPLAY_ONLY = frozenset({"simpledrm", "simple-framebuffer", "efi-framebuffer", "vesafb", "bochs-drm", "bochs",
                          "cirrus", "cirrus-qemu", "qxl", "ast", "mgag200", "hyperv_drm", "vkms", "udl",
                          "vboxvideo", "vc4", "virtio_gpu", "virtio-pci", "vmwgfx", "gm12u320"})
# Intel's integrated GPU always sits at this PCI address; a discrete Intel GPU does not.
INTEL_IGPU_SLOT = "0000:00:02.0"
# Throttle reasons that are heat (Intel's names, and NVML's "thermal"); the others are power limits.
THERMAL_NAMES = frozenset({"thermal", "prochot", "ratl", "vr_thermalert"})


@dataclass(frozen=True)
class AcceleratorState:
    id: str  # gpu0, gpu1, npu0: in the order found (DRM cards, then GPUs NVML alone sees, then accel devices)
    kind: str  # "gpu" or "npu"
    vendor: str | None  # intel, amd, nvidia, qualcomm, arm, ...
    driver: str | None  # i915, xe, amdgpu, nvidia, intel_vpu, amdxdna, msm, panfrost, ...
    name: str | None
    pci_slot: str | None  # the device's bus address (a platform device's name on a SoC): `drm-pdev`
    node: str | None  # card0, accel0; None for a GPU only NVML sees
    nvml_index: int | None = None
    shares_system_memory: bool | None = None  # an integrated GPU, an NPU: its free memory is the system's
    busy: float | None = None  # share of the device busy with anything, 0..1, over the last interval
    others_busy: float | None = None  # ... with clients other than the agent's own process tree
    own_busy: float | None = None  # ... with the agent's own clients
    busy_source: str | None = None  # nvml, gpu_busy_percent, rc6, gtidle, npu_busy_time, fdinfo
    engines: dict[str, float] | None = None  # others' busy share per engine class (fdinfo)
    clients: int | None = None  # DRM clients of other processes seen
    own_clients: int | None = None
    memory_total_bytes: int | None = None  # the device's own memory (VRAM)
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    others_memory_bytes: int | None = None  # memory of others' DRM clients (every region)
    gtt_total_bytes: int | None = None  # amdgpu: system memory the GPU maps
    gtt_used_bytes: int | None = None
    clock_mhz: float | None = None  # actual clock (0 in a power-saving idle state reads None)
    clock_max_mhz: float | None = None  # the hardware's highest clock
    clock_limit_mhz: float | None = None  # a software cap on the clock (user, firmware), where set
    throttled: bool | None = None  # the hardware reports its clock limited (thermal, power)
    throttle_reasons: tuple[str, ...] = ()
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    stale: dict[str, float] = field(default_factory=dict)

    @property
    def thermal_throttling(self) -> bool | None:
        if self.throttled is None:
            return None
        return any(r in THERMAL_NAMES for r in self.throttle_reasons)


@dataclass(frozen=True)
class _Device:
    """What identifies a DRM or accel device (re-read once a minute)."""

    node: str
    kind: str
    key: str  # pci_slot, or the node where there is none
    pci_slot: str | None
    driver: str | None
    vendor: str | None
    pci_id: str | None  # `8086:9A49`


def parse_uevent(text: str) -> dict[str, str] | None:
    """A device's `uevent`: `DRIVER=i915`, `PCI_ID=8086:9A49`, `PCI_SLOT_NAME=0000:00:02.0`, ..."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.isupper() and value.isprintable() and len(value) < 256:
            out[key] = value
    return out or None


def _parse_percent(text: str) -> float | None:
    value = parse_int(text)
    return value / 100.0 if value is not None and 0 <= value <= 100 else None


def _parse_count(text: str) -> int | None:
    value = parse_int(text)
    return value if value is not None and value >= 0 else None


def _parse_mhz(text: str) -> float | None:
    value = parse_int(text)
    return float(value) if value is not None and 0 < value < 100_000 else None


def _parse_clock(text: str) -> float | None:
    """An actual clock: 0 is a real reading (power-gated, in RC6), which the state shows as None."""
    value = parse_int(text)
    return float(value) if value is not None and 0 <= value < 100_000 else None


def _parse_flag(text: str) -> bool | None:
    value = parse_int(text)
    return None if value not in (0, 1) else bool(value)


def parse_dpm_clocks(text: str) -> tuple[float, float] | None:
    """amdgpu `pp_dpm_sclk` (`0: 500Mhz`, `1: 1800Mhz *`, ...) -> (current, highest) MHz; None for garbage."""
    levels: list[float] = []
    current = None
    for line in text.splitlines():
        _, colon, rest = line.partition(":")
        parts = rest.split()
        if not colon or not parts or not parts[0].lower().endswith("mhz"):
            continue
        try:
            mhz = float(parts[0][:-3])
        except ValueError:
            return None
        if not 0 < mhz < 100_000:
            return None
        levels.append(mhz)
        if parts[-1] == "*":
            current = mhz
    if not levels or current is None:
        return None
    return current, max(levels)


def _parse_microwatts(text: str) -> float | None:
    value = parse_int(text)
    return value / 1e6 if value is not None and 0 <= value < 10**10 else None


class AcceleratorProbe:
    """Samples every accelerator; one instance per sampler (it keeps counters between samples)."""

    def __init__(self, sys_files: KernelFiles, drm: DrmClients, clock: Callable[[], float] = time.monotonic) -> None:
        self.sys = sys_files
        self.drm = drm
        self.clock = clock
        self._counters: dict[str, tuple[float, float]] = {}  # key -> (counter, when)

    def sample(self, gpus: tuple[GpuState, ...] = ()) -> tuple[tuple[AcceleratorState, ...], list[str]]:
        """Every accelerator, and notes on what could not be seen."""
        now = self.clock()
        cards = self._devices(DRM, "card", "gpu")
        npus = self._devices(ACCEL, "accel", "npu")
        notes: list[str] = []
        usage: dict[str, DeviceUsage] = {}
        if cards or npus:
            nodes = {d.node: d.key for d in cards + npus}
            nodes.update(self._render_nodes())
            report = self.drm.sample(nodes, {d.pci_slot: d.key for d in cards + npus if d.pci_slot})
            usage = report.devices
            if report.hidden_processes:
                notes.append(f"drm: the fds of {report.hidden_processes} processes of other users cannot be read "
                             "(not root): their GPU and NPU clients count only in device-wide readings")
        by_slot = {g.pci_slot: g for g in gpus if g.pci_slot}
        members = self.drm.tree.members() if any(g.process_busy for g in gpus) else set()
        out: list[AcceleratorState] = []
        matched: set[int] = set()
        for i, dev in enumerate(cards):
            gpu = by_slot.get(dev.pci_slot or "")
            if gpu is not None:
                matched.add(gpu.index)
            out.append(self._state(f"gpu{i}", dev, usage.get(dev.key), gpu, now, members))
        for gpu in gpus:
            if gpu.index not in matched:
                alone = _Device(node="", kind="gpu", key=f"nvml{gpu.index}", pci_slot=gpu.pci_slot, driver=None,
                                vendor="nvidia", pci_id=None)
                out.append(self._state(f"gpu{len(out)}", alone, None, gpu, now, members))
        for i, dev in enumerate(npus):
            out.append(self._state(f"npu{i}", dev, usage.get(dev.key), None, now))
        live = {d.key for d in cards + npus}
        for key in [k for k in self._counters if k.split("#", 1)[0] not in live]:
            del self._counters[key]
        return tuple(out), notes

    # -- discovery --

    def _devices(self, cls: str, prefix: str, kind: str) -> list[_Device]:
        found = []
        for node in self.sys.listdir(cls, prefix, STATIC_TTL_S):
            if not node[len(prefix):].isdigit():
                continue  # card0-eDP-1 is a connector
            dev = self._identify(f"{cls}/{node}/device", node, kind)
            if dev is not None and dev.driver not in DISPLAY_ONLY:
                found.append(dev)
        return found

    def _identify(self, base: str, node: str, kind: str) -> _Device | None:
        if not self.sys.exists(base):
            return None
        uevent = self.sys.read(f"{base}/uevent", parse_uevent, STATIC_TTL_S).value or {}
        driver = uevent.get("DRIVER")
        if driver is None:
            link = self.sys.readlink(f"{base}/driver")
            driver = os.path.basename(link) if link else None
        slot = uevent.get("PCI_SLOT_NAME") or self.sys.resolved_name(base)
        pci_id = uevent.get("PCI_ID")
        vendor = PCI_VENDORS.get(pci_id.split(":")[0].lower()) if pci_id else None
        vendor = vendor or DRIVER_VENDORS.get(driver or "")
        return _Device(node=node, kind=kind, key=slot or node, pci_slot=slot, driver=driver, vendor=vendor,
                       pci_id=pci_id)

    def _render_nodes(self) -> dict[str, str]:
        nodes = {}
        for node in self.sys.listdir(DRM, "renderD", STATIC_TTL_S):
            dev = self._identify(f"{DRM}/{node}/device", node, "gpu")
            if dev is not None:
                nodes[node] = dev.key
        return nodes

    # -- one device --

    def _state(self, id_: str, dev: _Device, use: DeviceUsage | None, gpu: GpuState | None,
               now: float, own_pids: set[int] | frozenset[int] = frozenset()) -> AcceleratorState:
        stale: dict[str, float] = {}
        r: dict = {}
        base = f"{DRM if dev.kind == 'gpu' else ACCEL}/{dev.node}/device"
        if dev.node:
            reader = {"amdgpu": self._amdgpu, "i915": self._i915, "xe": self._xe, "intel_vpu": self._intel_vpu,
                      "amdxdna": self._amdxdna}.get(dev.driver or "")
            if reader is not None:
                reader(dev, base, r, stale, now)
        if gpu is not None:
            r.update(_from_nvml(gpu))
            stale.update(gpu.stale)
        shares = r.pop("shares_system_memory", None)
        if shares is None:
            if dev.kind == "npu" or (dev.vendor == "intel" and dev.pci_slot == INTEL_IGPU_SLOT):
                shares = True
            elif dev.pci_slot and ":" not in dev.pci_slot:
                shares = True  # a platform device: a SoC's GPU uses the system's memory
        busy, source = r.pop("busy", None), r.pop("busy_source", None)
        own = use.own_busy if use is not None else None
        if own is None and gpu is not None and gpu.process_busy is not None:
            own = min(1.0, sum(share for pid, share in gpu.process_busy.items() if pid in own_pids))  # NVML's
        fd_others = use.others_busy if use is not None else None
        if busy is None and fd_others is not None:
            busy, source = min(1.0, fd_others + (own or 0.0)), "fdinfo"
        others = None
        if busy is not None:
            # the device-wide reading less the agent's own clients; fdinfo's sum where it sees more (a device-wide
            # reading can be an instant where fdinfo is a mean over the interval)
            others = max(0.0, busy - (own or 0.0))
            if fd_others is not None:
                others = max(others, fd_others)
        total, used = r.get("memory_total_bytes"), r.get("memory_used_bytes")
        if total is not None and used is not None and "memory_free_bytes" not in r:
            r["memory_free_bytes"] = max(0, total - used)
        name = r.pop("name", None) or _default_name(dev)
        return AcceleratorState(
            id=id_, kind=dev.kind, vendor=dev.vendor, driver=dev.driver, name=name, pci_slot=dev.pci_slot,
            node=dev.node or None, nvml_index=gpu.index if gpu is not None else None, shares_system_memory=shares,
            busy=_round(busy), others_busy=_round(others), own_busy=_round(own), busy_source=source,
            engines=use.others_engines if use is not None else None,
            clients=use.others_clients if use is not None else None,
            own_clients=use.own_clients if use is not None else None,
            others_memory_bytes=use.others_memory_bytes if use is not None else None,
            stale=stale, **r,
        )

    def _delta(self, key: str, value: float | None, now: float) -> float | None:
        """Growth per second of a counter since the previous sample; None on the first, or after a reset."""
        if value is None:
            return None
        prev = self._counters.get(key)
        self._counters[key] = (value, now)
        if prev is None or now <= prev[1] or value < prev[0]:
            return None
        return (value - prev[0]) / (now - prev[1])

    def _amdgpu(self, dev: _Device, base: str, r: dict, stale: dict[str, float], now: float) -> None:
        f = self.sys
        r["busy"] = take(f.read(f"{base}/gpu_busy_percent", _parse_percent), "busy", stale)
        r["busy_source"] = "gpu_busy_percent" if r["busy"] is not None else None
        r["memory_total_bytes"] = f.read(f"{base}/mem_info_vram_total", _parse_count, STATIC_TTL_S).value
        r["memory_used_bytes"] = take(f.read(f"{base}/mem_info_vram_used", _parse_count), "memory_used_bytes", stale)
        r["gtt_total_bytes"] = f.read(f"{base}/mem_info_gtt_total", _parse_count, STATIC_TTL_S).value
        r["gtt_used_bytes"] = take(f.read(f"{base}/mem_info_gtt_used", _parse_count), "gtt_used_bytes", stale)
        r["name"] = f.read_word(f"{base}/product_name", STATIC_TTL_S).value
        clocks = take(f.read(f"{base}/pp_dpm_sclk", parse_dpm_clocks), "clock_mhz", stale)
        if clocks is not None:
            r["clock_mhz"], r["clock_max_mhz"] = clocks
        for hw in f.listdir(f"{base}/hwmon", "hwmon", STATIC_TTL_S):
            hb = f"{base}/hwmon/{hw}"
            r["temp_c"] = take(f.read(f"{hb}/temp1_input", parse_millidegrees), "temp_c", stale)
            power = f.read(f"{hb}/power1_average", _parse_microwatts)
            if power.value is None:
                power = f.read(f"{hb}/power1_input", _parse_microwatts)
            r["power_w"] = take(power, "power_w", stale)
            r["power_limit_w"] = f.read(f"{hb}/power1_cap", _parse_microwatts, STATIC_TTL_S).value
            break
        if r.get("power_w") is not None and r.get("power_limit_w"):
            capped = r["power_w"] >= 0.95 * r["power_limit_w"]
            r["throttled"], r["throttle_reasons"] = capped, ("power",) if capped else ()

    def _intel_throttle(self, where: str, prefix: str, status: str, r: dict, stale: dict[str, float]) -> None:
        f = self.sys
        if not f.exists(f"{where}/{status}"):
            return
        r["throttled"] = take(f.read(f"{where}/{status}", _parse_flag), "throttled", stale)
        reasons = []
        for entry in f.listdir(where, prefix, STATIC_TTL_S):
            if entry != status and f.read(f"{where}/{entry}", _parse_flag).value:
                reasons.append(entry[len(prefix):])
        r["throttle_reasons"] = tuple(reasons) if r["throttled"] else ()

    def _intel_clocks(self, act: list[str], limit: list[str], top: list[str], r: dict, stale: dict[str, float]) -> None:
        f = self.sys

        def first(paths: list[str], ttl: float = 0.0, parse=_parse_mhz):
            for path in paths:
                if f.exists(path):
                    return f.read(path, parse, ttl)
            return None

        actual = first(act, parse=_parse_clock)
        r["clock_mhz"] = (take(actual, "clock_mhz", stale) or None) if actual is not None else None
        capped, hardware = first(limit, 5.0), first(top, STATIC_TTL_S)
        r["clock_max_mhz"] = hardware.value if hardware is not None else None
        r["clock_limit_mhz"] = capped.value if capped is not None else None

    def _i915(self, dev: _Device, base: str, r: dict, stale: dict[str, float], now: float) -> None:
        card, gt = f"{DRM}/{dev.node}", f"{DRM}/{dev.node}/gt/gt0"
        self._intel_clocks([f"{gt}/rps_act_freq_mhz", f"{card}/gt_act_freq_mhz"],
                           [f"{gt}/rps_max_freq_mhz", f"{card}/gt_max_freq_mhz"],
                           [f"{gt}/rps_RP0_freq_mhz", f"{card}/gt_RP0_freq_mhz"], r, stale)
        self._intel_throttle(gt, "throttle_reason_", "throttle_reason_status", r, stale)
        self._idle_residency(dev, [f"{gt}/rc6_residency_ms", f"{card}/power/rc6_residency_ms"], "rc6", r, now)

    def _idle_residency(self, dev: _Device, paths: list[str], source: str, r: dict, now: float) -> None:
        """Busy share from a counter of ms spent idle (RC6 / C6): 1 - idle ms per ms of wall time. A GT that
        idles but has not yet dropped into RC6 counts as busy, so a light load reads a little high."""
        path = next((p for p in paths if self.sys.exists(p)), None)
        idle_ms = self.sys.read(path, _parse_count).value if path else None
        idle = self._delta(f"{dev.key}#{source}", idle_ms, now)
        if idle is not None:  # ms of idle per s of wall time
            r["busy"], r["busy_source"] = max(0.0, min(1.0, 1.0 - idle / 1000.0)), source

    def _xe(self, dev: _Device, base: str, r: dict, stale: dict[str, float], now: float) -> None:
        gt = f"{base}/tile0/gt0"
        freq = f"{gt}/freq0"
        self._intel_clocks([f"{freq}/act_freq"], [f"{freq}/max_freq"], [f"{freq}/rp0_freq"], r, stale)
        self._intel_throttle(f"{freq}/throttle", "reason_", "status", r, stale)
        self._idle_residency(dev, [f"{gt}/gtidle/idle_residency_ms"], "gtidle", r, now)

    def _intel_vpu(self, dev: _Device, base: str, r: dict, stale: dict[str, float], now: float) -> None:
        f = self.sys
        busy_us = f.read(f"{base}/npu_busy_time_us", _parse_count).value
        busy = self._delta(f"{dev.key}#busy", busy_us, now)
        if busy is not None:  # us busy per s of wall time
            r["busy"], r["busy_source"] = max(0.0, min(1.0, busy / 1e6)), "npu_busy_time"
        r["clock_mhz"] = take(f.read(f"{base}/npu_current_frequency_mhz", _parse_clock), "clock_mhz", stale) or None
        r["clock_max_mhz"] = f.read(f"{base}/npu_max_frequency_mhz", _parse_mhz, STATIC_TTL_S).value
        used = f.read(f"{base}/npu_memory_utilization", _parse_count)
        r["memory_used_bytes"] = take(used, "memory_used_bytes", stale)

    def _amdxdna(self, dev: _Device, base: str, r: dict, stale: dict[str, float], now: float) -> None:
        r["name"] = self.sys.read_word(f"{base}/vbnv", STATIC_TTL_S).value


def _from_nvml(g: GpuState) -> dict:
    """NVML's readings of one GPU, in the accelerator's terms (they win over sysfs's for the same device)."""
    reasons: list[str] = []
    if g.event_reasons is not None:
        reasons += ["thermal"] if g.event_reasons & THERMAL_REASONS else []
        reasons += ["power"] if g.event_reasons & POWER_REASONS else []
        reasons += ["hardware"] if g.event_reasons & REASON_HW_SLOWDOWN else []
    return {
        "name": g.name,
        "busy": None if g.util_percent is None else min(1.0, g.util_percent / 100.0),
        "busy_source": "nvml" if g.util_percent is not None else None,
        "memory_total_bytes": g.memory_total_bytes, "memory_used_bytes": g.memory_used_bytes,
        "memory_free_bytes": g.memory_free_bytes, "shares_system_memory": False,
        "clock_mhz": g.sm_clock_mhz, "clock_max_mhz": g.sm_clock_max_mhz,
        "throttled": None if g.event_reasons is None else bool(reasons), "throttle_reasons": tuple(reasons),
        "power_w": g.power_w, "power_limit_w": g.power_limit_w, "temp_c": g.temp_c,
    }


def _default_name(dev: _Device) -> str | None:
    """Without a product name: the vendor, the driver and the PCI id (`intel i915 [8086:9A49]`)."""
    parts = [p for p in (dev.vendor, dev.driver) if p]
    if dev.pci_id:
        parts.append(f"[{dev.pci_id}]")
    return " ".join(parts) or None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
