"""The agent's own work is never load by others: real agent processes on this machine's real processes.

The agent reads a device /proc (device_proc.py): the real /proc of the test's processes, without the host's
other tenants, whose load would be real contention to the agent and is not what these tests are about.

A monitor's model is sized so that it meets `good` (< 100 ms) at rest with room to spare, and misses it
at 3x: what the agent read when it took its own calibration for two other tasks wanting a CPU. Each test
ends with real busy processes of others (outside the agent's process tree) turning the same monitor
false, so that a monitor that could not move would fail it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time

import pytest
from agent_harness import AgentProcess, client, exact_tiers, request_v5
from device_proc import DeviceProc
from models import mlp, mlp_near

from agent.calibration_store import load as load_calibration
from agent.simulation.load import Load

pytestmark = pytest.mark.slow
TARGET_MS = 40.0  # at rest; `good` is lost at 110 ms (the 10 % margin, no privacy jitter): 2.75x


@pytest.fixture(scope="module")
def sensitive(estimator) -> str:
    return base64.b64encode(mlp_near(estimator, TARGET_MS)).decode()


async def collect_events(c, device: str, monitor: str, into: list[dict]) -> None:
    async for m in c.messages:
        if m.topic.matches(f"daop/{device}/monitors/{monitor}/events"):
            into.append(json.loads(m.payload))


async def others_turn_it_false(events: list[dict], proc: DeviceProc, timeout_s: float = 20.0) -> None:
    """Four busy processes of others: the monitor must say false (it can move)."""
    with Load(detached=True) as load:
        load.set_busy(4)
        proc.adopt(load.pids)
        deadline = time.monotonic() + timeout_s
        while not any(e["meetsRequirement"] is False for e in events):
            assert time.monotonic() < deadline, f"busy processes of others did not turn the monitor false: {events}"
            await asyncio.sleep(0.1)


@pytest.mark.host  # a full calibration in the background: beside the parallel tests it took 200 s and moved a monitor
async def test_real_agent_device_proc_first_monitor_and_background_full_calibration(state_dir, mosquitto, sensitive,
                                                                                    device_proc, tmp_path):
    """A quick calibration found at start is redone in full in the background (about a minute of both
    cores), its progress in the log. Meanwhile an estimate is answered on the quick calibration, and a monitor
    created then answers as the quiet device does; no event comes until the calibration is over, and the full
    one is saved."""
    assert load_calibration(state_dir, "cpu").quick
    agent = AgentProcess(state_dir, mosquitto.url, device_id="own1", sample_interval=0.2,
                         config=exact_tiers(tmp_path), extra=["--calibration", "full"],
                           procfs_root=device_proc.root)
    agent.start()
    try:
        agent.wait_log("calibrating in full in the background", timeout=30)
        async with client(mosquitto.port) as c, client(mosquitto.port) as watcher:
            events: list[dict] = []
            await watcher.subscribe("daop/own1/monitors/m/events", qos=1)
            follow = asyncio.get_running_loop().create_task(collect_events(watcher, "own1", "m", events))
            created, _ = await request_v5(c, "own1", "monitors/create",
                                          {"onnx": sensitive, "requiredTier": "good", "monitor": "m"})
            assert created["data"]["meetsRequirement"] is True, (created, agent.log[-3000:])
            during, _ = await request_v5(c, "own1", "estimate", {"onnx": sensitive}, timeout=60)
            assert during["status"] == "ok" and "full calibration ready" not in agent.log, during
            await asyncio.to_thread(agent.wait_log, "full calibration ready (cpu)", 480)  # 212 s beside a busy process
            progress = re.findall(r"calibrating cpu in full: (\d+)% \(", agent.log)  # the log says how far it is
            assert len(progress) >= 8 and progress[-1] == "100", progress
            await asyncio.sleep(1.0)  # the samples right after it
            assert events == [], f"events during the agent's own calibration: {events}\n{agent.log[-4000:]}"
            after, _ = await request_v5(c, "own1", "estimate", {"onnx": sensitive}, timeout=60)
            assert after["status"] == "ok", after
            await others_turn_it_false(events, device_proc)
            follow.cancel()
    finally:
        assert agent.stop(timeout=20) == 0
    cal = load_calibration(state_dir, "cpu")
    assert cal is not None and not cal.quick and cal.refresh_reference


# The broker relaying the 15 MB requests is the test's child, so on the device /proc: beside the parallel tests its
# CPU, scaled up by the host's share, turned the monitor false for two seconds in a CI run. Its bursts, and a device
# /proc update landing between the agent's reads of /proc/stat and of its own tree (50 ms of two busy workers), read
# as 0.6-0.8 other tasks in 0.2 s samples (1.4 once in CI: 2.76x, past the monitor's 2.75x); in 0.5 s samples, the
# agent's default being 1 s, the peak was 1.25x in four runs. The agent counting its workers as others reads 2 at any
# interval.
@pytest.mark.host
async def test_real_agent_device_proc_pricing_large_graphs_moves_no_other_client_s_monitor(
        state_dir, mosquitto, sensitive, device_proc, tmp_path):
    """Another client keeps both estimator workers busy pricing a 30,000-node graph (about 2 s of CPU each)
    for ten seconds: the first client's monitor does not move."""
    # built before the agent starts: this process's own CPU would be others' load to the agent
    large = base64.b64encode(mlp([4] * 10_000, batch=1).SerializeToString()).decode()
    agent = AgentProcess(state_dir, mosquitto.url, device_id="own2", sample_interval=0.5,
                         config=exact_tiers(tmp_path), procfs_root=device_proc.root).start()
    agent.settle()
    try:
        async with (client(mosquitto.port) as c, client(mosquitto.port) as watcher, client(mosquitto.port) as a,
                    client(mosquitto.port) as b):
            events: list[dict] = []
            await watcher.subscribe("daop/own2/monitors/m/events", qos=1)
            follow = asyncio.get_running_loop().create_task(collect_events(watcher, "own2", "m", events))
            created, _ = await request_v5(c, "own2", "monitors/create",
                                          {"onnx": sensitive, "requiredTier": "good", "monitor": "m"})
            assert created["data"]["meetsRequirement"] is True, created

            async def price_until(other, deadline: float) -> int:
                done = 0
                while time.monotonic() < deadline:
                    answer, _ = await request_v5(other, "own2", "estimate", {"onnx": large}, timeout=60)
                    assert answer["status"] == "ok", answer
                    done += 1
                return done

            deadline = time.monotonic() + 10.0
            priced = await asyncio.gather(price_until(a, deadline), price_until(b, deadline))
            await asyncio.sleep(1.0)
            assert min(priced) >= 1, priced  # both kept asking until the deadline: how many fit is the host's speed
            assert events == [], f"the agent's own pricing moved a monitor: {events}\n{agent.log[-4000:]}"
            await others_turn_it_false(events, device_proc)
            follow.cancel()
    finally:
        agent.stop()
