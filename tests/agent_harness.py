"""The real agent as a child process (`python -m agent run`), and a raw MQTT v5 / 3.1.1 test client.

Used by the tests/test_agent_*.py end-to-end tests: the agent is the same
program the systemd unit starts, so SIGKILL and restarts are real.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from device_proc import DeviceProc
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.simulation.trees import desktop

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def device(tmp_path: Path):
    """The device the agent tests run on: a desktop fixture /sys tree, on the balanced profile."""

    tree = desktop(tmp_path / "tree")
    tree.set("firmware/acpi/platform_profile", "balanced")
    return tree


@pytest.fixture
def device_proc(tmp_path: Path):
    """A /proc of this test's processes without the host's other tenants (device_proc.py), kept up to date."""
    with DeviceProc(tmp_path / "device-proc") as proc:
        yield proc


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def exact_tiers(tmp_path: Path) -> Path:
    """A config without the privacy jitter, for tests about load, the agent's own work and reports: a boundary
    moved by up to 20 % (drawn afresh at each start) would leave a model's margin to its tier to chance."""
    return write_config(tmp_path, "[privacy]\njitter = 0\n")


def agent_on(device, state_dir: Path, broker_url: str, config: Path, device_id: str = "dev1") -> AgentProcess:
    """An agent (not started yet) reading `device`'s fixture tree, with `config`."""
    return AgentProcess(state_dir, broker_url, device_id=device_id, config=config, sysfs_root=device.sys,
                        procfs_root=device.proc)


class AgentProcess:
    def __init__(self, state_dir: Path, broker_url: str, *, device_id: str = "dev1", sample_interval: float = 0.1,
                 config: Path | None = None, sysfs_root: Path | None = None, procfs_root: Path | None = None,
                 extra: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.device_id = device_id
        self.args = [sys.executable, "-m", "agent", "run", "--broker", broker_url, "--device-id", device_id,
                     "--state-dir", str(state_dir), "--sample-interval", str(sample_interval), "--log-level", "debug",
                     "--calibration", "quick"]  # the session's quick calibration, as it is
        if config is not None:
            self.args += ["--config", str(config)]
        if sysfs_root is not None:
            self.args += ["--sysfs-root", str(sysfs_root)]
        if procfs_root is not None:
            self.args += ["--procfs-root", str(procfs_root)]
        self.args += extra or []
        self.env = {**os.environ, **(env or {})}
        self.log_path = self.state_dir.parent / f"agent-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_for: str = "estimator ready", timeout: float = 30.0) -> AgentProcess:
        self.log_path = self.state_dir.parent / f"agent-{uuid.uuid4().hex[:6]}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log, cwd=REPO, env=self.env)
        if wait_for:
            self.wait_log(wait_for, timeout)
        return self

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, text: str, timeout: float = 20.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.count(text) >= count:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent exited ({self.proc.returncode}) before {text!r}:\n{self.log[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"agent did not log {text!r} within {timeout} s:\n{self.log[-3000:]}")

    def settle(self, timeout: float = 20.0, most: float = 2.0) -> None:
        """Until the agent's latest reading of the present CPU speed (its debug log) is within `most` of the
        calibrated: a fresh agent's first readings take in the end of its own start-up, which the tests that first
        need a quiet device wait out. The warm refresh measures the real CPU, which a shared host's other work slows
        (1.3-1.8x seen): `most` is under the tests' margins to their tiers (2.75x), not a quiet host's 1.0."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            readings = [line for line in self.log.splitlines() if " DEBUG speed cpu " in line]
            if readings and float(readings[-1].split(" DEBUG speed cpu ")[1].split("x")[0]) <= most:
                return
            time.sleep(0.05)
        raise AssertionError(f"the agent's reading did not settle within {timeout} s:\n{self.log[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean stop, no offline message, whatever it was doing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"agent did not stop on SIGTERM:\n{self.log[-3000:]}") from None
        return self.proc.returncode


def client(port: int, *, v5: bool = True, identifier: str | None = None, clean_start: bool = True,
           session_expiry: int | None = None, username: str | None = None,
           password: str | None = None,
           queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None) -> aiomqtt.Client:
    props = None
    if v5 and session_expiry is not None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = session_expiry
    kwargs: dict[str, Any] = {}
    if not v5:
        kwargs["clean_session"] = clean_start
    else:
        kwargs["clean_start"] = clean_start
    return aiomqtt.Client("127.0.0.1", port, identifier=identifier, username=username, password=password,
                          protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
                          properties=props, timeout=10, queue_type=queue_type, **kwargs)


async def next_message(c: aiomqtt.Client, topic_filter: str | None = None, timeout: float = 10.0) -> aiomqtt.Message:
    async def first() -> aiomqtt.Message:
        async for m in c.messages:
            if topic_filter is None or m.topic.matches(topic_filter):
                return m
        raise AssertionError("disconnected")

    return await asyncio.wait_for(first(), timeout)


async def request_v5(c: aiomqtt.Client, device: str, method: str, payload: bytes | dict,
                     response_topic: str | None = None, timeout: float = 30.0,
                     owner: str | None = None) -> tuple[dict, aiomqtt.Message]:
    """One request with a v5 ResponseTopic and CorrelationData; the parsed answer and its message. With an
    `owner`, sent (and answered) under that client's scope `daop/<device>/client/<owner>/`."""
    scope = f"daop/{device}/client/{owner}/" if owner else f"daop/{device}/"
    response_topic = response_topic or f"{scope}response/client/t-{uuid.uuid4().hex[:8]}"
    await c.subscribe(response_topic, qos=1)
    corr = uuid.uuid4().bytes
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = response_topic
    props.CorrelationData = corr
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    await c.publish(f"{scope}request/{method}", body, qos=1, properties=props)
    while True:
        m = await next_message(c, response_topic, timeout)
        if m.properties is not None and getattr(m.properties, "CorrelationData", None) == corr:
            await c.unsubscribe(response_topic)
            return json.loads(m.payload), m
