"""Which running jobs a waiting job may suspend: Parsons and Sevcik's simple preemption (LSF-PREEMPT).

Simple preemption stops a job's processes where they are (SIGSTOP; LSF sent SIGTSTP) and continues them
later on the same processors: nothing is checkpointed, so a suspended job keeps its memory and its place.
E. W. Parsons and K. C. Sevcik ("Implementing Multiprocessor Scheduling Disciplines", JSSPP 1997, section
5.1) let a waiting job X suspend a running job R when:

1. X is suspended itself and its processors are R's, or X is pending and wants R's size (the rigid rule
   that keeps the machine packed); :func:`victims_for` with ``same_size=False`` widens this for a machine
   manager that places jobs anywhere: X may take the processors of several running jobs and free ones;
2. X outranks R. Three ways to rank (:class:`Rank`): with no knowledge of service demand X's acquired
   processor time must be under half of R's (a multilevel feedback queue); with it, X's remaining demand
   must be 10% under R's; in a machine manager with job priorities (queues, partitions), X's priority must
   be higher than R's;
3. R has run for the minimum time since it started or was last resumed (1 minute: suspending is cheap);
4. no processor would then hold more than a given number of processes (5), counting suspended ones,
   which keep their memory there.

If several jobs may suspend the same one, the best ranked goes first. The rules are pure functions of the
jobs' state and the time passed in; :func:`choose_preemptions` applies them to a whole queue.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


class Rank(enum.Enum):
    """What makes a waiting job better than a running one (rule 2)."""

    ACQUIRED = "acquired"  # least acquired processor time first; no knowledge of service demand
    DEMAND = "demand"  # least remaining service demand first
    PRIORITY = "priority"  # highest priority first: a queue's or a partition's


@dataclass(frozen=True)
class PreemptionRules:
    """The paper's thresholds (its values are the defaults)."""

    min_run_s: float = 60.0  # rule 3: since the job started or was last resumed
    max_processes: int = 5  # rule 4: per processor, running and suspended
    acquired_fraction: float = 0.5  # rule 2 without knowledge: acquired(X) < this x acquired(R)
    demand_fraction: float = 0.9  # rule 2 with knowledge: remaining(X) < this x remaining(R)

    def __post_init__(self) -> None:
        if self.min_run_s < 0 or self.max_processes < 1:
            raise ValueError("min_run_s must be >= 0 and max_processes >= 1")
        if not (0 < self.acquired_fraction <= 1 and 0 < self.demand_fraction <= 1):
            raise ValueError("the fractions must be within (0, 1]")


@dataclass(frozen=True)
class Running:
    """A running job that might be suspended."""

    job_id: int
    units: frozenset[int]  # the processors (or nodes, PEs) it runs on
    since: float  # when it started or was last resumed
    acquired: float = 0.0  # processor-seconds so far
    remaining: float = 0.0  # remaining service demand (Rank.DEMAND)
    priority: int = 0  # Rank.PRIORITY: higher runs first


@dataclass(frozen=True)
class Waiting:
    """A job that is not running: pending (``suspended_on`` None) or suspended on ``suspended_on``."""

    job_id: int
    size: int  # units it needs: its desired size when pending; its own units' count when suspended
    suspended_on: frozenset[int] | None = None
    acquired: float = 0.0
    remaining: float = 0.0
    priority: int = 0


@dataclass(frozen=True)
class Preemption:
    """``by`` runs on ``units`` once ``victims`` are suspended (a suspended ``by`` is resumed there)."""

    by: int
    victims: tuple[int, ...]
    units: frozenset[int]


def ran_long_enough(since: float, now: float, rules: PreemptionRules) -> bool:
    """Rule 3: a job that started or resumed at ``since`` may be suspended at ``now``. O(1)."""
    return now - since >= rules.min_run_s


def outranks(x: Waiting, r: Running, rank: Rank, rules: PreemptionRules) -> bool:
    """Rule 2: whether waiting job ``x`` is enough better than running job ``r`` to suspend it. O(1)."""
    if rank is Rank.ACQUIRED:
        return x.acquired < rules.acquired_fraction * r.acquired
    if rank is Rank.DEMAND:
        return x.remaining < rules.demand_fraction * r.remaining
    return x.priority > r.priority


def within_process_cap(
    units: Iterable[int], processes: Mapping[int, int], added: int, rules: PreemptionRules
) -> bool:
    """Rule 4: ``added`` more processes on each of ``units`` keep every one at or under the cap. O(units)."""
    return all(processes.get(u, 0) + added <= rules.max_processes for u in units)


