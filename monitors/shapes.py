"""Bind input shapes, check the graph, and infer every tensor's concrete shape.

The estimator prices kernels by their shapes, so every tensor must end with
a concrete shape. A graph from an app may be malformed or hostile: each
check here raises a `GraphError` (or `LimitExceeded`) with one line that says
what is wrong and, where the caller can fix it, how.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
from typing import Iterable, Iterator, Mapping

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper

from monitors.errors import GraphError
from monitors.graph import DTYPE_NAMES, Graph, InputSpec, TensorInfo
from monitors.limits import Limits
from monitors.onnx_import import is_absent, iter_tensors

# onnxruntime contrib operators (domain com.microsoft) that onnxruntime's
# symbolic shape inference can shape; onnx itself knows none of them.
CONTRIB_OPS = frozenset({
    "Attention", "BiasAdd", "BiasGelu", "BiasSplitGelu", "DecoderMaskedMultiHeadAttention", "DequantizeLinear",
    "EmbedLayerNormalization", "FastGelu", "GatedRelativePositionBias", "GatherBlockQuantized", "Gelu",
    "GemmFastGelu", "GroupNorm", "GroupQueryAttention", "LayerNormalization", "LongformerAttention", "MatMulNBits",
    "MultiHeadAttention", "NhwcConv", "PackedAttention", "PackedMultiHeadAttention", "QLinearAdd", "QLinearMul",
    "QuantizeLinear", "QuickGelu", "RelativePositionBias", "RemovePadding", "RestorePadding", "RotaryEmbedding",
    "SimplifiedLayerNormalization", "SkipGroupNorm", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "SparseAttention",
})
CONTRIB_DOMAIN = "com.microsoft"
_ONNX_DOMAINS = ("", "ai.onnx")
_ML_DOMAIN = "ai.onnx.ml"

# Never folded by onnxruntime at session creation: random ops, and
# DequantizeLinear (kept so that QDQ groups fuse into quantized kernels).
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                         "Bernoulli", "DequantizeLinear", "If", "Loop", "Scan"})


def _describe(node: onnx.NodeProto, index: int) -> str:
    return f"node '{node.name}' ({node.op_type})" if node.name else f"node #{index} ({node.op_type})"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    if not node.attribute:
        return []
    return [g for attr in node.attribute for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)]


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)


# ---------------------------------------------------------------- structure

def _count_nodes(graph: onnx.GraphProto, limits: Limits, depth: int = 0) -> int:
    limits.check_depth(depth)
    count = len(graph.node)
    limits.check_nodes(count)
    for node in graph.node:
        for sub in _subgraphs(node):
            count += _count_nodes(sub, limits, depth + 1)
            limits.check_nodes(count)
    return count


def _defined_in(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names |= {s.values.name for s in graph.sparse_initializer}
    for node in graph.node:
        names.update(o for o in node.output if o)
    return names


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from its enclosing scopes."""
    defined = _defined_in(graph)
    free: set[str] = set()
    for node in graph.node:
        free.update(i for i in node.input if i and i not in defined)
        for sub in _subgraphs(node):
            free.update(n for n in _free_names(sub) if n not in defined)
    free.update(o.name for o in graph.output if o.name not in defined)
    return free


