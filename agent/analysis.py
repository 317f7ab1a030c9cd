"""Graph import and planning off the event loop, in worker processes with a time limit.

A request's graph comes from an untrusted app. Importing and planning it is
CPU work that can take seconds for a big model, so it runs in a small process
pool: the event loop keeps answering, and a request that overruns the time
limit gets its worker killed (a thread could not be stopped) and an error
answer. What comes back is only the kernel plan and the calibrated quiet-device
latency per device; the present latency is that times the device's present
slow-down factor, the same arithmetic the monitors use on every tick, so an
`estimate` answer and a monitor never disagree.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import functools
import logging
import math
import multiprocessing
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.progress import LogProgress
from agent.protocol import graph_in_request
from monitors.errors import BadInput, LimitExceeded
from monitors.graphs.graph import InputSpec
from monitors.graphs.limits import Limits
from monitors.pricing.generation import GenerationSpec
from monitors.pricing.kernels import Plan
from monitors.speed.present import Speed, fastest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Analysis:
    plans: dict[str, str]       # device -> Plan.to_json(): what a monitor keeps on disk
    base_ms: dict[str, float]   # device -> calibrated latency on the quiet device
    memory_bytes: int           # weights + peak activations (+ KV cache): must fit in the memory free now
    written_mb: float = 0.0     # activations the CPU plan writes per inference (the handoff extra's bytes)
    stream_ms: float = 0.0      # what the CPU latency gains per unit of memory slowdown (Estimator.stream_ms)
    gemm_ms: float = 0.0        # ... and per unit of gemm slowdown (Estimator.gemm_ms)
    # A generation's phases, by device, at rest: (time to first token, time per output token) in ms, and
    # the MB the prefill and one decode step write and their stream_ms and gemm_ms on the CPU; empty for one
    # inference.
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    phase_written_mb: tuple[float, float] = (0.0, 0.0)
    phase_stream_ms: tuple[float, float] = (0.0, 0.0)
    phase_gemm_ms: tuple[float, float] = (0.0, 0.0)

    def present(self, speed: Speed) -> tuple[float, str]:
        """The fastest device's latency at `speed` (inf where it does not fit now), and that device."""
        return fastest(self.base_ms, speed, self.memory_bytes, self.written_mb, self.stream_ms, self.gemm_ms)


class EngineError(Exception):
    """The estimator failed in a way that is not the request's fault."""


# -- worker side (runs in the pool's processes) -------------------------------------

_ESTIMATOR: Any = None
PR_SET_PDEATHSIG = 1
PARENT_WATCH_S = 1.0


