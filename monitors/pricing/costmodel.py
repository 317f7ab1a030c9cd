"""Price a kernel plan from a calibration: piecewise-linear interpolation in log space.

Each family's calibration is a grid over its parameters (log-spaced). What is
interpolated is log(efficiency) = log(work / time), multilinearly over the
log parameters; that is the same as interpolating log(time), since log(work)
is linear in the log parameters, but it extrapolates sensibly: beyond the
grid, efficiency holds at the edge, so time grows in proportion to work
(FLOPs or bytes moved) instead of following the last slope off a cliff.
Grid points too costly to measure take the efficiency measured at the largest
point they dominate (efficiency rises with size, then saturates), or that of
the nearest measured point when they dominate none. No point is credited
with more than 1.25x the best efficiency of the points that ran long enough
to be timed well: a tiny kernel's reading is mostly fixed costs and noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from monitors.pricing.kernels import Kernel, Plan
from probes.calibration import (
    COMPUTE_FAMILIES,
    FLOAT_PRODUCTS,
    NBITS_BLOCK,
    NBITS_FAMILIES,
    NBITS_TAIL_PERIOD,
    NBITS_TAILS,
    QUANTIZED_CHAIN_K,
    QUANTIZED_CHAIN_KERNELS,
    QUANTIZED_CHAIN_SMALL,
    Calibration,
    FamilyTable,
    work_of,
)

# A memory-bound kernel is priced from its own op's table when calibration measured that op, else from
# its family's representative op.
REPRESENTATIVE = {"eltwise": "Add", "transcend": "Erf", "movement": "Transpose", "reduce": "ReduceMean",
                  "softmax": "Softmax", "norm": "LayerNormalization", "pool": "MaxPool", "view": "Reshape"}
ALIASES = {"Upsample": "Resize", "Sub": "Add", "Div": "Mul", "SkipLayerNormalization": "LayerNormalization",
           "RMSNormalization": "SimplifiedLayerNormalization",
           "MemcpyFromHost": "MemcpyHost", "MemcpyToHost": "MemcpyHost"}  # the GPU's table (probes/microbench.py)


@dataclass
class _Interpolator:
    axes: list[np.ndarray]  # log coordinates, ascending
    values: np.ndarray  # log efficiency at every grid point

    def __call__(self, params: tuple[float, ...]) -> float:
        idx: list[tuple[int, int, float]] = []
        # not strict: params beyond the grid's axes (a quantized matmul's bits) do not index it
        for axis, p in zip(self.axes, params, strict=False):
            x = math.log(max(p, 1e-12))
            if len(axis) == 1 or x <= axis[0]:
                idx.append((0, 0, 0.0))
            elif x >= axis[-1]:
                n = len(axis) - 1
                idx.append((n, n, 0.0))
            else:
                i = int(np.searchsorted(axis, x)) - 1
                t = (x - axis[i]) / (axis[i + 1] - axis[i])
                idx.append((i, i + 1, t))
        total = 0.0
        for corner in range(1 << len(idx)):
            weight = 1.0
            at = []
            for d, (lo, hi, t) in enumerate(idx):
                if corner >> d & 1:
                    weight *= t
                    at.append(hi)
                else:
                    weight *= 1.0 - t
                    at.append(lo)
            if weight:
                total += weight * self.values[tuple(at)]
        return total


def build_interpolator(family: str, table: FamilyTable) -> _Interpolator:
    axes = [np.log(np.asarray(a, dtype=np.float64)) for a in table.axes]
    shape = tuple(len(a) for a in axes)
    if not table.points:
        raise ValueError(f"calibration of {family!r} has no measured points")
    points = _monotone(table.points)
    well_timed = [work_of(family, p) / s for p, s in points if s >= WELL_TIMED_S]
    ceiling = math.log(1.25 * max(well_timed)) if well_timed else math.inf
    # not strict: a point's params beyond the grid's axes (a quantized matmul's bits) do not index it
    logs = {tuple(np.searchsorted(a, math.log(v)) for a, v in zip(axes, p, strict=False)):
            min(math.log(work_of(family, p) / s), ceiling) for p, s in points}
    measured = np.array(list(logs.keys()))
    measured_eff = np.array(list(logs.values()))
    measured_work = np.array([sum(axes[d][i] for d, i in enumerate(k)) for k in logs])
    values = np.empty(shape)
    for at in np.ndindex(*shape):
        if at in logs:
            values[at] = logs[at]
            continue
        dominated = np.all(measured <= np.array(at), axis=1)
        if dominated.any():  # the largest dominated point; among equals, the most efficient
            work = np.where(dominated, np.round(measured_work, 9), -np.inf)
            best = int(np.argmax(np.where(work == work.max(), measured_eff, -np.inf)))
        else:
            best = int(np.argmin(np.abs(measured - np.array(at)).sum(axis=1)))
        values[at] = measured_eff[best]
    return _Interpolator(axes, values)


def _monotone(points: tuple[tuple[tuple[float, ...], float], ...]) -> list[tuple[tuple[float, ...], float]]:
    """Cap each point's time by that of any point doing more in every dimension.

    A kernel given more work is never faster; a measurement that says so was
    disturbed (preempted, a cold page), and the larger point bounds it.
    """
    pts = [(p, s) for p, s in points if s > 0]
    coords = np.array([p for p, _ in pts])
    times = np.array([s for _, s in pts])
    out = []
    for i, (p, s) in enumerate(pts):
        dominating = np.all(coords >= coords[i], axis=1)
        out.append((p, float(min(s, times[dominating].min()))))
    return out


MAX_SHARE = 1.5  # read_share's bound: a kernel reads beyond the cache at most this much faster than the sweep
STREAM_SECANT = 2.0  # stream_seconds: the memory slowdown its secant reaches (a bandwidth hog read 1.3-2x here)
GEMM_SECANT = 1.4  # gemm_seconds: the gemm slowdown its secant reaches (a spell read 1.3-1.4x)
WELL_TIMED_S = 20e-6  # kernels at least this long are timed well enough to bound the others
# A kernel whose activations, read and written, take more than this share of the last-level cache streams them from
# memory in a model (the rest of the cache holds the weights and the tensors that live on), where calibration's
# single op found part of them cached; and a line it writes that is not cached is read first, then written back,
# except by a copy of whole rows (memcpy writes large blocks past the cache).
ACTIVATION_CACHE_SHARE = 0.5
WRITE_COST = 2.0
COPIES = frozenset({"Concat"})


def quantized_chain(family: str, size: float, count: int) -> Kernel:
    """QuantizedReads' chain of `count` one-row 4-bit products (float scales) over `size` bytes of weights, as one
    kernel repeated."""
    def product(n: float, repeat: int) -> Kernel:
        return Kernel(family, (1.0, float(QUANTIZED_CHAIN_K), n, 4.0, float(NBITS_BLOCK), 4.0),
                      2.0 * QUANTIZED_CHAIN_K * n, "MatMulNBits", repeat)

    return product(size / weight_bytes(product(1.0, 1)) / count, count)


class CostModel:
    """Latency of a plan on the calibrated, quiet device."""

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._interp = {f: build_interpolator(f, t) for f, t in calibration.tables.items()}
        # (log efficiency, floor s, K tail slowdown) by kernel
        self._cache: dict[tuple[str, str, tuple[float, ...]], tuple[float, float, float]] = {}
        self.cache_bytes = calibration.cache_bytes or int(calibration.fingerprint.get("llc_bytes", "0") or 0)
        self.stream_bytes_per_s = calibration.stream_bytes_per_s  # 0 where unmeasured (GPU): no cold pricing
        beyond = [(size, rate) for size, rate in calibration.read_rates if size >= self.cache_bytes]
        # log sizes and log rates from the cache on (weight_read_rate); None: memory's rate throughout
        self._read_curve = np.log(beyond).T if len(beyond) >= 2 else None
        # the rate at which weights already in the cache are read (the fastest working set measured)
        self._cache_rate = max((r for _, r in calibration.read_rates), default=0.0)
        self._readings: dict[str, tuple[float, float | None, float]] = {}  # _reading's answers

    def table(self, k: Kernel) -> str:
        """The calibration table that prices `k`."""
        if k.family in COMPUTE_FAMILIES:
            return k.family
        op = ALIASES.get(k.op, k.op)
        return op if op in self._interp else REPRESENTATIVE.get(k.family, "Transpose")

    def kernel_seconds(self, k: Kernel) -> float:
        """The kernel's own time, without dispatch overhead."""
        if k.work <= 0:
            return 0.0
        key = (k.family, k.op, k.params)
        hit = self._cache.get(key)
        if hit is None:
            table = self.table(k)
            interp = self._interp[table]
            # Below the grid a kernel is no faster than the smallest measured one: its fixed costs
            # (threads, dispatch inside the op) do not shrink with the work. (Parameters beyond the grid's
            # axes, such as a quantized matmul's bits, only set the bytes its weights take.)
            coords = k.params[:len(interp.axes)]
            # not strict: coords is the params cut to the grid's axes, and may be the shorter
            floor = tuple(max(p, float(np.exp(a[0]))) for p, a in zip(coords, interp.axes, strict=False))
            floor_work = work_of(table, floor) if floor != coords else 0.0
            hit = (interp(coords), floor_work / math.exp(interp(floor)) if floor_work else 0.0, self.k_tail_slowdown(k))
            self._cache[key] = hit
        log_eff, floor_s, tail = hit
        own = k.repeat * max(k.work / math.exp(log_eff), floor_s) * tail
        return own + self.kernel_seconds(k.epilogue) if k.epilogue else own

    def k_tail_slowdown(self, k: Kernel) -> float:
        """How much slower than its table says an int8-compute block-quantized product of many rows runs for its K
        beyond a multiple of NBITS_TAIL_PERIOD: the step measured at or below it (nbits_tails; 1 for one row, whose
        kernel reads more than it computes, and for any other kernel)."""
        tails = self.calibration.nbits_tails
        if k.family != "nbits" or k.params[0] <= 1 or len(tails) != len(NBITS_TAILS):
            return 1.0
        beyond = int(k.params[1]) % NBITS_TAIL_PERIOD
        return tails[max(i for i, t in enumerate(NBITS_TAILS) if t <= beyond)]

    def weight_read_rate(self, footprint: float) -> float:
        """Bytes per second at which a model whose inference touches `footprint` bytes reads its weights
        again at the next inference; 0 while they stay cached.

        Beyond the cache, a cyclic read still hits it in part, less the further beyond: the rate is the
        one measured over working sets of that size (log-log between them), down to memory's.
        """
        if not (self.cache_bytes > 0 and footprint > self.cache_bytes and self.stream_bytes_per_s > 0):
            return 0.0
        return self._curve_rate(footprint)

    def _curve_rate(self, size: float) -> float:
        """The sweep's read rate over a working set of `size` bytes: log-log between the sizes measured from the
        cache on, the nearest one's beyond them (memory's rate where fewer than two were)."""
        if self._read_curve is None:
            return self.stream_bytes_per_s
        sizes, rates = self._read_curve
        return float(np.exp(np.interp(math.log(size), sizes, rates)))

    def cache_read_slowdown(self, footprint: float) -> float:
        """How much slower than in calibration's chains of attentions a decode step touching `footprint` bytes
        reads its KV cache: the sweep's rate over the chains' working set over its rate over the step's (1 where
        either is unmeasured). The chains stay small for calibration's time and memory (128 MiB at most), and where
        the last-level cache is large, much of theirs is still read from it: on a 2-core Intel Xeon VM reporting
        480 MiB of it, the sweep read 42 GB/s at 128 MiB and 26 from 1 GiB on, and steps at contexts of 2,048 and
        4,096 were priced 23-35 % fast."""
        chains = self.calibration.attention_chain_bytes
        if not (chains > 0 and footprint > chains and self._read_curve is not None):
            return 1.0
        return self._curve_rate(chains) / self._curve_rate(footprint)

    def read_share(self, family: str) -> float:
        """How fast a family's kernels read their weights beyond the cache, relative to the sweep's product over
        the same working set (measured, 1 where not): block-quantized weights are unpacked as they are read
        (QuantizedReads), and a float MatMul reads the weights its session holds and prepacked, kernel after
        kernel, not as the sweep reads one input matrix (FloatReads: 0.74x to 1.3x of the sweep on two hosts)."""
        return self._reading(family)[0]

    def _reading(self, family: str) -> tuple[float, float | None, float]:
        """(read_share, the share of its reads a kernel's computing does not hide: None where `_unhidden` gives
        each kernel's own, what each kernel pays to start streaming), measured once."""
        reading = self._readings.get(family)
        if reading is None:
            reading = self._readings[family] = self._measured_reading(family)
        return reading

    def _measured_reading(self, family: str) -> tuple[float, float | None, float]:
        measured = self.calibration.quantized_read_rates.get(family)
        if measured is None or self._read_curve is None:
            return 1.0, None, 0.0
        size, rate, per_kernel = measured
        float_rate = self._curve_rate(size)
        if family in NBITS_FAMILIES:
            start = self._stream_start(family, size, per_kernel)
            # the large chain's reading and computing: its time less its kernels' start (QuantizedReads' rate took off
            # the chains' whole time a kernel)
            chain = size / rate + QUANTIZED_CHAIN_KERNELS * (per_kernel - start)
            return (*self._quantized_reading(family, size, chain, size / float_rate), start)
        return min(MAX_SHARE, max(0.1, rate / float_rate)), None, 0.0

    def _stream_start(self, family: str, size: float, per_kernel: float) -> float:
        """What each block-quantized kernel of a decode step pays to start streaming: the chains' time a kernel
        (QuantizedReads: two chains over the same bytes, of few and of many kernels) less the part that the table
        already prices in each kernel's time in the cache, the two chains priced there. On a 2-core Intel Xeon VM the
        chains read 18-30 us a kernel and the table 37-59 us (the smaller products less efficient): none, where
        taking the chains' whole priced the zoo's int4 decode steps +18 % at the median, against +7 % without it."""
        def chain(count: int) -> float:
            return self.kernel_seconds(quantized_chain(family, size, count))

        in_cache = (chain(QUANTIZED_CHAIN_SMALL) - chain(QUANTIZED_CHAIN_KERNELS)) / (
            QUANTIZED_CHAIN_SMALL - QUANTIZED_CHAIN_KERNELS)
        return max(0.0, per_kernel - in_cache)

    def _quantized_reading(self, family: str, size: float, measured: float, as_float: float) -> tuple[float, float]:
        """The quantized chain's measured time, as `seconds` composes a kernel's computing (t, the chain priced in
        the cache) and its reads (s: `as_float`, its bytes at the float rate, over the share): measured = max(t, s)
        + u min(t, s), solved for u where it can be, else for the share. The chain unpacks as it reads: where
        unpacking is slow next to memory (AVX2 without VNNI) it hides the reads wholly, the chain taking no longer
        than its time in the cache, and a decode step's products no longer than theirs."""
        t = self.kernel_seconds(quantized_chain(family, size, QUANTIZED_CHAIN_KERNELS))
        if t <= 0 or measured >= t + as_float:  # none of its reads hidden, and slower than float ones
            return max(0.1, min(MAX_SHARE, as_float / max(measured - t, 1e-12))), 1.0
        if measured >= max(t, as_float):  # read as fast as float weights, in part behind the unpacking
            return 1.0, (measured - max(t, as_float)) / min(t, as_float)
        return min(MAX_SHARE, max(1.0, as_float / measured)), 0.0  # hidden wholly; faster than float ones where
        # the chain took less than its bytes at the float rate

    def seconds(self, plan: Plan, memory: float = 1.0, gemm: float = 1.0) -> float:
        """The plan's latency on the calibrated device, with memory streaming `memory` times slower than
        calibrated (a neighbour that takes bandwidth) and float products computing `gemm` times slower."""
        cal = self.calibration
        return cal.per_run_s + cal.per_kernel_s * len(plan.kernels) + sum(self.plan_kernel_seconds(plan, memory, gemm))

    def plan_kernel_seconds(self, plan: Plan, memory: float = 1.0, gemm: float = 1.0) -> list[float]:
        """Each kernel's time within `plan` (dispatch apart): its table's, or its weights' and its activations'
        streaming where those do not fit in the cache (`memory` and `gemm` as in `seconds`)."""
        # Weights stay cached from one inference to the next only if they and the activations that
        # stream past them (the live ones, written and read again) fit in the last-level cache.
        footprint = plan.weight_bytes + 2 * plan.peak_activation_bytes
        rate = self.weight_read_rate(footprint) / memory
        kv_memory = memory * self.cache_read_slowdown(footprint) if rate else memory  # a decode step's KV cache
        times = []
        for k in plan.kernels:
            t = self.kernel_seconds(k) * (gemm if k.family in FLOAT_PRODUCTS else 1.0)
            if rate and k.family == "gqa":
                # a decode step's as the chains of attentions measured it, its cache read at its working set's rate;
                # a prefill's cache goes to memory on top of the attention's own work, measured in the cache
                decode = self.decode_attention_seconds(k, kv_memory) if k.params[1] == 1 and k.params[2] > 1 else None
                t = decode if decode is not None else t + k.repeat * weight_bytes(k) / rate
            elif rate:  # each kernel reads its weights again, no faster than that
                share, unhidden, start = self._reading(k.family)
                stream = k.repeat * (start + weight_bytes(k) / (rate * share))
                t = max(t, stream) + (self._unhidden(t, k) if unhidden is None else unhidden) * min(t, stream)
            times.append(max(t, self.activation_seconds(k, memory)))
        return times

    def activation_seconds(self, k: Kernel, memory: float = 1.0) -> float:
        """The least time `k` takes where its activations do not fit in the cache: its reads, and its writes at
        WRITE_COST (a copy's once), at memory's streaming rate (`memory` times slower than calibrated); 0 where they
        fit. (An epilogue works on the output while it is cached: no floor of its own.) Beyond the
        calibration grid (a blur segmenter's reorders of 12-20 MB each way, the depthwise convolutions of a batch of 8
        images) the tables price such kernels as if cached, 1.5-3.6x fast."""
        moved = k.read_bytes + k.written_bytes
        if not (self.stream_bytes_per_s > 0 and moved > ACTIVATION_CACHE_SHARE * self.cache_bytes > 0):
            return 0.0
        writes = k.written_bytes * (1.0 if k.op in COPIES else WRITE_COST)
        return (k.read_bytes + writes) * memory / self.stream_bytes_per_s

    def decode_attention_seconds(self, k: Kernel, memory: float = 1.0) -> float | None:
        """A decode step's attention whose KV cache comes from memory (`memory` times slower than calibrated): its
        cost at one token, plus a cost per query head and one per KV head for each element of the context, fitted
        to the chains calibration timed (AttentionChains); None where it timed none. The table's decode points,
        measured at one grouping in the cache, tell neither apart."""
        if self._attention is None:
            return None
        heads, _, context, head, kv_heads = k.params
        per_query, per_kv = self._attention
        per_element = per_query * heads + per_kv * kv_heads * memory
        return k.repeat * (self._one_token(k.params) + context * head * per_element)

    def _one_token(self, params: tuple[float, ...]) -> float:
        """The attention of the same heads over one token and no past: what it costs beyond its context."""
        p = (params[0], 1.0, 1.0, params[3], params[4])
        return self.kernel_seconds(Kernel("gqa", p, work_of("gqa", p)))

    @cached_property
    def _attention(self) -> tuple[float, float] | None:
        """A decode step's attention beyond the cache: (seconds per query head, per KV head) an element of the
        context, the least-squares fit, neither negative, to the chains' times a layer less their cost at one token;
        None where calibration timed no two chains. Fitted at its first use, not when the model loads."""
        chains = self.calibration.attention_chains
        if len(chains) < 2 or "gqa" not in self._interp:
            return None
        rows = np.array([(p[0] * p[2] * p[3], p[4] * p[2] * p[3]) for p, _ in chains])
        return _nonnegative_fit(rows, np.array([s - self._one_token(p) for p, s in chains]))

    def stream_seconds(self, plan: Plan) -> float:
        """What the plan's latency gains per unit of memory slowdown: the secant from calibrated memory to memory
        STREAM_SECANT times slower (exact for a kernel that only streams; one that computes as long as it reads
        gains less at first). 0 for a plan whose weights stay in the cache."""
        return (self.seconds(plan, STREAM_SECANT) - self.seconds(plan)) / (STREAM_SECANT - 1.0)

    def gemm_seconds(self, plan: Plan) -> float:
        """What the plan's latency gains per unit of gemm slowdown: the secant to float products GEMM_SECANT times
        slower than calibrated (their time where they compute; less where they wait on their weights' reads)."""
        return (self.seconds(plan, gemm=GEMM_SECANT) - self.seconds(plan)) / (GEMM_SECANT - 1.0)

    def _unhidden(self, t: float, k: Kernel) -> float:
        """The share of a kernel's weight reads from memory that its computing does not hide.

        A float vector-matrix product only streams its weights: it runs at the slower of its compute and its
        reads, nothing to hide. A kernel that reuses each weight over many rows, or unpacks quantized weights
        as it reads them, computes out of the cache most of its time, and its loads from memory then stall it
        rather than overlap: that share is the part of its in-cache time not spent reading its weights at the
        cache's rate (a short prompt of float weights runs so). Block-quantized kernels take the share their chain
        measured where calibration timed it (_quantized_reading)."""
        if not self._cache_rate or t <= 0 or (k.family == "gemm" and k.params[0] <= 1):
            return 0.0  # the slower of the two, as for a float vector-matrix product
        return max(0.0, 1.0 - weight_bytes(k) * k.repeat / self._cache_rate / t)


