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
import logging
import multiprocessing
import os
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from monitors.errors import BadInput, LimitExceeded
from monitors.graph import InputSpec
from monitors.limits import Limits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Analysis:
    plans: dict[str, str]       # device -> Plan.to_json(): what a monitor keeps on disk
    base_ms: dict[str, float]   # device -> calibrated latency on the quiet device
    memory_bytes: int           # weights + peak activations: must fit in a GPU's free memory
    written_mb: float = 0.0     # activations the CPU plan writes per inference (the handoff extra's bytes)


class EngineError(Exception):
    """The estimator failed in a way that is not the request's fault."""


# -- worker side (runs in the pool's processes) -------------------------------------

_ESTIMATOR: Any = None


def _init_worker(state_dir: str) -> None:
    global _ESTIMATOR
    from monitors.estimator import Estimator

    _ESTIMATOR = Estimator.load(Path(state_dir), device="auto", announce=None)


def _analyse(fmt: str, source: Any, inputs: dict[str, InputSpec], limits: Limits) -> Analysis:
    from monitors.importer import load_graph

    graph = load_graph(source, fmt=fmt, inputs=inputs or None, limits=limits)
    plans, base, memory, written = {}, {}, 0, 0.0
    for device in _ESTIMATOR.devices:
        plan = _ESTIMATOR.plan(graph, device)
        plans[device] = plan.to_json()
        base[device] = float(_ESTIMATOR.base_latency_ms(plan, device))
        memory = max(memory, int(plan.memory_bytes))
        if device == "cpu":
            written = plan.written_mb
    return Analysis(plans, base, memory, written)


def _rebase(plans: list[dict[str, str]]) -> list[dict[str, float]]:
    """Calibrated latencies again for stored plans (the calibration may have been redone)."""
    from monitors.kernels import Plan

    out = []
    for by_device in plans:
        out.append({device: float(_ESTIMATOR.base_latency_ms(Plan.from_json(text), device))
                    for device, text in by_device.items() if device in _ESTIMATOR.devices})
    return out


def _ping() -> tuple[str, ...]:
    return tuple(_ESTIMATOR.devices)


def ensure_calibrated(state_dir: Path, quick: bool) -> tuple[str, ...]:
    """Load (and, the first time, run) the calibrations; done once before the workers start."""
    from monitors.estimator import Estimator

    return Estimator.load(Path(state_dir), device="auto", quick=quick).devices


def quick_calibrations(state_dir: Path) -> tuple[str, ...]:
    """The devices whose saved calibration is quick (`daop-agent estimate` makes quick ones)."""
    from agent.calibration_store import load
    from monitors.estimator import DEVICES

    return tuple(d for d in DEVICES if (cal := load(state_dir, d)) is not None and cal.quick)


def run_full_calibrations(state_dir: Path, devices: tuple[str, ...]) -> None:
    from agent.calibration_store import run_calibration

    for device in devices:
        run_calibration(state_dir, device, quick=False)


# -- agent side ---------------------------------------------------------------------


class AnalysisPool:
    """Worker processes that import and plan graphs, each call bounded in time."""

    def __init__(self, state_dir: Path, workers: int = 2, timeout_s: float = 20.0, quick: bool = False) -> None:
        self.state_dir = Path(state_dir)
        self.devices: tuple[str, ...] = ()
        self.workers = workers
        self.timeout_s = timeout_s
        self.quick = quick  # a first calibration made here is quick
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._aside: concurrent.futures.ProcessPoolExecutor | None = None  # a calibration's own process
        self._ready = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def _new_pool(self, workers: int | None = None, init: bool = True) -> concurrent.futures.ProcessPoolExecutor:
        # forkserver: workers are forked from a clean process, not from this
        # one with its event loop and threads.
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["agent.analysis", "monitors.importer", "monitors.estimator"])
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=workers or self.workers, mp_context=ctx, initializer=_init_worker if init else None,
            initargs=(str(self.state_dir),) if init else ())

    async def start(self) -> None:
        """Calibrate if needed, then start the workers."""
        await self._aside_call(ensure_calibrated, self.state_dir, self.quick)
        self._pool = self._new_pool()
        self.devices = await asyncio.wrap_future(self._pool.submit(_ping))
        self._ready.set()

    async def calibrate_in_full(self) -> tuple[str, ...]:
        """Redo quick calibrations in full while the workers go on answering on them; then
        switch to fresh workers that load the full ones. Returns the devices redone."""
        redone = await self._aside_call(quick_calibrations, self.state_dir)
        if redone:
            log.info("the %s calibration is quick: calibrating in full in the background", ", ".join(redone))
            await self._aside_call(run_full_calibrations, self.state_dir, redone)
            old, self._pool = self._pool, self._new_pool()
            if old is not None:
                old.shutdown(wait=False)  # calls under way there finish on the quick calibration
            self.devices = await asyncio.wrap_future(self._pool.submit(_ping))
            self._ready.set()  # (a restart meanwhile waits on `old`'s readiness, which no longer counts)
        return redone

    async def _aside_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` in a process of its own (calibration: a minute of CPU), killed when the call is
        cancelled (the agent stops) or by close()."""
        pool = self._aside = self._new_pool(workers=1, init=False)
        try:
            return await asyncio.wrap_future(pool.submit(fn, *args))
        finally:
            self._aside = None
            _kill(pool)

    async def _warm(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        """Wait for fresh workers to load the estimator before timing requests again."""
        try:
            await asyncio.wrap_future(pool.submit(_ping))
        except Exception as exc:  # noqa: BLE001 - the next request reports it
            log.warning("estimator workers failed to start: %s", exc)
        if self._pool is pool:
            self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            raise BadInput("the agent is still calibrating; try again shortly", "not_ready") from None

    async def analyse(self, fmt: str, source: Any, inputs: dict[str, InputSpec], limits: Limits) -> Analysis:
        return await self._call(_analyse, fmt, source, inputs, limits)

    async def rebase(self, plans: list[dict[str, str]]) -> list[dict[str, float]]:
        return await self._call(_rebase, plans, timeout_s=max(self.timeout_s, 0.01 * len(plans)))

    async def _call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        timeout_s = timeout_s or self.timeout_s
        for attempt in range(2):
            await self._ready.wait()  # after a restart: until the new workers are up, untimed
            pool = self._pool
            if pool is None:
                raise EngineError("the estimator is not started")
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
                    raise EngineError("the estimator's worker died twice on this request") from None
            except BadInput:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug in the estimator must not stop the agent
                log.exception("estimator failed")
                raise EngineError(f"the estimator failed: {type(exc).__name__}: {exc}") from None
        raise EngineError("unreachable")

    def _restart(self, pool: concurrent.futures.ProcessPoolExecutor, why: str) -> None:
        if self._pool is not pool:
            return  # someone else restarted it already
        log.warning("restarting estimator workers: %s", why)
        _kill(pool)
        self._ready.clear()
        self._pool = self._new_pool()
        task = asyncio.get_running_loop().create_task(self._warm(self._pool))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for pool in (self._pool, self._aside):
            if pool is not None:
                _kill(pool)
        self._pool = self._aside = None


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
