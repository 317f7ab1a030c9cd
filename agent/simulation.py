"""`daop-agent simulate`: the real agent on a simulated device, driven along a scenario's timeline.

A scenario (TOML, docs/simulate.md) sets device conditions at given times,
starts and stops real load, registers monitors and states the events it
expects. The runner:

- writes a fixture /sys tree (thermal zone and trip points, cooling device,
  cpufreq, batteries and adapter, platform profile) and a /proc tree whose
  /proc/stat is synthesized from the *real* CPU time of the load processes it
  starts, plus any simulated steal time, so the device's load is exactly the
  scenario's and not that of whatever else shares the host;
- serves GPUs through an NVML stand-in (`SimulatedNvml`);
- runs the real agent (`agent.service.Agent`) in-process on that device,
  against a private Mosquitto or a given broker, and talks to it over MQTT
  as an app would (`agent.client.DaopClient`);
- keeps the device consistent: the agent's warm refresh runs the real
  onnxruntime probe on the real CPU (so that it costs what it costs on a
  device), and reports what the simulated device would read: the probe's
  quiet time per run slowed by the simulated clock (limit / maximum) and by
  the scenario's busy processes sharing the cores, like /proc/stat;
- prints the timeline and checks the expectations.

Parsing and validation are pure; everything else is I/O.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from agent.store import MONITOR_ID_RE
from monitors.errors import BadInput
from monitors.tiers import TIER_NAMES

if TYPE_CHECKING:  # onnxruntime is loaded only when a scenario runs
    from probes.refresh import WarmRefresh


PROFILES = ("laptop", "desktop", "server", "vm")
HZ = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20

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


# -- the scenario model (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class MonitorSpec:
    id: str
    model: Path
    inputs: dict[str, Any]  # name -> InputSpec
    required_tier: str
    at: float = 0.0


@dataclass(frozen=True)
class Step:
    t: float
    conditions: dict[str, Any]
    note: str | None = None


@dataclass(frozen=True)
class Expectation:
    """One of: an event with `meets` in [start, end]; the value `meets` throughout; no event at all."""

    kind: str  # "event_within" | "holds" | "no_event"
    monitor: str
    start: float
    end: float
    meets: bool | None = None

    def describe(self, speed: float = 1.0) -> str:
        a, b = round(self.start / speed, 2), round(self.end / speed, 2)
        if self.kind == "event_within":
            return f"{self.monitor}: an event meetsRequirement={str(self.meets).lower()} between t={a:g} and t={b:g}"
        if self.kind == "holds":
            return f"{self.monitor}: meetsRequirement={str(self.meets).lower()} from t={a:g} to t={b:g}"
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
    path: Path | None = None


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
    if not gpu and set(out) & GPU_KEYS:
        raise _fail(where, "GPU conditions need `gpu = true`")
    ranges = {"temp_c": (-40, 150), "passive_c": (20, 150), "cooling": (0, 10), "cpu_mhz": (100, 10000),
              "cpu_limit_mhz": (100, 10000), "battery_percent": (0, 100), "steal": (0, 0.9), "busy": (0, MAX_BUSY),
              "memory_mb": (0, 1 << 20), "gpu_util": (0, 100), "gpu_memory_used_mb": (0, 1 << 20)}
    for key, (lo, hi) in ranges.items():
        if key in out:
            _number(out[key], f"{where}.{key}", lo, hi)
    return out


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
    from monitors.importer import parse_input_spec

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
    initial = _conditions(doc.pop("initial", {}), "[initial]", device, gpu)

    monitors: list[MonitorSpec] = []
    raw_monitors = doc.pop("monitors", [])
    if not isinstance(raw_monitors, list) or not raw_monitors:
        raise _fail("file", "needs at least one [[monitors]]")
    for i, m in enumerate(raw_monitors):
        w = f"[[monitors]] #{i + 1}"
        if not isinstance(m, dict):
            raise _fail(w, "must be a table")
        m = dict(m)
        mid = _take(m, "id", (str,), w)
        if not MONITOR_ID_RE.match(mid):
            raise _fail(f"{w}.id", f"must be 1 to 64 of A-Z a-z 0-9 _ -, not {mid!r}")
        if any(x.id == mid for x in monitors):
            raise _fail(f"{w}.id", f"{mid!r} is used twice")
        model = _resolve_model(_take(m, "model", (str,), w), base, f"{w}.model")
        raw_inputs = _take(m, "inputs", (dict,), w, {})
        inputs = {}
        for key, dims in raw_inputs.items():
            if not isinstance(dims, str):
                raise _fail(f"{w}.inputs.{key}", f"must be a string like \"1x3x224x224\", not {dims!r}")
            input_name, spec = parse_input_spec(f"{key}={dims}")
            inputs[input_name] = spec
        tier = _take(m, "required_tier", (str,), w)
        if tier not in TIER_NAMES:
            raise _fail(f"{w}.required_tier", f"must be one of {', '.join(TIER_NAMES)}, not {tier!r}")
        at = _number(_take(m, "at", (int, float), w, 0), f"{w}.at", 0, duration)
        _leftovers(m, w)
        monitors.append(MonitorSpec(mid, model, inputs, tier, at))

    steps: list[Step] = []
    raw_steps = doc.pop("steps", [])
    if not isinstance(raw_steps, list):
        raise _fail("steps", "must be an array of tables [[steps]]")
    for i, s in enumerate(raw_steps):
        w = f"[[steps]] #{i + 1}"
        if not isinstance(s, dict):
            raise _fail(w, "must be a table")
        s = dict(s)
        t = _number(_take(s, "t", (int, float), w), f"{w}.t", 0, duration)
        note = _take(s, "note", (str,), w, None)
        steps.append(Step(t, _conditions(s, w, device, gpu), note))
    steps.sort(key=lambda s: s.t)

    expectations: list[Expectation] = []
    ids = {m.id for m in monitors}
    for i, e in enumerate(doc.pop("expect", [])):
        w = f"[[expect]] #{i + 1}"
        if not isinstance(e, dict):
            raise _fail(w, "must be a table")
        e = dict(e)
        monitor = _take(e, "monitor", (str,), w)
        if monitor not in ids:
            raise _fail(f"{w}.monitor", f"no monitor {monitor!r} in this scenario")
        kinds = [k for k in ("event_within", "holds", "no_event") if k in e]
        if len(kinds) != 1:
            raise _fail(w, "needs exactly one of event_within, holds, no_event")
        kind = kinds[0]
        a, b = _window(e.pop(kind), f"{w}.{kind}", duration)
        meets = _take(e, "meets", (bool,), w, None)
        if kind != "no_event" and meets is None:
            raise _fail(w, f"{kind} needs `meets = true|false`")
        if kind == "no_event" and meets is not None:
            raise _fail(w, "no_event takes no `meets`")
        _leftovers(e, w)
        expectations.append(Expectation(kind, monitor, a, b, meets))
    if not expectations:
        raise _fail("file", "states no [[expect]]: a scenario must say what it expects")
    _leftovers(doc, "file")
    if agent_config:
        _check_agent_config(agent_config)
    return Scenario(name, description, duration, device, gpu, cpu_max, sample, agent_config, initial,
                    tuple(monitors), tuple(steps), tuple(expectations))


def _check_agent_config(text: str) -> None:
    """The embedded agent.toml text, validated by the agent's own config loader."""
    from agent.config import load_config

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


