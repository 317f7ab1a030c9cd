"""Input descriptors resize a graph: the same answers in Python, on the CLI (`--input`) and over MQTT.

The explainer's app builds its graph once at 224x224 and asks about the 720x1280 frames it will run: the
descriptor re-binds the input even where the graph fixed it, and every shape is inferred again from there. A
size the graph cannot take is one `bad_inputs` error naming the node; an input with no shape is `bad_inputs`
too, saying how to give it on each surface.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import agent_on, client, request_v5, write_config
from models import LIGHT_DIR

from monitors.errors import GraphError, InputsError, UnboundInput
from monitors.graphs.builder import GraphBuilder
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.pricing.tiers import TIER_NAMES

DEV = "dev1"
FRAME = InputSpec((1, 3, 720, 1280), "float32")


def explainer_graph(reshape: bool = False) -> dict:
    """The explainer's weightless conv2d as the JS MLGraphBuilder writes it (webnn-graph-json), built at 224x224;
    with `reshape`, a head that flattens to the size it has at 224x224."""
    graph = {"format": "webnn-graph-json", "version": 1,
             "inputs": {"input": {"dataType": "float32", "shape": [1, 3, 224, 224]}},
             "consts": {"modelWeights": {"dataType": "float32", "shape": [3, 3, 64, 64], "label": "modelWeights"}},
             "nodes": [{"id": "conv2d", "op": "conv2d", "inputs": ["input", "modelWeights"], "options": {}}],
             "outputs": {"output": "conv2d"}}
    if reshape:
        graph["nodes"].append({"id": "flat", "op": "reshape", "inputs": ["conv2d"],
                               "options": {"newShape": [1, 3 * 161 * 161]}})
        graph["outputs"] = {"output": "flat"}
    return graph


EXPLAINER_TEXT = """webnn_graph "explainer" v1 {
  inputs { input: f32[1, 3, 224, 224]; }
  consts { modelWeights: f32[3, 3, 64, 64] @weights("modelWeights"); }
  nodes {
    conv = conv2d(input, modelWeights);
    flat = reshape(conv, newShape=[1, 77763]);
  }
  outputs { flat; }
}
"""


def test_a_descriptor_resizes_a_graph_built_at_another_size_in_every_format():
    built = load_graph(explainer_graph(), fmt="json")
    assert built.tensors["conv2d"].shape == (1, 3, 161, 161)
    resized = load_graph(explainer_graph(), fmt="json", inputs={"input": FRAME})
    assert resized.tensors["input"].shape == (1, 3, 720, 1280)
    assert resized.tensors["conv2d"].shape == (1, 3, 657, 1217)
    assert resized.tensors["modelWeights"].shape == (3, 3, 64, 64)  # the label is the weights' late-binding name

    b = GraphBuilder()
    weights = b.constant({"shape": [3, 3, 64, 64], "dataType": "float32", "label": "modelWeights"})
    x = b.input("input", {"shape": [1, 3, 224, 224], "dataType": "float32"})
    out = b.conv2d(x, weights)
    assert weights.name == "modelWeights"
    assert b.build({"output": out}).tensors[out.name].shape == (1, 3, 161, 161)
    assert b.build({"output": out}, {"input": FRAME}).tensors[out.name].shape == (1, 3, 657, 1217)


@pytest.mark.parametrize("fmt", ["json", "webnn", "builder"])
def test_a_size_the_graph_cannot_take_is_bad_inputs_naming_the_node(fmt):
    def load(inputs=None):
        if fmt == "json":
            return load_graph(explainer_graph(reshape=True), fmt="json", inputs=inputs)
        if fmt == "webnn":
            return load_graph(EXPLAINER_TEXT, fmt="webnn", inputs=inputs)
        b = GraphBuilder()
        x = b.input("input", {"shape": [1, 3, 224, 224], "dataType": "float32"})
        y = b.conv2d(x, b.constant({"shape": [3, 3, 64, 64], "dataType": "float32", "label": "modelWeights"}))
        return b.build({"output": b.reshape(y, [1, 77763], label="flat")}, inputs)

    assert load().tensors["flat"].shape == (1, 77763)  # as built
    with pytest.raises(InputsError) as caught:
        load({"input": FRAME})
    message = str(caught.value)
    assert caught.value.code == "bad_inputs" and "\n" not in message
    assert message.startswith("the graph cannot take input 'input' at [1, 3, 720, 1280] "
                              "(built at [1, 3, 224, 224]): "), message
    assert "reshape" in message and "2398707 elements" in message, message
    where = {"json": "nodes[1] ('flat')", "webnn": "line 6:12: reshape", "builder": "reshape #"}[fmt]
    assert where in message, message
    # a graph broken as built is the graph's fault, resized or not
    broken = explainer_graph(reshape=True)
    broken["nodes"][1]["options"]["newShape"] = [1, 5]
    for inputs in (None, {"input": FRAME}):
        with pytest.raises(GraphError) as caught:
            load_graph(broken, fmt="json", inputs=inputs)
        assert caught.value.code == "bad_graph", caught.value


def test_a_missing_input_shape_is_bad_inputs():
    graph = explainer_graph()
    graph["inputs"]["input"]["shape"] = [1, 3, "height", "width"]
    with pytest.raises(UnboundInput) as caught:
        load_graph(graph, fmt="json")
    assert caught.value.code == "bad_inputs" and "--input" not in str(caught.value)
    assert "symbolic dimension 'height'" in str(caught.value)
    assert load_graph(graph, fmt="json", inputs={"input": FRAME}).tensors["conv2d"].shape == (1, 3, 657, 1217)


def daop(*args: str, state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args, "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=120)


def test_cli_input_resizes_and_refuses_what_the_graph_cannot_take(state_dir, tmp_path):
    path = tmp_path / "explainer.json"
    path.write_text(json.dumps(explainer_graph()))
    small = daop("estimate", str(path), "--json", "--at-rest", state_dir=state_dir)
    big = daop("estimate", str(path), "--input", "input=1x3x720x1280", "--json", "--at-rest", state_dir=state_dir)
    assert small.returncode == 0 and big.returncode == 0, small.stderr + big.stderr
    # 30 times the work: a tier ladder whose steps are at most 10x apart puts it in a worse tier
    assert json.loads(big.stdout)["latency_ms"] > 10 * json.loads(small.stdout)["latency_ms"]
    assert TIER_NAMES.index(json.loads(big.stdout)["tier"]) > TIER_NAMES.index(json.loads(small.stdout)["tier"])

    path.write_text(json.dumps(explainer_graph(reshape=True)))
    r = daop("estimate", str(path), "--input", "input=1x3x720x1280", state_dir=state_dir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot take input 'input' at [1, 3, 720, 1280]" in r.stderr and "nodes[1] ('flat')" in r.stderr

    unbound = explainer_graph()
    unbound["inputs"]["input"]["shape"] = [1, 3, "height", "width"]
    path.write_text(json.dumps(unbound))
    r = daop("estimate", str(path), state_dir=state_dir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "symbolic dimension 'height'" in r.stderr and "pass --input input=1x3x<height>x<width>" in r.stderr


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, "[privacy]\njitter = 0\n"), DEV).start()
    yield proc
    proc.stop()


async def test_mqtt_inputs_resize_and_errors_are_bad_inputs(agent, mosquitto):
    frame = {"input": {"shape": list(FRAME.shape), "dataType": "float32"}}
    unbound = explainer_graph()
    unbound["inputs"]["input"]["shape"] = [1, 3, "height", "width"]
    async with client(mosquitto.port) as c:
        small, _ = await request_v5(c, DEV, "estimate", {"graph": explainer_graph()})
        big, _ = await request_v5(c, DEV, "estimate", {"graph": explainer_graph(), "inputs": frame})
        assert small["status"] == big["status"] == "ok", (small, big)
        assert TIER_NAMES.index(big["data"]["performanceTier"]) > TIER_NAMES.index(small["data"]["performanceTier"])
        refused, _ = await request_v5(c, DEV, "estimate", {"graph": explainer_graph(reshape=True), "inputs": frame})
        assert refused["status"] == "error" and refused["error"]["code"] == "bad_inputs", refused
        assert "nodes[1] ('flat')" in refused["error"]["message"]
        missing, _ = await request_v5(c, DEV, "meets", {"graph": unbound, "requiredTier": "poor"})
        assert missing["status"] == "error" and missing["error"]["code"] == "bad_inputs", missing
        assert "symbolic dimension 'height'" in missing["error"]["message"]
        assert "--input" not in missing["error"]["message"]
        ok, _ = await request_v5(c, DEV, "meets", {"graph": unbound, "requiredTier": "poor", "inputs": frame})
        assert ok["status"] == "ok" and ok["data"] == {"meetsRequirement": True}, ok  # the agent kept serving


def test_real_models_built_at_224_asked_at_448():
    """onnx's light CNNs, built at 224x224: SqueezeNet (a global pool before its head) runs at 448x448; ResNet-50
    (a 7x7 pool, then a Reshape to 2048) cannot, as a runtime would find, and the error names that Reshape."""
    squeezenet = load_graph(LIGHT_DIR / "light_squeezenet.onnx", inputs={"data_0": InputSpec((1, 3, 448, 448))})
    assert squeezenet.tensors["data_0"].shape == (1, 3, 448, 448)
    assert squeezenet.tensors[squeezenet.model.graph.output[0].name].shape == (1, 1000, 1, 1)
    with pytest.raises(InputsError) as caught:
        load_graph(LIGHT_DIR / "light_resnet50.onnx", inputs={"gpu_0/data_0": InputSpec((1, 3, 448, 448))})
    assert str(caught.value) == (
        "the graph cannot take input 'gpu_0/data_0' at [1, 3, 448, 448] (built at [1, 3, 224, 224]): "
        "node 'n173' (Reshape) reshapes [1, 2048, 8, 8] (131072 elements) to [1, 2048] (2048 elements)")
