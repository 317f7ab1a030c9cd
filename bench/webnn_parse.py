"""Figures for the WebNN text front end: parse+lower speed, and how a hostile file is refused.

    .venv/bin/python -m bench.webnn_parse

Prints the time to turn tests/data/mobilenet_like.webnn into ONNX, and the
time and peak Python memory to refuse a one-million-node text under the
default limits (Limits().max_nodes).
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

from monitors.errors import LimitExceeded
from monitors.graphs import webnn_text
from monitors.graphs.limits import Limits

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    text = (ROOT / "tests" / "data" / "mobilenet_like.webnn").read_text()
    runs = 50
    start = time.perf_counter()
    for _ in range(runs):
        model = webnn_text.to_onnx(text, Limits())
    per = (time.perf_counter() - start) / runs
    print(f"mobilenet_like.webnn -> ONNX ({len(model.graph.node)} nodes): {per * 1e3:.2f} ms")

    body = "".join(f"n{i} = relu(x);\n" for i in range(1_000_000))
    huge = 'webnn_graph "huge" v1 { inputs { x: f32[1]; } nodes {\n' + body + "} outputs { n0; } }"
    print(f"hostile text: 1,000,000 nodes, {len(huge) / 2**20:.1f} MiB")
    start = time.perf_counter()
    try:
        webnn_text.to_onnx(huge, Limits())
    except LimitExceeded as e:
        print(f"  refused in {time.perf_counter() - start:.2f} s: {e}")
    tracemalloc.start()
    try:
        webnn_text.to_onnx(huge, Limits())
    except LimitExceeded:
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"  peak Python memory while refusing: {peak / 2**20:.1f} MiB (the text itself not counted)")


if __name__ == "__main__":
    main()
