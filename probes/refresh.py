"""Warm refresh: cheap onnxruntime probes that measure how much slower one inference runs now than calibrated.

`reference()` right after cold calibration is the quiet device; later,
`slowdown(measure(), reference)` is how much slower one inference runs now,
and `handoff_ms_per_mb(measure(), reference)` what the host adds on top per
MB of activations the intra-op threads hand each other,
`gemm_slowdown(measure(), reference)` how much slower than calibrated float products run beyond that slowdown, and
`memory_slowdown(measure(stream=True), reference)` how much slower than calibrated memory streams, beyond it too.

Three probes, their runs alternating in one window: a compute probe (3x3
convolutions, whose threads each keep to their part of the image) and a
handoff probe (depthwise and pointwise convolutions over large activations,
whose threads read what the other core wrote). A host whose vCPUs sit apart
some of the time (docs/device-state.md) slows the second 2-3x and the first
hardly at all; time slicing and lower clocks slow both alike. The third, a gemm probe, is one float product of 64
rows over 1024x1024 weights, as a transformer's layers multiply: a shared host has spells of a minute or more in which
such products run 1.3-1.4x slower while 3x3 convolutions run 1.1x slower (onnxruntime computes the two with different
kernels); the ratio of its slowdown to the compute probe's tells a calibration read in such a spell from the host out
of it (monitors/speed/present.py makes it the gemm multiplier). Where asked,
a fourth probe streams a buffer twice the last-level cache through a
one-row MatMul, as a decode step reads its weights: a host whose memory is
busier than at calibration slows it more than the compute probe, and that
ratio is what a model's streamed bytes pay on top of the CPU's slowdown. It is asked
for only while a priced model streams (its buffer, tens of MB, is made on
first use and dropped by the first refresh that does not ask for it).

Each probe runs as an app runs a model: a session with onnxruntime's
default options (intra-op threads = the physical cores, pinned, spinning
between kernels; only the spinning after a run is cut short), run back to
back. Its wall time per run is averaged over a window of several
scheduler slices, and that one figure sees everything that slows a real
inference: lower clocks (thermal, power), time slicing with other tasks,
group scheduling and cgroup limits, steal, and the waits of lock-stepped
intra-op threads for a descheduled peer.

Why a mean over a window and not the median run: under time slicing a
short run either fits between preemptions or waits a whole slice, so single
runs are bimodal; the mean over many runs is what an app's throughput sees.
Why not the share of a core times an assumed penalty for the lock-stepped
waits: that penalty depends on the machine's scheduler and hypervisor, and a
constant fitted on one machine read 27-55 % high on another
(docs/device-state.md).

The agent measures in a short-lived process of its own (`measured_apart`: `python -m probes.refresh`), so that
onnxruntime never stays in its memory; a child of the agent, its CPU is the agent's own (probes/tree_cpu.py).
It stays, its threads idle, until the agent has sampled once more, so that the sampler reads its threads' waits
for a CPU while they are there (a thread that has ended loses them, and would leave them to others' load).
In one process the sessions are created once and cached; one refresh runs until the process
has used `CPU_BUDGET_S` of CPU (so it lasts longer when the probe gets less
of a core, and sees more slices), or `MAX_WALL_S` has passed.

When to refresh is monitors/speed/refresh_policy.py's to say.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import psutil

from probes.cpu import last_level_cache_bytes

if TYPE_CHECKING:  # the probes are built where they run (the refresh's own process), never in the agent's
    import onnx
    from onnx import TensorProto

CPU_BUDGET_S = 0.15  # one refresh, all of the probe's threads together
MAX_WALL_S = 0.4
MIN_RUNS = 3
REFERENCE_RUNS = 3  # the reference keeps the fastest of this many refreshes (the quiet device), and of earlier ones
LOCKSTEP_KEY = "lockstep_s"  # wall seconds per run of the compute probe, mean over the window
HANDOFF_KEY = "handoff_s"  # wall seconds per run of the handoff probe, mean over the same window
GEMM_KEY = "gemm_s"  # wall seconds per run of the gemm probe, mean over the same window
STREAM_KEY = "stream_s"  # wall seconds per run of the stream probe, mean over the same window (where asked)
THREADS_KEY = "threads"
CORES_KEY = "cores"
# onnxruntime 1.31 reads IR versions up to 13; onnx 1.23 writes 14 by default.
IR_VERSION = 10
OPSET = 17
# The probe: LAYERS 3x3 convolutions (+ Relu) over CHANNELS x PIXELS x PIXELS, the bulk of a CNN; about
# 1 ms a run on two cores of a 2026 server, so that a window holds tens of runs.
LAYERS, CHANNELS, PIXELS = 4, 32, 56
# The handoff probe: HANDOFF_BLOCKS depthwise 3x3 + pointwise 1x1 pairs (+ Relu) over large activations, as in
# a MobileNet's first blocks. onnxruntime splits a depthwise convolution and a pointwise one differently between
# its threads, so each layer reads what the other core wrote: cheap in compute, heavy in cross-core traffic.
HANDOFF_BLOCKS, HANDOFF_CHANNELS, HANDOFF_PIXELS = 3, 32, 112
# The gemm probe: x[GEMM_ROWS, GEMM_K] @ w[GEMM_K, GEMM_N], the weights an initializer (prepacked, as a model's):
# about 0.7 ms a run on two cores of a 2026 server.
GEMM_ROWS, GEMM_K, GEMM_N = 64, 1024, 1024
# MB of activations the cost model's plan says the handoff probe writes per run (Plan.written_mb; a test
# checks it), so that its extra time converts to the same ms per MB the estimator charges a model.
HANDOFF_MB = 12.845
# The stream probe's buffer: twice the last-level cache the kernel reports, so that a cyclic read of it comes from
# memory, within these bounds (a host with hundreds of MB of cache is read partly from its cache: the probe then
# follows bandwidth less closely, and costs no more than this).
STREAM_MIN_BYTES, STREAM_MAX_BYTES = 16 * 2 ** 20, 96 * 2 ** 20
STREAM_WIDTH = 4096  # the buffer is rows of this many float32, the weights of x[1, k] @ w[k, STREAM_WIDTH]
APART_TIMEOUT_S = 30.0  # a refresh's own process: its start (onnxruntime, the sessions) and one measurement
LEAVE_TIMEOUT_S = 5.0  # for it to end once let go
# numpy's BLAS starts a thread per core on import (a sixth of the refresh process's CPU): the probes need none
APART_ENV = {"OPENBLAS_NUM_THREADS": "1"}
CPU_S_KEY = "cpu_s"  # what the refresh's own process reports beside the measurement: its whole CPU


def _layer(kind: str, i: int, x: str, channels: int,
           rng: np.random.Generator) -> tuple[list[onnx.NodeProto], TensorProto]:
    """One probe layer (a convolution and its Relu) reading `x`: nodes and weight."""
    from onnx import helper, numpy_helper  # noqa: PLC0415 - onnx only where the probes are built

    attrs: dict[str, Any]
    if kind == "conv":
        w, attrs = rng.standard_normal((channels, channels, 3, 3)) * 0.05, {"pads": [1, 1, 1, 1]}
    elif kind == "depthwise":
        w, attrs = rng.standard_normal((channels, 1, 3, 3)) * 0.1, {"pads": [1, 1, 1, 1], "group": channels}
    else:  # pointwise
        w, attrs = rng.standard_normal((channels, channels, 1, 1)) * 0.1, {}
    nodes = [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], **attrs),
             helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    return nodes, numpy_helper.from_array(w.astype(np.float32), f"w{i}")


def _build_model(layers: tuple[str, ...], channels: int, pixels: int) -> bytes:
    """A probe graph (serialized ONNX), built in memory: `layers` in a chain over CHANNELS x PIXELS x PIXELS."""
    import onnx  # noqa: PLC0415 - onnx only where the probes are built
    from onnx import TensorProto, helper  # noqa: PLC0415

    rng = np.random.default_rng(0)
    shape = [1, channels, pixels, pixels]
    nodes: list[onnx.NodeProto] = []
    weights: list[TensorProto] = []
    x = "x"
    for i, kind in enumerate(layers):
        layer_nodes, weight = _layer(kind, i, x, channels, rng)
        nodes += layer_nodes
        weights.append(weight)
        x = f"r{i}"
    graph = helper.make_graph(nodes, "warm_refresh", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _image(channels: int, pixels: int) -> dict[str, np.ndarray]:
    """A probe's input: noise over channels x pixels x pixels."""
    return {"x": np.random.default_rng(1).standard_normal((1, channels, pixels, pixels), dtype=np.float32)}


