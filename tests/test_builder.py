"""The Python MLGraphBuilder mirror: same ONNX as the text and JSON formats, checked call by call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from monitors.errors import GraphError, LimitExceeded
from monitors.graphs import webnn_json, webnn_text
from monitors.graphs.builder import GraphBuilder, Operand
from monitors.graphs.graph import Graph, InputSpec
from monitors.graphs.limits import Limits
from tests.webnn_cases import run

DATA = Path(__file__).parent / "data"
F32 = "float32"


def desc(*shape, dtype=F32):
    return {"dataType": dtype, "shape": list(shape)}


def test_brief_example_builds_a_graph_with_inferred_shapes_that_runs():
    b = GraphBuilder()
    x = b.input("x", {"dataType": "float32", "shape": [1, 3, 224, 224]})
    w = b.constant({"dataType": "float32", "shape": [32, 3, 3, 3]}, label="conv1.weight")
    y = b.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1])
    y = b.relu(y)
    graph = b.build({"out": y})
    assert isinstance(graph, Graph)
    assert graph.tensors["out"].shape == (1, 32, 112, 112)
    assert graph.weight_bytes == 32 * 3 * 3 * 3 * 4
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Identity"]
    assert run(graph)["out"].shape == (1, 32, 112, 112)


def test_operands_know_their_webnn_type_and_shape_as_they_are_built():
    b = GraphBuilder()
    x = b.input("x", desc("batch", 64))
    w = b.constant(desc(64, 16), label="w")
    y = b.matmul(x, w)
    assert isinstance(y, Operand)
    assert (y.dataType, y.shape) == (F32, ["batch", 16])
    parts = b.split(y, [4, 12], axis=1)
    assert [p.shape for p in parts] == [["batch", 4], ["batch", 12]]
    assert b.cast(parts[0], "int32").dataType == "int32"


def mobilenet_like(b: GraphBuilder) -> dict[str, Operand]:
    """tests/data/mobilenet_like.webnn, written with the builder (same names through labels)."""
    x = b.input("x", desc(1, 3, 224, 224))
    blocks = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2)]
    c = {"stem.w": b.constant(desc(32, 3, 3, 3), label="stem.weight")}
    for part in ("mean", "var", "scale", "bias"):
        c[f"stem.bn.{part}"] = b.constant(desc(32), label=f"stem.bn.{part}")
    for k, (cin, cout, _) in enumerate(blocks, 1):
        c[f"b{k}.dw.w"] = b.constant(desc(cin, 1, 3, 3), label=f"b{k}.dw.weight")
        c[f"b{k}.dw.b"] = b.constant(desc(cin), label=f"b{k}.dw.bias")
        c[f"b{k}.pw.w"] = b.constant(desc(cout, cin, 1, 1), label=f"b{k}.pw.weight")
        c[f"b{k}.pw.b"] = b.constant(desc(cout), label=f"b{k}.pw.bias")
    c["fc.w"] = b.constant(desc(512, 1000), label="classifier.weight")
    c["fc.b"] = b.constant(desc(1000), label="classifier.bias")
    y = b.conv2d(x, c["stem.w"], strides=[2, 2], padding=[1, 1, 1, 1], label="stem.conv")
    y = b.batchNormalization(y, c["stem.bn.mean"], c["stem.bn.var"], scale=c["stem.bn.scale"],
                             bias=c["stem.bn.bias"], label="stem.bn")
    y = b.clamp(y, minValue=0, maxValue=6, label="stem")
    for k, (cin, _, s) in enumerate(blocks, 1):
        y = b.conv2d(y, c[f"b{k}.dw.w"], {"bias": c[f"b{k}.dw.b"], "strides": [s, s], "padding": [1, 1, 1, 1],
                                         "groups": cin, "label": f"b{k}.dw"})  # WebNN style: options dict
        y = b.clamp(y, minValue=0, maxValue=6, label=f"b{k}.dw.act")
        y = b.conv2d(y, c[f"b{k}.pw.w"], bias=c[f"b{k}.pw.b"], label=f"b{k}.pw")
        y = b.clamp(y, minValue=0, maxValue=6, label=f"b{k}")
    y = b.averagePool2d(y, label="pooled")
    y = b.reshape(y, [1, 512], label="flat")
    y = b.gemm(y, c["fc.w"], c=c["fc.b"], label="logits")
    return {"probs": b.softmax(y, axis=1, label="probs")}


def rename_constants(model, names: dict[str, str]):
    for t in model.graph.initializer:
        t.name = names.get(t.name, t.name)
    for n in model.graph.node:
        for k, i in enumerate(n.input):
            n.input[k] = names.get(i, i)
    return model


def test_builder_text_and_json_give_the_same_onnx_for_a_mobilenet():
    b = GraphBuilder(name="mobilenet_like")
    builder_model = b.to_onnx(mobilenet_like(b))
    text_model = webnn_text.to_onnx((DATA / "mobilenet_like.webnn").read_text(), Limits())
    json_model = webnn_json.to_onnx(__import__("json").loads((DATA / "mobilenet_like.json").read_text()), Limits())
    # The builder names a constant by its label (the weights key); the text names it by its declaration.
    decl = webnn_text.parse((DATA / "mobilenet_like.webnn").read_text())
    by_label = {c.value: c.name for c in decl.consts}
    assert rename_constants(builder_model, by_label).SerializeToString() == text_model.SerializeToString()
    assert json_model.SerializeToString() == text_model.SerializeToString()


def test_builder_mlp_matches_its_json_and_text_twins():
    b = GraphBuilder(name="mlp")
    x = b.input("features", desc("batch", 256))
    w = {k: b.constant(desc(*s), label=k) for k, s in [
        ("fc1.w", (256, 512)), ("fc1.b", (512,)), ("fc2.w", (512, 512)), ("fc2.b", (512,)),
        ("ln.scale", (512,)), ("ln.bias", (512,)), ("head.w", (512, 10)), ("head.b", (10,))]}
    half = b.constant(0.5, label="half")
    h1 = b.matmul(x, w["fc1.w"], label="h1")
    h1 = b.gelu(b.add(h1, w["fc1.b"], label="h1.b"), label="h1.act")
    h2 = b.gemm(h1, w["fc2.w"], c=w["fc2.b"], label="h2")
    h2 = b.add(h2, h1, label="h2.res")
    h2 = b.layerNormalization(h2, scale=w["ln.scale"], bias=w["ln.bias"], axes=[1], epsilon=1e-5, label="h2.norm")
    h2 = b.mul(h2, half, label="h2.scaled")
    logits = b.add(b.matmul(h2, w["head.w"], label="logits"), w["head.b"], label="logits.b")
    probs = b.softmax(logits, axis=1, label="probs")
    text = webnn_text.to_onnx((DATA / "mlp.webnn").read_text(), Limits())
    refs = {c.value: c.name for c in webnn_text.parse((DATA / "mlp.webnn").read_text()).consts if c.kind == "weights"}
    built = rename_constants(b.to_onnx({"probs": probs}), refs)
    assert built.SerializeToString() == text.SerializeToString()
    graph = b.build({"probs": probs}, inputs={"features": InputSpec((3, 256))})
    assert graph.tensors["probs"].shape == (3, 10)


def test_constants_weightless_scalar_typed_and_small_values():
    b = GraphBuilder()
    x = b.input("x", desc(2, 3))
    k = b.constant("float32", 2.0)
    v = b.constant(desc(3), [1.0, 2.0, 3.0], label="v")
    w = b.constant(desc(3, 4), label="w")  # weightless
    y = b.matmul(b.mul(b.add(x, v), k), w)
    model = b.to_onnx({"y": y})
    inits = {t.name: t for t in model.graph.initializer}
    assert numpy_helper.to_array(inits["v"]).tolist() == [1.0, 2.0, 3.0]
    assert not inits["w"].raw_data and inits["w"].data_location == inits["w"].EXTERNAL
    out = run(b.build({"y": y}))["y"]
    assert out.shape == (2, 4) and np.isfinite(out).all()


def test_unused_operands_are_left_out_like_mlgraphbuilder_build():
    b = GraphBuilder()
    x = b.input("x", desc(4))
    b.exp(x)
    b.constant(desc(1000, 1000), label="unused.weight")
    graph = b.build({"y": b.relu(x)})
    assert [n.op_type for n in graph.nodes] == ["Relu", "Identity"]
    assert graph.weight_bytes == 0


def test_errors_come_at_the_offending_call_as_one_line():
    b = GraphBuilder()
    x = b.input("x", desc(1, 3, 8, 8))
    w = b.constant(desc(4, 3, 3, 3), label="w")
    cases = [
        (lambda: b.conv2d(x, w, strides=[1]), "conv2d #2: conv2d: option 'strides': expected 2 values, got 1"),
        (lambda: b.conv2d(x, w, stride=[1, 1]), "conv2d #3: conv2d: unknown option 'stride'"),
        (lambda: b.matmul(x, w), "matmul #4: matmul: inner dimensions differ"),
        (lambda: b.relu(x, 3), "relu #5: relu: unexpected argument 3"),
        (lambda: b.relu(GraphBuilder().input("x", desc(1))), "does not belong to this builder"),
        (lambda: b.input("x", desc(1)), "'x' is already defined"),
        (lambda: b.input("z", desc(1, 0)), "bad dimension 0"),
        (lambda: b.input("z", desc(1, dtype="float64")), "unknown data type 'float64'"),
        (lambda: b.constant(desc("n", 3)), "bad dimension 'n'"),
        (lambda: b.constant(desc(3), [1.0, 2.0]), "2 values given, shape [3] needs 3"),
        (lambda: b.constant([1, 2]), "constant takes (descriptor)"),
        (lambda: b.constant(desc(2), [[1.0], [2.0, 3.0]]), "values are not a rectangular array of numbers"),
        (lambda: b.constant(desc(2, dtype="int8"), [1000, 1]), "1000 does not fit int8"),
        (lambda: b.to_onnx({}), "build needs at least one named output"),
    ]
    for call, message in cases:
        with pytest.raises(GraphError) as err:
            call()
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(AttributeError, match="no operator 'foo'"):
        b.foo(x)
    # A failed call leaves the builder usable.
    assert b.conv2d(x, w, padding=[1, 1, 1, 1]).shape == [1, 4, 8, 8]


def test_builder_respects_max_nodes():
    b = GraphBuilder(limits=Limits(max_nodes=10))
    y = b.input("x", desc(4))
    with pytest.raises(LimitExceeded, match="more than 10 nodes"):
        for _ in range(11):
            y = b.relu(y)


def evaluate(b: GraphBuilder, outputs: dict, feeds: dict) -> dict:
    """Run a builder graph whose constants all carry values (no weights to invent)."""
    model = b.to_onnx(outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = list(outputs)
    return dict(zip(names, session.run(names, feeds), strict=True))


RNG = np.random.default_rng(7)


def test_layouts_compute_the_same_values_as_onnx_native_layouts():
    """nhwc/hwio and nhwc/ohwi conv2d, hwoi convTranspose2d and nhwc pools equal their nchw twins."""
    x = RNG.standard_normal((1, 6, 9, 8)).astype(np.float32)     # nchw
    w = RNG.standard_normal((4, 6, 3, 3)).astype(np.float32)     # oihw
    wt = RNG.standard_normal((6, 5, 3, 3)).astype(np.float32)    # iohw
    b = GraphBuilder()
    xn = b.input("x", desc(1, 6, 9, 8))
    xh = b.input("xh", desc(1, 9, 8, 6))
    ref = b.conv2d(xn, b.constant(desc(*w.shape), w), strides=[2, 1], padding=[1, 0, 1, 1])
    hwio = b.conv2d(xh, b.constant(desc(3, 3, 6, 4), w.transpose(2, 3, 1, 0)), strides=[2, 1],
                    padding=[1, 0, 1, 1], inputLayout="nhwc", filterLayout="hwio")
    ohwi = b.conv2d(xh, b.constant(desc(4, 3, 3, 6), w.transpose(0, 2, 3, 1)), strides=[2, 1],
                    padding=[1, 0, 1, 1], inputLayout="nhwc", filterLayout="ohwi")
    ihwo = b.conv2d(xn, b.constant(desc(6, 3, 3, 4), w.transpose(1, 2, 3, 0)), strides=[2, 1],
                    padding=[1, 0, 1, 1], filterLayout="ihwo")
    t_ref = b.convTranspose2d(xn, b.constant(desc(*wt.shape), wt), strides=[2, 2])
    t_hwoi = b.convTranspose2d(xh, b.constant(desc(3, 3, 5, 6), wt.transpose(2, 3, 1, 0)), strides=[2, 2],
                               inputLayout="nhwc", filterLayout="hwoi")
    p_ref = b.maxPool2d(xn, windowDimensions=[3, 2], strides=[2, 2])
    p_nhwc = b.maxPool2d(xh, windowDimensions=[3, 2], strides=[2, 2], layout="nhwc")
    out = evaluate(b, {"ref": ref, "hwio": hwio, "ohwi": ohwi, "ihwo": ihwo, "t_ref": t_ref, "t_hwoi": t_hwoi,
                       "p_ref": p_ref, "p_nhwc": p_nhwc}, {"x": x, "xh": x.transpose(0, 2, 3, 1)})
    nhwc = (0, 2, 3, 1)
    np.testing.assert_allclose(out["hwio"], out["ref"].transpose(nhwc), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["ohwi"], out["ref"].transpose(nhwc), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["ihwo"], out["ref"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["t_hwoi"], out["t_ref"].transpose(nhwc), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["p_nhwc"], out["p_ref"].transpose(nhwc), rtol=1e-6)


def test_normalizations_compute_what_the_webnn_spec_says():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    scale = RNG.standard_normal((5, 3)).astype(np.float32)       # axes [3, 1]: dims in the axes' order
    bias = RNG.standard_normal((5, 3)).astype(np.float32)
    mean, var = RNG.standard_normal(5).astype(np.float32), RNG.uniform(0.5, 2, 5).astype(np.float32)
    b = GraphBuilder()
    xi = b.input("x", desc(2, 3, 4, 5))
    ln = b.layerNormalization(xi, scale=b.constant(desc(5, 3), scale), bias=b.constant(desc(5, 3), bias),
                              axes=[3, 1], epsilon=1e-3)
    ln2 = b.layerNormalization(xi)  # default axes [1, 2, 3]; absent scale and bias mean 1 and 0
    bn = b.batchNormalization(xi, b.constant(desc(5), mean), b.constant(desc(5), var), axis=3, epsilon=1e-3)
    inorm = b.instanceNormalization(xi, layout="nhwc")
    out = evaluate(b, {"ln": ln, "ln2": ln2, "bn": bn, "in": inorm}, {"x": x})
    m = x.mean(axis=(1, 3), keepdims=True)
    v = x.var(axis=(1, 3), keepdims=True)
    s = scale.T.reshape(1, 3, 1, 5)
    bb = bias.T.reshape(1, 3, 1, 5)
    np.testing.assert_allclose(out["ln"], (x - m) / np.sqrt(v + 1e-3) * s + bb, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["bn"], (x - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-4)
    m2, v2 = x.mean(axis=(1, 2, 3), keepdims=True), x.var(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(out["ln2"], (x - m2) / np.sqrt(v2 + 1e-5), rtol=1e-4, atol=1e-4)
    m3, v3 = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(out["in"], (x - m3) / np.sqrt(v3 + 1e-5), rtol=1e-4, atol=1e-4)


def test_slicing_padding_and_resampling_compute_the_spec_values():
    x = np.arange(48, dtype=np.float32).reshape(1, 2, 4, 6)
    b = GraphBuilder()
    xi = b.input("x", desc(1, 2, 4, 6))
    outs = {
        "slice": b.slice(xi, [0, 1, 1, 0], [1, 1, 2, 6], strides=[1, 1, 1, 2]),
        "pad": b.pad(xi, [0, 0, 1, 0], [0, 0, 0, 2], mode="edge"),
        "up": b.resample2d(xi, scales=[2.0, 2.0]),
        "rev": b.reverse(xi, axes=[3]),
        "split": b.split(xi, [2, 4], axis=3)[1],
    }
    out = evaluate(b, outs, {"x": x})
    np.testing.assert_array_equal(out["slice"], x[:, 1:2, 1:3, 0:6:2])
    np.testing.assert_array_equal(out["pad"], np.pad(x, [(0, 0), (0, 0), (1, 0), (0, 2)], mode="edge"))
    np.testing.assert_array_equal(out["up"], x.repeat(2, axis=2).repeat(2, axis=3))
    np.testing.assert_array_equal(out["rev"], x[..., ::-1])
    np.testing.assert_array_equal(out["split"], x[..., 2:])
