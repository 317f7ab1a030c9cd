"""The browser extension's native messaging host (`daop-agent web-bridge host`), a real process over its real
stdio framing, against the real agent and Mosquitto; and its registration (`daop-agent web-bridge install`).

Each page origin is its own owner on the agent: its own monitors (another origin neither lists, deletes nor
hears them), privacy jitter and request budget. The device is the desktop fixture /sys tree: the user policy
`power_saver = true` turns every monitor false on the low-power profile, a change the test controls.
"""

from __future__ import annotations

import asyncio
import json
import queue
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_harness import agent_on, write_config
from test_input_descriptors import explainer_graph

from agent.commands.web_bridge import extension_id
from agent.web_bridge import NAME, agent_monitor_id, owner_of
from daop_client import DaopClient

DEV = "dev1"
A, B = "http://127.0.0.1:8000", "https://meet.example"
CONFIG = """
[monitors]
min_dwell_s = 0.2
hysteresis_margin = 0.1

[policy]
power_saver = true
"""


class Host:
    """`daop-agent web-bridge host` as the browser runs it: length-prefixed JSON on its stdin and stdout."""

    def __init__(self, broker: str, device_id: str = DEV) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "agent", "web-bridge", "host", "--broker", broker,
                                      "--device-id", device_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.messages: queue.Queue[dict | None] = queue.Queue()
        self.events: list[dict] = []
        self._id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while len(head := self.proc.stdout.read(4)) == 4:
            self.messages.put(json.loads(self.proc.stdout.read(struct.unpack("=I", head)[0])))
        self.messages.put(None)

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        body = json.dumps(message).encode()
        self.proc.stdin.write(struct.pack("=I", len(body)) + body)
        self.proc.stdin.flush()

    def call(self, origin: str, method: str, body: dict | None = None, timeout: float = 60) -> dict:
        self._id += 1
        self.send({"id": self._id, "origin": origin, "method": method, "body": body or {}})
        while True:
            message = self.messages.get(timeout=timeout)
            assert message is not None, self.proc.stderr.read().decode() if self.proc.stderr else ""
            if "event" in message:
                self.events.append(message["event"])
            elif message["id"] == self._id:
                return message

    def event(self, timeout: float = 30) -> dict:
        if self.events:
            return self.events.pop(0)
        message = self.messages.get(timeout=timeout)
        assert message is not None and "event" in message, message
        return message["event"]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the browser closes the port
        return self.proc.wait(30)


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    yield proc
    proc.stop()


def owned(mosquitto, origin: str) -> list[str]:
    async def ids() -> list[str]:
        async with DaopClient(mosquitto.url, DEV, owner=owner_of(origin), timeout_s=30) as daop:
            return [m["monitor"] for m in await daop.list_monitors()]
    return asyncio.run(ids())


def test_each_origin_is_its_own_owner_and_hears_only_its_monitors(agent, mosquitto, device):
    host = Host(mosquitto.url)
    try:
        assert host.call(A, "hello") == {"id": 1, "status": "ok", "data": {}}
        graph = {"graph": explainer_graph(), "inputs": {"input": {"shape": [1, 3, 720, 1280], "dataType": "float32"}}}
        estimate = host.call(A, "estimate", graph)
        assert estimate["status"] == "ok" and estimate["data"]["performanceTier"] in (
            "excellent", "good", "fair", "moderate", "slow", "very-slow", "poor")
        created = host.call(A, "monitors/create", {**graph, "requiredTier": "poor", "monitor": "blur"})
        assert created["data"] == {"monitor": "blur", "meetsRequirement": True}, created
        # origin B neither sees, deletes nor takes A's monitor; its own of the same name is its own
        assert host.call(B, "monitors/list")["data"] == {"monitors": []}
        refused = host.call(B, "monitors/delete", {"monitor": "blur"})
        assert refused["status"] == "error" and refused["error"]["code"] == "unknown_monitor", refused
        assert host.call(B, "monitors/create", {**graph, "requiredTier": "poor", "monitor": "blur"})["status"] == "ok"
        assert owned(mosquitto, A) == [agent_monitor_id(A, "blur")]
        assert owned(mosquitto, B) == [agent_monitor_id(B, "blur")]
        assert agent_monitor_id(A, "blur") != agent_monitor_id(B, "blur")
        assert [m["monitor"] for m in host.call(A, "monitors/list")["data"]["monitors"]] == ["blur"]

        device.set("firmware/acpi/platform_profile", "low-power")  # the policy: nothing runs locally
        events = sorted((host.event(), host.event()), key=lambda e: e["origin"])
        assert [(e["origin"], e["monitor"], e["doc"]["meetsRequirement"]) for e in events] == [
            (A, "blur", False), (B, "blur", False)]
        assert all(isinstance(e["doc"]["seq"], int) for e in events)
        assert host.call(B, "monitors/delete", {"monitor": "blur"})["data"] == {}
        assert owned(mosquitto, B) == [] and owned(mosquitto, A) == [agent_monitor_id(A, "blur")]
        device.set("firmware/acpi/platform_profile", "balanced")
        back = host.event()
        assert (back["origin"], back["monitor"], back["doc"]["meetsRequirement"]) == (A, "blur", True)
    finally:
        assert host.close() == 0
    assert owned(mosquitto, A) == []  # the browser closed the port: the extension's monitors went with it