def compute_graph() -> bytes:
    return _build_model(("conv",) * LAYERS, CHANNELS, PIXELS)


def handoff_graph() -> bytes:
    return _build_model(("depthwise", "pointwise") * HANDOFF_BLOCKS, HANDOFF_CHANNELS, HANDOFF_PIXELS)


def gemm_graph() -> bytes:
    """y = x[GEMM_ROWS, GEMM_K] @ w[GEMM_K, GEMM_N], the weights an initializer."""
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415 - onnx only where the probes are built

    weights = np.random.default_rng(0).standard_normal((GEMM_K, GEMM_N), dtype=np.float32) * 0.05
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm_probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [GEMM_ROWS, GEMM_K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [GEMM_ROWS, GEMM_N])],
                              initializer=[numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


def gemm_inputs() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((GEMM_ROWS, GEMM_K), dtype=np.float32)}


def stream_graph(rows: int) -> bytes:
    """y = x[1, rows] @ w[rows, STREAM_WIDTH], the weights an input (no prepacked copy)."""
    from onnx import TensorProto, helper  # noqa: PLC0415 - onnx only where the probes are built

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "stream_probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [rows, STREAM_WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, STREAM_WIDTH])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


def stream_rows(cache_bytes: int) -> int:
    """The stream probe's weights: about twice `cache_bytes`, within STREAM_MIN_BYTES..STREAM_MAX_BYTES."""
    return max(1, min(max(2 * cache_bytes, STREAM_MIN_BYTES), STREAM_MAX_BYTES) // (4 * STREAM_WIDTH))


def stream_inputs(rows: int) -> dict[str, np.ndarray]:
    """The stream probe's input and weights, each row with a value of its own (not a page of zeros shared by the
    kernel)."""
    weights = np.empty((rows, STREAM_WIDTH), np.float32)
    weights[:] = np.linspace(0.01, 0.02, rows, dtype=np.float32)[:, None]
    return {"x": np.full((1, rows), 0.5, np.float32), "w": weights}


def compute_probe() -> tuple[bytes, dict[str, np.ndarray]]:
    return compute_graph(), _image(CHANNELS, PIXELS)


def handoff_probe() -> tuple[bytes, dict[str, np.ndarray]]:
    return handoff_graph(), _image(HANDOFF_CHANNELS, HANDOFF_PIXELS)


def gemm_probe() -> tuple[bytes, dict[str, np.ndarray]]:
    return gemm_graph(), gemm_inputs()


def stream_probe(cache_bytes: int) -> tuple[bytes, dict[str, np.ndarray]]:
    rows = stream_rows(cache_bytes)
    return stream_graph(rows), stream_inputs(rows)


T = TypeVar("T")


class GraphCache:
    """The probes' serialized graphs, kept in `folder` between refreshes (None: built each time). A refresh's
    process that finds them neither imports onnx nor builds them (about 0.04 s of its CPU). A graph is kept under the
    key of this module's source, so that a changed probe is built again; the graphs of other keys go."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self._key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12] if folder is not None else ""

    def load(self, name: str, build: Callable[[], bytes], use: Callable[[bytes], T]) -> T:
        """`use` of the graph kept as `name`; of one built now where none is kept or the kept one fails in `use`
        (a torn or foreign file), which is then kept in its place."""
        if self.folder is None:
            return use(build())
        path = self.folder / f"{name}-{self._key}.onnx"
        try:
            return use(path.read_bytes())
        except Exception:  # noqa: BLE001 - none kept, or not a graph onnxruntime takes: built again below
            pass
        blob = build()
        used = use(blob)
        with contextlib.suppress(OSError):  # a folder it cannot write: built again next time
            self.folder.mkdir(parents=True, exist_ok=True)
            for old in self.folder.glob(f"{name}-*.onnx"):
                old.unlink()
            partial = path.with_suffix(f".{os.getpid()}.part")
            partial.write_bytes(blob)
            partial.replace(path)
        return used


def default_threads() -> int:
    """onnxruntime's default intra-op thread count: the physical cores."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


class WarmRefresh:
    """The cached probe sessions and their measurement."""

    def __init__(self, threads: int | None = None, cpu_budget_s: float = CPU_BUDGET_S,
                 max_wall_s: float = MAX_WALL_S, graphs: GraphCache | None = None) -> None:
        import onnxruntime as ort  # noqa: PLC0415 - ~0.1 s to import: only once the probe's sessions are made

        self.threads = threads or default_threads()
        self.cores = os.cpu_count() or self.threads
        self.cpu_budget_s = cpu_budget_s
        self.max_wall_s = max_wall_s
        self._lock = threading.Lock()
        options = ort.SessionOptions()
        if threads:  # else onnxruntime's default, as an app's session: the physical cores, with affinity
            options.intra_op_num_threads = threads
        # The intra-op threads spin between kernels as an app's do, but stop when a run returns: else they
        # would spin on for about 50 ms after each refresh, a quarter of its CPU and in the app's way.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self._new_session = functools.partial(ort.InferenceSession, sess_options=options,
                                              providers=["CPUExecutionProvider"])
        self._graphs = graphs or GraphCache()
        self._probes = [(self._graphs.load("compute", compute_graph, self._new_session), _image(CHANNELS, PIXELS)),
                        (self._graphs.load("handoff", handoff_graph, self._new_session),
                         _image(HANDOFF_CHANNELS, HANDOFF_PIXELS)),
                        (self._graphs.load("gemm", gemm_graph, self._new_session), gemm_inputs())]
        self._stream: tuple[Any, dict[str, np.ndarray]] | None = None  # made on first use (stream_probe)
        self.last_cpu_s: float | None = None
        self.last_runs: int = 0

    def measure(self, stream: bool = False) -> dict[str, float]:
        """Wall seconds per run of each probe (mean over the window; their runs alternate, so that all see the
        same background), threads, cores; the stream probe's too where `stream` (without, its buffer is
        dropped)."""
        with self._lock:  # one refresh at a time: two would slow each other down
            probes = list(self._probes)
            if not stream:
                self._stream = None
            elif self._stream is None:
                rows = stream_rows(last_level_cache_bytes())
                self._stream = (self._graphs.load(f"stream{rows}", functools.partial(stream_graph, rows),
                                                  self._new_session), stream_inputs(rows))
            if self._stream is not None:
                probes.append(self._stream)
            cpu_start = time.process_time()  # the whole process: onnxruntime's threads included
            for session, feeds in probes:
                session.run(None, feeds)  # untimed: wakes the intra-op threads
            deadline_cpu = time.process_time() + self.cpu_budget_s
            runs = 0
            walls = [0.0] * len(probes)
            start = time.perf_counter()
            while True:
                for i, (session, feeds) in enumerate(probes):
                    t = time.perf_counter()
                    session.run(None, feeds)
                    walls[i] += time.perf_counter() - t
                runs += 1
                if time.perf_counter() - start >= self.max_wall_s or (
                        runs >= MIN_RUNS and time.process_time() >= deadline_cpu):
                    break
            self.last_cpu_s = time.process_time() - cpu_start
            self.last_runs = runs
            out = {LOCKSTEP_KEY: walls[0] / runs, HANDOFF_KEY: walls[1] / runs, GEMM_KEY: walls[2] / runs,
                   THREADS_KEY: float(self.threads), CORES_KEY: float(self.cores)}
            if stream:
                out[STREAM_KEY] = walls[3] / runs
            return out

    def reference(self, earlier: Iterable[dict[str, float]] = (), typical: bool = False,
                  products: Iterable[dict[str, float]] = ()) -> dict[str, float]:
        """The quiet device: each probe's fastest of REFERENCE_RUNS refreshes now and of `earlier` ones
        (interference only ever adds time). `typical`: each probe's median instead, for tables measured once at
        whatever speed the host ran through them (a quick calibration), of readings spread over that time.
        `products`: refreshes taken right after the float products' grids, whose gemm probe alone then sets the
        reference's (a spell can slow those products for a minute and leave the rest: the gemm probe must read the
        state their tables were measured in, not the calibration's fastest moment)."""
        readings = [m for m in earlier if m.get(LOCKSTEP_KEY)]
        readings += [self.measure(stream=True) for _ in range(REFERENCE_RUNS)]
        pick = statistics.median if typical else min
        out = dict(min(readings, key=lambda m: m[LOCKSTEP_KEY]))
        after_products = [m for m in products if m.get(GEMM_KEY)]
        for key in (LOCKSTEP_KEY, HANDOFF_KEY, GEMM_KEY, STREAM_KEY):
            times = [m[key] for m in (after_products if key == GEMM_KEY and after_products else readings) if m.get(key)]
            if times:
                out[key] = pick(times)
        return out


