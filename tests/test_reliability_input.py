"""Reliability against bad input: 10,000 fuzzed requests and hostile graphs, over MQTT, to the real agent.

Every request gets exactly one answer; a request that breaks the contract
gets an error answer (a fuzzed one that happens to be well formed may get a
real answer); hostile graphs (millions of nodes, huge shapes, deep nesting,
cycles) are each refused with an error; the agent's memory stays bounded;
and a well-formed request is still answered promptly in the middle of it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import time
import uuid
from pathlib import Path

import onnx
import onnx.helper as h
import psutil
import pytest
from agent_harness import AgentProcess, client
from broker import Mosquitto
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from models import make_model, mlp, value
from onnx import TensorProto as T
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.protocol import METHODS, parse_request
from agent.simulation.trees import desktop
from monitors.errors import BadInput
from monitors.pricing.tiers import TIER_NAMES

DEV = "fuzz1"
REPO = Path(__file__).resolve().parent.parent
MAX_REQUEST_BYTES = 16 << 20
CONFIG = f"""
[limits]
estimate_timeout_s = 5
max_request_bytes = {MAX_REQUEST_BYTES}
max_monitors = 50
"""
SMALL_ONNX = mlp([64, 128, 10], batch=1).SerializeToString()
SMALL = base64.b64encode(SMALL_ONNX).decode()
WEBNN = (REPO / "tests/data/mlp.webnn").read_text()
FUZZED = 10_000
BATCH = 500  # sent at once


@pytest.fixture(scope="module")
def agent(calibrated_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    state = root / "state"
    shutil.copytree(calibrated_dir, state)
    tree = desktop(root / "tree")
    config = root / "agent.toml"
    config.write_text(CONFIG)
    broker = Mosquitto(root / "broker").start()
    proc = AgentProcess(state, broker.url, device_id=DEV, config=config, sysfs_root=tree.sys,
                        procfs_root=tree.proc, sample_interval=0.5).start()
    try:
        yield proc, broker
    finally:
        proc.stop()
        broker.stop()


def memory_mb(proc: AgentProcess) -> tuple[float, float]:
    """RSS of the agent process, and of it with its estimator workers, MB."""
    p = psutil.Process(proc.proc.pid)
    own = p.memory_info().rss
    total = own + sum(c.memory_info().rss for c in p.children(recursive=True) if c.is_running())
    return own / 2**20, total / 2**20


async def send_all(port: int, requests: list[tuple[str, bytes]], timeout: float = 120.0) -> list[dict]:
    """Publish every request with its own CorrelationData; the answers in request order."""
    topic = f"daop/{DEV}/response/client/fuzz-{uuid.uuid4().hex[:8]}"
    answers: list[list[dict]] = [[] for _ in requests]
    async with client(port) as c:
        await c.subscribe(topic, qos=1)

        async def publish(i: int, method: str, payload: bytes) -> None:
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic = topic
            props.CorrelationData = i.to_bytes(4, "big")
            await c.publish(f"daop/{DEV}/request/{method}", payload, qos=1, properties=props)

        async def collect() -> None:
            got = 0
            async for m in c.messages:
                answers[int.from_bytes(m.properties.CorrelationData, "big")].append(json.loads(m.payload))
                got += 1
                if got == len(requests):
                    return

        reader = asyncio.get_running_loop().create_task(collect())
        await asyncio.gather(*(publish(i, method, payload) for i, (method, payload) in enumerate(requests)))
        try:
            await asyncio.wait_for(reader, timeout)
        except TimeoutError:
            missing = [requests[i][0] for i, a in enumerate(answers) if not a]
            raise AssertionError(f"{len(missing)} request(s) never answered, e.g. {missing[:5]}") from None
        await asyncio.sleep(0.05)  # a duplicate answer would show up here
    assert all(len(a) == 1 for a in answers), "a request was answered twice"
    return [a[0] for a in answers]


async def good_request_seconds(port: int) -> float:
    t0 = time.perf_counter()
    [answer] = await send_all(port, [("estimate", json.dumps({"onnx": SMALL, "transaction": 1}).encode())], 60)
    assert answer["status"] == "ok" and answer["transaction"] == 1, answer
    return time.perf_counter() - t0


# -- fuzzed requests ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=4)


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """`data` with a few bytes changed, sometimes cut short."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        out = out[: draw(st.integers(0, len(out)))]
    return bytes(out)


