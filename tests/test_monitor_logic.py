"""Pure monitor logic: hysteresis, dwell, rate cap, policy veto, vectorised evaluation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitors.pricing.tiers import bound_ms
from monitors.speed.present import Speed
from monitors.table import Change, Member, MonitorRules, MonitorTable, initial_meets


def table(rules: MonitorRules | None = None) -> MonitorTable:
    t = MonitorTable(rules or MonitorRules(margin=0.1, dwell_s=1.0, max_events_per_minute=6))
    # 'good' is < 100 ms; base 80 ms on the CPU.
    t.add("m", [Member(80.0, "cpu", bound_ms("good"))], meets=True, seq=0)
    return t


def factors(cpu: float, gpu: float | None = None, handoff: float = 0.0) -> Speed:
    return Speed(cpu=cpu, gpu=gpu, handoff_ms_per_mb=handoff)


def test_change_when_latency_crosses_the_bound_beyond_the_margin():
    t = table()
    assert t.evaluate(0.0, factors(1.30)) == []  # 104 ms: inside the band, no change
    assert t.evaluate(0.1, factors(1.40)) == [Change("m", False, 1)]  # 112 ms >= 110 ms
    assert not t.meets("m") and t.seq("m") == 1


def test_noise_around_the_boundary_does_not_flap():
    t = table(MonitorRules(margin=0.1, dwell_s=0.0, max_events_per_minute=60))
    rng = np.random.default_rng(1)
    # latency oscillates +/-8% around the 100 ms bound: never beyond the 10% band
    changes = []
    for k in range(1000):
        f = (100.0 / 80.0) * (1.0 + rng.uniform(-0.08, 0.08))
        changes += t.evaluate(k * 0.1, factors(f))
    assert changes == []


def test_hysteresis_needs_the_lower_edge_to_come_back():
    t = table(MonitorRules(margin=0.1, dwell_s=0.0))
    assert t.evaluate(0, factors(1.5))  # 120 ms -> false
    assert t.evaluate(1, factors(1.2)) == []  # 96 ms: under the bound but above 90 ms
    assert t.evaluate(2, factors(1.1)) == [Change("m", True, 2)]  # 88 ms < 90 ms


def test_dwell_holds_a_new_value_then_lets_it_go():
    t = table(MonitorRules(margin=0.1, dwell_s=1.0))
    assert t.evaluate(0.0, factors(2.0))  # false at t=0
    assert t.evaluate(0.5, factors(1.0)) == []  # would be true, but dwell
    assert t.evaluate(1.0, factors(1.0)) == [Change("m", True, 2)]


def test_first_change_after_creation_is_not_delayed_by_dwell():
    t = table(MonitorRules(margin=0.1, dwell_s=100.0))
    assert t.evaluate(0.0, factors(2.0)) == [Change("m", False, 1)]


def test_rate_cap_limits_events_per_minute():
    t = table(MonitorRules(margin=0.1, dwell_s=0.0, max_events_per_minute=3))
    changes = []
    for k in range(20):  # flips wanted every second for 20 s
        changes += t.evaluate(float(k), factors(2.0 if k % 2 == 0 else 1.0))
    assert len(changes) == 3
    # after the window has passed, changes are allowed again
    later = t.evaluate(60.0, factors(1.0 if t.meets("m") is False else 2.0))
    assert len(later) == 1
    seqs = [c.seq for c in changes + later]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_policy_veto_forces_false_without_margin_and_releases():
    t = table(MonitorRules(margin=0.5, dwell_s=0.0))
    assert t.evaluate(0.0, factors(0.1), veto=True) == [Change("m", False, 1)]
    assert t.evaluate(1.0, factors(0.1), veto=True) == []
    assert t.evaluate(2.0, factors(0.1), veto=False) == [Change("m", True, 2)]


def test_gpu_monitor_without_a_usable_gpu_does_not_meet():
    t = MonitorTable(MonitorRules(dwell_s=0.0))
    t.add("g", [Member(5.0, "gpu", bound_ms("excellent"))], meets=True, seq=3)
    assert t.evaluate(0.0, factors(1.0, gpu=None)) == [Change("g", False, 4)]
    assert t.evaluate(1.0, factors(1.0, gpu=1.0)) == [Change("g", True, 5)]


def test_handoff_extra_adds_each_cpu_monitor_s_written_mb_and_spares_the_gpu_s():
    """A host's slow phase costs a model by the bytes it writes, not by its time (monitors/speed/present.py)."""
    t = MonitorTable(MonitorRules(dwell_s=0.0))
    t.add("bytes", [Member(12.0, "cpu", bound_ms("excellent"), written_mb=60.0)], meets=True, seq=1)
    t.add("flops", [Member(12.0, "cpu", bound_ms("excellent"), written_mb=2.0)], meets=True, seq=2)
    t.add("gpu", [Member(12.0, "gpu", bound_ms("excellent"), written_mb=40.0)], meets=True, seq=3)
    # 0.1 ms per MB on the CPU; 18 ms: past 16 ms and its margin
    assert t.latencies(factors(1.0, gpu=1.0, handoff=0.1)).tolist() == pytest.approx([18.0, 12.2, 12.0])
    assert t.evaluate(0.0, factors(1.0, gpu=1.0, handoff=0.1)) == [Change("bytes", False, 4)]
    t.remove("flops")  # the swap-remove keeps each monitor's bytes with it
    assert t.latencies(factors(2.0, gpu=1.0, handoff=0.1)).tolist() == pytest.approx([30.0, 12.0])


