"""How many processors a moldable job gets when it starts: Parsons and Sevcik's adaptive rules.

A moldable job asks for a range of sizes (Slurm's ``--nodes=min-max``, storm's ``-n 4-16``); the machine
manager picks one when it starts the job and keeps it until the job ends. The rules here are those of
LSF-RTC-AD and LSF-RTC-ADSUBSET (E. W. Parsons and K. C. Sevcik, "Implementing Multiprocessor Scheduling
Disciplines", JSSPP 1997, section 5.1), and the two of Naik, Setia and Squillante's adaptive partitioning
(AP, SC'93 section 3.2). Sizes are counted in allocation units (PEs, nodes, or the paper's workstations of
eight processors: ``processors_per_unit`` converts a size for the speedup models).

- :func:`first_fit`: scan the queue in its order and take every job whose minimum still fits.
- :func:`share_leftover`: processors left over after the minima go one at a time either to the job with
  the smallest allocation (equi-allocation: nothing is known of speedup) or, when every chosen job's speedup
  is known, to the job whose efficiency is highest *after* taking it (the paper's rule, which favours jobs
  that use processors well).
- :func:`min_surplus_subset`: the subset-sum step of the SUBSET variant: of the given minima, the set that
  fills the free units best (fewest surplus units), preferring earlier jobs among equally good sets.
- :func:`choose_sizes`: RTC-AD (first fit, then leftovers), or with ``subset`` RTC-ADSUBSET: commit to the
  first N' = floor(N_ff max(1 - L / (delta N_ff), 0)) first-fit jobs (N_ff of them; L jobs in the system),
  fill what is left with the subset-sum choice among the other jobs, then share the leftovers.
- :func:`adaptive_size` and :func:`equal_split`: AP's sizes at an arrival and at a release.

The caller orders the queue: arrival order (FCFS) when nothing is known of service demand, shortest demand
first when it is (the paper's SPT). Everything is a pure function of its arguments: no clock, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from storm.mm.speedup import SpeedupModel, efficiency

SUBSET_DELTA = 5.0  # the paper's delta: how soon, as the system fills, the SUBSET rule takes over


@dataclass(frozen=True)
class MoldableRequest:
    """A job waiting to start, as the sizing rules see it: a size range in units, and its speedup if known.

    A job whose size is already fixed (a migratable job restarting at the size it first ran at) has
    ``minimum == maximum``.
    """

    job_id: int
    minimum: int
    maximum: int
    speedup: SpeedupModel | None = None

    def __post_init__(self) -> None:
        if self.minimum < 1 or self.maximum < self.minimum:
            raise ValueError(
                f"job {self.job_id}: sizes must satisfy 1 <= minimum <= maximum, not {self.minimum}-"
                f"{self.maximum}"
            )


def first_fit(minima: Sequence[int], free: int) -> list[int]:
    """The indices of the jobs a first-fit scan takes: in order, each whose minimum still fits in what the
    earlier ones left. O(n)."""
    chosen = []
    for index, size in enumerate(minima):
        if size <= free:
            chosen.append(index)
            free -= size
    return chosen


def committed_count(first_fit_jobs: int, jobs_in_system: int, delta: float = SUBSET_DELTA) -> int:
    """N' = floor(N_ff x max(1 - L / (delta x N_ff), 0)): how many first-fit jobs SUBSET commits to. O(1)."""
    if first_fit_jobs == 0:
        return 0
    if not delta > 0:
        raise ValueError(f"delta must be > 0, not {delta}")
    share = max(1.0 - jobs_in_system / (delta * first_fit_jobs), 0.0)
    # The small epsilon keeps an exact product (2 x 0.5) from flooring to one less through rounding.
    return min(first_fit_jobs, math.floor(first_fit_jobs * share + 1e-9))


def min_surplus_subset(sizes: Sequence[int], capacity: int) -> list[int]:
    """The indices (ascending) of a subset of ``sizes`` whose sum is the largest that is <= ``capacity``,
    i.e. leaves the fewest surplus units. Among subsets with that sum, the one that takes the earliest
    jobs: job i is in it whenever some best subset agrees with the choices made for jobs 0..i-1 and holds i.

    Dynamic programming over reachable sums kept as bit sets (Python integers): O(n x C / w) time and
    O(n x C) bits, C = ``capacity``, w the machine word. Sizes must be >= 1.
    """
    if capacity <= 0 or not sizes:
        return []
    if min(sizes) < 1:
        raise ValueError("sizes must be >= 1")
    mask = (1 << (capacity + 1)) - 1
    # reach[i]: the sums (bit k = sum k) that jobs i..n-1 can make, up to the capacity.
    reach = [0] * (len(sizes) + 1)
    reach[-1] = 1
    for i in range(len(sizes) - 1, -1, -1):
        reach[i] = (reach[i + 1] | (reach[i + 1] << sizes[i])) & mask
    target = reach[0].bit_length() - 1
    chosen = []
    for i, size in enumerate(sizes):
        if size <= target and (reach[i + 1] >> (target - size)) & 1:
            chosen.append(i)
            target -= size
    return chosen


