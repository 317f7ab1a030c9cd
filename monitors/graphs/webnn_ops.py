"""WebNN graph -> the ONNX a WebNN-on-onnxruntime backend would run.

Shared by the three WebNN front ends (the `.webnn` text, webnn-graph-json and
the Python `GraphBuilder`), so that all three agree: each parses into the same
small declaration form (`GraphDecl`), and `lower()` turns that into a
weightless ONNX model.

Lowering tracks every operand's WebNN shape (the spec's output-shape rules),
because several mappings need it (layouts, default axes, absent scale/bias)
and because a wrong graph should fail here with its position, not later in
onnxruntime. Dimensions are ints, a symbol name (a dynamic input dimension),
or None (computed from a symbol, unknown until the caller binds inputs).

Every error is one `GraphError` line that starts with the node's position
("line 3:14" for text, "nodes[2]" for JSON, "conv2d #3" for the builder).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from monitors.errors import GraphError, LimitExceeded
from monitors.graphs.graph import ABSENT_LOCATION
from monitors.graphs.limits import Limits

OPSET = 18
IR_VERSION = 9  # ONNX 1.13+; opset 18 needs it, onnxruntime 1.31 reads up to 13

# WebNN MLOperandDataType -> ONNX element type. int4/uint4 are refused: ONNX
# has them from opset 21 only, and onnxruntime's 4-bit kernels are few.
DTYPES: dict[str, int] = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int32": TensorProto.INT32,
    "uint32": TensorProto.UINT32,
    "int64": TensorProto.INT64,
    "uint64": TensorProto.UINT64,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
}
# ONNX comparisons yield bool; kept as an internal operand type.
_ALL_DTYPES = {**DTYPES, "bool": TensorProto.BOOL}
# The text format's short names (webnn-graph's `f32[1, 3]`).
SHORT_DTYPES: dict[str, str] = {
    "f32": "float32", "f16": "float16", "i32": "int32", "u32": "uint32",
    "i64": "int64", "u64": "uint64", "i8": "int8", "u8": "uint8",
}
_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "uint32": np.uint32,
              "int64": np.int64, "uint64": np.uint64, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}
_FLOATS = {"float32", "float16"}

# Scalar/@bytes constants larger than this many elements stay weightless.
MAX_INLINE_ELEMENTS = 1 << 16

Dim = int | str | None


def parse_dtype(name: Any) -> str:
    """A WebNN data type name (long or short form) -> the long form; ValueError otherwise."""
    if isinstance(name, str):
        if name in DTYPES:
            return name
        if name in SHORT_DTYPES:
            return SHORT_DTYPES[name]
        if name in ("int4", "uint4", "i4", "u4"):
            raise ValueError(f"data type '{name}' is not supported (4-bit types need ONNX opset 21)")
    raise ValueError(f"unknown data type {name!r}; expected one of {', '.join(DTYPES)}")


# ---------------------------------------------------------------------------
# The declaration form every front end produces.


@dataclass
class InputDecl:
    name: str
    dtype: str
    dims: list[int | str]  # str: a symbolic dimension, bound by the caller
    where: str


@dataclass
class ConstDecl:
    name: str
    dtype: str
    dims: list[int]
    kind: str  # "weights" | "scalar" | "bytes" | "values"
    value: Any  # weights: the ref; scalar: a number; bytes: bytes; values: a flat list of numbers
    where: str


@dataclass
class NodeDecl:
    op: str
    inputs: list[str]
    options: dict[str, Any]
    outputs: list[str]
    where: str


@dataclass
class GraphDecl:
    name: str = "webnn"
    inputs: list[InputDecl] = field(default_factory=list)
    consts: list[ConstDecl] = field(default_factory=list)
    nodes: list[NodeDecl] = field(default_factory=list)
    outputs: list[tuple[str, str, str]] = field(default_factory=list)  # (output name, operand, where)


def fail(where: str, message: str) -> GraphError:
    return GraphError(f"{where}: {message}" if where else message)


MAX_NAME_CHARS = 4096


def check_name(name: Any, where: str, what: str = "name") -> str:
    """An operand, input or output name: a non-empty single-line string of bounded length."""
    if not isinstance(name, str) or not name:
        raise fail(where, f"expected a non-empty {what}, got {show(name)}")
    if len(name) > MAX_NAME_CHARS:
        raise fail(where, f"{what} longer than {MAX_NAME_CHARS} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise fail(where, f"{what} {show(name)} holds control characters")
    return name


# ---------------------------------------------------------------------------
# Option values: each validator returns the normalised value or raises ValueError.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise ValueError(f"expected an integer, got {_show(v)}")
    if abs(v) > 2**40:  # far beyond any dimension; keeps sums and products of options inside int64
        raise ValueError(f"integer {v} is out of range")
    return v


def _uint(v: Any) -> int:
    v = _int(v)
    if v < 0:
        raise ValueError(f"expected a non-negative integer, got {v}")
    return v


def _pos(v: Any) -> int:
    v = _int(v)
    if v < 1:
        raise ValueError(f"expected a positive integer, got {v}")
    return v


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {_show(v)}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError("expected a finite number")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {_show(v)}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {_show(v)}")
    return v


def _list(item: Callable[[Any], Any], n: int | None = None) -> Callable[[Any], list]:
    def check(v: Any) -> list:
        if not isinstance(v, list):
            raise ValueError(f"expected a list, got {_show(v)}")
        if n is not None and len(v) != n:
            raise ValueError(f"expected {n} values, got {len(v)}")
        return [item(x) for x in v]
    return check


def _enum(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(repr(c) for c in choices)}, got {_show(v)}")
        return v
    return check


def _dtype_opt(v: Any) -> str:
    return parse_dtype(v)


def _int_or_ints(v: Any) -> int | list[int]:
    return _list(_pos)(v) if isinstance(v, list) else _pos(v)


def _shape_dim(v: Any) -> int | str:
    """A reshape/expand target dimension: a positive int, -1, or a dynamic dim."""
    if isinstance(v, dict):
        if set(v) - {"name", "maxSize"} or not isinstance(v.get("name"), str):
            raise ValueError("a dynamic dimension is {\"name\": ..., \"maxSize\": ...}")
        return v["name"]
    if isinstance(v, str):
        return v
    v = _int(v)
    if v == 0 or v < -1:
        raise ValueError(f"dimension {v} is not allowed")
    return v


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 30, 30, 6, 4


def show(v: Any) -> str:
    """A short repr for error lines, safe for huge or deeply nested hostile values."""
    return _REPR.repr(v)


_show = show


OPERAND = object()  # marks an option whose value names an operand (bias=b)


def _operand_opt(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected an operand name, got {_show(v)}")
    return v


# ---------------------------------------------------------------------------
# Shapes and the lowering context.


@dataclass(frozen=True)
class Info:
    dtype: str
    dims: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)


def _known(*dims: Dim) -> bool:
    return all(isinstance(d, int) for d in dims)


def _ints(dims: Sequence[Dim]) -> list[int] | None:
    """The dimensions as ints when every one is known, else None (the typed form of `_known(*dims)`)."""
    ints = [d for d in dims if isinstance(d, int)]
    return ints if len(ints) == len(dims) else None


def _broadcast(where: str, *shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        ints = {d for d in dims if isinstance(d, int) and d != 1}
        if len(ints) > 1:
            raise fail(where, "shapes " + " and ".join(_fmt(s) for s in shapes) + " do not broadcast")
        if ints:
            out.append(ints.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            syms = {d for d in dims if d != 1}
            out.append(syms.pop() if len(syms) == 1 else None)
    return tuple(out)


def _fmt(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _window_out(size: Dim, k: Dim, s: int, d: int, pb: int, pe: int, ceil: bool, where: str, what: str) -> Dim:
    if not (isinstance(size, int) and isinstance(k, int)):
        return None
    span = size + pb + pe - (d * (k - 1) + 1)
    if span < 0:
        raise fail(where, f"{what}: window {k} (dilation {d}) is larger than the padded input {size + pb + pe}")
    return (-(-span // s) if ceil else span // s) + 1


class Lowering:
    """Accumulates ONNX nodes and initializers, and each operand's shape."""

    def __init__(self, limits: Limits | None) -> None:
        self.max_nodes = int(getattr(limits, "max_nodes", 100_000))
        self.max_rank = int(getattr(limits, "max_rank", 8))
        self.max_dim = int(getattr(limits, "max_dim", 2**31 - 1))
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.info: dict[str, Info] = {}
        self.where: dict[str, str] = {}  # operand name -> where it was defined
        self._names: set[str] = set()
        self._cache: dict[tuple, str] = {}
        self._counter = 0

    # names ---------------------------------------------------------------

    def claim(self, name: str, where: str) -> None:
        if name in self._names:
            first = self.where.get(name)
            raise fail(where, f"'{name}' is already defined" + (f" (at {first})" if first else ""))
        self._names.add(name)
        self.where[name] = where

    def is_used(self, name: str) -> bool:
        return name in self._names

    def fresh(self, base: str) -> str:
        while True:
            self._counter += 1
            name = f"{base}::{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    # checks -------------------------------------------------------------

    def check_dims(self, dims: Sequence[Dim], where: str, what: str) -> None:
        if len(dims) > self.max_rank:
            raise LimitExceeded(f"{where}: {what} has rank {len(dims)}, more than the limit of {self.max_rank}")
        for d in dims:
            if isinstance(d, int) and (d < 1 or d > self.max_dim):
                if d < 1:
                    raise fail(where, f"{what} has dimension {d}; dimensions must be positive")
                raise LimitExceeded(f"{where}: {what} has dimension {d}, more than the limit of {self.max_dim}")

    # emission -----------------------------------------------------------

    def add(self, op_type: str, inputs: Sequence[str], info: Info | Sequence[Info], where: str,
            out: str | Sequence[str] | None = None, **attrs: Any) -> str:
        """Emit one ONNX node; returns its (first) output name."""
        if len(self.nodes) >= self.max_nodes:
            raise LimitExceeded(f"{where}: graph has more than {self.max_nodes} nodes (limit max_nodes)")
        infos = [info] if isinstance(info, Info) else list(info)
        if out is None:
            outs = [self.fresh(op_type.lower()) for _ in infos]
        elif isinstance(out, str):
            outs = [out]
        else:
            outs = list(out)
        for name, i in zip(outs, infos, strict=True):
            self.check_dims(i.dims, where, f"'{name}'")
            self.info[name] = i
        node = helper.make_node(op_type, list(inputs), outs, name=f"{op_type}_{len(self.nodes)}",
                                **{k: v for k, v in attrs.items() if v is not None})
        self.nodes.append(node)
        return outs[0]

    def finish(self, produced: str, target: str) -> None:
        """Give the last node's output its WebNN name (or alias it when that is impossible)."""
        if produced == target:
            return
        last = self.nodes[-1] if self.nodes else None
        # The last node's single output has no consumer yet: nodes only read what came before.
        if last is not None and list(last.output) == [produced]:
            last.output[0] = target
            self.info[target] = self.info.pop(produced)
        else:
            self.add("Identity", [produced], self.info[produced], self.where.get(target, ""), out=target)

    def initializer(self, tensor: TensorProto, info: Info) -> str:
        self.initializers.append(tensor)
        self.info[tensor.name] = info
        return tensor.name

    def absent(self, name: str, dtype: str, dims: Sequence[int]) -> str:
        """A weightless initializer: dims and type only, its bytes marked absent."""
        t = TensorProto(name=name, data_type=_ALL_DTYPES[dtype], dims=list(dims))
        t.data_location = TensorProto.EXTERNAL
        entry = t.external_data.add()
        entry.key, entry.value = "location", ABSENT_LOCATION
        return self.initializer(t, Info(dtype, tuple(dims)))

    def values(self, name: str, dtype: str, dims: Sequence[int], array: np.ndarray) -> str:
        t = onnx.numpy_helper.from_array(np.asarray(array, dtype=_NP_DTYPES[dtype]).reshape(list(dims)), name)
        return self.initializer(t, Info(dtype, tuple(dims)))

    def i64(self, values: Sequence[int]) -> str:
        """A small int64 vector constant (shapes, axes, pads), shared by value."""
        key = ("i64", tuple(values))
        if key not in self._cache:
            self._cache[key] = self.values(self.fresh("i64"), "int64", [len(values)], np.array(values, np.int64))
        return self._cache[key]

    def scalar(self, value: float | int, dtype: str, where: str = "") -> str:
        """A 0-d constant of `dtype` (clamp bounds, epsilon, pad value), shared by value."""
        key = ("scalar", dtype, float(value))
        if key not in self._cache:
            fitted = fit_value(value, dtype, where)
            self._cache[key] = self.values(self.fresh(f"{dtype}_scalar"), dtype, [], np.array(fitted))
        return self._cache[key]

    def declare_input(self, inp: InputDecl) -> None:
        self.claim(inp.name, inp.where)
        self.check_dims(inp.dims, inp.where, f"input '{inp.name}'")
        self.info[inp.name] = Info(inp.dtype, tuple(inp.dims))
        self.inputs.append(helper.make_tensor_value_info(inp.name, DTYPES[inp.dtype], list(inp.dims)))

    def declare_const(self, const: ConstDecl) -> None:
        self.claim(const.name, const.where)
        self.check_dims(const.dims, const.where, f"constant '{const.name}'")
        _constant(self, const)

    def transpose(self, x: str, perm: Sequence[int], where: str, out: str | None = None) -> str:
        i = self.info[x]
        return self.add("Transpose", [x], Info(i.dtype, tuple(i.dims[p] for p in perm)), where,
                        out=out, perm=list(perm))


