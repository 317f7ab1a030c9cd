"""Monitors on disk, so that they and their `seq` survive any restart, SIGKILL included.

Layout in the state dir:

- `monitors/<id>.json`: one file per monitor (id, its workloads: each one's
  requirement, device and kernel plan; its first seq; whether its app runs it
  here now), written when the monitor is created and when its app says it
  starts or stops running it;
- `monitor-seq.json`: the last seq handed out and every monitor's present
  (seq, meets) and, for a group, its workloads' answers, rewritten on each tick
  that changes something.

Every write is atomic (temporary file, fsync, rename, fsync of the folder), and
the agent writes before it answers a request or publishes an event, so nothing
acknowledged is lost. A file that cannot be read is set aside whole, as
`corrupt/<name>.corrupt-<timestamp>` in the state dir, with one log line (its
monitor's retained state is cleared on the broker); the agent carries on.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitors.devices import DEVICES
from monitors.errors import BadInput
from monitors.pricing.generation import plan_from_json
from monitors.pricing.tiers import TIER_NAMES
from monitors.requirements import Requirement
from monitors.speed.present import Speed
from monitors.table import Member
from monitors.tick import present_ms

log = logging.getLogger(__name__)

FORMAT = 2  # 1: one workload, a tier (still read)
SEQ_FORMAT = 1
SEQ_FILE = "monitor-seq.json"
MONITOR_DIR = "monitors"
CORRUPT_DIR = "corrupt"
# When the seq file itself is lost, seq jumps this far ahead of anything still
# known, so that it keeps never going back for subscribers.
SEQ_LOSS_JUMP = 1 << 20
# A name that becomes one topic level (monitor ids, owners, workload names): matched whole (`fullmatch`: a `$`
# would let a final newline through, and Mosquitto drops a connection that publishes a control character).
MONITOR_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Running:
    """An app's word that it runs a monitor's workloads here now, at this rate, in this process."""

    running: bool
    rate_hz: float | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rateHz": self.rate_hz, "pid": self.pid}

    @classmethod
    def from_json(cls, data: Any) -> Running | None:
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("running must be an object")
        rate, pid = data.get("rateHz"), data.get("pid")
        if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate <= 10_000):
            raise ValueError("bad running rate")
        if pid is not None and not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 1):
            raise ValueError("bad running pid")
        return cls(True, None if rate is None else float(rate), pid)


@dataclass
class StoredWorkload:
    name: str  # "" for a monitor of one workload
    requirement: Requirement
    device: str  # where it is evaluated: the faster device when it was created
    plans: dict[str, str]  # device -> the estimator's Plan.to_json()
    base_ms: dict[str, float]  # device -> calibrated quiet latency (local only, never published)
    memory_bytes: int
    view: float = 1.0  # its owner's view at creation (monitors/privacy.py: shown / live latency), kept for its life
    stream_ms: float = 0.0  # what its CPU latency gains per unit of memory slowdown (local only, never published)
    gemm_ms: float = 0.0  # ... and per unit of gemm slowdown (local only, never published)

    @functools.cached_property
    def written_mb(self) -> float:
        """Activations its CPU plan writes per run (an inference, or a whole generation: the handoff extra's
        bytes), read off the stored plan; 0 for a plan this version cannot read (then it goes without the
        extra)."""
        try:
            return plan_from_json(self.plans["cpu"]).written_mb
        except (KeyError, ValueError, TypeError):
            return 0.0

    def present_ms(self, speed: Speed) -> float:
        """Its latency on its device at `speed` (inf where it does not fit in memory now)."""
        return present_ms(self.member(), speed)

    def member(self) -> Member:
        """As the monitor table prices it: the deadline as its owner's view puts it (latency * view < deadline)."""
        return Member(self.base_ms[self.device], self.device, self.requirement.deadline_ms / self.view,
                      self.requirement.sustained_hz, self.memory_bytes, self.written_mb, self.stream_ms,
                      self.gemm_ms)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "requirement": self.requirement.to_json(), "device": self.device,
                "plans": self.plans, "baseMs": self.base_ms, "memoryBytes": self.memory_bytes, "view": self.view,
                "streamMs": self.stream_ms, "gemmMs": self.gemm_ms}

    @classmethod
    def from_json(cls, data: Any) -> StoredWorkload:
        if not isinstance(data, dict):
            raise ValueError("a workload must be an object")
        try:
            requirement = Requirement.parse(dict(data["requirement"]))
        except BadInput as exc:
            raise ValueError(str(exc)) from None
        w = cls(str(data["name"]), requirement, data["device"], dict(data["plans"]),
                {str(k): float(v) for k, v in dict(data["baseMs"]).items()}, int(data["memoryBytes"]),
                float(data.get("view", 1.0)), float(data.get("streamMs", 0.0)), float(data.get("gemmMs", 0.0)))
        if w.name and not MONITOR_ID_RE.fullmatch(w.name):
            raise ValueError(f"bad workload name {w.name!r}")
        if w.device not in DEVICES or w.device not in w.base_ms:
            raise ValueError("bad device")
        if not 0.5 <= w.view <= 2.0:
            raise ValueError(f"bad view {w.view!r}")
        if not (0.0 <= w.stream_ms < math.inf):
            raise ValueError(f"bad stream time {w.stream_ms!r}")
        if not (0.0 <= w.gemm_ms < math.inf):
            raise ValueError(f"bad gemm time {w.gemm_ms!r}")
        return w