_default: WarmRefresh | None = None
_default_lock = threading.Lock()


def _instance() -> WarmRefresh:
    global _default
    with _default_lock:
        if _default is None:
            _default = WarmRefresh()
    return _default


def measure(stream: bool = False) -> dict[str, float]:
    """The present measurement (the sessions are created on the first call, then reused)."""
    return _instance().measure(stream)


def reference(earlier: Iterable[dict[str, float]] = (), typical: bool = False,
              products: Iterable[dict[str, float]] = ()) -> dict[str, float]:
    """The reference measurement, taken right after cold calibration; `earlier`: refreshes taken during
    it (probes/microbench.py), of which it keeps the fastest too (`typical`: the median of all); `products`: those
    taken right after the float products' grids, which alone set the gemm probe's (WarmRefresh.reference)."""
    return _instance().reference(earlier, typical, products)


def slowdown(now: dict[str, float], reference: dict[str, float]) -> float | None:
    """How much slower one inference runs now than calibrated: the probe's wall time per run, now over the
    reference's. None when either lacks it (a reference from an older version of the probe)."""
    a, b = now.get(LOCKSTEP_KEY), reference.get(LOCKSTEP_KEY)
    if not a or not b or a <= 0 or b <= 0 or not math.isfinite(a / b):
        return None
    return a / b


