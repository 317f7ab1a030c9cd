"""Warm refresh: real onnxruntime probes, slowdown and the handoff extra."""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import subprocess
import sys
import time

import pytest
from onnx import TensorProto, helper

from monitors.graphs.importer import load_graph
from monitors.pricing.planner import plan
from probes import microbench, refresh
from probes.calibration import COMPUTE_FAMILIES
from probes.refresh import (
    GEMM_KEY,
    GEMM_ROWS,
    HANDOFF_KEY,
    HANDOFF_MB,
    LOCKSTEP_KEY,
    MIN_MEMORY_SLOWDOWN,
    MIN_RUNS,
    REFERENCE_RUNS,
    STREAM_KEY,
    STREAM_MAX_BYTES,
    STREAM_MIN_BYTES,
    GraphCache,
    WarmRefresh,
    compute_probe,
    gemm_probe,
    gemm_slowdown,
    handoff_ms_per_mb,
    handoff_probe,
    memory_slowdown,
    slowdown,
    stream_probe,
)


def test_measure_runs_three_real_multithreaded_onnxruntime_probes_with_cached_sessions():
    # no wall limit to speak of: a host that the parallel tests share can stretch three runs past the default's
    # 0.4 s (that limit has its own test below)
    warm = WarmRefresh(threads=2, cpu_budget_s=0.02, max_wall_s=30.0)
    sessions = [session for session, _ in warm._probes]
    first = warm.measure()
    second = warm.measure()
    assert set(first) == set(second) == {LOCKSTEP_KEY, HANDOFF_KEY, GEMM_KEY, "threads", "cores"}
    assert 0 < first[LOCKSTEP_KEY] < 1.0 and 0 < first[HANDOFF_KEY] < 1.0 and 0 < first[GEMM_KEY] < 1.0
    assert first["threads"] == 2.0 and first["cores"] == os.cpu_count()
    assert [session for session, _ in warm._probes] == sessions  # created once, reused
    assert warm.last_cpu_s is not None and warm.last_cpu_s > 0
    assert warm.last_runs >= MIN_RUNS


def test_the_stream_probe_runs_only_when_asked_and_its_buffer_goes_with_the_first_refresh_that_does_not_ask():
    warm = WarmRefresh(threads=2, cpu_budget_s=0.02, max_wall_s=30.0)
    assert STREAM_KEY not in warm.measure() and warm._stream is None  # nothing held at rest
    streamed = warm.measure(stream=True)
    assert 0 < streamed[STREAM_KEY] < 1.0
    session = warm._stream
    assert session is not None and warm.measure(stream=True) and warm._stream is session  # kept while asked for
    assert STREAM_KEY not in warm.measure() and warm._stream is None


def test_stream_probe_reads_twice_the_cache_from_distinct_rows_within_bounds():
    _, feeds = stream_probe(32 * 2 ** 20)
    assert feeds["w"].nbytes == pytest.approx(64 * 2 ** 20, rel=0.01)
    assert feeds["w"][0, 0] != feeds["w"][-1, 0]  # real pages, not the kernel's shared page of zeros
    assert stream_probe(0)[1]["w"].nbytes == pytest.approx(STREAM_MIN_BYTES, rel=0.01)
    assert stream_probe(2 ** 30)[1]["w"].nbytes == pytest.approx(STREAM_MAX_BYTES, rel=0.01)


def test_memory_slowdown_is_the_stream_probe_s_beyond_the_compute_probe_s():
    reference = {LOCKSTEP_KEY: 1e-3, STREAM_KEY: 2e-3}
    assert memory_slowdown({LOCKSTEP_KEY: 2e-3, STREAM_KEY: 6e-3}, reference) == pytest.approx(1.5)
    assert memory_slowdown({LOCKSTEP_KEY: 2e-3, STREAM_KEY: 4e-3}, reference) == 1.0  # time slicing alone
    assert memory_slowdown({LOCKSTEP_KEY: 1e-3, STREAM_KEY: 1.5e-3}, reference) == 0.75  # a faster spell than then
    assert memory_slowdown({LOCKSTEP_KEY: 1e-3, STREAM_KEY: 1e-4}, reference) == MIN_MEMORY_SLOWDOWN
    assert memory_slowdown({LOCKSTEP_KEY: 1e-3}, reference) is None  # not read
    assert memory_slowdown({LOCKSTEP_KEY: 1e-3, STREAM_KEY: 1e-3}, {LOCKSTEP_KEY: 1e-3}) is None  # an older reference


