"""A causal language model's inputs, found in its graph: tokens, mask, positions and the KV cache.

An LLM app asks about a prompt and an answer, not about tensor shapes. One run of a
decoder graph is a prefill (the prompt's tokens, an empty cache) or a decode step (one
token, the cache of everything before it). This finds which input is which, from the
graph and, where onnxruntime-genai's `genai_config.json` sits beside the model, from
the names it declares, so that a caller gives only a number of new tokens and a past
length:

- tokens: `input_ids` [batch, new] (or `inputs_embeds` [batch, new, hidden]);
- mask: `attention_mask` [batch, past + new]; positions: `position_ids` [batch, new];
- cache: every input named like `past_key_values.N.key` (genai's `past_key_names`, or
  any input with `past` in its name): [batch, kv heads, past, head size], the past axis
  being the one whose dimension is named for it (else the second to last).

The head size, when the graph leaves it symbolic (onnxruntime-genai writes
`kv_cache_dim`), comes from genai_config's `head_size`, else from the attention op that
reads the cache: its query's width (a weight's descriptor) over its number of heads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from monitors.errors import GraphError
from monitors.graphs.graph import InputSpec
from monitors.graphs.shapes import real_inputs

TOKEN_NAMES = ("input_ids", "inputs_embeds")
MASK_NAMES = ("attention_mask",)
POSITION_NAMES = ("position_ids",)
_PAST = re.compile(r"past", re.IGNORECASE)
_PAST_AXIS = re.compile(r"past|seq|length|len", re.IGNORECASE)
CONFIG_FILE = "genai_config.json"
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class CacheInput:
    name: str
    dims: tuple[int | str | None, ...]  # as declared
    past_axis: int


@dataclass(frozen=True)
class Decoder:
    """Which input is which, and what the symbolic dimensions of the cache stand for."""

    tokens: str
    token_rank: int  # 2 for ids, 3 for embeddings
    hidden: int | None  # the embedding width, for inputs_embeds
    mask: str | None
    positions: str | None
    caches: tuple[CacheInput, ...]
    head_size: int
    context_limit: int | None = None  # genai_config's context_length, where given

    def bindings(self, new_tokens: int, past: int, batch: int = 1) -> dict[str, InputSpec]:
        """The input shapes of one run: `new_tokens` tokens after a cache of `past` (0: a prefill)."""
        if new_tokens < 1 or past < 0 or batch < 1:
            raise GraphError(f"a decoder run needs at least one new token and a past of 0 or more, not "
                             f"{new_tokens} after {past}")
        tokens = (batch, new_tokens) if self.token_rank == 2 else (batch, new_tokens, self.hidden or 0)
        specs = {self.tokens: InputSpec(tokens)}
        if self.mask:
            specs[self.mask] = InputSpec((batch, past + new_tokens))
        if self.positions:
            specs[self.positions] = InputSpec((batch, new_tokens))
        for cache in self.caches:
            dims = []
            for axis, d in enumerate(cache.dims):
                if axis == cache.past_axis:
                    dims.append(past)
                elif axis == 0 and not isinstance(d, int):
                    dims.append(batch)
                elif axis == len(cache.dims) - 1 and not isinstance(d, int):
                    dims.append(self.head_size)
                elif isinstance(d, int):
                    dims.append(d)
                else:
                    raise GraphError(f"cache input '{cache.name}' has a symbolic dimension '{d}' at axis {axis} "
                                     "that is neither batch, past length nor head size")
            specs[cache.name] = InputSpec(tuple(dims))
        return specs


def read_genai_config(model_path: str | Path) -> dict[str, Any] | None:
    """genai_config.json beside a model file, or None (absent, unreadable or not JSON: the graph alone says)."""
    path = Path(model_path).with_name(CONFIG_FILE)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        config = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) else None


def find_decoder(model: onnx.ModelProto, config: Mapping[str, Any] | None = None) -> Decoder:
    """The decoder's inputs; GraphError with one line when the graph is not a causal LM with a KV cache."""
    decoder_config = _decoder_config(config)
    names = decoder_config.get("inputs", {}) if isinstance(decoder_config.get("inputs"), dict) else {}
    feeds = {v.name: v for v in real_inputs(model.graph)}
    tokens = _pick(feeds, [names.get("input_ids")] + list(TOKEN_NAMES))
    if tokens is None:
        raise GraphError("not a language model: no input_ids (or inputs_embeds) input; its inputs are: "
                         + ", ".join(feeds))
    token_dims = _dims(feeds[tokens])
    hidden = token_dims[2] if len(token_dims) == 3 and isinstance(token_dims[2], int) else None
    mask = _pick(feeds, [names.get("attention_mask")] + list(MASK_NAMES))
    positions = _pick(feeds, [names.get("position_ids")] + list(POSITION_NAMES))
    patterns = [p for p in (names.get("past_key_names"), names.get("past_value_names")) if isinstance(p, str)]
    cache_names = [n for n in feeds if n not in (tokens, mask, positions) and (
        any(_matches(p, n) for p in patterns) or _PAST.search(n))]
    if not cache_names:
        raise GraphError("not a decoder with a KV cache: no input named like past_key_values.N.key")
    caches = tuple(_cache_input(feeds[n]) for n in cache_names)
    others = [n for n in feeds if n not in (tokens, mask, positions, *cache_names)]
    if others:
        raise GraphError(f"the decoder has inputs that are neither tokens, mask, positions nor cache: "
                         f"{', '.join(others)}")
    head = _declared_head(caches) or _config_int(decoder_config, "head_size") or _head_from_graph(model, caches)
    if not head:
        raise GraphError(f"cannot tell the head size of the cache input '{caches[0].name}': the graph leaves it "
                         "symbolic and no genai_config.json says it; bind the inputs with --input instead")
    limit = _config_int(config.get("model", {}) if isinstance(config, Mapping) else {}, "context_length")
    return Decoder(tokens, len(token_dims), hidden, mask, positions, caches, head, limit)


