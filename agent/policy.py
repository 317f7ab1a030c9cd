"""The user's policy: when must nothing run locally, whatever the estimate says.

Its verdict makes every `meetsRequirement` false (apps then offload); the
cause is only logged on the device, never published. The battery floor has its
own hysteresis so a battery hovering at the floor does not flap.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.config import Policy


@dataclass(frozen=True)
class PowerFacts:
    """What the policy looks at, taken from the device state; None when unknown."""

    battery_percent: float | None
    on_battery: bool | None  # discharging / adapter offline
    power_mode: str | None


class PolicyGate:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._battery_low = False
        self.vetoed: str | None = None  # the latest verdict (veto), what requests are answered under

    def veto(self, facts: PowerFacts) -> str | None:
        """The reason local inference is vetoed now, or None (kept as `vetoed`)."""
        p = self.policy
        reasons: list[str] = []
        if p.battery_floor_percent is not None:
            pct = facts.battery_percent
            if facts.on_battery and pct is not None:
                if self._battery_low:
                    self._battery_low = pct < p.battery_floor_percent + p.battery_release_percent
                else:
                    self._battery_low = pct < p.battery_floor_percent
            else:
                self._battery_low = False  # plugged in (or no battery): the floor does not apply
            if self._battery_low:
                reasons.append(f"on battery at {pct:.0f}% (floor {p.battery_floor_percent:.0f}%)")
        if p.power_saver and facts.power_mode is not None and facts.power_mode in p.power_saver_profiles:
            reasons.append(f"power profile '{facts.power_mode}'")
        self.vetoed = "; ".join(reasons) or None
        return self.vetoed
