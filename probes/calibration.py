"""The calibration: what the micro-benchmarks measured, and what they depend on.

Pure data: probes/microbench.py produces it, agent/calibration_store.py keeps
it in the state dir, monitors/pricing/costmodel.py turns it into latencies. When the
fingerprint (CPU model, core count, onnxruntime version, format) no longer
matches the device, the calibration is redone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

FORMAT_VERSION = 13  # 2: per-op tables for memory-bound kernels, cache size; 3: weight streaming rate;
# 4: the cache size measured, not reported; overheads from the wall clock alone; 5: the read rates over
# working sets around the cache; every reading the fastest of three passes; 6: read rates by
# onnxruntime's own MatMul, out to eight times the reported cache; 7: the warm refresh's reference is the
# wall time of a lock-stepped multi-threaded probe; 8: the LLM kernels (MatMulNBits, int8 matmuls,
# GroupQueryAttention, rotary, RMS norms, quantized gathers); 9: the read-rate sweep out to 1 GiB or more, and
# the rate of a chain of float products over weights the session holds (FloatReads, quantized_read_rates["gemm"]);
# 10: Where's condition as masks are (runs, not coin flips: 6x faster), SiLU's own table (QuickGelu of alpha 1,
# 2.6x faster than CLIP's alpha), the warm refresh's stream probe; 11: attention's decode points in the cache only, and
# chains of decode-step attentions beyond it (AttentionChains: attention_chains); 12: the blocked layout's Upsample
# (NCHWC_UPSAMPLE), 3-4x faster than the plain Resize; 13: the quantized read chains over distinct weights (equal ones
# are shared and read from the cache: their rate was 2x memory's on an AMD EPYC family 26 VM)


# The families calibrated over multi-dimensional grids of compute (FLOPs); the others are memory-bound,
# one axis of bytes moved. monitors/pricing/kernels.py describes each family's grid coordinates.
COMPUTE_FAMILIES: tuple[str, ...] = ("conv", "conv1x1", "dwconv", "gemm", "bmm", "nbits", "nbits_f", "qgemm", "gqa")
# The families onnxruntime computes with its float matrix products: what the warm refresh's gemm probe follows
# (probes/refresh.py), and what the gemm multiplier stretches (monitors/speed/present.py).
FLOAT_PRODUCTS: tuple[str, ...] = ("gemm", "bmm")
# Block-quantized weights (MatMulNBits), by how onnxruntime computes with them: `nbits` multiplies in int8
# (accuracy_level 4: the activations quantized on the fly), `nbits_f` in float (levels 0 to 3).
NBITS_FAMILIES: tuple[str, ...] = ("nbits", "nbits_f")
NBITS_BLOCK = 32  # onnxruntime-genai's block size for int4 on the CPU, with one float scale per block
# The chain of block-quantized products that QuantizedReads times beyond the cache: QUANTIZED_CHAIN_KERNELS one-row
# MatMulNBits of K = QUANTIZED_CHAIN_K, 4-bit, over all the bytes it records, and QUANTIZED_CHAIN_SMALL over the same
# bytes (the two give the time per kernel). The cost model prices the same chains in the cache to tell the reading in
# their measured times from the computing (monitors/pricing/costmodel.py).
QUANTIZED_CHAIN_K = 1024
QUANTIZED_CHAIN_KERNELS = 4
QUANTIZED_CHAIN_SMALL = 64
# A block-quantized product's K beyond a multiple of NBITS_TAIL_PERIOD, in the steps NbitsTails times: onnxruntime's
# int8-compute kernel runs a tail of two or three blocks of 32 slower (on a 2-core Intel Xeon VM with AVX-512 VNNI, at
# 256 rows: 219-225 GFLOP/s at K = 896, 1024 and 1152, 185-191 at 832, 960 and 1088, 169-175 at 864 and 992).
NBITS_TAIL_PERIOD = 128
NBITS_TAILS = (0, 32, 64, 96)
# The table of a Resize that onnxruntime runs in the blocked layout (NCHWc), as its own Upsample kernel: on a 2-core AMD
# EPYC VM (AVX2) 10-12 GB/s where the plain Resize moves 3 (monitors/pricing/planner.py says which Resizes do).
NCHWC_UPSAMPLE = "NchwcUpsample"


def work_of(family: str, p: tuple[float, ...]) -> float:
    """The work (FLOPs or bytes) of a calibration grid point; the planner computes the same for kernels.

    gqa's coordinates are (batch x heads, new tokens S, past + 1, head size): it multiplies S queries by
    S + past keys and values, 4 FLOPs per query, key and head element."""
    if family in ("conv", "conv1x1", "gemm", "dwconv", "nbits", "nbits_f", "qgemm"):
        return 2.0 * p[0] * p[1] * p[2]
    if family == "bmm":
        return 2.0 * p[0] * p[1] * p[2] * p[3]
    if family == "gqa":
        return 4.0 * p[0] * p[1] * (p[2] - 1.0 + p[1]) * p[3]
    return p[0]


@dataclass(frozen=True)
class FamilyTable:
    """Measured kernel times over one family's grid; unmeasured grid points are extrapolated."""

    axes: tuple[tuple[float, ...], ...]
    points: tuple[tuple[tuple[float, ...], float], ...]  # (grid coordinates, seconds)


