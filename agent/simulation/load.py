"""Real load for a simulated device, and for tests and benchmarks: busy processes and a process holding memory.

Each load process exits by itself when its owner (the process that started it) is gone, so that nothing
keeps spinning after a crash. A `detached` load is started outside its owner's process tree (its parent is
a launcher that exits at once): an agent running in the owner's process leaves its own process tree out of
the load it sees (probes/tree_cpu.py), and must see this load as others'.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

# The owner's liveness is checked every couple of million iterations (a few times a second).
_SPIN = ("import os, sys\nowner = int(sys.argv[1])\nn = 0\n"
         "while True:\n    n += 1\n    if n % 2000000 == 0:\n        try:\n            os.kill(owner, 0)\n"
         "        except OSError:\n            break\n")
_HOLD = ("import os, sys, time\nowner = int(sys.argv[1])\nblock = b'\\x01' * (int(sys.argv[2]) << 20)\n"
         "print('held', flush=True)\nwhile True:\n    time.sleep(0.5)\n    try:\n        os.kill(owner, 0)\n"
         "    except OSError:\n        break\n")
# Starts a command in a new session, waits for its first line if asked, prints its pid and exits: the
# command is then reparented away from the owner's tree.
_LAUNCH = ("import subprocess, sys\nwait = sys.argv[1] == '1'\n"
           "p = subprocess.Popen(sys.argv[2:], start_new_session=True, stdin=subprocess.DEVNULL,\n"
           "                     stderr=subprocess.DEVNULL, stdout=subprocess.PIPE if wait else subprocess.DEVNULL)\n"
           "if wait:\n    p.stdout.readline()\nprint(p.pid, flush=True)\n")


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in USER_HZ ticks; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class LoadProcess:
    pid: int
    child: subprocess.Popen[bytes] | None  # None when detached: not this process's child

    @classmethod
    def start(cls, code: str, args: list[str], detached: bool, ready_line: bool = False,
              cpus: Sequence[int] | None = None) -> LoadProcess:
        """`cpus`: the only CPUs it may run on (a simulated device's), else any."""
        command = [sys.executable, "-c", code, str(os.getpid()), *args]
        if detached:
            out = subprocess.run([sys.executable, "-c", _LAUNCH, "1" if ready_line else "0", *command],
                                 stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=60)
            started = cls(int(out.stdout.split()[-1]), None)
        else:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if ready_line else subprocess.DEVNULL)
            if ready_line:
                assert child.stdout is not None
                child.stdout.readline()  # the memory is touched and resident
            started = cls(child.pid, child)
        if cpus is not None:
            try:
                os.sched_setaffinity(started.pid, cpus)
            except ProcessLookupError:
                pass
        return started

    def stop(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5.0  # reaped by whoever adopted it; off the run queue once it is a zombie
        while time.monotonic() < deadline and _state(self.pid) not in ("Z", "X", None):
            time.sleep(0.01)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


class Load:
    """Real load: busy processes and a process holding memory; `detached` starts them outside this process's
    tree. A context manager: everything stops on exit."""

    def __init__(self, detached: bool = False, cpus: Sequence[int] | None = None) -> None:
        self.detached = detached
        self.cpus = cpus  # the CPUs it runs on (a simulated device's), else any
        self.busy: list[LoadProcess] = []
        self.holder: LoadProcess | None = None
        self.held_mb = 0
        self._seen: dict[int, int] = {}  # pid -> ticks counted so far
        self._gone_ticks = 0

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.busy]

    def set_busy(self, count: int) -> None:
        while len(self.busy) < count:
            self.busy.append(LoadProcess.start(_SPIN, [], self.detached, cpus=self.cpus))
        while len(self.busy) > count:
            self._end(self.busy.pop())

    def set_memory(self, mb: int) -> None:
        if self.holder is not None:
            self._end(self.holder)
            self.holder, self.held_mb = None, 0
        if mb > 0:
            self.holder = LoadProcess.start(_HOLD, [str(mb)], self.detached, ready_line=True, cpus=self.cpus)
            self.held_mb = mb

    def _end(self, proc: LoadProcess) -> None:
        self._gone_ticks += self._delta(proc.pid)
        proc.stop()
        self._seen.pop(proc.pid, None)

    def _delta(self, pid: int) -> int:
        now = cpu_ticks(pid)
        before = self._seen.get(pid, 0)
        self._seen[pid] = max(now, before)
        return max(0, now - before)

    def take_ticks(self) -> int:
        """CPU ticks the load used since the last call."""
        procs = self.busy + ([self.holder] if self.holder is not None else [])
        total = self._gone_ticks + sum(self._delta(p.pid) for p in procs)
        self._gone_ticks = 0
        return total

    @property
    def running(self) -> int:
        return len(self.busy)

    def stop(self) -> None:
        self.set_busy(0)
        self.set_memory(0)
