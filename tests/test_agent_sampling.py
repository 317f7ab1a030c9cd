"""agent/sampling.py: the sampler's own thread, with a stand-in sampler."""

from __future__ import annotations

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

    def sample(self) -> Any:
        if self.fail:
            raise OSError("a probe failed")
        return SimpleNamespace()

    def tick(self) -> None:
        self.ticks += 1

    def wants_ticks(self) -> bool:
        return self.waiting


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


def test_a_failed_sample_is_handed_over_as_such_and_sampling_goes_on():
    sampler = StandIn()
    sampler.fail = True
    got: list[Sampled] = []

    def deliver(sampled: Sampled) -> None:
        got.append(sampled)
        sampler.fail = False

    run(sampler, 0.25, deliver)
    assert got[0].state is None and isinstance(got[0].error, OSError)
    assert got[1].state is not None and got[1].error is None


def test_the_thread_ends_when_its_loop_is_closed():
    def closed(_: Sampled) -> None:
        raise RuntimeError("Event loop is closed")  # what call_soon_threadsafe raises then

    thread = SamplingThread(StandIn(), 0.1, 0.02, closed).start()  # type: ignore[arg-type]
    assert thread.join(1.0)