def test_gemm_slowdown_is_the_gemm_probe_s_beyond_the_compute_probe_s():
    reference = {LOCKSTEP_KEY: 1e-3, GEMM_KEY: 0.8e-3}
    assert gemm_slowdown({LOCKSTEP_KEY: 1.1e-3, GEMM_KEY: 1.1e-3}, reference) == pytest.approx(1.25)  # a spell
    assert gemm_slowdown({LOCKSTEP_KEY: 2e-3, GEMM_KEY: 1.6e-3}, reference) == pytest.approx(1.0)  # time slicing alone
    assert gemm_slowdown({LOCKSTEP_KEY: 1e-3, GEMM_KEY: 0.6e-3}, reference) == pytest.approx(0.75)  # calibrated in one
    assert gemm_slowdown({LOCKSTEP_KEY: 1e-3}, reference) is None  # not read
    assert gemm_slowdown({LOCKSTEP_KEY: 1e-3, GEMM_KEY: 1e-3}, {LOCKSTEP_KEY: 1e-3}) is None  # an older reference


def test_the_gemm_probe_is_one_float_product_of_many_rows_over_weights_the_session_holds():
    blob, feeds = gemm_probe()
    p = plan(load_graph(blob, fmt="onnx"))
    assert [(k.family, k.params[0]) for k in p.kernels] == [("gemm", GEMM_ROWS)]
    assert p.weight_bytes > 1e6, "the weights are the graph's, prepacked by onnxruntime as a model's"
    assert list(feeds) == ["x"]


def test_measure_stops_at_its_wall_limit():
    warm = WarmRefresh(threads=2, cpu_budget_s=100.0, max_wall_s=0.1)
    start = time.perf_counter()
    warm.measure()
    assert time.perf_counter() - start < 2.0


def test_measure_stops_at_its_cpu_budget():
    warm = WarmRefresh(threads=1, cpu_budget_s=0.01, max_wall_s=10.0)
    warm.measure()
    one_run = warm.last_cpu_s / (warm.last_runs + 1)  # the untimed run included
    assert warm.last_cpu_s < 0.01 + 3 * one_run + 0.02  # stops at the first run past the budget


def test_reference_keeps_the_fastest_refresh():
    readings = iter([3e-3, 1e-3, 2e-3])

    class Scripted(WarmRefresh):
        def measure(self, stream=False):
            return {LOCKSTEP_KEY: next(readings), "threads": 2.0, "cores": 2.0}

    assert Scripted(threads=1).reference()[LOCKSTEP_KEY] == 1e-3


def _scripted(readings: list[tuple[float, float]]) -> WarmRefresh:
    """A refresh whose measurements are (compute probe, handoff probe) seconds, in turn."""
    left = iter(readings)

    class Scripted(WarmRefresh):
        def measure(self, stream=False):
            lockstep, handoff = next(left)
            return {LOCKSTEP_KEY: lockstep, HANDOFF_KEY: handoff, "threads": 2.0, "cores": 2.0}

    return Scripted(threads=1)


def test_reference_keeps_each_probe_s_fastest_reading():
    readings = [(3e-3, 0.5e-3), (1e-3, 0.9e-3), (2e-3, 0.6e-3)]
    reference = _scripted(readings).reference([{LOCKSTEP_KEY: 4e-3}])  # an older probe's reading: no handoff
    assert (reference[LOCKSTEP_KEY], reference[HANDOFF_KEY]) == (1e-3, 0.5e-3)


