"""daop-client (clients/python) against the real agent: it installs alone, reconnects, speaks requirements, groups,
running and reports, follows a fleet with a persistent session; `daop-agent monitor` around it."""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import io
import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import aiomqtt
import onnx
import paho
import pytest
from agent_harness import REPO, agent_on, client, write_config
from models import mlp
from test_agent_contract import CONFIG

from agent.local_broker import DEFAULT_PORT
from agent.progress import ProgressBar
from daop_client import Context, DaopClient, DaopError, DeviceStatus, Fleet, FleetEvent, Workload
from daop_client.address import DEFAULT_BROKER, default_broker

DEV = "dev1"
INPUTS = {"x": ([1, 64], "float32")}
CLIENT = REPO / "clients" / "python"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp([64, 128, 10], batch="batch"), str(path))
    return path


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    yield proc
    proc.stop()


def build_wheel(source: Path, out: Path) -> Path:
    """The distribution's wheel, built here without network (the test environment's setuptools)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("*.whl")
    return wheel


def requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return [line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]


async def test_the_client_installs_alone_and_talks_to_the_agent(agent, mosquitto, model, tmp_path):
    """Its wheel holds daop_client alone and requires aiomqtt and paho-mqtt; unpacked beside only those two, in an
    interpreter without site-packages, it answers an estimate and imports nothing of the agent."""
    wheel = await asyncio.to_thread(build_wheel, CLIENT, tmp_path / "wheel")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"daop_client"}
    assert "daop_client/py.typed" in names
    assert sorted(r.split(">")[0].split("=")[0].split("<")[0] for r in requires(wheel)) == ["aiomqtt", "paho-mqtt"]
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    deps = tmp_path / "deps"
    deps.mkdir()
    for module in (aiomqtt, paho):
        (deps / module.__name__).symlink_to(Path(module.__file__).parent)
    script = f"""
import asyncio, sys
sys.path[:0] = [{str(site)!r}, {str(deps)!r}]
from daop_client import DaopClient
async def main():
    async with DaopClient({mosquitto.url!r}, {DEV!r}) as daop:
        print(await daop.estimate({str(model)!r}, {{"x": ([1, 64], "float32")}}))
