"""Kernels: what onnxruntime actually dispatches, and the parameters that set their cost.

A `Plan` is the list of kernels one inference runs; the cost model prices each
kernel from the calibration table of its family. Families and their grid
coordinates (all in log space when interpolated):

- compute-bound, `work` = FLOPs:
  - ``conv``     (M = N*Ho*Wo, K = Cin/groups*kh*kw, Co = Cout/groups), spatial kernels
  - ``conv1x1``  (M, K = Cin/groups, Co = Cout/groups), pointwise kernels
  - ``dwconv``   (C, M = N*Ho*Wo, taps = kh*kw), depthwise
  - ``gemm``     (M, K, N): one operand is a weight (MatMul/Gemm against a constant)
  - ``bmm``      (B, M, K, N): both operands are activations (attention scores, ...)
  - ``nbits``    (M, K, N, bits, block size, scale bytes): MatMulNBits, block-quantized weights multiplied
                 in int8 (accuracy level 4); ``nbits_f``: the same multiplied in float (levels 0-3)
  - ``qgemm``    (M, K, N): int8 weights (DynamicQuantizeMatMul, MatMulInteger, QLinearMatMul)
  - ``gqa``      (batch x heads, new tokens, past + 1, head size, batch x KV heads): GroupQueryAttention
                 and the other fused attention ops, KV cache append and rotary included
- memory-bound, `work` = bytes read + written, coordinate (bytes,):
  ``eltwise`` (cheap unary/binary), ``transcend`` (exp/erf/tanh/sigmoid/gelu...),
  ``movement`` (transpose/concat/slice/gather/pad/resize/reorder...), ``reduce``,
  ``softmax``, ``norm`` (layer/instance/group/RMS normalisation), ``pool``.
- ``view``: Reshape, Squeeze, ...: onnxruntime re-labels memory where it can, and copies where it cannot.

Memory-bound kernels are priced from their own op's calibration where it was
measured (Add, Where, Softmax, LayerNormalization, Gelu, ...), else from their
family's representative op (monitors/pricing/costmodel.py: REPRESENTATIVE).

Every kernel also pays the per-kernel dispatch overhead; every run pays the
per-run overhead. Both are calibrated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from probes.calibration import COMPUTE_FAMILIES

MEMORY_FAMILIES: tuple[str, ...] = ("eltwise", "transcend", "movement", "reduce", "softmax", "norm", "pool")
FAMILIES: tuple[str, ...] = COMPUTE_FAMILIES + MEMORY_FAMILIES + ("view",)
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Kernel:
    family: str
    params: tuple[float, ...]
    work: float  # FLOPs for compute families, bytes moved for memory families
    op: str = ""  # the ONNX op(s) it runs, for display and tests
    repeat: int = 1  # identical kernels run back to back (grouped convolution's groups)
    # A fused activation that the kernel applies in a second pass over its output, priced as that
    # memory-bound op without a dispatch of its own: MLAS's blocked convolutions run only Relu inside.
    epilogue: Kernel | None = None
    # The activation bytes a convolution reads in all, which its parameters do not tell (a strided one reads more
    # than it writes); 0: derived from the parameters (read_bytes), as in plans stored before it.
    input_bytes: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(float(p) for p in self.params))
        object.__setattr__(self, "work", float(self.work))

    def to_json(self) -> list:
        item = [self.family, list(self.params), self.work, self.op, self.repeat]
        epilogue = self.epilogue.to_json() if self.epilogue else None
        if self.input_bytes:
            return item + [epilogue, self.input_bytes]
        return item + [epilogue] if epilogue else item

    @classmethod
    def from_json(cls, item: list) -> Kernel:
        family, params, work, op, repeat, *rest = item  # plans stored before epilogues and input_bytes lack them
        if family not in FAMILIES:
            raise ValueError(f"unknown kernel family {family!r}")
        epilogue = cls.from_json(rest[0]) if rest and rest[0] else None
        return cls(family, tuple(float(p) for p in params), float(work), str(op), int(repeat), epilogue,
                   float(rest[1]) if len(rest) > 1 else 0.0)

    @property
    def read_bytes(self) -> float:
        """The activation bytes the kernel reads (float32; weights apart): what it streams from memory, with what it
        writes, when they do not fit in the cache (CostModel.seconds)."""
        if self.input_bytes:
            return self.input_bytes
        p, family = self.params, self.family
        if family in ("conv1x1", "dwconv", "gemm", "nbits", "nbits_f", "qgemm"):  # (M, K, ...), (C, M, ...): stride 1
            elements = p[0] * p[1]
        elif family == "bmm":  # (B, M, K, N): both operands
            elements = p[0] * (p[1] * p[2] + p[2] * p[3])
        elif family == "conv":  # not told (a plan stored before input_bytes): its output's size
            return self.written_bytes
        elif family in ("gqa", "view"):  # the attention's KV cache is priced apart; a view moves nothing
            return 0.0
        else:  # memory-bound: work = bytes read + written; count half as read
            return self.work / 2 * self.repeat
        return elements * FLOAT_BYTES * self.repeat

    @property
    def written_bytes(self) -> float:
        """The activation bytes the kernel writes, which the next kernel reads (float32): what the intra-op
        threads hand each other, and what a host whose vCPUs sit apart charges extra for
        (monitors/speed/prediction.py)."""
        p, family = self.params, self.family
        if family in ("conv", "conv1x1", "gemm", "nbits", "nbits_f", "qgemm"):  # (M, K, N): an M x N output
            elements = p[0] * p[2]
        elif family == "gqa":  # (B x heads, S, past + 1, head): the attention's output
            elements = p[0] * p[1] * p[3]
        elif family == "dwconv":  # (C, M, taps)
            elements = p[0] * p[1]
        elif family == "bmm":  # (B, M, K, N)
            elements = p[0] * p[1] * p[3]
        elif family == "view":  # a relabelling, or a copy the plan prices as movement
            return 0.0
        else:  # memory-bound: work = bytes read + written; count half as written
            return self.work / 2 * self.repeat
        return elements * FLOAT_BYTES * self.repeat


@dataclass(frozen=True)
class Plan:
    """The kernels of one inference, plus what the device must hold to run them."""

    kernels: tuple[Kernel, ...]
    weight_bytes: int = 0
    peak_activation_bytes: int = 0
    flops: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.peak_activation_bytes

    @property
    def written_mb(self) -> float:
        """MB of activations the kernels of one inference write (Kernel.written_bytes)."""
        return sum(k.written_bytes for k in self.kernels) / 1e6

    def to_json(self) -> str:
        return json.dumps(
            {
                "kernels": [k.to_json() for k in self.kernels],
                "weight_bytes": self.weight_bytes,
                "peak_activation_bytes": self.peak_activation_bytes,
                "flops": self.flops,
                "notes": list(self.notes),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        return cls(
            kernels=tuple(Kernel.from_json(k) for k in d["kernels"]),
            weight_bytes=int(d["weight_bytes"]),
            peak_activation_bytes=int(d["peak_activation_bytes"]),
            flops=float(d["flops"]),
            notes=tuple(d.get("notes", ())),
        )
