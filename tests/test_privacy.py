"""The privacy rules on what one client is shown (monitors/privacy.py) and its request budget
(agent/ratelimit.py): pure, no broker."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.ratelimit import ClientBudgets, RateLimited
from monitors.pricing.tiers import TIER_NAMES, rank, tier_for
from monitors.privacy import BOUNDS_MS, PrivacyRules, Warp, held_speed, hold, period_of, warp_for
from monitors.speed.present import Speed

SECRET = b"k" * 32
RULES = PrivacyRules()


def test_each_moved_boundary_stays_within_the_jitter_and_they_differ():
    for client in (f"app{i}" for i in range(200)):
        warp = warp_for(SECRET, client, 7, RULES)
        for moved, bound in zip(warp.moved, BOUNDS_MS, strict=True):
            assert bound * (1 - RULES.jitter) <= moved < bound * (1 + RULES.jitter)
        assert len({round(m / b, 9) for m, b in zip(warp.moved, BOUNDS_MS, strict=True)}) > 1  # per boundary


def test_half_the_jitter_is_the_devices_so_many_client_names_do_not_average_it_out():
    def mean_offset(period: int) -> float:
        return sum(warp_for(SECRET, f"name{i}", period, RULES).moved[0] / BOUNDS_MS[0] - 1 for i in range(2000)) / 2000

    means = [mean_offset(p) for p in range(6)]
    assert all(abs(m) <= RULES.jitter / 2 + 0.01 for m in means)
    assert max(means) - min(means) > RULES.jitter / 4  # the device's half moves with the period; clients' cancel


def test_a_client_sees_the_same_boundaries_all_period_and_new_ones_the_next():
    rules = PrivacyRules(period_s=600)
    start = 1_800_000_000.0 - 1_800_000_000.0 % 600
    periods = {period_of(start + s, rules) for s in (0, 1, 299, 599.9)}
    assert len(periods) == 1
    (period,) = periods
    same = {warp_for(SECRET, "app", period, rules) for _ in range(5)}
    assert len(same) == 1
    assert warp_for(SECRET, "app", period + 1, rules) != warp_for(SECRET, "app", period, rules)
    assert period_of(start + 600, rules) == period + 1


def test_clients_see_different_boundaries_and_another_key_moves_them_all():
    firsts = {warp_for(SECRET, f"app{i}", 1, RULES).moved[0] for i in range(100)}
    assert len(firsts) == 100
    spread = (max(firsts) - min(firsts)) / BOUNDS_MS[0]
    assert spread > 0.8 * RULES.jitter  # their own halves use most of it
    assert warp_for(b"other" * 7, "app0", 1, RULES) != warp_for(SECRET, "app0", 1, RULES)


def test_the_warp_puts_a_clients_moved_boundaries_on_the_contracts():
    warp = warp_for(SECRET, "app", 3, RULES)
    for moved, bound in zip(warp.moved, BOUNDS_MS, strict=True):
        assert warp.shown_ms(moved) == pytest.approx(bound, rel=1e-9)
        assert rank(warp.tier(moved * 0.999)) == rank(warp.tier(moved * 1.001)) - 1
    assert warp.shown_ms(0.0) == 0.0 and warp.shown_ms(math.inf) == math.inf
    assert Warp().tier(15.9) == "excellent" and Warp().tier(16.0) == "good"  # no jitter: the contract's
    assert warp_for(SECRET, "app", 3, PrivacyRules(jitter=0)) == Warp()


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.text(max_size=8), st.integers(0, 10**6))
def test_the_warp_is_monotone_and_never_more_than_a_jitter_away(a, b, client, period):
    warp = warp_for(SECRET, client, period, RULES)
    lo, hi = sorted((a, b))
    assert warp.shown_ms(lo) <= warp.shown_ms(hi) * (1 + 1e-12)
    assert rank(warp.tier(lo)) <= rank(warp.tier(hi))
    if lo > 0:
        assert 1 / (1 + RULES.jitter) - 1e-9 <= warp.shown_ms(lo) / lo <= 1 / (1 - RULES.jitter) + 1e-9
    assert warp.tier(lo) in TIER_NAMES


def test_jitter_beyond_what_keeps_boundaries_in_order_is_refused():
    with pytest.raises(ValueError, match="jitter"):
        PrivacyRules(jitter=0.3)
    with pytest.raises(ValueError, match="period"):
        PrivacyRules(period_s=0)
    with pytest.raises(ValueError, match="hysteresis"):
        PrivacyRules(hysteresis=1.0)


def test_hysteresis_hides_load_changes_within_the_margin_and_follows_larger_ones():
    assert hold(None, 1.3, 0.1) == 1.3
    assert hold(1.0, 1.09, 0.1) == 1.0 and hold(1.0, 0.92, 0.1) == 1.0
    assert hold(1.0, 1.11, 0.1) == 1.11 and hold(1.0, 0.9, 0.1) == 0.9
    held = held_speed(None, Speed(cpu=1.0, gpu=2.0), 0.1)
    # a slow drift never shows until it has gone past the margin from where it was last shown
    for live in (1.02, 1.05, 1.08, 1.1):
        held = held_speed(held, Speed(cpu=live, gpu=2.05), 0.1)
        assert (held.cpu, held.gpu) == (1.0, 2.0)
    held = held_speed(held, Speed(cpu=1.2, gpu=None), 0.1)
    assert (held.cpu, held.gpu) == (1.2, None)


def test_flip_point_seen_through_held_speed_does_not_move_with_small_load_changes():
    base_ms = 15.0  # excellent at rest, near the boundary
    held = held_speed(None, Speed(cpu=1.0), 0.1)
    shown, live_tiers = set(), set()
    for live in (1.0, 1.04, 1.08, 1.06, 1.09, 1.02):
        held = held_speed(held, Speed(cpu=live), 0.1)
        shown.add(tier_for(base_ms * held.cpu))
        live_tiers.add(tier_for(base_ms * live))
    assert live_tiers == {"excellent", "good"}  # the live speed would have shown the load move
    assert shown == {"excellent"}


def test_a_clients_budget_runs_out_says_when_to_come_back_and_refills():
    budgets = ClientBudgets(burst=5, per_minute=30, max_clients=100)
    for _ in range(5):
        budgets.take("attacker", 100.0)
    with pytest.raises(RateLimited) as info:
        budgets.take("attacker", 100.0)
    assert info.value.code == "rate_limited" and info.value.retry_after_s == 2  # one token per 2 s
    budgets.take("honest", 100.0)  # others keep theirs
    budgets.take("attacker", 102.0)
    with pytest.raises(RateLimited):
        budgets.take("attacker", 102.5)
    for _ in range(5):  # a long pause refills it to the burst, no further
        budgets.take("attacker", 1000.0)
    with pytest.raises(RateLimited):
        budgets.take("attacker", 1000.0)


def test_budgets_held_stay_bounded_whatever_names_clients_use():
    budgets = ClientBudgets(burst=2, per_minute=1, max_clients=50)
    for i in range(1000):
        budgets.take(f"c{i}", float(i))
    assert len(budgets) == 50
