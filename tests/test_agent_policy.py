"""The user policy: battery floor (with its own hysteresis) and power-saver profiles veto local inference."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from agent_harness import AgentProcess, client, next_message, request_v5, write_config
from dbus_bus import start_ppd
from models import mlp
from test_agent_contract import onnx_b64

from agent.config import Policy
from agent.policy import PolicyGate, PowerFacts
from agent.service import power_facts
from agent.simulation.trees import desktop, laptop
from probes.state import Sampler


def test_no_policy_never_vetoes():
    gate = PolicyGate(Policy())
    assert gate.veto(PowerFacts(3.0, True, "low-power")) is None


def test_battery_floor_applies_only_on_battery_and_lifts_above_floor_plus_release():
    gate = PolicyGate(Policy(battery_floor_percent=20, battery_release_percent=3))
    assert gate.veto(PowerFacts(25, True, None)) is None
    assert "floor 20%" in gate.veto(PowerFacts(19, True, None))
    assert gate.veto(PowerFacts(21, True, None)) is not None  # hovering at the floor: still vetoed
    assert gate.veto(PowerFacts(22.9, True, None)) is not None
    assert gate.veto(PowerFacts(23, True, None)) is None
    assert gate.veto(PowerFacts(10, False, None)) is None  # plugged in
    assert gate.veto(PowerFacts(10, None, None)) is None  # unknown: no made-up veto
    assert gate.veto(PowerFacts(None, True, None)) is None


def test_power_saver_profiles():
    gate = PolicyGate(Policy(power_saver=True))
    assert "low-power" in gate.veto(PowerFacts(None, None, "low-power"))
    assert gate.veto(PowerFacts(None, None, "power-saver")) is not None
    assert gate.veto(PowerFacts(None, None, "balanced")) is None
    assert gate.veto(PowerFacts(None, None, None)) is None
    both = PolicyGate(Policy(power_saver=True, battery_floor_percent=50)).veto(PowerFacts(10, True, "quiet"))
    assert "battery" in both and "quiet" in both


def test_laptop_fixture_tree_on_battery_at_37_percent_is_vetoed_below_a_40_percent_floor(tmp_path):

    tree = laptop(tmp_path / "laptop")
    facts = power_facts(Sampler(tree.sys, tree.proc).sample())
    assert (facts.battery_percent, facts.on_battery, facts.power_mode) == (37.0, True, "low-power")
    assert "floor 40%" in PolicyGate(Policy(battery_floor_percent=40)).veto(facts)
    assert PolicyGate(Policy(battery_floor_percent=30)).veto(facts) is None
    tree.supply("ADP1", online=1)  # plugged in: the floor no longer applies
    assert PolicyGate(Policy(battery_floor_percent=40)).veto(power_facts(Sampler(tree.sys, tree.proc).sample())) is None
    plain = desktop(tmp_path / "desktop")  # no battery at all
    facts = power_facts(Sampler(plain.sys, plain.proc).sample())
    assert PolicyGate(Policy(battery_floor_percent=40)).veto(facts) is None


async def test_real_agent_private_bus_a_switch_to_power_saver_turns_monitors_false_within_a_second(
        state_dir: Path, mosquitto, device, bus_address: str, tmp_path: Path):
    """power-profiles-daemon's signal, not its poll (every 30 s) nor the next sample (every 5 s here): the desktop
    fixture tree has no platform profile here, so the power mode is ppd's, a stand-in on a private system bus."""
    (device.sys / "firmware/acpi/platform_profile").unlink()
    bus, ppd = await start_ppd(bus_address, "balanced")
    config = write_config(tmp_path, "[policy]\npower_saver = true\n[monitors]\nmin_dwell_s = 0.2\n")
    agent = AgentProcess(state_dir, mosquitto.url, config=config, sysfs_root=device.sys, procfs_root=device.proc,
                         sample_interval=5.0, env={"DBUS_SYSTEM_BUS_ADDRESS": bus_address}).start()
    try:
        async with client(mosquitto.port) as c:
            await c.subscribe("daop/dev1/monitors/m/events", qos=1)
            created, _ = await request_v5(c, "dev1", "monitors/create",
                                          {"onnx": onnx_b64(mlp([64, 128, 10], batch=1)), "requiredTier": "poor",
                                           "monitor": "m"})
            assert created["data"]["meetsRequirement"] is True
            for profile, meets in (("power-saver", False), ("balanced", True)):
                switched = time.monotonic()
                ppd.switch(profile)
                event = json.loads((await next_message(c, timeout=10.0)).payload)
                assert event["meetsRequirement"] is meets, agent.log[-3000:]
                assert time.monotonic() - switched < 1.0, agent.log[-3000:]
                await asyncio.sleep(0.5)  # past the monitor's dwell (0.2 s), which would hold the next change
    finally:
        agent.stop()
        bus.disconnect()
