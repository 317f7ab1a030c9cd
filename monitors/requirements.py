"""What an app requires of one workload: a tier, a frame rate, a deadline.

A tier bounds each run (`excellent`: under 16 ms). A frame rate of r Hz means each run within 1000 / r ms
*and* the device able to sustain r runs a second beside everything else that runs (the utilisation fits:
monitors/table.py); an explicit deadline bounds each run more tightly than the period. Answers stay
booleans: the requirement comes from the app, and nothing about the device leaves with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from monitors.errors import BadInput
from monitors.pricing.tiers import TIER_NAMES, bound_ms

MIN_RATE_HZ, MAX_RATE_HZ = 1e-3, 10_000.0
MIN_DEADLINE_MS, MAX_DEADLINE_MS = 0.01, 3_600_000.0


@dataclass(frozen=True)
class Requirement:
    tier: str | None = None
    rate_hz: float | None = None
    deadline: float | None = None  # ms

    @property
    def deadline_ms(self) -> float:
        """The bound on one run: the explicit deadline, else the period of the rate, else the tier's bound."""
        if self.deadline is not None:
            return self.deadline
        if self.rate_hz is not None:
            return 1000.0 / self.rate_hz
        assert self.tier is not None
        return bound_ms(self.tier)

    @property
    def sustained_hz(self) -> float:
        """Runs a second it must sustain beside the others (0: none)."""
        return self.rate_hz or 0.0

    def to_json(self) -> dict[str, Any]:
        """The request's (and the retained state's) fields for it."""
        if self.tier is not None:
            return {"requiredTier": self.tier}
        out: dict[str, Any] = {}
        if self.rate_hz is not None:
            out["requiredRate"] = self.rate_hz
        if self.deadline is not None:
            out["requiredDeadlineMs"] = self.deadline
        return out

    @classmethod
    def parse(cls, doc: dict[str, Any], where: str = "") -> Requirement:
        """From a request object: `requiredTier`, or `requiredRate` (Hz) and/or `requiredDeadlineMs`."""
        tier = doc.get("requiredTier")
        rate = doc.get("requiredRate")
        deadline = doc.get("requiredDeadlineMs")
        if tier is not None:
            if rate is not None or deadline is not None:
                raise BadInput(f"{where}requiredTier goes alone, without requiredRate or requiredDeadlineMs",
                               "bad_requirement")
            if tier not in TIER_NAMES:
                raise BadInput(f"{where}requiredTier must be one of {', '.join(TIER_NAMES)}, not {_short(tier)}",
                               "bad_tier")
            return cls(tier=tier)
        if rate is None and deadline is None:
            raise BadInput(f"{where}requiredTier (or requiredRate, requiredDeadlineMs) is missing", "bad_tier")
        return cls(rate_hz=_number(rate, f"{where}requiredRate", MIN_RATE_HZ, MAX_RATE_HZ),
                   deadline=_number(deadline, f"{where}requiredDeadlineMs", MIN_DEADLINE_MS, MAX_DEADLINE_MS))

    def describe(self) -> str:
        if self.tier is not None:
            return self.tier
        parts = [f"{self.rate_hz:g} Hz"] if self.rate_hz is not None else []
        if self.deadline is not None:
            parts.append(f"{self.deadline:g} ms")
        return " within ".join(parts)


def finite_number(value: Any) -> bool:
    """A JSON number that is a finite float: not a bool, and not an integer too large for a float (a 401-digit
    one would raise OverflowError in any float arithmetic, and must be a bad request, not an internal error)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _number(value: Any, name: str, lo: float, hi: float) -> float | None:
    if value is None:
        return None
    if not finite_number(value) or not lo <= value <= hi:
        raise BadInput(f"{name} must be a number from {lo:g} to {hi:g}, not {_short(value)}", "bad_requirement")
    return float(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
