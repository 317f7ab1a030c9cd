"""Configuration: defaults, TOML, flags over TOML, and one clear line with exit 2 for every mistake."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from agent import config_reference
from agent.config import (
    OPTIONS,
    SECTIONS,
    Broker,
    Config,
    default_device_id,
    default_state_dir,
    load_config,
    option,
    parse_broker_url,
    shown,
)
from agent.mqtt_link import max_packet_bytes
from monitors.errors import BadInput
from monitors.graphs.limits import Limits

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_defaults_work_on_a_laptop_with_a_local_broker(monkeypatch):
    for name in ("DAOP_STATE_DIR", "STATE_DIRECTORY", "XDG_STATE_HOME", "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    cfg = load_config()
    assert cfg.broker == Broker()  # mqtt://localhost:1883
    assert cfg.device_id == default_device_id()
    assert cfg.state_dir == Path.home() / ".local/state/daop-agent"
    assert cfg.base_topic == f"daop/{cfg.device_id}/" and cfg.client_id == f"daop-agent-{cfg.device_id}"


def test_state_directory_from_systemd(monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/daop-agent:/var/lib/other")
    assert load_config().state_dir == Path("/var/lib/daop-agent")


def test_the_agent_and_estimate_share_the_xdg_state_home(monkeypatch, tmp_path):

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert load_config().state_dir == default_state_dir() == tmp_path / "daop-agent"


def test_hostname_is_sanitised_into_a_device_id(monkeypatch):

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
    broker = cfg.broker
    assert (broker.host, broker.port, broker.username, broker.password) == ("10.0.0.2", 1884, "user", "pw")
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


def test_several_brokers_in_order_with_protocol_and_session(tmp_path: Path):
    """A cluster's nodes: `urls` in the file, or --broker repeated (the flags replace the file's list); the
    settings of [broker] apply to each, a URL's own credentials to it alone."""
    path = write(tmp_path, '[broker]\nurls = ["mqtt://u:p@n1:1884", "mqtt://n2:1885"]\nusername = "dev1"\n'
                           'protocol = "3.1.1"\nsession_expiry_s = 3600\n')
    cfg = load_config(path)
    assert [b.url for b in cfg.brokers] == ["mqtt://n1:1884", "mqtt://n2:1885"] and cfg.broker == cfg.brokers[0]
    assert [b.username for b in cfg.brokers] == ["u", "dev1"]
    assert {(b.protocol, b.session_expiry_s) for b in cfg.brokers} == {("3.1.1", 3600)}
    cfg = load_config(path, {"broker": ["mqtt://a", "mqtt://b", "mqtt://c"], "protocol": "5"})
    assert [b.host for b in cfg.brokers] == ["a", "b", "c"] and cfg.broker.protocol == "5"
    assert load_config().brokers == (Broker(),)


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
    ("[agent]\nweb_port = 70000\n", "web port must be 1 to 65535"),
    ("[agent]\nweb_port = 'on'\n", "agent.web_port must be int"),
    ("[brokers]\n", "unknown section"),
    ("[broker]\nurl = 'http://x'\n", "mqtt://"),
    ("[broker]\nurl = 'mqtt://h'\nca_file = '/nonexistent'\n", "not mqtts"),
    ("[broker]\nurl = 'mqtts://h'\nca_file = '/nonexistent'\n", "does not exist"),
    ("[broker]\ncert_file = '/x'\nurl = 'mqtts://h'\n", "go together"),
    ("[broker]\npassword_file = '/nonexistent/pw'\n", "password file"),
    ("[broker]\nurl = 'mqtt://a'\nurls = ['mqtt://b']\n", "broker.url or broker.urls, not both"),
    ("[broker]\nurls = []\n", "non-empty list"),
    ("[broker]\nurls = ['mqtt://a', 3]\n", "non-empty list"),
    ("[broker]\nurls = ['mqtt://a', 'http://b']\n", "mqtt://"),
    ("[broker]\nurls = ['mqtts://a', 'mqtt://b']\nca_file = '/x'\n", "mqtt://b:1883 is not mqtts"),
    ("[broker]\nprotocol = '4'\n", "protocol must be 5 or 3.1.1"),
    ("[broker]\nprotocol = 5\n", "broker.protocol must be str"),
    ("[broker]\nsession_expiry_s = -1\n", "session expiry"),
    ("[monitors]\nhysteresis_margin = 2\n", "margin"),
    ("[limits]\nmax_monitors = -1\n", "positive"),
    ("[limits]\nmax_nodez = 5\n", "unknown limit"),
    ("[limits]\nmax_request_bytes = 2000\nmax_pending_bytes = 1000\n", "at least limits.max_request_bytes"),
    ("[limits]\nworker_memory_mb = 300\n", "worker_memory_mb must be at least 512"),
    ("[policy]\nbattery_floor_percent = 150\n", "0 to 100"),
    ("[privacy]\njitter = 0.5\n", "jitter must be 0 to 0.25"),
    ("[privacy]\nperiod_s = 0\n", "period_s must be positive"),
    ("[privacy]\nburst = 0\n", "privacy.burst must be positive"),
    ("[privacy]\nenabled = 'yes'\n", "privacy.enabled must be bool"),
    ("[privacy]\nrate = 5\n", "unknown key in [privacy]: rate"),
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
    (["--web-port", "18831"], "--web-port needs --local-broker"),
    (["--broker", "mqtt://a", "--broker", "ftp://b"], "mqtt://"),
    (["--protocol", "4"], "invalid choice"),
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
    assert cfg.local_broker is False and cfg.web_port is None  # with --local-broker: WebSockets on its port + 1
    assert cfg.homeassistant.enabled is False and cfg.metrics.port == 0  # the integrations are opt-in
    assert cfg.privacy == load_config(None).privacy and cfg.privacy.enabled  # as the defaults: on
    assert (cfg.limits.max_pending_bytes, cfg.limits.worker_memory_mb) == (64 << 20, 1024)


