"""Per-client limits: a token bucket per key (a client's uid), and a throttle for log lines about bad input.

Pure: every call takes the current time, so the rules are tested without sleeping and the daemons decide
nothing here.

A bucket holds at most ``burst`` tokens and gains ``rate`` per second; each submission takes one. A user may
therefore submit a burst of ``burst`` jobs at once (a job array, a script's loop) and then ``rate`` per
second for as long as they like, but no single user can flood the MM's queue and store faster than that.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float  # tokens gained per second
    burst: float  # the most tokens it holds (and holds at first)
    tokens: float = math.nan  # nan: full
    last: float = math.nan  # when ``tokens`` was last brought up to date

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        if math.isnan(self.tokens):
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if not math.isnan(self.last) and now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        if math.isnan(self.last) or now > self.last:
            self.last = now  # a clock that stepped back gains nothing and loses nothing

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens if there are that many; False (and nothing taken) if not."""
        self._refill(now)
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def wait(self, now: float, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens will be there (0 if they are now)."""
        self._refill(now)
        if cost > self.burst:
            return math.inf
        return max(0.0, (cost - self.tokens) / self.rate)

    def full(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= self.burst


class RateLimits:
    """One token bucket per client, created on first use. ``rate`` 0 turns the limit off.

    Buckets that have filled up again are dropped (a full bucket is what a new one would be), so the table
    holds only clients that submitted recently, however many there have been.
    """

    PRUNE_EVERY = 1024  # calls between sweeps of the table

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, max(1.0, burst)
        self.buckets: dict[Hashable, TokenBucket] = {}
        self._calls = 0

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def allow(self, key: Hashable, now: float, cost: float = 1.0) -> float:
        """0.0 if ``key`` may go ahead now (a token is taken), else the seconds it should wait."""
        if not self.enabled:
            return 0.0
        self._calls += 1
        if self._calls % self.PRUNE_EVERY == 0:
            self.buckets = {k: b for k, b in self.buckets.items() if not b.full(now)}
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TokenBucket(self.rate, self.burst, last=now)
        if bucket.take(now, cost):
            return 0.0
        return max(bucket.wait(now, cost), 1e-3)


class LogThrottle:
    """At most ``burst`` log lines at once and ``rate`` per second per kind of line, then a count.

    A peer sending garbage as fast as it can would otherwise fill the disk with one warning per message.
    ``allow`` answers whether to log now, and how many lines of that kind were held back since the last one.
    """

    def __init__(self, rate: float = 1.0, burst: float = 10.0) -> None:
        self.limits = RateLimits(rate, burst)
        self.suppressed: dict[Hashable, int] = {}

    def allow(self, kind: Hashable, now: float) -> tuple[bool, int]:
        if self.limits.allow(kind, now) > 0:
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            return False, 0
        return True, self.suppressed.pop(kind, 0)

    def warning(self, logger: logging.Logger, kind: Hashable, now: float, text: str, *args: object) -> None:
        """``logger.warning(text, *args)`` unless lines of this kind come too fast."""
        go, held = self.allow(kind, now)
        if go:
            if held:
                text += " (%d similar line(s) not logged)"
                args = (*args, held)
            logger.warning(text, *args)
