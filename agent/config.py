"""The agent's configuration: defaults, then a TOML file, then command-line flags.

Every mistake is a `BadInput` with one clear line (the CLI exits 2), so a
typo in the unit's config file never turns into a crash loop of tracebacks.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import daop_client.address
from daop_client.address import default_device_id  # one rule for the agent and its clients
from monitors.errors import BadInput
from monitors.graphs.limits import Limits
from monitors.privacy import PrivacyRules
from monitors.table import MonitorRules

MiB = 1 << 20
PROTOCOLS = ("5", "3.1.1")  # the MQTT versions the agent speaks
MAX_BROKERS = 16  # broker URLs to fail over between
CALIBRATIONS = ("full", "quick")  # full: a quick calibration found at start is redone in full, in the background


@dataclass(frozen=True)
class Broker:
    host: str = "localhost"
    port: int = 1883
    tls: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    client_id: str | None = None  # default: daop-agent-<device_id>
    keepalive_s: int = 30
    protocol: str = "5"  # one of PROTOCOLS; "3.1.1" for brokers without v5 (RabbitMQ 3.x)
    session_expiry_s: int = 0  # 0: a clean session each connect; above 0: the broker keeps it (docs/fleet.md)

    @property
    def url(self) -> str:
        """The broker address without credentials (safe to log)."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


@dataclass(frozen=True)
class Policy:
    """User rules that make `meetsRequirement` false whatever the estimate says.

    The cause stays on the device (logged), only the boolean goes out.
    """

    battery_floor_percent: float | None = None  # on battery below this: run nothing locally
    battery_release_percent: float = 3.0         # hysteresis above the floor before it lifts
    power_saver: bool = False                    # in a power-saver profile: run nothing locally
    power_saver_profiles: tuple[str, ...] = ("low-power", "power-saver", "quiet", "cool")


@dataclass(frozen=True)
class AgentLimits:
    max_monitors: int = 1000
    max_request_bytes: int = 16 * MiB
    estimate_timeout_s: float = 20.0
    graph: Limits = field(default_factory=Limits)
    # Bytes of requests held at once (queued and being parsed); beyond it a request is answered `busy` at once.
    # Default: the larger of 64 MiB and two requests of max_request_bytes.
    max_pending_bytes: int = 64 * MiB
    # Address space (RLIMIT_AS) of each helper process that reads a request's payload or graph: a hostile graph
    # fails there, with an error answer, instead of taking the device's memory.
    worker_memory_mb: int = 1024
    # Monitors one owner (a client scope, or the shared topics) may hold: no one app takes the device's all.
    max_monitors_per_owner: int = 100