def test_handoff_extra_is_the_handoff_probe_s_time_beyond_the_compute_probe_s_slowdown():
    reference = {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 0.5e-3}
    # a slow phase: the compute probe as calibrated, the handoff probe 1.2845 ms slower = 0.1 ms per MB it writes
    phase = {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 0.5e-3 + HANDOFF_MB * 1e-4}
    assert handoff_ms_per_mb(phase, reference) == pytest.approx(0.1)
    # time slicing slows both 3x: no handoff extra; 3x plus the slow phase: the same 0.1 ms/MB on top
    assert handoff_ms_per_mb({LOCKSTEP_KEY: 3e-3, HANDOFF_KEY: 1.5e-3}, reference) == pytest.approx(0.0)
    both = {LOCKSTEP_KEY: 3e-3, HANDOFF_KEY: 1.5e-3 + HANDOFF_MB * 1e-4}
    assert handoff_ms_per_mb(both, reference) == pytest.approx(0.1)
    # the handoff probe faster than the slowdown says (noise): 0, never a negative extra
    assert handoff_ms_per_mb({LOCKSTEP_KEY: 3e-3, HANDOFF_KEY: 1e-3}, reference) == 0.0
    # a reference or reading of the probe before it had a handoff probe: no figure
    assert handoff_ms_per_mb(phase, {LOCKSTEP_KEY: 1e-3}) is None
    assert handoff_ms_per_mb({LOCKSTEP_KEY: 1e-3}, reference) is None


def test_handoff_mb_is_what_the_cost_model_counts_for_the_handoff_probe():
    """The extra per MB must be in the estimator's bytes, or a model would be charged at the wrong rate."""

    blob, _ = handoff_probe()
    assert plan(load_graph(blob, fmt="onnx")).written_mb == pytest.approx(HANDOFF_MB, rel=1e-3)


@pytest.mark.host  # times the real CPU's bytes against its FLOPs: beside the parallel tests the ratio fell below 3
def test_the_real_handoff_probe_writes_far_more_bytes_per_ms_than_the_compute_probe():
    """What lets one refresh tell the two apart: the handoff probe is bytes, the compute probe is FLOPs. One thread
    each: with two, beside a busy process of the host's, one shares a core with it and the ratio fell from about 5
    to 1.9 (one thread: about 9 either way, 2-core AMD EPYC VM)."""

    warm = WarmRefresh(threads=1, cpu_budget_s=0.05)
    readings = [warm.measure() for _ in range(3)]  # each probe's fastest: a busy host only adds time
    handoff_s, compute_s = (min(r[key] for r in readings) for key in (HANDOFF_KEY, LOCKSTEP_KEY))
    compute_mb = plan(load_graph(compute_probe()[0], fmt="onnx")).written_mb
    assert HANDOFF_MB / handoff_s > 3 * compute_mb / compute_s


def test_reference_keeps_an_earlier_faster_refresh_and_skips_old_format_ones():
    """Refreshes taken during calibration (a host's fast phase) count; readings of an older probe do not."""
    readings = iter([3e-3, 2e-3, 2.5e-3])

    class Scripted(WarmRefresh):
        def measure(self, stream=False):
            return {LOCKSTEP_KEY: next(readings), "threads": 2.0, "cores": 2.0}

    earlier = [{LOCKSTEP_KEY: 4e-3}, {LOCKSTEP_KEY: 1.5e-3, "threads": 2.0}, {"share": 0.1}]
    assert Scripted(threads=1).reference(earlier) == {LOCKSTEP_KEY: 1.5e-3, "threads": 2.0}
    readings = iter([3e-3, 2e-3, 2.5e-3])
    assert Scripted(threads=1).reference([{LOCKSTEP_KEY: 4e-3}])[LOCKSTEP_KEY] == 2e-3


