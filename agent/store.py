"""Monitors on disk, so that they and their `seq` survive any restart, SIGKILL included.

Layout in the state dir:

- `monitors/<id>.json`: one file per monitor (id, required tier, device, kernel
  plan, first seq), written once when the monitor is created;
- `monitor-seq.json`: the last seq handed out and every monitor's present
  (seq, meets), rewritten on each tick that changes something.

Every write is atomic (temporary file, fsync, rename, fsync of the folder), and
the agent writes before it answers a request or publishes an event, so nothing
acknowledged is lost. A file that cannot be read is set aside as
`<name>.corrupt-<timestamp>` with one log line; the agent carries on.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitors.kernels import Plan
from monitors.monitor import DEVICES
from monitors.tiers import TIER_NAMES

log = logging.getLogger(__name__)

FORMAT = 1
SEQ_FILE = "monitor-seq.json"
MONITOR_DIR = "monitors"
# When the seq file itself is lost, seq jumps this far ahead of anything still
# known, so that it keeps never going back for subscribers.
SEQ_LOSS_JUMP = 1 << 20
MONITOR_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class StoredMonitor:
    monitor: str
    required_tier: str
    device: str                # where it is evaluated: the faster device when it was created
    plans: dict[str, str]      # device -> the estimator's Plan.to_json()
    base_ms: dict[str, float]  # device -> calibrated quiet latency (local only, never published)
    memory_bytes: int
    seq: int
    meets: bool
    created_seq: int = -1      # the seq it was created with (set by MonitorStore.load; not stored)

    @functools.cached_property
    def written_mb(self) -> float:
        """Activations its CPU plan writes per inference (the handoff extra's bytes), read off the stored plan;
        0 for a plan this version cannot read (the monitor then goes without the extra)."""
        try:
            return Plan.from_json(self.plans["cpu"]).written_mb
        except (KeyError, ValueError, TypeError):
            return 0.0

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "monitor": self.monitor, "requiredTier": self.required_tier,
                "device": self.device, "plans": self.plans, "baseMs": self.base_ms,
                "memoryBytes": self.memory_bytes, "seq": self.seq, "meets": self.meets}

    @classmethod
    def from_json(cls, data: Any) -> "StoredMonitor":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a monitor file of this format")
        m = cls(data["monitor"], data["requiredTier"], data["device"], dict(data["plans"]),
                {str(k): float(v) for k, v in dict(data["baseMs"]).items()}, int(data["memoryBytes"]),
                data["seq"], data["meets"])
        if not (isinstance(m.monitor, str) and MONITOR_ID_RE.match(m.monitor)):
            raise ValueError(f"bad monitor id {m.monitor!r}")
        if m.required_tier not in TIER_NAMES or m.device not in DEVICES or m.device not in m.base_ms:
            raise ValueError("bad tier or device")
        if not isinstance(m.seq, int) or isinstance(m.seq, bool) or m.seq < 0 or not isinstance(m.meets, bool):
            raise ValueError("bad seq or meets")
        return m


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside(path: Path, why: str) -> Path:
    """Rename a file that cannot be read so that it is kept for a human, never re-read."""
    target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**6:06d}")
    os.replace(path, target)
    log.error("state file %s cannot be used (%s); set aside as %s", path, why, target.name)
    return target


class MonitorStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.folder = self.state_dir / MONITOR_DIR
        self.seq_path = self.state_dir / SEQ_FILE

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

    def save_seq(self, last_seq: int, states: dict[str, tuple[int, bool]]) -> None:
        doc = {"format": FORMAT, "lastSeq": last_seq, "monitors": {k: [s, m] for k, (s, m) in states.items()}}
        atomic_write(self.seq_path, json.dumps(doc, separators=(",", ":")).encode())

    def load(self) -> tuple[list[StoredMonitor], int]:
        """Every readable monitor with its latest (seq, meets), and the last seq handed out."""
        self.prepare()
        monitors: list[StoredMonitor] = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                m = StoredMonitor.from_json(json.loads(path.read_bytes()))
                if path.name != f"{m.monitor}.json":
                    raise ValueError(f"holds monitor {m.monitor!r}")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                set_aside(path, str(exc) or type(exc).__name__)
                continue
            monitors.append(m)
        for leftover in [*self.folder.glob(".*.tmp-*"), *self.state_dir.glob(".*.tmp-*")]:
            leftover.unlink(missing_ok=True)  # a write cut short by a crash
        last_seq, states, lost = 0, {}, False
        if self.seq_path.exists():
            try:
                doc = json.loads(self.seq_path.read_bytes())
                if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                    raise ValueError("not a seq file of this format")
                last_seq = int(doc["lastSeq"])
                states = {k: (int(v[0]), bool(v[1])) for k, v in dict(doc["monitors"]).items()}
            except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                set_aside(self.seq_path, str(exc) or type(exc).__name__)
                last_seq, states, lost = 0, {}, True
        for m in monitors:
            m.created_seq = m.seq
            seq, meets = states.get(m.monitor, (m.seq, m.meets))
            if seq >= m.seq:
                m.seq, m.meets = seq, meets
            last_seq = max(last_seq, m.seq)
        if lost:
            last_seq += SEQ_LOSS_JUMP
            for m in monitors:
                m.seq += SEQ_LOSS_JUMP
                m.created_seq = m.seq
        return monitors, last_seq
