"""`daop-agent state`: the device state as the agent sees it."""

from __future__ import annotations

import argparse
import json
import os

from monitors.errors import BadInput
from monitors.placement import calibrated_device, no_provider_line, providers_for
from probes.state import DeviceState, Sampler

HELP = "Show the device state as the agent sees it (thermal, battery, power mode, CPU, GPUs and NPUs)."


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
    installed = _providers() if state.accelerators else ()
    if args.json:
        doc = state.to_json()
        for acc, out in zip(state.accelerators, doc["accelerators"], strict=True):
            out["providers"] = providers_for(acc, installed)
            out["calibrated_as"] = calibrated_device(acc, state.accelerators, installed)
        doc["notes"] += provider_notes(state, installed)
        print(json.dumps(doc))
    else:
        print(format_table(state, installed))
    return 0


def _providers() -> tuple[str, ...]:
    from probes import providers  # noqa: PLC0415 - loads onnxruntime: only when there is an accelerator to match

    return providers.installed()


def provider_notes(state: DeviceState, installed: tuple[str, ...]) -> list[str]:
    """One line for each accelerator no estimate runs on, and why."""
    return [no_provider_line(a, installed) for a in state.accelerators
            if calibrated_device(a, state.accelerators, installed) is None]


def _fmt(value: object, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _gib(value: int | None) -> float | None:
    return None if value is None else value / (1 << 30)


def _percent(share: float | None) -> float | None:
    return None if share is None else 100 * share


def format_table(state: DeviceState, installed: tuple[str, ...] = ()) -> str:
    """A readable table: one signal per line, `unknown` where it cannot be read."""
    t, b, p, c, m = state.thermal, state.battery, state.power, state.cpu, state.memory
    rows: list[tuple[str, str]] = [
        ("thermal", f"max {_fmt(t.max_temp_c, ' C')}, throttling {_fmt(t.throttling)}"
                    + (" (fans only: cpu not throttled)" if t.throttling and t.cpu_throttling is False else "")
                    + (f" ({t.source}, {len(t.zones)} sensors)" if t.source else "")),
    ]
    for z in t.zones:
        rows.append((f"  {z.name}",
                     f"{z.type or '?'}: {_fmt(z.temp_c, ' C')}, passive at {_fmt(z.passive_c, ' C')}"))
    for cd in t.cooling:
        rows.append((f"  {cd.name}", f"{cd.type or '?'}: state {_fmt(cd.cur_state)} of {_fmt(cd.max_state)}"))
    if t.throttle_count is not None:
        rows.append(("  throttle count", f"{t.throttle_count} (+{_fmt(t.throttle_events)} since last sample)"))
    if b.present:
        rows.append(("battery",
                     f"{_fmt(b.percent, ' %')}, {b.charging or 'status unknown'}, plugged {_fmt(b.plugged)}"))
        for x in b.batteries:
            rows.append((f"  {x.name}", f"{_fmt(x.percent, ' %')}, {x.status or 'status unknown'}"))
    else:
        rows.append(("battery", f"none, plugged {_fmt(b.plugged)}"))
    for adapter in b.adapters:
        rows.append((f"  {adapter.name}", f"{adapter.type}, online {_fmt(adapter.online)}"))
    rows.append(("power mode", _fmt(p.power_mode)))
    if p.platform_profile_choices:
        rows.append(("  profile choices", " ".join(p.platform_profile_choices)))
    rows.append(("  governor / EPP", f"{_fmt(p.governor)} / {_fmt(p.epp)}"))
    others = (f"{_fmt(c.others_busy_cores, digits=2)} of {_fmt(c.cores)} cores"
              if c.others_busy_cores is not None else "unknown")
    rows.append(("cpu", f"load by others {_fmt(c.load, digits=2)} ({others}), "
                        f"{_fmt(c.runnable_others)} other tasks runnable"))
    rows.append(("  pressure / steal",
                 f"PSI some avg10 {_fmt(c.psi_some_avg10, ' %')}, steal {_fmt(_percent(c.steal), ' %')}"))
    rows.append(("  clock", f"{_fmt(c.cur_mhz, ' MHz', 0)} of {_fmt(c.max_mhz, ' MHz', 0)} "
                            f"(limit {_fmt(c.limit_mhz, ' MHz', 0)})"))
    rows.append(("memory", f"{_fmt(_gib(m.available_bytes), ' GiB')} available of {_fmt(_gib(m.total_bytes), ' GiB')}, "
                           f"PSI some avg10 {_fmt(m.psi_some_avg10, ' %')}"))
    if not state.accelerators:
        rows.append(("accelerators", "none"))
    for a in state.accelerators:
        what = " ".join(p for p in (a.kind, a.name or "?", f"({a.driver or '?'}, {a.pci_slot or 'no PCI slot'})") if p)
        rows.append((a.id, f"{what}: busy {_fmt(_percent(a.busy), ' %', 0)}, "
                           f"by others {_fmt(_percent(a.others_busy), ' %', 0)}, "
                           f"by the agent {_fmt(_percent(a.own_busy), ' %', 0)} ({a.busy_source or 'no reading'}), "
                           f"{_fmt(a.clients)} clients of others"))
        if a.shares_system_memory:
            memory = "shares the system's memory"
        else:
            memory = f"{_fmt(_gib(a.memory_free_bytes), ' GiB')} free of {_fmt(_gib(a.memory_total_bytes), ' GiB')}"
        rows.append(("  memory / clock", f"{memory}; clock {_fmt(a.clock_mhz, ' MHz', 0)} of "
                                         f"{_fmt(a.clock_max_mhz, ' MHz', 0)}"
                                         + (f" (limit {a.clock_limit_mhz:.0f} MHz)" if a.clock_limit_mhz else "")
                                         + f", throttled {_fmt(a.throttled)}"
                                         + (f" ({', '.join(a.throttle_reasons)})" if a.throttle_reasons else "")))
        if a.power_w is not None or a.temp_c is not None:
            rows.append(("  power / temp",
                         f"{_fmt(a.power_w, ' W', 0)} of {_fmt(a.power_limit_w, ' W', 0)}, {_fmt(a.temp_c, ' C', 0)}"))
        calibrated = calibrated_device(a, state.accelerators, installed)
        rows.append(("  estimates", f"as device '{calibrated}'" if calibrated
                     else no_provider_line(a, installed).split(": ", 1)[1]))
    for key, age in sorted(state.stale.items()):
        rows.append(("stale", f"{key}: last good value, {age:.1f} s old"))
    for note in state.notes:
        rows.append(("note", note))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
