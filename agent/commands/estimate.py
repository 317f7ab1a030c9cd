"""`daop-agent estimate MODEL`: the tier (and, locally, the latency) of one inference now."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from agent import calibration_store
from agent.config import default_state_dir
from agent.progress import ProgressBar
from monitors.importer import load_graph, parse_input_spec

HELP = "Estimate one inference of a weightless model (.onnx, .webnn, .json) on this device, now."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to .onnx (weights inline, external or absent), .webnn or .json")
    p.add_argument("--input", action="append", default=[], metavar="NAME=1x3x224x224[:float32]",
                   help="bind an input's shape (and data type); repeat for several inputs")
    p.add_argument("--device", choices=("cpu", "gpu", "auto"), default="cpu")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--state-dir", type=Path, default=None, help="where calibrations are kept")
    p.add_argument("--at-rest", action="store_true",
                   help="ignore the device's present state (load, throttling): the calibrated device at rest")
    p.add_argument("--kernels", action="store_true", help="list the planned kernels and their estimated times")


def run(args: argparse.Namespace) -> int:
    inputs = dict(parse_input_spec(text) for text in args.input)
    graph = load_graph(args.model, inputs=inputs)
    state_dir = args.state_dir or default_state_dir()
    estimator = calibration_store.load_estimator(state_dir, device=args.device, quick=True,
                                                 progress=ProgressBar("calibrating"))
    cpu = estimator.calibrations.get("cpu")
    speed = None if args.at_rest else _present_speed(cpu.refresh_reference if cpu else {})
    est = estimator.estimate(graph, device=args.device, speed=speed)
    latency = est.latency_ms if math.isfinite(est.latency_ms) else None
    if args.json:
        out = {"tier": est.tier, "latency_ms": None if latency is None else round(latency, 3),
               "device": est.device, "kernels": est.kernels}
        if speed is not None:
            out["slowdown"] = round(speed.cpu if est.device == "cpu" else (speed.gpu or 1.0), 3)
            if est.device == "cpu":
                out["handoff_ms_per_mb"] = speed.handoff_ms_per_mb
        print(json.dumps(out))
    else:
        shown = "does not fit on this device now" if latency is None else f"{latency:.2f} ms"
        print(f"{est.tier}  ({shown} on {est.device}, {est.kernels} kernels)")
    if args.kernels:
        _print_kernels(estimator, graph, est.device)
    return 0


def _present_speed(reference: dict[str, float]):
    """The device's present speed: its state over a window, then one warm refresh against the calibration's
    reference, as the agent measures (none without a reference: the prediction alone)."""
    from monitors.speed import speed_from_state
    from probes import refresh
    from probes.state import Sampler

    sampler = Sampler()
    try:
        state = sampler.sample_over()
    finally:
        sampler.close()
    measured = handoff = None
    if reference:
        now = refresh.measure()
        measured, handoff = refresh.slowdown(now, reference), refresh.handoff_ms_per_mb(now, reference)
    return speed_from_state(state, measured, refresh.default_threads(), measured_current=measured is not None,
                            handoff_ms_per_mb=handoff)


def _print_kernels(estimator, graph, device: str) -> None:
    model = estimator.models[device]
    plan = estimator.plan(graph, device)
    for k in plan.kernels:
        ms = 1000 * (model.kernel_seconds(k) + model.calibration.per_kernel_s)
        params = "x".join(f"{p:g}" for p in k.params)
        print(f"  {k.family:<10} {k.op:<28} {params:<22} {ms:9.3f} ms")
