"""Privacy against other apps, end to end: the real agent process and a real Mosquitto.

Request budgets (agent/ratelimit.py): a client past its budget gets `rate_limited` with a retry-after, and
the agent goes on serving everyone else. Ownership (agent/registry.py): under the documented ACL
(examples/mosquitto-acl), each app asks under its own scope `daop/<id>/client/<user>/`, and no other app can
list, replace, delete, report on, say it runs, or read the answers of its monitors.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from agent_harness import AgentProcess, agent_on, client, next_message, request_v5, write_config
from test_agent_contract import SMALL
from test_agent_security import nothing_arrives

ACL = (Path(__file__).resolve().parent.parent / "examples" / "mosquitto-acl").read_text()
USERS = {"dev1": "pw-dev1", "alice": "pw-alice", "bob": "pw-bob"}
BUDGET = """
[privacy]
burst = 3
per_minute = 6
"""


@pytest.fixture
def limited(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, BUDGET)).start()
    proc.wait_log("connected to")
    yield proc
    proc.stop()


async def test_a_client_past_its_budget_is_told_when_to_retry_and_others_are_still_served(limited, mosquitto):
    estimate = {"onnx": SMALL, "transaction": "t"}
    async with client(mosquitto.port) as c:
        started = time.monotonic()
        for _ in range(3):
            answer, _ = await request_v5(c, "dev1", "estimate", estimate, owner="prober")
            assert answer["status"] == "ok", answer
        answer, _ = await request_v5(c, "dev1", "meets", {**estimate, "requiredTier": "good"}, owner="prober")
        assert answer["status"] == "error" and answer["transaction"] == "t", answer
        assert answer["error"]["code"] == "rate_limited"
        # one request per 10 s: the next token is 10 s after the burst less what has come back since (a loaded host
        # takes seconds over the three estimates)
        assert 10 - (time.monotonic() - started) <= answer["error"]["retryAfterS"] <= 10, answer
        # requests that tell nothing of the device's speed are not counted
        listed, _ = await request_v5(c, "dev1", "monitors/list", {}, owner="prober")
        assert listed == {"status": "ok", "data": {"monitors": []}}
        # the others have budgets of their own: a second app, and the shared unscoped topics
        for owner in ("honest", None):
            answer, _ = await request_v5(c, "dev1", "estimate", estimate, owner=owner)
            assert answer["status"] == "ok", (owner, answer)
    assert limited.proc.poll() is None


async def test_privacy_off_answers_every_request(state_dir, mosquitto, device, tmp_path):
    config = write_config(tmp_path, BUDGET + "enabled = false\n")
    proc = agent_on(device, state_dir, mosquitto.url, config).start()
    try:
        proc.wait_log("connected to")
        async with client(mosquitto.port) as c:
            for _ in range(5):
                answer, _ = await request_v5(c, "dev1", "estimate", {"onnx": SMALL}, owner="prober")
                assert answer["status"] == "ok", answer
    finally:
        proc.stop()


@pytest.fixture
def secured(mosquitto_factory):
    return mosquitto_factory(passwords=USERS, acl=ACL).start()


async def test_apps_own_their_monitors_and_no_other_app_can_touch_or_read_them(state_dir, secured):
    url = secured.url.replace("://", f"://dev1:{USERS['dev1']}@")
    agent = AgentProcess(state_dir, url, device_id="dev1").start()
    try:
        agent.wait_log("connected to")
        async with client(secured.port, username="alice", password=USERS["alice"]) as alice, \
                client(secured.port, username="bob", password=USERS["bob"]) as bob:
            created, _ = await request_v5(alice, "dev1", "monitors/create",
                                          {"onnx": SMALL, "requiredTier": "poor", "monitor": "m1"}, owner="alice")
            assert created["status"] == "ok", created
            await alice.subscribe("daop/dev1/client/alice/monitors/m1/state", qos=1)
            state = json.loads((await next_message(alice)).payload)
            assert state["monitor"] == "m1" and state["meetsRequirement"] is True

            # bob, in his own scope: alice's monitor is not there for him
            listed, _ = await request_v5(bob, "dev1", "monitors/list", {}, owner="bob")
            assert listed == {"status": "ok", "data": {"monitors": []}}
            for method, body in (("monitors/delete", {"monitor": "m1"}),
                                 ("monitors/running", {"monitor": "m1", "running": True}),
                                 ("monitors/report", {"monitor": "m1", "latenciesMs": [1.0]})):
                answer, _ = await request_v5(bob, "dev1", method, body, owner="bob")
                assert answer["status"] == "error" and answer["error"]["code"] == "unknown_monitor", (method, answer)
            replaced, _ = await request_v5(bob, "dev1", "monitors/create",
                                           {"onnx": SMALL, "requiredTier": "excellent", "monitor": "m1"}, owner="bob")
            assert replaced["status"] == "error" and replaced["error"]["code"] == "monitor_taken", replaced

            # bob cannot ask in alice's scope nor read it: the broker drops both
            await bob.subscribe("daop/dev1/client/alice/#", qos=1)
            await bob.publish("daop/dev1/client/alice/request/monitors/delete", json.dumps({"monitor": "m1"}), qos=1)
            await bob.publish("daop/dev1/request/monitors/delete", json.dumps({"monitor": "m1"}), qos=1)
            assert await nothing_arrives(bob, 1.5)

            # alice's monitor is as she left it, and only she sees it
            listed, _ = await request_v5(alice, "dev1", "monitors/list", {}, owner="alice")
            assert [m["monitor"] for m in listed["data"]["monitors"]] == ["m1"], listed
            assert listed["data"]["monitors"][0]["requiredTier"] == "poor"
            deleted, _ = await request_v5(alice, "dev1", "monitors/delete", {"monitor": "m1"}, owner="alice")
            assert deleted == {"status": "ok", "data": {}}
        assert "monitor m1 deleted" in agent.log and agent.log.count("monitor m1 created") == 1
    finally:
        agent.stop()


async def test_monitors_keep_their_owner_across_a_restart(state_dir, mosquitto):
    agent = AgentProcess(state_dir, mosquitto.url).start()
    try:
        agent.wait_log("connected to")
        async with client(mosquitto.port) as c:
            created, _ = await request_v5(c, "dev1", "monitors/create",
                                          {"onnx": SMALL, "requiredTier": "poor", "monitor": "mine"}, owner="alice")
            assert created["status"] == "ok", created
        agent.stop()
        agent.start()
        agent.wait_log("connected to")
        async with client(mosquitto.port) as c:
            shared, _ = await request_v5(c, "dev1", "monitors/list", {})
            assert shared["data"]["monitors"] == []
            own, _ = await request_v5(c, "dev1", "monitors/list", {}, owner="alice")
            assert [m["monitor"] for m in own["data"]["monitors"]] == ["mine"]
            await c.subscribe("daop/dev1/client/alice/monitors/mine/state", qos=1)
            assert json.loads((await next_message(c)).payload)["monitor"] == "mine"  # republished in its scope
    finally:
        agent.stop()