models = st.one_of(
    st.builds(lambda b: {"onnx": base64.b64encode(b).decode()}, mutated(SMALL_ONNX)),
    st.builds(lambda v: {"onnx": v}, st.text(max_size=30) | json_values),
    st.builds(lambda b: {"webnn": b.decode("latin-1")}, mutated(WEBNN.encode())),
    st.builds(lambda v: {"graph": v}, json_values),
    st.just({"onnx": SMALL, "webnn": WEBNN}),  # two models
    st.just({}),  # none
)
inputs = st.dictionaries(st.text(max_size=8), st.builds(
    lambda shape, dtype: {"shape": shape, "dataType": dtype},
    st.lists(st.integers(-5, 2**40) | st.sampled_from([0, 1, 64, 2**31 - 1]), max_size=5) | json_values,
    st.sampled_from(["float32", "int64", "float99"]) | json_values), max_size=2)
requests_dicts = st.builds(
    lambda model, extra: {**model, **extra}, models,
    st.fixed_dictionaries({}, optional={
        "inputs": inputs | json_values,
        "requiredTier": st.sampled_from(TIER_NAMES) | json_values,
        "monitor": st.sampled_from(["m1", "x" * 65, "a/b", "", "ok_id-2"]) | json_values,
        "transaction": json_values,
    }))
payloads = st.one_of(
    st.binary(max_size=100),
    json_values.map(lambda v: json.dumps(v).encode()),
    requests_dicts.map(lambda d: json.dumps(d).encode()),
    requests_dicts.map(lambda d: json.dumps(d).encode()[:-1]),  # cut short
)
ODD_METHODS = ("", "estimate/x", "monitors", "Estimate", "..", "list", "monitors/create/again")


def contract_allows(method: str, payload: bytes) -> bool:
    """Whether the request is well formed by the contract (then an ok answer is legitimate)."""
    try:
        parse_request(method, payload, MAX_REQUEST_BYTES)
    except BadInput:
        return False
    return True


def fuzzed(count: int) -> list[tuple[str, bytes]]:
    """`count` requests: payloads drawn by hypothesis, each sent to every method of the contract (and a few
    to methods that do not exist). Generation only: they are sent in bulk, not one example at a time."""
    drawn: list[bytes] = []

    @settings(max_examples=count // len(METHODS), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(payload=payloads)
    def draw(payload: bytes) -> None:
        drawn.append(payload)

    draw()
    requests = [(method, payload) for payload in drawn for method in METHODS]
    for i, payload in enumerate(drawn[: count - len(requests)]):
        requests.append((ODD_METHODS[i % len(ODD_METHODS)], payload))
    return requests


def test_ten_thousand_fuzzed_requests_each_get_one_well_formed_answer_and_good_ones_are_still_served(agent):
    proc, broker = agent
    requests = fuzzed(FUZZED)
    assert len(requests) == FUZZED
    own_before, _ = memory_mb(proc)

    async def scenario() -> tuple[list[dict], list[float]]:
        answers: list[dict] = []
        good: list[float] = []
        for start in range(0, len(requests), BATCH):
            answers += await send_all(broker.port, requests[start:start + BATCH])
            if start % (10 * BATCH) == 0:
                good.append(await good_request_seconds(broker.port))
        return answers, good

    t0 = time.perf_counter()
    answers, good = asyncio.run(scenario())
    took = time.perf_counter() - t0
    codes: dict[str, int] = {}
    for (method, payload), answer in zip(requests, answers, strict=True):
        assert answer.get("status") in ("ok", "error"), answer
        if answer["status"] == "error":
            assert set(answer["error"]) == {"code", "message"} and answer["error"]["message"], answer
            assert answer["error"]["code"] != "internal", (method, payload[:300], answer)
            codes[answer["error"]["code"]] = codes.get(answer["error"]["code"], 0) + 1
        else:  # only a request the contract allows may succeed
            assert contract_allows(method, payload), (method, payload[:300], answer)
    assert proc.proc.poll() is None
    own_after, total = memory_mb(proc)
    ok = sum(a["status"] == "ok" for a in answers)
    print(f"\nfuzz: {len(requests)} requests answered in {took:.1f} s ({ok} well-formed ones ok); errors {codes}; "
          f"agent RSS {own_before:.0f} -> {own_after:.0f} MB, {total:.0f} MB with workers; a good estimate "
          f"meanwhile answered in at most {max(good) * 1000:.0f} ms")
    assert own_after - own_before < 150, (own_before, own_after)
    assert max(good) < 10, good


# -- hostile graphs ----------------------------------------------------------------------------


def repeated_nodes_model(count: int) -> bytes:
    """A model of `count` nodes, built as bytes: protobuf merges concatenated messages (fast, little memory)."""
    base = make_model([], [value("x", [1, 8])], [value("y", [1, 8])]).SerializeToString()
    one = onnx.ModelProto(graph=onnx.GraphProto(node=[h.make_node("Relu", ["x"], ["y"])])).SerializeToString()
    return base + one * count


def chain_model(count: int) -> bytes:
    nodes = [h.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(count)]
    return make_model(nodes, [value("t0", [1, 8])], [value(f"t{count}", [1, 8])]).SerializeToString()


def _ld(field: int, data: bytes) -> bytes:
    """One length-delimited protobuf field."""
    out, n = bytearray([field << 3 | 2]), len(data)
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out) + data


