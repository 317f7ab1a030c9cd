"""Benchmark: re-evaluating 10,000 monitors per tick (target: at most 10 ms per tick).

    .venv/bin/python -m bench.monitor_eval [--monitors 10000] [--ticks 500]

Monitors get random calibrated latencies (0.5 ms to 20 s), required tiers and
devices; each tick draws a new CPU and GPU slow-down factor around 1.5x so a
share of the monitors sit near their boundaries and flip. Prints the time per
tick (median, p95, max) and the number of changes, plus the time of one tick
in which every monitor flips (the worst case: 10,000 events).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from monitors.pricing.tiers import TIER_NAMES, bound_ms
from monitors.speed.present import Speed
from monitors.table import Member, MonitorRules, MonitorTable


def build(n: int, rng: np.random.Generator) -> MonitorTable:
    table = MonitorTable(MonitorRules(margin=0.1, dwell_s=2.0, max_events_per_minute=6), capacity=n)
    base = np.exp(rng.uniform(np.log(0.5), np.log(20_000), n))
    tiers = rng.integers(0, len(TIER_NAMES), n)
    for i in range(n):
        tier = TIER_NAMES[tiers[i]]
        member = Member(float(base[i]), "gpu" if i % 10 == 0 else "cpu", bound_ms(tier),
                        memory_bytes=int(rng.integers(1, 8)) << 30)
        table.add(f"m{i}", [member], bool(base[i] < bound_ms(tier)), 0)
    return table


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--monitors", type=int, default=10_000)
    ap.add_argument("--ticks", type=int, default=500)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    table = build(args.monitors, rng)
    times, changes = [], 0
    now = 0.0
    for _ in range(args.ticks):
        now += 0.5
        speed = Speed(cpu=rng.uniform(1.0, 2.5), gpu=rng.uniform(1.0, 3.0), gpu_free_bytes=4 << 30)
        start = time.perf_counter()
        changed = table.evaluate(now, speed, veto=False)
        times.append((time.perf_counter() - start) * 1000)
        changes += len(changed)
    # worst case: a policy veto flips every monitor that meets its requirement at once
    everyone = build(args.monitors, np.random.default_rng(1))
    start = time.perf_counter()
    flipped = everyone.evaluate(1000.0, Speed(gpu=1.0), veto=True)
    worst = (time.perf_counter() - start) * 1000
    print(f"monitors: {args.monitors}, ticks: {args.ticks}, changes: {changes} "
          f"({changes / args.ticks:.0f} per tick on average)")
    print(f"per tick: median {statistics.median(times):.3f} ms, p95 {percentile(times, 0.95):.3f} ms, "
          f"max {max(times):.3f} ms (target <= 10 ms)")
    print(f"one tick in which {len(flipped)} monitors flip (policy veto): {worst:.3f} ms")


if __name__ == "__main__":
    main()
