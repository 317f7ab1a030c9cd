"""The agent's configuration: defaults, then a TOML file, then command-line flags.

Every mistake is a `BadInput` with one clear line (the CLI exits 2), so a
typo in the unit's config file never turns into a crash loop of tracebacks.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit

from monitors.errors import BadInput
from monitors.limits import Limits
from monitors.monitor import MonitorRules

DEVICE_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MiB = 1 << 20
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


@dataclass(frozen=True)
class Config:
    device_id: str
    state_dir: Path
    broker: Broker = field(default_factory=Broker)
    sample_interval_s: float = 1.0
    refresh_interval_s: float = 60.0
    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    estimate_workers: int = 2
    rules: MonitorRules = field(default_factory=MonitorRules)
    limits: AgentLimits = field(default_factory=AgentLimits)
    policy: Policy = field(default_factory=Policy)
    local_broker: bool = False
    calibration: str = "full"  # one of CALIBRATIONS

    @property
    def client_id(self) -> str:
        return self.broker.client_id or f"daop-agent-{self.device_id}"

    @property
    def base_topic(self) -> str:
        return f"daop/{self.device_id}/"


def default_device_id() -> str:
    """The hostname, reduced to the characters a topic level may use here."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:64].strip("-")
    return name or "device"


def default_state_dir() -> Path:
    """systemd's $STATE_DIRECTORY, else the XDG state home."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "daop-agent"


def check_device_id(value: Any) -> str:
    if not isinstance(value, str) or not DEVICE_ID_RE.match(value):
        raise BadInput(f"device id must be 1 to 64 of A-Z a-z 0-9 _ -, not {value!r}")
    return value


def parse_broker_url(url: str, base: Broker | None = None) -> Broker:
    """mqtt://[user[:pass]@]host[:port] or mqtts://...; credentials in the URL win."""
    base = base or Broker()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadInput(f"broker URL {url!r} is malformed: {exc}") from None
    if parts.scheme not in ("mqtt", "mqtts"):
        raise BadInput(f"broker URL must start with mqtt:// or mqtts://, not {url!r}")
    if not parts.hostname:
        raise BadInput(f"broker URL {url!r} names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise BadInput(f"broker URL {url!r} must be only scheme, credentials, host and port")
    tls = parts.scheme == "mqtts"
    return replace(
        base,
        host=parts.hostname,
        port=port or (8883 if tls else 1883),
        tls=tls,
        username=unquote(parts.username) if parts.username else base.username,
        password=unquote(parts.password) if parts.password else base.password,
    )


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

    Override keys: broker (URL), device_id, state_dir, sysfs_root, procfs_root,
    sample_interval_s, local_broker, calibration.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise BadInput(f"cannot read config {path}: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"config {path} is not valid TOML: {exc}") from None
    known_sections = {"agent", "broker", "monitors", "limits", "policy"}
    unknown = set(data) - known_sections
    if unknown:
        raise BadInput(f"config: unknown section{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))}; "
                       f"known: {', '.join(sorted(known_sections))}")
    over = {k: v for k, v in (overrides or {}).items() if v is not None}

    a = _table(data, "agent")
    device_id = check_device_id(over.get("device_id", _take(a, "agent", "device_id", (str,), None) or default_device_id()))
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
    url = over.get("broker", _take(b, "broker", "url", (str,), "mqtt://localhost:1883"))
    _no_leftovers(b, "broker")
    broker = parse_broker_url(url, broker)
    if (broker.cert_file is None) != (broker.key_file is None):
        raise BadInput("config: broker.cert_file and broker.key_file go together")
    if (broker.ca_file or broker.cert_file) and not broker.tls:
        raise BadInput("config: TLS files given but the broker URL is not mqtts://")
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
    max_request = int(_positive(_take(lim, "limits", "max_request_bytes", (int,), 16 * MiB), "limits.max_request_bytes"))
    timeout = float(_positive(_take(lim, "limits", "estimate_timeout_s", (int, float), 20.0), "limits.estimate_timeout_s"))
    graph_limits = Limits.from_mapping(lim)  # the rest are graph limits; unknown keys are refused there
    limits = AgentLimits(max_monitors, max_request, timeout, graph_limits)

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

    return Config(device_id=device_id, state_dir=state_dir, broker=broker, sample_interval_s=sample,
                  refresh_interval_s=refresh, sysfs_root=sysfs, procfs_root=procfs, estimate_workers=workers,
                  rules=rules, limits=limits, policy=policy, local_broker=local_broker,
                  calibration=calibration)
