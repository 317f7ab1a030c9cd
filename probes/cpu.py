"""CPU probe: load by others than this agent, PSI, steal time, current vs maximum clocks.

Load comes from /proc/stat deltas between two samples (psutil.cpu_percent's
first call says 0.0, which would be a made-up reading). The agent's whole
process tree (probes/tree_cpu.py) is taken out, its CPU time from the busy
cores and its running and waiting threads from the run queue, so that its
calibrations, estimator workers and warm refreshes never look like contention.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from probes.process_tree import ProcessTree
from probes.sysfs import STATIC_TTL_S, KernelFiles, parse_float, take
from probes.tree_cpu import TreeCpu, TreeUsage

_STAT_BYTES = 1 << 18  # /proc/stat on a large machine is longer than a page
# Run-queue snapshots are taken between samples only while tasks wait for a CPU: PSI's `some` stall time over the
# last interval at least this share of it (or PSI not seen moving, as a fixture's or a kernel without PSI).
TICK_STALL_SHARE = 0.01


@dataclass(frozen=True)
class CpuTimes:
    """Aggregate /proc/stat CPU times, in USER_HZ ticks summed over CPUs."""

    busy: int
    idle: int
    steal: int
    cores: int
    running: int | None = None  # procs_running: tasks on or waiting for a CPU right now (the reader included)

    @property
    def total(self) -> int:
        return self.busy + self.idle + self.steal


@dataclass(frozen=True)
class TreeShare:
    """What one tracked process tree (an app running a monitored workload) used over the interval."""

    cores: float  # cores it kept busy
    waiting: float  # its threads waiting on a run queue, on average


@dataclass(frozen=True)
class CpuState:
    cores: int | None  # online CPUs
    load: float | None  # share of all cores kept busy by others than this process, 0..1
    busy_cores: float | None  # cores busy with anything
    others_busy_cores: float | None  # cores busy with others than the agent's process tree
    own_cores: float | None  # cores used by the agent's process tree
    # Tasks of others that want a CPU (running or waiting): the mean of the run-queue snapshots taken
    # over the interval (CpuProbe.tick), or one snapshot. Unlike busy cores this does not saturate at
    # the core count: it tells 2 busy processes on 2 cores from 6.
    runnable_others: float | None
    steal: float | None  # share of CPU time taken by the hypervisor, 0..1
    psi_some_avg10: float | None  # % of the last 10 s some runnable task waited for a CPU
    cur_mhz: float | None  # mean current clock over cpufreq policies
    max_mhz: float | None  # mean hardware maximum clock
    limit_mhz: float | None  # mean scaling_max_freq (a cap set by software or firmware)
    interval_s: float | None  # the window the load was measured over
    stale: dict[str, float] = field(default_factory=dict)
    tracked: dict[int, TreeShare] = field(default_factory=dict)  # by pid: apps that run a monitored workload

    @property
    def demand(self) -> float | None:
        """Other tasks wanting a CPU, on average over the interval.

        Busy cores count the running ones exactly; the runnable count adds the waiting ones. A task
        waits only while every core is busy, and busy_cores / cores bounds that share of the time,
        so the excess of runnable over busy is weighted by it. Unweighted, a snapshot's stray task
        on an idle device, or a queue that emptied halfway through the interval, would read as
        contention."""
        busy, runnable = self.others_busy_cores, self.runnable_others
        if busy is None or runnable is None:
            return busy if runnable is None else runnable
        saturated = min(1.0, (self.busy_cores or 0.0) / self.cores) if self.cores else 1.0
        return busy + saturated * max(0.0, runnable - busy)

    @property
    def clock_ratio(self) -> float | None:
        """Current over maximum clock, 0..1 (low at idle: only meaningful under load or capping)."""
        if self.cur_mhz is None or not self.max_mhz:
            return None
        return self.cur_mhz / self.max_mhz


def parse_proc_stat(text: str) -> CpuTimes | None:
    """The aggregate `cpu` line and the number of `cpuN` lines; None for garbage."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("cpu "):
        return None
    try:
        values = [int(v) for v in lines[0].split()[1:]]
    except ValueError:
        return None
    if len(values) < 4 or min(values) < 0:
        return None
    values += [0] * (8 - len(values))
    user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
    cores = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    if cores == 0:
        return None
    running = None
    for line in lines[cores + 1:]:
        if line.startswith("procs_running "):
            value = line.split()[1]
            running = int(value) if value.isdigit() else None
            break
    return CpuTimes(busy=user + nice + system + irq + softirq, idle=idle + iowait, steal=steal, cores=cores,
                    running=running)


def parse_loadavg_running(text: str) -> int | None:
    """`0.52 0.58 0.59 3/467 12345` -> 3 (tasks running or waiting for a CPU now, the reader included)."""
    fields = text.split()
    if len(fields) < 4:
        return None
    running, slash, _ = fields[3].partition("/")
    return int(running) if slash and running.isdigit() else None


