"""`daop-agent state` as a real subprocess, on fixture trees and on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.simulation.trees import ACCELERATOR_BUILDERS, BUILDERS

ROOT = Path(__file__).resolve().parent.parent


def daop(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_state_json_on_fixture_tree(tmp_path, kind):
    tree = BUILDERS[kind](tmp_path)
    out = daop("state", "--json", "--sysfs-root", str(tree.sys), "--procfs-root", str(tree.proc))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    expected = {
        "laptop": ({"max_temp_c": 71.5, "throttling": False},
                   {"present": True, "percent": 37.0, "plugged": False}, "low-power"),
        "desktop": ({"max_temp_c": 49.0, "throttling": False},
                    {"present": False, "percent": None, "plugged": True}, None),
        "server": ({"max_temp_c": 58.0, "throttling": False},
                   {"present": False, "percent": None, "plugged": True}, None),
        "vm": ({"max_temp_c": None, "throttling": None}, {"present": False, "percent": None, "plugged": True}, None),
    }[kind]
    thermal, battery, mode = expected
    assert {k: doc["thermal"][k] for k in thermal} == thermal
    assert {k: doc["battery"][k] for k in battery} == battery
    assert doc["power_mode"] == mode
    assert doc["cpu"]["load"] is None  # a fixture /proc/stat does not move: no load, never a made-up 0
    assert doc["gpus"] == []


def test_state_table_on_laptop_fixture_tree(tmp_path):
    tree = BUILDERS["laptop"](tmp_path)
    out = daop("state", "--sysfs-root", str(tree.sys), "--procfs-root", str(tree.proc))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("thermal") and "71.5 C" in line and "throttling no" in line for line in lines)
    assert any(line.startswith("battery") and "37.0 %" in line and "plugged no" in line for line in lines)
    assert any(line.startswith("power mode") and "low-power" in line for line in lines)


def test_state_on_this_machine():
    out = daop("state", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cpu"]["load"] is not None and 0.0 <= doc["cpu"]["load"] <= 1.0
    assert isinstance(doc["battery"]["present"], bool)
    table = daop("state")
    assert table.returncode == 0 and table.stdout.startswith("thermal")


def test_state_bad_root_exits_2_with_one_line(tmp_path):
    out = daop("state", "--sysfs-root", str(tmp_path / "nowhere"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--sysfs-root" in out.stderr and "Traceback" not in out.stderr


ACCELERATORS = {
    "intel-laptop-i915": [("gpu0", "gpu", "intel", "i915"), ("npu0", "npu", "intel", "intel_vpu")],
    "intel-laptop-xe": [("gpu0", "gpu", "intel", "xe"), ("npu0", "npu", "intel", "intel_vpu")],
    "amd-laptop": [("gpu0", "gpu", "amd", "amdgpu"), ("npu0", "npu", "amd", "amdxdna")],
    "nvidia-desktop": [("gpu0", "gpu", "nvidia", "nvidia")],
}


@pytest.mark.parametrize("kind", sorted(ACCELERATOR_BUILDERS))
def test_state_json_lists_accelerators_on_fixture_tree(tmp_path, kind):
    tree = ACCELERATOR_BUILDERS[kind](tmp_path)
    out = daop("state", "--json", "--sysfs-root", str(tree.sys), "--procfs-root", str(tree.proc))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(a["id"], a["kind"], a["vendor"], a["driver"]) for a in doc["accelerators"]] == ACCELERATORS[kind]
    assert doc["gpus"] == []  # the contract's NVML list: no NVML in this process
    for a in doc["accelerators"]:
        assert a["calibrated_as"] is None and isinstance(a["providers"], list)
        # one clear line for each accelerator no estimate runs on
        assert sum(n.startswith(a["id"] + " (") and "no calibrated onnxruntime execution provider" in n
                   for n in doc["notes"]) == 1


def test_state_table_on_amd_laptop_fixture_tree(tmp_path):
    tree = ACCELERATOR_BUILDERS["amd-laptop"](tmp_path)
    out = daop("state", "--sysfs-root", str(tree.sys), "--procfs-root", str(tree.proc))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("gpu0") and "busy 35 %" in line and "amdgpu" in line for line in lines)
    assert any(line.startswith("npu0") and "RyzenAI-npu1" in line for line in lines)
    assert sum("no calibrated onnxruntime execution provider" in line for line in lines) == 2
