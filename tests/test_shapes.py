"""Shape binding and inference: concrete shapes everywhere, clear errors for graphs that cannot have them."""

from __future__ import annotations

import pickle

import numpy as np
import onnx
import onnx.helper as h
import onnxruntime as ort
import pytest
from models import LIGHT_DIR, make_model, mlp, value
from onnx import TensorProto as T
from onnx import numpy_helper as nh
from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

from agent.simulation.materialize import materialize
from monitors.errors import GraphError, InputsError, LimitExceeded, UnboundInput
from monitors.graphs import contrib_shapes
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.graphs.limits import Limits
from monitors.graphs.onnx_import import read_weightless
from monitors.graphs.shapes import CONTRIB_OPS, _evaluate, bind_and_infer, node_flops, real_inputs

LIMITS = Limits()
LIGHT_MODELS = sorted(LIGHT_DIR.glob("*.onnx"))


def bind(model: onnx.ModelProto, inputs=None, limits: Limits = LIMITS):
    return bind_and_infer(read_weightless(model.SerializeToString(), limits), inputs, limits)


def conv_net(batch="N", height="H", width="W") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((16, 3, 3, 3), dtype=np.float32), "w"),
             nh.from_array(rng.standard_normal(16, dtype=np.float32), "b")]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
             h.make_node("Relu", ["c"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["p"]),
             h.make_node("Flatten", ["p"], ["y"])]
    return make_model(nodes, [value("x", [batch, 3, height, width])], [value("y", None)], inits)


# -------------------------------------------------------------- real models

@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_light_models_import_with_the_reference_output_shapes(path):
    graph = load_graph(path)
    reference = onnx.load_tensor(str(path.with_name(path.stem + "_output_0.pb")))
    output = graph.model.graph.output[0].name
    assert graph.tensors[output].shape == tuple(reference.dims)
    for node in graph.nodes:
        for out in node.output:
            if out and node.op_type != "Dropout":
                assert out in graph.tensors, out
    # weights come from ConstantOfShape of constant shapes (IR 3): onnxruntime folds them
    weights = [n.output[0] for n in graph.nodes if n.op_type == "ConstantOfShape"]
    assert weights and all(w in graph.constants for w in weights)
    assert real_inputs(graph.model.graph)[0].name not in graph.constants


@pytest.mark.parametrize("stem", ["light_squeezenet", "light_shufflenet"])
def test_every_tensor_shape_matches_onnxruntime(stem):
    graph = load_graph(LIGHT_DIR / f"{stem}.onnx")
    model = materialize(graph)
    names = [o for n in model.graph.node for o in n.output if o and n.op_type != "Dropout"]
    del model.graph.output[:]
    model.graph.output.extend(value(n, None) for n in names)  # ask onnxruntime for every tensor
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = real_inputs(graph.model.graph)[0].name
    feed = {x: np.random.default_rng(0).random(graph.tensors[x].shape, dtype=np.float32)}
    results = session.run(names, feed)
    for name, result in zip(names, results, strict=True):
        assert graph.tensors[name].shape == result.shape, name


def test_materialized_copy_runs_in_onnxruntime_with_sane_values():
    graph = bind(conv_net(), {"x": InputSpec((2, 3, 32, 48))})
    model = materialize(graph, seed=1)
    assert model.ir_version <= 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((2, 3, 32, 48), np.float32)})
    assert y.shape == graph.tensors["y"].shape == (2, 16)
    assert np.isfinite(y).all() and 0 < np.abs(y).max() < 100


# ------------------------------------------------------------------ binding

def test_symbolic_dims_bound_by_inputs():
    graph = bind(conv_net(), {"x": InputSpec((4, 3, 224, 160), "float32")})
    assert graph.tensors["x"].shape == (4, 3, 224, 160)
    assert graph.tensors["c"].shape == (4, 16, 112, 80)
    assert graph.tensors["y"].shape == (4, 16)
    assert graph.tensors["w"].shape == (16, 3, 3, 3)
    assert graph.constants == {"w", "b"}