def parse_psi_some_avg10(text: str) -> float | None:
    """`some avg10=2.91 avg60=...` -> 2.91."""
    return parse_psi_some(text)[0]


def parse_psi_some(text: str) -> tuple[float | None, int | None]:
    """`some avg10=2.91 avg60=... total=12345` -> (2.91, 12345): the share of the last 10 s some task stalled, in
    %, and the stall time so far, in us; None for what is missing or garbage."""
    avg10 = total = None
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    number = parse_float(value)
                    avg10 = number if number is not None and 0.0 <= number <= 100.0 else None
                elif key == "total" and value.isdigit():
                    total = int(value)
    return avg10, total


def _parse_khz(text: str) -> float | None:
    value = parse_float(text)
    return value / 1000.0 if value is not None and 0 < value < 1e8 else None


class CpuProbe:
    CPUFREQ = "devices/system/cpu/cpufreq"

    def __init__(
        self,
        sys_files: KernelFiles,
        proc_files: KernelFiles,
        own: TreeCpu | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`own`: the agent's process tree, taken out of what others use (only on the real /proc)."""
        self.sys = sys_files
        self.proc = proc_files
        self.own = own
        self.clock = clock
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._prev: tuple[CpuTimes, float] | None = None  # times, wall
        self._snapshots_lock = threading.Lock()  # tick() runs on the event loop, sample() in a thread
        self._snapshots = (0, 0)  # sum and count of the run-queue snapshots since the last sample
        self._psi: tuple[int, float] | None = None  # PSI cpu `some` stall so far (us) and when read
        self._psi_moved = False  # PSI's stall time has grown since the probe started: it is live, not a fixture's
        self._stall: float | None = None  # the share of the last interval some task waited for a CPU (PSI)
        self._trees_lock = threading.Lock()  # track() and sample() each run in a thread of their own
        self._tracked: frozenset[int] = frozenset()
        self._trees: dict[int, TreeCpu] = {}

    def track(self, pids: frozenset[int]) -> None:
        """Measure these processes' trees too (apps that said they run a monitored workload): CpuState.tracked.
        A pid new to the set is read at once, so that the next sample measures it from now: an app says so before
        it starts its run (docs/mqtt.md), and its start is then its own, not others' load."""
        with self._trees_lock:
            self._tracked = pids
            for pid in pids - set(self._trees):
                self._tree_use(pid)

    def wants_ticks(self) -> bool:
        """Whether run-queue snapshots (tick) are worth taking before the next sample: only while tasks wait for
        a CPU. PSI's stall time says when none did (then the tasks that want a CPU are the busy ones, and an
        agent at rest sleeps from one sample to the next); without live PSI, always."""
        return not self._psi_moved or self._stall is None or self._stall >= TICK_STALL_SHARE

    def tick(self) -> None:
        """One run-queue snapshot (/proc/loadavg: a small file, cheap to read), taken between samples
        so that runnable_others is a mean over the sample's interval instead of one snapshot, which
        is noisy and would have to be smoothed over seconds; a failed read is skipped."""
        running = parse_loadavg_running(self.proc.read_raw("loadavg", 256) or "")
        if running is not None:
            with self._snapshots_lock:
                total, count = self._snapshots
                self._snapshots = (total + running, count + 1)

    def sample(self) -> CpuState:
        stale: dict[str, float] = {}
        times = self.proc.read("stat", parse_proc_stat, max_bytes=_STAT_BYTES).value
        now = self.clock()
        usage = self.own.read() if self.own is not None else None
        tracked = self._read_tracked()
        busy_cores = others = own_cores = steal = load = interval = None
        shares: dict[int, TreeShare] = {}
        own_waiting = 0.0  # the tree's threads waiting on a run queue, on average
        prev = self._prev
        if times is not None:
            self._prev = (times, now)
            if prev is not None:
                before, then = prev
                d_total = times.total - before.total
                d_busy, d_steal = times.busy - before.busy, times.steal - before.steal
                if d_total > 0 and d_busy >= 0 and d_steal >= 0 and times.cores == before.cores:
                    interval = now - then
                    busy_cores = times.cores * d_busy / d_total
                    steal = d_steal / d_total
                    own_cores = 0.0
                    capacity_s = d_total / self._ticks_per_s
                    if usage is not None:
                        own_cores = min(busy_cores, times.cores * usage.cpu_s / capacity_s)
                        if usage.wait_s is not None and interval > 0:
                            own_waiting = usage.wait_s / interval
                    others = max(0.0, busy_cores - own_cores)
                    load = others / times.cores
                    shares = {pid: TreeShare(round(min(busy_cores, times.cores * u.cpu_s / capacity_s), 4),
                                             round(u.wait_s / interval if u.wait_s is not None and interval > 0
                                                   else 0.0, 4))
                              for pid, u in tracked.items()}
        psi = self._pressure(now, stale)
        runnable = self._runnable(times, others, own_cores or 0.0, own_waiting, first=prev is None)
        cur, top, limit = self._clocks(stale)
        return CpuState(
            cores=times.cores if times is not None else None,
            load=_round(load),
            busy_cores=_round(busy_cores),
            others_busy_cores=_round(others),
            own_cores=_round(own_cores),
            runnable_others=_round(runnable),
            steal=_round(steal),
            psi_some_avg10=psi,
            cur_mhz=cur,
            max_mhz=top,
            limit_mhz=limit,
            interval_s=_round(interval),
            stale=stale,
            tracked=shares,
        )

    def _read_tracked(self) -> dict[int, TreeUsage]:
        """The tracked trees' use since their last reading; a pid read for the first time gives none yet."""
        with self._trees_lock:
            pids = self._tracked
            for gone in set(self._trees) - pids:
                del self._trees[gone]
            uses = {pid: self._tree_use(pid) for pid in pids}
        return {pid: use for pid, use in uses.items() if use is not None}

    def _tree_use(self, pid: int) -> TreeUsage | None:
        """One reading of the pid's tree (the first: none, its baseline). Not (or no longer) there: measured from
        when it is."""
        if not self.proc.exists(f"{pid}/stat"):
            self._trees.pop(pid, None)
            return None
        tree = self._trees.get(pid)
        if tree is None:
            tree = self._trees[pid] = TreeCpu(self.proc, ProcessTree(self.proc, pid))
        return tree.read()

    def _pressure(self, now: float, stale: dict[str, float]) -> float | None:
        """PSI cpu's `some avg10`; keeps the share of the interval since the last reading that some task waited
        for a CPU (`_stall`: None without two fresh readings, as a last good total would read as no stall)."""
        reading = self.proc.read("pressure/cpu", parse_psi_some)
        avg10, total = take(reading, "cpu.psi_some_avg10", stale) or (None, None)
        prev, self._psi = self._psi, (None if reading.stale or total is None else (total, now))
        self._stall = None
        if prev is not None and total is not None and self._psi is not None and now > prev[1] and total >= prev[0]:
            self._psi_moved = self._psi_moved or total > prev[0]
            self._stall = min(1.0, (total - prev[0]) / 1e6 / (now - prev[1]))
        return avg10

    def _runnable(self, times: CpuTimes | None, others: float | None, own_cores: float, own_waiting: float,
                  first: bool) -> float | None:
        """Others' tasks that want a CPU, on average over the interval: the mean of the snapshots since the last
        sample and this one, less the reader in each and the agent's own threads running or waiting. Where none
        were taken because no task waited (wants_ticks), the busy ones and what PSI saw waiting. None at the
        first sample: without an interval the agent's own threads (its start-up, above all) cannot be taken
        out."""
        with self._snapshots_lock:
            total, count = self._snapshots
            self._snapshots = (0, 0)
        if first:
            return None
        if count == 0 and others is not None and not self.wants_ticks():
            return others + max(0.0, (self._stall or 0.0) - own_waiting)
        if times is not None and times.running is not None:
            total, count = total + times.running, count + 1
        if count == 0:
            return None
        return max(0.0, total / count - 1.0 - own_cores - own_waiting)

    def _clocks(self, stale: dict[str, float]) -> tuple[float | None, float | None, float | None]:
        curs, maxes, limits = [], [], []
        for policy in self.sys.listdir(self.CPUFREQ, "policy", STATIC_TTL_S):
            base = f"{self.CPUFREQ}/{policy}"
            top = self.sys.read(f"{base}/cpuinfo_max_freq", _parse_khz, STATIC_TTL_S).value
            cur = take(self.sys.read(f"{base}/scaling_cur_freq", _parse_khz), f"cpu.cur_mhz.{policy}", stale)
            # every sample: the cpufreq cooling device caps the clock here, as a thermal event comes
            limit = self.sys.read(f"{base}/scaling_max_freq", _parse_khz).value
            if top is not None:
                maxes.append(top)
                if cur is not None:
                    curs.append(min(cur, top * 1.5))  # boost clocks can exceed the nominal max a little
                if limit is not None:
                    limits.append(min(limit, top))

        def mean(values: list[float]) -> float | None:
            return round(sum(values) / len(values), 1) if values else None

        return mean(curs), mean(maxes), mean(limits)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def last_level_cache_bytes(sysfs_root: str = "/sys") -> int:
    """The largest CPU cache (0 when sysfs does not say): weights beyond it stream from memory."""
    best = 0
    base = os.path.join(sysfs_root, "devices/system/cpu/cpu0/cache")
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best
