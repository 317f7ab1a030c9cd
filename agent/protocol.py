"""The MQTT request/answer format of the contract: parsing requests, building answers.

Pure functions, no I/O: every malformed request becomes a `BadInput` with an
error code and one clear message, which the service sends back as an error
answer before it goes on serving others.
"""

from __future__ import annotations

import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any

from monitors.errors import BadInput
from monitors.graph import DTYPE_CODES, InputSpec
from monitors.tiers import TIER_NAMES
from agent.store import MONITOR_ID_RE

METHODS = ("estimate", "meets", "monitors/create", "monitors/delete", "monitors/list")
MODEL_FIELDS = {"onnx": "onnx", "webnn": "webnn", "graph": "json"}  # request field -> importer format
MAX_TRANSACTION_CHARS = 256
MAX_INPUTS = 1024


@dataclass(frozen=True)
class ModelSource:
    fmt: str  # 'onnx' (bytes), 'webnn' (text) or 'json' (a dict)
    source: bytes | str | dict[str, Any]


@dataclass(frozen=True)
class Request:
    method: str
    transaction: Any = None
    model: ModelSource | None = None
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    required_tier: str | None = None
    monitor: str | None = None


def transaction_of(payload: bytes) -> Any:
    """The request's `transaction`, best effort, for echoing in an error answer."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return _clean_transaction(doc.get("transaction")) if isinstance(doc, dict) else None


def _clean_transaction(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str) and len(value) <= MAX_TRANSACTION_CHARS:
        return value
    if isinstance(value, int) and abs(value) < 2**63:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def parse_request(method: str, payload: bytes, max_bytes: int) -> Request:
    """Check one request against the contract; raise BadInput with a code on any fault."""
    if method not in METHODS:
        raise BadInput(f"unknown method {method!r}; methods: {', '.join(METHODS)}", "unknown_method")
    if len(payload) > max_bytes:
        raise BadInput(f"request is {len(payload)} bytes, more than the limit of {max_bytes}", "too_large")
    try:
        doc = json.loads(payload) if payload else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"request is not valid JSON: {exc}", "bad_json") from None
    except RecursionError:
        raise BadInput("request JSON is nested too deeply", "bad_json") from None
    if not isinstance(doc, dict):
        raise BadInput("request must be a JSON object", "bad_request")
    raw_tx = doc.get("transaction")
    transaction = _clean_transaction(raw_tx)
    if raw_tx is not None and transaction is None:
        raise BadInput(f"transaction must be a string of at most {MAX_TRANSACTION_CHARS} characters or a number",
                       "bad_request")

    needs_model = method in ("estimate", "meets", "monitors/create")
    model = _model(doc) if needs_model else None
    inputs = _inputs(doc.get("inputs")) if needs_model else {}
    required = None
    if method in ("meets", "monitors/create"):
        required = doc.get("requiredTier")
        if required is None:
            raise BadInput("requiredTier is missing", "bad_tier")
        if required not in TIER_NAMES:
            raise BadInput(f"requiredTier must be one of {', '.join(TIER_NAMES)}, not {_short(required)}", "bad_tier")
    monitor = None
    if method in ("monitors/create", "monitors/delete"):
        monitor = doc.get("monitor")
        if monitor is None and method == "monitors/delete":
            raise BadInput("monitor is missing", "bad_monitor_id")
        if monitor is not None and not (isinstance(monitor, str) and MONITOR_ID_RE.match(monitor)):
            raise BadInput(f"monitor id must be 1 to 64 of A-Z a-z 0-9 _ -, not {_short(monitor)}", "bad_monitor_id")
    return Request(method, transaction, model, inputs, required, monitor)


def _model(doc: dict[str, Any]) -> ModelSource:
    present = [k for k in MODEL_FIELDS if k in doc]
    if len(present) != 1:
        what = "none" if not present else " and ".join(present)
        raise BadInput(f"a request carries exactly one of onnx, webnn, graph; this one has {what}", "bad_model")
    key = present[0]
    value = doc[key]
    if key == "onnx":
        if not isinstance(value, str):
            raise BadInput("onnx must be a base64 string", "bad_base64")
        try:
            data = binascii.a2b_base64(value.encode("ascii"), strict_mode=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise BadInput(f"onnx is not valid base64: {exc}", "bad_base64") from None
        if not data:
            raise BadInput("onnx is empty", "bad_model")
        return ModelSource("onnx", data)
    if key == "webnn":
        if not isinstance(value, str) or not value.strip():
            raise BadInput("webnn must be the graph's text", "bad_model")
        return ModelSource("webnn", value)
    if not isinstance(value, dict):
        raise BadInput("graph must be a webnn-graph-json object", "bad_model")
    return ModelSource("json", value)


def _inputs(value: Any) -> dict[str, InputSpec]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput('inputs must be an object: {"name": {"shape": [...], "dataType": "float32"}}', "bad_inputs")
    if len(value) > MAX_INPUTS:
        raise BadInput(f"inputs names {len(value)} tensors, more than {MAX_INPUTS}", "bad_inputs")
    specs: dict[str, InputSpec] = {}
    for name, spec in value.items():
        if not isinstance(spec, dict):
            raise BadInput(f"inputs.{_short(name)} must be an object with shape and dataType", "bad_inputs")
        shape = spec.get("shape")
        if not isinstance(shape, list) or len(shape) > 16 or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**53 for d in shape):
            raise BadInput(f"inputs.{_short(name)}.shape must be a list of non-negative integers", "bad_inputs")
        dtype = spec.get("dataType")
        if dtype is not None and (not isinstance(dtype, str) or dtype not in DTYPE_CODES):
            raise BadInput(f"inputs.{_short(name)}.dataType {_short(dtype)} is not one of "
                           f"{', '.join(sorted(DTYPE_CODES))}", "bad_inputs")
        specs[name] = InputSpec(tuple(shape), dtype)
    return specs


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def ok(data: dict[str, Any], transaction: Any = None) -> bytes:
    answer: dict[str, Any] = {"status": "ok", "data": data}
    if transaction is not None:
        answer["transaction"] = transaction
    return json.dumps(answer).encode()


def error(code: str, message: str, transaction: Any = None) -> bytes:
    answer: dict[str, Any] = {"status": "error", "error": {"code": code, "message": message}}
    if transaction is not None:
        answer["transaction"] = transaction
    return json.dumps(answer).encode()
