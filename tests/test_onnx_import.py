"""Weightless ONNX reading: weights stripped or marked absent, never read; bad bytes are one-line GraphErrors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as h
import onnx.inliner
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import absent_weights_model, make_model, mlp, save_external, value, write_inline_weights_model
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper as nh

from bench.attacks import nested_functions_onnx
from monitors.errors import BadInput, GraphError, LimitExceeded
from monitors.graphs.graph import ABSENT_LOCATION, DTYPE_NAMES, InputSpec
from monitors.graphs.importer import input_specs_from_json, load_graph, parse_input_spec
from monitors.graphs.limits import Limits
from monitors.graphs.onnx_import import is_absent, iter_tensors, read_weightless

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits()


def _absent(tensor: onnx.TensorProto) -> bool:
    return (tensor.data_location == T.EXTERNAL
            and [(e.key, e.value) for e in tensor.external_data] == [("location", ABSENT_LOCATION)])


def _has_data(tensor: onnx.TensorProto) -> bool:
    return bool(tensor.raw_data or tensor.float_data or tensor.int64_data or tensor.int32_data
                or tensor.double_data or tensor.string_data or tensor.uint64_data)


# ------------------------------------------------------------------ weights

def test_inline_weights_are_stripped_and_small_tensors_kept():
    model = mlp([256, 512, 10])
    read = read_weightless(model.SerializeToString(), LIMITS)
    inits = {t.name: t for t in read.graph.initializer}
    big = inits["w0"]  # 256x512 float32 = 512 KiB
    assert _absent(big) and not _has_data(big)
    assert list(big.dims) == [256, 512] and big.data_type == T.FLOAT and big.name == "w0"
    for small in ("b0", "w1", "b1", "target"):  # <= 64 KiB: kept with data
        assert not is_absent(inits[small]) and _has_data(inits[small])
    assert list(nh.to_array(inits["target"])) == [-1, 10]
    assert read.ByteSize() < 30_000  # the 530 KB of weights are gone
    # everything but the big tensor's data is as onnx reads it
    original = onnx.load_from_string(model.SerializeToString())
    original.graph.initializer[0].ClearField("raw_data")
    original.graph.initializer[0].data_location = T.EXTERNAL
    original.graph.initializer[0].external_data.add(key="location", value=ABSENT_LOCATION)
    assert read == original


def test_model_without_large_tensors_reads_exactly_as_onnx_load():
    model = mlp([8, 16, 4])
    assert read_weightless(model.SerializeToString(), LIMITS) == model


def test_large_int64_tensors_up_to_a_mebibyte_keep_their_data():
    indices = nh.from_array(np.arange(50_000, dtype=np.int64), "idx")  # 400 KB of int64: shape inference may need it
    table = nh.from_array(np.zeros((50_000, 4), np.float32), "table")  # 800 KB of float: stripped
    model = make_model([h.make_node("Gather", ["table", "idx"], ["y"])], [], [value("y", None)], [indices, table])
    read = read_weightless(model.SerializeToString(), LIMITS)
    inits = {t.name: t for t in read.graph.initializer}
    assert not is_absent(inits["idx"]) and len(inits["idx"].raw_data) == 400_000
    assert _absent(inits["table"])


def test_unpacked_repeated_float_data_is_stripped_too():
    # float_data written element by element (wire type 5), as old writers may do
    tensor = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[20_000])
    meta = tensor.SerializeToString()
    element = bytes([4 << 3 | 5]) + np.float32(1.5).tobytes()
    body = meta + element * 20_000
    graph = h.make_graph([h.make_node("Relu", ["w"], ["y"])], "g", [], [value("y", None)])
    graph_bytes = graph.SerializeToString() + bytes([5 << 3 | 2]) + _varint(len(body)) + body
    model = make_model([], [], [])
    model.ClearField("graph")
    data = model.SerializeToString() + bytes([7 << 3 | 2]) + _varint(len(graph_bytes)) + graph_bytes
    assert len(onnx.load_from_string(data).graph.initializer[0].float_data) == 20_000
    read = read_weightless(data, LIMITS)
    assert _absent(read.graph.initializer[0]) and list(read.graph.initializer[0].dims) == [20_000]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_external_weights_present_are_never_opened(tmp_path):
    save_external(mlp([256, 512, 10]), tmp_path / "m.onnx", absent=False)
    data_file = tmp_path / "m.onnx.data"
    assert data_file.stat().st_size > 500_000
    opened: list[str] = []

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            opened.append(str(args[0]))

    sys.addaudithook(hook)
    opened.clear()
    graph = load_graph(tmp_path / "m.onnx", inputs={"x": InputSpec((4, 256))})
    seen = list(opened)
    opened.clear()
    assert not any(p.endswith("m.onnx.data") for p in seen), seen
    inits = {t.name: t for t in graph.model.graph.initializer}
    assert all(_absent(inits[n]) for n in ("w0", "b0", "w1"))  # 1 KiB or more: went to the side file
    assert not is_absent(inits["target"]) and not is_absent(inits["b1"])
    assert graph.tensors["w0"].shape == (256, 512) and graph.tensors["y"].shape == (4, 10)


def test_shape_values_only_in_external_data_are_a_clear_error(tmp_path):
    # every tensor external, the Reshape target too: its values are needed and never read
    path = save_external(mlp([256, 512, 10]), tmp_path / "m.onnx", absent=False, size_threshold=0)
    with pytest.raises(GraphError, match=r"node 'reshape' \(Reshape\): it depends on the values of its input "
                                         r"'shape', the weight 'target', whose values are never read"):
        load_graph(path, inputs={"x": InputSpec((4, 256))})


def test_external_weights_absent_import(tmp_path):
    path = save_external(mlp([256, 512, 10]), tmp_path / "m.onnx", absent=True)
    graph = load_graph(path, inputs={"x": InputSpec((2, 256))})
    assert graph.tensors["y"].shape == (2, 10)
    assert graph.weight_bytes == 4 * (256 * 512 + 512 + 512 * 10 + 10) + 16


def test_big_constant_nodes_are_stripped_also_inside_subgraphs():
    big = nh.from_array(np.ones((300, 300), np.float32))
    then_graph = h.make_graph([h.make_node("Constant", [], ["k"], value=big), h.make_node("Add", ["x", "k"], ["t"])],
                              "then", [], [value("t", [300, 300])])
    else_graph = h.make_graph([h.make_node("Identity", ["x"], ["e"])], "else", [], [value("e", [300, 300])])
    nodes = [h.make_node("Constant", [], ["c"], value=big),
             h.make_node("Constant", [], ["cond"], value=nh.from_array(np.array(True))),
             h.make_node("If", ["cond"], ["z"], then_branch=then_graph, else_branch=else_graph),
             h.make_node("MatMul", ["z", "c"], ["y"])]
    model = make_model(nodes, [value("x", [300, 300])], [value("y", None)])
    read = read_weightless(model.SerializeToString(), LIMITS)
    tensors = list(iter_tensors(read))
    assert len(tensors) == 3
    stripped = [t for t in tensors if list(t.dims) == [300, 300]]
    assert len(stripped) == 2 and all(_absent(t) for t in stripped)
    assert read.ByteSize() < 2_000
    graph = load_graph(read.SerializeToString(), fmt="onnx")
    assert graph.tensors["y"].shape == (300, 300)


def test_sparse_tensor_attribute_is_stripped():
    values = nh.from_array(np.ones(40_000, np.float32), "v")
    indices = nh.from_array(np.arange(40_000, dtype=np.int64), "i")
    sparse = h.make_sparse_tensor(values, indices, [200, 400])
    model = make_model([h.make_node("Constant", [], ["y"], sparse_value=sparse)], [], [value("y", None)])
    read = read_weightless(model.SerializeToString(), LIMITS)
    attr = read.graph.node[0].attribute[0].sparse_tensor
    assert _absent(attr.values) and list(attr.dims) == [200, 400]
    assert not is_absent(attr.indices)  # 320 KB of int64 indices: kept


# ------------------------------------------------------------ bad sources

def test_not_a_model(tmp_path):
    with pytest.raises(GraphError, match="is not an ONNX model"):
        read_weightless(b"this is plainly not a protobuf \xff\xff\xff\xff", LIMITS)
    text = tmp_path / "notes.onnx"
    text.write_text("hello, world\n")
    with pytest.raises(GraphError, match=r"notes.onnx is not an ONNX model"):
        load_graph(text)


def test_truncated_model_bytes():
    data = mlp([256, 512, 10]).SerializeToString()
    for cut in (len(data) // 2, len(data) - 1, 3):
        with pytest.raises(GraphError, match="is not an ONNX model") as e:
            read_weightless(data[:cut], LIMITS)
        assert "\n" not in str(e.value)


def test_truncated_model_file_whose_weights_are_cut_off(tmp_path):
    path = write_inline_weights_model(tmp_path / "m.onnx", 2_000_000)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    with pytest.raises(GraphError, match="is not an ONNX model: truncated"):
        read_weightless(path, LIMITS)


def test_empty_missing_and_directory_paths(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(GraphError, match="is not an ONNX model: it is empty"):
        load_graph(tmp_path / "empty.onnx")
    with pytest.raises(GraphError, match=r"^cannot read .*nope.onnx: No such file or directory$"):
        load_graph(tmp_path / "nope.onnx")
    (tmp_path / "dir.onnx").mkdir()
    with pytest.raises(GraphError, match="cannot read .*dir.onnx: Is a directory"):
        load_graph(tmp_path / "dir.onnx")
    with pytest.raises(GraphError, match="cannot tell the format"):
        load_graph(tmp_path / "model.pt")
    with pytest.raises(GraphError, match="cannot read .*nope.json"):
        load_graph(tmp_path / "nope.json")


def test_a_protobuf_that_is_not_a_model():
    # a valid protobuf (a TensorProto) is still not a ModelProto with a graph
    with pytest.raises(GraphError, match="is not an ONNX model"):
        read_weightless(nh.from_array(np.ones(4, np.float32), "t").SerializeToString(), LIMITS)


def test_inline_bytes_above_the_limit():
    data = mlp([256, 512, 10]).SerializeToString()
    with pytest.raises(LimitExceeded, match="more than the limit"):
        read_weightless(data, Limits(max_file_bytes=100_000))


def test_stripped_model_above_the_limit(tmp_path):
    # many small tensors: nothing to strip, and too much left
    inits = [nh.from_array(np.ones(1000, np.float32), f"t{i}") for i in range(40)]
    model = make_model([h.make_node("Sum", [t.name for t in inits], ["y"])], [], [value("y", None)], inits)
    with pytest.raises(LimitExceeded, match="max_stripped_bytes"):
        read_weightless(model.SerializeToString(), Limits(max_stripped_bytes=100_000))


def test_nested_subgraphs_deeper_than_the_limit_are_refused_while_reading():
    big = nh.from_array(np.ones((200, 200), np.float32))  # makes each level large enough to be walked
    body = h.make_graph([h.make_node("Constant", [], ["k"], value=big)], "b0", [], [value("k", None)])
    for level in range(1, 8):
        node = h.make_node("If", ["c"], ["k"], then_branch=body, else_branch=body)
        body = h.make_graph([node], f"b{level}", [], [value("k", None)])
    model = make_model(list(body.node), [value("c", [], T.BOOL)], [value("k", None)])
    with pytest.raises(LimitExceeded, match="nested"):
        read_weightless(model.SerializeToString(), Limits(max_graph_depth=4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_reader(data):
    try:
        model = read_weightless(data, LIMITS)
    except GraphError as e:
        assert "\n" not in str(e)
    else:
        assert model.HasField("graph")


_VALID = mlp([64, 300, 4]).SerializeToString()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), max_size=6),
       st.integers(1, len(_VALID)))
def test_corrupted_models_are_refused_or_imported_never_crash(edits, cut):
    data = bytearray(_VALID[:cut])
    for pos, byte in edits:
        if pos < len(data):
            data[pos] = byte
    try:
        graph = load_graph(bytes(data), fmt="onnx", inputs=None)
    except BadInput as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert all(info.size >= 0 for info in graph.tensors.values())


# --------------------------------------------------------------- memory

_CHILD = r"""
import json, sys, time

