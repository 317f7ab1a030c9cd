"""The cost model's interpolation and extrapolation, on hand-made calibrations."""

import hashlib
import itertools
import math
from dataclasses import replace

import numpy as np
import onnx
import pytest

from monitors.pricing.costmodel import MAX_SHARE, WRITE_COST, CostModel, weight_bytes
from monitors.pricing.kernels import Kernel, Plan
from probes import microbench
from probes.calibration import (
    COMPUTE_FAMILIES,
    NCHWC_UPSAMPLE,
    QUANTIZED_CHAIN_K,
    QUANTIZED_CHAIN_KERNELS,
    Calibration,
    FamilyTable,
    work_of,
)
from probes.microbench import (
    CHAIN_LONG,
    CHAIN_SHORT,
    AttentionChains,
    FloatReads,
    MemoryLevels,
    MemoryPass,
    QuantizedReads,
    _feasible,
    _point,
    _profile,
    _profile_points,
    fastest_sweep,
    grids,
    measure_memory,
    memory_levels,
    memory_sweep_sizes,
    nbits_tails,
    overheads,
    profiler_cost,
    quiet_passes,
    stream_buffer,
    stream_bytes,
)
from probes.refresh import HANDOFF_KEY, LOCKSTEP_KEY


def _cal(tables, per_kernel=1e-6, per_run=5e-6) -> Calibration:
    return Calibration(fingerprint={"device": "cpu"}, tables=tables, per_kernel_s=per_kernel, per_run_s=per_run)


def _memory_table(seconds_per_byte=lambda b: 1e-9 * b + 1e-6):
    sizes = tuple(float(2 ** k) for k in range(10, 21, 2))
    return FamilyTable(axes=(sizes,), points=tuple(((b,), seconds_per_byte(b)) for b in sizes))


def _gemm_table(measure_all=True):
    axes = ((1.0, 64.0, 1024.0), (64.0, 1024.0), (64.0, 1024.0))
    pts = []
    for m in axes[0]:
        for k in axes[1]:
            for n in axes[2]:
                p = (m, k, n)
                if not measure_all and m * k * n > 1e8:
                    continue
                eff = 1e9 * (1 + math.log(m) + math.log(k))  # efficiency grows with size
                pts.append((p, work_of("gemm", p) / eff))
    return FamilyTable(axes=axes, points=tuple(pts))


def test_grid_points_are_reproduced_exactly():
    cm = CostModel(_cal({"Add": _memory_table(), "gemm": _gemm_table()}))
    for p, s in _gemm_table().points:
        assert cm.kernel_seconds(Kernel("gemm", p, work_of("gemm", p))) == pytest.approx(s, rel=1e-9)


def test_between_grid_points_time_lies_between_neighbours():
    cm = CostModel(_cal({"Add": _memory_table()}))

    def t(b: int) -> float:
        return cm.kernel_seconds(Kernel("eltwise", (b,), b, "Add"))

    assert t(2 ** 12) < t(3 * 2 ** 12) < t(2 ** 14)


def test_beyond_the_grid_time_grows_with_work_at_edge_efficiency():
    cm = CostModel(_cal({"Add": _memory_table()}))
    edge = 2.0 ** 20
    t_edge = cm.kernel_seconds(Kernel("eltwise", (edge,), edge, "Add"))
    t_far = cm.kernel_seconds(Kernel("eltwise", (8 * edge,), 8 * edge, "Add"))
    assert t_far == pytest.approx(8 * t_edge, rel=1e-9)


def test_unmeasured_grid_points_take_the_largest_dominated_efficiency():
    full = CostModel(_cal({"gemm": _gemm_table(True)}))
    sparse = CostModel(_cal({"gemm": _gemm_table(False)}))
    big = (1024.0, 1024.0, 1024.0)
    k = Kernel("gemm", big, work_of("gemm", big))
    # the skipped corner takes the best dominated efficiency, (1024, 1024, 64): same law, so same time
    assert sparse.kernel_seconds(k) == pytest.approx(full.kernel_seconds(k), rel=1e-9)


def test_plan_latency_adds_dispatch_and_run_overheads():
    cm = CostModel(_cal({"Add": _memory_table()}, per_kernel=2e-6, per_run=10e-6))
    plan = Plan(kernels=(Kernel("view", (0.0,), 0.0, "Reshape"),) * 3)
    assert cm.seconds(plan) == pytest.approx(10e-6 + 3 * 2e-6)


def test_calibration_and_plan_survive_json_round_trip():
    cal = replace(_cal({"Add": _memory_table(), "gemm": _gemm_table(False)}), attention_chain_bytes=134184960,
                  nbits_tails=(1.0, 1.0, 1.13, 1.18))
    again = Calibration.from_json(cal.to_json())
    assert again == cal
    clip = Kernel("eltwise", (512.0,), 512.0, "Clip")
    plan = Plan(kernels=(Kernel("gemm", (1.0, 64.0, 64.0), 8192.0, "MatMul+Add"),
                         Kernel("dwconv", (16.0, 4.0, 9.0), 1152.0, "Conv+Clip", epilogue=clip)),
                weight_bytes=5, flops=8192.0)
    assert Plan.from_json(plan.to_json()) == plan
    # a plan stored before kernels had epilogues (five fields each) still loads
    old = '{"kernels":[["gemm",[1,64,64],8192,"MatMul+Add",1]],"weight_bytes":5,"peak_activation_bytes":0,"flops":1}'
    assert Plan.from_json(old).kernels[0].epilogue is None
    # and a convolution's input bytes, with or without an epilogue, come back
    strided = Kernel("conv1x1", (16.0, 64.0, 64.0), 131072.0, "Conv", input_bytes=16384.0)
    fused = Kernel("conv1x1", strided.params, strided.work, "Conv+Clip", epilogue=clip, input_bytes=16384.0)
    for k in (strided, fused):
        assert Kernel.from_json(k.to_json()) == k and Kernel.from_json(k.to_json()).read_bytes == 16384.0
    assert Kernel("conv1x1", (16.0, 64.0, 64.0), 131072.0, "Conv").read_bytes == 4 * 16 * 64  # stride 1


