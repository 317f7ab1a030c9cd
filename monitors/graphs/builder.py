"""A Python mirror of WebNN's MLGraphBuilder, for apps that build graphs in code.

    b = GraphBuilder()
    x = b.input("x", {"dataType": "float32", "shape": [1, 3, 224, 224]})
    w = b.constant({"dataType": "float32", "shape": [32, 3, 3, 3]}, label="conv1.weight")
    y = b.relu(b.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1]))
    graph = b.build({"out": y})          # a monitors.graphs.graph.Graph, every shape inferred
    model = b.to_onnx({"out": y})        # or just the weightless ONNX model

Constants are weightless (a descriptor and a label); small values may be
given (`b.constant(0.5)`, `b.constant("float32", 0.5)`, or a descriptor with a
short list). Every WebNN operator in `monitors.graphs.webnn_ops.OPS` is a method
taking operands, then its positional arguments, then options as keywords or
as a trailing dict, exactly as in WebNN: `b.concat([a, c], 1)`,
`b.split(x, 2, axis=1)` (a list of operands), `b.reshape(x, [1, -1])`.
Each call is checked as it is made, like MLGraphBuilder, and the same
lowering serves the text and JSON formats, so all three agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from monitors.errors import GraphError
from monitors.graphs.limits import Limits
from monitors.graphs.rebind import lower_and_bind, resized
from monitors.graphs.shapes import bind_and_infer
from monitors.graphs.webnn_ops import (
    MAX_INLINE_ELEMENTS,
    OPS,
    ConstDecl,
    GraphDecl,
    InputDecl,
    Lowering,
    NodeDecl,
    assemble,
    bind,
    check_name,
    parse_dtype,
    show,
)

if TYPE_CHECKING:
    from monitors.graphs.graph import Graph, InputSpec


@dataclass(frozen=True, eq=False)
class Operand:
    """An MLOperand: a name in one builder's graph, with its data type and shape."""

    name: str
    builder: GraphBuilder

    @property
    def dataType(self) -> str:
        return self.builder._L.info[self.name].dtype

    @property
    def shape(self) -> list[int | str | None]:
        return list(self.builder._L.info[self.name].dims)

    def __repr__(self) -> str:
        return f"Operand({self.name!r}, {self.dataType}, {self.shape})"