class SimulatedNvml:
    """An NVML stand-in (pynvml's names, units and error class) for the simulated GPU."""

    def __init__(self, total_mb: int = 24576) -> None:
        import pynvml

        self.NVMLError = pynvml.NVMLError
        self.NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
        self.NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
        self._lost = pynvml.NVML_ERROR_GPU_IS_LOST
        self.total = total_mb * MiB
        self.used = 1024 * MiB
        self.util = 0
        self.fail = False

    def _check(self) -> None:
        if self.fail:
            raise self.NVMLError(self._lost)

    def nvmlInit(self) -> None: self._check()
    def nvmlShutdown(self) -> None: pass
    def nvmlDeviceGetCount(self) -> int: self._check(); return 1
    def nvmlDeviceGetHandleByIndex(self, index: int) -> int: self._check(); return index
    def nvmlDeviceGetName(self, handle: int) -> str: self._check(); return "Simulated GPU"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._check()
        from types import SimpleNamespace

        return SimpleNamespace(gpu=self.util, memory=min(100, self.util))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check()
        from types import SimpleNamespace

        return SimpleNamespace(total=self.total, used=self.used, free=max(0, self.total - self.used))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int: self._check(); return 40 + self.util // 3
    def nvmlDeviceGetPowerUsage(self, handle: int) -> int: self._check(); return 50_000 + 2_500 * self.util
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int: self._check(); return 320_000
    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int: self._check(); return 2100
    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int: self._check(); return 2100
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int: self._check(); return 0 if self.util else 1


