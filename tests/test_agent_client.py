"""The Python client and `daop-agent monitor` against the real agent; `run --local-broker`; privacy of payloads."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from agent_harness import REPO, agent_on, client, next_message, write_config
from broker import free_port
from models import mlp
from test_agent_contract import CONFIG

from daop_client import DaopClient, DaopError

DEV = "dev1"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp([64, 128, 10], batch="batch"), str(path))
    return path


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    yield proc
    proc.stop()


async def test_client_estimate_meets_and_a_monitor_as_an_async_iterator(agent, mosquitto, device, model):
    inputs = {"x": ([1, 64], "float32")}
    async with DaopClient(mosquitto.url, DEV) as daop:
        tier = await daop.estimate(model, inputs)
        assert await daop.meets(model, tier, inputs) is True
        monitor = await daop.create_monitor(model, "poor", monitor="app-1", inputs=inputs)
        assert monitor.id == "app-1" and monitor.meets is True
        device.set("firmware/acpi/platform_profile", "low-power")
        event = await asyncio.wait_for(anext(monitor), 5)
        assert (event.monitor, event.meets) == ("app-1", False) and monitor.meets is False
        device.set("firmware/acpi/platform_profile", "balanced")
        event2 = await asyncio.wait_for(anext(monitor), 5)
        assert event2.meets is True and event2.seq == event.seq + 1
        assert [m["monitor"] for m in await daop.list_monitors()] == ["app-1"]
        await monitor.delete()
        assert await daop.list_monitors() == []
        with pytest.raises(DaopError) as info:
            await daop.meets(model, "great", inputs)
        assert info.value.code == "bad_tier"


async def test_client_names_a_device_id_no_agent_has_at_once(agent, mosquitto, model):
    """A wrong device id (the README's old `my-laptop`) is said within seconds, with the ids that are there."""
    started = time.monotonic()
    async with DaopClient(mosquitto.url, "nobody", timeout_s=60) as daop:
        with pytest.raises(DaopError) as info:
            await daop.estimate(model, {"x": ([1, 64], None)})
    assert info.value.code == "no_agent" and "'nobody'" in info.value.message and DEV in info.value.message
    assert time.monotonic() - started < 15


def test_monitor_command_prints_events_until_interrupted(agent, mosquitto, device, model):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "monitor", str(model), "--tier", "poor", "--broker", mosquitto.url,
         "--device-id", DEV, "--input", "x=1x64", "--monitor", "cli-1", "--json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert first == {"monitor": "cli-1", "requiredTier": "poor", "meetsRequirement": True}
        device.set("firmware/acpi/platform_profile", "low-power")
        event = json.loads(proc.stdout.readline())
        assert event["monitor"] == "cli-1" and event["meetsRequirement"] is False
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode in (0, 130) and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
    agent.wait_log("monitor cli-1 deleted")  # without --keep, it cleans up after itself


@pytest.mark.parametrize("args,expected", [
    (["--tier", "great"], "invalid choice"),
    (["--tier", "good", "--input", "x=axb"], "bad --input"),
    (["--tier", "good", "--broker", "http://x"], "mqtt://"),
])
def test_monitor_command_bad_input_exits_2_with_one_line(model, args, expected):
    result = subprocess.run([sys.executable, "-m", "agent", "monitor", str(model), *args], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert expected in result.stderr


def test_monitor_command_without_a_broker_exits_2(model):
    result = subprocess.run([sys.executable, "-m", "agent", "monitor", str(model), "--tier", "good", "--broker",
                             f"mqtt://127.0.0.1:{free_port()}", "--input", "x=1x64"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cannot reach the broker" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _run_with_local_broker(state_dir: Path) -> tuple[subprocess.Popen[str], int]:
    """`daop-agent run --local-broker PORT`, again on another free port where a parallel test took this one first
    (a free port is free only until someone binds it; the agent then exits and says the port is in use)."""
    log = state_dir.parent / "agent.log"
    for _ in range(3):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--local-broker", str(port), "--state-dir",
                                 str(state_dir), "--device-id", DEV, "--calibration", "quick"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=open(log, "w"), text=True)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return proc, port  # still running: it has its port
        if "already in use" not in log.read_text():
            return proc, port  # it failed otherwise: the test says how
    return proc, port


async def test_run_with_a_local_broker_works_in_one_command(state_dir: Path, model):
    proc, port = await asyncio.to_thread(_run_with_local_broker, state_dir)
    try:
        deadline = time.monotonic() + 30
        while True:  # the broker starts first, then the agent connects and says it is online
            try:
                async with client(port) as c:
                    await c.subscribe(f"daop/{DEV}/status", qos=1)
                    if json.loads((await next_message(c, timeout=5)).payload) == {"state": "online"}:
                        break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        async with DaopClient(f"mqtt://127.0.0.1:{port}", DEV, timeout_s=30) as daop:
            assert await daop.estimate(model, {"x": ([1, 64], None)})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    assert proc.returncode == 0, (state_dir.parent / "agent.log").read_text()
    time.sleep(0.2)
    with pytest.raises(OSError):  # the private broker stopped with the agent

        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()


ALLOWED = {
    "status": {"state"},
    "state": {"monitor", "requiredTier", "meetsRequirement", "seq"},
    "events": {"monitor", "meetsRequirement", "seq", "ts"},
}


async def test_only_tiers_and_booleans_leave_the_device(agent, mosquitto, device, model):
    """Every payload the agent publishes, checked: no latency, temperature, battery, hardware id."""
    seen: list[tuple[str, dict]] = []
    async with client(mosquitto.port) as spy, DaopClient(mosquitto.url, DEV) as daop:
        await spy.subscribe(f"daop/{DEV}/#", qos=1)
        inputs = {"x": ([1, 64], None)}
        await daop.estimate(model, inputs)
        await daop.meets(model, "good", inputs)
        m = await daop.create_monitor(model, "poor", inputs=inputs)
        device.set("firmware/acpi/platform_profile", "low-power")
        await asyncio.wait_for(anext(m), 5)
        await daop.list_monitors()
        await m.delete()
        try:
            while True:
                msg = await next_message(spy, timeout=1.0)
                if msg.payload:
                    seen.append((msg.topic.value, json.loads(msg.payload)))
        except TimeoutError:
            pass
    kinds = set()
    for topic, body in seen:
        kind = topic.rsplit("/", 1)[-1]
        if "/request/" in topic:
            continue
        if "/response/" in topic:
            kinds.add("response")
            data = body.get("data", {})
            assert set(data) <= {"performanceTier", "meetsRequirement", "monitor", "monitors"}, body
            for item in data.get("monitors", []):
                assert set(item) == ALLOWED["state"]
            continue
        kinds.add(kind)
        assert set(body) == ALLOWED[kind], (topic, body)
        for key, value in body.items():
            if key not in ("seq", "ts", "monitor"):
                assert isinstance(value, bool) or value in ("online", "offline") or key == "requiredTier", body
    assert kinds == {"status", "state", "events", "response"}


def test_the_private_broker_dies_with_a_killed_agent(state_dir: Path):

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agent", "run", "--local-broker", str(port), "--state-dir",
                             str(state_dir), "--device-id", DEV, "--calibration", "quick"], cwd=REPO,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the private broker did not start"
            time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            break  # gone with its agent: no orphan broker holding the port
        assert time.monotonic() < deadline, "the private broker outlived its agent"
        time.sleep(0.1)