def test_a_kernels_epilogue_costs_its_ops_pass_and_no_dispatch():
    cm = CostModel(_cal({"Add": _memory_table(), "gemm": _gemm_table()}, per_kernel=2e-6, per_run=0.0))
    n = 2.0 ** 16
    conv = Kernel("gemm", (64.0, 64.0, 64.0), work_of("gemm", (64.0, 64.0, 64.0)), "Conv")
    clip = Kernel("eltwise", (n,), n, "Clip")
    fused = Kernel(conv.family, conv.params, conv.work, "Conv+Clip", epilogue=clip)
    assert cm.kernel_seconds(fused) == pytest.approx(cm.kernel_seconds(conv) + cm.kernel_seconds(clip))
    assert cm.seconds(Plan(kernels=(fused,))) == pytest.approx(cm.kernel_seconds(fused) + 2e-6)


def test_malformed_calibration_json_is_rejected():
    with pytest.raises((ValueError, KeyError, TypeError)):
        Calibration.from_json('{"format": 1, "tables": {}}')
    with pytest.raises(ValueError):
        Calibration.from_json('{"format": 99}')


def test_memory_kernels_use_their_own_op_table_else_the_family_representative():
    fast = _memory_table(lambda b: 1e-10 * b)
    slow = _memory_table(lambda b: 1e-9 * b)
    cm = CostModel(_cal({"Add": fast, "Where": slow}))
    n = 2.0 ** 16
    assert cm.kernel_seconds(Kernel("eltwise", (n,), n, "Where")) == pytest.approx(10 * cm.kernel_seconds(
        Kernel("eltwise", (n,), n, "Add")))
    assert cm.kernel_seconds(Kernel("eltwise", (n,), n, "Sub")) == cm.kernel_seconds(Kernel("eltwise", (n,), n, "Add"))


def test_host_copies_on_the_gpu_are_priced_by_their_own_table_in_both_directions():
    """A GPU calibration's MemcpyHost table prices the plan's MemcpyFromHost and MemcpyToHost kernels (the
    app's inputs in, its outputs out): 12 GB/s there, against the 1 GB/s the movement family would say."""
    copies = _memory_table(lambda b: b / 12e9 + 5e-6)
    cm = CostModel(_cal({"MemcpyHost": copies, "Transpose": _memory_table(lambda b: 1e-9 * b)}))
    n = 2.0 ** 20
    for op in ("MemcpyFromHost", "MemcpyToHost"):
        assert cm.kernel_seconds(Kernel("movement", (n,), n, op)) == pytest.approx(n / 12e9 + 5e-6, rel=1e-6)


def _gemv_plan(side: int) -> Plan:
    k = Kernel("gemm", (1.0, float(side), float(side)), 2.0 * side * side, "MatMul")
    return Plan(kernels=(k,), weight_bytes=4 * side * side)


def test_weights_beyond_the_measured_cache_stream_at_the_measured_rate():
    side = 4096  # 64 MiB of weights
    table = _gemm_table()
    cal = dict(fingerprint={"device": "cpu", "llc_bytes": str(256 * 2 ** 20)}, tables={"gemm": table},
               per_kernel_s=0.0, per_run_s=0.0, stream_bytes_per_s=5e9)
    held_small = CostModel(Calibration(**cal, cache_bytes=32 * 2 ** 20))
    held_large = CostModel(Calibration(**cal, cache_bytes=512 * 2 ** 20))
    unmeasured = CostModel(Calibration(**cal))  # falls back to the reported 256 MiB
    streamed = held_small.seconds(_gemv_plan(side))
    assert streamed == pytest.approx(4 * side * side / 5e9)
    assert held_large.seconds(_gemv_plan(side)) == pytest.approx(unmeasured.seconds(_gemv_plan(side)))
    assert held_large.seconds(_gemv_plan(side)) < streamed / 3


def test_each_kernels_time_in_a_plan_holds_its_streaming_and_adds_up_to_the_plan():
    """What `estimate --kernels` lists: a streamed product's time is its weights' reads, not its table's."""
    cal = dict(fingerprint={"device": "cpu"}, tables={"gemm": _gemm_table()}, per_kernel_s=2e-6, per_run_s=5e-6,
               stream_bytes_per_s=5e9, cache_bytes=32 * 2 ** 20)
    cm = CostModel(Calibration(**cal))
    plan = Plan(kernels=_gemv_plan(4096).kernels * 2, weight_bytes=2 * 4 * 4096 * 4096)
    times = cm.plan_kernel_seconds(plan)
    assert times == [pytest.approx(4 * 4096 * 4096 / 5e9)] * 2 and times[0] > 3 * cm.kernel_seconds(plan.kernels[0])
    assert cm.seconds(plan) == pytest.approx(sum(times) + 2 * 2e-6 + 5e-6)


