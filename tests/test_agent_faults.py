"""Faults: broker restarts, agent SIGKILL, a subscriber that was away, corrupt state files, slow graphs."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import socket
import time
from pathlib import Path

import pytest
from agent_harness import AgentProcess, agent_on, client, next_message, request_v5, write_config
from models import mlp
from test_agent_contract import CONFIG, SMALL

from agent.config import parse_broker_url
from agent.mqtt_link import MqttLink
from agent.notify import Notifier
from agent.topics import Topics
from monitors.graphs.importer import load_graph
from monitors.graphs.limits import Limits

DEV = "dev1"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, CONFIG)


def make_agent(state_dir, broker, device, config) -> AgentProcess:
    return agent_on(device, state_dir, broker.url, config, DEV)


async def create(port: int, monitor: str, tier: str = "poor") -> dict:
    async with client(port) as c:
        answer, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": tier,
                                                                 "monitor": monitor})
    assert answer["status"] == "ok", answer
    return answer["data"]


async def retained(port: int, topic_filter: str, count: int, timeout: float = 10.0) -> dict[str, bytes]:
    got: dict[str, bytes] = {}
    async with client(port) as c:
        await c.subscribe(topic_filter, qos=1)
        while len(got) < count:
            m = await next_message(c, timeout=timeout)
            assert m.retain
            got[m.topic.value] = m.payload
    return got


async def test_broker_restarted_without_persistence_gets_every_retained_state_back(
        state_dir, mosquitto_factory, device, config):
    broker = mosquitto_factory(persistence=False).start()
    agent = make_agent(state_dir, broker, device, config).start()
    try:
        for name in ("a", "b", "c"):
            await create(broker.port, name)
        before = await retained(broker.port, f"daop/{DEV}/#", 4)
        broker.restart(down_s=0.5)
        agent.wait_log("connected to", count=2, timeout=20)
        after = await retained(broker.port, f"daop/{DEV}/#", 4)
        assert after == before
        assert json.loads(after[f"daop/{DEV}/status"]) == {"state": "online"}
    finally:
        agent.stop()


async def test_agent_sigkill_and_restart_keeps_monitors_ids_topics_and_seq(state_dir, mosquitto, device, config):
    agent = make_agent(state_dir, mosquitto, device, config).start()
    await create(mosquitto.port, "keep")
    async with client(mosquitto.port) as c:
        await c.subscribe(f"daop/{DEV}/monitors/keep/events", qos=1)
        device.set("firmware/acpi/platform_profile", "low-power")
        event = json.loads((await next_message(c, timeout=5)).payload)
    assert event["meetsRequirement"] is False
    agent.kill()  # right after the event: no clean stop
    agent.start()
    try:
        async with client(mosquitto.port) as c:
            await c.subscribe(f"daop/{DEV}/monitors/keep/#", qos=1)
            state = json.loads((await next_message(c, f"daop/{DEV}/monitors/keep/state")).payload)
            assert state["seq"] == event["seq"] and state["meetsRequirement"] is False
            device.set("firmware/acpi/platform_profile", "balanced")
            back = json.loads((await next_message(c, f"daop/{DEV}/monitors/keep/events", timeout=5)).payload)
            assert back["meetsRequirement"] is True and back["seq"] > event["seq"]
            listed, _ = await request_v5(c, DEV, "monitors/list", {})
            assert [m["monitor"] for m in listed["data"]["monitors"]] == ["keep"]
    finally:
        agent.stop()


async def test_persistent_subscriber_that_was_away_receives_the_events_it_missed(state_dir, mosquitto, device, config):
    agent = make_agent(state_dir, mosquitto, device, config).start()
    try:
        await create(mosquitto.port, "m")
        sub = dict(identifier="app-sub-1", clean_start=False, session_expiry=3600)
        async with client(mosquitto.port, **sub) as c:
            await c.subscribe(f"daop/{DEV}/monitors/m/events", qos=1)
        # away: two changes happen
        device.set("firmware/acpi/platform_profile", "low-power")
        time.sleep(1.0)
        device.set("firmware/acpi/platform_profile", "balanced")
        time.sleep(1.0)
        async with client(mosquitto.port, **sub) as c:  # same id, clean start off: the session is kept
            first = json.loads((await next_message(c, timeout=5)).payload)
            second = json.loads((await next_message(c, timeout=5)).payload)
        assert (first["meetsRequirement"], second["meetsRequirement"]) == (False, True)
        assert second["seq"] == first["seq"] + 1
    finally:
        agent.stop()


async def test_events_during_a_broker_outage_reach_a_persistent_subscriber(
        state_dir, mosquitto_factory, device, config):
    broker = mosquitto_factory(persistence=True).start()
    agent = make_agent(state_dir, broker, device, config).start()
    try:
        await create(broker.port, "m")
        sub = dict(identifier="app-sub-2", clean_start=False, session_expiry=3600)
        async with client(broker.port, **sub) as c:
            await c.subscribe(f"daop/{DEV}/monitors/m/events", qos=1)
        broker.stop()
        device.set("firmware/acpi/platform_profile", "low-power")  # changes while the broker is down
        agent.wait_log("1 monitor(s) changed", timeout=10)
        broker.start()
        agent.wait_log("connected to", count=2, timeout=20)
        async with client(broker.port, **sub) as c:
            event = json.loads((await next_message(c, timeout=10)).payload)
        assert event["meetsRequirement"] is False
    finally:
        agent.stop()


async def test_a_corrupt_monitor_file_is_set_aside_and_the_others_are_served(state_dir, mosquitto, device, config):
    agent = make_agent(state_dir, mosquitto, device, config).start()
    await create(mosquitto.port, "good1")
    await create(mosquitto.port, "bad1")
    agent.stop()
    (state_dir / "monitors" / "bad1.json").write_text('{"format": 1, "monitor": "bad1", "requiredTier": ')
    agent.start()
    try:
        assert "set aside as corrupt/bad1.json.corrupt-" in agent.log
        assert agent.log.count("cannot be used") == 1
        assert list((state_dir / "corrupt").glob("bad1.json.corrupt-*"))
        assert list((state_dir / "monitors").glob("*.json")) == [state_dir / "monitors" / "good1.json"]
        # its retained state is cleared on the broker; the other monitor's stays
        await retained(mosquitto.port, f"daop/{DEV}/monitors/good1/state", 1)
        async with client(mosquitto.port) as c:
            await c.subscribe(f"daop/{DEV}/monitors/bad1/state", qos=1)
            with pytest.raises(TimeoutError):
                await next_message(c, timeout=1.5)
        async with client(mosquitto.port) as c:
            listed, _ = await request_v5(c, DEV, "monitors/list", {})
        assert [m["monitor"] for m in listed["data"]["monitors"]] == ["good1"]
    finally:
        agent.stop()
    agent.start()  # the set-aside file is not read again: no crash loop, no new log line
    try:
        assert "cannot be used" not in agent.log
    finally:
        agent.stop()


async def test_a_corrupt_seq_file_still_never_sends_seq_back(state_dir, mosquitto, device, config):
    agent = make_agent(state_dir, mosquitto, device, config).start()
    await create(mosquitto.port, "s")
    topic = f"daop/{DEV}/monitors/s/state"
    state = json.loads((await retained(mosquitto.port, topic, 1))[topic])
    agent.stop()
    (state_dir / "monitor-seq.json").write_bytes(b"\x00\x01garbage")
    agent.start()
    try:
        after = json.loads((await retained(mosquitto.port, f"daop/{DEV}/monitors/s/state", 1))[
            f"daop/{DEV}/monitors/s/state"])
        assert after["seq"] > state["seq"]
        assert list((state_dir / "corrupt").glob("monitor-seq.json.corrupt-*"))
    finally:
        agent.stop()


def graph_slower_than(seconds: float) -> tuple[bytes, float]:
    """An MLP whose import alone, in this process, takes at least `seconds` on this host now (the agent's worker
    plans it too, so takes longer), grown to the node limit at most; and that import time. A fixed graph took
    3-4 s on one 2-core VM and under 1.5 s on a faster one."""
    layers, max_layers = 6000, Limits().max_nodes // 3 - 1
    while True:
        model = mlp([8] * (layers + 1), batch=1).SerializeToString()
        started = time.perf_counter()
        load_graph(model, fmt="onnx")
        took = time.perf_counter() - started
        if took >= seconds or layers == max_layers:
            return model, took
        layers = min(max_layers, math.ceil(layers * 1.3 * seconds / took))


async def test_a_graph_that_takes_too_long_gets_an_error_and_others_are_still_served(
        state_dir, mosquitto, device, tmp_path):


    # The limit leaves a small graph room on a host busy with other tests (0.5 s did not, once in CI); the big graph
    # takes at least twice the limit here and now, or the limit is cut to half its time where the node limit stops it.
    limit = 1.5
    big, took = graph_slower_than(2 * limit)
    limit = min(limit, round(took / 2, 2))
    config = tmp_path / "slow.toml"
    config.write_text(f"[limits]\nestimate_timeout_s = {limit}\nmax_request_bytes = 100000000\n")
    agent = agent_on(device, state_dir, mosquitto.url, config, DEV).start()
    try:
        async with client(mosquitto.port) as c:
            slow, _ = await request_v5(c, DEV, "estimate", {"onnx": base64.b64encode(big).decode()})
            assert slow["status"] == "error" and slow["error"]["code"] == "limit_exceeded", (slow, took)
            assert f"{limit:g} s" in slow["error"]["message"]
            fine, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL})
            assert fine["status"] == "ok", fine
    finally:
        agent.stop()


async def test_the_link_says_offline_when_the_agent_goes_down_by_a_fault_not_a_clean_stop(mosquitto):
    """A task of the agent failing cancels the link, whose disconnect is then clean (no Will): it must say
    offline itself, or the retained status would stay `online` for an agent that is gone."""


    link = MqttLink([parse_broker_url(mosquitto.url)], "crashing", Topics(f"daop/{DEV}/"), Notifier(),
                    retained=lambda: [], on_request=lambda method, message: None, monitors=lambda: 0)
    task = asyncio.get_running_loop().create_task(link.run(asyncio.Event()))
    await asyncio.wait_for(link.connected.wait(), 10)

    sock = link._client._client.socket()  # (and no Nagle delay on its answers)
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    assert json.loads((await retained(mosquitto.port, f"daop/{DEV}/status", 1))[f"daop/{DEV}/status"]) == {
        "state": "online"}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert json.loads((await retained(mosquitto.port, f"daop/{DEV}/status", 1))[f"daop/{DEV}/status"]) == {
        "state": "offline"}