def handoff_ms_per_mb(now: dict[str, float], reference: dict[str, float]) -> float | None:
    """The extra time this host charges now, beyond calibration, per MB of activations the intra-op threads hand
    each other (Plan.written_mb): the handoff probe's time beyond what the compute probe's slowdown explains.

    On a host whose vCPUs sit apart some of the time, that extra grows with the bytes a model writes and not
    with its time (docs/device-state.md, "Current figures"), so it is added to an estimate, not
    multiplied in. Never below 0 (the calibration is the quiet device); None when either reading lacks a probe.
    """
    ratio = slowdown(now, reference)
    a, b = now.get(HANDOFF_KEY), reference.get(HANDOFF_KEY)
    if ratio is None or not a or not b or a <= 0 or b <= 0:
        return None
    extra = 1000.0 * (a - ratio * b) / HANDOFF_MB
    return max(0.0, extra) if math.isfinite(extra) else None


# The memory multiplier's bounds. Below 1 too: a shared host's bandwidth moves with its neighbours for minutes at a
# time (a 2-core EPYC VM read 42 GB/s in one calibration and 56 in the next, a minute apart), and a calibration
# taken in a slow spell would price every decode step high for as long as the host runs faster.
MIN_MEMORY_SLOWDOWN, MAX_MEMORY_SLOWDOWN = 0.5, 8.0


