"""Several brokers, one after the other: the real agent fails over between two real Mosquittos, and speaks
MQTT 3.1.1 where asked (RabbitMQ 3.x has no v5; tests/test_fleet_cluster.py runs it on a real cluster)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from agent_harness import AgentProcess, client, next_message
from broker import free_port

DEV = "dev1"


def agent(device, state_dir: Path, urls: list[str], *extra: str) -> AgentProcess:
    flags = [f for url in urls[1:] for f in ("--broker", url)]
    return AgentProcess(state_dir, urls[0], device_id=DEV, sample_interval=0.5, sysfs_root=device.sys,
                        procfs_root=device.proc, extra=[*flags, *extra])


async def test_the_agent_goes_to_the_next_broker_when_one_is_lost(state_dir, device, mosquitto_factory):
    a, b = mosquitto_factory("a").start(), mosquitto_factory("b").start()
    dead = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there: skipped over at start
    proc = agent(device, state_dir, [dead, a.url, b.url]).start()
    try:
        proc.wait_log(f"connected to {a.url}")
        async with client(b.port) as c:
            await c.subscribe(f"daop/{DEV}/status", qos=1)
            a.stop()  # the node the agent is on goes away
            m = await next_message(c, timeout=20)
            assert json.loads(m.payload) == {"state": "online"}  # the agent is on b now
        proc.wait_log(f"connected to {b.url}")
    finally:
        proc.stop()


async def test_an_agent_on_mqtt_3_1_1_answers_on_response_method_with_the_transaction(state_dir, device,
                                                                                      mosquitto_factory):
    broker = mosquitto_factory().start()
    proc = agent(device, state_dir, [broker.url], "--protocol", "3.1.1", "--session-expiry", "600").start()
    try:
        proc.wait_log(f"connected to {broker.url}")
        async with client(broker.port, v5=False) as c:
            await c.subscribe(f"daop/{DEV}/response/#", qos=1)
            tx = uuid.uuid4().hex
            await c.publish(f"daop/{DEV}/request/monitors/list", json.dumps({"transaction": tx}), qos=1)
            m = await next_message(c, f"daop/{DEV}/response/monitors/list")
            answer = json.loads(m.payload)
            assert answer["status"] == "ok" and answer["transaction"] == tx
    finally:
        proc.stop()
