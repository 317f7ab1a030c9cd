"""Request parsing and answers (pure): every malformed request is a BadInput with a code, never anything else."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocol import METHODS, error, ok, parse_request, transaction_of
from agent.store import Running
from monitors.errors import BadInput
from monitors.graphs.graph import InputSpec
from monitors.requirements import Requirement

LIMIT = 1 << 20
ONNX = base64.b64encode(b"\x08\x07").decode()


def test_a_well_formed_request_of_each_method():
    r = parse_request("monitors/create", json.dumps({
        "onnx": ONNX, "requiredTier": "good", "monitor": "cam_1", "transaction": "t",
        "inputs": {"x": {"shape": [1, 3, 224, 224], "dataType": "float16"}}}).encode(), LIMIT)
    (w,) = r.workloads
    assert (r.method, w.requirement, r.monitor, r.transaction) == ("monitors/create", Requirement("good"), "cam_1", "t")
    assert w.model.fmt == "onnx" and w.model.source == b"\x08\x07" and not r.group
    assert w.inputs == {"x": InputSpec((1, 3, 224, 224), "float16")}
    estimate = parse_request("estimate", json.dumps({"webnn": "graph g {}"}).encode(), LIMIT)
    assert estimate.workloads[0].model.fmt == "webnn"
    meets = parse_request("meets", json.dumps({"graph": {}, "requiredTier": "poor"}).encode(), LIMIT)
    assert meets.workloads[0].model.fmt == "json"
    assert parse_request("monitors/delete", b'{"monitor": "a"}', LIMIT).monitor == "a"
    assert parse_request("monitors/list", b"", LIMIT).method == "monitors/list"


def test_answers_echo_the_transaction():
    assert json.loads(ok({"a": True}, 5)) == {"status": "ok", "data": {"a": True}, "transaction": 5}
    assert json.loads(error("bad_tier", "no", None)) == {"status": "error",
                                                         "error": {"code": "bad_tier", "message": "no"}}
    assert transaction_of(b'{"transaction": "x", "onnx": 3}') == "x"
    assert transaction_of(b"garbage") is None and transaction_of(b'{"transaction": [1]}') is None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(METHODS + ("bogus", "")), st.binary(max_size=200))
def test_arbitrary_bytes_are_answered_with_bad_input_only(method, payload):
    try:
        parse_request(method, payload, LIMIT)
    except BadInput as exc:
        assert exc.code and str(exc) and "\n" not in str(exc)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)
workload = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.sampled_from(["blur", "noise"]), json_values), "onnx": st.one_of(st.just(ONNX), json_values),
    "requiredRate": st.one_of(st.just(30), json_values), "requiredDeadlineMs": st.one_of(st.just(33.3), json_values),
    "requiredTier": st.one_of(st.just("good"), json_values)})
fields = st.fixed_dictionaries({}, optional={
    "onnx": st.one_of(st.just(ONNX), json_values), "webnn": json_values, "graph": json_values,
    "requiredTier": st.one_of(st.sampled_from(["good", "poor", "great"]), json_values),
    "requiredRate": st.one_of(st.sampled_from([30, 0, 1e9]), json_values),
    "requiredDeadlineMs": st.one_of(st.just(16.7), json_values),
    "workloads": st.one_of(st.lists(workload, max_size=3), json_values),
    "running": st.one_of(st.booleans(), json_values), "rateHz": st.one_of(st.just(30), json_values),
    "pid": st.one_of(st.just(1234), json_values), "latenciesMs": st.one_of(st.just([9.5, 10.1]), json_values),
    "workload": st.one_of(st.just("blur"), json_values),
    "monitor": st.one_of(st.just("m1"), json_values), "inputs": json_values, "transaction": json_values})


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(METHODS), fields)
def test_arbitrary_json_objects_are_parsed_or_refused_with_a_code(method, body):
    try:
        r = parse_request(method, json.dumps(body).encode(), LIMIT)
    except BadInput as exc:
        assert exc.code in {"bad_json", "bad_request", "bad_model", "bad_base64", "bad_inputs", "bad_tier",
                            "bad_monitor_id", "bad_requirement", "bad_workload", "bad_running", "bad_report",
                            "bad_generation", "bad_context"}
        return
    if method in ("estimate", "meets", "monitors/create"):
        assert r.workloads and all(w.model is not None for w in r.workloads)
    if method in ("meets", "monitors/create"):
        for w in r.workloads:
            assert w.requirement.tier in {"good", "poor", None}
            assert w.requirement.deadline_ms > 0


def test_size_limit_is_checked_before_parsing():
    with pytest.raises(BadInput) as info:
        parse_request("estimate", b"{" * 100, 10)
    assert info.value.code == "too_large"


def test_rates_deadlines_and_groups():
    rate = parse_request("monitors/create", json.dumps({"onnx": ONNX, "requiredRate": 30}).encode(), LIMIT)
    assert rate.workloads[0].requirement == Requirement(rate_hz=30.0)
    assert rate.workloads[0].requirement.deadline_ms == pytest.approx(33.333, abs=1e-3)
    both = parse_request("meets", json.dumps({"onnx": ONNX, "requiredRate": 30, "requiredDeadlineMs": 20}).encode(),
                         LIMIT).workloads[0].requirement
    assert (both.deadline_ms, both.sustained_hz) == (20.0, 30.0)
    group = parse_request("monitors/create", json.dumps({"monitor": "call", "workloads": [
        {"name": "blur", "onnx": ONNX, "requiredRate": 30},
        {"name": "noise", "webnn": "graph g {}", "requiredRate": 100, "requiredDeadlineMs": 5},
        {"name": "captions", "onnx": ONNX, "requiredTier": "fair"}]}).encode(), LIMIT)
    assert group.group and [w.name for w in group.workloads] == ["blur", "noise", "captions"]
    assert [w.requirement.sustained_hz for w in group.workloads] == [30.0, 100.0, 0.0]


@pytest.mark.parametrize("body, code", [
    ({"onnx": ONNX, "requiredTier": "good", "requiredRate": 30}, "bad_requirement"),
    ({"onnx": ONNX, "requiredRate": 0}, "bad_requirement"),
    ({"onnx": ONNX, "requiredDeadlineMs": "fast"}, "bad_requirement"),
    ({"onnx": ONNX}, "bad_tier"),
    ({"workloads": []}, "bad_workload"),
    ({"workloads": [{"name": "a", "onnx": ONNX, "requiredRate": 30}], "onnx": ONNX}, "bad_workload"),
    ({"workloads": [{"name": "a", "onnx": ONNX, "requiredRate": 30}] * 2}, "bad_workload"),
    ({"workloads": [{"name": "a b", "onnx": ONNX, "requiredRate": 30}]}, "bad_workload"),
    ({"workloads": [{"name": "a", "requiredRate": 30}]}, "bad_model"),
])
def test_bad_requirements_and_groups_are_refused_with_a_code(body, code):
    with pytest.raises(BadInput) as info:
        parse_request("monitors/create", json.dumps(body).encode(), LIMIT)
    assert info.value.code == code


def test_running_and_report():
    r = parse_request("monitors/running", b'{"monitor": "m", "running": true, "rateHz": 30, "pid": 4242}', LIMIT)
    assert (r.monitor, r.running) == ("m", Running(True, 30.0, 4242))
    assert parse_request("monitors/running", b'{"monitor": "m", "running": false}', LIMIT).running == Running(False)
    rep = parse_request("monitors/report", b'{"monitor": "m", "latenciesMs": [9.5, 10], "workload": "blur"}', LIMIT)
    assert (rep.latencies_ms, rep.workload) == ((9.5, 10.0), "blur")
    for method, body, code in (("monitors/running", b'{"monitor": "m"}', "bad_running"),
                               ("monitors/running", b'{"monitor": "m", "running": true, "pid": 1}', "bad_running"),
                               ("monitors/running", b'{"monitor": "m", "running": true, "rateHz": -1}', "bad_running"),
                               ("monitors/running", b'{"running": true}', "bad_monitor_id"),
                               ("monitors/report", b'{"monitor": "m", "latenciesMs": []}', "bad_report"),
                               ("monitors/report", b'{"monitor": "m", "latenciesMs": [0]}', "bad_report"),
                               ("monitors/report", b'{"monitor": "m", "latenciesMs": [1], "workload": 3}',
                                "bad_workload")):
        with pytest.raises(BadInput) as info:
            parse_request(method, body, LIMIT)
        assert info.value.code == code, (method, body)


def test_webnn_context_options():
    body = {"onnx": ONNX, "deviceType": "npu", "powerPreference": "low-power"}
    r = parse_request("estimate", json.dumps(body).encode(), LIMIT)
    assert (r.context.device_type, r.context.power_preference, r.context.accelerated) == ("npu", "low-power", None)
    assert parse_request("estimate", json.dumps({"onnx": ONNX}).encode(), LIMIT).context is None
    for body in ({"deviceType": "tpu"}, {"powerPreference": "eco"}, {"accelerated": 1}, {"deviceType": 3},
                 {"deviceType": "gpu", "accelerated": False}):
        with pytest.raises(BadInput) as info:
            parse_request("meets", json.dumps({"onnx": ONNX, "requiredTier": "good", **body}).encode(), LIMIT)
        assert info.value.code == "bad_context", body
