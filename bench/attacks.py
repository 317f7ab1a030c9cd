"""Attacks on the agent's intake, replayed against a real Mosquitto and the real agent process (issue #21).

Each attack is sent while the agent's whole process tree (the agent, its forkserver, estimator workers) is
sampled every 50 ms from /proc (RSS summed over the tree: shared pages counted in each process, so an upper
bound on what a cgroup is charged); a well-formed `estimate` is timed while the attack is in hand (sent 0.5 s
after it began) and again after it. Prints, per attack, the peak tree RSS, both times, and the answers' codes.

The broker is started with `max_packet_size` 200 MB, larger than the agent's own Maximum Packet Size, so that
the huge message reaches the broker and the agent's refusal of it is what is measured.

    .venv/bin/python -m bench.attacks
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiomqtt
import psutil
from agent_harness import AgentProcess
from broker import Mosquitto
from onnx import TensorProto, helper
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent import calibration_store

REPO = Path(__file__).resolve().parent.parent
DEV = "attacked"
MiB = 1 << 20
ROUNDS = 6  # rounds of four 15 MB graphs after the attacks, for the agent's RSS at rest afterwards
AGENT_CEILING = 512 * MiB  # the agent process alone, whatever it is sent (docs/reliability.md)
REST_GROWTH_BOUND = 48 * MiB  # what two rounds of four 15 MB graphs may leave in a fresh agent process at rest
BROKER_MAX_PACKET = 200 * MiB  # under MQTT's own ceiling (256 MB), which Mosquitto 2.0 cannot serve as is
BURST = 20  # a client's request budget at once (privacy.burst): the over-budget attack spends it first
CONFIG = f"""
[limits]
estimate_timeout_s = 10

[privacy]
burst = {BURST}
per_minute = 6
"""


# -- what is sent -------------------------------------------------------------------------------------------

def small_onnx() -> bytes:
    """A two-layer MLP: a well-formed request's model."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [64, 128], [0.01] * (64 * 128))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [128, 10], [0.01] * (128 * 10))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [x], [y], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def nested_functions_onnx(levels: int = 7, fanout: int = 10) -> bytes:
    """About 1.6 KB: function f<i> calls f<i-1> `fanout` times, so the graph inlines to fanout**(levels-1)
    (a million) nodes."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    funcs = [helper.make_function("local", "f0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], opsets)]
    for i in range(1, levels):
        nodes, prev = [], "x"
        for j in range(fanout):
            out = "y" if j == fanout - 1 else f"t{j}"
            nodes.append(helper.make_node(f"f{i - 1}", [prev], [out], domain="local"))
            prev = out
        funcs.append(helper.make_function("local", f"f{i}", ["x"], ["y"], nodes, opsets))
    graph = helper.make_graph([helper.make_node(f"f{levels - 1}", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    return helper.make_model(graph, functions=funcs, opset_imports=opsets).SerializeToString()


def webnn_with_string(chars: int) -> str:
    return ('webnn_graph "g" v1 {\n  inputs { x: f32[1, 8]; }\n  nodes { y = relu(x, label="' + "a" * chars +
            '"); }\n  outputs { y; }\n}\n')


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


GOOD = json.dumps({"onnx": b64(small_onnx())}).encode()


# -- talking to the agent -------------------------------------------------------------------------------------

def client(port: int) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5,
                          identifier=f"attacker-{uuid.uuid4().hex[:8]}")


async def ask(port: int, method: str, payloads: list[bytes], timeout: float, *, retain: bool = False,
              response_topic: str | None = None, owner: str | None = None) -> list[dict | None]:
    """Publish each payload as a request with its own CorrelationData; the answers in order (None: none came).
    With an `owner`, asked in that client's scope (its own request budget)."""
    scope = f"daop/{DEV}/client/{owner}/" if owner else f"daop/{DEV}/"
    topic = response_topic or f"{scope}response/client/a-{uuid.uuid4().hex[:8]}"
    answers: list[dict | None] = [None] * len(payloads)
    async with client(port) as c:
        await c.subscribe(topic, qos=1)

        async def collect() -> None:
            async for m in c.messages:
                corr = getattr(m.properties, "CorrelationData", None) if m.properties else None
                if corr is not None:
                    answers[int.from_bytes(corr, "big")] = json.loads(m.payload)
                if all(a is not None for a in answers):
                    return

        reader = asyncio.get_running_loop().create_task(collect())
        for i, payload in enumerate(payloads):
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic = topic
            props.CorrelationData = i.to_bytes(4, "big")
            await c.publish(f"{scope}request/{method}", payload, qos=1, properties=props, retain=retain)
        try:
            await asyncio.wait_for(reader, timeout)
        except TimeoutError:
            pass
    return answers


