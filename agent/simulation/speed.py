"""The simulated device's own speed: what the host measures, scaled to the device a scenario describes.

A scenario says how fast its device is (`[speed]`: a reference model takes `at_rest_ms` on it at rest). Its
events then hang on that device, not on the host that runs it: the host's calibration is scaled so that it
prices the reference at `at_rest_ms` (the agent's estimates are the device's), and the apps' runs are scaled
by the reference's real run here (what an app measures is the device's). The warm refresh reads the simulated
device in ratios to its own reference (device.py), which no scale changes. So the same scenario gives the
same events on a host three times faster or slower; what the host cannot change is its share of noise.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.simulation.app import run_ms
from agent.simulation.device import HZ, HostShare
from agent.simulation.scenario import DeviceSpeed
from monitors.graphs.importer import load_graph
from monitors.pricing.estimator import Estimator
from probes.calibration import Calibration, FamilyTable


@dataclass(frozen=True)
class Scales:
    """The device against the host, for one run of a scenario."""

    calibration: float = 1.0  # the device's calibrated times over the host's
    apps: float = 1.0  # an app's run on the device over the same run on the host's CPUs
    host_estimate_ms: float | None = None  # the reference as the host's calibration prices it
    host_run_ms: float | None = None  # ... and as it runs here without the host's other tenants (only with apps)


def scaled(cal: Calibration, factor: float) -> Calibration:
    """The calibration of a device `factor` times as slow as the calibrated one: every time it holds times
    `factor`, every rate over `factor` (so each estimate is `factor` times the calibrated one)."""
    return replace(
        cal,
        tables={name: FamilyTable(t.axes, tuple((p, s * factor) for p, s in t.points))
                for name, t in cal.tables.items()},
        per_kernel_s=cal.per_kernel_s * factor,
        per_run_s=cal.per_run_s * factor,
        stream_bytes_per_s=cal.stream_bytes_per_s / factor,
        read_rates=tuple((size, rate / factor) for size, rate in cal.read_rates),
        quantized_read_rates={f: (size, rate / factor, start_s * factor)
                              for f, (size, rate, start_s) in cal.quantized_read_rates.items()},
        attention_chains=tuple((p, s * factor) for p, s in cal.attention_chains),
    )


def reference_estimate_ms(cal: Calibration, spec: DeviceSpeed) -> float:
    """The reference model at rest, as this calibration prices it on the CPU."""
    return Estimator({"cpu": cal}).estimate(load_graph(spec.model, inputs=spec.inputs or None), "cpu").latency_ms


def scales(spec: DeviceSpeed | None, host: Calibration, cpus: Sequence[int], apps: bool) -> Scales:
    """How the device a scenario states stands against this host (`host`: its CPU calibration; `cpus`: the
    host CPUs the device's load and apps run on; `apps`: whether the scenario runs any, which costs a real
    run of the reference, about a second)."""
    if spec is None:
        return Scales()
    estimate = reference_estimate_ms(host, spec)
    run = run_without_tenants_ms(spec, cpus) if apps else None
    return Scales(spec.at_rest_ms / estimate, spec.at_rest_ms / run if run else 1.0, estimate, run)


def run_without_tenants_ms(spec: DeviceSpeed, cpus: Sequence[int]) -> float:
    """The reference's run on these CPUs of the host, as it would be without the host's other tenants: their share
    over the measurement (HostShare) taken out, as it is from each app's run (app.py). Measured beside a busy
    process without it, the reference counted the neighbour once and the apps' reports a second time: they read
    a third of the device's time."""
    tenants = HostShare(list(cpus))
    used = _children_cpu_s()
    run = run_ms(spec.model, spec.inputs, cpus)
    return run / tenants.share(int((_children_cpu_s() - used) * HZ))


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended children (the measurement's, once it is reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
