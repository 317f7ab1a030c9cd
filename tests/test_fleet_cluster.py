"""A fleet on a real clustered broker: three RabbitMQ nodes (MQTT 3.1.1 only) on this machine, real agent
processes on fixture /sys trees, the backend (daop_client.Fleet) on another node than the agents, and one node
killed with SIGKILL mid-run: the agents fail over to the next node, and the backend's persistent session (a
quorum queue, replicated) loses no event an agent sent with QoS 1."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
from agent_harness import AgentProcess, client, next_message, write_config
from models import mlp

from agent.simulation.trees import desktop
from daop_client import DeviceStatus, Fleet, FleetEvent

SMALL = base64.b64encode(mlp([64, 128, 10], batch=1).SerializeToString()).decode()
CONFIG = """
[monitors]
min_dwell_s = 0.2
hysteresis_margin = 0.1
max_events_per_minute = 60

[policy]
power_saver = true
"""
DEVICES = ("fleet-a", "fleet-b")


def agents_on(urls: list[str], tmp_path: Path, calibrated_dir: Path) -> list[tuple[AgentProcess, object]]:
    out = []
    config = write_config(tmp_path, CONFIG)
    for name in DEVICES:
        tree = desktop(tmp_path / name / "tree")
        tree.set("firmware/acpi/platform_profile", "balanced")
        state = tmp_path / name / "state"
        shutil.copytree(calibrated_dir, state)
        flags = [f for url in urls[1:] for f in ("--broker", url)]
        proc = AgentProcess(state, urls[0], device_id=name, sample_interval=0.1, config=config,
                            sysfs_root=tree.sys, procfs_root=tree.proc,
                            extra=[*flags, "--protocol", "3.1.1", "--session-expiry", "3600"])
        out.append((proc, tree))
    return out


async def create_monitor(port: int, device_id: str) -> None:
    """Over MQTT 3.1.1 on `port`'s node: the answer comes on response/<method> with the transaction echoed."""
    async with client(port, v5=False) as c:
        await c.subscribe(f"daop/{device_id}/response/#", qos=1)
        tx = uuid.uuid4().hex
        body = {"onnx": SMALL, "requiredTier": "poor", "monitor": "m", "transaction": tx}
        await c.publish(f"daop/{device_id}/request/monitors/create", json.dumps(body), qos=1)
        while True:
            answer = json.loads((await next_message(c, f"daop/{device_id}/response/monitors/create", 30)).payload)
            if answer.get("transaction") == tx:
                assert answer["status"] == "ok" and answer["data"]["meetsRequirement"] is True, answer
                return


@pytest.mark.slow
async def test_agents_fail_over_and_a_persistent_backend_loses_no_event_when_a_node_dies(
        rabbit_cluster, tmp_path: Path, calibrated_dir: Path):
    n0, n1, n2 = rabbit_cluster.nodes
    agents = agents_on([n0.url, n1.url, n2.url], tmp_path, calibrated_dir)  # the agents on node 0 first
    events: dict[str, list[tuple[int, bool]]] = {d: [] for d in DEVICES}
    online: set[str] = set()

    async def follow(fleet: Fleet) -> None:
        async for item in fleet:
            if isinstance(item, FleetEvent):
                events[item.device].append((item.event.seq, item.event.meets))
            elif isinstance(item, DeviceStatus) and item.online:
                online.add(item.device)

    # The backend on node 1, persistent (clean_session false), with node 2 to fail over to.
    async with Fleet([n1.url, n2.url], client_id="backend-cluster", protocol="3.1.1", devices=DEVICES) as fleet:
        task = asyncio.create_task(follow(fleet))
        try:
            for proc, _ in agents:
                proc.start(wait_for=f"connected to {n0.url}", timeout=60)
            for d in DEVICES:
                await create_monitor(n2.mqtt_port, d)  # requests cross the cluster too
            assert online == set(DEVICES)  # status crossed from node 0 to the backend on node 1
            flips = 8
            for k in range(flips):
                profile = "low-power" if k % 2 == 0 else "balanced"
                for _, tree in agents:
                    tree.set("firmware/acpi/platform_profile", profile)
                if k == 3:
                    rabbit_cluster.kill(0)  # the agents' node dies, unannounced
                    for proc, _ in agents:
                        await asyncio.to_thread(proc.wait_log, f"connected to {n1.url}", 30)
                await asyncio.sleep(0.8)  # past the dwell
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(len(events[d]) < flips for d in DEVICES):
                await asyncio.sleep(0.2)
        finally:
            task.cancel()
            for proc, _ in agents:
                proc.stop()
    for d in DEVICES:
        seqs = sorted({s for s, _ in events[d]})
        assert seqs == list(range(seqs[0], seqs[0] + flips)), (d, events[d])  # every change, none lost
        meets = dict(events[d])
        assert [meets[s] for s in seqs] == [k % 2 == 1 for k in range(flips)]