def test_unbound_symbolic_dimension_is_bad_inputs_and_says_how_to_bind_it():
    with pytest.raises(UnboundInput, match=r"^input 'x' has symbolic dimension 'N' \(shape \[N, 3, H, W\]\): give its "
                                           r"shape in the inputs$") as caught:
        bind(conv_net())
    assert caught.value.code == "bad_inputs" and caught.value.cli_hint == "pass --input x=<N>x3x<H>x<W>"
    assert "--input" not in str(caught.value)  # over MQTT and in Python there is no command line
    again = pickle.loads(pickle.dumps(caught.value))  # as it comes back from the agent's worker process
    assert (type(again), str(again), again.code, again.cli_hint) == (UnboundInput, str(caught.value), "bad_inputs",
                                                                     caught.value.cli_hint)
    with pytest.raises(UnboundInput, match="symbolic dimension 'H'"):
        bind(conv_net(batch=1))
    unnamed = make_model([h.make_node("Relu", ["x"], ["y"])], [value("x", [None, 4])], [value("y", None)])
    with pytest.raises(UnboundInput, match=r"input 'x' has an unknown dimension") as caught:
        bind(unnamed)
    assert caught.value.cli_hint == "pass --input x=<?>x4"
    shapeless = make_model([h.make_node("Relu", ["x"], ["y"])], [value("x", None)], [value("y", None)])
    with pytest.raises(UnboundInput, match="input 'x' has no declared shape"):
        bind(shapeless)
    assert bind(shapeless, {"x": InputSpec((2, 5))}).tensors["y"].shape == (2, 5)


def test_unknown_input_name_lists_the_real_inputs():
    with pytest.raises(GraphError, match=r"model has no input 'image'; its inputs are: x$"):
        bind(conv_net(), {"image": InputSpec((1, 3, 8, 8))})
    # initializers listed as inputs (IR 3) are not inputs to bind
    with pytest.raises(GraphError, match=r"its inputs are: data_0$"):
        load_graph(LIGHT_DIR / "light_bvlc_alexnet.onnx", inputs={"conv1_w_0__SHAPE": InputSpec((4,))})


def test_binding_must_match_rank_and_dtype():
    with pytest.raises(InputsError, match=r"input 'x' has rank 4 \(\[N, 3, H, W\]\), but the binding gives 3"):
        bind(conv_net(), {"x": InputSpec((1, 3, 8))})
    with pytest.raises(InputsError, match="input 'x' is float32 in the model, not float16"):
        bind(conv_net(), {"x": InputSpec((1, 3, 8, 8), "float16")})