asyncio.run(main())
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("agent", "monitors", "probes", "onnx", "numpy"))
print(leaked)
"""
    result = await asyncio.to_thread(subprocess.run, [sys.executable, "-S", "-c", script], capture_output=True,
                                     text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tier, leaked = result.stdout.split()
    assert tier in ("excellent", "good", "fair") and leaked == "[]"


def test_the_agents_wheel_carries_its_files_and_declares_every_import(tmp_path):
    """scenarios/, examples/, the unit, py.typed and the licence in the wheel; every third-party package that
    agent/, monitors/ and probes/ import is one the wheel requires (or the standard library's)."""
    wheel = build_wheel(REPO, tmp_path / "wheel")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("agent/share/systemd/daop-agent.service", "agent/share/scenarios/laptop-heats-up.toml",
              "agent/share/examples/blur_segmenter.webnn", "agent/py.typed", "monitors/py.typed", "probes/py.typed"):
        assert f in names, f
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    def normal(name: str) -> str:  # PEP 503
        return re.sub(r"[-_.]+", "-", name).lower()

    declared = {normal(re.split(r"[<>=!~;\[ ]", r)[0]) for r in requires(wheel)}
    distributions = importlib.metadata.packages_distributions()
    imported: set[str] = set()
    for package in ("agent", "monitors", "probes"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"agent", "monitors", "probes"}
    missing = {m: distributions.get(m) for m in third_party
               if not {normal(d) for d in distributions.get(m, [])} & declared}
    assert not missing, f"imported but not declared: {missing}"


def test_the_default_broker_is_what_run_sh_serves(monkeypatch):
    monkeypatch.delenv("DAOP_BROKER", raising=False)
    assert default_broker() == DEFAULT_BROKER == f"mqtt://127.0.0.1:{DEFAULT_PORT}"
    assert "--local-broker" in (REPO / "run.sh").read_text()
    monkeypatch.setenv("DAOP_BROKER", "mqtt://elsewhere:1")
    assert DaopClient().address.host == "elsewhere"


async def test_requirements_groups_running_and_reports(agent, mosquitto, device, model):
    async with DaopClient(mosquitto.url, DEV) as daop:
        assert await daop.meets(model, inputs=INPUTS, rate=1) is True
        assert await daop.estimate(model, INPUTS, context=Context(device_type="cpu")) in ("excellent", "good", "fair")
        with pytest.raises(DaopError) as refused:  # no calibrated NPU provider here
            await daop.estimate(model, INPUTS, context=Context(device_type="npu"))
        assert refused.value.code == "bad_context"
        with pytest.raises(ValueError):
            await daop.meets(model, "good", INPUTS, rate=30)  # a tier goes alone: refused before sending
        answer = await daop.meets_group([Workload("a", model, INPUTS, tier="poor"),
                                         Workload("b", model, INPUTS, deadline_ms=60_000)])
        assert answer.meets is True and answer.workloads == {"a": True, "b": True}
        rated = await daop.create_monitor(model, inputs=INPUTS, rate=2, deadline_ms=400, monitor="rated")
        assert rated.meets is True and rated.workloads is None
        group = await daop.create_group([Workload("a", model, INPUTS, tier="poor"),
                                         Workload("b", model, INPUTS, rate=1)], monitor="call")
        assert group.workloads == {"a": True, "b": True}
        assert await group.running(rate_hz=2) is True
        agent.wait_log(f"monitor call: its app runs it here now at 2 Hz (process {os.getpid()})")
        await group.report([1.2, 1.4], workload="a")
        with pytest.raises(DaopError) as info:
            await group.report([1.0])  # a group's report names its workload
        assert info.value.code == "bad_workload"
        device.set("firmware/acpi/platform_profile", "low-power")
        event = await asyncio.wait_for(anext(group), 5)
        assert event.meets is False and event.workloads == {"a": False, "b": False}
        assert group.workloads == event.workloads
        await group.stopped()
        agent.wait_log("monitor call: its app no longer runs it here")
        listed = {m["monitor"]: m for m in await daop.list_monitors()}
        assert listed["rated"]["requiredRate"] == 2 and listed["rated"]["requiredDeadlineMs"] == 400
        assert set(listed["call"]["workloads"]) == {"a", "b"}


async def test_an_owner_scoped_client_owns_its_monitors_and_hears_their_events(agent, mosquitto, device,
                                                                              model):
    async with DaopClient(mosquitto.url, DEV, owner="alice") as alice, \
            DaopClient(mosquitto.url, DEV, owner="bob") as bob, DaopClient(mosquitto.url, DEV) as shared:
        assert alice.scope == f"daop/{DEV}/client/alice/" and alice.response_topic.startswith(alice.scope)
        mine = await alice.create_monitor(model, "poor", inputs=INPUTS, monitor="mine")
        assert mine.meets is True
        assert await bob.list_monitors() == [] and await shared.list_monitors() == []
        with pytest.raises(DaopError) as info:
            await bob.delete_monitor("mine")
        assert info.value.code == "unknown_monitor"
        device.set("firmware/acpi/platform_profile", "low-power")  # the policy says no: an event, in alice's scope
        event = await asyncio.wait_for(anext(mine), 5)
        assert event.meets is False
        assert [m["monitor"] for m in await alice.list_monitors()] == ["mine"]
        await mine.delete()
    with pytest.raises(ValueError, match="owner"):
        DaopClient(mosquitto.url, DEV, owner="a/b")


async def test_the_client_reconnects_and_hears_a_change_made_while_away(state_dir, mosquitto_factory, device,
                                                                        model, tmp_path):
    """The broker restarts (no persistence: sessions and retained messages gone); the agent queues its event;
    the client reconnects by itself and its monitor goes on, the change read from the retained state."""
    broker = mosquitto_factory().start()
    agent = agent_on(device, state_dir, broker.url, write_config(tmp_path, CONFIG), DEV).start()
    news: list[str] = []
    try:
        async with DaopClient(broker.url, DEV, on_connection=lambda what, _: news.append(what)) as daop:
            monitor = await daop.create_monitor(model, "poor", monitor="m1", inputs=INPUTS)
            broker.stop()
            await asyncio.sleep(0.5)
            device.set("firmware/acpi/platform_profile", "low-power")
            agent.wait_log("1 monitor(s) changed", timeout=10)
            broker.start()
            event = await asyncio.wait_for(anext(monitor), 30)
            assert (event.monitor, event.meets) == ("m1", False) and "lost" in news and "reconnected" in news
            assert await daop.estimate(model, INPUTS)  # requests work again
            device.set("firmware/acpi/platform_profile", "balanced")
            again = await asyncio.wait_for(anext(monitor), 10)
            assert again.meets is True and again.seq > event.seq and again.ts is not None
    finally:
        agent.stop()


async def test_a_fleet_follower_misses_nothing_while_away(agent, mosquitto, device, model):
    """A persistent session (fixed id, no clean start, expiry > 0, QoS 1): the changes made while the backend is
    away arrive when it comes back; a message handed out but not handled is delivered again."""
    async with DaopClient(mosquitto.url, DEV) as daop:
        await daop.create_monitor(model, "poor", monitor="fleet-m", inputs=INPUTS)
    async with Fleet(mosquitto.url, client_id="backend-1") as fleet:
        first = await asyncio.wait_for(anext(aiter(fleet)), 5)
        assert first == DeviceStatus(DEV, True)
    device.set("firmware/acpi/platform_profile", "low-power")  # the backend is away
    agent.wait_log("1 monitor(s) changed", timeout=10)
    await asyncio.sleep(2.5)  # past the dwell
    device.set("firmware/acpi/platform_profile", "balanced")
    agent.wait_log("1 monitor(s) changed", timeout=10, count=2)
    seen: list[FleetEvent] = []
    async with Fleet(mosquitto.url, client_id="backend-1") as fleet:
        async for item in fleet:
            if isinstance(item, FleetEvent):
                seen.append(item)
                break  # stop with this one handed out: not acknowledged
    async with Fleet(mosquitto.url, client_id="backend-1") as fleet:
        iterator = aiter(fleet)
        while len({e.event.seq for e in seen}) < 2:
            item = await asyncio.wait_for(anext(iterator), 5)
            if isinstance(item, FleetEvent):
                seen.append(item)
    assert [e.event.meets for e in seen][:1] == [False] and seen[1].event.seq == seen[0].event.seq  # again
    assert {(e.device, e.event.monitor) for e in seen} == {(DEV, "fleet-m")}
    assert sorted({(e.event.seq, e.event.meets) for e in seen})[-1][1] is True


async def test_fleet_followers_in_a_share_group_split_the_events_between_them(mosquitto):
    """The backend's consumer pattern past one process: two followers in group `backends` subscribe with
    `$share/backends/daop/+/...`; the broker hands each event to one of them, every event to one."""
    sent = {(f"d{i % 4}", seq) for i, seq in enumerate(range(40))}
    got: dict[str, list[tuple[str, int]]] = {"b1": [], "b2": []}

    async def follow(name: str, fleet: Fleet) -> None:
        async for item in fleet:
            if isinstance(item, FleetEvent):
                got[name].append((item.device, item.event.seq))

    async with Fleet(mosquitto.url, client_id="b1", group="backends") as f1, \
            Fleet(mosquitto.url, client_id="b2", group="backends") as f2:
        assert f1.topics[1] == "$share/backends/daop/+/monitors/+/events"
        tasks = [asyncio.create_task(follow("b1", f1)), asyncio.create_task(follow("b2", f2))]
        async with client(mosquitto.port) as c:
            for device_id, seq in sorted(sent, key=lambda x: x[1]):
                body = {"monitor": "m", "meetsRequirement": seq % 2 == 0, "seq": seq, "ts": "2026-01-01T00:00:00Z"}
                await c.publish(f"daop/{device_id}/monitors/m/events", json.dumps(body), qos=1)
        for _ in range(100):
            if len(got["b1"]) + len(got["b2"]) >= len(sent):
                break
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
    assert set(got["b1"]) | set(got["b2"]) == sent and not set(got["b1"]) & set(got["b2"])
    assert got["b1"] and got["b2"]  # both took a share
    with pytest.raises(ValueError, match="share group"):
        Fleet(mosquitto.url, client_id="b3", group="a/b")


# -- daop-agent monitor ------------------------------------------------------------------------------------------


def monitor_command(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agent", "monitor", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def test_monitor_command_on_daop_broker_deletes_its_monitor_on_sigterm(agent, mosquitto, model):
    proc = monitor_command(str(model), "--rate", "2", "--input", "x=1x64", "--monitor", "term-1", "--json",
                           "--device-id", DEV, "--running", "--pid", str(os.getpid()),
                           env={"DAOP_BROKER": mosquitto.url})
    try:
        first = json.loads(proc.stdout.readline())
        assert first == {"monitor": "term-1", "requiredRate": 2.0, "meetsRequirement": True}
        agent.wait_log("monitor term-1: its app runs it here now at 2 Hz")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
    agent.wait_log("monitor term-1 deleted")


def test_monitor_command_says_a_lost_broker_and_goes_on(state_dir, mosquitto_factory, device, model,
                                                        tmp_path):
    broker = mosquitto_factory().start()
    agent = agent_on(device, state_dir, broker.url, write_config(tmp_path, CONFIG), DEV).start()
    proc = monitor_command(str(model), "--tier", "poor", "--input", "x=1x64", "--monitor", "lost-1", "--broker",
                           broker.url, "--device-id", DEV)
    try:
        assert "poor met" in proc.stdout.readline()
        broker.restart(down_s=1.0)
        news = [proc.stderr.readline()]
        while "reconnected" not in news[-1]:  # (the agent's Will may come first: the broker sends it as it stops)
            news.append(proc.stderr.readline())
            assert news[-1], news
        assert any("lost the broker" in line for line in news), news
        device.set("firmware/acpi/platform_profile", "low-power")
        assert "poor NOT met" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0 and "Traceback" not in err, err
        agent.wait_log("monitor lost-1 deleted")
    finally:
        if proc.poll() is None:
            proc.kill()
        agent.stop()


def test_monitor_command_names_a_wrong_device_id_quickly(agent, mosquitto, model):
    proc = monitor_command(str(model), "--tier", "good", "--input", "x=1x64", "--broker", mosquitto.url,
                           "--device-id", "my-laptop")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1
    assert "no agent with device id 'my-laptop'" in err and DEV in err


@pytest.mark.parametrize("args,expected", [
    (["--rate", "30", "--tier", "good"], "--tier goes alone"),
    ([], "give the requirement"),
    (["--tier", "good", "--pid", "5"], "--pid goes with --running"),
])
def test_monitor_command_requirement_mistakes_exit_2(model, args, expected):
    result = subprocess.run([sys.executable, "-m", "agent", "monitor", str(model), *args], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr


# -- the command line as a package ---------------------------------------------------------------------------------


def test_version_and_packaged_files():
    out = subprocess.run([sys.executable, "-m", "agent", "--version"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == f"daop-agent {importlib.metadata.version('daop-agent')}"
    unit = subprocess.run([sys.executable, "-m", "agent", "files", "systemd/daop-agent.service"],
                          capture_output=True, text=True, cwd=REPO)
    assert Path(unit.stdout.strip()).read_text() == (REPO / "systemd" / "daop-agent.service").read_text()


def test_a_closed_pipe_ends_quietly(state_dir):
    """`estimate --kernels | head`: the reader is gone before the output; no traceback, SIGPIPE's status."""
    proc = subprocess.Popen([sys.executable, "-m", "agent", "estimate", "examples/blur_segmenter.webnn", "--input",
                             "image=1x360x640x3", "--kernels", "--at-rest", "--state-dir", str(state_dir)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert proc.returncode == 141 and err == "", err


def test_progress_off_a_terminal_is_a_few_lines():
    stream = io.StringIO()
    bar = ProgressBar("calibrating cpu", stream=stream)
    for i in range(1, 301):
        bar(f"family{i // 10}", i, 300)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("calibrating cpu: 100%")
