"""The fields of a request: the model, the inputs' shapes, the requirement, a group's workloads (docs/mqtt.md)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

Model = Union[str, "os.PathLike[str]", bytes, Mapping[str, Any]]


def model_fields(model: Model) -> dict[str, Any]:
    """A path (.onnx/.webnn/.json), ONNX bytes, or a webnn-graph-json dict -> the request's model field."""
    if isinstance(model, (bytes, bytearray)):
        return {"onnx": base64.b64encode(bytes(model)).decode("ascii")}
    if isinstance(model, Mapping):
        return {"graph": dict(model)}
    path = Path(model)
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return {"onnx": base64.b64encode(path.read_bytes()).decode("ascii")}
    if suffix == ".webnn":
        return {"webnn": path.read_text(encoding="utf-8")}
    if suffix == ".json":
        return {"graph": json.loads(path.read_text(encoding="utf-8"))}
    raise ValueError(f"{path}: a model is .onnx, .webnn or .json")


def inputs_field(inputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """{"name": (shape, dtype) | object with .shape/.dtype | {"shape": ..., "dataType": ...}} -> "inputs"."""
    if not inputs:
        return {}
    out: dict[str, Any] = {}
    for name, spec in inputs.items():
        if isinstance(spec, Mapping):
            out[name] = dict(spec)
        elif hasattr(spec, "shape"):
            dtype = getattr(spec, "dtype", None)
            out[name] = {"shape": list(spec.shape), **({"dataType": dtype} if dtype else {})}
        else:
            shape, dtype = spec
            out[name] = {"shape": list(shape), **({"dataType": dtype} if dtype else {})}
    return {"inputs": out}


def generation_field(generation: tuple[int, int] | None) -> dict[str, Any]:
    """(prompt tokens, output tokens) -> the request's "generation": an LLM's whole answer is priced."""
    if generation is None:
        return {}
    prompt, output = generation
    return {"generation": {"promptTokens": prompt, "outputTokens": output}}


@dataclass(frozen=True)
class Context:
    """WebNN's MLContextOptions: where the agent places the model (None: its default, the fastest device)."""

    device_type: str | None = None  # cpu, gpu, npu
    power_preference: str | None = None  # default, high-performance, low-power, fallback
    accelerated: bool | None = None

    def fields(self) -> dict[str, Any]:
        out = {"deviceType": self.device_type, "powerPreference": self.power_preference,
               "accelerated": self.accelerated}
        return {k: v for k, v in out.items() if v is not None}


def requirement_fields(tier: str | None = None, rate: float | None = None,
                       deadline_ms: float | None = None) -> dict[str, Any]:
    """A tier, or a rate (runs a second) and/or a deadline (ms per run): the agent checks the values."""
    if tier is not None:
        if rate is not None or deadline_ms is not None:
            raise ValueError("a requirement is a tier, or a rate and/or a deadline, not both")
        return {"requiredTier": tier}
    if rate is None and deadline_ms is None:
        raise ValueError("a requirement needs a tier, a rate or a deadline")
    out: dict[str, Any] = {}
    if rate is not None:
        out["requiredRate"] = rate
    if deadline_ms is not None:
        out["requiredDeadlineMs"] = deadline_ms
    return out


@dataclass(frozen=True)
class Workload:
    """One member of a group: a model that runs beside the others, with its own requirement."""

    name: str
    model: Model
    inputs: Mapping[str, Any] | None = None
    tier: str | None = None
    rate: float | None = None
    deadline_ms: float | None = None
    generation: tuple[int, int] | None = None  # an LLM's (prompt tokens, output tokens)

    def fields(self) -> dict[str, Any]:
        return {"name": self.name, **model_fields(self.model), **inputs_field(self.inputs),
                **generation_field(self.generation), **requirement_fields(self.tier, self.rate, self.deadline_ms)}