def fixed_flatten_net(reshape_to: int | None) -> onnx.ModelProto:
    """A conv net built at 1x3x32x32: its head a Reshape to a fixed size, or a Flatten and a fixed-size MatMul."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((4, 3, 3, 3), dtype=np.float32), "w"),
             nh.from_array(rng.standard_normal((4 * 32 * 32, 10), dtype=np.float32), "fc")]
    head = ([h.make_node("Reshape", ["c", "to"], ["f"], name="to_rows")] if reshape_to
            else [h.make_node("Flatten", ["c"], ["f"], name="flat")])
    if reshape_to:
        inits.append(nh.from_array(np.array([1, reshape_to], np.int64), "to"))
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"), *head,
             h.make_node("MatMul", ["f", "fc"], ["y"], name="classifier")]
    return make_model(nodes, [value("x", [1, 3, 32, 32])], [value("y", None)], inits)


def test_a_binding_resizes_fixed_dimensions_and_shapes_follow():
    """As a runtime runs a model built at one resolution at another: the shapes are inferred again."""
    graph = bind(conv_net(batch=1, height=224, width=224), {"x": InputSpec((1, 3, 720, 1280), "float32")})
    assert graph.tensors["x"].shape == (1, 3, 720, 1280)
    assert graph.tensors["c"].shape == (1, 16, 360, 640)
    assert graph.static is None  # taken as built at that size: onnxruntime would know every shape
    built = bind(conv_net(batch=1, height=224, width=224))
    assert built.tensors["c"].shape == (1, 16, 112, 112)
    # the same model as given, or bound at its own sizes: unchanged
    assert bind(conv_net(batch=1, height=224, width=224),
                {"x": InputSpec((1, 3, 224, 224))}).tensors["c"].shape == (1, 16, 112, 112)


@pytest.mark.parametrize("reshape_to,node", [(4 * 32 * 32, "node 'to_rows' (Reshape)"),
                                             (None, "node name: classifier")])
def test_a_size_the_graph_cannot_take_is_bad_inputs_naming_the_node(reshape_to, node):
    model = fixed_flatten_net(reshape_to)
    assert bind(model).tensors["y"].shape == (1, 10)  # as built
    with pytest.raises(InputsError) as caught:
        bind(model, {"x": InputSpec((1, 3, 64, 64))})
    message = str(caught.value)
    assert caught.value.code == "bad_inputs"
    assert message.startswith("the graph cannot take input 'x' at [1, 3, 64, 64] (built at [1, 3, 32, 32]): ")
    assert node in message and "\n" not in message
    # a channel count the convolution's weights do not have: the same, naming the conv
    with pytest.raises(InputsError, match="conv"):
        bind(model, {"x": InputSpec((1, 4, 32, 32))})


def test_a_reshape_that_changes_the_element_count_is_a_bad_graph_as_built():
    """onnx's shape inference takes a fixed Reshape target as it is; the estimator checks the element count."""
    model = make_model([h.make_node("Reshape", ["x", "to"], ["y"], name="to_rows")], [value("x", [1, 4, 32, 32])],
                       [value("y", None)], [nh.from_array(np.array([1, 100], np.int64), "to")])
    with pytest.raises(GraphError, match=r"node 'to_rows' \(Reshape\) reshapes \[1, 4, 32, 32\] \(4096 elements\) "
                                         r"to \[1, 100\] \(100 elements\)$") as caught:
        bind(model)
    assert caught.value.code == "bad_graph"
    # resized, a graph broken as built stays the graph's fault
    for broken in (model, fixed_flatten_net(100)):
        with pytest.raises(GraphError) as caught:
            bind(broken, {"x": InputSpec((1, 4, 64, 64) if broken is model else (1, 3, 64, 64))})
        assert caught.value.code == "bad_graph", caught.value


@pytest.mark.parametrize("shape", [(1, 3, -8, 8), (-1, 3, 8, 8)])
def test_negative_bound_dims(shape):
    with pytest.raises(GraphError, match="invalid dimension .*must be non-negative"):
        bind(conv_net(), {"x": InputSpec(shape)})


def test_zero_bound_dims_are_empty_tensors():
    """An empty tensor is valid (a KV cache before the first token): every shape is inferred, with zeros."""
    graph = bind(conv_net(), {"x": InputSpec((0, 3, 8, 8))})
    assert all(0 in info.shape for name, info in graph.tensors.items() if name not in ("w", "b"))


def test_absurd_bound_dims():
    with pytest.raises(LimitExceeded, match="elements, more than the limit"):
        bind(conv_net(), {"x": InputSpec((1 << 20, 3, 1 << 10, 1 << 10))})
    with pytest.raises(LimitExceeded, match="more than the limit"):
        bind(conv_net(), {"x": InputSpec((1, 3, 1 << 40, 8))})


def test_declared_negative_input_dims():
    model = make_model([h.make_node("Relu", ["x"], ["y"])], [value("x", [1, -3])], [value("y", None)])
    with pytest.raises(GraphError, match="invalid dimension"):
        bind(model)


def test_initializer_with_negative_dims():
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[4, -2])
    model = make_model([h.make_node("MatMul", ["x", "w"], ["y"])], [value("x", [1, 4])], [value("y", None)], [w])
    with pytest.raises(GraphError, match="tensor 'w' has a negative dimension"):
        bind(model)


def test_absurd_intermediate_shape_from_expand():
    shape = nh.from_array(np.array([1 << 20, 1 << 20], dtype=np.int64), "shape")
    model = make_model([h.make_node("Expand", ["x", "shape"], ["y"])], [value("x", [1, 1])], [value("y", None)],
                       [shape])
    with pytest.raises(LimitExceeded, match="tensor 'y' of shape \\[1048576, 1048576\\]"):
        bind(model)


