"""`daop-agent estimate MODEL`: the tier (and, locally, the latency) of one inference now."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from agent import calibration_store
from agent.config import STATE_DIR_HELP, default_state_dir
from agent.progress import ProgressBar
from monitors.errors import BadInput
from monitors.graphs.importer import load_decoder, load_graph, parse_input_spec
from monitors.placement import DEVICE_TYPES, POWER_PREFERENCES, ContextHints, Placement, device_accelerator, place
from monitors.pricing.costmodel import CostModel
from monitors.pricing.estimator import Estimator
from monitors.pricing.generation import GenerationSpec
from monitors.pricing.kernels import Plan
from monitors.speed.present import AT_REST, Measurement, Speed, speed_from_state
from probes import providers, refresh
from probes.state import DeviceState, Sampler

HELP = "Estimate one inference of a weightless model (.onnx, .webnn, .json) on this device, now."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to .onnx (weights inline, external or absent), .webnn or .json")
    p.add_argument("--input", action="append", default=[], metavar="NAME=1x3x224x224[:float32]",
                   help="bind an input's shape (and data type); repeat for several inputs")
    p.add_argument("--device", choices=(*DEVICE_TYPES, "auto"), default=None,
                   help="where to estimate (WebNN's deviceType): cpu (the default without hints), gpu, npu, or auto: "
                        "the fastest calibrated device")
    p.add_argument("--power-preference", choices=POWER_PREFERENCES, default=None,
                   help="WebNN's powerPreference hint (fallback: the proposed value, the CPU); implies --device auto")
    p.add_argument("--accelerated", action=argparse.BooleanOptionalAction, default=None,
                   help="WebNN's proposed accelerated hint: prefer an accelerator (--accelerated) or not "
                        "(--no-accelerated: the CPU); implies --device auto")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--state-dir", type=Path, default=None, help=f"where calibrations are kept ({STATE_DIR_HELP})")
    p.add_argument("--at-rest", action="store_true",
                   help="ignore the device's present state (load, throttling): the calibrated device at rest")
    p.add_argument("--kernels", action="store_true", help="list the planned kernels and their estimated times")
    p.add_argument("--prompt-tokens", type=int, metavar="N",
                   help="an LLM (ONNX with a KV cache): a generation after a prompt of N tokens; its inputs' "
                        "shapes come from the graph (and genai_config.json beside it)")
    p.add_argument("--output-tokens", type=int, metavar="N", help="... answering N tokens (default 1)")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR", help="read the device state's sysfs from DIR")
    p.add_argument("--procfs-root", default="/proc", metavar="DIR", help="read the device state's procfs from DIR")


def run(args: argparse.Namespace) -> int:
    started = time.time()
    try:
        return _run(args)
    finally:
        _upgrade_fresh_quick_calibrations(args, started)


def _run(args: argparse.Namespace) -> int:
    for flag, root in (("--sysfs-root", args.sysfs_root), ("--procfs-root", args.procfs_root)):
        if not os.path.isdir(root):
            raise BadInput(f"{flag} {root}: not a directory")
    if args.prompt_tokens is not None or args.output_tokens is not None:
        return _run_generation(args)
    inputs = dict(parse_input_spec(text) for text in args.input)
    graph = load_graph(args.model, inputs=inputs)
    device = _device(args)
    estimator, speed, state = _estimator_and_speed(args, device)
    est = estimator.estimate(graph, device=device.device, speed=speed)
    latency = est.latency_ms if math.isfinite(est.latency_ms) else None
    acc = device_accelerator(est.device, state.accelerators) if state is not None else None
    if args.json:
        out = {"tier": est.tier, "latency_ms": None if latency is None else round(latency, 3),
               "device": est.device, "kernels": est.kernels, "calibration": _which(estimator, est.device)}
        if acc is not None:
            out["accelerator"] = acc.id
        if not args.at_rest:
            out["slowdown"] = round(speed.cpu if est.device == "cpu" else (speed.gpu or 1.0), 3)
            if est.device == "cpu":
                out["handoff_ms_per_mb"] = speed.handoff_ms_per_mb
                out["memory"] = speed.memory
                out["gemm"] = speed.gemm
        print(json.dumps(out))
    else:
        shown = "does not fit on this device now" if latency is None else f"{latency:.2f} ms"
        where = est.device + (f" {acc.id}" if acc is not None else "")
        print(f"{est.tier}  ({shown} on {where}, {est.kernels} kernels, {_which(estimator, est.device)} calibration)")
    if args.kernels:
        _print_plan(estimator.models[est.device], estimator.plan(graph, est.device))
    return 0


def _device(args: argparse.Namespace) -> Placement:
    """Where to estimate: --device, or where the WebNN hints place it among the accelerators and providers here."""
    hinted = args.power_preference is not None or args.accelerated is not None
    device = args.device or ("auto" if hinted else "cpu")
    if device == "cpu" and not hinted:
        return Placement("cpu", None)
    hints = ContextHints(None if device == "auto" else device, args.power_preference or "default", args.accelerated)
    placement = place(hints, _sample(args.sysfs_root, args.procfs_root).accelerators, providers.installed())
    for note in placement.notes:
        print(f"daop-agent: {note}", file=sys.stderr)
    return placement


def _estimator_and_speed(args: argparse.Namespace, device: Placement) -> tuple[Estimator, Speed, DeviceState | None]:
    """The estimator (calibrating first where needed), and the present speed with the state it was read from
    (none --at-rest)."""
    estimator = calibration_store.load_estimator(args.state_dir or default_state_dir(), device=device.device,
                                                 quick=True, progress=ProgressBar("calibrating"))
    if args.at_rest:
        return estimator, AT_REST, None
    cpu = estimator.calibrations.get("cpu")
    state = _sample(args.sysfs_root, args.procfs_root)  # after a calibration that may have just run
    return estimator, _present_speed(state, cpu.refresh_reference if cpu else {}), state


def _run_generation(args: argparse.Namespace) -> int:
    """TTFT, time per output token and the whole of a generation; the tier is the whole's."""
    if args.input:
        raise BadInput("--input does not go with --prompt-tokens/--output-tokens: the generation binds the inputs")
    if args.prompt_tokens is None:
        raise BadInput("--output-tokens needs --prompt-tokens")
    spec = GenerationSpec(args.prompt_tokens, 1 if args.output_tokens is None else args.output_tokens)
    source = load_decoder(args.model)
    device = _device(args)
    estimator, speed, _ = _estimator_and_speed(args, device)
    plans = {d: estimator.plan_generation(source.decoder, spec, source.graph, d)
             for d in (estimator.devices if device.device == "auto" else (device.device,))}
    est = estimator.estimate_generation(plans, device=device.device, speed=speed)
    t = est.times
    if args.json:
        finite = t.feasible
        out = {"tier": t.tier, "latency_ms": round(t.total_ms, 3) if finite else None,
               "time_to_first_token_ms": round(t.ttft_ms, 3) if finite else None,
               "time_per_output_token_ms": round(t.tpot_ms, 3) if finite else None,
               "total_ms": round(t.total_ms, 3) if finite else None,
               "time_to_first_token_tier": t.ttft_tier, "time_per_output_token_tier": t.tpot_tier,
               "prompt_tokens": spec.prompt_tokens, "output_tokens": spec.output_tokens,
               "memory_bytes": est.memory_bytes, "fits": est.why_not is None,
               "device": est.device, "kernels": est.kernels, "calibration": _which(estimator, est.device)}
        if not args.at_rest:
            out["slowdown"] = round(speed.cpu if est.device == "cpu" else (speed.gpu or 1.0), 3)
            if est.device == "cpu":
                out["memory"] = speed.memory
                out["gemm"] = speed.gemm
        print(json.dumps(out))
    elif not t.feasible:
        print(f"{t.tier}  (does not run on {est.device} now: {est.why_not or 'the device is unavailable'})")
    else:
        after = (f", then {t.tpot_ms:.1f} ms a token for {spec.output_tokens - 1} more"
                 if spec.output_tokens > 1 else "")
        print(f"{t.tier}  ({_duration(t.total_ms)} on {est.device} for {spec.output_tokens} token(s) after "
              f"{spec.prompt_tokens}: first token {_duration(t.ttft_ms)}{after}; needs "
              f"{est.memory_bytes / 1e9:.2f} GB; {_which(estimator, est.device)} calibration)")
    if args.kernels:
        plan = plans[est.device]
        model = estimator.models[est.device]
        for what, p in [("prefill", plan.prefill)] + [(f"decode at {past}", q) for past, _, q in plan.decode]:
            print(f"{what}: {1000 * model.seconds(p):.2f} ms at rest, {len(p.kernels)} kernels")
            _print_plan(model, p)
    return 0


