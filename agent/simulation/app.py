"""A real app for the simulated device: one process that runs its monitor's workloads through onnxruntime, each
at its frame rate, as a video-call app runs its blur and its noise suppression, and says how long each run took.

The process runs on the real CPU, on the simulated device's CPUs (pinned there, with as many intra-op threads,
onnxruntime's default on a device of that size; otherwise its default options, threads spinning between runs
included), so real busy processes slow it and the agent sees its real CPU use. What the real CPU cannot show,
the app emulates by one `scale`, a number in a file the device rewrites as its conditions change: the simulated
device's own speed against the host's, its capped clock (a thermal or power cap in the scenario) and a hidden
slowdown that no signal shows (a scenario's `hidden_slowdown`, for learning from reports). Above 1 (the device
is slower), after each run it spins on until the run has taken `scale` times as long: real CPU work, as a
slower device would do. Below 1 (the device is faster), a run counts for `scale` of its time and for 1/scale
frames, and the app runs that much less often: the host's CPU time per second is the device's either way.
The same file holds the host's share (HostShare in device.py): a run that the host's other tenants slowed is
reported at the time it would have taken without them, as the device's /proc counts its CPU time, and counts for
that many more frames, as a faster device's run does (the scale's reference run is measured without them too:
speed.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.simulation.load import cpu_ticks
from monitors.graphs.graph import InputSpec

# How the app and the reference measurement load a model: on the device's CPUs (argv), with as many intra-op
# threads as it has (onnxruntime's default on a device of that size), otherwise onnxruntime's default options.
LOADER = r"""
import json, os, sys, time
import numpy as np
import onnxruntime as ort

def pin(cpus):
    os.sched_setaffinity(0, cpus)