@pytest.mark.slow
def test_a_real_quick_calibration_spreads_the_probe_over_its_pass_and_keeps_the_median(monkeypatch):
    """The reference describes the same device as the tables, whose one pass runs at whatever speed the host has
    through it: read after each compute family's grid, at the pass's end and after it, and the median of all. A
    family whose refresh read a slow phase (the handoff probe slow for its compute probe) that has passed by the
    pass's end is measured again, and its refresh with it."""

    given = []

    def scripted(self, stream=False):
        seconds = 1e-3 * (1 + len(given))  # 1, 2, 3 ... ms: a host slowing down through the pass
        given.append((seconds, stream))
        handoff = (2.0 if len(given) == 1 else 0.5) * seconds  # the first family's grid in a slow phase
        return {LOCKSTEP_KEY: seconds, HANDOFF_KEY: handoff, GEMM_KEY: 0.7 * seconds, STREAM_KEY: 2 * seconds,
                "threads": 2.0, "cores": 2.0}

    measured: dict[str, int] = {}
    batches = microbench._batches

    def counted(family, pts, budget):
        measured[family] = measured.get(family, 0) + len(pts)
        return batches(family, pts, budget)

    monkeypatch.setattr(WarmRefresh, "measure", scripted)
    monkeypatch.setattr(microbench, "_batches", counted)
    monkeypatch.setattr(microbench, "QUICK_AGAIN_BEFORE_S", math.inf)  # however long the pass took on this host
    cal = microbench.calibrate(quick=True)
    compute = [grid.family for grid in microbench.grids(quick=True) if grid.family in COMPUTE_FAMILIES]
    assert len(compute) >= 5 and len(given) == len(compute) + 2 + REFERENCE_RUNS and all(s for _, s in given)
    points = {f: len(cal.tables[f].points) for f in compute}
    assert measured[compute[0]] >= 2 * points[compute[0]]  # the pass and again
    assert all(measured[f] < 2 * points[f] for f in compute[1:])
    median = statistics.median(seconds for seconds, _ in given[1:])  # the slow phase's refresh replaced
    assert cal.refresh_reference[LOCKSTEP_KEY] == pytest.approx(median)
    assert cal.refresh_reference[STREAM_KEY] == pytest.approx(2 * median)
    assert cal.refresh_reference[GEMM_KEY] == pytest.approx(0.7 * median)


def test_a_quick_calibration_measures_again_only_what_a_slow_phase_that_has_passed_slowed():
    def reading(handoff: float) -> dict[str, float]:
        return {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: handoff * 1e-3}

    after = {"conv": 0, "gemm": 1, "gqa": 2}
    assert microbench.slow_phase_families([reading(0.9), reading(0.6), reading(0.62), reading(0.6)], after) == {"conv"}
    # still in it at the end: measured again, it would read the same
    assert microbench.slow_phase_families([reading(0.9), reading(0.6), reading(0.62), reading(0.9)], after) == set()
    # noise within SLOW_PHASE_HANDOFF of the quietest, or no handoff probe read (an older probe): nothing
    assert microbench.slow_phase_families([reading(0.7), reading(0.6), reading(0.62), reading(0.6)], after) == set()
    assert microbench.slow_phase_families([{LOCKSTEP_KEY: 1e-3}] * 4, after) == set()
    assert microbench.slow_phase_families([reading(0.9), reading(0.6)], {}) == set()  # a full calibration


def test_the_reference_s_gemm_probe_is_read_after_the_float_products_grids_where_there_are_such_readings():
    """A spell that slowed the products' grids and not the rest of the calibration: the gemm probe's reference is the
    state those tables saw (the fastest, or the median, of the readings taken right after them)."""
    refresh = _scripted([(1e-3, 0.5e-3)] * REFERENCE_RUNS)
    earlier = [{LOCKSTEP_KEY: 1e-3, GEMM_KEY: 0.7e-3}]
    products = [{LOCKSTEP_KEY: 1.1e-3, GEMM_KEY: 1.0e-3}, {LOCKSTEP_KEY: 1.1e-3, GEMM_KEY: 0.9e-3},
                {LOCKSTEP_KEY: 1e-3}]
    assert refresh.reference(earlier, products=products)[GEMM_KEY] == 0.9e-3
    refresh = _scripted([(1e-3, 0.5e-3)] * REFERENCE_RUNS)
    assert refresh.reference(earlier, typical=True, products=products)[GEMM_KEY] == pytest.approx(0.95e-3)
    refresh = _scripted([(1e-3, 0.5e-3)] * REFERENCE_RUNS)
    assert refresh.reference(earlier)[GEMM_KEY] == 0.7e-3  # none after them: the fastest of all