_SPIN = ("import os, sys\nparent = int(sys.argv[1])\nn = 0\n"
         "while True:\n    n += 1\n    if n % 2000000 == 0 and os.getppid() != parent:\n        break\n")
_HOLD = ("import os, sys, time\nparent = int(sys.argv[1])\nblock = b'\\x01' * (int(sys.argv[2]) << 20)\n"
         "print('held', flush=True)\nwhile os.getppid() == parent:\n    time.sleep(0.5)\n")


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in USER_HZ ticks; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


class Load:
    """Real load: busy processes and a process holding memory. Each child exits when its parent dies."""

    def __init__(self) -> None:
        self.busy: list[subprocess.Popen[bytes]] = []
        self.holder: subprocess.Popen[bytes] | None = None
        self.held_mb = 0
        self._seen: dict[int, int] = {}  # pid -> ticks counted so far
        self._gone_ticks = 0

    def set_busy(self, count: int) -> None:
        while len(self.busy) < count:
            self.busy.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid())],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        while len(self.busy) > count:
            self._end(self.busy.pop())

    def set_memory(self, mb: int) -> None:
        if self.holder is not None:
            self._end(self.holder)
            self.holder, self.held_mb = None, 0
        if mb > 0:
            self.holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(os.getpid()), str(mb)],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            assert self.holder.stdout is not None
            self.holder.stdout.readline()  # the memory is touched and resident
            self.held_mb = mb

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        self._gone_ticks += self._delta(proc.pid)
        proc.kill()
        proc.wait()
        self._seen.pop(proc.pid, None)

    def _delta(self, pid: int) -> int:
        now = _cpu_ticks(pid)
        before = self._seen.get(pid, 0)
        self._seen[pid] = max(now, before)
        return max(0, now - before)

    def take_ticks(self) -> int:
        """CPU ticks the load used since the last call."""
        procs = self.busy + ([self.holder] if self.holder is not None else [])
        total = self._gone_ticks + sum(self._delta(p.pid) for p in procs)
        self._gone_ticks = 0
        return total

    @property
    def running(self) -> int:
        return len(self.busy)

    def stop(self) -> None:
        self.set_busy(0)
        self.set_memory(0)


