"""A process tree's CPU: the time it uses and the time its threads wait for a CPU.

The CPU probe reads two kinds of tree. The agent's own (probes/process_tree.py), which it takes out of what
others use, so that the agent's calibration processes, its estimator workers, its warm refreshes and its
local broker are never read as load by others; and the tree of each app that said it runs a monitored
workload here, whose use the agent takes out for that app's own monitor only (docs/device-state.md).

CPU time is utime + stime + cutime + cstime summed over the tree's live processes (/proc/<pid>/stat): a
child that ends is reaped by its parent inside the tree, which adds its time to the parent's cutime and
cstime, so the total goes on without a jump (one reaped while the tree is read, after its parent was: the tree is
read again). Waits come from each thread's scheduler statistics
(/proc/<pid>/task/<tid>/schedstat: time on a CPU, time waiting on a run queue, in ns), as a delta per
thread; a thread that ends between two readings loses its last part. Which processes belong to a tree is
probes/process_tree.py's to say.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from probes.process_tree import ProcessTree
from probes.sysfs import KernelFiles

READ_TRIES = 3  # readings of the tree in one read(), while a process vanishes between its listing and its stat


@dataclass(frozen=True)
class TreeUsage:
    """What the tree used since the previous reading."""

    cpu_s: float  # CPU seconds, every process and thread of the tree
    wait_s: float | None  # seconds its threads waited on a run queue (None: no scheduler statistics)
    processes: int  # live processes in the tree now


def parse_stat_times(text: str) -> int | None:
    """utime + stime + cutime + cstime (clock ticks) from a /proc/<pid>/stat line; None for garbage.
    The command name may hold spaces and parentheses: the fields start after the last ')'."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 15:
        return None
    try:
        times = [int(v) for v in fields[11:15]]
    except ValueError:
        return None
    return sum(times) if min(times) >= 0 else None


def parse_schedstat_wait_ns(text: str) -> int | None:
    """The second field of a schedstat line (ns waiting on a run queue)."""
    fields = text.split()
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


class TreeCpu:
    """The CPU use of one process tree (`tree`), read under `proc_files`."""

    def __init__(self, proc_files: KernelFiles, tree: ProcessTree) -> None:
        self.proc = proc_files
        self.tree = tree
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._cpu_ticks: int | None = None
        self._waits: dict[int, int] = {}

    def read(self) -> TreeUsage | None:
        """The tree's use since the previous call; None on the first call (a delta needs two)."""
        # A process reaped between the listing and its reading: its parent, read before, did not yet hold its
        # time in cutime, and the tree's total would drop by all it ever used (that interval's own work read as
        # others'). Read again: the parent holds it now.
        for _ in range(READ_TRIES):
            pids, ticks, waits, complete = self._read_once()
            if complete:
                break
        before, self._cpu_ticks = self._cpu_ticks, ticks
        previous, self._waits = self._waits, waits
        if before is None:
            return None
        wait_ns = sum(max(0, w - previous.get(tid, 0)) for tid, w in waits.items()) if waits else None
        return TreeUsage(cpu_s=max(0, ticks - before) / self._ticks_per_s,
                        wait_s=None if wait_ns is None else wait_ns / 1e9, processes=len(pids))

    def _read_once(self) -> tuple[list[int], int, dict[int, int], bool]:
        """The tree's processes, their CPU ticks summed, each thread's wait (ns), and whether every process
        listed could be read."""
        pids = sorted(self.tree.members())
        ticks = 0
        waits: dict[int, int] = {}
        complete = True
        for pid in pids:
            text = self.proc.read_raw(f"{pid}/stat", 4096)
            complete = complete and text is not None  # else gone since the listing
            times = parse_stat_times(text or "")
            if times is None:
                continue
            ticks += times
            for tid in self.proc.listdir(f"{pid}/task"):
                wait = parse_schedstat_wait_ns(self.proc.read_raw(f"{pid}/task/{tid}/schedstat", 256) or "")
                if wait is not None and tid.isdigit():
                    waits[int(tid)] = wait
        return pids, ticks, waits, complete