def test_the_example_broker_config_refuses_what_the_agent_would_not_be_sent():
    """examples/mosquitto.conf's max_packet_size is the agent's own Maximum Packet Size at the default limits."""

    lines = (REPO / "examples" / "mosquitto.conf").read_text().splitlines()
    assert f"max_packet_size {max_packet_bytes(load_config(None).limits.max_request_bytes)}" in lines
    assert "set_tcp_nodelay true" in lines


def test_broker_password_from_a_systemd_credential(tmp_path: Path, monkeypatch):
    """The unit's LoadCredential=broker-password: read from $CREDENTIALS_DIRECTORY; its empty default is none;
    a password in the configuration wins."""
    creds = tmp_path / "creds"
    creds.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    (creds / "broker-password").write_text("s3cret\n")
    assert load_config(None, {"state_dir": str(tmp_path)}).broker.password == "s3cret"
    (creds / "broker-password").write_text("\n")  # SetCredential=broker-password:\n, where no file was there
    assert load_config(None, {"state_dir": str(tmp_path)}).broker.password is None
    config = tmp_path / "agent.toml"
    config.write_text('[broker]\npassword = "from-config"\n')
    (creds / "broker-password").write_text("s3cret\n")
    assert load_config(config, {"state_dir": str(tmp_path)}).broker.password == "from-config"


