"""webnn-graph-json (the webnn-graph project's JSON form) -> weightless ONNX.

    {"format": "webnn-graph-json", "version": 1,
     "inputs":  {"x": {"dataType": "float32", "shape": [1, {"name": "n", "maxSize": 8}]}},
     "consts":  {"W": {"dataType": "float32", "shape": [8, 4], "init": {"kind": "weights", "ref": "W"}}},
     "nodes":   [{"id": "y", "op": "matmul", "inputs": ["x", "W"], "options": {}}],
     "outputs": {"y": "y"}}

Init kinds: "weights" (ref; weightless), "scalar" (value), "inlineBytes"
(bytes). A node with several outputs lists them in "outputs". Every error is
one GraphError line that starts with the JSON path of the fault.
"""

from __future__ import annotations

from typing import Any

import onnx

from monitors.errors import GraphError, LimitExceeded
from monitors.graphs.limits import Limits
from monitors.graphs.webnn_ops import ConstDecl, GraphDecl, InputDecl, NodeDecl, check_name, lower, parse_dtype, show

_TOP_KEYS = {"format", "version", "name", "quantized", "inputs", "consts", "nodes", "outputs"}


def _err(where: str, message: str) -> GraphError:
    return GraphError(f"{where}: {message}")


def _dict(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise _err(where, f"expected an object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise _err(where, f"expected a list, got {type(v).__name__}")
    return v


def _name(v: Any, where: str) -> str:
    return check_name(v, where)


def _keys(obj: dict, allowed: set[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _err(where, f"unknown key {show(key)} (known: {', '.join(sorted(allowed))})")


def _dtype(v: Any, where: str) -> str:
    try:
        return parse_dtype(v)
    except ValueError as e:
        raise _err(where, str(e)) from None


def _static_shape(v: Any, where: str) -> list[int]:
    """A constant's shape: positive integers only (_shape with static=True refuses the rest)."""
    return [d for d in _shape(v, where, static=True) if isinstance(d, int)]


def _shape(v: Any, where: str, static: bool) -> list[int | str]:
    dims: list[int | str] = []
    for k, d in enumerate(_list(v, where)):
        at = f"{where}[{k}]"
        if isinstance(d, dict) and not static:
            _keys(d, {"name", "maxSize"}, at)
            dims.append(_name(d.get("name"), f"{at}.name"))
        elif isinstance(d, str) and not static:
            dims.append(_name(d, at))
        elif isinstance(d, int) and not isinstance(d, bool) and d >= 1:
            dims.append(d)
        else:
            kind = "a positive integer" if static else "a positive integer or {\"name\", \"maxSize\"}"
            raise _err(at, f"expected {kind}, got {show(d)}")
    return dims


def parse(obj: object, limits: Limits | None = None) -> GraphDecl:
    """The declaration form of a webnn-graph-json object (structure only; lowering checks the rest)."""
    top = _dict(obj, "graph")
    _keys(top, _TOP_KEYS, "graph")
    if top.get("format", "webnn-graph-json") != "webnn-graph-json":
        raise _err("format", f"expected 'webnn-graph-json', got {show(top['format'])}")
    if top.get("version", 1) not in (1, 2):
        raise _err("version", f"unsupported version {show(top['version'])} (1 and 2 are known)")
    max_nodes = int(getattr(limits, "max_nodes", 100_000))
    max_decls = int(getattr(limits, "max_tensors", 1_000_000))
    nodes = _list(top.get("nodes", []), "nodes")
    if len(nodes) > max_nodes:
        raise LimitExceeded(f"nodes: graph has {len(nodes)} nodes, more than the limit of {max_nodes}")
    inputs = _dict(top.get("inputs", {}), "inputs")
    consts = _dict(top.get("consts", {}), "consts")
    if len(inputs) + len(consts) > max_decls:
        raise LimitExceeded(f"graph declares {len(inputs) + len(consts)} inputs and constants, "
                            f"more than the limit of {max_decls}")
    name = top.get("name") or "webnn"
    g = GraphDecl(name=name if isinstance(name, str) else "webnn")

    for key, desc in inputs.items():
        where = f"inputs[{show(key)}]"
        _name(key, where)
        desc = _dict(desc, where)
        _keys(desc, {"dataType", "shape", "label"}, where)
        g.inputs.append(InputDecl(key, _dtype(desc.get("dataType"), f"{where}.dataType"),
                                  _shape(desc.get("shape"), f"{where}.shape", static=False), where))

    for key, desc in consts.items():
        where = f"consts[{show(key)}]"
        _name(key, where)
        desc = _dict(desc, where)
        _keys(desc, {"dataType", "shape", "init", "label"}, where)
        dtype = _dtype(desc.get("dataType"), f"{where}.dataType")
        dims = _static_shape(desc.get("shape"), f"{where}.shape")
        label = _name(desc["label"], f"{where}.label") if "label" in desc else key  # the explainer's late binding
        init = _dict(desc.get("init", {"kind": "weights", "ref": label}), f"{where}.init")
        kind = init.get("kind")
        if kind == "weights":
            _keys(init, {"kind", "ref"}, f"{where}.init")
            value: Any = init.get("ref", key)
        elif kind == "scalar":
            _keys(init, {"kind", "value"}, f"{where}.init")
            value = init.get("value")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _err(f"{where}.init.value", f"expected a number, got {show(value)}")
        elif kind in ("inlineBytes", "bytes"):
            _keys(init, {"kind", "bytes"}, f"{where}.init")
            raw = _list(init.get("bytes"), f"{where}.init.bytes")
            if not all(type(b) is int and 0 <= b < 256 for b in raw):
                raise _err(f"{where}.init.bytes", "expected integers 0..255")
            kind, value = "bytes", bytes(raw)
        else:
            raise _err(f"{where}.init.kind", f"expected 'weights', 'scalar' or 'inlineBytes', got {show(kind)}")
        g.consts.append(ConstDecl(key, dtype, dims, kind, value, where))

    for k, node in enumerate(nodes):
        where = f"nodes[{k}]"
        node = _dict(node, where)
        _keys(node, {"id", "op", "inputs", "options", "outputs"}, where)
        node_id = _name(node.get("id"), f"{where}.id")
        where = f"nodes[{k}] ({show(node_id)})"
        op = node.get("op")
        if not isinstance(op, str):
            raise _err(where, f"expected an operator name in 'op', got {show(op)}")
        ins = [_name(i, f"{where}.inputs[{j}]") for j, i in enumerate(_list(node.get("inputs", []), f"{where}.inputs"))]
        options = _dict(node.get("options", {}), f"{where}.options")
        outs = node.get("outputs")
        outs = [node_id] if outs is None else [_name(o, f"{where}.outputs") for o in _list(outs, f"{where}.outputs")]
        if not outs:
            raise _err(where, "a node needs at least one output")
        g.nodes.append(NodeDecl(op, ins, dict(options), outs, where))

    outputs = top.get("outputs")
    if isinstance(outputs, list):  # lenient: a list of operand names
        g.outputs = [(_name(o, f"outputs[{j}]"), o, f"outputs[{j}]") for j, o in enumerate(outputs)]
    else:
        for key, ref in _dict(outputs, "outputs").items():
            where = f"outputs[{show(key)}]"
            g.outputs.append((_name(key, where), _name(ref, where), where))
    return g


def to_onnx(obj: object, limits: Limits | None = None) -> onnx.ModelProto:
    """The weightless ONNX model of a webnn-graph-json object; GraphError with the JSON path on any fault."""
    if limits is None:
        limits = Limits()
    return lower(parse(obj, limits), limits)
