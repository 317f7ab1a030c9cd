"""The MQTT request/answer format of the contract: parsing requests, building answers.

Pure functions, no I/O: every malformed request becomes a `BadInput` with an
error code and one clear message, which the service sends back as an error
answer before it goes on serving others.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from agent.store import MONITOR_ID_RE, Running
from monitors.errors import BadInput
from monitors.graphs.graph import DTYPE_CODES, InputSpec
from monitors.placement import ContextHints
from monitors.pricing.generation import GenerationSpec
from monitors.requirements import Requirement, finite_number
from monitors.warm import MAX_LATENCIES

METHODS = ("estimate", "meets", "monitors/create", "monitors/delete", "monitors/list", "monitors/running",
           "monitors/report", "monitors/renew")
MODEL_FIELDS = {"onnx": "onnx", "webnn": "webnn", "graph": "json"}  # request field -> importer format
MAX_TRANSACTION_CHARS = 256
MAX_INPUTS = 1024
MAX_WORKLOADS = 16  # in one group
MAX_PID = 1 << 22  # the kernel's pid_max ceiling
MIN_LEASE_S, MAX_LEASE_S = 10, 7 * 86400  # a monitor's lease (docs/mqtt.md "Leases")
MAX_RENEW = 1000  # monitors renewed by one request


@dataclass(frozen=True)
class ModelSource:
    """`fmt` 'onnx' (bytes), 'webnn' (text), 'json' (a dict), or 'json-request': a webnn-graph-json model left
    in the request's payload, `(payload, index)` (index: which of `workloads`, None for the request's own
    `graph`), read again where it is priced (graph_in_request) rather than carried as objects or re-serialised."""

    fmt: str
    source: Any


@dataclass(frozen=True)
class Workload:
    """One model and what it must meet; a request without `workloads` holds one, named ""."""

    name: str
    model: ModelSource
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    requirement: Requirement | None = None  # None for `estimate`
    generation: GenerationSpec | None = None  # an LLM's generation rather than one inference


@dataclass(frozen=True)
class Request:
    method: str
    transaction: Any = None
    workloads: tuple[Workload, ...] = ()
    monitor: str | None = None
    running: Running | None = None
    latencies_ms: tuple[float, ...] = ()  # a report's
    workload: str | None = None  # which of a group's workloads a report is for
    context: ContextHints | None = None  # WebNN's context options: where to run it
    lease_s: float | None = None  # a create's lease: deleted once this long passes unrenewed (None: no lease)
    monitors: tuple[str, ...] = ()  # the monitors a renew is for

    @property
    def group(self) -> bool:
        return len(self.workloads) > 1 or any(w.name for w in self.workloads)


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

    workloads: tuple[Workload, ...] = ()
    context = _context(doc) if method in ("estimate", "meets", "monitors/create") else None
    if method == "estimate":
        workloads = (_workload(doc, "", None),)
    elif method in ("meets", "monitors/create"):
        workloads = _workloads(doc)
    monitor = None
    if method in ("monitors/create", "monitors/delete", "monitors/running", "monitors/report"):
        monitor = doc.get("monitor")
        if monitor is None and method != "monitors/create":
            raise BadInput("monitor is missing", "bad_monitor_id")
        if monitor is not None and not (isinstance(monitor, str) and MONITOR_ID_RE.fullmatch(monitor)):
            raise BadInput(f"monitor id must be 1 to 64 of A-Z a-z 0-9 _ -, not {_short(monitor)}", "bad_monitor_id")
    running = _running(doc) if method == "monitors/running" else None
    latencies: tuple[float, ...] = ()
    workload = None
    if method == "monitors/report":
        latencies = _latencies(doc.get("latenciesMs"))
        workload = doc.get("workload")
        if workload is not None and not (isinstance(workload, str) and MONITOR_ID_RE.fullmatch(workload)):
            raise BadInput(f"workload must name one of the monitor's workloads, not {_short(workload)}",
                           "bad_workload")
    lease = _lease(doc.get("leaseS")) if method == "monitors/create" else None
    renewed = _renewed(doc.get("monitors")) if method == "monitors/renew" else ()
    return Request(method, transaction, workloads, monitor, running, latencies, workload, context, lease, renewed)


def _lease(value: Any) -> float | None:
    if value is None:
        return None
    if not finite_number(value) or not MIN_LEASE_S <= value <= MAX_LEASE_S:
        raise BadInput(f"leaseS must be the seconds a monitor lives unrenewed, {MIN_LEASE_S} to {MAX_LEASE_S}, "
                       f"not {_short(value)}", "bad_lease")
    return float(value)


def _renewed(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_RENEW or not all(
            isinstance(m, str) and MONITOR_ID_RE.fullmatch(m) for m in value):
        raise BadInput(f"monitors must be a list of 1 to {MAX_RENEW} monitor ids", "bad_monitor_id")
    return tuple(dict.fromkeys(value))


def parse_request_compact(method: str, payload: bytes, max_bytes: int) -> Request:
    """`parse_request` for a helper process (a large payload is parsed off the agent's event loop): what comes
    back to the agent is only what it needs. A webnn-graph-json model comes back as where it lies in the
    payload the agent already holds (`json-request`, its payload filled in by `with_payload`), never as
    objects nor re-serialised (a `1e15` written back is `1000000000000000.0`: the agent would hold several
    times the request). A payload whose parse needs more than the process's memory ceiling is refused."""
    try:
        request = parse_request(method, payload, max_bytes)
    except MemoryError:
        raise BadInput("the request needs more memory to read than the agent allows (limits.worker_memory_mb)",
                       "too_large") from None
    grouped = request.method in ("meets", "monitors/create") and any(w.name for w in request.workloads)
    workloads = tuple(dataclasses.replace(w, model=ModelSource("json-request", (None, i if grouped else None)))
                      if w.model.fmt == "json" else w for i, w in enumerate(request.workloads))
    return dataclasses.replace(request, workloads=workloads)


def with_payload(request: Request, payload: bytes) -> Request:
    """A compact request's `json-request` models pointed at its payload (the bytes the agent holds already)."""
    workloads = tuple(dataclasses.replace(w, model=ModelSource("json-request", (payload, w.model.source[1])))
                      if w.model.fmt == "json-request" else w for w in request.workloads)
    return dataclasses.replace(request, workloads=workloads)


def graph_in_request(source: tuple[bytes, int | None]) -> dict[str, Any]:
    """The webnn-graph-json model a `json-request` source points at, read from its payload again (in a worker)."""
    payload, index = source
    doc = json.loads(payload)
    graph = doc["graph"] if index is None else doc["workloads"][index]["graph"]
    if not isinstance(graph, dict):
        raise BadInput("graph must be a webnn-graph-json object", "bad_model")
    return graph


def _workloads(doc: dict[str, Any]) -> tuple[Workload, ...]:
    """One model with its requirement, or `workloads`: a group, each with a name, a model and a requirement."""
    group = doc.get("workloads")
    if group is None:
        return (_workload(doc, "", Requirement.parse(doc)),)
    if any(k in doc for k in (*MODEL_FIELDS, "inputs", "generation", "requiredTier", "requiredRate",
                              "requiredDeadlineMs")):
        raise BadInput("a request with workloads carries its models and requirements in them, not beside them",
                       "bad_workload")
    if not isinstance(group, list) or not 1 <= len(group) <= MAX_WORKLOADS:
        raise BadInput(f"workloads must be a list of 1 to {MAX_WORKLOADS} objects", "bad_workload")
    out: list[Workload] = []
    for i, item in enumerate(group):
        where = f"workloads[{i}]."
        if not isinstance(item, dict):
            raise BadInput(f"{where[:-1]} must be an object", "bad_workload")
        name = item.get("name")
        if not (isinstance(name, str) and MONITOR_ID_RE.fullmatch(name)):
            raise BadInput(f"{where}name must be 1 to 64 of A-Z a-z 0-9 _ -, not {_short(name)}", "bad_workload")
        if any(w.name == name for w in out):
            raise BadInput(f"{where}name {name!r} is used twice", "bad_workload")
        out.append(_workload(item, name, Requirement.parse(item, where)))
    return tuple(out)


def _workload(doc: dict[str, Any], name: str, requirement: Requirement | None) -> Workload:
    """A model with its inputs, or with a generation (an LLM's: its inputs come from the graph)."""
    model, inputs, generation = _model(doc), _inputs(doc.get("inputs")), _generation(doc.get("generation"))
    if generation is not None:
        if inputs:
            raise BadInput("a generation binds the model's inputs itself: give either generation or inputs",
                           "bad_generation")
        if model.fmt != "onnx":
            raise BadInput("a generation needs an ONNX language model (onnx), not a webnn graph", "bad_generation")
    return Workload(name, model, inputs, requirement, generation)


def _generation(value: Any) -> GenerationSpec | None:
    """`"generation": {"promptTokens": 512, "outputTokens": 128}` (outputTokens defaults to 1)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadInput('generation must be an object: {"promptTokens": 512, "outputTokens": 128}', "bad_generation")
    unknown = set(value) - {"promptTokens", "outputTokens"}
    if unknown:
        raise BadInput(f"generation has unknown fields: {', '.join(sorted(map(_short, unknown)))}; "
                       "known: promptTokens, outputTokens", "bad_generation")
    if "promptTokens" not in value:
        raise BadInput("generation.promptTokens is missing", "bad_generation")
    return GenerationSpec(value["promptTokens"], value.get("outputTokens", 1))


def _context(doc: dict[str, Any]) -> ContextHints | None:
    """WebNN's MLContextOptions as the request gives them: `deviceType`, `powerPreference`, `accelerated`."""
    device, preference, accelerated = doc.get("deviceType"), doc.get("powerPreference"), doc.get("accelerated")
    if device is None and preference is None and accelerated is None:
        return None
    if accelerated is not None and not isinstance(accelerated, bool):
        raise BadInput(f"accelerated must be true or false, not {_short(accelerated)}", "bad_context")
    if not all(v is None or isinstance(v, str) for v in (device, preference)):
        raise BadInput("deviceType and powerPreference are strings", "bad_context")
    try:
        return ContextHints(device, preference or "default", accelerated)
    except BadInput as exc:
        raise BadInput(str(exc), "bad_context") from None


def _running(doc: dict[str, Any]) -> Running:
    running = doc.get("running")
    if not isinstance(running, bool):
        raise BadInput("running must be true or false", "bad_running")
    rate = doc.get("rateHz")
    if rate is not None and (not finite_number(rate) or not 0 < rate <= 10_000):
        raise BadInput(f"rateHz must be a number of runs a second, above 0 and at most 10000, not {_short(rate)}",
                       "bad_running")
    pid = doc.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid < MAX_PID):
        raise BadInput(f"pid must be the app's process id on this device, not {_short(pid)}", "bad_running")
    return Running(running, None if rate is None else float(rate), pid)


def _latencies(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LATENCIES or not all(
            finite_number(v) and 0 < v < 3.6e6
            for v in value):
        raise BadInput(f"latenciesMs must be a list of 1 to {MAX_LATENCIES} positive milliseconds (under an hour)",
                       "bad_report")
    return tuple(float(v) for v in value)


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


def error(code: str, message: str, transaction: Any = None, retry_after_s: int | None = None) -> bytes:
    """An error answer; `rate_limited` carries `retryAfterS`, the whole seconds until the client may ask again."""
    body: dict[str, Any] = {"code": code, "message": message}
    if retry_after_s is not None:
        body["retryAfterS"] = retry_after_s
    answer: dict[str, Any] = {"status": "error", "error": body}
    if transaction is not None:
        answer["transaction"] = transaction
    return json.dumps(answer).encode()
