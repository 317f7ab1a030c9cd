"""Read an ONNX model without reading its weights.

`onnx.load` would copy every weight byte into memory: 435 MB of weights
would cost 435 MB+ of RSS just to learn a few shapes. Instead the file is
memory-mapped and the protobuf wire format of ModelProto is walked here:
every field is copied except the data of large tensors, whose pages are
skipped by offset and never touched. A stripped tensor keeps its name, dims
and data type and is marked as external data at `ABSENT_LOCATION`; tensors
that were already external are never opened, only marked absent the same
way. The stripped bytes (topology + small tensors) are then parsed by onnx.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import onnx
from google.protobuf.message import DecodeError

from monitors.errors import GraphError
from monitors.graphs.graph import ABSENT_LOCATION
from monitors.graphs.limits import Limits

# A tensor keeps its data when its data fields total at most this many bytes.
KEEP_BYTES = 64 * 1024
# Integer tensors (shape targets, axes, indices) are kept up to this size:
# shape inference may need their values.
KEEP_INT_BYTES = 1024 * 1024
_INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
              onnx.TensorProto.INT8, onnx.TensorProto.UINT64, onnx.TensorProto.UINT32}

# Wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# For each message kind we walk: which length-delimited fields hold a message
# that may contain a tensor, and of which kind. Everything else is copied.
_CHILDREN: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attr"},
    "attr": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
# TensorProto fields holding data: float, int32, string, int64, raw, double, uint64.
_TENSOR_DATA_FIELDS = frozenset({4, 5, 6, 7, 9, 10, 11})
_TENSOR_DATA_TYPE, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 2, 13, 14
# GraphProto fields that name a tensor: initializer, input, output, value_info, sparse_initializer.
_GRAPH_VALUE_FIELDS = frozenset({5, 11, 12, 13, 15})


class _Malformed(Exception):
    """The bytes are not a well-formed protobuf message."""


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _encode_varint(field << 3 | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _encode_varint(len(payload)) + payload


# Appended to a stripped tensor: data_location = EXTERNAL, external_data = [{location: ABSENT}].
_ABSENT_MARK = (
    _key(_TENSOR_DATA_LOCATION, _VARINT) + _encode_varint(onnx.TensorProto.EXTERNAL)
    + _len_field(_TENSOR_EXTERNAL_DATA, _len_field(1, b"location") + _len_field(2, ABSENT_LOCATION.encode()))
)


def _size(pieces: list) -> int:
    return sum(p[1] - p[0] if isinstance(p, tuple) else len(p) for p in pieces)


class _Walker:
    """Walks one buffer; produces the pieces of the stripped message.

    A piece is either new bytes or a (start, end) range of the buffer, so
    nothing is copied, and no view of the mapping outlives the walk.
    """

    def __init__(self, buf: memoryview, limits: Limits) -> None:
        self.buf = buf
        self.limits = limits
        self.stripped = 0  # tensors whose data was left behind
        self.nodes = 0  # counted while walking, so a hostile graph is refused before it is parsed
        self.values = 0

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        buf = self.buf
        result = shift = 0
        while True:
            if pos >= end:
                raise _Malformed(f"truncated at byte {pos}")
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                raise _Malformed(f"bad varint at byte {pos}")

    def fields(self, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
        """(field, wire, field_start, value_start, value_end) of each field of a message."""
        pos = start
        while pos < end:
            field_start = pos
            key, pos = self.varint(pos, end)
            field, wire = key >> 3, key & 7
            if field == 0:
                raise _Malformed(f"field number 0 at byte {field_start}")
            value_start = pos
            if wire == _VARINT:
                _, pos = self.varint(pos, end)
            elif wire == _I64:
                pos += 8
            elif wire == _I32:
                pos += 4
            elif wire == _LEN:
                length, pos = self.varint(pos, end)
                value_start = pos
                pos += length
            else:
                raise _Malformed(f"unsupported wire type {wire} at byte {field_start}")
            if pos > end:
                raise _Malformed(f"truncated at byte {end}")
            yield field, wire, field_start, value_start, pos

    def message(self, kind: str, start: int, end: int, depth: int) -> list | None:
        """The pieces of a stripped copy of the message, or None when unchanged."""
        if kind == "tensor":
            return self.tensor(start, end)
        children = _CHILDREN[kind]
        pieces: list = []
        copied_to = start
        for field, wire, field_start, value_start, value_end in self.fields(start, end):
            if kind == "graph":
                self.count(field)
            child = children.get(field) if wire == _LEN else None
            # A message no larger than KEEP_BYTES cannot hold a tensor worth stripping.
            if child is None or value_end - value_start <= KEEP_BYTES:
                continue
            child_depth = depth + 1 if child == "graph" else depth
            if child == "graph":
                self.limits.check_depth(child_depth)
            sub = self.message(child, value_start, value_end, child_depth)
            if sub is None:
                continue
            pieces.append((copied_to, field_start))
            pieces.append(_key(field, _LEN) + _encode_varint(_size(sub)))
            pieces.extend(sub)
            copied_to = value_end
        if not pieces:
            return None
        pieces.append((copied_to, end))
        return pieces

    def count(self, graph_field: int) -> None:
        if graph_field == 1:
            self.nodes += 1
            if self.nodes > self.limits.max_nodes:
                self.limits.check_nodes(self.nodes)
        elif graph_field in _GRAPH_VALUE_FIELDS:
            self.values += 1
            if self.values > self.limits.max_tensors:
                self.limits.check_tensors(self.values)

    def tensor(self, start: int, end: int) -> list | None:
        data_bytes = 0
        data_type = 0
        keep: list[tuple[int, int]] = []  # byte ranges of the fields that stay
        for field, wire, field_start, value_start, value_end in self.fields(start, end):
            if field in _TENSOR_DATA_FIELDS:
                data_bytes += value_end - value_start
                continue
            if field == _TENSOR_DATA_TYPE and wire == _VARINT:
                data_type, _ = self.varint(value_start, value_end)
            elif field in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
                continue  # replaced by the absent mark if stripped
            keep.append((field_start, value_end))
        limit = KEEP_INT_BYTES if data_type in _INT_TYPES else KEEP_BYTES
        if data_bytes <= limit:
            return None
        self.stripped += 1
        pieces: list = []
        run_start = run_end = None
        for a, b in keep:  # merge adjacent ranges into few slices
            if run_end == a:
                run_end = b
                continue
            if run_start is not None:
                pieces.append((run_start, run_end))
            run_start, run_end = a, b
        if run_start is not None:
            pieces.append((run_start, run_end))
        pieces.append(_ABSENT_MARK)
        return pieces


def _strip(buf: memoryview, limits: Limits, label: str) -> bytes:
    walker = _Walker(buf, limits)
    try:
        pieces = walker.message("model", 0, len(buf), 0)
    except _Malformed as e:
        raise GraphError(f"{label} is not an ONNX model: {e}") from None
    if pieces is None:
        limits.check_stripped_bytes(len(buf), label)
        return bytes(buf)
    limits.check_stripped_bytes(_size(pieces), label)
    out = bytearray()
    for p in pieces:
        if isinstance(p, tuple):
            with buf[p[0]:p[1]] as part:
                out += part
        else:
            out += p
    return bytes(out)


def iter_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a model: initializers, Constant/attribute tensors, sparse parts, subgraphs, functions."""

    def from_graph(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from from_nodes(graph.node)

    def from_nodes(nodes) -> Iterator[onnx.TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                for sparse in [attr.sparse_tensor] * attr.HasField("sparse_tensor") + list(attr.sparse_tensors):
                    yield sparse.values
                    yield sparse.indices
                if attr.HasField("g"):
                    yield from from_graph(attr.g)
                for g in attr.graphs:
                    yield from from_graph(g)

    yield from from_graph(model.graph)
    for function in model.functions:
        yield from from_nodes(function.node)
    for info in model.training_info:
        yield from from_graph(info.initialization)
        yield from from_graph(info.algorithm)


def is_absent(tensor: onnx.TensorProto) -> bool:
    """True when the tensor's data is not here (stripped, or external)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _mark_external_absent(model: onnx.ModelProto) -> None:
    """Weights in a side file are never opened: point them at ABSENT_LOCATION too."""
    for tensor in iter_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations = [e.value for e in tensor.external_data if e.key == "location"]
            if locations != [ABSENT_LOCATION]:
                del tensor.external_data[:]
                entry = tensor.external_data.add()
                entry.key, entry.value = "location", ABSENT_LOCATION


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GraphError(f"{label} is not an ONNX model: {reason}") from None
    if not model.HasField("graph"):
        raise GraphError(f"{label} is not an ONNX model: it has no graph")
    if model.ir_version < 1:
        raise GraphError(f"{label} is not an ONNX model: it has no IR version")
    return model


def _check_text(model: onnx.ModelProto, label: str) -> None:
    """Names must be text: protobuf hands back invalid UTF-8 in ONNX's (proto2) string fields as bytes."""

    def bad(values) -> bool:
        return any(not isinstance(v, str) for v in values)

    def check_values(values) -> bool:
        for v in values:
            if not isinstance(v.name, str):
                return True
            if v.type.WhichOneof("value") == "tensor_type":
                if bad(d.dim_param for d in v.type.tensor_type.shape.dim):
                    return True
        return False

    def check_nodes(nodes) -> bool:
        for node in nodes:
            if bad((node.op_type, node.domain, node.name)) or bad(node.input) or bad(node.output):
                return True
            for attr in node.attribute:
                if bad((attr.name, attr.ref_attr_name)):
                    return True
                graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
                if any(check_graph(g) for g in graphs):
                    return True
        return False

    def check_graph(graph: onnx.GraphProto) -> bool:
        return (check_nodes(graph.node) or check_values(graph.input) or check_values(graph.output)
                or check_values(graph.value_info) or bad(t.name for t in graph.initializer)
                or bad(s.values.name for s in graph.sparse_initializer))

    broken = (bad(o.domain for o in model.opset_import) or check_graph(model.graph)
              or any(bad((f.name, f.domain)) or bad(f.input) or bad(f.output) or check_nodes(f.node)
                     for f in model.functions))
    if broken:
        raise GraphError(f"{label} is not an ONNX model: a name is not valid UTF-8 text")


def read_weightless(source: str | os.PathLike | bytes | bytearray | memoryview, limits: Limits) -> onnx.ModelProto:
    """The model with its large tensors' data left behind (marked absent), read in bounded memory."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        label = "model"
        limits.check_file_bytes(len(source), label)
        if len(source) == 0:
            raise GraphError(f"{label} is not an ONNX model: it is empty")
        with memoryview(source) as view:
            data = _strip(view.cast("B") if view.format != "B" else view, limits, label)
    else:
        label = os.fspath(source)
        try:
            with open(label, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GraphError(f"{label} is not an ONNX model: it is empty")
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
                        mm.madvise(mmap.MADV_RANDOM)  # no read-ahead into the skipped weights
                    with memoryview(mm) as view:
                        data = _strip(view, limits, label)
        except OSError as e:
            raise GraphError(f"cannot read {label}: {e.strerror or e}") from None
    model = _parse(data, label)
    _check_text(model, label)
    _mark_external_absent(model)
    return model
