"""The kernel plan against onnxruntime's own optimized graph (the oracle), on small and real models."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as h
import onnxruntime as ort
import pytest
from onnx import numpy_helper as nh

from agent.simulation.materialize import materialize
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.pricing.kernels import Kernel
from monitors.pricing.planner import CUDA, Provider, plan
from probes.calibration import NCHWC_UPSAMPLE
from tests.models import LIGHT_DIR, make_model, value

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

COMPUTE_OPS = {"Conv", "FusedConv", "Gemm", "MatMul", "FusedMatMul", "FusedGemm"}


def _ort_kernels(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The op types onnxruntime runs after its default (ORT_ENABLE_ALL) optimizations."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


def _graph(model: onnx.ModelProto):
    return load_graph(model.SerializeToString(), fmt="onnx")


RNG = np.random.default_rng(0)


def _w(shape, name, rng=RNG):
    return nh.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)


def _conv_bn_relu(c: int) -> onnx.ModelProto:
    """x (1x16x28x28) -> Conv 3x3 to `c` channels -> BatchNormalization -> Relu -> y."""
    inits = [_w((c, 16, 3, 3), "w"), _w((c,), "s"), _w((c,), "b"), _w((c,), "m"),
             nh.from_array(np.ones(c, np.float32), "v")]
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             h.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             h.make_node("Relu", ["bn"], ["y"])]
    return make_model(nodes, [value("x", [1, 16, 28, 28])], [value("y", None)], inits)


def test_conv_batchnorm_relu_is_one_kernel_as_in_onnxruntime(tmp_path):
    model = _conv_bn_relu(32)
    p = plan(_graph(model))
    convs = [k for k in p.kernels if k.family == "conv"]
    assert len(convs) == 1 and convs[0].op == "Conv+BatchNormalization+Relu"
    ort_ops = _ort_kernels(model, tmp_path)
    assert "BatchNormalization" not in ort_ops and "Relu" not in ort_ops
    assert sum(op in COMPUTE_OPS for op in ort_ops) == len(convs)
    assert collections.Counter(k.op for k in p.kernels)["ReorderInput"] == ort_ops.count("ReorderInput")


def test_blocked_conv_fused_with_clip_carries_an_output_pass_and_relu_does_not(tmp_path):
    """MLAS's NCHWc kernels apply Relu as they write and any other activation in a second pass over the
    output: onnxruntime fuses both into the Conv, and the plan prices the pass (docs/estimator.md)."""
    c, side = 32, 28
    inits = [_w((c, 1, 3, 3), "w"), nh.from_array(np.array(0, np.float32), "lo"),
             nh.from_array(np.array(6, np.float32), "hi"), _w((c, c, 1, 1), "w2")]
    nodes = [h.make_node("Conv", ["x", "w"], ["d"], group=c, pads=[1] * 4),
             h.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
             h.make_node("Conv", ["d6", "w2"], ["p"]), h.make_node("Relu", ["p"], ["y"])]
    model = make_model(nodes, [value("x", [1, c, side, side])], [value("y", None)], inits)
    dw, pw = [k for k in plan(_graph(model)).kernels if k.family in ("dwconv", "conv1x1")]
    assert dw.op == "Conv+Clip" and dw.epilogue == Kernel("eltwise", (2.0 * 4 * c * side * side,),
                                                          2.0 * 4 * c * side * side, "Clip")
    assert pw.op == "Conv+Relu" and pw.epilogue is None
    assert plan(_graph(model), Provider(nchwc_block=0)).kernels[0].epilogue is None  # the plain kernel: no second pass
    ort_ops = _ort_kernels(model, tmp_path)
    assert "Clip" not in ort_ops and "Relu" not in ort_ops


def test_matmul_bias_add_fuses_and_activation_matmul_does_not(tmp_path):
    inits = [_w((64, 128), "w"), _w((128,), "b")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["a", "t"], ["y"])]
    model = make_model(nodes, [value("x", [2, 10, 64])], [value("y", None)], inits)
    p = plan(_graph(model))
    fams = [k.family for k in p.kernels]
    assert fams.count("gemm") == 1 and fams.count("bmm") == 1
    gemm = next(k for k in p.kernels if k.family == "gemm")
    assert gemm.params == (20.0, 64.0, 128.0) and "Add" in gemm.op
    bmm = next(k for k in p.kernels if k.family == "bmm")
    assert bmm.params == (2.0, 10.0, 128.0, 10.0) and bmm.op.startswith("Transpose")
    ort_ops = _ort_kernels(model, tmp_path)
    assert "Add" not in ort_ops and "Transpose" not in ort_ops
    assert sum(op in COMPUTE_OPS for op in ort_ops) == 2


def test_erf_gelu_and_decomposed_layernorm_fuse_like_onnxruntime(tmp_path):
    d = 64
    inits = [nh.from_array(np.array(1.4142135, np.float32), "sqrt2"), nh.from_array(np.array(1.0, np.float32), "one"),
             nh.from_array(np.array(0.5, np.float32), "half"), nh.from_array(np.array(2.0, np.float32), "two"),
             nh.from_array(np.array(1e-5, np.float32), "eps"), _w((d,), "g"), _w((d,), "beta")]
    nodes = [
        h.make_node("Div", ["x", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
        h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["x", "e1"], ["xe"]),
        h.make_node("Mul", ["xe", "half"], ["gelu"]),
        h.make_node("ReduceMean", ["gelu"], ["mu"], axes=[-1]), h.make_node("Sub", ["gelu", "mu"], ["xc"]),
        h.make_node("Pow", ["xc", "two"], ["sq"]), h.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["sd"]),
        h.make_node("Div", ["xc", "sd"], ["n"]), h.make_node("Mul", ["n", "g"], ["ng"]),
        h.make_node("Add", ["ng", "beta"], ["y"]),
    ]
    model = make_model(nodes, [value("x", [1, 8, d])], [value("y", None)], inits)
    p = plan(_graph(model))
    assert [k.op for k in p.kernels] == ["Gelu", "LayerNormalization"]
    assert [k.family for k in p.kernels] == ["transcend", "norm"]
    ort_ops = _ort_kernels(model, tmp_path)
    assert len(ort_ops) == 2 and "Erf" not in ort_ops and "ReduceMean" not in ort_ops


def test_silu_is_a_quickgelu_of_alpha_one_and_clip_s_scaled_sigmoid_is_not_as_onnxruntime_fuses_them(tmp_path):
    """onnxruntime's QuickGelu with alpha 1 (x * sigmoid(x)) runs 2.6x faster than with CLIP's 1.702: priced from
    a table of its own ("Silu"), the fused pattern and the contrib op alike."""
    scale = nh.from_array(np.array(1.702, np.float32), "a")
    silu = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Mul", ["x", "s"], ["y"])]
    clip = [h.make_node("Mul", ["x", "a"], ["xa"]), h.make_node("Sigmoid", ["xa"], ["s"]),
            h.make_node("Mul", ["x", "s"], ["y"])]
    for nodes, inits, alpha, op in ((silu, [], 1.0, "Silu"), (clip, [scale], 1.702, "QuickGelu")):
        model = make_model(nodes, [value("x", [1, 64, 56, 56])], [value("y", None)], inits)
        assert [k.op for k in plan(_graph(model)).kernels] == [op]
        so = ort.SessionOptions()
        so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        (fused,) = onnx.load(str(tmp_path / "optimized.onnx")).graph.node
        assert fused.op_type == "QuickGelu"
        assert h.get_attribute_value(next(a for a in fused.attribute if a.name == "alpha")) == pytest.approx(alpha)
    contrib = make_model([h.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.0)],
                         [value("x", [1, 64, 56, 56])], [value("y", None)], extra_opsets={"com.microsoft": 1})
    assert [k.op for k in plan(_graph(contrib)).kernels] == ["Silu"]
    # between blocked convolutions a SiLU stays blocked, as onnxruntime keeps it: no reorders around it
    block = make_model([h.make_node("Conv", ["x", "w1"], ["c"], pads=[1] * 4), h.make_node("Sigmoid", ["c"], ["s"]),
                        h.make_node("Mul", ["c", "s"], ["a"]), h.make_node("Conv", ["a", "w2"], ["y"], pads=[1] * 4)],
                       [value("x", [1, 32, 56, 56])], [value("y", None)],
                       [_w((32, 32, 3, 3), "w1"), _w((32, 32, 3, 3), "w2")])
    ops = [k.op for k in plan(_graph(block)).kernels]
    assert "Silu" in ops
    ort_ops = _ort_kernels(block, tmp_path)
    for reorder in ("ReorderInput", "ReorderOutput"):
        assert ops.count(reorder) == ort_ops.count(reorder), (ops, ort_ops)


def test_constant_subgraphs_are_folded_away():
    inits = [nh.from_array(np.array([2, 3], np.int64), "s"), _w((6,), "w")]
    nodes = [h.make_node("Reshape", ["w", "s"], ["w2"]), h.make_node("Relu", ["w2"], ["w3"]),
             h.make_node("Add", ["x", "w3"], ["y"])]
    model = make_model(nodes, [value("x", [2, 3])], [value("y", None)], inits)
    p = plan(_graph(model))
    assert [k.op for k in p.kernels] == ["Add"]


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "inception_v2", "shufflenet", "bvlc_alexnet"])
def test_real_cnn_compute_kernels_match_onnxruntime(name, tmp_path):
    path = LIGHT_DIR / f"light_{name}.onnx"
    p = plan(load_graph(path))
    ort_ops = _ort_kernels(onnx.load(str(path)), tmp_path)
    ours = sum(k.family in ("conv", "conv1x1", "dwconv", "gemm", "bmm") for k in p.kernels)
    theirs = sum(op in COMPUTE_OPS for op in ort_ops)
    assert abs(ours - theirs) <= max(2, 0.05 * theirs), (ours, theirs)
    # the elementwise work onnxruntime fuses into convolutions must not reappear as kernels
    assert abs(len(p.kernels) - len(ort_ops)) <= 0.3 * len(ort_ops), (len(p.kernels), len(ort_ops))


def test_plan_reports_weights_activations_and_flops():
    p = plan(load_graph(LIGHT_DIR / "light_resnet50.onnx"))
    assert 95e6 < p.weight_bytes < 110e6  # ResNet-50: 25.6 M parameters
    assert 7e9 < p.flops < 9e9  # about 4.1 G multiply-adds
    assert 1e6 < p.peak_activation_bytes < 100e6


def test_written_bytes_is_each_family_s_output_in_float32() -> None:
    assert Kernel("conv", (3136, 288, 64), 0).written_bytes == 3136 * 64 * 4
    assert Kernel("conv1x1", (100, 32, 16), 0, repeat=4).written_bytes == 100 * 16 * 4 * 4  # per group x groups
    assert Kernel("gemm", (32, 1024, 1000), 0).written_bytes == 32 * 1000 * 4
    assert Kernel("dwconv", (96, 12544, 9), 0).written_bytes == 96 * 12544 * 4
    assert Kernel("bmm", (4, 128, 64, 128), 0).written_bytes == 4 * 128 * 128 * 4
    assert Kernel("eltwise", (3e6,), 3e6).written_bytes == 1.5e6
    assert Kernel("view", (1e6,), 1e6).written_bytes == 0.0


def test_a_convolution_reads_its_whole_input_and_the_residual_it_adds_strided_or_not() -> None:
    """What a convolution streams when its activations do not fit in the cache (CostModel.activation_seconds): its
    parameters tell only the output's size; a stride-2 one reads four times that."""
    inits = [_w((32, 16, 3, 3), "w1"), _w((32, 1, 3, 3), "w2"), _w((32, 32, 1, 1), "w3")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4, strides=[2, 2]),
             h.make_node("Conv", ["a", "w2"], ["b"], pads=[1] * 4, group=32),
             h.make_node("Conv", ["b", "w3"], ["c"]),
             h.make_node("Add", ["c", "a"], ["y"])]
    p = plan(_graph(make_model(nodes, [value("x", [1, 16, 56, 56])], [value("y", None)], inits)))
    strided, depthwise, pointwise = [k for k in p.kernels if k.family in ("conv", "dwconv", "conv1x1")]
    assert strided.read_bytes == 16 * 56 * 56 * 4 and strided.written_bytes == 32 * 28 * 28 * 4
    assert depthwise.read_bytes == depthwise.written_bytes == 32 * 28 * 28 * 4
    assert pointwise.op == "Conv+Add" and pointwise.read_bytes == 2 * 32 * 28 * 28 * 4


