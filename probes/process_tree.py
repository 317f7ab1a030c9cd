"""The agent's own process tree: its own pid and every descendant.

Work that this tree does on a device (its calibration, its analysis workers)
is not load by others. Parents come from `/proc/<pid>/stat` under the procfs
root, so the tests run the same code on a fixture tree; a pid whose stat
cannot be read is not counted as the agent's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from probes.sysfs import KernelFiles

MAX_DEPTH = 64  # a parent chain longer than this is garbage (or a loop)
MAX_MEMBERS = 256  # more descendants than this: the rest are found by their parents (snapshot)


def parse_ppid(text: str) -> int | None:
    """The parent pid in `/proc/<pid>/stat`: `1234 (a (weird) name) S 1 ...` -> 1. The name may hold spaces and
    parentheses, so the fields are read after its last closing parenthesis."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


class ProcessTree:
    """Tells the agent's own processes from others'.

    `root_pid`: the agent's pid (None: no process is the agent's by descent). `extra_pids`: a callable that
    gives further pids to count as the agent's (injected by tests and by the agent for helpers it knows of).
    """

    def __init__(self, proc_files: KernelFiles, root_pid: int | None,
                 extra_pids: Callable[[], Collection[int]] | None = None) -> None:
        self.proc = proc_files
        self.root_pid = root_pid
        self.extra_pids = extra_pids

    def members(self) -> set[int]:
        """The agent's pids: the extra ones, the root and its descendants as `/proc/<pid>/task/<tid>/children`
        lists them (each thread lists the children it forked). A kernel without CONFIG_PROC_CHILDREN has no such
        files: then every process's parent chain is followed instead (a read of each /proc/<pid>/stat)."""
        found = set(self.extra_pids()) if self.extra_pids is not None else set()
        if self.root_pid is not None:
            found.add(self.root_pid)
            if not self.proc.exists(f"{self.root_pid}/task/{self.root_pid}/children"):
                owns = self.snapshot()
                return found | {int(p) for p in self.proc.listdir("") if p.isdigit() and owns(int(p))}
        queue = sorted(found)
        while queue and len(found) < MAX_MEMBERS:
            pid = queue.pop()
            for tid in self.proc.listdir(f"{pid}/task"):
                for word in (self.proc.read_raw(f"{pid}/task/{tid}/children") or "").split():
                    if word.isdigit() and int(word) not in found:
                        found.add(int(word))
                        queue.append(int(word))
        return found

    def snapshot(self) -> Callable[[int], bool]:
        """A test for one sample: parents read once per pid (processes come and go between samples)."""
        extra = set(self.extra_pids()) if self.extra_pids is not None else set()
        parents: dict[int, int | None] = {}

        def parent(pid: int) -> int | None:
            if pid not in parents:
                # read_raw, not read: no last good value per pid (pids come and go; a stale parent is no help)
                text = self.proc.read_raw(f"{pid}/stat", 1024) if pid > 0 else None
                parents[pid] = parse_ppid(text) if text else None
            return parents[pid]

        def owns(pid: int) -> bool:
            current: int | None = pid
            for _ in range(MAX_DEPTH):
                if current is None or current <= 0:
                    return False
                if current in extra or current == self.root_pid:
                    return True
                if current == 1:
                    return False
                current = parent(current)
            return False

        return owns
