"""The systemd unit: `systemd-analyze verify` clean, exposure <= 2.0, and the settings the agent relies on."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "daop-agent.service"
INSTALLED_BINARY = "/opt/daop-agent/.venv/bin/daop-agent"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)")


def settings() -> dict[str, list[str]]:
    """Every Key=value of the unit, in order, keys repeated as systemd allows."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


@needs_analyze
def test_unit_verifies_clean(tmp_path: Path):
    # verify checks that ExecStart's binary exists: point it at this checkout's Python, nothing else changes.
    unit = tmp_path / "daop-agent.service"
    text = UNIT.read_text()
    assert INSTALLED_BINARY in text
    unit.write_text(text.replace(INSTALLED_BINARY, f"{sys.executable} -m agent"))
    result = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


@needs_analyze
def test_unit_hardening_exposure_is_at_most_2():
    result = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(UNIT)],
                            capture_output=True, text=True)
    match = re.search(r"Overall exposure level for daop-agent\.service: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 2.0


def test_unit_is_notify_with_watchdog_restart_state_dir_and_nvml_devices():
    s = settings()
    assert s["Type"] == ["notify"]
    assert s["NotifyAccess"] == ["main"]
    assert s["Restart"] == ["on-failure"]
    assert s["StateDirectory"] == ["daop-agent"]
    assert int(s["WatchdogSec"][0].rstrip("s")) >= 10
    assert s["PrivateDevices"] == ["no"] and s["DevicePolicy"] == ["closed"]
    assert any("nvidiactl" in d for d in s["DeviceAllow"]) and any("nvidia-frontend" in d for d in s["DeviceAllow"])
    assert s["ExecStart"][0].split()[:2] == [INSTALLED_BINARY, "run"]
    assert "2" in s["RestartPreventExitStatus"][0].split()  # bad config: exit 2, no restart loop
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment]
    parser.read_string(UNIT.read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]