def test_a_reshape_within_the_graph_moves_nothing_and_one_into_its_output_copies():
    """onnxruntime's Reshape aliases its input, unless its output is the graph's (which must own its memory)."""
    shape = nh.from_array(np.array([64, 256], np.int64), "shape")
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Reshape", ["a", "shape"], ["b"]),
             h.make_node("Relu", ["b"], ["c"]), h.make_node("Flatten", ["c"], ["y"])]
    p = plan(_graph(make_model(nodes, [value("x", [1, 16384])], [value("y", None)], [shape])))
    within, output = (k for k in p.kernels if k.family == "view")
    assert (within.op, within.work) == ("Reshape", 0.0)
    assert (output.op, output.work) == ("Flatten", 2 * 16384 * 4)  # read and written


def test_a_channels_last_webnn_graph_s_transposes_cancel_as_in_onnxruntime(tmp_path):
    """WebNN's `inputLayout: "nhwc"` wraps each convolution in Transposes; onnxruntime pushes them through the
    activations, resizes and concatenations between convolutions until they cancel, and the convolutions chain
    with their activations fused. The plan has the kernels onnxruntime runs, not a Transpose pair per layer."""
    graph = load_graph(EXAMPLES / "blur_segmenter.webnn", inputs={"image": InputSpec((1, 144, 256, 3))})
    p = plan(graph)
    ours = collections.Counter(k.op.split("+")[0] for k in p.kernels)
    theirs = collections.Counter(_ort_kernels(materialize(graph), tmp_path))
    assert sum(graph.model.graph.node[i].op_type == "Transpose" for i in range(len(graph.nodes))) > 10
    assert ours["Transpose"] == theirs["Transpose"] == 1  # the input's, to NCHW
    assert ours["Conv"] == theirs["Conv"] and "Relu" not in ours and "Relu" not in theirs
    assert ours["ReorderInput"] == theirs["ReorderInput"] == 0
    assert ours["Concat"] == theirs["Concat"] and ours[NCHWC_UPSAMPLE] == theirs["Upsample"] == 3
    assert ours["Resize"] == theirs["Resize"] == 0
    assert ours["ReorderOutput"] == theirs["ReorderOutput"] == 1  # writing channels-last: the last Transpose's


