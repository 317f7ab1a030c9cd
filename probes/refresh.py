"""Warm refresh: cheap onnxruntime micro-benchmarks that measure the device's present speed.

`measure()` right after cold calibration is the reference; later,
`slowdown(measure(), reference)` is how much slower one inference runs now.

A slowdown has two parts, measured separately because short benchmarks
timed by the wall clock are dominated by scheduling noise (a probe shorter
than a scheduler slice is either untouched or preempted; one just after
the agent slept enjoys the scheduler's credit for sleepers):

* **speed per CPU-second**: single-threaded probes (a MatMul, a 3x3
  convolution, a memory-bound Add over 8 MB operands) timed in thread CPU
  time. This sees lower clocks (thermal, power), memory-bandwidth
  contention and a busy SMT sibling, and not time slicing.
* **share of a CPU**: `threads` probe threads (onnxruntime's intra-op
  thread count) run together for a short window; each one's CPU time over
  the wall time is the share of a core it gets, whatever decides it (other
  tasks, group scheduling, cgroup limits, steal). Time slicing slows an
  inference by 1 / share. `demand = cores / share - threads` says how many
  other tasks that share corresponds to (shown, not used).

Sessions are created once and cached; one refresh costs at most about
`CPU_BUDGET_S` of CPU (bench/probe_cost.py).

`RefreshPolicy` (pure) says when to refresh: periodically, and soon after
the state changes markedly, within a CPU budget of 1 % of a core.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np

# One refresh: every probe thread loops over the probes for WINDOW_S of wall time, or until the
# threads together used CPU_BUDGET_S of CPU, with at least MIN_ROUNDS rounds each.
WINDOW_S = 0.07
SETTLE_S = 0.02  # the share is counted after this much of the window
MAX_WALL_S = 0.4
CPU_BUDGET_S = 0.15
MIN_ROUNDS = 3
SHARE_KEY = "share"  # mean share of a core the probe threads got
THREADS_KEY = "threads"
CORES_KEY = "cores"
# onnxruntime 1.31 reads IR versions up to 13; onnx 1.23 writes 14 by default.
IR_VERSION = 10
OPSET = 17


def _build_models() -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    """The probe graphs (serialized ONNX) and their inputs, built in memory."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    f32 = TensorProto.FLOAT

    def model(name: str, nodes, inputs, outputs, initializers=()) -> bytes:
        graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = IR_VERSION
        onnx.checker.check_model(m)
        return m.SerializeToString()

    def value(name: str, shape: list[int]):
        return helper.make_tensor_value_info(name, f32, shape)

    models: dict[str, tuple[bytes, dict[str, np.ndarray]]] = {}
    n = 256
    models["cpu_matmul_256"] = (
        model("matmul", [helper.make_node("MatMul", ["a", "b"], ["y"])],
              [value("a", [n, n]), value("b", [n, n])], [value("y", [n, n])]),
        {"a": rng.standard_normal((n, n), dtype=np.float32), "b": rng.standard_normal((n, n), dtype=np.float32)},
    )
    weights = numpy_helper.from_array(rng.standard_normal((32, 32, 3, 3), dtype=np.float32) * 0.05, "w")
    models["cpu_conv3x3_32ch_28px"] = (
        model("conv", [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
              [value("x", [1, 32, 28, 28])], [value("y", [1, 32, 28, 28])], [weights]),
        {"x": rng.standard_normal((1, 32, 28, 28), dtype=np.float32)},
    )
    count = 1 << 21  # 8 MB of float32 per operand, 24 MB moved: more than most last-level caches
    models["cpu_add_8mb"] = (
        model("add", [helper.make_node("Add", ["a", "b"], ["y"])],
              [value("a", [count]), value("b", [count])], [value("y", [count])]),
        {"a": rng.standard_normal(count, dtype=np.float32), "b": rng.standard_normal(count, dtype=np.float32)},
    )
    return models


def default_threads() -> int:
    """onnxruntime's default intra-op thread count: the physical cores."""
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


class WarmRefresh:
    """Cached single-threaded onnxruntime sessions for the probes, and the probe threads' measurement."""

    def __init__(self, threads: int | None = None, window_s: float = WINDOW_S, cpu_budget_s: float = CPU_BUDGET_S,
                 max_wall_s: float = MAX_WALL_S) -> None:
        import onnxruntime as ort

        self.threads = threads or default_threads()
        self.cores = os.cpu_count() or self.threads
        self.window_s = window_s
        self.cpu_budget_s = cpu_budget_s
        self.max_wall_s = max_wall_s
        self._lock = threading.Lock()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # the probe thread itself computes: its CPU time is the probe's
        options.inter_op_num_threads = 1
        self._sessions = [
            (name, ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"]), feeds)
            for name, (blob, feeds) in _build_models().items()
        ]
        self.last_cpu_s: float | None = None
        self.last_runs: int = 0

    def measure(self) -> dict[str, float]:
        """Thread CPU seconds per run of each probe, the share of a core the probe threads got, threads, cores."""
        with self._lock:  # one refresh at a time: two would slow each other down
            cpu_start = time.process_time()
            results: list[tuple[dict[str, list[float]], float, float, int]] = [None] * self.threads  # type: ignore[list-item]
            start = threading.Barrier(self.threads)
            deadline_cpu = cpu_start + self.cpu_budget_s

            def worker(i: int) -> None:
                for _, session, feeds in self._sessions:  # warm-up: first runs allocate
                    session.run(None, feeds)
                start.wait()
                cpu_times: dict[str, list[float]] = {name: [] for name, _, _ in self._sessions}
                wall0 = time.perf_counter()
                # Share of a core, counted inside session.run only (no GIL there: waiting for the GIL
                # between runs is not time slicing) and after SETTLE_S, because the scheduler favours
                # a task that just woke up.
                cpu_in, wall_in = 0.0, 0.0
                rounds = 0
                while True:
                    settled = time.perf_counter() - wall0 >= SETTLE_S
                    for name, session, feeds in self._sessions:
                        c, w = time.thread_time(), time.perf_counter()
                        session.run(None, feeds)
                        c, w = time.thread_time() - c, time.perf_counter() - w
                        cpu_times[name].append(c)
                        if settled:
                            cpu_in, wall_in = cpu_in + c, wall_in + w
                    rounds += 1
                    wall = time.perf_counter() - wall0
                    if rounds >= MIN_ROUNDS and (wall >= self.window_s or time.process_time() >= deadline_cpu):
                        break
                    if wall >= self.max_wall_s:
                        break
                if wall_in <= 0.0:  # never settled: count the whole window
                    cpu_in = sum(sum(v) for v in cpu_times.values())
                    wall_in = time.perf_counter() - wall0
                results[i] = (cpu_times, cpu_in, wall_in, rounds)

            workers = [threading.Thread(target=worker, args=(i,), name=f"warm-refresh-{i}") for i in range(self.threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            self.last_cpu_s = time.process_time() - cpu_start
            self.last_runs = min(r[3] for r in results)
            out: dict[str, float] = {}
            for name, _, _ in self._sessions:
                out[name] = statistics.median(t for r in results for t in r[0][name])
            out[SHARE_KEY] = min(1.0, statistics.fmean(cpu / wall for _, cpu, wall, _ in results if wall > 0))
            out[THREADS_KEY] = float(self.threads)
            out[CORES_KEY] = float(self.cores)
            return out


_default: WarmRefresh | None = None
_default_lock = threading.Lock()


def measure() -> dict[str, float]:
    """The present measurement (sessions created on the first call, then reused)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WarmRefresh()
    return _default.measure()


def speed_per_cpu_second(now: dict[str, float], reference: dict[str, float]) -> float | None:
    """Median over the single-threaded probes of now / reference CPU time per run."""
    ratios = [
        now[k] / reference[k]
        for k in now.keys() & reference.keys()
        if k.startswith("cpu_") and reference[k] > 0 and now[k] > 0 and math.isfinite(now[k] / reference[k])
    ]
    return statistics.median(ratios) if ratios else None


def demand_from_share(measurement: dict[str, float]) -> float | None:
    """How many other tasks wanted the CPUs while the probe threads ran: cores / share - threads."""
    share, threads, cores = (measurement.get(k) for k in (SHARE_KEY, THREADS_KEY, CORES_KEY))
    if not share or not threads or not cores or share <= 0:
        return None
    return max(0.0, cores / min(share, 1.0) - threads)


def contention(measurement: dict[str, float]) -> float | None:
    """Slowdown from time slicing: 1 / the share of a core the probe threads got, with the
    penalty lock-stepped threads pay for it (monitors.speed.lockstep)."""
    from monitors.speed import lockstep

    share = measurement.get(SHARE_KEY)
    if not share or share <= 0:
        return None
    threads = int(measurement.get(THREADS_KEY, 1) or 1)
    return min(lockstep(1.0 / min(share, 1.0), threads), 50.0)


def slowdown(now: dict[str, float], reference: dict[str, float]) -> float | None:
    """How much slower one inference runs now than calibrated: speed per CPU-second times contention now.

    Contention is absolute, not relative to the reference: cold calibration keeps
    the fastest run of each micro-benchmark, which is the quiet device's speed
    even when other work ran meanwhile. None when the two have no probe in common.
    """
    speed = speed_per_cpu_second(now, reference)
    if speed is None:
        return None
    c_now = contention(now)
    return speed if c_now is None else speed * c_now


@dataclass(frozen=True)
class Marks:
    """The parts of a DeviceState whose change calls for a new measurement."""

    throttling: bool | None
    demand: float | None  # other tasks wanting a CPU (CpuState.demand)
    power_mode: str | None
    plugged: bool | None
    limit_mhz: float | None
    epp: str | None

    @classmethod
    def of(cls, state) -> "Marks":
        return cls(
            throttling=state.thermal.cpu_throttling,
            demand=state.cpu.demand,
            power_mode=state.power.power_mode,
            plugged=state.battery.plugged,
            limit_mhz=state.cpu.limit_mhz,
            epp=state.power.epp,
        )

    def differs(self, other: "Marks", load_delta_cores: float) -> str | None:
        """Why `other` is markedly different from these marks, or None."""
        if bool(self.throttling) != bool(other.throttling):
            return "throttling"
        a, b = self.demand, other.demand
        if a is not None and b is not None and abs(a - b) > load_delta_cores:
            return "load"
        if self.power_mode != other.power_mode:
            return "power mode"
        if self.plugged != other.plugged:
            return "plugged"
        if self.epp != other.epp:
            return "energy/performance preference"
        x, y = self.limit_mhz, other.limit_mhz
        if (x is None) != (y is None) or (x and y and abs(x - y) > 0.05 * max(x, y)):
            return "clock limit"
        return None


@dataclass
class RefreshPolicy:
    """When to run a warm refresh (pure: the caller passes the time).

    Due every `period_s`, and as soon as the budget allows after a marked state
    change (throttling flips, load by others moves by more than
    `load_delta_cores` since the last measurement, power mode, plugged, EPP or
    clock limit changes). After a refresh that cost `cpu_s` of CPU, the next
    one waits at least cpu_s / budget_fraction, so that refreshes never take
    more than `budget_fraction` of a core on average, however much the state
    flaps.
    """

    period_s: float = 60.0
    load_delta_cores: float = 0.5
    budget_fraction: float = 0.01
    min_gap_s: float = 2.0
    last_refresh_at: float | None = None
    last_change_at: float | None = None
    last_change: str | None = None
    next_allowed_at: float = -math.inf
    _baseline: Marks | None = field(default=None, repr=False)  # the state of the last measurement
    _changed_to: Marks | None = field(default=None, repr=False)  # the state that last marked a change

    def observe(self, state, now: float) -> str | None:
        """Feed each sampled state; returns what changed markedly (and records when), or None."""
        marks = Marks.of(state)
        if self._baseline is None:
            self._baseline = marks
            return None
        why = self._baseline.differs(marks, self.load_delta_cores)
        if why is None:
            return None
        if self._changed_to is not None and self._changed_to.differs(marks, self.load_delta_cores) is None:
            return None  # the same change as before, still pending
        self._changed_to = marks
        self.last_change_at = now
        self.last_change = why
        return why

    def change_pending(self) -> bool:
        if self.last_change_at is None:
            return False
        return self.last_refresh_at is None or self.last_change_at > self.last_refresh_at

    def due(self, now: float) -> bool:
        if now < self.next_allowed_at:
            return False
        if self.last_refresh_at is None or self.change_pending():
            return True
        return now - self.last_refresh_at >= self.period_s

    def refreshed(self, state, started_at: float, cpu_s: float) -> None:
        """Record a refresh that started at `started_at` (in `state`) and cost `cpu_s` of CPU."""
        self.last_refresh_at = started_at
        self._baseline = Marks.of(state)
        self._changed_to = None
        self.next_allowed_at = started_at + max(self.min_gap_s, cpu_s / self.budget_fraction)

    def measurement_current(self) -> bool:
        """True when the latest measurement was taken after the last marked state change."""
        return self.last_refresh_at is not None and not self.change_pending()