def session_of(model, inputs):
    from agent.simulation.materialize import materialize
    from monitors.graphs.importer import load_graph
    from monitors.graphs.graph import InputSpec
    specs = {k: InputSpec(tuple(v[0]), v[1]) for k, v in inputs.items()}
    graph = load_graph(model, inputs=specs or None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    session = ort.InferenceSession(materialize(graph).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        kind = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32}.get(i.type, np.float32)
        feeds[i.name] = (np.random.default_rng(0).random(shape) * 0.1).astype(kind)
    for _ in range(3):
        session.run(None, feeds)  # warm-up, untimed
    return session, feeds
"""

# Runs in the app's own process: python -c APP OWNER_PID SPEC_JSON SCALE_FILE
APP = LOADER + r"""
owner, spec, scale_file = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
pin(spec["cpus"])
sys.stdin.readline()  # "go": the app has told the agent it runs these workloads (with its pid) before it loads them
sys.path.insert(0, spec["repo"])
work = []
for w in spec["workloads"]:
    session, feeds = session_of(w["model"], w["inputs"])
    work.append([w["name"], 1.0 / w["rate_hz"], session, feeds, 0.0])
print("ready", flush=True)

scale, host_share, read_at = 1.0, 1.0, 0.0
start = time.perf_counter()
due = [start] * len(work)
while True:
    now = time.perf_counter()
    if now - read_at > 0.25:
        read_at = now
        try:
            scale, host_share = (max(0.01, float(v)) for v in open(scale_file).read().split())
        except (OSError, ValueError):
            pass
        try:
            os.kill(owner, 0)
        except OSError:
            break
    i = min(range(len(work)), key=lambda k: due[k])
    wait = due[i] - time.perf_counter()
    if wait > 0:
        time.sleep(wait)
    name, period, session, feeds, credit = work[i]
    t0 = time.perf_counter()
    session.run(None, feeds)
    target = t0 + (time.perf_counter() - t0) * scale  # a slower device: spin on, as its longer run would
    while time.perf_counter() < target:
        pass
    # A faster one: its run is shorter. The host's other tenants, which slowed it, are not on the device: there it
    # is shorter by their share too. Device time per host time, then: each run counts for `g` of its time and
    # for 1/g frames, and the app runs that much less often.
    g = min(1.0, scale) / host_share
    took = (time.perf_counter() - t0) * g
    credit += 1.0 / g
    frames = int(credit)
    work[i][4] = credit - frames
    print(f"{name} {1000.0 * took:.4f} {frames}", flush=True)
    real_period = period / g
    due[i] = max(due[i] + real_period, time.perf_counter() - real_period)  # fall behind: skip, never burst
"""

# One model's run time on the device's CPUs at rest, as the app would run it: python -c MEASURE SPEC_JSON
MEASURE = LOADER + r"""
spec = json.loads(sys.argv[1])
pin(spec["cpus"])
sys.path.insert(0, spec["repo"])
session, feeds = session_of(spec["model"], spec["inputs"])
times = []
for _ in range(spec["runs"]):
    t0 = time.perf_counter()
    session.run(None, feeds)
    times.append(time.perf_counter() - t0)
print(1000.0 * sorted(times)[len(times) // 2], flush=True)
"""

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Workload:
    name: str
    model: Path
    inputs: dict[str, InputSpec]
    rate_hz: float


class AppProcess:
    """The app's process, and what it measured: each workload's run latencies (ms) since the last `take`.

    The process starts idle; `go()` has it load its models and start its frames. In between the app can tell
    the agent that it runs them, with its pid, before it does any of that work, as a well-behaved app would."""

    def __init__(self, workloads: list[Workload], scale_file: Path, cpus: Sequence[int] | None = None) -> None:
        spec = {"repo": str(REPO), "cpus": sorted(os.sched_getaffinity(0) if cpus is None else cpus), "workloads": [
            {"name": w.name, "model": str(w.model), "rate_hz": w.rate_hz, "inputs": _inputs(w.inputs)}
            for w in workloads]}
        self.proc = subprocess.Popen([sys.executable, "-c", APP, str(os.getpid()), json.dumps(spec),
                                      str(scale_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=REPO)
        self.pid = self.proc.pid
        self._lock = threading.Lock()
        self._runs: dict[str, list[float]] = {w.name: [] for w in workloads}
        self._seen_ticks = 0

    def go(self) -> None:
        """Load the models and start the frames; returns once the models are loaded (blocking: a thread)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        first = self.proc.stdout.readline()
        if first.strip() != "ready":
            self.stop()
            raise RuntimeError(f"the app did not start: {first!r}")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            name, _, rest = line.partition(" ")
            try:
                ms, frames = rest.split()
                value, count = float(ms), int(frames)
            except ValueError:
                continue
            with self._lock:
                if name in self._runs:
                    self._runs[name].extend([value] * count)

    def take(self) -> dict[str, list[float]]:
        """Each workload's run latencies (ms) since the last call."""
        with self._lock:
            out = {k: v for k, v in self._runs.items()}
            self._runs = {k: [] for k in self._runs}
        return out

    def take_ticks(self) -> int:
        """CPU ticks the app used since the last call (for the simulated /proc/stat)."""
        ticks = cpu_ticks(self.pid)
        delta, self._seen_ticks = max(0, ticks - self._seen_ticks), max(ticks, self._seen_ticks)
        return delta

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def _inputs(inputs: dict[str, InputSpec]) -> dict[str, list[object]]:
    return {k: [list(v.shape), v.dtype or "float32"] for k, v in inputs.items()}


def run_ms(model: Path, inputs: dict[str, InputSpec], cpus: Sequence[int], runs: int = 15) -> float:
    """The median run time (ms) of a model on these CPUs at rest, loaded and run as the app does it."""
    spec = {"repo": str(REPO), "cpus": list(cpus), "model": str(model), "inputs": _inputs(inputs), "runs": runs}
    out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(spec)], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    try:
        return float(out.stdout.split()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"cannot run {model.name} here: {out.stderr.strip()[-500:]}") from None


def oracle(runs: dict[str, list[float]], targets: dict[str, tuple[float, float]], seconds: float) -> bool | None:
    """Whether the app met its requirement over `seconds`, by its own measurements: for each workload (name ->
    (deadline ms, rate Hz)), the median run within the deadline and, for a rate, at least 90 % of the runs
    a second it must sustain. None when a workload has no run to judge by."""
    verdict = True
    for name, (deadline, rate) in targets.items():
        values = sorted(runs.get(name, []))
        if not values:
            return None
        median = values[len(values) // 2]
        verdict &= median < deadline and (rate <= 0 or len(values) >= 0.9 * rate * seconds)
    return verdict