@dataclass(frozen=True)
class HomeAssistantSettings:
    """Home Assistant MQTT discovery (agent/homeassistant.py)."""

    enabled: bool = False
    discovery_prefix: str = "homeassistant"

    @property
    def status_topic(self) -> str:
        """Where Home Assistant says `online` when it (re)starts: the cue to announce again."""
        return f"{self.discovery_prefix}/status"


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus endpoint (agent/metrics.py)."""

    port: int = 0  # 0: no metrics endpoint
    address: str = "127.0.0.1"
    device_state: bool = False  # also the device's slow-down, temperature, battery and load (they fingerprint)


@dataclass(frozen=True)
class PrivacySettings:
    """What one client may learn by asking (docs/security.md "Probing"): the rules on what it is shown
    (monitors/privacy.py) and its request budget (agent/ratelimit.py)."""

    enabled: bool = True
    rules: PrivacyRules = field(default_factory=PrivacyRules)
    burst: int = 240  # requests answered with a tier or a boolean, at once, per client
    per_minute: float = 30.0  # ... and refilled at this rate
    max_clients: int = 10_000  # budgets kept; beyond, the longest unseen client's is forgotten


@dataclass(frozen=True)
class Config:
    device_id: str
    state_dir: Path
    brokers: tuple[Broker, ...] = (Broker(),)  # tried in turn: the next one after a loss (a cluster's nodes)
    sample_interval_s: float = 1.0
    refresh_interval_s: float = 60.0
    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    estimate_workers: int = 2
    rules: MonitorRules = field(default_factory=MonitorRules)
    limits: AgentLimits = field(default_factory=AgentLimits)
    policy: Policy = field(default_factory=Policy)
    local_broker: bool = False
    web_port: int | None = None  # the local broker's WebSockets port; None: its MQTT port + 1; 0: none
    calibration: str = "full"  # one of CALIBRATIONS
    homeassistant: HomeAssistantSettings = field(default_factory=HomeAssistantSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)

    @property
    def broker(self) -> Broker:
        """The first broker: the one tried first."""
        return self.brokers[0]

    @property
    def client_id(self) -> str:
        return self.broker.client_id or f"daop-agent-{self.device_id}"

    @property
    def base_topic(self) -> str:
        return f"daop/{self.device_id}/"


PASSWORD_CREDENTIAL = "broker-password"  # systemd's LoadCredential= name for the broker password


STATE_DIR_HELP = "default: $DAOP_STATE_DIR, else $STATE_DIRECTORY (systemd), else ~/.local/state/daop-agent"


def default_state_dir() -> Path:
    """The one default of every command: $DAOP_STATE_DIR, else systemd's $STATE_DIRECTORY, else the XDG state
    home."""
    if os.environ.get("DAOP_STATE_DIR"):
        return Path(os.environ["DAOP_STATE_DIR"])
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "daop-agent"


def credential(name: str) -> str | None:
    """A credential systemd passed (LoadCredential=, SetCredential=) in $CREDENTIALS_DIRECTORY; None without
    one. An empty one (the unit's SetCredential= default, where no file was there to load) is none too."""
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return None
    path = Path(folder) / name
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadInput(f"cannot read credential {path}: {exc.strerror or exc}") from None
    return value or None


def check_device_id(value: Any) -> str:
    try:
        return daop_client.address.check_device_id(value)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def parse_broker_url(url: str, base: Broker | None = None) -> Broker:
    """mqtt://[user[:pass]@]host[:port] or mqtts://...; credentials in the URL win."""
    base = base or Broker()
    try:
        address = daop_client.address.parse_broker_url(url)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return replace(base, host=address.host, port=address.port, tls=address.tls,
                   username=address.username or base.username, password=address.password or base.password)


def _table(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise BadInput(f"config: [{name}] must be a table")
    return dict(value)


def _take(table: dict[str, Any], section: str, key: str, kinds: tuple[type, ...], default: Any) -> Any:
    if key not in table:
        return default
    value = table.pop(key)
    if isinstance(value, bool) and bool not in kinds:
        raise BadInput(f"config: {section}.{key} must be {'/'.join(k.__name__ for k in kinds)}, not {value!r}")
    if not isinstance(value, kinds):
        raise BadInput(f"config: {section}.{key} must be {'/'.join(k.__name__ for k in kinds)}, not {value!r}")
    return value


def _positive(value: float, what: str) -> float:
    if not value > 0:
        raise BadInput(f"config: {what} must be positive, not {value!r}")
    return value


def _no_leftovers(table: dict[str, Any], section: str) -> None:
    if table:
        raise BadInput(f"config: unknown key{'s' if len(table) > 1 else ''} in [{section}]: {', '.join(sorted(table))}")


def load_config(path: str | os.PathLike[str] | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file at `path`, then `overrides` (flags; None values ignored).

    Override keys: broker (URL or list of URLs), protocol, session_expiry_s, device_id, state_dir, sysfs_root,
    procfs_root, sample_interval_s, local_broker, web_port, calibration.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise BadInput(f"cannot read config {path}: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"config {path} is not valid TOML: {exc}") from None
    known_sections = {"agent", "broker", "monitors", "limits", "policy", "homeassistant", "metrics", "privacy"}
    unknown = set(data) - known_sections
    if unknown:
        raise BadInput(f"config: unknown section{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))}; "
                       f"known: {', '.join(sorted(known_sections))}")
    over = {k: v for k, v in (overrides or {}).items() if v is not None}

    a = _table(data, "agent")
    device_id = check_device_id(over.get("device_id", _take(a, "agent", "device_id", (str,), None)
                                         or default_device_id()))
    state_dir = Path(over.get("state_dir") or _take(a, "agent", "state_dir", (str,), None) or default_state_dir())
    sample = float(over.get("sample_interval_s", _take(a, "agent", "sample_interval_s", (int, float), 1.0)))
    if not (0.01 <= sample <= 3600):
        raise BadInput(f"sample interval must be between 0.01 and 3600 seconds, not {sample}")
    refresh = _positive(float(_take(a, "agent", "refresh_interval_s", (int, float), 60.0)), "agent.refresh_interval_s")
    sysfs = Path(over.get("sysfs_root") or _take(a, "agent", "sysfs_root", (str,), "/sys"))
    procfs = Path(over.get("procfs_root") or _take(a, "agent", "procfs_root", (str,), "/proc"))
    workers = int(_take(a, "agent", "estimate_workers", (int,), 2))
    if not 1 <= workers <= 16:
        raise BadInput(f"config: agent.estimate_workers must be 1 to 16, not {workers}")
    local_broker = bool(over.get("local_broker", _take(a, "agent", "local_broker", (bool,), False)))
    web_port = over.get("web_port", _take(a, "agent", "web_port", (int,), None))
    if web_port is not None and not 0 <= web_port < 65536:
        raise BadInput(f"web port must be 1 to 65535 (0: no WebSockets listener), not {web_port}")
    calibration = over.get("calibration", _take(a, "agent", "calibration", (str,), "full"))
    if calibration not in CALIBRATIONS:
        raise BadInput(f"config: agent.calibration must be {' or '.join(CALIBRATIONS)}, not {calibration!r}")
    _no_leftovers(a, "agent")

    b = _table(data, "broker")
    broker = Broker(
        username=_take(b, "broker", "username", (str,), None),
        password=_take(b, "broker", "password", (str,), None),
        ca_file=_take(b, "broker", "ca_file", (str,), None),
        cert_file=_take(b, "broker", "cert_file", (str,), None),
        key_file=_take(b, "broker", "key_file", (str,), None),
        client_id=_take(b, "broker", "client_id", (str,), None),
        keepalive_s=int(_positive(_take(b, "broker", "keepalive_s", (int,), 30), "broker.keepalive_s")),
    )
    password_file = _take(b, "broker", "password_file", (str,), None)
    if password_file:
        try:
            broker = replace(broker, password=Path(password_file).read_text(encoding="utf-8").strip())
        except OSError as exc:
            raise BadInput(f"cannot read broker password file {password_file}: {exc.strerror or exc}") from None
    if broker.password is None:
        broker = replace(broker, password=credential(PASSWORD_CREDENTIAL))
    protocol = str(over.get("protocol", _take(b, "broker", "protocol", (str,), "5")))
    if protocol not in PROTOCOLS:
        raise BadInput(f"broker protocol must be {' or '.join(PROTOCOLS)}, not {protocol!r}")
    expiry = over.get("session_expiry_s", _take(b, "broker", "session_expiry_s", (int,), 0))
    if not 0 <= expiry <= 0xFFFFFFFF:
        raise BadInput(f"broker session expiry must be 0 to 4294967295 seconds, not {expiry}")
    broker = replace(broker, protocol=protocol, session_expiry_s=int(expiry))
    urls = _broker_urls(b, over.get("broker"))
    _no_leftovers(b, "broker")
    brokers = tuple(parse_broker_url(url, broker) for url in urls)
    if (broker.cert_file is None) != (broker.key_file is None):
        raise BadInput("config: broker.cert_file and broker.key_file go together")
    for x in brokers:
        if (broker.ca_file or broker.cert_file) and not x.tls:
            raise BadInput(f"config: TLS files given but the broker URL {x.url} is not mqtts://")
    for f in (broker.ca_file, broker.cert_file, broker.key_file):
        if f and not Path(f).is_file():
            raise BadInput(f"config: TLS file {f} does not exist")

    m = _table(data, "monitors")
    try:
        rules = MonitorRules(
            margin=float(_take(m, "monitors", "hysteresis_margin", (int, float), 0.10)),
            dwell_s=float(_take(m, "monitors", "min_dwell_s", (int, float), 2.0)),
            max_events_per_minute=int(_take(m, "monitors", "max_events_per_minute", (int,), 6)),
        )
    except ValueError as exc:
        raise BadInput(f"config: [monitors] {exc}") from None
    _no_leftovers(m, "monitors")

    lim = _table(data, "limits")
    max_monitors = int(_positive(_take(lim, "limits", "max_monitors", (int,), 1000), "limits.max_monitors"))
    def positive(key: str, kinds: tuple[type, ...], default: float) -> float:
        return _positive(_take(lim, "limits", key, kinds, default), f"limits.{key}")

    max_request = int(positive("max_request_bytes", (int,), 16 * MiB))
    timeout = float(positive("estimate_timeout_s", (int, float), 20.0))
    pending = int(positive("max_pending_bytes", (int,), max(64 * MiB, 2 * max_request)))
    if pending < max_request:
        raise BadInput(f"config: limits.max_pending_bytes ({pending}) must be at least limits.max_request_bytes "
                       f"({max_request})")
    worker_mb = int(_positive(_take(lim, "limits", "worker_memory_mb", (int,), 1024),
                              "limits.worker_memory_mb"))
    if worker_mb < 512:  # a worker holds about 300 MB of address space before it reads anything
        raise BadInput(f"config: limits.worker_memory_mb must be at least 512, not {worker_mb}")
    per_owner = int(positive("max_monitors_per_owner", (int,), 100))
    graph_limits = Limits.from_mapping(lim)  # the rest are graph limits; unknown keys are refused there
    limits = AgentLimits(max_monitors, max_request, timeout, graph_limits, pending, worker_mb, per_owner)

    p = _table(data, "policy")
    floor = _take(p, "policy", "battery_floor_percent", (int, float), None)
    if floor is not None and not 0 <= floor <= 100:
        raise BadInput(f"config: policy.battery_floor_percent must be 0 to 100, not {floor}")
    release = float(_take(p, "policy", "battery_release_percent", (int, float), 3.0))
    saver = _take(p, "policy", "power_saver", (bool,), False)
    profiles = _take(p, "policy", "power_saver_profiles", (list,), list(Policy.power_saver_profiles))
    if not all(isinstance(x, str) for x in profiles):
        raise BadInput("config: policy.power_saver_profiles must be a list of strings")
    _no_leftovers(p, "policy")
    policy = Policy(None if floor is None else float(floor), release, saver, tuple(profiles))

    return Config(homeassistant=_homeassistant(_table(data, "homeassistant")),
                  metrics=_metrics(_table(data, "metrics")), device_id=device_id, state_dir=state_dir,
                  brokers=brokers, sample_interval_s=sample,
                  refresh_interval_s=refresh, sysfs_root=sysfs, procfs_root=procfs, estimate_workers=workers,
                  rules=rules, limits=limits, policy=policy, local_broker=local_broker, web_port=web_port,
                  calibration=calibration, privacy=_privacy(_table(data, "privacy")))


def _broker_urls(b: dict[str, Any], flag: str | list[str] | None) -> list[str]:
    """The broker URLs in order: the flags' (repeated --broker), else `url` or `urls` from the file."""
    url = _take(b, "broker", "url", (str,), None)
    urls = _take(b, "broker", "urls", (list,), None)
    if url is not None and urls is not None:
        raise BadInput("config: give broker.url or broker.urls, not both")
    if flag is not None:
        urls = [flag] if isinstance(flag, str) else list(flag)
    elif url is not None:
        urls = [url]
    elif urls is None:
        urls = ["mqtt://localhost:1883"]
    if not urls or not all(isinstance(u, str) for u in urls):
        raise BadInput("config: broker.urls must be a non-empty list of URLs")
    if len(urls) > MAX_BROKERS:
        raise BadInput(f"at most {MAX_BROKERS} broker URLs, not {len(urls)}")
    return urls


def _homeassistant(t: dict[str, Any]) -> HomeAssistantSettings:
    enabled = _take(t, "homeassistant", "enabled", (bool,), False)
    prefix = _take(t, "homeassistant", "discovery_prefix", (str,), "homeassistant")
    if not prefix or any(c in prefix for c in "+#\0") or prefix.startswith("/") or prefix.endswith("/"):
        raise BadInput(f"config: homeassistant.discovery_prefix must be a topic without wildcards, not {prefix!r}")
    _no_leftovers(t, "homeassistant")
    return HomeAssistantSettings(enabled, prefix)


def _metrics(t: dict[str, Any]) -> MetricsSettings:
    port = _take(t, "metrics", "port", (int,), 0)
    if not 0 <= port < 65536:
        raise BadInput(f"config: metrics.port must be 1 to 65535 (0: no metrics), not {port}")
    address = _take(t, "metrics", "address", (str,), "127.0.0.1")
    device_state = _take(t, "metrics", "device_state", (bool,), False)
    _no_leftovers(t, "metrics")
    return MetricsSettings(port, address, device_state)


def _privacy(t: dict[str, Any]) -> PrivacySettings:
    enabled = _take(t, "privacy", "enabled", (bool,), True)
    try:
        rules = PrivacyRules(
            jitter=float(_take(t, "privacy", "jitter", (int, float), PrivacyRules.jitter)),
            period_s=float(_take(t, "privacy", "period_s", (int, float), PrivacyRules.period_s)),
            hysteresis=float(_take(t, "privacy", "hysteresis", (int, float), PrivacyRules.hysteresis)),
        )
    except ValueError as exc:
        raise BadInput(f"config: [privacy] {exc}") from None
    burst = int(_positive(_take(t, "privacy", "burst", (int,), PrivacySettings.burst), "privacy.burst"))
    per_minute = float(_positive(_take(t, "privacy", "per_minute", (int, float), PrivacySettings.per_minute),
                                 "privacy.per_minute"))
    max_clients = int(_positive(_take(t, "privacy", "max_clients", (int,), PrivacySettings.max_clients),
                                "privacy.max_clients"))
    _no_leftovers(t, "privacy")
    return PrivacySettings(enabled, rules, burst, per_minute, max_clients)
