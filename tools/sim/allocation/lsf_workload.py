"""Parsons and Sevcik's workload (JSSPP 1997, section 6.1), and what we assumed where the paper is silent.

Poisson arrivals; per job, drawn in this order from one seeded RNG (so every discipline sees the same jobs,
as the paper's section 6.1 says, and job i is the same however many jobs a run consumes):

- service demand (work on one processor, s): hyperexponential with mean 8,000 s and CV 4. The paper gives
  the mean, the CV and the quartiles 1,230 / 2,985 / 6,100 s, not the phases; the two-phase fit with
  balanced means (each phase carries half the mean) has p = (1 + sqrt((c^2 - 1)/(c^2 + 1))) / 2 = 0.96967,
  phase means 4,125 s and 131,875 s, and its quartiles are 1,228 / 2,984 / 6,099 s, within 2 s of the
  paper's (:func:`h2_quantile`; a test holds them there);
- minimum size: uniform over 1..16 workstations (8..128 processors); maximum 16; desired (the rigid size)
  uniform over [minimum, 16];
- speedup: Amdahl, sequential fraction 0.001 for 75% of jobs ("good": S(128) = 113.6, the paper's "114")
  and 0.1 for the rest ("poor": S(16) = 6.4, S(128) = 9.3, and 58.8% efficiency on 8 processors, the
  paper's "58%"; the paper's "6.4 on 8 processors" fits 16). Drawn independently of size and demand:
  the paper does not correlate them.
- arrivals: exponential gaps of mean 1/lambda, the first job at time 0. The paper gives no rate ("a
  moderately-heavy load"); 1/300 per second puts 200 arrivals in about 60,000 s, in line with its minimum
  makespan of 65,412 s, for an offered load of 0.57 (every job at its minimum size) to 0.73 (rigid sizes).

The first ``tagged`` jobs (200) are measured; jobs keep arriving after them until every tagged job is gone,
so the tagged jobs see a steady load to the end (the paper does not say; :func:`assumptions`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from storm.mm.speedup import Amdahl
from storm.tools.sim.allocation.jobs import JobSpec

UNITS = 16  # workstations
PROCESSORS_PER_UNIT = 8
PAPER_QUARTILES = (1230.0, 2985.0, 6100.0)
PAPER_MIN_MAKESPAN = 65412.0


@dataclass(frozen=True)
class LsfWorkload:
    """The workload's parameters; the defaults are the paper's, or ours where it gives none."""

    mean_demand: float = 8000.0
    cv: float = 4.0
    rate: float = 1 / 300  # arrivals per second (ours)
    good_share: float = 0.75
    good_sequential: float = 0.001
    poor_sequential: float = 0.1
    units: int = UNITS
    tagged: int = 200

    def __post_init__(self) -> None:
        if not (self.mean_demand > 0 and self.cv >= 1 and self.rate > 0):
            raise ValueError("mean demand and rate must be positive and the CV at least 1 (hyperexponential)")
        if not 0 <= self.good_share <= 1 or self.units < 1 or self.tagged < 1:
            raise ValueError("good_share within [0, 1], units and tagged at least 1")

    def phases(self) -> tuple[float, float, float]:
        """The balanced-means H2 fit: (p, mean of phase 1, mean of phase 2)."""
        c2 = self.cv * self.cv
        p = 0.5 * (1 + math.sqrt((c2 - 1) / (c2 + 1)))
        return p, self.mean_demand / (2 * p), self.mean_demand / (2 * (1 - p))

    def jobs(self, seed: int) -> Iterator[JobSpec]:
        """The job stream for ``seed``, without end (the simulator stops taking jobs when it is done)."""
        rng = random.Random(seed)
        p, mean1, mean2 = self.phases()
        clock = 0.0
        job_id = 0
        while True:
            mean = mean1 if rng.random() < p else mean2
            work = rng.expovariate(1 / mean)
            minimum = rng.randint(1, self.units)
            desired = rng.randint(minimum, self.units)
            good = rng.random() < self.good_share
            sequential = self.good_sequential if good else self.poor_sequential
            yield JobSpec(
                job_id, clock, max(work, 1e-6), minimum, desired, self.units, Amdahl(sequential),
                "good" if good else "poor", job_id < self.tagged,
            )  # fmt: skip
            clock += rng.expovariate(self.rate)
            job_id += 1

    def offered_load(self) -> tuple[float, float]:
        """Expected processor occupancy per second over the machine's processors, with every job at its
        minimum size and at its rigid desired size (the two ends of what a discipline can do). Exact
        expectations over the size and speedup draws. O(units^2)."""
        processors = self.units * PROCESSORS_PER_UNIT
        at_min = at_desired = 0.0
        for sequential, share in (
            (self.good_sequential, self.good_share),
            (self.poor_sequential, 1 - self.good_share),
        ):
            model = Amdahl(sequential)
            for minimum in range(1, self.units + 1):
                # area of a job of work w on p processors: w x p / S(p) = w (s p + 1 - s) for Amdahl.
                weight = share / self.units
                at_min += weight * _area_factor(model, minimum * PROCESSORS_PER_UNIT)
                for desired in range(minimum, self.units + 1):
                    at_desired += (
                        weight
                        / (self.units - minimum + 1)
                        * _area_factor(model, desired * PROCESSORS_PER_UNIT)
                    )
        scale = self.rate * self.mean_demand / processors
        return at_min * scale, at_desired * scale


def _area_factor(model: Amdahl, processors: int) -> float:
    return processors / model.speedup(processors)


def h2_quantile(workload: LsfWorkload, q: float) -> float:
    """The q-quantile of the fitted H2 demand, by bisection on its CDF. O(60)."""
    p, mean1, mean2 = workload.phases()

    def cdf(x: float) -> float:
        return p * (1 - math.exp(-x / mean1)) + (1 - p) * (1 - math.exp(-x / mean2))

    low, high = 0.0, 100 * workload.mean_demand
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < q else (low, mid)
    return (low + high) / 2


def tagged_jobs(workload: LsfWorkload, seed: int) -> list[JobSpec]:
    """The measured jobs of ``seed``'s stream."""
    stream = workload.jobs(seed)
    return [next(stream) for _ in range(workload.tagged)]


