"""The systemd unit: `systemd-analyze verify` clean, exposure <= 1.7, and the settings the agent relies on."""

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
def test_unit_hardening_exposure_is_at_most_1_7():
    result = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(UNIT)],
                            capture_output=True, text=True)
    match = re.search(r"Overall exposure level for daop-agent\.service: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 1.7


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


def test_unit_names_only_groups_a_debian_system_has():
    """systemd refuses to start a unit whose SupplementaryGroups= names a missing group (Debian 12 has no
    `render` until a GPU driver's udev rules create it); this test machine is a Debian 12 base system."""
    import grp  # noqa: PLC0415 - only where the unit's group is checked (a Unix-only module)

    for group in " ".join(settings().get("SupplementaryGroups", [])).split():
        grp.getgrnam(group)  # KeyError: the group is missing


def test_unit_loads_the_broker_password_as_a_credential_with_an_empty_default():
    s = settings()
    assert s["LoadCredential"] == ["broker-password:/etc/daop-agent/broker-password"]
    # without the file, SetCredential= is the default and the unit still starts (no password)
    assert s["SetCredential"] == ["broker-password:\\n"]


def test_unit_has_memory_for_its_own_calibration():
    value = settings()["MemoryMax"][0]
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    limit = float(value[:-1]) * units[value[-1]]
    assert limit >= 2 * 2**30  # a full calibration's tree peaks at 1.1 GB on larger machines (docs/systemd.md)
