"""Validation limits: how large a graph the agent agrees to look at.

A graph comes from an untrusted app over MQTT. Every step of the import is
bounded by these figures so that a hostile graph (millions of nodes, huge
shapes, deep nesting) is refused with one clear line instead of exhausting
the device. Each violation raises `LimitExceeded`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from monitors.errors import BadInput, GraphError, LimitExceeded

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 100_000              # nodes, subgraphs included
    max_tensor_elements: int = 2**31      # elements of any one tensor (weights included, never allocated)
    max_dim: int = 2**31 - 1              # any one dimension
    max_rank: int = 8                     # dimensions of any one tensor
    max_total_flops: float = 1e15         # 2 * MACs of MatMul/Gemm/Conv/ConvTranspose/attention/RNN
    max_graph_depth: int = 4              # nesting of subgraphs (If/Loop/Scan bodies)
    max_file_bytes: int = 64 * MiB        # model bytes passed inline (MQTT); a path may be larger
    max_stripped_bytes: int = 64 * MiB    # the model once weights are stripped (topology + small tensors)
    max_tensors: int = 1_000_000          # distinct tensor names

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Limits:
        """Build from a configuration table (e.g. `[limits]` in the agent's TOML)."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise BadInput(f"unknown limit '{key}'; known: {', '.join(sorted(known))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise BadInput(f"limit '{key}' must be a positive number, not {value!r}")
            kwargs[key] = float(value) if key == "max_total_flops" else int(value)
        return cls(**kwargs)

    # One check per limit, so every message reads the same way.

    def check_file_bytes(self, n: int, what: str) -> None:
        if n > self.max_file_bytes:
            raise LimitExceeded(f"{what} is {n} bytes, more than the limit of {self.max_file_bytes}")

    def check_stripped_bytes(self, n: int, what: str) -> None:
        if n > self.max_stripped_bytes:
            raise LimitExceeded(
                f"{what} holds more than {self.max_stripped_bytes} bytes besides its weights "
                "(limit max_stripped_bytes)")

    def check_nodes(self, n: int) -> None:
        if n > self.max_nodes:
            raise LimitExceeded(f"graph has more than {self.max_nodes} nodes (limit max_nodes)")

    def check_tensors(self, n: int) -> None:
        if n > self.max_tensors:
            raise LimitExceeded(f"graph has more than {self.max_tensors} tensors (limit max_tensors)")

    def check_depth(self, depth: int) -> None:
        if depth > self.max_graph_depth:
            raise LimitExceeded(f"subgraphs nested {depth} deep, more than the limit of {self.max_graph_depth}")

    def check_shape(self, name: str, shape: tuple[int, ...] | list[int]) -> None:
        """A concrete shape: rank, each dimension and the element count within bounds."""
        if len(shape) > self.max_rank:
            raise LimitExceeded(f"tensor '{name}' has rank {len(shape)}, more than the limit of {self.max_rank}")
        elements = 1
        for d in shape:
            if d < 0:
                raise GraphError(f"tensor '{name}' has a negative dimension {d} in shape {list(shape)}")
            if d > self.max_dim:
                raise LimitExceeded(f"tensor '{name}' has dimension {d}, more than the limit of {self.max_dim}")
            elements *= d
        if elements > self.max_tensor_elements:
            raise LimitExceeded(
                f"tensor '{name}' of shape {list(shape)} has {elements} elements, "
                f"more than the limit of {self.max_tensor_elements}")

    def check_flops(self, flops: float) -> None:
        if flops > self.max_total_flops:
            raise LimitExceeded(f"graph needs about {flops:.3g} FLOPs, more than the limit of "
                                f"{self.max_total_flops:.3g}")