def test_a_memory_slowdown_stretches_only_the_time_a_plan_streams():
    side = 4096  # 64 MiB of weights, read at 5 GB/s: a decode step's product
    table = _gemm_table()
    cal = dict(fingerprint={"device": "cpu"}, tables={"gemm": table}, per_kernel_s=0.0, per_run_s=0.0,
               stream_bytes_per_s=5e9, cache_bytes=32 * 2 ** 20)
    cm = CostModel(Calibration(**cal))
    plan = _gemv_plan(side)
    streamed = 4 * side * side / 5e9
    assert cm.seconds(plan, memory=2.0) == pytest.approx(2 * streamed)
    assert cm.stream_seconds(plan) == pytest.approx(streamed)
    held = _gemv_plan(1024)  # 4 MiB: held in the cache, priced by the table alone
    assert cm.stream_seconds(held) == 0.0 and cm.seconds(held, memory=3.0) == cm.seconds(held)


def test_a_gemm_slowdown_stretches_the_float_products_where_they_compute_and_not_where_they_wait_on_memory():
    table = _gemm_table()
    cm = CostModel(Calibration(fingerprint={"device": "cpu"}, tables={"gemm": table, "Transpose": _memory_table()},
                               per_kernel_s=1e-6, per_run_s=5e-6, stream_bytes_per_s=5e9, cache_bytes=32 * 2 ** 20))
    held = _gemv_plan(1024)  # in the cache: its products' time is the table's
    products = sum(cm.kernel_seconds(k) for k in held.kernels)
    assert cm.gemm_seconds(held) == pytest.approx(products)
    assert cm.seconds(held, gemm=1.3) == pytest.approx(cm.seconds(held) + 0.3 * products)
    streamed = _gemv_plan(4096)  # its weights read from memory: the reads, not the products, set its time
    assert cm.gemm_seconds(streamed) == 0.0 and cm.seconds(streamed, gemm=1.3) == cm.seconds(streamed)
    others = Plan(kernels=(Kernel("movement", (1e6,), 1e6, "Transpose"),))
    assert cm.gemm_seconds(others) == 0.0


def test_activations_beyond_half_the_cache_stream_from_memory_their_writes_read_first():
    """A kernel's activations that do not fit beside the rest of a model stream from memory, where a table measured
    with them cached prices them too fast; a write reads its line first (WRITE_COST), but a copy's does not."""
    mib = 2 ** 20
    cached = _memory_table(lambda b: 1e-11 * b + 1e-7)  # 100 GB/s
    cm = CostModel(Calibration(fingerprint={"device": "cpu"}, tables={"Transpose": cached}, per_kernel_s=0.0,
                               per_run_s=0.0, stream_bytes_per_s=10e9, cache_bytes=32 * mib))
    big = Kernel("movement", (40.0 * mib,), 40.0 * mib, "ReorderOutput")  # 20 MiB read, 20 written
    assert cm.kernel_seconds(big) < 40 * mib / 10e9 / 5
    floor = (20 * mib + WRITE_COST * 20 * mib) / 10e9
    assert cm.seconds(Plan(kernels=(big,))) == pytest.approx(floor)
    assert cm.seconds(Plan(kernels=(big,)), memory=2.0) == pytest.approx(2 * floor)  # a bandwidth hog slows it
    assert cm.stream_seconds(Plan(kernels=(big,))) == pytest.approx(floor)
    copy = Kernel("movement", (40.0 * mib,), 40.0 * mib, "Concat")  # memcpy's large blocks: written once
    assert cm.seconds(Plan(kernels=(copy,))) == pytest.approx(40 * mib / 10e9)
    fits = Kernel("movement", (8.0 * mib,), 8.0 * mib, "ReorderOutput")  # a quarter of the cache: the table's
    assert cm.seconds(Plan(kernels=(fits,))) == cm.kernel_seconds(fits) and cm.activation_seconds(fits) == 0.0
    # a strided convolution reads four times what it writes: its input, not its parameters, sets the floor
    conv = Kernel("dwconv", (96.0, 25088.0, 9.0), 2.0 * 96 * 25088 * 9, "Conv", input_bytes=4 * 96 * 100352.0)
    assert cm.activation_seconds(conv) == pytest.approx((4 * 96 * 100352 + WRITE_COST * 4 * 96 * 25088) / 10e9)
    gpu = CostModel(Calibration(fingerprint={"device": "gpu"}, tables={"Transpose": cached},
                                per_kernel_s=0.0, per_run_s=0.0))  # no memory sweep: tables alone
    assert gpu.activation_seconds(big) == 0.0


def test_weights_a_little_beyond_the_cache_read_at_the_rate_measured_for_that_working_set():
    mib = 2 ** 20
    rates = ((16 * mib, 4e9), (32 * mib, 2.5e9), (64 * mib, 2e9))  # slow enough to bind over the table
    cal = dict(fingerprint={"device": "cpu"}, tables={"gemm": _gemm_table()}, per_kernel_s=0.0, per_run_s=0.0,
               stream_bytes_per_s=2e9, cache_bytes=16 * mib)
    cm = CostModel(Calibration(**cal, read_rates=rates))
    assert cm.weight_read_rate(8 * mib) == 0.0  # held: the tables price it
    assert cm.weight_read_rate(32 * mib) == pytest.approx(2.5e9)
    assert 2.5e9 < cm.weight_read_rate(24 * mib) < 4e9
    assert cm.weight_read_rate(1024 * mib) == pytest.approx(2e9)  # beyond the sweep: memory's rate
    assert CostModel(Calibration(**cal)).weight_read_rate(24 * mib) == 2e9  # no sweep stored: memory's rate
    side = 2304  # 20.25 MiB of weights, in the slope between 16 and 32 MiB
    assert cm.seconds(_gemv_plan(side)) == pytest.approx(4 * side * side / cm.weight_read_rate(4 * side * side))