def _decoder_config(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        return {}
    model = config.get("model")
    decoder = model.get("decoder") if isinstance(model, Mapping) else None
    return decoder if isinstance(decoder, Mapping) else {}


def _config_int(section: Mapping[str, Any], key: str) -> int | None:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _matches(pattern: str, name: str) -> bool:
    """genai's printf-style name pattern ('past_key_values.%d.key') against an input name."""
    regex = "".join(r"\d+" if part == "%d" else re.escape(part) for part in re.split(r"(%d)", pattern))
    return re.fullmatch(regex, name) is not None


def _pick(feeds: Mapping[str, onnx.ValueInfoProto], candidates: list[Any]) -> str | None:
    return next((c for c in candidates if isinstance(c, str) and c in feeds), None)


def _dims(value: onnx.ValueInfoProto) -> tuple[int | str | None, ...]:
    shape = value.type.tensor_type.shape
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim)


def _cache_input(value: onnx.ValueInfoProto) -> CacheInput:
    dims = _dims(value)
    if len(dims) < 3:
        raise GraphError(f"cache input '{value.name}' has rank {len(dims)}; expected [batch, heads, past, head size]")
    named = [axis for axis, d in enumerate(dims[:-1]) if isinstance(d, str) and _PAST_AXIS.search(d) and axis > 0]
    return CacheInput(value.name, dims, named[0] if named else len(dims) - 2)


def _declared_head(caches: tuple[CacheInput, ...]) -> int | None:
    last = {c.dims[-1] for c in caches}
    if len(last) != 1:
        return None
    (head,) = last
    return head if isinstance(head, int) else None


def _head_from_graph(model: onnx.ModelProto, caches: tuple[CacheInput, ...]) -> int | None:
    """The head size from the attention op reading a cache input: its query's width over its heads."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    weights = {t.name: tuple(t.dims) for t in graph.initializer}
    names = {c.name for c in caches}
    for node in graph.node:
        if node.op_type not in ("GroupQueryAttention", "MultiHeadAttention") or not names & set(node.input):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        heads, kv_heads = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
        width = _width(node.input[0], producer, weights, 0)
        if not width or heads <= 0:
            continue
        packed = node.op_type == "GroupQueryAttention" and (len(node.input) < 2 or not node.input[1])
        parts = heads + 2 * kv_heads if packed else heads
        if width % parts == 0:
            return width // parts
    return None


_WIDTH_PRESERVING = {"Add", "Sub", "Mul", "Div", "Cast", "RotaryEmbedding", "Relu", "Identity", "BiasAdd"}


def _width(tensor: str, producer: Mapping[str, onnx.NodeProto], weights: Mapping[str, tuple[int, ...]],
           depth: int) -> int | None:
    """The last dimension of an activation, read off the weights that produce it (never their values)."""
    node = producer.get(tensor)
    if node is None or depth > 16:
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "MatMulNBits":
        return attrs.get("N")
    if node.op_type in ("MatMul", "FusedMatMul", "Gemm") and len(node.input) > 1 and node.input[1] in weights:
        w = weights[node.input[1]]
        trans = attrs.get("transB", 0)
        return (w[-2] if trans else w[-1]) if len(w) >= 2 else None
    if node.op_type in _WIDTH_PRESERVING:
        for i in node.input:
            if i and i not in weights:
                width = _width(i, producer, weights, depth + 1)
                if width:
                    return width
    return None
