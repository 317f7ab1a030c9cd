"""CPU and memory probes: /proc/stat deltas, own-process subtraction, steal, PSI, clocks."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from agent.simulation.load import Load
from agent.simulation.trees import desktop, laptop, vm
from probes.cpu import CpuProbe, CpuState, parse_loadavg_running, parse_proc_stat, parse_psi_some, parse_psi_some_avg10
from probes.memory import MemoryProbe, parse_meminfo
from probes.process_tree import ProcessTree
from probes.sysfs import KernelFiles
from probes.tree_cpu import TreeCpu


def fixture_probe(tree) -> CpuProbe:
    return CpuProbe(KernelFiles(tree.sys), KernelFiles(tree.proc))


def test_vm_fixture_tree_first_sample_has_no_load_not_zero(tmp_path):
    state = fixture_probe(vm(tmp_path)).sample()
    assert state.cores == 2
    assert state.load is None and state.steal is None and state.busy_cores is None


def test_vm_fixture_tree_steal_and_load_from_deltas(tmp_path):
    tree = vm(tmp_path)
    probe = fixture_probe(tree)
    probe.sample()
    # next 100 ticks: 50 busy, 30 idle, 20 stolen
    tree.set_stat(busy=5050, idle=14030, steal=1020)
    state = probe.sample()
    assert state.steal == pytest.approx(0.2)
    assert state.busy_cores == pytest.approx(1.0)  # 50 % of 2 cores
    assert state.load == pytest.approx(0.5) and state.others_busy_cores == pytest.approx(1.0)
    assert state.psi_some_avg10 is None  # no PSI on this kernel
    assert state.cur_mhz is None and state.max_mhz is None


def test_laptop_fixture_tree_clocks_and_psi(tmp_path):
    state = fixture_probe(laptop(tmp_path)).sample()
    assert state.cur_mhz == 1400.0 and state.max_mhz == 4200.0 and state.limit_mhz == 4200.0
    assert state.clock_ratio == pytest.approx(1 / 3)
    assert state.psi_some_avg10 == 1.5


def test_desktop_fixture_tree_clock_limit_below_max(tmp_path):
    tree = desktop(tmp_path)
    tree.cpufreq(cur_khz=2_000_000, max_khz=4_700_000, limit_khz=2_350_000)
    probe = fixture_probe(tree)
    state = probe.sample()
    assert state.limit_mhz == 2350.0 and state.max_mhz == 4700.0
    tree.cpufreq(cur_khz=1_000_000, max_khz=4_700_000, limit_khz=1_175_000)  # the cpufreq cooling device caps it
    assert probe.sample().limit_mhz == 1175.0  # at the next sample, not a cache's lifetime later


def test_vm_fixture_tree_counters_going_back_give_no_load(tmp_path):
    tree = vm(tmp_path)
    probe = fixture_probe(tree)
    probe.sample()
    tree.set_stat(busy=10, idle=10)  # garbage or a counter reset
    state = probe.sample()
    assert state.load is None


def test_vm_fixture_tree_first_sample_has_no_run_queue_reading(tmp_path):
    """Before an interval is measured the agent's own threads cannot be taken out of the run queue: at
    start-up they would read as others' contention."""
    tree = vm(tmp_path)
    tree.set_stat(busy=5000, idle=14000, steal=1000, running=6)
    probe = fixture_probe(tree)
    probe.tick()
    first = probe.sample()
    assert first.runnable_others is None and first.demand is None
    tree.set_stat(busy=5200, idle=14000, steal=1000, running=3)
    assert probe.sample().runnable_others == pytest.approx(2.0)  # the start-up snapshots were dropped


