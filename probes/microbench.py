"""Cold calibration: micro-benchmarks through onnxruntime over log-spaced grids, per kernel family.

Many grid points share one session: each is an independent node with its own
input, and onnxruntime's profiler reports every kernel's own time, so one
session run measures a whole slice of a grid and session creation is paid a
few times per family, not once per point. Points whose work would take too
long are skipped; the cost model extrapolates to them (monitors/pricing/costmodel.py).
Per-kernel dispatch and per-run overheads are measured with chains of tiny
kernels timed by the wall clock; the cache that really holds weights between
inferences, and the rate beyond it, by reads over growing working sets.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import numpy as np
import onnx
import onnxruntime as ort
import psutil
from onnx import TensorProto, helper, numpy_helper

from probes import refresh
from probes.calibration import (
    COMPUTE_FAMILIES,
    FLOAT_PRODUCTS,
    FORMAT_VERSION,
    NBITS_BLOCK,
    NBITS_TAILS,
    NCHWC_UPSAMPLE,
    QUANTIZED_CHAIN_K,
    QUANTIZED_CHAIN_KERNELS,
    QUANTIZED_CHAIN_SMALL,
    Calibration,
    FamilyTable,
    work_of,
)
from probes.cpu import last_level_cache_bytes

OPSET = 17
IR_VERSION = 9
Progress = Callable[[str, int, int], None]  # (label, done, total)


@dataclass(frozen=True)
class Grid:
    family: str
    axes: tuple[tuple[float, ...], ...]
    max_work: float  # skip points beyond this much work (FLOPs or bytes)


# The most bytes a memory-bound op's grid moves, where not all of its sizes (to 64 MiB): ops that run well below
# memory's rate, whose rate holds from a few MiB on, and whose largest points took seconds. A quantized gather moves
# 3 GB/s: up to 8 MiB (a prompt of 2,048 tokens of width 1,024). LRN sums a window of squares per element, 0.4 GB/s
# on a 2-core AMD EPYC VM from 16 KiB to 64 MiB (within 5 %): up to 16 MiB (a batch-8 AlexNet's moves 19 MB, priced
# at the rate of the largest point).
_MEMORY_OP_MOST = {"GatherBlockQuantized": 2 ** 23, "LRN": 2 ** 24}


def grids(quick: bool) -> list[Grid]:
    """The calibration grids; `quick` leaves out the costliest points and thins the memory-bound ones.

    Not the compute grids: their efficiency is concave in log size, so interpolating over every
    other point priced the kernels in between high (the zoo's share within +/-25 % fell from 95 %
    to 68 % on the same readings)."""
    hw = (2, 4, 7, 14, 28, 56, 112)
    g = [
        Grid("conv", (tuple(x * x for x in hw), (27.0, 144.0, 576.0, 2304.0), (16.0, 64.0, 256.0, 512.0)), 1.6e9),
        Grid("conv1x1", (tuple(x * x for x in hw), (16.0, 64.0, 256.0, 1024.0), (16.0, 64.0, 256.0, 1024.0)), 1.6e9),
        Grid("dwconv", ((16.0, 64.0, 256.0, 1024.0), tuple(x * x for x in hw), (9.0, 25.0)), 1e9),
        Grid("gemm", ((1.0, 8.0, 64.0, 512.0, 4096.0), (64.0, 256.0, 1024.0, 4096.0),
                      (64.0, 256.0, 1024.0, 4096.0, 32768.0)), 4.5e9),
        Grid("bmm", ((1.0, 8.0, 64.0), (1.0, 32.0, 256.0, 1024.0), (32.0, 128.0, 512.0), (32.0, 128.0, 512.0)), 1e9),
        # LLM kernels: block-quantized and int8 weights at decode (M = 1) and prefill sizes; attention over
        # prefills (past 0) and decode steps (one token) only, the two lines an app's generation runs on.
        # (N up to a vocabulary's 32768: an LM head's wide products run at half the efficiency of narrower ones)
        Grid("nbits", ((1.0, 16.0, 128.0, 1024.0), (256.0, 1024.0, 4096.0), (256.0, 1024.0, 4096.0, 32768.0)),
             2.2e9),
        Grid("nbits_f", ((1.0, 128.0, 1024.0), (256.0, 4096.0), (256.0, 4096.0, 32768.0)), 2.2e9),
        Grid("qgemm", ((1.0, 64.0, 512.0), (256.0, 1024.0, 4096.0), (256.0, 4096.0, 32768.0)), 1.1e9),
        Grid("gqa", ((4.0, 16.0), (1.0, 16.0, 128.0, 512.0, 2048.0), (1.0, 16.0, 128.0, 512.0, 2048.0, 8192.0),
                     (64.0, 128.0)), 5e9),
    ]
    sizes = tuple(float(2 ** k) for k in range(8, 27, 2))  # 256 B .. 64 MiB moved
    for op in MEMORY_OPS:
        g.append(Grid(op, (sizes,), _MEMORY_OP_MOST.get(op, 2 ** 27)))
    if quick:  # no point of more than a third of the largest work; memory-bound ops every other size
        g = [Grid(x.family, x.axes if x.family in COMPUTE_FAMILIES else tuple(_thin(a) for a in x.axes),
                  x.max_work / 3) for x in g]
    return g


HOST_COPY = "MemcpyHost"  # one tensor copied between host and GPU memory (onnxruntime's MemcpyFromHost/ToHost)


def host_copy_grids(quick: bool) -> list[Grid]:
    """The GPU's copies of an app's inputs and outputs, by bytes of the tensor: 256 B .. 64 MiB."""
    sizes = tuple(float(2 ** k) for k in range(8, 27, 2))
    return [Grid(HOST_COPY, (_thin(sizes) if quick else sizes,), 2 ** 27)]


def _thin(axis: tuple[float, ...]) -> tuple[float, ...]:
    if len(axis) <= 3:
        return axis
    kept = axis[::2]
    return kept if kept[-1] == axis[-1] else kept + (axis[-1],)


# --- one node per grid point ---------------------------------------------------------------------------------------

@dataclass
class _Point:
    nodes: list[onnx.NodeProto]
    inputs: list[onnx.ValueInfoProto]
    inits: list[onnx.TensorProto]
    output: str  # the timed kernel's output; its profile entry is "<output>[_nchwc]_kernel_time"
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # large initializers, handed over from memory


_NOISE: list[np.ndarray] = []


def _noise(shape: Iterable[int], rng: np.random.Generator) -> np.ndarray:
    """Standard normal numbers of `shape`, a view of one pool drawn once: drawing 64 MiB of weights
    afresh for every point and pass took half of a calibration. (A kernel's speed does not
    depend on which normal numbers it gets.)"""
    shape = tuple(int(d) for d in shape)
    count = math.prod(shape)
    if not _NOISE or _NOISE[0].size < count:
        _NOISE[:] = [rng.standard_normal(max(count, 2 ** 20), dtype=np.float32)]
    return _NOISE[0][:count].reshape(shape)


def _rand(shape: Iterable[int], rng: np.random.Generator) -> np.ndarray:
    """Small normal numbers of `shape`: a new array (weights that shared memory would be cached together)."""
    return _noise(shape, rng) * 0.05


def _point(family: str, p: tuple[float, ...], tag: str, rng: np.random.Generator) -> _Point:
    f32 = TensorProto.FLOAT
    x, y, w = f"x_{tag}", f"y_{tag}", f"w_{tag}"
    if family in ("conv", "conv1x1"):
        side = int(round(math.sqrt(p[0])))
        taps = 1 if family == "conv1x1" else 9
        cin, cout = int(p[1]) // taps, int(p[2])
        pad = 0 if taps == 1 else 1
        k = 1 if taps == 1 else 3
        return _Point([helper.make_node("Conv", [x, w], [y], name=y, pads=[pad] * 4)],
                      [helper.make_tensor_value_info(x, f32, [1, cin, side, side])],
                      [], y, {w: _rand((cout, cin, k, k), rng)})
    if family == "dwconv":
        c, side, k = int(p[0]), int(round(math.sqrt(p[1]))), int(round(math.sqrt(p[2])))
        return _Point([helper.make_node("Conv", [x, w], [y], name=y, group=c, pads=[k // 2] * 4)],
                      [helper.make_tensor_value_info(x, f32, [1, c, side, side])],
                      [], y, {w: _rand((c, 1, k, k), rng)})
    if family == "gemm":
        m, k, n = (int(v) for v in p)
        return _Point([helper.make_node("MatMul", [x, w], [y], name=y)],
                      [helper.make_tensor_value_info(x, f32, [m, k])], [], y, {w: _rand((k, n), rng)})
    if family == "bmm":
        b, m, k, n = (int(v) for v in p)
        return _Point([helper.make_node("MatMul", [x, w], [y], name=y)],
                      [helper.make_tensor_value_info(x, f32, [b, m, k]),
                       helper.make_tensor_value_info(w, f32, [b, k, n])], [], y)
    if family in ("nbits", "nbits_f"):
        return _nbits_point(p, x, y, tag, rng, accuracy=4 if family == "nbits" else 1)
    if family == "qgemm":
        m, k, n = (int(v) for v in p)
        scale, zero = f"s_{tag}", f"z_{tag}"
        return _Point([helper.make_node("DynamicQuantizeMatMul", [x, w, scale, zero], [y], name=y, domain=MS)],
                      [helper.make_tensor_value_info(x, f32, [m, k])],
                      [numpy_helper.from_array(np.array(0.01, np.float32), scale),
                       numpy_helper.from_array(np.array(0, np.int8), zero)], y,
                      {w: _bytes((k, n), rng).view(np.int8).copy()})
    if family == "gqa":
        return _gqa_point(p, x, y, tag, rng)
    if family == HOST_COPY:  # a Relu of the tensor's size (2x: its bytes moved, read and written)
        return MEMORY_OPS["Relu"](2 * p[0], x, y, tag, rng)
    return MEMORY_OPS[family](p[0], x, y, tag, rng)


def _bytes(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random bytes of `shape` (a view of the noise pool)."""
    count = math.prod(shape)
    return _noise((-(-count // 4),), rng).view(np.uint8)[:count].reshape(shape)


def _nbits_point(p: tuple[float, ...], x: str, y: str, tag: str, rng: np.random.Generator, accuracy: int,
                 salt: int = 0) -> _Point:
    """MatMulNBits of 4-bit weights in blocks of 32 along K, one float scale per block: onnxruntime-genai's
    int4 layout ([N, K / block, block / 2] bytes). `salt` (0-255) makes the weights differ from those of the same
    shape: onnxruntime shares equal initializers, and a chain of kernels over one shared matrix reads it from the
    cache (on an AMD EPYC family 26 VM, 95 GB/s over 187 MiB where distinct weights read 43)."""
    m, k, n = (int(v) for v in p[:3])
    w, scale = f"w_{tag}", f"s_{tag}"
    blocks = k // NBITS_BLOCK
    return _Point([helper.make_node("MatMulNBits", [x, w, scale], [y], name=y, domain=MS, K=k, N=n, bits=4,
                                    block_size=NBITS_BLOCK, accuracy_level=accuracy)],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [m, k])],
                  [], y, {w: _bytes((n, blocks, NBITS_BLOCK // 2), rng) ^ np.uint8(salt),
                          scale: np.abs(_noise((n * blocks,), rng)) * 0.01 + 0.001 * (1 + salt)})


GQA_GROUP = 4  # query heads per KV head in the calibration (Qwen2.5: 7, SmolLM2: 3, Gemma: 4, Phi-3: 1)


def _gqa_point(p: tuple[float, ...], x: str, y: str, tag: str, rng: np.random.Generator,
               kv_heads: int = 0) -> _Point:
    """GroupQueryAttention as onnxruntime-genai writes it for the CPU: query, key and value packed in one
    input, rotary applied inside, the past cache [1, KV heads, past, head] appended to (a new present).
    KV heads: a quarter of the query heads (GQA_GROUP) unless given."""
    heads, seq, past, head = int(p[0]), int(p[1]), int(p[2]) - 1, int(p[3])
    kv_heads = kv_heads or max(1, heads // GQA_GROUP)
    pk, pv, lens, total, cos, sin = (f"{n}_{tag}" for n in ("pk", "pv", "len", "tot", "cos", "sin"))
    positions = past + seq
    f32 = TensorProto.FLOAT
    node = helper.make_node("GroupQueryAttention", [x, "", "", pk, pv, lens, total, cos, sin],
                            [y, f"{y}_k", f"{y}_v"], name=y, domain=MS, num_heads=heads, kv_num_heads=kv_heads,
                            do_rotary=1, scale=1.0 / math.sqrt(head))
    angles = np.outer(np.arange(positions, dtype=np.float32), np.ones(head // 2, np.float32) * 1e-3)
    return _Point([node],
                  [helper.make_tensor_value_info(x, f32, [1, seq, (heads + 2 * kv_heads) * head]),
                   helper.make_tensor_value_info(pk, f32, [1, kv_heads, past, head]),
                   helper.make_tensor_value_info(pv, f32, [1, kv_heads, past, head])],
                  [numpy_helper.from_array(np.array([positions - 1], np.int32), lens),
                   numpy_helper.from_array(np.array(positions, np.int32), total),
                   numpy_helper.from_array(np.cos(angles), cos), numpy_helper.from_array(np.sin(angles), sin)], y)


def _rows(elements: float, width: int = 256) -> list[int]:
    """A [rows, width] shape of about `elements` numbers (narrower rows for the smallest sizes)."""
    n = max(int(elements), 8)
    width = min(width, n)
    return [max(n // width, 1), width]


def _unary(op: str, domain: str = "", **attrs) -> Callable:
    """x -> op(x): one tensor read, one written; rows of 256 for ops that work along the last axis."""
    def build(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
        return _Point([helper.make_node(op, [x], [y], name=y, domain=domain, **attrs)],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, _rows(nbytes / 8))], [], y)
    return build


def _binary(op: str) -> Callable:
    def build(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
        w = f"w_{tag}"
        shape = _rows(nbytes / 12)
        return _Point([helper.make_node(op, [x, w], [y], name=y)],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape),
                       helper.make_tensor_value_info(w, TensorProto.FLOAT, shape)], [], y)
    return build


def _where(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    """The attention-mask select: a bool condition and scores in, scores out (9 bytes an element)."""
    c, fill = f"c_{tag}", f"f_{tag}"
    shape = _rows(nbytes / 9)
    return _Point([helper.make_node("Where", [c, x, fill], [y], name=y)],
                  [helper.make_tensor_value_info(c, TensorProto.BOOL, shape),
                   helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                  [numpy_helper.from_array(np.array(-1e4, np.float32), fill)], y)


def _with_params(op: str, count: int, domain: str = "", **attrs) -> Callable:
    """x plus `count` per-channel constants (LayerNormalization's scale and bias, BiasGelu's bias)."""
    def build(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
        shape = _rows(nbytes / 8)
        params = [f"p{i}_{tag}" for i in range(count)]
        return _Point([helper.make_node(op, [x, *params], [y], name=y, domain=domain, **attrs)],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                      [numpy_helper.from_array(_rand((shape[1],), rng), q) for q in params], y)
    return build


def _skip_norm(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    """SkipSimplifiedLayerNormalization as a decoder layer runs it: x and the residual in, the normalised
    output and the residual sum out (4 tensors moved)."""
    shape = _rows(nbytes / 16, 1024)
    skip, gamma = f"k_{tag}", f"g_{tag}"
    return _Point([helper.make_node("SkipSimplifiedLayerNormalization", [x, skip, gamma], [y, "", "", f"{y}_sum"],
                                    name=y, domain=MS, epsilon=1e-6)],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape),
                   helper.make_tensor_value_info(skip, TensorProto.FLOAT, shape)],
                  [numpy_helper.from_array(_rand((shape[1],), rng), gamma)], y)


def _rotary(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    """RotaryEmbedding of a [1, tokens, 4 heads x 64] tensor (the positions and tables are constants)."""
    tokens = max(int(nbytes / 8 / 256), 1)
    positions, cos, sin = f"p_{tag}", f"c_{tag}", f"s_{tag}"
    angles = np.outer(np.arange(tokens, dtype=np.float32), np.ones(32, np.float32) * 1e-3)
    return _Point([helper.make_node("RotaryEmbedding", [x, positions, cos, sin], [y], name=y, domain=MS,
                                    num_heads=4)],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, tokens, 256])],
                  [numpy_helper.from_array(np.arange(tokens, dtype=np.int64)[None], positions),
                   numpy_helper.from_array(np.cos(angles), cos), numpy_helper.from_array(np.sin(angles), sin)], y)


def _gather_quantized(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    """GatherBlockQuantized: rows of a 4-bit table of width 1024 (blocks of 32) into float; the bytes moved
    count the indices read and the rows written, as the planner counts them."""
    width, rows = 1024, max(int(nbytes / (8 + 4 * 1024)), 1)
    table, scales = f"w_{tag}", f"s_{tag}"
    return _Point([helper.make_node("GatherBlockQuantized", [table, x, scales], [y], name=y, domain=MS,
                                    bits=4, block_size=32, gather_axis=0, quantize_axis=1)],
                  [helper.make_tensor_value_info(x, TensorProto.INT64, [1, rows])],
                  [], y, {table: _bytes((GATHER_ROWS, width // 2), rng).copy(),
                          scales: np.abs(_noise((GATHER_ROWS, width // 32), rng)) * 0.01 + 0.001})


GATHER_ROWS = 4096


def _transpose(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    """The attention-style head transpose (0, 2, 1, 3) of a [1, s, 16, 64] tensor."""
    rows, width = _rows(nbytes / 8, 1024)
    heads = max(width // 64, 1)
    return _Point([helper.make_node("Transpose", [x], [y], name=y, perm=[0, 2, 1, 3])],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, rows, heads, width // heads])], [], y)


def _concat(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    rows, width = _rows(nbytes / 16, 1024)
    w = f"w_{tag}"
    shape = [1, max(width // 32, 1), rows, min(width, 32)]
    return _Point([helper.make_node("Concat", [x, w], [y], name=y, axis=1)],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape),
                   helper.make_tensor_value_info(w, TensorProto.FLOAT, shape)], [], y)


def _reshape(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    s = f"s_{tag}"
    rows, width = _rows(nbytes / 8)
    return _Point([helper.make_node("Reshape", [x, s], [y], name=y)],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [rows, width])],
                  [numpy_helper.from_array(np.array([-1, width], np.int64), s)], y)


def _image_op(op: str, channels: int = 64, out_ratio: float = 1.0, **attrs) -> Callable:
    """Ops over [1, C, H, W] images; `out_ratio` is output bytes over input bytes."""
    def build(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
        n = max(int(nbytes / (4 * (1 + out_ratio))), 16)
        chans = min(channels, max(n // 16, 1))
        side = max(int(math.sqrt(n / chans)), 2)
        extra, inits = [], []
        if op == "Resize":
            sc = f"s_{tag}"
            extra = ["", sc]
            inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), sc)]
        return _Point([helper.make_node(op, [x, *extra], [y], name=y, **attrs)],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, chans, side, side])], inits, y)
    return build


def _blocked_upsample(nbytes: float, x: str, y: str, tag: str, rng: np.random.Generator) -> _Point:
    """A Resize that onnxruntime runs in the blocked layout, as its own Upsample kernel: linear, twice the height
    and width, reading what a 1x1 convolution wrote there (as a segmenter's decoder does). Bytes as Resize's."""
    n = max(int(nbytes / (4 * 5)), 16 * 4)
    chans = 64 if n >= 64 * 16 else 16  # whole blocks (8 floats on AVX2, 16 on AVX-512)
    side = max(int(math.sqrt(n / chans)), 2)
    w, c, sc = f"w_{tag}", f"c_{tag}", f"s_{tag}"
    return _Point([helper.make_node("Conv", [x, w], [c], name=f"conv_{tag}"),
                   helper.make_node("Resize", [c, "", sc], [y], name=y, mode="linear")],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, chans, side, side])],
                  [numpy_helper.from_array(_noise((chans, chans, 1, 1), rng) * 0.1, w),
                   numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), sc)], y)


MS = "com.microsoft"
# Memory-bound ops calibrated one by one, by bytes moved (non-constant inputs read + outputs written).
MEMORY_OPS: dict[str, Callable[..., _Point]] = {
    "Add": _binary("Add"), "Mul": _binary("Mul"), "Where": _where,
    "Relu": _unary("Relu"), "Sigmoid": _unary("Sigmoid"), "Tanh": _unary("Tanh"), "Erf": _unary("Erf"),
    "Gelu": _unary("Gelu", MS), "FastGelu": _unary("FastGelu", MS), "QuickGelu": _unary("QuickGelu", MS),
    "Silu": _unary("QuickGelu", MS, alpha=1.0),
    "BiasGelu": _with_params("BiasGelu", 1, MS),
    "Softmax": _unary("Softmax", axis=-1), "LayerNormalization": _with_params("LayerNormalization", 2, axis=-1),
    "ReduceMean": _unary("ReduceMean", axes=[-1], keepdims=1),
    "Transpose": _transpose, "Concat": _concat, "Reshape": _reshape,
    "MaxPool": _image_op("MaxPool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "AveragePool": _image_op("AveragePool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "GlobalAveragePool": _image_op("GlobalAveragePool", out_ratio=0.0),
    "Resize": _image_op("Resize", out_ratio=4.0, mode="nearest"),
    NCHWC_UPSAMPLE: _blocked_upsample,
    "LRN": _image_op("LRN", size=5),
    "SimplifiedLayerNormalization": _with_params("SimplifiedLayerNormalization", 1, axis=-1, epsilon=1e-6),
    "SkipSimplifiedLayerNormalization": _skip_norm,
    "RotaryEmbedding": _rotary,
    "GatherBlockQuantized": _gather_quantized,
}


def _model(points: list[_Point]) -> onnx.ModelProto:
    """The points as one graph; their `weights` as initializers whose data `_session` hands over."""
    nodes = [n for p in points for n in p.nodes]
    inits = [t for p in points for t in p.inits]
    inits += [_in_memory(name, a) for p in points for name, a in p.weights.items()]
    g = helper.make_graph(nodes, "calibration", [i for p in points for i in p.inputs],
                          [helper.make_tensor_value_info(p.output, TensorProto.FLOAT, None) for p in points], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)])
    m.ir_version = IR_VERSION
    return m


def _in_memory(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer without its data, which the session is given from memory (add_external_initializers)."""
    tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="in-memory")
    return tensor


def _session(points: list[_Point], so: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """A session of the points, their weights handed over from memory: copied into a protobuf, serialized and
    parsed again, hundreds of MB of them took a quarter of a quick calibration. The session holds the arrays
    (onnxruntime reads them in place and does not own them)."""
    weights = {name: a for p in points for name, a in p.weights.items()}
    if weights:
        so.add_external_initializers(list(weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()])
    session = ort.InferenceSession(_model(points).SerializeToString(), so, providers=providers)
    session.weights = weights  # as long as the session lives
    return session


def _feeds(session: ort.InferenceSession, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # Copies: inputs that shared memory would be cached together and read faster than a model's.
    # Integer inputs are row indices (the quantized gathers' points: tables of GATHER_ROWS rows). Conditions are
    # masks as a model's are (an attention mask's padding, a NaN check): runs along each row, not coin flips,
    # which onnxruntime's Where reads 6x slower.
    def feed(i) -> np.ndarray:
        if i.type == "tensor(bool)":
            row = np.arange(i.shape[-1]) < max(1, 3 * i.shape[-1] // 4)
            return np.broadcast_to(row, tuple(i.shape)).copy()
        if i.type == "tensor(int64)":
            return rng.integers(0, GATHER_ROWS, tuple(i.shape), dtype=np.int64)
        return _noise(i.shape, rng).copy()
    return {i.name: feed(i) for i in session.get_inputs()}


# A session's timed runs: `runs`, but no more than MIN_RUNS once they have taken RUNS_BUDGET_S. A point's readings vary
# more from one pass to the next than between the runs of one session (2-core AMD EPYC VM: a pass's median point read
# 1.0-1.8x its fastest of six passes, at 3 runs a session as at 15), least for long kernels, and the points' runs
# were half of a full calibration (33 of its 70 s there). The passes, not the runs, find the quiet device.
MIN_RUNS = 2
RUNS_BUDGET_S = 0.03


def _profile(points: list[_Point], outputs: list[str], runs: int, providers: list[str],
             rng: np.random.Generator) -> dict[str, float]:
    """Each timed output's kernel time (seconds) as onnxruntime's profiler reads it, its own cost included, from
    `runs` runs after one that warms up (fewer where they take long: RUNS_BUDGET_S)."""
    with tempfile.TemporaryDirectory(prefix="daop-cal-") as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "prof")
        so.log_severity_level = 3
        session = _session(points, so, providers)
        feeds = _feeds(session, rng)
        session.run(None, feeds)  # warms caches and the allocator; dropped below
        spent = 0.0
        for done in range(runs):
            if done >= MIN_RUNS and spent >= RUNS_BUDGET_S:
                break
            t0 = time.perf_counter()
            session.run(None, feeds)
            spent += time.perf_counter() - t0
        events = json.load(open(session.end_profiling()))
    times: dict[str, list[float]] = {o: [] for o in outputs}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        key = name[: -len("_kernel_time")].removesuffix("_nchwc")
        if key in times:
            times[key].append(e["dur"] * 1e-6)
    # The first run warms caches and the allocator: drop it. Of the rest, take the fastest: other
    # processes only ever add time (a parallel kernel whose second thread is descheduled waits a whole
    # time slice), so the minimum is the steadiest view of the device at rest.
    return {k: float(min(v[1:] if len(v) > 1 else v)) for k, v in times.items() if v}


BIAS_PROBES = 16  # kernels that do nothing, beside the points of every profiled session


def nbits_tails(runs: int, rng: np.random.Generator) -> tuple[float, ...]:
    """How much slower int8-compute block-quantized products of 256 rows by 1024 columns run, per element of work,
    with K NBITS_TAILS beyond 1024 than at 1024, timed in one session (the host's speed cancels out). The `nbits`
    grid's K axis holds multiples of 128 only, and a model's K need not be one (SmolLM2's 960: its int4 prefills
    were priced 17-21 % fast on a 2-core Intel Xeon VM)."""
    points = [(256.0, 1024.0 + t, 1024.0) for t in NBITS_TAILS]
    built = [_point("nbits", p, f"tail{i}", rng) for i, p in enumerate(points)]
    times = _profile_points(built, runs, ["CPUExecutionProvider"], rng)
    rates = [work_of("nbits", p) / times[b.output] for p, b in zip(points, built, strict=True)]
    return tuple(max(1.0, rates[0] / r) for r in rates)


def _do_nothing(length: int) -> _Point:
    """A chain of `length` Relu kernels over 16 numbers: kernels that are nothing but dispatch."""
    names = [f"bias{i + 1}" for i in range(length)]
    return _Point([helper.make_node("Relu", [f"bias{i}"], [n], name=n) for i, n in enumerate(names)],
                  [helper.make_tensor_value_info("bias0", TensorProto.FLOAT, [16])], [], names[-1])


def _profile_points(points: list[_Point], runs: int, providers: list[str],
                    rng: np.random.Generator) -> dict[str, float]:
    """Each point's own kernel time (seconds): the profiler's reading less the profiler's own cost per
    timed kernel, read in the same session on a chain of kernels that do nothing.

    That cost is 4-9 us on a slow virtual machine, in whole microseconds, and it moves with the
    host's speed, so it is read beside the points rather than once, and taken off in full: a kernel
    that reads no more than it costs next to nothing beyond its dispatch, which the per-kernel
    overhead (wall clock, below) prices.
    """
    read, bias = _profile_beside_nothing(points, runs, providers, rng)
    return {p.output: max(read[p.output] - bias, 1e-8) for p in points if p.output in read}


def profiler_cost(runs: int = 10) -> float:
    """The profiler's own cost per kernel it times (seconds), read on a session of kernels that do nothing: what
    bench.kernel_errors takes off each kernel of a model's profile, as _profile_points does off the points'."""
    return _profile_beside_nothing([], runs, ["CPUExecutionProvider"], np.random.default_rng(0))[1]


def _profile_beside_nothing(points: list[_Point], runs: int, providers: list[str],
                            rng: np.random.Generator) -> tuple[dict[str, float], float]:
    """The points' profiled times, in one session with BIAS_PROBES kernels that do nothing, and those kernels' mean
    time (the mean: the profiler counts whole microseconds)."""
    probe = _do_nothing(BIAS_PROBES)
    names = [n.output[0] for n in probe.nodes]
    read = _profile(points + [probe], [p.output for p in points] + names, runs, providers, rng)
    return read, float(np.mean([read[n] for n in names if n in read] or [0.0]))


def _gpu_times(points: list[_Point], runs: int, rng: np.random.Generator) -> dict[str, float]:
    """Per-point wall-clock time on the CUDA provider, inputs and outputs in device memory.

    onnxruntime's profiler times a CUDA kernel's launch, not its run, so each
    point gets a session of its own, timed around a synchronised run with
    IOBinding (no host copies), less the time of an empty such run.
    """
    empty = _gpu_run_time([_do_nothing(1)], runs, rng, bound=True)
    return {p.output: max(_gpu_run_time([p], runs, rng, bound=True) - empty, 1e-7) for p in points}


def _host_copy_times(points: list[_Point], runs: int, rng: np.random.Generator) -> dict[str, float]:
    """Per point, one copy of its input's size between host and GPU memory: a run fed from and answering to
    host memory, as an app's runs are, less the same run bound in GPU memory, halved (one tensor in, one out)."""
    out = {}
    for p in points:
        host = _gpu_run_time([p], runs, rng, bound=False)
        out[p.output] = max((host - _gpu_run_time([p], runs, rng, bound=True)) / 2, 1e-7)
    return out


def _gpu_run_time(points: list[_Point], runs: int, rng: np.random.Generator, bound: bool) -> float:
    """The fastest of `runs` synchronised runs of `points` on the CUDA provider, after two that warm it up.
    `bound`: inputs and outputs in GPU memory (IOBinding); else fed from host memory, as an app feeds it."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = _session(points, so, ["CUDAExecutionProvider"])
    feeds = _feeds(s, rng)
    io = s.io_binding()
    for name, value in feeds.items():
        io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for o in s.get_outputs():
        io.bind_output(o.name, "cuda")

    def run() -> float:
        t0 = time.perf_counter()
        if bound:
            s.run_with_iobinding(io)
            io.synchronize_outputs()
        else:
            s.run(None, feeds)
        return time.perf_counter() - t0

    run()
    run()
    return min(run() for _ in range(runs))


def _chain_time(length: int, providers: list[str], rng: np.random.Generator, reps: int) -> float:
    """Wall-clock low quantile of one run of a chain of `length` kernels that do nothing."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = _session([_do_nothing(length)], so, providers)
    feed = _feeds(s, rng)
    for _ in range(20):
        s.run(None, feed)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.run(None, feed)
        samples.append(time.perf_counter() - t0)
    return float(np.quantile(samples, 0.1))


CHAIN_SHORT, CHAIN_LONG = 2, 102


def chain_times(providers: list[str], rng: np.random.Generator, reps: int = 200) -> tuple[float, float]:
    """Wall-clock times of one run of a short and of a long chain of kernels that do nothing (`overheads`)."""
    return (_chain_time(CHAIN_SHORT, providers, rng, reps),
            _chain_time(CHAIN_LONG, providers, rng, max(reps // 4, 30)))


def overheads(short_s: float, long_s: float) -> tuple[float, float]:
    """(per-kernel, per-run) overheads in seconds: what a run costs beyond its kernels' own times.

    The slope per kernel and the intercept of the chains' wall-clock times. No
    profiler reading enters them: a kernel's own time is the profiler's reading
    less its bias, and a difference of the two clocks over bigger kernels read
    anywhere from 0.2 to 2.5 us from one calibration to the next.
    """
    tiny = max((long_s - short_s) / (CHAIN_LONG - CHAIN_SHORT), 0.0)
    return tiny, max(short_s - CHAIN_SHORT * tiny, 0.0)


@dataclass(frozen=True)
class MemoryLevels:
    """What the weights of a model too big for the cache cost: where the cache really ends, and the rate
    beyond it. The size sysfs reports can be far from the share a virtual machine gets of a host's
    cache (260 MiB reported, about 64 MiB held, on a 2-core Intel Xeon VM)."""

    cache_bytes: int  # the largest working set still read at a cached rate
    stream_bytes_per_s: float  # the read rate beyond it, from memory
    rates: tuple[tuple[int, float], ...]  # (working set, bytes per second), as measured


# The largest working set the memory sweep reads: 1 GiB, or twice the reported cache where that is more (at
# most 4 GiB, and a quarter of the free memory; a cyclic read of twice an LRU cache's size misses it throughout, and
# on a 2-core Intel Xeon VM reporting 480 MiB of L3 the sweep read 27.6 GB/s at 512 MiB and 26.3 at 1 GiB, where
# four times, 1.9 GiB, took 5 s more of a 50 s calibration). On the hosts measured, the rate of a sweep's product
# settles from about 512 MiB (2-core AMD EPYC VM: 21-22 GB/s from 45 MiB to 2 GiB; 16-core Intel Xeon with 300 MiB
# of L3: 64-68 GB/s at 1-2 GiB); what differs at gigabytes is how a model's kernels read their weights (FloatReads).
# Faulting the buffer in is what costs (1.6-3 s a GiB on a VM, and as much again for FloatReads' session): it is
# made once a calibration, and a quick one makes a quarter of it, where the rate has settled on those hosts (on a
# 2-core Intel Xeon VM with 300 MiB of L3 reported and about 95 MiB held, FloatReads read 0.95x as fast over 288 MiB
# as over 576; on the AMD EPYC VM, with 32 MiB reported, the sweep read within 3 % from 128 MiB to 256 MiB, and the
# buffer took 1.65 s of a 14.1 s quick calibration at half the full size).
STREAM_BYTES = 2 ** 30
SWEEP_WIDTH = 4096  # the sweep's weights are k x SWEEP_WIDTH float32
STREAM_BLOCK = 2 ** 25  # each 32 MiB of the buffer holds its own value: onnxruntime shares equal initializers


def stream_bytes(reported_cache: int, quick: bool = False) -> int:
    """The bytes of weights the memory sweep and FloatReads read (above; `quick`: a quarter as many)."""
    return min(max(STREAM_BYTES, 2 * reported_cache), 4 * STREAM_BYTES) // (4 if quick else 1)


def stream_buffer(reported_cache: int, largest: int | None = None, quick: bool = False) -> np.ndarray:
    """The weights that the memory sweep and FloatReads read (`largest` bytes, else stream_bytes'; at most a
    quarter of the free memory): rows of SWEEP_WIDTH float32, each block of STREAM_BLOCK bytes valued apart."""
    size = min(stream_bytes(reported_cache, quick) if largest is None else largest,
               psutil.virtual_memory().available // 4)
    row = 4 * SWEEP_WIDTH
    buffer = np.empty((max(size // row, 1), SWEEP_WIDTH), np.float32)
    per_block = STREAM_BLOCK // row
    for i in range(0, len(buffer), per_block):
        buffer[i:i + per_block] = 0.01 + 1e-4 * (i // per_block)
    return buffer


def memory_sweep_sizes(reported_cache: int, cap: int) -> list[int]:
    """Working sets, whole rows of the sweep's weights: by factors of sqrt(2) from 1 MiB to eight times the
    reported cache (where the cache ends; at most 512 MiB), then by factors of 2 up to `cap` (where memory's
    rate settles)."""
    row = 4 * SWEEP_WIDTH
    fine_top = min(cap, max(8 * reported_cache, 16 * 2 ** 20), 512 * 2 ** 20)
    sizes = [2 ** (k / 2) for k in range(40, 80) if 2 ** (k / 2) <= fine_top]
    while sizes and 2 * sizes[-1] <= cap:
        sizes.append(2 * sizes[-1])
    return [round(s / row) * row for s in sizes]


def measure_memory(reported_cache: int, reads: int = 2 ** 28, buffer: np.ndarray | None = None) -> MemoryLevels:
    """onnxruntime's vector-matrix products (a decode step's MatMul) over working sets that grow by a
    factor of sqrt(2) from 1 MiB to eight times the reported cache, then by factors of 2 up to the size of
    `buffer` (stream_buffer: 1 GiB, half in a quick calibration, more for a large cache): the read rate
    drops where the cache ends, over a factor of several (a cyclic read a little beyond it still hits it in part; on a
    2-core AMD EPYC VM with a 32 MiB L3 reported, it fell from 70 GB/s at 11 MiB to 33 at 64 MiB and settled
    at 30 from 128 MiB).

    onnxruntime's own kernel, not numpy's matrix-vector product: on that machine numpy read 1.3-1.4x
    as fast beyond the cache (40 against 30 GB/s), and a decode step of distilgpt2 ran at 27. The
    weights are an input here, so one session serves every size; the rate is the same as for weights
    held by the session. Each working set is read `reads` bytes' worth, at least three times up to
    256 MiB (once beyond 1 GiB), in three rounds; the fastest round counts (from 512 MiB on, the first round
    is also the warm-up: nothing of such a set stays in the cache from one read to the next).
    """
    width = SWEEP_WIDTH
    weights = stream_buffer(reported_cache) if buffer is None else buffer
    row = 4 * width
    sizes = memory_sweep_sizes(reported_cache, weights.nbytes)
    if len(sizes) < 2:
        return MemoryLevels(reported_cache, 0.0, ())
    vector = np.full((1, sizes[-1] // row), 0.5, np.float32)
    session = _vector_matrix_session(width)
    rates = []
    for size in sizes:
        feeds = {"x": vector[:, : size // row], "w": weights[: size // row]}  # contiguous: no copies
        passes = max(1, min(3, 2 ** 30 // size), reads // size)
        if size < 2 ** 29:  # beyond, nothing stays warm from one read to the next: the first round is the warm-up
            session.run(None, feeds)
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(passes):
                session.run(None, feeds)
            best = min(best, (time.perf_counter() - t0) / passes)
        rates.append((size, size / best))
    return memory_levels(rates, reported_cache)


class QuantizedReads:
    """How a decode step reads block-quantized weights beyond the cache: chains of MatMulNBits of one row
    each over different weights, twice the reported cache in all (48 to 128 MiB), per compute kind.

    A decode step runs hundreds of such kernels of a few MB each; each starts cold (its threads meet, its
    first lines come from memory) and they unpack as they read. Two chains over the same bytes, one of many
    small kernels and one of a few large ones, give both parts: the time per kernel and the chain's time
    beyond it (the cost model takes the large chain's time in the cache out of it, and prices these kernels'
    weights at the rate that leaves, relative to the float one at that working set, plus the time per
    kernel). The sessions are made once; each pass times them again.
    """

    SMALL, LARGE = QUANTIZED_CHAIN_SMALL, QUANTIZED_CHAIN_KERNELS  # kernels in each chain

    def __init__(self, reported_cache: int, rng: np.random.Generator) -> None:
        target = min(max(2 * reported_cache, 48 * 2 ** 20), 128 * 2 ** 20, psutil.virtual_memory().available // 8)
        self.k = QUANTIZED_CHAIN_K
        per_column = self.k // 2 + (self.k // NBITS_BLOCK) * 4  # packed bytes and float scales of one column
        columns = max(64 * self.SMALL, target // per_column // (64 * self.SMALL) * 64 * self.SMALL)
        self.bytes = columns * per_column
        self.x = np.full((1, self.k), 0.5, np.float32)
        self.sessions: dict[tuple[str, int], ort.InferenceSession] = {}
        for family, accuracy in (("nbits", 4), ("nbits_f", 1)):
            for count in (self.SMALL, self.LARGE):
                self.sessions[(family, count)] = self._chain(count, columns // count, accuracy, rng)

    def _chain(self, count: int, n: int, accuracy: int, rng: np.random.Generator) -> ort.InferenceSession:
        """`count` MatMulNBits of x [1, K] by K x n weights each, all reading the same x (independent kernels)."""
        points = [_nbits_point((1, self.k, n), "x", f"y{i}", f"c{i}", rng, accuracy, salt=i) for i in range(count)]
        for point in points[1:]:
            point.inputs.clear()  # the first point's x is the graph's one input
        so = ort.SessionOptions()
        so.log_severity_level = 3
        return _session(points, so, ["CPUExecutionProvider"])

    def measure(self) -> dict[str, tuple[int, float, float]]:
        """family -> (working set bytes, bytes per second, seconds per kernel), from each chain's fastest of five
        runs: the two chains' difference gives the time per kernel (a disturbed pass of the small chain alone read
        80 us a kernel where the quiet ones read 2-6; calibrate keeps the fastest pass)."""
        times = {key: _run_time(session, {"x": self.x}) for key, session in self.sessions.items()}
        out = {}
        for family in ("nbits", "nbits_f"):
            small, large = times[(family, self.SMALL)], times[(family, self.LARGE)]
            per_kernel = max(0.0, (small - large) / (self.SMALL - self.LARGE))
            streaming = max(large - self.LARGE * per_kernel, 1e-6)
            out[family] = (self.bytes, self.bytes / streaming, per_kernel)
        return out


class FloatReads:
    """How a float decode step reads its weights from memory: a chain of one-row MatMuls over different float32
    weights that the session holds (and prepacks, as it does a model's: a packed copy beside them).

    The sweep's one product over an input matrix is not read the same way: on a 16-core Intel Xeon host such
    a chain read 80-97 GB/s where the sweep read 64-68 at 1-2 GiB, and on a 2-core AMD EPYC VM a 2 GB decode
    step read 40 GB/s where the sweep read 54 at 256 MiB. The cost model prices a float product's streamed
    weights at this rate relative to the sweep's at this working set (CostModel.read_share), as it does
    block-quantized ones (QuantizedReads). The weights reach the session from memory
    (add_external_initializers): no model file, no 2 GB protobuf limit. Made once; each pass times it again.
    """

    K, N = 1024, 8192  # 32 MiB of weights a kernel (STREAM_BLOCK), as an LM head's slice or a 7B model's projection

    def __init__(self, reported_cache: int, buffer: np.ndarray) -> None:
        """Weights: views of `buffer` (stream_buffer, whose blocks differ: onnxruntime shares equal initializers,
        and one matrix read many times stays in the cache), half of it (512 MiB of a full calibration's), or four
        times the reported cache where that is more, all of it at most (on the Xeon below, 415 MiB read as fast as
        1.6 GiB)."""
        per_kernel = 4 * self.K * self.N
        total = min(max(buffer.nbytes // 2, 4 * reported_cache), buffer.nbytes)
        count = max(1, total // per_kernel)
        self.bytes = count * per_kernel
        flat = buffer.reshape(-1)
        points = [_Point([helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"y{i}")], [], [], f"y{i}",
                         {f"w{i}": flat[i * self.K * self.N:(i + 1) * self.K * self.N].reshape(self.K, self.N)})
                  for i in range(count)]
        points[0].inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, self.K]))
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.session = _session(points, so, ["CPUExecutionProvider"])
        self.x = np.full((1, self.K), 0.5, np.float32)

    def measure(self) -> tuple[int, float, float]:
        """(working set bytes, bytes per second, seconds per kernel: 0, not measured), from the median of its runs
        (calibrate keeps the fastest pass): a stream from memory runs slower one run in several (on the AMD EPYC VM
        of docs/accuracy.md the median of seven read 0.90-0.97x the fastest, once 0.68x), and so do the decode steps
        it prices (their median run over their fastest: 1.12 across the zoo's, 1.05 across its CNNs), whose ground
        truth is their median."""
        return self.bytes, self.bytes / _run_time(self.session, {"x": self.x}, statistics.median), 0.0


class AttentionChains:
    """How a decode step's attention runs when its KV cache comes from memory: chains of GroupQueryAttention of one
    new token each over past keys and values of their own, twice the reported cache in all (48 to 128 MiB), one
    chain for each grouping in CHAINS.

    onnxruntime's CPU kernel zeroes a new present cache, then for each query head copies its KV head's past into it
    and multiplies: work by query head in the cache, and trips through memory by KV head, in proportions that the
    calibration's one grouping (GQA_GROUP) cannot tell apart. The cost model fits one cost per query head and one
    per KV head to the chains (costmodel.py: decode_attention_seconds). The presents are the graph's outputs, each
    in memory of its own, as a model's are. Made once; each pass times them again.

    A step whose weights and cache are larger than the chains' (`bytes`) reads its cache slower, the more so where
    the chains' working set still hits the cache in part (a large last-level cache): the cost model scales their
    cost per KV head by the memory sweep's rates at the two working sets (CostModel.cache_read_slowdown).
    """

    CHAINS = ((16, 2), (16, 16))  # (query heads, KV heads): grouped as Qwen2.5's, and one KV head a query head
    CONTEXT, HEAD = 4096, 64

    def __init__(self, reported_cache: int, rng: np.random.Generator) -> None:
        target = min(max(2 * reported_cache, 48 * 2 ** 20), 128 * 2 ** 20, psutil.virtual_memory().available // 8)
        self.chains = []
        reads = []  # each chain's past keys and values, in bytes
        for heads, kv_heads in self.CHAINS:
            past = (1, kv_heads, self.CONTEXT - 1, self.HEAD)
            layers = max(1, target // (2 * 4 * math.prod(past)))
            reads.append(layers * 2 * 4 * math.prod(past))
            p = (float(heads), 1.0, float(self.CONTEXT), float(self.HEAD))
            points = [_gqa_point(p, "x", f"y{i}", f"c{i}", rng, kv_heads=kv_heads) for i in range(layers)]
            for point in points[1:]:
                del point.inputs[0]  # the first point's x is the graph's one x
            feeds = {v.name: _noise(tuple(d.dim_value for d in v.type.tensor_type.shape.dim), rng).copy()
                     for point in points for v in point.inputs}
            model = _model(points)
            model.graph.output.extend(helper.make_tensor_value_info(present, TensorProto.FLOAT, None)
                                      for point in points for present in point.nodes[0].output[1:])
            so = ort.SessionOptions()
            so.log_severity_level = 3
            session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            self.chains.append(((*p, float(kv_heads)), layers, session, feeds))
        self.bytes = round(statistics.fmean(reads))  # the chains' working set: about `target` each

    def measure(self) -> dict[tuple[float, ...], float]:
        """gqa coordinates (query heads, 1, context, head size, KV heads) -> seconds a layer, from each chain's
        fastest of five runs (calibrate keeps the fastest pass)."""
        return {params: _run_time(session, feeds) / layers for params, layers, session, feeds in self.chains}


SETTLE_S = 0.2
T = TypeVar("T")


def _settled(measure: Callable[[], T]) -> T:
    """`measure()` after SETTLE_S at rest. The sessions just run keep the CPUs and the memory bus busy for a while
    after, and a quick calibration has one pass to read each probe in (docs/estimator.md, section 3)."""
    time.sleep(SETTLE_S)
    return measure()


def _run_time(session: ort.InferenceSession, feeds: dict[str, np.ndarray],
              pick: Callable[[list[float]], float] = min, runs: int = 5) -> float:
    """Seconds of the fastest (`pick`: another statistic) of `runs` runs, after one that warms the session up."""
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return pick(times)


def _vector_matrix_session(width: int) -> ort.InferenceSession:
    """y[1, width] = x[1, k] @ w[k, width], k given at each run."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "read",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "k"]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, ["k", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = IR_VERSION
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def memory_levels(rates: list[tuple[int, float]], reported_cache: int) -> MemoryLevels:
    """The cache ends at the largest working set read at least 1.5x as fast as the last one, which is
    read from memory. (Not halfway to the fastest: that is the small private cache, whose rate is
    noisy enough to move the boundary below the shared cache.)"""
    stream = rates[-1][1]
    held = [size for size, r in rates if r >= 1.5 * stream]
    return MemoryLevels(max(held) if held else reported_cache, stream, tuple(rates))


def fastest_sweep(sweeps: list[MemoryLevels], reported_cache: int) -> MemoryLevels:
    """Sweeps made apart in time, combined: each working set that all of them read keeps its fastest
    rate (a sweep stops short when free memory has shrunk)."""
    fastest: dict[int, float] = {}
    for size, rate in (r for s in sweeps for r in s.rates):
        fastest[size] = max(rate, fastest.get(size, 0.0))
    common = set.intersection(*({size for size, _ in s.rates} for s in sweeps))
    if len(common) < 2:
        return sweeps[0]
    return memory_levels([(size, fastest[size]) for size in sorted(common)], reported_cache)


def calibrate(quick: bool = False, device: str = "cpu", progress: Progress | None = None,
              seed: int = 0) -> Calibration:
    """Run the micro-benchmarks and return the calibration for `device` ('cpu' or 'gpu')."""
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "gpu" else ["CPUExecutionProvider"]
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    plan: list[tuple[Grid, list[tuple[float, ...]]]] = []
    reported_cache = last_level_cache_bytes()
    for grid in grids(quick) + (host_copy_grids(quick) if device == "gpu" else []):
        if device == "gpu" and grid.family == NCHWC_UPSAMPLE:
            continue  # the CUDA provider has no blocked layout
        pts = [p for p in itertools.product(*grid.axes) if work_of(grid.family, p) <= grid.max_work
               and _feasible(grid.family, p, reported_cache)]
        plan.append((grid, pts))
    total = sum(len(p) for _, p in plan) + 1
    done = 0.0
    tables: dict[str, FamilyTable] = {}
    runs = 3 if quick else 5
    # Tensors per calibration session: about as many as pass through the cache between one inference
    # of a model and the next, so that a point's operands are about as warm as a model's are (weights
    # beyond the cache: costmodel.py). Half the reported cache, not the measured one: sessions within the
    # cache that is really held read every model 15-20 % fast and spread more.
    budget_bytes = max(min(96 * 2 ** 20, reported_cache // 2), 4 * 2 ** 20)

    def measure(grid: Grid, pts: list[tuple[float, ...]]) -> Iterable[tuple[list[tuple[float, ...]], dict]]:
        for batch in _batches(grid.family, pts, budget_bytes):
            built = [_point(grid.family, p, f"{grid.family}{i}", rng) for i, p in enumerate(batch)]
            if grid.family == HOST_COPY:
                times = _host_copy_times(built, runs, rng)
            elif device == "gpu":
                times = _gpu_times(built, runs, rng)
            else:
                times = _profile_points(built, runs, providers, rng)
            yield batch, {p: times[b.output] for p, b in zip(batch, built, strict=True) if times.get(b.output, 0) > 0}

    # Every point, the overhead chains and the memory sweep are read in each of three passes over all
    # the grids (one in quick calibration), so that their readings lie seconds apart, and each keeps
    # its fastest: a shared host slows down for seconds or minutes at a time, for a whole family or
    # for two passes of three, and a slowdown only adds time. (The ground truth is the quietest of
    # rounds too.)
    passes = 1 if quick else 3
    fastest: dict[str, dict[tuple[float, ...], float]] = {grid.family: {} for grid, _ in plan}
    chains: list[tuple[float, float]] = []
    tails: list[tuple[float, ...]] = []  # nbits_tails, a pass each
    # The warm refresh's reference is read in each pass too and keeps its fastest, as the points do: it must
    # describe the same quiet device as the tables, and a host's slow phase can outlast three refreshes in a row.
    # A quick calibration's one pass runs at whatever speed the host has through it, its tables too: its reference
    # is the median of refreshes spread over the pass, one after each compute family's grid (on a 2-core Intel Xeon
    # VM whose speed moved 1.2-1.8x by the minute, the fastest of those at the end of the pass read 0.88-0.93x a full
    # calibration's where the pass's tables read 1.3-1.6x, and the agent priced models 28-29 % high at the median).
    refreshes: list[dict[str, float]] = []
    after: dict[str, int] = {}  # a quick calibration's compute family -> the refresh taken right after its grid
    products: list[dict[str, float]] = []  # a full calibration's refreshes right after the float products' grids
    quantized: QuantizedReads | None = None
    floats: FloatReads | None = None
    attention: AttentionChains | None = None
    memory_passes: list[MemoryPass] = []
    buffer: np.ndarray | None = None  # the weights the sweep and FloatReads read, faulted in once
    for _ in range(passes):
        for grid, pts in plan:
            for batch, times in measure(grid, pts):
                for p, t in times.items():
                    fastest[grid.family][p] = min(t, fastest[grid.family].get(p, math.inf))
                done += len(batch) / passes
                if progress:
                    progress(grid.family, round(done), total)
            if quick and device == "cpu" and grid.family in COMPUTE_FAMILIES:
                after[grid.family] = len(refreshes)
                refreshes.append(refresh.measure(stream=True))  # spread over the one pass (below)
            if not quick and device == "cpu" and grid.family in FLOAT_PRODUCTS:
                products.append(_settled(refresh.measure))  # the state the products' tables were read in
        chains.append(chain_times(providers, rng, reps=100))
        if device == "cpu":
            tails.append(nbits_tails(runs, rng))
            if buffer is None:
                buffer = stream_buffer(reported_cache, quick=quick)
            if quantized is None or floats is None or attention is None:
                quantized, floats = QuantizedReads(reported_cache, rng), FloatReads(reported_cache, buffer)
                attention = AttentionChains(reported_cache, rng)
            # Each probe reads memory only once the work before it has settled; the refresh after them tells the
            # state the host was in (quiet_passes).
            sweep = _settled(partial(measure_memory, reported_cache, buffer=buffer))
            floats_reading = _settled(floats.measure)
            reads = {**_settled(quantized.measure), "gemm": floats_reading}
            chains_reading = _settled(attention.measure)
            refreshes.append(_settled(partial(refresh.measure, stream=True)))
            memory_passes.append(MemoryPass(refreshes[-1], sweep, reads, chains_reading))
        done += 1 / passes
        if progress:
            progress("overhead", round(done), total)
    again = slow_phase_families(refreshes, after)
    for grid, pts in plan:
        measured = fastest[grid.family]
        if grid.family in again and time.perf_counter() - started < QUICK_AGAIN_BEFORE_S:
            _keep_fastest(measured, measure(grid, pts))
            refreshes[after[grid.family]] = refresh.measure(stream=True)  # the reference describes the new times
        if quick and grid.family not in COMPUTE_FAMILIES:
            # A quick calibration's one pass goes once more over the memory-bound ops (about a second): such a
            # kernel can run at one of two speeds a session, and three runs in one session keep the slower often.
            _keep_fastest(measured, measure(grid, pts))
        # Then up to two passes over the points that still look disturbed (much slower than their
        # neighbours); each keeps its fastest time. A real cliff (out of the cache) reads the same again.
        for _ in range(2):
            _keep_fastest(measured, measure(grid, _disturbed(grid, measured)))
        tables[grid.family] = FamilyTable(axes=grid.axes, points=tuple(measured.items()))
    per_kernel, per_run = overheads(min(c[0] for c in chains), min(c[1] for c in chains))
    memory, quantized_rates, attention_chains = fastest_readings(quiet_passes(memory_passes), reported_cache)
    return Calibration(
        fingerprint=fingerprint(device),
        tables=tables,
        per_kernel_s=per_kernel,
        per_run_s=per_run,
        quick=quick,
        seconds=time.perf_counter() - started,
        created=time.time(),
        refresh_reference=refresh.reference(refreshes, typical=quick, products=products),
        stream_bytes_per_s=memory.stream_bytes_per_s,
        cache_bytes=memory.cache_bytes,
        read_rates=memory.rates,
        quantized_read_rates=quantized_rates,
        attention_chains=tuple(attention_chains.items()),
        attention_chain_bytes=attention.bytes if attention is not None else 0,
        nbits_tails=tuple(statistics.median(tail) for tail in zip(*tails, strict=True)),
    )


# A quick calibration measures a compute family's grid again where the refresh right after it read the handoff probe
# this much slower, for its compute probe's time, than the calibration's quietest refresh did, and its latest refresh
# reads within that again: the grid ran in a slow phase of the host (its vCPUs apart: on a 2-core AMD EPYC guest of
# family 26 the handoff probe read 1.25-1.4x its compute probe's ratio for 15-75 s at a time, and the short kernels
# 1.5-3x) that has passed. Never from this many seconds into it on (a quick calibration is meant to take at most 15).
SLOW_PHASE_HANDOFF = 1.2
QUICK_AGAIN_BEFORE_S = 10.0


def _handoff_ratio(reading: dict[str, float]) -> float:
    """A refresh's handoff probe over its compute probe (NaN without them): high in a host's slow phase."""
    handoff, compute = reading.get(refresh.HANDOFF_KEY), reading.get(refresh.LOCKSTEP_KEY)
    return handoff / compute if handoff and compute else math.nan


def slow_phase_families(refreshes: list[dict[str, float]], after: dict[str, int]) -> set[str]:
    """The families of `after` (family -> index in `refreshes`) measured in a slow phase that has passed: their
    refresh's handoff probe over its compute probe SLOW_PHASE_HANDOFF x the least of all `refreshes`, the last's
    within it (in the phase still, they would read it again)."""
    ratios = [x for x in map(_handoff_ratio, refreshes) if math.isfinite(x)]
    if not after or not ratios or not _handoff_ratio(refreshes[-1]) <= SLOW_PHASE_HANDOFF * min(ratios):
        return set()
    return {family for family, i in after.items() if _handoff_ratio(refreshes[i]) > SLOW_PHASE_HANDOFF * min(ratios)}


@dataclass(frozen=True)
class MemoryPass:
    """What one pass of a calibration read of memory, and the refresh right after it."""

    refresh: dict[str, float]
    sweep: MemoryLevels
    reads: dict[str, tuple[int, float, float]]  # QuantizedReads' by family, and "gemm": FloatReads'
    chains: dict[tuple[float, ...], float]  # AttentionChains'


def quiet_passes(passes: list[MemoryPass]) -> list[MemoryPass]:
    """The passes whose memory readings describe the device that the tables do: those whose refresh read the
    handoff probe within SLOW_PHASE_HANDOFF of the least, for its compute probe's time (all, where none read it).

    The tables keep each point's fastest pass, and a host's slow phase, whose vCPUs sit apart, slows their short
    kernels; but it can speed memory up. On a 2-core AMD EPYC guest of family 26, with the vCPUs apart the handoff
    probe read 1.6x and a float decode step's weights streamed 1.4x as fast (60 against 41 GB/s; over 7 minutes the
    two moved together, correlation -0.98), each vCPU on a chiplet of its own with its own path to memory. The
    fastest memory readings of all passes would price a device with both sides' best, which never runs."""
    ratios = [_handoff_ratio(p.refresh) for p in passes]
    known = [r for r in ratios if math.isfinite(r)]
    if not known:
        return passes
    return [p for p, r in zip(passes, ratios, strict=True) if math.isfinite(r) and r <= SLOW_PHASE_HANDOFF * min(known)]


def fastest_readings(passes: list[MemoryPass], reported_cache: int) -> tuple[
        MemoryLevels, dict[str, tuple[int, float, float]], dict[tuple[float, ...], float]]:
    """Each memory reading's fastest over `passes` (quiet_passes'): the sweep, the read chains' rates, the attention
    chains' seconds a layer; none measured where there are no passes (a GPU's calibration)."""
    if not passes:
        return MemoryLevels(0, 0.0, ()), {}, {}
    reads = {family: max((p.reads[family] for p in passes), key=lambda r: r[1]) for family in passes[0].reads}
    chains = {params: min(p.chains[params] for p in passes) for params in passes[0].chains}
    return fastest_sweep([p.sweep for p in passes], reported_cache), reads, chains


def _keep_fastest(measured: dict[tuple[float, ...], float],
                  readings: Iterable[tuple[list[tuple[float, ...]], dict[tuple[float, ...], float]]]) -> None:
    """Each point's fastest time, of those in `measured` and the new `readings` (measure's batches)."""
    for _, times in readings:
        for p, t in times.items():
            measured[p] = min(t, measured.get(p, math.inf))


def _disturbed(grid: Grid, measured: dict[tuple[float, ...], float]) -> list[tuple[float, ...]]:
    """Points much less efficient than their grid neighbours: most likely disturbed while measured
    (another process, a page fault storm), so worth measuring again. A real cliff (out of the
    cache) measures the same again and stays."""
    index = {p: tuple(axis.index(v) for axis, v in zip(grid.axes, p, strict=True)) for p in measured}
    at = {i: p for p, i in index.items()}
    eff = {p: work_of(grid.family, p) / t for p, t in measured.items()}
    suspects = []
    for p, i in index.items():
        near = [eff[at[j]] for d in range(len(i)) for step in (-1, 1)
                if (j := i[:d] + (i[d] + step,) + i[d + 1:]) in at]
        if near and eff[p] < 0.6 * float(np.median(near)):
            suspects.append(p)
    return suspects


def _feasible(family: str, p: tuple[float, ...], cache: int) -> bool:
    """Weight matrices up to 64 MiB: larger ones are priced by the streaming rate. Attention is measured
    on prefills (past 0: p[2] == 1) and decode steps (one new token) only, a decode step only while its keys
    and values (past and present) fit in the `cache`: the cost model prices their trips through memory apart
    (AttentionChains); a float product of one row only where its weights fit in the `cache` (beyond, its time is
    their reads, and measured with them it priced them twice over); the wide products (N = WIDE) at up to 64 rows
    and K up to 1024, what a decode step and a short prompt's LM head run."""
    if family == "gqa":
        return p[2] == 1.0 or (p[1] == 1.0 and _kv_bytes(p) <= cache)
    if family == "gemm" and p[0] == 1.0 and 4 * p[1] * p[2] > cache:
        return False  # one row over weights beyond the cache: it only streams them, priced by the read rates
    if p[-1] >= WIDE and family in ("gemm", "nbits", "nbits_f", "qgemm"):
        return p[0] <= 64 and p[1] <= 1024 and p[1] * p[2] * 4 <= 64 * 2 ** 20  # an LM head's few rows
    return family != "gemm" or p[1] * p[2] * 4 <= 64 * 2 ** 20


WIDE = 32768.0  # the wide products' N (an LM head's vocabulary)


def _point_bytes(family: str, p: tuple[float, ...]) -> float:
    if family in ("nbits", "nbits_f"):
        return 4.0 * (p[0] * p[1] + p[0] * p[2]) + p[1] * p[2] / 2
    if family == "qgemm":
        return 4.0 * (p[0] * p[1] + p[0] * p[2]) + p[1] * p[2]
    if family == "gqa":
        return 4.0 * p[1] * (p[0] + 2 * max(1.0, p[0] // GQA_GROUP)) * p[3] * 2 + _kv_bytes(p)
    if family in ("conv", "conv1x1"):
        taps = 1 if family == "conv1x1" else 9
        return 4.0 * (p[0] * (p[1] / taps + p[2]) + p[1] * p[2])
    if family == "dwconv":
        return 8.0 * p[0] * p[1]
    if family == "gemm":
        return 4.0 * (p[0] * p[1] + p[1] * p[2] + p[0] * p[2])
    if family == "bmm":
        return 4.0 * p[0] * (p[1] * p[2] + p[2] * p[3] + p[1] * p[3])
    return 2.0 * p[0]


def _kv_bytes(p: tuple[float, ...]) -> float:
    """The keys and values a calibration attention reads and writes: past and present, a KV head for GQA_GROUP
    query heads."""
    return 16.0 * max(1.0, p[0] // GQA_GROUP) * (p[2] + p[1]) * p[3]


def _batches(family: str, pts: list[tuple[float, ...]], budget: float) -> Iterable[list[tuple[float, ...]]]:
    batch: list[tuple[float, ...]] = []
    used = 0.0
    for p in pts:
        b = _point_bytes(family, p)
        if batch and (used + b > budget or len(batch) >= 32):
            yield batch
            batch, used = [], 0.0
        batch.append(p)
        used += b
    if batch:
        yield batch


def fingerprint(device: str) -> dict[str, str]:
    """What a calibration depends on: a change in any of these means calibrating again."""
    return {
        "device": device,
        "cpu_model": cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "onnxruntime": ort.__version__,
        "format": str(FORMAT_VERSION),
        "machine": platform.machine(),
        "nchwc_block": str(nchwc_block() if device == "cpu" else 0),
        "llc_bytes": str(last_level_cache_bytes()),
        **({"gpu_model": gpu_model()} if device == "gpu" else {}),
    }


def gpu_model() -> str:
    """The first GPU's name from NVML ('' where NVML cannot tell): a new GPU means a new calibration."""
    try:
        import pynvml  # noqa: PLC0415 - optional, as in probes/gpu.py: without it there is no GPU to name
    except ImportError:
        return ""
    try:
        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except (pynvml.NVMLError, OSError, UnicodeDecodeError):  # no driver, a broken library, no device
        return ""


def nchwc_block() -> int:
    """The channel block of onnxruntime's NCHWc convolutions on this CPU (0: none, as on ARM)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return 0
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return 0
    return 16 if "avx512f" in flags else 8 if "avx2" in flags else 0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
