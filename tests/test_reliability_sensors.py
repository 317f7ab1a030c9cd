"""Reliability of the senses: files vanishing and returning garbage, NVML failing midway.

Where this machine has no such hardware the real probes and the real agent
run against fixture /sys and /proc trees (agent/simulation/trees.py) and the NVML
stand-in (agent/simulation/nvml.py), as the names of the tests say. The agent
must keep running, keep answering, keep publishing what it still can see,
and say what it cannot (`daop-agent state`: null readings, stale values with
their age, notes).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pynvml
from agent_harness import client, next_message, request_v5
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_agent_contract import SMALL

from agent.config import load_config
from agent.service import Agent
from agent.simulation.nvml import NvmlStandin, StandinGpu
from agent.simulation.trees import amd_laptop, intel_laptop, laptop
from probes.state import Sampler

REPO = Path(__file__).resolve().parent.parent
DEV = "sens1"

GARBAGE = [b"", b"\x00\xff\xfe garbage", b"-999999999999999999999999", b"nan", b"inf\n", b"12abc", b"\n\n\n",
           b"9" * 100_000, "température".encode(), b"-1", b"1e309"]


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def finite_or_none(value) -> bool:
    if isinstance(value, dict):
        return all(finite_or_none(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_or_none(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return True


def vandalise(path: Path, how: int, garbage: bytes) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if how == 0:
        return  # vanished
    if how == 1:
        path.mkdir(parents=True)  # a directory where a file was
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(garbage)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_laptop_fixture_tree_vandalised_files_never_break_the_sampler(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("tree")
    tree = laptop(root)
    originals = {p: p.read_bytes() for p in files_of(root)}
    gpu = NvmlStandin(gpus=[StandinGpu(util=40)])
    sampler = Sampler(tree.sys, tree.proc, nvml=gpu, gpus=True, ppd=False)
    # A read slower than 50 ms is not retried for 30 s (a slow embedded controller); on a loaded test host a
    # plain file read can be that slow, which would leave a restored file unread: not what this test is about.
    sampler.sys_files.slow_read_s = sampler.proc_files.slow_read_s = 30.0
    clean = sampler.sample().to_json()
    paths = sorted(originals)
    for _ in range(data.draw(st.integers(1, 12))):
        path = data.draw(st.sampled_from(paths))
        vandalise(path, data.draw(st.integers(0, 2)), data.draw(st.sampled_from(GARBAGE)))
        if data.draw(st.booleans()):
            call = data.draw(st.sampled_from(["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
                                              "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons"]))
            gpu.fail[call] = pynvml.NVML_ERROR_GPU_IS_LOST
        sampler.tick()  # a run-queue snapshot from whatever /proc/loadavg now holds
        state = sampler.sample()
        out = state.to_json()
        json.dumps(out)  # serialisable, no NaN sneaking in as a float
        assert finite_or_none(out)
        t = out["thermal"]["max_temp_c"]
        assert t is None or t > 0  # a reading that can't be had is null, never 0
        pct = out["battery"]["percent"]
        assert pct is None or 0 <= pct <= 100
    # everything back as it was: fresh readings equal to the clean ones, nothing stale
    for path, content in originals.items():
        if path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    gpu.fail.clear()
    restored = sampler.sample().to_json()
    assert restored["stale"] == {}
    for key in ("thermal", "battery", "power_mode", "gpus"):
        a, b = clean[key], restored[key]
        if key == "thermal":
            a = {k: v for k, v in a.items() if k != "throttle_events"}
            b = {k: v for k, v in b.items() if k != "throttle_events"}
        assert a == b, key


ACCELERATOR_TREES = {"amd-laptop": amd_laptop, "intel-laptop-i915": intel_laptop,
                     "intel-laptop-xe": lambda root: intel_laptop(root, "xe")}
IDENTITY = ("id", "kind", "vendor", "driver", "name", "pci_slot", "node", "shares_system_memory",
            "memory_total_bytes", "clock_max_mhz")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_accelerator_fixture_trees_vandalised_files_never_break_the_sampler(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("tree")
    tree = ACCELERATOR_TREES[data.draw(st.sampled_from(sorted(ACCELERATOR_TREES)))](root)
    originals = {p: p.read_bytes() for p in files_of(tree.sys / "devices") + files_of(tree.proc)
                 if p.name not in ("stat", "meminfo", "loadavg")}
    sampler = Sampler(tree.sys, tree.proc, ppd=False, gpus=False)
    sampler.sys_files.slow_read_s = sampler.proc_files.slow_read_s = 30.0  # host load is no slow sensor
    clean = sampler.sample().to_json()["accelerators"]
    paths = sorted(originals)
    for _ in range(data.draw(st.integers(1, 12))):
        vandalise(data.draw(st.sampled_from(paths)), data.draw(st.integers(0, 2)), data.draw(st.sampled_from(GARBAGE)))
        out = sampler.sample().to_json()
        json.dumps(out)
        assert finite_or_none(out)
        for a in out["accelerators"]:
            assert all(a[k] is None or 0.0 <= a[k] <= 1.0 for k in ("busy", "others_busy", "own_busy"))
            assert all(a[k] is None or a[k] >= 0 for k in ("memory_used_bytes", "memory_free_bytes", "clients"))
    for path, content in originals.items():
        if path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    restored = sampler.sample().to_json()["accelerators"]
    assert [{k: a[k] for k in IDENTITY} for a in restored] == [{k: a[k] for k in IDENTITY} for a in clean]


def test_laptop_fixture_tree_garbage_readings_are_stale_last_good_values_then_null(tmp_path):
    tree = laptop(tmp_path)
    sampler = Sampler(tree.sys, tree.proc, ppd=False, gpus=False, stale_after_s=0.3)
    sampler.sys_files.slow_read_s = 30.0  # see above: host load must not look like a slow sensor
    before = sampler.sample()
    assert before.thermal.max_temp_c == 71.5 and before.battery.percent == 37.0
    tree.set("class/thermal/thermal_zone1/temp", "garbage")
    tree.remove("class/power_supply/BAT0/energy_now")
    tree.remove("class/power_supply/BAT0/capacity")
    during = sampler.sample()
    assert during.thermal.max_temp_c == 71.5  # the last good value ...
    assert any("thermal_zone1" in k for k in during.stale)  # ... said to be one, with its age

    time.sleep(0.35)
    later = sampler.sample()
    assert later.thermal.zones[1].temp_c is None  # too old: null, never a made-up 0
    tree.set("class/thermal/thermal_zone1/temp", "80000")
    assert sampler.sample().thermal.max_temp_c == 80.0


def test_nvml_standin_failing_midway_keeps_last_good_values_then_recovers(tmp_path):
    tree = laptop(tmp_path)
    gpu = NvmlStandin(gpus=[StandinGpu(util=30, used=4 << 30)])
    sampler = Sampler(tree.sys, tree.proc, nvml=gpu, gpus=True, ppd=False)
    assert sampler.sample().gpus[0].util_percent == 30
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
                 "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons"):
        gpu.fail[name] = pynvml.NVML_ERROR_GPU_IS_LOST
    gpu.gpus[0].util = 99
    state = sampler.sample()
    assert state.gpus[0].util_percent == 30 and any(k.startswith("gpus.0.") for k in state.stale)
    gpu.fail.clear()
    assert sampler.sample().gpus[0].util_percent == 99


async def test_agent_on_a_laptop_fixture_tree_and_nvml_standin_keeps_running_while_its_sensors_fail(
        state_dir, mosquitto, tmp_path):
    """In-process agent (the NVML stand-in is injected into its Sampler); a real broker; real estimates."""


    tree = laptop(tmp_path / "tree")
    tree.supply("ADP1", type="Mains", online=1)
    config = tmp_path / "agent.toml"
    config.write_text("[monitors]\nmin_dwell_s = 0.1\nmax_events_per_minute = 60\n"
                      "[policy]\nbattery_floor_percent = 20\n")
    cfg = load_config(config, {"broker": mosquitto.url, "device_id": DEV, "state_dir": str(state_dir),
                               "sysfs_root": str(tree.sys), "procfs_root": str(tree.proc), "sample_interval_s": 0.1,
                               "calibration": "quick"})
    gpu = NvmlStandin(gpus=[StandinGpu(util=20)])
    agent = Agent(cfg, sampler=Sampler(tree.sys, tree.proc, nvml=gpu, gpus=True, ppd=False))
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        for _ in range(600):
            if agent.pool.ready:
                break
            assert not task.done(), task
            await asyncio.sleep(0.05)
        async with client(mosquitto.port) as c:
            created, _ = await request_v5(c, DEV, "monitors/create", {"onnx": SMALL, "requiredTier": "poor",
                                                                      "monitor": "m"})
            assert created["data"]["meetsRequirement"] is True
            await c.subscribe(f"daop/{DEV}/monitors/m/events", qos=1)

            # between samples the agent takes run-queue snapshots: 6 other tasks in /proc/loadavg
            # count, though the samples' own /proc/stat snapshot reads none
            tree.set_proc("loadavg", "6.00 6.00 6.00 7/300 4242\n")
            await asyncio.sleep(0.5)
            assert agent.speed.state.cpu.runnable_others > 3.0, agent.speed.state.cpu

            # the senses fail: files vanish or hold garbage, /proc/stat is junk, NVML loses the GPU
            shutil.rmtree(tree.sys / "class/thermal")
            tree.set("firmware/acpi/platform_profile", b"\xff\xfe\x00")
            for policy in (tree.sys / "devices/system/cpu/cpufreq").iterdir():
                (policy / "scaling_cur_freq").write_text("n/a\n")
            tree.set_proc("stat", "cpu  garbage\n")
            tree.set_proc("loadavg", "junk\n")
            tree.set_proc("pressure/cpu", "\x00" * 64)
            for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCount"):
                gpu.fail[name] = pynvml.NVML_ERROR_GPU_IS_LOST
            await asyncio.sleep(1.0)  # ten samples of that
            assert not task.done()
            for method, body in (("monitors/list", {}), ("estimate", {"onnx": SMALL})):
                answer, _ = await request_v5(c, DEV, method, body, timeout=10)
                assert answer["status"] == "ok", answer

            # what it still sees still counts: on battery below the floor -> false
            tree.supply("ADP1", online=0)
            tree.supply("BAT0", status="Discharging", energy_now=5_000_000)
            tree.supply("CMB1", status="Discharging", energy_now=1_000_000)
            event = json.loads((await next_message(c, f"daop/{DEV}/monitors/m/events", timeout=10)).payload)
            assert event["meetsRequirement"] is False
            assert not task.done()

        # and it says what it cannot see (the same probes, through `daop-agent state`)
        r = subprocess.run([sys.executable, "-m", "agent", "state", "--json", "--sysfs-root", str(tree.sys),
                            "--procfs-root", str(tree.proc)], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        assert seen["thermal"]["max_temp_c"] is None and seen["thermal"]["zones"] == []
        assert seen["power_mode"] is None and seen["cpu"]["load"] is None and seen["cpu"]["cur_mhz"] is None
        assert seen["battery"]["percent"] is not None  # what is still readable is still read
    finally:
        agent.request_stop()
        await asyncio.wait_for(task, 15)