def test_a_memory_slowdown_moves_the_monitors_that_stream_and_only_them():
    """A neighbour that takes memory bandwidth slows a decode step (its weights streamed) and not a convolution
    net priced from the cache (monitors/speed/present.py)."""
    t = MonitorTable(MonitorRules(dwell_s=0.0))
    t.add("decode", [Member(60.0, "cpu", bound_ms("good"), stream_ms=50.0)], meets=True, seq=1)
    t.add("cnn", [Member(60.0, "cpu", bound_ms("good"))], meets=True, seq=2)
    t.add("gpu", [Member(60.0, "gpu", bound_ms("good"), stream_ms=50.0)], meets=True, seq=3)  # not the CPU's memory
    assert t.streams(0.5) and not t.streams(0.9)
    slow = dataclasses.replace(factors(1.0, gpu=1.0), memory=2.2)
    assert t.latencies(slow).tolist() == pytest.approx([120.0, 60.0, 60.0])  # past 100 ms and its margin
    assert t.evaluate(0.0, slow) == [Change("decode", False, 4)]
    t.remove("decode")  # the swap-remove keeps each member's stream time with it
    assert not t.streams(0.01)
    t.set_base("cnn", [60.0], [30.0])  # a calibration redone: the stream time with the base
    assert t.latencies(slow).tolist() == pytest.approx([60.0, 60.0 + 1.2 * 30.0])  # the GPU member took its row


def test_a_gemm_multiplier_moves_the_monitors_whose_float_products_take_their_time():
    """Calibrated in a spell of slow float products, the host read out of it: a transformer (most of its time in
    them) is priced faster, a convolution net is not."""
    t = MonitorTable(MonitorRules(dwell_s=0.0))
    t.add("bert", [Member(110.0, "cpu", bound_ms("good"), gemm_ms=100.0)], meets=False, seq=1)
    t.add("cnn", [Member(110.0, "cpu", bound_ms("good"))], meets=False, seq=2)
    t.add("gpu", [Member(110.0, "gpu", bound_ms("good"), gemm_ms=100.0)], meets=False, seq=3)  # no probe reads it
    faster = dataclasses.replace(factors(1.0, gpu=1.0), gemm=0.75)
    assert t.latencies(faster).tolist() == pytest.approx([85.0, 110.0, 110.0])
    assert t.evaluate(0.0, faster) == [Change("bert", True, 4)]
    t.remove("bert")  # the swap-remove keeps each member's gemm time with it
    t.set_base("cnn", [110.0], [0.0], [40.0])  # a calibration redone: the gemm time with the base
    assert t.latencies(faster).tolist() == pytest.approx([110.0, 110.0 - 0.25 * 40.0])


def test_poor_tier_is_met_by_any_finite_latency():
    t = MonitorTable(MonitorRules(dwell_s=0.0))
    t.add("p", [Member(1e9, "cpu", bound_ms("poor"))], meets=True, seq=0)
    assert t.evaluate(0.0, factors(1e6)) == []


def test_initial_value_is_a_plain_comparison():
    assert initial_meets(99.0, 100.0) is True
    assert initial_meets(100.0, 100.0) is False
    assert initial_meets(1.0, 100.0, veto=True) is False


def test_remove_keeps_the_other_monitors_intact():
    t = MonitorTable(MonitorRules(dwell_s=0.0), capacity=2)
    for i in range(10):
        t.add(f"m{i}", [Member(10.0 * (i + 1), "cpu", 100.0)], meets=(i < 9), seq=i)
    t.remove("m0")
    t.remove("m5")
    assert sorted(t.ids) == sorted(f"m{i}" for i in range(10) if i not in (0, 5))
    assert t.seq("m9") == 9 and t.meets("m3") is True
    changes = t.evaluate(0.0, factors(2.0))  # everyone x2: m5..m9 (>= 110 ms) flip false; m9 already false
    assert sorted(c.monitor for c in changes) == ["m6", "m7", "m8"]


def test_rules_reject_nonsense():
    with pytest.raises(ValueError):
        MonitorRules(margin=1.5)
    with pytest.raises(ValueError):
        MonitorRules(dwell_s=-1)
    with pytest.raises(ValueError):
        MonitorRules(max_events_per_minute=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.05, max_value=20.0), min_size=1, max_size=80),
       st.floats(min_value=0.0, max_value=0.5), st.floats(min_value=0.0, max_value=3.0))
def test_seq_only_grows_and_events_alternate_and_respect_the_rules(series, margin, dwell):
    rules = MonitorRules(margin=margin, dwell_s=dwell, max_events_per_minute=4)
    t = table(rules)
    times: list[float] = []
    previous = (True, 0)
    for k, f in enumerate(series):
        now = k * 0.5
        for c in t.evaluate(now, factors(f)):
            assert c.meets != previous[0] and c.seq == previous[1] + 1
            previous = (c.meets, c.seq)
            if times:
                assert now - times[-1] >= dwell
            times.append(now)
    for i in range(len(times) - 4):
        assert times[i + 4] - times[i] >= 60.0