async def good_request_s(port: int, timeout: float = 60.0) -> float:
    """Seconds a well-formed estimate takes to be answered `ok` (inf when it is not), from a client of its own: the
    bench's well-formed requests would otherwise spend one shared request budget between them."""
    started = time.monotonic()
    (answer,) = await ask(port, "estimate", [GOOD], timeout, owner=f"good-{uuid.uuid4().hex[:6]}")
    if answer is None or answer.get("status") != "ok":
        return float("inf")
    return time.monotonic() - started


def own_rss(pid: int) -> int:
    """RSS of the agent process alone (not its workers), bytes; 0 once it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return 0


def tree_rss(pid: int) -> int:
    """RSS summed over the process and its descendants, read from /proc (psutil), bytes."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class PeakWatcher:
    """The peaks of tree_rss(pid) and of own_rss(pid) (the agent process's own), sampled every 50 ms in a thread
    while in the `with` block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.own_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.own_peak = max(self.own_peak, own_rss(self.pid))
        self.peak = max(self.peak, tree_rss(self.pid))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.05)

    def __enter__(self) -> PeakWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- the attacks ----------------------------------------------------------------------------------------------

Attack = Callable[[int], Awaitable[list[dict | None]]]


async def huge_message(port: int) -> list[dict | None]:
    """One 64 MB message (the broker takes it; it is over the agent's Maximum Packet Size): never delivered."""
    return await ask(port, "estimate", [b'{"onnx": "' + b"A" * (64 * MiB) + b'"}'], 5.0)


async def over_the_request_limit(port: int) -> list[dict | None]:
    """A 20 MB message: over max_request_bytes (16 MiB), under the Maximum Packet Size: answered too_large."""
    return await ask(port, "estimate", [b'{"onnx": "' + b"A" * (20 * MiB) + b'"}'], 30.0)


async def many_within_limit(port: int) -> list[dict | None]:
    """Ten requests of 16 MB each, each within its own limit of 16 MiB (base64 of bytes that are not ONNX)."""
    junk = json.dumps({"onnx": b64(os.urandom(int(11.9 * MiB)))}).encode()
    return await ask(port, "estimate", [junk] * 10, 180.0)


async def long_string_literal(port: int) -> list[dict | None]:
    """A .webnn text with a 15 MB string literal."""
    return await ask(port, "estimate", [json.dumps({"webnn": webnn_with_string(15_000_000)}).encode()], 60.0)


async def nested_local_functions(port: int) -> list[dict | None]:
    """A 1.6 KB ONNX whose nested local functions would inline to a million nodes."""
    return await ask(port, "estimate", [json.dumps({"onnx": b64(nested_functions_onnx())}).encode()], 60.0)


def big_numbers_graph(mb: float) -> bytes:
    """A webnn-graph-json request of about `mb` MB whose graph is made of `1e15`s (each 4 bytes as sent, 16 once
    written back as a float)."""
    count = int(mb * MiB) // 5
    return b'{"graph": {"consts": [' + b",".join([b"1e15"] * count) + b"]}}"


async def large_graphs_at_once(port: int) -> list[dict | None]:
    """Four 15 MB webnn-graph-json requests at once (each read in a worker), from a client of their own (within
    its budget)."""
    return await ask(port, "estimate", [big_numbers_graph(15)] * 4, 180.0, owner=f"big-{uuid.uuid4().hex[:6]}")


async def large_over_budget(port: int) -> list[dict | None]:
    """A client that has spent its request budget (privacy.burst) sends four 15 MB requests: refused before
    anything of them is read."""
    owner = f"spent-{uuid.uuid4().hex[:6]}"
    await ask(port, "estimate", [GOOD] * (BURST + 1), 120.0, owner=owner)
    return await ask(port, "estimate", [big_numbers_graph(15)] * 4, 60.0, owner=owner)


async def response_topic_elsewhere(port: int) -> list[dict | None]:
    """A well-formed request whose ResponseTopic lies outside daop/<device>/: never answered there."""
    return await ask(port, "estimate", [GOOD], 5.0, response_topic=f"elsewhere/{uuid.uuid4().hex[:8]}")


ATTACKS: dict[str, Attack] = {
    "one 64 MB message": huge_message,
    "one 20 MB message": over_the_request_limit,
    "ten 16 MB requests": many_within_limit,
    "a .webnn text with a 15 MB string": long_string_literal,
    "ONNX functions inlining to 1e6 nodes": nested_local_functions,
    "ResponseTopic outside the base": response_topic_elsewhere,
    "four 15 MB graphs of 1e15s at once": large_graphs_at_once,
    "four 15 MB requests over the budget": large_over_budget,
}


def codes(answers: list[dict | None]) -> str:
    out = []
    for a in answers:
        out.append("none" if a is None else a["status"] if a["status"] == "ok" else a["error"]["code"])
    return ", ".join(sorted(set(out), key=out.index)) + (f" (x{len(out)})" if len(out) > 1 else "")


async def good_request_during_s(port: int, delay_s: float = 0.5) -> float:
    """good_request_s, sent `delay_s` after the attack began (the attack's requests are in hand by then)."""
    await asyncio.sleep(delay_s)
    return await good_request_s(port)


async def replay(pid: int, port: int) -> list[tuple[str, int, int, float, float, str]]:
    """(attack, peak tree RSS bytes, peak RSS of the agent process alone, seconds to answer a well-formed request
    sent during it and after it, answers' codes)."""
    rows = []
    for name, attack in ATTACKS.items():
        with PeakWatcher(pid) as watcher:
            answers, during = await asyncio.gather(attack(port), good_request_during_s(port))
            after = await good_request_s(port)
        rows.append((name, watcher.peak, watcher.own_peak, during, after, codes(answers)))
    return rows


async def rounds_of_large_graphs(port: int, rounds: int) -> None:
    """`rounds` times four 15 MB graphs at once: what the agent keeps of them shows at rest afterwards."""
    for _ in range(rounds):
        await large_graphs_at_once(port)


def main() -> int:
    sys.path.insert(0, str(REPO / "tests"))


    with tempfile.TemporaryDirectory(prefix="daop-attacks-") as tmp:
        root = Path(tmp)
        state = root / "state"
        calibration_store.run_calibration(state, "cpu", quick=True)
        config = root / "agent.toml"
        config.write_text(CONFIG)
        broker = Mosquitto(root / "broker", max_packet_size=BROKER_MAX_PACKET).start()
        agent = AgentProcess(state, broker.url, device_id=DEV, config=config, sample_interval=0.5).start()
        try:
            assert agent.proc is not None
            pid = agent.proc.pid
            time.sleep(2.0)
            rest, own_rest = tree_rss(pid), own_rss(pid)
            baseline = asyncio.run(good_request_s(broker.port))
            rows = asyncio.run(replay(pid, broker.port))
            asyncio.run(rounds_of_large_graphs(broker.port, ROUNDS))
            time.sleep(2.0)
            own_after = own_rss(pid)
            alive = agent.proc.poll() is None
        finally:
            agent.stop()
            broker.stop()
            shutil.rmtree(root, ignore_errors=True)
    print(f"agent process tree at rest: {rest / MiB:.0f} MB RSS (the agent process alone: {own_rest / MiB:.0f} MB); "
          f"a well-formed estimate: {baseline * 1000:.0f} ms")
    print(f"{'attack':40s} {'peak tree RSS':>14s} {'agent alone':>12s} {'good one during':>16s} {'and after':>10s}  "
          "answers")
    for name, peak, own_peak, during, after, answer_codes in rows:
        print(f"{name:40s} {peak / MiB:11.0f} MB {own_peak / MiB:9.0f} MB {during * 1000:13.0f} ms "
              f"{after * 1000:7.0f} ms  {answer_codes}")
    print(f"the agent process alone at rest after every attack and {ROUNDS} more rounds of four 15 MB graphs: "
          f"{own_after / MiB:.0f} MB RSS (at start {own_rest / MiB:.0f} MB)")
    print(f"agent still running: {alive}")
    return 0 if alive else 1


if __name__ == "__main__":
    raise SystemExit(main())
