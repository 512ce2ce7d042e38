"""What storm-mm counts for its metrics (mm/metrics.py, served by mm/exporter.py): jobs started and ended, the
nodes' heartbeat and switch timings added up, the time its scheduling passes take. Pure: no clock, no I/O.

Counters count from this storm-mm's start, as Prometheus expects of a process's counters (its ``rate()`` and
``increase()`` take a restart for a reset). What the queue, the nodes and the processes are *now* is not
counted here but read from the Controller's state when a scrape asks (mm/metrics.py).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from storm.mm.protocol import TIMING_BOUNDS, SwitchTimings
from storm.mm.states import TERMINAL_STATES, JobState

# Scheduling passes: a few hundred microseconds for a short queue, tens of milliseconds for 10,000 queued
# jobs (storm bench scale), seconds only if something is wrong.
PASS_BOUNDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram:
    """Observations counted in buckets with the given upper bounds (a value equal to a bound is in its
    bucket, as Prometheus's ``le`` says), one more bucket above the last bound, and their sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("bucket bounds must be increasing")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """One observation; a negative one (clocks that disagree) counts as 0. O(log buckets)."""
        value = max(0.0, value)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add(self, counts: Sequence[int], total: float) -> None:
        """Observations counted elsewhere in the same buckets."""
        self.counts = list(map(operator.add, self.counts, counts))
        self.total += total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or under it) per bucket, the last one's bound infinite: the form
        Prometheus histograms take."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    def distribution(self) -> tuple[tuple[int, ...], float]:
        """(counts, sum) as a node reports them: ((), 0.0) when nothing was observed."""
        if not any(self.counts):
            return (), 0.0
        return tuple(self.counts), self.total


@dataclass
class Tally:
    """Jobs started (each run: a requeued job starts again), ended by their final state, and requeued."""

    started: int = 0
    requeued: int = 0
    ended: dict[JobState, int] = field(default_factory=lambda: dict.fromkeys(sorted(TERMINAL_STATES), 0))

    def end(self, state: JobState) -> None:
        self.ended[state] += 1


@dataclass
class _Seen:
    """What a node manager (one process: its epoch) last reported, to add only what grew since."""

    nm_epoch: str
    timings: SwitchTimings


class TimingTotals:
    """Every node's heartbeat and switch timings added up (SwitchTimings, in node_status).

    A node reports what it counted since it registered with this storm-mm, again and again: what grew since
    its last report is added, so a lost report costs nothing and no count is added twice. A node manager
    that restarted (another epoch) starts from zero, as does one whose counts went down. A distribution in
    other buckets than this MM's (a storm-nm of another version) is left out and counted in ``refused``.
    O(buckets) per report, one dict entry per node.
    """

    def __init__(self) -> None:
        self.delivery = Histogram(TIMING_BOUNDS)
        self.lateness = Histogram(TIMING_BOUNDS)
        self.duration = Histogram(TIMING_BOUNDS)
        self.late = 0
        self.skewed = 0
        self.refused = 0
        self._seen: dict[str, _Seen] = {}

    def report(self, node: str, nm_epoch: str, timings: SwitchTimings | None) -> None:
        if timings is None:
            return
        seen = self._seen.get(node)
        before = seen.timings if seen is not None and seen.nm_epoch == nm_epoch else _NOTHING
        if timings == before:
            return  # nothing happened since (a compare in C)
        grown = _grown(timings, before)
        if grown is None:  # some count went down: not the counts this MM saw grow, a fresh start
            before = _NOTHING
            grown = _grown(timings, before)
            assert grown is not None
        self.refused += sum(1 for counts, _ in timings.distributions() if counts and len(counts) != _BUCKETS)
        for histogram, (counts, total) in zip(
            (self.delivery, self.lateness, self.duration), grown, strict=True
        ):
            if counts:
                histogram.add(counts, total)
        self.late += timings.late - before.late
        self.skewed += timings.skewed - before.skewed
        self._seen[node] = _Seen(nm_epoch, timings)


_NOTHING = SwitchTimings()
_BUCKETS = len(TIMING_BOUNDS) + 1


def _grown(now: SwitchTimings, then: SwitchTimings) -> list[tuple[list[int], float]] | None:
    """Each distribution's growth since ``then`` (nothing for one in other buckets than this MM's), or None
    if any count went down. In C-level maps: a thousand nodes report."""
    if now.late < then.late or now.skewed < then.skewed:
        return None
    out: list[tuple[list[int], float]] = []
    for (new, new_sum), (old, old_sum) in zip(now.distributions(), then.distributions(), strict=True):
        if not new or len(new) != _BUCKETS:
            if old and not new:
                return None
            out.append(([], 0.0))
        elif not old:
            out.append((list(new), new_sum))
        elif len(old) != len(new):
            return None
        else:
            grown = list(map(operator.sub, new, old))
            if min(grown) < 0:
                return None
            out.append((grown, max(0.0, new_sum - old_sum)))
    return out
