"""How a shared host's slow phase slows each model: by its activation bytes, not in proportion to its time.

On some virtual machines onnxruntime's default session runs at two speeds
with nothing else running, switching every few seconds
(docs/device-state.md, "Current figures"). This benchmark times every model
in short windows, one after the other, for `--seconds`; splits the windows
into the fast phase and the slow one by how much slower than its fastest
window each model ran in it (geometric mean over the models); and prints,
per model, the extra time in the slow phase against the bytes its kernels
write (the cost model's plan; `Plan.written_mb`).

If the extra time per MB written is about the same for every model while
the ratio slow/fast is not, the slow phase adds time per activation byte
(handing data between the intra-op threads' cores), and no single
multiplier can describe it: that is the finding this script reproduces.
The last columns say how well each view fits: the extra predicted as the
median ms per MB times the model's bytes, against the median ratio times
its fast-phase latency.

Each window also takes one warm refresh (probes/refresh.py) as the agent
does, and the end of the output scores, over every window and model, the
estimate the agent makes from it: each model's fastest window (its
calibrated latency) x the refresh's slowdown, blended with the prediction
of no slowdown as the agent blends them where nothing contends, + its MB x
the refresh's handoff extra; against the slowdown taken whole (with and
without the extra) and no correction at all.

    python -m bench.slow_phase --state-dir DIR             # 12 models, 300 s
    python -m bench.slow_phase --models squeezenet,shufflenet --seconds 60

A machine without phases prints that it found none.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from bench import zoo
from bench.groundtruth import _feeds, _plain_inputs
from monitors.graphs.importer import load_graph
from monitors.pricing.estimator import Estimator
from monitors.speed.present import blend
from probes.refresh import HANDOFF_KEY, LOCKSTEP_KEY, WarmRefresh, handoff_ms_per_mb, slowdown

DEFAULT_MODELS = ("squeezenet", "mobilenetv2-b1-224x224", "mobilenetv2-w0.5-b1-224x224", "resnet18-b1-224x224",
                  "bert-mini-b1-s128", "bert-tiny-b1-s128", "mlp-1024x4-b32", "efficientnet-b0-b1-224x224",
                  "shufflenet", "deeplab-lite-b1-256x144", "unet-b1-256x144", "vit-tiny-b1")
# A window is fast when the models ran at most FAST_BELOW times their fastest window (geometric mean), slow
# from SLOW_ABOVE; windows between the two straddle a switch of phase and are left out.
FAST_BELOW = 1.15
SLOW_ABOVE = 1.35


@dataclass
class PhaseRow:
    model: str
    mbytes: float  # MB written per inference
    fast_ms: float
    slow_ms: float

    @property
    def extra_ms_per_mb(self) -> float:
        return (self.slow_ms - self.fast_ms) / self.mbytes if self.mbytes else math.nan


def split_phases(windows: list[dict[str, float]]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The fast and the slow windows, by each window's geometric-mean ratio to every model's fastest."""
    if not windows:
        return [], []
    fastest = {m: min(w[m] for w in windows) for m in windows[0]}
    fast, slow = [], []
    for w in windows:
        ratio = math.exp(statistics.fmean(math.log(w[m] / fastest[m]) for m in w))
        if ratio <= FAST_BELOW:
            fast.append(w)
        elif ratio >= SLOW_ABOVE:
            slow.append(w)
    return fast, slow


def phase_rows(windows: list[dict[str, float]], mbytes: dict[str, float]) -> list[PhaseRow]:
    """Per model, the median latency in each phase; empty when either phase has no window."""
    fast, slow = split_phases(windows)
    if not fast or not slow:
        return []
    return [PhaseRow(m, mbytes[m], statistics.median(w[m] for w in fast), statistics.median(w[m] for w in slow))
            for m in mbytes]


