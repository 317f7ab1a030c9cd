"""The `.webnn` text format: every operator maps to runnable ONNX with the WebNN spec's shapes; bad text fails in
one line."""

from __future__ import annotations

import subprocess
import sys
import time
from math import erf, sqrt
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.simulation.materialize import materialize
from monitors.errors import GraphError, LimitExceeded
from monitors.graphs import webnn_text
from monitors.graphs.graph import ABSENT_LOCATION, InputSpec
from monitors.graphs.importer import load_graph
from monitors.graphs.limits import Limits
from monitors.graphs.shapes import bind_and_infer
from tests.webnn_cases import CASES, run

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).parent.parent / "examples"


def graph_of(text: str, inputs=None):
    return bind_and_infer(webnn_text.to_onnx(text, Limits()), inputs, Limits())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_operator_maps_to_onnx_with_spec_shapes_that_runs_in_onnxruntime(case):
    graph = graph_of(case.text())
    outputs = run(graph)
    for name, (dtype, shape) in case.expect.items():
        assert graph.tensors[name].dtype == dtype
        assert graph.tensors[name].shape == tuple(shape), "shape inference disagrees with the WebNN spec"
        assert outputs[name].shape == tuple(shape), "onnxruntime disagrees with the WebNN spec"
        assert str(outputs[name].dtype) == dtype


def test_readme_example_of_webnn_graph_parses_to_weightless_onnx():
    text = """
    webnn_graph "resnet_head" v1 {
      inputs { x: f32[1, 2048]; }
      consts {
        W: f32[2048, 1000] @weights("W");
        b: f32[1000]       @weights("b");
      }
      nodes {
        logits0 = matmul(x, W);
        logits  = add(logits0, b);
        probs   = softmax(logits, axis=1);
      }
      outputs { probs; }
    }"""
    model = webnn_text.to_onnx(text, Limits())
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add", "Softmax"]
    assert 17 <= model.opset_import[0].version and 8 <= model.ir_version <= 10
    weights = {t.name: t for t in model.graph.initializer}
    assert set(weights) == {"W", "b"}
    for t in weights.values():  # weightless: dims and type only, bytes absent
        assert not t.raw_data and t.data_location == t.EXTERNAL
        assert {e.key: e.value for e in t.external_data} == {"location": ABSENT_LOCATION}
    assert list(weights["W"].dims) == [2048, 1000]
    assert bind_and_infer(model, None, Limits()).weight_bytes == (2048 * 1000 + 1000) * 4


def test_symbolic_input_dims_stay_symbolic_and_bind_from_the_caller():
    text = """webnn_graph "dyn" v2 {
      inputs { x: f32[dyn("batch", 8), 3, height, width]; }
      consts { w: f32[16, 3, 3, 3]; }
      nodes { y = conv2d(x, w, padding=[1, 1, 1, 1], strides=[2, 2]); }
      outputs { y; }
    }"""
    model = webnn_text.to_onnx(text, Limits())
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    graph = bind_and_infer(model, {"x": InputSpec((2, 3, 720, 1280))}, Limits())
    assert graph.tensors["y"].shape == (2, 16, 360, 640)
    assert run(graph)["y"].shape == (2, 16, 360, 640)


