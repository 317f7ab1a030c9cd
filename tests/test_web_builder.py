"""The JS MLGraphBuilder (clients/js/webnn.js) in Node.js: what it builds is what the agent imports.

Weightless graphs built with the explainer's calls are read by the agent's own importer (monitors/graphs) and
must have the shapes the Python GraphBuilder gives for the same calls; the builder's operators are exactly the
agent's (monitors/graphs/webnn_ops.py OPS), with the same positional options.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from browser import CLIENT

from monitors.errors import GraphError
from monitors.graphs.builder import GraphBuilder
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.graphs.webnn_ops import OPS

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (>= 20)")


def node(script: str) -> object:
    """The JSON a module script prints, run with webnn.js's exports in scope."""
    code = f"import * as daop from './webnn.js';\nconst out = await (async () => {{ {script} }})();\n" \
           "console.log(JSON.stringify(out));"
    r = subprocess.run(["node", "--input-type=module", "-e", code], cwd=CLIENT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_builder_has_the_agents_operators_with_their_positional_options():
    table = node("""
        const b = new daop.MLGraphBuilder();
        return daop.OPERATOR_NAMES.map((op) => [op, typeof b[op], daop.OPERATORS[op]]);""")
    assert {op: (kind, positional) for op, kind, positional in table} == {
        op: ("function", list(spec.positional)) for op, spec in OPS.items()}


EXPLAINER = """
    const builder = new daop.MLGraphBuilder({});
    const weights = builder.constant({shape: [3, 3, 64, 64], dataType: 'float32', label: 'modelWeights'});
    const input = builder.input('input', {shape: [1, 3, 224, 224], dataType: 'float32'});
    const output = builder.conv2d(input, weights);
"""


def test_the_explainers_graph_is_weightless_json_the_agent_reads_and_resizes():
    graph = node(EXPLAINER + "return builder.build().toJSON();")
    assert graph["consts"] == {"modelWeights": {"dataType": "float32", "shape": [3, 3, 64, 64],
                                                "label": "modelWeights"}}
    assert graph["outputs"] == {"conv2d": "conv2d"}  # build(): the result nothing reads
    assert load_graph(graph, fmt="json").tensors["conv2d"].shape == (1, 3, 161, 161)
    resized = load_graph(graph, fmt="json", inputs={"input": InputSpec((1, 3, 720, 1280), "float32")})
    assert resized.tensors["conv2d"].shape == (1, 3, 657, 1217)
    named = node(EXPLAINER + "return builder.build({mask: output}).toJSON();")
    assert named["outputs"] == {"mask": "conv2d"}


def test_a_network_built_in_js_has_the_shapes_the_python_builder_gives():
    graph = node("""
        const b = new daop.MLGraphBuilder();
        const x = b.input('image', {shape: [1, 224, 224, 3], dataType: 'float32'});
        const w1 = b.constant({shape: [16, 3, 3, 3], dataType: 'float32', label: 'conv1.weight'});
        const bias = b.constant({shape: [16], dataType: 'float32', label: 'conv1.bias'});
        const c1 = b.relu(b.conv2d(x, w1, {inputLayout: 'nhwc', filterLayout: 'ohwi', strides: [2, 2],
                                           padding: [1, 1, 1, 1], bias}));
        const [left, right] = b.split(c1, 2, {axis: 3});
        const joined = b.concat([b.sigmoid(left), right], 3);
        const pooled = b.averagePool2d(joined, {layout: 'nhwc', windowDimensions: [112, 112]});
        const flat = b.reshape(pooled, [1, 16], {label: 'flat'});
        const fc = b.constant({shape: [16, 10], dataType: 'float32', label: 'fc.weight'});
        const scale = b.constant('float32', 0.5);
        const probs = b.softmax(b.mul(b.matmul(flat, fc), scale), 1);
        return b.build({probs}).toJSON();""")
    got = load_graph(graph, fmt="json")

    b = GraphBuilder()
    x = b.input("image", {"shape": [1, 224, 224, 3], "dataType": "float32"})
    w1 = b.constant({"shape": [16, 3, 3, 3], "dataType": "float32", "label": "conv1.weight"})
    bias = b.constant({"shape": [16], "dataType": "float32", "label": "conv1.bias"})
    c1 = b.relu(b.conv2d(x, w1, inputLayout="nhwc", filterLayout="ohwi", strides=[2, 2], padding=[1, 1, 1, 1],
                         bias=bias))
    left, right = b.split(c1, 2, axis=3)
    pooled = b.averagePool2d(b.concat([b.sigmoid(left), right], 3), layout="nhwc", windowDimensions=[112, 112])
    flat = b.reshape(pooled, [1, 16], label="flat")
    probs = b.softmax(b.mul(b.matmul(flat, b.constant({"shape": [16, 10], "dataType": "float32"})),
                            b.constant(0.5)), 1)
    want = b.build({"probs": probs})
    assert got.tensors["probs"].shape == want.tensors[probs.name].shape == (1, 10)
    assert got.tensors["flat"].shape == want.tensors["flat"].shape == (1, 16)
    assert sorted(n.op_type for n in got.nodes) == sorted(n.op_type for n in want.nodes)
    assert {k: v["init"] for k, v in graph["consts"].items() if "init" in v} == {
        "constant": {"kind": "scalar", "value": 0.5}}  # the weights travel as descriptors only


def test_builder_misuse_is_a_clear_error_at_the_call():
    errors = node("""
        const msg = (f) => { try { f(); return 'no error'; } catch (e) { return `${e.name}: ${e.message}`; } };
        const a = new daop.MLGraphBuilder(), b = new daop.MLGraphBuilder();
        const x = a.input('x', {shape: [1, 4], dataType: 'float32'});
        const y = b.input('y', {shape: [1, 4], dataType: 'float32'});
        return [
            msg(() => a.add(x, y)),
            msg(() => a.constant({shape: [2, 2], dataType: 'float32', weights: 'w'})),
            msg(() => a.constant({shape: [2, -1], dataType: 'float32'})),
            msg(() => a.build()),
            msg(() => { a.relu(x); a.build(); a.relu(x); }),
        ];""")
    assert errors[0].startswith("TypeError: add #1: ") and "not an operand of this builder" in errors[0]
    assert errors[1] == "TypeError: constant: unknown descriptor key 'weights'"
    assert errors[2].startswith("TypeError: constant: shape must be a list of positive integers")
    assert errors[3] == "DaopError: build: the graph has no operator to compute"
    assert errors[4] == "DaopError: relu: this builder has built its graph already"


def test_a_graph_the_agent_refuses_names_the_node():
    graph = node(EXPLAINER + """
        builder.reshape(output, [1, 5], {label: 'flat'});
        return builder.build().toJSON();""")
    with pytest.raises(GraphError, match=r"nodes\[1\] \('flat'\): reshape: cannot reshape"):
        load_graph(graph, fmt="json")
