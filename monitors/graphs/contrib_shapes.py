"""Output shapes of the operators onnxruntime adds to ONNX, from input shapes and attributes alone.

onnx knows none of onnxruntime's contrib operators (domain com.microsoft), nor the
`SimplifiedLayerNormalization` onnxruntime registers in the default domain, which
onnxruntime-genai's model builder emits. onnxruntime's own symbolic shape inference
knows them, but it reads the values of initializers it meets on the way (a bias
added after a MatMul, say), and a weightless graph has none. Each function here
follows the operator's schema in onnxruntime (`contrib_defs.cc`, `bert_defs.cc`,
`quantization_defs.cc`) and needs no value but small scalars the caller has
already computed (GroupQueryAttention's total sequence length).

A function gets the node, the shapes and element types of its inputs (None where an
input is absent or unknown) and the known values of small inputs, and returns the
(shape, element type) of each output, or None for an output it cannot shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from monitors.errors import GraphError

Shape = tuple[int, ...]
Typed = tuple[Shape, int]  # (shape, onnx element type)
Inputs = Sequence[Typed | None]  # each input's (shape, type), None where unknown or absent
Values = Mapping[str, np.ndarray]  # the small constant values computed so far, by tensor name
Shaped = list[Typed | None]  # each output's (shape, type); None where this shaper does not know it

FLOAT = onnx.TensorProto.FLOAT
UINT8 = onnx.TensorProto.UINT8
INT8 = onnx.TensorProto.INT8
INT32 = onnx.TensorProto.INT32

# Operators onnxruntime registers in the default ONNX domain from version 1 on, beside onnx's own
# (its contrib_defs.cc): a model may use them at any opset.
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization", "LayerNormalization"})


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _where(node: onnx.NodeProto) -> str:
    return f"node '{node.name}' ({node.op_type})" if node.name else f"a {node.op_type} node"


def _need(node: onnx.NodeProto, inputs: Sequence[Typed | None], index: int) -> Typed:
    typed = inputs[index] if index < len(inputs) else None
    if typed is None:
        raise _Unknown()
    return typed


class _Unknown(Exception):
    """An input this output depends on has no known shape yet."""


def _broadcast(*shapes: Shape) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise GraphError(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") from None


# --- matrix products -------------------------------------------------------------------------------------------------

def _matmul_nbits(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    a, elem = _need(node, inputs, 0)
    n = _attr(node, "N", None)
    k = _attr(node, "K", None)
    if n is None or k is None:
        raise GraphError(f"{_where(node)} lacks its K or N attribute")
    if not a or a[-1] != k:
        raise GraphError(f"{_where(node)} multiplies an input of shape {list(a)} by a {k}x{n} matrix")
    return [(a[:-1] + (int(n),), elem)]


def _matmul_shape(node: onnx.NodeProto, a: Shape, b: Shape, trans_a: int = 0, trans_b: int = 0) -> Shape:
    if len(a) < 1 or len(b) < 1:
        raise GraphError(f"{_where(node)} multiplies scalars")
    a2 = a if len(a) >= 2 else (1,) + a
    b2 = b if len(b) >= 2 else b + (1,)
    if trans_a:
        a2 = a2[:-2] + (a2[-1], a2[-2])
    if trans_b:
        b2 = b2[:-2] + (b2[-1], b2[-2])
    if a2[-1] != b2[-2]:
        raise GraphError(f"{_where(node)} multiplies shapes {list(a)} and {list(b)}: inner dimensions differ")
    batch = _broadcast(a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _fused_matmul(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    (a, elem), (b, _) = _need(node, inputs, 0), _need(node, inputs, 1)
    return [(_matmul_shape(node, a, b, _attr(node, "transA", 0), _attr(node, "transB", 0)), elem)]


def _float_matmul(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """DynamicQuantizeMatMul, MatMulIntegerToFloat: an integer product whose output is float."""
    (a, _), (b, _) = _need(node, inputs, 0), _need(node, inputs, 1)
    scale = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    elem = scale[1] if scale is not None and scale[1] in (FLOAT, onnx.TensorProto.FLOAT16) else FLOAT
    return [(_matmul_shape(node, a, b), elem)]


def _gemm_fast_gelu(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    (a, elem), (b, _) = _need(node, inputs, 0), _need(node, inputs, 1)
    return [(_matmul_shape(node, a, b), elem)]


# --- embeddings ------------------------------------------------------------------------------------------------------

def _gather_block_quantized(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """data [.., gathered, ..] quantized in blocks along quantize_axis; uint8 data packs 8/bits numbers a byte."""
    (data, data_elem), (indices, _), (_, scale_elem) = (_need(node, inputs, i) for i in range(3))
    axis = _attr(node, "gather_axis", 0)
    quant_axis = _attr(node, "quantize_axis", 1)
    bits = _attr(node, "bits", 4)
    rank = len(data)
    if rank == 0:
        raise GraphError(f"{_where(node)} gathers from a scalar")
    axis = axis + rank if axis < 0 else axis
    quant_axis = quant_axis + rank if quant_axis < 0 else quant_axis
    if not (0 <= axis < rank and 0 <= quant_axis < rank):
        raise GraphError(f"{_where(node)} has an axis out of range for data of rank {rank}")
    dims = list(data)
    if data_elem == UINT8 and bits in (2, 4):
        dims[-1] *= 8 // bits  # onnxruntime: the last axis of packed uint8 data holds 8/bits numbers a byte
    out = tuple(dims[:axis]) + tuple(indices) + tuple(dims[axis + 1:])
    return [(out, scale_elem)]


def _embed_layer_norm(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    (ids, _), (word, elem) = _need(node, inputs, 0), _need(node, inputs, 2)
    return [(ids + (word[-1],), elem), ((ids[0],), INT32), (ids + (word[-1],), elem)]


# --- normalizations --------------------------------------------------------------------------------------------------

def _skip_norm(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """Skip(Simplified)LayerNormalization: output, mean, inverse std (one per row), input + skip (+ bias)."""
    x, elem = _need(node, inputs, 0)
    stats = x[:-1] + (1,)
    return [(x, elem), (stats, FLOAT), (stats, FLOAT), (x, elem)]


def _simplified_norm(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """SimplifiedLayerNormalization (default domain): output, inverse std over the axes from `axis` on."""
    x, elem = _need(node, inputs, 0)
    axis = _attr(node, "axis", -1)
    axis = axis + len(x) if axis < 0 else axis
    stash = _attr(node, "stash_type", 1)
    stash_elem = FLOAT if stash == 1 else elem
    return [(x, elem), (x[:axis] + (1,) * (len(x) - axis), stash_elem)]


def _same_as_first(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    x, elem = _need(node, inputs, 0)
    return [(x, elem)]


def _dequantize(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    (x, _), (_, scale_elem) = _need(node, inputs, 0), _need(node, inputs, 1)
    return [(x, scale_elem)]


def _quantize(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    x, _ = _need(node, inputs, 0)
    zero = inputs[2] if len(inputs) > 2 else None
    return [(x, zero[1] if zero is not None else UINT8)]


def _qlinear_binary(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    (a, elem), (b, _) = _need(node, inputs, 0), _need(node, inputs, 3)
    return [(_broadcast(a, b), elem)]


def _qlinear_global_pool(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    x, elem = _need(node, inputs, 0)
    if len(x) < 3:
        raise GraphError(f"{_where(node)} pools an input of rank {len(x)}")
    if _attr(node, "channels_last", 0):
        return [((x[0],) + (1,) * (len(x) - 2) + (x[-1],), elem)]
    return [(x[:2] + (1,) * (len(x) - 2), elem)]


def _qlinear_concat(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    axis = _attr(node, "axis", None)
    parts = [_need(node, inputs, i) for i in range(2, len(inputs), 3)]
    if axis is None or not parts:
        raise GraphError(f"{_where(node)} lacks its axis or inputs")
    first, elem = parts[0]
    axis = axis + len(first) if axis < 0 else axis
    total = sum(p[0][axis] for p in parts)
    return [(first[:axis] + (total,) + first[axis + 1:], elem)]


# --- attention -------------------------------------------------------------------------------------------------------

def _scalar(values: Mapping[str, np.ndarray], node: onnx.NodeProto, index: int) -> int | None:
    if index < len(node.input) and node.input[index] in values:
        value = np.asarray(values[node.input[index]]).reshape(-1)
        if value.size == 1:
            return int(value[0])
    return None


def _group_query_attention(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """query [B, S, D] (with key and value packed into it when they are absent); past [B, kv_heads, P, head];
    present [B, kv_heads, max(P, total), head], where `total` is the total sequence length input's value
    (P + S when the cache is not shared with the past buffer)."""
    query, elem = _need(node, inputs, 0)
    heads = _attr(node, "num_heads", 0)
    kv_heads = _attr(node, "kv_num_heads", 0)
    if heads <= 0 or kv_heads <= 0 or len(query) != 3:
        raise GraphError(f"{_where(node)} needs num_heads, kv_num_heads and a query of shape [batch, sequence, hidden]")
    batch, seq, width = query
    packed = len(node.input) < 2 or not node.input[1]
    past = inputs[3] if len(inputs) > 3 else None
    if past is not None and len(past[0]) == 4:
        head = past[0][3]
    else:
        parts = heads + 2 * kv_heads if packed else heads
        if width % parts:
            raise GraphError(f"{_where(node)}: a query of width {width} does not split into {parts} heads")
        head = width // parts
    out: Shaped = [((batch, seq, heads * head), elem)]
    past_len = past[0][2] if past is not None and len(past[0]) == 4 else 0
    total = _scalar(values, node, 6)
    if total is None:
        total = past_len + seq
    present = (batch, kv_heads, max(past_len, total), head)
    out += [(present, elem), (present, elem)]
    if len(node.output) > 3:
        out.append(((batch, heads, seq, present[2]), elem))
    return out


def _multi_head_attention(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """query [B, S, D]; key/value [B, L, D] (or already [B, heads, L, head]); past [B, heads, P, head]."""
    query, elem = _need(node, inputs, 0)
    heads = _attr(node, "num_heads", 0)
    if heads <= 0 or len(query) != 3:
        raise GraphError(f"{_where(node)} needs num_heads and a query of shape [batch, sequence, hidden]")
    batch, seq, width = query
    key = inputs[1] if len(inputs) > 1 else None
    value = inputs[2] if len(inputs) > 2 else None
    head = width // heads
    v_width = width
    kv_len = seq
    if key is not None:
        kv_len = key[0][1] if len(key[0]) == 3 else key[0][2] if len(key[0]) == 4 else seq
    if value is not None:
        v_width = value[0][2] if len(value[0]) == 3 else value[0][1] * value[0][3] if len(value[0]) == 4 else width
    out: Shaped = [((batch, seq, v_width), elem)]
    past = inputs[6] if len(inputs) > 6 else None
    past_len = past[0][2] if past is not None and len(past[0]) == 4 else 0
    if len(node.output) > 1:
        out.append(((batch, heads, past_len + kv_len, head), elem))
    if len(node.output) > 2:
        out.append(((batch, heads, past_len + kv_len, v_width // heads), elem))
    return out


def _attention(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    """The fused self-attention of BERT-style exports: input [B, S, hidden] times weights [hidden, 3 * hidden]."""
    (x, elem), (w, _) = _need(node, inputs, 0), _need(node, inputs, 1)
    heads = _attr(node, "num_heads", 0)
    sizes = _attr(node, "qkv_hidden_sizes", None)
    if heads <= 0 or len(x) != 3 or len(w) != 2:
        raise GraphError(f"{_where(node)} needs num_heads, an input [batch, sequence, hidden] and 2-D weights")
    q, k, v = (int(s) for s in sizes) if sizes else (w[1] // 3,) * 3
    out: Shaped = [((x[0], x[1], v), elem)]
    if len(node.output) > 1:
        past = inputs[4] if len(inputs) > 4 else None
        past_len = past[0][3] if past is not None and len(past[0]) == 5 else 0
        out.append(((2, x[0], heads, past_len + x[1], k // heads), elem))
    return out


def _rotary(node: onnx.NodeProto, inputs: Inputs, values: Values) -> Shaped:
    return _same_as_first(node, inputs, values)


SHAPERS: dict[str, Callable[[onnx.NodeProto, Inputs, Values], Shaped]] = {
    "MatMulNBits": _matmul_nbits,
    "MatMulBnb4": _matmul_nbits,
    "FusedMatMul": _fused_matmul,
    "DynamicQuantizeMatMul": _float_matmul,
    "MatMulIntegerToFloat": _float_matmul,
    "GemmFastGelu": _gemm_fast_gelu,
    "GatherBlockQuantized": _gather_block_quantized,
    "EmbedLayerNormalization": _embed_layer_norm,
    "SkipLayerNormalization": _skip_norm,
    "SkipSimplifiedLayerNormalization": _skip_norm,
    "SimplifiedLayerNormalization": _simplified_norm,
    "LayerNormalization": _simplified_norm,
    "GroupQueryAttention": _group_query_attention,
    "MultiHeadAttention": _multi_head_attention,
    "Attention": _attention,
    "RotaryEmbedding": _rotary,
    "Gelu": _same_as_first, "FastGelu": _same_as_first, "QuickGelu": _same_as_first, "BiasGelu": _same_as_first,
    "BiasAdd": _same_as_first, "GroupNorm": _same_as_first, "SkipGroupNorm": _same_as_first,
    "QLinearSigmoid": _same_as_first, "QLinearLeakyRelu": _same_as_first, "QLinearSoftmax": _same_as_first,
    "QLinearAdd": _qlinear_binary, "QLinearMul": _qlinear_binary,
    "QLinearGlobalAveragePool": _qlinear_global_pool, "QLinearConcat": _qlinear_concat,
    "DequantizeLinear": _dequantize, "QuantizeLinear": _quantize,
}


def infer(node: onnx.NodeProto, inputs: Sequence[Typed | None],
          values: Mapping[str, np.ndarray]) -> list[Typed | None] | None:
    """The node's output (shape, type)s, None while an input it needs is unknown; GraphError if it is malformed."""
    shaper = SHAPERS.get(node.op_type)
    if shaper is None:
        return None
    try:
        outs = shaper(node, inputs, values)
    except _Unknown:
        return None
    for shape, _ in (o for o in outs if o is not None):
        if any(d < 0 for d in shape):
            raise GraphError(f"{_where(node)} would produce a negative dimension ({list(shape)})")
    return outs

