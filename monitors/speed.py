"""From device state to present speed: how much slower one inference runs now than on the calibrated quiet device.

Pure computation. Signals predict a slowdown (clock capping, contention,
steal, power-saving profiles, a busy GPU); warm-refresh micro-benchmarks
measure one. How the two are combined (docs/device-state.md):

* no measurement: the prediction;
* a measurement older than the last marked state change: carried over to the
  present state (the present prediction times the correction the agent made
  to the prediction of the measurement's time, faded as that slowdown goes
  away), then the slower of the two, because an app would rather fall back
  to the cloud than miss its frame budget on a slowdown nobody has
  confirmed yet;
* a measurement taken in the present state: blended in log space with the
  prediction, weight MEASURED_WEIGHT divided by the square of the predicted
  slowdown from time slicing, because a short probe that shares its cores
  with busy processes reads what the scheduler gives its wake-ups: 4x where
  an app ran 2.4x slower beside one busy process, 2.3x where it ran 5x
  beside four, on the same machine, run after run (docs/device-state.md).

Apart from that multiplier, the handoff extra: what a host whose vCPUs sit
apart some of the time charges per MB of activations the intra-op threads
hand each other (probes/refresh.py: handoff_ms_per_mb). It grows with a
model's bytes, not its time, so an estimate adds it (monitors/estimator.py);
no signal predicts it, so it is the latest measurement's, kept until the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # data only: monitors/ does no I/O
    from probes.state import DeviceState

# Profiles that lower clocks or power limits; when the clocks do not show it
# (no cpufreq, or a firmware limit) assume this much slower until measured.
POWER_SAVING_PROFILES = frozenset({"low-power", "power-saver", "quiet", "cool"})
POWER_SAVING_FACTOR = 1.3
EPP_POWER_FACTOR = 1.15
# Thermal throttling with no clock readings to size it: a guess until measured.
UNSIZED_THROTTLING_FACTOR = 1.5
MAX_CLOCK_FACTOR = 4.0
MAX_FACTOR = 50.0
# A prediction above this explains the slowdown it was measured in: the correction fades when it falls.
FADE_FROM = 1.1
# Weight of a measurement taken in the present state, vs the prediction (log space), on a device
# without contention; divided by the square of the predicted slowdown from time slicing (combine).
MEASURED_WEIGHT = 0.5
# A measurement can read a little faster than the reference (noise, turbo headroom).
MIN_FACTOR = 0.8
# A parallel kernel ends when its slowest thread does. Oversubscribed, a thread that shares its core
# loses whole time slices while its peers wait, so inference slows down more than fair sharing says:
# on a quiet 2-core machine, real models under 1, 2 and 4 busy processes ran 1.55-1.65x slower than
# the fair share (docs/device-state.md). The penalty grows with the threads that wait for the last one.
LOCKSTEP = 1.2
# The handoff extra: worth a reason from this much (a MobileNetV2 writes 27 MB), and capped (a slow phase
# measured 0.06-0.2 ms/MB; a reading 10x that is a probe that lost the CPU, which the multiplier covers).
NOTABLE_HANDOFF_MS_PER_MB = 0.02
MAX_HANDOFF_MS_PER_MB = 2.0


@dataclass(frozen=True)
class Speed:
    cpu: float  # latency multiplier vs the calibrated quiet device, >= ~1.0
    gpu: float | None  # same for GPU 0 (what onnxruntime's CUDA provider uses), None without GPU
    gpu_free_bytes: int | None  # a model whose weights + activations exceed this cannot run on the GPU
    reasons: tuple[str, ...]  # why it is slower (local only: may carry figures)
    mem_available_bytes: int | None = None  # ... and this, on the CPU
    predicted_cpu: float = 1.0  # what the signals alone say
    measured_cpu: float | None = None  # the latest warm-refresh slowdown, as given
    handoff_ms_per_mb: float = 0.0  # added to a CPU estimate per MB its plan writes (Plan.written_mb)


def lockstep_penalty(oversubscription: float, threads: int) -> float:
    """The straggler penalty of `threads` lock-stepped intra-op threads at a fair-share slowdown of
    `oversubscription`; it ramps in over the first half core of oversubscription (continuous)."""
    if oversubscription <= 1.0 or threads <= 1:
        return 1.0
    ramp = min(1.0, (oversubscription - 1.0) / 0.5)
    return 1.0 + LOCKSTEP * ramp * (threads - 1) / threads


def contention_factor(threads: int, others: float, cores: int, busy_others: float | None = None) -> float:
    """Slowdown of `threads` intra-op threads sharing `cores` with `others` tasks that want a CPU.

    While threads + others fit the cores there is no slowdown; beyond that each
    runnable task gets a fair share s = cores / (threads + others) of a core and
    the slowdown is 1 / s, times the straggler penalty of lock-stepped threads
    (lockstep_penalty). The penalty is sized by `busy_others`, the cores other
    processes kept busy over the last interval, where known: an exact average,
    unlike the runnable-task count, which is a snapshot that reads about one
    task even on an idle device.
    """
    threads = min(max(1, threads), max(1, cores))
    cores = max(1, cores)
    fair = max(1.0, (threads + max(0.0, others)) / cores)
    busy = others if busy_others is None else min(max(0.0, busy_others), others)
    return min(MAX_FACTOR, fair * lockstep_penalty((threads + busy) / cores, threads))


def cpu_contention(state: DeviceState, threads: int) -> tuple[float, str | None]:
    """The predicted slowdown from time slicing with other processes, and why (None: no contention seen)."""
    c = state.cpu
    cores = c.cores or max(1, threads)
    others = c.demand  # busy cores saturate at the core count; runnable tasks tell 2 busy processes from 6
    if others is not None:
        contention = contention_factor(threads, others, cores, c.others_busy_cores)
        return contention, f"{others:.1f} other tasks want a CPU" if contention > 1.0 else None
    if c.psi_some_avg10 is not None:
        psi = c.psi_some_avg10
        return 1.0 + psi / 100.0, f"cpu pressure {psi:.0f} %" if psi >= 10.0 else None
    return 1.0, None


def predict_cpu(state: DeviceState, threads: int) -> tuple[float, list[str]]:
    """Predicted CPU slowdown from signals alone, and why."""
    factor, _, reasons = _predict_cpu(state, threads)
    return factor, reasons


def _predict_cpu(state: DeviceState, threads: int) -> tuple[float, float, list[str]]:
    """Predicted CPU slowdown, the part of it from time slicing (cpu_contention), and why."""
    reasons: list[str] = []
    c, t, p = state.cpu, state.thermal, state.power
    factor = 1.0

    # Clocks: a cap on the maximum (firmware, power limit, user) and thermal throttling.
    clock = 1.0
    if c.max_mhz and c.limit_mhz and c.limit_mhz < 0.98 * c.max_mhz:
        clock = max(clock, c.max_mhz / c.limit_mhz)
        reasons.append(f"cpu clock capped at {c.limit_mhz:.0f} of {c.max_mhz:.0f} MHz")
    if t.cpu_throttling:
        # The current clock shows the throttled speed only while the cores are busy; idle cores
        # clock down for other reasons. Otherwise a guess, until a warm refresh measures it.
        busy = c.busy_cores is not None and c.cores and c.busy_cores >= 0.5 * c.cores
        if busy and c.max_mhz and c.cur_mhz:
            clock = max(clock, c.max_mhz / min(c.cur_mhz, c.limit_mhz or c.cur_mhz))
            reasons.append(f"thermal throttling, clock {c.cur_mhz:.0f} of {c.max_mhz:.0f} MHz")
        else:
            clock = max(clock, UNSIZED_THROTTLING_FACTOR)
            reasons.append("thermal throttling")
    mode = p.power_mode
    if mode in POWER_SAVING_PROFILES:
        clock = max(clock, POWER_SAVING_FACTOR)
        reasons.append(f"power mode {mode}")
    elif p.epp == "power":
        clock = max(clock, EPP_POWER_FACTOR)
        reasons.append("energy/performance preference: power")
    factor *= min(clock, MAX_CLOCK_FACTOR)

    contention, why = cpu_contention(state, threads)
    if why:
        reasons.append(why)
    factor *= contention

    # Time the hypervisor gives to other guests.
    if c.steal:
        steal = min(c.steal, 0.9)
        factor /= 1.0 - steal
        if steal >= 0.02:
            reasons.append(f"steal time {100 * steal:.0f} %")

    # Memory stalls (reclaim, swap).
    m = state.memory
    if m.psi_some_avg10 is not None and m.psi_some_avg10 >= 5.0:
        factor *= 1.0 + m.psi_some_avg10 / 100.0
        reasons.append(f"memory pressure {m.psi_some_avg10:.0f} %")
    return min(factor, MAX_FACTOR), contention, reasons


def predict_gpu(state: DeviceState) -> tuple[float | None, int | None, list[str]]:
    """Predicted slowdown of GPU 0 and its free memory."""
    if not state.gpus:
        return None, None, []
    g = state.gpus[0]
    reasons: list[str] = []
    factor = 1.0
    if g.util_percent:
        # Time slicing with another context that keeps the GPU busy u % of the time.
        factor *= 1.0 + min(g.util_percent, 100.0) / 100.0
        if g.util_percent >= 10:
            reasons.append(f"gpu {g.util_percent:.0f} % busy")
    capped = g.thermal_throttling or g.power_capping or g.hw_slowdown
    if capped and g.sm_clock_mhz and g.sm_clock_max_mhz and g.sm_clock_mhz < g.sm_clock_max_mhz:
        factor *= min(MAX_CLOCK_FACTOR, g.sm_clock_max_mhz / g.sm_clock_mhz)
        why = "thermal" if g.thermal_throttling else "power" if g.power_capping else "hardware"
        reasons.append(f"gpu {why} capping, SM clock {g.sm_clock_mhz:.0f} of {g.sm_clock_max_mhz:.0f} MHz")
    return min(factor, MAX_FACTOR), g.memory_free_bytes, reasons


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
    alone, cpu_contention), because sharing cores with busy processes, the short probe's reading
    depends on where the scheduler puts its wake-ups, not only on the load (docs/device-state.md)."""
    weight = MEASURED_WEIGHT / max(1.0, contention) ** 2
    return math.exp(weight * math.log(measured) + (1 - weight) * math.log(predicted))