def _write(path: Path, text: str) -> None:
    """Atomically, as the kernel's attributes change: a reader sees the old value or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.sim"
    tmp.write_text(text if text.endswith("\n") else text + "\n")
    os.replace(tmp, path)


class SimulatedDevice:
    """The fixture /sys and /proc trees of one device profile, and its real load."""

    def __init__(self, root: Path, scenario: Scenario) -> None:
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.profile = scenario.device
        self.cores = os.cpu_count() or 1  # the real CPUs: the load and the benchmarks run on them
        self.cpu_max_mhz = scenario.cpu_max_mhz
        self.nvml = SimulatedNvml() if scenario.gpu else None
        self.load = Load()
        self.conditions: dict[str, Any] = {"busy": 0, "memory_mb": 0, "steal": 0.0}
        self._ticks = {"busy": 0, "idle": 0, "steal": 0}
        self._stat_at = time.monotonic()
        self._mem_total, self._mem_available = _real_meminfo()
        self._build()

    # the tree at rest
    def _build(self) -> None:
        (self.sys / "class" / "thermal").mkdir(parents=True, exist_ok=True)
        (self.sys / "class" / "power_supply").mkdir(parents=True, exist_ok=True)
        self.proc.mkdir(parents=True, exist_ok=True)
        for i in range(self.cores):
            (self.sys / f"devices/system/cpu/cpu{i}").mkdir(parents=True, exist_ok=True)
        if self.profile != "vm":
            z = self.sys / "class/thermal/thermal_zone0"
            _write(z / "type", "x86_pkg_temp")
            _write(z / "trip_point_0_type", "passive")
            _write(z / "trip_point_1_type", "critical")
            _write(z / "trip_point_1_temp", "105000")
            c = self.sys / "class/thermal/cooling_device0"
            _write(c / "type", "Processor")
            _write(c / "max_state", "10")
            for i in range(self.cores):
                p = self.sys / f"devices/system/cpu/cpufreq/policy{i}"
                _write(p / "cpuinfo_max_freq", str(int(self.cpu_max_mhz * 1000)))
                _write(p / "scaling_governor", "powersave" if self.profile == "laptop" else "performance")
            _write(self.sys / "firmware/acpi/platform_profile_choices", "low-power balanced performance")
        if self.profile == "laptop":
            b = self.sys / "class/power_supply/BAT0"
            _write(b / "type", "Battery")
            _write(b / "present", "1")
            _write(b / "energy_full", "50000000")
            _write(self.sys / "class/power_supply/AC/type", "Mains")
        at_rest = {"busy": 0, "memory_mb": 0, "steal": 0.0}
        if self.profile != "vm":
            at_rest |= {"temp_c": 50, "passive_c": 95, "cooling": 0, "cpu_mhz": self.cpu_max_mhz,
                        "cpu_limit_mhz": self.cpu_max_mhz, "power_profile": "balanced"}
        if self.profile == "laptop":
            at_rest |= {"battery_percent": 80, "plugged": True}
        if self.nvml is not None:
            at_rest |= {"gpu_util": 0, "gpu_memory_used_mb": 1024, "gpu_fail": False}
        self.apply(at_rest)
        self.update_proc()

    def apply(self, conditions: dict[str, Any]) -> None:
        """Set conditions (validated by parse_scenario); real load starts or stops here."""
        self.conditions.update(conditions)
        c = self.conditions
        z = self.sys / "class/thermal/thermal_zone0"
        if "temp_c" in conditions:
            _write(z / "temp", str(int(round(c["temp_c"] * 1000))))
        if "passive_c" in conditions:
            _write(z / "trip_point_0_temp", str(int(round(c["passive_c"] * 1000))))
        if "cooling" in conditions:
            _write(self.sys / "class/thermal/cooling_device0/cur_state", str(c["cooling"]))
        if CPUFREQ_KEYS & set(conditions):
            for i in range(self.cores):
                p = self.sys / f"devices/system/cpu/cpufreq/policy{i}"
                _write(p / "scaling_cur_freq", str(int(c["cpu_mhz"] * 1000)))
                _write(p / "scaling_max_freq", str(int(c["cpu_limit_mhz"] * 1000)))
        if "power_profile" in conditions:
            _write(self.sys / "firmware/acpi/platform_profile", c["power_profile"])
        if BATTERY_KEYS & set(conditions):
            b = self.sys / "class/power_supply/BAT0"
            pct = float(c["battery_percent"])
            _write(b / "capacity", str(int(round(pct))))
            _write(b / "energy_now", str(int(50000000 * pct / 100)))
            _write(b / "status", "Full" if c["plugged"] and pct >= 99.5 else
                   "Charging" if c["plugged"] else "Discharging")
            _write(self.sys / "class/power_supply/AC/online", "1" if c["plugged"] else "0")
        if self.nvml is not None:
            self.nvml.util = int(c.get("gpu_util", self.nvml.util))
            self.nvml.used = min(self.nvml.total, int(c.get("gpu_memory_used_mb", self.nvml.used // MiB)) * MiB)
            self.nvml.fail = bool(c.get("gpu_fail", False))
        if "busy" in conditions:
            self.load.set_busy(int(c["busy"]))
        if "memory_mb" in conditions and int(c["memory_mb"]) != self.load.held_mb:
            self.load.set_memory(int(c["memory_mb"]))
            self.update_proc()

    def update_proc(self) -> None:
        """/proc/stat, /proc/meminfo and PSI from the real load and the simulated steal time."""
        now = time.monotonic()
        capacity = max(0, int(round(self.cores * (now - self._stat_at) * HZ)))
        self._stat_at = now
        # The hypervisor takes its share first; the guest's processes get at most the rest.
        steal = int(round(capacity * float(self.conditions.get("steal", 0.0))))
        busy = min(capacity - steal, self.load.take_ticks())
        t = self._ticks
        t["busy"] += busy
        t["steal"] += steal
        t["idle"] += capacity - busy - steal
        per = lambda total, i: total // self.cores + (1 if i < total % self.cores else 0)  # noqa: E731
        lines = [f"cpu  {t['busy']} 0 0 {t['idle']} 0 0 0 {t['steal']} 0 0"]
        lines += [f"cpu{i} {per(t['busy'], i)} 0 0 {per(t['idle'], i)} 0 0 0 {per(t['steal'], i)} 0 0"
                  for i in range(self.cores)]
        lines += ["intr 0", "ctxt 0", "btime 1700000000", "processes 1",
                  f"procs_running {1 + self.load.running}", "procs_blocked 0"]
        _write(self.proc / "stat", "\n".join(lines))
        _write(self.proc / "loadavg", f"0.00 0.00 0.00 {1 + self.load.running}/100 4242")
        available = max(0, self._mem_available - self.load.held_mb * 1024)
        _write(self.proc / "meminfo", f"MemTotal:       {self._mem_total} kB\nMemFree:        {available} kB\n"
                                      f"MemAvailable:   {available} kB\n")
        memory_some = 0.0 if available > 0.1 * self._mem_total else 25.0
        _write(self.proc / "pressure/memory", f"some avg10={memory_some:.2f} avg60=0.00 avg300=0.00 total=0\n"
                                              "full avg10=0.00 avg60=0.00 avg300=0.00 total=0")

    @property
    def clock_ratio(self) -> float:
        """Simulated clock over the maximum (1.0 on a vm): what a CPU-bound probe's CPU time scales by."""
        c = self.conditions
        if "cpu_mhz" not in c:
            return 1.0
        return max(0.05, min(1.0, min(c["cpu_mhz"], c["cpu_limit_mhz"]) / self.cpu_max_mhz))

    def sampler(self) -> Any:
        from probes.state import Sampler

        return Sampler(self.sys, self.proc, nvml=self.nvml, gpus=self.nvml is not None, ppd=False)

    def close(self) -> None:
        self.load.stop()


