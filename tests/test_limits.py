"""Validation limits: hostile graphs are refused with one line, early, in bounded time and memory."""

from __future__ import annotations

import resource
import time

import numpy as np
import onnx
import onnx.helper as h
import pytest
from models import make_model, mlp, value
from onnx import TensorProto as T
from onnx import numpy_helper as nh

from monitors.errors import BadInput, GraphError, LimitExceeded
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph
from monitors.graphs.limits import Limits
from monitors.graphs.onnx_import import read_weightless
from monitors.graphs.shapes import bind_and_infer


def _load(model: onnx.ModelProto, limits: Limits, inputs=None):
    return load_graph(model.SerializeToString(), fmt="onnx", inputs=inputs, limits=limits)


def test_defaults_are_sensible():
    limits = Limits()
    assert limits.max_nodes == 100_000 and limits.max_rank == 8 and limits.max_graph_depth == 4
    assert limits.max_tensor_elements == 2**31 and limits.max_file_bytes == 64 << 20
    assert 1e14 <= limits.max_total_flops <= 1e16


def test_from_mapping():
    limits = Limits.from_mapping({"max_nodes": 10, "max_total_flops": 5e9})
    assert limits.max_nodes == 10 and limits.max_total_flops == 5e9 and limits.max_rank == 8
    with pytest.raises(BadInput, match="unknown limit 'max_widgets'"):
        Limits.from_mapping({"max_widgets": 1})
    for bad in (0, -1, "10", True, None):
        with pytest.raises(BadInput, match="must be a positive number"):
            Limits.from_mapping({"max_nodes": bad})


def test_limit_exceeded_is_a_graph_error_with_its_own_code():
    with pytest.raises(GraphError) as e:
        Limits(max_rank=2).check_shape("t", (1, 2, 3))
    assert isinstance(e.value, LimitExceeded) and e.value.code == "limit_exceeded"
    assert str(e.value) == "tensor 't' has rank 3, more than the limit of 2"


def test_node_count():
    model = mlp([8, 8, 8, 8])  # 10 nodes
    assert len(_load(model, Limits(max_nodes=10), {"x": InputSpec((1, 8))}).nodes) == 10
    with pytest.raises(LimitExceeded, match=r"^graph has more than 9 nodes \(limit max_nodes\)$"):
        _load(model, Limits(max_nodes=9), {"x": InputSpec((1, 8))})


def _many_nodes_bytes(count: int) -> bytes:
    """A model of `count` Identity nodes, assembled from bytes (onnx.helper would take seconds)."""
    node = h.make_node("Identity", ["x"], ["x"]).SerializeToString()
    field = bytes([1 << 3 | 2, len(node)]) + node
    graph = h.make_graph([], "g", [value("x", [1])], [value("x", None)]).SerializeToString()
    body = graph + field * count
    model = make_model([], [], [])
    model.ClearField("graph")
    length = bytearray()
    n = len(body)
    while True:
        byte, n = n & 0x7F, n >> 7
        length.append(byte | (0x80 if n else 0))
        if not n:
            break
    return model.SerializeToString() + bytes([7 << 3 | 2]) + bytes(length) + body


def test_a_million_nodes_are_refused_before_parsing():
    data = _many_nodes_bytes(1_000_000)
    assert len(data) < Limits().max_file_bytes
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    with pytest.raises(LimitExceeded, match="more than 100000 nodes"):
        read_weightless(data, Limits())
    assert time.process_time() - t0 < 5  # about 0.1 s: stops at the limit, parses nothing
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 50 * 1024


def test_deep_nesting_of_small_subgraphs():
    body = h.make_graph([h.make_node("Identity", ["x"], ["k"])], "b0", [], [value("k", [1])])
    for level in range(1, 8):
        node = h.make_node("If", ["c"], ["k"], then_branch=body, else_branch=body)
        body = h.make_graph([node], f"b{level}", [], [value("k", [1])])
    model = make_model(list(body.node), [value("c", [], T.BOOL), value("x", [1])], [value("k", None)])
    with pytest.raises(LimitExceeded, match=r"^subgraphs nested 5 deep, more than the limit of 4$"):
        _load(model, Limits())
    assert _load(model, Limits(max_graph_depth=7)).tensors["k"].shape == (1,)


def test_rank():
    model = make_model([h.make_node("Relu", ["x"], ["y"])], [value("x", [1] * 9)], [value("y", None)])
    with pytest.raises(LimitExceeded, match="tensor 'input x' has rank 9, more than the limit of 8"):
        _load(model, Limits())
    unsqueeze = make_model([h.make_node("Unsqueeze", ["x", "axes"], ["y"])], [value("x", [1] * 8)],
                           [value("y", None)], [nh.from_array(np.array([0], np.int64), "axes")])
    with pytest.raises(LimitExceeded, match="tensor 'y' has rank 9"):
        _load(unsqueeze, Limits())


def test_weight_elements_are_bounded_though_never_allocated():
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[1 << 16, 1 << 16])
    w.data_location = T.EXTERNAL
    w.external_data.add(key="location", value="nowhere.bin")
    model = make_model([h.make_node("MatMul", ["x", "w"], ["y"])], [value("x", [1, 1 << 16])], [value("y", None)], [w])
    with pytest.raises(LimitExceeded, match=r"tensor 'w' of shape \[65536, 65536\] has 4294967296 elements"):
        _load(model, Limits())


def test_total_flops():
    # ten 7x7 convolutions on a 1024x1024x1024 activation: weights absent, about 1.1e15 FLOPs
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[1024, 1024, 7, 7])
    w.data_location = T.EXTERNAL
    w.external_data.add(key="location", value="nowhere.bin")
    nodes, prev = [], "x"
    for i in range(10):
        nodes.append(h.make_node("Conv", [prev, "w"], [f"c{i}"], pads=[3, 3, 3, 3]))
        prev = f"c{i}"
    model = make_model(nodes, [value("x", [1, 1024, 1024, 1024])], [value(prev, None)], [w])
    with pytest.raises(LimitExceeded, match=r"^graph needs about 1.08e\+15 FLOPs, more than the limit of 1e\+15$"):
        _load(model, Limits())
    assert _load(model, Limits(max_total_flops=2e15)).tensors["c9"].shape == (1, 1024, 1024, 1024)
    small = mlp([64, 64, 64])
    with pytest.raises(LimitExceeded, match="FLOPs"):
        _load(small, Limits(max_total_flops=1000), {"x": InputSpec((1, 64))})


def test_tensor_count():
    with pytest.raises(LimitExceeded, match="more than 5 tensors"):
        _load(mlp([8, 8, 8]), Limits(max_tensors=5), {"x": InputSpec((1, 8))})


def test_bind_and_infer_checks_limits_on_a_parsed_model_too():
    # the WebNN importers hand over a ModelProto directly, without read_weightless
    model = mlp([8, 8, 8, 8])
    with pytest.raises(LimitExceeded, match="more than 3 nodes"):
        bind_and_infer(model, {"x": InputSpec((1, 8))}, Limits(max_nodes=3))
