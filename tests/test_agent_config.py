"""Configuration: defaults, TOML, flags over TOML, and one clear line with exit 2 for every mistake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import Broker, default_device_id, load_config, parse_broker_url
from monitors.errors import BadInput

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_defaults_work_on_a_laptop_with_a_local_broker(monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    cfg = load_config()
    assert cfg.broker == Broker()  # mqtt://localhost:1883
    assert cfg.device_id == default_device_id()
    assert cfg.state_dir == Path.home() / ".local/state/daop-agent"
    assert cfg.base_topic == f"daop/{cfg.device_id}/" and cfg.client_id == f"daop-agent-{cfg.device_id}"


def test_state_directory_from_systemd(monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/daop-agent:/var/lib/other")
    assert load_config().state_dir == Path("/var/lib/daop-agent")


def test_the_agent_and_estimate_share_the_xdg_state_home(monkeypatch, tmp_path):
    from agent.config import default_state_dir

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert load_config().state_dir == default_state_dir() == tmp_path / "daop-agent"


def test_hostname_is_sanitised_into_a_device_id(monkeypatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "my.laptop (home)" + "x" * 80)
    device_id = default_device_id()
    assert device_id.startswith("my-laptop--home") and len(device_id) <= 64
    assert all(ch.isalnum() or ch in "_-" for ch in device_id)


def test_broker_urls():
    b = parse_broker_url("mqtts://dev%40x:p%3Ass@broker.example:9999")
    assert (b.host, b.port, b.tls, b.username, b.password) == ("broker.example", 9999, True, "dev@x", "p:ss")
    assert parse_broker_url("mqtts://h").port == 8883 and parse_broker_url("mqtt://h").port == 1883
    assert parse_broker_url("mqtt://h").url == "mqtt://h:1883"
    for bad in ("http://h", "mqtt://", "mqtt://h:99999", "mqtt://h/path", "h:1883"):
        with pytest.raises(BadInput):
            parse_broker_url(bad)


def test_toml_then_flags(tmp_path: Path):
    path = write(tmp_path, """
[agent]
device_id = "kitchen-pi"
state_dir = "/tmp/x"
sample_interval_s = 0.5
[broker]
url = "mqtt://10.0.0.2:1884"
username = "user"
password = "pw"
keepalive_s = 20
[monitors]
hysteresis_margin = 0.2
min_dwell_s = 5
max_events_per_minute = 3
[limits]
max_monitors = 10
max_request_bytes = 1000
estimate_timeout_s = 2.5
max_nodes = 500
[policy]
battery_floor_percent = 20
power_saver = true
""")
    cfg = load_config(path)
    assert cfg.device_id == "kitchen-pi" and cfg.sample_interval_s == 0.5
    assert (cfg.broker.host, cfg.broker.port, cfg.broker.username, cfg.broker.password) == ("10.0.0.2", 1884, "user", "pw")
    assert (cfg.rules.margin, cfg.rules.dwell_s, cfg.rules.max_events_per_minute) == (0.2, 5.0, 3)
    assert (cfg.limits.max_monitors, cfg.limits.max_request_bytes, cfg.limits.estimate_timeout_s) == (10, 1000, 2.5)
    assert cfg.limits.graph.max_nodes == 500
    assert cfg.policy.battery_floor_percent == 20 and cfg.policy.power_saver
    flagged = load_config(path, {"device_id": "other", "broker": "mqtt://b", "sample_interval_s": 2.0,
                                 "state_dir": None})
    assert flagged.device_id == "other" and flagged.broker.host == "b" and flagged.sample_interval_s == 2.0
    assert flagged.broker.username == "user"  # credentials from the file stay unless the URL has its own
    assert load_config(path, {"broker": "mqtt://u2:p2@b"}).broker.username == "u2"
    assert flagged.state_dir == Path("/tmp/x")


def test_password_file(tmp_path: Path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    cfg = load_config(write(tmp_path, f'[broker]\nusername = "dev1"\npassword_file = "{secret}"\n'))
    assert cfg.broker.password == "s3cret"


BAD = [
    ("[agent]\ndevice_id = 'a/b'\n", "device id"),
    ("[agent]\nsample_interval_s = 0\n", "sample interval"),
    ("[agent]\nsample_interval_s = 'fast'\n", "agent.sample_interval_s"),
    ("[agent]\nfoo = 1\n", "unknown key in [agent]: foo"),
    ("[agent]\ncalibration = 'fast'\n", "agent.calibration must be full or quick"),
    ("[brokers]\n", "unknown section"),
    ("[broker]\nurl = 'http://x'\n", "mqtt://"),
    ("[broker]\nurl = 'mqtt://h'\nca_file = '/nonexistent'\n", "not mqtts"),
    ("[broker]\nurl = 'mqtts://h'\nca_file = '/nonexistent'\n", "does not exist"),
    ("[broker]\ncert_file = '/x'\nurl = 'mqtts://h'\n", "go together"),
    ("[broker]\npassword_file = '/nonexistent/pw'\n", "password file"),
    ("[monitors]\nhysteresis_margin = 2\n", "margin"),
    ("[limits]\nmax_monitors = -1\n", "positive"),
    ("[limits]\nmax_nodez = 5\n", "unknown limit"),
    ("[policy]\nbattery_floor_percent = 150\n", "0 to 100"),
    ("[policy]\npower_saver = 'yes'\n", "policy.power_saver"),
    ("agent = 3\n", "[agent] must be a table"),
    ("[agent\n", "not valid TOML"),
]


@pytest.mark.parametrize("text,expected", BAD)
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, expected: str):
    with pytest.raises(BadInput) as info:
        load_config(write(tmp_path, text))
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("args,expected", [
    (["--config", "/nonexistent.toml"], "cannot read config"),
    (["--broker", "ftp://x"], "mqtt://"),
    (["--device-id", "bad id!"], "device id"),
    (["--sample-interval", "-1"], "sample interval"),
    (["--state-dir", "/proc/daop-agent-test"], "not writable"),
])
def test_run_with_bad_config_exits_2_with_one_line(tmp_path: Path, args: list[str], expected: str):
    result = subprocess.run([sys.executable, "-m", "agent", "run", "--state-dir", str(tmp_path / "s"), *args],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr


def test_the_example_config_loads_as_documented():
    cfg = load_config(REPO / "examples" / "agent.toml")
    assert cfg.broker.url == "mqtt://localhost:1883" and cfg.sample_interval_s == 1.0
    assert cfg.rules.dwell_s == 2.0 and cfg.limits.max_monitors == 1000 and cfg.policy.power_saver is False
    assert cfg.calibration == "full"
