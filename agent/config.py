"""The agent's configuration: defaults, then a TOML file, then command-line flags.

Each key is declared once, in `OPTIONS` (its type, default, accepted values and meaning): the loader takes
its defaults from there, and docs/configuration.md's key tables and examples/agent.toml are generated from it
(agent/config_reference.py). A default held by a dataclass here or in monitors/ is referenced, not repeated.

Every mistake is a `BadInput` with one clear line (the CLI exits 2), so a
typo in the unit's config file never turns into a crash loop of tracebacks.
"""

from __future__ import annotations

import json
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
from monitors.privacy import MAX_JITTER, PrivacyRules
from monitors.speed.refresh_policy import REFRESH_BACKOFF
from monitors.table import MonitorRules

MiB = 1 << 20
PROTOCOLS = ("5", "3.1.1")  # the MQTT versions the agent speaks
MAX_BROKERS = 16  # broker URLs to fail over between
CALIBRATIONS = ("full", "quick")  # full: a quick calibration found at start is redone in full, in the background
SAMPLE_INTERVAL_S = (0.01, 3600)  # the accepted sample intervals, in seconds
ESTIMATE_WORKERS = (1, 16)
MIN_WORKER_MEMORY_MB = 512  # a worker holds about 300 MB of address space before it reads anything
MAX_SESSION_EXPIRY_S = 0xFFFFFFFF  # MQTT v5's Session Expiry Interval is four bytes


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
    estimate_idle_s: float = 60.0
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


@dataclass(frozen=True)
class Option:
    """One configuration key, declared once: its default and its documentation. `load_config` takes its
    type and default from here; docs/configuration.md's reference and examples/agent.toml are generated from
    here (`python -m agent.config_reference`, checked by tests/test_agent_config.py).

    A new key: its field (with its default) in the dataclass that holds it, one `Option` below that references
    that default, one `_take` in `load_config`; then `python -m agent.config_reference --write`."""

    section: str
    key: str
    kinds: tuple[type, ...]  # the TOML types accepted
    default: Any  # what an absent key means; None: unset (`unset` says what happens then)
    doc: str  # one line: what it does
    valid: str = ""  # the values accepted beyond the type, as the reference shows them
    unset: str = ""  # the default in words, where it is unset or computed (then after `default`, `or`)
    example: Any = None  # examples/agent.toml's value for a key without a default (shown commented out)
    flag: str = ""  # the `daop-agent run` flag that overrides it

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


SECTIONS = {  # the TOML tables, in the order of the reference, and what each holds
    "agent": "the agent itself",
    "broker": "the MQTT broker the agent connects to",
    "monitors": "how monitors answer (docs/mqtt.md \"Monitors and `seq`\")",
    "limits": "how much the agent accepts (the \"Limits\" section below)",
    "policy": "user rules under which nothing runs locally: meetsRequirement false, apps offload",
    "privacy": "what one client can learn by asking (docs/security.md \"Probing\")",
    "homeassistant": "Home Assistant MQTT discovery (docs/integrations.md)",
    "metrics": "Prometheus metrics (docs/integrations.md)",
}

_NUMBER, _INT, _STR, _BOOL = (int, float), (int,), (str,), (bool,)
_POSITIVE = "above 0"
_PORT = "0 to 65535"

