"""The local broker's MQTT over WebSockets for web pages: loopback only, the agent-made password, the ACL.

A real Mosquitto (agent/local_broker.py's, as `daop-agent run --local-broker` starts it) and real WebSocket
clients (aiomqtt's websockets transport); the end-to-end test runs the real agent and `web-credentials`.
"""

from __future__ import annotations

import base64
import json
import socket
import stat
import subprocess
import sys
from pathlib import Path

import aiomqtt
import psutil
import pytest
from agent_harness import REPO, AgentProcess, client, next_message, request_v5
from broker import MOSQUITTO_PASSWD, free_port
from test_agent_contract import SMALL

from agent.local_broker import LocalBroker, password_file_line, read_web_credentials, web_credentials_path
from agent.mqtt_link import max_packet_bytes
from monitors.errors import BadInput

DEV = "dev1"


def two_ports() -> tuple[int, int]:
    port = free_port()
    while (web := free_port()) == port:
        pass
    return port, web


def ws_client(port: int, username: str | None = None, password: str | None = None) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, username=username, password=password, transport="websockets",
                          protocol=aiomqtt.ProtocolVersion.V5, timeout=10)


@pytest.fixture
def web_broker(tmp_path: Path):
    port, web = two_ports()
    broker = LocalBroker(tmp_path / "state", port, web_port=web, device_id=DEV)
    broker.start()
    yield broker
    broker.stop()


