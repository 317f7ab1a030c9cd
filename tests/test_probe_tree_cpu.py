"""The agent's own process tree is its own work, not load by others: real processes on the real /proc, and the
arithmetic on a fixture /proc tree (a child reaped, garbage, files that vanish)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.simulation.load import Load
from probes.cpu import CpuProbe
from probes.process_tree import ProcessTree
from probes.sysfs import KernelFiles
from probes.tree_cpu import TreeCpu, parse_schedstat_wait_ns, parse_stat_times

HZ = os.sysconf("SC_CLK_TCK")
GRANDCHILD = ("import subprocess, sys\n"
              "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
              "print(p.pid, flush=True)\np.wait()\n")


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def real_probe() -> CpuProbe:
    proc = KernelFiles("/proc")
    return CpuProbe(KernelFiles("/sys"), proc, own=TreeCpu(proc, ProcessTree(proc, os.getpid())))


@pytest.mark.host
def test_real_proc_busy_child_and_grandchild_are_the_agent_s_own_work():
    """A calibration or an estimator worker is a child (or, through the forkserver, a grandchild) of the
    agent: its CPU time counts as the agent's own, not as load by others."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    parent = subprocess.Popen([sys.executable, "-c", GRANDCHILD], stdout=subprocess.PIPE)
    grandchild = int(parent.stdout.readline())
    try:
        tree = ProcessTree(KernelFiles("/proc"), os.getpid())
        assert {child.pid, parent.pid, grandchild} <= tree.members()
        probe = real_probe()
        time.sleep(0.2)
        probe.sample()
        before = _ticks(child.pid) + _ticks(grandchild)
        time.sleep(0.8)
        state = probe.sample()
        used_s = (_ticks(child.pid) + _ticks(grandchild) - before) / HZ
    finally:
        os.kill(grandchild, 9)
        for p in (child, parent):
            p.kill()
            p.wait()
    assert used_s > 0.3  # they did run
    # every core-second the two used is the tree's own (to a few ticks either way)
    assert state.own_cores * state.interval_s >= used_s - 0.1
    assert state.others_busy_cores <= state.busy_cores - state.own_cores + 2e-4


@pytest.mark.host
def test_real_proc_own_threads_waiting_for_a_cpu_are_not_others_on_the_run_queue():
    """Three busy processes on this machine's cores, first the agent's own (children), then others'
    (detached, outside its tree): the run queue reads them as others' only in the second case. Whatever else
    runs on the host is in both readings: three rounds interleaved, their medians compared."""
    def runnable_others(detached: bool) -> float:
        with Load(detached=detached) as load:
            load.set_busy(3)
            probe = real_probe()
            time.sleep(0.3)
            probe.sample()
            for _ in range(10):
                time.sleep(0.08)
                probe.tick()
            return probe.sample().runnable_others

    rounds = [(runnable_others(False), runnable_others(True)) for _ in range(3)]
    own, others = (statistics.median(r[i] for r in rounds) for i in (0, 1))
    assert others >= 2.0, rounds  # three busy processes of others, and what else runs here
    assert own <= others - 1.5, rounds  # the agent's own three are left out


@pytest.mark.host
def test_real_proc_detached_load_is_outside_the_tree():
    with Load(detached=True) as load:
        load.set_busy(1)
        assert load.pids[0] not in ProcessTree(KernelFiles("/proc"), os.getpid()).members()


# -- fixture /proc ---------------------------------------------------------------------------------------------------

def _stat(pid: int, utime: int, stime: int = 0, cutime: int = 0, cstime: int = 0, name: str = "python3",
          ppid: int = 1) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
    return (f"{pid} ({name}) S {ppid} 1 1 0 -1 4194304 100 0 0 0 {utime} {stime} {cutime} {cstime} "
            "20 0 1 0 100 1000 50\n")