OPTIONS: tuple[Option, ...] = (
    Option("agent", "device_id", _STR, None, "topic base daop/<device_id>/", "[A-Za-z0-9_-]{1,64}",
           unset="the hostname, sanitised", example="kitchen-pi", flag="--device-id"),
    Option("agent", "state_dir", _STR, None, "monitors, calibration, the private broker's files",
           unset=STATE_DIR_HELP.removeprefix("default: "), example="/var/lib/daop-agent", flag="--state-dir"),
    Option("agent", "calibration", _STR, Config.calibration,
           "full: a quick calibration found at start is redone in full, in the background; "
           "quick: keep a quick one as it is (slow devices)", " or ".join(CALIBRATIONS), flag="--calibration"),
    Option("agent", "sample_interval_s", _NUMBER, Config.sample_interval_s,
           "seconds between device samples and monitor evaluations",
           f"{SAMPLE_INTERVAL_S[0]} to {SAMPLE_INTERVAL_S[1]}", flag="--sample-interval"),
    Option("agent", "refresh_interval_s", _NUMBER, Config.refresh_interval_s,
           "warm-refresh probe (present speed) period, in seconds; at rest it doubles up to "
           f"{REFRESH_BACKOFF}x while the state is unchanged", _POSITIVE),
    Option("agent", "sysfs_root", _STR, str(Config.sysfs_root), "the sysfs tree read (fixture trees, simulation)",
           flag="--sysfs-root"),
    Option("agent", "procfs_root", _STR, str(Config.procfs_root), "the procfs tree read", flag="--procfs-root"),
    Option("agent", "estimate_workers", _INT, Config.estimate_workers,
           "worker processes that import and plan request graphs", f"{ESTIMATE_WORKERS[0]} to {ESTIMATE_WORKERS[1]}"),
    Option("agent", "estimate_idle_s", _NUMBER, Config.estimate_idle_s,
           "seconds without a request after which the estimator's workers leave (the next request starts them "
           "again, in about a second)", _POSITIVE),
    Option("agent", "local_broker", _BOOL, Config.local_broker,
           "true: start a private Mosquitto on 127.0.0.1 for this agent, stopped on exit", flag="--local-broker"),
    Option("agent", "web_port", _INT, Config.web_port,
           "with local_broker: its MQTT-over-WebSockets port for web pages, password required "
           "(daop-agent web-credentials; docs/web.md)", _PORT, unset="the local broker's port + 1; 0: none",
           example=18831, flag="--web-port"),

    Option("broker", "url", _STR, Broker().url,
           "mqtt://[user[:pass]@]host[:port] (1883) or mqtts://... (8883); credentials in the URL win",
           flag="--broker"),
    Option("broker", "urls", (list,), None,
           "a cluster's nodes, tried in turn: the next one after a loss (docs/fleet.md); not with url",
           f"1 to {MAX_BROKERS} URLs", unset="[url]", example=["mqtt://node1:1883", "mqtt://node2:1883"],
           flag="--broker (repeated)"),
    Option("broker", "protocol", _STR, Broker.protocol,
           "the MQTT version; 3.1.1 for brokers without v5 (RabbitMQ 3.x)", " or ".join(PROTOCOLS),
           flag="--protocol"),
    Option("broker", "session_expiry_s", _INT, Broker.session_expiry_s,
           "keep the agent's session on the broker this long after a loss (docs/fleet.md); 0: a clean session "
           "each connect", f"0 to {MAX_SESSION_EXPIRY_S}", flag="--session-expiry"),
    Option("broker", "username", _STR, Broker.username,
           "with the documented ACL, the username is the device id", example="kitchen-pi"),
    Option("broker", "password", _STR, Broker.password, "the password; never logged",
           unset="password_file, else the systemd credential broker-password", example="..."),
    Option("broker", "password_file", _STR, None, "a file holding the password",
           example="/etc/daop-agent/broker-password"),
    Option("broker", "ca_file", _STR, Broker.ca_file, "TLS (mqtts://): the broker's CA",
           example="/etc/daop-agent/ca.crt"),
    Option("broker", "cert_file", _STR, Broker.cert_file, "TLS client certificate (with key_file)",
           example="/etc/daop-agent/client.crt"),
    Option("broker", "key_file", _STR, Broker.key_file, "TLS client key (with cert_file)",
           example="/etc/daop-agent/client.key"),
    Option("broker", "client_id", _STR, Broker.client_id, "the agent's MQTT client id",
           unset="daop-agent-<device_id>", example="daop-agent-kitchen-pi"),
    Option("broker", "keepalive_s", _INT, Broker.keepalive_s, "MQTT keep-alive, in seconds", _POSITIVE),

    Option("monitors", "hysteresis_margin", _NUMBER, MonitorRules.margin,
           "leave 'meets' at bound*(1+m), come back below bound*(1-m)", "0 to below 1"),
    Option("monitors", "min_dwell_s", _NUMBER, MonitorRules.dwell_s, "keep a new value at least this long, in seconds",
           "0 or more"),
    Option("monitors", "max_events_per_minute", _INT, MonitorRules.max_events_per_minute, "per monitor",
           "1 or more"),

    Option("limits", "max_monitors", _INT, AgentLimits.max_monitors, "monitors per device", _POSITIVE),
    Option("limits", "max_monitors_per_owner", _INT, AgentLimits.max_monitors_per_owner,
           "monitors one owner (a client scope, or the shared topics) may hold", _POSITIVE),
    Option("limits", "max_request_bytes", _INT, AgentLimits.max_request_bytes,
           "one MQTT request (the broker's max_packet_size: examples/mosquitto.conf)", _POSITIVE),
    Option("limits", "max_pending_bytes", _INT, AgentLimits.max_pending_bytes,
           "request bytes held at once; beyond: busy", "at least max_request_bytes",
           unset="2 x max_request_bytes where that is larger"),
    Option("limits", "worker_memory_mb", _INT, AgentLimits.worker_memory_mb,
           "address space of each estimator worker, in MB", f"{MIN_WORKER_MEMORY_MB} or more"),
    Option("limits", "estimate_timeout_s", _NUMBER, AgentLimits.estimate_timeout_s,
           "importing and planning one request's graph, in seconds", _POSITIVE),
    # The graph limits: read by monitors/graphs/limits.py (Limits.from_mapping), which holds their defaults.
    Option("limits", "max_nodes", _NUMBER, Limits.max_nodes, "graph nodes, subgraphs included", _POSITIVE),
    Option("limits", "max_tensor_elements", _NUMBER, Limits.max_tensor_elements, "elements of any one tensor",
           _POSITIVE),
    Option("limits", "max_dim", _NUMBER, Limits.max_dim, "any one dimension of a tensor", _POSITIVE),
    Option("limits", "max_rank", _NUMBER, Limits.max_rank, "dimensions of any one tensor", _POSITIVE),
    Option("limits", "max_total_flops", _NUMBER, Limits.max_total_flops,
           "2 x MACs of MatMul/Gemm/Conv/ConvTranspose/attention/RNN", _POSITIVE),
    Option("limits", "max_graph_depth", _NUMBER, Limits.max_graph_depth,
           "nesting of subgraphs (If/Loop/Scan bodies)", _POSITIVE),
    Option("limits", "max_file_bytes", _NUMBER, Limits.max_file_bytes,
           "model bytes passed inline (MQTT); a path may be larger", _POSITIVE),
    Option("limits", "max_stripped_bytes", _NUMBER, Limits.max_stripped_bytes,
           "the model once weights are stripped (topology and small tensors)", _POSITIVE),
    Option("limits", "max_tensors", _NUMBER, Limits.max_tensors, "distinct tensor names", _POSITIVE),

    Option("policy", "battery_floor_percent", _NUMBER, Policy.battery_floor_percent,
           "on battery below this level, nothing runs locally", "0 to 100", unset="none", example=20),
    Option("policy", "battery_release_percent", _NUMBER, Policy.battery_release_percent,
           "the floor lifts again at floor + this, so a battery at the floor does not flap"),
    Option("policy", "power_saver", _BOOL, Policy.power_saver,
           "true: nothing runs locally while the power profile is one of power_saver_profiles"),
    Option("policy", "power_saver_profiles", (list,), list(Policy.power_saver_profiles),
           "platform profile / power-profiles-daemon names that mean power saving", "a list of strings"),

    Option("privacy", "enabled", _BOOL, PrivacySettings.enabled,
           "false: every request priced at the live speed against the contract's boundaries"),
    Option("privacy", "jitter", _NUMBER, PrivacyRules.jitter,
           "each tier boundary moved by up to this fraction, per client and period; 0: none", f"0 to {MAX_JITTER}"),
    Option("privacy", "period_s", _NUMBER, PrivacyRules.period_s,
           "how long a client's moved boundaries hold, in seconds", _POSITIVE),
    Option("privacy", "hysteresis", _NUMBER, PrivacyRules.hysteresis,
           "answers follow the live speed only when it moves this fraction; 0: at once", "0 to below 1"),
    Option("privacy", "burst", _INT, PrivacySettings.burst,
           "requests telling of the speed (estimate, meets, monitors/create) per client at once", _POSITIVE),
    Option("privacy", "per_minute", _NUMBER, PrivacySettings.per_minute,
           "... refilled at this rate; beyond: the error rate_limited with retryAfterS", _POSITIVE),
    Option("privacy", "max_clients", _INT, PrivacySettings.max_clients,
           "budgets kept; beyond, the longest unseen client's is forgotten", _POSITIVE),

    Option("homeassistant", "enabled", _BOOL, HomeAssistantSettings.enabled,
           "true: each monitor a binary sensor \"can run locally\""),
    Option("homeassistant", "discovery_prefix", _STR, HomeAssistantSettings.discovery_prefix,
           "Home Assistant's discovery topic prefix", "a topic without wildcards"),

    Option("metrics", "port", _INT, MetricsSettings.port, "the endpoint's port (e.g. 9464); 0: none", _PORT),
    Option("metrics", "address", _STR, MetricsSettings.address, "the address it listens on (loopback)"),
    Option("metrics", "device_state", _BOOL, MetricsSettings.device_state,
           "true: also slow-down, temperature, battery, load (they fingerprint the device)"),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The declaration of `section.key` (a KeyError names an undeclared one)."""
    return _BY_NAME[name]


def shown(value: Any) -> str:
    """A value as TOML writes it (the example file, the reference, the CLI's help)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return repr(value)


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


def _take(table: dict[str, Any], section: str, key: str) -> Any:
    """The key's value from its table, checked against its declared type, else its declared default."""
    opt = option(f"{section}.{key}")
    kinds = opt.kinds
    if key not in table:
        return opt.default
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
    known_sections = set(SECTIONS)
    unknown = set(data) - known_sections
    if unknown:
        raise BadInput(f"config: unknown section{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))}; "
                       f"known: {', '.join(sorted(known_sections))}")
    over = {k: v for k, v in (overrides or {}).items() if v is not None}

    a = _table(data, "agent")
    device_id = check_device_id(over.get("device_id", _take(a, "agent", "device_id")
                                         or default_device_id()))
    state_dir = _take(a, "agent", "state_dir")  # taken before the flag, so a flag over the file is no unknown key
    state_dir = Path(over.get("state_dir") or state_dir or default_state_dir())
    sample = float(over.get("sample_interval_s", _take(a, "agent", "sample_interval_s")))
    low, high = SAMPLE_INTERVAL_S
    if not (low <= sample <= high):
        raise BadInput(f"sample interval must be between {low} and {high} seconds, not {sample}")
    refresh = _positive(float(_take(a, "agent", "refresh_interval_s")), "agent.refresh_interval_s")
    sysfs, procfs = _take(a, "agent", "sysfs_root"), _take(a, "agent", "procfs_root")
    sysfs, procfs = Path(over.get("sysfs_root") or sysfs), Path(over.get("procfs_root") or procfs)
    workers = int(_take(a, "agent", "estimate_workers"))
    estimate_idle = _positive(float(_take(a, "agent", "estimate_idle_s")), "agent.estimate_idle_s")
    if not ESTIMATE_WORKERS[0] <= workers <= ESTIMATE_WORKERS[1]:
        raise BadInput(f"config: agent.estimate_workers must be {ESTIMATE_WORKERS[0]} to {ESTIMATE_WORKERS[1]}, "
                       f"not {workers}")
    local_broker = bool(over.get("local_broker", _take(a, "agent", "local_broker")))
    web_port = over.get("web_port", _take(a, "agent", "web_port"))
    if web_port is not None and not 0 <= web_port < 65536:
        raise BadInput(f"web port must be 1 to 65535 (0: no WebSockets listener), not {web_port}")
    calibration = over.get("calibration", _take(a, "agent", "calibration"))
    if calibration not in CALIBRATIONS:
        raise BadInput(f"config: agent.calibration must be {' or '.join(CALIBRATIONS)}, not {calibration!r}")
    _no_leftovers(a, "agent")

    b = _table(data, "broker")
    broker = Broker(
        username=_take(b, "broker", "username"),
        password=_take(b, "broker", "password"),
        ca_file=_take(b, "broker", "ca_file"),
        cert_file=_take(b, "broker", "cert_file"),
        key_file=_take(b, "broker", "key_file"),
        client_id=_take(b, "broker", "client_id"),
        keepalive_s=int(_positive(_take(b, "broker", "keepalive_s"), "broker.keepalive_s")),
    )
    password_file = _take(b, "broker", "password_file")
    if password_file:
        try:
            broker = replace(broker, password=Path(password_file).read_text(encoding="utf-8").strip())
        except OSError as exc:
            raise BadInput(f"cannot read broker password file {password_file}: {exc.strerror or exc}") from None
    if broker.password is None:
        broker = replace(broker, password=credential(PASSWORD_CREDENTIAL))
    protocol = str(over.get("protocol", _take(b, "broker", "protocol")))
    if protocol not in PROTOCOLS:
        raise BadInput(f"broker protocol must be {' or '.join(PROTOCOLS)}, not {protocol!r}")
    expiry = over.get("session_expiry_s", _take(b, "broker", "session_expiry_s"))
    if not 0 <= expiry <= MAX_SESSION_EXPIRY_S:
        raise BadInput(f"broker session expiry must be 0 to {MAX_SESSION_EXPIRY_S} seconds, not {expiry}")
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
            margin=float(_take(m, "monitors", "hysteresis_margin")),
            dwell_s=float(_take(m, "monitors", "min_dwell_s")),
            max_events_per_minute=int(_take(m, "monitors", "max_events_per_minute")),
        )
    except ValueError as exc:
        raise BadInput(f"config: [monitors] {exc}") from None
    _no_leftovers(m, "monitors")

    lim = _table(data, "limits")
    max_monitors = int(_positive(_take(lim, "limits", "max_monitors"), "limits.max_monitors"))
    def positive(key: str) -> float:
        return _positive(_take(lim, "limits", key), f"limits.{key}")

    max_request = int(positive("max_request_bytes"))
    timeout = float(positive("estimate_timeout_s"))
    pending = int(_positive(_take(lim, "limits", "max_pending_bytes") if "max_pending_bytes" in lim
                            else max(option("limits.max_pending_bytes").default, 2 * max_request),
                            "limits.max_pending_bytes"))
    if pending < max_request:
        raise BadInput(f"config: limits.max_pending_bytes ({pending}) must be at least limits.max_request_bytes "
                       f"({max_request})")
    worker_mb = int(_positive(_take(lim, "limits", "worker_memory_mb"),
                              "limits.worker_memory_mb"))
    if worker_mb < MIN_WORKER_MEMORY_MB:
        raise BadInput(f"config: limits.worker_memory_mb must be at least {MIN_WORKER_MEMORY_MB}, not {worker_mb}")
    per_owner = int(positive("max_monitors_per_owner"))
    graph_limits = Limits.from_mapping(lim)  # the rest are graph limits; unknown keys are refused there
    limits = AgentLimits(max_monitors, max_request, timeout, graph_limits, pending, worker_mb, per_owner)

    p = _table(data, "policy")
    floor = _take(p, "policy", "battery_floor_percent")
    if floor is not None and not 0 <= floor <= 100:
        raise BadInput(f"config: policy.battery_floor_percent must be 0 to 100, not {floor}")
    release = float(_take(p, "policy", "battery_release_percent"))
    saver = _take(p, "policy", "power_saver")
    profiles = _take(p, "policy", "power_saver_profiles")
    if not all(isinstance(x, str) for x in profiles):
        raise BadInput("config: policy.power_saver_profiles must be a list of strings")
    _no_leftovers(p, "policy")
    policy = Policy(None if floor is None else float(floor), release, saver, tuple(profiles))

    return Config(homeassistant=_homeassistant(_table(data, "homeassistant")),
                  metrics=_metrics(_table(data, "metrics")), device_id=device_id, state_dir=state_dir,
                  brokers=brokers, sample_interval_s=sample,
                  refresh_interval_s=refresh, sysfs_root=sysfs, procfs_root=procfs, estimate_workers=workers,
                  estimate_idle_s=estimate_idle,
                  rules=rules, limits=limits, policy=policy, local_broker=local_broker, web_port=web_port,
                  calibration=calibration, privacy=_privacy(_table(data, "privacy")))


def _broker_urls(b: dict[str, Any], flag: str | list[str] | None) -> list[str]:
    """The broker URLs in order: the flags' (repeated --broker), else `url` or `urls` from the file."""
    both, given = "url" in b and "urls" in b, "urls" in b
    url, urls = _take(b, "broker", "url"), _take(b, "broker", "urls")
    if both:
        raise BadInput("config: give broker.url or broker.urls, not both")
    if flag is not None:
        urls = [flag] if isinstance(flag, str) else list(flag)
    elif not given:
        urls = [url]
    if not urls or not all(isinstance(u, str) for u in urls):
        raise BadInput("config: broker.urls must be a non-empty list of URLs")
    if len(urls) > MAX_BROKERS:
        raise BadInput(f"at most {MAX_BROKERS} broker URLs, not {len(urls)}")
    return urls


def _homeassistant(t: dict[str, Any]) -> HomeAssistantSettings:
    enabled = _take(t, "homeassistant", "enabled")
    prefix = _take(t, "homeassistant", "discovery_prefix")
    if not prefix or any(c in prefix for c in "+#\0") or prefix.startswith("/") or prefix.endswith("/"):
        raise BadInput(f"config: homeassistant.discovery_prefix must be a topic without wildcards, not {prefix!r}")
    _no_leftovers(t, "homeassistant")
    return HomeAssistantSettings(enabled, prefix)


def _metrics(t: dict[str, Any]) -> MetricsSettings:
    port = _take(t, "metrics", "port")
    if not 0 <= port < 65536:
        raise BadInput(f"config: metrics.port must be 1 to 65535 (0: no metrics), not {port}")
    address = _take(t, "metrics", "address")
    device_state = _take(t, "metrics", "device_state")
    _no_leftovers(t, "metrics")
    return MetricsSettings(port, address, device_state)


def _privacy(t: dict[str, Any]) -> PrivacySettings:
    enabled = _take(t, "privacy", "enabled")
    try:
        rules = PrivacyRules(
            jitter=float(_take(t, "privacy", "jitter")),
            period_s=float(_take(t, "privacy", "period_s")),
            hysteresis=float(_take(t, "privacy", "hysteresis")),
        )
    except ValueError as exc:
        raise BadInput(f"config: [privacy] {exc}") from None
    burst = int(_positive(_take(t, "privacy", "burst"), "privacy.burst"))
    per_minute = float(_positive(_take(t, "privacy", "per_minute"),
                                 "privacy.per_minute"))
    max_clients = int(_positive(_take(t, "privacy", "max_clients"),
                                "privacy.max_clients"))
    _no_leftovers(t, "privacy")
    return PrivacySettings(enabled, rules, burst, per_minute, max_clients)
