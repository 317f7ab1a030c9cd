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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
import onnx.numpy_helper

from monitors.errors import GraphError, InputsError, LimitExceeded, UnboundInput
from monitors.graphs import contrib_shapes
from monitors.graphs.graph import DTYPE_NAMES, Graph, InputSpec, TensorInfo
from monitors.graphs.limits import Limits
from monitors.graphs.onnx_import import is_absent, iter_tensors

# onnxruntime contrib operators (domain com.microsoft) the estimator accepts: those whose shapes
# monitors/graphs/contrib_shapes.py infers, and those onnxruntime's symbolic shape inference knows.
CONTRIB_OPS = frozenset({
    "Attention", "BiasAdd", "BiasGelu", "BiasSplitGelu", "DecoderMaskedMultiHeadAttention", "DequantizeLinear",
    "EmbedLayerNormalization", "FastGelu", "GatedRelativePositionBias", "GatherBlockQuantized", "Gelu",
    "GemmFastGelu", "GroupNorm", "GroupQueryAttention", "LongformerAttention", "MatMulNBits",
    "MultiHeadAttention", "NhwcConv", "PackedAttention", "PackedMultiHeadAttention", "QLinearAdd", "QLinearMul",
    "QuantizeLinear", "QuickGelu", "RelativePositionBias", "RemovePadding", "RestorePadding", "RotaryEmbedding",
    "SkipGroupNorm", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SparseAttention",
}) | (frozenset(contrib_shapes.SHAPERS) - contrib_shapes.ORT_DEFAULT_DOMAIN_OPS)
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


def _count_inlined_nodes(model: onnx.ModelProto, limits: Limits) -> int:
    """The nodes the graph will have once its local functions are inlined, from each function's size times its
    calls (nested calls included), before inlining builds any: a few KB of functions that call each other ten
    times over inline into millions of nodes."""
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    sizes: dict[tuple[str, str, str], int] = {}
    calling: set[tuple[str, str, str]] = set()

    def count(nodes: Sequence[onnx.NodeProto], depth: int) -> int:
        total = 0
        for node in nodes:
            key = (node.domain, node.op_type, getattr(node, "overload", ""))
            total += size(key, depth) if key in functions else 1
            for sub in _subgraphs(node):
                limits.check_depth(depth + 1)
                total += count(sub.node, depth + 1)
            limits.check_nodes(total)
        return total

    def size(key: tuple[str, str, str], depth: int) -> int:
        if key not in sizes:
            if key in calling:
                raise GraphError(f"local function '{key[1]}' calls itself")
            calling.add(key)
            sizes[key] = count(functions[key].node, depth)
            calling.discard(key)
        return sizes[key]

    try:
        return count(model.graph.node, 0)
    except RecursionError:
        raise GraphError("local functions call each other too deeply") from None


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
                first = _describe(nodes[producer[out]], producer[out])
                raise GraphError(f"{where}tensor '{out}' is produced twice: by {first} and {_describe(node, index)}")
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
                raise GraphError(f"{where}{_describe(node, index)} reads '{name}', which no node, input or "
                                 "initializer provides")
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
                if domain in _ONNX_DOMAINS and node.op_type in contrib_shapes.ORT_DEFAULT_DOMAIN_OPS:
                    continue  # onnxruntime registers it in the default domain, at every opset
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
            raise InputsError(f"model has no input '{name}'; its inputs are: {', '.join(names) or '(none)'}")
    for value in feeds:
        name = value.name
        if value.type.WhichOneof("value") != "tensor_type":
            raise GraphError(f"input '{name}' is not a tensor; only tensor inputs are supported")
        elem_type = value.type.tensor_type.elem_type
        if elem_type not in DTYPE_NAMES:
            raise GraphError(f"input '{name}' has data type {_type_name(elem_type)}, which is not supported")
        declared = _declared_dims(value)
        spec = inputs.get(name)
        if spec is None:
            if declared is None:
                raise UnboundInput(f"input '{name}' has no declared shape: give its shape in the inputs",
                                   cli_hint=f"pass --input {name}=DIMS")
            shape = []
            for d in declared:
                if not isinstance(d, int):
                    what = f"symbolic dimension '{d}'" if isinstance(d, str) else "an unknown dimension"
                    raise UnboundInput(f"input '{name}' has {what} (shape {_show(declared)}): give its shape in "
                                       "the inputs", cli_hint=f"pass --input {name}={_dims_text(declared)}")
                shape.append(d)
        else:
            shape = list(spec.shape)
            if spec.dtype is not None and spec.dtype != DTYPE_NAMES[elem_type]:
                raise InputsError(f"input '{name}' is {DTYPE_NAMES[elem_type]} in the model, not {spec.dtype}")
            if declared is not None and len(declared) != len(shape):
                raise InputsError(f"input '{name}' has rank {len(declared)} ({_show(declared)}), "
                                  f"but the binding gives {len(shape)} dimensions ({_show(shape)})")
        for d in shape:
            if not isinstance(d, int) or d < 0:
                raise InputsError(f"input '{name}' has invalid dimension {d} in shape {_show(shape)}; "
                                  "dimensions must be non-negative (0 for an empty cache)")
        limits.check_shape(f"input {name}", shape)
        tensor_shape = value.type.tensor_type.shape
        tensor_shape.ClearField("dim")
        for d in shape:
            tensor_shape.dim.add().dim_value = d


