"""Persistence: atomic writes, SIGKILL at any moment, corrupt files set aside, seq never back."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.analysis import Analysis
from agent.registry import MonitorRegistry
from agent.store import SEQ_LOSS_JUMP, MonitorStore, Running, StoredMonitor, StoredWorkload, atomic_write
from agent.topics import Topics
from monitors.requirements import Requirement
from monitors.speed.present import PresentSpeed, Speed
from monitors.table import MonitorRules

REPO = Path(__file__).resolve().parent.parent

AT_REST_PRESENT = PresentSpeed.at(Speed())


GOOD = Requirement("good")


def workload(name: str = "", requirement: Requirement = GOOD) -> StoredWorkload:
    return StoredWorkload(name, requirement, "cpu", {"cpu": '{"kernels": []}'}, {"cpu": 12.5}, 1000)


def monitor(name: str, seq: int = 1, meets: bool = True) -> StoredMonitor:
    return StoredMonitor(name, [workload()], seq, meets)


FORMAT_1 = {"format": 1, "monitor": "old", "requiredTier": "fair", "device": "cpu", "plans": {"cpu": "{}"},
            "baseMs": {"cpu": 120.0}, "memoryBytes": 10, "seq": 3, "meets": True}


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


def test_a_workload_s_stream_and_gemm_times_round_trip_and_older_files_have_none():
    streaming = StoredWorkload("", GOOD, "cpu", {"cpu": '{"kernels": []}'}, {"cpu": 40.0}, 10, stream_ms=31.5,
                               gemm_ms=6.0)
    again = StoredWorkload.from_json(json.loads(json.dumps(streaming.to_json())))
    assert again.stream_ms == 31.5 and again.member().stream_ms == 31.5
    assert again.gemm_ms == 6.0 and again.member().gemm_ms == 6.0
    older = streaming.to_json()
    del older["streamMs"], older["gemmMs"]
    assert StoredWorkload.from_json(older).stream_ms == StoredWorkload.from_json(older).gemm_ms == 0.0
    slow_memory = Speed(cpu=1.0, gpu=None, memory=2.0)
    assert again.present_ms(slow_memory) == pytest.approx(40.0 + 31.5)
    assert again.present_ms(Speed(cpu=1.0, gpu=None, gemm=1.5)) == pytest.approx(40.0 + 3.0)
    with pytest.raises(ValueError, match="stream"):
        StoredWorkload.from_json(streaming.to_json() | {"streamMs": -1.0})
    with pytest.raises(ValueError, match="gemm"):
        StoredWorkload.from_json(streaming.to_json() | {"gemmMs": math.inf})


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
    (store.folder / "tier.json").write_text(json.dumps({**FORMAT_1, "monitor": "tier", "requiredTier": "great"}))
    store.save_seq(4, {"ok": (4, True)})
    store.seq_path.write_text("[]")
    with caplog.at_level("ERROR"):
        loaded, last = store.load()
    assert [m.monitor for m in loaded] == ["ok"]
    assert len([r for r in caplog.records if "set aside" in r.getMessage()]) == 4
    assert len(list((tmp_path / "corrupt").glob("*.json.corrupt-*"))) == 4  # 3 monitors and the seq file
    assert len(list((tmp_path / "corrupt").glob("monitor-seq.json.corrupt-*"))) == 1
    assert sorted(m for m, _ in store.set_aside) == ["tier", "trunc", "wrong"]
    # seq file lost: seq jumps ahead so it still never goes back
    assert loaded[0].seq == 1 + SEQ_LOSS_JUMP and last >= loaded[0].seq
    caplog.clear()
    loaded, _ = store.load()  # nothing is set aside twice
    assert [m.monitor for m in loaded] == ["ok"] and not caplog.records


def test_a_monitor_of_the_first_format_loads_as_one_workload_of_its_tier(tmp_path: Path):
    store = MonitorStore(tmp_path)
    store.prepare()
    (store.folder / "old.json").write_text(json.dumps(FORMAT_1))
    (m,), _ = store.load()
    assert (m.monitor, m.seq, m.meets, m.group, m.running) == ("old", 3, True, False, None)
    (w,) = m.workloads
    assert (w.requirement, w.base_ms, w.member().deadline_ms) == (Requirement("fair"), {"cpu": 120.0}, 1000.0)


def test_a_group_its_answers_and_its_running_app_round_trip(tmp_path: Path):
    store = MonitorStore(tmp_path)
    store.prepare()
    group = StoredMonitor("call", [workload("blur", Requirement(rate_hz=30.0)),
                                   workload("noise", Requirement(rate_hz=100.0, deadline=5.0))], 4, False,
                          running=Running(True, 30.0, 4242))
    store.save_monitor(group)
    store.save_seq(6, {"call": (6, False)}, {"call": [True, False]})
    (m,), last = store.load()
    assert (last, m.seq, m.meets, m.member_meets, m.running) == (6, 6, False, [True, False], Running(True, 30.0, 4242))
    assert [w.requirement for w in m.workloads] == [Requirement(rate_hz=30.0), Requirement(rate_hz=100.0, deadline=5.0)]
    assert [w.member().deadline_ms for w in m.workloads] == [1000.0 / 30.0, 5.0]


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path):
    target = tmp_path / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


WRITER = """
import sys
from pathlib import Path
from agent.store import MonitorStore, StoredMonitor, StoredWorkload
from monitors.requirements import Requirement
store = MonitorStore(Path(sys.argv[1]))
store.prepare()
states = {f"m{i}": (0, True) for i in range(200)}
seq = 0
while True:
    seq += 1
    name = f"m{seq % 200}"
    w = StoredWorkload("", Requirement("good"), "cpu", {"cpu": "{}"}, {"cpu": 1.0}, 0)
    store.save_monitor(StoredMonitor(name, [w], seq, seq % 2 == 0))
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