def hwm():  # peak RSS of this process image in KiB (ru_maxrss would carry the forking parent's)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

sys.path.insert(0, sys.argv[2])
from monitors.graphs.importer import load_graph
before = hwm()
t0 = time.perf_counter()
graph = load_graph(sys.argv[1])
print(json.dumps({"before_kb": before, "peak_kb": hwm(),
                  "seconds": time.perf_counter() - t0, "weight_bytes": graph.weight_bytes}))
"""


def _measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(ROOT)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_memory_of_a_model_with_435_mb_of_absent_weights(tmp_path):
    path = tmp_path / "absent.onnx"
    path.write_bytes(absent_weights_model(435_000_000).SerializeToString())
    r = _measure(path)
    assert r["weight_bytes"] > 430_000_000
    assert r["peak_kb"] < 250 * 1024
    assert r["peak_kb"] - r["before_kb"] < 30 * 1024


def test_memory_of_a_model_with_200_mb_of_inline_weights(tmp_path):
    # A sparse file: any page the reader touched would be counted in its RSS.
    path = write_inline_weights_model(tmp_path / "inline.onnx", 200_000_000)
    assert path.stat().st_size > 199_000_000
    r = _measure(path)
    assert r["weight_bytes"] > 199_000_000
    assert r["peak_kb"] < 250 * 1024
    assert r["peak_kb"] - r["before_kb"] < 30 * 1024


# ------------------------------------------------------------ importer

def test_load_graph_from_bytes_and_path_agree(tmp_path):
    model = mlp([32, 64, 8])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    inputs = {"x": InputSpec((3, 32))}
    a = load_graph(path, inputs=inputs)
    b = load_graph(model.SerializeToString(), fmt="onnx", inputs=inputs)
    assert a.tensors == b.tensors and a.tensors["y"].shape == (3, 8)
    assert a.name == "m"


def test_load_graph_argument_errors():
    with pytest.raises(BadInput, match="needs its format"):
        load_graph(b"\x08\x03")
    with pytest.raises(BadInput, match="unknown model format"):
        load_graph(b"\x08\x03", fmt="tflite")
    with pytest.raises(BadInput, match="must be given as bytes"):
        load_graph({"a": 1}, fmt="onnx")
    with pytest.raises(BadInput, match="must be a JSON object"):
        load_graph("[1, 2]", fmt="json")
    with pytest.raises(GraphError, match="is not JSON"):
        load_graph("{nope", fmt="json")


@pytest.mark.parametrize("text, expected", [
    ("x=1x3x224x224", ("x", InputSpec((1, 3, 224, 224), None))),
    ("x=1x3x224x224:float16", ("x", InputSpec((1, 3, 224, 224), "float16"))),
    ("input_ids=1,128:int64", ("input_ids", InputSpec((1, 128), "int64"))),
    ("serving_default:0=8", ("serving_default:0", InputSpec((8,), None))),
    ("a=b=2X4", ("a=b", InputSpec((2, 4), None))),
])
def test_parse_input_spec(text, expected):
    assert parse_input_spec(text) == expected


@pytest.mark.parametrize("text", ["x", "=1x3", "x=", "x=-1x3", "x=1xx3", "x=ax3", "x=1x3:float99",
                                  "x=1.5x3", "x=99999999999", "x=1x3:"])
def test_parse_input_spec_rejects(text):
    if text == "x=1x3:":  # an empty dtype is the same as none
        assert parse_input_spec(text) == ("x", InputSpec((1, 3), None))
        return
    with pytest.raises(BadInput, match="bad --input"):
        parse_input_spec(text)


def test_input_specs_from_a_request():
    assert input_specs_from_json({"x": {"shape": [1, 3, 720, 1280], "dataType": "float32"}}) == {
        "x": InputSpec((1, 3, 720, 1280), "float32")}
    assert input_specs_from_json({"past": {"shape": [1, 2, 0, 64]}}) == {"past": InputSpec((1, 2, 0, 64))}
    assert parse_input_spec("past=1x2x0x64") == ("past", InputSpec((1, 2, 0, 64)))  # an empty KV cache
    for bad in ([1], {"x": {"shape": [-1, 3]}}, {"x": {"shape": [True]}}, {"x": {}},
                {"x": {"shape": [1], "dataType": "float128"}}):
        with pytest.raises(BadInput):
            input_specs_from_json(bad)


def test_local_functions_are_counted_as_inlined_before_they_are_inlined():
    """1.6 KB of functions, each calling the one before ten times: a million nodes once inlined."""


    calls: list[int] = []
    real = onnx.inliner.inline_local_functions
    onnx.inliner.inline_local_functions = lambda m, *a, **k: calls.append(1) or real(m, *a, **k)
    try:
        with pytest.raises(LimitExceeded, match="more than 100000 nodes"):
            load_graph(nested_functions_onnx(7, 10), fmt="onnx")
        assert not calls  # refused before the inliner ran
        small = load_graph(nested_functions_onnx(3, 3), fmt="onnx")  # 9 nodes inlined: within the limits
        assert len(small.model.graph.node) == 9 and calls
    finally:
        onnx.inliner.inline_local_functions = real
    opsets = [oh.make_opsetid("", 17), oh.make_opsetid("local", 1)]
    loop = oh.make_function("local", "f", ["x"], ["y"], [oh.make_node("f", ["x"], ["y"], domain="local")], opsets)
    graph = oh.make_graph([oh.make_node("f", ["x"], ["y"], domain="local")], "g",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    with pytest.raises(GraphError, match="calls itself"):
        load_graph(oh.make_model(graph, functions=[loop], opset_imports=opsets).SerializeToString(), fmt="onnx")


def test_the_dtype_codes_written_out_are_onnxs():
    """monitors/graphs/graph.py writes ONNX's data type codes out (the agent's main process does not load onnx)."""
    names = {code: onnx.TensorProto.DataType.Name(code) for code in DTYPE_NAMES}
    assert names == {1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL",
                     10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64", 16: "BFLOAT16"}
    assert {onnx.helper.tensor_dtype_to_np_dtype(code).name for code in DTYPE_NAMES if code != 16} == \
        {name for code, name in DTYPE_NAMES.items() if code != 16}
