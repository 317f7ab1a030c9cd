"""A runnable copy of a weightless graph: random weights where the real ones are absent.

Ground truth for the estimator is a real onnxruntime run of the same graph;
the weights' values do not change its latency, only their shapes do. Used by
the simulation's apps, benchmarks and oracle tests, never by estimation.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from monitors.graphs.graph import Graph
from monitors.graphs.onnx_import import is_absent, iter_tensors

# onnxruntime 1.31 reads models up to IR version 13; onnx 1.23 writes 14 by default.
MAX_IR_VERSION = 13

_FLOATS: dict[int, type[np.floating]] = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
                                          onnx.TensorProto.FLOAT16: np.float16}


def _values(tensor: onnx.TensorProto, rng: np.random.Generator) -> bytes:
    """Raw little-endian data for a tensor: small normal values scaled by fan-in, positive for vectors.

    Vectors (biases, BatchNormalization scale/mean/variance) get values in
    [0.5, 1.5] so variances stay positive; matrices and kernels get
    N(0, 1/fan_in), which keeps activations of deep networks in range.
    Integer and boolean tensors are zeros (valid indices everywhere).
    """
    shape = tuple(tensor.dims)
    count = math.prod(shape)
    data_type = tensor.data_type
    if data_type in _FLOATS or data_type == onnx.TensorProto.BFLOAT16:
        if len(shape) <= 1:
            values = rng.uniform(0.5, 1.5, count).astype(np.float32)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 2 else max(shape)
            values = (rng.standard_normal(count, dtype=np.float32) / math.sqrt(max(fan_in, 1))).astype(np.float32)
        if data_type == onnx.TensorProto.BFLOAT16:
            return (values.view(np.uint32) >> 16).astype("<u2").tobytes()
        return values.astype(np.dtype(_FLOATS[data_type]).newbyteorder("<")).tobytes()
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    return bytes(count * itemsize)


def materialize(graph: Graph, seed: int = 0, ir_version: int = 10) -> onnx.ModelProto:
    """A copy of `graph.model` that onnxruntime can run: absent tensors filled, IR version it reads.

    The IR version is lowered to `ir_version` (never raised: an IR 3 model's
    initializers are constants only under IR < 4).
    """
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    rng = np.random.default_rng(seed)
    for tensor in iter_tensors(model):
        if not is_absent(tensor):
            continue
        raw = _values(tensor, rng)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.raw_data = raw
    model.ir_version = min(model.ir_version, ir_version, MAX_IR_VERSION)
    return model
