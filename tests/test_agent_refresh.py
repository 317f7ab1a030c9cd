"""The agent's warm refresh: one at a time, and paired with the sample whose interval holds it.

An in-process agent on a fixture /sys and /proc tree (this machine's real load would move the
prediction) with a real broker; the refresh's `measure` is a stand-in that says 3x slower than
the calibration's reference and takes 0.5 s, five sample intervals. Six other tasks start
wanting a CPU when the refresh does, so the sample before it and the one after it predict
different slowdowns.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import time

import pytest
from agent_harness import client, request_v5
from models import weightless_mlp

from agent.calibration_store import load as load_calibration
from agent.config import load_config
from agent.service import Agent
from agent.simulation.trees import vm
from monitors.speed.prediction import predict_cpu
from monitors.speed.present import fastest, memory_multiplier
from probes.refresh import HANDOFF_KEY, HANDOFF_MB, LOCKSTEP_KEY, STREAM_KEY
from probes.state import Sampler


@contextlib.asynccontextmanager
async def vm_agent(state_dir, broker, tree, device_id: str, measure, config=None):
    """A running agent on the fixture tree, with `measure` as its warm refresh (and the TOML file `config`)."""

    cfg = load_config(config, {"broker": broker.url, "device_id": device_id, "state_dir": str(state_dir),
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
    raise AssertionError("not within 30 s")


async def test_agent_on_a_vm_fixture_tree_runs_one_slow_refresh_at_a_time_and_pairs_it_with_the_next_sample(
        state_dir, mosquitto, tmp_path):

    reference = load_calibration(state_dir, "cpu").refresh_reference
    calls: list[float] = []
    lock = threading.Lock()
    tree = vm(tmp_path / "tree")

    def measure(stream: bool = False) -> dict[str, float]:
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

    def measure(stream: bool = False) -> dict[str, float]:
        return {**reference, HANDOFF_KEY: reference[HANDOFF_KEY] + HANDOFF_MB * 1e-4}

    async with vm_agent(state_dir, mosquitto, vm(tmp_path / "tree"), "refresh2", measure) as (agent, task):
        await until(task, lambda: agent.speed.speed.handoff_ms_per_mb > 0)
        speed = agent.speed.speed
        assert speed.handoff_ms_per_mb == pytest.approx(0.1)
        assert fastest({"cpu": 10.0}, speed, 0, 40.0) == (pytest.approx(10.0 * speed.cpu + 4.0), "cpu")
        assert fastest({"cpu": 10.0}, speed, 0, 0.0) == (pytest.approx(10.0 * speed.cpu), "cpu")


async def test_agent_on_a_vm_fixture_tree_reads_memory_s_speed_only_while_a_monitor_streams_and_charges_that_monitor(
        state_dir, mosquitto, tmp_path):
    """A neighbour takes memory bandwidth: the stream probe reads 2x its reference, the compute probe as calibrated.
    The agent runs the stream probe only while a monitor's model streams its weights (an MLP of 256 MB), and
    that monitor's latency pays the memory multiplier on its streamed time alone."""

    reference = load_calibration(state_dir, "cpu").refresh_reference
    assert STREAM_KEY in reference  # the calibration read the stream probe
    asked: list[bool] = []

    def measure(stream: bool = False) -> dict[str, float]:
        asked.append(stream)
        return {**reference, STREAM_KEY: 2.0 * reference[STREAM_KEY]} if stream else \
            {k: v for k, v in reference.items() if k != STREAM_KEY}

    streaming = base64.b64encode(weightless_mlp(4096, 4, 1)).decode()
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\nrefresh_interval_s = 0.5\n")
    async with vm_agent(state_dir, mosquitto, vm(tmp_path / "tree"), "refresh3", measure, config) as (agent, task):
        await until(task, lambda: len(asked) >= 1)
        assert asked == [False] and agent.speed.speed.memory == 1.0  # no monitor yet: no buffer, no reading
        async with client(mosquitto.port) as c:
            created, _ = await request_v5(c, "refresh3", "monitors/create",
                                          {"onnx": streaming, "requiredTier": "poor", "monitor": "big"})
            assert created["status"] == "ok", created
            (w,) = agent.registry.book.records["big"].workloads
            assert w.stream_ms > 0.5 * w.base_ms["cpu"]  # its weights come from memory
            # the monitor's estimate is priced at the speed of the last tick, which follows the refresh's reading
            # at the next evaluation: wait for that, not for the present speed alone
            await until(task, lambda: agent.book.table.speed_of("big").memory
                        == pytest.approx(memory_multiplier(2.0), rel=1e-3))
            assert asked[-1] is True, asked
            speed = agent.book.table.speed_of("big")
            (latency,) = agent.book.estimates_ms()["big"]
            own = w.base_ms["cpu"] + w.stream_ms * (speed.memory - 1.0) + w.gemm_ms * (speed.gemm - 1.0)
            assert latency == pytest.approx(own * speed.cpu + w.written_mb * speed.handoff_ms_per_mb, rel=1e-3)
            deleted, _ = await request_v5(c, "refresh3", "monitors/delete", {"monitor": "big"})
            assert deleted["status"] == "ok", deleted
            count = len(asked)
            await until(task, lambda: len(asked) > count)
            assert asked[-1] is False  # nothing streams now: the probe's buffer goes