def _real_meminfo() -> tuple[int, int]:
    """MemTotal and MemAvailable of the host, kB (the simulated device has the host's memory)."""
    found = {"MemTotal": 8 << 20, "MemAvailable": 6 << 20}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in found:
                found[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return found["MemTotal"], found["MemAvailable"]


class SimulatedRefresh:
    """The warm refresh of the simulated device.

    The real probe runs on the real CPU, so that a refresh costs real CPU
    time and the refresh policy's budget holds as on a device. What it
    reports is the simulated device's reading: each probe's reference time per
    run (the host at rest), times the simulated clock's slowdown (maximum /
    limit) and the contention of the scenario's busy processes
    (monitors.speed.contention_factor). The host's other tenants are left
    out, as they are left out of the simulated /proc/stat, so that the run
    does not depend on what else shares the host.

    Smaller than the agent's default (a CPU budget of 30 ms instead of 150 ms)
    so that the refresh policy's 1 %-of-a-core budget lets it run every few
    seconds and follow a timeline compressed into tens of seconds.
    """

    def __init__(self, device: SimulatedDevice, reference: dict[str, float], bench: WarmRefresh | None = None) -> None:
        self.device = device
        self.reference = reference
        self.bench = bench or simulated_probe()

    def measure(self) -> dict[str, float]:
        from monitors.speed import contention_factor
        from probes.refresh import HANDOFF_KEY, LOCKSTEP_KEY

        out = self.bench.measure()
        contention = contention_factor(self.bench.threads, self.device.load.running, self.device.cores)
        for key in (LOCKSTEP_KEY, HANDOFF_KEY):  # both probes alike: the simulated device hands data as calibrated
            if key in self.reference:
                out[key] = self.reference[key] * contention / self.device.clock_ratio
        return out


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Timeline:
    """What the subscriber saw: (t, meets, seq) per monitor, from the create answer on."""

    created: dict[str, tuple[float, bool]] = field(default_factory=dict)
    events: dict[str, list[tuple[float, bool, int]]] = field(default_factory=dict)

    def value_at(self, monitor: str, t: float) -> bool | None:
        if monitor not in self.created or self.created[monitor][0] > t:
            return None
        value = self.created[monitor][1]
        for at, meets, _ in self.events.get(monitor, []):
            if at <= t:
                value = meets
        return value


def check(e: Expectation, timeline: Timeline, speed: float = 1.0) -> tuple[bool, str]:
    """Whether the expectation held, and what was seen."""
    a, b = e.start / speed, e.end / speed
    events = [(t, m, s) for t, m, s in timeline.events.get(e.monitor, []) if a <= t <= b]
    seen = ", ".join(f"t={t:.1f} {str(m).lower()}" for t, m, _ in events) or "none"
    if e.kind == "event_within":
        return any(m == e.meets for _, m, _ in events), f"events in the window: {seen}"
    if e.kind == "no_event":
        return not events, f"events in the window: {seen}"
    created = timeline.created.get(e.monitor)
    if created is not None and created[0] <= b:
        a = max(a, created[0])  # a window that opens with the registration starts at its answer
    start = timeline.value_at(e.monitor, a)
    ok = start == e.meets and all(m == e.meets for _, m, _ in events)
    shown = "not yet registered" if start is None else str(start).lower()
    return ok, f"value at t={a:.1f}: {shown}; events in the window: {seen}"


@dataclass
class Outcome:
    results: list[tuple[Expectation, bool, str]]

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.results)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def simulated_probe() -> WarmRefresh:
    """The simulated device's refresh probe (smaller than the agent's: see SimulatedRefresh)."""
    from probes.refresh import WarmRefresh

    return WarmRefresh(cpu_budget_s=0.03, max_wall_s=0.25)