def die_with_agent(agent_pid: int) -> None:
    """In a helper process: die with the agent, even when it is killed with SIGKILL outside systemd.

    PR_SET_PDEATHSIG fires when this process's parent (the forkserver) dies, which need not be when the agent
    does; so a thread also waits for the agent's end: on a pidfd of it, which wakes it only then, or where pidfds
    are missing (Linux before 5.3) by looking every PARENT_WATCH_S."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    parent = os.getppid()
    try:
        agent = os.pidfd_open(agent_pid)
    except (OSError, AttributeError):
        agent = None

    def watch() -> None:
        if agent is not None:
            select.select([agent], [], [])  # readable once the agent has ended
            os._exit(1)
        while True:
            time.sleep(PARENT_WATCH_S)
            if os.getppid() != parent or not os.path.exists(f"/proc/{agent_pid}"):
                os._exit(1)

    threading.Thread(target=watch, name="agent-watch", daemon=True).start()


def memory_ceiling(memory_mb: int) -> None:
    """This process's address space capped at `memory_mb` (never above a hard limit already set): a request that
    needs more fails in the worker with MemoryError (or kills it), never the agent."""
    limit = memory_mb << 20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _init_worker(state_dir: str, agent_pid: int, memory_mb: int | None) -> None:
    global _ESTIMATOR
    from agent import calibration_store  # noqa: PLC0415 - loads onnxruntime: only in the worker or calibration process that calls it

    die_with_agent(agent_pid)  # the estimator loads unbounded (trusted, the device's own), then the ceiling
    _ESTIMATOR = calibration_store.load_estimator(Path(state_dir), device="auto", announce=None)
    if memory_mb is not None:
        memory_ceiling(memory_mb)


def _init_aside(agent_pid: int) -> None:
    die_with_agent(agent_pid)


def _out_of_memory(what: str) -> LimitExceeded:
    return LimitExceeded(f"{what} needs more memory than the agent gives one worker (limits.worker_memory_mb)")


def _analyse(fmt: str, source: Any, inputs: dict[str, InputSpec], limits: Limits,
             generation: GenerationSpec | None = None) -> Analysis:
    try:
        return _analyse_unbounded(fmt, source, inputs, limits, generation)
    except MemoryError:
        raise _out_of_memory("estimating this graph") from None


def _analyse_unbounded(fmt: str, source: Any, inputs: dict[str, InputSpec], limits: Limits,
                       generation: GenerationSpec | None = None) -> Analysis:
    from monitors.graphs.importer import load_graph  # noqa: PLC0415 - runs in the estimator workers: the agent's main process never loads the importers

    if fmt == "json-request":  # a large request's graph, read from its payload here (agent/protocol.py)
        fmt, source = "json", graph_in_request(source)
    if generation is not None:
        return _analyse_generation(fmt, source, limits, generation)
    graph = load_graph(source, fmt=fmt, inputs=inputs or None, limits=limits)
    plans, base, memory, written, stream, gemm = {}, {}, 0, 0.0, 0.0, 0.0
    for device in _ESTIMATOR.devices:
        plan = _ESTIMATOR.plan(graph, device)
        plans[device] = plan.to_json()
        base[device] = float(_ESTIMATOR.base_latency_ms(plan, device))
        memory = max(memory, int(plan.memory_bytes))
        if device == "cpu":
            written, stream, gemm = plan.written_mb, _ESTIMATOR.stream_ms(plan), _ESTIMATOR.gemm_ms(plan)
    return Analysis(plans, base, memory, written, stream, gemm)


def _ms(seconds: Callable[[Plan], float], plan: Plan) -> float:
    """A CostModel figure of `plan` (its latency, or a secant of it) in ms."""
    return 1000.0 * seconds(plan)


def _analyse_generation(fmt: str, source: Any, limits: Limits, spec: GenerationSpec) -> Analysis:
    """A generation's plans by device: the whole at rest is what monitors keep, its phases what `estimate` tells."""
    from monitors.graphs.importer import load_decoder  # noqa: PLC0415 - runs in the estimator workers: the agent's main process never loads the importers
    from monitors.pricing.generation import generation_times  # noqa: PLC0415 - runs in the estimator workers: the agent's main process never loads the importers

    model = load_decoder(source, fmt=fmt, limits=limits)
    plans, base, phases, memory = {}, {}, {}, 0
    written, phase_written, stream, phase_stream, gemm, phase_gemm = 0.0, (0.0, 0.0), 0.0, (0.0, 0.0), 0.0, (0.0, 0.0)
    for device in _ESTIMATOR.devices:
        plan = _ESTIMATOR.plan_generation(model.decoder, spec, model.graph, device)
        costs = _ESTIMATOR.models[device]
        times = generation_times(plan, functools.partial(_ms, costs.seconds))
        plans[device] = plan.to_json()
        base[device] = times.total_ms
        phases[device] = (times.ttft_ms, times.tpot_ms)
        memory = max(memory, plan.memory_bytes)
        if device == "cpu":
            steps = sum(w for _, w, _ in plan.decode)
            written = plan.written_mb
            phase_written = (plan.prefill.written_mb, (written - plan.prefill.written_mb) / steps if steps else 0.0)
            streams = generation_times(plan, functools.partial(_ms, costs.stream_seconds))
            stream, phase_stream = streams.total_ms, (streams.ttft_ms, streams.tpot_ms)
            gemms = generation_times(plan, functools.partial(_ms, costs.gemm_seconds))
            gemm, phase_gemm = gemms.total_ms, (gemms.ttft_ms, gemms.tpot_ms)
    return Analysis(plans, base, memory, written, stream, gemm, phases, phase_written, phase_stream, phase_gemm)