# --------------------------------------------------------------- structure

def test_cycle_names_a_node():
    nodes = [h.make_node("Add", ["x", "b"], ["a"], name="first"), h.make_node("Relu", ["a"], ["b"], name="second"),
             h.make_node("Identity", ["b"], ["y"])]
    model = make_model(nodes, [value("x", [2])], [value("y", None)])
    with pytest.raises(GraphError, match=r"^graph has a cycle through node 'first' \(Add\)$"):
        bind(model)
    downstream = make_model([h.make_node("Identity", ["b"], ["y"], name="reader")] + nodes[:2], [value("x", [2])],
                            [value("y", None)])
    with pytest.raises(GraphError, match=r"cycle through node '(first|second)'"):
        bind(downstream)  # the reader waits on the cycle but is not on it
    self_loop = make_model([h.make_node("Relu", ["y"], ["y"], name="loop")], [value("x", [2])], [value("y", None)])
    with pytest.raises(GraphError, match="cycle through node 'loop'"):
        bind(self_loop)


def test_input_produced_by_nothing_names_the_node():
    model = make_model([h.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [value("x", [2])], [value("y", None)])
    with pytest.raises(GraphError, match=r"^node 'adder' \(Add\) reads 'ghost', which no node, input or initializer"):
        bind(model)
    unnamed = make_model([h.make_node("Add", ["x", "ghost"], ["y"])], [value("x", [2])], [value("y", None)])
    with pytest.raises(GraphError, match=r"node #0 \(Add\) reads 'ghost'"):
        bind(unnamed)


def test_tensor_produced_twice():
    nodes = [h.make_node("Relu", ["x"], ["y"], name="a"), h.make_node("Neg", ["x"], ["y"], name="b")]
    with pytest.raises(GraphError, match="tensor 'y' is produced twice"):
        bind(make_model(nodes, [value("x", [2])], [value("y", None)]))


def test_graph_output_produced_by_nothing():
    model = make_model([h.make_node("Relu", ["x"], ["y"])], [value("x", [2])], [value("z", None)])
    with pytest.raises(GraphError, match="graph output 'z' is produced by nothing"):
        bind(model)


def test_nodes_out_of_order_are_sorted():
    nodes = [h.make_node("Neg", ["r"], ["y"]), h.make_node("Relu", ["x"], ["r"])]
    graph = bind(make_model(nodes, [value("x", [3, 2])], [value("y", None)]))
    assert [n.op_type for n in graph.nodes] == ["Relu", "Neg"]
    assert graph.tensors["y"].shape == (3, 2)


def test_subgraph_reading_an_outer_tensor_defined_later_is_ordered_and_shaped():
    then_graph = h.make_graph([h.make_node("Relu", ["late"], ["t"])], "then", [], [value("t", [2, 3])])
    else_graph = h.make_graph([h.make_node("Neg", ["late"], ["e"])], "else", [], [value("e", [2, 3])])
    nodes = [h.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph, name="if"),
             h.make_node("Abs", ["x"], ["late"], name="abs")]
    graph = bind(make_model(nodes, [value("x", [2, 3]), value("c", [], T.BOOL)], [value("y", None)]))
    assert [n.name for n in graph.nodes] == ["abs", "if"]
    assert graph.tensors["y"].shape == (2, 3) and graph.tensors["t"].shape == (2, 3)


def test_subgraph_reading_nothing():
    then_graph = h.make_graph([h.make_node("Relu", ["ghost"], ["t"], name="inner")], "then", [], [value("t", [2])])
    node = h.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=then_graph, name="branch")
    model = make_model([node], [value("c", [], T.BOOL)], [value("y", None)])
    with pytest.raises(GraphError, match="reads 'ghost'"):
        bind(model)


# ---------------------------------------------------------------- operators

def test_unknown_operator():
    model = make_model([h.make_node("Foo", ["x"], ["y"])], [value("x", [2])], [value("y", None)])
    with pytest.raises(GraphError, match=r"^unknown operator 'Foo'$"):
        bind(model)