def test_cache_is_where_the_read_rate_falls_to_memorys():

    mib = 2 ** 20
    rates = [(1 * mib, 90e9), (2 * mib, 95e9), (8 * mib, 50e9), (32 * mib, 48e9), (64 * mib, 47e9),
             (128 * mib, 24e9), (256 * mib, 22e9)]
    levels = memory_levels(rates, reported_cache=260 * mib)
    assert levels.cache_bytes == 64 * mib and levels.stream_bytes_per_s == 22e9
    flat = [(s, 30e9) for s, _ in rates]
    assert memory_levels(flat, reported_cache=260 * mib).cache_bytes == 260 * mib


def test_memory_sweep_measures_a_rate_for_every_working_set():

    levels = measure_memory(reported_cache=2 * 2 ** 20, reads=2 ** 24, buffer=stream_buffer(0, largest=2 ** 24))
    sizes = [s for s, _ in levels.rates]  # 1 MiB to 16 MiB by factors of sqrt(2), whole 16 KiB rows
    assert sizes[0] == 2 ** 20 and sizes[-1] == 2 ** 24 and len(sizes) == 9
    assert all(1.40 < b / a < 1.43 and b % 2 ** 14 == 0 for a, b in itertools.pairwise(sizes))
    assert all(r > 1e8 for _, r in levels.rates)
    assert levels.cache_bytes in [s for s, _ in levels.rates] + [2 * 2 ** 20]
    assert levels.stream_bytes_per_s == levels.rates[-1][1]


def test_memory_sweep_goes_on_by_doublings_to_the_gigabytes_a_decode_step_streams():
    mib = 2 ** 20
    sizes = memory_sweep_sizes(reported_cache=32 * mib, cap=2048 * mib)
    fine = [s for s in sizes if s <= 256 * mib]  # sqrt(2) steps to eight times the cache: where it ends
    assert all(1.40 < b / a < 1.43 for a, b in itertools.pairwise(fine))
    assert sizes[len(fine):] == [512 * mib, 1024 * mib, 2048 * mib]  # then doublings: memory's rate settling
    # a cache reported huge (a VM's host cache) sweeps finely to 512 MiB, no further; little free memory: less
    assert memory_sweep_sizes(260 * mib, 2048 * mib)[-3:] == [512 * mib, 1024 * mib, 2048 * mib]
    assert memory_sweep_sizes(32 * mib, 700 * mib)[-1] == 512 * mib


def test_a_decode_step_of_gigabytes_streams_at_the_rate_measured_for_gigabytes_not_for_a_few_caches():
    mib = 2 ** 20
    # a read of 8 caches still gets more than the bus sustains for a 2 GB decode step (54 against 40 GB/s on one
    # VM; here a twentieth of that, slow enough to bind over the table)
    rates = ((16 * mib, 7.5e9), (64 * mib, 3e9), (256 * mib, 2.7e9), (1024 * mib, 2.25e9), (2048 * mib, 2e9))
    cal = dict(fingerprint={"device": "cpu"}, tables={"gemm": _gemm_table()}, per_kernel_s=0.0, per_run_s=0.0,
               stream_bytes_per_s=2e9, cache_bytes=16 * mib)
    cm = CostModel(Calibration(**cal, read_rates=rates))
    side = 23170  # 2 GiB of float32 weights, one row times them: a float decode step's weights
    assert cm.weight_read_rate(4 * side * side) == pytest.approx(2e9, rel=1e-3)
    assert cm.seconds(_gemv_plan(side)) == pytest.approx(4 * side * side / 2e9, rel=1e-3)
    assert cm.weight_read_rate(512 * mib) == pytest.approx((2.7e9 * 2.25e9) ** 0.5)  # log-log between the two
    short = CostModel(Calibration(**cal, read_rates=rates[:3]))  # a sweep that stopped at 256 MiB, as before
    assert short.seconds(_gemv_plan(side)) < 0.8 * cm.seconds(_gemv_plan(side))


def test_float_reads_chain_distinct_weights_held_by_the_session_real_onnxruntime():
    # two kernels of 32 MiB: half of the buffer
    reads = FloatReads(0, stream_buffer(0, largest=4 * 4 * FloatReads.K * FloatReads.N))
    size, rate, per_kernel = reads.measure()
    assert size == 2 * 4 * FloatReads.K * FloatReads.N and rate > 1e8 and per_kernel == 0.0
    ys = reads.session.run(None, {"x": reads.x})  # each kernel read its own weights, from memory, not a file
    assert [float(y[0, 0]) for y in ys] == pytest.approx([0.5 * FloatReads.K * (0.01 + 1e-4 * i) for i in range(2)],
                                                         rel=1e-4)


def test_float_reads_read_the_median_of_their_runs(monkeypatch):
    # a stream from memory is slow one run in several, as the decode steps it prices are, whose truth is a median:
    # each measurement is its runs' median (here 2 s, not the fastest 1 s); calibrate keeps the fastest pass
    reads = FloatReads(0, stream_buffer(0, largest=4 * 4 * FloatReads.K * FloatReads.N))
    now = [0.0]
    durations = iter([0.5, 2.0, 1.0, 3.0, 9.0, 2.0,   # a warm-up run, then five: median 2 s
                      0.5, 4.0, 4.0, 3.0, 9.0, 4.0])  # a slower measurement: median 4 s, not kept

    class Session:
        def run(self, outputs, feeds):
            now[0] += next(durations)

    monkeypatch.setattr(microbench.time, "perf_counter", lambda: now[0])
    reads.session = Session()
    assert reads.measure()[1] == pytest.approx(reads.bytes / 2.0)
    assert reads.measure()[1] == pytest.approx(reads.bytes / 4.0)


