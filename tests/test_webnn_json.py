"""webnn-graph-json: the JSON twin of a text graph gives the same ONNX; bad JSON fails in one line with its path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from monitors.errors import GraphError, LimitExceeded
from monitors.graphs import webnn_json, webnn_text
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.graphs.limits import Limits
from monitors.graphs.shapes import bind_and_infer
from monitors.graphs.webnn_ops import OPS
from tests.webnn_cases import CASES, run, to_json

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).parent.parent / "examples"

README_JSON = {
    "format": "webnn-graph-json",
    "version": 1,
    "inputs": {"x": {"dataType": "float32", "shape": [1, 2048]}},
    "consts": {
        "W": {"dataType": "float32", "shape": [2048, 1000], "init": {"kind": "weights", "ref": "W"}},
        "b": {"dataType": "float32", "shape": [1000], "init": {"kind": "weights", "ref": "b"}},
    },
    "nodes": [
        {"id": "logits0", "op": "matmul", "inputs": ["x", "W"], "options": {}},
        {"id": "logits", "op": "add", "inputs": ["logits0", "b"], "options": {}},
        {"id": "probs", "op": "softmax", "inputs": ["logits"], "options": {"axis": 1}},
    ],
    "outputs": {"probs": "probs"},
}
README_TEXT = """webnn_graph "resnet_head" v1 {
  inputs { x: f32[1, 2048]; }
  consts { W: f32[2048, 1000] @weights("W"); b: f32[1000] @weights("b"); }
  nodes { logits0 = matmul(x, W); logits = add(logits0, b); probs = softmax(logits, axis=1); }
  outputs { probs; }
}"""


def test_webnn_graph_readme_json_and_text_give_the_same_onnx():
    a = webnn_json.to_onnx(dict(README_JSON, name="resnet_head"), Limits())
    b = webnn_text.to_onnx(README_TEXT, Limits())
    assert a.SerializeToString() == b.SerializeToString()


@pytest.mark.parametrize("stem", ["mlp", "mobilenet_like"])
def test_sample_json_twin_equals_its_text(stem):
    a = webnn_json.to_onnx(json.loads((DATA / f"{stem}.json").read_text()), Limits())
    b = webnn_text.to_onnx((DATA / f"{stem}.webnn").read_text(), Limits())
    assert a.SerializeToString() == b.SerializeToString()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_operator_case_lowers_identically_from_json(case):
    text_model = webnn_text.to_onnx(case.text(), Limits())
    obj = json.loads(json.dumps(to_json(webnn_text.parse(case.text()))))  # through real JSON text
    json_model = webnn_json.to_onnx(obj, Limits())
    assert json_model.SerializeToString() == text_model.SerializeToString()


def test_example_mlp_loads_binds_and_runs():
    graph = load_graph(EXAMPLES / "mlp.json", inputs={"features": InputSpec((4, 256))})
    assert graph.tensors["probs"].shape == (4, 10)
    probs = run(graph)["probs"]
    assert probs.shape == (4, 10)
    assert abs(float(probs.sum()) - 4.0) < 1e-3  # softmax rows sum to one: the graph computes what it says


def test_multi_output_node_and_list_outputs():
    obj = {
        "inputs": {"x": {"dataType": "float32", "shape": [1, 8]}},
        "nodes": [{"id": "s", "op": "split", "inputs": ["x"], "options": {"splits": [3, 5], "axis": 1},
                   "outputs": ["a", "b"]},
                  {"id": "y", "op": "concat", "inputs": ["b", "a"], "options": {"axis": 1}}],
        "outputs": ["y", "a"],
    }
    graph = load_graph(obj, fmt="json")
    assert graph.tensors["y"].shape == (1, 8) and graph.tensors["a"].shape == (1, 3)


def test_output_renamed_from_its_operand():
    obj = copy.deepcopy(README_JSON)
    obj["outputs"] = {"scores": "probs"}
    graph = load_graph(obj, fmt="json")
    assert [o.name for o in graph.model.graph.output] == ["scores"]
    assert graph.tensors["scores"].shape == (1, 1000)


def test_inline_bytes_and_scalar_constants_carry_their_values():
    obj = {
        "inputs": {"x": {"dataType": "float32", "shape": [4, 2]}},
        "consts": {"i": {"dataType": "int32", "shape": [2], "init": {"kind": "inlineBytes",
                                                                       "bytes": [3, 0, 0, 0, 1, 0, 0, 0]}},
                   "k": {"dataType": "float32", "shape": [1], "init": {"kind": "scalar", "value": 2}}},
        "nodes": [{"id": "g", "op": "gather", "inputs": ["x", "i"]},
                  {"id": "y", "op": "mul", "inputs": ["g", "k"]}],
        "outputs": {"y": "y"},
    }
    model = webnn_json.to_onnx(obj, Limits())
    values = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    assert values["i"] == [3, 1] and values["k"] == [2.0]


def with_node(**node) -> dict:
    obj = copy.deepcopy(README_JSON)
    obj["nodes"][2] = {"id": "probs", "op": "softmax", "inputs": ["logits"], "options": {"axis": 1}, **node}
    return obj


def changed(path: str, value) -> dict:
    obj = copy.deepcopy(README_JSON)
    *parents, last = path.split("/")
    target = obj
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return obj


BAD = [
    (changed("format", "onnx"), "format: expected 'webnn-graph-json'"),
    (changed("version", 3), "version: unsupported version 3"),
    (changed("extra", 1), "graph: unknown key 'extra'"),
    (changed("inputs/x/dataType", "float64"), "inputs['x'].dataType: unknown data type 'float64'"),
    (changed("inputs/x/shape", [1, -5]), "inputs['x'].shape[1]: expected a positive integer"),
    (changed("inputs/x/shape", [1, True]), "inputs['x'].shape[1]"),
    (changed("inputs/x/dtype", "float32"), "inputs['x']: unknown key 'dtype'"),
    (changed("consts/W/shape", [{"name": "n", "maxSize": 2}, 1000]), "consts['W'].shape[0]: expected a positive"),
    (changed("consts/W/init", {"kind": "file", "ref": "W"}), "consts['W'].init.kind: expected 'weights'"),
    (changed("consts/W/init", {"kind": "scalar", "value": "big"}), "consts['W'].init.value: expected a number"),
    (changed("consts/b/init", {"kind": "inlineBytes", "bytes": [1, 2]}),
     "consts['b']: constant 'b': 2 bytes given, float32[1000] needs 4000"),
    (changed("nodes/0/op", "foo"), "nodes[0] ('logits0'): unknown operator 'foo'"),
    (changed("nodes/2/options", {"axis": 1, "dim": 2}), "nodes[2] ('probs'): softmax: unknown option 'dim'"),
    (changed("nodes/2/options", {"axis": "one"}), "softmax: option 'axis': expected an integer, got 'one'"),
    (changed("nodes/1/inputs", ["logits0", "nope"]), "nodes[1] ('logits'): undefined operand 'nope'"),
    (changed("nodes/0/inputs", ["probs", "W"]), "cyclic reference"),
    (changed("nodes/0/inputs", "x"), "nodes[0] ('logits0').inputs: expected a list"),
    (changed("nodes/0/id", 7), "nodes[0].id: expected a non-empty name"),
    (changed("nodes/0/id", "x"), "nodes[0] ('x'): 'x' is already defined (at inputs['x'])"),
    (changed("nodes/0/kind", "x"), "nodes[0]: unknown key 'kind'"),
    (changed("nodes", {"a": 1}), "nodes: expected a list"),
    (changed("outputs", {"probs": "nowhere"}), "outputs['probs']: output 'probs' names undefined operand"),
    (changed("outputs", {}), "the graph declares no outputs"),
    (changed("outputs", {"W": "probs"}), "output name 'W' is already an operand"),
    (with_node(outputs=["p", "q"]), "softmax: has one output, but 2 names are assigned"),
    (changed("inputs/x/dataType", "int4"), "data type 'int4' is not supported"),
]


@pytest.mark.parametrize("obj,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_json_gives_one_graph_error_line_with_its_path(obj, message):
    with pytest.raises(GraphError) as err:
        webnn_json.to_onnx(obj, Limits())
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_node_count_is_checked_before_anything_is_built():
    obj = copy.deepcopy(README_JSON)
    obj["nodes"] = [{"id": f"n{i}", "op": "relu", "inputs": ["x"]} for i in range(200_001)]
    with pytest.raises(LimitExceeded, match="^nodes: graph has 200001 nodes, more than the limit of 100000$"):
        webnn_json.to_onnx(obj, Limits())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 300) | st.floats(allow_nan=True) | st.text(max_size=8)
    | st.sampled_from(["x", "W", "b", "nhwc", "linear"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OPS)), st.lists(st.sampled_from(["x", "W", "b", "logits0"]), max_size=4),
       st.dictionaries(st.sampled_from(sorted({k for s in OPS.values() for k in s.options})), json_values,
                       max_size=4))
def test_random_operator_calls_raise_nothing_but_graph_error(op, inputs, options):
    obj = copy.deepcopy(README_JSON)
    obj["nodes"].append({"id": "extra", "op": op, "inputs": inputs, "options": options})
    obj["outputs"]["extra"] = "extra"
    try:
        webnn_json.to_onnx(obj, Limits())
    except GraphError as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["format", "version", "inputs", "consts", "nodes", "outputs", "name"]),
                       json_values, max_size=6))
def test_random_json_objects_raise_nothing_but_graph_error(obj):
    try:
        webnn_json.to_onnx(obj, Limits())
    except GraphError as e:
        assert "\n" not in str(e)


_CASE_JSON = [(c.id, to_json(webnn_text.parse(c.text()))) for c in CASES]
_VALUES = [None, True, 0, 1, -1, 2, 3, 7, 1000, 0.5, -2.5, 1e30, "x", "nhwc", "linear", [], [0], [1, 1], [2, 2],
           [0, 0, 0, 0], [1, 2, 3], [-1], [[1]], {"name": "n"}, "float16", [1, -1], [3, 1, 0, 2], [0, 1, 2, 3]]


@settings(max_examples=250, deadline=None)
@given(st.integers(0, len(_CASE_JSON) - 1), st.integers(0, 10**6), st.sampled_from(_VALUES),
       st.sampled_from(["set", "drop", "add-input", "drop-input"]))
def test_perturbed_valid_graphs_fail_cleanly_or_infer_cleanly(index, pick, value, how):
    """One option or operand of a valid graph changed: a GraphError, or ONNX that shape inference accepts."""
    case_id, obj = copy.deepcopy(_CASE_JSON[index])
    node = obj["nodes"][pick % len(obj["nodes"])]
    if how == "set":
        options = sorted(OPS[node["op"]].options)
        node["options"][options[pick % len(options)]] = value
    elif how == "drop" and node["options"]:
        del node["options"][sorted(node["options"])[pick % len(node["options"])]]
    elif how == "add-input":
        names = sorted(obj["inputs"]) + sorted(obj["consts"])
        node["inputs"].append(names[pick % len(names)])
    elif how == "drop-input" and node["inputs"]:
        node["inputs"].pop(pick % len(node["inputs"]))
    try:
        model = webnn_json.to_onnx(obj, Limits())
    except GraphError as e:
        assert "\n" not in str(e)
        return
    bind_and_infer(model, None, Limits())  # what lowering accepts, ONNX shape inference accepts too


def test_names_with_line_breaks_or_huge_values_still_give_one_short_line():
    obj = changed("nodes/0/op", "evil\nop")
    with pytest.raises(GraphError, match=r"^nodes\[0\] \('logits0'\): unknown operator 'evil\\nop'$"):
        webnn_json.to_onnx(obj, Limits())
    with pytest.raises(GraphError, match="holds control characters"):
        webnn_json.to_onnx(changed("nodes/0/id", "a\nb"), Limits())
    nested: list = []
    for _ in range(800):
        nested = [nested]
    huge = changed("nodes/2/options", {"axis": nested})
    with pytest.raises(GraphError) as err:
        webnn_json.to_onnx(huge, Limits())
    assert len(str(err.value)) < 200 and "\n" not in str(err.value)
    with pytest.raises(GraphError) as err:
        webnn_json.to_onnx(changed("nodes/2/options", {"axis": list(range(10**6))}), Limits())
    assert len(str(err.value)) < 200
