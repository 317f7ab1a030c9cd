"""An LLM app's generation, in its own terms: time to first token, time per output token, the whole.

A generation of O tokens after a prompt of P tokens runs a prefill (the P prompt tokens
against an empty KV cache), which yields the first token, then one decode step per
further token: the j-th output token (j = 2..O) comes from a step of one token against a
past of P + j - 2 tokens. So

- time to first token (TTFT) = the prefill;
- time per output token (TPOT) = the mean decode step over the context the answer spans;
- the whole = TTFT + the sum of the O - 1 decode steps.

A decode step's time grows smoothly with its past (the KV cache it reads and appends
to), so it is priced at a few pasts across the span (`DECODE_POINTS`) and summed as the
piecewise-linear curve through them over every integer past. A generation is then a
weighted sum of kernel plans: the prefill's weight is 1, each decode point's weight the
number of steps it stands for. Pricing it again after a new calibration is the same sum
of the plans' new prices, which is how monitors keep it.

What the device must hold: the weights, the KV cache at the full context (the last
step's cache in and out) and the activations at their peak (a long prompt's logits are
the largest: 2,048 tokens of a 152k vocabulary are 1.2 GB of float32).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from monitors.errors import BadInput
from monitors.pricing.kernels import Plan
from monitors.pricing.tiers import tier_for

if TYPE_CHECKING:  # types only: the agent's main process reads plans, it never imports graphs (agent/analysis.py)
    from monitors.graphs.decoder import Decoder
    from monitors.graphs.graph import Graph, InputSpec

DECODE_POINTS = 3  # pasts at which a decode step is priced (the first, the middle, the last)
MAX_TOKENS = 1 << 20  # a prompt or an answer longer than this is not a request anyone makes


@dataclass(frozen=True)
class GenerationSpec:
    """What an app asks about: a prompt of `prompt_tokens` and an answer of `output_tokens`."""

    prompt_tokens: int
    output_tokens: int
    batch: int = 1

    def __post_init__(self) -> None:
        for name, value, low in (("prompt tokens", self.prompt_tokens, 1), ("output tokens", self.output_tokens, 1),
                                 ("batch", self.batch, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
                raise BadInput(f"{name} must be a whole number from {low} to {MAX_TOKENS}, not {value!r}",
                               "bad_generation")

    @property
    def context(self) -> int:
        """Tokens in the cache after the last step (the last output token is never fed back)."""
        return self.prompt_tokens + self.output_tokens - 1


def decode_pasts(spec: GenerationSpec, points: int = DECODE_POINTS) -> list[int]:
    """The pasts at which a decode step is priced: spread evenly over those the answer's steps have."""
    first, last = spec.prompt_tokens, spec.prompt_tokens + spec.output_tokens - 2
    if last < first:
        return []
    steps = last - first + 1
    if steps <= points:
        return list(range(first, last + 1))
    return sorted({int(round(x)) for x in np.linspace(first, last, points)})


def decode_weights(pasts: list[int], first: int, last: int) -> list[float]:
    """Weights w such that sum(w[i] * f(pasts[i])) is the sum of f over every integer past from `first` to
    `last`, f taken piecewise linear through the priced pasts (exact when f is)."""
    if not pasts:
        return []
    if len(pasts) == 1:
        return [float(last - first + 1)]
    every = np.arange(first, last + 1, dtype=np.float64)
    weights = []
    for i in range(len(pasts)):
        unit = np.zeros(len(pasts))
        unit[i] = 1.0
        weights.append(float(np.interp(every, pasts, unit).sum()))
    return weights


