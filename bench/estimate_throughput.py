"""Benchmark: estimate throughput, in-process and over MQTT.

    .venv/bin/python -m bench.estimate_throughput [--seconds 20] [--clients 16]

1. In-process: graph import + kernel plan + pricing of one inference, per
   second, for a few real graphs (the blur segmenter at 720p in the
   webnn-graph text format, the MLP in webnn-graph-json, ResNet-50 from the
   onnx wheel's test data, weightless).
2. End to end: the real agent (`daop-agent run --local-broker`, two
   estimator workers by default) answering `estimate` requests from
   `--clients` concurrent MQTT v5 clients for `--seconds`: requests per
   second and answer latency p50/p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import onnx

from agent import calibration_store
from agent.config import default_state_dir
from bench.support import start_agent, stop_agent, wait_online
from daop_client import DaopClient
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.pricing.estimator import Estimator

REPO = Path(__file__).resolve().parent.parent


def models() -> dict[str, tuple[object, str, dict]]:
    """name -> (source, format, inputs)."""


    out: dict[str, tuple[object, str, dict]] = {
        "blur_segmenter 720p (.webnn)": ((REPO / "examples/blur_segmenter.webnn").read_text(), "webnn",
                                         {"image": InputSpec((1, 720, 1280, 3), None)}),
        "mlp batch 64 (.json)": (json.loads((REPO / "examples/mlp.json").read_text()), "json",
                                 {"features": InputSpec((64, 256), None)}),
    }
    resnet = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    if resnet.exists():
        out["resnet50 (.onnx)"] = (resnet.read_bytes(), "onnx", {})
    return out


def in_process(state_dir: Path, seconds: float) -> None:

    est = Estimator.load(state_dir)
    for name, (source, fmt, inputs) in models().items():
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or n < 3:
            graph = load_graph(source, fmt=fmt, inputs=inputs or None)
            plan = est.plan(graph, "cpu")
            est.base_latency_ms(plan, "cpu")
            n += 1
        took = time.perf_counter() - t0
        print(f"  {name:<32} {n / took:8.1f} estimates/s ({1000 * took / n:.1f} ms each)")


async def over_mqtt(port: int, clients: int, seconds: float) -> None:

    source = REPO / "examples/blur_segmenter.webnn"
    inputs = {"image": ((1, 360, 640, 3), None)}
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def one_client(i: int) -> None:
        async with DaopClient(f"mqtt://127.0.0.1:{port}", "tput", timeout_s=120) as daop:
            await daop.estimate(source, inputs)  # warm
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                await daop.estimate(source, inputs)
                latencies.append(time.perf_counter() - t0)

    t0 = time.monotonic()
    await asyncio.gather(*(one_client(i) for i in range(clients)))
    wall = time.monotonic() - t0
    latencies.sort()
    p95 = latencies[max(0, int(0.95 * len(latencies)) - 1)]
    print(f"  {len(latencies)} estimates of the blur segmenter (360p) from {clients} clients in {wall:.1f} s: "
          f"{len(latencies) / wall:.1f} requests/s; latency p50 {1000 * statistics.median(latencies):.0f} ms, "
          f"p95 {1000 * p95:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--state-dir", type=Path, default=None, help="calibration to copy (default: the agent's)")
    args = ap.parse_args()


    source = args.state_dir or default_state_dir()
    calibration_store.load_estimator(source, quick=True)  # calibrate once if there is none
    print("in-process (one thread):")
    in_process(source, min(5.0, args.seconds))
    with tempfile.TemporaryDirectory(prefix="daop-tput-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        shutil.copy(calibration_store.calibration_path(source, "cpu"), state)
        agent, port = start_agent(state, "tput", log=Path(tmp) / "agent.log")
        try:
            asyncio.run(wait_online(port, "tput"))
            print("over MQTT (the agent, 2 estimator workers):")
            asyncio.run(over_mqtt(port, args.clients, args.seconds))
        finally:
            stop_agent(agent)


if __name__ == "__main__":
    main()