def _rebase(plans: list[dict[str, str]]) -> list[tuple[dict[str, float], float, float]]:
    """Calibrated latencies again for stored plans (the calibration may have been redone), by device, and the
    CPU plan's stream_ms and gemm_ms."""
    from monitors.pricing.generation import plan_from_json  # noqa: PLC0415 - runs in the estimator workers: the agent's main process never loads the importers

    out = []
    for by_device in plans:
        parsed = {device: plan_from_json(text) for device, text in by_device.items() if device in _ESTIMATOR.devices}
        cpu = parsed.get("cpu")
        out.append(({device: float(_ESTIMATOR.base_latency_ms(plan, device)) for device, plan in parsed.items()},
                    float(_ESTIMATOR.stream_ms(cpu)) if cpu is not None else 0.0,
                    float(_ESTIMATOR.gemm_ms(cpu)) if cpu is not None else 0.0))
    return out


def _ping() -> tuple[str, ...]:
    return tuple(_ESTIMATOR.devices)


@dataclass(frozen=True)
class EngineFacts:
    """What the agent's own process knows of the estimator, read where onnxruntime is loaded (the calibration's
    process), so that the agent's never loads it: the devices calibrated, the CPU calibration's warm-refresh
    reference, and onnxruntime's execution providers."""

    devices: tuple[str, ...] = ()
    refresh_reference: dict[str, float] = field(default_factory=dict)
    providers: tuple[str, ...] = ()


def engine_facts(state_dir: Path, quick: bool) -> EngineFacts:
    """Load (and, the first time, run) the calibrations, saying how far in the log; then the facts the agent's
    process needs. Runs in the calibration's process."""
    from agent import calibration_store  # noqa: PLC0415 - loads onnxruntime: only in the worker or calibration process that calls it
    from probes import providers  # noqa: PLC0415 - loads onnxruntime: only in the worker or calibration process that calls it

    progress = LogProgress(f"no calibration yet: calibrating{' (quick)' if quick else ''}")
    devices = calibration_store.load_estimator(Path(state_dir), device="auto", quick=quick, progress=progress,
                                               announce=None).devices
    cpu = calibration_store.load(state_dir, "cpu")
    return EngineFacts(tuple(devices), dict(cpu.refresh_reference) if cpu is not None else {},
                       providers.installed())


def quick_calibrations(state_dir: Path) -> tuple[str, ...]:
    """The devices whose saved calibration is quick (`daop-agent estimate` makes quick ones)."""
    from agent.calibration_store import load  # noqa: PLC0415 - loads onnxruntime: only in the worker or calibration process that calls it
    from monitors.devices import DEVICES  # noqa: PLC0415 - loads onnxruntime: only in the worker or calibration process that calls it

    return tuple(d for d in DEVICES if (cal := load(state_dir, d)) is not None and cal.quick)


def run_full_calibrations(state_dir: Path) -> EngineFacts:
    """Redo the state dir's quick calibrations in full, under the lock that
    `daop-agent calibrate --if-quick` holds: where a first `estimate` has already started one, wait for it
    rather than measure beside it. Returns the facts of the calibrations now."""
    from agent.calibration_store import upgrade_in_full  # noqa: PLC0415 - loads onnxruntime: only in the worker or calibration process that calls it

    upgrade_in_full(state_dir, lambda device: LogProgress(f"calibrating {device} in full"), wait=True)
    return engine_facts(state_dir, quick=False)


# -- agent side ---------------------------------------------------------------------