def prepare_state_dir(state_dir: Path, calibration_from: Path, bench: WarmRefresh,
                      announce: Any = sys.stderr) -> dict[str, float]:
    """The agent's private state dir: the CPU calibration of this host, with a reference refresh taken now
    by `bench`, which is returned (the simulated device at rest, see SimulatedRefresh)."""
    from agent import calibration_store

    cal = calibration_store.load(calibration_from, "cpu")
    if cal is None:
        if announce is not None:
            print(f"daop-agent: no CPU calibration in {calibration_from}: calibrating now (quick)...", file=announce)
        cal = calibration_store.run_calibration(calibration_from, "cpu", quick=True)
    reference = bench.reference()
    calibration_store.save(state_dir, replace(cal, refresh_reference=reference))
    return reference


Emit = Callable[[dict[str, Any]], None]


async def run_scenario(scenario: Scenario, *, emit: Emit, broker: str | None = None, speed: float = 1.0,
                       calibration_from: Path, status_every_s: float = 1.0) -> Outcome:
    """Run the scenario against the real agent; `emit` gets each timeline record as it happens."""
    from agent.client import DaopClient, DaopError
    from agent.config import load_config, parse_broker_url
    from agent.local_broker import LocalBroker
    from agent.service import Agent
    from monitors.speed import speed_from_state

    if not speed > 0:
        raise BadInput(f"--speed must be positive, not {speed}")
    with tempfile.TemporaryDirectory(prefix="daop-sim-") as tmp_name:
        tmp = Path(tmp_name)
        device = SimulatedDevice(tmp / "device", scenario)
        private = None
        agent_task: asyncio.Task[int] | None = None
        agent: Agent | None = None
        try:
            device.apply(scenario.initial)
            state_dir = tmp / "state"
            state_dir.mkdir(mode=0o700)
            bench = await asyncio.to_thread(simulated_probe)
            reference = await asyncio.to_thread(prepare_state_dir, state_dir, calibration_from, bench)
            if broker is None:
                private = LocalBroker(tmp, _free_port())
                private.start()
                broker = private.url
            parse_broker_url(broker)
            config_path = tmp / "agent.toml"
            config_path.write_text(scenario.agent_config)
            device_id = "sim-" + "".join(ch if ch.isalnum() else "-" for ch in scenario.name.lower())[:40]
            cfg = load_config(config_path, {"broker": broker, "device_id": device_id, "state_dir": str(state_dir),
                                            "sysfs_root": str(device.sys), "procfs_root": str(device.proc),
                                            "sample_interval_s": scenario.sample_interval_s,
                                            "calibration": "quick"})
            refresh = SimulatedRefresh(device, reference, bench)
            agent = Agent(cfg, sampler=device.sampler(), measure=refresh.measure)
            agent_task = asyncio.get_running_loop().create_task(agent.run())
            deadline = time.monotonic() + 120
            while not agent.pool.ready:
                if agent_task.done():
                    raise BadInput(f"the agent stopped at start: {agent.engine_error or agent_task.result()}")
                if agent.engine_error:
                    raise BadInput(f"the agent's estimator cannot start: {agent.engine_error}")
                if time.monotonic() > deadline:
                    raise BadInput("the agent's estimator did not start within 120 s")
                await asyncio.sleep(0.05)
            emit({"kind": "start", "scenario": scenario.name, "device": scenario.device, "gpu": scenario.gpu,
                  "broker": cfg.broker.url, "device_id": device_id, "duration_s": scenario.duration_s / speed})
            return await _drive(scenario, device, DaopClient(broker, device_id, timeout_s=60), emit, speed,
                                status_every_s, agent, agent_task, speed_from_state, DaopError)
        finally:
            if agent is not None:
                agent.request_stop()
            if agent_task is not None:
                try:
                    await asyncio.wait_for(agent_task, 15)
                except Exception:  # noqa: BLE001 - stopping; the run's outcome stands
                    agent_task.cancel()
            device.close()
            if private is not None:
                private.stop()
            elif agent is not None:
                await _clear_status(cfg.broker, agent.topic("status"))