@pytest.mark.parametrize(("attrs", "scale"), [
    ({"mode": "linear"}, 2.0), ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, 3.0),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, 2.0), ({"mode": "linear"}, 1.5),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, 2.0),
    ({"mode": "nearest"}, 2.0), ({"mode": "cubic"}, 2.0)])
def test_a_resize_after_a_blocked_conv_stays_blocked_only_where_onnxruntime_keeps_it_so(tmp_path, attrs, scale):
    """onnxruntime runs a Resize in the blocked layout (its Upsample, 3-4x faster) for whole-number scales, linear
    with some coordinate transformations or nearest rounded down; else it reorders the tensor back to NCHW first."""
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Resize", ["c", "", "s"], ["y"], **attrs)]
    inits = [_w((32, 32, 1, 1), "w"), nh.from_array(np.array([1, 1, scale, scale], np.float32), "s")]
    model = make_model(nodes, [value("x", [1, 32, 16, 16])], [value("y", None)], inits)
    ours = collections.Counter(k.op for k in plan(_graph(model)).kernels)
    theirs = collections.Counter(_ort_kernels(model, tmp_path))
    assert ours[NCHWC_UPSAMPLE] == theirs["Upsample"] and ours["Resize"] == theirs["Resize"]
    assert ours[NCHWC_UPSAMPLE] + ours["Resize"] == 1 and ours["ReorderOutput"] == theirs["ReorderOutput"] == 1


