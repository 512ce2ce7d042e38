"""A job with speedup: work, a size range and a speedup function, so that its runtime follows from its size.

``work`` is the job's service demand on one processor, in seconds; on p processors the job runs
``work / speedup(p)`` seconds. Sizes are counted in allocation units of ``processors_per_unit``
processors (Parsons and Sevcik's workstations stand for 8 processors each; Naik et al. allocate in units of
4): a job asks for between ``minimum`` and ``maximum`` units, ``desired`` is the size a rigid discipline
gives it. :class:`Progress` follows a job through allocations that change: what share of the work is left,
the processor time it acquired and the work it has done, so a test can check that work is conserved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from storm.mm.speedup import SpeedupModel, efficiency


@dataclass(frozen=True)
class JobSpec:
    """A job as it arrives (immutable). ``kind`` is the workload's label for it (speedup class, job class)."""

    job_id: int
    arrival: float
    work: float
    minimum: int
    desired: int
    maximum: int
    speedup: SpeedupModel
    kind: str = ""
    tagged: bool = True  # counted in the results (Parsons and Sevcik measure the first 200 jobs only)

    def __post_init__(self) -> None:
        if not (1 <= self.minimum <= self.desired <= self.maximum):
            raise ValueError(
                f"job {self.job_id}: sizes must satisfy 1 <= minimum <= desired <= maximum, not "
                f"{self.minimum}/{self.desired}/{self.maximum}"
            )
        if not (self.work > 0 and math.isfinite(self.work)):
            raise ValueError(f"job {self.job_id}: work must be positive, not {self.work}")

    def runtime(self, units: int, processors_per_unit: int) -> float:
        """Seconds the whole job takes on ``units`` units, uninterrupted. O(1)."""
        return self.work / self.speedup.speedup(units * processors_per_unit)

    def area(self, units: int, processors_per_unit: int) -> float:
        """Processor-seconds the whole job occupies on ``units`` units: work / efficiency. O(1)."""
        return self.work / efficiency(self.speedup, units * processors_per_unit)


class Progress:
    """How far a job has got: the share of its work left, its acquired processor time and its work done.

    :meth:`run` accounts for ``seconds`` spent computing on ``processors`` processors; the job's work
    done grows by seconds x speedup(processors), so the share left falls by that over the work.
    """

    __slots__ = ("acquired", "done", "job", "remaining")

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.remaining = 1.0
        self.acquired = 0.0  # processor-seconds
        self.done = 0.0  # work-seconds done

    def rate(self, processors: int) -> float:
        """Share of the work done per second on ``processors``."""
        return self.job.speedup.speedup(processors) / self.job.work

    def run(self, seconds: float, processors: int) -> None:
        if seconds <= 0:
            return
        self.acquired += seconds * processors
        self.done += seconds * self.job.speedup.speedup(processors)
        self.remaining = max(0.0, self.remaining - seconds * self.rate(processors))

    def time_left(self, processors: int) -> float:
        """Seconds to finish on ``processors``, uninterrupted."""
        return self.remaining / self.rate(processors)