@dataclass(frozen=True)
class GenerationPlan:
    """The kernel plans of a generation and the weights that add them up."""

    spec: GenerationSpec
    prefill: Plan
    decode: tuple[tuple[int, float, Plan], ...]  # (past, steps it stands for, plan)
    memory_bytes: int

    @property
    def terms(self) -> list[tuple[float, Plan]]:
        """(weight, plan) pairs whose weighted sum is the whole generation."""
        return [(1.0, self.prefill)] + [(w, plan) for _, w, plan in self.decode]

    @property
    def kernels(self) -> int:
        """Kernels of the prefill (what one run dispatches)."""
        return len(self.prefill.kernels)

    @property
    def written_mb(self) -> float:
        """MB of activations the whole generation writes (the handoff extra's bytes)."""
        return sum(w * plan.written_mb for w, plan in self.terms)

    def to_json(self) -> str:
        return json.dumps({
            "generation": [self.spec.prompt_tokens, self.spec.output_tokens, self.spec.batch],
            "prefill": json.loads(self.prefill.to_json()),
            "decode": [[past, weight, json.loads(plan.to_json())] for past, weight, plan in self.decode],
            "memory_bytes": self.memory_bytes,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> GenerationPlan:
        d = json.loads(text)
        prompt, output, batch = d["generation"]
        return cls(GenerationSpec(int(prompt), int(output), int(batch)),
                   Plan.from_json(json.dumps(d["prefill"])),
                   tuple((int(past), float(w), Plan.from_json(json.dumps(p))) for past, w, p in d["decode"]),
                   int(d["memory_bytes"]))


def plan_from_json(text: str) -> Plan | GenerationPlan:
    """A stored plan: one inference's (Plan.to_json) or a generation's (GenerationPlan.to_json)."""
    if text.lstrip().startswith('{"generation"'):
        return GenerationPlan.from_json(text)
    return Plan.from_json(text)


def plan_generation(decoder: Decoder, spec: GenerationSpec,
                    graph_of: Callable[[Mapping[str, InputSpec]], Graph],
                    plan_of: Callable[[Graph], Plan]) -> GenerationPlan:
    """Plan the prefill and the decode points of a generation: `graph_of` binds the decoder's inputs and
    infers every shape (monitors.graphs.shapes.bind_and_infer), `plan_of` plans the kernels."""
    if decoder.context_limit and spec.context > decoder.context_limit:
        raise BadInput(f"a prompt of {spec.prompt_tokens} and an answer of {spec.output_tokens} tokens need a "
                       f"context of {spec.context}; this model's is {decoder.context_limit}", "bad_generation")
    prefill = plan_of(graph_of(decoder.bindings(spec.prompt_tokens, 0, spec.batch)))
    pasts = decode_pasts(spec)
    first, last = spec.prompt_tokens, spec.prompt_tokens + spec.output_tokens - 2
    decode = tuple((past, weight, plan_of(graph_of(decoder.bindings(1, past, spec.batch))))
                   for past, weight in zip(pasts, decode_weights(pasts, first, last), strict=True))
    plans = [prefill] + [plan for _, _, plan in decode]
    memory = max(p.weight_bytes for p in plans) + max(p.peak_activation_bytes for p in plans)
    return GenerationPlan(spec, prefill, decode, memory)


@dataclass(frozen=True)
class GenerationTimes:
    """A generation's times (ms; inf when the model cannot run on the device now) and their tiers."""

    ttft_ms: float
    tpot_ms: float  # 0 for an answer of one token
    total_ms: float

    @property
    def tier(self) -> str:
        """The tier of the whole generation: what `meets` and monitors compare."""
        return tier_for(self.total_ms)

    @property
    def ttft_tier(self) -> str:
        return tier_for(self.ttft_ms)

    @property
    def tpot_tier(self) -> str:
        return tier_for(self.tpot_ms)

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.total_ms)


def generation_times(plan: GenerationPlan, price_ms: Callable[[Plan], float]) -> GenerationTimes:
    """TTFT, time per output token and the whole, with each plan priced by `price_ms` (on the device at rest,
    or now: its latency times the present slowdown plus the handoff extra for the MB it writes)."""
    ttft = price_ms(plan.prefill)
    steps = sum(w for _, w, _ in plan.decode)
    decoding = sum(w * price_ms(p) for _, w, p in plan.decode)
    return GenerationTimes(ttft, decoding / steps if steps else 0.0, ttft + decoding)

