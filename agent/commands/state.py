"""`daop-agent state`: the device state as the agent sees it."""

from __future__ import annotations

import argparse
import json
import os

from monitors.errors import BadInput
from probes.state import DeviceState, Sampler

HELP = "Show the device state as the agent sees it (thermal, battery, power mode, CPU, GPUs)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sysfs-root", default="/sys", metavar="DIR", help="read sysfs from DIR (default /sys)")
    parser.add_argument("--procfs-root", default="/proc", metavar="DIR", help="read procfs from DIR (default /proc)")


def run(args: argparse.Namespace) -> int:
    for flag, root in (("--sysfs-root", args.sysfs_root), ("--procfs-root", args.procfs_root)):
        if not os.path.isdir(root):
            raise BadInput(f"{flag} {root}: not a directory")
    sampler = Sampler(args.sysfs_root, args.procfs_root)
    try:
        if sampler.ppd is not None:
            sampler.ppd.wait(1.0)
        state = sampler.sample_over()
    finally:
        sampler.close()
    if args.json:
        print(json.dumps(state.to_json()))
    else:
        print(format_table(state))
    return 0


def _fmt(value: object, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def format_table(state: DeviceState) -> str:
    """A readable table: one signal per line, `unknown` where it cannot be read."""
    t, b, p, c, m = state.thermal, state.battery, state.power, state.cpu, state.memory
    rows: list[tuple[str, str]] = [
        ("thermal", f"max {_fmt(t.max_temp_c, ' C')}, throttling {_fmt(t.throttling)}"
                    + (" (fans only: cpu not throttled)" if t.throttling and t.cpu_throttling is False else "")
                    + (f" ({t.source}, {len(t.zones)} sensors)" if t.source else "")),
    ]
    for z in t.zones:
        rows.append((f"  {z.name}", f"{z.type or '?'}: {_fmt(z.temp_c, ' C')}, passive at {_fmt(z.passive_c, ' C')}"))
    for cd in t.cooling:
        rows.append((f"  {cd.name}", f"{cd.type or '?'}: state {_fmt(cd.cur_state)} of {_fmt(cd.max_state)}"))
    if t.throttle_count is not None:
        rows.append(("  throttle count", f"{t.throttle_count} (+{_fmt(t.throttle_events)} since last sample)"))
    if b.present:
        rows.append(("battery", f"{_fmt(b.percent, ' %')}, {b.charging or 'status unknown'}, plugged {_fmt(b.plugged)}"))
        for x in b.batteries:
            rows.append((f"  {x.name}", f"{_fmt(x.percent, ' %')}, {x.status or 'status unknown'}"))
    else:
        rows.append(("battery", f"none, plugged {_fmt(b.plugged)}"))
    for a in b.adapters:
        rows.append((f"  {a.name}", f"{a.type}, online {_fmt(a.online)}"))
    rows.append(("power mode", _fmt(p.power_mode)))
    if p.platform_profile_choices:
        rows.append(("  profile choices", " ".join(p.platform_profile_choices)))
    if p.ppd_profile is not None:
        rows.append(("  power-profiles-daemon", f"{p.ppd_profile}" + (f", degraded: {p.ppd_degraded}" if p.ppd_degraded else "")))
    rows.append(("  governor / EPP", f"{_fmt(p.governor)} / {_fmt(p.epp)}"))
    others = f"{_fmt(c.others_busy_cores, digits=2)} of {_fmt(c.cores)} cores" if c.others_busy_cores is not None else "unknown"
    rows.append(("cpu", f"load by others {_fmt(c.load, digits=2)} ({others}), "
                        f"{_fmt(c.runnable_others)} other tasks runnable"))
    rows.append(("  pressure / steal", f"PSI some avg10 {_fmt(c.psi_some_avg10, ' %')}, steal {_fmt(None if c.steal is None else 100 * c.steal, ' %')}"))
    rows.append(("  clock", f"{_fmt(c.cur_mhz, ' MHz', 0)} of {_fmt(c.max_mhz, ' MHz', 0)} (limit {_fmt(c.limit_mhz, ' MHz', 0)})"))
    gib = 1 << 30
    rows.append(("memory", f"{_fmt(None if m.available_bytes is None else m.available_bytes / gib, ' GiB')} available of "
                           f"{_fmt(None if m.total_bytes is None else m.total_bytes / gib, ' GiB')}, PSI some avg10 {_fmt(m.psi_some_avg10, ' %')}"))
    if not state.gpus:
        rows.append(("gpus", "none"))
    for g in state.gpus:
        free = None if g.memory_free_bytes is None else g.memory_free_bytes / gib
        rows.append((f"gpu {g.index}", f"{g.name or '?'}: util {_fmt(g.util_percent, ' %', 0)}, {_fmt(free, ' GiB')} free, "
                                       f"{_fmt(g.temp_c, ' C', 0)}, {_fmt(g.power_w, ' W', 0)} of {_fmt(g.power_limit_w, ' W', 0)}, "
                                       f"SM {_fmt(g.sm_clock_mhz, ' MHz', 0)} of {_fmt(g.sm_clock_max_mhz, ' MHz', 0)}, "
                                       f"thermal {_fmt(g.thermal_throttling)}, power cap {_fmt(g.power_capping)}"))
    for key, age in sorted(state.stale.items()):
        rows.append(("stale", f"{key}: last good value, {age:.1f} s old"))
    for note in state.notes:
        rows.append(("note", note))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
