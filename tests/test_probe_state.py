"""Sampler and DeviceState on whole fixture trees: the contract's JSON, garbage, vanishing files, FIFOs."""

from __future__ import annotations

import json
import os
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.simulation.nvml import NVML_ERROR_GPU_IS_LOST, NvmlStandin, StandinGpu
from agent.simulation.trees import desktop, laptop, server, vm
from probes.state import Sampler


def sample_twice(tree, nvml=None):
    sampler = Sampler(tree.sys, tree.proc, nvml)
    sampler.sample()
    tree.set_stat(busy=1000 * tree.cores + 30, idle=9000 * tree.cores + 70)
    return sampler.sample()


def contract_shape(doc: dict) -> None:
    assert set(doc) >= {"thermal", "battery", "power_mode", "cpu", "gpus"}
    assert set(doc["thermal"]) >= {"max_temp_c", "throttling"}
    assert set(doc["battery"]) >= {"present", "percent", "plugged"}
    assert "load" in doc["cpu"]
    assert isinstance(doc["gpus"], list)
    json.dumps(doc)  # serialisable as is


def test_laptop_fixture_tree_contract_json(tmp_path):
    tree = laptop(tmp_path)
    doc = sample_twice(tree).to_json()
    contract_shape(doc)
    assert doc["thermal"]["max_temp_c"] == 71.5 and doc["thermal"]["throttling"] is False
    assert doc["battery"] == doc["battery"] | {"present": True, "percent": 37.0, "plugged": False}
    assert doc["power_mode"] == "low-power"
    assert doc["cpu"]["load"] == 0.3  # 30 of 100 ticks busy, fixture: no own process to subtract
    assert doc["gpus"] == [] and doc["stale"] == {}


def test_desktop_fixture_tree_contract_json(tmp_path):
    doc = sample_twice(desktop(tmp_path)).to_json()
    contract_shape(doc)
    assert doc["thermal"] == doc["thermal"] | {"max_temp_c": 49.0, "throttling": False, "source": "hwmon"}
    assert doc["battery"] == doc["battery"] | {"present": False, "percent": None, "plugged": True}
    assert doc["power_mode"] is None and doc["power"]["governor"] == "performance"


def test_server_fixture_tree_with_nvml_standin(tmp_path):
    nvml = NvmlStandin([StandinGpu(util=75, used=20 * 2**30, reasons=0x40)])
    doc = sample_twice(server(tmp_path), nvml).to_json()
    contract_shape(doc)
    (gpu,) = doc["gpus"]
    assert gpu["util_percent"] == 75.0 and gpu["memory_free_bytes"] == 4 * 2**30
    assert gpu["thermal_throttling"] is True and gpu["power_capping"] is False


