"""Attacks on the agent's intake and storage, replayed against a real Mosquitto and the real agent process.

The attacks are bench/attacks.py's (the figures in docs/reliability.md come from there). After each one the
agent must still be running, answer a well-formed request, have lost no monitor (their retained states keep
their seq), and its whole process tree (agent, forkserver, workers), its RSS read from /proc every 50 ms, must
have stayed under the systemd unit's MemoryMax (read from systemd/daop-agent.service: one ceiling for the unit,
the docs and these tests), and the agent process itself under AGENT_CEILING (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
from agent_harness import AgentProcess, client, next_message, request_v5
from broker import Mosquitto

from agent import ratelog
from bench import attacks

DEV = attacks.DEV
UNIT = Path(__file__).resolve().parent.parent / "systemd" / "daop-agent.service"


def unit_memory_max() -> int:
    """The unit's MemoryMax=, bytes: the ceiling of the agent's whole process tree."""
    (value,) = [line.split("=", 1)[1].strip() for line in UNIT.read_text().splitlines()
                if line.startswith("MemoryMax=")]
    return int(float(value[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[value[-1]])


CEILING = unit_memory_max()
AGENT_CEILING = attacks.AGENT_CEILING  # the agent process alone (docs/reliability.md)
GOOD_WITHIN_S = 30.0  # a well-formed request after an attack (generous: a shared, noisy machine)
MONITORS = ("keep1", "keep2")


@pytest.fixture(scope="module")
def attacked(calibrated_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    state = root / "state"
    shutil.copytree(calibrated_dir, state)
    config = root / "agent.toml"
    config.write_text(attacks.CONFIG)
    broker = Mosquitto(root / "broker", max_packet_size=attacks.BROKER_MAX_PACKET, persistence=True).start()
    agent = AgentProcess(state, broker.url, device_id=DEV, config=config, sample_interval=0.5).start()
    try:
        async def setup() -> None:
            async with client(broker.port) as c:
                for name in MONITORS:
                    answer, _ = await request_v5(c, DEV, "monitors/create", {
                        "onnx": attacks.b64(attacks.small_onnx()), "requiredTier": "poor", "monitor": name})
                    assert answer["status"] == "ok", answer
        asyncio.run(setup())
        yield agent, broker
    finally:
        agent.stop()
        broker.stop()


async def monitor_states(port: int) -> dict[str, dict]:
    """The retained state of each kept monitor."""
    got: dict[str, dict] = {}
    async with client(port) as c:
        for name in MONITORS:
            await c.subscribe(f"daop/{DEV}/monitors/{name}/state", qos=1)
        while len(got) < len(MONITORS):
            m = await next_message(c, timeout=10)
            if m.payload:
                body = json.loads(m.payload)
                got[body["monitor"]] = body
    return got


def still_serving(agent: AgentProcess, broker: Mosquitto, before: dict[str, dict]) -> None:
    assert agent.proc is not None and agent.proc.poll() is None, agent.log[-3000:]
    assert asyncio.run(attacks.good_request_s(broker.port)) < GOOD_WITHIN_S
    after = asyncio.run(monitor_states(broker.port))
    assert set(after) == set(MONITORS)
    assert all(after[m]["seq"] >= before[m]["seq"] for m in MONITORS)  # no monitor lost, seq never back
    assert "Traceback" not in agent.log


EXPECTED = {  # attack -> the codes its answers may carry ("none": no answer)
    "one 64 MB message": {"none"},  # over the agent's Maximum Packet Size: the broker never delivers it
    "one 20 MB message": {"too_large"},
    "ten 16 MB requests": {"bad_graph", "busy"},  # each within its limit; beyond max_pending_bytes: busy
    "a .webnn text with a 15 MB string": {"bad_graph"},
    "ONNX functions inlining to 1e6 nodes": {"limit_exceeded"},
    "ResponseTopic outside the base": {"none"},
    # read in the workers: refused as graphs, or past the time limit on a loaded machine
    "four 15 MB graphs of 1e15s at once": {"bad_graph", "limit_exceeded", "busy"},
    # refused before they are read; one may come after a token came back (a busy machine is slow to send them)
    "four 15 MB requests over the budget": {"rate_limited", "bad_graph", "limit_exceeded"},
}


@pytest.mark.parametrize("name", list(attacks.ATTACKS))
def test_an_attack_is_refused_and_the_agent_keeps_serving_with_its_own_and_its_trees_rss_from_proc_under_the_ceilings(
        attacked, name):
    agent, broker = attacked
    assert agent.proc is not None
    before = asyncio.run(monitor_states(broker.port))
    with attacks.PeakWatcher(agent.proc.pid) as watcher:
        answers = asyncio.run(attacks.ATTACKS[name](broker.port))
    got = {"none" if a is None else a["error"]["code"] if a["status"] == "error" else "ok" for a in answers}
    assert got <= EXPECTED[name], (name, answers)
    print(f"\n  {name}: {sorted(got)}, peak tree RSS {watcher.peak >> 20} MB, agent alone {watcher.own_peak >> 20} MB",
          end="")
    assert watcher.peak < CEILING, watcher.peak
    assert watcher.own_peak < AGENT_CEILING, watcher.own_peak
    if name == "four 15 MB requests over the budget":
        assert sum(a is not None and a["status"] == "error" and a["error"]["code"] == "rate_limited"
                   for a in answers) >= 3, answers
    still_serving(agent, broker, before)
    if name == "a .webnn text with a 15 MB string":
        assert "longer than 4096 characters" in json.dumps(answers)
    if name == "ResponseTopic outside the base":
        assert "not answering: ResponseTopic 'elsewhere/" in agent.log


def test_a_retained_request_is_never_run_neither_live_nor_after_a_reconnect(attacked):
    agent, broker = attacked
    before = asyncio.run(monitor_states(broker.port))
    delete = json.dumps({"monitor": MONITORS[0]}).encode()
    topic = f"daop/{DEV}/request/monitors/delete"

    async def publish(payload: bytes) -> None:
        async with client(broker.port) as c:
            await c.publish(topic, payload, qos=1, retain=True)

    asyncio.run(publish(delete))
    agent.wait_log("ignored a retained request on request/monitors/delete", count=1)
    broker.restart()  # the agent reconnects and subscribes again: the broker hands it the retained request
    agent.wait_log("ignored a retained request on request/monitors/delete", count=2, timeout=30)
    asyncio.run(publish(b""))  # the retained message cleared (an empty retained request is ignored too)
    still_serving(agent, broker, before)


def test_a_storage_fault_made_by_directories_in_place_of_state_files_is_a_state_not_a_crash(attacked):
    """Tests run as root, which chmod cannot stop: the fault is made by directories where the agent's files
    go (its seq file, and the temporary file of the next monitor), so that every save fails with EISDIR."""
    agent, broker = attacked
    assert agent.proc is not None
    state = agent.state_dir
    before = asyncio.run(monitor_states(broker.port))
    seq_file = state / "monitor-seq.json"
    saved = seq_file.read_bytes()
    seq_file.unlink()
    seq_file.mkdir()
    (state / "monitors" / f".new1.json.tmp-{agent.proc.pid}").mkdir()
    try:
        async def during() -> tuple[dict, dict, dict]:
            async with client(broker.port) as c:
                created, _ = await request_v5(c, DEV, "monitors/create", {
                    "onnx": attacks.b64(attacks.small_onnx()), "requiredTier": "poor", "monitor": "new1"})
                deleted, _ = await request_v5(c, DEV, "monitors/delete", {"monitor": "nosuch"})
                await c.subscribe(f"daop/{DEV}/status", qos=1)
                status = json.loads((await next_message(c, f"daop/{DEV}/status", timeout=10)).payload)
            return created, deleted, status

        created, deleted, status = asyncio.run(during())
        assert created["status"] == "error" and created["error"]["code"] == "storage", created
        assert deleted["error"]["code"] == "unknown_monitor"
        assert status == {"state": "online", "storage": "failing"}
        assert "storage: cannot save monitor new1" in agent.log
        still_serving(agent, broker, before)
    finally:
        (state / "monitors" / f".new1.json.tmp-{agent.proc.pid}").rmdir()
        seq_file.rmdir()
        seq_file.write_bytes(saved)

    async def status_now() -> dict:
        async with client(broker.port) as c:
            answer, _ = await request_v5(c, DEV, "monitors/create", {
                "onnx": attacks.b64(attacks.small_onnx()), "requiredTier": "poor", "monitor": "new1"})
            assert answer["status"] == "ok", answer
            await c.subscribe(f"daop/{DEV}/status", qos=1)
            return json.loads((await next_message(c, f"daop/{DEV}/status", timeout=10)).payload)

    assert asyncio.run(status_now()) == {"state": "online"}  # saving works again, and the status says so
    assert "storage: saving works again" in agent.log
    assert json.loads(seq_file.read_bytes())["monitors"].keys() >= {*MONITORS, "new1"}


def test_kill_9_leaves_no_orphan_helper_processes_and_loses_no_monitor(attacked):
    """Last: SIGKILL to the agent outside systemd (no cgroup to sweep its helpers)."""
    agent, broker = attacked
    assert agent.proc is not None
    before = asyncio.run(monitor_states(broker.port))
    helpers = psutil.Process(agent.proc.pid).children(recursive=True)
    assert helpers, "the agent has helper processes (forkserver, estimator workers)"
    agent.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                              for p in helpers):
        time.sleep(0.1)
    left = [p.pid for p in helpers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for pid in left:  # (so that a failure leaves nothing behind either)
        os.kill(pid, signal.SIGKILL)
    assert not left, f"orphans after kill -9: {left}"
    agent.start()
    still_serving(agent, broker, before)


def test_the_bench_and_the_test_replay_the_same_attacks():
    assert set(EXPECTED) == set(attacks.ATTACKS)
    assert Path(attacks.__file__).name == "attacks.py"


def test_a_burst_of_identical_warnings_collapses_into_one_line_with_a_count(attacked):
    """200 requests whose ResponseTopic lies outside the base: each is logged, but the log holds at most
    ratelog.BURST such lines, then one that counts the rest (once its window ends)."""
    agent, broker = attacked
    before = agent.log.count("WARNING not answering: ResponseTopic")

    async def flood() -> None:
        await attacks.ask(broker.port, "estimate", [attacks.GOOD] * 200, 3.0, response_topic="elsewhere/flood")

    asyncio.run(flood())
    # once the window ends, one line says what was held back (a timer: the agent at rest may log nothing else)
    agent.wait_log("more line(s) like 'not answering: ResponseTopic %r is outside %s' in 10 s held back",
                   timeout=ratelog.WINDOW_S + 10)
    logged = agent.log.count("WARNING not answering: ResponseTopic") - before
    assert 1 <= logged <= ratelog.BURST


def test_a_request_over_the_workers_memory_ceiling_gets_an_answer_and_the_agent_stays_up(
        calibrated_dir, tmp_path):
    """`worker_memory_mb = 512`, and a 12 MB request of four million empty JSON lists: about 300 MB of Python
    objects to read it, in the worker, past its RLIMIT_AS. Answered `too_large`; the agent serves on."""
    state = tmp_path / "state"
    shutil.copytree(calibrated_dir, state)
    config = tmp_path / "agent.toml"
    config.write_text("[limits]\nworker_memory_mb = 512\n")
    broker = Mosquitto(tmp_path / "broker").start()
    agent = AgentProcess(state, broker.url, device_id=DEV, config=config, sample_interval=0.5).start()
    try:
        payload = b'{"graph": {"nodes": [' + b"[]," * 4_000_000 + b'[]]}}'
        (answer,) = asyncio.run(attacks.ask(broker.port, "estimate", [payload], 60.0))
        assert answer is not None and answer["status"] == "error", answer
        assert answer["error"]["code"] == "too_large" and "limits.worker_memory_mb" in answer["error"]["message"]
        assert agent.proc is not None and agent.proc.poll() is None
        assert asyncio.run(attacks.good_request_s(broker.port)) < GOOD_WITHIN_S
    finally:
        agent.stop()
        broker.stop()