def combine(predicted: float, measured: float | None, measured_current: bool,
            predicted_then: float | None = None, contention: float = 1.0, contention_then: float = 1.0) -> float:
    """The rule of the module docstring; see docs/device-state.md.

    A current measurement is blended with the prediction (blend).

    A measurement older than the last marked change is first carried over to the present
    state: the present prediction times the correction the agent made to the prediction of the
    measurement's time (the blend then over `predicted_then`, with `contention_then`), faded as
    the slowdown it corrected goes away (carried_correction). The measurement sizes the slowdown,
    the signals tell how it changed; so a load that stops is believed at the next sample, not at
    the next warm refresh. Carrying the blend and not the raw reading keeps the multiplier
    continuous across a change: a reading of 1.47x that the agent took as 1.21x stays 1.21x when
    a short burst of load comes and goes, rather than jumping to 1.47x until the next refresh.
    """
    if measured is None or not math.isfinite(measured) or measured <= 0:
        return predicted
    if not measured_current:
        if predicted_then and predicted_then > 0:
            correction = blend(predicted_then, measured, contention_then) / predicted_then
            measured = predicted * carried_correction(correction, predicted, predicted_then)
        return max(predicted, measured)
    return blend(predicted, measured, contention)


def speed_from_state(
    state: DeviceState, measured: float | None, cores: int, *, measured_current: bool = False,
    predicted_then: float | None = None, contention_then: float = 1.0, handoff_ms_per_mb: float | None = None,
) -> Speed:
    """Present speed of this device.

    `measured`: the latest warm-refresh slowdown (now / reference), or None.
    `cores`: onnxruntime's intra-op threads (its default: the physical cores).
    `measured_current`: the measurement was taken after the last marked state
    change (RefreshPolicy.measurement_current()); when False, a slowdown the
    signals predict wins over an older, faster measurement.
    `predicted_then`, `contention_then`: the prediction and its share from time slicing
    (cpu_contention) for the state the measurement was taken in.
    `handoff_ms_per_mb`: the latest warm refresh's handoff extra, or None.
    """
    predicted, contention, reasons = _predict_cpu(state, cores)
    cpu = combine(predicted, measured, measured_current, predicted_then, contention, contention_then)
    if measured is not None and measured > 1.1 and measured >= predicted:
        reasons.append(f"measured {measured:.2f}x slower than calibrated")
    handoff = handoff_ms_per_mb if handoff_ms_per_mb is not None and math.isfinite(handoff_ms_per_mb) else 0.0
    handoff = min(MAX_HANDOFF_MS_PER_MB, max(0.0, handoff))
    if handoff >= NOTABLE_HANDOFF_MS_PER_MB:
        reasons.append(f"threads hand data across cores {handoff:.3f} ms/MB slower than calibrated")
    gpu, gpu_free, gpu_reasons = predict_gpu(state)
    return Speed(
        cpu=round(min(MAX_FACTOR, max(MIN_FACTOR, cpu)), 4),
        gpu=None if gpu is None else round(gpu, 4),
        gpu_free_bytes=gpu_free,
        reasons=tuple(reasons + gpu_reasons),
        mem_available_bytes=state.memory.available_bytes,
        predicted_cpu=round(predicted, 4),
        measured_cpu=measured,
        handoff_ms_per_mb=round(handoff, 5),
    )