def _rebind_fixed(graph: onnx.GraphProto, inputs: Mapping[str, InputSpec]) -> dict[str, InputSpec]:
    """Declare each input that a binding gives other sizes than the model fixed at those sizes, as a runtime
    would take the model built at one resolution and run at another; the shapes are inferred again from there.
    Returns, for each one re-declared, the binding that keeps the model as built (its fixed dimensions, the
    binding's for its symbolic ones), to tell a graph that cannot take the new sizes from one broken anyway."""
    as_built: dict[str, InputSpec] = {}
    for value in real_inputs(graph):
        spec = inputs.get(value.name)
        declared = _declared_dims(value) if value.type.HasField("tensor_type") else None
        if spec is None or declared is None or len(declared) != len(spec.shape):
            continue  # the binding checks say what is wrong with these
        if all(not isinstance(d, int) or d == s for d, s in zip(declared, spec.shape, strict=True)):
            continue
        as_built[value.name] = InputSpec(tuple(d if isinstance(d, int) else s
                                               for d, s in zip(declared, spec.shape, strict=True)), spec.dtype)
        tensor_shape = value.type.tensor_type.shape
        for dim, s in zip(tensor_shape.dim, spec.shape, strict=True):
            if dim.HasField("dim_value") and dim.dim_value != s:
                dim.dim_value = s
    return as_built


def rebound_text(name: str, built: Sequence[int | str | None], given: Sequence[int]) -> str:
    """How an input was re-bound, for the error that says the graph cannot take it."""
    return f"input '{name}' at {_show(given)} (built at {_show(built)})"