async def _drive(scenario: Scenario, device: SimulatedDevice, daop: Any, emit: Emit, speed: float,
                 status_every_s: float, agent: Any, agent_task: asyncio.Task[int], speed_from_state: Any,
                 DaopError: type[Exception]) -> Outcome:
    loop = asyncio.get_running_loop()
    timeline = Timeline()
    observer = device.sampler()
    await asyncio.to_thread(observer.sample)  # the first sample has no load delta
    tiers: dict[str, str] = {}
    background: set[asyncio.Task[Any]] = set()

    async with daop:
        t0 = loop.time()
        now = lambda: loop.time() - t0  # noqa: E731

        async def follow(monitor: Any) -> None:
            async for event in monitor:
                t = now()
                timeline.events.setdefault(event.monitor, []).append((t, event.meets, event.seq))
                emit({"kind": "event", "t": round(t, 2), "monitor": event.monitor, "meetsRequirement": event.meets,
                      "seq": event.seq})

        async def poll_tiers() -> None:
            for spec in scenario.monitors:
                if spec.id in timeline.created:
                    try:
                        tiers[spec.id] = await daop.estimate(spec.model, spec.inputs)
                    except DaopError as exc:
                        tiers[spec.id] = f"error ({exc})"

        async def ticker() -> None:
            while True:
                await asyncio.to_thread(device.update_proc)
                await asyncio.sleep(0.1)

        def spawn(coro: Any) -> asyncio.Task[Any]:
            task = loop.create_task(coro)
            background.add(task)
            task.add_done_callback(background.discard)
            return task

        spawn(ticker())
        plan: list[tuple[float, int, Any]] = [(m.at / speed, 0, m) for m in scenario.monitors]
        plan += [(s.t / speed, 1, s) for s in scenario.steps]
        plan.sort(key=lambda x: (x[0], x[1]))
        end = scenario.duration_s / speed
        next_status = 0.0
        tier_task: asyncio.Task[None] | None = None
        i = 0
        while True:
            if agent_task.done():
                raise BadInput("the agent stopped during the scenario")
            t = now()
            while i < len(plan) and plan[i][0] <= t:
                _, kind, item = plan[i]
                i += 1
                if kind == 0:
                    m = await daop.create_monitor(item.model, item.required_tier, item.id, item.inputs)
                    timeline.created[item.id] = (now(), m.meets)
                    emit({"kind": "monitor", "t": round(now(), 2), "monitor": item.id,
                          "requiredTier": item.required_tier, "meetsRequirement": m.meets})
                    spawn(follow(m))
                else:
                    await asyncio.to_thread(device.apply, item.conditions)
                    emit({"kind": "step", "t": round(now(), 2), "set": item.conditions, "note": item.note})
            if t >= next_status:
                state = await asyncio.to_thread(observer.sample)
                sp = speed_from_state(state, None, device.cores)
                factor, _ = agent.present_latency({"cpu": 1.0}, 0)  # the agent's present CPU slowdown
                emit({"kind": "status", "t": round(now(), 2), "sees": _seen(state), "predicted_slowdown":
                      round(sp.cpu, 2), "agent_slowdown": round(factor, 2), "reasons": list(sp.reasons),
                      "tiers": dict(tiers),
                      "meets": {m: timeline.value_at(m, now()) for m in timeline.created}})
                if tier_task is None or tier_task.done():
                    tier_task = spawn(poll_tiers())
                next_status += status_every_s
            if t >= end:
                break
            upcoming = min([end, next_status] + ([plan[i][0]] if i < len(plan) else []))
            await asyncio.sleep(max(0.0, min(0.5, upcoming - now())))
        await asyncio.sleep(0.2)  # events already on their way
        for task in list(background):
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for monitor in timeline.created:  # leave no retained state behind on a shared broker
            try:
                await daop.delete_monitor(monitor)
            except DaopError:
                pass
    observer.close()
    results = []
    for e in scenario.expectations:
        ok, seen = check(e, timeline, speed)
        results.append((e, ok, seen))
        emit({"kind": "expect", "expectation": e.describe(speed), "passed": ok, "seen": seen})
    outcome = Outcome(results)
    emit({"kind": "result", "passed": outcome.passed,
          "failed": sum(1 for _, ok, _ in results if not ok), "total": len(results)})
    return outcome