def share_leftover(
    sizes: Sequence[int],
    caps: Sequence[int],
    leftover: int,
    speedups: Sequence[SpeedupModel | None] | None = None,
    processors_per_unit: int = 1,
) -> list[int]:
    """``sizes`` grown by up to ``leftover`` units, one at a time, never past ``caps``.

    Each unit goes to the job with the smallest size (equi-allocation), or, when ``speedups`` names a model
    for every job, to the job whose efficiency at its size plus one unit (``processors_per_unit``
    processors each) is highest. Ties go to the earlier job. Units no job can take stay unused.
    O((n + u) log n) for u units shared among n jobs.
    """
    out = list(sizes)
    if len(caps) != len(out):
        raise ValueError("one cap per size")
    models: list[SpeedupModel] | None = None
    if speedups is not None and len(speedups) == len(out) and all(m is not None for m in speedups):
        models = [m for m in speedups if m is not None]

    def key(i: int) -> tuple[float, int]:
        if models is None:
            return (float(out[i]), i)
        return (-efficiency(models[i], (out[i] + 1) * processors_per_unit), i)

    heap = [key(i) for i in range(len(out)) if out[i] < caps[i]]
    heapq.heapify(heap)
    while leftover > 0 and heap:
        _, i = heapq.heappop(heap)
        out[i] += 1
        leftover -= 1
        if out[i] < caps[i]:
            heapq.heappush(heap, key(i))
    return out


def choose_sizes(
    queue: Sequence[MoldableRequest],
    free: int,
    *,
    jobs_in_system: int,
    subset: bool = False,
    delta: float = SUBSET_DELTA,
    processors_per_unit: int = 1,
) -> list[tuple[int, int]]:
    """Which of ``queue`` (in priority order) start now on ``free`` units, and at what size: RTC-AD, or
    RTC-ADSUBSET with ``subset`` (module docstring). ``jobs_in_system`` is L, every job waiting or running.

    Returns (job id, units) in queue order; every size is within the job's [minimum, maximum] and they add up
    to at most ``free``. Leftover units are shared by efficiency if every chosen job's speedup is known,
    else equally. O(n log n + u log n) without ``subset``; with it add O(n x free / w) for the subset sum.
    """
    minima = [job.minimum for job in queue]
    chosen = first_fit(minima, free)
    if subset and chosen:
        keep = committed_count(len(chosen), jobs_in_system, delta)
        committed = chosen[:keep]
        left = free - sum(minima[i] for i in committed)
        taken = set(committed)
        rest = [i for i in range(len(queue)) if i not in taken]
        extra = min_surplus_subset([minima[i] for i in rest], left)
        chosen = sorted(committed + [rest[j] for j in extra])
    jobs = [queue[i] for i in chosen]
    leftover = free - sum(job.minimum for job in jobs)
    sizes = share_leftover(
        [job.minimum for job in jobs],
        [job.maximum for job in jobs],
        leftover,
        [job.speedup for job in jobs],
        processors_per_unit,
    )
    return [(job.job_id, size) for job, size in zip(jobs, sizes, strict=True)]


def adaptive_size(request: int, free: int, minimum: int) -> int | None:
    """AP at an arrival: min(request, free) if at least ``minimum`` units are free, else None (the job
    waits). A request below ``minimum`` is met whenever it fits. O(1)."""
    if free >= min(minimum, request):
        return min(request, free)
    return None


def equal_split(requests: Sequence[int], free: int, minimum: int) -> list[int]:
    """AP at a release: ``free`` units shared equally among the waiting jobs (``requests``, in queue order),
    none getting less than ``minimum`` (or its request, if smaller) nor more than its request. Returns the
    sizes of the first k jobs that can be served, k as large as the free units allow. O((n + u) log n)."""
    floors: list[int] = []
    left = free
    for request in requests:
        floor = min(minimum, request)
        if floor > left:
            break
        floors.append(floor)
        left -= floor
    return share_leftover(floors, list(requests[: len(floors)]), left)