def test_memory_is_read_in_the_passes_whose_threads_handed_data_across_fastest():
    """A host's slow phase (its vCPUs apart) slows the short kernels, whose tables keep their fastest pass, and can
    speed memory up: memory's readings come from the passes in the tables' state, the fastest of those."""

    def memory_pass(handoff: float, rate: float) -> MemoryPass:
        sweep = MemoryLevels(32 * 2 ** 20, rate, ((2 ** 30, rate),))
        return MemoryPass({LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: handoff * 1e-3}, sweep, {"gemm": (2 ** 29, rate, 0.0)},
                          {(16.0, 1.0, 4096.0, 64.0, 2.0): 1e9 / rate})

    apart, together, together_slower = memory_pass(1.0, 60e9), memory_pass(0.6, 41e9), memory_pass(0.65, 39e9)
    assert quiet_passes([apart, together, together_slower]) == [together, together_slower]
    assert quiet_passes([together, together_slower]) == [together, together_slower]  # noise: both, the fastest counts
    blind = replace(apart, refresh={LOCKSTEP_KEY: 1e-3})  # no handoff probe read (an older probe): every pass
    assert quiet_passes([blind, replace(together, refresh={})]) == [blind, replace(together, refresh={})]


def test_quantized_read_chains_hold_distinct_weights_real_onnxruntime():
    """onnxruntime shares equal initializers: a chain over copies of one matrix reads it from the cache, 2x memory's
    rate on an AMD EPYC VM where a decode step's distinct weights stream at memory's."""
    reads = QuantizedReads(2 ** 20, np.random.default_rng(0))
    for session in reads.sessions.values():
        digests = [hashlib.sha1(a.tobytes()).hexdigest() for a in session.weights.values()]
        assert len(digests) >= 8 and len(set(digests)) == len(digests)
    assert set(reads.measure()) == {"nbits", "nbits_f"}


def test_a_float_decode_step_streams_at_the_rate_its_own_kernels_read_relative_to_the_sweep():
    mib = 2 ** 20
    rates = ((16 * mib, 7.5e9), (256 * mib, 2.7e9), (1024 * mib, 2.25e9), (2048 * mib, 2e9))
    cal = dict(fingerprint={"device": "cpu"}, tables={"gemm": _gemm_table()}, per_kernel_s=0.0, per_run_s=0.0,
               stream_bytes_per_s=2e9, cache_bytes=16 * mib, read_rates=rates)
    side = 23170  # 2 GiB of float32 weights, one row times them
    sweep = CostModel(Calibration(**cal)).seconds(_gemv_plan(side))
    # a chain of held, prepacked weights read 1.3x as fast as the sweep at 1 GiB (a 16-core Xeon) or 0.74x (a VM)
    for share in (1.3, 0.74):
        chained = CostModel(Calibration(**cal, quantized_read_rates={"gemm": (1024 * mib, share * 2.25e9, 0.0)}))
        assert chained.read_share("gemm") == pytest.approx(share)
        assert chained.seconds(_gemv_plan(side)) == pytest.approx(sweep / share, rel=1e-3)
    assert CostModel(Calibration(**cal)).read_share("gemm") == 1.0  # unmeasured (an older calibration): the sweep