def _sort_graph(graph: onnx.GraphProto, outer: set[str], where: str) -> None:
    """Check that every input has a producer and there is no cycle; put nodes in topological order."""
    available = set(outer) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    available |= {s.values.name for s in graph.sparse_initializer}
    nodes = list(graph.node)
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for out in node.output:
            if not out:
                continue
            if out in producer:
                raise GraphError(f"{where}tensor '{out}' is produced twice: by {_describe(nodes[producer[out]], producer[out])}"
                                 f" and {_describe(node, index)}")
            if out in available and out not in outer:
                raise GraphError(f"{where}tensor '{out}' is a graph input or initializer and also the output of "
                                 f"{_describe(node, index)}")
            producer[out] = index
    consumers: list[list[int]] = [[] for _ in nodes]
    producers: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for index, node in enumerate(nodes):
        reads = {i for i in node.input if i}
        for sub in _subgraphs(node):
            reads |= _free_names(sub)
        for name in reads:
            if name in producer:
                consumers[producer[name]].append(index)
                producers[index].append(producer[name])
                waiting[index] += 1
            elif name not in available:
                raise GraphError(f"{where}{_describe(node, index)} reads '{name}', which no node, input or initializer provides")
    # Kahn's algorithm, smallest index first: a graph already in order keeps its order.
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for consumer in consumers[index]:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                heapq.heappush(ready, consumer)
    if len(order) < len(nodes):
        # Walk back from a stuck node through stuck producers until a node repeats: it lies on a cycle.
        stuck = min(i for i, w in enumerate(waiting) if w > 0)
        seen: set[int] = set()
        while stuck not in seen:
            seen.add(stuck)
            stuck = next(p for p in producers[stuck] if waiting[p] > 0)
        raise GraphError(f"{where}graph has a cycle through {_describe(nodes[stuck], stuck)}")
    for out in graph.output:
        if out.name not in producer and out.name not in available:
            raise GraphError(f"{where}graph output '{out.name}' is produced by nothing")
    scope = available | set(producer)
    for index, node in enumerate(nodes):
        for sub in _subgraphs(node):
            _sort_graph(sub, scope, f"in the subgraph of {_describe(node, index)}: ")
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


