"""What the device's signals predict: how much slower than calibrated one inference runs, and why.

Pure computation over a DeviceState: clock capping and thermal throttling, power-saving profiles,
time slicing with other processes (contention, with the straggler penalty of lock-stepped intra-op
threads), steal time, memory pressure; for an accelerator, the busy share of other clients, clock capping
and the memory left. present.py combines the prediction with what warm refreshes measure
(docs/device-state.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from monitors.placement import device_accelerator
from probes.accelerators import AcceleratorState
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
# A parallel kernel ends when its slowest thread does. Oversubscribed, a thread that shares its core
# loses whole time slices while its peers wait, so inference slows down more than fair sharing says:
# on a quiet 2-core machine, real models under 1, 2 and 4 busy processes ran 1.55-1.65x slower than
# the fair share (docs/device-state.md). The penalty grows with the threads that wait for the last one.
LOCKSTEP = 1.2


@dataclass(frozen=True)
class CpuPrediction:
    factor: float  # the predicted CPU slowdown
    contention: float  # ... the part of it from time slicing with other processes (cpu_contention)
    reasons: tuple[str, ...]  # why (local only: may carry figures)


QUIET = CpuPrediction(1.0, 1.0, ())  # what the signals predict for a device nothing contends for


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


def predict_cpu(state: DeviceState, threads: int) -> CpuPrediction:
    """The CPU slowdown the signals predict for `threads` intra-op threads, its share from time slicing, and why."""
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
    return CpuPrediction(min(factor, MAX_FACTOR), contention, tuple(reasons))


def predict_accelerator(acc: AcceleratorState, mem_available_bytes: int | None = None,
                        ) -> tuple[float, int | None, list[str]]:
    """Predicted slowdown of one accelerator, the memory a model can have on it, and why.

    As for the CPU, the load of others and the clocks: time slicing with other clients that keep it busy a
    share u of the time (its busy share less the agent's own clients': probes/accelerators.py) makes it
    1 + u slower; a software cap on its clock, max / cap; a clock the hardware holds down (thermal, power),
    max / actual, or UNSIZED_THROTTLING_FACTOR where the clock cannot size it. The memory left is its own
    free memory, or the system's available memory for one that shares it (an integrated GPU, an NPU)."""
    reasons: list[str] = []
    label = acc.kind
    factor = 1.0
    others = acc.others_busy
    if others:
        factor *= 1.0 + min(others, 1.0)
        if others >= 0.10:
            reasons.append(f"{label} {100 * others:.0f} % busy")
    clock = 1.0
    top, limit, actual = acc.clock_max_mhz, acc.clock_limit_mhz, acc.clock_mhz
    if top and limit and limit < 0.98 * top:
        clock = max(clock, top / limit)
        reasons.append(f"{label} clock capped at {limit:.0f} of {top:.0f} MHz")
    if acc.throttled:
        why = "thermal" if acc.thermal_throttling else "hardware" if acc.throttle_reasons == ("hardware",) else "power"
        if top and actual:
            if actual < top:
                clock = max(clock, top / actual)
                reasons.append(f"{label} {why} capping, clock {actual:.0f} of {top:.0f} MHz")
        else:
            clock = max(clock, UNSIZED_THROTTLING_FACTOR)
            reasons.append(f"{label} {why} capping")
    factor *= min(clock, MAX_CLOCK_FACTOR)
    free = acc.memory_free_bytes
    if free is None and acc.shares_system_memory:
        free = mem_available_bytes
    return min(factor, MAX_FACTOR), free, reasons


def predict_gpu(state: DeviceState) -> tuple[float | None, int | None, list[str]]:
    """Predicted slowdown of the estimator's `gpu` device (the accelerator its calibrated provider runs on:
    monitors/placement.py) and the memory a model can have there; None without one."""
    acc = device_accelerator("gpu", state.accelerators)
    if acc is None:
        return None, None, []
    return predict_accelerator(acc, state.memory.available_bytes)