def test_a_typical_reference_is_each_probe_s_median():
    earlier = [{LOCKSTEP_KEY: 5e-3, HANDOFF_KEY: 0.8e-3}, {LOCKSTEP_KEY: 4e-3, HANDOFF_KEY: 0.7e-3}]
    reference = _scripted([(3e-3, 0.5e-3), (1e-3, 0.9e-3), (2e-3, 0.6e-3)]).reference(earlier, typical=True)
    assert (reference[LOCKSTEP_KEY], reference[HANDOFF_KEY]) == (3e-3, 0.7e-3)


@pytest.mark.host  # its quiet reference is timed on the real CPU: beside the parallel tests it read 1.24x, not 1.5
def test_real_busy_processes_slow_the_probe_down():
    """Eight times as many real busy processes as cores: each probe thread gets about a ninth of a core, and waits
    for the other (the scheduler favours threads that wake, so the slowdown read is far less than the share says).
    Eight, not two: with a busy process of the host's beside the test, the reference is already slowed (two per
    core read 1.19x there), and four per core read 1.49-2.1x on a 2-core AMD EPYC VM (family 26), eight 2.2-3.0x."""
    warm = WarmRefresh()
    before = warm.reference()
    cores = os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(8 * cores)]
    try:
        time.sleep(0.3)
        loaded = warm.measure()
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    # the quiet device: the faster of a reference before the load and one after it (a process of the host's can fall
    # on either: a reference read 3.5 ms where the next read 1.45)
    quiet = min(before, warm.reference(), key=lambda r: r[LOCKSTEP_KEY])
    assert slowdown(loaded, quiet) > 1.5


def test_module_measure_reuses_one_instance():
    refresh.measure()
    instance = refresh._default
    refresh.reference()
    assert refresh._default is instance


def test_slowdown_is_the_ratio_of_wall_times_per_run():
    quiet = {LOCKSTEP_KEY: 1e-3, "threads": 2.0, "cores": 2.0}
    assert slowdown(quiet, quiet) == pytest.approx(1.0)
    assert slowdown({**quiet, LOCKSTEP_KEY: 2.5e-3}, quiet) == pytest.approx(2.5)
    # the floor is monitors.speed.prediction's
    assert slowdown({**quiet, LOCKSTEP_KEY: 0.9e-3}, quiet) == pytest.approx(0.9)


def test_slowdown_without_a_common_probe_is_none():
    quiet = {LOCKSTEP_KEY: 1e-3, "threads": 2.0, "cores": 2.0}
    old_format = {"cpu_matmul_256": 1e-3, "share": 1.0}  # a reference from an older version: nothing to compare
    assert slowdown(quiet, old_format) is None
    assert slowdown(old_format, quiet) is None
    assert slowdown({LOCKSTEP_KEY: float("nan")}, quiet) is None
    assert slowdown({LOCKSTEP_KEY: 0.0}, quiet) is None


def _children() -> set[int]:
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        return {int(p) for p in f.read().split()}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def test_measured_apart_measures_in_a_process_of_its_own_which_stays_until_let_go():
    """The agent's refresh: the same measurement as `measure()`, in a child process that this process never needs
    onnxruntime for; the CPU reported covers the child's start; the child stays (idle) until the block ends, so
    that the agent's next sample reads its threads."""
    loaded_before = "onnxruntime" in sys.modules
    others = _children()  # a test worker's other children (brokers of other tests) are not the refresh's
    children: set[int] = set()
    async with refresh.measured_apart(stream=True) as (reading, cpu_s):
        assert set(reading) == {LOCKSTEP_KEY, HANDOFF_KEY, GEMM_KEY, STREAM_KEY, "threads", "cores"}
        assert 0 < reading[LOCKSTEP_KEY] < 1.0 and 0 < reading[STREAM_KEY] < 1.0
        assert reading["threads"] == refresh.default_threads() and reading["cores"] == os.cpu_count()
        assert cpu_s > refresh.CPU_BUDGET_S, "the child's whole CPU: its start and the measurement's budget"
        children = _children() - others
        assert any(_alive(p) for p in children), "the refresh's process is still there"
    assert not any(_alive(p) for p in children), "let go, it has ended"
    assert ("onnxruntime" in sys.modules) == loaded_before