def test_one_default_state_dir_for_every_command(tmp_path: Path, monkeypatch):

    monkeypatch.setenv("DAOP_STATE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "systemd"))
    assert default_state_dir() == tmp_path / "mine"
    monkeypatch.delenv("DAOP_STATE_DIR")
    assert default_state_dir() == tmp_path / "systemd"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "daop-agent"


@pytest.mark.parametrize("text,expected", [
    ("[metrics]\nport = 70000\n", "metrics.port"),
    ("[metrics]\nport = 9464\nfingerprint = true\n", "unknown key"),
    ("[homeassistant]\ndiscovery_prefix = \"ha/#\"\n", "discovery_prefix"),
    ("[homeassistant]\nenabled = \"yes\"\n", "homeassistant.enabled"),
])
def test_integration_settings_are_checked(tmp_path: Path, text: str, expected: str):
    config = tmp_path / "agent.toml"
    config.write_text(text)
    with pytest.raises(BadInput, match=expected):
        load_config(config, {"state_dir": str(tmp_path)})


def test_the_docs_reference_and_the_example_are_the_declarations_output():
    """docs/configuration.md's key tables and examples/agent.toml are generated from OPTIONS: edit one without
    the other and this fails (python -m agent.config_reference --write rewrites both)."""
    docs = (REPO / "docs" / "configuration.md").read_text()
    hint = "changed OPTIONS? run: python -m agent.config_reference --write"
    assert config_reference.docs_with_reference(docs) == docs, hint
    assert (REPO / "examples" / "agent.toml").read_text() == config_reference.toml(), hint
    for opt in OPTIONS:
        assert f"| `{opt.key}` |" in docs and f"{opt.key} = " in config_reference.toml()
    assert config_reference.main(["--check"]) == 0


def test_the_dataclass_defaults_the_loader_and_the_example_agree(monkeypatch):
    """No file, the example file (every declared default written out) and the dataclasses' own defaults make the
    same configuration."""
    for name in ("DAOP_STATE_DIR", "STATE_DIRECTORY", "XDG_STATE_HOME", "CREDENTIALS_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    cfg = load_config(None)
    assert load_config(REPO / "examples" / "agent.toml") == cfg
    assert Config(device_id=cfg.device_id, state_dir=cfg.state_dir) == cfg
    assert cfg.limits.max_monitors_per_owner == option("limits.max_monitors_per_owner").default == 100


def test_every_declared_key_is_read_and_every_key_read_is_declared(tmp_path: Path):
    assert set(SECTIONS) == {o.section for o in OPTIONS}
    assert {f.name for f in fields(Limits)} <= {o.key for o in OPTIONS if o.section == "limits"}
    for opt in OPTIONS:
        value = opt.default if opt.default is not None else opt.example
        path = write(tmp_path, f"[{opt.section}]\n{opt.key} = {shown(value)}\n")
        try:
            load_config(path, {"state_dir": str(tmp_path)})
        except BadInput as exc:  # a TLS file that is not there, say; never an unknown key
            assert "unknown" not in str(exc), opt.name
    with pytest.raises(KeyError):
        option("agent.not_declared")


def test_run_help_shows_the_declared_defaults():
    result = subprocess.run([sys.executable, "-m", "agent", "run", "--help"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    text = " ".join(result.stdout.split())
    for name in ("agent.sample_interval_s", "broker.protocol", "broker.session_expiry_s", "agent.sysfs_root"):
        assert str(option(name).default) in text, name
    assert f"(default {option('agent.sample_interval_s').default})" in text


def _edges(valid: str, integer: bool) -> tuple[list[float], list[float]]:
    """Values the declaration's `valid` says are accepted, and values just beyond them that it says are not."""
    step = 1 if integer else 0.01
    words = valid.split()
    if valid == "above 0":
        return [1], [0, -1]
    if valid.endswith(" or more"):
        low = float(words[0])
        return [low], [low - step]
    if valid.startswith("0 to below "):
        high = float(words[-1])
        return [0, high - step], [-step, high]
    if len(words) == 3 and words[1] == "to":
        low, high = float(words[0]), float(words[2])
        return [low, high], [low - step, high + step]
    return [], []


def test_the_declared_bounds_are_the_loaders(tmp_path: Path):
    """Each numeric key's declared range (as the reference shows it) is what the loader accepts: its edges load,
    one step beyond them is one clear line."""
    checked = 0
    for opt in OPTIONS:
        integer = opt.kinds == (int,)
        good, bad = _edges(opt.valid, integer)
        if opt.kinds in ((int,), (int, float)) and opt.valid and opt.valid != "at least max_request_bytes":
            assert good and bad, f"{opt.name}: the test cannot read {opt.valid!r}"
        for value, accepted in [(v, True) for v in good] + [(v, False) for v in bad]:
            shown_value = str(int(value)) if integer or value == int(value) else repr(value)
            path = write(tmp_path, f"[{opt.section}]\n{opt.key} = {shown_value}\n")
            if accepted:
                load_config(path, {"state_dir": str(tmp_path)})
            else:
                with pytest.raises(BadInput) as info:
                    load_config(path, {"state_dir": str(tmp_path)})
                assert "\n" not in str(info.value), opt.name
            checked += 1
    assert checked > 60  # every numeric key, not none
