"""The webnn-graph text format (`.webnn`) -> weightless ONNX.

The grammar follows the webnn-graph project (its `wg.pest`), with the small
extensions described in docs/webnn-format.md:

    webnn_graph "name" v1 {
      inputs  { x: f32[1, 3, dyn("h", 1080), 224]; }
      consts  { w: f32[32, 3, 3, 3] @weights("conv1.weight"); s: f32[] @scalar(0.5); }
      nodes   { y = conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1]); [a, b] = split(y, 2, axis=1); }
      outputs { a; b; }
    }

A hand-written tokenizer (lazy, so that a hostile file is refused after
max_nodes statements, not after it has all been read into tokens) and a
recursive-descent parser; no eval. Every error is one GraphError line that
starts with "line L:C:".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import onnx

from monitors.errors import GraphError, LimitExceeded
from monitors.graphs.limits import Limits
from monitors.graphs.webnn_ops import OPS, ConstDecl, GraphDecl, InputDecl, NodeDecl, lower, parse_dtype

MAX_TOKEN_CHARS = 4096     # one identifier, string or number
MAX_ARRAY_ITEMS = 1 << 16  # one [...] literal (@bytes included)
MAX_DEPTH = 16             # nested [...] literals
MAX_TEXT_RANK = 16         # dimensions in one type (Limits.max_rank is checked when lowering)

# A string's repetition is bounded: an unbounded (?:a|b)* keeps backtracking state for every character it
# matched (gigabytes for a 15 MB string literal) before the length check could run. A longer string matches
# `longstring` (bounded too) and is refused at once.
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+ | \#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\[^\n]){0,""" + str(MAX_TOKEN_CHARS) + r"""}")
  | (?P<longstring>"(?:[^"\\\n]|\\[^\n]){""" + str(MAX_TOKEN_CHARS) + r"""})
  | (?P<badstring>"[^\n]*)
  | (?P<number>-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<annot>@[A-Za-z_]+)
  | (?P<ident>[A-Za-z_/$][A-Za-z0-9_./]*)
  | (?P<punct>[{}()\[\],;:=])
""", re.VERBOSE)
_UNESCAPE = re.compile(r'\\(["\\])')
_VERSION = re.compile(r"v([0-9]{1,9})")


class Token(NamedTuple):
    kind: str   # string, number, annot, ident, punct, eof
    text: str
    line: int
    col: int

    @property
    def where(self) -> str:
        return f"line {self.line}:{self.col}"


