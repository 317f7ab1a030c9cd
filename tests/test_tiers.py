import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitors.pricing.tiers import TIER_NAMES, bound_ms, meets, rank, tier_for


@pytest.mark.parametrize("ms,tier", [
    (0.0, "excellent"), (15.999, "excellent"), (16.0, "good"), (99.9, "good"), (100.0, "fair"),
    (999.0, "fair"), (1000.0, "moderate"), (9999.0, "moderate"), (10_000.0, "slow"), (29_999.0, "slow"),
    (30_000.0, "very-slow"), (59_999.0, "very-slow"), (60_000.0, "poor"), (math.inf, "poor"),
])
def test_contract_tier_bounds(ms, tier):
    assert tier_for(ms) == tier


def test_meets_is_required_tier_or_better():
    assert meets("excellent", "good") and meets("good", "good")
    assert not meets("fair", "good")
    assert all(meets(t, "poor") for t in TIER_NAMES)


@given(st.floats(min_value=0, max_value=1e7), st.floats(min_value=0, max_value=1e7))
def test_tiers_are_monotone_in_latency(a, b):
    lo, hi = sorted((a, b))
    assert rank(tier_for(lo)) <= rank(tier_for(hi))
    assert lo < bound_ms(tier_for(lo))


def test_bad_tier_and_latency_are_rejected():
    with pytest.raises(ValueError, match="unknown tier"):
        rank("great")
    with pytest.raises(ValueError):
        tier_for(float("nan"))
    with pytest.raises(ValueError):
        tier_for(-1.0)
