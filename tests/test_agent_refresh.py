"""The agent's warm refresh: one at a time, and paired with the sample whose interval holds it.

An in-process agent on a fixture /sys and /proc tree (this machine's real load would move the
prediction) with a real broker; the refresh's `measure` is a stand-in that says 3x slower than
the calibration's reference and takes 0.5 s, five sample intervals. Six other tasks start
wanting a CPU when the refresh does, so the sample before it and the one after it predict
different slowdowns.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from broker import mosquitto  # noqa: F401 - fixture
from probes.refresh import LOCKSTEP_KEY
from probes.state import Sampler
from sysfs_trees import vm


async def test_agent_on_a_vm_fixture_tree_runs_one_slow_refresh_at_a_time_and_pairs_it_with_the_next_sample(
        state_dir, mosquitto, tmp_path):  # noqa: F811
    from agent.calibration_store import load as load_calibration
    from agent.config import load_config
    from agent.service import Agent
    from monitors.speed import predict_cpu

    reference = load_calibration(state_dir, "cpu").refresh_reference
    calls: list[float] = []
    lock = threading.Lock()

    def measure() -> dict[str, float]:
        with lock:
            calls.append(time.monotonic())
        tree.set_stat(busy=5000, idle=14000, steal=1000, running=7)
        time.sleep(0.5)
        return {**reference, LOCKSTEP_KEY: 3.0 * reference[LOCKSTEP_KEY]}

    tree = vm(tmp_path / "tree")
    cfg = load_config(None, {"broker": mosquitto.url, "device_id": "refresh1", "state_dir": str(state_dir),
                             "sysfs_root": str(tree.sys), "procfs_root": str(tree.proc), "sample_interval_s": 0.1,
                             "calibration": "quick"})
    agent = Agent(cfg, sampler=Sampler(tree.sys, tree.proc, ppd=False), measure=measure)
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        for _ in range(600):
            if agent._measured is not None:
                break
            assert not task.done(), task
            await asyncio.sleep(0.05)
        assert agent._measured == pytest.approx(3.0)
        # paired with a sample taken after the refresh began: the loaded prediction, not the quiet one
        assert agent._measured_predicted > 2.0
        assert agent._measured_predicted == pytest.approx(predict_cpu(agent._last_state, agent._cores)[0])
        await asyncio.sleep(1.0)  # ten more samples; the policy's 2 s gap has not passed
        assert len(calls) == 1, calls  # samples during the 0.5 s refresh did not queue another
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)
