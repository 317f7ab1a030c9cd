"""Reliability under faults: 10 broker restarts and 10 agent SIGKILLs during one run.

The real agent process and a real Mosquitto (persistence on, as a production
broker runs); the device is a fixture /sys tree (a desktop) whose platform
profile the test flips, and the agent's policy `power_saver = true` turns
every monitor false in low-power and true again in balanced: a change the
test controls exactly. Each flip is followed, after a random short delay, by
a fault: the broker restarted or the agent killed with SIGKILL and started
again. A persistent subscriber (fixed client id, clean start off, session
expiry, QoS 1) must receive every change event of every monitor: after
de-duplication (QoS 1 is at least once) the values alternate, one event per
flip, `seq` only goes up, and the monitors, their ids and their retained
states are all still there at the end.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiomqtt
import pytest
from agent_harness import AgentProcess, client, next_message, request_v5
from test_agent_contract import SMALL

from agent.simulation.trees import desktop

DEV = "rel1"
MONITORS = ("a", "b", "c")
CONFIG = """
[monitors]
min_dwell_s = 0.1
hysteresis_margin = 0.1
max_events_per_minute = 100

[policy]
power_saver = true
"""


class PersistentSubscriber:
    """An app that must not miss events: reconnects with the same session whenever the broker goes away."""

    def __init__(self, port: int, topic: str) -> None:
        self.port = port
        self.topic = topic
        self.received: list[tuple[str, bool, int]] = []
        self.connections = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        received = self.received

        class Recording(asyncio.Queue[aiomqtt.Message]):
            """Records each event as it arrives, before its PUBACK goes out: aiomqtt's iterator raises on a lost
            connection and drops what is still queued, which the broker already counts as delivered."""

            def put_nowait(self, item: aiomqtt.Message) -> None:
                body = json.loads(item.payload)
                received.append((body["monitor"], body["meetsRequirement"], body["seq"]))
                super().put_nowait(item)

        while True:
            try:
                async with client(self.port, identifier="reliability-sub", clean_start=False,
                                  session_expiry=3600, queue_type=Recording) as c:
                    self.connections += 1
                    await c.subscribe(self.topic, qos=1)
                    async for _ in c.messages:
                        pass
            except aiomqtt.MqttError:
                await asyncio.sleep(0.1)

    def events(self, monitor: str) -> list[tuple[bool, int]]:
        """De-duplicated (QoS 1 may deliver twice), in arrival order."""
        seen: set[int] = set()
        out = []
        for m, meets, seq in self.received:
            if m == monitor and seq not in seen:
                seen.add(seq)
                out.append((meets, seq))
        return out

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_ten_broker_restarts_and_ten_agent_sigkills_lose_no_event_no_monitor_and_seq_never_goes_back(
        state_dir, mosquitto_factory, tmp_path: Path):
    rng = random.Random(5)
    device = desktop(tmp_path / "tree")
    device.set("firmware/acpi/platform_profile", "balanced")
    config = tmp_path / "agent.toml"
    config.write_text(CONFIG)
    broker = mosquitto_factory(persistence=True).start()
    agent = AgentProcess(state_dir, broker.url, device_id=DEV, config=config, sysfs_root=device.sys,
                         procfs_root=device.proc)
    await asyncio.to_thread(agent.start)
    subscriber = PersistentSubscriber(broker.port, f"daop/{DEV}/monitors/+/events")
    try:
        async with client(broker.port) as c:
            for name in MONITORS:
                answer, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "poor",
                                                                         "monitor": name})
                assert answer["status"] == "ok" and answer["data"]["meetsRequirement"] is True, answer
        subscriber.start()
        await wait_until(lambda: subscriber.connections >= 1, 10, "the subscriber to connect")
        await asyncio.sleep(0.3)  # its subscription is in place

        faults = ["broker"] * 10 + ["agent"] * 10
        rng.shuffle(faults)
        for i, fault in enumerate(faults):
            profile = "low-power" if i % 2 == 0 else "balanced"
            device.set("firmware/acpi/platform_profile", profile)
            await asyncio.sleep(rng.uniform(0.0, 0.4))  # sometimes before the agent sees it, sometimes after
            if fault == "broker":
                await asyncio.to_thread(broker.restart, 0.2)
            else:
                await asyncio.to_thread(agent.kill)
                await asyncio.to_thread(agent.start, "connected to", 30.0)
            flips = i + 1
            await wait_until(lambda flips=flips: all(len(subscriber.events(m)) >= flips for m in MONITORS), 30,
                             f"the event of flip {flips} ({profile}, then a {fault} fault) for every monitor: "
                             f"have {[subscriber.events(m) for m in MONITORS]}")

        for name in MONITORS:
            events = subscriber.events(name)
            assert [meets for meets, _ in events] == [i % 2 == 1 for i in range(20)], (name, events)
            seqs = [seq for _, seq in events]
            assert seqs == sorted(seqs) and len(set(seqs)) == 20, (name, seqs)
        # every received copy, duplicates included, never goes back per monitor
        for name in MONITORS:
            last = 0
            for m, _, seq in subscriber.received:
                if m == name:
                    assert seq >= last or any(s == seq for _, s in subscriber.events(name)), (name, seq, last)
                    last = max(last, seq)

        async with client(broker.port) as c:
            listed, _ = await request_v5(c, DEV, "monitors/list", {})
            assert sorted(m["monitor"] for m in listed["data"]["monitors"]) == list(MONITORS)
            await c.subscribe(f"daop/{DEV}/monitors/+/state", qos=1)
            states = {}
            while len(states) < len(MONITORS):
                body = json.loads((await next_message(c, timeout=10)).payload)
                states[body["monitor"]] = body
        for name in MONITORS:
            assert states[name]["seq"] == subscriber.events(name)[-1][1]
            assert states[name]["meetsRequirement"] is True
    finally:
        await subscriber.stop()
        await asyncio.to_thread(agent.stop)


async def test_an_event_queued_while_the_broker_is_away_survives_a_sigkill(state_dir, mosquitto_factory, tmp_path):
    """The change is stored, its event waits in memory for the broker, the agent is killed: the restarted agent
    sends that last change event again (same seq), so the persistent subscriber still gets it."""
    device = desktop(tmp_path / "tree")
    device.set("firmware/acpi/platform_profile", "balanced")
    config = tmp_path / "agent.toml"
    config.write_text(CONFIG)
    broker = mosquitto_factory(persistence=True).start()
    agent = AgentProcess(state_dir, broker.url, device_id=DEV, config=config, sysfs_root=device.sys,
                         procfs_root=device.proc)
    await asyncio.to_thread(agent.start)
    try:
        async with client(broker.port) as c:
            answer, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "poor",
                                                                     "monitor": "q"})
            assert answer["status"] == "ok"
        sub = dict(identifier="queued-sub", clean_start=False, session_expiry=3600)
        async with client(broker.port, **sub) as c:
            await c.subscribe(f"daop/{DEV}/monitors/q/events", qos=1)
        await asyncio.to_thread(broker.stop)
        device.set("firmware/acpi/platform_profile", "low-power")
        await asyncio.to_thread(agent.wait_log, "1 monitor(s) changed", 10.0)  # stored; the event waits in memory
        await asyncio.to_thread(agent.kill)
        await asyncio.to_thread(broker.start)
        await asyncio.to_thread(agent.start, "connected to", 30.0)
        async with client(broker.port, **sub) as c:
            event = json.loads((await next_message(c, timeout=10)).payload)
        assert event["meetsRequirement"] is False and event["monitor"] == "q"
        async with client(broker.port) as c:
            await c.subscribe(f"daop/{DEV}/monitors/q/state", qos=1)
            state = json.loads((await next_message(c, timeout=10)).payload)
        assert state["seq"] == event["seq"]
    finally:
        await asyncio.to_thread(agent.stop)