class AnalysisPool:
    """Worker processes that import and plan graphs, each call bounded in time.

    The workers start with the first call that needs them and leave after `idle_s` without one: at rest the
    agent holds neither onnxruntime nor a graph importer. They are spawned (a fresh interpreter each, about a
    third of a second to load the estimator), so that nothing of the agent's process is copied into them and no
    fork server stays behind."""

    def __init__(self, state_dir: Path, workers: int = 2, timeout_s: float = 20.0, quick: bool = False,
                 memory_mb: int | None = None, idle_s: float = 60.0) -> None:
        self.state_dir = Path(state_dir)
        self.memory_mb = memory_mb  # each worker's address space (RLIMIT_AS), None: unbounded
        self.facts = EngineFacts()
        self.workers = workers
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self.quick = quick  # a first calibration made here is quick
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()  # one start of the workers at a time; the calls meanwhile wait for it
        self._spawning: concurrent.futures.ProcessPoolExecutor | None = None  # workers being started
        self._aside: concurrent.futures.ProcessPoolExecutor | None = None  # a calibration's own process
        self._leaving: set[concurrent.futures.ProcessPoolExecutor] = set()  # workers finishing their calls
        self._ready = asyncio.Event()
        self._retire: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The agent's own work, which the present speed must not read as load: calls under way in the workers, a
        # calibration under way, workers starting or leaving, when the last of these ended, and a count that moves
        # whenever work starts or ends (a warm refresh that saw it move overlapped the agent's own work).
        self._in_flight = 0
        self._changing = 0  # worker processes starting or leaving now
        self.calibrating = False
        self.error: str | None = None  # why the estimator cannot start (start); None while it can
        self.own_work_ended_at = -math.inf  # a calibration's end, or workers started or gone (reaped)
        self.work_marker = 0

    @property
    def devices(self) -> tuple[str, ...]:
        return self.facts.devices

    def _new_pool(self, workers: int | None = None, init: bool = True) -> concurrent.futures.ProcessPoolExecutor:
        ctx = multiprocessing.get_context("spawn")  # a clean interpreter: not this one with its loop and threads
        if init:
            return concurrent.futures.ProcessPoolExecutor(
                max_workers=workers or self.workers, mp_context=ctx, initializer=_init_worker,
                initargs=(str(self.state_dir), os.getpid(), self.memory_mb))
        return concurrent.futures.ProcessPoolExecutor(max_workers=workers or self.workers, mp_context=ctx,
                                                      initializer=_init_aside, initargs=(os.getpid(),))

    async def start(self) -> None:
        """Calibrate if needed, and learn what the agent's process needs of the estimator (EngineFacts). The
        workers start with the first call. A failure is kept (`error`): every later call is answered with it."""
        try:
            self.facts = await self._aside_call(engine_facts, self.state_dir, self.quick)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        self._ready.set()

    async def calibrate_in_full(self) -> tuple[str, ...]:
        """Redo quick calibrations in full while the workers go on answering on them; then the next call starts
        fresh workers that load the full ones. Returns the devices redone."""
        redone = await self._aside_call(quick_calibrations, self.state_dir)
        if redone:
            log.info("the %s calibration is quick: calibrating in full in the background", ", ".join(redone))
            self.facts = await self._aside_call(run_full_calibrations, self.state_dir)
            if self._pool is not None:  # calls under way there finish on the quick calibration
                self._leave(self._pool)
        return redone

    @property
    def busy(self) -> bool:
        """The agent's own heavy work is under way: a calibration, calls in the workers, workers starting or
        leaving."""
        return self.calibrating or self._in_flight > 0 or self._changing > 0

    @property
    def alive(self) -> int:
        """Worker processes up now."""
        return len(getattr(self._pool, "_processes", None) or {}) if self._pool is not None else 0

    def own_work_since(self, t: float) -> bool:
        """A calibration ran, or worker processes started or left, at some time after monotonic `t`: a sample
        over that time may have read the agent's own work as others' load (its processes' time is split between
        them and their parent as they start and end)."""
        return self.calibrating or self._changing > 0 or self.own_work_ended_at >= t

    def _marked(self) -> None:
        self.own_work_ended_at = time.monotonic()
        self.work_marker += 1

    async def _aside_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` in a process of its own (calibration: a minute of CPU), killed when the call is
        cancelled (the agent stops) or by close()."""
        pool = self._aside = self._new_pool(workers=1, init=False)
        self.calibrating = True
        self.work_marker += 1
        try:
            return await asyncio.wrap_future(pool.submit(fn, *args))
        finally:
            self._aside = None
            _kill(pool)
            self.calibrating = False
            self._marked()

    async def _workers(self) -> concurrent.futures.ProcessPoolExecutor:
        """The running workers, started (every one, each with the estimator loaded) if there are none."""
        async with self._starting:
            if self._pool is None:
                self._pool = await self._start_workers()
            return self._pool

    async def _start_workers(self) -> concurrent.futures.ProcessPoolExecutor:
        log.info("estimator workers starting (%d)", self.workers)
        pool = self._spawning = self._new_pool()
        self._changing += 1
        self.work_marker += 1
        try:
            # one call per worker at once: the executor starts a process for each, as none is idle yet
            await asyncio.gather(*(asyncio.wrap_future(pool.submit(_ping)) for _ in range(self.workers)))
        except BaseException:
            _kill(pool)
            raise
        finally:
            self._spawning = None
            self._changing -= 1
            self._marked()
        return pool

    def _leave(self, pool: concurrent.futures.ProcessPoolExecutor, kill: bool = False) -> None:
        """The workers go (killed, or once their calls are done); the next call starts new ones."""
        if self._pool is pool:
            self._pool = None
        self._changing += 1
        self.work_marker += 1
        self._leaving.add(pool)

        async def reaped() -> None:
            try:
                if kill:
                    _kill(pool)
                await asyncio.to_thread(pool.shutdown, True)  # every process ended and reaped
                log.info("estimator workers left")
            finally:
                self._leaving.discard(pool)
                self._changing -= 1
                self._marked()

        task = asyncio.get_running_loop().create_task(reaped())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _idle_later(self) -> None:
        """The workers leave after `idle_s` without a call."""
        if self._retire is not None:
            self._retire.cancel()
        self._retire = asyncio.get_running_loop().call_later(self.idle_s, self._leave_if_idle)

    def _leave_if_idle(self) -> None:
        self._retire = None
        if self._pool is not None and self._in_flight == 0:
            log.debug("estimator workers leaving: no request for %g s", self.idle_s)
            self._leave(self._pool)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the estimator has started (BadInput after `timeout_s`; EngineError where it cannot start)."""
        if self.error is not None:
            raise EngineError(f"the estimator is unavailable: {self.error}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            raise BadInput("the agent is still calibrating; try again shortly", "not_ready") from None

    async def analyse(self, fmt: str, source: Any, inputs: dict[str, InputSpec], limits: Limits,
                      generation: GenerationSpec | None = None) -> Analysis:
        return await self._call(_analyse, fmt, source, inputs, limits, generation)

    async def parse(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A large request's payload read in a worker (JSON, base64: seconds of CPU and many times its size in
        memory), under the worker's memory ceiling and time limit, so the event loop keeps serving."""
        return await self._call(fn, *args)

    async def rebase(self, plans: list[dict[str, str]]) -> list[tuple[dict[str, float], float, float]]:
        return await self._call(_rebase, plans, timeout_s=max(self.timeout_s, 0.01 * len(plans)))

    async def _call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        self._in_flight += 1
        self.work_marker += 1
        try:
            return await self._call_bounded(fn, *args, timeout_s=timeout_s or self.timeout_s)
        finally:
            self._in_flight -= 1
            self.work_marker += 1
            self._idle_later()

    async def _call_bounded(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        for attempt in range(2):
            await self._ready.wait()  # the calibration first
            try:
                pool = await self._workers()  # their start untimed
            except Exception as exc:
                log.exception("estimator workers failed to start")
                raise EngineError(f"the estimator workers failed to start: {type(exc).__name__}: {exc}") from None
            future = pool.submit(fn, *args)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
            except TimeoutError:
                self._restart(pool, "a request ran past the time limit")
                raise LimitExceeded(f"estimating took longer than the limit of {timeout_s:g} s") from None
            except BrokenProcessPool:
                # a worker died (killed for another request's timeout, or out of memory): retry once
                self._restart(pool, "a worker died")
                if attempt:
                    raise LimitExceeded("the worker estimating this request died twice (most likely it needed more "
                                        "memory than limits.worker_memory_mb)") from None
            except BadInput:
                raise
            except Exception as exc:
                log.exception("estimator failed")
                raise EngineError(f"the estimator failed: {type(exc).__name__}: {exc}") from None
        raise EngineError("unreachable")

    def _restart(self, pool: concurrent.futures.ProcessPoolExecutor, why: str) -> None:
        if self._pool is not pool:
            return  # someone else restarted it already
        log.warning("restarting estimator workers: %s", why)
        self._leave(pool, kill=True)

    def close(self) -> None:
        if self._retire is not None:
            self._retire.cancel()
        # workers still finishing a call go too: else the agent's exit would wait for it (the thread that reaps
        # them is joined at exit)
        for pool in (self._pool, self._spawning, self._aside, *self._leaving):
            if pool is not None:
                _kill(pool)
        self._pool = self._spawning = self._aside = None


def _kill(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    for proc in list(getattr(pool, "_processes", {}).values()):  # the executor has no public kill
        try:
            proc.kill()
        except (OSError, AttributeError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