@dataclass(frozen=True)
class Calibration:
    fingerprint: dict[str, str]
    tables: dict[str, FamilyTable]
    per_kernel_s: float
    per_run_s: float
    quick: bool = False
    seconds: float = 0.0  # how long calibrating took
    created: float = 0.0  # unix time
    # warm-refresh probe: fastest during and right after
    refresh_reference: dict[str, float] = field(default_factory=dict)
    stream_bytes_per_s: float = 0.0  # weights read from memory when they cannot stay cached (0: unmeasured)
    cache_bytes: int = 0  # the cache weights stay in between inferences, as measured (0: unmeasured)
    read_rates: tuple[tuple[int, float], ...] = ()  # (working set bytes, bytes/s read cyclically over it)
    # weights beyond the cache as a decode step's kernels read them, by compute family (block-quantized ones, and
    # "gemm": float32 ones held and prepacked by the session): (working set bytes, bytes/s, s per kernel)
    quantized_read_rates: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    # decode-step attentions whose KV caches come from memory, each timed in a chain of layers: (gqa coordinates
    # (query heads, 1 token, context, head size, KV heads), seconds a layer)
    attention_chains: tuple[tuple[tuple[float, ...], float], ...] = ()
    attention_chain_bytes: int = 0  # the past keys and values each of those chains reads a run (0: unmeasured)
    # how much slower an int8-compute block-quantized product of many rows runs where K is 0, 32, 64 or 96 beyond a
    # multiple of 128 (NBITS_TAILS), against K a multiple of 128 (empty: unmeasured)
    nbits_tails: tuple[float, ...] = ()

    @property
    def device(self) -> str:
        return self.fingerprint.get("device", "cpu")

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_VERSION,
                "fingerprint": self.fingerprint,
                "tables": {
                    name: {"axes": [list(a) for a in t.axes], "points": [[list(p), s] for p, s in t.points]}
                    for name, t in self.tables.items()
                },
                "per_kernel_s": self.per_kernel_s,
                "per_run_s": self.per_run_s,
                "quick": self.quick,
                "seconds": self.seconds,
                "created": self.created,
                "refresh_reference": self.refresh_reference,
                "stream_bytes_per_s": self.stream_bytes_per_s,
                "cache_bytes": self.cache_bytes,
                "read_rates": [list(r) for r in self.read_rates],
                "quantized_read_rates": {f: list(r) for f, r in self.quantized_read_rates.items()},
                "attention_chains": [[list(p), s] for p, s in self.attention_chains],
                "attention_chain_bytes": self.attention_chain_bytes,
                "nbits_tails": list(self.nbits_tails),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        """Raises ValueError (or KeyError/TypeError) on anything malformed."""
        d = json.loads(text)
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"calibration format {d.get('format')!r}, expected {FORMAT_VERSION}")
        tables = {
            name: FamilyTable(
                axes=tuple(tuple(float(v) for v in a) for a in t["axes"]),
                points=tuple((tuple(float(v) for v in p), float(s)) for p, s in t["points"]),
            )
            for name, t in d["tables"].items()
        }
        return cls(
            fingerprint={str(k): str(v) for k, v in d["fingerprint"].items()},
            tables=tables,
            per_kernel_s=float(d["per_kernel_s"]),
            per_run_s=float(d["per_run_s"]),
            quick=bool(d.get("quick", False)),
            seconds=float(d.get("seconds", 0.0)),
            created=float(d.get("created", 0.0)),
            refresh_reference={str(k): float(v) for k, v in d.get("refresh_reference", {}).items()},
            stream_bytes_per_s=float(d.get("stream_bytes_per_s", 0.0)),
            cache_bytes=int(d.get("cache_bytes", 0)),
            read_rates=tuple((int(size), float(rate)) for size, rate in d.get("read_rates", ())),
            quantized_read_rates={str(f): (int(r[0]), float(r[1]), float(r[2]))
                                  for f, r in d.get("quantized_read_rates", {}).items()},
            attention_chains=tuple((tuple(float(v) for v in p), float(s)) for p, s in d.get("attention_chains", ())),
            attention_chain_bytes=int(d.get("attention_chain_bytes", 0)),
            nbits_tails=tuple(float(v) for v in d.get("nbits_tails", ())),
        )
