"""Does the estimate follow real load? Estimate vs real latency under 0, 1, 2, 4 busy processes and a memory hog.

For each load (real processes: `while True: pass`, or a process streaming
over 512 MB with numpy so that it competes for memory bandwidth and holds
the memory resident): start it; then per model, `--cycles` times: sample
the device state over `--window` seconds as the agent does, run one warm
refresh, combine them into a Speed (monitors/speed/present.py, the
measurement current), and have the app time the model for a while
(onnxruntime default session, median of runs). The estimate (the
estimator's, at that Speed: (calibrated latency + its streamed time x
(speed.memory - 1)) x speed.cpu + the MB the plan writes x the handoff
extra) is compared with the real latency, each the geometric mean over the
cycles, so that both see the same background. The refresh runs its stream
probe (column B: the memory multiplier), as the agent's does while a
monitored model streams; `--models` with a decode step
(gpt-vocab152k-step-ctx128) shows what the memory hog does to one.

As in deployment, the app is its own process (a worker that holds every
model's session): its inference is not the agent's, and its onnxruntime
threads, which spin for a while after each run, are not inside the process
that measures. The state window and the refresh come after a short pause
that lets them stop, and before the app's next run.

Also printed: the predicted-only and measured-only views (each with the
handoff extra, column H in ms per MB), and the slowdown
error (estimated slowdown vs real slowdown against the no-extra-load run),
which isolates the state->speed model from the static estimator's own error.

    python -m bench.under_load                       # default models, all loads (about 2 minutes)
    python -m bench.under_load --models 'resnet18-b1-224x224,squeezenet' --loads 0,2

The machine's other work is part of the state too: the "0" run is whatever
else runs here, which the probes see and the estimate accounts for.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from agent import calibration_store
from agent.calibration_store import run_calibration
from agent.simulation.load import Load, LoadProcess
from bench import zoo
from monitors.graphs.importer import load_graph
from monitors.speed.present import Measurement, Speed, speed_from_state
from probes.refresh import (
    HANDOFF_KEY,
    LOCKSTEP_KEY,
    gemm_slowdown,
    handoff_ms_per_mb,
    measure,
    memory_slowdown,
    slowdown,
)
from probes.state import Sampler

DEFAULT_MODELS = ("squeezenet", "mobilenetv2-b1-224x224", "resnet18-b1-224x224", "bert-mini-b1-s128",
                  "mlp-1024x4-b32")
PAUSE_S = 0.1
WARM_UP_S = 0.1  # untimed runs before each timed window, as bench/groundtruth.py warms up
MEMORY_HOG = (  # streams memory until its owner (argv[1]) is gone
    "import os, sys\nimport numpy as np\nowner = int(sys.argv[1])\n"
    "a = np.ones(64 << 20); b = np.empty_like(a)\n"  # 2 x 512 MB, resident
    "while True:\n    np.copyto(b, a); np.copyto(a, b)\n    os.kill(owner, 0)\n"
)


def start_load(kind: str) -> list[LoadProcess]:
    """Real load outside this process's tree: the Sampler here leaves its own tree out of others' load."""
    if kind == "mem":
        return [LoadProcess.start(MEMORY_HOG, [], detached=True)]
    load = Load(detached=True)
    load.set_busy(int(kind))
    return load.busy


def stop_load(procs: list[LoadProcess]) -> None:
    for p in procs:
        p.stop()


APP = """
import statistics, sys, time
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from bench import zoo
from bench.groundtruth import _feeds, _plain_inputs

sessions = {}
for name in sys.argv[2].split(","):
    model = zoo.BY_NAME[name]
    session = ort.InferenceSession(str(model.path()), providers=["CPUExecutionProvider"])
    feeds = _feeds(session, _plain_inputs(model.inputs))
    session.run(None, feeds)
    sessions[name] = (session, feeds)
