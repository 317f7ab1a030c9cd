"""One entry point for every model format: a path, bytes, text or a parsed object in, a Graph out.

The format comes from the path's suffix (.onnx, .webnn, .json) or is given:
'onnx' (bytes), 'webnn' (webnn-graph text), 'json' (webnn-graph-json text or
an already parsed dict, as in an MQTT request's "graph" field). WebNN
graphs become weightless ONNX first, so every format ends in the same
shape binding and checks.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from monitors.errors import BadInput, GraphError
from monitors.graphs import webnn_json, webnn_text
from monitors.graphs.decoder import Decoder, find_decoder, read_genai_config
from monitors.graphs.graph import DTYPE_CODES, Graph, InputSpec
from monitors.graphs.limits import Limits
from monitors.graphs.onnx_import import read_weightless
from monitors.graphs.rebind import lower_and_bind
from monitors.graphs.shapes import bind_and_infer

FORMATS = {".onnx": "onnx", ".webnn": "webnn", ".json": "json"}


@dataclass(frozen=True)
class DecoderSource:
    """A language model read once, to be bound and shaped for each run of a generation (prefill, decode steps)."""

    model: onnx.ModelProto
    decoder: Decoder
    limits: Limits
    name: str = ""

    def graph(self, inputs: Mapping[str, InputSpec]) -> Graph:
        return bind_and_infer(self.model, inputs, self.limits, self.name)


def load_decoder(source: str | os.PathLike | bytes, *, fmt: str | None = None,
                 limits: Limits | None = None) -> DecoderSource:
    """An ONNX language model with a KV cache (a path, or bytes with fmt 'onnx'); the genai_config.json beside
    a path names its inputs where present. GraphError/BadInput with one line if it is not one."""
    limits = limits or Limits()
    if isinstance(source, (bytes, bytearray)):
        if fmt not in (None, "onnx"):
            raise BadInput("a generation needs an ONNX language model, not a webnn graph", "bad_generation")
        model, config, name = read_weightless(bytes(source), limits), None, ""
    else:
        path = Path(source)
        if (fmt or FORMATS.get(path.suffix.lower())) != "onnx":
            raise BadInput(f"a generation needs an ONNX language model; {path} is not .onnx", "bad_generation")
        model, config, name = read_weightless(path, limits), read_genai_config(path), path.stem
    return DecoderSource(model, find_decoder(model, config), limits, name)


def load_graph(source: str | os.PathLike | bytes | Mapping[str, Any], *, fmt: str | None = None,
               inputs: Mapping[str, InputSpec] | None = None, limits: Limits | None = None) -> Graph:
    """The model as a Graph with concrete shapes; GraphError/LimitExceeded/BadInput with one line if not.

    A str or PathLike without `fmt` is a path, and so is a str with fmt 'onnx' (ONNX is never text);
    a PathLike with `fmt` is a path read as that format.
    """
    limits = limits or Limits()
    if fmt is not None and fmt not in FORMATS.values():
        raise BadInput(f"unknown model format '{fmt}'; known: {', '.join(FORMATS.values())}")
    if isinstance(source, os.PathLike) or (isinstance(source, str) and fmt in (None, "onnx")):
        return _load_path(Path(source), fmt, inputs, limits)
    if fmt is None:
        raise BadInput("a model given as bytes, text or an object needs its format (onnx, webnn or json)")
    if fmt == "onnx":
        if not isinstance(source, (bytes, bytearray, memoryview)):
            raise BadInput("an ONNX model must be given as bytes")
        return bind_and_infer(read_weightless(source, limits), inputs, limits)
    if fmt == "webnn":
        if isinstance(source, (bytes, bytearray)):
            source = _decode(bytes(source), "model")
        if not isinstance(source, str):
            raise BadInput("a webnn model must be given as text")
        limits.check_file_bytes(len(source.encode()), "model")
        return _from_webnn_text(source, inputs, limits, "")
    if isinstance(source, (bytes, bytearray)):
        source = _decode(bytes(source), "model")
    if isinstance(source, str):
        limits.check_file_bytes(len(source.encode()), "model")
        source = _parse_json(source, "model")
    if not isinstance(source, Mapping):
        raise BadInput("a webnn-graph-json model must be a JSON object")
    return _from_webnn_json(source, inputs, limits, "")


def _load_path(path: Path, fmt: str | None, inputs: Mapping[str, InputSpec] | None, limits: Limits) -> Graph:
    fmt = fmt or FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise GraphError(f"cannot tell the format of {path}: expected a .onnx, .webnn or .json file")
    if fmt == "onnx":
        return bind_and_infer(read_weightless(path, limits), inputs, limits, path.stem)
    try:
        size = path.stat().st_size
        limits.check_file_bytes(size, str(path))
        raw = path.read_bytes()
    except OSError as e:
        raise GraphError(f"cannot read {path}: {e.strerror or e}") from None
    text = _decode(raw, str(path))
    if fmt == "webnn":
        return _from_webnn_text(text, inputs, limits, path.stem)
    obj = _parse_json(text, str(path))
    if not isinstance(obj, Mapping):
        raise GraphError(f"{path} is not a webnn-graph-json model: the top level is not an object")
    return _from_webnn_json(obj, inputs, limits, path.stem)


def _decode(raw: bytes, label: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GraphError(f"{label} is not UTF-8 text: byte {e.start}") from None


def _parse_json(text: str, label: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphError(f"{label} is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise GraphError(f"{label} is not usable JSON: nested too deeply") from None


def _from_webnn_text(text: str, inputs: Mapping[str, InputSpec] | None, limits: Limits, name: str) -> Graph:
    return lower_and_bind(webnn_text.parse(text, limits), inputs, limits, name)


def _from_webnn_json(obj: Mapping[str, Any], inputs: Mapping[str, InputSpec] | None, limits: Limits,
                     name: str) -> Graph:
    return lower_and_bind(webnn_json.parse(obj, limits), inputs, limits, name)


_DIMS = re.compile(r"^\d+([x,]\d+)*$")


def parse_input_spec(text: str) -> tuple[str, InputSpec]:
    """`NAME=1x3x224x224[:float32]` (commas also separate dims) -> (name, InputSpec)."""
    name, sep, rest = text.rpartition("=")
    if not sep or not name:
        raise BadInput(f"bad --input '{text}': expected NAME=1x3x224x224[:float32]")
    dims_text, _, dtype = rest.partition(":")
    dims_text = dims_text.strip().lower()
    if not _DIMS.match(dims_text):
        raise BadInput(f"bad --input '{text}': dimensions must be non-negative integers separated by 'x', "
                       "as in 1x3x224x224 (0 for an empty cache)")
    shape = tuple(int(d) for d in re.split(r"[x,]", dims_text))
    if any(d > 2**31 - 1 for d in shape) or len(shape) > 64:
        raise BadInput(f"bad --input '{text}': dimensions too large")
    dtype = dtype.strip()
    if dtype and dtype not in DTYPE_CODES:
        raise BadInput(f"bad --input '{text}': unknown data type '{dtype}'; known: {', '.join(sorted(DTYPE_CODES))}")
    return name.strip(), InputSpec(shape, dtype or None)


def input_specs_from_json(obj: Any) -> dict[str, InputSpec]:
    """A request's `"inputs": {"name": {"shape": [1, 3, 720, 1280], "dataType": "float32"}}`."""
    if not isinstance(obj, Mapping):
        raise BadInput('"inputs" must be an object of {"name": {"shape": [...], "dataType": "..."}}')
    specs: dict[str, InputSpec] = {}
    for name, spec in obj.items():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("shape"), list):
            raise BadInput(f'input "{name}" needs a "shape" list')
        shape = spec["shape"]
        if len(shape) > 64 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape):
            raise BadInput(f'input "{name}" has a bad shape {shape!r}: dimensions must be non-negative integers')
        dtype = spec.get("dataType")
        if dtype is not None and dtype not in DTYPE_CODES:
            raise BadInput(f'input "{name}" has an unknown dataType {dtype!r}')
        specs[str(name)] = InputSpec(tuple(shape), dtype)
    return specs