def test_operator_from_a_later_opset():
    model = make_model([h.make_node("Gelu", ["x"], ["y"])], [value("x", [2])], [value("y", None)], opset=17)
    with pytest.raises(GraphError, match=r"^unknown operator 'Gelu' in opset 17$"):
        bind(model)
    model = make_model([h.make_node("Gelu", ["x"], ["y"])], [value("x", [2])], [value("y", None)], opset=20)
    assert bind(model).tensors["y"].shape == (2,)


def test_operator_of_an_unknown_domain():
    model = make_model([h.make_node("Foo", ["x"], ["y"], domain="com.acme")], [value("x", [2])], [value("y", None)],
                       extra_opsets={"com.acme": 1})
    with pytest.raises(GraphError, match=r"^unknown operator 'com.acme.Foo'$"):
        bind(model)
    model = make_model([h.make_node("Foo", ["x"], ["y"], domain="com.microsoft")], [value("x", [2])],
                       [value("y", None)], extra_opsets={"com.microsoft": 1})
    with pytest.raises(GraphError, match=r"^unknown operator 'com.microsoft.Foo'$"):
        bind(model)


def test_contrib_operators_are_shaped_by_onnxruntime_symbolic_inference():
    nodes = [h.make_node("FastGelu", ["x"], ["g"], domain="com.microsoft"),
             h.make_node("MatMul", ["g", "w"], ["m"]),
             h.make_node("SkipLayerNormalization", ["m", "x", "gamma", "beta"], ["y"], domain="com.microsoft")]
    inits = [nh.from_array(np.ones((64, 64), np.float32), "w"), nh.from_array(np.ones(64, np.float32), "gamma"),
             nh.from_array(np.zeros(64, np.float32), "beta")]
    model = make_model(nodes, [value("x", ["batch", "seq", 64])], [value("y", None)], inits,
                       extra_opsets={"com.microsoft": 1})
    graph = bind(model, {"x": InputSpec((2, 7, 64))})
    assert graph.tensors["g"].shape == (2, 7, 64)
    assert graph.tensors["m"].shape == (2, 7, 64)
    assert graph.tensors["y"].shape == (2, 7, 64)
    # the real engine agrees
    session = ort.InferenceSession(materialize(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((2, 7, 64), np.float32)})[0].shape == (2, 7, 64)


def test_contrib_operator_list_is_what_can_be_shaped():
    """Every accepted contrib op is shaped by contrib_shapes or by onnxruntime's symbolic inference, and is
    an operator onnxruntime registers in com.microsoft; the default-domain additions are registered there too."""

    known = SymbolicShapeInference(2**31 - 1, False, False, 0).dispatcher_
    assert CONTRIB_OPS <= set(known) | set(contrib_shapes.SHAPERS)
    registered = {(s.domain, s.name) for s in get_all_operator_schema()}
    assert {("com.microsoft", op) for op in CONTRIB_OPS} <= registered
    assert {("", op) for op in contrib_shapes.ORT_DEFAULT_DOMAIN_OPS} <= registered


def test_data_dependent_shape_names_the_weight():
    """A Reshape whose target shape is a weight never read: the error says which weight, and why."""
    shape = onnx.TensorProto(name="target", data_type=T.INT64, dims=[2], data_location=onnx.TensorProto.EXTERNAL)
    shape.external_data.add(key="location", value="absent.bin")
    model = make_model([h.make_node("Reshape", ["x", "target"], ["y"], name="flat")], [value("x", [4, 4])],
                       [value("y", None)], [shape])
    with pytest.raises(GraphError, match=r"output of node 'flat' \(Reshape\): it depends on the values of its "
                                         r"input 'shape', the weight 'target', whose values are never read"):
        bind(model)


def test_data_dependent_shape_is_a_clear_error():
    model = make_model([h.make_node("NonZero", ["x"], ["nz"], name="where"), h.make_node("Neg", ["nz"], ["y"])],
                       [value("x", [4, 4])], [value("y", None, T.INT64)])
    with pytest.raises(GraphError, match=r"cannot infer a concrete shape for 'nz', output of node 'where' \(NonZero\)"):
        bind(model)


