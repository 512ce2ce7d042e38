"""How fast a parallel job runs on p processors: Amdahl's law and Downey's model.

A job's work is its service demand on one processor, in seconds; on p processors it takes
work / speedup(p) seconds, and its efficiency there is speedup(p) / p. Both models give speedup(1) = 1,
a speedup that never falls as p grows, and an efficiency that never rises: the property that adaptive
sizing relies on (a job uses processors best at its smallest allocation, Parsons and Sevcik section 5.1).

- :class:`Amdahl`: a sequential fraction s of the work runs on one processor, the rest on all p:
  speedup(p) = 1 / (s + (1 - s) / p). Parsons and Sevcik's workload has s = 0.001 for three jobs in four
  and s = 0.1 for the rest (their section 6.1).
- :class:`Downey`: Downey's model (A. B. Downey, "A model for speedup of parallel programs", UC Berkeley
  TR CSD-97-933, 1997), from a job's average parallelism A and the variance of its parallelism sigma.
  Speedup grows nearly linearly up to about A processors and is flat at A from A + A sigma - sigma (or
  2A - 1) on. The simulator's substitute for Naik, Setia and Squillante's unpublished speedup tables.

Pure: no I/O, no state; each call is O(1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class SpeedupModel(Protocol):
    """Anything that says how much faster a job runs on ``processors`` than on one."""

    def speedup(self, processors: float) -> float: ...


def efficiency(model: SpeedupModel, processors: float) -> float:
    """speedup(p) / p: the share of the p processors' time the job turns into work. O(1)."""
    return model.speedup(processors) / processors


def _check_processors(processors: float) -> None:
    # `not p >= 1` also refuses NaN.
    if not processors >= 1:
        raise ValueError(f"processors must be >= 1, not {processors}")


@dataclass(frozen=True)
class Amdahl:
    """Amdahl's law with sequential fraction ``sequential`` (0 = perfectly parallel, 1 = serial)."""

    sequential: float

    def __post_init__(self) -> None:
        if not 0 <= self.sequential <= 1:
            raise ValueError(f"the sequential fraction must be within [0, 1], not {self.sequential}")

    def speedup(self, processors: float) -> float:
        _check_processors(processors)
        return 1.0 / (self.sequential + (1.0 - self.sequential) / processors)


@dataclass(frozen=True)
class Downey:
    """Downey's speedup model: average parallelism ``parallelism`` (A >= 1) and ``variance`` (sigma >= 0).

    sigma <= 1 (low variance)::

        S(n) = A n / (A + sigma (n - 1) / 2)           1 <= n <= A
        S(n) = A n / (sigma (A - 1/2) + n (1 - sigma/2))  A <= n <= 2A - 1
        S(n) = A                                       n >= 2A - 1

    sigma >= 1 (high variance)::

        S(n) = n A (sigma + 1) / (sigma (n + A - 1) + A)   1 <= n <= A + A sigma - sigma
        S(n) = A                                            beyond

    The pieces meet where they change over, so S is continuous and never falls.
    """

    parallelism: float
    variance: float

    def __post_init__(self) -> None:
        if not self.parallelism >= 1:
            raise ValueError(f"the average parallelism must be >= 1, not {self.parallelism}")
        if not (self.variance >= 0 and math.isfinite(self.variance)):
            raise ValueError(f"the variance of parallelism must be >= 0, not {self.variance}")

    def speedup(self, processors: float) -> float:
        _check_processors(processors)
        a, sigma, n = self.parallelism, self.variance, processors
        if sigma <= 1:
            if n <= a:
                return a * n / (a + sigma * (n - 1) / 2)
            if n <= 2 * a - 1:
                return a * n / (sigma * (a - 0.5) + n * (1 - sigma / 2))
            return a
        if n <= a + a * sigma - sigma:
            return n * a * (sigma + 1) / (sigma * (n + a - 1) + a)
        return a