def test_vm_fixture_tree_runnable_is_the_mean_of_the_snapshots_since_the_last_sample(tmp_path):
    tree = vm(tmp_path)
    probe = fixture_probe(tree)
    probe.sample()
    for running in (7, 7, 3):  # the run queue between samples: 6 others, 6, then 2 (the reader is one)
        tree.set_proc("loadavg", f"1.0 1.0 1.0 {running}/300 4242\n")
        probe.tick()
    tree.set_proc("loadavg", "garbage\n")
    probe.tick()  # skipped, not a zero
    tree.set_stat(busy=5200, idle=14000, steal=1000, running=3)  # the sample's own snapshot: 2 others
    assert probe.sample().runnable_others == pytest.approx((6 + 6 + 2 + 2) / 4)
    tree.set_stat(busy=5400, idle=14000, steal=1000, running=1)
    assert probe.sample().runnable_others == 0.0  # the snapshots were used up: only the sample's own


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_vm_fixture_tree_no_run_queue_snapshots_while_psi_says_no_task_waited(tmp_path):
    """At rest the sampler sleeps from one sample to the next: PSI's stall time says no task waited for a CPU,
    so the tasks that want one are the busy ones."""
    tree, clock = vm(tmp_path), Clock()
    probe = CpuProbe(KernelFiles(tree.sys), KernelFiles(tree.proc), clock=clock)
    stall_us = 1000
    tree.set_psi(0.0, cpu_some_total_us=stall_us)
    probe.sample()
    assert probe.wants_ticks()  # PSI not seen moving yet: it could be a fixture's
    busy = 5000
    for stalled_s, want in ((0.5, True), (0.002, False), (0.2, True)):
        clock.now += 1.0
        busy += 100
        stall_us += int(stalled_s * 1e6)
        tree.set_psi(0.0, cpu_some_total_us=stall_us)
        tree.set_stat(busy=busy, idle=14000, steal=1000, running=5)
        state = probe.sample()
        assert probe.wants_ticks() is want
        if not want:  # no snapshot: the busy cores and what PSI saw waiting, not the sample's stray snapshot
            assert state.runnable_others == pytest.approx(state.others_busy_cores + 0.002)
        else:
            assert state.runnable_others == pytest.approx(4.0)


def test_vm_fixture_tree_wants_run_queue_snapshots_where_psi_does_not_move_or_is_missing(tmp_path):
    tree, clock = vm(tmp_path), Clock()
    probe = CpuProbe(KernelFiles(tree.sys), KernelFiles(tree.proc), clock=clock)
    tree.set_psi(0.0, cpu_some_total_us=1000)  # a fixture's PSI: the same total at every read
    for _ in range(3):
        clock.now += 1.0
        probe.sample()
        assert probe.wants_ticks()
    (tree.proc / "pressure" / "cpu").unlink()
    clock.now += 1.0
    probe.sample()
    assert probe.wants_ticks()


def test_parse_psi_some_gives_avg10_and_total():
    assert parse_psi_some("some avg10=2.91 avg60=1.14 avg300=0.98 total=5\nfull total=0\n") == (2.91, 5)
    assert parse_psi_some("some avg10=x total=-3\n") == (None, None)


def _cpu(busy_cores: float, others: float, runnable: float | None) -> CpuState:
    return CpuState(cores=2, load=others / 2, busy_cores=busy_cores, others_busy_cores=others, own_cores=0.0,
                    runnable_others=runnable, steal=0.0, psi_some_avg10=None, cur_mhz=None, max_mhz=None,
                    limit_mhz=None, interval_s=1.0)


def test_demand_counts_waiting_tasks_only_as_far_as_all_cores_were_busy():
    assert _cpu(2.0, 2.0, 6.0).demand == pytest.approx(6.0)  # saturated: 4 more wait
    assert _cpu(0.1, 0.1, 2.0).demand == pytest.approx(0.1 + 0.05 * 1.9)  # idle: a stray snapshot
    assert _cpu(1.0, 1.0, 3.0).demand == pytest.approx(2.0)  # load that stopped halfway through
    assert _cpu(1.5, 1.5, 1.0).demand == pytest.approx(1.5)  # never below the busy cores
    assert _cpu(1.0, 1.0, None).demand == 1.0
    assert dataclasses.replace(_cpu(1.0, 1.0, 3.0), others_busy_cores=None).demand == 3.0


