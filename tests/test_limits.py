"""Per-client limits: the token bucket, the table of buckets and the log throttle, with time passed in."""

from __future__ import annotations

import logging
import math

import pytest

from storm.mm.limits import LogThrottle, RateLimits, TokenBucket


def test_a_bucket_starts_full_and_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.wait(100.0) == pytest.approx(0.5)  # one token comes every 1/rate seconds
    assert not bucket.take(100.4)
    assert bucket.take(100.5)
    assert not bucket.take(100.5)


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=2, last=0.0)
    assert bucket.full(1e6)
    assert [bucket.take(1e6) for _ in range(3)] == [True, True, False]


def test_a_clock_stepping_back_gives_nothing_and_takes_nothing() -> None:
    bucket = TokenBucket(rate=1.0, burst=2, last=50.0)
    assert bucket.take(50.0) and bucket.take(50.0)
    assert not bucket.take(10.0)  # 40 s earlier: no tokens for time that did not pass
    assert not bucket.take(50.5)
    assert bucket.take(51.0)  # refilled from the newest time seen, not from the step


def test_a_cost_larger_than_the_burst_can_never_be_paid() -> None:
    bucket = TokenBucket(rate=1.0, burst=2)
    assert not bucket.take(0.0, cost=3)
    assert bucket.wait(0.0, cost=3) == math.inf
    assert bucket.tokens == 2  # a refused take costs nothing


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 5.0), (-1.0, 5.0), (1.0, 0.5)])
def test_a_bucket_needs_a_positive_rate_and_room_for_one(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        TokenBucket(rate=rate, burst=burst)


def test_rate_limits_are_per_client() -> None:
    limits = RateLimits(rate=1.0, burst=2)
    assert [limits.allow(1000, 0.0) for _ in range(2)] == [0.0, 0.0]
    assert limits.allow(1000, 0.0) == pytest.approx(1.0)  # uid 1000 must wait a second...
    assert limits.allow(1001, 0.0) == 0.0  # ... while uid 1001 is not held back by it
    assert limits.allow(1000, 0.25) == pytest.approx(0.75)
    assert limits.allow(1000, 1.0) == 0.0


def test_rate_zero_turns_the_limit_off() -> None:
    limits = RateLimits(rate=0.0, burst=1)
    assert not limits.enabled
    assert all(limits.allow(0, 0.0) == 0.0 for _ in range(10_000))
    assert limits.buckets == {}


def test_idle_clients_are_forgotten() -> None:
    limits = RateLimits(rate=100.0, burst=1)
    for uid in range(RateLimits.PRUNE_EVERY - 1):
        limits.allow(uid, 0.0)
    assert len(limits.buckets) == RateLimits.PRUNE_EVERY - 1
    limits.allow(-1, 10.0)  # every bucket has long filled up again: only the newest client remains
    assert list(limits.buckets) == [-1]
    assert limits.allow(5, 10.0) == 0.0  # a forgotten client starts again with a full bucket


def test_the_log_throttle_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    throttle = LogThrottle(rate=1.0, burst=2)
    logger = logging.getLogger("test.limits")
    with caplog.at_level(logging.WARNING, logger="test.limits"):
        for i in range(50):
            throttle.warning(logger, "garbage", 0.0, "bad message %d", i)
        throttle.warning(logger, "other", 0.0, "another kind")
        throttle.warning(logger, "garbage", 1.0, "bad message %d", 50)
    assert [r.getMessage() for r in caplog.records] == [
        "bad message 0",
        "bad message 1",
        "another kind",  # kinds have separate budgets
        "bad message 50 (48 similar line(s) not logged)",
    ]