@dataclass
class StoredMonitor:
    monitor: str
    workloads: list[StoredWorkload]
    # Its answer as its files hold it (the monitor file's, or the seq file's where newer), loaded into the monitor
    # table, which holds the present one (agent/registry.py writes that into the file when it saves it again).
    seq: int
    meets: bool
    running: Running | None = None  # its app runs it here now
    member_meets: list[bool] | None = None  # a group's workloads' answers (None: each as `meets`)
    created_seq: int = -1  # the seq it was created with (set by MonitorStore.load; not stored)
    owner: str = ""  # the client that created it ("": the shared, anonymous one; docs/mqtt.md "Owners")
    lease_s: float | None = None  # deleted once this long passes without a renewal (None: lives until deleted)

    @property
    def group(self) -> bool:
        return len(self.workloads) > 1 or any(w.name for w in self.workloads)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "monitor": self.monitor, "workloads": [w.to_json() for w in self.workloads],
                "seq": self.seq, "meets": self.meets,
                "running": None if self.running is None else self.running.to_json(), "owner": self.owner,
                "leaseS": self.lease_s}

    @classmethod
    def from_json(cls, data: Any) -> StoredMonitor:
        if not isinstance(data, dict) or data.get("format") not in (1, FORMAT):
            raise ValueError("not a monitor file of this format")
        if data["format"] == 1:
            tier = data["requiredTier"]
            if tier not in TIER_NAMES:
                raise ValueError("bad tier")
            workloads = [StoredWorkload.from_json({"name": "", "requirement": {"requiredTier": tier},
                                                   "device": data["device"], "plans": data["plans"],
                                                   "baseMs": data["baseMs"], "memoryBytes": data["memoryBytes"]})]
            running = None
        else:
            if not isinstance(data["workloads"], list) or not data["workloads"]:
                raise ValueError("a monitor has workloads")
            workloads = [StoredWorkload.from_json(w) for w in data["workloads"]]
            running = Running.from_json(data.get("running"))
        lease = data.get("leaseS")
        if lease is not None and not (isinstance(lease, (int, float)) and 0 < lease < 1e9):
            raise ValueError(f"bad lease {lease!r}")
        m = cls(data["monitor"], workloads, data["seq"], data["meets"], running, owner=data.get("owner", ""),
                lease_s=None if lease is None else float(lease))
        if not (isinstance(m.monitor, str) and MONITOR_ID_RE.fullmatch(m.monitor)):
            raise ValueError(f"bad monitor id {m.monitor!r}")
        if not (m.owner == "" or isinstance(m.owner, str) and MONITOR_ID_RE.fullmatch(m.owner)):
            raise ValueError(f"bad owner {m.owner!r}")
        if not isinstance(m.seq, int) or isinstance(m.seq, bool) or m.seq < 0 or not isinstance(m.meets, bool):
            raise ValueError("bad seq or meets")
        return m


