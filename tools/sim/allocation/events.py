"""The simulators' event queue: events at equal times come out in a stated order.

An event is (time, kind, job id, token). Events at one instant come out by kind (the simulator's own order
of kinds, smaller first), then by job id, then in the order they were pushed: a run never depends on how
the heap breaks ties. ``token`` lets a simulator recognise an event it has since cancelled (a job's end
that a preemption moved): it keeps each job's current token and ignores events carrying an older one.
"""

from __future__ import annotations

import heapq
import itertools


class EventQueue:
    """A heap of (time, kind, job id, sequence, token). push and pop are O(log n)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._sequence = itertools.count()

    def push(self, time: float, kind: int, job_id: int = -1, token: int = 0) -> None:
        heapq.heappush(self._heap, (time, kind, job_id, next(self._sequence), token))

    def pop(self) -> tuple[float, int, int, int]:
        time, kind, job_id, _, token = heapq.heappop(self._heap)
        return time, kind, job_id, token

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