def test_parsers_reject_garbage():
    assert parse_loadavg_running("0.52 0.58 0.59 3/467 12345\n") == 3
    assert parse_loadavg_running("0.52 0.58 0.59 x/467 12345\n") is None
    assert parse_loadavg_running("0.52 0.58\n") is None
    assert parse_proc_stat("cpu  a b c d\ncpu0 1 2 3 4\n") is None
    assert parse_proc_stat("intr 1 2\n") is None
    assert parse_proc_stat("cpu  1 2 3 4\n") is None  # no per-CPU lines: core count unknown
    assert parse_psi_some_avg10("some avg10=101.00 avg60=0\n") is None
    assert parse_psi_some_avg10("some avg10=2.91 avg60=1.14 avg300=0.98 total=5\n") == 2.91
    assert parse_meminfo("MemTotal: 100 kB\nMemAvailable: 200 kB\n") is None
    assert parse_meminfo("MemTotal: 100 kB\nMemAvailable: 50 kB\n") == {"MemTotal": 102400, "MemAvailable": 51200}


def test_memory_fixture_tree(tmp_path):
    tree = laptop(tmp_path)
    tree.set_psi(0.0, 12.5)
    state = MemoryProbe(KernelFiles(tree.proc)).sample()
    assert state.total_bytes == 16 * 2**30 and state.available_bytes == 12 * 2**30
    assert state.psi_some_avg10 == 12.5


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def real_probe() -> CpuProbe:
    proc = KernelFiles("/proc")
    return CpuProbe(KernelFiles("/sys"), proc, own=TreeCpu(proc, ProcessTree(proc, os.getpid())))


def test_real_proc_own_cpu_is_not_load_by_others():
    """This process spinning for 0.3 s of CPU shows as own cores, not as others."""
    probe = real_probe()
    probe.sample()
    _burn(0.3)
    state = probe.sample()
    assert state.own_cores is not None and state.interval_s is not None
    assert state.own_cores * state.interval_s == pytest.approx(0.3, abs=0.1)  # core-seconds this process used
    # each figure is rounded to 4 places on its own, so their difference may be off by 1e-4
    assert state.others_busy_cores <= state.busy_cores - state.own_cores + 2e-4


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_real_proc_busy_process_is_load_by_others():
    """A real busy process that is not the agent's (not in its process tree) is load by others, whatever
    else runs here."""
    probe = real_probe()
    with Load(detached=True) as load:
        load.set_busy(1)
        pid = load.pids[0]
        time.sleep(0.2)
        before = _cpu_seconds(pid)
        probe.sample()
        time.sleep(0.6)
        state = probe.sample()
        child_cores = (_cpu_seconds(pid) - before) / state.interval_s
    assert child_cores > 0.1  # it did run
    assert state.others_busy_cores >= child_cores - 0.15  # tick granularity
    assert state.own_cores < 0.2
    assert state.runnable_others is not None and state.runnable_others >= 0


def test_vm_fixture_tree_an_app_tracked_between_samples_is_measured_by_the_next_one(tmp_path):
    """An app says it runs a workload (its pid) before starting it: read at once, its first run after is measured
    as its own in the very next sample, not left to others' load for an interval."""
    tree = vm(tmp_path)
    tree.process(4242, 1, "app")
    probe = fixture_probe(tree)
    probe.sample()
    probe.track(frozenset({4242}))
    stat = tree.proc / "4242" / "stat"
    stat.write_text(stat.read_text().replace(" 50 20 0 0 ", " 100 20 0 0 "))  # 50 more ticks: half a second
    tree.set_stat(busy=5060, idle=14040, steal=1000)  # 100 ticks of 2 cores: 1.2 busy
    state = probe.sample()
    assert state.tracked[4242].cores == pytest.approx(1.0)
    tree.set_stat(busy=5080, idle=14120, steal=1000)
    assert probe.sample().tracked[4242].cores == 0.0  # nothing since
    probe.track(frozenset())
    tree.set_stat(busy=5100, idle=14200, steal=1000)
    assert probe.sample().tracked == {}
