"""Preemption by suspension in storm-mm: Parsons and Sevcik's PREEMPT rules (mm/preemption.py) on the matrix.

Slurm calls it PreemptMode=SUSPEND. A job that cannot start may suspend running jobs of a lower priority (its
QOS's, [mm] qos) that have run the minimum time since they started or last resumed ([mm] preempt_min_run);
their ranks are stopped where they are (SIGSTOP through the node managers' context switch) and keep their
memory, so they can only continue on the same PEs. Here is what storm-mm decides, as pure functions of the
matrix and the jobs, time passed in; mm/schedule_state.py keeps the suspended jobs and applies the decisions,
mm/runs.py stores them and tells the nodes.

- Units are the PEs of the usable nodes, numbered in natural node order then PE index (the order in which
  :meth:`~storm.mm.matrix.Matrix.find` lays out ranks), so a preempting job takes the lowest free PEs first,
  as mm/preemption.py takes units, and its ranks are block-distributed over them.
- Each row of the matrix is a machine of its own for the rules: the running jobs of a row are the ones that
  may be suspended for a job placed in that row. Rows are tried in order and a job is served in the first
  row that can (mm/preemption.py :func:`~storm.mm.preemption.choose_preemptions`, ranked by priority, not the
  rigid same-size rule: storm places jobs anywhere). Processes per PE count every row's jobs and the
  suspended ones (rule 4, [mm] preempt_max_jobs).
- A waiting job takes free PEs first, then those of the fewest suspendable jobs (lowest priority first, then
  the newest); it runs at its minimum size if it is moldable. A suspended job may suspend the lower-priority
  jobs that run on its own PEs to resume there (the paper's rule 1): a job started on PEs that a preemptor
  did not need can delay a suspended job of its own priority, not of a higher one, beyond its minimum run.
- Jobs that are starting or ending are never suspended (``exempt``: they count as running for ever).
- A suspended job resumes, in any row, as soon as all its PEs are free there (:func:`free_row`).

:func:`preemptions` also says when a waiting job that cannot suspend anything yet will be able to (its
reason), by asking the same rules again at the times the running jobs reach their minimum run time.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from storm.mm.matrix import PE, Matrix, Placement
from storm.mm.preemption import PreemptionRules, Rank, Running, Waiting, choose_preemptions, victims_for

OUTLOOK_JOBS = 8  # waiting jobs per pass whose future preemption is looked for (each costs r log r per time)
OUTLOOK_TIMES = 8  # times tried for each of them


@dataclass(frozen=True)
class Suspended:
    """A job preemption stopped: out of the matrix, its processes still on ``pes`` (in rank order)."""

    job_id: int
    pes: tuple[PE, ...]
    priority: int
    time_limit: float | None
    ran: float  # seconds it had run by backfilling's clock when suspended: its estimate goes on from there
    at: float  # when it was suspended


@dataclass(frozen=True)
class Candidate:
    """A queued job that may suspend running ones: its least size and its priority."""

    job_id: int
    size: int
    priority: int


@dataclass(frozen=True)
class Suspension:
    """``by`` runs on ``placement`` once ``victims`` are suspended; ``resumed``: ``by`` was suspended."""

    by: int
    victims: tuple[int, ...]
    placement: Placement
    resumed: bool


@dataclass(frozen=True)
class Outlook:
    """A waiting job will be able to suspend ``victims`` at ``at`` (when they have run the minimum time)."""

    at: float
    victims: tuple[int, ...]


def free_row(matrix: Matrix, pes: Sequence[PE], usable: Collection[str] | None = None) -> int | None:
    """The lowest row in which every PE of ``pes`` is free; None if there is none, or one is on a node not in
    ``usable``. O(mpl x len(pes))."""
    if usable is not None and any(node not in usable for node, _ in pes):
        return None
    return next((row for row in range(matrix.mpl) if matrix.all_free(row, pes)), None)


@dataclass
class _Row:
    """One row as the rules see it: its jobs (as units) and its free units."""

    running: list[Running]
    free: frozenset[int]


def preemptions(
    now: float,
    matrix: Matrix,
    pending: Sequence[Candidate],
    suspended: Sequence[Suspended],
    running: Mapping[int, tuple[float, int]],
    *,
    rules: PreemptionRules,
    usable: Collection[str] | None = None,
    exempt: Collection[int] = (),
) -> tuple[list[Suspension], dict[int, Outlook]]:
    """Every suspension to make now (module docstring), in order, and for queued jobs that cannot suspend
    anything now, when they can. ``running``: each job in the matrix -> (when it started or last resumed,
    its priority). Changes nothing. O(PEs x mpl + mpl x w x (r log r + units)) for w waiting, r running."""
    columns = [pe for pe in matrix.columns() if usable is None or pe[0] in usable]
    index = {pe: i for i, pe in enumerate(columns)}
    cells = matrix.cells()
    processes: dict[int, int] = {}
    for pes in [*(row.keys() for row in cells), *(s.pes for s in suspended)]:
        for pe in pes:
            unit = index.get(pe)
            if unit is not None:
                processes[unit] = processes.get(unit, 0) + 1
    waiting = [Waiting(c.job_id, c.size, priority=c.priority) for c in pending]
    waiting += [
        Waiting(s.job_id, len(s.pes), frozenset(index[pe] for pe in s.pes), priority=s.priority)
        for s in suspended
        if all(pe in index for pe in s.pes)
    ]
    by_id = {s.job_id: s for s in suspended}
    rows: list[_Row] = []
    placed = matrix.jobs()
    found: list[Suspension] = []
    for row in range(matrix.mpl):
        jobs = [
            Running(
                job_id,
                frozenset(index[pe] for pe in placement.pes if pe in index),
                math.inf if job_id in exempt else running.get(job_id, (now, 0))[0],
                priority=running.get(job_id, (now, 0))[1],
            )
            for job_id, placement in placed.items()
            if placement.row == row
        ]
        here = _Row(jobs, frozenset(i for i, pe in enumerate(columns) if pe not in cells[row]))
        rows.append(here)
        if not waiting:
            continue
        chosen = choose_preemptions(
            here.running, waiting, free=here.free, processes=processes, now=now, rank=Rank.PRIORITY,
            rules=rules, same_size=False,
        )  # fmt: skip
        for preemption in chosen:
            mine = by_id.get(preemption.by)
            pes = mine.pes if mine is not None else tuple(columns[i] for i in sorted(preemption.units))
            found.append(Suspension(preemption.by, preemption.victims, Placement(row, pes), mine is not None))
            if mine is None:
                for unit in preemption.units:
                    processes[unit] = processes.get(unit, 0) + 1
        served = {preemption.by for preemption in chosen}
        waiting = [w for w in waiting if w.job_id not in served]
    outlook: dict[int, Outlook] = {}
    for job in [w for w in waiting if w.suspended_on is None][:OUTLOOK_JOBS]:
        later = _outlook(job, rows, processes, now, rules)
        if later is not None:
            outlook[job.job_id] = later
    return found, outlook


def _outlook(
    job: Waiting, rows: Sequence[_Row], processes: Mapping[int, int], now: float, rules: PreemptionRules
) -> Outlook | None:
    """The first of the times the running jobs it outranks reach their minimum run at which ``job`` could
    suspend some of them (the rules asked again then, nothing else changed), if any."""
    times = sorted(
        {
            r.since + rules.min_run_s
            for row in rows
            for r in row.running
            if r.priority < job.priority and now < r.since + rules.min_run_s < math.inf
        }
    )
    for at in times[:OUTLOOK_TIMES]:
        for row in rows:
            found = victims_for(
                job, row.running, free=row.free, processes=processes, now=at, rank=Rank.PRIORITY, rules=rules,
                same_size=False,
            )  # fmt: skip
            if found is not None:
                return Outlook(at, found.victims)
    return None