class _Lexer:
    """Tokens on demand, with one token of lookahead."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._tokens = self._scan()
        self.peek = next(self._tokens)

    def _scan(self) -> Iterator[Token]:
        """Tokens with their line and column, counted as the text is read (never rescanned)."""
        text, end = self.text, len(self.text)
        line, line_start, pos = 1, 0, 0
        for m in _TOKEN.finditer(text):
            start = m.start()
            if start != pos:  # finditer skipped something no token matches
                raise GraphError(f"line {line}:{pos - line_start + 1}: unexpected character {text[pos]!r}")
            kind, pos = m.lastgroup, m.end()
            assert kind is not None  # every alternative of _TOKEN is a named group
            if kind == "ws":
                newlines = text.count("\n", start, pos)
                if newlines:
                    line += newlines
                    line_start = text.rfind("\n", start, pos) + 1
                continue
            col = start - line_start + 1
            if kind == "longstring":
                raise GraphError(f"line {line}:{col}: token longer than {MAX_TOKEN_CHARS} characters")
            if kind == "badstring":
                raise GraphError(f"line {line}:{col}: unterminated string")
            if pos - start > MAX_TOKEN_CHARS:
                raise GraphError(f"line {line}:{col}: token longer than {MAX_TOKEN_CHARS} characters")
            yield Token(kind, m.group(), line, col)
        if pos != end:
            raise GraphError(f"line {line}:{pos - line_start + 1}: unexpected character {text[pos]!r}")
        yield Token("eof", "", line, pos - line_start + 1)

    def next(self) -> Token:
        tok = self.peek
        if tok.kind != "eof":
            self.peek = next(self._tokens)
        return tok



def _describe(tok: Token) -> str:
    return "end of file" if tok.kind == "eof" else repr(tok.text if len(tok.text) <= 30 else tok.text[:27] + "...")


class _Ident(str):
    """An identifier used as a value (an operand name, or an enum such as nhwc)."""


class _Parser:
    def __init__(self, text: str, limits: Limits | None) -> None:
        self.lex = _Lexer(text)
        self.max_nodes = int(getattr(limits, "max_nodes", 100_000))
        self.max_decls = int(getattr(limits, "max_tensors", 1_000_000))
        self.graph = GraphDecl()
        self.decls = 0

    # helpers ---------------------------------------------------------------

    def error(self, tok: Token, message: str) -> GraphError:
        return GraphError(f"{tok.where}: {message}")

    def where(self, tok: Token) -> str:
        return tok.where

    def expect(self, text: str) -> Token:
        tok = self.lex.next()
        if tok.kind != "punct" or tok.text != text:
            raise self.error(tok, f"expected '{text}', found {_describe(tok)}")
        return tok

    def accept(self, text: str) -> bool:
        tok = self.lex.peek
        if tok.kind == "punct" and tok.text == text:
            self.lex.next()
            return True
        return False

    def ident(self, what: str = "a name") -> Token:
        tok = self.lex.next()
        if tok.kind != "ident":
            raise self.error(tok, f"expected {what}, found {_describe(tok)}")
        return tok

    def string(self) -> str:
        tok = self.lex.next()
        if tok.kind != "string":
            raise self.error(tok, f"expected a string, found {_describe(tok)}")
        return _UNESCAPE.sub(r"\1", tok.text[1:-1])

    def integer(self) -> int:
        tok = self.lex.next()
        if tok.kind != "number" or not re.fullmatch(r"-?[0-9]+", tok.text):
            raise self.error(tok, f"expected an integer, found {_describe(tok)}")
        return int(tok.text)

    def count_decl(self, tok: Token) -> None:
        self.decls += 1
        if self.decls > self.max_decls:
            raise LimitExceeded(f"{self.where(tok)}: more than {self.max_decls} inputs and constants "
                                "(limit max_tensors)")

    # the file ----------------------------------------------------------------

    def parse(self) -> GraphDecl:
        tok = self.ident("'webnn_graph'")
        if tok.text != "webnn_graph":
            raise self.error(tok, f"expected 'webnn_graph', found {_describe(tok)}")
        self.graph.name = self.string() or "webnn"
        self.version()
        if self.lex.peek.kind == "annot" and self.lex.peek.text == "@quantized":
            self.lex.next()
        self.expect("{")
        seen: dict[str, Token] = {}
        while not self.accept("}"):
            tok = self.ident("a block (inputs, consts, nodes or outputs) or '}'")
            block = {"inputs": self.inputs, "consts": self.consts, "nodes": self.nodes, "outputs": self.outputs}
            if tok.text not in block:
                raise self.error(tok, f"unknown block '{tok.text}'; expected inputs, consts, nodes or outputs")
            if tok.text in seen:
                raise self.error(tok, f"second '{tok.text}' block (the first is at {self.where(seen[tok.text])})")
            seen[tok.text] = tok
            self.expect("{")
            block[tok.text]()
        tok = self.lex.next()
        if tok.kind != "eof":
            raise self.error(tok, f"unexpected {_describe(tok)} after the end of the graph")
        return self.graph

    def version(self) -> None:
        tok = self.ident("a version such as v1")
        m = _VERSION.fullmatch(tok.text)
        if tok.text == "v":
            version = self.integer()
        elif m:
            version = int(m.group(1))
        else:
            raise self.error(tok, f"expected a version such as v1, found {_describe(tok)}")
        if version not in (1, 2):
            raise self.error(tok, f"unsupported version v{version} (v1 and v2 are known)")

    def dtype(self) -> str:
        tok = self.ident("a data type such as f32")
        try:
            return parse_dtype(tok.text)
        except ValueError as e:
            raise self.error(tok, str(e)) from None

    def static_shape(self) -> list[int]:
        """A constant's shape: positive integers only (shape(static=True) refuses the rest)."""
        return [d for d in self.shape(static=True) if isinstance(d, int)]

    def shape(self, static: bool) -> list[int | str]:
        self.expect("[")
        dims: list[int | str] = []
        if self.accept("]"):
            return dims
        while True:
            tok = self.lex.peek
            if tok.kind == "number":
                d = self.integer()
                if d < 1:
                    raise self.error(tok, f"dimension {d} must be positive")
                dims.append(d)
            elif tok.kind == "ident" and tok.text == "dyn":
                self.lex.next()
                self.expect("(")
                name = self.string()
                self.expect(",")
                self.integer()  # maxSize: the caller binds the actual size
                self.expect(")")
                dims.append(name or "?")
            elif tok.kind == "ident":
                dims.append(self.lex.next().text)
            elif tok.kind == "string":
                dims.append(self.string() or "?")
            else:
                raise self.error(tok, f"expected a dimension, found {_describe(tok)}")
            if static and isinstance(dims[-1], str):
                raise self.error(tok, "a constant's shape must be static")
            if len(dims) > MAX_TEXT_RANK:
                raise self.error(tok, f"more than {MAX_TEXT_RANK} dimensions")
            if self.accept("]"):
                return dims
            self.expect(",")

    # blocks -------------------------------------------------------------------

    def inputs(self) -> None:
        while not self.accept("}"):
            name = self.ident("an input name")
            self.count_decl(name)
            self.expect(":")
            dtype = self.dtype()
            dims = self.shape(static=False)
            self.expect(";")
            self.graph.inputs.append(InputDecl(name.text, dtype, dims, self.where(name)))

    def consts(self) -> None:
        while not self.accept("}"):
            name = self.ident("a constant name")
            self.count_decl(name)
            self.expect(":")
            dtype = self.dtype()
            dims = self.static_shape()
            value: object  # ConstDecl.value: the ref, a number, bytes or a list of numbers, by kind
            kind, value = "weights", name.text
            annots = 0
            while self.lex.peek.kind == "annot":
                tok = self.lex.next()
                annots += 1
                if annots > 1:
                    raise self.error(tok, "a constant takes one initializer annotation")
                self.expect("(")
                if tok.text == "@weights":
                    kind, value = "weights", self.string()
                elif tok.text == "@scalar":
                    kind, value = "scalar", self.value(0)
                    if isinstance(value, bool) or not isinstance(value, (int, float)):
                        raise self.error(tok, "@scalar takes a number")
                elif tok.text == "@bytes":
                    arr_tok = self.lex.peek
                    arr = self.value(0)
                    if not isinstance(arr, list) or not all(type(b) is int and 0 <= b < 256 for b in arr):
                        raise self.error(arr_tok, "@bytes takes a list of integers 0..255")
                    kind, value = "bytes", bytes(arr)
                else:
                    raise self.error(tok, f"unknown annotation '{tok.text}'; expected @weights, @scalar or @bytes")
                self.expect(")")
            self.expect(";")
            self.graph.consts.append(ConstDecl(name.text, dtype, dims, kind, value,
                                               self.where(name)))

    def nodes(self) -> None:
        while not self.accept("}"):
            first = self.lex.peek
            if len(self.graph.nodes) >= self.max_nodes:
                raise LimitExceeded(f"{self.where(first)}: graph has more than {self.max_nodes} nodes "
                                    "(limit max_nodes)")
            if self.accept("["):
                outs = [self.ident("an output name").text]
                while self.accept(","):
                    outs.append(self.ident("an output name").text)
                    if len(outs) > MAX_ARRAY_ITEMS:
                        raise self.error(first, "too many outputs")
                self.expect("]")
            else:
                outs = [self.ident("a node name or '}'").text]
            self.expect("=")
            self.graph.nodes.append(self.expr(outs))
            self.expect(";")

    def outputs(self) -> None:
        while not self.accept("}"):
            tok = self.ident("an output name or '}'")
            self.graph.outputs.append((tok.text, tok.text, self.where(tok)))
            if not self.accept(","):
                self.accept(";")

    # expressions ----------------------------------------------------------------

    def expr(self, outs: list[str]) -> NodeDecl:
        tok = self.lex.next()
        if tok.kind != "ident":
            raise self.error(tok, f"expected an operator call or an operand name, found {_describe(tok)}")
        where = self.where(tok)
        if not self.accept("("):  # `y = x;` aliases an operand
            return NodeDecl("identity", [tok.text], {}, outs, where)
        spec = OPS.get(tok.text)
        if spec is None:
            raise self.error(tok, f"unknown operator '{tok.text}'")
        inputs: list[str] = []
        options: dict[str, Any] = {}
        positional = list(spec.positional)
        variadic = any(s.startswith("*") for s in spec.operands)
        slots = len(spec.operands)
        if self.accept(")"):
            return NodeDecl(tok.text, inputs, options, outs, where)
        while True:
            arg_tok = self.lex.peek
            value = self.value(0)
            if isinstance(value, _Ident) and self.accept("="):
                key = str(value)
                if key in options:
                    raise self.error(arg_tok, f"option '{key}' is given twice")
                options[key] = self.value(0)
            elif isinstance(value, str) and (variadic or len(inputs) < slots):
                inputs.append(str(value))
            elif isinstance(value, list) and variadic and not inputs and value and all(
                    isinstance(v, str) for v in value):
                inputs.extend(str(v) for v in value)
            elif positional:
                key = positional.pop(0)
                if key in options:
                    raise self.error(arg_tok, f"option '{key}' is given twice")
                options[key] = _plain(value)
            else:
                raise self.error(arg_tok, f"{tok.text}: unexpected argument {_describe(arg_tok)}")
            if len(inputs) > MAX_ARRAY_ITEMS:
                raise self.error(arg_tok, "too many operands")
            if self.accept(")"):
                break
            self.expect(",")
        return NodeDecl(tok.text, inputs, {k: _plain(v) for k, v in options.items()}, outs, where)

    def value(self, depth: int) -> Any:
        tok = self.lex.next()
        if tok.kind == "number":
            if re.fullmatch(r"-?[0-9]+", tok.text):
                return int(tok.text)
            return float(tok.text)
        if tok.kind == "string":
            return _UNESCAPE.sub(r"\1", tok.text[1:-1])
        if tok.kind == "ident":
            return {"true": True, "false": False, "null": None}.get(tok.text, _Ident(tok.text))
        if tok.kind == "punct" and tok.text == "[":
            if depth >= MAX_DEPTH:
                raise self.error(tok, f"lists nested more than {MAX_DEPTH} deep")
            items: list[Any] = []
            if self.accept("]"):
                return items
            while True:
                items.append(self.value(depth + 1))
                if len(items) > MAX_ARRAY_ITEMS:
                    raise self.error(tok, f"a list of more than {MAX_ARRAY_ITEMS} items")
                if self.accept("]"):
                    return items
                self.expect(",")
        raise self.error(tok, f"expected a value, found {_describe(tok)}")


def _plain(value: Any) -> Any:
    if isinstance(value, _Ident):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse(text: str, limits: Limits | None = None) -> GraphDecl:
    """The declaration form of a `.webnn` text (syntax only; lowering checks the rest)."""
    if not isinstance(text, str):
        raise GraphError("a webnn graph must be text")
    max_bytes = getattr(limits, "max_file_bytes", None)
    if max_bytes is not None and len(text) > max_bytes:
        raise LimitExceeded(f"webnn text is {len(text)} characters, more than the limit of {max_bytes}")
    return _Parser(text, limits).parse()


def to_onnx(text: str, limits: Limits | None = None) -> onnx.ModelProto:
    """The weightless ONNX model of a `.webnn` text; GraphError with line:column on any fault."""
    if limits is None:
        limits = Limits()
    return lower(parse(text, limits), limits)