def test_type_error_found_by_strict_inference():
    model = make_model([h.make_node("Add", ["x", "i"], ["y"])], [value("x", [2]), value("i", [2], T.INT64)],
                       [value("y", None)])
    with pytest.raises(GraphError, match="^shape inference failed: .*Add") as e:
        bind(model)
    assert "\n" not in str(e.value)


def test_shape_computed_from_shapes_is_propagated():
    # Shape -> Gather -> Concat -> Reshape: what exporters write for flatten; needs data propagation
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             h.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             h.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
             h.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [nh.from_array(np.array(0, np.int64), "zero"), nh.from_array(np.array([0], np.int64), "axes"),
             nh.from_array(np.array([-1], np.int64), "minus_one")]
    model = make_model(nodes, [value("x", ["batch", 3, 4, 5])], [value("y", None)], inits)
    graph = bind(model, {"x": InputSpec((6, 3, 4, 5))})
    assert graph.tensors["y"].shape == (6, 60)
    # onnxruntime folds the whole shape computation: it is all constant once shapes are bound
    assert {"s", "n", "n1", "target"} <= graph.constants
    assert "y" not in graph.constants and "x" not in graph.constants


def test_local_functions_are_inlined():
    fn = h.make_function("local", "Swish", ["a"], ["b"],
                         [h.make_node("Sigmoid", ["a"], ["s"]), h.make_node("Mul", ["a", "s"], ["b"])],
                         [h.make_opsetid("", 17)])
    model = make_model([h.make_node("Swish", ["x"], ["y"], domain="local")], [value("x", [2, 8])], [value("y", None)],
                       extra_opsets={"local": 1}, functions=[fn])
    graph = bind(model)
    assert [n.op_type for n in graph.nodes] == ["Sigmoid", "Mul"]
    assert graph.tensors["y"].shape == (2, 8) and not graph.model.functions


def test_sequence_tensors_are_refused():
    nodes = [h.make_node("SplitToSequence", ["x"], ["seq"]), h.make_node("SequenceAt", ["seq", "zero"], ["y"])]
    model = make_model(nodes, [value("x", [4, 2])], [value("y", None)], [nh.from_array(np.array(0, np.int64), "zero")])
    with pytest.raises(GraphError,
                       match="^tensor 'seq', output of node #0 \\(SplitToSequence\\), is a sequence, not a tensor"):
        bind(model)


# ---------------------------------------------------------------- constants

def test_constants_mirror_onnxruntime_folding():
    nodes = [h.make_node("Constant", [], ["k"], value=nh.from_array(np.ones(4, np.float32))),
             h.make_node("Mul", ["k", "w"], ["kw"]),            # constant * initializer: folded
             h.make_node("Add", ["x", "kw"], ["a"]),            # reads the input: not folded
             h.make_node("RandomNormal", [], ["r"], shape=[4], dtype=T.FLOAT),   # random: never folded
             h.make_node("Add", ["a", "r"], ["y"])]
    model = make_model(nodes, [value("x", [4]), value("w", [4])], [value("y", None)],
                       [nh.from_array(np.ones(4, np.float32), "w")])
    graph = bind(model)
    # IR >= 4: an initializer that is also a graph input can be overridden: not a constant
    assert graph.constants == {"k"}
    model.graph.ClearField("input")
    model.graph.input.extend([value("x", [4])])
    assert bind(model).constants == {"k", "w", "kw"}


def test_flops_of_matmul_gemm_and_conv():
    graph = bind(mlp([64, 128, 10]), {"x": InputSpec((5, 64))})
    by_name = {n.name: n for n in graph.nodes}
    assert node_flops(by_name["matmul0"], graph.tensors) == 2 * 5 * 64 * 128
    assert node_flops(by_name["add0"], graph.tensors) == 0
    conv = bind(conv_net(), {"x": InputSpec((1, 3, 32, 32))})
    assert node_flops(conv.nodes[0], conv.tensors) == 2 * (16 * 16 * 16) * (3 * 3 * 3)
    gemm = make_model([h.make_node("Gemm", ["a", "b"], ["y"], transB=1)], [value("a", [3, 5]), value("b", [7, 5])],
                      [value("y", None)])
    g = bind(gemm)
    assert node_flops(g.nodes[0], g.tensors) == 2 * 3 * 5 * 7