# ---------------------------------------------------------------------------
# One call of an operator, with its operands bound and options validated.


@dataclass
class Call:
    op: str
    x: dict[str, str]              # operand slot -> tensor name (an absent optional operand has no entry)
    rest: list[str]                # variadic operands (concat)
    opt: dict[str, Any]
    out: list[str]
    where: str

    def info(self, L: Lowering, slot: str) -> Info:
        return L.info[self.x[slot]]

    def err(self, message: str) -> GraphError:
        return fail(self.where, f"{self.op}: {message}")


Lower = Callable[[Lowering, Call], None]


@dataclass(frozen=True)
class OpSpec:
    operands: tuple[str, ...]                  # "?name": optional, "*name": variadic
    options: dict[str, Callable[[Any], Any]]   # validators; OPERAND-valued ones via operand_options
    lower: Lower
    positional: tuple[str, ...] = ()           # options that may also be given positionally
    operand_options: tuple[str, ...] = ()      # options naming an operand (bias=b)
    multi_output: bool = False


OPS: dict[str, OpSpec] = {}


def _op(names: str | Iterable[str], operands: tuple[str, ...], lower: Lower, options: dict | None = None,
        positional: tuple[str, ...] = (), operand_options: tuple[str, ...] = (), multi_output: bool = False) -> None:
    opts = {"label": _str, **(options or {})}
    for o in operand_options:
        opts[o] = _operand_opt
    for name in [names] if isinstance(names, str) else names:
        OPS[name] = OpSpec(operands, opts, lower, positional, operand_options, multi_output)


# --- elementwise ------------------------------------------------------------

_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min", "pow": "Pow"}
_COMPARE = {"equal": "Equal", "greater": "Greater", "greaterOrEqual": "GreaterOrEqual", "lesser": "Less",
            "lesserOrEqual": "LessOrEqual", "notEqual": "Equal"}
_LOGICAL = {"logicalAnd": "And", "logicalOr": "Or", "logicalXor": "Xor"}


def _binary(L: Lowering, c: Call) -> None:
    a, b = c.info(L, "a"), c.info(L, "b")
    if a.dtype != b.dtype:
        raise c.err(f"operand types differ ({a.dtype} and {b.dtype})")
    dims = _broadcast(c.where, a.dims, b.dims)
    ins = [c.x["a"], c.x["b"]]
    if c.op in _BINARY:
        L.add(_BINARY[c.op], ins, Info(a.dtype, dims), c.where, out=c.out[0])
    elif c.op == "notEqual":
        eq = L.add("Equal", ins, Info("bool", dims), c.where)
        L.add("Not", [eq], Info("bool", dims), c.where, out=c.out[0])
    elif c.op in _COMPARE:
        L.add(_COMPARE[c.op], ins, Info("bool", dims), c.where, out=c.out[0])
    else:
        L.add(_LOGICAL[c.op], [_as_bool(L, x, c.where) for x in ins], Info("bool", dims), c.where, out=c.out[0])


def _as_bool(L: Lowering, x: str, where: str) -> str:
    i = L.info[x]
    return x if i.dtype == "bool" else L.add("Cast", [x], Info("bool", i.dims), where, to=TensorProto.BOOL)


_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "erf": "Erf", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "abs": "Abs", "neg": "Neg", "identity": "Identity", "hardSwish": "HardSwish",
          "softplus": "Softplus", "softsign": "Softsign", "ceil": "Ceil", "floor": "Floor", "sin": "Sin",
          "cos": "Cos", "tan": "Tan", "reciprocal": "Reciprocal", "sign": "Sign", "roundEven": "Round",
          "elu": "Elu", "leakyRelu": "LeakyRelu", "hardSigmoid": "HardSigmoid"}
_FLOAT_ONLY = (set(_UNARY) | {"gelu"}) - {"relu", "abs", "neg", "identity", "sign"}


