"""agent/sampling.py: the sampler's own thread, with a stand-in sampler."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from agent.sampling import Sampled, SamplingThread


class StandIn:
    """A sampler that fails when told to, and counts its run-queue snapshots."""

    def __init__(self, waiting: bool = True) -> None:
        self.fail = False
        self.ticks = 0
        self.waiting = waiting  # tasks wait for a CPU: run-queue snapshots are wanted
        self.changed = threading.Event()

    def sample(self) -> Any:
        if self.fail:
            raise OSError("a probe failed")
        return SimpleNamespace()

    def tick(self) -> None:
        self.ticks += 1

    def wants_ticks(self) -> bool:
        return self.waiting


def until(condition: Any, timeout_s: float = 5.0) -> bool:
    """Whether `condition()` came true within `timeout_s`: a test that needs n samples waits for them, not for the
    n intervals they take on a quiet host (beside the other tests, a 0.05 s interval ran late)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(condition())


def run(sampler: StandIn, seconds: float, deliver: Any = None) -> list[Sampled]:
    got: list[Sampled] = []
    thread = SamplingThread(sampler, 0.1, 0.02, deliver or got.append).start()  # type: ignore[arg-type]
    time.sleep(seconds)
    thread.stop()
    assert thread.join(1.0), "the thread ends at its next wait"
    return got


def test_the_thread_samples_every_interval_and_reads_the_run_queue_between():
    sampler = StandIn()
    got = run(sampler, 0.45)
    assert 2 <= len(got) <= 5 and all(s.state is not None for s in got)  # at most one an interval
    assert all(0.09 <= b.started - a.started for a, b in zip(got, got[1:], strict=False))
    assert 1 <= sampler.ticks <= 5 * len(got)  # one every 0.02 s at most


def test_the_thread_sleeps_from_one_sample_to_the_next_while_no_task_waits():
    sampler = StandIn(waiting=False)
    got = run(sampler, 0.45)
    assert 2 <= len(got) <= 5 and sampler.ticks == 0
    assert all(0.09 <= b.started - a.started for a, b in zip(got, got[1:], strict=False))


def test_a_pushed_change_is_sampled_at_once_not_at_the_next_interval():
    sampler = StandIn(waiting=False)
    got: list[Sampled] = []
    thread = SamplingThread(sampler, 5.0, 0.02, got.append).start()  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 2.0
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        changed_at = time.monotonic()
        sampler.changed.set()  # as power-profiles-daemon's signal sets it
        while len(got) < 2 and time.monotonic() < deadline + 2.0:
            time.sleep(0.01)
        assert len(got) == 2 and got[1].started - changed_at < 1.0  # not 5 s later
    finally:
        thread.stop()
    assert thread.join(1.0), "a stop wakes the wait"


def test_a_failed_sample_is_handed_over_as_such_and_sampling_goes_on():
    sampler = StandIn()
    sampler.fail = True
    got: list[Sampled] = []

    def deliver(sampled: Sampled) -> None:
        got.append(sampled)
        sampler.fail = False

    thread = SamplingThread(sampler, 0.1, 0.02, deliver).start()  # type: ignore[arg-type]
    assert until(lambda: len(got) >= 2)
    thread.stop()
    assert thread.join(1.0)
    assert got[0].state is None and isinstance(got[0].error, OSError)
    assert got[1].state is not None and got[1].error is None


def test_the_thread_ends_when_its_loop_is_closed():
    def closed(_: Sampled) -> None:
        raise RuntimeError("Event loop is closed")  # what call_soon_threadsafe raises then

    thread = SamplingThread(StandIn(), 0.1, 0.02, closed).start()  # type: ignore[arg-type]
    assert thread.join(1.0)


class Band:
    """A stand-in for monitors/steady.py's Steady: holds for the samples it is told to."""

    def __init__(self, number: int, holds: bool = True) -> None:
        self.number = number
        self.holding = holds

    def holds(self, state: Any, now: float) -> bool:
        return self.holding


def test_samples_inside_the_band_are_not_handed_over_and_the_first_outside_it_is_at_once():
    got: list[tuple[Sampled, int]] = []  # each sample handed over, and how many were skipped before it
    bands: list[Band] = []

    def deliver(sampled: Sampled) -> None:  # the agent's evaluation: a band from the sample it evaluated
        got.append((sampled, thread.skipped))
        bands.append(Band(sampled.number, holds=not bands))  # the first holds until told; the later ones never
        thread.steady = bands[-1]  # type: ignore[assignment]

    thread = SamplingThread(StandIn(waiting=False), 0.05, 0.02, deliver)  # type: ignore[arg-type]
    thread.start()
    assert until(lambda: thread.skipped >= 2)
    assert len(got) == 1  # the rest were inside the band
    bands[0].holding = False
    assert until(lambda: len(got) >= 2)
    thread.stop()
    assert thread.join(1.0)
    (first, _), (out, skipped) = got[0], got[1]
    assert out.number == first.number + skipped + 1  # the first sample outside the band, at once
    assert skipped >= 2 and out.since > first.started  # its load covers the interval since the sample before it (one
    # skipped), not all since the last one handed over
    assert [s.number for s, _ in got[1:]] == list(range(out.number, out.number + len(got) - 1))


def test_a_band_made_from_an_older_sample_is_stale():
    got: list[Sampled] = []

    def deliver(sampled: Sampled) -> None:
        got.append(sampled)
        thread.steady = Band(sampled.number - 1)  # type: ignore[assignment]

    thread = SamplingThread(StandIn(waiting=False), 0.05, 0.02, deliver)  # type: ignore[arg-type]
    thread.start()
    assert until(lambda: len(got) >= 4)
    thread.stop()
    assert thread.join(1.0)
    assert thread.skipped == 0
    assert [s.number for s in got] == list(range(1, len(got) + 1))
