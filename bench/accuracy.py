"""Accuracy of the estimator: its estimate against the real onnxruntime latency, over the model zoo.

For every zoo model: the estimate from the weightless graph (the calibration in
the state dir; calibrated first when there is none) and the real latency of one
inference (bench/groundtruth.py: default session, CPU, median after warm-up, in
a fresh process, cached). Error = estimate / real - 1. Column `now`: the error of
the agent's present estimate, the same priced at the speed its warm refresh read
right before the truth's runs (groundtruth.present_speed; truths measured with it).

    python -m bench.accuracy                     # whole zoo, table + summary
    python -m bench.accuracy --only 'bert|gpt'   # a subset (regex on the name)
    python -m bench.accuracy --remeasure         # ignore cached ground truth
    python -m bench.accuracy --json out.json     # also write every row
    python -m bench.accuracy --measure-only      # ground truth only, no estimator
    python -m bench.accuracy --device gpu        # on the CUDA provider (a GPU calibration in the state dir)

Ground truth must be measured on a quiet machine: other load inflates it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import onnxruntime

from agent.config import default_state_dir
from bench import groundtruth, support, zoo
from monitors.graphs.importer import load_graph
from monitors.pricing.tiers import rank, tier_for


@dataclass
class Row:
    name: str
    family: str
    kernels: int | None = None
    estimate_ms: float | None = None
    real_ms: float | None = None
    real_iqr_ms: float | None = None
    real_min_ms: float | None = None
    error: float | None = None  # estimate / real - 1
    present_ms: float | None = None  # the estimate at the speed read with the truth (the agent's answer then)
    present_error: float | None = None
    present_tier: str | None = None
    est_tier: str | None = None
    real_tier: str | None = None
    problem: str | None = None  # why an estimate or measurement is missing


def estimate(estimator: Any, path: Path, inputs: dict[str, Any], device: str = "cpu",
             probe: dict[str, float] | None = None) -> tuple[float, int, float | None]:
    """The estimator's latency (ms) on `device` at rest, its kernel count, and its latency at the speed the truth's
    warm refresh `probe` read (None without one) for the model bound to `inputs`."""

    graph = load_graph(path, inputs=inputs)
    plan = estimator.plan(graph, device)
    result = estimator.estimate(plan, device=device)
    present = None
    if probe:
        speed = groundtruth.present_speed(probe, estimator.calibrations[device].refresh_reference)
        present = estimator.estimate(plan, device=device, speed=speed).latency_ms
    return result.latency_ms, result.kernels, present


def load_estimator(state_dir: Path, device: str = "cpu") -> Any:

    return support.scored_estimator(state_dir, device)


def evaluate(model: zoo.ZooModel, estimator: Any | None, remeasure: bool, min_repeats: int,
             device: str = "cpu") -> Row:
    """One row: build the file if needed, measure (or reuse) the real latency, then estimate."""
    row = Row(model.name, model.family)
    path = model.path()
    probe = None
    try:
        real = groundtruth.measure(path, model.inputs, repeats=min_repeats, remeasure=remeasure, device=device)
        probe = real.get("probe")
        row.real_ms, row.real_iqr_ms, row.real_min_ms = real["median_ms"], real["iqr_ms"], real["min_ms"]
        row.real_tier = tier_for(row.real_ms)
    except (RuntimeError, OSError, ValueError) as exc:
        row.problem = f"measure: {exc}"
    if estimator is not None:
        try:
            row.estimate_ms, row.kernels, row.present_ms = estimate(estimator, path, model.inputs, device, probe)
            row.est_tier = tier_for(row.estimate_ms)
            row.present_tier = tier_for(row.present_ms) if row.present_ms is not None else None
        except Exception as exc:  # noqa: BLE001 - a benchmark reports every failure as a row, then goes on
            row.problem = "; ".join(filter(None, [row.problem, f"estimate: {type(exc).__name__}: {exc}"]))
    if row.estimate_ms is not None and row.real_ms:
        row.error = row.estimate_ms / row.real_ms - 1.0
    if row.present_ms is not None and row.real_ms:
        row.present_error = row.present_ms / row.real_ms - 1.0
    return row


def summarize(rows: list[Row], present: bool = False) -> dict[str, Any]:
    """Median |error|, shares within +/-10% and +/-25%, tier agreement; a missing estimate counts as a miss.
    `present`: of the estimates at the speed read with the truth, over the rows that have one."""
    measured = [r for r in rows if r.real_ms is not None]
    if present:
        measured = [replace(r, error=r.present_error, est_tier=r.present_tier) for r in measured
                    if r.present_error is not None]
    errors = [abs(r.error) for r in measured if r.error is not None]
    # --measure-only: no shares to give; otherwise a failed estimate counts as a miss
    estimator_used = any(r.estimate_ms is not None or "estimate:" in (r.problem or "") for r in rows)
    n = len(measured) if estimator_used else 0
    agree = sum(1 for r in measured if r.est_tier is not None and r.est_tier == r.real_tier)
    off_by_one = sum(1 for r in measured if r.est_tier is not None and abs(rank(r.est_tier) - rank(r.real_tier)) <= 1)
    return {
        "models": len(rows),
        "measured": len(measured),
        "estimated": len(errors),
        "median_abs_error": statistics.median(errors) if errors else None,
        "mean_abs_error": statistics.fmean(errors) if errors else None,
        "within_10": sum(e <= 0.10 for e in errors) / n if n else None,
        "within_25": sum(e <= 0.25 for e in errors) / n if n else None,
        "tier_agreement": agree / n if n else None,
        "tier_within_one": off_by_one / n if n else None,
    }


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def error_cells(error: float | None, real_ms: float | None, real_iqr_ms: float | None) -> tuple[str, str]:
    """A row's signed error and the real time's interquartile range, as printed."""
    return (f"{error:+.0%}" if error is not None else "-",
            f"{real_iqr_ms / real_ms:.0%}" if real_ms and real_iqr_ms is not None else "-")


HEADER = (f"{'model':34} {'kernels':>7} {'est ms':>9} {'real ms':>9} {'iqr %':>6} {'error':>7}  "
          f"{'est tier':9} {'real tier':9} {'now':>5}")


def format_row(r: Row) -> str:
    error, iqr = error_cells(r.error, r.real_ms, r.real_iqr_ms)
    mark = " *" if r.est_tier and r.real_tier and r.est_tier != r.real_tier else ""
    line = (f"{r.name:34} {r.kernels if r.kernels is not None else '-':>7} {ms(r.estimate_ms):>9} "
            f"{ms(r.real_ms):>9} {iqr:>6} {error:>7}  {r.est_tier or '-':9} {r.real_tier or '-':9} "
            f"{error_cells(r.present_error, None, None)[0]:>5}{mark}")
    return line + (f"  [{r.problem}]" if r.problem else "")


def format_summary(rows: list[Row]) -> str:
    s = summarize(rows)
    lines = [f"{s['models']} models, {s['measured']} measured, {s['estimated']} estimated",
             f"median |error| {pct(s['median_abs_error'])}, mean |error| {pct(s['mean_abs_error'])}",
             f"within +/-10%: {pct(s['within_10'])}, within +/-25%: {pct(s['within_25'])}",
             f"tier agreement: {pct(s['tier_agreement'])} (within one tier: {pct(s['tier_within_one'])})"]
    families = sorted({r.family for r in rows})
    for family in families:
        errs = [abs(r.error) for r in rows if r.family == family and r.error is not None]
        if errs:
            lines.append(f"  {family:13} n={len(errs):2}  median |error| {statistics.median(errs):.0%}  "
                         f"max |error| {max(errs):.0%}")
    p = summarize(rows, present=True)
    if p["estimated"]:
        lines.append(f"at the speed read with the truth (the agent's present estimate, {p['estimated']} models): "
                     f"median |error| {pct(p['median_abs_error'])}, within +/-10%: {pct(p['within_10'])}, "
                     f"within +/-25%: {pct(p['within_25'])}, tier agreement: {pct(p['tier_agreement'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Estimator accuracy over the model zoo.")
    parser.add_argument("--only", metavar="REGEX", help="only models whose name matches (re.search)")
    parser.add_argument("--remeasure", action="store_true", help="measure ground truth again, ignoring the cache")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write rows and summary as JSON")
    parser.add_argument("--state-dir", type=Path, help="calibration state dir (default: the agent's)")
    parser.add_argument("--measure-only", action="store_true", help="ground truth only; do not load the estimator")
    parser.add_argument("--device", choices=tuple(groundtruth.PROVIDERS), default="cpu",
                        help="measure and estimate on this device (gpu: onnxruntime's CUDA provider)")
    parser.add_argument("--min-repeats", type=int, default=groundtruth.MIN_REPEATS)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure the models in this many rounds over all of them, each in a fresh process, "
                             "and keep each model's quietest")
    args = parser.parse_args(argv)

    models = zoo.ZOO
    if args.only:
        try:
            pattern = re.compile(args.only)
        except re.error as exc:
            print(f"bad --only regex: {exc}", file=sys.stderr)
            return 2
        models = [m for m in models if pattern.search(m.name)]
        if not models:
            print(f"no zoo model matches {args.only!r}", file=sys.stderr)
            return 2

    start = time.perf_counter()
    build_s = zoo.build_all(models, log=lambda line: print(line, file=sys.stderr))
    estimator = None
    if not args.measure_only:

        estimator = load_estimator(args.state_dir or default_state_dir(), args.device)

    remeasure = args.remeasure
    if args.rounds > 1:  # rounds over the whole zoo, minutes apart (groundtruth.measure_spread)
        groundtruth.measure_spread([(m.path(), m.inputs) for m in models], args.rounds, args.min_repeats,
                                   remeasure=remeasure, log=lambda line: print(line, file=sys.stderr),
                                   device=args.device)
        remeasure = False
    print(HEADER)
    rows: list[Row] = []
    for model in models:
        row = evaluate(model, estimator, remeasure, args.min_repeats, args.device)
        rows.append(row)
        print(format_row(row), flush=True)
    print()
    print(format_summary(rows))
    elapsed = time.perf_counter() - start
    print(f"({elapsed:.0f} s in all, of which {build_s:.0f} s building the zoo)")

    if args.json:

        report = {"summary": summarize(rows), "rows": [asdict(r) for r in rows],
                  "onnxruntime": onnxruntime.__version__, "cpu": groundtruth.cpu_model(), "device": args.device,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