def test_a_transpose_pair_around_elementwise_ops_cancels_and_one_read_twice_stays(tmp_path):
    to_nchw, to_nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    inits = [nh.from_array(np.ones((1, 1, 1, 8), np.float32), "bias")]
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=to_nhwc), h.make_node("Relu", ["t"], ["r"]),
             h.make_node("Add", ["r", "bias"], ["a"]), h.make_node("Transpose", ["a"], ["y"], perm=to_nchw)]
    model = make_model(nodes, [value("x", [1, 8, 32, 32])], [value("y", None)], inits)
    assert [k.op for k in plan(_graph(model)).kernels] == ["Relu", "Add"]
    assert "Transpose" not in _ort_kernels(model, tmp_path)
    forked = [h.make_node("Transpose", ["x"], ["t"], perm=to_nhwc), h.make_node("Relu", ["t"], ["r"]),
              h.make_node("Sigmoid", ["t"], ["s"]), h.make_node("Add", ["r", "s"], ["y"])]
    model = make_model(forked, [value("x", [1, 8, 32, 32])], [value("y", None)], [])
    assert [k.op for k in plan(_graph(model)).kernels] == ["Transpose", "Relu", "Sigmoid", "Add"]


# --- the CUDA provider (onnxruntime 1.31's optimized graphs of the zoo on an H100: docs/accuracy.md, "GPU") ---------