def memory_slowdown(now: dict[str, float], reference: dict[str, float]) -> float | None:
    """How much slower than calibrated memory streams now, beyond the CPU's slowdown: the stream probe's slowdown
    over the compute probe's (time slicing and clocks slow both; a neighbour that takes bandwidth slows the stream
    probe more). A model's streamed time pays it on top of the CPU multiplier (monitors/speed/present.py). None
    where either reading lacks the stream probe."""
    value = _beyond_compute(now, reference, STREAM_KEY)
    return None if value is None else min(MAX_MEMORY_SLOWDOWN, max(MIN_MEMORY_SLOWDOWN, value))


def gemm_slowdown(now: dict[str, float], reference: dict[str, float]) -> float | None:
    """How much slower than calibrated float products run now, beyond the CPU's slowdown: the gemm probe's slowdown
    over the compute probe's. None where either reading lacks the gemm probe (a reference from an older version of the
    refresh); unbounded (the present speed bounds it, to at most 1: monitors/speed/present.py)."""
    return _beyond_compute(now, reference, GEMM_KEY)


def _beyond_compute(now: dict[str, float], reference: dict[str, float], key: str) -> float | None:
    """The `key` probe's slowdown (now over the reference) over the compute probe's; None where either reading lacks
    one of them."""
    ratio = slowdown(now, reference)
    a, b = now.get(key), reference.get(key)
    if ratio is None or not a or not b or a <= 0 or b <= 0:
        return None
    value = a / b / ratio
    return value if math.isfinite(value) else None