def rank_key(job: Waiting | Running, rank: Rank) -> float:
    """Smaller is better: acquired time, remaining demand, or minus the priority."""
    if rank is Rank.ACQUIRED:
        return job.acquired
    if rank is Rank.DEMAND:
        return job.remaining
    return -float(job.priority)


def victims_for(
    job: Waiting,
    running: Sequence[Running],
    *,
    free: frozenset[int],
    processes: Mapping[int, int],
    now: float,
    rank: Rank,
    rules: PreemptionRules = PreemptionRules(),
    same_size: bool = True,
) -> Preemption | None:
    """The running jobs ``job`` may suspend to run now, and the units it then runs on; None if none will do.

    ``free``: units no job runs on (suspended processes may be there); ``processes``: per unit, the jobs
    with processes on it, running or suspended. A suspended ``job`` needs its own units back: the jobs
    running on any of them must all be suspendable (rules 2 and 3), and nothing else changes on them. A
    pending ``job`` with ``same_size`` takes the units of one suspendable job of exactly its size, the
    worst ranked such job (the paper's rigid rule); without ``same_size`` it takes free units first
    (lowest numbered) and then those of suspendable jobs, worst ranked first, as few as will do. A pending
    job adds one process on each unit it takes (rule 4). Only a preemption is returned: a job that fits
    in free units alone needs none (None). O(r log r + units) for r running jobs.
    """
    movable = [r for r in running if ran_long_enough(r.since, now, rules) and outranks(job, r, rank, rules)]
    if job.suspended_on is not None:
        mine = job.suspended_on
        blocking = [r for r in running if r.units & mine]
        if not blocking or any(r not in movable for r in blocking):
            return None
        if not mine <= free | frozenset().union(*(r.units for r in blocking)):
            return None
        victims = tuple(sorted(r.job_id for r in blocking))
        return Preemption(job.job_id, victims, mine)
    # Worst ranked first; among equals the later job id (the newer) goes first.
    movable.sort(key=lambda r: (-rank_key(r, rank), -r.job_id))
    if same_size:
        for r in movable:
            if len(r.units) == job.size and within_process_cap(r.units, processes, 1, rules):
                return Preemption(job.job_id, (r.job_id,), r.units)
        return None
    usable_free = sorted(u for u in free if within_process_cap((u,), processes, 1, rules))
    if len(usable_free) >= job.size:
        return None
    taken: list[int] = []
    units = list(usable_free)
    for r in movable:
        if len(units) >= job.size:
            break
        own = sorted(u for u in r.units if within_process_cap((u,), processes, 1, rules))
        if not own:
            continue
        taken.append(r.job_id)
        units.extend(own)
    if len(units) < job.size:
        return None
    # Free units first, then the victims' in the order they were taken: exactly the size asked for.
    # A victim none of whose units is finally used is not suspended.
    use = frozenset(units[: job.size])
    victims = tuple(sorted(v for v in taken if next(r for r in movable if r.job_id == v).units & use))
    return Preemption(job.job_id, victims, use)


def choose_preemptions(
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    *,
    free: frozenset[int],
    processes: Mapping[int, int],
    now: float,
    rank: Rank,
    rules: PreemptionRules = PreemptionRules(),
    same_size: bool = True,
) -> list[Preemption]:
    """Every preemption to make now: the waiting jobs, best ranked first (ties: lower job id), each take
    what :func:`victims_for` gives them from the jobs still running. A job suspended here is not resumed
    here, and the free units and process counts are updated as each preemption is chosen.
    O(w x (r log r + units)) for w waiting and r running jobs.
    """
    order = sorted(waiting, key=lambda w: (rank_key(w, rank), w.job_id))
    still = list(running)
    counts = dict(processes)
    open_units = set(free)
    out: list[Preemption] = []
    for job in order:
        found = victims_for(
            job,
            still,
            free=frozenset(open_units),
            processes=counts,
            now=now,
            rank=rank,
            rules=rules,
            same_size=same_size,
        )
        if found is None:
            continue
        out.append(found)
        gone = set(found.victims)
        freed = frozenset().union(*(r.units for r in still if r.job_id in gone))
        still = [r for r in still if r.job_id not in gone]
        # The victims' processes stay where they were; the newcomer's run on found.units.
        open_units = (open_units | freed) - found.units
        if job.suspended_on is None:
            for u in found.units:
                counts[u] = counts.get(u, 0) + 1
        still.append(Running(job.job_id, found.units, now, job.acquired, job.remaining, job.priority))
    return out