# An attention's keys and values of the whole context cross the memory bus three times a step: the past read,
# and the present written (a new tensor, so its lines are read before they are written); the attention's own
# read of the present mostly finds it in the cache it was just written to.
KV_PASSES = 3.0


def _nonnegative_fit(rows: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """Least squares of times = rows @ (a, b) with a, b >= 0: where the free fit makes one negative, it is 0 and
    the other is fitted alone."""
    a, b = np.linalg.lstsq(rows, times, rcond=None)[0]
    if a >= 0 and b >= 0:
        return float(a), float(b)
    alone = [max(0.0, float(rows[:, i] @ times / (rows[:, i] @ rows[:, i]))) for i in (0, 1)]
    return (alone[0], 0.0) if a >= 0 else (0.0, alone[1])


def weight_bytes(k: Kernel) -> float:
    """The bytes a compute kernel reads that stay the same from one inference to the next, or grow by one
    token's worth: float32 weights, packed quantized weights and their scales, the KV cache an attention
    reads (0 where its operands are all fresh activations)."""
    p = k.params
    if k.family in ("gemm", "conv", "conv1x1"):
        return 4.0 * p[1] * p[2]
    if k.family == "dwconv":
        return 4.0 * p[0] * p[2]
    if k.family in NBITS_FAMILIES:  # (M, K, N, bits, block, scale bytes)
        return p[1] * p[2] * p[3] / 8.0 + math.ceil(p[1] / p[4]) * p[2] * p[5]
    if k.family == "qgemm":
        return p[1] * p[2]
    if k.family == "gqa":  # (B x heads, S, past + 1, head, B x KV heads)
        return KV_PASSES * 2.0 * 4.0 * p[4] * (p[2] - 1.0 + p[1]) * p[3]
    return 0.0