async def _clear_status(broker: Any, topic: str) -> None:
    """The simulated agent's retained status removed from a shared broker (best effort)."""
    import aiomqtt

    try:
        async with aiomqtt.Client(broker.host, broker.port, username=broker.username, password=broker.password,
                                  timeout=5) as c:
            await c.publish(topic, b"", qos=1, retain=True)
    except (aiomqtt.MqttError, OSError):
        pass


def _seen(state: Any) -> dict[str, Any]:
    """The device state as the agent's probes read it (local figures: this is a local tool)."""
    t, b, c = state.thermal, state.battery, state.cpu
    out: dict[str, Any] = {"max_temp_c": t.max_temp_c, "throttling": t.throttling}
    if b.present:
        out |= {"battery_percent": b.percent, "plugged": b.plugged}
    out |= {"power_mode": state.power_mode, "cur_mhz": c.cur_mhz, "limit_mhz": c.limit_mhz,
            "others_busy_cores": c.others_busy_cores, "runnable_others": c.runnable_others, "steal": c.steal,
            "mem_available_mb": None if state.memory.available_bytes is None else
            state.memory.available_bytes // MiB}
    if state.gpus:
        g = state.gpus[0]
        out["gpu"] = {"util_percent": g.util_percent, "memory_free_mb":
                      None if g.memory_free_bytes is None else g.memory_free_bytes // MiB}
    if state.notes:
        out["notes"] = list(state.notes)
    if state.stale:
        out["stale"] = sorted(state.stale)  # last good values, not fresh readings
    return out


def format_record(r: dict[str, Any]) -> str:
    """One timeline record as a line for people."""
    kind = r["kind"]
    if kind == "start":
        return (f"simulating '{r['scenario']}' on a {r['device']}{' with a GPU' if r['gpu'] else ''} for "
                f"{r['duration_s']:g} s (agent {r['device_id']} on {r['broker']})")
    t = f"t={r.get('t', 0):6.1f}s"
    if kind == "monitor":
        return f"{t}  monitor {r['monitor']} registered (required {r['requiredTier']}): " \
               f"meetsRequirement={str(r['meetsRequirement']).lower()}"
    if kind == "step":
        what = ", ".join(f"{k}={json.dumps(v)}" for k, v in r["set"].items())
        return f"{t}  set {what}" + (f"  ({r['note']})" if r.get("note") else "")
    if kind == "event":
        return f"{t}  EVENT {r['monitor']} meetsRequirement={str(r['meetsRequirement']).lower()} seq={r['seq']}"
    if kind == "status":
        s = r["sees"]
        parts = []
        if s.get("max_temp_c") is not None:
            parts.append(f"{s['max_temp_c']:.0f}C{' THROTTLING' if s.get('throttling') else ''}")
        if s.get("limit_mhz"):
            parts.append(f"cpu {s.get('cur_mhz') or 0:.0f}/{s['limit_mhz']:.0f}MHz")
        if "battery_percent" in s:
            parts.append(f"battery {s['battery_percent']:.0f}% {'plugged' if s['plugged'] else 'on battery'}")
        if s.get("power_mode"):
            parts.append(s["power_mode"])
        if s.get("runnable_others") is not None:
            parts.append(f"others {s['runnable_others']:.1f}")
        if s.get("steal"):
            parts.append(f"steal {100 * s['steal']:.0f}%")
        if "gpu" in s:
            g = s["gpu"]
            stale = any(k.startswith("gpus.") for k in s.get("stale", []))
            parts.append(f"gpu {g['util_percent']:.0f}% free {g['memory_free_mb']}MB{' (STALE)' if stale else ''}"
                         if g["util_percent"] is not None else "gpu UNREADABLE")
        if s.get("notes"):
            parts.append("; ".join(s["notes"]))
        parts.append(f"slowdown x{r['agent_slowdown']:.2f}")
        monitors = "  ".join(f"{m}: {r['tiers'].get(m, '?')} "
                             f"{'meets' if v else 'does not meet' if v is not None else '?'}"
                             for m, v in r["meets"].items())
        return f"{t}  {' | '.join(parts)}" + (f"  ||  {monitors}" if monitors else "")
    if kind == "expect":
        return f"{'PASS' if r['passed'] else 'FAIL'}  {r['expectation']}  [{r['seen']}]"
    if kind == "result":
        return "all expectations met" if r["passed"] else f"{r['failed']} of {r['total']} expectations failed"
    return json.dumps(r)