WARM_UP_S = float(sys.argv[3])
print("ready", flush=True)
for line in sys.stdin:
    name, seconds = line.split()
    session, feeds = sessions[name]
    warm = time.perf_counter() + WARM_UP_S
    while time.perf_counter() < warm:
        session.run(None, feeds)
    times = []
    end = time.perf_counter() + float(seconds)
    while time.perf_counter() < end or len(times) < 5:
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    print(1000.0 * statistics.median(times), flush=True)
"""


class App:
    """The app: a process that holds every model's default onnxruntime session and times one on request."""

    def __init__(self, models: list[str]) -> None:
        repo = str(Path(__file__).resolve().parents[1])
        self.proc = subprocess.Popen([sys.executable, "-c", APP, repo, ",".join(models), str(WARM_UP_S)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the app process did not start")

    def latency_ms(self, model: str, seconds: float) -> float:
        self.proc.stdin.write(f"{model} {seconds}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def geomean(values: list[float]) -> float:
    values = [v for v in values if v == v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    parser.add_argument("--loads", default="0,1,2,4,mem", help="comma-separated: a number of busy processes, or mem")
    parser.add_argument("--seconds", type=float, default=1.5, help="timed runs per model and load, in all")
    parser.add_argument("--cycles", type=int, default=3, help="state+measurement / real-run alternations per model")
    parser.add_argument("--window", type=float, default=0.5, help="seconds each state sample spans (the agent's: 1)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="calibration state dir (default: bench/.cache/state when its refresh reference is "
                             "current, else bench/.cache/state-under-load, calibrated --quick on first use)")
    args = parser.parse_args()



    state_dir = args.state_dir or Path(__file__).resolve().parent / ".cache" / "state"
    calibrated = (state_dir / "calibration-cpu.json").exists()
    estimator = calibration_store.load_estimator(state_dir, device="cpu") if calibrated else None
    if estimator is None or not {LOCKSTEP_KEY, HANDOFF_KEY} <= set(estimator.calibrations["cpu"].refresh_reference):
        # The warm-refresh reference must come from this version's probes, taken right after calibration.
        state_dir = Path(__file__).resolve().parent / ".cache" / "state-under-load"
        if not (state_dir / "calibration-cpu.json").exists():
            print(f"calibrating (--quick) into {state_dir}: no calibration with a current refresh reference",
                  flush=True)
            run_calibration(state_dir, "cpu", quick=True)
        estimator = calibration_store.load_estimator(state_dir, device="cpu")
    print(f"calibration: {state_dir}")
    reference = estimator.calibrations["cpu"].refresh_reference
    threads = psutil.cpu_count(logical=False) or 1
    models = []  # (name, plan)
    for name in args.models.split(","):
        model = zoo.BY_NAME[name]
        models.append((name, estimator.plan(load_graph(model.path(), inputs=model.inputs), "cpu")))
    measure(stream=True)  # create the refresh sessions before timing anything
    app = App([name for name, _ in models])

    sampler = Sampler()
    rows = []
    quiet: dict[str, tuple[float, float]] = {}  # model -> (estimate, real) of the "0" run
    print(f"{'load':>5} {'busy':>5} {'runq':>5} {'P':>5} {'M':>5} {'H':>5} {'B':>5} {'speed':>5}  {'model':26s} "
          f"{'est ms':>8} {'real ms':>8} {'err':>6} {'err P':>6} {'err M':>6} {'slowdown est/real':>18}")
    for load in args.loads.split(","):
        procs = start_load(load)
        try:
            time.sleep(0.5)
            sampler.sample()
            time.sleep(0.5)
            for name, plan in models:
                # Alternate state+measurement and real runs, so that both see the same background.
                cycles: list[dict[str, float]] = []
                for _ in range(args.cycles):
                    time.sleep(PAUSE_S)  # the app's onnxruntime threads stop spinning
                    state = sampler.sample_over(args.window)  # as the agent samples
                    now = measure(stream=True)  # as the agent refreshes while a monitored model streams
                    measured = slowdown(now, reference) if reference else None
                    handoff = handoff_ms_per_mb(now, reference) if reference else None
                    memory = memory_slowdown(now, reference) if reference else None
                    gemm = gemm_slowdown(now, reference) if reference else None
                    speed = speed_from_state(state, threads, Measurement.taken_in(state, threads, measured, handoff,
                                                                                  memory, gemm), current=True)

                    def estimate(cpu: float, plan: Any = plan, speed: Speed = speed) -> float:
                        """The estimator's, at this cycle's Speed with this multiplier."""
                        return estimator.estimate(plan, device="cpu", speed=replace(speed, cpu=cpu)).latency_ms

                    cycles.append({"speed": speed.cpu, "P": speed.predicted_cpu, "M": measured or float("nan"),
                                   "H": speed.handoff_ms_per_mb, "B": speed.memory, "est": estimate(speed.cpu),
                                   "est_p": estimate(speed.predicted_cpu),
                                   "est_m": estimate(measured) if measured else float("nan"),
                                   "busy": state.cpu.others_busy_cores or 0.0, "runq": state.cpu.runnable_others or 0.0,
                                   "real": app.latency_ms(name, args.seconds / args.cycles)})
                g = {k: statistics.fmean(c[k] for c in cycles) if k in ("busy", "runq", "H", "B")
                     else geomean([c[k] for c in cycles]) for k in cycles[0]}
                real, est = g["real"], g["est"]
                if load == "0":
                    quiet[name] = (est, real)
                q_est, q_real = quiet.get(name, (float("nan"), float("nan")))
                est_slow, real_slow = est / q_est, real / q_real
                row = {"load": load, "model": name, "err": est / real - 1, "err_p": g["est_p"] / real - 1,
                       "err_m": g["est_m"] / real - 1, "slow_err": est_slow / real_slow - 1}
                rows.append(row)
                print(f"{load:>5} {g['busy']:5.2f} {g['runq']:5.2f} {g['P']:5.2f} {g['M']:5.2f} {g['H']:5.3f} "
                      f"{g['B']:5.2f} {g['speed']:5.2f}  {name:26s} {est:8.1f} {real:8.1f} {100 * row['err']:+5.0f}% "
                      f"{100 * row['err_p']:+5.0f}% {100 * row['err_m']:+5.0f}% {est_slow:8.2f}/{real_slow:<5.2f}",
                      flush=True)
        finally:
            stop_load(procs)
        time.sleep(0.5)
    app.close()

    def share(key: str, bound: float) -> str:
        values = [abs(r[key]) for r in rows if r[key] == r[key]]
        within = sum(v <= bound for v in values)
        median = 100 * statistics.median(values)
        return f"{within}/{len(values)} within +/-{100 * bound:.0f}%, median |error| {median:.0f}%"

    print()
    print(f"estimate (combined) vs real : {share('err', 0.25)}")
    print(f"prediction only             : {share('err_p', 0.25)}")
    print(f"measurement only            : {share('err_m', 0.25)}")
    print(f"slowdown vs the '0' run     : {share('slow_err', 0.25)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