def test_gelu_lowers_to_the_erf_pattern_onnxruntime_fuses():
    graph = graph_of('webnn_graph "g" v1 { inputs { x: f32[2, 8]; } nodes { y = gelu(x); } outputs { y; } }')
    assert [n.op_type for n in graph.nodes] == ["Div", "Erf", "Add", "Mul", "Mul"]
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    session = ort.InferenceSession(materialize(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    expected = np.array([[v * 0.5 * (1 + erf(v / sqrt(2))) for v in row] for row in x], dtype=np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_onnxruntime_fuses_the_lowered_gelu_and_conv_batchnorm_clamp(tmp_path):
    """The lowering yields the patterns onnxruntime's optimizer recognises (its own optimized graph is the oracle)."""
    text = """webnn_graph "fuse" v1 {
      inputs { x: f32[1, 8, 16, 16]; t: f32[4, 64]; }
      consts { w: f32[16, 8, 3, 3]; m: f32[16]; v: f32[16]; s: f32[16]; b: f32[16]; }
      nodes {
        c = conv2d(x, w, padding=[1, 1, 1, 1]);
        n = batchNormalization(c, m, v, scale=s, bias=b);
        y = clamp(n, minValue=0, maxValue=6);
        g = gelu(t);
      }
      outputs { y; g; }
    }"""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(materialize(graph_of(text)).SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = sorted(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
    assert ops == ["FusedConv", "Gelu"]


def test_layouts_become_transposes_around_the_onnx_op():
    text = """webnn_graph "nhwc" v1 {
      inputs { x: f32[1, 16, 16, 8]; }
      consts { w: f32[3, 3, 8, 4]; }
      nodes { y = conv2d(x, w, inputLayout="nhwc", filterLayout="hwio", padding=[1, 1, 1, 1]); }
      outputs { y; }
    }"""
    graph = graph_of(text)
    ops = [(n.op_type, list(n.attribute[0].ints) if n.op_type == "Transpose" else None) for n in graph.nodes]
    assert ops == [("Transpose", [0, 3, 1, 2]), ("Transpose", [3, 2, 0, 1]), ("Conv", None),
                   ("Transpose", [0, 2, 3, 1])]
    # The filter's transpose reads only a constant: onnxruntime folds it away at session creation.
    assert graph.nodes[1].output[0] in graph.constants
    assert graph.tensors["y"].shape == (1, 16, 16, 4)


def test_nodes_may_come_in_any_order_and_dead_nodes_are_dropped():
    text = """webnn_graph "order" v1 {
      inputs { x: f32[2, 3]; }
      nodes { y = relu(t); t = add(x, x); unused = exp(x); }
      outputs { y; }
    }"""
    graph = graph_of(text)
    assert [n.op_type for n in graph.nodes] == ["Add", "Relu"]


def test_comments_quantized_header_and_short_output_lists():
    text = """# a comment
    webnn_graph "c" v1 @quantized {   # trailing comment
      inputs { x: f32[2]; y: float32[2]; }
      nodes { a = add(x, y); b = mul(x, y); }
      outputs { a, b; }
    }"""
    graph = graph_of(text)
    assert [o.name for o in graph.model.graph.output] == ["a", "b"]


def test_sample_models_load_through_the_importer():
    mobile = load_graph(DATA / "mobilenet_like.webnn")
    assert mobile.tensors["probs"].shape == (1, 1000)
    assert run(mobile)["probs"].shape == (1, 1000)
    blur = load_graph(EXAMPLES / "blur_segmenter.webnn", inputs={"image": InputSpec((1, 360, 640, 3))})
    assert blur.tensors["mask"].shape == (1, 360, 640, 1)
    assert run(blur)["mask"].shape == (1, 360, 640, 1)


# ---------------------------------------------------------------------------------------- bad input

HEAD = 'webnn_graph "bad" v1 {\n  inputs { x: f32[1, 3, 8, 8]; }\n  consts { w: f32[4, 3, 3, 3]; }\n  nodes {\n'


def nodes(body: str) -> str:
    return HEAD + "    " + body + "\n  }\n  outputs { y; }\n}\n"


BAD = [
    (nodes("y = foo(x);"), "line 5:9: unknown operator 'foo'"),
    (nodes("y = relu(x, alpha=1);"), "line 5:9: relu: unknown option 'alpha'"),
    (nodes("y = relu(z);"), "line 5:9: undefined operand 'z'"),
    (nodes("a = relu(b); b = relu(a); y = relu(a);"), "cyclic reference"),
    (nodes("y = relu(y);"), "cyclic reference: 'y' -> 'y'"),
    (nodes("y = relu(x); y = exp(x);"), "line 5:22: 'y' is already defined (at line 5:9)"),
    (nodes("x = relu(x);"), "'x' is already defined"),
    (nodes("y = conv2d(x, w, strides=[1]);"), "line 5:9: conv2d: option 'strides': expected 2 values, got 1"),
    (nodes('y = conv2d(x, w, inputLayout="nchwc");'), "option 'inputLayout': expected one of 'nchw', 'nhwc'"),
    (nodes("y = conv2d(x, w, groups=2);"), "input has 3 channels but filter expects 3 x 2 groups"),
    (nodes("y = conv2d(w, x);"), "conv2d: window 8 (dilation 1) is larger than the padded input 3"),
    (nodes("y = matmul(x, w);"), "matmul: inner dimensions differ"),
    (nodes("y = relu(x, x);"), "line 5:17: relu: unexpected argument 'x'"),
    (nodes("y = relu();"), "relu: missing operand 'input'"),
    (nodes("[y, z] = relu(x);"), "relu: has one output, but 2 names are assigned"),
    (nodes("[y, z] = split(x, 3, axis=1);"), "split: gives 3 outputs but 2 names are assigned"),
    (nodes("y = split(x, 2, axis=1);"), "dimension 3 does not divide into 2 equal parts"),
    (nodes("y = reshape(x, [5, 5]);"), "cannot reshape [1, 3, 8, 8] (192 elements) to [5, 5]"),
    (nodes("y = add(x, w);"), "do not broadcast"),
    (nodes("y = softmax(x, axis=7);"), "softmax: axis 7 is out of range for rank 4"),
    (nodes("y = averagePool2d(x, windowDimensions=[9, 9]);"), "larger than the padded input"),
    (nodes("y = cast(x);"), "cast: missing the target data type"),
    (nodes('y = cast(x, "float64");'), "unknown data type 'float64'"),
    (nodes("y = relu(x)"), "line 6:3: expected ';', found '}'"),
    (nodes("y = relu(x;"), "line 5:15: expected ','"),
    (nodes('y = relu(x, label="unterminated);'), "line 5:23: unterminated string"),
    (nodes("y = relu(x) ? 1;"), "line 5:17: unexpected character '?'"),
    (nodes("y = 3;"), "line 5:9: expected an operator call or an operand name, found '3'"),
    (nodes("y = reshape(x, " + "[" * 40 + "]" * 40 + ");"), "lists nested more than 16 deep"),
    (nodes("y = relu(" + "x" * 5000 + ");"), "token longer than 4096 characters"),
    (HEAD.replace("x: f32", "x: f64") + "  }\n}", "line 2:15: unknown data type 'f64'"),
    (HEAD.replace("w: f32[4, 3, 3, 3]", 'w: f32[4, dyn("n", 4), 3, 3]') + "  }\n}", "constant's shape must be static"),
    (HEAD.replace("[1, 3, 8, 8]", "[1, 0, 8, 8]") + "  }\n}", "dimension 0 must be positive"),
    (HEAD.replace("v1", "v3") + "  }\n}", "line 1:19: unsupported version v3"),
    (HEAD.replace("webnn_graph", "graph") + "  }\n}", "line 1:1: expected 'webnn_graph'"),
    (HEAD.replace('w: f32[4, 3, 3, 3]', 'w: f32[4] @weights("a") @scalar(1)'), "one initializer annotation"),
    (HEAD.replace('w: f32[4, 3, 3, 3]', 'w: f32[2] @bytes([1, 2, 3])') + "  }\n  outputs { w; }\n}",
     "constant 'w': 3 bytes given, float32[2] needs 8"),
    (HEAD.replace('w: f32[4, 3, 3, 3]', 'w: f32[2] @bytes([1, 2, 300])'), "@bytes takes a list of integers 0..255"),
    (HEAD.replace('w: f32[4, 3, 3, 3]', 'w: f32[2] @fill(1)'), "unknown annotation '@fill'"),
    (nodes("y = relu(x);").replace("outputs { y; }", "outputs { nothere; }"),
     "line 7:13: output 'nothere' names undefined operand 'nothere'"),
    (nodes("y = relu(x);").replace("outputs { y; }", "outputs { }"), "the graph declares no outputs"),
    (nodes("y = relu(x);") + "extra", "line 9:1: unexpected 'extra' after the end of the graph"),
    (nodes("y = relu(x);").replace("  outputs", "  inputs { q: f32[1]; }\n  outputs"), "second 'inputs' block"),
    ("", "line 1:1: expected 'webnn_graph', found end of file"),
    (HEAD, "found end of file"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_text_gives_one_graph_error_line_with_its_position(text, message):
    with pytest.raises(GraphError) as err:
        webnn_text.to_onnx(text, Limits())
    line = str(err.value)
    assert message in line
    assert "\n" not in line
    assert line.startswith("line ") or line == "the graph declares no outputs"


def test_bad_model_through_the_importer_is_one_graph_error_line(tmp_path):
    path = tmp_path / "bad.webnn"
    path.write_text(nodes("y = foo(x);"))
    with pytest.raises(GraphError, match=r"^line 5:9: unknown operator 'foo'$"):
        load_graph(path)


def test_missing_dynamic_dimension_is_an_error_at_binding():
    text = 'webnn_graph "d" v2 { inputs { x: f32[dyn("n", 8), 4]; } nodes { y = relu(x); } outputs { y; } }'
    with pytest.raises(GraphError):
        graph_of(text)


_TOKENS = ["webnn_graph", '"g"', "v1", "{", "}", "inputs", "consts", "nodes", "outputs", "x", "y", "w", ":", ";",
           ",", "=", "(", ")", "[", "]", "f32", "i64", "1", "3", "-1", "2.5", "@weights", "@scalar", "@bytes",
           "dyn", "relu", "conv2d", "split", "concat", "reshape", "axis", "true", "null", '"nhwc"', "#c\n", "\n"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_text_raises_nothing_but_graph_error(text):
    try:
        webnn_text.to_onnx(text, Limits())
    except GraphError as e:
        assert "\n" not in str(e)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=60), st.booleans())
def test_random_token_soup_raises_nothing_but_graph_error(tokens, with_header):
    head = 'webnn_graph "g" v1 { inputs { x: f32[1, 3, 4, 4]; } nodes { ' if with_header else ""
    try:
        webnn_text.to_onnx(head + " ".join(tokens), Limits())
    except GraphError as e:
        assert "\n" not in str(e)


def test_a_million_node_text_fails_fast_with_limit_exceeded():
    body = "".join(f"n{i} = relu(x);\n" for i in range(1_000_000))
    text = 'webnn_graph "huge" v1 { inputs { x: f32[1]; } nodes {\n' + body + "} outputs { n0; } }"
    start = time.perf_counter()
    # Refused at the first statement past the limit: the rest of the text is never tokenized, and
    # what is held is bounded by max_nodes. (bench/webnn_parse.py measures it at the default limit.)
    with pytest.raises(LimitExceeded, match=r"^line 10002:1: graph has more than 10000 nodes \(limit max_nodes\)$"):
        webnn_text.to_onnx(text, Limits(max_nodes=10_000))
    assert time.perf_counter() - start < 10


def test_max_nodes_counts_onnx_nodes_too():
    # 3 WebNN nodes but layouts add Transposes: the ONNX node count is what is limited.
    text = nodes('y = conv2d(x, w, inputLayout="nhwc", filterLayout="hwio");').replace(
        "[1, 3, 8, 8]", "[1, 8, 8, 3]").replace("[4, 3, 3, 3]", "[3, 3, 3, 4]")
    webnn_text.to_onnx(text, Limits(max_nodes=4))
    with pytest.raises(LimitExceeded, match="more than 3 nodes"):
        webnn_text.to_onnx(text, Limits(max_nodes=3))


@pytest.mark.parametrize("body,message", [
    ("y = clamp(i, minValue=0.5);", "line 5:9: clamp: minValue: 0.5 is not an integer, as int32 needs"),
    ("y = clamp(x, minValue=6, maxValue=0);", "clamp: minValue 6.0 is above maxValue 0.0"),
    ("y = pad(i, [0], [1], value=1e12);", "pad: value: 1000000000000 does not fit int32"),
    ("y = slice(i, [1099511627777], [2]);", "option 'starts': integer 1099511627777 is out of range"),
    ("y = pad(x, [0, 0, 0, 1099511627775], [0, 0, 0, 0]);", "more than the limit of 2147483647"),
])
def test_values_that_do_not_fit_their_type_are_graph_errors(body, message):
    text = nodes(body).replace("inputs { x: f32[1, 3, 8, 8]; }", "inputs { x: f32[1, 3, 8, 8]; i: i32[n]; }")
    with pytest.raises(GraphError) as err:
        webnn_text.to_onnx(text, Limits())
    assert message in str(err.value)


def test_scalar_constants_must_fit_their_type():
    for decl, message in [("k: i32[] @scalar(2.5);", "constant 'k': 2.5 is not an integer"),
                          ("k: u8[] @scalar(300);", "300 does not fit uint8"),
                          ("k: f16[] @scalar(1e9);", "does not fit float16")]:
        text = HEAD.replace("w: f32[4, 3, 3, 3];", decl) + "    y = relu(x);\n  }\n  outputs { y; }\n}"
        with pytest.raises(GraphError, match=message):
            webnn_text.to_onnx(text, Limits())


def test_an_input_or_constant_cannot_be_an_output_as_in_mlgraphbuilder_build():
    for outs in ("x;", "w;"):
        with pytest.raises(GraphError, match=r"^line 7:13: output '.' is a graph input or constant"):
            webnn_text.to_onnx(nodes("y = relu(x);").replace("outputs { y; }", f"outputs {{ {outs} }}"), Limits())


def test_a_15_mb_string_literal_is_refused_before_the_lexer_backtracks_over_it():
    """In a process of its own, to read its peak memory: the unbounded string pattern took 2.5 GB here."""

    code = ("import resource\n"
            "from monitors.graphs.importer import load_graph\n"
            "from monitors.errors import GraphError\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "text = 'webnn_graph \"g\" v1 { inputs { x: f32[1]; } nodes { y = relu(x, label=\"' + 'a' * 15_000_000"
            " + '\"); } outputs { y; } }'\n"
            "try:\n    load_graph(text, fmt='webnn')\nexcept GraphError as e:\n    print(e)\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent).stdout.splitlines()
    assert out[0] == "line 1:70: token longer than 4096 characters", out
    assert int(out[1]) < 200, f"{out[1]} MB for a refused 15 MB string"
