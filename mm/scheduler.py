"""Which queued jobs start now: first come, first served, with EASY backfilling on the Ousterhout matrix.

EASY backfilling (Lifka 1995; Mu'alem & Feitelson 2001) starts jobs in queue order while they fit. The first
job that does not fit (the head) gets a reservation: the earliest time, by the running jobs' time limits,
when enough PEs will be free for it. Later jobs may then jump ahead ("backfill") only if they cannot delay
that reservation: they end before it, or they use PEs the head will not need even then.

Time sharing stretches every job: with ``mpl`` jobs taking turns on a PE, each gets about 1/mpl of it. As
in the Flexible CoScheduling paper, run and reservation times are therefore estimated by multiplying the
requested time limit by the MPL.

The reservation covers one row of the matrix. Other rows are separate time slots whose jobs cannot delay
the head there, so backfilling into them is unrestricted.

Everything here is a pure function of its arguments (time is passed in), so the simulator can replay it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from storm.mm.matrix import Matrix, Placement

RESOURCES = "Resources"
PRIORITY = "Priority"


def _check_limit(time_limit: float | None) -> None:
    # `not x > 0` also refuses NaN, which would make every comparison with it false.
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds or None, not {time_limit}")


@dataclass(frozen=True)
class QueuedJob:
    """A pending job as the scheduler sees it."""

    job_id: int
    ranks: int
    time_limit: float | None  # seconds requested; None = unlimited

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"job {self.job_id} needs at least one rank, not {self.ranks}")
        _check_limit(self.time_limit)


@dataclass(frozen=True)
class RunningJob:
    """When a job in the matrix started and how long it may run."""

    job_id: int
    start_time: float
    time_limit: float | None  # None = unlimited

    def __post_init__(self) -> None:
        _check_limit(self.time_limit)


@dataclass(frozen=True)
class Start:
    """A job to launch now; it is already committed to the matrix."""

    job_id: int
    placement: Placement
    backfilled: bool  # True when it jumped ahead of an earlier queued job


@dataclass(frozen=True)
class Reservation:
    """When and where the head of the queue is expected to start.

    ``start`` is the shadow time (``math.inf`` if only jobs without a time limit hold the PEs it needs).
    ``extra`` counts the PEs of that row still free at the shadow time beyond what the head needs, after
    this pass's backfilled jobs took their share.
    """

    job_id: int
    row: int
    start: float
    extra: int


@dataclass(frozen=True)
class Plan:
    """The outcome of one scheduling pass."""

    starts: tuple[Start, ...]
    reservation: Reservation | None
    reasons: dict[int, str]  # every queued job not started -> a Slurm-like reason


def runtime_estimate(time_limit: float | None, mpl: int) -> float:
    """How long a job is expected to hold its PEs: its limit stretched by time sharing; inf if unlimited."""
    return math.inf if time_limit is None else time_limit * mpl


def schedule(
    now: float,
    queue: Sequence[QueuedJob],
    running: Mapping[int, RunningJob],
    matrix: Matrix,
    usable: Collection[str] | None = None,
) -> Plan:
    """Decide which queued jobs start at ``now``, commit them into ``matrix`` and say why the rest wait.

    ``queue`` is in FCFS order. Jobs already in the matrix are running; ``running`` gives their start and
    limit (one missing there counts as unlimited). Only PEs of nodes in ``usable`` (None: all) are used.

    Reasons for jobs that do not start: ``Resources`` for the head, ``Priority`` for jobs behind it, and
    ``PartitionConfig: ...`` for a job wider than all usable PEs, which is skipped without blocking others.

    A job that may backfill tries the rows other than the reserved one first (in index order), and the
    reserved row last, so it leaves the head's row alone whenever it can.
    """
    _check_queue(queue, matrix)
    usable_set = None if usable is None else frozenset(usable)
    mpl = matrix.mpl
    total = matrix.total_pes(usable_set)
    ends = {job_id: _estimated_end(now, running.get(job_id), mpl) for job_id in matrix.jobs()}
    # Free usable PEs per row, kept up to date as jobs start: find() places a job in a row exactly when the
    # row has that many, so a job that fits in no row is passed over without searching (a long queue behind
    # a full cluster then costs a comparison per job, not a search).
    free = [matrix.free_pes(row, usable_set) for row in range(mpl)]
    most = max(free)
    starts: list[Start] = []
    reasons: dict[int, str] = {}
    reservation: Reservation | None = None

    for job in queue:
        if job.ranks > total:
            reasons[job.job_id] = f"PartitionConfig: needs {job.ranks} PEs, the cluster has {total}"
            continue
        if reservation is None:
            placement = matrix.find(job.ranks, usable_set) if job.ranks <= most else None
            if placement is None:
                reservation = _reserve(job, matrix, ends, usable_set)
                reasons[job.job_id] = RESOURCES
                continue
        elif job.ranks > most:
            reasons[job.job_id] = PRIORITY
            continue
        else:
            placement, extra = _backfill(now, job, matrix, reservation, usable_set, free=free)
            if placement is None:
                reasons[job.job_id] = PRIORITY
                continue
            reservation = dataclasses.replace(reservation, extra=extra)
        matrix.assign(job.job_id, placement)
        free[placement.row] -= len(placement.pes)
        most = max(free)
        # The head's reservation, made later in this pass, must see this job ending at its estimate.
        ends[job.job_id] = now + runtime_estimate(job.time_limit, mpl)
        starts.append(Start(job.job_id, placement, backfilled=reservation is not None))
    return Plan(tuple(starts), reservation, reasons)


def _check_queue(queue: Sequence[QueuedJob], matrix: Matrix) -> None:
    ids = [job.job_id for job in queue]
    if len(set(ids)) == len(ids) and matrix.jobs().keys().isdisjoint(ids):
        return  # set operations: the check must not cost a long queue more than the pass itself
    seen: set[int] = set()
    for job_id in ids:
        if job_id in seen:
            raise ValueError(f"job {job_id} is queued twice")
        if matrix.placement_of(job_id) is not None:
            raise ValueError(f"job {job_id} is queued but already in the matrix")
        seen.add(job_id)


def _estimated_end(now: float, job: RunningJob | None, mpl: int) -> float:
    if job is None:
        return math.inf
    # A job past its estimate may end any moment: counting it as ending now keeps the shadow time from
    # lying in the past, where every backfill check would fail for no reason.
    return max(now, job.start_time + runtime_estimate(job.time_limit, mpl))


def _reserve(
    job: QueuedJob, matrix: Matrix, ends: Mapping[int, float], usable: Collection[str] | None
) -> Reservation:
    """The row where ``job`` can start earliest (ties: lowest row), assuming jobs end at their estimates."""
    per_row: list[list[tuple[float, int, int]]] = [[] for _ in range(matrix.mpl)]
    for job_id, placement in matrix.jobs().items():
        pes = sum(1 for node, _ in placement.pes if usable is None or node in usable)
        if pes:
            per_row[placement.row].append((ends[job_id], job_id, pes))

    best: Reservation | None = None
    for row, events in enumerate(per_row):
        events.sort()
        free = matrix.free_pes(row, usable)
        shadow = math.inf
        i = 0
        while i < len(events):
            end = events[i][0]
            # Jobs ending at the same instant free their PEs together: all of them count towards extra.
            while i < len(events) and events[i][0] == end:
                free += events[i][2]
                i += 1
            if free >= job.ranks:
                shadow = end
                break
        candidate = Reservation(job.job_id, row, shadow, max(0, free - job.ranks))
        if best is None or candidate.start < best.start:
            best = candidate
    assert best is not None  # mpl >= 1, so there is at least one row
    return best


def _backfill(
    now: float,
    job: QueuedJob,
    matrix: Matrix,
    reservation: Reservation,
    usable: Collection[str] | None,
    *,
    free: Sequence[int],
) -> tuple[Placement | None, int]:
    """Where ``job`` may start without delaying the reservation, and the extra PEs left after it; ``free``:
    each row's free usable PEs."""
    for row in range(matrix.mpl):
        if row != reservation.row and free[row] >= job.ranks:
            placement = matrix.find(job.ranks, usable, row=row)
            if placement is not None:
                return placement, reservation.extra
    if free[reservation.row] < job.ranks:
        return None, reservation.extra
    placement = matrix.find(job.ranks, usable, row=reservation.row)
    if placement is None:
        return None, reservation.extra
    runtime = runtime_estimate(job.time_limit, matrix.mpl)
    # An unlimited job never "ends before" the shadow, not even an infinite one: it may hold its PEs forever.
    if math.isfinite(runtime) and now + runtime <= reservation.start:
        return placement, reservation.extra
    if job.ranks <= reservation.extra:
        return placement, reservation.extra - job.ranks
    return None, reservation.extra
