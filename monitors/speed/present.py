"""The present speed, and the one formula that turns a calibrated latency into a present one.

Pure computation: the agent, the estimate CLI, the monitor table, the simulation and the benchmarks all
price through `latencies_ms` (vectorised) or `fastest` (one model), and hold the speed in one
`PresentSpeed`.

How a speed is made (docs/device-state.md):

* the signals predict a CPU slowdown (prediction.py: clocks, contention by others, steal, memory
  pressure) and a GPU one;
* a warm refresh (probes/refresh.py) measures one; `Measurement` keeps it with the prediction of the
  state it was taken in;
* a measurement taken in the present state is blended with the prediction in log space, weight
  MEASURED_WEIGHT divided by the square of the predicted slowdown from time slicing (`blend`): beside
  busy processes the short probe reads where the scheduler puts its wake-ups (4x where an app ran 2.4x
  slower beside one busy process, 2.3x where it ran 5x beside four, on the same machine);
* a measurement older than the last marked state change is carried over to the present state: the
  present prediction times the correction the agent made to the prediction then, faded as that
  slowdown goes away (`carried_correction`), then the slower of the two, because an app would rather
  fall back to the cloud than miss its frame budget on a slowdown nobody has confirmed yet.

Apart from that multiplier, the handoff extra: what a host whose vCPUs sit apart some of the time
charges per MB of activations the intra-op threads hand each other. It grows with a model's bytes, not
its time, so a latency adds it; no signal predicts it, so it is the latest measurement's taken without
contention (a reading beside others' threads is the scheduler's, not the host's).

And the memory multiplier: how much slower than calibrated memory streams beyond the CPU's slowdown (the
host's other tenants using its memory more, or less, than during calibration). Only a model's streamed time
pays it (`stream_ms`: what its calibrated latency gains per unit of memory slowdown, the weights of a decode
step read from memory), so a decode step moves with it and a convolution net does not. No signal predicts it
either: it is the latest
refresh's stream probe against its compute probe (probes/refresh.py, memory_slowdown), read only while a priced
model streams and, as the handoff extra, only without contention: what it follows is the host's memory, whose
bandwidth moves with the neighbours of a shared host for minutes at a time.

And the gemm multiplier: how much faster than calibrated float products run now beyond the CPU's speed, where a
calibration was taken while they ran slow (a shared host has spells in which they run 1.3-1.4x slower and
convolutions 1.1x; docs/device-state.md). Only a model's float products pay it (`gemm_ms`: their calibrated time,
most of a transformer's, little of a CNN's); it is the latest refresh's gemm probe against its compute probe
(probes/refresh.py, gemm_slowdown), read as the memory multiplier is, without contention, and never above 1 (one
reading of a slow spell is as likely a few seconds' state as a lasting one).

The agent's own work is never load from others: the CPU probe leaves out the agent's process tree, and
a state sampled while the agent's own heavy work ran (a calibration) is marked: `PresentSpeed` keeps the
speed it had before and takes no measurement from it, so it moves no monitor.

An app's own run of a workload is not contention against itself: when an app says it runs a monitored graph
here, its monitor is priced at `PresentSpeed.for_share` of what the app takes (its process tree's CPU as the
probe measured it, or what its rate and latency say it takes), left out of the load the state shows. For
everyone else, that run is load like any other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from monitors.devices import DEVICE_INDEX, DEVICES
from monitors.speed.prediction import MAX_FACTOR, CpuPrediction, predict_cpu, predict_gpu
from monitors.speed.refresh_policy import RefreshPolicy
from probes.state import DeviceState

# A prediction above this explains the slowdown it was measured in: the correction fades when it falls.
FADE_FROM = 1.1
# Weight of a measurement taken in the present state, vs the prediction (log space), on a device
# without contention; divided by the square of the predicted slowdown from time slicing (blend).
MEASURED_WEIGHT = 0.5
# A measurement can read a little faster than the reference (noise, turbo headroom).
MIN_FACTOR = 0.8
# The handoff extra: worth a reason from this much (a MobileNetV2 writes 27 MB), and capped (a slow phase
# measured 0.06-0.2 ms/MB; a reading 10x that is a probe that lost the CPU, which the multiplier covers).
NOTABLE_HANDOFF_MS_PER_MB = 0.02
MAX_HANDOFF_MS_PER_MB = 2.0
# The handoff and memory readings are the host's only where others' threads leave the cores to the probe: beside
# them the probes' runs fare differently by where the scheduler puts their wake-ups (0.1-0.3 ms/MB beside busy
# processes, an app's own frames included), which the multiplier already prices.
HANDOFF_QUIET_CONTENTION = 1.2
# The memory multiplier: worth a reason from this much, and bounded as probes/refresh.py bounds it.
NOTABLE_MEMORY = 1.1
MIN_MEMORY, MAX_MEMORY = 0.5, 8.0
# ... and shrunk toward 1 by this factor: on a steady host the stream probe read 0.84-1.10x its reference from one
# refresh to the next, where the host's bandwidth moved by 1.3x over minutes (a calibration's sweep: 42, then 56 GB/s).
MEMORY_NOISE = 1.12
# The gemm multiplier: bounded below by what a spell does (a 2-core AMD EPYC VM ran its float products 1.3-1.4x slower
# in them; a calibration taken in one would price every transformer high for as long as the host runs faster), never
# above 1: on that VM the gemm probe over the compute probe flipped between two levels 1.3x apart every few seconds (a
# 4-minute watch: 0.66-0.68 and 0.86-0.90, a third of the readings at the upper one), one refresh lands on either, and
# the models' runs followed the lower one at their median (readings above 1 took the present estimate of the LLM zoo
# from 76-93 % of its cases within +/-25 % to 68-88 %, five calibrations); and shrunk toward 1 by GEMM_NOISE.
MIN_GEMM, MAX_GEMM = 1 / 1.4, 1.0
GEMM_NOISE = 1.1
FAILED_REFRESH_CPU_S = 0.05  # what a failed or discarded refresh is charged against the policy's budget


@dataclass(frozen=True)
class Speed:
    """How much slower than calibrated each device runs now, and what else limits it."""

    cpu: float = 1.0  # latency multiplier vs the calibrated quiet device, >= ~1.0
    gpu: float | None = None  # same for GPU 0 (onnxruntime's CUDA provider), None without a GPU
    gpu_free_bytes: int | None = None  # a model whose weights + activations exceed this cannot run on the GPU
    reasons: tuple[str, ...] = ()  # why it is slower (local only: may carry figures)
    mem_available_bytes: int | None = None  # ... and this, on the CPU
    predicted_cpu: float = 1.0  # what the signals alone say
    measured_cpu: float | None = None  # the latest warm-refresh slowdown, as given
    handoff_ms_per_mb: float = 0.0  # added to a CPU latency per MB its plan writes (Plan.written_mb)
    memory: float = 1.0  # how much slower memory streams than calibrated, beyond `cpu` (a model's stream_ms pays it;
    # below 1 where the host streams faster than in its calibration)
    gemm: float = 1.0  # how much slower float products run than calibrated, beyond `cpu` (a model's gemm_ms pays it;
    # at most 1 from a refresh: gemm_multiplier)

    def factors(self) -> np.ndarray:
        """The multiplier by device (DEVICES order); inf where the device is absent."""
        return np.array([self.cpu, math.inf if self.gpu is None else self.gpu])

    def handoffs(self) -> np.ndarray:
        """ms per MB written, by device (the GPU's: none measured)."""
        return np.array([self.handoff_ms_per_mb, 0.0])

    def memories(self) -> np.ndarray:
        """The memory multiplier by device (the GPU's: none measured)."""
        return np.array([self.memory, 1.0])

    def gemms(self) -> np.ndarray:
        """The gemm multiplier by device (the GPU's: none measured)."""
        return np.array([self.gemm, 1.0])

    def holding(self, cpu_bytes: int, gpu_bytes: int) -> Speed:
        """This speed for an app that holds these bytes itself (its model's weights and caches, while it runs it):
        what it holds is free to it."""
        return replace(self, mem_available_bytes=None if self.mem_available_bytes is None
                       else self.mem_available_bytes + cpu_bytes,
                       gpu_free_bytes=None if self.gpu_free_bytes is None else self.gpu_free_bytes + gpu_bytes)

    def free_bytes(self) -> np.ndarray:
        """The memory a model may use, by device; inf where unknown."""
        return np.array([math.inf if self.mem_available_bytes is None else float(self.mem_available_bytes),
                         math.inf if self.gpu_free_bytes is None else float(self.gpu_free_bytes)])


AT_REST = Speed(gpu=1.0)  # the calibrated devices, quiet (`estimate --at-rest`, and before the first sample)


# -- the one latency formula --------------------------------------------------------------------------------------

def latencies_ms(base_ms: np.ndarray, device: np.ndarray, memory_bytes: np.ndarray, written_mb: np.ndarray,
                 speed: Speed, stream_ms: np.ndarray | float = 0.0, gemm_ms: np.ndarray | float = 0.0) -> np.ndarray:
    """The present latency of each model: its calibrated latency on its device, its streamed time
    (`stream_ms`, the calibrated latency's gain per unit of memory slowdown) stretched by the device's memory
    multiplier and its float products' time (`gemm_ms`) by the device's gemm multiplier, all times the
    device's multiplier, plus the MB its plan writes times the device's handoff extra; infinite where its
    weights and activations do not fit in the device's free memory (it cannot run there now).

    `device` holds DEVICE_INDEX values; the arrays are parallel.
    """
    own = base_ms + stream_ms * (speed.memories()[device] - 1.0) + gemm_ms * (speed.gemms()[device] - 1.0)
    lat = own * speed.factors()[device] + written_mb * speed.handoffs()[device]
    return np.where(memory_bytes > speed.free_bytes()[device], math.inf, lat)


def memory_shortfall(need_bytes: float, speed: Speed, device: str) -> str | None:
    """Why a model does not fit in the memory its device has free now (None when it does, or when unknown):
    weights, KV cache and activations against the CPU's available memory or the GPU's free memory."""
    free = speed.gpu_free_bytes if device == "gpu" else speed.mem_available_bytes
    if free is None or need_bytes <= free:
        return None
    what = "GPU memory" if device == "gpu" else "memory"
    return f"needs {need_bytes / 1e9:.2f} GB of {what} (weights, KV cache, activations); {free / 1e9:.2f} GB free now"


def fastest(base_ms: Mapping[str, float], speed: Speed, memory_bytes: int = 0,
            written_mb: float = 0.0, stream_ms: float = 0.0, gemm_ms: float = 0.0) -> tuple[float, str]:
    """The fastest device's present latency for one model (calibrated latency by device), and that device.
    The CPU where nothing is finite: it is where an app would try. `written_mb`, `stream_ms` and `gemm_ms` are
    the CPU plan's."""
    devices = [d for d in DEVICES if d in base_ms]
    if not devices:
        raise ValueError("no calibrated latency to price")
    n = len(devices)
    lat = latencies_ms(np.array([base_ms[d] for d in devices], dtype=np.float64),
                       np.array([DEVICE_INDEX[d] for d in devices]), np.full(n, float(memory_bytes)),
                       np.full(n, float(written_mb)), speed, float(stream_ms), float(gemm_ms))
    best = int(np.argmin(lat))
    if not math.isfinite(lat[best]) and "cpu" in devices:
        return math.inf, "cpu"
    return float(lat[best]), devices[best]


# -- measurement and prediction into a speed ------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """A warm refresh's reading, with the signals' prediction for the state it was taken in."""

    slowdown: float | None  # probe wall time now / reference (probes.refresh.slowdown)
    handoff_ms_per_mb: float | None  # probes.refresh.handoff_ms_per_mb
    predicted: float = 1.0  # the predicted CPU slowdown then
    contention: float = 1.0  # ... and its share from time slicing then
    memory: float | None = None  # probes.refresh.memory_slowdown (None: not read)
    gemm: float | None = None  # probes.refresh.gemm_slowdown (None: not read)

    @classmethod
    def taken_in(cls, state: DeviceState, threads: int, slowdown: float | None,
                 handoff_ms_per_mb: float | None, memory: float | None = None,
                 gemm: float | None = None) -> Measurement:
        """The reading in `state`; its handoff, memory and gemm figures only where nothing contends for the cores (None
        beside others' threads: there they are the scheduler's, not the host's; beside one busy process on a 2-core
        VM the stream probe read 0.5-0.8x against the compute probe, and an app's decode step slowed 2.1x where its
        convolution nets slowed 3.9x)."""
        p = predict_cpu(state, threads)
        quiet = p.contention <= HANDOFF_QUIET_CONTENTION
        return cls(slowdown, handoff_ms_per_mb if quiet else None, p.factor, p.contention, memory if quiet else None,
                   gemm if quiet else None)


def carried_correction(ratio: float, predicted: float, predicted_then: float) -> float:
    """How much of a measurement's correction to the prediction (`ratio` = measured / predicted then)
    still holds now.

    All of it while the predicted slowdown holds or grows. As the prediction falls back toward the
    calibrated speed the correction fades with it, in log space (the share of the slowdown that is
    left): an error measured at 5x under load says nothing about a device that has gone quiet. A
    measurement taken when the prediction was near 1 (nothing seen, something measured: say
    throttling the signals miss) keeps all of it."""
    if predicted_then <= FADE_FROM or predicted >= predicted_then:
        return ratio
    left = math.log(max(1.0, predicted)) / math.log(predicted_then)
    return ratio ** left


def blend(predicted: float, measured: float, contention: float = 1.0) -> float:
    """A measurement taken in the present state, weighed against the prediction in log space:
    MEASURED_WEIGHT / `contention` squared (`contention`: the predicted slowdown from time slicing
    alone), because sharing cores with busy processes, the short probe's reading depends on where the
    scheduler puts its wake-ups, not only on the load (docs/device-state.md)."""
    weight = MEASURED_WEIGHT / max(1.0, contention) ** 2
    return math.exp(weight * math.log(measured) + (1 - weight) * math.log(predicted))


def combine(predicted: float, contention: float, m: Measurement | None, current: bool) -> float:
    """The CPU multiplier from the present prediction (and its share from time slicing) and the latest
    measurement, `current` when it was taken after the last marked state change.

    A current measurement is blended with the prediction. An older one is carried over to the present
    state through the correction the agent made then (the blend over the prediction then), faded as the
    slowdown it corrected goes away; the measurement sizes the slowdown, the signals tell how it changed,
    so a load that stops is believed at the next sample, not at the next warm refresh. Carrying the blend
    and not the raw reading keeps the multiplier continuous across a change: a reading of 1.47x that the
    agent took as 1.21x stays 1.21x when a short burst of load comes and goes.
    """
    if m is None:
        return predicted
    measured = m.slowdown
    if measured is None or not math.isfinite(measured) or measured <= 0:
        return predicted
    if current:
        return blend(predicted, measured, contention)
    correction = blend(m.predicted, measured, m.contention) / m.predicted if m.predicted > 0 else measured
    return max(predicted, predicted * carried_correction(correction, predicted, m.predicted))


def shrunk(reading: float | None, low: float, high: float, noise: float) -> float:
    """A multiplier from a probe's reading (None: none read): bounded to `low`..`high`, and shrunk toward 1 by
    `noise`, so that a steady host's refresh-to-refresh noise moves nothing."""
    if reading is None or not math.isfinite(reading):
        return 1.0
    value = min(high, max(low, reading))
    if value > noise:
        return value / noise
    return value * noise if value < 1 / noise else 1.0


def memory_multiplier(reading: float | None) -> float:
    """The memory multiplier from the stream probe's reading (probes.refresh.memory_slowdown)."""
    return shrunk(reading, MIN_MEMORY, MAX_MEMORY, MEMORY_NOISE)


def gemm_multiplier(reading: float | None) -> float:
    """The gemm multiplier from the gemm probe's reading (probes.refresh.gemm_slowdown)."""
    return shrunk(reading, MIN_GEMM, MAX_GEMM, GEMM_NOISE)


def speed_from_state(state: DeviceState, threads: int, measurement: Measurement | None = None,
                     current: bool = False) -> Speed:
    """The present speed of this device in `state`, with onnxruntime's `threads` intra-op threads and the
    latest warm-refresh `measurement` (`current`: taken after the last marked state change)."""
    cpu = cpu_speed(predict_cpu(state, threads), measurement, current)
    gpu, gpu_free, gpu_reasons = predict_gpu(state)
    return replace(cpu, gpu=None if gpu is None else round(gpu, 4), gpu_free_bytes=gpu_free,
                   reasons=cpu.reasons + tuple(gpu_reasons), mem_available_bytes=state.memory.available_bytes)


def cpu_speed(p: CpuPrediction, measurement: Measurement | None, current: bool) -> Speed:
    """The CPU's part of the present speed, from the signals' prediction `p` and the latest warm-refresh
    `measurement` (no GPU, memory unknown): what the agent answers on a device that nothing contends for, given
    prediction.QUIET (bench.groundtruth prices its ground truth so)."""
    reasons = list(p.reasons)
    cpu = combine(p.factor, p.contention, measurement, current)
    measured = None if measurement is None else measurement.slowdown
    if measured is not None and measured > 1.1 and measured >= p.factor:
        reasons.append(f"measured {measured:.2f}x slower than calibrated")
    handoff = None if measurement is None else measurement.handoff_ms_per_mb
    handoff = handoff if handoff is not None and math.isfinite(handoff) else 0.0
    handoff = min(MAX_HANDOFF_MS_PER_MB, max(0.0, handoff))
    if handoff >= NOTABLE_HANDOFF_MS_PER_MB:
        reasons.append(f"threads hand data across cores {handoff:.3f} ms/MB slower than calibrated")
    memory = memory_multiplier(None if measurement is None else measurement.memory)
    if memory >= NOTABLE_MEMORY:
        reasons.append(f"memory streams {memory:.2f}x slower than calibrated")
    gemm = gemm_multiplier(None if measurement is None else measurement.gemm)
    return Speed(
        cpu=round(min(MAX_FACTOR, max(MIN_FACTOR, cpu)), 4),
        reasons=tuple(reasons),
        predicted_cpu=round(p.factor, 4),
        measured_cpu=measured,
        handoff_ms_per_mb=round(handoff, 5),
        memory=round(memory, 4),
        gemm=round(gemm, 4),
    )


# -- an app's own run, left out -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Share:
    """What an app's own run of a workload takes of the CPU."""

    cores: float  # cores it keeps busy
    runnable: float  # its threads running or waiting, on average (>= cores)


def measured_share(state: DeviceState, pid: int) -> Share | None:
    """The app's process tree as the CPU probe measured it (None: not measured in this state)."""
    use = state.cpu.tracked.get(pid)
    return None if use is None else Share(use.cores, use.cores + use.waiting)


def expected_share(rate_hz: float, latency_ms: float, threads: int, cores: int | None) -> Share:
    """What a workload run `rate_hz` times a second, each run `latency_ms` on `threads` intra-op threads, keeps
    busy: a lower bound (an app's threads also spin between runs, which only its process's reading shows)."""
    width = min(max(1, threads), max(1, cores or threads))
    busy = rate_hz * latency_ms / 1000.0 * width if math.isfinite(latency_ms) else float(width)
    return Share(min(busy, float(width)), min(busy, float(width)))


def without(state: DeviceState, share: Share) -> DeviceState:
    """The state as an app that takes `share` sees it: its own run left out of others' load."""
    c = state.cpu
    if c.others_busy_cores is None and c.runnable_others is None:
        return state
    others = None if c.others_busy_cores is None else max(0.0, c.others_busy_cores - share.cores)
    return replace(state, cpu=replace(
        c, others_busy_cores=others,
        busy_cores=None if c.busy_cores is None else max(0.0, c.busy_cores - share.cores),
        runnable_others=None if c.runnable_others is None else max(0.0, c.runnable_others - share.runnable),
        load=None if others is None or not c.cores else others / c.cores))


# -- the holder ---------------------------------------------------------------------------------------------------

class PresentSpeed:
    """The agent's present speed: the latest state, the latest warm refresh carried over to it, and when to
    refresh (RefreshPolicy). One per agent; pure: the caller passes the times and the readings.

    A refresh's reading pairs with the first state sampled after it: that sample's interval holds the
    refresh, so both describe the same load (the sample before it may predate a load that had just started
    or stopped). A state sampled while the agent's own heavy work ran (`own_work`) keeps the speed as it
    was, and a refresh paired with it is dropped: the agent's work is not the device's load.
    """

    def __init__(self, threads: int, policy: RefreshPolicy | None = None) -> None:
        self.threads = threads
        self.policy = policy
        self.state: DeviceState | None = None
        self.priced: DeviceState | None = None  # the state the present speed was made from
        self.measurement: Measurement | None = None
        self.speed: Speed = AT_REST
        self.held = False  # the latest state was sampled during the agent's own heavy work
        self._fresh = False  # the speed has been made from a state free of the agent's own work
        self.fresh_states = 0  # states observed free of the agent's own work
        self._own_reading: tuple[Speed, DeviceState] | None = None  # the last reading during the agent's own work
        self._refreshing = False  # a refresh is due, running, or its reading not yet paired
        self._reading: _Reading | None = None  # the latest refresh's, until the next state pairs it

    @classmethod
    def at(cls, speed: Speed, threads: int = 1) -> PresentSpeed:
        """A present speed fixed at `speed`, no state sampled: monitors priced outside an agent (tests, tools)."""
        present = cls(threads)
        present.speed = speed
        return present

    @property
    def measurement_current(self) -> bool:
        return self.policy is not None and self.measurement is not None and self.policy.measurement_current()

    def observe(self, state: DeviceState, now: float, own_work: bool = False) -> Speed:
        """A newly sampled state (monotonic `now`); returns the present speed."""
        self.state = state
        self.held = own_work
        self.fresh_states += not own_work
        if self._reading is not None:
            self._pair(self._reading, state, own_work)
        if self.policy is not None and not own_work:
            self.policy.observe(state, now)
        if not own_work or not self._fresh:
            # Without a state free of the agent's own work yet (at start-up it calibrates first), price the one
            # it has by CPU time, from which the probe takes the agent's tree out; not by the run queue, where
            # its short-lived threads (a calibration's sessions) read as others' tasks waiting. Where its
            # processes start and end, one interval's split of the CPU time can still misread them as others':
            # during its own work, a slower reading counts once the next sample agrees.
            priced = state if not own_work else replace(state, cpu=replace(state.cpu, runnable_others=None))
            speed = speed_from_state(priced, self.threads, self.measurement, self.measurement_current)
            last, self._own_reading = self._own_reading, ((speed, priced) if own_work else None)
            if last is not None and last[0].cpu < speed.cpu:
                speed, priced = last
            self.speed = speed
            self.priced = priced
            self._fresh = self._fresh or not own_work
        return self.speed

    @property
    def refreshing(self) -> bool:
        """A refresh is due, running, or its reading not yet paired with a state."""
        return self._refreshing or self._reading is not None

    def full_reading(self, refresh_on: bool) -> bool:
        """Whether the present speed has a full reading: a warm refresh's measurement paired with a state where
        the agent refreshes, else two states free of its own work (the first covers an interval that began
        before the agent was sampling: its load and pressure are partial)."""
        if refresh_on:
            return self.measurement is not None and self.fresh_states >= 1
        return self.fresh_states >= 2

    def for_share(self, share: Share) -> Speed:
        """The present speed for an app that takes `share` of the CPU itself: its own run left out. The warm
        refresh read the device with that run in it, so its reading is carried over as to any other state."""
        if self.priced is None:
            return self.speed
        return speed_from_state(without(self.priced, share), self.threads, self.measurement, current=False)

    def start_refresh(self, now: float, own_work: bool = False) -> bool:
        """True when a warm refresh should start now (and it is then counted as under way)."""
        if self.policy is None or self.state is None or self._refreshing or own_work or not self.policy.due(now):
            return False
        self._refreshing = True
        return True

    def refreshed(self, slowdown: float | None, handoff_ms_per_mb: float | None, started_at: float,
                  cpu_s: float, memory: float | None = None, gemm: float | None = None) -> None:
        """A refresh's reading; taken with the next observed state."""
        self._reading = _Reading(slowdown, handoff_ms_per_mb, memory, gemm, started_at, cpu_s)

    def refresh_failed(self, started_at: float) -> None:
        """A refresh that failed or overlapped the agent's own work: nothing measured, the budget charged."""
        if self.policy is not None:
            self.policy.failed(started_at, FAILED_REFRESH_CPU_S)
        self._refreshing = False

    def forget_measurement(self) -> None:
        """The calibration was redone: readings against the old reference no longer apply."""
        self.measurement = None
        self._reading = None

    def _pair(self, reading: _Reading, state: DeviceState, own_work: bool) -> None:
        self._reading = None
        if own_work:
            self.refresh_failed(reading.at)
            return
        assert self.policy is not None
        self.policy.refreshed(state, reading.at, reading.cpu_s)
        self._refreshing = False
        m = Measurement.taken_in(state, self.threads, reading.slowdown, reading.handoff, reading.memory, reading.gemm)
        last = self.measurement
        if last is not None:  # a figure not read this time: the last one stands
            if m.handoff_ms_per_mb is None:
                m = replace(m, handoff_ms_per_mb=last.handoff_ms_per_mb)
            if m.memory is None:
                m = replace(m, memory=last.memory)
            if m.gemm is None:
                m = replace(m, gemm=last.gemm)
        self.measurement = m


class _Reading(NamedTuple):
    slowdown: float | None
    handoff: float | None
    memory: float | None
    gemm: float | None
    at: float  # monotonic, when the refresh started
    cpu_s: float
