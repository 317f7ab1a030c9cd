"""The opt-in integrations against the real agent: Home Assistant MQTT discovery and Prometheus metrics; and
docs/asyncapi.yaml checked against every message the agent sends."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request
from pathlib import Path

import onnx
import psutil
import pytest
import yaml
from agent_harness import REPO, agent_on, client, next_message, write_config
from broker import free_port
from jsonschema import Draft202012Validator
from models import mlp
from prometheus_client.parser import text_string_to_metric_families
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from test_agent_contract import CONFIG

from agent.protocol import METHODS
from daop_client import DaopClient

DEV = "dev1"
INPUTS = {"x": ([1, 64], "float32")}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp([64, 128, 10], batch="batch"), str(path))
    return path


async def drain(c, timeout: float = 0.7) -> list[tuple[str, bytes, bool]]:
    """Every message that arrives until `timeout` passes without one: (topic, payload, retain)."""
    out = []
    try:
        while True:
            m = await next_message(c, timeout=timeout)
            out.append((m.topic.value, bytes(m.payload), bool(m.retain)))
    except TimeoutError:
        return out


# -- Home Assistant ----------------------------------------------------------------------------------------------


async def test_home_assistant_discovery_follows_monitors(state_dir, mosquitto, device, model, tmp_path):
    config = write_config(tmp_path, CONFIG + "\n[homeassistant]\nenabled = true\n")
    agent = agent_on(device, state_dir, mosquitto.url, config, DEV).start()
    try:
        async with client(mosquitto.port) as ha, DaopClient(mosquitto.url, DEV) as daop:
            await ha.subscribe("homeassistant/#", qos=1)
            await ha.subscribe(f"daop/{DEV}/monitors/+/state", qos=1)
            await daop.create_monitor(model, "poor", monitor="blur", inputs=INPUTS)
            seen = await drain(ha)
            topics = [t for t, _, _ in seen]
            config_topic = f"homeassistant/binary_sensor/daop_{DEV}/blur/config"
            state_topic = f"daop/{DEV}/monitors/blur/state"
            assert config_topic in topics and topics.index(config_topic) < topics.index(state_topic)
            body = json.loads(dict((t, p) for t, p, _ in seen)[config_topic])
            assert body["state_topic"] == state_topic and body["json_attributes_topic"] == state_topic
            assert body["availability_topic"] == f"daop/{DEV}/status"
            assert body["unique_id"] == f"daop_{DEV}_blur" and body["device"]["identifiers"] == [f"daop_{DEV}"]
            assert body["value_template"] == "{{ 'ON' if value_json.meetsRequirement else 'OFF' }}"

            await ha.publish("homeassistant/status", b"online", qos=1)  # Home Assistant restarted
            again = [t for t, p, _ in await drain(ha) if p and t != "homeassistant/status"]
            assert again == [config_topic]

        mosquitto.restart()  # no persistence: every retained message is gone, and comes back from the agent
        agent.wait_log("connected to", count=2)
        async with client(mosquitto.port) as late:
            await late.subscribe("homeassistant/#", qos=1)
            assert [t for t, p, retained in await drain(late) if p and retained] == [config_topic]

        async with client(mosquitto.port) as ha, DaopClient(mosquitto.url, DEV) as daop:
            await ha.subscribe("homeassistant/#", qos=1)
            await ha.subscribe(f"daop/{DEV}/monitors/+/state", qos=1)
            await drain(ha)
            await daop.delete_monitor("blur")
            gone = await drain(ha)
            assert [(t, p) for t, p, _ in gone] == [(config_topic, b""), (state_topic, b"")]  # entity first
        async with client(mosquitto.port) as late:  # nothing retained left behind
            await late.subscribe("homeassistant/#", qos=1)
            assert await drain(late, timeout=0.5) == []
    finally:
        agent.stop()


async def test_without_home_assistant_nothing_is_published_outside_the_device_tree(state_dir, mosquitto, device,
                                                                                  model, tmp_path):
    agent = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    try:
        async with client(mosquitto.port) as spy, DaopClient(mosquitto.url, DEV) as daop:
            await spy.subscribe("#", qos=1)
            await daop.create_monitor(model, "poor", inputs=INPUTS)
            assert {t.split("/")[0] for t, _, _ in await drain(spy)} == {"daop"}
    finally:
        agent.stop()


# -- Prometheus --------------------------------------------------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_on_loopback_say_the_agents_health_and_nothing_of_the_device(state_dir, mosquitto, device,
                                                                                   model, tmp_path):
    port = free_port()
    config = write_config(tmp_path, CONFIG + f"\n[metrics]\nport = {port}\n")
    agent = agent_on(device, state_dir, mosquitto.url, config, DEV).start()
    try:
        agent.wait_log("metrics on http://127.0.0.1")
        async with DaopClient(mosquitto.url, DEV) as daop:
            await daop.estimate(model, INPUTS)
            m = await daop.create_monitor(model, "poor", inputs=INPUTS)
            with pytest.raises(Exception):  # noqa: B017 - any error answer
                await daop.meets(model, "great", INPUTS)
            device.set("firmware/acpi/platform_profile", "low-power")
            await asyncio.wait_for(anext(m), 5)
        metrics = await asyncio.to_thread(scrape, port)
        assert metrics[("daop_monitors", ())] == 1
        assert metrics[("daop_requests_total", (("method", "estimate"), ("outcome", "ok")))] == 1
        assert metrics[("daop_requests_total", (("method", "meets"), ("outcome", "bad_tier")))] == 1
        assert metrics[("daop_request_duration_seconds_count", (("method", "monitors/create"),))] == 1
        assert metrics[("daop_events_total", ())] >= 1
        assert metrics[("daop_broker_connected", ())] == 1
        assert 0 <= metrics[("daop_calibration_age_seconds", (("device", "cpu"),))] < 3600 * 24 * 365
        assert ("daop_calibration_age_seconds", (("device", "gpu"),)) not in metrics  # it would tell of a GPU
        assert metrics[("process_resident_memory_bytes", ())] > 0
        assert not any(name.startswith("daop_device_") for name, _ in metrics)  # nothing that fingerprints
        listening = [c.laddr for c in psutil.Process(agent.proc.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert listening and all(a.ip == "127.0.0.1" for a in listening)
    finally:
        agent.stop()


async def test_metrics_with_device_state_when_configured(state_dir, mosquitto, device, tmp_path):
    port = free_port()
    config = write_config(tmp_path, CONFIG + f"\n[metrics]\nport = {port}\ndevice_state = true\n")
    agent = agent_on(device, state_dir, mosquitto.url, config, DEV).start()
    try:
        agent.wait_log("metrics on http://127.0.0.1")
        await asyncio.sleep(0.5)  # a few samples
        metrics = await asyncio.to_thread(scrape, port)
        assert metrics[("daop_device_cpu_slowdown", ())] > 0  # (below 1 where the device runs faster than calibrated)
        assert metrics[("daop_device_thermal_max_celsius", ())] > 0  # the fixture tree's zones
    finally:
        agent.stop()


# -- AsyncAPI ----------------------------------------------------------------------------------------------------


class AsyncApi:
    """docs/asyncapi.yaml: each channel's address as a pattern, its messages' payload schemas as validators."""

    def __init__(self, path: Path) -> None:
        self.doc = yaml.safe_load(path.read_text())
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource("urn:asyncapi", resource)
        self.channels: list[tuple[str, re.Pattern[str], list[Draft202012Validator]]] = []
        for name, channel in self.doc["channels"].items():
            pattern = re.escape(channel["address"])
            pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", pattern)
            validators = []
            for msg in channel["messages"].values():
                msg = self._resolve(msg)
                validators.append(self.validator(msg["payload"]))
            self.channels.append((name, re.compile(f"^{pattern}$"), validators))

    def _resolve(self, node: dict) -> dict:
        while "$ref" in node:
            node = self.registry.resolver("urn:asyncapi").lookup("urn:asyncapi" + node["$ref"]).contents
        return node

    def validator(self, schema: dict) -> Draft202012Validator:
        if "$ref" in schema:
            schema = {"$ref": "urn:asyncapi" + schema["$ref"]}
        return Draft202012Validator({"$id": "urn:check", **schema} if "$ref" not in schema else schema,
                                    registry=self.registry)

    def check(self, topic: str, payload: dict) -> str:
        """The channel the message belongs to; AssertionError where none, or where its payload is off."""
        for name, pattern, validators in self.channels:
            if pattern.match(topic):
                errors = [list(v.iter_errors(payload)) for v in validators]
                assert any(not e for e in errors), (topic, payload, [str(e[0].message) for e in errors if e])
                return name
        raise AssertionError(f"{topic} is on no channel of docs/asyncapi.yaml")


def test_asyncapi_document_is_asyncapi_3_with_every_method():
    api = AsyncApi(REPO / "docs" / "asyncapi.yaml")
    assert api.doc["asyncapi"].startswith("3.")
    addresses = {c["address"] for c in api.doc["channels"].values()}
    for method in METHODS:
        assert f"daop/{{deviceId}}/request/{method}" in addresses
        assert f"daop/{{deviceId}}/response/{method}" in addresses
        assert f"daop/{{deviceId}}/client/{{owner}}/request/{method}" in addresses
        assert f"daop/{{deviceId}}/client/{{owner}}/response/{method}" in addresses
    for op in api.doc["operations"].values():  # every operation's channels exist
        assert op["channel"]["$ref"].removeprefix("#/channels/") in api.doc["channels"]


async def test_every_message_the_agent_sends_matches_the_asyncapi_document(state_dir, mosquitto, device, model,
                                                                           tmp_path):
    """Requests without a ResponseTopic (answers on response/<method>), single monitors and groups, running,
    report, list, delete, an error, change events: each payload validated against its channel's schema; all of
    it on the shared topics and again under an owner's scope (`client/app1/`)."""
    api = AsyncApi(REPO / "docs" / "asyncapi.yaml")
    agent = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    onnx_b64 = base64.b64encode(model.read_bytes()).decode()
    one = {"onnx": onnx_b64, "inputs": {"x": {"shape": [1, 64], "dataType": "float32"}}}
    requests = [
        ("estimate", {**one, "transaction": "t1"}),
        ("meets", {**one, "requiredTier": "poor", "transaction": 2}),
        ("meets", {"workloads": [{"name": "a", **one, "requiredRate": 5}, {"name": "b", **one,
                                                                           "requiredDeadlineMs": 5000}]}),
        ("monitors/create", {**one, "requiredTier": "poor", "monitor": "single"}),
        ("monitors/create", {**one, "requiredRate": 2, "requiredDeadlineMs": 400, "monitor": "rated"}),
        ("monitors/create", {"monitor": "group", "workloads": [{"name": "a", **one, "requiredTier": "poor"},
                                                               {"name": "b", **one, "requiredRate": 1}]}),
        ("monitors/running", {"monitor": "group", "running": True, "rateHz": 2, "pid": agent.proc.pid}),
        ("monitors/report", {"monitor": "group", "workload": "a", "latenciesMs": [1.5, 2.0]}),
        ("monitors/list", {}),
        ("monitors/create", {**one, "requiredTier": "poor", "monitor": "leased", "leaseS": 60}),
        ("monitors/renew", {"monitors": ["leased", "nobody"]}),
        ("meets", {**one, "requiredTier": "great"}),  # an error answer
    ]
    try:
        async with client(mosquitto.port) as spy, client(mosquitto.port) as app:
            await spy.subscribe(f"daop/{DEV}/#", qos=1)
            for scope, prefix in ((f"daop/{DEV}/", ""), (f"daop/{DEV}/client/app1/", "o-")):
                for method, body in requests:
                    if "monitor" in body:  # monitor ids are the device's: each owner its own
                        body = {**body, "monitor": prefix + body["monitor"]}
                    if body.get("requiredTier") == "great":  # the document refuses what the agent refuses
                        with pytest.raises(AssertionError):
                            api.check(f"{scope}request/{method}", body)
                    else:
                        assert api.check(f"{scope}request/{method}", body).endswith("Request")
                    await app.publish(f"{scope}request/{method}", json.dumps(body).encode(), qos=1)
                    await asyncio.sleep(0.3)
            device.set("firmware/acpi/platform_profile", "low-power")
            await asyncio.sleep(1.5)
            for scope, prefix in ((f"daop/{DEV}/", ""), (f"daop/{DEV}/client/app1/", "o-")):
                await app.publish(f"{scope}request/monitors/running", json.dumps(
                    {"monitor": prefix + "group", "running": False}).encode(), qos=1)
                await app.publish(f"{scope}request/monitors/delete", json.dumps(
                    {"monitor": prefix + "single"}).encode(), qos=1)
            seen = await drain(spy, timeout=1.5)
        channels = set()
        for topic, payload, _ in seen:
            if "/request/" in topic or not payload:  # requests are the test's; an empty retained state clears
                continue
            channels.add(api.check(topic, json.loads(payload)))
        sent_by_agent = {name for name, _, _ in api.channels if not name.endswith("Request")}
        assert channels == sent_by_agent, sent_by_agent - channels
    finally:
        agent.stop()


def test_asyncapi_ids_are_whole_strings_even_where_dollar_matches_before_a_final_newline():
    """A monitor id with a final newline took the agent offline (issue #27); the document's Id must refuse it in a
    validator built on Python's `re` too, whose `$` matches before a final newline."""
    api = AsyncApi(REPO / "docs" / "asyncapi.yaml")
    ids = api.validator({"$ref": "#/components/schemas/Id"})
    assert ids.is_valid("blur_1-a") and ids.is_valid("x" * 64)
    for bad in ("x\n", "x\r", "", "x" * 65, "a/b", "a+b", "é"):
        assert not ids.is_valid(bad), repr(bad)