def nested_if_model(depth: int) -> bytes:
    """If nodes nested `depth` deep in their then-branches, encoded by hand (protobuf's own builder stops at ~30)."""
    leaf = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "leaf", [], [value("y", [1, 8])]).SerializeToString()
    out_info = value("y", [1, 8]).SerializeToString()
    graph = leaf
    for i in range(depth):  # AttributeProto: name=1, g=6, type=20 (GRAPH=5); NodeProto: input=1, output=2,
        then_attr = _ld(1, b"then_branch") + _ld(6, graph) + bytes([0xA0, 0x01, 5])  # op_type=4, attribute=5
        else_attr = _ld(1, b"else_branch") + _ld(6, leaf) + bytes([0xA0, 0x01, 5])
        node = _ld(1, b"c") + _ld(2, b"y") + _ld(4, b"If") + _ld(5, then_attr) + _ld(5, else_attr)
        graph = _ld(1, node) + _ld(2, f"g{i}".encode()) + _ld(12, out_info)  # GraphProto: node=1, name=2, output=12
    base = make_model([], [value("c", [], T.BOOL), value("x", [1, 8])], [value("y", [1, 8])]).SerializeToString()
    return base + _ld(7, _ld(1, node))  # ModelProto.graph=7, merged into the base model's graph


def cycle_model() -> bytes:
    nodes = [h.make_node("Relu", ["b"], ["a"]), h.make_node("Relu", ["a"], ["b"]),
             h.make_node("Add", ["x", "a"], ["y"])]
    return make_model(nodes, [value("x", [1, 8])], [value("y", [1, 8])]).SerializeToString()


def huge_shape_model() -> bytes:
    nodes = [h.make_node("MatMul", ["x", "x"], ["y"])]
    return make_model(nodes, [value("x", [2**31 - 1, 2**31 - 1])], [value("y", None)]).SerializeToString()


def deep_json(depth: int) -> bytes:
    return b'{"graph": ' + b"[" * depth + b"]" * depth + b"}"


def cyclic_webnn_json() -> dict:
    """mlp.json with its second node fed by the third one's output: h1.b -> h1.act -> h1.b."""
    graph = json.loads((REPO / "tests/data/mlp.json").read_text())
    nodes = graph["nodes"]
    assert nodes[1]["id"] == "h1.b" and nodes[2]["inputs"] == ["h1.b"]
    nodes[1]["inputs"] = [nodes[2]["id"], "fc1.b"]
    return graph


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


