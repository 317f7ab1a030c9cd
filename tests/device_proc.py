"""A device /proc for the real-agent tests: this machine's real processes, without the host's other tenants.

The real-agent tests (test_agent_own_work, test_agent_workloads) start a real agent, real apps and real busy
processes, and check what the agent makes of them: its own work is not load, an app's run is not contention
against itself, four busy processes are. On a host shared with other people's jobs, the real /proc shows their
load too, and the agent, rightly, reads it as contention: the tests then fail for what they do not test.

DeviceProc keeps a /proc tree of the device these tests run: the test's process tree (every descendant of the
test process: the agent, its workers, the apps) and the processes it adopts (busy processes started outside
that tree, as others' load is), every 50 ms. `stat` counts their CPU time as the only busy time, scaled as the
simulator scales the device's load (agent/simulation/device.py, HostShare) to what it would have been without
the tenants, thread by thread (update); `loadavg` counts the tasks running or waiting on the device;
`<pid>/stat`, `<pid>/task/<tid>/schedstat` and `.../children` mirror the real ones with the same device times.
The pids are real, so the agent finds its own process tree in it and takes it out of others' load as on the
real /proc: a test still fails if the agent counts its own work, or an app's, as load by others.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from agent.simulation.device import HostShare
from agent.simulation.trees import stat_with_ticks, write_atomic
from probes.process_tree import parse_ppid

HZ = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        found += [int(p) for p in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]
    return found


class DeviceProc:
    """A /proc under `root` of this test's processes alone (see the module's docstring); a context manager."""

    INTERVAL_S = 0.05

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.me = os.getpid()
        self.cpus = sorted(os.sched_getaffinity(0))
        self._host = HostShare(self.cpus)
        self._adopted: set[int] = set()
        self._last: dict[tuple[int, str], tuple[int, int]] = {}  # (pid, tid) -> real schedstat run, wait (ns)
        self._device: dict[tuple[int, str], tuple[float, float]] = {}  # (pid, tid) -> device run, wait (ns)
        self._scaled: dict[int, float] = {}  # pid -> its CPU time on the device (ticks), as its stat says
        self._reaped: dict[int, float] = {}  # pid -> its ended descendants' device time (ticks): its cutime
        self._parent: dict[int, int | None] = {}  # pid -> its parent's pid, from its last stat line
        self._counting = False
        self._busy = 0.0
        self._idle = 0.0
        self._runnable = 0.0  # runnable tasks not yet counted in a whole (see update)
        self._at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-proc", daemon=True)
        write_atomic(self.root / "pressure" / "cpu", b"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                                     b"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        self.update()

    def __enter__(self) -> DeviceProc:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def adopt(self, pids: list[int]) -> None:
        """Processes outside the test's tree that run on the device (busy processes of others)."""
        self._adopted.update(pids)

    def shown(self, pid: int, timeout_s: float = 5.0) -> None:
        """Wait until the device /proc shows `pid` (at its first update after the process started): the agent reads
        the pid an app names from it, and one not there yet read as gone, its run as others' load from then on (a
        test failed so one run in three on a 2-core Intel Xeon VM)."""
        deadline = time.monotonic() + timeout_s
        while not (self.root / str(pid) / "stat").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {pid} is not on the device /proc after {timeout_s} s")
            time.sleep(self.INTERVAL_S / 5)

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self.update()

    def _pids(self) -> list[int]:
        """The test process's descendants (not itself: the test's client is not on the device) and the adopted."""
        found: list[int] = []
        todo = _children(self.me) + [p for p in self._adopted if os.path.exists(f"/proc/{p}")]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.append(pid)
                todo += _children(pid)
        return found

    def update(self) -> None:
        """One update: each thread's time on a CPU and waiting for one since the last (its real schedstat), as it
        would have been on the device: a thread gets the time the tenants took from it back (up to the time it
        wanted: its run and its wait), the device's CPUs at most; what it wanted beyond that it waited."""
        now = time.monotonic()
        elapsed, self._at = now - self._at, now
        stats: dict[int, str] = {}  # pid -> its real stat line
        runs: dict[tuple[int, str], tuple[int, int]] = {}  # (pid, tid) -> this interval's real run, wait (ns)
        for pid in self._pids():
            text = _read(f"/proc/{pid}/stat")
            if text is None:
                continue
            stats[pid] = text
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                tids = []
            for tid in tids:
                fields = (_read(f"/proc/{pid}/task/{tid}/schedstat") or "").split()
                if len(fields) < 2 or not fields[0].isdigit() or not fields[1].isdigit():
                    continue
                run, wait = int(fields[0]), int(fields[1])
                last_run, last_wait = self._last.get((pid, tid), (0, 0) if self._counting else (run, wait))
                runs[(pid, tid)] = (max(0, run - last_run), max(0, wait - last_wait))
                self._last[(pid, tid)] = (run, wait)
        self._counting = True  # the first update is a baseline: what came before it is not the interval's
        real_ticks = int(sum(r for r, _ in runs.values()) * HZ / 1e9)
        share = self._host.share(real_ticks)  # the host's other tenants are not on the device
        wanted = {key: (min(run * share, run + wait), run + wait) for key, (run, wait) in runs.items()}
        capacity_ns = len(self.cpus) * elapsed * 1e9
        total = sum(r for r, _ in wanted.values())
        fit = min(1.0, capacity_ns / total) if total > 0 else 1.0
        waiting_ns = 0.0
        for key, (run, want) in wanted.items():
            run_ns, wait_ns = run * fit, want - run * fit
            waiting_ns += wait_ns
            acc_run, acc_wait = self._device.get(key, (0.0, 0.0))
            self._device[key] = (acc_run + run_ns, acc_wait + wait_ns)
            self._scaled[key[0]] = self._scaled.get(key[0], 0.0) + run_ns * HZ / 1e9
        busy = total * fit * HZ / 1e9
        self._busy += busy
        self._idle += max(0.0, capacity_ns * HZ / 1e9 - busy)
        # An ended process leaves before its parent's cutime holds its time, as the kernel's reaping looks to a
        # reader: never both at once, which a reader would count twice.
        alive = set(stats)
        gone = set(self._parent) - alive  # every process written has its parent noted
        for pid in gone:
            self._reap(pid, gone, alive)
            self._remove(pid)
        for pid, text in stats.items():
            self._parent[pid] = parse_ppid(text)
            stat = stat_with_ticks(text, self._scaled.get(pid, 0.0), self._reaped.get(pid, 0.0))
            if stat is not None:
                write_atomic(self.root / str(pid) / "stat", stat.encode())
                self._mirror_tasks(pid)
        for key in set(self._last) - set(runs):
            self._last.pop(key)
            self._device.pop(key, None)
        # runnable: the tasks on a CPU and those waiting for one, on average over the interval (the fractions
        # carried to the next update, so that the mean of the snapshots is the device's)
        n = len(self.cpus)
        if elapsed > 0:
            self._runnable += (total * fit + waiting_ns) / (elapsed * 1e9)
        running, self._runnable = int(self._runnable), self._runnable - int(self._runnable)
        busy_ticks, idle_ticks = int(self._busy), int(self._idle)
        per = lambda total, i: total // n + (1 if i < total % n else 0)  # noqa: E731
        lines = [f"cpu  {busy_ticks} 0 0 {idle_ticks} 0 0 0 0 0 0"]
        lines += [f"cpu{i} {per(busy_ticks, i)} 0 0 {per(idle_ticks, i)} 0 0 0 0 0 0" for i in range(n)]
        lines += ["intr 0", "ctxt 0", "btime 1700000000", "processes 1", f"procs_running {1 + running}",
                  "procs_blocked 0"]
        write_atomic(self.root / "stat", ("\n".join(lines) + "\n").encode())
        write_atomic(self.root / "loadavg", f"0.00 0.00 0.00 {1 + running}/100 4242\n".encode())
        for name in ("meminfo", "pressure/memory"):  # memory is not shared with the tenants' CPU: the host's own
            text = _read(f"/proc/{name}")
            if text is not None:
                write_atomic(self.root / name, text.encode())

    def _reap(self, pid: int, gone: set[int], alive: set[int]) -> None:
        """An ended process's time goes to its nearest living ancestor's cutime, as the kernel adds a reaped
        child's: the tree's total goes on without a drop (a drop would read the agent's own work as others')."""
        ticks = self._scaled.pop(pid, 0.0) + self._reaped.pop(pid, 0.0)
        ancestor = self._parent.pop(pid, None)
        while ancestor in gone:
            ancestor = self._parent.get(ancestor)
        if ancestor in alive:
            self._reaped[ancestor] = self._reaped.get(ancestor, 0.0) + ticks

    def _mirror_tasks(self, pid: int) -> None:
        """Each thread's device run and wait (schedstat) and the children it forked (real)."""
        where = self.root / str(pid) / "task"
        tids = {tid for p, tid in self._device if p == pid}
        for gone in set(os.listdir(where) if where.is_dir() else []) - tids:
            shutil.rmtree(where / gone, ignore_errors=True)
        for tid in tids:
            run, wait = self._device[(pid, tid)]
            write_atomic(where / tid / "schedstat", f"{int(run)} {int(wait)} 0\n".encode())
            children = _read(f"/proc/{pid}/task/{tid}/children")
            if children is not None:
                write_atomic(where / tid / "children", children.encode())

    def _remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid), ignore_errors=True)
