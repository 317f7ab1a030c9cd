"""WebNN operator cases shared by the text, JSON and builder tests.

Each case is a tiny `.webnn` graph and the output shapes the WebNN spec
gives for it (worked out by hand from the spec's shape rules, not from our
lowering). Tests run each case through the real import (bind_and_infer) and
through onnxruntime with random weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from agent.simulation.materialize import materialize
from monitors.graphs.graph import Graph


@dataclass(frozen=True)
class Case:
    id: str
    inputs: str       # lines of the inputs block
    consts: str       # lines of the consts block
    nodes: str        # lines of the nodes block
    expect: dict      # output name -> (dtype, shape)

    def text(self) -> str:
        outs = " ".join(f"{o};" for o in self.expect)
        return (f'webnn_graph "{self.id}" v1 {{\n  inputs {{ {self.inputs} }}\n  consts {{ {self.consts} }}\n'
                f"  nodes {{\n    {self.nodes}\n  }}\n  outputs {{ {outs} }}\n}}\n")


def _c(id: str, inputs: str, consts: str, nodes: str, **expect) -> Case:
    return Case(id, inputs, consts, nodes,
                {k: (v if v and isinstance(v[0], str) else ("float32", v)) for k, v in expect.items()})


X4 = "x: f32[1, 32, 8, 8];"
UNARY = ["relu", "sigmoid", "tanh", "gelu", "erf", "exp", "log", "sqrt", "abs", "neg", "identity", "hardSwish",
         "softplus", "softsign", "elu", "leakyRelu", "hardSigmoid", "ceil", "floor", "reciprocal", "sin", "cos"]

CASES: list[Case] = [
    _c("conv2d", "x: f32[1, 3, 224, 224];", 'w: f32[32, 3, 3, 3] @weights("conv.w");',
       "y = conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1]);", y=(1, 32, 112, 112)),
    _c("conv2d_nhwc_ohwi_depthwise_bias", "x: f32[1, 56, 56, 32];", "w: f32[32, 3, 3, 1]; b: f32[32];",
       'y = conv2d(x, w, bias=b, groups=32, padding=[1, 1, 1, 1], inputLayout="nhwc", filterLayout="ohwi");',
       y=(1, 56, 56, 32)),
    _c("conv2d_hwio_dilated", "x: f32[1, 3, 32, 32];", "w: f32[3, 3, 3, 16];",
       'y = conv2d(x, w, dilations=[2, 2], filterLayout="hwio");', y=(1, 16, 28, 28)),
    _c("conv2d_ihwo_bias_positional", "x: f32[1, 3, 32, 32];", "w: f32[3, 3, 3, 16]; b: f32[16];",
       'y = conv2d(x, w, b, filterLayout="ihwo", strides=[1, 2]);', y=(1, 16, 30, 15)),
    _c("conv2d_autopad_activation", "x: f32[1, 3, 225, 225];", "w: f32[8, 3, 3, 3];",
       'y = conv2d(x, w, strides=[2, 2], autoPad="same-upper", activation="relu");', y=(1, 8, 113, 113)),
    _c("convTranspose2d", "x: f32[1, 16, 14, 14];", "w: f32[16, 8, 4, 4];",
       "y = convTranspose2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1]);", y=(1, 8, 28, 28)),
    _c("convTranspose2d_outputSizes", "x: f32[1, 16, 14, 14];", "w: f32[16, 8, 3, 3]; b: f32[8];",
       "y = convTranspose2d(x, w, bias=b, strides=[2, 2], padding=[1, 1, 1, 1], outputSizes=[28, 28]);",
       y=(1, 8, 28, 28)),
    _c("convTranspose2d_nhwc_hwoi_outputPadding", "x: f32[1, 7, 7, 16];", "w: f32[3, 3, 8, 16];",
       'y = convTranspose2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], outputPadding=[1, 1], '
       'inputLayout="nhwc", filterLayout="hwoi");', y=(1, 14, 14, 8)),
    _c("averagePool2d", "x: f32[1, 32, 112, 112];", "",
       "y = averagePool2d(x, windowDimensions=[3, 3], strides=[2, 2]);", y=(1, 32, 55, 55)),
    _c("maxPool2d_ceil_padding", "x: f32[1, 32, 112, 112];", "",
       'y = maxPool2d(x, windowDimensions=[3, 3], strides=[2, 2], roundingType="ceil");', y=(1, 32, 56, 56)),
    _c("maxPool2d_outputSizes", "x: f32[1, 8, 112, 112];", "",
       "y = maxPool2d(x, windowDimensions=[3, 3], strides=[2, 2], padding=[0, 1, 0, 1], outputSizes=[56, 56]);",
       y=(1, 8, 56, 56)),
    _c("averagePool2d_global", "x: f32[1, 32, 7, 7];", "", "y = averagePool2d(x);", y=(1, 32, 1, 1)),
    _c("maxPool2d_global_nhwc", "x: f32[1, 7, 7, 32];", "", 'y = maxPool2d(x, layout="nhwc");', y=(1, 1, 1, 32)),
    _c("l2Pool2d", "x: f32[1, 4, 8, 8];", "", "y = l2Pool2d(x, windowDimensions=[2, 2], strides=[2, 2]);",
       y=(1, 4, 4, 4)),
    _c("l2Pool2d_global", "x: f32[1, 4, 8, 8];", "", "y = l2Pool2d(x);", y=(1, 4, 1, 1)),
    _c("averagePool2d_no_window_strided", "x: f32[1, 4, 8, 8];", "", "y = averagePool2d(x, strides=[2, 2]);",
       y=(1, 4, 1, 1)),
    _c("matmul_batched_broadcast", "a: f32[2, 1, 4, 8]; b: f32[3, 8, 5];", "", "y = matmul(a, b);",
       y=(2, 3, 4, 5)),
    _c("matmul_weights", "x: f32[1, 2048];", 'W: f32[2048, 1000] @weights("W");', "y = matmul(x, W);",
       y=(1, 1000)),
    _c("gemm_transposed_c", "a: f32[8, 4];", "b: f32[5, 8]; c: f32[5];",
       "y = gemm(a, b, c=c, aTranspose=true, bTranspose=true, alpha=0.5, beta=2.0);", y=(4, 5)),
    _c("gemm_plain", "a: f32[3, 4];", "b: f32[4, 6];", "y = gemm(a, b);", y=(3, 6)),
    _c("softmax_axis", "x: f32[2, 10];", "", "y = softmax(x, axis=1);", y=(2, 10)),
    _c("softmax_positional_axis", "x: f32[2, 3, 4];", "", "y = softmax(x, 1);", y=(2, 3, 4)),
    *[_c(f"binary_{op}", "a: f32[2, 3, 4]; b: f32[4];", "", f"y = {op}(a, b);", y=(2, 3, 4))
      for op in ("add", "sub", "mul", "div", "max", "min", "pow")],
    _c("binary_broadcast_both", "a: f32[2, 1, 4]; b: f32[3, 1];", "", "y = add(a, b);", y=(2, 3, 4)),
    *[_c(f"unary_{op}", X4, "", f"y = {op}(x);", y=(1, 32, 8, 8)) for op in UNARY],
    _c("clamp", X4, "", "y = clamp(x, minValue=0, maxValue=6);", y=(1, 32, 8, 8)),
    _c("clamp_max_only", X4, "", "y = clamp(x, maxValue=6.0);", y=(1, 32, 8, 8)),
    _c("leakyRelu_alpha", X4, "", "y = leakyRelu(x, alpha=0.1);", y=(1, 32, 8, 8)),
    _c("linear", X4, "", "y = linear(x, alpha=2, beta=1);", y=(1, 32, 8, 8)),
    _c("prelu", "x: f32[1, 3, 4, 4];", "s: f32[3, 1, 1];", "y = prelu(x, s);", y=(1, 3, 4, 4)),
    _c("cast", "x: f32[2, 3];", "", 'y = cast(x, "int32");', y=("int32", (2, 3))),
    _c("cast_option", "x: f32[2, 3];", "", 'y = cast(x, type="float16");', y=("float16", (2, 3))),
    _c("batchNormalization", X4, "m: f32[32]; v: f32[32]; s: f32[32]; b: f32[32];",
       "y = batchNormalization(x, m, v, scale=s, bias=b, epsilon=0.001);", y=(1, 32, 8, 8)),
    _c("batchNormalization_nhwc_no_scale", "x: f32[1, 8, 8, 32];", "m: f32[32]; v: f32[32];",
       "y = batchNormalization(x, m, v, axis=3);", y=(1, 8, 8, 32)),
    _c("instanceNormalization", X4, "s: f32[32]; b: f32[32];", "y = instanceNormalization(x, scale=s, bias=b);",
       y=(1, 32, 8, 8)),
    _c("instanceNormalization_nhwc_no_scale", "x: f32[1, 8, 8, 32];", "",
       'y = instanceNormalization(x, layout="nhwc");', y=(1, 8, 8, 32)),
    _c("layerNormalization", "x: f32[2, 5, 16];", "s: f32[16]; b: f32[16];",
       "y = layerNormalization(x, scale=s, bias=b, axes=[2], epsilon=0.00001);", y=(2, 5, 16)),
    _c("layerNormalization_default_axes", "x: f32[2, 4, 4];", "", "y = layerNormalization(x);", y=(2, 4, 4)),
    _c("reduceMean_keep", X4, "", "y = reduceMean(x, axes=[2, 3], keepDimensions=true);", y=(1, 32, 1, 1)),
    _c("reduceSum_all", X4, "", "y = reduceSum(x);", y=()),
    _c("reduceMax_axis", X4, "", "y = reduceMax(x, axes=[1]);", y=(1, 8, 8)),
    *[_c(f"{op}_axes", X4, "", f"y = {op}(x, axes=[3]);", y=(1, 32, 8))
      for op in ("reduceMin", "reduceProduct", "reduceL1", "reduceL2", "reduceLogSum", "reduceLogSumExp",
                 "reduceSumSquare")],
    _c("reduceMean_empty_axes", X4, "", "y = reduceMean(x, axes=[]);", y=(1, 32, 8, 8)),
    _c("argMax", X4, "", "y = argMax(x, 1);", y=("int32", (1, 8, 8))),
    _c("argMin_keep_int64", X4, "", 'y = argMin(x, axis=2, keepDimensions=true, outputDataType="int64");',
       y=("int64", (1, 32, 1, 8))),
    _c("reshape", X4, "", "y = reshape(x, [1, 2048]);", y=(1, 2048)),
    _c("reshape_minus_one", X4, "", "y = reshape(x, newShape=[4, -1]);", y=(4, 512)),
    _c("transpose", X4, "", "y = transpose(x, permutation=[0, 2, 3, 1]);", y=(1, 8, 8, 32)),
    _c("transpose_default", "x: f32[2, 3, 4];", "", "y = transpose(x);", y=(4, 3, 2)),
    _c("concat", "a: f32[1, 3, 4]; b: f32[1, 5, 4];", "", "y = concat(a, b, axis=1);", y=(1, 8, 4)),
    _c("concat_list_positional", "a: f32[1, 3, 4]; b: f32[1, 3, 2];", "", "y = concat([a, b, a], 2);",
       y=(1, 3, 10)),
    _c("split_count", "x: f32[1, 8, 4];", "", "[p, q] = split(x, 2, axis=1);", p=(1, 4, 4), q=(1, 4, 4)),
    _c("split_sizes", "x: f32[6, 4];", "", "[p, q, r] = split(x, splits=[1, 2, 3]);",
       p=(1, 4), q=(2, 4), r=(3, 4)),
    _c("slice", "x: f32[4, 6];", "", "y = slice(x, [1, 2], [2, 3]);", y=(2, 3)),
    _c("slice_strides", "x: f32[4, 6];", "", "y = slice(x, [0, 0], [4, 5], strides=[2, 2]);", y=(2, 3)),
    _c("pad_constant", "x: f32[1, 3, 8, 8];", "", "y = pad(x, [0, 0, 1, 1], [0, 0, 2, 2], value=0.5);",
       y=(1, 3, 11, 11)),
    _c("pad_reflection", "x: f32[1, 3, 8, 8];", "",
       'y = pad(x, beginningPadding=[0, 0, 1, 1], endingPadding=[0, 0, 1, 1], mode="reflection");',
       y=(1, 3, 10, 10)),
    _c("pad_edge", "x: f32[2, 3];", "", 'y = pad(x, [1, 0], [1, 2], mode="edge");', y=(4, 5)),
    _c("resample2d_scales_linear", "x: f32[1, 3, 8, 8];", "", 'y = resample2d(x, scales=[2.0, 2.0], mode="linear");',
       y=(1, 3, 16, 16)),
    _c("resample2d_sizes", "x: f32[1, 3, 8, 8];", "", "y = resample2d(x, sizes=[5, 7]);", y=(1, 3, 5, 7)),
    _c("resample2d_nhwc_axes", "x: f32[1, 8, 8, 3];", "", "y = resample2d(x, scales=[0.5, 0.5], axes=[1, 2]);",
       y=(1, 4, 4, 3)),
    _c("expand", "x: f32[3, 1];", "", "y = expand(x, [2, 3, 4]);", y=(2, 3, 4)),
    _c("gather", "x: f32[4, 5, 6]; i: i32[2, 3];", "", "y = gather(x, i, axis=1);", y=(4, 2, 3, 6)),
    _c("gather_uint32_indices", "x: f32[4, 5];", "i: u32[3];", "y = gather(x, i);", y=(3, 5)),
    _c("where_uint8_condition", "c: u8[2, 3]; a: f32[2, 3]; b: f32[3];", "", "y = where(c, a, b);", y=(2, 3)),
    _c("where_greater", "a: f32[2, 3]; b: f32[3];", "", "g = greater(a, b);\n    y = where(g, a, b);", y=(2, 3)),
    _c("compare_logical", "a: f32[2, 3]; b: f32[2, 3];", "",
       "e = notEqual(a, b);\n    l = lesserOrEqual(a, b);\n    y = logicalAnd(e, logicalNot_in);\n"
       "    logicalNot_in = logicalNot(l);", y=("bool", (2, 3))),
    _c("gatherElements", "x: f32[4, 5]; i: i64[4, 2];", "", "y = gatherElements(x, i, axis=1);", y=(4, 2)),
    _c("gatherND", "x: f32[4, 5, 6]; i: i32[3, 2];", "", "y = gatherND(x, i);", y=(3, 6)),
    _c("reverse", "x: f32[2, 3, 4];", "", "y = reverse(x, axes=[0, 2]);", y=(2, 3, 4)),
    _c("isNaN_isInfinite", "x: f32[2, 3];", "", "n = isNaN(x);\n    i = isInfinite(x);\n    y = logicalOr(n, i);",
       y=("bool", (2, 3))),
    _c("layerNormalization_nchw_channel_axis", "x: f32[1, 8, 4, 4];", "s: f32[8]; b: f32[8];",
       "y = layerNormalization(x, scale=s, bias=b, axes=[1]);", y=(1, 8, 4, 4)),
    _c("layerNormalization_unsorted_axes", "x: f32[2, 3, 4, 5];", "s: f32[5, 3];",
       "y = layerNormalization(x, scale=s, axes=[3, 1]);", y=(2, 3, 4, 5)),
    _c("dequantizeLinear_per_tensor_conv", "x: f32[1, 8, 6, 6];",
       "w: i8[4, 8, 3, 3]; s: f32[1, 1, 1, 1]; z: i8[1, 1, 1, 1];",
       "wf = dequantizeLinear(w, s, z);\n    y = conv2d(x, wf);", y=(1, 4, 4, 4)),
    _c("dequantizeLinear_per_axis", "", "w: u8[16, 32]; s: f32[32]; z: u8[32];",
       "y = dequantizeLinear(w, s, z);", y=(16, 32)),
    _c("quantizeLinear_per_channel", "x: f32[1, 8, 4, 4];", "s: f32[8, 1, 1]; z: u8[8, 1, 1];",
       "q = quantizeLinear(x, s, z);\n    y = dequantizeLinear(q, s, z);", y=(1, 8, 4, 4)),
    _c("squeeze_unsqueeze", "x: f32[1, 3, 1, 4];", "",
       "s = squeeze(x, axes=[0, 2]);\n    y = unsqueeze(s, axes=[0]);", y=(1, 3, 4)),
    _c("tile", "x: f32[2, 3];", "", "y = tile(x, [2, 2]);", y=(4, 6)),
    _c("cumulativeSum", "x: f32[2, 3];", "", "y = cumulativeSum(x, 1, exclusive=true);", y=(2, 3)),
    _c("triangular", "x: f32[4, 4];", "", "y = triangular(x, upper=false, diagonal=1);", y=(4, 4)),
    _c("alias_and_scalar", "x: f32[2, 3];", "s: f32[] @scalar(0.5);", "m = mul(x, s);\n    y = m;", y=(2, 3)),
    _c("bytes_const", "x: f32[4, 5];", "i: i32[2] @bytes([1, 0, 0, 0, 3, 0, 0, 0]);", "y = gather(x, i);",
       y=(2, 5)),
    _c("float16", "x: f16[1, 8, 4, 4];", "w: f16[8, 8, 1, 1];", "c = conv2d(x, w);\n    y = gelu(c);",
       y=("float16", (1, 8, 4, 4))),
]


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a bound graph: floats in [-1, 1], integers 0 (valid indices), uint8 0/1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in graph.model.graph.input:
        info = graph.tensors[inp.name]
        if info.dtype.startswith("float"):
            feeds[inp.name] = rng.uniform(-1, 1, info.shape).astype(info.dtype)
        elif info.dtype == "uint8":
            feeds[inp.name] = rng.integers(0, 2, info.shape).astype(np.uint8)
        else:
            feeds[inp.name] = np.zeros(info.shape, dtype=info.dtype)
    return feeds


def run(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Run a weightless graph in onnxruntime with random weights and inputs."""
    model = materialize(graph, seed)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, random_feeds(graph, seed)), strict=True))


def to_json(decl) -> dict:
    """A parsed graph declaration written out as webnn-graph-json (for twin tests)."""
    def init(c):
        if c.kind == "weights":
            return {"kind": "weights", "ref": c.value}
        if c.kind == "scalar":
            return {"kind": "scalar", "value": c.value}
        return {"kind": "inlineBytes", "bytes": list(c.value)}

    def dim(d):
        return {"name": d, "maxSize": 4096} if isinstance(d, str) else d

    nodes = []
    for n in decl.nodes:
        node = {"id": n.outputs[0], "op": n.op, "inputs": n.inputs, "options": n.options}
        if len(n.outputs) > 1 or n.op == "split":
            node["outputs"] = n.outputs
        nodes.append(node)
    return {
        "format": "webnn-graph-json", "version": 2, "name": decl.name,
        "inputs": {i.name: {"dataType": i.dtype, "shape": [dim(d) for d in i.dims]} for i in decl.inputs},
        "consts": {c.name: {"dataType": c.dtype, "shape": c.dims, "init": init(c)} for c in decl.consts},
        "nodes": nodes,
        "outputs": {name: ref for name, ref, _ in decl.outputs},
    }
