"""Free PEs of one matrix row over future time, for conservative backfilling's reservations.

The profile is a step function: ``free[i]`` PEs are free from ``times[i]`` until ``times[i + 1]`` (the last
step lasts forever). It starts as what the running jobs' estimated ends promise; every reservation and every
job started takes its PEs off for its estimated run, so the profile only ever goes down. PEs are counted,
not named: a job that spans nodes can use free PEs wherever they are, so enough free PEs means it fits.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable


class FreeProfile:
    """Future free PEs of one row, from ``now`` on.

    ``n`` below is the number of steps: one per distinct estimated end of a running job, plus one per
    reservation or start made so far (its end; its start is always an existing step).
    """

    def __init__(self, now: float, free_now: int, releases: Iterable[tuple[float, int]]) -> None:
        """``free_now`` PEs are free at ``now``; each (time, pes) of ``releases`` frees pes more at time
        (one at or before ``now`` counts from ``now``, an infinite one never). O(r log r) for r releases."""
        self.times = [now]
        self.free = [free_now]
        for end, pes in sorted(releases):
            if end == math.inf:
                break
            if end <= self.times[-1]:
                self.free[-1] += pes
            else:
                self.times.append(end)
                self.free.append(self.free[-1] + pes)
        # Width -> the first time at which that many PEs were seen free. Free PEs only ever go down, so no
        # later search for that width can succeed earlier: the next one starts there.
        self._first: dict[int, float] = {}
        # (width, duration) -> the last earliest start found: for the same reason, no later search for the
        # same shape can succeed earlier. Queues repeat shapes (the same few widths and limits) often.
        self._found: dict[tuple[int, float], float] = {}

    def fits(self, start: float, duration: float, ranks: int) -> bool:
        """Whether ``ranks`` PEs stay free from the step ``start`` for ``duration``. O(steps covered)."""
        times, free = self.times, self.free
        end = start + duration
        i = bisect_left(times, start)
        while i < len(times) and times[i] < end:
            if free[i] < ranks:
                return False
            i += 1
        return True

    def earliest(self, ranks: int, duration: float) -> float:
        """The earliest step at which ``ranks`` PEs stay free for ``duration`` (``math.inf``: never, as
        far as the estimates tell). O(n) at worst; steps before the first with ``ranks`` free PEs that an
        earlier search for the same width saw, or before the start an earlier search for the same width and
        duration found, are not visited again."""
        times, free = self.times, self.free
        n = len(times)
        shape = (ranks, duration)
        first = self._first.get(ranks, times[0])
        begin = max(first, self._found.get(shape, times[0]))
        # Only a scan from the first step with enough PEs learns (or rules out) that step: one that starts
        # later, where an earlier search for this shape left off, skipped it.
        learns = begin == first
        i = bisect_left(times, begin)
        seen = False
        while i < n:
            if free[i] < ranks:
                i += 1
                continue
            if not seen:
                seen = True
                if learns:
                    self._first[ranks] = times[i]
            end = times[i] + duration
            j = i + 1
            while j < n and times[j] < end and free[j] >= ranks:
                j += 1
            if j == n or times[j] >= end:
                self._found[shape] = times[i]
                return times[i]
            i = j + 1  # every start up to step j would cover step j, which has too few
        if not seen and learns:
            self._first[ranks] = math.inf
        self._found[shape] = math.inf
        return math.inf

    def take(self, start: float, duration: float, ranks: int) -> None:
        """Take ``ranks`` PEs from the step ``start`` for ``duration`` (forever if infinite; nothing if
        ``start`` is infinite). O(n) for the new step's insertion, O(steps covered) for the counts."""
        if start == math.inf:
            return
        times, free = self.times, self.free
        i = bisect_left(times, start)
        end = start + duration
        k = len(times)
        if end != math.inf:
            k = bisect_left(times, end)
            if k == len(times) or times[k] != end:
                times.insert(k, end)
                free.insert(k, free[k - 1])
        for j in range(i, k):
            free[j] -= ranks

    def free_at(self, time: float) -> int:
        """Free PEs at ``time`` (>= the profile's start). O(log n)."""
        return self.free[bisect_right(self.times, time) - 1]
