"""What one client may learn of the device's speed through the tiers (docs/security.md, "Probing").

A tier is coarse on purpose, but a client that asks about models of many sizes finds where the answer flips
and reads the device's throughput from it, and its live load from where the flip moves. As W3C Compute
Pressure does for its states, two rules blur that, both pure here (the agent holds their state):

- **Boundary jitter.** Each client sees each tier boundary moved by a random fraction (within `jitter`),
  drawn from keyed hashes of the period and the client: fixed for the period, so asking again and again
  returns the same answers and averages nothing out; different for every client and period. Half of it is
  the device's for the period, the same for every client: many client names asking in one period average
  out only their own halves, and still see the boundary off by up to `jitter / 2`.
  The latency a client is answered about is warped so that its moved boundaries fall on the contract's
  (`Warp`): tiers, and deadlines a request names, shift together and stay monotone in the latency.
- **Hysteresis on the live speed.** Answers are priced at a held slow-down that follows the live one only
  when the two differ by more than `hysteresis` (`held_speed`): load changes smaller than that never show.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass, replace

from monitors.pricing.tiers import TIERS, tier_for
from monitors.speed.present import Speed

BOUNDS_MS: tuple[float, ...] = tuple(bound for _, bound in TIERS if math.isfinite(bound))
MAX_JITTER = 0.25  # beyond this, neighbouring boundaries (30 s and 60 s) could swap


@dataclass(frozen=True)
class PrivacyRules:
    """The rules' settings (the `[privacy]` config section)."""

    jitter: float = 0.20  # each boundary moved by up to this fraction, per client and period
    period_s: float = 86400.0  # how long one client's moved boundaries hold
    hysteresis: float = 0.10  # the priced slow-down moves only when the live one is this far from it

    def __post_init__(self) -> None:
        if not 0 <= self.jitter <= MAX_JITTER:
            raise ValueError(f"jitter must be 0 to {MAX_JITTER}, not {self.jitter!r}")
        if not self.period_s > 0:
            raise ValueError(f"period_s must be positive, not {self.period_s!r}")
        if not 0 <= self.hysteresis < 1:
            raise ValueError(f"hysteresis must be 0 to below 1, not {self.hysteresis!r}")


@dataclass(frozen=True)
class Warp:
    """One client's view: its moved boundaries (`moved[i]` is where it sees `BOUNDS_MS[i]`)."""

    moved: tuple[float, ...] = BOUNDS_MS

    def shown_ms(self, latency_ms: float) -> float:
        """The latency as this client is answered about it: its moved boundaries map onto the contract's,
        log-linear between them, one factor beyond the ends. Monotone; 0 and inf stay put."""
        if not latency_ms > 0 or math.isinf(latency_ms):
            return latency_ms
        moved, bounds = self.moved, BOUNDS_MS
        if latency_ms <= moved[0]:
            return latency_ms * bounds[0] / moved[0]
        if latency_ms >= moved[-1]:
            return latency_ms * bounds[-1] / moved[-1]
        i = next(k for k in range(len(moved) - 1) if latency_ms < moved[k + 1])
        t = math.log(latency_ms / moved[i]) / math.log(moved[i + 1] / moved[i])
        return math.exp(math.log(bounds[i]) + t * math.log(bounds[i + 1] / bounds[i]))

    def tier(self, latency_ms: float) -> str:
        return tier_for(self.shown_ms(latency_ms))


def period_of(now: float, rules: PrivacyRules) -> int:
    """Which period `now` (seconds since the epoch) falls in."""
    return math.floor(now / rules.period_s)


def warp_for(secret: bytes, client: str, period: int, rules: PrivacyRules) -> Warp:
    """The client's moved boundaries for the period: 1 + jitter * (u_device + u_client) / 2, each u uniform in
    [-1, 1) from HMAC-SHA256 keyed with the agent's secret."""
    if rules.jitter == 0:
        return Warp()
    device = _uniforms(secret, f"device\0{period}")
    own = _uniforms(secret, f"client\0{client}\0{period}")
    return Warp(tuple(bound * (1 + rules.jitter * (d + c) / 2)
                      for bound, d, c in zip(BOUNDS_MS, device, own, strict=True)))


def _uniforms(secret: bytes, what: str) -> list[float]:
    """One number uniform in [-1, 1) per boundary, from the keyed hash of `what`."""
    digest = hmac.new(secret, what.encode(), hashlib.sha256).digest()
    return [int.from_bytes(digest[4 * i:4 * i + 4], "big") / 2**32 * 2 - 1 for i in range(len(BOUNDS_MS))]


def hold(held: float | None, live: float, margin: float) -> float:
    """The held slow-down: the live one when it is more than `margin` (a fraction) away, else the held."""
    if held is None or not math.isfinite(held) or not math.isfinite(live):
        return live
    return held if held / (1 + margin) <= live <= held * (1 + margin) else live


def held_speed(held: Speed | None, live: Speed, margin: float) -> Speed:
    """The speed answers are priced at: the live one, with its slow-downs held by `hold`."""
    if held is None:
        return live
    return replace(live, cpu=hold(held.cpu, live.cpu, margin),
                   gpu=None if live.gpu is None else hold(held.gpu, live.gpu, margin))
