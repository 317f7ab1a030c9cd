"""A scenario: device conditions over a timeline, monitors, and the events expected (pure parsing and checks)."""

from __future__ import annotations

import math
import os
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.config import load_config
from agent.store import MONITOR_ID_RE
from monitors.errors import BadInput
from monitors.graphs.importer import parse_input_spec
from monitors.requirements import Requirement

PROFILES = ("laptop", "desktop", "server", "vm")

# Condition keys a step (or [initial]) may set: key -> (types, what it means).
CONDITIONS: dict[str, tuple[tuple[type, ...], str]] = {
    "temp_c": ((int, float), "CPU package zone temperature, degrees C"),
    "passive_c": ((int, float), "the zone's passive trip point, degrees C"),
    "cooling": ((int,), "processor cooling device cur_state, 0 to 10"),
    "cpu_mhz": ((int, float), "scaling_cur_freq of every core, MHz"),
    "cpu_limit_mhz": ((int, float), "scaling_max_freq of every core (a cap), MHz"),
    "battery_percent": ((int, float), "battery level, 0 to 100"),
    "plugged": ((bool,), "AC adapter online"),
    "power_profile": ((str,), "ACPI platform profile: low-power, balanced, performance"),
    "steal": ((int, float), "share of CPU time taken by the hypervisor, 0 to 0.9"),
    "busy": ((int,), "number of real busy processes (spinning loops)"),
    "memory_mb": ((int,), "MB held by a real process (0 releases it)"),
    "gpu_util": ((int,), "GPU 0 utilisation, %"),
    "gpu_memory_used_mb": ((int,), "GPU 0 memory in use, MB"),
    "gpu_fail": ((bool,), "NVML fails on every call (GPU lost)"),
}
BATTERY_KEYS = {"battery_percent", "plugged"}
GPU_KEYS = {"gpu_util", "gpu_memory_used_mb", "gpu_fail"}
THERMAL_KEYS = {"temp_c", "passive_c", "cooling"}
CPUFREQ_KEYS = {"cpu_mhz", "cpu_limit_mhz"}
MAX_BUSY = 16
MAX_DURATION_S = 600.0
MAX_CORES = 64


@dataclass(frozen=True)
class WorkloadSpec:
    name: str  # "" for a monitor of one workload
    model: Path
    inputs: dict[str, Any]  # name -> InputSpec
    requirement: Requirement


@dataclass(frozen=True)
class MonitorSpec:
    id: str
    workloads: tuple[WorkloadSpec, ...]
    at: float = 0.0

    @property
    def group(self) -> bool:
        return len(self.workloads) > 1 or bool(self.workloads[0].name)

    def describe(self) -> str:
        return ", ".join(f"{w.name + ' ' if w.name else ''}{w.requirement.describe()}" for w in self.workloads)


@dataclass(frozen=True)
class AppSpec:
    """A real app process that runs a monitor's workloads here from `start` to `stop`, each at its rate."""

    monitor: str
    rates: dict[str, float]  # workload name ("" for a monitor of one) -> runs a second
    start: float
    stop: float
    declare: bool = True  # says so to the agent (monitors/running, with its pid)
    report: bool = False  # reports its measured latencies every second (monitors/report)
    hidden_slowdown: float = 1.0  # its runs take this much longer than any signal or the calibration says


@dataclass(frozen=True)
class DeviceSpeed:
    """How fast the simulated device is: `model` (with `inputs`) takes `at_rest_ms` on it at rest. The harness
    scales what the host measures to it, so that a scenario gives the same events on a faster or slower host."""

    model: Path
    inputs: dict[str, Any]  # name -> InputSpec
    at_rest_ms: float


@dataclass(frozen=True)
class Step:
    t: float
    conditions: dict[str, Any]
    note: str | None = None


@dataclass(frozen=True)
class Expectation:
    """One of: an event with `meets` in [start, end]; the value `meets` throughout; no event at all; the
    monitor agreeing with its app's own measurements in at least `share` of the seconds."""

    kind: str  # "event_within" | "holds" | "no_event" | "agrees"
    monitor: str
    start: float
    end: float
    meets: bool | None = None
    share: float = 0.95

    def describe(self, speed: float = 1.0) -> str:
        a, b = round(self.start / speed, 2), round(self.end / speed, 2)
        if self.kind == "event_within":
            return f"{self.monitor}: an event meetsRequirement={str(self.meets).lower()} between t={a:g} and t={b:g}"
        if self.kind == "holds":
            return f"{self.monitor}: meetsRequirement={str(self.meets).lower()} from t={a:g} to t={b:g}"
        if self.kind == "agrees":
            return (f"{self.monitor}: agrees with its app's own measurements in at least {100 * self.share:g} % "
                    f"of the seconds from t={a:g} to t={b:g}")
        return f"{self.monitor}: no event between t={a:g} and t={b:g}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    device: str
    gpu: bool
    cpu_max_mhz: float
    sample_interval_s: float
    agent_config: str
    initial: dict[str, Any]
    monitors: tuple[MonitorSpec, ...]
    steps: tuple[Step, ...]
    expectations: tuple[Expectation, ...]
    apps: tuple[AppSpec, ...] = ()
    path: Path | None = None
    cores: int | None = None  # the simulated device's CPUs (None: as many as the host has)
    speed: DeviceSpeed | None = None  # None: as fast as the host