def _unary_to(L: Lowering, op: str, x: str, opt: dict, where: str, out: str | None) -> str:
    """One WebNN unary op on x (also used for conv2d's fused `activation`)."""
    i = L.info[x]
    if op in _FLOAT_ONLY and i.dtype not in _FLOATS:
        raise fail(where, f"{op}: needs a float operand, got {i.dtype}")
    if op == "gelu":
        # 0.5 * x * (1 + erf(x / sqrt(2))): the pattern onnxruntime fuses into one Gelu kernel.
        d = L.add("Div", [x, L.scalar(math.sqrt(2.0), i.dtype)], i, where)
        e = L.add("Erf", [d], i, where)
        a = L.add("Add", [e, L.scalar(1.0, i.dtype)], i, where)
        m = L.add("Mul", [x, a], i, where)
        return L.add("Mul", [m, L.scalar(0.5, i.dtype)], i, where, out=out)
    if op == "clamp":
        lo, hi = opt.get("minValue"), opt.get("maxValue")
        if lo is not None and hi is not None and lo > hi:
            raise fail(where, f"clamp: minValue {lo} is above maxValue {hi}")
        ins = [x, L.scalar(lo, i.dtype, f"{where}: clamp: minValue") if lo is not None else "",
               L.scalar(hi, i.dtype, f"{where}: clamp: maxValue") if hi is not None else ""]
        while ins[-1] == "":
            ins.pop()
        return L.add("Clip", ins, i, where, out=out)
    if op == "linear":
        m = L.add("Mul", [x, L.scalar(opt.get("alpha", 1.0), i.dtype, f"{where}: linear: alpha")], i, where)
        return L.add("Add", [m, L.scalar(opt.get("beta", 0.0), i.dtype, f"{where}: linear: beta")], i, where, out=out)
    attrs: dict[str, Any] = {}
    if op == "elu":
        attrs["alpha"] = opt.get("alpha", 1.0)
    elif op == "leakyRelu":
        attrs["alpha"] = opt.get("alpha", 0.01)
    elif op == "hardSigmoid":
        attrs["alpha"], attrs["beta"] = opt.get("alpha", 0.2), opt.get("beta", 0.5)
    return L.add(_UNARY[op], [x], i, where, out=out, **attrs)


def _unary(L: Lowering, c: Call) -> None:
    _unary_to(L, c.op, c.x["input"], c.opt, c.where, c.out[0])


ACTIVATIONS = ("relu", "sigmoid", "tanh", "gelu", "hardSwish", "softplus", "softsign", "elu", "leakyRelu",
               "hardSigmoid", "identity")


def _activation(L: Lowering, c: Call, y: str) -> str:
    act = c.opt.get("activation")
    return y if act is None else _unary_to(L, act, y, {}, c.where, None)


def _cast(L: Lowering, c: Call) -> None:
    if "type" not in c.opt:
        raise c.err("missing the target data type (type=...)")
    i = c.info(L, "input")
    L.add("Cast", [c.x["input"]], Info(c.opt["type"], i.dims), c.where, out=c.out[0], to=DTYPES[c.opt["type"]])


def _prelu(L: Lowering, c: Call) -> None:
    i, s = c.info(L, "input"), c.info(L, "slope")
    _broadcast(c.where, i.dims, s.dims)
    L.add("PRelu", [c.x["input"], c.x["slope"]], i, c.where, out=c.out[0])


def _where(L: Lowering, c: Call) -> None:
    cond, t, f = c.info(L, "condition"), c.info(L, "trueValue"), c.info(L, "falseValue")
    if t.dtype != f.dtype:
        raise c.err(f"trueValue and falseValue types differ ({t.dtype} and {f.dtype})")
    dims = _broadcast(c.where, cond.dims, t.dims, f.dims)
    L.add("Where", [_as_bool(L, c.x["condition"], c.where), c.x["trueValue"], c.x["falseValue"]],
          Info(t.dtype, dims), c.where, out=c.out[0])