def makespan_bound(jobs: Sequence[JobSpec], dispatch_s: float, processors_per_unit: int, units: int) -> float:
    """A lower bound on the makespan of ``jobs`` (the tagged ones) under any discipline with a dispatch
    delay of ``dispatch_s``: the largest of (a) each job's arrival + dispatch + its runtime on every
    processor, and (b) for each arrival time t, t + the least processor time the jobs arriving from t on
    need (each at its minimum size, where it is most efficient) / the processors. Other jobs only add to
    it. O(n log n)."""
    if not jobs:
        return 0.0
    path = max(j.arrival + dispatch_s + j.runtime(j.maximum, processors_per_unit) for j in jobs)
    capacity = units * processors_per_unit
    ordered = sorted(jobs, key=lambda j: j.arrival)
    area = 0.0
    best = 0.0
    for job in reversed(ordered):
        area += job.area(job.minimum, processors_per_unit)
        best = max(best, job.arrival + dispatch_s + area / capacity)
    return max(path, best)


def assumptions(workload: LsfWorkload) -> list[str]:
    """What the workload assumes where the paper is silent or garbled, with the figures it implies."""
    p, mean1, mean2 = workload.phases()
    quartiles = " / ".join(f"{h2_quantile(workload, q):,.0f}" for q in (0.25, 0.5, 0.75))
    at_min, at_desired = workload.offered_load()
    poor = Amdahl(workload.poor_sequential)
    return [
        f"Service demand: the balanced-means two-phase hyperexponential with mean "
        f"{workload.mean_demand:,.0f} s and CV {workload.cv:g} (p = {p:.5f}, phase means {mean1:,.1f} s and "
        f"{mean2:,.1f} s); its quartiles are {quartiles} s against the paper's 1,230 / 2,985 / 6,100 s.",
        f"Arrival rate: 1/{1 / workload.rate:,.0f} per second (the paper says only 'moderately heavy'): "
        f"{workload.tagged} arrivals span about {workload.tagged / workload.rate:,.0f} s, as its minimum "
        f"makespan of 65,412 s suggests; offered load {at_min:.2f} with every job at its minimum size, "
        f"{at_desired:.2f} at its rigid desired size.",
        f"Poor speedup: Amdahl with sequential fraction {workload.poor_sequential:g} (S(16) = "
        f"{poor.speedup(16):.1f}, S(128) = {poor.speedup(128):.1f}, {poor.speedup(8) / 8:.1%} efficiency on "
        "8 processors); the paper's '6.4 on 8 processors' is read as 16. Speedup class, size and demand are "
        "drawn independently.",
        f"Jobs keep arriving after the {workload.tagged} tagged ones until all of those have left; only the "
        "tagged ones are measured.",
    ]
