"""The MQTT contract end to end: the real agent process, a real Mosquitto, real estimates.

The device is a fixture /sys tree (a desktop) so that the tests can flip its
power profile; the user policy `power_saver = true` then makes every monitor
false, and back: a state change the tests control exactly.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import onnx
import onnx.helper as h
import pytest
from agent_harness import agent_on, client, next_message, request_v5, write_config
from models import make_model, mlp, value
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from monitors.pricing.tiers import TIER_NAMES

DEV = "dev1"
CONFIG = """
[monitors]
min_dwell_s = 0.2
hysteresis_margin = 0.1
max_events_per_minute = 30

[limits]
max_request_bytes = 200000
max_monitors = 5

[policy]
power_saver = true
"""


def onnx_b64(model: onnx.ModelProto) -> str:
    return base64.b64encode(model.SerializeToString()).decode()


SMALL = onnx_b64(mlp([64, 128, 10], batch=1))


def huge_matmul() -> str:
    """A hostile graph: one MatMul of two 200,000 x 200,000 inputs (1.6e16 FLOPs, 160 GB per input)."""


    n = 200_000
    model = make_model([h.make_node("MatMul", ["a", "b"], ["y"])], [value("a", [n, n]), value("b", [n, n])],
                       [value("y", [n, n])])
    return onnx_b64(model)
DYNAMIC = onnx_b64(mlp([64, 128, 10], batch="batch"))


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    yield proc
    proc.stop()


async def test_status_is_retained_online_and_offline_after_a_clean_stop(agent, mosquitto):
    async with client(mosquitto.port) as c:
        await c.subscribe(f"daop/{DEV}/status", qos=1)
        m = await next_message(c)
        assert m.retain and json.loads(m.payload) == {"state": "online"}
        assert agent.stop() == 0
        m = await next_message(c)
        assert json.loads(m.payload) == {"state": "offline"}


async def test_will_says_offline_when_the_agent_is_killed(agent, mosquitto):
    async with client(mosquitto.port) as c:
        await c.subscribe(f"daop/{DEV}/status", qos=1)
        assert json.loads((await next_message(c)).payload) == {"state": "online"}
        agent.kill()
        assert json.loads((await next_message(c)).payload) == {"state": "offline"}


async def test_desktop_fixture_tree_webnn_context_options_place_a_request(agent, mosquitto):
    """The desktop fixture has no GPU or NPU: `deviceType: "gpu"` is an error with one line; the CPU, a fallback,
    or accelerated false are answered on the CPU; a low-power preference with no NPU falls back to the CPU."""
    async with client(mosquitto.port) as c:
        cpu, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL, "deviceType": "cpu"})
        for options in ({"powerPreference": "fallback"}, {"accelerated": False}, {"powerPreference": "low-power"}):
            same, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL, **options})
            assert same == cpu, options
        for options in ({"deviceType": "gpu"}, {"deviceType": "npu"}, {"deviceType": "tpu"}, {"accelerated": "yes"},
                        {"deviceType": "gpu", "powerPreference": "fallback"}):
            answer, _ = await request_v5(c, DEV, "meets", {"onnx": SMALL, "requiredTier": "poor", **options})
            assert answer["status"] == "error" and answer["error"]["code"] == "bad_context", (options, answer)
            assert "\n" not in answer["error"]["message"]


async def test_estimate_and_meets_over_v5_with_correlation_data(agent, mosquitto):
    async with client(mosquitto.port) as c:
        answer, msg = await request_v5(c, DEV, "estimate", {"onnx": SMALL, "transaction": "t-1"})
        assert answer["status"] == "ok" and answer["transaction"] == "t-1"
        tier = answer["data"]["performanceTier"]
        assert tier in TIER_NAMES and set(answer["data"]) == {"performanceTier"}
        same, _ = await request_v5(c, DEV, "meets", {"onnx": SMALL, "requiredTier": tier})
        assert same == {"status": "ok", "data": {"meetsRequirement": True}}
        worst, _ = await request_v5(c, DEV, "meets", {"onnx": SMALL, "requiredTier": "poor"})
        assert worst["data"]["meetsRequirement"] is True
        if tier != "excellent":
            better = TIER_NAMES[TIER_NAMES.index(tier) - 1]
            ans, _ = await request_v5(c, DEV, "meets", {"onnx": SMALL, "requiredTier": better})
            assert ans["data"]["meetsRequirement"] is False


async def test_inputs_bind_symbolic_dimensions(agent, mosquitto):
    async with client(mosquitto.port) as c:
        small, _ = await request_v5(c, DEV, "estimate", {
            "onnx": DYNAMIC, "inputs": {"x": {"shape": [1, 64], "dataType": "float32"}}})
        assert small["status"] == "ok"
        missing, _ = await request_v5(c, DEV, "estimate", {"onnx": DYNAMIC})
        assert missing["status"] == "error" and missing["error"]["message"]


async def test_a_311_client_is_answered_on_response_method_with_its_transaction(agent, mosquitto):
    async with client(mosquitto.port, v5=False) as c:
        await c.subscribe(f"daop/{DEV}/response/#", qos=1)
        await c.publish(f"daop/{DEV}/request/estimate", json.dumps({"onnx": SMALL, "transaction": 42}), qos=1)
        m = await next_message(c, timeout=30)
        assert m.topic.value == f"daop/{DEV}/response/estimate"
        answer = json.loads(m.payload)
        assert answer["status"] == "ok" and answer["transaction"] == 42
        await c.publish(f"daop/{DEV}/request/monitors/list", json.dumps({"transaction": "x"}), qos=1)
        m = await next_message(c, timeout=30)
        assert m.topic.value == f"daop/{DEV}/response/monitors/list"
        assert json.loads(m.payload) == {"status": "ok", "data": {"monitors": []}, "transaction": "x"}


async def test_monitor_lifecycle_with_retained_state_and_events_on_change(agent, mosquitto, device):
    async with client(mosquitto.port) as c:
        await c.subscribe(f"daop/{DEV}/monitors/#", qos=1)
        answer, _ = await request_v5(c, DEV, "monitors/create",
                                     {"onnx": SMALL, "requiredTier": "poor", "monitor": "blur"})
        assert answer == {"status": "ok", "data": {"monitor": "blur", "meetsRequirement": True}}
        state = await next_message(c, f"daop/{DEV}/monitors/blur/state")
        first = json.loads(state.payload)
        assert first == {"monitor": "blur", "requiredTier": "poor", "meetsRequirement": True, "seq": first["seq"]}

        device.set("firmware/acpi/platform_profile", "low-power")  # policy: nothing runs locally
        event = json.loads((await next_message(c, f"daop/{DEV}/monitors/blur/events", timeout=5)).payload)
        assert event["meetsRequirement"] is False and event["seq"] == first["seq"] + 1
        assert set(event) == {"monitor", "meetsRequirement", "seq", "ts"} and event["ts"].endswith("Z")
        state = json.loads((await next_message(c, f"daop/{DEV}/monitors/blur/state")).payload)
        assert state["meetsRequirement"] is False and state["seq"] == event["seq"]

        device.set("firmware/acpi/platform_profile", "balanced")
        back = json.loads((await next_message(c, f"daop/{DEV}/monitors/blur/events", timeout=5)).payload)
        assert back["meetsRequirement"] is True and back["seq"] == event["seq"] + 1

        listed, _ = await request_v5(c, DEV, "monitors/list", {})
        assert listed["data"]["monitors"] == [
            {"monitor": "blur", "requiredTier": "poor", "meetsRequirement": True, "seq": back["seq"]}]

    # a late subscriber gets the retained state
    async with client(mosquitto.port) as late:
        await late.subscribe(f"daop/{DEV}/monitors/+/state", qos=1)
        m = await next_message(late)
        assert m.retain and json.loads(m.payload)["seq"] == back["seq"]
        deleted, _ = await request_v5(late, DEV, "monitors/delete", {"monitor": "blur"})
        assert deleted == {"status": "ok", "data": {}}
        cleared = await next_message(late, f"daop/{DEV}/monitors/blur/state")
        assert cleared.payload == b""
        again, _ = await request_v5(late, DEV, "monitors/delete", {"monitor": "blur"})
        assert again["status"] == "error" and again["error"]["code"] == "unknown_monitor"
        listed, _ = await request_v5(late, DEV, "monitors/list", {})
        assert listed["data"]["monitors"] == []


async def test_recreating_a_monitor_never_sends_seq_back(agent, mosquitto):
    async with client(mosquitto.port) as c:
        await c.subscribe(f"daop/{DEV}/monitors/m/state", qos=1)
        await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "good", "monitor": "m"})
        s1 = json.loads((await next_message(c)).payload)["seq"]
        await request_v5(c, DEV, "monitors/delete", {"monitor": "m"})
        assert (await next_message(c)).payload == b""
        await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "good", "monitor": "m"})
        s2 = json.loads((await next_message(c)).payload)["seq"]
        assert s2 > s1


async def test_monitor_limit_is_enforced(agent, mosquitto):
    async with client(mosquitto.port) as c:
        for _ in range(5):
            ok, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "fair"})
            assert ok["status"] == "ok", ok
        refused, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "fair"})
        assert refused["status"] == "error" and refused["error"]["code"] == "too_many_monitors"
        listed, _ = await request_v5(c, DEV, "monitors/list", {})
        assert len(listed["data"]["monitors"]) == 5


MALFORMED = [
    ("estimate", b"{not json", "bad_json"),
    ("estimate", b"[1, 2]", "bad_request"),
    ("estimate", b"\xff\xfe", "bad_json"),
    ("estimate", b"[" * 100_000, "bad_json"),
    ("estimate", json.dumps({}).encode(), "bad_model"),
    ("estimate", json.dumps({"onnx": SMALL, "webnn": "x"}).encode(), "bad_model"),
    ("estimate", json.dumps({"onnx": "!!!not base64!!!"}).encode(), "bad_base64"),
    ("estimate", json.dumps({"onnx": 12}).encode(), "bad_base64"),
    ("estimate", json.dumps({"onnx": base64.b64encode(b"garbage bytes").decode()}).encode(), "bad_graph"),
    ("estimate", json.dumps({"graph": "not an object"}).encode(), "bad_model"),
    ("estimate", json.dumps({"onnx": huge_matmul()}).encode(), "limit_exceeded"),
    ("estimate", json.dumps({"onnx": SMALL, "inputs": {"x": {"shape": [2**40, 64]}}}).encode(), None),
    ("estimate", json.dumps({"graph": {"nodes": "?"}}).encode(), None),
    ("estimate", json.dumps({"webnn": "this is not a graph {"}).encode(), None),
    ("estimate", json.dumps({"onnx": SMALL, "inputs": {"x": {"shape": [-1, 64]}}}).encode(), "bad_inputs"),
    ("estimate", json.dumps({"onnx": SMALL, "inputs": {"x": {"shape": [1, 64], "dataType": "f33"}}}).encode(),
     "bad_inputs"),
    ("estimate", json.dumps({"onnx": SMALL, "inputs": [1]}).encode(), "bad_inputs"),
    ("estimate", json.dumps({"onnx": SMALL, "transaction": {"a": 1}}).encode(), "bad_request"),
    ("estimate", json.dumps({"onnx": "A" * 300_000}).encode(), "too_large"),
    ("meets", json.dumps({"onnx": SMALL}).encode(), "bad_tier"),
    ("meets", json.dumps({"onnx": SMALL, "requiredTier": "great"}).encode(), "bad_tier"),
    ("meets", json.dumps({"onnx": SMALL, "requiredTier": 3}).encode(), "bad_tier"),
    ("monitors/create", json.dumps({"onnx": SMALL, "requiredTier": "good", "monitor": "a/b"}).encode(),
     "bad_monitor_id"),
    ("monitors/create", json.dumps({"onnx": SMALL, "requiredTier": "good", "monitor": "x" * 65}).encode(),
     "bad_monitor_id"),
    ("monitors/delete", json.dumps({}).encode(), "bad_monitor_id"),
    ("monitors/delete", json.dumps({"monitor": "nope"}).encode(), "unknown_monitor"),
    ("frobnicate", json.dumps({"onnx": SMALL}).encode(), "unknown_method"),
    ("monitors/create/extra", b"{}", "unknown_method"),
]


async def test_every_malformed_request_gets_an_error_answer_and_the_agent_keeps_serving(agent, mosquitto):
    async with client(mosquitto.port) as c:
        for method, payload, code in MALFORMED:
            answer, _ = await request_v5(c, DEV, method, payload)
            assert answer["status"] == "error", (method, payload[:80], answer)
            assert set(answer["error"]) == {"code", "message"} and answer["error"]["message"]
            if code is not None:
                assert answer["error"]["code"] == code, (method, payload[:80], answer)
        ok, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL})
        assert ok["status"] == "ok"
        listed, _ = await request_v5(c, DEV, "monitors/list", {})
        assert listed["data"]["monitors"] == []  # nothing was created by a bad request
    assert "Traceback" not in agent.log


async def test_a_response_topic_inside_the_device_tree_cannot_spoof_monitor_state(agent, mosquitto):

    async with client(mosquitto.port) as c:
        await c.subscribe(f"daop/{DEV}/response/estimate", qos=1)
        await c.subscribe(f"daop/{DEV}/monitors/#", qos=1)
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = f"daop/{DEV}/monitors/fake/state"
        props.CorrelationData = b"c1"
        await c.publish(f"daop/{DEV}/request/estimate", json.dumps({"onnx": SMALL}), qos=1, properties=props)
        m = await next_message(c, timeout=30)
        assert m.topic.value == f"daop/{DEV}/response/estimate"
        assert m.properties.CorrelationData == b"c1"
        assert json.loads(m.payload)["status"] == "ok"
