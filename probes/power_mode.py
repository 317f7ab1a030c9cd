"""Power mode probe: ACPI platform profile, power-profiles-daemon, cpufreq governor and EPP.

power-profiles-daemon's answer is kept current apart (probes/power_profiles.py: followed over D-Bus, else
polled): a sample never waits for D-Bus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from probes.power_profiles import PpdAnswer
from probes.sysfs import STATIC_TTL_S, KernelFiles, take

GOVERNOR_TTL_S = 5.0


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


class PpdSource(Protocol):
    """power-profiles-daemon's latest answer, never waiting (probes/power_profiles.py)."""

    def current(self) -> PpdAnswer | None: ...


class PowerModeProbe:
    PROFILE = "firmware/acpi/platform_profile"
    CPUFREQ = "devices/system/cpu/cpufreq"

    def __init__(self, files: KernelFiles, ppd: PpdSource | None = None) -> None:
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
