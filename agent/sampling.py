"""The sampler's own thread: a sample every interval, with run-queue snapshots between while tasks wait for a CPU.

A sample inside the band the last evaluation left (`steady`, monitors/steady.py) changes no monitor's answer: it
is not handed over, and the event loop sleeps on. The first one outside it is handed over at once.

A thread because probes may block (NVML, a battery's embedded controller); its own, on its own timer, because a
job handed to the loop's executor each interval woke three threads that then contended with the loop for the
GIL (4 to 7 context switches a sample, against 2 here). The event loop sleeps until a sample is ready. At rest
(no task waiting for a CPU, Sampler.wants_ticks) the thread sleeps from one sample to the next, or until the
device says something changed (`Sampler.changed`: power-profiles-daemon's signals, the kernel's power-supply and
thermal uevents), which is sampled at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from monitors.steady import Steady
from probes.state import DeviceState, Sampler

log = logging.getLogger("daop-agent")

THREAD_NAME = "daop-sampler"  # as `top -H` and /proc/<pid>/task/<tid>/comm show it
PUSHED_GAP_S = 0.1  # a burst of the device's own change signals is sampled at most this often


def name_thread(name: str) -> None:
    """Gives the calling thread its name in the kernel too (Python 3.11 keeps it to itself)."""
    with contextlib.suppress(OSError):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name[:15])


@dataclass(frozen=True)
class Sampled:
    """One sample: its number, when it began and when the one before it did (monotonic: its load covers that
    interval), and the state read or why none was."""

    number: int
    since: float
    started: float
    state: DeviceState | None
    error: Exception | None = None


class SamplingThread:
    """Samples `sampler` every `interval_s` and hands each Sampled to `deliver` (from this thread: the caller
    passes it on to its loop), except those inside `steady`, the band the caller made when it evaluated sample
    `steady.number` (set it after each evaluation; None: every sample is handed over). Between samples, run-queue
    snapshots (Sampler.tick) every `tick_s` while the sampler wants them."""

    def __init__(self, sampler: Sampler, interval_s: float, tick_s: float,
                 deliver: Callable[[Sampled], object]) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self.tick_s = tick_s
        self.deliver = deliver
        self.steady: Steady | None = None
        self.skipped = 0  # samples not handed over, inside a band
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> SamplingThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread at its next wait (not waited for: a probe may be blocked)."""
        self._stop.set()
        self.sampler.changed.set()  # wakes its wait

    def join(self, timeout_s: float) -> bool:
        """Whether the thread has ended within `timeout_s`."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        name_thread(THREAD_NAME)
        number, delivered, since = 0, 0, time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            number += 1
            try:
                sampled = Sampled(number, since, started, self.sampler.sample())
            except Exception as exc:  # noqa: BLE001 - a probe bug must not stop the monitors: the agent logs it
                sampled = Sampled(number, since, started, None, exc)
            since = started
            steady = self.steady  # made from the last sample handed over, or from an older one (then stale)
            if steady is not None and steady.number == delivered and sampled.state is not None \
                    and steady.holds(sampled.state, started):
                self.skipped += 1
            else:
                self.steady = None
                delivered = number
                try:
                    self.deliver(sampled)
                except RuntimeError:  # the loop is closed: the agent has stopped
                    return
            ticks, changed = self.sampler.wants_ticks(), self.sampler.changed
            while (left := started + self.interval_s - time.monotonic()) > 0:
                if changed.wait(min(self.tick_s, left) if ticks else left):
                    changed.clear()  # the device says something changed (or a stop): sample now
                    if (early := started + PUSHED_GAP_S - time.monotonic()) > 0 and not self._stop.is_set():
                        time.sleep(early)
                    break
                if ticks:
                    self.sampler.tick()