def _logical_not(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    L.add("Not", [_as_bool(L, c.x["input"], c.where)], Info("bool", i.dims), c.where, out=c.out[0])


_op(list(_BINARY) + list(_COMPARE) + list(_LOGICAL), ("a", "b"), _binary)
_op("logicalNot", ("input",), _logical_not)
_op([u for u in _UNARY if u not in ("elu", "leakyRelu", "hardSigmoid")] + ["gelu"], ("input",), _unary)
_op("elu", ("input",), _unary, {"alpha": _float})
_op("leakyRelu", ("input",), _unary, {"alpha": _float})
_op("hardSigmoid", ("input",), _unary, {"alpha": _float, "beta": _float})
_op("linear", ("input",), _unary, {"alpha": _float, "beta": _float})
_op("clamp", ("input",), _unary, {"minValue": _float, "maxValue": _float})
_op("cast", ("input",), _cast, {"type": _dtype_opt, "dataType": _dtype_opt}, positional=("type",))
_op("prelu", ("input", "slope"), _prelu)
_op("where", ("condition", "trueValue", "falseValue"), _where)

# --- convolution and pooling ------------------------------------------------

_NHWC_TO_NCHW, _NCHW_TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
_CONV_FILTER_TO_OIHW = {"hwio": [3, 2, 0, 1], "ohwi": [0, 3, 1, 2], "ihwo": [3, 0, 1, 2]}
_CONVT_FILTER_TO_IOHW = {"hwoi": [3, 2, 0, 1], "ohwi": [3, 0, 1, 2]}
_AUTO_PAD = {"same-upper": "SAME_UPPER", "same-lower": "SAME_LOWER"}


def _need_rank(c: Call, info: Info, rank: int, what: str) -> None:
    if info.rank != rank:
        raise c.err(f"{what} must be {rank}-D, got shape {_fmt(info.dims)}")


def _padding_attrs(c: Call, sizes: Sequence[Dim], ks: Sequence[Dim], strides: Sequence[int],
                   dil: Sequence[int], ceil: bool) -> tuple[dict, list[Dim]]:
    """ONNX pads/auto_pad for WebNN padding [bH, eH, bW, eW] or autoPad, and the output size."""
    auto = c.opt.get("autoPad", "explicit")
    if auto != "explicit":
        out: list[Dim] = [-(-s // st) if isinstance(s, int) else None for s, st in zip(sizes, strides, strict=True)]
        return {"auto_pad": _AUTO_PAD[auto]}, out
    p = c.opt.get("padding", [0, 0, 0, 0])
    out = [_window_out(sizes[i], ks[i], strides[i], dil[i], p[2 * i], p[2 * i + 1], ceil, c.where, c.op)
           for i in range(2)]
    return {"pads": [p[0], p[2], p[1], p[3]]}, out


def _conv_operands(L: Lowering, c: Call, onnx_layout: str, to_onnx: dict) -> tuple[str, str, Info, bool]:
    """A (transposed) convolution's input and filter checked and moved to ONNX's layouts
    (NCHW, and `onnx_layout` for the filter); returns them, the input's Info, and NHWC-ness."""
    x, w = c.x["input"], c.x["filter"]
    xi, wi = L.info[x], L.info[w]
    _need_rank(c, xi, 4, "input")
    _need_rank(c, wi, 4, "filter")
    if xi.dtype not in _FLOATS or wi.dtype != xi.dtype:
        raise c.err(f"input and filter must be the same float type, got {xi.dtype} and {wi.dtype}")
    nhwc = c.opt.get("inputLayout", "nchw") == "nhwc"
    layout = c.opt.get("filterLayout", onnx_layout)
    if nhwc:
        x = L.transpose(x, _NHWC_TO_NCHW, c.where)
    if layout != onnx_layout:
        w = L.transpose(w, to_onnx[layout], c.where)
    return x, w, xi, nhwc


def _conv2d(L: Lowering, c: Call) -> None:
    b = c.x.get("bias")
    x, w, xi, nhwc = _conv_operands(L, c, "oihw", _CONV_FILTER_TO_OIHW)
    n, cin, h, wd = L.info[x].dims
    o, i, kh, kw = L.info[w].dims
    groups = c.opt.get("groups", 1)
    if _known(cin, i) and cin != i * groups:
        raise c.err(f"input has {cin} channels but filter expects {i} x {groups} groups")
    if _known(o) and o % groups:
        raise c.err(f"{o} output channels are not divisible by {groups} groups")
    strides, dil = c.opt.get("strides", [1, 1]), c.opt.get("dilations", [1, 1])
    pads, (oh, ow) = _padding_attrs(c, (h, wd), (kh, kw), strides, dil, False)
    ins = [x, w]
    if b:
        _check_vector(L, c, b, "bias", xi.dtype, (o,))
        ins.append(b)
    y = L.add("Conv", ins, Info(xi.dtype, (n, o, oh, ow)), c.where, strides=strides, dilations=dil,
              group=groups, kernel_shape=[kh, kw] if _known(kh, kw) else None, **pads)
    y = _activation(L, c, y)
    if nhwc:
        y = L.transpose(y, _NCHW_TO_NHWC, c.where)
    L.finish(y, c.out[0])


def _conv_transpose2d(L: Lowering, c: Call) -> None:
    b = c.x.get("bias")
    x, w, xi, nhwc = _conv_operands(L, c, "iohw", _CONVT_FILTER_TO_IOHW)
    n, cin, h, wd = L.info[x].dims
    i, og, kh, kw = L.info[w].dims
    groups = c.opt.get("groups", 1)
    if _known(cin, i) and cin != i:
        raise c.err(f"input has {cin} channels but filter expects {i}")
    if _known(cin) and cin % groups:
        raise c.err(f"{cin} input channels are not divisible by {groups} groups")
    o = og * groups if _known(og) else None
    strides, dil = c.opt.get("strides", [1, 1]), c.opt.get("dilations", [1, 1])
    p = c.opt.get("padding", [0, 0, 0, 0])
    outpad = c.opt.get("outputPadding", [0, 0])
    attrs: dict[str, Any] = {"strides": strides, "dilations": dil, "group": groups,
                             "pads": [p[0], p[2], p[1], p[3]]}
    if c.opt.get("autoPad", "explicit") != "explicit":
        attrs = {"strides": strides, "dilations": dil, "group": groups, "auto_pad": _AUTO_PAD[c.opt["autoPad"]]}
    sizes = c.opt.get("outputSizes")
    if sizes is not None:
        for k, (s, kk) in enumerate(((h, kh), (wd, kw))):
            if isinstance(s, int) and isinstance(kk, int) and "pads" in attrs:
                base = (s - 1) * strides[k] + dil[k] * (kk - 1) + 1 - p[2 * k] - p[2 * k + 1]
                if not base <= sizes[k] < base + strides[k]:
                    raise c.err(f"outputSizes {sizes} do not fit: dimension {k} must be "
                                f"{base}..{base + strides[k] - 1}")
        attrs["output_shape"] = sizes
        oh, ow = sizes
    else:
        if any(outpad):
            attrs["output_padding"] = outpad
        dims: list[Dim] = []
        for k, (s, kk) in enumerate(((h, kh), (wd, kw))):
            if not (isinstance(s, int) and isinstance(kk, int)):
                dims.append(None)
                continue
            pb, pe = (p[2 * k], p[2 * k + 1]) if "pads" in attrs else (0, 0)
            v = (s - 1) * strides[k] + dil[k] * (kk - 1) + 1 - pb - pe + outpad[k]
            if "auto_pad" in attrs:
                v = s * strides[k]
            if v < 1:
                raise c.err(f"output size {v} is not positive")
            dims.append(v)
        oh, ow = dims
    ins = [x, w]
    if b:
        _check_vector(L, c, b, "bias", xi.dtype, (o,))
        ins.append(b)
    y = L.add("ConvTranspose", ins, Info(xi.dtype, (n, o, oh, ow)), c.where,
              kernel_shape=[kh, kw] if _known(kh, kw) else None, **attrs)
    y = _activation(L, c, y)
    if nhwc:
        y = L.transpose(y, _NCHW_TO_NHWC, c.where)
    L.finish(y, c.out[0])


_POOLS = {"averagePool2d": ("AveragePool", "GlobalAveragePool"), "maxPool2d": ("MaxPool", "GlobalMaxPool"),
          "l2Pool2d": ("LpPool", "GlobalLpPool")}


def _nchw_input(L: Lowering, c: Call) -> tuple[str, Info, bool]:
    """The 4-D `input` in ONNX's NCHW (moved from WebNN's `layout: "nhwc"`), its own Info, and NHWC-ness."""
    x = c.x["input"]
    xi = L.info[x]
    _need_rank(c, xi, 4, "input")
    nhwc = c.opt.get("layout", "nchw") == "nhwc"
    if nhwc:
        x = L.transpose(x, _NHWC_TO_NCHW, c.where)
    return x, xi, nhwc


def _pool(L: Lowering, c: Call) -> None:
    x, xi, nhwc = _nchw_input(L, c)
    n, ch, h, w = L.info[x].dims
    local, global_ = _POOLS[c.op]
    p_attrs: dict[str, Any] = {"p": 2} if c.op == "l2Pool2d" else {}
    window = c.opt.get("windowDimensions")
    shaping = {"padding", "strides", "dilations", "autoPad", "outputSizes"} & set(c.opt)
    if window is None and not shaping:
        y = L.add(global_, [x], Info(xi.dtype, (n, ch, 1, 1)), c.where, **p_attrs)
    else:
        if window is None:
            if not _known(h, w):
                raise c.err("without windowDimensions the input's spatial size must be known")
            window = [h, w]
        strides, dil = c.opt.get("strides", [1, 1]), c.opt.get("dilations", [1, 1])
        ceil = c.opt.get("roundingType", "floor") == "ceil"
        pads, (oh, ow) = _padding_attrs(c, (h, w), window, strides, dil, ceil)
        sizes = c.opt.get("outputSizes")
        if sizes is not None:
            if _known(oh, ow) and (oh, ow) != tuple(sizes):
                ceil = True
                _, (oh, ow) = _padding_attrs(c, (h, w), window, strides, dil, True)
                if (oh, ow) != tuple(sizes):
                    raise c.err(f"outputSizes {sizes} match neither floor nor ceil rounding")
            oh, ow = sizes
        if c.op == "averagePool2d" and dil != [1, 1]:
            raise c.err("dilated averagePool2d is not supported")
        extra: dict[str, Any] = {"dilations": dil} if c.op != "averagePool2d" else {}
        y = L.add(local, [x], Info(xi.dtype, (n, ch, oh, ow)), c.where, kernel_shape=window, strides=strides,
                  ceil_mode=int(ceil) if c.op != "l2Pool2d" else None, **pads, **extra, **p_attrs)
    if nhwc:
        y = L.transpose(y, _NCHW_TO_NHWC, c.where)
    L.finish(y, c.out[0])


_INTS2, _INTS4 = _list(_pos, 2), _list(_uint, 4)
_CONV_OPTS = {"padding": _INTS4, "strides": _INTS2, "dilations": _INTS2, "groups": _pos,
              "inputLayout": _enum("nchw", "nhwc"), "autoPad": _enum("explicit", "same-upper", "same-lower"),
              "activation": _enum(*ACTIVATIONS)}
_op("conv2d", ("input", "filter", "?bias"), _conv2d,
    {**_CONV_OPTS, "filterLayout": _enum("oihw", "hwio", "ohwi", "ihwo")}, operand_options=("bias",))
_op("convTranspose2d", ("input", "filter", "?bias"), _conv_transpose2d,
    {**_CONV_OPTS, "filterLayout": _enum("iohw", "hwoi", "ohwi"), "outputPadding": _list(_uint, 2),
     "outputSizes": _INTS2}, operand_options=("bias",))
_op(list(_POOLS), ("input",), _pool,
    {"windowDimensions": _INTS2, "padding": _INTS4, "strides": _INTS2, "dilations": _INTS2,
     "autoPad": _enum("explicit", "same-upper", "same-lower"), "layout": _enum("nchw", "nhwc"),
     "roundingType": _enum("floor", "ceil"), "outputSizes": _INTS2})

# --- matrix products and softmax ---------------------------------------------


def _matmul(L: Lowering, c: Call) -> None:
    a, b = c.info(L, "a"), c.info(L, "b")
    if a.dtype != b.dtype:
        raise c.err(f"operand types differ ({a.dtype} and {b.dtype})")
    if a.rank < 2 or b.rank < 2:
        raise c.err(f"operands must be at least 2-D, got {_fmt(a.dims)} and {_fmt(b.dims)}")
    if _known(a.dims[-1], b.dims[-2]) and a.dims[-1] != b.dims[-2]:
        raise c.err(f"inner dimensions differ: {_fmt(a.dims)} x {_fmt(b.dims)}")
    batch = _broadcast(c.where, a.dims[:-2], b.dims[:-2])
    L.add("MatMul", [c.x["a"], c.x["b"]], Info(a.dtype, batch + (a.dims[-2], b.dims[-1])), c.where, out=c.out[0])


def _gemm(L: Lowering, c: Call) -> None:
    a, b = c.info(L, "a"), c.info(L, "b")
    _need_rank(c, a, 2, "a")
    _need_rank(c, b, 2, "b")
    if a.dtype != b.dtype:
        raise c.err(f"operand types differ ({a.dtype} and {b.dtype})")
    ta, tb = c.opt.get("aTranspose", False), c.opt.get("bTranspose", False)
    m, k = a.dims[::-1] if ta else a.dims
    k2, n = b.dims[::-1] if tb else b.dims
    if _known(k, k2) and k != k2:
        raise c.err(f"inner dimensions differ: {k} and {k2}")
    ins = [c.x["a"], c.x["b"]]
    if c.x.get("c"):
        _broadcast(c.where, (m, n), L.info[c.x["c"]].dims)
        ins.append(c.x["c"])
    L.add("Gemm", ins, Info(a.dtype, (m, n)), c.where, out=c.out[0], alpha=c.opt.get("alpha", 1.0),
          beta=c.opt.get("beta", 1.0), transA=int(ta), transB=int(tb))


def _axis(c: Call, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise c.err(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _softmax(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    axis = _axis(c, c.opt.get("axis", i.rank - 1), i.rank)
    L.add("Softmax", [c.x["input"]], i, c.where, out=c.out[0], axis=axis)


_op("matmul", ("a", "b"), _matmul)
_op("gemm", ("a", "b", "?c"), _gemm, {"alpha": _float, "beta": _float, "aTranspose": _bool, "bTranspose": _bool},
    operand_options=("c",))
_op("softmax", ("input",), _softmax, {"axis": _int}, positional=("axis",))

# --- normalization -------------------------------------------------------------


def _channel_vector(L: Lowering, c: Call, slot: str, dtype: str, channels: Dim) -> str:
    """The given scale/bias operand, or a weightless one of `channels` values."""
    given = c.x.get(slot)
    if given:
        _check_vector(L, c, given, slot, dtype, (channels,))
        return given
    if not isinstance(channels, int):
        raise c.err(f"without {slot}, the channel dimension must be known")
    return _filled(L, f"{c.out[0]}.{slot}", dtype, [channels], 1.0 if slot == "scale" else 0.0)


def _filled(L: Lowering, base: str, dtype: str, dims: list[int], value: float) -> str:
    """WebNN's default scale (ones) or bias (zeros); weightless when too large to write out."""
    if math.prod(dims) > MAX_INLINE_ELEMENTS:
        return L.absent(L.fresh(base), dtype, dims)
    return L.values(L.fresh(base), dtype, dims, np.full(dims, value))


def _check_vector(L: Lowering, c: Call, name: str, what: str, dtype: str, dims: Sequence[Dim]) -> None:
    """An operand such as scale/bias/mean must have exactly `dims` (where known) and the input's type."""
    i = L.info[name]
    if i.dtype != dtype:
        raise c.err(f"{what} is {i.dtype}, the input is {dtype}")
    if i.rank != len(dims) or any(_known(a, b) and a != b for a, b in zip(i.dims, dims, strict=True)):
        raise c.err(f"{what} must have shape {_fmt(dims)}, got {_fmt(i.dims)}")


def _batch_norm(L: Lowering, c: Call) -> None:
    x = c.x["input"]
    xi = L.info[x]
    axis = _axis(c, c.opt.get("axis", 1), xi.rank) if xi.rank > 1 else 0
    _check_vector(L, c, c.x["mean"], "mean", xi.dtype, (xi.dims[axis],))
    _check_vector(L, c, c.x["variance"], "variance", xi.dtype, (xi.dims[axis],))
    perm = None
    if axis != 1 and xi.rank > 1:
        perm = [0, axis] + [d for d in range(1, xi.rank) if d != axis]
        x = L.transpose(x, perm, c.where)
    chans = xi.dims[axis]
    scale = _channel_vector(L, c, "scale", xi.dtype, chans)
    bias = _channel_vector(L, c, "bias", xi.dtype, chans)
    y = L.add("BatchNormalization", [x, scale, bias, c.x["mean"], c.x["variance"]], L.info[x], c.where,
              epsilon=c.opt.get("epsilon", 1e-5))
    y = _activation(L, c, y)
    if perm:
        y = L.transpose(y, list(np.argsort(perm)), c.where)
    L.finish(y, c.out[0])


def _instance_norm(L: Lowering, c: Call) -> None:
    x, xi, nhwc = _nchw_input(L, c)
    chans = L.info[x].dims[1]
    scale = _channel_vector(L, c, "scale", xi.dtype, chans)
    bias = _channel_vector(L, c, "bias", xi.dtype, chans)
    y = L.add("InstanceNormalization", [x, scale, bias], L.info[x], c.where, epsilon=c.opt.get("epsilon", 1e-5))
    if nhwc:
        y = L.transpose(y, _NCHW_TO_NHWC, c.where)
    L.finish(y, c.out[0])


def _layer_norm(L: Lowering, c: Call) -> None:
    x = c.x["input"]
    xi = L.info[x]
    axes = c.opt.get("axes", list(range(1, xi.rank)))
    axes = [_axis(c, a, xi.rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise c.err(f"axes {axes} repeat an axis")
    if not axes:
        raise c.err("empty axes are not supported")
    if axes != list(range(axes[0], xi.rank)):
        _layer_norm_decomposed(L, c, axes)
        return
    normalized = xi.dims[axes[0]:]
    for slot in ("scale", "bias"):
        if c.x.get(slot):
            _check_vector(L, c, c.x[slot], slot, xi.dtype, normalized)
    scale = c.x.get("scale")
    if not scale:
        known = _ints(normalized)
        if known is None:
            raise c.err("without scale, the normalized dimensions must be known")
        scale = _filled(L, f"{c.out[0]}.scale", xi.dtype, known, 1.0)
    ins = [x, scale] + ([c.x["bias"]] if c.x.get("bias") else [])
    L.add("LayerNormalization", ins, xi, c.where, out=c.out[0], axis=axes[0], epsilon=c.opt.get("epsilon", 1e-5))


def _layer_norm_decomposed(L: Lowering, c: Call, axes: list[int]) -> None:
    """Layer normalization over axes that are not the trailing ones in order, as elementary ops."""
    x = c.x["input"]
    xi = L.info[x]
    dt, where = xi.dtype, c.where
    kept = Info(dt, tuple(1 if k in axes else d for k, d in enumerate(xi.dims)))
    ax = L.i64(sorted(axes))
    mean = L.add("ReduceMean", [x, ax], kept, where, keepdims=1)
    d = L.add("Sub", [x, mean], xi, where)
    var = L.add("ReduceMean", [L.add("Mul", [d, d], xi, where), ax], kept, where, keepdims=1)
    eps = L.scalar(c.opt.get("epsilon", 1e-5), dt, f"{where}: {c.op}: epsilon")
    std = L.add("Sqrt", [L.add("Add", [var, eps], kept, where)], kept, where)
    y = L.add("Div", [d, std], xi, where)
    # WebNN's scale and bias have the axes' dimensions in the axes' order: put them in place.
    target = [xi.dims[k] if k in axes else 1 for k in range(xi.rank)]
    for slot, op in (("scale", "Mul"), ("bias", "Add")):
        v = c.x.get(slot)
        if not v:
            continue
        _check_vector(L, c, v, slot, dt, [xi.dims[a] for a in axes])
        order = sorted(range(len(axes)), key=lambda k: axes[k])
        if order != list(range(len(axes))):
            v = L.transpose(v, order, where)
        known = _ints(target)
        if known is None:
            raise c.err(f"with a {slot}, the normalized dimensions must be known")
        v = L.add("Reshape", [v, L.i64(known)], Info(dt, tuple(known)), where)
        y = L.add(op, [y, v], xi, where)
    L.finish(y, c.out[0])


_op("batchNormalization", ("input", "mean", "variance", "?scale", "?bias"), _batch_norm,
    {"axis": _int, "epsilon": _float, "activation": _enum(*ACTIVATIONS)}, operand_options=("scale", "bias"))
_op("instanceNormalization", ("input", "?scale", "?bias"), _instance_norm,
    {"epsilon": _float, "layout": _enum("nchw", "nhwc")}, operand_options=("scale", "bias"))
_op("layerNormalization", ("input", "?scale", "?bias"), _layer_norm,
    {"axes": _list(_int), "epsilon": _float}, operand_options=("scale", "bias"))

# --- reductions ----------------------------------------------------------------

_REDUCE = {"reduceMean": "ReduceMean", "reduceSum": "ReduceSum", "reduceMax": "ReduceMax",
           "reduceMin": "ReduceMin", "reduceProduct": "ReduceProd", "reduceL1": "ReduceL1",
           "reduceL2": "ReduceL2", "reduceLogSum": "ReduceLogSum", "reduceLogSumExp": "ReduceLogSumExp",
           "reduceSumSquare": "ReduceSumSquare"}


def _reduce(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    axes = c.opt.get("axes")
    axes = list(range(i.rank)) if axes is None else sorted({_axis(c, a, i.rank) for a in axes})
    keep = c.opt.get("keepDimensions", False)
    if keep:
        dims = tuple(1 if k in axes else d for k, d in enumerate(i.dims))
    else:
        dims = tuple(d for k, d in enumerate(i.dims) if k not in axes)
    if not axes:  # WebNN: empty axes reduce nothing
        L.add(_REDUCE[c.op], [c.x["input"]], i, c.where, out=c.out[0], keepdims=1, noop_with_empty_axes=1)
        return
    L.add(_REDUCE[c.op], [c.x["input"], L.i64(axes)], Info(i.dtype, dims), c.where, out=c.out[0],
          keepdims=int(keep))


def _arg(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    axis = _axis(c, c.opt.get("axis", 0), i.rank)
    keep = c.opt.get("keepDimensions", False)
    dims = tuple(1 if k == axis else d for k, d in enumerate(i.dims) if keep or k != axis)
    dtype = c.opt.get("outputDataType", "int32")
    if dtype not in ("int32", "int64"):
        raise c.err(f"outputDataType must be int32 or int64, got {dtype}")
    y = L.add("ArgMax" if c.op == "argMax" else "ArgMin", [c.x["input"]], Info("int64", dims), c.where,
              axis=axis, keepdims=int(keep))
    if dtype == "int32":
        y = L.add("Cast", [y], Info("int32", dims), c.where, to=TensorProto.INT32)
    L.finish(y, c.out[0])


_op(list(_REDUCE), ("input",), _reduce, {"axes": _list(_int), "keepDimensions": _bool})
_op(["argMax", "argMin"], ("input",), _arg, {"axis": _int, "keepDimensions": _bool, "outputDataType": _dtype_opt},
    positional=("axis",))

# --- shape manipulation ----------------------------------------------------------


def _size(dims: Sequence[Dim]) -> int | None:
    ints = _ints(dims)
    return None if ints is None else math.prod(ints)


def _reshape(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    if "newShape" not in c.opt:
        raise c.err("missing newShape")
    target = list(c.opt["newShape"])
    symbolic = [k for k, d in enumerate(target) if isinstance(d, str) or d == -1]
    if len(symbolic) > 1:
        raise c.err("newShape may hold at most one -1 or dynamic dimension")
    dims: list[Dim] = [d if _is_int(d) else None for d in target]
    total = _size(i.dims)
    if symbolic:
        known = math.prod(d for d in target if _is_int(d) and d > 0)
        if total is not None:
            if total % known:
                raise c.err(f"cannot reshape {_fmt(i.dims)} to {target}")
            dims[symbolic[0]] = total // known
        target[symbolic[0]] = -1
    elif total is not None and total != math.prod(target):
        raise c.err(f"cannot reshape {_fmt(i.dims)} ({total} elements) to {target}")
    L.add("Reshape", [c.x["input"], L.i64(target)], Info(i.dtype, tuple(dims)), c.where, out=c.out[0])


def _transpose(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    perm = c.opt.get("permutation", list(range(i.rank))[::-1])
    if sorted(perm) != list(range(i.rank)):
        raise c.err(f"permutation {perm} is not a permutation of {i.rank} axes")
    L.transpose(c.x["input"], perm, c.where, out=c.out[0])


def _concat(L: Lowering, c: Call) -> None:
    names = c.rest
    if not names:
        raise c.err("needs at least one input")
    infos = [L.info[n] for n in names]
    first = infos[0]
    if "axis" not in c.opt:
        raise c.err("missing axis")
    axis = _axis(c, c.opt["axis"], first.rank)
    total: Dim = 0
    for n, i in zip(names, infos, strict=True):
        if i.rank != first.rank or i.dtype != first.dtype:
            raise c.err(f"input '{n}' {i.dtype}{_fmt(i.dims)} does not match {first.dtype}{_fmt(first.dims)}")
        for k in range(first.rank):
            if k != axis and _known(i.dims[k], first.dims[k]) and i.dims[k] != first.dims[k]:
                raise c.err(f"input '{n}' shape {_fmt(i.dims)} differs from {_fmt(first.dims)} off axis {axis}")
        d = i.dims[axis]
        total = total + d if isinstance(total, int) and isinstance(d, int) else None
    dims = list(first.dims)
    dims[axis] = total
    L.add("Concat", names, Info(first.dtype, tuple(dims)), c.where, out=c.out[0], axis=axis)


def _split(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    axis = _axis(c, c.opt.get("axis", 0), i.rank)
    splits = c.opt.get("splits")
    if splits is None:
        raise c.err("missing splits (a count or a list of sizes)")
    size = i.dims[axis]
    if isinstance(splits, list):
        if _known(size) and sum(splits) != size:
            raise c.err(f"splits {splits} do not add up to dimension {size}")
        sizes: list[Dim] = list(splits)
        ins, attrs = [c.x["input"], L.i64(splits)], {}
    else:
        if _known(size) and size % splits:
            raise c.err(f"dimension {size} does not divide into {splits} equal parts")
        sizes = [size // splits if _known(size) else None] * splits
        ins, attrs = [c.x["input"]], {"num_outputs": splits}
    if len(sizes) != len(c.out):
        raise c.err(f"gives {len(sizes)} outputs but {len(c.out)} names are assigned")
    infos = [Info(i.dtype, tuple(s if k == axis else d for k, d in enumerate(i.dims))) for s in sizes]
    L.add("Split", ins, infos, c.where, out=c.out, axis=axis, **attrs)


def _slice(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    starts, sizes = c.opt.get("starts"), c.opt.get("sizes")
    if starts is None or sizes is None:
        raise c.err("needs starts and sizes")
    strides = c.opt.get("strides", [1] * i.rank)
    if not len(starts) == len(sizes) == len(strides) == i.rank:
        raise c.err(f"starts, sizes and strides need {i.rank} values each")
    dims: list[Dim] = []
    for k, (s, n, st) in enumerate(zip(starts, sizes, strides, strict=True)):
        if _known(i.dims[k]) and s + n > i.dims[k]:
            raise c.err(f"slice {s}..{s + n} is outside dimension {k} of size {i.dims[k]}")
        dims.append(-(-n // st))
    ends = [s + n for s, n in zip(starts, sizes, strict=True)]
    ins = [c.x["input"], L.i64(starts), L.i64(ends), L.i64(list(range(i.rank)))]
    if any(st != 1 for st in strides):
        ins.append(L.i64(strides))
    L.add("Slice", ins, Info(i.dtype, tuple(dims)), c.where, out=c.out[0])


_PAD_MODES = {"constant": "constant", "edge": "edge", "reflection": "reflect"}


def _pad(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    begin, end = c.opt.get("beginningPadding"), c.opt.get("endingPadding")
    if begin is None or end is None or len(begin) != i.rank or len(end) != i.rank:
        raise c.err(f"needs beginningPadding and endingPadding with {i.rank} values each")
    mode = c.opt.get("mode", "constant")
    if mode not in _PAD_MODES:
        raise c.err(f"mode '{mode}' is not supported")
    dims = tuple(d + b + e if _known(d) else None for d, b, e in zip(i.dims, begin, end, strict=True))
    ins = [c.x["input"], L.i64(list(begin) + list(end))]
    if mode == "constant":
        ins.append(L.scalar(c.opt.get("value", 0.0), i.dtype, f"{c.where}: pad: value"))
    L.add("Pad", ins, Info(i.dtype, dims), c.where, out=c.out[0], mode=_PAD_MODES[mode])


def _resample(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    _need_rank(c, i, 4, "input")
    axes = [_axis(c, a, 4) for a in c.opt.get("axes", [2, 3])]
    if len(set(axes)) != 2:
        raise c.err(f"axes {axes} must name two different dimensions")
    mode = "linear" if c.opt.get("mode", "nearest-neighbor") == "linear" else "nearest"
    dims = list(i.dims)
    # Full-rank scales/sizes rather than Resize's `axes` attribute: onnxruntime's
    # transpose optimizer mishandles `axes` when it pushes an NHWC transpose through.
    attrs: dict[str, Any] = {}
    if "sizes" in c.opt:
        sizes = c.opt["sizes"]
        for a, s in zip(axes, sizes, strict=True):
            dims[a] = s
        known = _ints(dims)
        if known is not None:
            ins = [c.x["input"], "", "", L.i64(known)]
        else:
            ins, attrs = [c.x["input"], "", "", L.i64(sizes)], {"axes": axes}
    else:
        scales = c.opt.get("scales", [1.0, 1.0])
        if any(s <= 0 for s in scales):
            raise c.err(f"scales {scales} must be positive")
        full = [1.0] * 4
        for a, s in zip(axes, scales, strict=True):
            full[a] = s
            dims[a] = math.floor(dims[a] * s) if _known(dims[a]) else None
            if dims[a] == 0:
                raise c.err(f"scale {s} shrinks dimension {a} to nothing")
        ins = [c.x["input"], "", L.values(L.fresh("scales"), "float32", [4], np.array(full, np.float32))]
    L.add("Resize", ins, Info(i.dtype, tuple(dims)), c.where, out=c.out[0], mode=mode,
          coordinate_transformation_mode="half_pixel", **attrs)


def _expand(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    target = c.opt.get("newShape")
    if target is None or any(not _is_int(d) or d < 1 for d in target):
        raise c.err("needs newShape with positive dimensions")
    dims = _broadcast(c.where, i.dims, target)
    if len(target) < i.rank or tuple(target) != tuple(
            d if d is not None else t for d, t in zip(dims, target, strict=True)):
        raise c.err(f"cannot expand {_fmt(i.dims)} to {target}")
    L.add("Expand", [c.x["input"], L.i64(target)], Info(i.dtype, tuple(target)), c.where, out=c.out[0])


def _gather(L: Lowering, c: Call) -> None:
    i, idx = c.info(L, "input"), c.info(L, "indices")
    axis = _axis(c, c.opt.get("axis", 0), i.rank)
    ind = _int_indices(L, c, "indices")
    dims = i.dims[:axis] + idx.dims + i.dims[axis + 1:]
    L.add("Gather", [c.x["input"], ind], Info(i.dtype, dims), c.where, out=c.out[0], axis=axis)


def _squeeze(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    if c.op == "squeeze":
        axes = c.opt.get("axes", [k for k, d in enumerate(i.dims) if d == 1])
        axes = sorted({_axis(c, a, i.rank) for a in axes})
        for a in axes:
            if _known(i.dims[a]) and i.dims[a] != 1:
                raise c.err(f"cannot squeeze axis {a} of size {i.dims[a]}")
        dims = tuple(d for k, d in enumerate(i.dims) if k not in axes)
        L.add("Squeeze", [c.x["input"], L.i64(axes)], Info(i.dtype, dims), c.where, out=c.out[0])
    else:
        if "axes" not in c.opt:
            raise c.err("missing axes")
        rank = i.rank + len(c.opt["axes"])
        axes = sorted({_axis(c, a, rank) for a in c.opt["axes"]})
        if len(axes) != len(c.opt["axes"]):
            raise c.err(f"axes {c.opt['axes']} repeat an axis")
        it = iter(i.dims)
        dims = tuple(1 if k in axes else next(it) for k in range(rank))
        L.add("Unsqueeze", [c.x["input"], L.i64(axes)], Info(i.dtype, dims), c.where, out=c.out[0])


def _tile(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    reps = c.opt.get("repetitions")
    if reps is None or len(reps) != i.rank:
        raise c.err(f"needs repetitions with {i.rank} values")
    dims = tuple(d * r if _known(d) else None for d, r in zip(i.dims, reps, strict=True))
    L.add("Tile", [c.x["input"], L.i64(reps)], Info(i.dtype, dims), c.where, out=c.out[0])


def _cumsum(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    if "axis" not in c.opt:
        raise c.err("missing axis")
    axis = _axis(c, c.opt["axis"], i.rank)
    L.add("CumSum", [c.x["input"], L.values(L.fresh("axis"), "int64", [], np.array(axis))], i, c.where,
          out=c.out[0], exclusive=int(c.opt.get("exclusive", False)), reverse=int(c.opt.get("reversed", False)))


def _triangular(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    if i.rank < 2:
        raise c.err("input must be at least 2-D")
    k = L.values(L.fresh("diagonal"), "int64", [], np.array(c.opt.get("diagonal", 0)))
    L.add("Trilu", [c.x["input"], k], i, c.where, out=c.out[0], upper=int(c.opt.get("upper", True)))


def _gather_elements(L: Lowering, c: Call) -> None:
    i, idx = c.info(L, "input"), c.info(L, "indices")
    if idx.rank != i.rank:
        raise c.err(f"indices must have the input's rank {i.rank}, got shape {_fmt(idx.dims)}")
    axis = _axis(c, c.opt.get("axis", 0), i.rank)
    L.add("GatherElements", [c.x["input"], _int_indices(L, c, "indices")], Info(i.dtype, idx.dims), c.where,
          out=c.out[0], axis=axis)


def _gather_nd(L: Lowering, c: Call) -> None:
    i, idx = c.info(L, "input"), c.info(L, "indices")
    last = idx.dims[-1] if idx.rank >= 1 else None
    if not isinstance(last, int) or not 1 <= last <= i.rank:
        raise c.err(f"indices' last dimension must be known and at most the input's rank {i.rank}")
    dims = idx.dims[:-1] + i.dims[last:]
    L.add("GatherND", [c.x["input"], _int_indices(L, c, "indices", int64_only=True)], Info(i.dtype, dims), c.where,
          out=c.out[0])


def _int_indices(L: Lowering, c: Call, slot: str, int64_only: bool = False) -> str:
    """Indices as onnxruntime takes them: int32 or int64 (WebNN also allows unsigned ones)."""
    idx = c.info(L, slot)
    if idx.dtype == "int64" or (idx.dtype == "int32" and not int64_only):
        return c.x[slot]
    if idx.dtype not in ("int32", "uint32", "uint64", "int8", "uint8"):
        raise c.err(f"{slot} must be integers, got {idx.dtype}")
    return L.add("Cast", [c.x[slot]], Info("int64", idx.dims), c.where, to=TensorProto.INT64)


def _reverse(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    axes = sorted({_axis(c, a, i.rank) for a in c.opt.get("axes", range(i.rank))})
    if not axes:
        L.add("Identity", [c.x["input"]], i, c.where, out=c.out[0])
        return
    n = len(axes)
    L.add("Slice", [c.x["input"], L.i64([-1] * n), L.i64([-(2**63)] * n), L.i64(axes), L.i64([-1] * n)], i,
          c.where, out=c.out[0])


def _is_special(L: Lowering, c: Call) -> None:
    i = c.info(L, "input")
    if i.dtype not in _FLOATS:
        raise c.err(f"needs a float operand, got {i.dtype}")
    L.add("IsNaN" if c.op == "isNaN" else "IsInf", [c.x["input"]], Info("bool", i.dims), c.where, out=c.out[0])


def _quantization(L: Lowering, c: Call) -> None:
    """dequantizeLinear/quantizeLinear, per tensor or per axis (opset 18 has no block-wise form)."""
    x, scale, zero = c.info(L, "input"), c.info(L, "scale"), c.info(L, "zeroPoint")
    quantize = c.op == "quantizeLinear"
    float_type = x.dtype if quantize else scale.dtype
    if scale.dtype != "float32" or (quantize and x.dtype != "float32"):
        raise c.err(f"only float32 scale{' and input' if quantize else ''} are mapped, got {scale.dtype}")
    ints = ("int8", "uint8") if quantize else ("int8", "uint8", "int32")
    if zero.dtype not in ints or (not quantize and x.dtype != zero.dtype):
        raise c.err(f"zeroPoint must be {' or '.join(ints)}" + ("" if quantize else f" like the input ({x.dtype})")
                    + f", got {zero.dtype}")
    if scale.dims != zero.dims:
        raise c.err(f"scale {_fmt(scale.dims)} and zeroPoint {_fmt(zero.dims)} differ in shape")
    if scale.rank > x.rank:
        raise c.err(f"scale {_fmt(scale.dims)} has a higher rank than the input {_fmt(x.dims)}")
    # Right-align the scale with the input; per-axis when exactly one dimension is not 1.
    offset = x.rank - scale.rank
    varying = [k for k, d in enumerate(scale.dims) if d != 1]
    attrs: dict[str, Any] = {}
    if not varying:
        target: list[int] = []
    elif len(varying) == 1 and isinstance(d := scale.dims[varying[0]], int) and d == x.dims[varying[0] + offset]:
        axis = varying[0] + offset
        target, attrs = [d], {"axis": axis}
    else:
        raise c.err(f"block-wise scale {_fmt(scale.dims)} for input {_fmt(x.dims)} is not mapped (per tensor or "
                    "per axis only)")
    operands = []
    for slot in ("scale", "zeroPoint"):
        name, info = c.x[slot], c.info(L, slot)
        if list(info.dims) != target:
            name = L.add("Reshape", [name, L.i64(target)], Info(info.dtype, tuple(target)), c.where)
        operands.append(name)
    out_type = zero.dtype if quantize else float_type
    L.add("QuantizeLinear" if quantize else "DequantizeLinear", [c.x["input"], *operands],
          Info(out_type, x.dims), c.where, out=c.out[0], **attrs)


_op(["dequantizeLinear", "quantizeLinear"], ("input", "scale", "zeroPoint"), _quantization)
_op("gatherElements", ("input", "indices"), _gather_elements, {"axis": _int})
_op("gatherND", ("input", "indices"), _gather_nd)
_op("reverse", ("input",), _reverse, {"axes": _list(_int)})
_op(["isNaN", "isInfinite"], ("input",), _is_special)
_op("reshape", ("input",), _reshape, {"newShape": _list(_shape_dim)}, positional=("newShape",))
_op("transpose", ("input",), _transpose, {"permutation": _list(_uint)})
_op("concat", ("*inputs",), _concat, {"axis": _int}, positional=("axis",))
_op("split", ("input",), _split, {"splits": _int_or_ints, "axis": _int}, positional=("splits",), multi_output=True)
_op("slice", ("input",), _slice, {"starts": _list(_uint), "sizes": _list(_pos), "strides": _list(_pos)},
    positional=("starts", "sizes"))
_op("pad", ("input",), _pad, {"beginningPadding": _list(_uint), "endingPadding": _list(_uint),
                              "mode": _enum("constant", "edge", "reflection", "symmetric"), "value": _float},
    positional=("beginningPadding", "endingPadding"))
_op("resample2d", ("input",), _resample, {"mode": _enum("nearest-neighbor", "linear"), "scales": _list(_float, 2),
                                          "sizes": _INTS2, "axes": _list(_int, 2)})
_op("expand", ("input",), _expand, {"newShape": _list(_int)}, positional=("newShape",))
_op("gather", ("input", "indices"), _gather, {"axis": _int})
_op(["squeeze", "unsqueeze"], ("input",), _squeeze, {"axes": _list(_int)})
_op("tile", ("input",), _tile, {"repetitions": _list(_pos)}, positional=("repetitions",))
_op("cumulativeSum", ("input",), _cumsum, {"axis": _int, "exclusive": _bool, "reversed": _bool},
    positional=("axis",))
_op("triangular", ("input",), _triangular, {"upper": _bool, "diagonal": _int})


# ---------------------------------------------------------------------------
# Binding a node's operands and options.


def operand_refs(node: NodeDecl) -> list[str]:
    """Every operand a node reads (its inputs and operand-valued options), for ordering."""
    spec = OPS.get(node.op)
    refs = list(node.inputs)
    if spec:
        refs += [v for k, v in node.options.items() if k in spec.operand_options and isinstance(v, str)]
    return refs


def check_op(node: NodeDecl) -> OpSpec:
    spec = OPS.get(node.op)
    if spec is None:
        raise fail(node.where, f"unknown operator {show(node.op)}")
    return spec


def bind(node: NodeDecl) -> Call:
    """Match inputs to the operator's operand slots and validate every option."""
    spec = check_op(node)
    x: dict[str, str] = {}
    rest: list[str] = []
    inputs = list(node.inputs)
    for slot in spec.operands:
        name = slot.lstrip("?*")
        if slot.startswith("*"):
            rest, inputs = inputs, []
        elif inputs:
            x[name] = inputs.pop(0)
        elif not slot.startswith("?"):
            raise fail(node.where, f"{node.op}: missing operand '{name}'")
    if inputs:
        raise fail(node.where, f"{node.op}: too many operands ({len(node.inputs)})")
    opt: dict[str, Any] = {}
    for key, value in node.options.items():
        if value is None:  # webnn-graph writes absent options as null
            continue
        check = spec.options.get(key)
        if check is None:
            known = ", ".join(sorted(k for k in spec.options if k != "label")) or "none"
            raise fail(node.where, f"{node.op}: unknown option {show(key)} (known: {known})")
        try:
            opt[key] = check(value)
        except ValueError as e:
            raise fail(node.where, f"{node.op}: option '{key}': {e}") from None
        if key in spec.operand_options:
            if x.get(key):
                raise fail(node.where, f"{node.op}: '{key}' is given both as an operand and as an option")
            x[key] = opt.pop(key)
    if "dataType" in opt:  # cast(x, dataType=...) as an alias of type
        opt.setdefault("type", opt.pop("dataType"))
    if len(node.outputs) != 1 and not spec.multi_output:
        raise fail(node.where, f"{node.op}: has one output, but {len(node.outputs)} names are assigned")
    return Call(node.op, x, rest, opt, list(node.outputs), node.where)


# ---------------------------------------------------------------------------
# The whole graph.


def _order(graph: GraphDecl, defined: set[str]) -> list[NodeDecl]:
    """Nodes in dependency order; undefined operands and cycles are errors."""
    producer: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for out in node.outputs:
            producer[out] = k
    deps: list[list[int]] = []
    for node in graph.nodes:
        check_op(node)
        mine = []
        for ref in operand_refs(node):
            if ref in producer:
                mine.append(producer[ref])
            elif ref not in defined:
                raise fail(node.where, f"undefined operand '{ref}'")
        deps.append(mine)
    # Iterative depth-first topological sort: 0 new, 1 on the stack, 2 done.
    state = [0] * len(graph.nodes)
    order: list[NodeDecl] = []
    for root in range(len(graph.nodes)):
        if state[root]:
            continue
        stack = [(root, 0)]
        state[root] = 1
        while stack:
            k, i = stack[-1]
            if i < len(deps[k]):
                stack[-1] = (k, i + 1)
                d = deps[k][i]
                if state[d] == 1:
                    path = [graph.nodes[j].outputs[0] for j, _ in stack[[j for j, _ in stack].index(d):]]
                    cycle = " -> ".join(f"'{p}'" for p in path + [path[0]])
                    raise fail(graph.nodes[d].where, f"cyclic reference: {cycle}")
                if state[d] == 0:
                    state[d] = 1
                    stack.append((d, 0))
            else:
                state[k] = 2
                order.append(graph.nodes[k])
                stack.pop()
    return order


def lower(graph: GraphDecl, limits: Limits | None) -> onnx.ModelProto:
    """The weightless ONNX model for a WebNN graph declaration."""
    L = Lowering(limits)
    if len(graph.nodes) > L.max_nodes:
        raise LimitExceeded(f"graph has {len(graph.nodes)} nodes, more than the limit of {L.max_nodes}")
    max_tensors = int(getattr(limits, "max_tensors", 1_000_000))
    if len(graph.inputs) + len(graph.consts) > max_tensors:
        raise LimitExceeded(f"graph declares more than {max_tensors} inputs and constants (limit max_tensors)")
    for inp in graph.inputs:
        L.declare_input(inp)
    for const in graph.consts:
        L.declare_const(const)
    for node in graph.nodes:
        for out in node.outputs:
            L.claim(out, node.where)
    defined = {i.name for i in graph.inputs} | {c.name for c in graph.consts}
    for node in _order(graph, defined):
        OPS[node.op].lower(L, bind(node))
    return assemble(L, graph.name, graph.outputs)


def assemble(L: Lowering, name: str, outputs: Sequence[tuple[str, str, str]]) -> onnx.ModelProto:
    """The model computing `outputs` [(output name, operand, where)]: what they need, nothing more.

    Like MLGraphBuilder.build(), nodes and constants no output depends on are
    left out; every declared input stays, so that the caller may bind it.
    """
    if not outputs:
        raise GraphError("the graph declares no outputs")
    nodes = list(L.nodes)
    declared = {v.name for v in L.inputs} | {t.name for t in L.initializers}
    onnx_outputs = []
    seen: set[str] = set()
    for out_name, ref, where in outputs:
        if ref not in L.info:
            raise fail(where, f"output '{out_name}' names undefined operand '{ref}'")
        if ref in declared:  # as MLGraphBuilder.build() refuses them
            raise fail(where, f"output '{out_name}' is a graph input or constant; outputs must be computed "
                              "by an operator")
        if out_name in seen:
            raise fail(where, f"output '{out_name}' is declared twice")
        seen.add(out_name)
        if out_name != ref:
            if out_name in L.info:
                raise fail(where, f"output name '{out_name}' is already an operand")
            nodes.append(helper.make_node("Identity", [ref], [out_name], name=f"Identity_out_{len(seen)}"))
        onnx_outputs.append(helper.make_tensor_value_info(out_name, _ALL_DTYPES[L.info[ref].dtype], None))
    # Keep what the outputs depend on, in the original (dependency) order.
    needed = set(seen)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    inits = [t for t in L.initializers if t.name in needed]
    g = helper.make_graph(kept, name or "webnn", L.inputs, onnx_outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="daop-agent-webnn")
    model.ir_version = IR_VERSION
    return model


def fit_value(value: Any, dtype: str, where: str) -> float | int:
    """A number as a value of `dtype`, or a GraphError when it is not one (2.5 as int32, 1e9 as int8)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(where, f"expected a number, got {show(value)}")
    if dtype in _FLOATS or dtype == "float64":
        limit = float(np.finfo(_NP_DTYPES[dtype]).max)
        if not math.isfinite(value) or abs(value) > limit:
            raise fail(where, f"{show(value)} does not fit {dtype}")
        return float(value)
    if dtype == "bool":
        return int(bool(value))
    if isinstance(value, float):
        if not value.is_integer():
            raise fail(where, f"{show(value)} is not an integer, as {dtype} needs")
        value = int(value)
    info = np.iinfo(_NP_DTYPES[dtype])
    if not info.min <= value <= info.max:
        raise fail(where, f"{value} does not fit {dtype}")
    return value


def _constant(L: Lowering, const: ConstDecl) -> None:
    n = math.prod(const.dims)
    where = const.where
    if const.kind == "weights" or (const.kind == "scalar" and n > MAX_INLINE_ELEMENTS):
        L.absent(const.name, const.dtype, const.dims)
    elif const.kind == "scalar":
        value = fit_value(const.value, const.dtype, f"{where}: constant '{const.name}'")
        L.values(const.name, const.dtype, const.dims, np.full(const.dims, value))
    elif const.kind == "bytes":
        item = np.dtype(_NP_DTYPES[const.dtype]).itemsize
        if len(const.value) != n * item:
            raise fail(where, f"constant '{const.name}': {len(const.value)} bytes given, "
                              f"{const.dtype}{const.dims} needs {n * item}")
        L.values(const.name, const.dtype, const.dims,
                 np.frombuffer(bytes(const.value), dtype=np.dtype(_NP_DTYPES[const.dtype]).newbyteorder("<")))
    elif const.kind == "values":
        if len(const.value) != n:
            raise fail(where, f"constant '{const.name}': {len(const.value)} values given, shape needs {n}")
        fitted = [fit_value(v, const.dtype, f"{where}: constant '{const.name}'") for v in const.value]
        L.values(const.name, const.dtype, const.dims, np.array(fitted))
    else:
        raise fail(where, f"constant '{const.name}': unknown init kind '{const.kind}'")
