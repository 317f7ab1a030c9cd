"""The agent's warm refresh: one at a time, and paired with the sample whose interval holds it.

An in-process agent on a fixture /sys and /proc tree (this machine's real load would move the
prediction) with a real broker; the refresh's `measure` is a stand-in that says 3x slower than
the calibration's reference and takes 0.5 s, five sample intervals. Six other tasks start
wanting a CPU when the refresh does, so the sample before it and the one after it predict
different slowdowns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from agent.calibration_store import load as load_calibration
from agent.config import load_config
from agent.service import Agent
from agent.simulation.trees import vm
from monitors.speed.prediction import predict_cpu
from monitors.speed.present import fastest
from probes.refresh import HANDOFF_KEY, HANDOFF_MB, LOCKSTEP_KEY
from probes.state import Sampler


@contextlib.asynccontextmanager
async def vm_agent(state_dir, broker, tree, device_id: str, measure):
    """A running agent on the fixture tree, with `measure` as its warm refresh."""

    cfg = load_config(None, {"broker": broker.url, "device_id": device_id, "state_dir": str(state_dir),
                             "sysfs_root": str(tree.sys), "procfs_root": str(tree.proc), "sample_interval_s": 0.1,
                             "calibration": "quick"})
    agent = Agent(cfg, sampler=Sampler(tree.sys, tree.proc, ppd=False), measure=measure)
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        yield agent, task
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)


async def until(task: asyncio.Task, condition) -> None:
    for _ in range(600):
        if condition():
            return
        assert not task.done(), task
        await asyncio.sleep(0.05)


async def test_agent_on_a_vm_fixture_tree_runs_one_slow_refresh_at_a_time_and_pairs_it_with_the_next_sample(
        state_dir, mosquitto, tmp_path):

    reference = load_calibration(state_dir, "cpu").refresh_reference
    calls: list[float] = []
    lock = threading.Lock()
    tree = vm(tmp_path / "tree")

    def measure() -> dict[str, float]:
        with lock:
            calls.append(time.monotonic())
        tree.set_stat(busy=5000, idle=14000, steal=1000, running=7)
        time.sleep(0.5)
        return {**reference, LOCKSTEP_KEY: 3.0 * reference[LOCKSTEP_KEY]}

    async with vm_agent(state_dir, mosquitto, tree, "refresh1", measure) as (agent, task):
        await until(task, lambda: agent.speed.measurement is not None)
        m = agent.speed.measurement
        assert m.slowdown == pytest.approx(3.0)
        # paired with a sample taken after the refresh began: the loaded prediction, not the quiet one
        prediction = predict_cpu(agent.speed.state, agent.speed.threads)
        assert m.predicted > 2.0 and m.predicted == pytest.approx(prediction.factor)
        # ... and its share from time slicing, which a later state change carries the measurement over with
        assert m.contention > 2.0 and m.contention == pytest.approx(prediction.contention)
        await asyncio.sleep(1.0)  # ten more samples; the policy's 2 s gap has not passed
        assert len(calls) == 1, calls  # samples during the 0.5 s refresh did not queue another


async def test_agent_on_a_vm_fixture_tree_charges_a_refresh_s_handoff_extra_by_the_bytes_a_model_writes(
        state_dir, mosquitto, tmp_path):
    """A slow phase of the host: the compute probe as calibrated, the handoff probe 0.1 ms slower per MB it
    writes. The agent adds that per MB to a CPU latency: a 40 MB model +4 ms, one that writes nothing +0."""

    reference = load_calibration(state_dir, "cpu").refresh_reference
    assert HANDOFF_KEY in reference  # the calibration read both probes

    def measure() -> dict[str, float]:
        return {**reference, HANDOFF_KEY: reference[HANDOFF_KEY] + HANDOFF_MB * 1e-4}

    async with vm_agent(state_dir, mosquitto, vm(tmp_path / "tree"), "refresh2", measure) as (agent, task):
        await until(task, lambda: agent.speed.speed.handoff_ms_per_mb > 0)
        speed = agent.speed.speed
        assert speed.handoff_ms_per_mb == pytest.approx(0.1)
        assert fastest({"cpu": 10.0}, speed, 0, 40.0) == (pytest.approx(10.0 * speed.cpu + 4.0), "cpu")
        assert fastest({"cpu": 10.0}, speed, 0, 0.0) == (pytest.approx(10.0 * speed.cpu), "cpu")