def _default_opset(model: onnx.ModelProto) -> int:
    versions = {o.domain: o.version for o in model.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        if model.ir_version < 3:
            return 1
        raise GraphError("model imports no ONNX opset (opset_import has no default domain)")
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= version <= newest:
        raise GraphError(f"model uses ONNX opset {version}; this agent knows opsets 1 to {newest}")
    return version


def _check_operators(model: onnx.ModelProto, opset: int) -> None:
    versions = {o.domain: o.version for o in model.opset_import}
    checked: set[tuple[str, str]] = set()
    for node in _all_nodes(model.graph):
        if not node.op_type:
            raise GraphError(f"a node{' ' + repr(node.name) if node.name else ''} has no operator type")
        domain = node.domain
        if (domain, node.op_type) in checked:
            continue
        checked.add((domain, node.op_type))
        if domain in _ONNX_DOMAINS or domain == _ML_DOMAIN:
            version = opset if domain in _ONNX_DOMAINS else versions.get(_ML_DOMAIN, 1)
            try:
                schema = onnx.defs.get_schema(node.op_type, version, "" if domain in _ONNX_DOMAINS else domain)
            except onnx.defs.SchemaError:
                name = node.op_type if domain in _ONNX_DOMAINS else f"{domain}.{node.op_type}"
                if onnx.defs.has(node.op_type, "" if domain in _ONNX_DOMAINS else domain):
                    raise GraphError(f"unknown operator '{name}' in opset {version}") from None
                raise GraphError(f"unknown operator '{name}'") from None
            if schema.deprecated:
                raise GraphError(f"operator '{node.op_type}' is deprecated in opset {version}")
        elif domain == CONTRIB_DOMAIN and node.op_type in CONTRIB_OPS:
            continue
        else:
            raise GraphError(f"unknown operator '{domain + '.' if domain else ''}{node.op_type}'")


# ------------------------------------------------------------------ binding

def _dims_text(dims: Iterable[int | str | None]) -> str:
    return "x".join(str(d) if isinstance(d, int) else f"<{d or '?'}>" for d in dims)


def _declared_dims(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The declared shape: ints, names of symbolic dims, None for unnamed unknown dims; None if no shape."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param") and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def real_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs the caller feeds (not the initializers IR < 4 lists as inputs)."""
    initializers = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in initializers]


def _bind_inputs(graph: onnx.GraphProto, inputs: Mapping[str, InputSpec], limits: Limits) -> None:
    feeds = real_inputs(graph)
    names = [i.name for i in feeds]
    for name in inputs:
        if name not in names:
            raise GraphError(f"model has no input '{name}'; its inputs are: {', '.join(names) or '(none)'}")
    for value in feeds:
        name = value.name
        if value.type.WhichOneof("value") != "tensor_type":
            raise GraphError(f"input '{name}' is not a tensor; only tensor inputs are supported")
        elem_type = value.type.tensor_type.elem_type
        if elem_type not in DTYPE_NAMES:
            raise GraphError(f"input '{name}' has data type {onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type},"
                             " which is not supported")
        declared = _declared_dims(value)
        spec = inputs.get(name)
        if spec is None:
            if declared is None:
                raise GraphError(f"input '{name}' has no declared shape; pass --input {name}=DIMS")
            for d in declared:
                if not isinstance(d, int):
                    what = f"symbolic dimension '{d}'" if isinstance(d, str) else "an unknown dimension"
                    raise GraphError(f"input '{name}' has {what}; pass --input {name}={_dims_text(declared)}")
            shape = [int(d) for d in declared]
        else:
            shape = list(spec.shape)
            if spec.dtype is not None and spec.dtype != DTYPE_NAMES[elem_type]:
                raise GraphError(f"input '{name}' is {DTYPE_NAMES[elem_type]} in the model, not {spec.dtype}")
            if declared is not None:
                if len(declared) != len(shape):
                    raise GraphError(f"input '{name}' has rank {len(declared)} ({_show(declared)}), "
                                     f"but the binding gives {len(shape)} dimensions ({_show(shape)})")
                for axis, (d, s) in enumerate(zip(declared, shape)):
                    if isinstance(d, int) and d != s:
                        raise GraphError(f"input '{name}' has dimension {axis} fixed at {d} ({_show(declared)}), "
                                         f"but the binding gives {s}")
        for d in shape:
            if not isinstance(d, int) or d <= 0:
                raise GraphError(f"input '{name}' has invalid dimension {d} in shape {_show(shape)}; "
                                 "dimensions must be positive")
        limits.check_shape(f"input {name}", shape)
        tensor_shape = value.type.tensor_type.shape
        tensor_shape.ClearField("dim")
        for d in shape:
            tensor_shape.dim.add().dim_value = d


def _show(dims: Iterable[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


# ---------------------------------------------------------------- inference

def _run_onnx_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:  # type: ignore[attr-defined]
        text = _one_line(str(e))
        external = re.search(r"Cannot parse data from external tensors.*tensor: (\S+)", text)
        if external:  # weights are never read, so values needed for shapes must be inline
            raise GraphError(f"shape inference needs the values of '{external.group(1)}', which are in external "
                             "data that is never read; keep small integer tensors inline (onnx.save size_threshold)"
                             ) from None
        raise GraphError(f"shape inference failed: {text}") from None
    except Exception as e:  # onnx raises plain RuntimeError for some malformed graphs
        raise GraphError(f"shape inference failed: {_one_line(str(e)) or type(e).__name__}") from None


def _run_symbolic_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's symbolic shape inference: knows contrib ops and shapes that depend on computed values.

    Called only where onnx leaves a shape unknown. Its public entry point
    writes a file on failure, so the steps are driven here directly.
    """
    from onnxruntime.tools import symbolic_shape_infer as ssi  # imports sympy: slow, so only when needed

    ssi.logger.setLevel(logging.ERROR)
    inference = ssi.SymbolicShapeInference(int_max=2**31 - 1, auto_merge=False, guess_output_rank=False, verbose=0)
    try:
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
    except Exception as e:
        text = _one_line(str(e)) or type(e).__name__
        absent = re.search(r"tensor name: (\S+?)\s*\)", text)
        if absent:
            raise GraphError(f"shape inference needs the values of '{absent.group(1)}', which are weights that "
                             "are never read") from None
        raise GraphError(f"shape inference failed: {text}") from None
    return inference.out_mp_


def _tensor_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    types: dict[str, onnx.TypeProto] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.WhichOneof("value") is not None:
            types[value.name] = value.type
    return types


def _concrete(type_proto: onnx.TypeProto | None) -> tuple[tuple[int, ...], int] | None:
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape") or tensor_type.elem_type == 0:
        return None
    dims = []
    for dim in tensor_type.shape.dim:
        if not dim.HasField("dim_value"):
            return None
        dims.append(dim.dim_value)
    return tuple(dims), tensor_type.elem_type


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Tensors something reads: graph outputs and node inputs, in subgraphs too."""
    used = {o.name for o in graph.output}
    for node in _all_nodes(graph):
        used.update(node.input)
    return used


def _missing_outputs(model: onnx.ModelProto, used: set[str] | None = None) -> list[tuple[str, int]]:
    """Node outputs without a concrete shape, other than those nothing reads (e.g. Dropout's mask)."""
    graph = model.graph
    types = _tensor_types(graph)
    used = _used_names(graph) if used is None else used
    missing = []
    for index, node in enumerate(graph.node):
        for out in node.output:
            type_proto = types.get(out)
            kind = type_proto.WhichOneof("value") if type_proto is not None else None
            if kind not in (None, "tensor_type"):
                raise GraphError(f"tensor '{out}', output of {_describe(node, index)}, is a "
                                 f"{kind.replace('_type', '')}, not a tensor; only tensors are supported")
            if out and out in used and _concrete(type_proto) is None:
                missing.append((out, index))
    return missing


def _dtype_name(elem_type: int, name: str) -> str:
    if elem_type not in DTYPE_NAMES:
        type_name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else str(elem_type)
        raise GraphError(f"tensor '{name}' has data type {type_name}, which the estimator does not support")
    return DTYPE_NAMES[elem_type]


def _collect_tensors(graph: onnx.GraphProto, limits: Limits, tensors: dict[str, TensorInfo], main: bool) -> None:
    for init in graph.initializer:
        tensors[init.name] = TensorInfo(tuple(init.dims), _dtype_name(init.data_type, init.name))
    for sparse in graph.sparse_initializer:
        tensors[sparse.values.name] = TensorInfo(tuple(sparse.dims), _dtype_name(sparse.values.data_type, sparse.values.name))
    for name, type_proto in _tensor_types(graph).items():
        concrete = _concrete(type_proto)
        if concrete is None:
            if main and type_proto.WhichOneof("value") != "tensor_type":
                raise GraphError(f"tensor '{name}' is a {type_proto.WhichOneof('value').replace('_type', '')}, "
                                 "not a tensor; only tensors are supported")
            continue  # subgraph tensors may keep symbolic shapes (loop-carried values)
        shape, elem_type = concrete
        if name not in tensors:
            tensors[name] = TensorInfo(shape, _dtype_name(elem_type, name))
    for node in graph.node:
        for sub in _subgraphs(node):
            _collect_tensors(sub, limits, tensors, main=False)
    limits.check_tensors(len(tensors))


def _check_declared_tensors(model: onnx.ModelProto, limits: Limits) -> None:
    """Initializers and constant tensors: no negative dims, no absurd sizes (their bytes are never allocated)."""
    for tensor in iter_tensors(model):
        limits.check_shape(tensor.name or "(constant)", list(tensor.dims))


# -------------------------------------------------------------------- work

def _prod(values: Iterable[int]) -> int:
    return math.prod(values)


_FLOP_OPS = frozenset({"MatMul", "MatMulInteger", "FusedMatMul", "MatMulNBits", "QLinearMatMul", "Gemm", "FusedGemm",
                       "Conv", "ConvInteger", "FusedConv", "NhwcConv", "QLinearConv", "ConvTranspose", "LSTM", "GRU",
                       "RNN", "Attention", "MultiHeadAttention", "GroupQueryAttention", "SparseAttention", "Einsum"})


def node_flops(node: onnx.NodeProto, tensors: Mapping[str, TensorInfo]) -> int:
    """Rough 2 * multiply-accumulates of one node, for the total-work limit."""
    def shape(i: int) -> tuple[int, ...] | None:
        if i < len(node.input) and node.input[i] in tensors:
            return tensors[node.input[i]].shape
        return None

    def out_shape(i: int = 0) -> tuple[int, ...] | None:
        if i < len(node.output) and node.output[i] in tensors:
            return tensors[node.output[i]].shape
        return None

    op = node.op_type
    if op not in _FLOP_OPS:
        return 0
    a, b, y = shape(0), shape(1), out_shape()
    if op in ("MatMul", "MatMulInteger", "FusedMatMul", "MatMulNBits") and a and y is not None:
        return 2 * _prod(y) * a[-1]
    if op == "QLinearMatMul" and a and y is not None:
        return 2 * _prod(y) * a[-1]
    if op in ("Gemm", "FusedGemm") and a and y is not None and len(a) == 2:
        trans_a = next((attr.i for attr in node.attribute if attr.name == "transA"), 0)
        return 2 * _prod(y) * (a[0] if trans_a else a[1])
    if op in ("Conv", "ConvInteger", "FusedConv", "NhwcConv") and b and y is not None:
        return 2 * _prod(y) * _prod(b[1:])
    if op == "QLinearConv" and y is not None and (w := shape(3)):
        return 2 * _prod(y) * _prod(w[1:])
    if op == "ConvTranspose" and a and b:
        return 2 * _prod(a) * _prod(b[1:])
    if op in ("LSTM", "GRU", "RNN") and a and b and (r := shape(2)):
        return 2 * a[0] * a[1] * (_prod(b) + _prod(r))
    if op == "Attention" and node.domain == CONTRIB_DOMAIN and a and b and len(a) == 3:
        return 2 * _prod(a) * b[-1] + 4 * _prod(a) * a[1]
    if op in ("Attention", "MultiHeadAttention", "GroupQueryAttention", "SparseAttention") and a and b:
        seq_kv = b[-2] if len(b) == 4 else b[1] if len(b) >= 2 else 1
        return 4 * _prod(a) * seq_kv
    if op == "Einsum":
        return _einsum_flops(node, [shape(i) for i in range(len(node.input))])
    return 0


def _einsum_flops(node: onnx.NodeProto, shapes: list[tuple[int, ...] | None]) -> int:
    equation = next((attr.s.decode() for attr in node.attribute if attr.name == "equation"), "")
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    if "..." in equation or len(lhs) != len(shapes) or any(s is None for s in shapes):
        return 0
    sizes: dict[str, int] = {}
    for letters, s in zip(lhs, shapes):
        if s is None or len(letters) != len(s):
            return 0
        sizes.update(zip(letters, s))
    return 2 * _prod(sizes.values())


def total_flops(graph: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> int:
    return sum(node_flops(node, tensors) for node in _all_nodes(graph))


# ------------------------------------------------------- value propagation
#
# Exporters compute shapes in the graph (Shape -> Gather -> Concat -> Expand,
# Range over a sequence length, ...). onnx's data propagation covers only a
# few of these ops. Once the inputs are bound every such computation is
# constant, as onnxruntime finds when it folds them at session creation, so
# they are evaluated here (onnx's reference implementation, on small values
# only), and shape inference runs again with their results as initializers.

_EVAL_BUDGET = 1 << 20  # elements of any value evaluated here; larger ones are left alone
_EVAL_MAX_VALUES = 10_000  # values evaluated per graph (about 0.2 ms each); real graphs need hundreds
_OPEN_ENDED = frozenset({"Resize", "Upsample", "Pad", "OneHot", "EyeLike", "Col2Im", "CenterCropPad"})


def _attr_int(node: onnx.NodeProto, name: str, default: int | None) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), default)


def _output_bound(node: onnx.NodeProto, args: list[np.ndarray | None]) -> int | None:
    """An upper bound on the elements a node's outputs will have, or None if it cannot be bounded cheaply."""
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            return math.prod(int(d) for d in args[0].reshape(-1))
        if op == "Expand":
            return math.prod(np.broadcast_shapes(args[0].shape, tuple(int(d) for d in args[1].reshape(-1))))
        if op == "Tile":
            return math.prod(int(d) * int(r) for d, r in zip(args[0].shape, args[1].reshape(-1)))
        if op == "Range":
            start, limit, delta = (float(a.reshape(-1)[0]) for a in args[:3])
            return max(0, math.ceil((limit - start) / delta)) if delta else None
    except (ValueError, TypeError, AttributeError, IndexError, OverflowError, ZeroDivisionError):
        return None
    if op in _OPEN_ENDED:
        return None
    sizes = [a.size for a in args if a is not None]
    return max(sum(sizes), math.prod(sizes)) if sizes else 1


def _evaluate(node: onnx.NodeProto, values: dict[str, np.ndarray], known: Mapping[str, onnx.TensorProto],
              types: Mapping[str, onnx.TypeProto], opset: int) -> dict[str, np.ndarray] | None:
    """The values of a constant node's outputs, or None where they are not known or too large."""
    if node.domain not in _ONNX_DOMAINS or node.op_type in _NOT_FOLDED or any(True for _ in _subgraphs(node)):
        return None
    outputs = [o for o in node.output if o]
    if node.op_type in ("Shape", "Size"):
        concrete = _concrete(types.get(node.input[0]))
        if concrete is None:
            return None
        shape = concrete[0]
        if node.op_type == "Size":
            return {outputs[0]: np.array(math.prod(shape), np.int64)}
        start, end = _attr_int(node, "start", 0), _attr_int(node, "end", None)
        return {outputs[0]: np.array(shape[start:end], np.int64)}
    if node.op_type == "Constant" and any(a.HasField("t") and is_absent(a.t) for a in node.attribute):
        return None
    args: list[np.ndarray | None] = []
    for name in node.input:
        if not name:
            args.append(None)
        elif name in values:
            args.append(values[name])
        elif name in known:
            values[name] = onnx.numpy_helper.to_array(known[name])
            args.append(values[name])
        else:
            return None
    if any(a is not None and a.size > _EVAL_BUDGET for a in args):
        return None
    inferred = [_concrete(types.get(o)) for o in outputs]
    if all(c is not None for c in inferred):
        bound = sum(math.prod(c[0]) for c in inferred)
    else:
        bound = _output_bound(node, args)
    if bound is None or bound > _EVAL_BUDGET:
        return None
    from onnx.reference import ReferenceEvaluator  # numpy; imported when first needed

    feeds = {name: arg for name, arg in zip(node.input, args) if name}
    try:
        results = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
    except Exception:
        return None  # leave it to shape inference to explain
    out = {}
    for name, result in zip(node.output, results):
        if name:
            result = np.asarray(result)
            if result.size > _EVAL_BUDGET or result.dtype == object:
                return None
            out[name] = result
    return out


def _propagate_values(model: onnx.ModelProto, inferred: onnx.ModelProto, missing: list[tuple[str, int]],
                      opset: int, values: dict[str, np.ndarray]) -> bool:
    """Evaluate the constant computations that unknown shapes depend on; True if new values were found."""
    graph = model.graph
    nodes = list(graph.node)
    types = _tensor_types(inferred.graph)
    inputs = {i.name for i in graph.input}
    known = {t.name: t for t in graph.initializer
             if not is_absent(t) and (model.ir_version < 4 or t.name not in inputs)}
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    closure: set[int] = set()
    stack = [out for out, _ in missing]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or name in values:
            continue
        seen.add(name)
        index = producer.get(name)
        if index is None or index in closure:
            continue
        closure.add(index)
        if nodes[index].op_type not in ("Shape", "Size"):
            stack.extend(i for i in nodes[index].input if i)
    found = False
    for index in sorted(closure):
        node = nodes[index]
        if all(o in values for o in node.output if o):
            continue
        if len(values) > _EVAL_MAX_VALUES:
            break  # a hostile graph of shape computations: what is left stays unknown
        result = _evaluate(node, values, known, types, opset)
        if result:
            values.update(result)
            found = True
    return found


def _infer_with_values(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """Shape inference with the evaluated values standing in for the nodes that compute them.

    The returned model keeps every node; only its value_info and output
    types come from inference over the substituted copy.
    """
    copy = _copy(model)
    kept = [n for n in copy.graph.node if not all(o in values for o in n.output if o)]
    removed = {o for n in copy.graph.node for o in n.output if o} - {o for n in kept for o in n.output if o}
    del copy.graph.node[:]
    copy.graph.node.extend(kept)
    copy.graph.initializer.extend(onnx.numpy_helper.from_array(values[name], name) for name in sorted(removed))
    inferred = _run_onnx_inference(copy)
    def typed(name: str) -> onnx.ValueInfoProto:
        array = values[name]
        return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype),
                                                  list(array.shape))

    result = _copy(model)
    outputs = {o.name for o in result.graph.output}
    result.graph.value_info.extend(inferred.graph.value_info)
    result.graph.value_info.extend(typed(name) for name in sorted(removed - outputs))
    del result.graph.output[:]
    result.graph.output.extend(typed(o.name) if o.name in removed else o for o in inferred.graph.output)
    return result


