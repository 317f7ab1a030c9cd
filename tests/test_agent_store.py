"""Persistence: atomic writes, SIGKILL at any moment, corrupt files set aside, seq never back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.store import SEQ_LOSS_JUMP, MonitorStore, StoredMonitor, atomic_write

REPO = Path(__file__).resolve().parent.parent


def monitor(name: str, seq: int = 1, meets: bool = True) -> StoredMonitor:
    return StoredMonitor(name, "good", "cpu", {"cpu": '{"kernels": []}'}, {"cpu": 12.5}, 1000, seq, meets)


def test_monitors_and_seq_round_trip(tmp_path: Path):
    store = MonitorStore(tmp_path)
    store.prepare()
    store.save_monitor(monitor("a", 1))
    store.save_monitor(monitor("b", 2))
    store.save_seq(9, {"a": (7, False), "b": (2, True)})
    loaded, last = store.load()
    assert last == 9
    assert {(m.monitor, m.seq, m.meets) for m in loaded} == {("a", 7, False), ("b", 2, True)}
    store.delete_monitor("a")
    store.delete_monitor("a")  # deleting twice is harmless
    loaded, _ = store.load()
    assert [m.monitor for m in loaded] == ["b"]


def test_a_monitor_file_newer_than_the_seq_file_wins(tmp_path: Path):
    store = MonitorStore(tmp_path)
    store.prepare()
    store.save_seq(3, {"a": (3, True)})
    store.save_monitor(monitor("a", 5, False))  # re-created after the last seq write, then a crash
    loaded, last = store.load()
    assert (loaded[0].seq, loaded[0].meets, last) == (5, False, 5)


def test_corrupt_files_are_set_aside_once_with_one_log_line(tmp_path: Path, caplog):
    store = MonitorStore(tmp_path)
    store.prepare()
    store.save_monitor(monitor("ok"))
    (store.folder / "trunc.json").write_text('{"format": 1, "monit')
    (store.folder / "wrong.json").write_text(json.dumps(monitor("other").to_json()))  # name mismatch
    (store.folder / "tier.json").write_text(json.dumps({**monitor("tier").to_json(), "requiredTier": "great"}))
    store.save_seq(4, {"ok": (4, True)})
    store.seq_path.write_text("[]")
    with caplog.at_level("ERROR"):
        loaded, last = store.load()
    assert [m.monitor for m in loaded] == ["ok"]
    assert len([r for r in caplog.records if "set aside" in r.getMessage()]) == 4
    assert len(list(store.folder.glob("*.corrupt-*"))) == 3 and len(list(tmp_path.glob("*.corrupt-*"))) == 1
    # seq file lost: seq jumps ahead so it still never goes back
    assert loaded[0].seq == 1 + SEQ_LOSS_JUMP and last >= loaded[0].seq
    caplog.clear()
    loaded, _ = store.load()  # nothing is set aside twice
    assert [m.monitor for m in loaded] == ["ok"] and not caplog.records


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path):
    target = tmp_path / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


WRITER = """
import sys
from pathlib import Path
from agent.store import MonitorStore, StoredMonitor
store = MonitorStore(Path(sys.argv[1]))
store.prepare()
states = {f"m{i}": (0, True) for i in range(200)}
seq = 0
while True:
    seq += 1
    name = f"m{seq % 200}"
    store.save_monitor(StoredMonitor(name, "good", "cpu", {"cpu": "{}"}, {"cpu": 1.0}, 0, seq, seq % 2 == 0))
    states[name] = (seq, seq % 2 == 0)
    store.save_seq(seq, states)
    print(seq, flush=True)  # acknowledged: on disk
"""


def test_sigkill_at_any_moment_loses_nothing_acknowledged(tmp_path: Path):
    for round_ in range(6):
        folder = tmp_path / f"r{round_}"
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], cwd=REPO, stdout=subprocess.PIPE,
                                text=True)
        first = proc.stdout.readline()  # writing has begun (start-up time varies with the machine's load)
        time.sleep(0.05 + 0.09 * round_)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acknowledged = [int(x) for x in (first + out).split()]
        assert acknowledged, "the writer wrote nothing before it was killed"
        loaded, last = MonitorStore(folder).load()
        assert not list(folder.rglob("*.corrupt-*"))
        assert last >= acknowledged[-1]
        by_name = {m.monitor: m for m in loaded}
        name = f"m{acknowledged[-1] % 200}"
        assert by_name[name].seq >= acknowledged[-1]
