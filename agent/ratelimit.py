"""Each client's request budget: a token bucket per owner (docs/security.md "Probing").

A request answered with a tier or a boolean (estimate, meets, monitors/create) takes a token from its
owner's bucket; an empty bucket gets the error answer `rate_limited` with the seconds until the next token,
and nothing of the request is read or priced (the bucket is checked before its payload is parsed). The
buckets are the agent's only per-client state: at most `max_clients` of them, the longest unseen forgotten
first (a forgotten client starts full again, as a new one does), so memory stays bounded whatever names
clients use.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from monitors.errors import BadInput

PRICED_METHODS = ("estimate", "meets", "monitors/create")  # what tells a client something of the device's speed


class RateLimited(BadInput):
    """An over-budget request: answered `rate_limited`, with when to come back."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many requests from this client; retry in {retry_after_s} s", "rate_limited")
        self.retry_after_s = retry_after_s


@dataclass
class Bucket:
    tokens: float
    at: float  # when `tokens` was counted (monotonic seconds)


class ClientBudgets:
    """Token buckets by owner: `burst` at once, refilled at `per_minute`."""

    def __init__(self, burst: int, per_minute: float, max_clients: int) -> None:
        self.burst = float(burst)
        self.per_s = per_minute / 60.0
        self.max_clients = max_clients
        self._buckets: collections.OrderedDict[str, Bucket] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, owner: str, now: float) -> None:
        """Raises RateLimited when `owner`'s bucket is empty now, taking nothing: asked before a request's
        payload is read, so that an over-budget client costs the agent no parsing."""
        bucket = self._buckets.get(owner)
        if bucket is None:
            return
        tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.at) * self.per_s)
        if tokens < 1.0:
            raise RateLimited(max(1, math.ceil((1.0 - tokens) / self.per_s)))

    def take(self, owner: str, now: float) -> None:
        """One request of `owner`'s at `now`; raises RateLimited when its bucket is empty."""
        bucket = self._buckets.pop(owner, None) or Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.at) * self.per_s)
        bucket.at = now
        self._buckets[owner] = bucket  # the most recently seen last
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0:
            raise RateLimited(max(1, math.ceil((1.0 - bucket.tokens) / self.per_s)))
        bucket.tokens -= 1.0