def _infer(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """onnx shape inference, then evaluated shape computations, then onnxruntime's symbolic inference.

    Every node output that something reads ends with a concrete shape, or a GraphError says which does not.
    """
    used = _used_names(model.graph)
    inferred = _run_onnx_inference(model)
    missing = _missing_outputs(inferred, used)
    values: dict[str, np.ndarray] = {}
    for _ in range(4):
        if not missing or not _propagate_values(model, inferred, missing, opset, values):
            break
        inferred = _infer_with_values(model, values)
        missing = _missing_outputs(inferred, used)
    # onnxruntime's symbolic inference is slow on large graphs: only for the contrib ops onnx cannot shape.
    if missing and any(n.domain == CONTRIB_DOMAIN for n in _all_nodes(model.graph)):
        inferred = _run_symbolic_inference(inferred)
        missing = _missing_outputs(inferred, used)
    if missing:
        out, index = missing[0]
        node = inferred.graph.node[index]
        raise GraphError(f"cannot infer a concrete shape for '{out}', output of {_describe(node, index)}: "
                         "it depends on values known only at run time")
    return inferred


# --------------------------------------------------------------- constants

def _constant_names(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo]) -> frozenset[str]:
    """What onnxruntime knows before inference: initializers and what only depends on them.

    Since IR 4 an initializer that is also a graph input can be overridden
    at run time, so onnxruntime does not fold it; before IR 4 every
    initializer was listed as an input and is a constant.
    """
    graph = model.graph
    inputs = {i.name for i in graph.input}
    constants = {t.name for t in graph.initializer if model.ir_version < 4 or t.name not in inputs}
    constants |= {s.values.name for s in graph.sparse_initializer}
    for node in graph.node:
        outputs = [o for o in node.output if o]
        if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS:
            constants.update(outputs)
        elif node.op_type in _NOT_FOLDED:
            continue
        elif node.op_type in ("Shape", "Size") and node.domain in _ONNX_DOMAINS and node.input[0] in tensors:
            constants.update(outputs)  # every shape is static once the inputs are bound
        else:
            reads = [i for i in node.input if i]
            if reads and all(i in constants for i in reads):
                constants.update(outputs)
    return frozenset(constants)


