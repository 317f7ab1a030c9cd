"""The README's examples, run as written against a real agent.

The agent runs as `./run.sh` would (device id: this host's name) on the test's own broker, named by
`$DAOP_BROKER` (which the client and `daop-agent monitor` read in place of `./run.sh`'s address) so that the
test never takes a developer's port 18830; state in the session's calibrated state dir (`$DAOP_STATE_DIR`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import REPO, agent_on, write_config
from test_agent_contract import CONFIG

from daop_client import default_device_id

README = (REPO / "README.md").read_text()
TIERS = ("excellent", "good", "fair", "moderate", "slow", "very-slow", "poor")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def shell_examples() -> list[tuple[str, list[str]]]:
    """Each `$ command` of the README's sh blocks (continuation lines joined) with the lines it shows."""
    out = []
    for block in blocks("sh"):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("$ "):
                command = lines[i][2:]
                while command.endswith("\\"):
                    i += 1
                    command = command[:-1] + lines[i].strip()
                shown = []
                while i + 1 < len(lines) and not lines[i + 1].startswith("$ "):
                    i += 1
                    shown.append(lines[i])
                out.append((command, shown))
            i += 1
    return out


@pytest.fixture
def env(mosquitto, state_dir: Path) -> dict[str, str]:
    return {**os.environ, "DAOP_BROKER": mosquitto.url, "DAOP_STATE_DIR": str(state_dir),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), default_device_id()).start()
    yield proc
    proc.stop()


def run_shown(command: str, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/daop-agent", command
    return subprocess.Popen([sys.executable, "-m", "agent", *argv[1:]], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_readme_has_the_examples_this_file_runs():
    commands = [c.split()[1] for c, _ in shell_examples()]
    assert commands.count("estimate") == 3 and commands.count("monitor") == 1
    assert len(blocks("python")) == 1


def test_readme_estimate_examples_run_as_written(env):
    for command, shown in shell_examples():
        if " estimate " not in f" {command} ":
            continue
        if "--prompt-tokens" in command:  # the chat example: a model the user builds (docs/estimator.md), not shipped
            assert not (REPO / shlex.split(command)[2]).exists()
            continue
        proc = run_shown(command, env)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        if "--json" in command:
            doc, expected = json.loads(out), json.loads(shown[0])
            assert set(doc) >= set(expected) - {"accelerator"} and doc["tier"] in TIERS
        else:
            pattern = re.escape(re.sub(r"\d+\.\d+", "NUMBER", shown[0]))
            pattern = pattern.replace("NUMBER", r"\d+\.\d+").replace("excellent", "[a-z-]+")
            pattern = pattern.replace("full", "(?:quick|full)")  # the session's calibration is a quick one
            assert re.fullmatch(pattern, out.strip()), (out, shown[0])


def test_readme_monitor_example_runs_as_written(agent, env, device):
    (command, shown), = [(c, s) for c, s in shell_examples() if " monitor " in f" {c} "]
    proc = run_shown(command, env)
    try:
        first = proc.stdout.readline()
        pattern = re.escape(shown[0]).replace("714acf56b472908b", "[0-9a-f]{16}").replace(r"\ vm:", r"\ [^:]+:")
        pattern = pattern.replace(r"excellent\ met", r"excellent\ (met|NOT\ met)")
        assert re.fullmatch(pattern, first.strip()), (first, shown[0])
        assert f" on {default_device_id()}:" in first
        if " excellent met" in first:  # the policy's power-saver veto makes it false
            device.set("firmware/acpi/platform_profile", "low-power")
            assert re.fullmatch(r"\S+Z seq \d+: excellent NOT met", proc.stdout.readline().strip())
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_readme_python_example_runs_as_written(agent, env, device, tmp_path):
    (code,) = blocks("python")
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() in TIERS
        first = proc.stdout.readline().strip()
        assert first in ("run locally: True", "run locally: False")
        if first.endswith("True"):
            device.set("firmware/acpi/platform_profile", "low-power")
            assert proc.stdout.readline().strip() == "run locally: False"
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=15)
    assert "Traceback" not in err, err