def test_a_monitors_owner_and_its_owners_view_survive_a_restart(tmp_path: Path):
    """The owner's view fixed at creation (monitors/privacy.py) moves the deadline the table compares with, for the
    monitor's whole life: it is stored with it, as is its owner; an absurd view is a corrupt file."""
    store = MonitorStore(tmp_path)
    store.prepare()
    viewed = StoredWorkload("", Requirement("excellent"), "cpu", {"cpu": "{}"}, {"cpu": 12.5}, 1000, view=1.1)
    store.save_monitor(StoredMonitor("mine", [viewed], 1, True, owner="alice"))
    store.save_monitor(monitor("shared"))
    (loaded_mine, loaded_shared), _ = store.load()
    assert (loaded_mine.owner, loaded_shared.owner) == ("alice", "")
    assert loaded_mine.workloads[0].view == 1.1 and loaded_shared.workloads[0].view == 1.0
    assert loaded_mine.workloads[0].member().deadline_ms == 16.0 / 1.1
    assert loaded_shared.workloads[0].member().deadline_ms == Requirement("good").deadline_ms
    doc = json.loads((tmp_path / "monitors" / "mine.json").read_text())
    doc["workloads"][0]["view"] = 50.0
    (tmp_path / "monitors" / "mine.json").write_text(json.dumps(doc))
    loaded, _ = store.load()
    assert [m.monitor for m in loaded] == ["shared"]


def test_a_change_the_disk_refuses_is_held_and_sent_in_order_once_saving_works_fault_made_by_a_dir_for_the_seq_file(
        tmp_path: Path):
    """Tests run as root (chmod cannot stop them): a directory where monitor-seq.json goes makes every save
    fail with EISDIR, a real OSError from the kernel."""



    sent: list = []
    told: list = []

    async def scenario() -> None:
        reg = MonitorRegistry(tmp_path, MonitorRules(dwell_s=0.0), 10, Topics("daop/d/"), lambda *m: sent.extend(m),
                              on_storage=told.append)
        reg.load()
        analysis = Analysis({"cpu": "{}"}, {"cpu": 5.0}, 0)
        meets, _, _ = await reg.create("m", [("", Requirement.parse({"requiredTier": "good"}), analysis)],
                                       Speed(), False)
        assert meets is True and [m.topic for m in sent] == ["daop/d/monitors/m/state"]
        await reg.create("k", [("", Requirement.parse({"requiredTier": "good"}), analysis)], Speed(), False)
        seq_file = tmp_path / "monitor-seq.json"
        seq_file.unlink()
        seq_file.mkdir()
        sent.clear()
        assert await reg.evaluate(10.0, AT_REST_PRESENT, True) == 2  # the policy vetoes: the monitors turn false
        assert sent == [] and reg.storage_error and told == [reg.storage_error]  # held, and said
        await reg.delete("k")  # its file can go: deleted at once, its held messages with it
        assert [(m.topic, m.payload) for m in sent] == [("daop/d/monitors/k/state", b"")]
        sent.clear()
        with pytest.raises(Exception) as refused:
            await reg.create("n", [("", Requirement.parse({"requiredTier": "good"}), analysis)], Speed(), False)
        assert getattr(refused.value, "code", None) == "storage" and "n" not in reg.book.records
        assert await reg.evaluate(11.0, AT_REST_PRESENT, True) == 0 and sent == []  # retried, still refused
        seq_file.rmdir()
        assert await reg.evaluate(12.0, AT_REST_PRESENT, True) == 0  # retried: saved, then the held messages go
        assert [m.topic for m in sent] == ["daop/d/monitors/m/events", "daop/d/monitors/m/state"]
        assert json.loads(sent[0].payload)["meetsRequirement"] is False
        assert reg.storage_error is None and told[-1] is None
        assert json.loads(seq_file.read_bytes())["monitors"]["m"][1] is False

    asyncio.run(scenario())
