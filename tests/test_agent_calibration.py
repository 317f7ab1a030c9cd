"""The agent and the calibration it finds: a quick one (left by `daop-agent estimate`) is redone in full.

The whole background calibration, with a monitor and estimates meanwhile, is the real-agent test in
test_agent_own_work.py (a host test: it takes both cores for half a minute)."""

from __future__ import annotations

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