def _show(dims: Iterable[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


# ---------------------------------------------------------------- inference

def _run_onnx_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
        text = _one_line(str(e))
        external = re.search(r"Cannot parse data from external tensors.*tensor: (\S+)", text)
        if external:  # weights are never read, so values needed for shapes must be inline
            raise GraphError(_needs_weight(model, external.group(1))) from None
        raise GraphError(f"shape inference failed: {text}") from None
    except Exception as e:  # noqa: BLE001 - onnx raises plain RuntimeError (and others) for malformed graphs
        raise GraphError(f"shape inference failed: {_one_line(str(e)) or type(e).__name__}") from None


def _needs_weight(model: onnx.ModelProto, weight: str) -> str:
    """One line: which op's output shape depends on the values of a weight that is never read, and why."""
    for index, node in enumerate(model.graph.node):
        for i, role in _SHAPE_OPERANDS.get(node.op_type, {}).items():
            if i < len(node.input) and node.input[i] == weight:
                return (f"cannot infer the shape of the output of {_describe(node, index)}: it depends on the values "
                        f"of its input '{role}', the weight '{weight}', whose values are never read; keep small "
                        "integer tensors inline in the model (onnx.save size_threshold)")
    return (f"shape inference needs the values of '{weight}', which are in external data that is never read; "
            "keep small integer tensors inline (onnx.save size_threshold)")


def _run_symbolic_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's symbolic shape inference: knows contrib ops and shapes that depend on computed values.

    Called only where onnx leaves a shape unknown. Its public entry point
    writes a file on failure, so the steps are driven here directly.
    """
    from onnxruntime.tools import symbolic_shape_infer as ssi  # noqa: PLC0415 - imports sympy (~0.6 s): when needed

    ssi.logger.setLevel(logging.ERROR)
    inference = ssi.SymbolicShapeInference(int_max=2**31 - 1, auto_merge=False, guess_output_rank=False, verbose=0)
    try:
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
    except Exception as e:  # noqa: BLE001 - onnxruntime's symbolic inference raises anything on a graph it mishandles
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
        raise GraphError(f"tensor '{name}' has data type {_type_name(elem_type)}, which the estimator does not support")
    return DTYPE_NAMES[elem_type]


def _type_name(elem_type: int) -> str:
    """ONNX's name of an element type (FLOAT), or its number when onnx does not know it."""
    if elem_type in onnx.TensorProto.DataType.values():
        return onnx.TensorProto.DataType.Name(elem_type)
    return str(elem_type)


def _collect_tensors(graph: onnx.GraphProto, limits: Limits, tensors: dict[str, TensorInfo], main: bool) -> None:
    for init in graph.initializer:
        tensors[init.name] = TensorInfo(tuple(init.dims), _dtype_name(init.data_type, init.name))
    for sparse in graph.sparse_initializer:
        values = sparse.values
        tensors[values.name] = TensorInfo(tuple(sparse.dims), _dtype_name(values.data_type, values.name))
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
    for letters, s in zip(lhs, shapes, strict=True):
        if s is None or len(letters) != len(s):
            return 0
        sizes.update(zip(letters, s, strict=True))
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


# Operators whose output size is set by the values of their first n operands: op -> n.
_SHAPED_BY_VALUES = {"ConstantOfShape": 1, "Expand": 2, "Tile": 2, "Range": 3}


def _output_bound(node: onnx.NodeProto, args: list[np.ndarray | None]) -> int | None:
    """An upper bound on the elements a node's outputs will have, or None if it cannot be bounded cheaply."""
    op = node.op_type
    if op in _SHAPED_BY_VALUES:
        a = [x for x in args[:_SHAPED_BY_VALUES[op]] if x is not None]
        if len(a) < _SHAPED_BY_VALUES[op]:  # an operand absent: not bounded here
            return None
        try:
            if op == "ConstantOfShape":
                return math.prod([int(d) for d in a[0].reshape(-1)])
            if op == "Expand":
                return math.prod(np.broadcast_shapes(a[0].shape, tuple(int(d) for d in a[1].reshape(-1))))
            if op == "Tile":
                return math.prod([int(d) * int(r) for d, r in zip(a[0].shape, a[1].reshape(-1), strict=True)])
            start, limit, delta = (float(x.reshape(-1)[0]) for x in a)  # Range
            return max(0, math.ceil((limit - start) / delta)) if delta else None
        except (ValueError, TypeError, IndexError, OverflowError, ZeroDivisionError):
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
    inferred = [c for o in outputs if (c := _concrete(types.get(o))) is not None]
    bound: int | None
    if len(inferred) == len(outputs):
        bound = sum(math.prod(c[0]) for c in inferred)
    else:
        bound = _output_bound(node, args)
    if bound is None or bound > _EVAL_BUDGET:
        return None
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415 - ~70 ms to import; only constant folding needs it

    feeds = {name: arg for name, arg in zip(node.input, args, strict=True) if name}
    try:
        results = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
    except Exception:  # noqa: BLE001 - onnx's reference ops raise anything on odd values; shape inference explains
        return None
    out = {}
    # not strict: the evaluator need not return the node's trailing optional outputs
    for name, result in zip(node.output, results, strict=False):
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
    if missing and any(_is_ort_op(n, opset) for n in model.graph.node):
        inferred = _walk_nodes(model, inferred, values, opset)
        missing = _missing_outputs(inferred, used)
    # onnxruntime's symbolic inference is slow on large graphs, and reads the values of the initializers it
    # meets: only for the contrib ops contrib_shapes does not know.
    if missing and any(n.domain == CONTRIB_DOMAIN and n.op_type not in contrib_shapes.SHAPERS
                       for n in _all_nodes(model.graph)):
        inferred = _run_symbolic_inference(inferred)
        missing = _missing_outputs(inferred, used)
    if missing:
        out, index = missing[0]
        node = inferred.graph.node[index]
        raise GraphError(f"cannot infer a concrete shape for '{out}', output of {_describe(node, index)}: "
                         + _why_unknown(model, index, values))
    return inferred


def _is_ort_op(node: onnx.NodeProto, opset: int) -> bool:
    """An operator onnx cannot shape: onnxruntime's contrib ops and those it adds to the default domain."""
    if node.domain == CONTRIB_DOMAIN:
        return True
    if node.domain in _ONNX_DOMAINS and node.op_type in contrib_shapes.ORT_DEFAULT_DOMAIN_OPS:
        try:
            onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            return True
    return False


def _walk_nodes(model: onnx.ModelProto, inferred: onnx.ModelProto, values: dict[str, np.ndarray],
                opset: int) -> onnx.ModelProto:
    """Shapes node by node in topological order, past the operators onnx does not know.

    onnx's whole-graph inference stops at the first contrib op of a chain, and everything after it
    stays unknown. Here each node with an unknown output is shaped on its own: onnxruntime's ops by
    contrib_shapes, onnx's by onnx's per-node inference (given the small values computed so far, so
    that a Reshape after an attention op still reads its target shape). Small values are computed
    on the way (Shape, Gather, Concat, ...), as _propagate_values does.
    """
    graph = model.graph
    types = _tensor_types(inferred.graph)
    graph_inputs = {i.name for i in graph.input}
    for t in graph.initializer:
        types.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    known = {t.name: t for t in graph.initializer
             if not is_absent(t) and (model.ir_version < 4 or t.name not in graph_inputs)}
    opsets = list(model.opset_import)
    added: dict[str, onnx.TypeProto] = {}
    for node in graph.node:
        outputs = [o for o in node.output if o]
        if all(_concrete(types.get(o)) is not None for o in outputs):
            if node.domain in _ONNX_DOMAINS and not all(o in values for o in outputs):
                _remember_values(node, values, known, types, opset)
            continue
        if _is_ort_op(node, opset):
            shapes = [_concrete(types.get(i)) if i else None for i in node.input]
            contrib = contrib_shapes.infer(node, shapes, values)
            # not strict: a shaper may leave out the trailing optional outputs it does not know
            for name, typed in zip(node.output, contrib or [], strict=False):
                if name and typed is not None:
                    types[name] = added[name] = onnx.helper.make_tensor_type_proto(typed[1], list(typed[0]))
            continue
        if node.domain not in _ONNX_DOMAINS or any(i and _concrete(types.get(i)) is None for i in node.input):
            continue
        data = {}
        for i in node.input:
            if i in values and values[i].size <= _EVAL_BUDGET and values[i].dtype != object:
                data[i] = onnx.numpy_helper.from_array(np.asarray(values[i]), i)
            elif i in known:
                data[i] = known[i]
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
            node_types = onnx.shape_inference.infer_node_outputs(
                schema, node, {i: types[i] for i in node.input if i}, data, opset_imports=opsets,
                ir_version=model.ir_version)
        except Exception:  # noqa: BLE001 - left unknown; the caller says which output and why
            continue
        for name, type_proto in node_types.items():
            if _concrete(type_proto) is not None:
                types[name] = added[name] = type_proto
        _remember_values(node, values, known, types, opset)
    result_model = _copy(inferred)
    graph_outputs = {o.name for o in result_model.graph.output}
    kept = [v for v in result_model.graph.value_info if v.name not in added]  # partial types are replaced
    del result_model.graph.value_info[:]
    result_model.graph.value_info.extend(kept)
    result_model.graph.value_info.extend(onnx.helper.make_value_info(name, t) for name, t in added.items()
                                         if name not in graph_outputs)
    for output in result_model.graph.output:
        if output.name in added:
            output.type.CopyFrom(added[output.name])
    return result_model


def _remember_values(node: onnx.NodeProto, values: dict[str, np.ndarray], known: Mapping[str, onnx.TensorProto],
                     types: Mapping[str, onnx.TypeProto], opset: int) -> None:
    """Keep a node's small output values, for the shape computations after it."""
    if len(values) > _EVAL_MAX_VALUES:
        return
    if node.op_type not in ("Shape", "Size") and not all(not i or i in values or i in known for i in node.input):
        return
    result = _evaluate(node, values, known, types, opset)
    if result:
        values.update(result)


# Inputs whose values set an op's output shape (onnx's data-dependent shape inference): index -> role.
_SHAPE_OPERANDS: dict[str, dict[int, str]] = {
    "Reshape": {1: "shape"}, "Expand": {1: "shape"}, "Tile": {1: "repeats"}, "ConstantOfShape": {0: "shape"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"}, "Pad": {1: "pads", 3: "axes"},
    "Resize": {1: "roi", 2: "scales", 3: "sizes"}, "Upsample": {1: "scales"},
    "Range": {0: "start", 1: "limit", 2: "delta"},
    "TopK": {1: "K"}, "OneHot": {1: "depth"}, "Squeeze": {1: "axes"}, "Unsqueeze": {1: "axes"}, "Split": {1: "split"},
    "ReduceSum": {1: "axes"}, "ReduceMean": {1: "axes"}, "ReduceMax": {1: "axes"}, "ReduceMin": {1: "axes"},
    "ReduceProd": {1: "axes"}, "CenterCropPad": {1: "shape", 2: "axes"}, "Col2Im": {1: "image_shape", 2: "block_shape"},
}
_VALUE_SHAPED = {"NonZero": "the positions of its input's non-zero values",
                 "Unique": "how many distinct values its input holds",
                 "NonMaxSuppression": "how many boxes survive", "Compress": "its condition's values"}


def _why_unknown(model: onnx.ModelProto, index: int, values: Mapping[str, np.ndarray]) -> str:
    """One line on why a node's output shape cannot be known before the run: the weight whose values it
    depends on (weights are never read), or the run-time values that set it."""
    node = model.graph.node[index]
    if node.op_type in _VALUE_SHAPED:
        return f"its shape depends on {_VALUE_SHAPED[node.op_type]}, known only at run time"
    operands = _SHAPE_OPERANDS.get(node.op_type, {})
    absent = {t.name for t in model.graph.initializer if is_absent(t)}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    for i, role in operands.items():
        if i >= len(node.input) or not node.input[i] or node.input[i] in values:
            continue
        weight = _absent_source(node.input[i], producer, absent)
        if weight is not None:
            via = "" if weight == node.input[i] else f" (through '{node.input[i]}')"
            return (f"its shape depends on the values of its input '{role}'{via}, computed from the weight "
                    f"'{weight}', whose values are never read; keep small integer tensors inline in the model")
        return f"its shape depends on the values of its input '{role}' ('{node.input[i]}'), known only at run time"
    return "it depends on values known only at run time"


def _absent_source(name: str, producer: Mapping[str, onnx.NodeProto], absent: set[str]) -> str | None:
    """The absent weight that a value is computed from (not through its shape), if any."""
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in absent:
            return t
        node = producer.get(t)
        if node is not None and node.op_type not in ("Shape", "Size"):
            stack.extend(i for i in node.input if i)
    return None


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
    """A Graph whose every tensor has a concrete shape, with `inputs` binding the symbolic dimensions.

    A binding may also give other sizes than the model fixed (a model built at 224x224, asked about 720x1280):
    the model is taken as built at those sizes. Where the graph cannot take them (a Reshape to a fixed size, a
    MatMul whose sizes no longer agree), that is one InputsError naming the node.
    """
    inputs = inputs or {}
    original = model
    model = _copy(model)
    opset = _default_opset(model)
    _count_nodes(model.graph, limits)
    if model.functions:
        _count_inlined_nodes(model, limits)  # before the inliner builds them
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:  # noqa: BLE001 - onnx's inliner raises arbitrary types for malformed functions
            raise GraphError(f"cannot inline the model's local functions: {_one_line(str(e))}") from None
        del model.functions[:]
        _count_nodes(model.graph, limits)
    _check_operators(model, opset)
    _check_declared_tensors(model, limits)
    _sort_graph(model.graph, set(), "")
    as_built = _rebind_fixed(model.graph, inputs)
    static = _declared_static(model)
    if not as_built:
        return _bind_and_infer(model, inputs, limits, name, opset, static)
    return blame_bindings(lambda: _bind_and_infer(model, inputs, limits, name, opset, static),
                          lambda: bind_and_infer(original, {**inputs, **as_built}, limits, name), inputs, as_built)


def blame_bindings(resized: Callable[[], Graph], built: Callable[[], Graph], inputs: Mapping[str, InputSpec],
                   as_built: Mapping[str, InputSpec]) -> Graph:
    """`resized()`, the graph at the bindings' sizes; where it fails, `built()` tells whose fault it is: a graph
    that works as it was built but not at the new sizes is an InputsError naming the node, else the graph's."""
    try:
        return resized()
    except (LimitExceeded, InputsError):
        raise
    except GraphError as exc:
        try:
            built()
        except GraphError:
            raise exc from None
        what = ", ".join(rebound_text(n, spec.shape, inputs[n].shape) for n, spec in as_built.items())
        raise InputsError(f"the graph cannot take {what}: {exc}") from None


def _bind_and_infer(model: onnx.ModelProto, inputs: Mapping[str, InputSpec], limits: Limits, name: str,
                    opset: int, static: frozenset[str] | None) -> Graph:
    _bind_inputs(model.graph, inputs, limits)
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
    _check_sizes(inferred.graph, tensors)
    limits.check_flops(total_flops(inferred.graph, tensors))
    constants = _constant_names(inferred, tensors)
    return Graph(inferred, tensors, constants, name or inferred.graph.name, static)


def _check_sizes(graph: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> None:
    """What onnx's shape inference lets through: a Reshape must keep its element count (a fixed target shape is
    taken as it is), and a Conv's input must have the channels its weights take."""
    for index, node in enumerate(graph.node):
        if node.domain not in _ONNX_DOMAINS or len(node.input) < 2 or not node.output:
            continue
        x, y = tensors.get(node.input[0]), tensors.get(node.output[0])
        if node.op_type == "Reshape" and x is not None and y is not None and math.prod(x.shape) != math.prod(y.shape):
            raise GraphError(f"{_describe(node, index)} reshapes {_show(x.shape)} ({math.prod(x.shape)} elements) "
                             f"to {_show(y.shape)} ({math.prod(y.shape)} elements)")
        w = tensors.get(node.input[1])
        if node.op_type == "Conv" and x is not None and w is not None and len(x.shape) >= 2 and len(w.shape) >= 2:
            group = _attr_int(node, "group", 1) or 1
            if x.shape[1] != w.shape[1] * group:
                raise GraphError(f"{_describe(node, index)} takes {w.shape[1] * group} input channels (weights "
                                 f"{_show(w.shape)}, group {group}), not the {x.shape[1]} of {_show(x.shape)}")


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
    except Exception:  # noqa: BLE001 - what onnx cannot infer (any error type) is not known to onnxruntime either
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