class FakeProc:
    """A fixture /proc with a process tree: each process's stat, its threads' schedstat, their children."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def process(self, pid: int, utime: int, cutime: int = 0, children: tuple[int, ...] = (),
                waits_ns: dict[int, int] | None = None, name: str = "python3") -> None:
        base = self.root / str(pid)
        base.mkdir(parents=True, exist_ok=True)
        (base / "stat").write_text(_stat(pid, utime, cutime=cutime, name=name))
        for tid, wait in (waits_ns or {pid: 0}).items():
            task = base / "task" / str(tid)
            task.mkdir(parents=True, exist_ok=True)
            (task / "schedstat").write_text(f"{10**9} {wait} 42\n")
            (task / "children").write_text(" ".join(map(str, children)) + (" " if children else ""))

    def remove(self, pid: int) -> None:

        shutil.rmtree(self.root / str(pid))


def test_fixture_proc_tree_cpu_goes_on_without_a_jump_when_a_child_is_reaped(tmp_path):
    proc = FakeProc(tmp_path)
    proc.process(100, utime=500, children=(101,), waits_ns={100: 0, 102: 0})
    proc.process(101, utime=1000, name="spawn (worker) x")  # a command name with spaces and parentheses
    files = KernelFiles(tmp_path)
    tree = TreeCpu(files, ProcessTree(files, 100))
    assert tree.tree.members() == {100, 101}
    assert tree.read() is None  # a delta needs two readings
    proc.process(101, utime=1000 + 2 * HZ)  # two seconds of CPU in the child
    proc.process(100, utime=500, children=(101,), waits_ns={100: 0, 102: 3 * 10**8})
    usage = tree.read()
    assert usage.cpu_s == pytest.approx(2.0) and usage.processes == 2
    assert usage.wait_s == pytest.approx(0.3)
    # the child ends and the agent reaps it: its time moves into the agent's cutime
    proc.remove(101)
    proc.process(100, utime=500 + HZ // 2, cutime=1000 + 2 * HZ, waits_ns={100: 0, 102: 3 * 10**8})
    usage = tree.read()
    assert usage.cpu_s == pytest.approx(0.5)  # the agent's own half second, not the child's whole life again
    assert usage.wait_s == pytest.approx(0.0) and usage.processes == 1


class ReapedWhileRead(KernelFiles):
    """A fixture /proc where the child is reaped just as its stat is about to be read: after the agent's stat was
    read without it in cutime, before the child's (the kernel does both at once, at any moment)."""

    def __init__(self, root: Path, proc: FakeProc) -> None:
        super().__init__(root)
        self.fake = proc
        self.armed = False

    def read_raw(self, rel: str, max_bytes: int = 65536) -> str | None:
        if self.armed and rel == "101/stat":
            self.armed = False
            self.fake.remove(101)
            self.fake.process(100, utime=500 + HZ, cutime=1000 + 2 * HZ)
        return super().read_raw(rel, max_bytes)


def test_fixture_proc_tree_cpu_a_child_reaped_while_the_tree_is_read_is_not_a_drop(tmp_path):
    """The agent's second of work in that interval is its own, not lost in a drop of the child's whole life
    (which would read it as others' load), and the child's time is not counted twice after."""
    proc = FakeProc(tmp_path)
    proc.process(100, utime=500, children=(101,))
    proc.process(101, utime=1000 + 2 * HZ)
    files = ReapedWhileRead(tmp_path, proc)
    tree = TreeCpu(files, ProcessTree(files, 100))
    assert tree.read() is None
    proc.process(100, utime=500 + HZ, children=(101,))  # the agent's own second
    files.armed = True
    assert tree.read().cpu_s == pytest.approx(1.0)
    proc.process(100, utime=500 + 2 * HZ, cutime=1000 + 2 * HZ)
    assert tree.read().cpu_s == pytest.approx(1.0)


def test_fixture_proc_tree_garbage_and_vanished_processes_are_skipped(tmp_path):
    proc = FakeProc(tmp_path)
    proc.process(100, utime=100, children=(101, 102))
    proc.process(101, utime=100)
    (tmp_path / "102").mkdir()  # listed, but gone before its stat is read
    files = KernelFiles(tmp_path)
    tree = TreeCpu(files, ProcessTree(files, 100))
    tree.read()
    (tmp_path / "101" / "stat").write_text("garbage")
    (tmp_path / "100" / "task" / "100" / "schedstat").write_text("\x00\xff")
    usage = tree.read()
    assert usage.cpu_s == 0.0  # the garbage process is left out; the total never goes below zero
    assert usage.wait_s is None


@pytest.mark.parametrize("text, expected", [
    (_stat(7, 10, 20, 30, 40), 100),
    ("7 (a) b) c) S 1 1 1 0 -1 0 0 0 0 0 1 2 3 4 20 0\n", 10),
    ("", None), ("7 (x) S 1 2", None), ("7 (x) S 1 1 1 0 -1 0 0 0 0 0 a b c d 20 0", None),
    ("7 (x) S 1 1 1 0 -1 0 0 0 0 0 -1 2 3 4 20 0", None),
])
def test_stat_times_parse(text, expected):
    assert parse_stat_times(text) == expected


@pytest.mark.parametrize("text, expected", [("123 456 7\n", 456), ("123", None), ("1 x 2", None), ("", None)])
def test_schedstat_wait_parse(text, expected):
    assert parse_schedstat_wait_ns(text) == expected


def test_fixture_proc_tree_without_children_files_is_found_by_parent_chains(tmp_path):
    """A kernel without CONFIG_PROC_CHILDREN: the tree comes from each process's parent."""
    for pid, ppid in ((100, 1), (101, 100), (102, 101), (200, 1), (201, 200)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, 10, ppid=ppid))
    assert ProcessTree(KernelFiles(tmp_path), 100).members() == {100, 101, 102}