def test_bad_calls_are_error_answers_and_the_host_keeps_serving(agent, mosquitto):
    host = Host(mosquitto.url)
    try:
        host.send({"id": 1, "method": "estimate", "body": {}})
        assert host.messages.get(timeout=30)["error"]["code"] == "bad_request"
        host.send([1, 2])
        assert host.messages.get(timeout=30)["error"]["code"] == "bad_request"
        assert host.call(A, "monitors/purge")["error"]["code"] == "unknown_method"
        bad = host.call(A, "estimate", {"webnn": "not a graph"})
        assert bad["status"] == "error" and bad["error"]["code"] in ("bad_graph", "bad_model")
        unbound = explainer_graph()
        unbound["inputs"]["input"]["shape"] = [1, 3, "h", "w"]
        assert host.call(A, "estimate", {"graph": unbound})["error"]["code"] == "bad_inputs"
        too_long = host.call(A, "monitors/create", {"graph": explainer_graph(), "requiredTier": "poor",
                                                    "monitor": "x" * 52})
        assert too_long["error"]["code"] == "bad_monitor_id" and "1 to 51" in too_long["error"]["message"]
        assert host.call(A, "hello")["status"] == "ok"
    finally:
        assert host.close() == 0


def test_no_agent_is_agent_not_reachable(mosquitto):
    host = Host(mosquitto.url, device_id="nobody-here")
    try:
        answer = host.call(A, "hello")
        assert answer["status"] == "error" and answer["error"]["code"] == "unreachable", answer
        assert answer["error"]["message"].startswith("agent not reachable: no agent with device id 'nobody-here'")
    finally:
        assert host.close() == 0
    host = Host("mqtt://127.0.0.1:1")
    try:
        answer = host.call(A, "hello")
        assert answer["error"]["code"] == "unreachable"
        assert answer["error"]["message"].startswith("agent not reachable: cannot reach the broker mqtt://127.0.0.1:1")
    finally:
        assert host.close() == 0


def test_install_registers_the_host_for_the_extension_only(tmp_path):
    hosts, ext = tmp_path / "profile" / "NativeMessagingHosts", tmp_path / "data" / "webextension"
    args = ["--hosts-dir", str(hosts), "--extension-dir", str(ext), "--broker", "mqtt://127.0.0.1:18830",
            "--device-id", "my-laptop"]
    r = subprocess.run([sys.executable, "-m", "agent", "web-bridge", "install", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((ext / "manifest.json").read_text())
    assert manifest["manifest_version"] == 3 and manifest["permissions"] == ["nativeMessaging"]
    host = json.loads((hosts / f"{NAME}.json").read_text())
    assert host["name"] == NAME and host["type"] == "stdio"
    assert host["allowed_origins"] == [f"chrome-extension://{extension_id(manifest)}/"]
    launcher = Path(host["path"])
    assert launcher.is_absolute() and launcher.stat().st_mode & 0o111
    assert "web-bridge host --broker mqtt://127.0.0.1:18830 --device-id my-laptop" in launcher.read_text()
    page = (ext / "page.js").read_text()
    assert "class MLGraphBuilder" in page and "class BridgeContext" in page and "\nexport " not in page
    check = subprocess.run(["node", "--check", str(ext / "page.js")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert f"id {extension_id(manifest)}" in r.stdout

    bad = subprocess.run([sys.executable, "-m", "agent", "web-bridge", "install", "--device-id", "no/slash",
                          "--hosts-dir", str(hosts), "--extension-dir", str(ext)], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    r = subprocess.run([sys.executable, "-m", "agent", "web-bridge", "uninstall", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and not (hosts / f"{NAME}.json").exists() and not ext.exists() and not launcher.exists()