def refresh_views(windows: list[dict[str, float]], mbytes: dict[str, float],
                  readings: list[dict[str, float]]) -> dict[str, list[float]]:
    """Each view's relative errors over every window and model, from each window's warm refresh reading
    (reference: each probe's fastest reading, as a calibration keeps; a model's calibrated latency: its
    fastest window).

    "the agent" is what the agent estimates on a device where no signal predicts a slowdown: the reading's
    slowdown blended with the prediction of 1.0 (monitors/speed/present.py: blend), plus the handoff extra."""

    reference = {key: min(r[key] for r in readings) for key in (LOCKSTEP_KEY, HANDOFF_KEY)}
    fastest = {m: min(w[m] for w in windows) for m in mbytes}
    views: dict[str, list[float]] = {"the agent (blend + extra)": [], "slowdown + handoff extra": [],
                                     "slowdown alone": [], "no correction": []}
    for window, reading in zip(windows, readings, strict=True):
        ratio, extra = slowdown(reading, reference) or 1.0, handoff_ms_per_mb(reading, reference) or 0.0
        blended = blend(1.0, ratio)
        for m, mb in mbytes.items():
            real = window[m]
            views["the agent (blend + extra)"].append((fastest[m] * blended + mb * extra) / real - 1)
            views["slowdown + handoff extra"].append((fastest[m] * ratio + mb * extra) / real - 1)
            views["slowdown alone"].append(fastest[m] * ratio / real - 1)
            views["no correction"].append(fastest[m] / real - 1)
    return views


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long to sample, in all")
    parser.add_argument("--window", type=float, default=0.25, help="seconds each model is timed per window")
    parser.add_argument("--state-dir", type=Path, required=True, help="a calibration (for the plans' bytes)")
    args = parser.parse_args()



    estimator = Estimator.load(args.state_dir, device="cpu")
    sessions, mbytes = {}, {}
    for name in args.models.split(","):
        model = zoo.BY_NAME[name]
        plan = estimator.plan(load_graph(model.path(), inputs=model.inputs), "cpu")
        mbytes[name] = plan.written_mb
        session = ort.InferenceSession(str(model.path()), providers=["CPUExecutionProvider"])
        feeds = _feeds(session, _plain_inputs(model.inputs))
        session.run(None, feeds)
        sessions[name] = (session, feeds)

    refresh = WarmRefresh()
    windows: list[dict[str, float]] = []
    readings: list[dict[str, float]] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        window = {}
        for name, (session, feeds) in sessions.items():
            times = []
            stop = time.perf_counter() + args.window
            while time.perf_counter() < stop or len(times) < 3:
                t = time.perf_counter()
                session.run(None, feeds)
                times.append(time.perf_counter() - t)
            window[name] = 1000.0 * statistics.median(times)
        windows.append(window)
        readings.append(refresh.measure())

    print("each window's warm refresh, as the agent estimates from it, over every window and model:")
    for label, errors in refresh_views(windows, mbytes, readings).items():
        within = sum(abs(e) <= 0.25 for e in errors)
        print(f"  {label:26s}: {within / len(errors):4.0%} within +/-25%, median |error| "
              f"{statistics.median(abs(e) for e in errors):.0%}")
    fast, slow = split_phases(windows)
    print(f"{len(windows)} windows: {len(fast)} fast, {len(slow)} slow, {len(windows) - len(fast) - len(slow)} between")
    rows = phase_rows(windows, mbytes)
    if not rows:
        print("no two phases found: nothing to compare")
        return 0
    per_mb = statistics.median(r.extra_ms_per_mb for r in rows if r.mbytes)
    ratio = statistics.median(r.slow_ms / r.fast_ms for r in rows)
    by_bytes = [(r.fast_ms + per_mb * r.mbytes) / r.slow_ms - 1 for r in rows]
    by_ratio = [r.fast_ms * ratio / r.slow_ms - 1 for r in rows]
    print(f"{'model':28s} {'MB':>7s} {'fast ms':>8s} {'slow ms':>8s} {'ratio':>6s} {'ms/MB':>6s} "
          f"{'err +bytes':>10s} {'err xratio':>10s}")
    for r, err_bytes, err_ratio in zip(rows, by_bytes, by_ratio, strict=True):
        print(f"{r.model:28s} {r.mbytes:7.2f} {r.fast_ms:8.2f} {r.slow_ms:8.2f} {r.slow_ms / r.fast_ms:6.2f} "
              f"{r.extra_ms_per_mb:6.3f} {err_bytes:+10.0%} {err_ratio:+10.0%}")
    print(f"median extra {per_mb:.3f} ms per MB written; median ratio {ratio:.2f}")
    for label, errors in (("fast + median ms/MB x bytes", by_bytes), ("fast x median ratio", by_ratio)):
        within = sum(abs(e) <= 0.25 for e in errors)
        print(f"slow phase as {label:28s}: {within}/{len(rows)} within +/-25%, "
              f"median |error| {statistics.median(abs(e) for e in errors):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
