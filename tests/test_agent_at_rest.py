"""At rest, only the agent: the estimator's workers start when a request needs them and leave after a quiet
period (`agent.estimate_idle_s`), and the agent's main process never loads what estimating needs, nor what the
warm refresh needs (it measures in a process of its own).

Real processes throughout: the estimator's pool in this process on the session's calibration, and the real
agent (`python -m agent run`) whose process tree is read from /proc. The idle period is short here (1 s);
nothing waits for it to pass by a fixed sleep, only for the log line or the process count that says so.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest
from agent_harness import agent_on, client, request_v5, write_config
from models import mlp
from test_agent_contract import SMALL

from agent.analysis import AnalysisPool
from monitors.graphs.limits import Limits

DEV = "rest1"
IDLE_S = 1.0
# What estimating loads: onnxruntime's library and onnx's C extension (the graph importers'). A process that
# maps either holds the estimator's memory.
HEAVY = ("libonnxruntime", "onnx_cpp2py_export")


def heavy_libraries(pid: int) -> set[str]:
    """Which of HEAVY the process maps now (/proc/<pid>/maps); none for a process that is gone."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {lib for lib in HEAVY if lib in maps}


def heavy_helpers(pid: int) -> dict[int, set[str]]:
    """The agent's descendants that map an estimating library: its estimator workers, a forkserver preloaded
    with the importers."""
    found = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:  # left between the listing and the look: no helper any more
            continue
        libs = heavy_libraries(child.pid)
        if libs:
            found[child.pid] = libs
    return found


async def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_the_pool_starts_workers_for_a_call_and_they_leave_after_the_idle_period(state_dir):
    pool = AnalysisPool(state_dir, workers=2, timeout_s=60.0, quick=True, idle_s=IDLE_S)
    try:
        await pool.start()
        assert pool.devices and pool.alive == 0, "calibrated, and no worker before a call"
        before = time.monotonic()
        first = await pool.analyse("onnx", mlp([64, 128, 10], batch=1).SerializeToString(), {}, Limits())
        assert pool.alive == 2, "a call started the workers (and they are still there right after it)"
        assert pool.own_work_since(before), "their start is the agent's own work for the sampler"
        assert not pool.own_work_since(time.monotonic()) and not pool.busy
        await wait_until(lambda: pool.alive == 0 and not pool.busy, "the workers did not leave after the idle period")
        assert pool.own_work_since(before + IDLE_S), "their leaving is the agent's own work for the sampler"
        again = await pool.analyse("onnx", mlp([64, 128, 10], batch=1).SerializeToString(), {}, Limits())
        assert again == first, "a call after they left starts them again, and is answered the same"
        rebased = await pool.rebase([first.plans])
        assert rebased[0] == (pytest.approx(first.base_ms), pytest.approx(first.stream_ms),
                              pytest.approx(first.gemm_ms))
        assert first.gemm_ms > 0, "an MLP's products are its time"
    finally:
        pool.close()


async def test_closing_the_pool_ends_workers_that_were_leaving_with_a_call_still_under_way(state_dir):
    """Workers that leave once their calls are done (as after a full calibration) go at once when the agent
    stops: its exit would otherwise wait for the call."""
    pool = AnalysisPool(state_dir, workers=1, timeout_s=120.0, quick=True, idle_s=60.0)
    try:
        await pool.start()
        await pool.analyse("onnx", mlp([64, 128, 10], batch=1).SerializeToString(), {}, Limits())
        assert pool.alive == 1
        workers = [psutil.Process(pid) for pid in pool._pool._processes]  # the executor names them only here
        large = mlp([4] * 10_000, batch=1).SerializeToString()  # seconds of pricing
        call = asyncio.get_running_loop().create_task(pool.analyse("onnx", large, {}, Limits()))
        await wait_until(lambda: pool.busy, "the call did not start")
        await asyncio.sleep(0.3)
        pool._leave(pool._pool)  # as calibrate_in_full lets them go: the call under way finishes first
    finally:
        pool.close()
    assert not call.done()
    gone, alive = psutil.wait_procs(workers, timeout=1.0)
    assert not alive, "a leaving worker outlived close() by a second"
    call.cancel()


async def estimate(port: int) -> dict:
    async with client(port) as c:
        answer, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL}, timeout=60)
    assert answer["status"] == "ok", answer
    return answer["data"]


async def create(port: int, monitor: str) -> None:
    async with client(port) as c:
        answer, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "poor",
                                                                 "monitor": monitor}, timeout=60)
    assert answer["status"] == "ok", answer


@pytest.mark.slow
async def test_an_agent_with_monitors_holds_no_estimator_at_rest_and_starts_it_for_a_request(
        state_dir, mosquitto, device, tmp_path):
    config = write_config(tmp_path, f"[agent]\nestimate_idle_s = {IDLE_S}\n")
    agent = agent_on(device, state_dir, mosquitto.url, config, DEV).start()
    try:
        await create(mosquitto.port, "a")
        await create(mosquitto.port, "b")
    finally:
        assert agent.stop() == 0
    agent.start()  # a fresh agent with stored monitors: it re-prices them in the workers at start
    try:
        assert agent.proc is not None
        pid = agent.proc.pid
        assert "warm refresh off" not in agent.log
        agent.wait_log("warm refresh: ", timeout=60)  # the warm refresh is on, and has run
        agent.wait_log("estimator workers left", timeout=60)
        await wait_until(lambda: heavy_helpers(pid) == {}, "something estimating stays resident at rest")
        assert heavy_libraries(pid) == set(), \
            "the agent's own process never loads what estimating or the warm refresh needs"

        started = agent.log.count("estimator workers starting")
        assert (await estimate(mosquitto.port))["performanceTier"]
        assert agent.log.count("estimator workers starting") == started + 1, "the request started the workers"
        agent.wait_log("estimator workers left", count=2, timeout=60)
        await wait_until(lambda: heavy_helpers(pid) == {}, "the workers did not leave again after the idle period")
        assert heavy_libraries(pid) == set()
    finally:
        assert agent.stop() == 0
