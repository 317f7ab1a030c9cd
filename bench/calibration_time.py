"""Where does a calibration's time go? One calibration, timed by phase.

Each compute and memory-bound family's grid (its sessions: points built, the session made, its runs, the
profile read), the memory probes (their sessions made once, their readings in each pass, the pause before
each), the warm refreshes, and what is left (the second looks at disturbed points, the tables). Nothing is
saved: the state dir's calibration is not touched.

    .venv/bin/python -m bench.calibration_time [--quick]
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import probes.microbench as microbench

PROBES = ("stream_buffer", "measure_memory", "chain_times")
PROBE_CLASSES = ("QuantizedReads", "FloatReads", "AttentionChains")


def _timed(spent: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start
    return wrapper


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a quick calibration (one pass)")
    args = ap.parse_args(argv)
    parts: dict[str, float] = collections.defaultdict(float)  # of the probes' share of each pass
    for name in PROBES:
        setattr(microbench, name, _timed(parts, name, getattr(microbench, name)))
    for cls_name in PROBE_CLASSES:
        cls = getattr(microbench, cls_name)
        cls.__init__ = _timed(parts, f"{cls_name} (made)", cls.__init__)
        cls.measure = _timed(parts, f"{cls_name} (read)", cls.measure)
    settled = microbench._settled

    def counted_settle(measure: Callable[[], Any]) -> Any:
        parts["settling pauses"] += microbench.SETTLE_S
        return settled(measure)

    microbench._settled = counted_settle
    phases: dict[str, float] = collections.defaultdict(float)
    last = [time.perf_counter()]
    measure_refresh = microbench.refresh.measure

    def refresh(stream: bool = False) -> dict[str, float]:
        start = time.perf_counter()
        try:
            return measure_refresh(stream)
        finally:
            spent = time.perf_counter() - start
            phases["warm refreshes"] += spent
            last[0] += spent  # not part of the grid or pass it falls in

    microbench.refresh.measure = refresh

    def progress(family: str, done: int, total: int) -> None:
        # after each batch of a family's points, and once a pass after the probes ("overhead")
        now = time.perf_counter()
        phase = "memory probes, their sessions and pauses" if family == "overhead" else f"grid {family}"
        phases[phase] += now - last[0]
        last[0] = now

    start = time.perf_counter()
    cal = microbench.calibrate(quick=args.quick, progress=progress)
    total = time.perf_counter() - start
    points = sum(len(t.points) for t in cal.tables.values())
    print(f"{'quick' if args.quick else 'full'} calibration: {total:.1f} s, {points} points")
    for name, s in sorted(phases.items(), key=lambda kv: -kv[1]):
        print(f"  {name:48s} {s:6.2f} s")
        if name.startswith("memory probes"):
            for part, t in sorted(parts.items(), key=lambda kv: -kv[1]):
                print(f"      {part:44s} {t:6.2f} s")
    print(f"  {'the rest (second looks at disturbed points, tables)':48s} {total - sum(phases.values()):6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