@contextlib.asynccontextmanager
async def measured_apart(stream: bool = False, timeout_s: float = APART_TIMEOUT_S,
                         graphs: Path | None = None) -> AsyncIterator[tuple[dict[str, float], float]]:
    """One measurement (as `measure()`'s) in a process of its own, and the CPU seconds that process used, its start
    included; the probes' graphs kept in the folder `graphs` (GraphCache). The process stays, idle, until the block
    ends. A process that fails, says nothing readable or overruns `timeout_s` (then killed) raises RuntimeError."""
    import asyncio  # noqa: PLC0415 - here: the refresh's own process, which runs main(), never loads it
    args = (*(["--stream"] if stream else []), *(["--graphs", str(graphs)] if graphs is not None else []))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "probes.refresh", *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, **APART_ENV})
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"the refresh process ran past {timeout_s:g} s") from None
        if not line:
            await proc.wait()
            tail = (await proc.stderr.read()).decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise RuntimeError(f"the refresh process exited with {proc.returncode}: {tail[0]}")
        try:
            reading = {str(k): float(v) for k, v in json.loads(line).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise RuntimeError(f"the refresh process said nothing readable: {exc}") from None
        cpu_s = reading.pop(CPU_S_KEY, 0.0)
        yield reading, cpu_s
    except asyncio.CancelledError:
        # The agent stops: the process goes with it now, whether it was measuring or waiting to be let go (waiting
        # for it to end added up to LEAVE_TIMEOUT_S to the stop, and a stop has 10-15 s in all).
        if proc.returncode is None:
            proc.kill()
        raise
    finally:
        if proc.returncode is None:
            proc.stdin.close()  # let go: it ends
            try:
                await asyncio.wait_for(proc.wait(), LEAVE_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            except asyncio.CancelledError:  # the agent stops while it leaves: the process goes with it
                proc.kill()
                raise


def main(argv: list[str] | None = None) -> None:
    """`python -m probes.refresh [--stream] [--graphs FOLDER]`: one measurement as a line of JSON on stdout, with
    this process's whole CPU; then it waits, idle, until its stdin closes (the agent has sampled its threads once
    more)."""
    args = sys.argv[1:] if argv is None else argv
    graphs = Path(args[args.index("--graphs") + 1]) if "--graphs" in args[:-1] else None
    reading = WarmRefresh(graphs=GraphCache(graphs)).measure(stream="--stream" in args)
    reading[CPU_S_KEY] = time.process_time()
    print(json.dumps(reading), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
