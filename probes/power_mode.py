"""Power mode probe: ACPI platform profile, power-profiles-daemon, cpufreq governor and EPP.

power-profiles-daemon lives on the system D-Bus. We ask it through `busctl`
(or `gdbus`) in a background thread at most every `ppd_interval_s`, and
hand out the cached answer: a tick never waits for D-Bus. Where neither the
daemon nor the tools exist, that is a normal state, not an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

from probes.sysfs import STATIC_TTL_S, KernelFiles, parse_word, take

GOVERNOR_TTL_S = 5.0
SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"

# (bus name, object path, interface): the current name, then the old one (ppd < 0.20).
PPD_NAMES = (
    ("org.freedesktop.UPower.PowerProfiles", "/org/freedesktop/UPower/PowerProfiles",
     "org.freedesktop.UPower.PowerProfiles"),
    ("net.hadess.PowerProfiles", "/net/hadess/PowerProfiles", "net.hadess.PowerProfiles"),
)


@dataclass(frozen=True)
class PowerModeState:
    power_mode: str | None  # platform profile, else ppd's active profile, else None
    platform_profile: str | None
    platform_profile_choices: tuple[str, ...] = ()
    ppd_profile: str | None = None
    ppd_degraded: str | None = None  # ppd's PerformanceDegraded reason ("" = not degraded)
    governor: str | None = None  # cpufreq scaling_governor of the first policy
    epp: str | None = None  # energy_performance_preference of the first policy
    stale: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PpdAnswer:
    active_profile: str | None
    degraded: str | None


def _ppd_property_busctl(busctl: str, names: tuple[str, str, str], prop: str, timeout: float) -> str | None:
    bus, path, iface = names
    out = subprocess.run(
        [busctl, "--system", "get-property", bus, path, iface, prop],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    # prints: s "balanced"
    text = out.stdout.strip()
    if out.returncode != 0 or not text.startswith("s "):
        return None
    return text[2:].strip().strip('"')


def _ppd_property_gdbus(gdbus: str, names: tuple[str, str, str], prop: str, timeout: float) -> str | None:
    bus, path, iface = names
    out = subprocess.run(
        [gdbus, "call", "--system", "--dest", bus, "--object-path", path,
         "--method", "org.freedesktop.DBus.Properties.Get", iface, prop],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    # prints: (<'balanced'>,)
    text = out.stdout.strip()
    if out.returncode != 0 or not text.startswith("(<'"):
        return None
    return text[3:].split("'", 1)[0]


def query_ppd(timeout: float = 2.0) -> PpdAnswer | None:
    """Ask power-profiles-daemon over the system bus; None when it is not there."""
    if not os.path.exists(SYSTEM_BUS_SOCKET):
        return None
    busctl, gdbus = shutil.which("busctl"), shutil.which("gdbus")
    if busctl:
        ask = lambda names, prop: _ppd_property_busctl(busctl, names, prop, timeout)  # noqa: E731
    elif gdbus:
        ask = lambda names, prop: _ppd_property_gdbus(gdbus, names, prop, timeout)  # noqa: E731
    else:
        return None
    for names in PPD_NAMES:
        try:
            profile = ask(names, "ActiveProfile")
            if profile is None:
                continue
            return PpdAnswer(parse_word(profile), ask(names, "PerformanceDegraded"))
        except (OSError, subprocess.SubprocessError):
            return None
    return None


class PpdWatcher:
    """Cached power-profiles-daemon answer, refreshed in a background thread."""

    def __init__(self, interval_s: float = 30.0, query=query_ppd, clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self._query = query
        self._clock = clock
        self._lock = threading.Lock()
        self._answer: PpdAnswer | None = None
        self._asked_at: float | None = None
        self._thread: threading.Thread | None = None

    def current(self) -> PpdAnswer | None:
        """The latest answer; starts a refresh in the background when it is due."""
        with self._lock:
            due = self._asked_at is None or self._clock() - self._asked_at >= self.interval_s
            running = self._thread is not None and self._thread.is_alive()
            if due and not running:
                self._asked_at = self._clock()
                self._thread = threading.Thread(target=self._refresh, name="ppd-query", daemon=True)
                self._thread.start()
            return self._answer

    def wait(self, timeout: float) -> PpdAnswer | None:
        """For one-shot use (the CLI): ask now and wait up to `timeout` s for the answer."""
        self.current()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self._answer

    def _refresh(self) -> None:
        try:
            answer = self._query()
        except Exception:  # noqa: BLE001 - an injected query (gdbus by default): a broken bus must not stop the sampler
            answer = None
        with self._lock:
            self._answer = answer


class PowerModeProbe:
    PROFILE = "firmware/acpi/platform_profile"
    CPUFREQ = "devices/system/cpu/cpufreq"

    def __init__(self, files: KernelFiles, ppd: PpdWatcher | None = None) -> None:
        self.files = files
        self.ppd = ppd

    def sample(self) -> PowerModeState:
        stale: dict[str, float] = {}
        profile = take(self.files.read_word(self.PROFILE), "power.platform_profile", stale)
        choices_text = self.files.read(f"{self.PROFILE}_choices", lambda t: t.split() or None, STATIC_TTL_S).value
        choices = tuple(w for w in (choices_text or ()) if w.isprintable() and len(w) <= 64)
        if profile is not None and choices and profile not in choices:
            profile = None  # garbage: a profile the firmware does not offer
        answer = self.ppd.current() if self.ppd is not None else None
        policy = next(iter(self.files.listdir(self.CPUFREQ, "policy", STATIC_TTL_S)), None)
        governor = epp = None
        if policy is not None:
            base = f"{self.CPUFREQ}/{policy}"
            governor = take(self.files.read_word(f"{base}/scaling_governor", GOVERNOR_TTL_S), "power.governor", stale)
            epp = take(self.files.read_word(f"{base}/energy_performance_preference", GOVERNOR_TTL_S), "power.epp",
                       stale)
        ppd_profile = answer.active_profile if answer else None
        return PowerModeState(
            power_mode=profile if profile is not None else ppd_profile,
            platform_profile=profile,
            platform_profile_choices=choices,
            ppd_profile=ppd_profile,
            ppd_degraded=answer.degraded if answer else None,
            governor=governor,
            epp=epp,
            stale=stale,
        )