def test_a_quantized_decode_step_is_priced_at_the_measured_time_of_the_chain_it_resembles_not_that_plus_computing():
    mib = 2 ** 20
    axes = ((1.0, 16.0), (256.0, 4096.0), (256.0, 32768.0))
    flops = 10e9  # unpacking 4-bit weights as slowly as a host without VNNI does, next to its memory
    table = FamilyTable(axes=axes, points=tuple((p, work_of("nbits", p) / flops) for p in itertools.product(*axes)))
    cal = dict(fingerprint={"device": "cpu"}, tables={"nbits": table}, per_kernel_s=0.0, per_run_s=0.0,
               stream_bytes_per_s=8e9, cache_bytes=16 * mib,
               read_rates=((16 * mib, 40e9), (64 * mib, 10e9), (256 * mib, 8e9)))
    size = 64 * mib  # the chain QuantizedReads times: four one-row products of K = 1024 over all of it
    n = size / (QUANTIZED_CHAIN_K // 2 + QUANTIZED_CHAIN_K // 32 * 4) / QUANTIZED_CHAIN_KERNELS
    chain = Kernel("nbits", (1.0, float(QUANTIZED_CHAIN_K), n, 4.0, 32.0, 4.0), 2.0 * QUANTIZED_CHAIN_K * n,
                   "MatMulNBits", QUANTIZED_CHAIN_KERNELS)
    plan = Plan(kernels=(chain,), weight_bytes=size)
    in_cache = CostModel(Calibration(**cal)).kernel_seconds(chain)
    for slower in (1.2, 2.5):  # the chain's measured time against its time in the cache: computing, then reading
        measured = slower * in_cache
        cm = CostModel(Calibration(**cal, quantized_read_rates={"nbits": (size, size / measured, 0.0)}))
        assert cm.seconds(plan) == pytest.approx(measured, rel=1e-6)
    # no slower than in the cache (unpacking slow next to memory): the reads hide wholly, in every such product
    hidden = CostModel(Calibration(**cal, quantized_read_rates={"nbits": (size, size / in_cache, 0.0)}))
    assert hidden.seconds(plan) == pytest.approx(in_cache, rel=1e-6)
    other = Kernel("nbits", (1.0, 896.0, 4864.0, 4.0, 32.0, 4.0), 2.0 * 896 * 4864, "MatMulNBits")
    assert hidden.seconds(Plan(kernels=(other,), weight_bytes=size)) == pytest.approx(hidden.kernel_seconds(other))
    # faster than its bytes at the float rate: read faster than float weights, at most MAX_SHARE so
    fast = CostModel(Calibration(**cal, quantized_read_rates={"nbits": (size, size / (0.01 * in_cache), 0.0)}))
    assert fast.read_share("nbits") == MAX_SHARE


def test_a_quantized_kernel_pays_to_start_what_the_chains_read_a_kernel_beyond_what_its_table_prices_in_the_cache():
    mib = 2 ** 20
    axes = ((1.0, 16.0), (256.0, 4096.0), (256.0, 32768.0))
    size = 64 * mib  # the chains QuantizedReads times: 4 and 64 one-row products over all of it

    def model(fixed: float, per_kernel: float, rate: float = 4e9) -> CostModel:
        table = FamilyTable(axes=axes, points=tuple((p, fixed + work_of("nbits", p) / 50e9)
                                                    for p in itertools.product(*axes)))
        return CostModel(Calibration(fingerprint={"device": "cpu"}, tables={"nbits": table}, per_kernel_s=0.0,
                                     per_run_s=0.0, stream_bytes_per_s=8e9, cache_bytes=16 * mib,
                                     read_rates=((16 * mib, 40e9), (64 * mib, 10e9), (256 * mib, 8e9)),
                                     quantized_read_rates={"nbits": (size, rate, per_kernel)}))

    product = Kernel("nbits", (1.0, 896.0, 4864.0, 4.0, 32.0, 4.0), 2.0 * 896 * 4864, "MatMulNBits", 100)
    step = Plan(kernels=(product,), weight_bytes=512 * mib)  # a decode step's 100 products, streamed
    # a table of no fixed cost: the chains' 20 us a kernel is all start, and each of the step's products pays it
    assert model(0.0, 20e-6).seconds(step) == pytest.approx(model(0.0, 0.0).seconds(step) + 100 * 20e-6, rel=1e-9)
    # a table whose kernels cost 60 us each beyond their work: the chains' 20 us a kernel is what the table already
    # prices, no start; the chain's time is all its reading and computing
    assert model(60e-6, 20e-6).seconds(step) == pytest.approx(
        model(60e-6, 0.0, rate=size / (size / 4e9 + QUANTIZED_CHAIN_KERNELS * 20e-6)).seconds(step), rel=1e-9)


def test_a_prefills_block_quantized_products_pay_the_measured_slowdown_of_their_k_beyond_a_multiple_of_128():
    axes = ((1.0, 256.0), (256.0, 4096.0), (256.0, 4096.0))
    table = FamilyTable(axes=axes, points=tuple((p, work_of("nbits", p) / 200e9) for p in itertools.product(*axes)))
    plain = Calibration(fingerprint={"device": "cpu"}, tables={"nbits": table, "nbits_f": table}, per_kernel_s=0.0,
                        per_run_s=0.0)
    tails = replace(plain, nbits_tails=(1.0, 1.02, 1.13, 1.18))

    def product(m: float, k: float, family: str = "nbits") -> Kernel:
        p = (m, k, 1024.0, 4.0, 32.0, 4.0)
        return Kernel(family, p, 2.0 * m * k * 1024, "MatMulNBits")

    for k, slower in ((1024.0, 1.0), (960.0, 1.13), (992.0, 1.18), (896.0, 1.0), (928.0, 1.02), (1000.0, 1.18)):
        assert CostModel(tails).kernel_seconds(product(256.0, k)) == pytest.approx(
            slower * CostModel(plain).kernel_seconds(product(256.0, k)), rel=1e-9), k
    # one row (a decode step's, which reads more than it computes), float compute and an older calibration: as before
    for kernel, cal in ((product(1.0, 960.0), tails), (product(256.0, 960.0, "nbits_f"), tails),
                        (product(256.0, 960.0), plain)):
        assert CostModel(cal).kernel_seconds(kernel) == CostModel(plain).kernel_seconds(kernel)


def test_nbits_tails_time_k_beyond_1024_against_1024_in_one_session_real_onnxruntime():
    slowdowns = nbits_tails(2, np.random.default_rng(0))
    assert len(slowdowns) == 4 and slowdowns[0] == 1.0 and all(1.0 <= s < 5.0 for s in slowdowns)


def test_attention_chains_copy_each_layers_own_past_into_a_present_it_outputs_real_onnxruntime():
    chains = AttentionChains(0, np.random.default_rng(0))  # no cache reported: 48 MiB of past keys and values a chain
    measured = chains.measure()
    context, head = AttentionChains.CONTEXT, AttentionChains.HEAD
    assert set(measured) == {(float(q), 1.0, float(context), float(head), float(kv))
                             for q, kv in AttentionChains.CHAINS}
    assert all(0 < s < 1 for s in measured.values())
    reads = []
    for params, layers, session, feeds in chains.chains:
        kv = int(params[4])
        assert layers == 48 * 2 ** 20 // (2 * 4 * kv * (context - 1) * head)
        reads.append(layers * 2 * 4 * kv * (context - 1) * head)
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
        for i in range(layers):  # each present is an output of its own, holding its own past and the new token
            for name in ("k", "v"):
                present = outputs[f"y{i}_{name}"]
                assert present.shape == (1, kv, context, head)
                np.testing.assert_array_equal(present[:, :, :context - 1], feeds[f"p{name}_c{i}"])
    assert chains.bytes == round(sum(reads) / len(reads)) and 32 * 2 ** 20 < chains.bytes <= 48 * 2 ** 20


def _attention_calibration(chains=(), chain_bytes: int = 0) -> Calibration:
    mib = 2 ** 20
    axes = ((4.0, 16.0), (1.0,), (1.0, 16.0, 2048.0), (64.0, 256.0))
    table = FamilyTable(axes=axes, points=tuple((p, 2e-6 + work_of("gqa", p) / 20e9)
                                                for p in itertools.product(*axes)))
    return Calibration(fingerprint={"device": "cpu"}, tables={"gqa": table}, per_kernel_s=0.0, per_run_s=0.0,
                       stream_bytes_per_s=8e9, cache_bytes=16 * mib,
                       read_rates=((16 * mib, 40e9), (256 * mib, 8e9)), attention_chains=chains,
                       attention_chain_bytes=chain_bytes)


def _decode(heads: int, kv_heads: int, context: int, head: int = 64) -> Kernel:
    p = (heads, 1, context, head, kv_heads)
    return Kernel("gqa", p, work_of("gqa", p), "GroupQueryAttention")


def test_a_decode_steps_attention_costs_by_query_head_and_by_kv_head_as_the_chains_of_attentions_measured():
    per_query, per_kv = 1e-10, 1.2e-9  # seconds an element of the context (a 2-core AMD EPYC VM: 1.3e-10, 1.2e-9)
    table = CostModel(_attention_calibration())

    def layer(heads: int, kv_heads: int, context: int = 4096, head: int = 64) -> float:
        one_token = table.kernel_seconds(_decode(heads, kv_heads, 1, head))  # what it costs beyond its context
        return one_token + context * head * (per_query * heads + per_kv * kv_heads)

    chains = tuple(((16.0, 1.0, 4096.0, 64.0, float(kv)), layer(16, kv)) for kv in (2, 16))
    cm = CostModel(_attention_calibration(chains))
    assert cm._attention == pytest.approx((per_query, per_kv))
    for heads, kv_heads, context in ((14, 2, 4096), (16, 16, 2048), (15, 5, 512)):  # Qwen, Phi-3, SmolLM2 shapes
        k = _decode(heads, kv_heads, context)
        plan = Plan(kernels=(k,), weight_bytes=512 * 2 ** 20)  # the weights stream: so does the KV cache
        assert cm.seconds(plan) == pytest.approx(layer(heads, kv_heads, context), rel=1e-6)
        # a neighbour that takes memory bandwidth slows the KV heads' part only
        slower = cm.seconds(plan, memory=2.0) - cm.seconds(plan)
        assert slower == pytest.approx(context * 64 * per_kv * kv_heads, rel=1e-6)
    # the weights in the cache: the table's time, measured in the cache; no chains: three passes at the sweep's rate
    assert cm.seconds(Plan(kernels=(_decode(14, 2, 4096),))) == cm.kernel_seconds(_decode(14, 2, 4096))
    k = _decode(14, 2, 4096)
    unchained = CostModel(_attention_calibration())
    assert unchained.seconds(Plan(kernels=(k,), weight_bytes=512 * 2 ** 20)) == pytest.approx(
        unchained.kernel_seconds(k) + weight_bytes(k) / 8e9)


def test_a_decode_steps_kv_cache_streams_at_the_sweeps_rate_for_its_working_set_against_the_chains_one():
    """Chains of 64 MiB, read at 17.9 GB/s on the sweep's log-log curve (40 GB/s at 16 MiB, 8 from 256 MiB on);
    a step touching 512 MiB reads at 8: its cost per KV head 2.24x the chains', its cost per query head as it was."""
    per_query, per_kv = 1e-10, 1.2e-9
    table = CostModel(_attention_calibration())
    one_token = table.kernel_seconds(_decode(14, 2, 1))
    chains = tuple(((16.0, 1.0, 4096.0, 64.0, float(kv)), table.kernel_seconds(_decode(16, kv, 1))
                    + 4096 * 64 * (per_query * 16 + per_kv * kv)) for kv in (2, 16))
    mib = 2 ** 20
    cm = CostModel(_attention_calibration(chains, chain_bytes=64 * mib))
    slowdown = math.sqrt(40 / 8)
    assert cm.cache_read_slowdown(512 * mib) == pytest.approx(slowdown)
    plan = Plan(kernels=(_decode(14, 2, 4096),), weight_bytes=512 * mib)
    assert cm.seconds(plan) == pytest.approx(one_token + 4096 * 64 * (per_query * 14 + per_kv * 2 * slowdown))
    # a step no larger than the chains reads as they did; so does every step of a calibration that did not say
    assert cm.cache_read_slowdown(64 * mib) == cm.cache_read_slowdown(32 * mib) == 1.0
    unsized = CostModel(_attention_calibration(chains))
    assert unsized.seconds(plan) == pytest.approx(one_token + 4096 * 64 * (per_query * 14 + per_kv * 2))


def test_attention_costs_are_never_negative_where_noise_would_fit_one_below_zero():
    one_token = CostModel(_attention_calibration()).kernel_seconds(_decode(16, 2, 1))
    # the grouped chain slower than the ungrouped one: no cost per KV head, all of it per query head
    chains = (((16.0, 1.0, 4096.0, 64.0, 2.0), one_token + 3e-3), ((16.0, 1.0, 4096.0, 64.0, 16.0), one_token + 2e-3))
    per_query, per_kv = CostModel(_attention_calibration(chains))._attention
    assert per_kv == 0.0 and per_query > 0


def test_attention_decode_steps_and_one_row_products_are_calibrated_only_where_they_fit_in_the_cache():
    mib = 2 ** 20
    assert _feasible("gqa", (4.0, 1.0, 8192.0, 64.0), 32 * mib)  # one KV head: 8 MiB of past and present
    assert not _feasible("gqa", (16.0, 1.0, 8192.0, 64.0), 32 * mib)  # four: 32 MiB and more
    assert _feasible("gqa", (16.0, 1.0, 8192.0, 64.0), 64 * mib)
    assert _feasible("gqa", (16.0, 2048.0, 1.0, 128.0), 1 * mib)  # a prefill: no cache to carry
    assert not _feasible("gqa", (16.0, 16.0, 128.0, 64.0), 64 * mib)  # neither a prefill nor a decode step
    # a one-row float product over weights beyond the cache only streams them: the read rates price it
    assert not _feasible("gemm", (1.0, 4096.0, 4096.0), 32 * mib)
    assert _feasible("gemm", (8.0, 4096.0, 4096.0), 32 * mib) and _feasible("gemm", (1.0, 1024.0, 4096.0), 32 * mib)


def test_profiled_points_lose_the_profilers_own_cost_read_beside_them_real_onnxruntime():


    rng = np.random.default_rng(0)
    points = [_point("Relu", (256.0,), "small", rng), _point("gemm", (64.0, 256.0, 256.0), "big", rng)]
    cpu = ["CPUExecutionProvider"]
    # the fastest of 20 runs in each session: the two sessions are compared, and other work only ever adds time
    own = _profile_points(points, 20, cpu, rng)
    read = _profile(points, [p.output for p in points], 20, cpu, rng)
    assert set(own) == {"y_small", "y_big"}
    assert own["y_small"] < 0.5 * read["y_small"]  # a kernel that does next to nothing: mostly the profiler
    assert own["y_big"] > 10 * own["y_small"]
    # the same cost read apart (bench.kernel_errors takes it off a model's profile)
    assert 0 < profiler_cost(runs=5) < read["y_big"]


@pytest.mark.parametrize(("budget_s", "timed"), [(0.0, microbench.MIN_RUNS), (math.inf, 6)])
def test_a_session_whose_runs_take_long_is_timed_fewer_times_real_onnxruntime(monkeypatch, budget_s, timed):
    runs = []
    real_run = microbench.ort.InferenceSession.run

    def counted(session, *args, **kwargs):
        runs.append(1)
        return real_run(session, *args, **kwargs)

    monkeypatch.setattr(microbench.ort.InferenceSession, "run", counted)
    monkeypatch.setattr(microbench, "RUNS_BUDGET_S", budget_s)
    rng = np.random.default_rng(0)
    read = _profile([_point("Relu", (4096.0,), "r", rng)], ["y_r"], 6, ["CPUExecutionProvider"], rng)
    assert read["y_r"] > 0
    assert len(runs) == 1 + timed  # and one before them that warms up, unread


def test_overheads_are_the_slope_and_intercept_of_the_chains_never_negative():

    per_kernel, per_run = 0.4e-6, 10e-6
    short, long_ = per_run + CHAIN_SHORT * per_kernel, per_run + CHAIN_LONG * per_kernel
    assert overheads(short, long_) == pytest.approx((per_kernel, per_run))
    assert overheads(20e-6, 15e-6) == (0.0, 20e-6)  # a disturbed short chain: no negative slope


def test_memory_sweeps_made_apart_keep_each_working_sets_fastest_rate():

    mib = 2 ** 20
    slow_spell = MemoryLevels(0, 0.0, ((16 * mib, 40e9), (32 * mib, 12e9), (64 * mib, 10e9)))
    quiet = MemoryLevels(0, 0.0, ((16 * mib, 30e9), (32 * mib, 25e9), (64 * mib, 20e9)))
    levels = fastest_sweep([slow_spell, quiet], reported_cache=32 * mib)
    assert levels.rates == ((16 * mib, 40e9), (32 * mib, 25e9), (64 * mib, 20e9))
    assert levels.stream_bytes_per_s == 20e9 and levels.cache_bytes == 16 * mib
    short = MemoryLevels(0, 0.0, ((16 * mib, 50e9), (32 * mib, 30e9)))  # less free memory: fewer sizes
    assert fastest_sweep([quiet, short], reported_cache=32 * mib).rates == ((16 * mib, 50e9), (32 * mib, 30e9))


def test_quick_grids_keep_every_compute_point_but_the_costliest_and_thin_the_memory_ones():


    full, quick = {g.family: g for g in grids(False)}, {g.family: g for g in grids(True)}
    for family, g in quick.items():
        assert g.max_work == pytest.approx(full[family].max_work / 3)
        if family in COMPUTE_FAMILIES:  # interpolating over every other point prices kernels high
            assert g.axes == full[family].axes
        else:
            assert len(g.axes[0]) < len(full[family].axes[0])


def test_stream_bytes_beyond_a_large_reported_cache_and_a_quarter_as_many_in_a_quick_calibration() -> None:
    mib = 2 ** 20
    assert stream_bytes(32 * mib) == 1024 * mib and stream_bytes(32 * mib, quick=True) == 256 * mib
    assert stream_bytes(300 * mib) == 1024 * mib  # twice the reported cache only where that is more than 1 GiB
    assert stream_bytes(600 * mib) == 1200 * mib and stream_bytes(600 * mib, quick=True) == 300 * mib
    assert stream_bytes(3072 * mib) == 4096 * mib  # at most 4 GiB


@pytest.mark.skipif(microbench.nchwc_block() == 0, reason="no blocked layout on this CPU (onnxruntime's NCHWc: x86)")
def test_the_blocked_upsample_point_times_onnxruntime_s_blocked_kernel_real_onnxruntime(tmp_path):
    # the table's point: a Resize that onnxruntime runs in the blocked layout, as the planner's NchwcUpsample kernels
    point = microbench.MEMORY_OPS[NCHWC_UPSAMPLE](2.0 ** 22, "x", "y", "t", np.random.default_rng(0))
    so = microbench.ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    microbench.ort.InferenceSession(microbench._model([point]).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
    ops = [(n.op_type, n.domain) for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert ("Upsample", "com.microsoft.nchwc") in ops and ("Resize", "") not in ops
    times = _profile_points([point], 3, ["CPUExecutionProvider"], np.random.default_rng(0))
    assert times.get("y", 0) > 0  # its profile entry (y_nchwc) found
