"""Small ONNX models built in code for the import tests, and big ones written without holding them in memory."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as h
from onnx import TensorProto as T
from onnx import numpy_helper as nh

from monitors.graphs.importer import load_graph

IR_VERSION = 10  # onnxruntime 1.31 reads up to 13; onnx 1.23 writes 14 by default
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, ir_version: int = IR_VERSION,
               extra_opsets: dict[str, int] | None = None, functions=()) -> onnx.ModelProto:
    graph = h.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    opsets = [h.make_opsetid("", opset)] + [h.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = h.make_model(graph, opset_imports=opsets, functions=list(functions))
    model.ir_version = ir_version
    return model


def value(name: str, shape, elem_type: int = T.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem_type, shape)


def mlp(sizes: list[int], batch: int | str = "batch", seed: int = 0) -> onnx.ModelProto:
    """x -> (MatMul + Add + Relu)* -> y, weights inline, with a Reshape target as a small int64 initializer."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i, (k, n) in enumerate(itertools.pairwise(sizes)):
        inits.append(nh.from_array(rng.standard_normal((k, n), dtype=np.float32), f"w{i}"))
        inits.append(nh.from_array(rng.standard_normal(n, dtype=np.float32), f"b{i}"))
        nodes += [h.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                  h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  h.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        prev = f"r{i}"
    inits.append(nh.from_array(np.array([-1, sizes[-1]], dtype=np.int64), "target"))
    nodes.append(h.make_node("Reshape", [prev, "target"], ["y"], name="reshape"))
    return make_model(nodes, [value("x", [batch, sizes[0]])], [value("y", None)], inits)


def save_external(model: onnx.ModelProto, path: Path, *, absent: bool, size_threshold: int = 1024) -> Path:
    """Save with tensors of size_threshold bytes or more in a side file `<name>.data`; remove it when `absent`."""
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=size_threshold)
    if absent:
        os.remove(path.parent / (path.name + ".data"))
    return path


def absent_weights_model(total_bytes: int, layers: int = 8, hidden: int = 256) -> onnx.ModelProto:
    """An MLP whose weights (about total_bytes of float32) live in a side file that does not exist."""
    rows = max(1, total_bytes // (4 * hidden * layers))
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = onnx.TensorProto(name=f"w{i}", data_type=T.FLOAT, dims=[hidden, rows] if i % 2 == 0 else [rows, hidden])
        w.data_location = T.EXTERNAL
        for key, val in (("location", "weights.bin"), ("offset", str(i * 4 * rows * hidden)),
                         ("length", str(4 * rows * hidden))):
            entry = w.external_data.add()
            entry.key, entry.value = key, val
        inits.append(w)
        nodes.append(h.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        prev = f"m{i}"
    nodes.append(h.make_node("Relu", [prev], ["y"]))
    return make_model(nodes, [value("x", [1, hidden])], [value("y", None)], inits)


def weightless_mlp(width: int, depth: int, batch: int) -> bytes:
    """x[batch, width] -> depth x (MatMul + Relu), weights as descriptors of a side file that does not exist:
    a few hundred bytes, priced like the real thing."""
    nodes, inits, prev = [], [], "x"
    for i in range(depth):
        w = onnx.TensorProto(name=f"w{i}", data_type=T.FLOAT, dims=[width, width])
        w.data_location = T.EXTERNAL
        for key, val in (("location", "absent.bin"), ("offset", str(i * 4 * width * width)),
                         ("length", str(4 * width * width))):
            entry = w.external_data.add()
            entry.key, entry.value = key, val
        inits.append(w)
        nodes += [h.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), h.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    return make_model(nodes, [value("x", [batch, width])], [value(prev, [batch, width])], inits).SerializeToString()


def mlp_near(estimator, target_ms: float, width: int = 512, depth: int = 4) -> bytes:
    """A weightless MLP whose calibrated latency on this device's CPU, at rest, is about `target_ms` (its batch
    found by bisection on the estimator): a monitor that only a real slowdown moves across a tier."""

    def ms(batch: int) -> float:
        return estimator.estimate(load_graph(weightless_mlp(width, depth, batch), fmt="onnx"), device="cpu").latency_ms

    lo, hi = 1, 1
    while ms(hi) < target_ms:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ms(mid) < target_ms else (lo, mid)
    return weightless_mlp(width, depth, hi)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def write_inline_weights_model(path: Path, total_bytes: int, hidden: int = 256, random: bool = False) -> Path:
    """Write an ONNX file with ~total_bytes of inline float32 weights (raw_data), streamed to disk.

    Two MatMuls x[1,hidden] @ w0[hidden,rows] @ w1[rows,hidden]. The protobuf
    is assembled by hand so the weights never sit in this process's memory;
    with `random` the data is random bytes (no sparse holes), else zeros written
    as a sparse file.
    """
    rows = max(1, total_bytes // (8 * hidden))
    nodes = [h.make_node("MatMul", ["x", "w0"], ["m"]), h.make_node("MatMul", ["m", "w1"], ["y"])]
    model = make_model(nodes, [value("x", [1, hidden])], [value("y", None)])
    graph = model.graph.SerializeToString()
    model.ClearField("graph")
    head = model.SerializeToString()
    tensors = []
    for name, dims in (("w0", [hidden, rows]), ("w1", [rows, hidden])):
        meta = onnx.TensorProto(name=name, data_type=T.FLOAT, dims=dims).SerializeToString()
        nbytes = 4 * hidden * rows
        raw_key = bytes([9 << 3 | 2]) + _varint(nbytes)
        body_len = len(meta) + len(raw_key) + nbytes
        tensors.append((bytes([5 << 3 | 2]) + _varint(body_len) + meta + raw_key, nbytes))
    graph_len = len(graph) + sum(len(p) + n for p, n in tensors)
    chunk = 16 << 20
    with open(path, "wb") as f:
        f.write(head + bytes([7 << 3 | 2]) + _varint(graph_len) + graph)
        for prefix, nbytes in tensors:
            f.write(prefix)
            if random:
                left = nbytes
                block = np.random.default_rng(0).integers(0, 255, chunk, dtype=np.uint8).tobytes()
                while left:
                    f.write(block[: min(left, chunk)])
                    left -= min(left, chunk)
            else:
                f.seek(nbytes, os.SEEK_CUR)
        f.truncate()
    return path