def _which(estimator: Estimator, device: str) -> str:
    """Which calibration answered: 'quick' or 'full'."""
    return "quick" if estimator.calibrations[device].quick else "full"


def _upgrade_fresh_quick_calibrations(args: argparse.Namespace, started: float) -> None:
    """A first estimate answers on the quick calibration it has just made, then leaves the full one running
    in the background (as the agent does), so that the next estimates answer on it."""
    state_dir = args.state_dir or default_state_dir()
    fresh = [d for d in ("cpu", "gpu") if (path := calibration_store.calibration_path(state_dir, d)).exists()
             and path.stat().st_mtime >= started and (cal := calibration_store.load(state_dir, d)) and cal.quick]
    if fresh:
        try:
            pid = calibration_store.start_upgrade(state_dir)
        except OSError as exc:  # the answer stands on the quick calibration; `daop-agent calibrate` remains
            print(f"daop-agent: answered on a quick calibration; could not start the full one: {exc}", file=sys.stderr)
            return
        print(f"daop-agent: answered on a quick calibration; the full one is under way in the background "
              f"(pid {pid}, about a minute; its log: {Path(state_dir) / calibration_store.UPGRADE_LOG})",
              file=sys.stderr)


def _duration(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


def _sample(sysfs_root: str, procfs_root: str) -> DeviceState:
    """The device's state over a window (load is a delta between two samples)."""
    sampler = Sampler(sysfs_root, procfs_root)
    try:
        return sampler.sample_over()
    finally:
        sampler.close()


def _present_speed(state: DeviceState, reference: dict[str, float]) -> Speed:
    """The device's present speed: its state, then one warm refresh against the calibration's reference, as the
    agent measures (none without a reference: the prediction alone); the stream probe too where the reference has
    it, so that a model that streams its weights pays a neighbour's use of memory bandwidth, and the gemm probe, so
    that a calibration read in a spell of slow float products does not price a model's products at that speed."""
    threads = refresh.default_threads()
    if not reference:
        return speed_from_state(state, threads)
    now = refresh.measure(stream=refresh.STREAM_KEY in reference)
    measurement = Measurement.taken_in(state, threads, refresh.slowdown(now, reference),
                                       refresh.handoff_ms_per_mb(now, reference),
                                       refresh.memory_slowdown(now, reference), refresh.gemm_slowdown(now, reference))
    return speed_from_state(state, threads, measurement, current=True)


def _print_plan(model: CostModel, plan: Plan) -> None:
    for k, seconds in zip(plan.kernels, model.plan_kernel_seconds(plan), strict=True):
        ms = 1000 * (seconds + model.calibration.per_kernel_s)
        params = "x".join(f"{p:g}" for p in k.params)
        print(f"  {k.family:<10} {k.op:<28} {params:<22} {ms:9.3f} ms")
