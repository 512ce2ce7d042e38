"""Naik, Setia and Squillante's workload (SC'93, sections 2.1-2.2, Table 1), with a substitute speedup model.

512 processors allocated in units of 4, Min_sys = 32. Poisson arrivals at rate lambda; each job is small,
medium or large with probabilities in the ratio 320 : 8 : 1, then one of its class's applications,
uniformly:

| class | apps | Req (PEs) | mean s | min s | max s |
| small | 15 | 32 | 412 | 4 | 2,532 |
| medium | 4 | 128 | 4,545 | 1,589 | 7,698 |
| large | 4 | 128 | 33,771 | 18,468 | 48,688 |

The paper's per-application tables of execution time against processors (its references 9 and 14) are not
published, so two things are ours (:func:`assumptions` says so in every report):

- each application's time on Req processors: a class's apps spread between Table 1's min and max as
  t_i = min x (max/min)^(u_i^g), u_i = i/(n-1), with the bend g solved so that their mean is Table 1's
  average (:func:`spread`); so the table's min, max and mean hold exactly;
- speedup: Downey's model with average parallelism A = Req and sigma = 2/3 for every application. With
  sigma = 2/3 the product speedup x efficiency (Eager, Zahorjan and Lazowska's processor working set, the
  usual "most efficient size") peaks at n = A, i.e. at Req (a test checks it), which is how the paper
  chose Req ("from the efficiency curves"); efficiency there is 0.75, and speedup levels off at A from
  2A - 1 processors. An application's work is its time on Req processors times S(Req).

Jobs are drawn in job order from one seeded RNG: the gap to the next arrival, the class, the application.
A job asks for min = Min_sys, desired = Req and max = 512 processors (in units of 4); the U metric divides
a job's response by its time on Req processors.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from storm.mm.speedup import Downey
from storm.tools.sim.allocation.jobs import JobSpec

PROCESSORS = 512
UNIT = 4  # processors per allocation unit
UNITS = PROCESSORS // UNIT
MIN_SYS = 32  # processors
CLASSES = ("small", "medium", "large")
RATIO = (320, 8, 1)
TABLE1 = {  # apps, Req processors, mean, min, max seconds
    "small": (15, 32, 412.0, 4.0, 2532.0),
    "medium": (4, 128, 4545.0, 1589.0, 7698.0),
    "large": (4, 128, 33771.0, 18468.0, 48688.0),
}
SIGMA = 2 / 3


def spread(count: int, low: float, high: float, mean: float) -> list[float]:
    """``count`` values from ``low`` to ``high`` (both included) whose mean is ``mean``:
    low x (high/low)^(u^g) at u = 0, 1/(count-1), ..., 1, g found by bisection on log g. O(count x 200)."""
    if count == 1:
        return [mean]
    if not low < mean < high:
        raise ValueError("the mean must lie between the min and the max")

    def values(g: float) -> list[float]:
        return [low * (high / low) ** ((i / (count - 1)) ** g) for i in range(count)]

    lo, hi = -20.0, 20.0  # log g; the mean falls as g grows
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(values(2.0**mid)) / count > mean:
            lo = mid
        else:
            hi = mid
    return values(2.0 ** ((lo + hi) / 2))


@dataclass(frozen=True)
class Application:
    name: str
    kind: str
    req_processors: int
    time_at_req: float
    speedup: Downey

    @property
    def work(self) -> float:
        return self.time_at_req * self.speedup.speedup(self.req_processors)


def applications(sigma: float = SIGMA) -> dict[str, list[Application]]:
    """The 23 applications, per class."""
    out: dict[str, list[Application]] = {}
    for kind, (count, req, mean, low, high) in TABLE1.items():
        out[kind] = [
            Application(f"{kind}-{i}", kind, req, t, Downey(req, sigma))
            for i, t in enumerate(spread(count, low, high, mean))
        ]
    return out


@dataclass(frozen=True)
class NaikWorkload:
    """The job stream's recipe: the arrival rate (jobs/s) and the class ratio."""

    rate: float = 0.007
    ratio: tuple[int, int, int] = RATIO
    sigma: float = SIGMA

    def probabilities(self) -> tuple[float, ...]:
        total = sum(self.ratio)
        return tuple(r / total for r in self.ratio)

    def job(self, job_id: int, arrival: float, app: Application) -> JobSpec:
        return JobSpec(
            job_id,
            arrival,
            app.work,
            MIN_SYS // UNIT,
            app.req_processors // UNIT,
            UNITS,
            app.speedup,
            app.kind,
        )

    def jobs(self, seed: int) -> Iterator[JobSpec]:
        """Jobs without end; the first arrives after one gap from time 0."""
        rng = random.Random(seed)
        apps = applications(self.sigma)
        weights = self.probabilities()
        clock = 0.0
        job_id = 0
        while True:
            clock += rng.expovariate(self.rate)
            kind = rng.choices(CLASSES, weights)[0]
            yield self.job(job_id, clock, rng.choice(apps[kind]))
            job_id += 1

    def offered_load(self) -> float:
        """lambda x E[Req x time at Req] / 512: the utilisation if every job ran at its Req."""
        apps = applications(self.sigma)
        area = sum(
            p * sum(a.req_processors * a.time_at_req for a in apps[kind]) / len(apps[kind])
            for kind, p in zip(CLASSES, self.probabilities(), strict=True)
        )
        return self.rate * area / PROCESSORS


def assumptions(sigma: float = SIGMA) -> list[str]:
    apps = applications(sigma)
    times = "; ".join(
        f"{kind}: " + ", ".join(f"{a.time_at_req:,.0f}" for a in apps[kind]) for kind in CLASSES
    )
    s = Downey(128, sigma)
    return [
        f"Application times on Req processors (ours; Table 1's min, max and mean hold): {times} s.",
        f"Speedup (ours; the paper's tables are unpublished): Downey's model, A = Req, sigma = {sigma:.3g}, "
        f"so that Req maximises speedup x efficiency; for a 128-PE application S(32) = {s.speedup(32):.1f}, "
        f"S(128) = {s.speedup(128):.1f}, S(256) = {s.speedup(256):.1f}.",
        "Class and application are drawn independently of the arrival process, class first (320 : 8 : 1).",
    ]
