"""Thermal probe: zones and their trip points, cooling devices, x86 throttle counters, hwmon.

Trip points and throttle counters say more than raw temperatures: a zone at
or above its lowest `passive` trip point is being cooled by slowing the CPU
down, and a throttle counter that moved means it happened since last tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probes.sysfs import STATIC_TTL_S, KernelFiles, parse_int
from probes.sysfs import take as _note


@dataclass(frozen=True)
class Zone:
    name: str  # thermal_zone0, or hwmon1/temp2 when zones are missing
    type: str | None  # x86_pkg_temp, acpitz, coretemp Package id 0, ...
    temp_c: float | None
    passive_c: float | None  # lowest passive trip point (hwmon: tempN_max)
    trips: dict[str, float] = field(default_factory=dict)  # trip type -> lowest temperature of that type

    @property
    def throttling(self) -> bool | None:
        if self.temp_c is None or self.passive_c is None:
            return None
        return self.temp_c >= self.passive_c


@dataclass(frozen=True)
class CoolingDevice:
    name: str
    type: str | None  # Processor, intel_powerclamp, Fan, thermal-cpufreq-0, ...
    cur_state: int | None
    max_state: int | None


@dataclass(frozen=True)
class ThermalState:
    max_temp_c: float | None
    throttling: bool | None  # None: nothing here to tell (no zones, cooling devices or counters)
    source: str | None  # "thermal_zone", "hwmon" or None
    zones: tuple[Zone, ...] = ()
    cooling: tuple[CoolingDevice, ...] = ()
    throttle_count: int | None = None  # x86 package throttle events since boot
    throttle_events: int | None = None  # ... since the previous sample
    # Throttling that slows compute: a passive trip reached, a CPU cooling device (not a fan) engaged,
    # or the throttle counter moving. `throttling` (the contract's) also counts fans.
    cpu_throttling: bool | None = None
    stale: dict[str, float] = field(default_factory=dict)  # field -> age in s of a last good value


def parse_millidegrees(text: str) -> float | None:
    """Millidegrees Celsius to degrees; implausible values (sensor faults, garbage) are no reading."""
    value = parse_int(text)
    if value is None:
        return None
    celsius = value / 1000.0
    return celsius if -60.0 <= celsius <= 200.0 else None


def _parse_state(text: str) -> int | None:
    value = parse_int(text)
    return value if value is not None and 0 <= value < 1_000_000 else None


def _parse_count(text: str) -> int | None:
    value = parse_int(text)
    return value if value is not None and value >= 0 else None


class ThermalProbe:
    THERMAL = "class/thermal"
    HWMON = "class/hwmon"
    CPU = "devices/system/cpu"

    def __init__(self, files: KernelFiles) -> None:
        self.files = files
        self._last_count: int | None = None

    def sample(self) -> ThermalState:
        stale: dict[str, float] = {}
        names = self.files.listdir(self.THERMAL, "thermal_zone", STATIC_TTL_S)
        zones = [z for z in (self._zone(n, stale) for n in names) if z]
        source: str | None = "thermal_zone" if zones else None
        if not zones:
            zones = self._hwmon(stale)
            source = "hwmon" if zones else None
        cooling = [self._cooling(n, stale) for n in self.files.listdir(self.THERMAL, "cooling_device", STATIC_TTL_S)]
        count = self._throttle_count(stale)
        events = None
        if count is not None and self._last_count is not None:
            events = max(0, count - self._last_count)
        if count is not None:
            self._last_count = count

        temps = [z.temp_c for z in zones if z.temp_c is not None]
        compute: list[bool] = [z.throttling for z in zones if z.throttling is not None]
        compute += [c.cur_state > 0 for c in cooling if c.cur_state is not None and not _is_fan(c)]
        if events is not None:
            compute.append(events > 0)
        signals = compute + [c.cur_state > 0 for c in cooling if c.cur_state is not None and _is_fan(c)]
        return ThermalState(
            max_temp_c=max(temps) if temps else None,
            throttling=any(signals) if signals else None,
            cpu_throttling=any(compute) if compute else None,
            source=source,
            zones=tuple(zones),
            cooling=tuple(cooling),
            throttle_count=count,
            throttle_events=events,
            stale=stale,
        )

    def _zone(self, name: str, stale: dict[str, float]) -> Zone | None:
        base = f"{self.THERMAL}/{name}"
        mode = self.files.read_word(f"{base}/mode", STATIC_TTL_S).value
        if mode == "disabled":
            return None
        trips: dict[str, float] = {}
        for entry in self.files.listdir(base, "trip_point_", STATIC_TTL_S):
            if not entry.endswith("_type"):
                continue
            stem = entry[: -len("_type")]
            kind = self.files.read_word(f"{base}/{entry}", STATIC_TTL_S).value
            at = self.files.read(f"{base}/{stem}_temp", parse_millidegrees, STATIC_TTL_S).value
            # A trip point at or below 0 C is a disabled one on many firmwares.
            if kind and at is not None and at > 0 and (kind not in trips or at < trips[kind]):
                trips[kind] = at
        temp = _note(self.files.read(f"{base}/temp", parse_millidegrees), f"thermal.zones.{name}.temp_c", stale)
        return Zone(
            name=name,
            type=self.files.read_word(f"{base}/type", STATIC_TTL_S).value,
            temp_c=temp,
            passive_c=trips.get("passive"),
            trips=trips,
        )

    def _cooling(self, name: str, stale: dict[str, float]) -> CoolingDevice:
        base = f"{self.THERMAL}/{name}"
        cur = _note(self.files.read(f"{base}/cur_state", _parse_state), f"thermal.cooling.{name}.cur_state", stale)
        return CoolingDevice(
            name=name,
            type=self.files.read_word(f"{base}/type", STATIC_TTL_S).value,
            cur_state=cur,
            max_state=self.files.read(f"{base}/max_state", _parse_state, STATIC_TTL_S).value,
        )

    def _hwmon(self, stale: dict[str, float]) -> list[Zone]:
        zones = []
        for hw in self.files.listdir(self.HWMON, "hwmon", STATIC_TTL_S):
            base = f"{self.HWMON}/{hw}"
            chip = self.files.read_word(f"{base}/name", STATIC_TTL_S).value
            for entry in self.files.listdir(base, "temp", STATIC_TTL_S):
                if not entry.endswith("_input"):
                    continue
                stem = entry[: -len("_input")]
                label = self.files.read_word(f"{base}/{stem}_label", STATIC_TTL_S).value
                high = self.files.read(f"{base}/{stem}_max", parse_millidegrees, STATIC_TTL_S).value
                crit = self.files.read(f"{base}/{stem}_crit", parse_millidegrees, STATIC_TTL_S).value
                name = f"{hw}/{stem}"
                temp = _note(self.files.read(f"{base}/{entry}", parse_millidegrees), f"thermal.zones.{name}.temp_c",
                             stale)
                trips = {k: v for k, v in (("passive", high), ("critical", crit)) if v is not None and v > 0}
                kind = " ".join(p for p in (chip, label) if p) or None
                zones.append(Zone(name=name, type=kind, temp_c=temp, passive_c=trips.get("passive"), trips=trips))
        return zones

    def _throttle_count(self, stale: dict[str, float]) -> int | None:
        """Sum of x86 package throttle counters, one per physical package."""
        seen_packages: set[int] = set()
        total: int | None = None
        for cpu in self.files.listdir(self.CPU, "cpu", STATIC_TTL_S):
            if not cpu[3:].isdigit():
                continue
            counter = f"{self.CPU}/{cpu}/thermal_throttle/package_throttle_count"
            package = self.files.read_int(f"{self.CPU}/{cpu}/topology/physical_package_id", STATIC_TTL_S).value
            if package in seen_packages:
                continue
            if not self.files.exists(counter):
                if package is None:
                    break  # no topology and no counter: not an x86 machine with counters
                seen_packages.add(package)
                continue
            seen_packages.add(package if package is not None else -1)
            value = _note(self.files.read(counter, _parse_count), f"thermal.throttle_count.{cpu}", stale)
            if value is not None:
                total = (total or 0) + value
            if package is None:
                break  # without topology, count the first CPU's package only
        return total



def _is_fan(device: CoolingDevice) -> bool:
    """A fan cools without slowing anything down (ACPI `Fan`, `acpi_fan`, hwmon-backed `pwm-fan`, ...)."""
    return device.type is not None and "fan" in device.type.lower()