# ------------------------------------------------------------------- entry

def bind_and_infer(model: onnx.ModelProto, inputs: Mapping[str, InputSpec] | None, limits: Limits,
                   name: str = "") -> Graph:
    """A Graph whose every tensor has a concrete shape, with `inputs` binding the symbolic dimensions."""
    model = _copy(model)
    opset = _default_opset(model)
    _count_nodes(model.graph, limits)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:
            raise GraphError(f"cannot inline the model's local functions: {_one_line(str(e))}") from None
        del model.functions[:]
        _count_nodes(model.graph, limits)
    _check_operators(model, opset)
    _check_declared_tensors(model, limits)
    _sort_graph(model.graph, set(), "")
    static = _declared_static(model)
    _bind_inputs(model.graph, inputs or {}, limits)
    # The exporter's shape hints may carry stale symbolic or wrong dims; they are inferred anew.
    del model.graph.value_info[:]
    for output in model.graph.output:
        if output.type.WhichOneof("value") == "tensor_type":
            output.type.tensor_type.ClearField("shape")

    inferred = _infer(model, opset)

    tensors: dict[str, TensorInfo] = {}
    _collect_tensors(inferred.graph, limits, tensors, main=True)
    for tensor_name, info in tensors.items():
        limits.check_shape(tensor_name, info.shape)
    limits.check_flops(total_flops(inferred.graph, tensors))
    constants = _constant_names(inferred, tensors)
    return Graph(inferred, tensors, constants, name or inferred.graph.name, static)


def _declared_static(model: onnx.ModelProto) -> frozenset[str] | None:
    """Tensors whose shape the model fixes by itself, before any binding (None: every tensor's).

    onnxruntime creates its session from the model as declared, so only these
    shapes are known to its constant folding and shape-dependent fusions.
    """
    declared_inputs = [_declared_dims(i) for i in real_inputs(model.graph)]
    if all(dims is not None and all(isinstance(d, int) for d in dims) for dims in declared_inputs):
        return None
    try:
        declared = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # what cannot be inferred is not known to onnxruntime either
        return frozenset(t.name for t in model.graph.initializer)
    static = {t.name for t in declared.graph.initializer}
    for value in [*declared.graph.input, *declared.graph.value_info, *declared.graph.output]:
        shape = value.type.tensor_type.shape if value.type.HasField("tensor_type") else None
        if shape is not None and value.type.tensor_type.HasField("shape") \
                and all(d.HasField("dim_value") and d.dim_value > 0 for d in shape.dim):
            static.add(value.name)
    return frozenset(static)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
