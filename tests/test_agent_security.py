"""Security: a broker with a password file and the documented ACL (examples/mosquitto-acl), and TLS."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiomqtt
import pytest
from agent_harness import AgentProcess, client, next_message, request_v5
from broker import make_tls_files
from test_agent_contract import SMALL

ACL = (Path(__file__).resolve().parent.parent / "examples" / "mosquitto-acl").read_text()
USERS = {"dev1": "pw-dev1", "dev2": "pw-dev2", "app": "pw-app"}


@pytest.fixture
def secured(mosquitto_factory):
    return mosquitto_factory(passwords=USERS, acl=ACL).start()


def agent_with(state_dir: Path, broker, user: str, password: str, device_id: str = "dev1") -> AgentProcess:
    url = broker.url.replace("://", f"://{user}:{password}@")
    return AgentProcess(state_dir, url, device_id=device_id)


async def nothing_arrives(c: aiomqtt.Client, seconds: float = 1.0) -> bool:
    try:
        m = await next_message(c, timeout=seconds)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected message on {m.topic.value}: {m.payload!r}")


async def test_agent_with_its_password_serves_apps_through_the_acl(state_dir, secured):
    agent = agent_with(state_dir, secured, "dev1", USERS["dev1"]).start()
    try:
        agent.wait_log("connected to")
        async with client(secured.port, username="app", password=USERS["app"]) as app:
            await app.subscribe("daop/dev1/status", qos=1)
            assert json.loads((await next_message(app)).payload) == {"state": "online"}
            answer, _ = await request_v5(app, "dev1", "monitors/create",
                                         {"onnx": SMALL, "requiredTier": "poor", "monitor": "m"})
            assert answer["status"] == "ok"
            await app.subscribe("daop/dev1/monitors/m/state", qos=1)
            assert json.loads((await next_message(app)).payload)["monitor"] == "m"
    finally:
        agent.stop()


async def test_wrong_password_is_refused_and_the_agent_keeps_retrying(state_dir, secured):
    agent = agent_with(state_dir, secured, "dev1", "Xq7-bad-secret").start(wait_for="retrying")
    try:
        assert "connected to" not in agent.log
        assert agent.proc.poll() is None
        assert "Xq7-bad-secret" not in agent.log  # the password is never logged
    finally:
        agent.stop()


async def test_anonymous_clients_are_refused(secured):
    with pytest.raises(aiomqtt.MqttError):
        async with client(secured.port):
            pass


async def test_a_device_cannot_touch_another_devices_topics(state_dir, secured):
    agent = agent_with(state_dir, secured, "dev1", USERS["dev1"]).start()
    try:
        agent.wait_log("connected to")
        async with client(secured.port, username="dev2", password=USERS["dev2"]) as other, \
                client(secured.port, username="app", password=USERS["app"]) as app:
            await app.subscribe("daop/dev1/#", qos=1)
            assert json.loads((await next_message(app)).payload) == {"state": "online"}  # retained
            await other.publish("daop/dev1/status", json.dumps({"state": "offline"}), qos=1, retain=True)
            await other.publish("daop/dev1/monitors/m/events", b"{}", qos=1)
            await other.subscribe("daop/dev1/request/#", qos=1)
            await app.publish("daop/dev1/request/monitors/list", b"{}", qos=1)  # answered on response/...
            answer = await next_message(app, "daop/dev1/response/#", timeout=10)
            assert json.loads(answer.payload)["status"] == "ok"
            assert await nothing_arrives(other)  # dev2 never sees dev1's requests
        async with client(secured.port, username="app", password=USERS["app"]) as late:
            await late.subscribe("daop/dev1/status", qos=1)
            assert json.loads((await next_message(late)).payload) == {"state": "online"}
    finally:
        agent.stop()


async def test_an_app_cannot_spoof_agent_topics(state_dir, secured):
    agent = agent_with(state_dir, secured, "dev1", USERS["dev1"]).start()
    try:
        agent.wait_log("connected to")
        async with client(secured.port, username="app", password=USERS["app"]) as app:
            await app.subscribe("daop/dev1/monitors/#", qos=1)
            await app.publish("daop/dev1/monitors/x/events", json.dumps({"meetsRequirement": False}), qos=1)
            await app.publish("daop/dev1/status", json.dumps({"state": "offline"}), qos=1, retain=True)
            assert await nothing_arrives(app)
            await app.subscribe("daop/dev1/status", qos=1)
            assert json.loads((await next_message(app)).payload) == {"state": "online"}
    finally:
        agent.stop()


async def test_agent_over_tls_with_a_private_ca(state_dir, mosquitto_factory, tmp_path):
    ca, cert, key = make_tls_files(tmp_path / "tls")
    broker = mosquitto_factory(tls=(ca, cert, key)).start()
    config = tmp_path / "tls.toml"
    config.write_text(f'[broker]\nca_file = "{ca}"\n')
    agent = AgentProcess(state_dir, broker.url, device_id="dev1", config=config).start()
    try:
        agent.wait_log("connected to mqtts://localhost")
        tls = aiomqtt.TLSParameters(ca_certs=str(ca))
        async with aiomqtt.Client("localhost", broker.port, tls_params=tls,
                                  protocol=aiomqtt.ProtocolVersion.V5) as c:
            await c.subscribe("daop/dev1/status", qos=1)
            m = await asyncio.wait_for(anext(aiter(c.messages)), 10)
            assert json.loads(m.payload) == {"state": "online"}
    finally:
        agent.stop()