HOSTILE = {
    # (20 MB: over max_request_bytes, under the agent's Maximum Packet Size; a larger message never reaches the
    # agent at all: tests/test_reliability_attacks.py)
    "a million nodes (bytes over the request limit)": lambda: ("estimate", json.dumps(
        {"onnx": b64(repeated_nodes_model(1_000_000))}).encode()),
    "150,000 nodes (over max_nodes)": lambda: ("estimate",
                                               json.dumps({"onnx": b64(repeated_nodes_model(150_000))}).encode()),
    "a chain of 120,000 nodes": lambda: ("monitors/create", json.dumps(
        {"onnx": b64(chain_model(120_000)), "requiredTier": "good"}).encode()),
    "huge declared shapes": lambda: ("estimate", json.dumps({"onnx": b64(huge_shape_model())}).encode()),
    "huge input shapes": lambda: ("estimate", json.dumps(
        {"onnx": b64(mlp([64, 128, 10], batch="batch").SerializeToString()),
         "inputs": {"x": {"shape": [2**31 - 1, 64], "dataType": "float32"}}}).encode()),
    "rank 16 input": lambda: ("meets", json.dumps(
        {"webnn": WEBNN, "requiredTier": "good", "inputs": {"features": {"shape": [2] * 16}}}).encode()),
    "subgraphs nested 8 deep": lambda: ("estimate", json.dumps({"onnx": b64(nested_if_model(8))}).encode()),
    "subgraphs nested 2,000 deep": lambda: ("estimate", json.dumps({"onnx": b64(nested_if_model(2000))}).encode()),
    "JSON nested 200,000 deep": lambda: ("estimate", deep_json(200_000)),
    "a cycle in ONNX": lambda: ("estimate", json.dumps({"onnx": b64(cycle_model())}).encode()),
    "a cycle in webnn-graph-json": lambda: ("estimate", json.dumps({"graph": cyclic_webnn_json()}).encode()),
    "webnn text of 150,000 nodes": lambda: ("estimate", json.dumps({"webnn": WEBNN.replace(
        "probs = softmax(logits.b, axis=1);", "probs = softmax(logits.b, axis=1);\n" + "".join(
            f"    r{i} = relu(probs);\n" for i in range(150_000)))}).encode()),
}


def test_hostile_graphs_each_get_an_error_memory_stays_bounded_and_good_requests_still_served(agent):
    proc, broker = agent
    requests = [(name, *make()) for name, make in HOSTILE.items()]
    own_before, _ = memory_mb(proc)
    peak = [0.0]
    stop = False

    async def watch_memory() -> None:
        while not stop:
            peak[0] = max(peak[0], memory_mb(proc)[1])
            await asyncio.sleep(0.05)

    async def scenario() -> tuple[list[dict], float]:
        nonlocal stop
        watcher = asyncio.get_running_loop().create_task(watch_memory())
        hostile = asyncio.get_running_loop().create_task(
            send_all(broker.port, [(method, payload) for _, method, payload in requests], timeout=120))
        await asyncio.sleep(0.5)  # the hostile ones are in the workers now
        good = await good_request_seconds(broker.port)
        answers = await hostile
        stop = True
        await watcher
        return answers, good

    answers, good = asyncio.run(scenario())
    for (name, _, _), answer in zip(requests, answers, strict=True):
        assert answer["status"] == "error", (name, answer)
        assert answer["error"]["code"] != "internal", (name, answer)
        print(f"\n  {name}: {answer['error']['code']}: {answer['error']['message'][:100]}", end="")
    own_after, _ = memory_mb(proc)
    print(f"\nhostile graphs: a good estimate answered in {good * 1000:.0f} ms meanwhile; agent RSS "
          f"{own_before:.0f} -> {own_after:.0f} MB, peak with workers {peak[0]:.0f} MB")
    assert proc.proc.poll() is None
    assert good < 15, good  # behind at most one time limit (5 s) of a worker busy with a hostile graph
    assert own_after - own_before < 150, (own_before, own_after)
    assert peak[0] < 2048, peak[0]
