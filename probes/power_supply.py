"""Battery and power probe: every /sys/class/power_supply entry, by its `type`, not its name.

Batteries are not always BAT0 (CMB1, BATT, ...), adapters not always AC
(ADP1, ACAD, ucsi-source-psy-...). Peripheral batteries (a mouse, a
headset: `scope` Device) do not power this device and are ignored.

Where the kernel's power-supply uevents are heard (probes/uevents.py), the probe reads sysfs when one says
something changed and otherwise every `every_s` only: an ACPI battery's files are answered by the embedded
controller, which a read each second keeps awake.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from probes.sysfs import STATIC_TTL_S, KernelFiles, parse_int, parse_word, take

# Types of power_supply that feed the device from outside.
ADAPTER_TYPES = frozenset({"Mains", "USB", "USB_C", "USB_PD", "USB_PD_DRP", "USB_DCP", "USB_CDP", "USB_ACA", "BrickID",
                           "Wireless"})
# Battery `status` values, as the kernel spells them, to our names.
_STATUS = {"Charging": "charging", "Discharging": "discharging", "Full": "full", "Not charging": "not-charging"}


@dataclass(frozen=True)
class Battery:
    name: str
    percent: float | None
    status: str | None  # charging, discharging, full, not-charging, or None (Unknown)
    energy_now_uwh: int | None = None
    energy_full_uwh: int | None = None
    charge_now_uah: int | None = None
    charge_full_uah: int | None = None


@dataclass(frozen=True)
class Adapter:
    name: str
    type: str
    online: bool | None


@dataclass(frozen=True)
class PowerSupplyState:
    present: bool  # a system battery is present
    percent: float | None  # combined over batteries, by energy (or charge) where known
    plugged: bool | None
    charging: str | None  # combined status: charging, discharging, full, not-charging
    batteries: tuple[Battery, ...] = ()
    adapters: tuple[Adapter, ...] = ()
    stale: dict[str, float] = field(default_factory=dict)


def _parse_percent(text: str) -> float | None:
    value = parse_int(text)
    return float(value) if value is not None and 0 <= value <= 100 else None


def _parse_amount(text: str) -> int | None:
    value = parse_int(text)
    return value if value is not None and 0 <= value < 10**12 else None


def _parse_bool(text: str) -> bool | None:
    value = parse_int(text)
    return {0: False, 1: True}.get(value) if value is not None else None


def _parse_status(text: str) -> str | None:
    word = parse_word(text)
    return _STATUS.get(word, "unknown") if word is not None else None


class PowerSupplyProbe:
    """`every_s`: how long a reading stands unless `sample(changed=True)` (0: read at every sample)."""

    BASE = "class/power_supply"

    def __init__(self, files: KernelFiles, every_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.files = files
        self.every_s = every_s
        self.clock = clock
        self._last: tuple[float, PowerSupplyState] | None = None

    def sample(self, changed: bool = False) -> PowerSupplyState:
        """The power supplies now: read again when `changed` (a uevent said so) or the last reading is
        `every_s` old, else the last reading."""
        now = self.clock()
        if not changed and self._last is not None and now - self._last[0] < self.every_s:
            return self._last[1]
        state = self._read()
        self._last = (now, state)
        return state

    def _read(self) -> PowerSupplyState:
        stale: dict[str, float] = {}
        batteries: list[Battery] = []
        adapters: list[Adapter] = []
        for name in self.files.listdir(self.BASE):
            base = f"{self.BASE}/{name}"
            kind = self.files.read_word(f"{base}/type", STATIC_TTL_S).value
            if kind is None:
                continue
            if self.files.read_word(f"{base}/scope", STATIC_TTL_S).value == "Device":
                continue  # a peripheral's battery: it does not power this device
            if kind == "Battery":
                battery = self._battery(name, stale)
                if battery is not None:
                    batteries.append(battery)
            elif kind in ADAPTER_TYPES:
                online = take(self.files.read(f"{base}/online", _parse_bool), f"battery.adapters.{name}.online", stale)
                adapters.append(Adapter(name=name, type=kind, online=online))
        return PowerSupplyState(
            present=bool(batteries),
            percent=combined_percent(batteries),
            plugged=_plugged(batteries, adapters),
            charging=_combined_status(batteries),
            batteries=tuple(batteries),
            adapters=tuple(adapters),
            stale=stale,
        )

    def _battery(self, name: str, stale: dict[str, float]) -> Battery | None:
        base = f"{self.BASE}/{name}"
        if self.files.read(f"{base}/present", _parse_bool).value is False:
            return None  # an empty battery bay
        key = f"battery.batteries.{name}"

        def amount(attr: str) -> int | None:
            return take(self.files.read(f"{base}/{attr}", _parse_amount), f"{key}.{attr}", stale)

        status = take(self.files.read(f"{base}/status", _parse_status), f"{key}.status", stale)
        return Battery(
            name=name,
            percent=take(self.files.read(f"{base}/capacity", _parse_percent), f"{key}.percent", stale),
            status=None if status == "unknown" else status,
            energy_now_uwh=amount("energy_now"),
            energy_full_uwh=amount("energy_full"),
            charge_now_uah=amount("charge_now"),
            charge_full_uah=amount("charge_full"),
        )


def combined_percent(batteries: list[Battery]) -> float | None:
    """Charge left over all batteries: by energy where all report it, else by charge, else the mean capacity."""
    if not batteries:
        return None
    for now_attr, full_attr in (("energy_now_uwh", "energy_full_uwh"), ("charge_now_uah", "charge_full_uah")):
        pairs = [(getattr(b, now_attr), getattr(b, full_attr)) for b in batteries]
        if all(now is not None and full for now, full in pairs):
            total_full = sum(full for _, full in pairs)
            return round(min(100.0, 100.0 * sum(now for now, _ in pairs) / total_full), 1)
    known = [b.percent for b in batteries if b.percent is not None]
    return round(sum(known) / len(known), 1) if known else None


def _combined_status(batteries: list[Battery]) -> str | None:
    states = {b.status for b in batteries if b.status is not None}
    for status in ("charging", "discharging", "not-charging"):
        if status in states:
            return status
    return "full" if states == {"full"} else None


def _plugged(batteries: list[Battery], adapters: list[Adapter]) -> bool | None:
    """On external power: an adapter says so; else the batteries' status; a device without a battery is plugged."""
    online = [a.online for a in adapters if a.online is not None]
    if online:
        return any(online)
    if not batteries:
        return None if adapters else True
    status = _combined_status(batteries)
    if status == "discharging":
        return False
    if status in ("charging", "full", "not-charging"):
        return True
    return None
