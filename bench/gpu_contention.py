"""A GPU monitor against a real competing GPU workload, and against the agent's own GPU calibration.

On a machine with an NVIDIA GPU and onnxruntime's CUDA provider (docs/device-state.md, "GPUs"):

1. The agent starts on the calibrations in `--state-dir`. Where they are quick ones, it redoes them in full in
   the background (its own work on the GPU, for a minute or two) while a GPU monitor is live: every event in
   that time is a false one, since nothing else runs.
2. Then a second process runs a large model's matrix products on the same GPU (PyTorch, bf16 GEMMs) for
   `--hog-s` seconds, and stops: the monitor should turn false, then true again after.

The monitor is a deadline at `--margin` times the model's at-rest GPU estimate (the privacy jitter off: its
boundary is exact), so a competitor that halves the model's speed crosses it. Beside the events, the model's
real latency on the GPU (onnxruntime, inputs from host memory) is timed at rest and under the competitor,
which says what the slowdown really was.

    python -m bench.gpu_contention --state-dir DIR [--model resnet50] [--hog-s 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import groundtruth, zoo
from bench.support import start_agent, stop_agent, wait_online
from daop_client import Context, DaopClient
from monitors.graphs.importer import load_graph

DEVICE_ID = "gpubench"
# The competitor: bf16 GEMMs back to back, each a few ms, until the time is up (one line once it runs).
HOG = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
(a @ b).sum().item()
print("running", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
print("stopped", flush=True)
"""


def real_ms(path: Path, inputs: dict[str, Any], seconds: float) -> float:
    """Median wall time of runs on the CUDA provider for about `seconds` (a session of this process)."""
    import onnxruntime as ort  # noqa: PLC0415 - the GPU bench's own session

    session = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
    feeds = groundtruth._feeds(session, groundtruth._plain_inputs(inputs))
    for _ in range(5):
        session.run(None, feeds)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000.0


async def run(state_dir: Path, model: zoo.ZooModel, hog_s: float, margin: float, settle_s: float,
              calibration_wait_s: float) -> dict[str, Any]:
    from agent import calibration_store  # noqa: PLC0415 - loads the estimator: after the arguments are read
    from agent.analysis import quick_calibrations  # noqa: PLC0415 - likewise

    path = model.path()
    estimator = calibration_store.load_estimator(state_dir, device="gpu")
    estimate_ms = estimator.estimate(load_graph(path, inputs=model.inputs), device="gpu").latency_ms
    deadline_ms = margin * estimate_ms
    config = Path(tempfile.mkdtemp()) / "agent.toml"
    config.write_text("[privacy]\njitter = 0\n")
    quick = quick_calibrations(state_dir)
    agent, port = start_agent(state_dir, DEVICE_ID, "--config", str(config),
                              *(["--calibration", "full"] if quick else []))
    out: dict[str, Any] = {"model": model.name, "estimate_ms": estimate_ms, "deadline_ms": deadline_ms,
                           "quick_calibrations": list(quick)}
    events: list[tuple[float, bool]] = []
    try:
        await wait_online(port, DEVICE_ID)
        async with DaopClient(f"mqtt://127.0.0.1:{port}", DEVICE_ID) as daop:
            frame = {n: (list(s.shape), s.dtype) for n, s in model.inputs.items()}
            monitor = await daop.create_monitor(path.read_bytes(), inputs=frame, deadline_ms=deadline_ms,
                                                context=Context(device_type="gpu"))
            created = time.monotonic()
            out["created_meets"] = monitor.meets

            async def follow() -> None:
                async for event in monitor:
                    events.append((time.monotonic(), event.meets))
            follower = asyncio.create_task(follow())

            log = state_dir / "agent.log"
            if quick:  # the agent's own calibration on the GPU: no event may come of it
                end = time.monotonic() + calibration_wait_s
                while time.monotonic() < end and "full calibration ready" not in log.read_text():
                    await asyncio.sleep(1.0)
                out["own_calibration_s"] = time.monotonic() - created
                out["own_calibration_done"] = "full calibration ready" in log.read_text()
                full = calibration_store.load_estimator(state_dir, device="gpu")  # the monitor's price from now on
                out["estimate_full_ms"] = full.estimate(load_graph(path, inputs=model.inputs), device="gpu").latency_ms
            await asyncio.sleep(settle_s)
            out["events_before_competitor"] = len(events)
            out["rest_real_ms"] = await asyncio.to_thread(real_ms, path, model.inputs, 3.0)

            hog = subprocess.Popen([sys.executable, "-c", HOG, str(hog_s)], stdout=subprocess.PIPE, text=True)
            assert hog.stdout is not None
            await asyncio.to_thread(hog.stdout.readline)
            started = time.monotonic()
            out["loaded_real_ms"] = await asyncio.to_thread(real_ms, path, model.inputs, min(3.0, hog_s / 2))
            await asyncio.to_thread(hog.stdout.readline)  # its last product is done (the process takes longer)
            stopped = time.monotonic()
            await asyncio.to_thread(hog.wait)
            await asyncio.sleep(max(settle_s, 5.0))
            follower.cancel()
            await monitor.delete()
    finally:
        stop_agent(agent)
    during = [(t, m) for t, m in events if started <= t < stopped]
    after = [(t, m) for t, m in events if t >= stopped]
    out.update(
        events=[(round(t - created, 2), m) for t, m in events],
        false_after_s=next((round(t - started, 2) for t, m in during if not m), None),
        true_after_s=next((round(t - stopped, 2) for t, m in after if m), None),
        hog_s=round(stopped - started, 2),
        real_slowdown=out["loaded_real_ms"] / out["rest_real_ms"],
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="calibrations for cpu and gpu (quick: "
                        "the agent redoes them in full while the monitor is live)")
    parser.add_argument("--model", default="resnet50", help="a zoo model's name (bench/zoo.py)")
    parser.add_argument("--hog-s", type=float, default=10.0, help="how long the competitor runs")
    parser.add_argument("--margin", type=float, default=1.5, help="the deadline, in at-rest estimates")
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--calibration-wait-s", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    model = next((m for m in zoo.ZOO if m.name == args.model), None)
    if model is None:
        print(f"no zoo model named {args.model!r}", file=sys.stderr)
        return 2
    out = asyncio.run(run(args.state_dir, model, args.hog_s, args.margin, args.settle_s, args.calibration_wait_s))
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
