"""Learning from real runs (WARM): a bounded correction of one workload's estimate, from the latencies its app
measured running it on this device.

Each report is reduced to one figure: log(median measured / the agent's estimate at that moment), kept with
where it was learnt (the log of the estimate's present multiplier then), when, and how much it weighs (a
report of FULL_REPORT runs or more weighs one; of fewer, in proportion: one stray run is not a measurement).
The correction is the weighted median of the kept figures, each weighing less the further the device's
present state is from the one it was learnt in (a Gaussian in log multiplier) and the older it is (a
half-life), shrunk toward no correction by a prior worth PRIOR_WEIGHT reports, and bounded. So one wild run
moves little, two consistent reports halve the error, twenty remove nearly all of it, and what was learnt at
rest fades as the device gets busy. Pure: the caller passes the times; nothing learnt leaves the device.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_REPORTS = 64  # kept per workload: the newest
MAX_LATENCIES = 1000  # in one report
FULL_REPORT = 10  # runs in a report that weighs one
PRIOR_WEIGHT = 2.0  # reports' worth of trust in the estimate itself
MAX_LOG_CORRECTION = math.log(3.0)  # no report makes an estimate more than 3x slower or faster
STATE_WIDTH = 0.35  # in log multiplier: a report learnt at 1.0x weighs e^-1/2 at 1.42x, e^-2 at 2x
HALF_LIFE_S = 6 * 3600.0


@dataclass(frozen=True)
class Report:
    log_ratio: float  # log(median measured / estimated then)
    log_speed: float  # log of the estimate's multiplier then: where it was learnt
    at: float  # wall clock, seconds since the epoch
    weight: float = 1.0  # runs in it / FULL_REPORT, at most 1


def reduce(latencies_ms: Sequence[float], estimate_ms: float, multiplier: float, at: float) -> Report:
    """One report from an app's measured latencies of one workload; ValueError on nonsense."""
    values = [float(v) for v in latencies_ms]
    if not values or len(values) > MAX_LATENCIES:
        raise ValueError(f"a report holds 1 to {MAX_LATENCIES} latencies")
    if not all(math.isfinite(v) and 0.0 < v < 3.6e6 for v in values):
        raise ValueError("latencies are positive milliseconds, under an hour")
    if not (math.isfinite(estimate_ms) and estimate_ms > 0 and math.isfinite(multiplier) and multiplier > 0):
        raise ValueError("no finite estimate to learn against")
    return Report(math.log(statistics.median(values) / estimate_ms), math.log(multiplier), at,
                  min(1.0, len(values) / FULL_REPORT))


@dataclass
class Learnt:
    """What one workload's reports taught."""

    reports: deque[Report] = field(default_factory=lambda: deque(maxlen=MAX_REPORTS))

    def add(self, report: Report) -> None:
        self.reports.append(report)

    def correction(self, multiplier: float, now: float) -> float:
        """The log-correction to apply to the estimate now, at the estimate's present `multiplier`."""
        if not self.reports or not (math.isfinite(multiplier) and multiplier > 0):
            return 0.0
        here = math.log(multiplier)
        weighted = [(r.log_ratio, r.weight * 0.5 ** (max(0.0, now - r.at) / HALF_LIFE_S)
                     * math.exp(-0.5 * ((here - r.log_speed) / STATE_WIDTH) ** 2)) for r in self.reports]
        total = sum(w for _, w in weighted)
        if total <= 0.0:
            return 0.0
        shrunk = weighted_median(weighted) * total / (total + PRIOR_WEIGHT)
        return max(-MAX_LOG_CORRECTION, min(MAX_LOG_CORRECTION, shrunk))

    def to_json(self) -> list[list[float]]:
        return [[r.log_ratio, r.log_speed, r.at, r.weight] for r in self.reports]

    @classmethod
    def from_json(cls, data: Any) -> Learnt:
        """Raises ValueError on anything malformed."""
        if not isinstance(data, list):
            raise ValueError("reports must be a list")
        learnt = cls()
        for item in data[-MAX_REPORTS:]:
            values = [float(v) for v in item]
            if len(values) != 4 or not all(math.isfinite(v) for v in values) or abs(values[0]) > 20 \
                    or not 0 < values[3] <= 1:
                raise ValueError("a report is [log ratio, log multiplier, time, weight]")
            learnt.add(Report(*values))
        return learnt


def weighted_median(pairs: Iterable[tuple[float, float]]) -> float:
    """The value at half the total weight, (value, weight) pairs."""
    ordered = sorted(pairs)
    half = sum(w for _, w in ordered) / 2.0
    seen = 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]
