"""DAOP performance tiers: the only measure of speed that leaves the device."""

from __future__ import annotations

import math

# (name, upper bound in milliseconds, exclusive); the last tier has no bound.
TIERS: tuple[tuple[str, float], ...] = (
    ("excellent", 16.0),
    ("good", 100.0),
    ("fair", 1_000.0),
    ("moderate", 10_000.0),
    ("slow", 30_000.0),
    ("very-slow", 60_000.0),
    ("poor", math.inf),
)
TIER_NAMES: tuple[str, ...] = tuple(name for name, _ in TIERS)
_RANK = {name: i for i, name in enumerate(TIER_NAMES)}


def tier_for(latency_ms: float) -> str:
    """The tier of one inference taking `latency_ms`."""
    if math.isnan(latency_ms) or latency_ms < 0:
        raise ValueError(f"latency must be a non-negative number, got {latency_ms}")
    for name, bound in TIERS:
        if latency_ms < bound:
            return name
    return TIER_NAMES[-1]


def rank(tier: str) -> int:
    """0 for the best tier; raises ValueError for an unknown name."""
    try:
        return _RANK[tier]
    except KeyError:
        raise ValueError(f"unknown tier {tier!r}; expected one of {', '.join(TIER_NAMES)}") from None


def bound_ms(tier: str) -> float:
    """The exclusive upper latency bound of `tier` (inf for the last)."""
    return TIERS[rank(tier)][1]


def meets(tier: str, required: str) -> bool:
    """meetsRequirement: true when `tier` is `required` or better."""
    return rank(tier) <= rank(required)