def test_cuda_plan_runs_activations_apart_and_copies_the_inputs_and_outputs():
    """The CUDA provider folds the BatchNormalization into the Conv but runs the Relu as a kernel of its own,
    and the app's input crosses into GPU memory and its output back (MemcpyFromHost, MemcpyToHost)."""
    model = _conv_bn_relu(32)
    kernels = plan(_graph(model), CUDA).kernels
    assert [k.op for k in kernels] == ["MemcpyFromHost", "Conv+BatchNormalization", "Relu", "MemcpyToHost"]
    assert kernels[0].work == 4 * 16 * 28 * 28 and kernels[-1].work == 4 * 32 * 28 * 28  # each tensor's bytes
    assert [k.op for k in plan(_graph(model)).kernels] == ["ReorderInput", "Conv+BatchNormalization+Relu",
                                                           "ReorderOutput"]  # the CPU: fused, in NCHWc


def test_cuda_plan_keeps_the_transposes_of_a_channels_last_graph_before_a_resize():
    """A channels-last graph's Transposes cancel through a Relu on both providers; the CUDA build's Resize takes
    NCHW only, so the Transposes around it stay (the blur segmenter: 10 on the H100, 2 on the CPU)."""
    c = 8
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             h.make_node("Conv", ["xt", "w1"], ["c1"], pads=[1] * 4),
             h.make_node("Transpose", ["c1"], ["a"], perm=[0, 2, 3, 1]),
             h.make_node("Relu", ["a"], ["r"]),
             h.make_node("Resize", ["r", "", "scales"], ["u"], mode="nearest"),
             h.make_node("Transpose", ["u"], ["ut"], perm=[0, 3, 1, 2]),
             h.make_node("Conv", ["ut", "w2"], ["c2"], pads=[1] * 4),
             h.make_node("Transpose", ["c2"], ["y"], perm=[0, 2, 3, 1])]
    inits = [_w((c, 3, 3, 3), "w1"), _w((c, c, 3, 3), "w2"),
             nh.from_array(np.array([1, 2, 2, 1], np.float32), "scales")]
    model = make_model(nodes, [value("x", [1, 16, 16, 3])], [value("y", None)], inits)
    transposes = {provider: sum(k.op == "Transpose" for k in plan(_graph(model), p).kernels)
                  for provider, p in (("cpu", Provider(nchwc_block=0)), ("cuda", CUDA))}
    assert transposes == {"cpu": 2, "cuda": 4}
