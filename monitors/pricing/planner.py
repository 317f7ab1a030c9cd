"""Plan the kernels onnxruntime's CPU provider runs for a graph (default session options).

onnxruntime does not run ONNX nodes one by one: at session creation it folds
constants, drops no-ops, fuses (Conv+BatchNorm+Add+activation, MatMul+Add,
MatMul+scale, Transpose into MatMul, GELU, LayerNorm) and, on x86 with AVX2 or
AVX-512, moves convolutions to the blocked NCHWc layout with reorder kernels
at the layout's borders. Each rule here mirrors one of those passes; tests
check the plan against onnxruntime's own optimized graph on real models.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

import onnx

from monitors.errors import GraphError
from monitors.graphs.graph import ITEMSIZE, Graph, TensorInfo
from monitors.graphs.shapes import real_inputs
from monitors.pricing.kernels import Kernel, Plan
from monitors.pricing.transposes import push_transposes
from probes.calibration import COMPUTE_FAMILIES, NCHWC_UPSAMPLE

DEFAULT_NCHWC_BLOCK = 16  # AVX-512; 8 on AVX2; 0 where onnxruntime has no NCHWc path (ARM)


@dataclass(frozen=True)
class Provider:
    """Where onnxruntime's graph optimizations and kernels differ by execution provider (onnxruntime 1.31)."""

    nchwc_block: int = DEFAULT_NCHWC_BLOCK  # the CPU's blocked layout: 16 on AVX-512, 8 on AVX2, 0 without
    conv_activation: bool = True  # an activation after a Conv runs inside it (the CPU provider's FusedConv)
    transpose_through_resize: bool = True  # the transpose optimizer pushes through Resize (not in CUDA builds)
    host_copies: bool = False  # the app's inputs and outputs cross into the device's memory and back


# The CUDA provider, as the optimized graphs of the zoo on an H100 show it: activations run apart from their
# convolutions, Transposes stay before a Resize, and every input and output is copied (MemcpyFromHost/ToHost).
CUDA = Provider(nchwc_block=0, conv_activation=False, transpose_through_resize=False, host_copies=True)

ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"}
# MLAS's blocked convolutions apply Relu as they write; these, in a second pass over the output.
SECOND_PASS_ACTIVATIONS = ACTIVATIONS - {"Relu"}
VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
REMOVED = {"Identity", "Dropout"}
ELTWISE = {
    "Add", "Sub", "Mul", "Div", "Relu", "Clip", "LeakyRelu", "Max", "Min", "Neg", "Abs", "Sqrt", "Reciprocal",
    "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Not", "Xor", "Floor",
    "Ceil", "Round", "Sign", "HardSigmoid", "PRelu", "Cast", "Sum", "Mean", "IsNaN", "IsInf", "Mod", "BitShift",
    "ThresholdedRelu", "Shrink", "CastLike", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "RotaryEmbedding",
}
TRANSCENDENTAL = {
    "Exp", "Log", "Tanh", "Sigmoid", "Erf", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Softplus", "Softsign",
    "HardSwish", "Mish", "Pow", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Elu", "Selu", "Celu",
}
MOVEMENT = {
    "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Pad", "Expand", "Tile",
    "Resize", "Upsample", "DepthToSpace", "SpaceToDepth", "ScatterND", "ScatterElements", "Trilu", "CumSum",
    "ConstantOfShape", "Range", "Shape", "Size", "OneHot", "ReverseSequence", "Compress", "EyeLike", "Col2Im",
    "GatherBlockQuantized",
}
REDUCE = {
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "TopK",
}
SOFTMAX = {"Softmax", "LogSoftmax", "Hardmax"}
NORM = {
    "LayerNormalization", "SkipLayerNormalization", "InstanceNormalization", "GroupNormalization",
    "BatchNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
    "LpNormalization", "MeanVarianceNormalization", "LRN",
}
POOL = {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "MaxRoiPool"}
CONTROL_FLOW = {"Loop", "Scan", "If"}
# onnxruntime's QuickGelu with alpha 1 (x * sigmoid(x): SiLU, Swish, what QuickGeluFusion makes of that pattern) runs
# 2.6x faster than with any other alpha (CLIP's 1.702): its own kernel name, and its own calibration table.
SILU = "Silu"
_FAMILY_OF = {op: family for family, ops in (
    ("view", VIEWS), ("eltwise", ELTWISE), ("transcend", TRANSCENDENTAL | {"QuickGelu", SILU, "BiasGelu", "FastGelu"}),
    ("movement", MOVEMENT | {"ReorderInput", "ReorderOutput", NCHWC_UPSAMPLE}), ("reduce", REDUCE),
    ("softmax", SOFTMAX), ("norm", NORM), ("pool", POOL)) for op in ops}