def _fail(where: str, message: str) -> BadInput:
    return BadInput(f"scenario {where}: {message}")


def _number(value: Any, where: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, f"must be a number, not {value!r}")
    if not lo <= value <= hi:
        raise _fail(where, f"must be between {lo:g} and {hi:g}, not {value!r}")
    return float(value)


def _conditions(table: Any, where: str, device: str, gpu: bool) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise _fail(where, "must be a table of conditions")
    unknown = sorted(set(table) - set(CONDITIONS))
    if unknown:
        raise _fail(where, f"unknown condition{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                           f"known: {', '.join(CONDITIONS)}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        kinds, _ = CONDITIONS[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise _fail(f"{where}.{key}", f"must be {'/'.join(k.__name__ for k in kinds)}, not {value!r}")
        out[key] = value
    if device == "vm" and (set(out) & (BATTERY_KEYS | THERMAL_KEYS | CPUFREQ_KEYS | {"power_profile"})):
        raise _fail(where, "a vm has no thermal zones, batteries, cpufreq or platform profile")
    if device in ("desktop", "server") and set(out) & BATTERY_KEYS:
        raise _fail(where, f"a {device} has no battery")
    if device == "desktop" and set(out) & {"passive_c", "cooling"}:
        raise _fail(where, "a desktop has no thermal zones or cooling devices (its temperature is a hwmon sensor)")
    if not gpu and set(out) & GPU_KEYS:
        raise _fail(where, "GPU conditions need `gpu = true`")
    ranges = {"temp_c": (-40, 150), "passive_c": (20, 150), "cooling": (0, 10), "cpu_mhz": (100, 10000),
              "cpu_limit_mhz": (100, 10000), "battery_percent": (0, 100), "steal": (0, 0.9), "busy": (0, MAX_BUSY),
              "memory_mb": (0, 1 << 20), "gpu_util": (0, 100), "gpu_memory_used_mb": (0, 1 << 20)}
    for key, (lo, hi) in ranges.items():
        if key in out:
            _number(out[key], f"{where}.{key}", lo, hi)
    return out


def _tables(doc: dict[str, Any], key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The file's `[[key]]` tables, each with where it is (for errors), as copies to take values from."""
    raw = doc.pop(key, [])
    if not isinstance(raw, list):
        raise _fail(key, f"must be an array of tables [[{key}]]")
    for i, table in enumerate(raw):
        where = f"[[{key}]] #{i + 1}"
        if not isinstance(table, dict):
            raise _fail(where, "must be a table")
        yield where, dict(table)


def _monitor_of(table: dict[str, Any], where: str, ids: set[str]) -> str:
    """The scenario's monitor a table names."""
    monitor = _take(table, "monitor", (str,), where)
    if monitor not in ids:
        raise _fail(f"{where}.monitor", f"no monitor {monitor!r} in this scenario")
    return str(monitor)


def _take(table: dict[str, Any], key: str, kinds: tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise _fail(where, f"needs `{key}`")
        return default
    value = table.pop(key)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise _fail(f"{where}.{key}", f"must be {'/'.join(k.__name__ for k in kinds)}, not {value!r}")
    return value


def _leftovers(table: dict[str, Any], where: str) -> None:
    if table:
        raise _fail(where, f"unknown key{'s' if len(table) > 1 else ''} {', '.join(sorted(table))}")


def _window(value: Any, where: str, duration: float) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise _fail(where, f"must be [start, end] in seconds, not {value!r}")
    a = _number(value[0], f"{where}[0]", 0, duration)
    b = _number(value[1], f"{where}[1]", 0, duration)
    if b < a:
        raise _fail(where, f"ends before it starts: {value!r}")
    return a, b


def _resolve_model(text: str, base: Path, where: str) -> Path:
    for candidate in (base / text, Path.cwd() / text, Path(text)):
        if candidate.is_file():
            return candidate.resolve()
    raise _fail(where, f"model file {text!r} not found (relative to {base} or the current folder)")


def parse_scenario(text: str, base: Path = Path("."), where: str = "file") -> Scenario:
    """A validated Scenario from TOML text; every mistake is one BadInput line."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"scenario {where} is not valid TOML: {exc}") from None
    name = _take(doc, "name", (str,), "file")
    description = _take(doc, "description", (str,), "file", "")
    duration = _number(_take(doc, "duration_s", (int, float), "file"), "duration_s", 1, MAX_DURATION_S)
    device = _take(doc, "device", (str,), "file", "laptop")
    if device not in PROFILES:
        raise _fail("device", f"must be one of {', '.join(PROFILES)}, not {device!r}")
    gpu = _take(doc, "gpu", (bool,), "file", False)
    cpu_max = _number(_take(doc, "cpu_max_mhz", (int, float), "file", 4000), "cpu_max_mhz", 100, 10000)
    sample = _number(_take(doc, "sample_interval_s", (int, float), "file", 0.25), "sample_interval_s", 0.05, 5)
    agent_config = _take(doc, "agent_config", (str,), "file", "")
    cores = _take(doc, "cores", (int,), "file", None)
    if cores is not None:
        cores = int(_number(cores, "cores", 1, MAX_CORES))
    speed = _device_speed(doc.pop("speed"), base) if "speed" in doc else None
    initial = _conditions(doc.pop("initial", {}), "[initial]", device, gpu)

    monitors: list[MonitorSpec] = []
    raw_monitors = doc.get("monitors")
    if not isinstance(raw_monitors, list) or not raw_monitors:
        raise _fail("file", "needs at least one [[monitors]]")
    for w, m in _tables(doc, "monitors"):
        mid = _take(m, "id", (str,), w)
        if not MONITOR_ID_RE.fullmatch(mid):
            raise _fail(f"{w}.id", f"must be 1 to 64 of A-Z a-z 0-9 _ -, not {mid!r}")
        at = _number(_take(m, "at", (int, float), w, 0), f"{w}.at", 0, duration)
        if any(x.id == mid and x.at == at for x in monitors):
            raise _fail(f"{w}.id", f"{mid!r} is registered twice at t={at:g} (a later `at` replaces it)")
        raw_group = _take(m, "workloads", (list,), w, None)
        workloads: tuple[WorkloadSpec, ...]
        if raw_group is None:
            workloads = (_workload(m, "", base, w),)
        else:
            if not raw_group or len(raw_group) > 16:
                raise _fail(f"{w}.workloads", "must list 1 to 16 workloads")
            group: list[WorkloadSpec] = []
            for j, item in enumerate(raw_group):
                ww = f"{w}.workloads[{j}]"
                if not isinstance(item, dict):
                    raise _fail(ww, "must be a table")
                item = dict(item)
                name = _take(item, "name", (str,), ww)
                if not MONITOR_ID_RE.fullmatch(name) or any(x.name == name for x in group):
                    raise _fail(f"{ww}.name", f"must be 1 to 64 of A-Z a-z 0-9 _ -, and unique: {name!r}")
                group.append(_workload(item, name, base, ww))
                _leftovers(item, ww)
            workloads = tuple(group)
        _leftovers(m, w)
        monitors.append(MonitorSpec(mid, workloads, at))

    steps: list[Step] = []
    for w, s in _tables(doc, "steps"):
        t = _number(_take(s, "t", (int, float), w), f"{w}.t", 0, duration)
        note = _take(s, "note", (str,), w, None)
        steps.append(Step(t, _conditions(s, w, device, gpu), note))
    steps.sort(key=lambda s: s.t)

    ids = {m.id for m in monitors}
    apps: list[AppSpec] = []
    for w, a in _tables(doc, "apps"):
        monitor = _monitor_of(a, w, ids)
        names = {x.name for x in next(x for x in monitors if x.id == monitor).workloads}
        if "rate_hz" in a:
            rates = {"": _number(_take(a, "rate_hz", (int, float), w), f"{w}.rate_hz", 0.1, 1000)}
            if names != {""}:
                raise _fail(w, f"monitor {monitor!r} is a group: give `rates = {{workload = Hz, ...}}`")
        else:
            raw = _take(a, "rates", (dict,), w)
            if set(raw) != names:
                raise _fail(f"{w}.rates", f"must give a rate to each of {monitor!r}'s workloads: {sorted(names)}")
            rates = {k: _number(v, f"{w}.rates.{k}", 0.1, 1000) for k, v in raw.items()}
        start = _number(_take(a, "start", (int, float), w, 0), f"{w}.start", 0, duration)
        stop = _number(_take(a, "stop", (int, float), w, duration), f"{w}.stop", start, duration)
        apps.append(AppSpec(monitor, rates, start, stop, _take(a, "declare", (bool,), w, True),
                            _take(a, "report", (bool,), w, False),
                            _number(_take(a, "hidden_slowdown", (int, float), w, 1.0), f"{w}.hidden_slowdown", 1, 10)))
        _leftovers(a, w)

    expectations: list[Expectation] = []
    for w, e in _tables(doc, "expect"):
        monitor = _monitor_of(e, w, ids)
        kinds = [k for k in ("event_within", "holds", "no_event", "agrees") if k in e]
        if len(kinds) != 1:
            raise _fail(w, "needs exactly one of event_within, holds, no_event, agrees")
        kind = kinds[0]
        begin, end = _window(e.pop(kind), f"{w}.{kind}", duration)
        meets = _take(e, "meets", (bool,), w, None)
        if kind in ("event_within", "holds") and meets is None:
            raise _fail(w, f"{kind} needs `meets = true|false`")
        if kind in ("no_event", "agrees") and meets is not None:
            raise _fail(w, f"{kind} takes no `meets`")
        share = 0.95
        if kind == "agrees":
            share = _number(_take(e, "share", (int, float), w, 0.95), f"{w}.share", 0, 1)
            if not any(x.monitor == monitor and x.start <= begin and end <= x.stop for x in apps):
                raise _fail(w, f"agrees needs an app running {monitor!r}'s workloads throughout [{begin:g}, {end:g}]")
        _leftovers(e, w)
        expectations.append(Expectation(kind, monitor, begin, end, meets, share))
    if not expectations:
        raise _fail("file", "states no [[expect]]: a scenario must say what it expects")
    _leftovers(doc, "file")
    if agent_config:
        _check_agent_config(agent_config)
    return Scenario(name, description, duration, device, gpu, cpu_max, sample, agent_config, initial,
                    tuple(monitors), tuple(steps), tuple(expectations), tuple(apps), cores=cores, speed=speed)


def _device_speed(table: Any, base: Path) -> DeviceSpeed:
    """[speed]: a reference model, its inputs and its latency at rest on the simulated device."""
    where = "[speed]"
    if not isinstance(table, dict):
        raise _fail(where, "must be a table: model, inputs, at_rest_ms")
    table = dict(table)
    model = _resolve_model(_take(table, "model", (str,), where), base, f"{where}.model")
    inputs = _inputs(_take(table, "inputs", (dict,), where, {}), where)
    at_rest = _number(_take(table, "at_rest_ms", (int, float), where), f"{where}.at_rest_ms", 0.01, 600_000)
    _leftovers(table, where)
    return DeviceSpeed(model, inputs, at_rest)


def _inputs(table: dict[str, Any], where: str) -> dict[str, Any]:
    inputs = {}
    for key, dims in table.items():
        if not isinstance(dims, str):
            raise _fail(f"{where}.inputs.{key}", f"must be a string like \"1x3x224x224\", not {dims!r}")
        input_name, spec = parse_input_spec(f"{key}={dims}")
        inputs[input_name] = spec
    return inputs


def _workload(table: dict[str, Any], name: str, base: Path, where: str) -> WorkloadSpec:
    """A model, its inputs and its requirement: `required_tier`, or `required_rate` (Hz) and/or
    `required_deadline_ms`."""
    model = _resolve_model(_take(table, "model", (str,), where), base, f"{where}.model")
    inputs = _inputs(_take(table, "inputs", (dict,), where, {}), where)
    fields = {"requiredTier": table.pop("required_tier", None), "requiredRate": table.pop("required_rate", None),
              "requiredDeadlineMs": table.pop("required_deadline_ms", None)}
    try:
        requirement = Requirement.parse({k: v for k, v in fields.items() if v is not None})
    except BadInput as exc:
        raise _fail(where, str(exc).replace("requiredTier", "required_tier").replace("requiredRate", "required_rate")
                    .replace("requiredDeadlineMs", "required_deadline_ms")) from None
    return WorkloadSpec(name, model, inputs, requirement)


def _check_agent_config(text: str) -> None:
    """The embedded agent.toml text, validated by the agent's own config loader."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        load_config(f.name, {"device_id": "sim", "state_dir": tempfile.gettempdir()})
    except BadInput as exc:
        raise _fail("agent_config", str(exc)) from None
    finally:
        os.unlink(f.name)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read scenario {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BadInput(f"scenario {path} is not UTF-8 text") from None
    return replace(parse_scenario(text, path.parent, str(path)), path=path)


# -- the simulated device ------------------------------------------------------------------