def web_credentials_cli(state_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", "web-credentials", "--state-dir", str(state_dir), *extra],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_password_file_line_is_what_mosquitto_passwd_writes(tmp_path: Path):

    path = tmp_path / "passwd"
    path.write_text("")
    subprocess.run([MOSQUITTO_PASSWD, "-b", str(path), "web", "s3cret-Pw"], check=True, capture_output=True)
    line = path.read_text().strip()
    salt = base64.b64decode(line.split("$")[3])
    assert password_file_line("web", "s3cret-Pw", salt) == line
    assert password_file_line("web", "other", salt) != line


async def test_web_listener_takes_only_the_password_the_agent_made(web_broker):
    creds = read_web_credentials(web_broker.folder.parent)
    assert creds.url == f"ws://127.0.0.1:{web_broker.web_port}" and creds.deviceId == DEV
    assert creds.username == "web" and len(creds.password) >= 32
    for path in (web_credentials_path(web_broker.folder.parent), web_broker.folder / "web-passwd",
                 web_broker.folder / "web-acl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert creds.password not in (web_broker.folder / "mosquitto.conf").read_text()
    for username, password in ((None, None), ("web", None), ("web", "wrong"), ("admin", creds.password)):
        with pytest.raises(aiomqtt.MqttError):
            async with ws_client(web_broker.web_port, username, password):
                pass
    async with ws_client(web_broker.web_port, creds.username, creds.password):
        pass
    async with client(web_broker.port):  # the plain listener stays as it was: anonymous, for local programs
        pass


def test_both_listeners_bind_loopback_only(web_broker):
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(web_broker.process.proc.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {("127.0.0.1", web_broker.port), ("127.0.0.1", web_broker.web_port)}


async def nothing_arrives(c: aiomqtt.Client, seconds: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        m = await next_message(c, timeout=seconds)
        raise AssertionError(f"unexpected message on {m.topic.value}: {m.payload!r}")


async def test_web_user_may_only_send_requests_and_read_its_device(web_broker):
    creds = read_web_credentials(web_broker.folder.parent)
    async with client(web_broker.port) as spy, ws_client(web_broker.web_port, creds.username, creds.password) as web:
        await spy.subscribe("#", qos=1)
        await web.publish(f"daop/{DEV}/request/estimate", b"{}", qos=1)
        assert (await next_message(spy, timeout=5)).topic.value == f"daop/{DEV}/request/estimate"
        for topic in (f"daop/{DEV}/status", f"daop/{DEV}/monitors/m1/events", f"daop/{DEV}/response/estimate",
                      "daop/dev2/request/estimate", "elsewhere"):
            await web.publish(topic, b'{"state": "offline"}', qos=1)
        await nothing_arrives(spy)

        for allowed in (f"daop/{DEV}/response/#", f"daop/{DEV}/status", f"daop/{DEV}/monitors/#"):
            await web.subscribe(allowed, qos=1)
        for refused in ("#", f"daop/{DEV}/request/#", "daop/dev2/monitors/#"):
            await web.subscribe(refused, qos=1)  # granted or not, nothing outside the ACL may arrive
        for topic in (f"daop/{DEV}/request/estimate", "daop/dev2/monitors/m1/events", "elsewhere"):
            await spy.publish(topic, b"{}", qos=1)
        await nothing_arrives(web)
        allowed_topics = {f"daop/{DEV}/response/client/c1", f"daop/{DEV}/status", f"daop/{DEV}/monitors/m1/state"}
        for topic in allowed_topics:
            await spy.publish(topic, b"{}", qos=1)
        seen: set[str] = set()
        with pytest.raises(TimeoutError):  # each arrives (once per matching subscription), nothing else
            while True:
                seen.add((await next_message(web, timeout=1.0)).topic.value)
        assert seen == allowed_topics


def test_password_is_kept_across_restarts_and_dropped_with_the_listener(tmp_path: Path):
    state = tmp_path / "state"
    port, web = two_ports()
    passwords = []
    for web_port in (web, web, None, web):
        broker = LocalBroker(state, port, web_port=web_port, device_id=DEV)
        broker.start()
        broker.stop()
        if web_port is None:
            assert not web_credentials_path(state).exists() and not (broker.folder / "web-passwd").exists()
            result = web_credentials_cli(state)
            assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
            assert "no web credentials" in result.stderr and "Traceback" not in result.stderr
        else:
            passwords.append(read_web_credentials(state).password)
    assert passwords[0] == passwords[1] != passwords[2]


def test_port_clashes_are_refused_with_one_line(tmp_path: Path, web_broker):
    port, _ = two_ports()
    with pytest.raises(BadInput, match="cannot be the MQTT port"):
        LocalBroker(tmp_path / "s1", port, web_port=port, device_id=DEV).start()
    with pytest.raises(BadInput, match="--web-port"):
        LocalBroker(tmp_path / "s2", port, web_port=web_broker.web_port, device_id=DEV).start()


def test_a_credentials_file_that_cannot_be_read_is_one_clear_error(tmp_path: Path):
    path = web_credentials_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    result = web_credentials_cli(tmp_path)
    assert result.returncode == 2 and "not a web credentials file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_default_web_port_that_is_taken_leaves_web_pages_out_not_the_agent(state_dir: Path):

    port, _ = two_ports()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", port + 1))
        except OSError:
            pytest.skip(f"port {port + 1} is in use already")
        taken.listen()
        agent = AgentProcess(state_dir, "mqtt://127.0.0.1:1", device_id=DEV, extra=["--local-broker", str(port)])
        agent.start(timeout=60)
        try:
            assert f"port {port + 1} on 127.0.0.1 is not free: no WebSockets listener" in agent.log
            assert web_credentials_cli(state_dir).returncode == 2
        finally:
            assert agent.stop() == 0


async def test_run_with_a_local_broker_serves_web_pages_with_the_printed_credentials(state_dir: Path):
    port, web = two_ports()
    agent = AgentProcess(state_dir, "mqtt://127.0.0.1:1", device_id=DEV,
                         extra=["--local-broker", str(port), "--web-port", str(web)]).start(timeout=60)
    try:
        assert f"web pages: ws://127.0.0.1:{web}" in agent.log
        printed = web_credentials_cli(state_dir, "--json")
        assert printed.returncode == 0, printed.stderr
        creds = json.loads(printed.stdout)
        assert creds == {"url": f"ws://127.0.0.1:{web}", "deviceId": DEV, "username": "web",
                         "password": read_web_credentials(state_dir).password}
        text = web_credentials_cli(state_dir).stdout
        assert creds["password"] in text and creds["url"] in text
        async with ws_client(web, creds["username"], creds["password"]) as c:
            answer, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL})
            assert answer["status"] == "ok" and answer["data"]["performanceTier"] in ("excellent", "good")
            answer, _ = await request_v5(c, DEV, "meets", {"onnx": SMALL, "requiredTier": "best"})
            assert answer["status"] == "error" and answer["error"]["code"] == "bad_tier"
    finally:
        assert agent.stop() == 0


async def test_the_local_broker_refuses_a_packet_the_agent_would_not_be_sent(tmp_path: Path):
    """Its max_packet_size is the agent's Maximum Packet Size: a client that sends more is disconnected by the
    broker, so neither holds such a message; smaller ones pass."""

    limit = max_packet_bytes(1000)
    broker = LocalBroker(tmp_path / "state", free_port(), max_packet=limit)
    broker.start()
    try:
        config = (broker.folder / "mosquitto.conf").read_text().splitlines()
        assert f"max_packet_size {limit}" in config and "set_tcp_nodelay true" in config
        async with client(broker.port) as c:
            await c.subscribe("t/#", qos=1)
            await c.publish("t/small", b"x" * 1000, qos=1)
            assert (await next_message(c, timeout=5)).payload == b"x" * 1000
        with pytest.raises(aiomqtt.MqttError):
            async with client(broker.port) as c:
                await c.publish("t/big", b"x" * (limit + 1), qos=1, timeout=5)
                await next_message(c, timeout=2)
    finally:
        broker.stop()