def test_server_fixture_tree_nvml_standin_error_midway_keeps_sampling(tmp_path):
    nvml = NvmlStandin()
    tree = server(tmp_path)
    sampler = Sampler(tree.sys, tree.proc, nvml)
    sampler.sample()
    nvml.fail = {name: NVML_ERROR_GPU_IS_LOST for name in (
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetCurrentClocksEventReasons")}
    doc = sampler.sample().to_json()
    assert doc["gpus"][0]["util_percent"] == 0.0  # last good
    assert set(k for k in doc["stale"] if k.startswith("gpus.0.")) >= {"gpus.0.util", "gpus.0.temp_c"}
    assert doc["thermal"]["max_temp_c"] == 58.0


def test_vm_fixture_tree_everything_unknown_is_null(tmp_path):
    tree = vm(tmp_path)
    sampler = Sampler(tree.sys, tree.proc)
    sampler.sample()
    tree.set_stat(busy=5050, idle=14030, steal=1020)
    doc = sampler.sample().to_json()
    contract_shape(doc)
    assert doc["thermal"]["max_temp_c"] is None and doc["thermal"]["throttling"] is None
    assert doc["battery"] == doc["battery"] | {"present": False, "percent": None, "plugged": True}
    assert doc["power_mode"] is None
    assert doc["cpu"]["steal"] == 0.2 and doc["cpu"]["load"] == 0.5
    assert doc["gpus"] == []  # a fixture tree does not look at this machine's GPUs


def test_laptop_fixture_tree_fifo_in_place_of_battery_does_not_hang(tmp_path):
    tree = laptop(tmp_path)
    sampler = Sampler(tree.sys, tree.proc)
    sampler.sample()
    path = tree.sys / "class/power_supply/BAT0/energy_now"
    path.unlink()
    os.mkfifo(path)
    start = time.monotonic()
    state = sampler.sample()
    assert time.monotonic() - start < 1.0
    assert state.battery.percent == 37.0 and "battery.batteries.BAT0.energy_now" in state.stale


def test_real_machine_sampler_runs():
    """This machine as it is (a VM: likely no thermal, no battery): sampling works and is serialisable."""
    sampler = Sampler()
    sampler.sample()
    time.sleep(0.05)
    doc = sampler.sample().to_json()
    sampler.close()
    contract_shape(doc)
    assert doc["cpu"]["cores"] == os.cpu_count()
    assert doc["cpu"]["load"] is not None and 0.0 <= doc["cpu"]["load"] <= 1.0


# Files a driver may garble or remove, relative to the laptop tree's /sys.
VOLATILE = [
    "class/thermal/thermal_zone0/temp", "class/thermal/thermal_zone1/temp",
    "class/thermal/thermal_zone1/trip_point_1_temp", "class/thermal/thermal_zone1/type",
    "class/thermal/cooling_device0/cur_state", "class/thermal/cooling_device0/type",
    "class/power_supply/BAT0/capacity", "class/power_supply/BAT0/energy_now", "class/power_supply/BAT0/status",
    "class/power_supply/BAT0/type", "class/power_supply/CMB1/present", "class/power_supply/ADP1/online",
    "class/power_supply/hidpp_battery_0/scope", "firmware/acpi/platform_profile",
    "devices/system/cpu/cpufreq/policy0/scaling_cur_freq", "devices/system/cpu/cpufreq/policy0/cpuinfo_max_freq",
    "devices/system/cpu/cpu0/thermal_throttle/package_throttle_count",
]
PROC = ["stat", "pressure/cpu", "meminfo", "pressure/memory"]


def _check_values(doc: dict) -> None:
    t, b, c = doc["thermal"], doc["battery"], doc["cpu"]
    assert t["max_temp_c"] is None or -60 <= t["max_temp_c"] <= 200
    assert t["throttling"] in (None, True, False)
    assert b["percent"] is None or 0 <= b["percent"] <= 100
    assert b["plugged"] in (None, True, False)
    assert c["load"] is None or 0 <= c["load"] <= 1
    assert all(age >= 0 for age in doc["stale"].values())
    json.dumps(doc)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(changes=st.lists(st.tuples(st.sampled_from(VOLATILE + [f"/proc/{p}" for p in PROC]),
                                  st.one_of(st.none(), st.binary(max_size=40))), min_size=1, max_size=8))
def test_laptop_fixture_tree_garbage_and_vanishing_files_never_crash(tmp_path_factory, changes):
    """Random bytes written to, or files removed from, a laptop tree: sampling goes on with null or last good values."""
    tree = laptop(tmp_path_factory.mktemp("laptop"))
    sampler = Sampler(tree.sys, tree.proc)
    before = sampler.sample().to_json()
    for rel, data in changes:
        path = tree.proc / rel[len("/proc/"):] if rel.startswith("/proc/") else tree.sys / rel
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(data)
    after = sampler.sample().to_json()
    _check_values(after)
    # what a garbled file cannot say is either fresh, or the last good value (flagged stale), or null
    for zone in after["thermal"]["zones"]:
        key = f"thermal.zones.{zone['name']}.temp_c"
        if key in after["stale"]:
            old = next(z for z in before["thermal"]["zones"] if z["name"] == zone["name"])
            assert zone["temp_c"] == old["temp_c"]