def _owner_of(doc: Any) -> str:
    """The owner a monitor file that cannot be used still names, if it names a valid one; else ""."""
    owner = doc.get("owner") if isinstance(doc, dict) else None
    return owner if isinstance(owner, str) and MONITOR_ID_RE.fullmatch(owner) else ""


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind (a full disk, an I/O error)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside(path: Path, why: str, folder: Path | None = None) -> Path | None:
    """Move a file that cannot be read (into `folder`, else beside it) so that it is kept for a human and never
    re-read. None when even that fails (a read-only disk): it is skipped, and said so."""
    target = (folder or path.parent) / \
        f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**6:06d}"
    try:
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(path, target)
    except OSError as exc:
        log.error("state file %s cannot be used (%s) nor set aside (%s): skipped", path, why, exc.strerror or exc)
        return None
    log.error("state file %s cannot be used (%s); set aside as %s", path, why,
              target.name if folder is None else f"{folder.name}/{target.name}")
    return target


class MonitorStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.folder = self.state_dir / MONITOR_DIR
        self.seq_path = self.state_dir / SEQ_FILE
        self.corrupt_folder = self.state_dir / CORRUPT_DIR
        # (monitor, owner) of each file that could not be used at the last load (the owner as far as the file
        # still tells it, else ""): their retained states are cleared where the broker holds them
        self.set_aside: list[tuple[str, str]] = []

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, monitor: str) -> Path:
        return self.folder / f"{monitor}.json"

    def save_monitor(self, m: StoredMonitor) -> None:
        atomic_write(self._path(m.monitor), json.dumps(m.to_json(), separators=(",", ":")).encode())

    def delete_monitor(self, monitor: str) -> None:
        try:
            self._path(monitor).unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.folder)

    def save_seq(self, last_seq: int, states: dict[str, tuple[int, bool]],
                 members: dict[str, list[bool]] | None = None) -> None:
        """The last seq, every monitor's (seq, meets), and a group's workloads' answers."""
        members = members or {}
        doc = {"format": SEQ_FORMAT, "lastSeq": last_seq,
               "monitors": {k: [s, m, *([members[k]] if k in members else [])] for k, (s, m) in states.items()}}
        atomic_write(self.seq_path, json.dumps(doc, separators=(",", ":")).encode())

    def load(self) -> tuple[list[StoredMonitor], int]:
        """Every readable monitor with its latest (seq, meets), and the last seq handed out."""
        self.prepare()
        monitors: list[StoredMonitor] = []
        self.set_aside = []
        for path in sorted(self.folder.glob("*.json")):
            doc: Any = None
            try:
                doc = json.loads(path.read_bytes())
                m = StoredMonitor.from_json(doc)
                if path.name != f"{m.monitor}.json":
                    raise ValueError(f"holds monitor {m.monitor!r}")
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                set_aside(path, str(exc) or type(exc).__name__, self.corrupt_folder)
                if MONITOR_ID_RE.fullmatch(path.stem):  # (a name the broker would refuse has no state there)
                    self.set_aside.append((path.stem, _owner_of(doc)))
                continue
            monitors.append(m)
        for leftover in [*self.folder.glob(".*.tmp-*"), *self.state_dir.glob(".*.tmp-*")]:
            try:
                leftover.unlink(missing_ok=True)  # a write cut short by a crash
            except OSError as exc:
                log.warning("cannot remove %s: %s", leftover, exc.strerror or exc)
        last_seq, states, lost = 0, {}, False
        member_meets: dict[str, list[bool]] = {}
        if self.seq_path.exists():
            try:
                doc = json.loads(self.seq_path.read_bytes())
                if not isinstance(doc, dict) or doc.get("format") != SEQ_FORMAT:
                    raise ValueError("not a seq file of this format")
                last_seq = int(doc["lastSeq"])
                states = {k: (int(v[0]), bool(v[1])) for k, v in dict(doc["monitors"]).items()}
                member_meets = {k: [bool(x) for x in v[2]] for k, v in dict(doc["monitors"]).items() if len(v) > 2}
            except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
                set_aside(self.seq_path, str(exc) or type(exc).__name__, self.corrupt_folder)
                last_seq, states, lost = 0, {}, True
        for m in monitors:
            m.created_seq = m.seq
            seq, meets = states.get(m.monitor, (m.seq, m.meets))
            if seq >= m.seq:
                m.seq, m.meets = seq, meets
                answers = member_meets.get(m.monitor)
                if answers is not None and len(answers) == len(m.workloads):
                    m.member_meets = answers
            last_seq = max(last_seq, m.seq)
        if lost:
            last_seq += SEQ_LOSS_JUMP
            for m in monitors:
                m.seq += SEQ_LOSS_JUMP
                m.created_seq = m.seq
        return monitors, last_seq
