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
    speed = None if args.at_rest else _present_speed()
    est = estimator.estimate(graph, device=args.device, speed=speed)
    latency = est.latency_ms if math.isfinite(est.latency_ms) else None
    if args.json:
        out = {"tier": est.tier, "latency_ms": None if latency is None else round(latency, 3),
               "device": est.device, "kernels": est.kernels}
        if speed is not None:
            out["slowdown"] = round(speed.cpu if est.device == "cpu" else (speed.gpu or 1.0), 3)
        print(json.dumps(out))
    else:
        shown = "does not fit on this device now" if latency is None else f"{latency:.2f} ms"
        print(f"{est.tier}  ({shown} on {est.device}, {est.kernels} kernels)")
    if args.kernels:
        _print_kernels(estimator, graph, est.device)
    return 0


def _present_speed():
    """The device's present speed, predicted from its state (no warm refresh for one estimate)."""
    from monitors.speed import speed_from_state
    from probes.refresh import default_threads
    from probes.state import Sampler

    sampler = Sampler()
    try:
        return speed_from_state(sampler.sample_over(), measured=None, cores=default_threads())
    finally:
        sampler.close()


def _print_kernels(estimator, graph, device: str) -> None:
    model = estimator.models[device]
    plan = estimator.plan(graph, device)
    for k in plan.kernels:
        ms = 1000 * (model.kernel_seconds(k) + model.calibration.per_kernel_s)
        params = "x".join(f"{p:g}" for p in k.params)
        print(f"  {k.family:<10} {k.op:<28} {params:<22} {ms:9.3f} ms")