class GraphBuilder:
    """Builds a WebNN graph in code; `build()` gives the estimator's Graph."""

    def __init__(self, name: str = "webnn", limits: Limits | None = None) -> None:
        if limits is None:
            limits = Limits()
        self.name = name
        self.limits = limits
        self._L = Lowering(limits)
        self._decl = GraphDecl(name)  # what was built, to build again where input descriptors resize it
        self._calls = 0

    # graph inputs and constants ---------------------------------------------

    def input(self, name: str, descriptor: Mapping[str, Any]) -> Operand:
        """A graph input; a dimension given as a string stays symbolic (bound at build)."""
        check_name(name, "input", "input name")
        dtype, dims = self._descriptor(descriptor, f"input '{name}'", static=False)
        decl = InputDecl(name, dtype, dims, f"input '{name}'")
        self._L.declare_input(decl)
        self._decl.inputs.append(decl)
        return Operand(name, self)

    def constant(self, *args: Any, label: str | None = None) -> Operand:
        """A constant: `(descriptor)` weightless, `(descriptor, values)`, `(value)` or `(dataType, value)`."""
        if len(args) == 1 and isinstance(args[0], Mapping):
            desc, values = args[0], None
        elif len(args) == 2 and isinstance(args[0], Mapping):
            desc, values = args
        elif len(args) == 1 and _number(args[0]):
            desc, values = {"dataType": "float32", "shape": []}, args[0]
        elif len(args) == 2 and isinstance(args[0], str) and _number(args[1]):
            desc, values = {"dataType": args[0], "shape": []}, args[1]
        else:
            raise GraphError("constant takes (descriptor), (descriptor, values), (value) or (dataType, value)")
        if label is None:  # the explainer's weightless constant: {shape, dataType, label}
            label = desc.get("label")
        if label is not None:
            check_name(label, "constant", "label")
        name = self._name(label or "constant")
        self._calls += 1
        where = f"constant #{self._calls}"
        dtype, dims = self._descriptor(desc, where, static=True)
        size = math.prod(dims)
        if values is None:
            decl = ConstDecl(name, dtype, dims, "weights", label or name, where)
        elif _number(values):
            decl = ConstDecl(name, dtype, dims, "scalar", values, where)
        else:
            try:
                flat = np.asarray(values).reshape(-1)
            except (ValueError, TypeError):
                raise GraphError(f"{where}: values are not a rectangular array of numbers") from None
            if flat.size != size:
                raise GraphError(f"{where}: {flat.size} values given, shape {dims} needs {size}")
            if size > MAX_INLINE_ELEMENTS:
                raise GraphError(f"{where}: more than {MAX_INLINE_ELEMENTS} values; give a descriptor only")
            decl = ConstDecl(name, dtype, dims, "values", flat.tolist(), where)
        self._L.declare_const(decl)
        self._decl.consts.append(decl)
        return Operand(name, self)

    # operators ------------------------------------------------------------------

    def __getattr__(self, op: str) -> Any:
        if op.startswith("_") or op not in OPS:
            raise AttributeError(f"GraphBuilder has no operator '{op}'")

        def call(*args: Any, **options: Any) -> Operand | list[Operand]:
            return self._call(op, list(args), options)

        call.__name__ = op
        return call

    def _call(self, op: str, args: list[Any], options: dict[str, Any]) -> Operand | list[Operand]:
        spec = OPS[op]
        self._calls += 1
        where = f"{op} #{self._calls}"
        if args and isinstance(args[-1], Mapping):  # WebNN style: options as a trailing dict
            options = {**args.pop(), **options}
        inputs: list[str] = []
        positional = list(spec.positional)
        for arg in args:
            if isinstance(arg, Operand):
                inputs.append(self._own(arg, where))
            elif isinstance(arg, (list, tuple)) and arg and all(isinstance(a, Operand) for a in arg):
                inputs.extend(self._own(a, where) for a in arg)
            elif positional:
                options.setdefault(positional.pop(0), _plain(arg))
            else:
                raise GraphError(f"{where}: {op}: unexpected argument {show(arg)}")
        opts = {k: (self._own(v, where) if isinstance(v, Operand) else _plain(v)) for k, v in options.items()}
        label = opts.get("label")
        outs = [self._name(check_name(label, where, "label") if isinstance(label, str) else op)]
        if spec.multi_output:
            splits = opts.get("splits")
            count = len(splits) if isinstance(splits, list) else splits if isinstance(splits, int) else 1
            if not isinstance(count, int) or not 1 <= count <= 4096:
                raise GraphError(f"{where}: {op}: splits must be a count or a list of sizes")
            outs = [self._name(f"{outs[0]}.{k}") for k in range(count)]
        node = NodeDecl(op, inputs, opts, outs, where)
        call = bind(node)
        for o in outs:
            self._L.claim(o, where)
        spec.lower(self._L, call)
        self._decl.nodes.append(node)
        result = [Operand(o, self) for o in outs]
        return result if spec.multi_output else result[0]

    # building ---------------------------------------------------------------------

    def to_onnx(self, outputs: Mapping[str, Operand]) -> onnx.ModelProto:
        """The weightless ONNX model computing `outputs` (name -> operand)."""
        if not isinstance(outputs, Mapping) or not outputs:
            raise GraphError("build needs at least one named output")
        outs = [(check_name(k, "build", "output name"), self._own(v, f"output '{k}'"), f"output '{k}'")
                for k, v in outputs.items()]
        return assemble(self._L, self.name, outs)

    def build(self, outputs: Mapping[str, Operand], inputs: Mapping[str, InputSpec] | None = None) -> Graph:
        """The estimator's Graph: weightless ONNX with every shape inferred, symbols bound from `inputs`; an
        input that `inputs` gives other sizes than it was built with is built again at those sizes."""
        model = self.to_onnx(outputs)
        if not resized(self._decl, inputs or {})[1]:
            return bind_and_infer(model, inputs, self.limits, name=self.name)
        outs = [(k, v.name, f"output '{k}'") for k, v in outputs.items()]
        return lower_and_bind(GraphDecl(self.name, self._decl.inputs, self._decl.consts, self._decl.nodes, outs),
                              inputs, self.limits, self.name)

    # helpers ----------------------------------------------------------------------

    def _own(self, operand: Any, where: str) -> str:
        if not isinstance(operand, Operand) or operand.builder is not self:
            raise GraphError(f"{where}: operand {show(operand)} does not belong to this builder")
        return operand.name

    def _name(self, base: str) -> str:
        """A fresh operand name: the label itself when free, else label_2, label_3, ..."""
        name, k = base, 1
        while self._L.is_used(name):
            k += 1
            name = f"{base}_{k}"
        return name

    def _descriptor(self, desc: Any, where: str, static: bool) -> tuple[str, list]:
        if not isinstance(desc, Mapping):
            raise GraphError(f"{where}: a descriptor is {{'dataType': ..., 'shape': [...]}}")
        unknown = set(desc) - {"dataType", "shape", "dimensions", "type", "label"}
        if unknown:
            raise GraphError(f"{where}: unknown descriptor key '{sorted(unknown)[0]}'")
        if "label" in desc:
            check_name(desc["label"], where, "label")
        try:
            dtype = parse_dtype(desc.get("dataType", desc.get("type")))
        except ValueError as e:
            raise GraphError(f"{where}: {e}") from None
        dims = list(desc.get("shape", desc.get("dimensions", [])))
        for d in dims:
            ok = (isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1) or (
                isinstance(d, str) and d and not static)
            if not ok:
                raise GraphError(f"{where}: bad dimension {show(d)} in shape {show(dims)}")
        return dtype, [d if isinstance(d, str) else int(d) for d in dims]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool)


def _plain(v: Any) -> Any:
    """numpy scalars and tuples as the plain values the option checks expect."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    return v