def _positions_model() -> onnx.ModelProto:
    """What transformer exports write: positions = Range(0, seq) expanded to [batch, seq], a mask from them."""
    nodes = [h.make_node("Shape", ["ids"], ["s"]),
             h.make_node("Gather", ["s", "one"], ["seq"], axis=0),
             h.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
             h.make_node("Range", ["zero", "seq", "one"], ["pos"]),
             h.make_node("Unsqueeze", ["pos", "axes0"], ["pos1"]),
             h.make_node("Unsqueeze", ["batch", "axes0"], ["b1"]),
             h.make_node("Unsqueeze", ["seq", "axes0"], ["s1"]),
             h.make_node("Concat", ["b1", "s1"], ["target"], axis=0),
             h.make_node("Expand", ["pos1", "target"], ["positions"]),
             h.make_node("Add", ["ids", "positions"], ["y"]),
             h.make_node("Unsqueeze", ["pos", "axes1"], ["col"]),
             h.make_node("LessOrEqual", ["pos1", "col"], ["mask"]),
             h.make_node("Cast", ["mask"], ["maskf"], to=T.FLOAT)]
    inits = [nh.from_array(np.array(0, np.int64), "zero"), nh.from_array(np.array(1, np.int64), "one"),
             nh.from_array(np.array([0], np.int64), "axes0"), nh.from_array(np.array([1], np.int64), "axes1")]
    return make_model(nodes, [value("ids", ["batch", "seq"], T.INT64)],
                      [value("y", None, T.INT64), value("maskf", None)], inits)


def test_shape_computations_beyond_onnx_data_propagation_are_evaluated():
    graph = bind(_positions_model(), {"ids": InputSpec((3, 7))})
    assert graph.tensors["pos"].shape == (7,)
    assert graph.tensors["positions"].shape == (3, 7)
    assert graph.tensors["y"].shape == (3, 7) and graph.tensors["y"].dtype == "int64"
    assert graph.tensors["mask"].shape == (7, 7) and graph.tensors["maskf"].dtype == "float32"
    assert {"pos", "target", "positions", "mask", "maskf"} <= graph.constants and "y" not in graph.constants
    assert len(graph.nodes) == 13  # the graph itself is unchanged: only shapes were learnt
    # onnxruntime agrees on every tensor
    model = materialize(graph)
    names = [o for n in model.graph.node for o in n.output]
    del model.graph.output[:]
    model.graph.output.extend(h.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, result in zip(names, session.run(names, {"ids": np.zeros((3, 7), np.int64)}), strict=True):
        assert graph.tensors[name].shape == result.shape, name


def test_large_constant_computations_are_not_evaluated():

    node = h.make_node("Expand", ["a", "shape"], ["y"])
    values = {"a": np.ones(1, np.float32), "shape": np.array([1 << 16, 1 << 16], np.int64)}
    assert _evaluate(node, values, {}, {}, 17) is None
    values["shape"] = np.array([4, 4], np.int64)
    assert _evaluate(node, values, {}, {}, 17)["y"].shape == (4, 4)
    big_range = h.make_node("Range", ["s", "l", "d"], ["r"])
    values = {"s": np.array(0.0), "l": np.array(1e12), "d": np.array(1.0)}
    assert _evaluate(big_range, values, {}, {}, 17) is None


def test_absent_weights_are_never_evaluated():
    # Gather of an absent table with constant indices is constant, but its values are not here
    table = onnx.TensorProto(name="table", data_type=T.FLOAT, dims=[1000, 64])
    table.data_location = T.EXTERNAL
    table.external_data.add(key="location", value="nowhere.bin")
    nodes = [h.make_node("Gather", ["table", "idx"], ["rows"]), h.make_node("Add", ["x", "rows"], ["y"])]
    model = make_model(nodes, [value("x", [3, 64])], [value("y", None)],
                       [table, nh.from_array(np.array([1, 2, 3], np.int64), "idx")])
    graph = bind(model)
    assert graph.tensors["rows"].shape == (3, 64) and "rows" in graph.constants
