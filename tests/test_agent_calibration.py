"""The agent and the calibration it finds: a quick one (left by `daop-agent estimate`) is redone in full."""

from __future__ import annotations

import re
from pathlib import Path

import psutil
from agent_harness import agent_on, client, request_v5, write_config
from test_agent_contract import CONFIG, SMALL

from agent.calibration_store import load

DEV = "dev1"


def saved_calibration(state_dir: Path):

    return load(state_dir, "cpu")


async def estimate(port: int) -> dict:
    async with client(port) as c:
        answer, _ = await request_v5(c, DEV, "estimate", {"onnx": SMALL}, timeout=60)
    assert answer["status"] == "ok", answer
    return answer["data"]


async def test_a_quick_calibration_serves_until_the_agent_has_redone_it_in_full(state_dir, mosquitto, device,
                                                                                tmp_path):
    assert saved_calibration(state_dir).quick
    agent = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV)
    agent.args += ["--calibration", "full"]  # the default, over the harness's "quick"
    agent.start()
    try:
        agent.wait_log("calibrating in full in the background", timeout=30)
        assert "full calibration ready" not in agent.log
        during = await estimate(mosquitto.port)  # answered on the quick calibration meanwhile
        assert "full calibration ready" not in agent.log
        agent.wait_log("full calibration ready (cpu)", timeout=240)
        progress = re.findall(r"calibrating cpu in full: (\d+)% \(", agent.log)  # the log says how far it is
        assert len(progress) >= 8 and progress[-1] == "100", progress
        after = await estimate(mosquitto.port)
    finally:
        assert agent.stop(timeout=20) == 0
    cal = saved_calibration(state_dir)
    assert cal is not None and not cal.quick and cal.refresh_reference
    assert during["performanceTier"] and after["performanceTier"]


async def test_a_stop_during_the_background_calibration_keeps_the_quick_one(state_dir, mosquitto, device,
                                                                           tmp_path):
    before = (state_dir / "calibration-cpu.json").read_bytes()
    agent = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV)
    agent.args += ["--calibration", "full"]
    agent.start()
    agent.wait_log("calibrating in full in the background", timeout=30)
    children = psutil.Process(agent.proc.pid).children(recursive=True)  # the calibrating one among them
    assert agent.stop(timeout=20) == 0
    _, alive = psutil.wait_procs(children, timeout=5)  # the forkserver and resource tracker follow at once
    assert not alive
    assert (state_dir / "calibration-cpu.json").read_bytes() == before
    assert not list(state_dir.glob("*.tmp"))


async def test_with_calibration_quick_the_agent_keeps_a_quick_calibration(state_dir, mosquitto, device,
                                                                         tmp_path):
    agent = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), DEV).start()
    try:
        await estimate(mosquitto.port)
        assert "in the background" not in agent.log
    finally:
        agent.stop()
    assert saved_calibration(state_dir).quick