def test_the_graph_cache_builds_a_probe_once_and_again_when_its_key_changes_or_its_file_is_torn(tmp_path):
    built: list[str] = []

    def build() -> bytes:
        built.append("compute")
        return compute_probe()[0]

    def use(blob: bytes) -> int:  # as onnxruntime's session: refuses what is not a graph
        assert blob.startswith(compute_probe()[0][:8]), "not the graph"
        return len(blob)

    folder = tmp_path / "graphs"
    size = GraphCache(folder).load("compute", build, use)
    assert GraphCache(folder).load("compute", build, use) == size and built == ["compute"]
    kept = next(folder.iterdir())
    assert kept.name.startswith("compute-") and kept.read_bytes() == compute_probe()[0]

    kept.write_bytes(b"torn")  # a file cut short, or another program's
    assert GraphCache(folder).load("compute", build, use) == size and built == ["compute"] * 2
    assert kept.read_bytes() == compute_probe()[0]  # built again, and kept in its place

    changed = GraphCache(folder)
    changed._key = "another"  # as after an upgrade that changed the probes
    assert changed.load("compute", build, use) == size and built == ["compute"] * 3
    assert [p.name for p in folder.iterdir()] == ["compute-another.onnx"]  # the old key's is gone


def test_the_graph_cache_in_a_folder_it_cannot_write_still_gives_the_graph(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    assert GraphCache(blocked / "graphs").load("handoff", lambda: b"graph", bytes.upper) == b"GRAPH"
    assert GraphCache().load("handoff", lambda: b"graph", bytes.upper) == b"GRAPH"


async def test_measured_apart_keeps_the_probes_graphs_in_its_folder_and_measures_from_them(tmp_path):
    """The agent's refresh leaves the probes' graphs in its folder, and the next refresh's process measures from
    them: a kept compute graph that takes another input than the probe's is what it runs, and fails on."""
    folder = tmp_path / "graphs"
    async with refresh.measured_apart(stream=True, graphs=folder) as (reading, _):
        assert 0 < reading[LOCKSTEP_KEY] < 1.0
    names = sorted(p.name.split("-")[0] for p in folder.iterdir())
    assert names[:3] == ["compute", "gemm", "handoff"] and names[3].startswith("stream") and len(names) == 4
    other = helper.make_graph([helper.make_node("Relu", ["y"], ["z"])], "other",
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
    model = helper.make_model(other, opset_imports=[helper.make_opsetid("", refresh.OPSET)])
    model.ir_version = refresh.IR_VERSION
    next(folder.glob("compute-*.onnx")).write_bytes(model.SerializeToString())
    with pytest.raises(RuntimeError, match="exited with 1"):
        async with refresh.measured_apart(graphs=folder):
            pass


async def test_measured_apart_reports_a_failing_process(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="exited with 1"):
        async with refresh.measured_apart():
            pass


@pytest.mark.parametrize("answers", [False, True], ids=["while-it-measures", "while-it-waits-to-be-let-go"])
async def test_a_stopping_agent_ends_its_refresh_process_at_once(tmp_path, monkeypatch, answers):
    """The agent stops (its refresh task cancelled) while the refresh's process measures, or while it stays to be
    let go: the process is killed then, not waited for (a child that never ends, LEAVE_TIMEOUT_S made long)."""
    child = tmp_path / "refresh"
    answer = 'echo \'{"lockstep_s": 0.001}\'\n' if answers else ""
    child.write_text(f"#!/bin/sh\n{answer}exec sleep 600\n")  # deaf to its stdin closing
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    monkeypatch.setattr(refresh, "LEAVE_TIMEOUT_S", 600.0)
    others = _children()
    inside = asyncio.Event()

    async def refreshing() -> None:
        async with refresh.measured_apart():
            inside.set()
            await asyncio.sleep(600)

    task = asyncio.create_task(refreshing())
    if answers:
        await asyncio.wait_for(inside.wait(), 30)
    else:
        await asyncio.sleep(0.5)
    children = _children() - others
    assert any(_alive(p) for p in children)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)  # before: LEAVE_TIMEOUT_S (here 600 s) for a child that does not end
    assert not any(_alive(p) for p in children)
