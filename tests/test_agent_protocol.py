"""Request parsing and answers (pure): every malformed request is a BadInput with a code, never anything else."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings, strategies as st

from agent.protocol import METHODS, error, ok, parse_request, transaction_of
from monitors.errors import BadInput
from monitors.graph import InputSpec

LIMIT = 1 << 20
ONNX = base64.b64encode(b"\x08\x07").decode()


def test_a_well_formed_request_of_each_method():
    r = parse_request("monitors/create", json.dumps({
        "onnx": ONNX, "requiredTier": "good", "monitor": "cam_1", "transaction": "t",
        "inputs": {"x": {"shape": [1, 3, 224, 224], "dataType": "float16"}}}).encode(), LIMIT)
    assert (r.method, r.required_tier, r.monitor, r.transaction) == ("monitors/create", "good", "cam_1", "t")
    assert r.model.fmt == "onnx" and r.model.source == b"\x08\x07"
    assert r.inputs == {"x": InputSpec((1, 3, 224, 224), "float16")}
    assert parse_request("estimate", json.dumps({"webnn": "graph g {}"}).encode(), LIMIT).model.fmt == "webnn"
    assert parse_request("meets", json.dumps({"graph": {}, "requiredTier": "poor"}).encode(), LIMIT).model.fmt == "json"
    assert parse_request("monitors/delete", b'{"monitor": "a"}', LIMIT).monitor == "a"
    assert parse_request("monitors/list", b"", LIMIT).method == "monitors/list"


def test_answers_echo_the_transaction():
    assert json.loads(ok({"a": True}, 5)) == {"status": "ok", "data": {"a": True}, "transaction": 5}
    assert json.loads(error("bad_tier", "no", None)) == {"status": "error", "error": {"code": "bad_tier", "message": "no"}}
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
fields = st.fixed_dictionaries({}, optional={
    "onnx": st.one_of(st.just(ONNX), json_values), "webnn": json_values, "graph": json_values,
    "requiredTier": st.one_of(st.sampled_from(["good", "poor", "great"]), json_values),
    "monitor": st.one_of(st.just("m1"), json_values), "inputs": json_values, "transaction": json_values})


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(METHODS), fields)
def test_arbitrary_json_objects_are_parsed_or_refused_with_a_code(method, body):
    try:
        r = parse_request(method, json.dumps(body).encode(), LIMIT)
    except BadInput as exc:
        assert exc.code in {"bad_json", "bad_request", "bad_model", "bad_base64", "bad_inputs", "bad_tier",
                            "bad_monitor_id"}
        return
    if method in ("estimate", "meets", "monitors/create"):
        assert r.model is not None
    if method in ("meets", "monitors/create"):
        assert r.required_tier in {"good", "poor"}


def test_size_limit_is_checked_before_parsing():
    with pytest.raises(BadInput) as info:
        parse_request("estimate", b"{" * 100, 10)
    assert info.value.code == "too_large"
