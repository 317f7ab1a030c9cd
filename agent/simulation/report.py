"""What a scenario run saw: the timeline, the expectations checked against it, and lines for people."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.simulation.app import oracle
from agent.simulation.scenario import Expectation, MonitorSpec, Scenario

MiB = 1 << 20



@dataclass
class Timeline:
    """What the subscriber saw: each registration's answer (t, meets) and each event (t, meets, seq), per
    monitor (registered again, a monitor starts over from the new answer)."""

    created: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    events: dict[str, list[tuple[float, bool, int]]] = field(default_factory=dict)
    # per monitor, each second an app ran its workloads: (t at the second's end, workload -> run latencies ms)
    runs: dict[str, list[tuple[float, dict[str, list[float]]]]] = field(default_factory=dict)

    def registered(self, monitor: str, t: float) -> tuple[float, bool] | None:
        """The registration in force at `t`: its time and answer."""
        before = [r for r in self.created.get(monitor, []) if r[0] <= t]
        return before[-1] if before else None

    def value_at(self, monitor: str, t: float) -> bool | None:
        registration = self.registered(monitor, t)
        if registration is None:
            return None
        since, value = registration
        for at, meets, _ in self.events.get(monitor, []):
            if since <= at <= t:
                value = meets
        return value


def agreement(monitor: MonitorSpec, timeline: Timeline, a: float, b: float,
              seconds: float = 1.0) -> tuple[int, int]:
    """In how many of the seconds in [a, b] the monitor's value agreed with its app's own measurements
    (app.oracle), of how many could be judged."""
    targets = {w.name: (w.requirement.deadline_ms, w.requirement.sustained_hz) for w in monitor.workloads}
    agree = judged = 0
    for t, runs in timeline.runs.get(monitor.id, []):
        if not (a <= t - seconds and t <= b):
            continue
        truth, value = oracle(runs, targets, seconds), timeline.value_at(monitor.id, t)
        if truth is None or value is None:
            continue
        judged += 1
        agree += truth == value
    return agree, judged


def check(e: Expectation, timeline: Timeline, speed: float = 1.0,
          scenario: Scenario | None = None) -> tuple[bool, str]:
    """Whether the expectation held, and what was seen."""
    a, b = e.start / speed, e.end / speed
    if e.kind == "agrees":
        assert scenario is not None
        monitor = next(m for m in scenario.monitors if m.id == e.monitor)
        agree, judged = agreement(monitor, timeline, a, b, 1.0 / speed)
        return judged > 0 and agree >= e.share * judged, f"agreed in {agree} of {judged} seconds"
    events = [(t, m, s) for t, m, s in timeline.events.get(e.monitor, []) if a <= t <= b]
    seen = ", ".join(f"t={t:.1f} {str(m).lower()}" for t, m, _ in events) or "none"
    if e.kind == "event_within":
        return any(m == e.meets for _, m, _ in events), f"events in the window: {seen}"
    if e.kind == "no_event":
        return not events, f"events in the window: {seen}"
    registrations = timeline.created.get(e.monitor, [])
    if registrations and registrations[0][0] <= b:
        a = max(a, registrations[0][0])  # a window that opens with the registration starts at its answer
    start = timeline.value_at(e.monitor, a)
    again = [meets for t, meets in registrations if a < t <= b]  # registered again inside the window
    ok = start == e.meets and all(m == e.meets for _, m, _ in events) and all(m == e.meets for m in again)
    shown = "not yet registered" if start is None else str(start).lower()
    return ok, f"value at t={a:.1f}: {shown}; events in the window: {seen}"


@dataclass
class Outcome:
    results: list[tuple[Expectation, bool, str]]
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.results)



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


def _speed_line(s: dict[str, Any] | None) -> str:
    if not s:
        return "\n  device speed: the host's own (no [speed] in the scenario)"
    inputs = ", ".join(f"{k} {v}" for k, v in s["inputs"].items())
    line = (f"\n  device speed: {s['reference']}{' (' + inputs + ')' if inputs else ''} {s['at_rest_ms']:g} ms at rest;"
            f" here estimated {s['host_estimate_ms']:g} ms: calibration x{s['calibration_scale']:g}")
    if "apps_scale" in s:
        line += f"; here run in {s['host_run_ms']:g} ms: apps x{s['apps_scale']:g}"
    return line


def format_record(r: dict[str, Any]) -> str:
    """One timeline record as a line for people."""
    kind = r["kind"]
    if kind == "start":
        return (f"simulating '{r['scenario']}' on a {r['device']}{' with a GPU' if r['gpu'] else ''}"
                f"{' of ' + str(r['cores']) + ' CPUs' if r.get('cores') else ''} for "
                f"{r['duration_s']:g} s (agent {r['device_id']} on {r['broker']})" + _speed_line(r.get("speed")))
    t = f"t={r.get('t', 0):6.1f}s"
    if kind == "monitor":
        return f"{t}  monitor {r['monitor']} registered (required {r['required']}): " \
               f"meetsRequirement={str(r['meetsRequirement']).lower()}" + _answers(r)
    if kind == "app":
        rates = ", ".join(f"{k + ' ' if k else ''}{v:g}/s" for k, v in r.get("rates", {}).items())
        return f"{t}  app of {r['monitor']} {'starts (' + rates + ')' if r['started'] else 'stops'}"
    if kind == "step":
        what = ", ".join(f"{k}={json.dumps(v)}" for k, v in r["set"].items())
        return f"{t}  set {what}" + (f"  ({r['note']})" if r.get("note") else "")
    if kind == "event":
        return f"{t}  EVENT {r['monitor']} meetsRequirement={str(r['meetsRequirement']).lower()} seq={r['seq']}" \
               + _answers(r)
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
        for monitor, runs in r.get("apps", {}).items():
            own = r.get("monitor_slowdown", {}).get(monitor)
            if own is not None:  # its own run left out: what the agent prices the app's own monitor at
                parts.append(f"{monitor} without its app x{own:.2f}")
            medians = [f"{k + ' ' if k else ''}{sorted(v)[len(v) // 2]:.1f} ms x{len(v)}" for k, v in runs.items() if v]
            if medians:
                parts.append(f"app {monitor}: {', '.join(medians)}")
        estimates = r.get("estimates_ms", {})
        monitors = "  ".join(f"{m}: {r['tiers'].get(m, '?') + ' ' if m in r['tiers'] else ''}"
                             f"est {'/'.join(f'{x:.1f}' for x in estimates.get(m, []))} ms "
                             f"{'meets' if v else 'does not meet' if v is not None else '?'}"
                             for m, v in r["meets"].items())
        return f"{t}  {' | '.join(parts)}" + (f"  ||  {monitors}" if monitors else "")
    if kind == "expect":
        return f"{'PASS' if r['passed'] else 'FAIL'}  {r['expectation']}  [{r['seen']}]"
    if kind == "result":
        return "all expectations met" if r["passed"] else f"{r['failed']} of {r['total']} expectations failed"
    return json.dumps(r)


def _answers(r: dict[str, Any]) -> str:
    answers = r.get("workloads")
    return f" ({', '.join(f'{k}: {str(v).lower()}' for k, v in answers.items())})" if answers else ""