def memory_family(op: str) -> str | None:
    """The cost family of a memory-bound ONNX (or onnxruntime) op; None for ops with no model."""
    return _FAMILY_OF.get(op)
# Ops that keep a tensor in NCHWc when onnxruntime's NchwcTransformer has converted its producer.
NCHWC_UNARY = {"Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "HardSigmoid", "QuickGelu", SILU, "Gelu", "FastGelu"}
NCHWC_POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
CHANNELS_LAST = (0, 2, 3, 1)
NCHWC_PASS = NCHWC_UNARY | NCHWC_POOLS | {"Add", "Sum", "Mul", "BatchNormalization", "Concat", "Resize", "Upsample"}


@dataclass
class _Ctx:
    graph: Graph
    producer: dict[str, int]
    consumers: dict[str, list[int]]
    outputs: set[str]
    absorbed: set[int]
    folded: frozenset[str]  # what onnxruntime's constant folding computes at session creation

    def info(self, name: str) -> TensorInfo:
        try:
            return self.graph.tensors[name]
        except KeyError:
            raise GraphError(f"tensor {name!r} has no inferred shape") from None

    def is_const(self, name: str) -> bool:
        return name == "" or name in self.folded

    def sole_consumer(self, tensor: str) -> onnx.NodeProto | None:
        """The one live node reading `tensor`, if nothing else (not even a graph output) does."""
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.outputs:
            return None
        i = users[0]
        return None if i in self.absorbed else self.graph.nodes[i]

    def index(self, node: onnx.NodeProto) -> int:
        return self.producer[node.output[0]]


def plan(graph: Graph, provider: Provider = Provider()) -> Plan:
    """The kernels one inference of `graph` runs on `provider`, in execution order."""
    nchwc_block = provider.nchwc_block
    graph = push_transposes(graph, _folded(graph), provider.transpose_through_resize)
    nodes = graph.nodes
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer[out] = i
    for i, node in enumerate(nodes):
        if node.op_type in CONTROL_FLOW:
            raise GraphError(f"control-flow operator {node.op_type!r} (node {node.name or i}) is not supported")
        for inp in node.input:
            if inp:
                consumers[inp].append(i)
    ctx = _Ctx(graph, producer, consumers, {o.name for o in graph.model.graph.output}, set(),
               _folded(graph))
    for i, node in enumerate(nodes):  # constant folding and no-op removal
        if all(ctx.is_const(o) for o in node.output if o) or node.op_type in REMOVED:
            ctx.absorbed.add(i)

    _eliminate_common_subexpressions(ctx)
    fused: dict[int, tuple[Kernel, str, str]] = {}  # pattern fusions at their chain's first node: kernel, in, out
    for i, node in enumerate(nodes):
        if i not in ctx.absorbed and node.op_type in PATTERNS:
            PATTERNS[node.op_type](ctx, node, fused)

    kernels: list[Kernel] = []
    nchwc: set[str] = set()  # tensors onnxruntime holds in the blocked layout
    reordered: set[str] = set()  # NCHWc tensors already copied back to NCHW
    notes: list[str] = []

    def reorder(tensor: str) -> None:
        if tensor in nchwc and tensor not in reordered:
            reordered.add(tensor)
            kernels.append(_memory("movement", 2 * ctx.info(tensor).nbytes, "ReorderOutput"))

    for i, node in enumerate(nodes):
        if i in fused:
            kernel, x, out = fused[i]
            if x in nchwc and kernel.op in NCHWC_UNARY:
                nchwc.add(out)
            else:
                reorder(x)
            kernels.append(kernel)
            continue
        if i in ctx.absorbed:
            continue
        op = node.op_type
        if op == "Conv":
            kernel, last, blocked = _conv(ctx, node, nchwc_block, provider.conv_activation)
            x = node.input[0]
            if blocked and ctx.info(x).shape[1] >= nchwc_block:
                if x not in nchwc:
                    kernels.append(_memory("movement", 2 * ctx.info(x).nbytes, "ReorderInput"))
            else:  # the plain kernel, or the blocked one reading NCHW input directly (few channels)
                reorder(x)
            if blocked:
                nchwc.add(last)
            kernels.append(kernel)
            continue
        if op == "Transpose" and node.input[0] in nchwc and ctx.consumers.get(node.input[0]) == [i] and \
                node.input[0] not in ctx.outputs and tuple(_attr(node, "perm", ())) == CHANNELS_LAST:
            reordered.add(node.input[0])  # the reorder writes channels-last itself (ReorderOutput channels_last=1)
            kernels.append(_memory("movement", 2 * ctx.info(node.input[0]).nbytes, "ReorderOutput"))
            continue
        blocked = bool(nchwc_block) and op in NCHWC_PASS and _nchwc_passes(ctx, node, nchwc, nchwc_block)
        if blocked:
            nchwc.update(o for o in node.output if o)
        else:
            for inp in node.input:
                reorder(inp)
        if op == "Resize" and blocked:
            kernels.append(replace(_simple(ctx, node, notes), op=NCHWC_UPSAMPLE))
        elif op in ("MatMul", "Gemm", "FusedMatMul"):
            kernels.append(_matmul(ctx, node))
        elif op in LLM_KERNELS and (node.domain == "com.microsoft" or op in DEFAULT_DOMAIN_QUANTIZED):
            kernels.extend(LLM_KERNELS[op](ctx, node))
        elif op == "ConvTranspose":
            kernels.extend(_conv_transpose(ctx, node))
        else:
            kernels.append(_simple(ctx, node, notes))
    for out in ctx.outputs:
        reorder(out)
    if provider.host_copies:
        kernels[:0] = [_memory("movement", ctx.info(x.name).nbytes, "MemcpyFromHost")
                       for x in real_inputs(graph.model.graph)]
        kernels += [_memory("movement", ctx.info(o).nbytes, "MemcpyToHost") for o in sorted(ctx.outputs)]

    return Plan(
        kernels=tuple(kernels),
        weight_bytes=_weight_bytes(ctx),
        peak_activation_bytes=_peak_activation_bytes(ctx),
        flops=sum(k.work * k.repeat for k in kernels if k.family in COMPUTE_FAMILIES),
        notes=tuple(notes),
    )


# --- fused compute kernels -------------------------------------------------------------------------------------

def _conv(ctx: _Ctx, node: onnx.NodeProto, block: int, fuse_activation: bool = True) -> tuple[Kernel, str, bool]:
    """A Conv with what onnxruntime fuses after it; returns the kernel, its final output, and NCHWc-ness."""
    x, w = ctx.info(node.input[0]), ctx.info(node.input[1])
    y = ctx.info(node.output[0])
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise GraphError(f"Conv {node.name!r}: unsupported input rank {len(x.shape)}")
    groups = _attr(node, "group", 1)
    cout, cin_g = w.shape[0], w.shape[1]
    taps = math.prod(w.shape[2:])
    m = y.shape[0] * math.prod(y.shape[2:])
    cin = x.shape[1]
    depthwise = groups > 1 and groups == cin and cin_g == 1 and cout == cin
    blocked = bool(block) and len(x.shape) == 4 and (
        groups == 1 or (depthwise and cin % block == 0)
        or (cin_g % block == 0 and (cout // groups) % block == 0))
    ops = ["Conv"]
    last = node.output[0]
    residual_used = False
    reads = float(x.nbytes)  # its input, and a residual it adds
    activation = None
    while (nxt := ctx.sole_consumer(last)) is not None:
        kind = nxt.op_type
        others = [t for t in nxt.input if t and t != last]
        if kind == "BatchNormalization" and all(ctx.is_const(t) for t in nxt.input[1:]) and not residual_used:
            pass
        elif kind in ("Add", "Sum", "Mul") and len(others) == 1 and ctx.is_const(others[0]):
            pass  # ConvAddFusion / ConvMulFusion: per-channel constants fold into the weights
        elif (kind in ("Add", "Sum") and blocked and not residual_used and len(others) == 1
              and ctx.info(others[0]).shape == ctx.info(last).shape):
            residual_used = True
            reads += ctx.info(others[0]).nbytes
        elif kind in ACTIVATIONS and fuse_activation:
            ctx.absorbed.add(ctx.index(nxt))
            ops.append(kind)
            last = nxt.output[0]
            activation = kind
            break
        else:
            break
        ctx.absorbed.add(ctx.index(nxt))
        ops.append(kind)
        last = nxt.output[0]
    op = "+".join(ops)
    # The second pass costs as much as that op on its own (Clip after a depthwise convolution doubles its time).
    epilogue = None
    if blocked and activation in SECOND_PASS_ACTIVATIONS:
        epilogue = _memory(_FAMILY_OF[activation], 2 * ctx.info(last).nbytes, activation)
    if depthwise:
        work = 2.0 * cin * m * taps
        return Kernel("dwconv", (cin, m, taps), work, op, epilogue=epilogue, input_bytes=reads), last, blocked
    co_g = cout // groups
    if blocked:  # the blocked kernels pad channels up to the block size
        co_g = _round_up(co_g, block)
        if cin_g >= block:
            cin_g = _round_up(cin_g, block)
    k = cin_g * taps
    family = "conv1x1" if taps == 1 else "conv"
    repeat = 1 if blocked else groups
    work = 2.0 * m * k * co_g * (groups if blocked else 1)
    return Kernel(family, (m, k, co_g), work, op, repeat, epilogue, reads), last, blocked


def _conv_transpose(ctx: _Ctx, node: onnx.NodeProto) -> list[Kernel]:
    """onnxruntime runs ConvTranspose as a GEMM per group followed by col2im."""
    x, w, y = ctx.info(node.input[0]), ctx.info(node.input[1]), ctx.info(node.output[0])
    groups = _attr(node, "group", 1)
    cin, cout_g = w.shape[0], w.shape[1]
    m = x.shape[0] * math.prod(x.shape[2:])
    n = cout_g * math.prod(w.shape[2:])
    k = cin // groups
    return [
        Kernel("gemm", (m, k, n), 2.0 * m * k * n, "ConvTranspose", groups),
        _memory("movement", 2 * y.nbytes, "Col2Im"),
    ]


def _matmul(ctx: _Ctx, node: onnx.NodeProto) -> Kernel:
    """MatMul/Gemm with the Transpose before it and the bias Add / scale after it that onnxruntime fuses."""
    a, b = ctx.info(node.input[0]), ctx.info(node.input[1])
    ops = [node.op_type]
    for t in node.input[:2]:  # MatmulTransposeFusion and MatMulScaleFusion, on the inputs
        user = ctx.index(node)
        while (p := ctx.producer.get(t)) is not None and p not in ctx.absorbed and not ctx.is_const(t):
            if ctx.consumers.get(t) != [user] or t in ctx.outputs:
                break
            pre = ctx.graph.nodes[p]
            src = pre.input[0] if pre.op_type == "Transpose" else _scaled_input(ctx, pre)
            if src is None:
                break
            ctx.absorbed.add(p)
            ops.insert(0, pre.op_type)
            t, user = src, p
    if node.op_type == "Gemm":
        m, k = (a.shape[1], a.shape[0]) if _attr(node, "transA", 0) else a.shape[:2]
        n = b.shape[0] if _attr(node, "transB", 0) else b.shape[1]
        batch = 1
    else:
        ash = a.shape if len(a.shape) >= 2 else (1,) + a.shape
        bsh = b.shape if len(b.shape) >= 2 else b.shape + (1,)
        m, k = ash[-2], ash[-1]
        n = bsh[-1]
        batch = math.prod(ctx.info(node.output[0]).shape[:-2]) if len(ctx.info(node.output[0]).shape) > 2 else 1
    last = node.output[0]
    while (nxt := ctx.sole_consumer(last)) is not None and nxt.op_type in ("Add", "Mul", "Div"):
        other = [t for t in nxt.input if t != last]
        if len(other) != 1 or not ctx.is_const(other[0]):
            break
        if nxt.op_type == "Add" and (ctx.info(other[0]).size not in (1, n) or (
                len(ctx.info(last).shape) > 2 and not ctx.graph.is_static(last))):
            break  # MatMulAddFusion: a Gemm of 2-D products, or of N-D ones of static shape
        if nxt.op_type in ("Mul", "Div") and _scaled_input(ctx, nxt) != last:
            break
        ctx.absorbed.add(ctx.index(nxt))
        ops.append(nxt.op_type)
        last = nxt.output[0]
    op = "+".join(ops)
    b_batched = len(b.shape) > 2 and math.prod(b.shape[:-2]) > 1
    if ctx.is_const(node.input[1]) or not b_batched:
        rows = batch * m
        return Kernel("gemm", (rows, k, n), 2.0 * rows * k * n, op)
    return Kernel("bmm", (batch, m, k, n), 2.0 * batch * m * k * n, op)


# --- the kernels of language models ----------------------------------------------------------------------------------

def _absorb_bias(ctx: _Ctx, last: str, n: int, ops: list[str]) -> str:
    """A constant bias Add after a quantized matmul: onnxruntime passes it to the kernel as its bias input."""
    nxt = ctx.sole_consumer(last)
    if nxt is not None and nxt.op_type == "Add":
        other = [t for t in nxt.input if t != last]
        if len(other) == 1 and ctx.is_const(other[0]) and ctx.info(other[0]).size == n:
            ctx.absorbed.add(ctx.index(nxt))
            ops.append("Add")
            return nxt.output[0]
    return last


def _matmul_nbits(ctx: _Ctx, node: onnx.NodeProto) -> list[Kernel]:
    """MatMulNBits: block-quantized weights; accuracy level 4 multiplies in int8, the others in float."""
    a = ctx.info(node.input[0])
    k, n = int(_attr(node, "K", a.shape[-1])), int(_attr(node, "N", 0))
    m = math.prod(a.shape[:-1])
    bits, block = int(_attr(node, "bits", 4)), int(_attr(node, "block_size", 32))
    scale_bytes = ITEMSIZE.get(ctx.info(node.input[2]).dtype, 4) if len(node.input) > 2 and node.input[2] else 4
    ops = ["MatMulNBits"]
    _absorb_bias(ctx, node.output[0], n, ops)
    family = "nbits" if _attr(node, "accuracy_level", 0) == 4 else "nbits_f"
    return [Kernel(family, (m, k, n, bits, block, scale_bytes), 2.0 * m * k * n, "+".join(ops))]


def _int8_matmul(ctx: _Ctx, node: onnx.NodeProto) -> list[Kernel]:
    """A matmul of int8 weights (DynamicQuantizeMatMul, MatMulIntegerToFloat, QLinearMatMul)."""
    b_index = 3 if node.op_type == "QLinearMatMul" else 1
    a, b = ctx.info(node.input[0]), ctx.info(node.input[b_index])
    m, k, n = math.prod(a.shape[:-1]), a.shape[-1], b.shape[-1]
    return [Kernel("qgemm", (m, k, n), 2.0 * m * k * n, node.op_type)]


def _matmul_integer(ctx: _Ctx, node: onnx.NodeProto, fused: dict[int, tuple[Kernel, str, str]]) -> None:
    """onnxruntime.quantization's dynamic int8 matmul, DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul
    (-> bias Add): onnxruntime makes it one DynamicQuantizeMatMul when the quantized input feeds only this
    matmul, else a MatMulIntegerToFloat after a DynamicQuantizeLinear kernel shared by its consumers."""
    a, b = ctx.info(node.input[0]), ctx.info(node.input[1])
    m, k, n = math.prod(a.shape[:-1]), a.shape[-1], b.shape[-1]
    chain = {ctx.index(node)}
    ops = ["MatMulInteger"]
    last = node.output[0]
    cast = ctx.sole_consumer(last)
    if cast is not None and cast.op_type == "Cast":
        scale = ctx.sole_consumer(cast.output[0])
        if scale is not None and scale.op_type == "Mul":
            chain |= {ctx.index(cast), ctx.index(scale)}
            ops = ["MatMulIntegerToFloat"]
            last = scale.output[0]
            for t in scale.input:  # the product of the input's and the weights' scales
                p = ctx.producer.get(t)
                if p is not None and ctx.graph.nodes[p].op_type == "Mul" and ctx.consumers.get(t) == [ctx.index(scale)]:
                    chain.add(p)
            before = len(ops)
            last = _absorb_bias(ctx, last, n, ops)
            if len(ops) > before:
                chain.add(ctx.producer[last])
    x = node.input[0]
    quantize = ctx.producer.get(x)
    if (quantize is not None and ctx.graph.nodes[quantize].op_type == "DynamicQuantizeLinear"
            and ops[0] == "MatMulIntegerToFloat" and ctx.consumers.get(x) == [ctx.index(node)]):
        chain.add(quantize)
        ops[0] = "DynamicQuantizeMatMul"
        x = ctx.graph.nodes[quantize].input[0]
    ctx.absorbed.update(chain)
    fused[min(chain)] = (Kernel("qgemm", (m, k, n), 2.0 * m * k * n, "+".join(ops)), x, last)


def _attention_kernel(ctx: _Ctx, node: onnx.NodeProto) -> list[Kernel]:
    """GroupQueryAttention and MultiHeadAttention: S queries against past + L keys and values, the cache
    appended to (and rotary applied, where the op does it) in the same kernel."""
    q = ctx.info(node.input[0]).shape
    heads = int(_attr(node, "num_heads", 1))
    out = ctx.info(node.output[0]).shape
    batch, seq = (q[0], q[1]) if len(q) >= 3 else (1, q[0])
    head = out[-1] // heads if out and heads else 1
    if node.op_type == "GroupQueryAttention":
        kv_heads = int(_attr(node, "kv_num_heads", heads))
        past_index, new = 3, seq
    else:
        kv_heads = heads
        past_index = 6
        key = ctx.info(node.input[1]).shape if len(node.input) > 1 and node.input[1] else None
        new = (key[1] if len(key) == 3 else key[2]) if key else seq
    past = 0
    if len(node.input) > past_index and node.input[past_index]:
        shape = ctx.info(node.input[past_index]).shape
        past = shape[2] if len(shape) == 4 else 0
    total = past + new
    params = (batch * heads, seq, total - seq + 1, head, batch * kv_heads)
    return [Kernel("gqa", params, 4.0 * batch * heads * seq * total * head, node.op_type)]


def _int8_conv(ctx: _Ctx, node: onnx.NodeProto) -> list[Kernel]:
    """QLinearConv and ConvInteger (onnxruntime.quantization's convolutions): priced by the float convolution
    tables over the same (M, K, Co), onnxruntime's int8 convolutions not being calibrated on their own."""
    x, w = ctx.info(node.input[0]), ctx.info(node.input[3 if node.op_type == "QLinearConv" else 1])
    y = ctx.info(node.output[0])
    groups = int(_attr(node, "group", 1))
    taps = math.prod(w.shape[2:])
    m = y.shape[0] * math.prod(y.shape[2:])
    k, co = w.shape[1] * taps, w.shape[0] // groups
    if groups > 1 and groups == x.shape[1] and w.shape[1] == 1:
        return [Kernel("dwconv", (groups, m, taps), 2.0 * groups * m * taps, node.op_type)]
    family = "conv1x1" if taps == 1 else "conv"
    return [Kernel(family, (m, k, co), 2.0 * m * k * co * groups, node.op_type, groups)]


def _fused_attention(ctx: _Ctx, node: onnx.NodeProto) -> list[Kernel]:
    """The contrib Attention of BERT-style exports: the QKV projection, then the attention."""
    x, w = ctx.info(node.input[0]).shape, ctx.info(node.input[1]).shape
    heads = int(_attr(node, "num_heads", 1))
    rows = math.prod(x[:-1])
    batch, seq = x[0], x[1] if len(x) == 3 else 1
    head = w[1] // 3 // heads
    past = 0
    if len(node.input) > 4 and node.input[4]:
        shape = ctx.info(node.input[4]).shape
        past = shape[3] if len(shape) == 5 else 0
    return [Kernel("gemm", (rows, w[0], w[1]), 2.0 * rows * w[0] * w[1], "Attention"),
            Kernel("gqa", (batch * heads, seq, past + 1, head, batch * heads),
                   4.0 * batch * heads * seq * (past + seq) * head, "Attention")]


LLM_KERNELS = {
    "MatMulNBits": _matmul_nbits, "DynamicQuantizeMatMul": _int8_matmul, "MatMulIntegerToFloat": _int8_matmul,
    "QLinearMatMul": _int8_matmul, "GroupQueryAttention": _attention_kernel, "MultiHeadAttention": _attention_kernel,
    "Attention": _fused_attention, "QLinearConv": _int8_conv, "ConvInteger": _int8_conv,
}
DEFAULT_DOMAIN_QUANTIZED = {"QLinearMatMul", "QLinearConv", "ConvInteger"}  # onnx's own int8 ops


GELU_ISLAND = {"Add", "Mul", "Div", "Pow", "Sub"}
GELU_ANCHORS = {"Erf": ("Gelu", 4), "Tanh": ("FastGelu", 4), "Sigmoid": ("QuickGelu", 2)}


def _gelu(ctx: _Ctx, anchor: onnx.NodeProto, fused: dict[int, tuple[Kernel, str, str]]) -> None:
    """GELU/SiLU written out in elementwise ops, which onnxruntime's GeluFusion, FastGeluFusion and
    QuickGeluFusion each turn into one kernel (BiasGeluFusion also takes the bias Add before it).

    Walk back from the Erf/Tanh/Sigmoid through elementwise ops to the one
    tensor x they all derive from, then take in every elementwise op computed
    from x and the island alone; it fuses if exactly one tensor leaves it.
    """
    name, min_size = GELU_ANCHORS[anchor.op_type]
    nodes = ctx.graph.nodes
    island = {ctx.index(anchor)}
    roots: set[str] = set()
    stack = [t for t in anchor.input if t and not ctx.is_const(t)]
    seen: set[str] = set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        p = ctx.producer.get(t)
        if p is not None and p not in ctx.absorbed and nodes[p].op_type in GELU_ISLAND and len(island) < 12:
            island.add(p)
            stack.extend(i for i in nodes[p].input if i and not ctx.is_const(i))
        else:
            roots.add(t)
    if len(roots) != 1:
        return
    (x,) = roots
    grown = True
    while grown and len(island) < 16:
        grown = False
        produced = {o for j in island for o in nodes[j].output}
        for t in produced | {x}:
            for j in ctx.consumers.get(t, []):
                n = nodes[j]
                if j in island or j in ctx.absorbed or n.op_type not in GELU_ISLAND:
                    continue
                if all(i in produced or i == x or ctx.is_const(i) for i in n.input if i):
                    island.add(j)
                    grown = True
    produced = {o for j in island for o in nodes[j].output}
    escaping = {o for o in produced if o in ctx.outputs or any(c not in island for c in ctx.consumers.get(o, []))}
    if len(island) < min_size or len(escaping) != 1:
        return
    if name == "QuickGelu":
        if any(nodes[j].op_type not in ("Mul", "Sigmoid") for j in island):
            return
        if len(island) == 2 and x in anchor.input:  # x * sigmoid(x): no scale inside
            name = SILU
    (out,) = escaping
    ctx.absorbed.update(island)
    fused[min(island)] = (_memory("transcend", 2 * ctx.info(x).nbytes, name), x, out)


def _layer_norm(ctx: _Ctx, mean: onnx.NodeProto, fused: dict[int, tuple[Kernel, str, str]]) -> None:
    """ReduceMean-Sub-Pow-ReduceMean-Add-Sqrt-Div-Mul-Add: onnxruntime's LayerNormFusion makes it one kernel."""
    x = mean.input[0]
    users = [ctx.graph.nodes[i] for i in ctx.consumers.get(mean.output[0], [])]
    if len(users) != 1 or users[0].op_type != "Sub":
        return
    sub = users[0]
    chain = {ctx.index(mean), ctx.index(sub)}
    frontier = [sub.output[0]]
    ends = {"Add", "Mul", "Div", "Pow", "ReduceMean", "Sqrt", "Cast"}
    last = None
    while frontier and len(chain) < 12:
        t = frontier.pop()
        for i in ctx.consumers.get(t, []):
            n = ctx.graph.nodes[i]
            if i in chain or n.op_type not in ends:
                continue
            chain.add(i)
            frontier.extend(o for o in n.output if o)
            last = n
    kinds = sorted(ctx.graph.nodes[i].op_type for i in chain)
    if "Sqrt" not in kinds or kinds.count("ReduceMean") != 2 or last is None:
        return
    ctx.absorbed.update(chain)
    fused[min(chain)] = (_memory("norm", 2 * ctx.info(x).nbytes, "LayerNormalization"), x, last.output[0])


PATTERNS = {"Erf": _gelu, "Tanh": _gelu, "Sigmoid": _gelu, "ReduceMean": _layer_norm, "MatMulInteger": _matmul_integer}


# --- everything else ----------------------------------------------------------------------------------------------

def _scaled_input(ctx: _Ctx, node: onnx.NodeProto) -> str | None:
    """The input that a Mul/Div by one constant number scales; None for anything else."""
    if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return None
    a, b = node.input
    if ctx.is_const(b) and ctx.info(b).size == 1 and not ctx.is_const(a):
        return a
    if node.op_type == "Mul" and ctx.is_const(a) and ctx.info(a).size == 1 and not ctx.is_const(b):
        return b
    return None


def _simple(ctx: _Ctx, node: onnx.NodeProto, notes: list[str]) -> Kernel:
    op = SILU if node.op_type == "QuickGelu" and _attr(node, "alpha", 1.702) == 1.0 else node.op_type
    if op in VIEWS and not any(t in ctx.outputs for t in node.output):
        # onnxruntime's kernel aliases its input unless its output is the graph's, which must own its memory: nothing
        # moves, and it costs its dispatch (16 MiB reshaped within a graph: the profiler's own cost; into the graph's
        # output: a copy, 1.7 ms on a 2-core Intel Xeon VM). The calibration's points are graph outputs: copies.
        return Kernel("view", (1.0,), 0.0, op)
    moved = sum(ctx.info(t).nbytes for t in node.input if t and not ctx.is_const(t))
    moved += sum(ctx.info(t).nbytes for t in node.output if t)
    family = memory_family(op)
    if family is None:
        family = "movement"
        notes.append(f"no cost model for {op!r}: priced as data movement")
    return _memory(family, moved, op)


def _memory(family: str, nbytes: float, op: str) -> Kernel:
    nbytes = max(float(nbytes), 1.0)
    return Kernel(family, (nbytes,), nbytes, op)


def _nchwc_passes(ctx: _Ctx, node: onnx.NodeProto, nchwc: set[str], block: int) -> bool:
    """Whether onnxruntime keeps this op in the blocked layout (its inputs are already blocked)."""
    acts = [t for t in node.input if t and not ctx.is_const(t)]
    if not acts or not all(t in nchwc for t in acts):
        return False
    if node.op_type in ("Add", "Sum", "Mul"):
        return len({ctx.info(t).shape for t in acts}) == 1
    if node.op_type == "Concat":
        return _attr(node, "axis", 0) == 1 and all(ctx.info(t).shape[1] % block == 0 for t in acts)
    if node.op_type in NCHWC_POOLS:
        return len(ctx.info(acts[0]).shape) == 4 and ctx.info(acts[0]).shape[1] % block == 0
    if node.op_type == "Resize":
        return _blocked_resize(ctx, node)
    return True


# The Resizes that onnxruntime's NchwcTransformer runs as its blocked Upsample (onnxruntime 1.32, checked against its
# optimized graphs): whole-number scales of height and width only, linear with these coordinate transformations, or
# nearest with asymmetric coordinates rounded down. Any other leaves the blocked layout first (a ReorderOutput) and
# runs the plain kernel, 3-4x slower.
BLOCKED_LINEAR = ("half_pixel", "asymmetric", "align_corners")


def _blocked_resize(ctx: _Ctx, node: onnx.NodeProto) -> bool:
    x, y = ctx.info(node.input[0]).shape, ctx.info(node.output[0]).shape
    if len(x) != 4 or len(y) != 4 or x[:2] != y[:2] or any(not a or b % a for a, b in zip(x[2:], y[2:], strict=True)):
        return False
    mode, transform = _attr(node, "mode", "nearest"), _attr(node, "coordinate_transformation_mode", "half_pixel")
    if mode == "linear":
        return transform in BLOCKED_LINEAR
    return mode == "nearest" and transform == "asymmetric" and _attr(node, "nearest_mode", "") == "floor"


NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}


def _eliminate_common_subexpressions(ctx: _Ctx) -> None:
    """Drop nodes that repeat an earlier node on the same inputs (onnxruntime's
    CommonSubexpressionElimination): exporters write the same Shape/Gather/Unsqueeze chain many times."""
    same_as: dict[str, str] = {}
    first: dict[tuple, int] = {}
    for i, node in enumerate(ctx.graph.nodes):
        if i in ctx.absorbed or node.op_type in NONDETERMINISTIC:
            continue
        key = (node.domain, node.op_type, tuple(same_as.get(t, t) for t in node.input),
               tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute)))
        j = first.setdefault(key, i)
        if j != i and not any(o in ctx.outputs for o in node.output):
            # not strict: either node may leave out trailing optional outputs
            same_as.update(zip(node.output, ctx.graph.nodes[j].output, strict=False))
            ctx.absorbed.add(i)


def _folded(graph: Graph) -> frozenset[str]:
    """The constants onnxruntime folds: those of the bound graph, except what hangs on the shape of a
    tensor the model leaves dynamic (onnxruntime creates the session before it sees the inputs)."""
    if graph.static is None:
        return graph.constants
    folded = {t.name for t in graph.model.graph.initializer}
    for node in graph.nodes:
        ins = [t for t in node.input if t]
        if node.op_type in ("Shape", "Size"):
            ok = bool(ins) and graph.is_static(ins[0])
        else:
            ok = all(t in folded for t in ins) and node.op_type not in NONDETERMINISTIC
        if ok:
            folded.update(o for o in node.output if o)
    return frozenset(folded & graph.constants)


def _weight_bytes(ctx: _Ctx) -> int:
    """Constants that survive folding (initializers, or what ConstantOfShape and friends make of them)."""
    seen: set[str] = set()
    for node in ctx.graph.nodes:
        if all(ctx.is_const(o) for o in node.output if o):
            continue
        seen.update(t for t in node.input if t and ctx.is_const(t) and t in ctx.graph.tensors)
    return sum(ctx.graph.tensors[t].nbytes for t in seen)


def _peak_activation_bytes(ctx: _Ctx) -> int:
    """Largest sum of live activations along the node order (a plain liveness scan)."""
    last_use: dict[str, int] = {}
    for i, node in enumerate(ctx.graph.nodes):
        for t in node.input:
            last_use[t] = i
    live = peak = 0
    alive: dict[str, int] = {}
    for i, node in enumerate(ctx.graph.nodes):
        if i in ctx.absorbed and all(ctx.is_const(o) for o in node.output if o):
            continue
        for t in node.output:
            if t and t in ctx.graph.tensors and not ctx.is_const(t):
                alive[t] = ctx.graph.tensors[t].nbytes
                live += alive[t]
        peak = max(peak, live)
        for t in set(node.input):
            if t in alive and last_use.get(t) == i and t not in ctx.outputs:
                live -= alive.pop(t)
    inputs = sum(ctx.graph.tensors[i.name].nbytes for i in ctx.graph.model.graph.input
                 if i.name in ctx.graph.tensors and not ctx.is_const(i.name))
    return peak + inputs


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _round_up(x: int, block: int) -> int:
    return -(-x // block) * block
