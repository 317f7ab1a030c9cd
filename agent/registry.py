"""The device's monitors on disk and on the wire: their files, and the messages their changes send.

What the agent holds of them in memory, and every decision about them, is the book's (agent/book.py, and the
tick in monitors/tick.py). The registry loads the book from disk, and changes it only under one lock, in seq
order: a change is on disk before its answer or its event goes out (`send`), so nothing acknowledged is lost,
even across a SIGKILL. What apps taught their monitors is kept in `warm/<monitor>.json`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from agent.analysis import Analysis, EngineError
from agent.book import MonitorBook
from agent.store import MonitorStore, Running, StoredMonitor, StoredWorkload, atomic_write, set_aside
from agent.topics import Outgoing, Topics
from monitors.errors import BadInput
from monitors.requirements import Requirement
from monitors.speed.present import PresentSpeed, Speed
from monitors.table import Answer, MonitorRules, initial_answer
from monitors.warm import Learnt
from probes.liveness import process_runs

log = logging.getLogger("daop-agent")

REBASE_CHUNK = 500  # stored plans priced again per call to the workers
WARM_DIR = "warm"
WARM_SAVE_S = 10.0  # learnt corrections are written at most this often (and at a clean stop)
MAX_HELD = 100_000  # messages held while the disk refuses the seq file (oldest dropped beyond, logged)


async def _nothing(pids: frozenset[int]) -> None:
    """No one to tell."""


def _unheard() -> None:
    """No one to tell."""


class MonitorRegistry:
    def __init__(self, state_dir: Path, rules: MonitorRules, max_monitors: int, topics: Topics,
                 send: Callable[..., None], procfs_root: str = "/proc", max_per_owner: int | None = None, *,
                 on_storage: Callable[[str | None], None] = lambda why: None,
                 on_running: Callable[[frozenset[int]], Awaitable[None]] = _nothing,
                 on_change: Callable[[], None] = _unheard) -> None:
        """`on_storage`: told why saving fails, or None, when that changes; `on_running`: told the pids of the
        apps that run monitored workloads, when they change; `on_change`: told when what prices a monitor
        changes outside a tick (a monitor added, replaced or removed, re-priced, taught, run by its app)."""
        self.store = MonitorStore(state_dir)
        self.book = MonitorBook(rules, max_monitors, max_per_owner)
        self.topics = topics
        self.procfs_root = procfs_root
        self._send = send
        self._mutate = asyncio.Lock()  # book + disk + outbox change together, in seq order
        self._warm_dir = Path(state_dir) / WARM_DIR
        self._warm_dirty: set[str] = set()
        self._warm_saved_at = -math.inf
        # Storage faults are a state, not a crash: what could not be saved is retried on every tick, and the
        # messages that wait on it (a change is on disk before its event goes out) are held, in order.
        self._held: list[Outgoing] = []
        # Each monitor's answer as the seq file last took it: what it retains and lists while saving fails (seq
        # never goes back for anyone, a restart included). The present answers are the table's.
        self._on_disk: dict[str, Answer] = {}
        self.storage_error: str | None = None  # why the last save failed; None while saving works
        self.on_storage = on_storage
        self.on_running = on_running
        self.on_change = on_change

    def __len__(self) -> int:
        return len(self.book)

    # -- loading and holding ----------------------------------------------------------------------------------------

    def load(self) -> None:
        """The monitors and what apps taught them, from disk (blocking: run it in a thread)."""
        monitors, last_seq = self.store.load()
        table = self.book.table
        for m in monitors:
            self.book.add(m, self._load_learnt(m))
        table.last_seq = max(table.last_seq, last_seq)
        self._on_disk = table.answers()
        table.hold()  # they keep their stored answers until the agent's present speed has a full reading
        if monitors:
            log.info("loaded %d monitor(s) from %s", len(monitors), self.store.folder)
            self.on_change()

    def cleared_corrupt(self) -> list[Outgoing]:
        """Empty retained states for the monitors whose files were set aside at load: the broker forgets them
        (their apps see them gone, as after a delete) rather than keep a state no one updates."""
        return [self.topics.cleared_state(m, owner) for m, owner in self.store.set_aside if m not in self.book]

    def _load_learnt(self, m: StoredMonitor) -> list[Learnt] | None:
        path = self._warm_dir / f"{m.monitor}.json"
        try:
            doc = json.loads(path.read_bytes())
            learnt = [Learnt.from_json(doc[w.name]) if w.name in doc else Learnt() for w in m.workloads]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            set_aside(path, str(exc) or type(exc).__name__, self.store.corrupt_folder)
            return None
        return learnt

    def _forget(self, monitor: str) -> None:
        self.book.forget(monitor)
        self._on_disk.pop(monitor, None)
        self._warm_dirty.discard(monitor)
        self.on_change()

    def _state(self, rec: StoredMonitor, answer: Answer) -> Outgoing:
        if not rec.group:
            return self.topics.state_message(rec.monitor, answer.meets, answer.seq,
                                             rec.workloads[0].requirement.to_json(), owner=rec.owner)
        return self.topics.state_message(rec.monitor, answer.meets, answer.seq, {}, {
            w.name: (w.requirement.to_json(), ok) for w, ok in zip(rec.workloads, answer.members, strict=True)},
            owner=rec.owner)

    def _saved(self) -> dict[str, Answer]:
        """Every monitor's answer as saved: while saving fails, an answer the disk has not taken is neither retained
        nor listed."""
        answers = self.book.table.answers()
        return answers if self.storage_error is None else {**answers, **self._on_disk}

    def retained(self) -> list[Outgoing]:
        """Every monitor's retained state, as saved."""
        saved = self._saved()
        return [self._state(rec, saved[rec.monitor]) for rec in list(self.book.records.values())]

    def last_events(self) -> list[Outgoing]:
        """Each monitor's last change event again, same seq: at least once, even across a SIGKILL.

        A change is stored before its event is published, so an agent killed while the broker was away
        (events queued in memory) would otherwise never send it. A subscriber that has it already sees a
        duplicate seq, as with any QoS 1 duplicate, and drops it.
        """
        answers = self.book.table.answers()
        return [self.topics.event_message(rec.monitor, a.meets, a.seq, self._workloads(rec, a), rec.owner)
                for rec in self.book.records.values() if (a := answers[rec.monitor]).seq > rec.created_seq >= 0]

    def _workloads(self, rec: StoredMonitor, answer: Answer) -> dict[str, bool] | None:
        """A group's workloads' answers by name (None: a lone workload's is the monitor's)."""
        if not rec.group:
            return None
        return {w.name: ok for w, ok in zip(rec.workloads, answer.members, strict=True)}

    def listing(self, owner: str) -> list[dict[str, Any]]:
        """The owner's monitors, and no one else's."""
        saved = self._saved()
        return [json.loads(self._state(r, saved[r.monitor]).payload)
                for r in sorted(self.book.records.values(), key=lambda r: r.monitor) if r.owner == owner]

    # -- requests ---------------------------------------------------------------------------------------------------

    async def create(self, monitor: str, workloads: Sequence[tuple[str, Requirement, Analysis]], speed: Speed,
                     veto: bool, owner: str = "", shown: Callable[[float], float] = float,
                     lease_s: float | None = None) -> tuple[bool, dict[str, bool] | None, bool]:
        """Create (or replace) the owner's monitor priced at `speed`: its first value, its workloads' (a group's),
        and whether it replaced one. `shown` is the latency as the owner is answered about it
        (monitors/privacy.py): its ratio to the latency now is kept with each workload, so that the monitor's
        later answers flip where its owner's view puts the boundary, not where the device's speed does. A storage
        fault leaves things as they were and says so."""
        async with self._mutate:
            self.book.check_owner(monitor, owner)
            self.book.check_room(monitor, owner)
            stored, latencies = [], []
            for name, requirement, a in workloads:
                latency, device = a.present(speed)
                view = shown(latency) / latency if 0 < latency < math.inf else 1.0  # held for the monitor's life
                stored.append(StoredWorkload(name, requirement, device, a.plans, a.base_ms, a.memory_bytes, view,
                                             a.stream_ms, a.gemm_ms))
                latencies.append(latency)
            meets, member_meets = initial_answer(latencies, [w.member() for w in stored], veto)
            rec = StoredMonitor(monitor, stored, self.book.table.next_seq(), meets, member_meets=list(member_meets),
                                owner=owner, lease_s=lease_s)
            previous = self._as_present(self.book.records[monitor]) if monitor in self.book.records else None
            previous_learnt = self.book.learnt.get(monitor)
            try:
                await asyncio.to_thread(self.store.save_monitor, rec)
                self._forget(monitor)
                self.book.add(rec)
                await self._save_seq()
            except OSError as exc:
                self._forget(monitor)
                self._storage(exc, f"monitor {monitor}")
                try:
                    if previous is not None:  # a failed replace leaves the old monitor as it was
                        self.book.add(previous, previous_learnt)
                        await asyncio.to_thread(self.store.save_monitor, previous)
                    else:
                        await asyncio.to_thread(self.store.delete_monitor, monitor)
                except OSError:
                    pass  # the disk refuses everything: what is on it is what was there before
                raise BadInput(f"cannot store the monitor: {exc.strerror or exc}", "storage") from None
            self._storage(None)
            try:
                await asyncio.to_thread(self._delete_learnt, monitor)  # a new monitor learns afresh
            except OSError as exc:
                log.warning("monitor %s: cannot remove what its predecessor learnt: %s", monitor, exc.strerror or exc)
            answer = self.book.table.answer(monitor)
            self._release(self._state(rec, answer))
        return meets, self._workloads(rec, answer), previous is not None

    async def delete(self, monitor: str, owner: str = "") -> None:
        async with self._mutate:
            rec = self.book.record(monitor, owner)
            try:
                await asyncio.to_thread(self.store.delete_monitor, monitor)
            except OSError as exc:
                self._storage(exc, f"monitor {monitor}")
                raise BadInput(f"cannot delete the monitor from the state dir: {exc.strerror or exc}",
                               "storage") from None
            self._forget(monitor)
            try:
                await asyncio.to_thread(self._delete_learnt, monitor)
            except OSError as exc:
                log.warning("monitor %s: cannot remove what it learnt: %s", monitor, exc.strerror or exc)
            # The monitor file is gone: it is deleted, whatever the seq file. Its held messages go with it, and
            # the broker forgets it now.
            mine = (self.topics.monitor_state(monitor, rec.owner), self.topics.monitor_events(monitor, rec.owner))
            self._held = [m for m in self._held if m.topic not in mine]
            await self._commit()
            self._send(self.topics.cleared_state(monitor, rec.owner))

    async def expire(self, now: float) -> list[str]:
        """Delete the leased monitors nobody renewed in time (their clients have gone); the ones deleted."""
        deleted = []
        for rec in self.book.expired(now):
            if rec.monitor not in self.book or self.book.lease_ends(rec.monitor) > now:
                continue  # deleted or renewed while an earlier one was being deleted
            try:
                await self.delete(rec.monitor, rec.owner)
            except BadInput as exc:  # a storage fault: tried again on the next sample
                log.warning("monitor %s: its lease ran out, but %s", rec.monitor, exc)
                continue
            log.info("monitor %s deleted: its lease of %g s ran out unrenewed", rec.monitor, rec.lease_s)
            deleted.append(rec.monitor)
        return deleted

    async def set_running(self, monitor: str, running: Running, owner: str | None = None) -> None:
        """The app runs the monitor's workloads here now, or no longer (kept on disk: it survives a restart)."""
        async with self._mutate:
            rec = self.book.record(monitor, owner)
            before = rec.running
            rec.running = running if running.running else None
            try:
                await asyncio.to_thread(self.store.save_monitor, self._as_present(rec))
            except OSError as exc:
                rec.running = before
                self._storage(exc, f"monitor {monitor}")
                raise BadInput(f"cannot store the monitor: {exc.strerror or exc}", "storage") from None
        self.on_change()
        await self.on_running(self.book.running_pids())

    def report(self, monitor: str, workload: str | None, latencies_ms: Sequence[float], now: float,
               owner: str = "") -> None:
        """What the app measured, learnt (MonitorBook.report) and written to `warm/` with the next saves."""
        self.book.report(monitor, workload, latencies_ms, now, owner)
        self._warm_dirty.add(monitor)
        self.on_change()

    # -- evaluation -----------------------------------------------------------------------------------------------

    async def evaluate(self, now: float, present: PresentSpeed, veto: bool) -> int:
        """One tick (monitors/tick.py) at the present speed: the monitors whose answer changed are stored, then
        their events and states sent."""
        async with self._mutate:
            changes = self.book.tick(present, now, veto)
            if changes:
                messages: list[Outgoing] = []
                for c in changes:
                    rec = self.book.records[c.monitor]
                    answer = Answer(c.seq, c.meets, c.members or (c.meets,))
                    messages += [self.topics.event_message(c.monitor, c.meets, c.seq, self._workloads(rec, answer),
                                                           rec.owner),
                                 self._state(rec, answer)]
                await self._commit(*messages)
                log.debug("%d monitor(s) changed", len(changes))
            elif self.storage_error is not None:
                await self._commit()  # retry what could not be saved
            await self._save_learnt(now)
        return len(changes)

    async def end_gone_runs(self) -> None:
        """An app that said it runs a monitor's workloads in a process that is gone no longer runs them."""
        for rec in list(self.book.records.values()):
            pid = rec.running.pid if rec.running else None
            if pid and not process_runs(pid, self.procfs_root):
                log.info("monitor %s: its app's process %d is gone: no longer running here", rec.monitor, pid)
                try:
                    await self.set_running(rec.monitor, Running(False))
                except BadInput as exc:
                    log.warning("monitor %s: %s", rec.monitor, exc)

    async def rebase(self, price: Callable[[list[dict[str, str]]],
                                           Awaitable[list[tuple[dict[str, float], float, float]]]]) -> None:
        """Stored plans priced again with the present calibration (it may have been redone)."""
        items = [(rec.monitor, i) for rec in list(self.book.records.values()) for i in range(len(rec.workloads))]
        for start in range(0, len(items), REBASE_CHUNK):
            chunk = [(m, i) for m, i in items[start:start + REBASE_CHUNK] if m in self.book.records]
            try:
                bases = await price([self.book.records[m].workloads[i].plans for m, i in chunk])
            except (BadInput, EngineError) as exc:
                log.warning("could not re-price stored monitors: %s", exc)
                return
            for (monitor, i), (base, stream, gemm) in zip(chunk, bases, strict=True):
                rec = self.book.records.get(monitor)
                if rec is not None and rec.workloads[i].device in base:
                    rec.workloads[i].base_ms = base
                    rec.workloads[i].stream_ms = stream
                    rec.workloads[i].gemm_ms = gemm
            for monitor in {m for m, _ in chunk}:
                rec = self.book.records.get(monitor)
                if rec is not None:
                    self.book.table.set_base(monitor, [w.base_ms[w.device] for w in rec.workloads],
                                             [w.stream_ms for w in rec.workloads], [w.gemm_ms for w in rec.workloads])
            self.on_change()

    # -- files -------------------------------------------------------------------------------------------------------

    async def _save_seq(self) -> None:
        """Every monitor's (seq, meets), and a group's workloads' answers, to disk (OSError when the disk refuses)."""
        answers = self.book.table.answers()
        members = {m: list(a.members) for m, a in answers.items() if self.book.records[m].group}
        await asyncio.to_thread(self.store.save_seq, self.book.table.last_seq,
                                {m: (a.seq, a.meets) for m, a in answers.items()}, members)
        self._on_disk = answers

    def _as_present(self, rec: StoredMonitor) -> StoredMonitor:
        """The monitor with its present answer, as its file is written again."""
        a = self.book.table.answer(rec.monitor)
        return dataclasses.replace(rec, seq=a.seq, meets=a.meets, member_meets=list(a.members) if rec.group else None)

    async def _commit(self, *messages: Outgoing) -> bool:
        """The seq file saved, then `messages` (and any held before them) sent in order. When the disk refuses,
        they are held and the save is retried on the next tick: nothing is published that a restart would take
        back (seq never goes back), and nothing is lost while the agent runs. Whether it was saved."""
        self._held.extend(messages)
        if len(self._held) > MAX_HELD:
            del self._held[:len(self._held) - MAX_HELD]
            log.warning("storage failing for long: only the last %d unsaved messages are kept", MAX_HELD)
        try:
            await self._save_seq()
        except OSError as exc:
            self._storage(exc, "the monitors' seq")
            return False
        self._storage(None)
        self._release()
        return True

    def _release(self, *messages: Outgoing) -> None:
        held, self._held = self._held, []
        self._send(*held, *messages)

    def _storage(self, exc: OSError | None, what: str = "") -> None:
        """Say when saving starts or stops failing (the agent's status tells it); each failure is logged (the
        log's rate limit collapses a burst)."""
        why = None if exc is None else f"cannot save {what}: {exc.strerror or exc}"
        if why is not None:
            log.warning("storage: %s (will retry)", why)
        if (why is None) != (self.storage_error is None):
            if why is None:
                log.info("storage: saving works again")
            self.storage_error = why
            self.on_storage(why)

    async def _save_learnt(self, now: float, force: bool = False) -> None:
        if not self._warm_dirty or (not force and now - self._warm_saved_at < WARM_SAVE_S):
            return
        dirty, self._warm_dirty = self._warm_dirty, set()
        book = self.book
        docs = {m: {w.name: x.to_json() for w, x in zip(book.records[m].workloads, book.learnt[m], strict=True)}
                for m in dirty if m in book.records}
        self._warm_saved_at = now
        try:
            await asyncio.to_thread(self._write_learnt, docs)
        except OSError as exc:
            log.warning("cannot save what apps taught their monitors (will retry): %s", exc.strerror or exc)
            self._warm_dirty |= dirty

    def _write_learnt(self, docs: dict[str, dict[str, Any]]) -> None:
        self._warm_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for monitor, doc in docs.items():
            atomic_write(self._warm_dir / f"{monitor}.json", json.dumps(doc, separators=(",", ":")).encode())

    def _delete_learnt(self, monitor: str) -> None:
        (self._warm_dir / f"{monitor}.json").unlink(missing_ok=True)

    async def close(self) -> None:
        """What apps taught, written now (a clean stop)."""
        await self._save_learnt(math.inf, force=True)
