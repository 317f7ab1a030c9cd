"""Where does the estimate go wrong? Price onnxruntime's own kernels with the cost model.

For a zoo model, run it under onnxruntime's profiler, map every kernel it ran
to a cost-model family and parameters, and compare the measured kernel time
with the calibrated prediction: per family, and the worst kernels. This
separates cost-model errors (this report) from planning errors (the plan's
kernels differ from onnxruntime's: tests/test_planner.py).

    .venv/bin/python -m bench.kernel_errors resnet50 [--state-dir DIR] [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from agent.config import default_state_dir
from bench import support, zoo
from bench.groundtruth import _feeds, _plain_inputs
from monitors.graphs.importer import load_graph
from monitors.pricing.costmodel import CostModel
from monitors.pricing.kernels import Kernel, Plan
from monitors.pricing.planner import SECOND_PASS_ACTIVATIONS, SILU, memory_family
from probes.calibration import NCHWC_UPSAMPLE
from probes.microbench import profiler_cost

_LONGEST_FIRST = sorted(SECOND_PASS_ACTIVATIONS, key=len, reverse=True)  # "HardSigmoid" before "Sigmoid"


def kernel_of(op: str, shapes: list[list[int]], out_shape: list[int], in_bytes: float,
              out_bytes: float, name: str = "", silus: frozenset[str] = frozenset()) -> Kernel | None:
    """The cost-model kernel for one profiled onnxruntime kernel."""
    if op in ("Conv", "FusedConv") and len(shapes) >= 2 and len(shapes[1]) == 4:
        x, w = shapes[0], shapes[1]
        cout, cin_g, kh, kw = w
        groups = max(x[1] // max(cin_g, 1), 1)
        m = out_bytes / 4 / max(cout, 1)
        # The profile does not list a fused activation; a blocked kernel is named after its final output,
        # as in ".../Clip_output_0_nchwc", and all but Relu cost a pass over the output (planner.py).
        last = name.rsplit("/", 1)[-1]
        act = next((a for a in _LONGEST_FIRST if a in last), None)
        epilogue = None
        if act and "_nchwc" in last:
            epilogue = Kernel(memory_family(act), (2 * out_bytes,), 2 * out_bytes, act)
        if groups > 1 and cin_g == 1 and cout == x[1]:
            return Kernel("dwconv", (cout, m, kh * kw), 2.0 * cout * m * kh * kw, op, epilogue=epilogue,
                          input_bytes=in_bytes)
        fam = "conv1x1" if kh * kw == 1 else "conv"
        k = cin_g * kh * kw
        co = cout // groups
        return Kernel(fam, (m, k, co), 2.0 * m * k * co * groups, op, epilogue=epilogue, input_bytes=in_bytes)
    if op in ("MatMul", "FusedMatMul", "Gemm") and shapes:
        a = shapes[0]
        # a weight onnxruntime has prepacked is not listed among the inputs
        b = shapes[1] if len(shapes) > 1 and len(shapes[1]) > 1 else [a[-1], out_shape[-1]]
        m, k = (a[-2] if len(a) > 1 else 1), a[-1]
        n = b[-1] if op != "Gemm" or len(b) < 2 else (b[1] if b[0] == k else b[0])
        batch = math.prod(a[:-2]) if len(a) > 2 else 1
        if len(b) > 2 and math.prod(b[:-2]) > 1:
            return Kernel("bmm", (batch, m, k, n), 2.0 * batch * m * k * n, op)
        return Kernel("gemm", (batch * m, k, n), 2.0 * batch * m * k * n, op)
    moved = max(in_bytes + out_bytes, 1.0)
    if op == "Upsample" and "_nchwc" in name:  # a Resize in the blocked layout (planner.py: _blocked_resize)
        op = NCHWC_UPSAMPLE
    if op == "QuickGelu" and name.removesuffix("_kernel_time") in silus:  # alpha 1, which runs 2-3x faster
        op = SILU
    family = memory_family(op)
    return Kernel(family, (moved,), moved, op) if family else None


def profile(path: str, inputs: dict, runs: int = 10) -> tuple[list[dict], float, frozenset[str]]:
    """Per-kernel events of the last `runs` runs, the median wall time of a run, and the names of the QuickGelu
    kernels of alpha 1 (SiLU: the profile does not tell them apart, the optimized graph does)."""
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "p")
        so.log_severity_level = 3
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath, load_external_data=False)
        silus = frozenset(n.name for n in optimized.graph.node if n.op_type == "QuickGelu"
                          and next((a.f for a in n.attribute if a.name == "alpha"), 1.702) == 1.0)
        feeds = _feeds(s, _plain_inputs(inputs))
        for _ in range(3):
            s.run(None, feeds)
        walls = []
        for _ in range(runs):
            t = time.perf_counter()
            s.run(None, feeds)
            walls.append(time.perf_counter() - t)
        events = json.load(open(s.end_profiling()))
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = len(nodes) // (runs + 3)
    return nodes[-per_run * runs:], float(np.median(walls)), silus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    m = zoo.BY_NAME[args.model]
    path = str(m.path())

    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    est = support.scored_estimator(state_dir, "cpu")
    cm: CostModel = est.models["cpu"]
    events, wall, silus = profile(path, m.inputs)
    bias = profiler_cost()  # each profiled kernel's time carries it (4-23 us on VMs): taken off, as calibration does
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    info: dict[str, dict] = {}
    for e in events:
        by_name[e["name"]].append(max(e["dur"] * 1e-6 - bias, 0.0))
        info[e["name"]] = e["args"]
    fam_real: dict[str, float] = collections.defaultdict(float)
    fam_pred: dict[str, float] = collections.defaultdict(float)
    rows = []
    for name, durs in by_name.items():
        a = info[name]
        shapes = [list(d.values())[0] for d in a.get("input_type_shape", [])]
        outs = [list(d.values())[0] for d in a.get("output_type_shape", [])]
        k = kernel_of(a["op_name"], shapes, outs[0] if outs else [], float(a.get("activation_size", 0)),
                      float(a.get("output_size", 0)), name, silus)
        real = float(np.median(durs))
        pred = cm.plan_kernel_seconds(Plan(kernels=(k,)))[0] if k else float("nan")  # as a plan prices it
        fam = k.family if k else f"?{a['op_name']}"
        fam_real[fam] += real
        fam_pred[fam] += pred if k else 0.0
        rows.append((real, pred, fam, a["op_name"], k.params if k else shapes))
    total_real = sum(fam_real.values())
    print(f"{args.model}: wall {wall * 1e3:.2f} ms, sum of kernels {total_real * 1e3:.2f} ms, "
          f"{len(by_name)} kernels; predicted kernels {sum(fam_pred.values()) * 1e3:.2f} ms "
          f"+ overheads {(cm.calibration.per_run_s + len(by_name) * cm.calibration.per_kernel_s) * 1e3:.3f} ms; "
          f"plan has {len(est.plan(load_graph(path, inputs=m.inputs)).kernels)} kernels; the profiler's own "
          f"{bias * 1e6:.1f} us a kernel taken off")
    for fam in sorted(fam_real, key=fam_real.get, reverse=True):
        r, p = fam_real[fam], fam_pred[fam]
        print(f"  {fam:<10} real {r * 1e3:9.3f} ms  pred {p * 1e3:9.3f} ms  ratio {p / r if r else float('nan'):6.2f}")
    print("worst kernels (by |log ratio| x time):")
    rows.sort(key=lambda r: -abs(math.log(max(r[1], 1e-9) / r[0])) * r[0] if r[0] > 0 and not math.isnan(r[1]) else 0)
    for real, pred, fam, op, params in rows[: args.top]:
        print(f"  {op:<14} {fam:<9} {str([round(p) for p in params]):<28} real {real * 1e6:9.1f} us  "
              f"pred {pred * 1e6:9.1f} us")


if __name__ == "__main__":
    main()
