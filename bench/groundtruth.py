"""Ground truth: the real latency of one onnxruntime inference of a model file.

What the estimator predicts is one run through onnxruntime with its DEFAULT
SessionOptions on the CPUExecutionProvider (`--device gpu`: the CUDAExecutionProvider,
inputs and outputs in host memory, as an app hands them), so that is exactly what is timed:
each model in a fresh subprocess (so the arena and caches of one model don't
pollute the next), warm-up runs first, then enough timed runs for about
`target_s` seconds (at least `min_repeats`); the median and the interquartile
range are reported. Feeds are random floats, small token ids, masks of ones. On the CPU, before the
timed runs, one warm refresh as the agent takes it (its compute, handoff and stream probes: `probe`):
what the agent would have read of the device's speed then, which `present_speed` turns into the speed
the agent's answer at that moment is priced at. A shared host's speed moves for minutes at a time (the
refresh read 1.2x to 1.8x its calibration's reference over an hour on a 2-core Intel Xeon VM): the
benchmarks score the estimate at rest against the truth, and the estimate at that speed beside it.

Results are cached in bench/.cache/groundtruth.json, keyed by the file's hash,
the input bindings, the onnxruntime version and the CPU model (the GPU's, on the GPU).

    python -m bench.groundtruth MODEL.onnx --input NAME=1x3x224x224[:float32] ... [--device gpu]
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from monitors.speed.prediction import QUIET
from monitors.speed.present import AT_REST, Measurement, Speed, cpu_speed
from probes.microbench import gpu_model
from probes.refresh import WarmRefresh, gemm_slowdown, handoff_ms_per_mb, memory_slowdown, slowdown

CACHE_FILE = Path(__file__).resolve().parent / ".cache" / "groundtruth.json"
TARGET_S = 1.5
MIN_REPEATS = 5
MAX_REPEATS = 2000
WARMUP_S = 0.3
TIMEOUT_S = 600.0
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "gpu": ["CUDAExecutionProvider"]}


# --- the measurement (runs in the child process) ---------------------------------------------------------------------

def _feeds(session: Any, inputs: dict[str, tuple[list[int], str | None]]) -> dict[str, Any]:

    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        if arg.name not in inputs:
            raise ValueError(f"no binding for input {arg.name!r}")
        shape, _ = inputs[arg.name]
        dtype = types[arg.type]
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_ or "mask" in arg.name:
            feeds[arg.name] = np.ones(shape, dtype=dtype)
        else:
            feeds[arg.name] = rng.integers(0, 100, size=shape).astype(dtype)
    return feeds


def run_measurement(path: str, inputs: dict[str, tuple[list[int], str | None]], target_s: float = TARGET_S,
                    min_repeats: int = MIN_REPEATS, device: str = "cpu") -> dict[str, Any]:
    """Time the model in this process: default session, warm-up, then the timed runs."""

    t0 = time.perf_counter()
    options = ort.SessionOptions()
    if device == "gpu":  # the kernels the provider runs, to set beside the planner's (nodes after optimization)
        optimized = Path(tempfile.mkdtemp()) / "optimized.onnx"
        options.optimized_model_filepath = str(optimized)
    session = ort.InferenceSession(path, options, providers=PROVIDERS[device])
    session_s = time.perf_counter() - t0
    if device == "gpu" and session.get_providers()[0] != "CUDAExecutionProvider":
        raise RuntimeError(f"the CUDA provider did not load (providers: {session.get_providers()})")
    feeds = _feeds(session, inputs)
    probe = WarmRefresh().measure(stream=True) if device == "cpu" else None

    # Warm-up: the first run allocates; keep warming until WARMUP_S has passed (at least 2 runs).
    first = _timed(session, feeds)
    warm = [_timed(session, feeds)]
    while sum(warm) < WARMUP_S and len(warm) < 50:
        warm.append(_timed(session, feeds))
    per_run = float(np.median(warm))
    repeats = int(min(MAX_REPEATS, max(min_repeats, target_s / max(per_run, 1e-6))))
    times = np.array([_timed(session, feeds) for _ in range(repeats)]) * 1000.0
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    result = {
        "median_ms": float(median),
        "iqr_ms": float(q3 - q1),
        "min_ms": float(times.min()),
        "mean_ms": float(times.mean()),
        "repeats": repeats,
        "first_run_ms": first * 1000.0,
        "session_s": session_s,
    }
    if probe is not None:
        result["probe"] = probe
    if device == "gpu":
        result["bound_median_ms"] = _bound_median_ms(session, feeds, repeats)
        result["ops"] = dict(Counter(n.op_type for n in onnx.load(str(optimized), load_external_data=False).graph.node))
        shutil.rmtree(optimized.parent, ignore_errors=True)
    return result


def present_speed(probe: dict[str, float] | None, reference: dict[str, float]) -> Speed:
    """The speed the agent prices its answer at on a device that nothing else uses, whose warm refresh read
    `probe` (taken with a ground truth) against the calibration's `reference`: the agent's own formula
    (monitors/speed/present.py, cpu_speed) from that one reading. At rest where there is no reading."""
    if not probe:
        return AT_REST
    reading = Measurement(slowdown(probe, reference), handoff_ms_per_mb(probe, reference),
                          memory=memory_slowdown(probe, reference), gemm=gemm_slowdown(probe, reference))
    return replace(cpu_speed(QUIET, reading, current=True), gpu=1.0)


def _bound_median_ms(session: Any, feeds: dict[str, Any], repeats: int) -> float:
    """The median of runs with inputs and outputs already in GPU memory (IOBinding): the run less an app's
    host copies, to tell the copies' share of the error from the kernels'."""
    io = session.io_binding()
    for name, value in feeds.items():
        io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for out in session.get_outputs():
        io.bind_output(out.name, "cuda")
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        session.run_with_iobinding(io)
        io.synchronize_outputs()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000.0


_busy_since_pause = [0.0]


def _timed(session: Any, feeds: dict[str, Any]) -> float:
    """One run's wall time. Every 0.25 s of runs, a 0.1 s rest: measured under real-time scheduling
    (`chrt -f`, to keep a shared machine's other load out), threads busy (or spinning) for more than
    0.95 s of a second are stopped by the kernel's RT throttling, which would land inside timed runs."""
    if _busy_since_pause[0] > 0.25:
        time.sleep(0.1)
        _busy_since_pause[0] = 0.0
    start = time.perf_counter()
    session.run(None, feeds)
    elapsed = time.perf_counter() - start
    _busy_since_pause[0] += elapsed
    return elapsed


# --- the parent side: subprocess, cache ------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _gpu_name() -> str:
    return gpu_model()


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes (memoized per path, size and mtime: zoo files are large)."""
    stat = path.stat()
    return _file_hash(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _file_hash(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _plain_inputs(inputs: dict[str, Any]) -> dict[str, tuple[list[int], str | None]]:
    """InputSpec (or (shape, dtype)) values -> JSON-friendly (shape list, dtype)."""
    plain = {}
    for name, spec in inputs.items():
        shape, dtype = (spec.shape, spec.dtype) if hasattr(spec, "shape") else spec
        plain[name] = ([int(d) for d in shape], dtype)
    return plain


def cache_key(path: Path, inputs: dict[str, Any], device: str = "cpu") -> str:

    bindings = ";".join(f"{n}={'x'.join(map(str, s))}:{d}" for n, (s, d) in sorted(_plain_inputs(inputs).items()))
    where = cpu_model() if device == "cpu" else f"gpu {_gpu_name()}"
    return f"{file_hash(path)}|{bindings}|onnxruntime {ort.__version__}|{where}"


def load_cache(cache_file: Path = CACHE_FILE) -> dict[str, Any]:
    try:
        return json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}


def save_cache(cache: dict[str, Any], cache_file: Path = CACHE_FILE) -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_name(cache_file.name + ".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    tmp.replace(cache_file)


def measure_in_subprocess(path: Path, inputs: dict[str, Any], target_s: float = TARGET_S,
                          min_repeats: int = MIN_REPEATS, device: str = "cpu") -> dict[str, Any]:
    """Run `run_measurement` in a fresh Python process and return its result."""
    request = json.dumps({"path": str(path), "inputs": _plain_inputs(inputs), "target_s": target_s,
                          "min_repeats": min_repeats, "device": device})
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker"], input=request,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"measuring {path.name} failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(path: Path | str, inputs: dict[str, Any], repeats: int = MIN_REPEATS, target_s: float = TARGET_S,
            remeasure: bool = False, cache_file: Path = CACHE_FILE, device: str = "cpu") -> dict[str, Any]:
    """Real latency of `path` bound to `inputs` (name -> InputSpec), in a fresh process; cached unless
    `remeasure` (several rounds, kept at their quietest: `measure_spread`).

    `repeats` is the minimum number of timed runs; more are made to fill about `target_s` seconds.
    The result has median_ms, iqr_ms, repeats, ... plus `cached` (bool).
    """
    path = Path(path)
    key = cache_key(path, inputs, device)
    cache = load_cache(cache_file)
    if not remeasure and key in cache:
        return {**cache[key], "cached": True}
    result = measure_in_subprocess(path, inputs, target_s=target_s, min_repeats=repeats, device=device)
    _store(key, path, result, 1, cache_file)
    return {**result, "cached": False}


def measure_spread(jobs: list[tuple[Path, dict[str, Any]]], rounds: int, repeats: int = MIN_REPEATS,
                   target_s: float = TARGET_S, remeasure: bool = False, cache_file: Path = CACHE_FILE,
                   log: Any = None, device: str = "cpu") -> None:
    """Measure every job in `rounds` rounds over all of them, keeping each one's lowest median: on a
    shared machine a whole round can be disturbed, and disturbance only adds time.

    The host slows down for minutes at a time, so rounds of one model back to back all fell into the
    same slow spell, while a round over the whole list lies minutes from the next.
    Jobs already cached are skipped unless `remeasure`; a job that fails is left to the caller.
    """
    cached = load_cache(cache_file)
    todo = [(Path(p), inputs) for p, inputs in jobs if remeasure or cache_key(Path(p), inputs, device) not in cached]
    best: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for path, inputs in todo:
            key = cache_key(path, inputs, device)
            try:
                result = measure_in_subprocess(path, inputs, target_s=target_s, min_repeats=repeats, device=device)
            except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
                continue
            if key not in best or result["median_ms"] < best[key]["median_ms"]:
                best[key] = result
            if log:
                log(f"round {r + 1}/{rounds}: {path.name} {result['median_ms']:.3g} ms")
    for path, inputs in todo:
        key = cache_key(path, inputs, device)
        if key in best:
            _store(key, path, best[key], rounds, cache_file)


def _store(key: str, path: Path, result: dict[str, Any], rounds: int, cache_file: Path) -> None:
    result.update(rounds=rounds, file=path.name, measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_file.with_name(cache_file.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be writing: re-read under the lock
        cache = load_cache(cache_file)
        cache[key] = result
        save_cache(cache, cache_file)


def _parse_input(text: str) -> tuple[str, tuple[list[int], str | None]]:
    name, _, rest = text.rpartition("=")
    dims, _, dtype = rest.partition(":")
    return name, ([int(d) for d in dims.split("x")], dtype or None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Real onnxruntime latency of one model (default session).")
    parser.add_argument("model", nargs="?", type=Path)
    parser.add_argument("--input", action="append", default=[], help="NAME=1x3x224x224[:float32]")
    parser.add_argument("--remeasure", action="store_true")
    parser.add_argument("--device", choices=tuple(PROVIDERS), default="cpu")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        request = json.loads(sys.stdin.read())
        inputs = {name: (shape, dtype) for name, (shape, dtype) in request["inputs"].items()}
        result = run_measurement(request["path"], inputs, request["target_s"], request["min_repeats"],
                                 request.get("device", "cpu"))
        print(json.dumps(result))
        return 0
    if args.model is None:
        parser.error("a model path is required")
    result = measure(args.model, dict(_parse_input(t) for t in args.input), remeasure=args.remeasure,
                     device=args.device)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
