"""Which queued jobs start now: first come, first served, with backfilling on the Ousterhout matrix.

EASY backfilling (Lifka 1995; Mu'alem & Feitelson 2001) starts jobs in queue order while they fit. The first
job that does not fit (the head) gets a reservation: the earliest time, by the running jobs' time limits,
when enough PEs will be free for it. Later jobs may then jump ahead ("backfill") only if they cannot delay
that reservation: they end before it, or they use PEs the head will not need even then.

Time sharing stretches every job: with ``mpl`` jobs taking turns on a PE, each gets about 1/mpl of it. As
in the Flexible CoScheduling paper, run and reservation times are therefore estimated by multiplying the
requested time limit by the MPL.

The reservation covers one row of the matrix. Other rows are separate time slots whose jobs cannot delay
the head there, so backfilling into them is unrestricted.

Two other modes (``backfill=``): ``"none"`` is strict FCFS, and ``"conservative"`` gives every waiting
job a reservation, so that a job jumps ahead only if it delays none of them (see :func:`schedule`).

Everything here is a pure function of its arguments (time is passed in), so the simulator can replay it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from storm.mm.free_profile import FreeProfile
from storm.mm.matrix import Matrix, Placement
from storm.mm.torus import Box

RESOURCES = "Resources"
PRIORITY = "Priority"
BACKFILL_MODES = ("easy", "conservative", "none")


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
    """A job to launch now; it is already committed to the matrix (and, on a torus, to the torus)."""

    job_id: int
    placement: Placement
    backfilled: bool  # True when it jumped ahead of an earlier queued job
    box: Box | None = None  # on a torus: the partition it holds (mm/torus_scheduler.py)


@dataclass(frozen=True)
class Move:
    """A running job re-placed on the torus by migration (the simulator's alone: storm cannot move a running
    MPI job), already committed: its new box and the PEs its ranks now have."""

    job_id: int
    box: Box
    placement: Placement


@dataclass(frozen=True)
class Reservation:
    """When and where a waiting job is expected to start.

    ``start`` is the shadow time (``math.inf`` if only jobs without a time limit hold the PEs it needs).
    ``extra`` counts the PEs of that row still free at the shadow time beyond what the job needs, after
    this pass's backfilled jobs (and, with conservative backfilling, the other reservations) took their
    share; 0 when ``start`` is infinite under conservative backfilling.
    """

    job_id: int
    row: int
    start: float
    extra: int


@dataclass(frozen=True)
class Plan:
    """The outcome of one scheduling pass."""

    starts: tuple[Start, ...]
    reservation: Reservation | None  # the head's: the first job that did not start
    reasons: dict[int, str]  # every queued job not started -> a Slurm-like reason
    # Every reservation made: the head's alone, except with conservative backfilling (every waiting job).
    reservations: dict[int, Reservation] = field(default_factory=dict)
    # Jobs placed before this pass that its migration moved (one it starts is in ``starts`` where it ends up).
    moves: tuple[Move, ...] = ()


def runtime_estimate(time_limit: float | None, mpl: int) -> float:
    """How long a job is expected to hold its PEs: its limit stretched by time sharing; inf if unlimited."""
    return math.inf if time_limit is None else time_limit * mpl


def schedule(
    now: float,
    queue: Sequence[QueuedJob],
    running: Mapping[int, RunningJob],
    matrix: Matrix,
    usable: Collection[str] | None = None,
    *,
    backfill: str = "easy",
) -> Plan:
    """Decide which queued jobs start at ``now``, commit them into ``matrix`` and say why the rest wait.

    ``queue`` is in FCFS order. Jobs already in the matrix are running; ``running`` gives their start and
    limit (one missing there counts as unlimited). Only PEs of nodes in ``usable`` (None: all) are used.

    Jobs start in queue order, each in the lowest row with room, until one does not fit: the head. What
    happens to the jobs behind it depends on ``backfill``:

    * ``"easy"``: the head gets a reservation (module docstring). A later job starts if it fits and cannot
      delay it: it tries the rows other than the reserved one first (in index order), and the reserved row
      last, where it must end by the shadow time or fit in the extra PEs (which it then uses up).
    * ``"none"``: strict FCFS, nothing starts behind the head. The head still gets EASY's reservation, as
      the time it may expect to start.
    * ``"conservative"``: every job behind the head gets a reservation too, in queue order. Each row has a
      profile of free PEs over time (:class:`~storm.mm.free_profile.FreeProfile`): the PEs free now, plus
      those of running jobs at their estimated ends (as EASY: :func:`runtime_estimate`, and an overdue job
      ends now), minus the jobs started in this pass from now to their estimated ends, minus every
      reservation made so far. The exact rule for each job J, ``d`` its :func:`runtime_estimate`:

      1. J starts now in the lowest row r where it fits in the matrix now and the profile of r keeps J's
         ranks free from now for ``d``; its PEs come off r's profile over [now, now + d).
      2. Otherwise J reserves the earliest time t (the lowest row on ties) at which a profile keeps its
         ranks free over [t, t + d), and they come off that profile over [t, t + d). If no finite t exists
         (jobs without a limit hold the PEs for good), J's reservation is at infinity and takes nothing.

      So a job starts now only if it can without delaying any earlier job's reservation. The head's
      reservation is the one EASY would make: only running jobs precede it in the profile. Reservations
      count PEs, not particular PEs, like EASY's extra PEs: a job spanning nodes fits wherever PEs are free.

    Reasons for jobs that do not start: ``Resources`` for the head, ``Priority`` for jobs behind it, and
    ``PartitionConfig: ...`` for a job wider than all usable PEs, which is skipped without blocking others.

    Cost: O(q + r log r + s * m) for EASY and FCFS, q queued jobs, r running, s started, m the matrix's
    cost of a placement (:meth:`Matrix.find`); a job that cannot start costs O(mpl) checks of counts.
    Conservative adds each waiting job's profile search, O(mpl * n) for n steps of a profile, so O(q^2)
    at worst.
    """
    if backfill not in BACKFILL_MODES:
        raise ValueError(f"backfill must be one of {', '.join(BACKFILL_MODES)}, not {backfill!r}")
    _check_queue(queue, matrix)
    run = _Pass(now, running, matrix, None if usable is None else frozenset(usable))
    head: int | None = None
    for position, job in enumerate(queue):
        if job.ranks > run.total:
            run.too_wide(job)
            continue
        row = run.lowest_row_with_room(job.ranks)
        if row is None:
            head = position
            break
        run.start(job, row, backfilled=False)
    if head is None:
        return run.plan(None)
    if backfill == "conservative":
        return _conservative(run, queue[head:])
    reservation = _reserve(queue[head], run)
    run.reasons[queue[head].job_id] = RESOURCES
    behind = queue[head + 1 :]
    if backfill == "none":
        for job in behind:
            if job.ranks > run.total:
                run.too_wide(job)
            else:
                run.reasons[job.job_id] = PRIORITY
        return run.plan(reservation)
    return run.plan(_easy(run, behind, reservation))


class _Pass:
    """One pass's working state: the usable free PEs per row as they shrink, and what the pass decided."""

    def __init__(
        self, now: float, running: Mapping[int, RunningJob], matrix: Matrix, usable: frozenset[str] | None
    ) -> None:
        self.now = now
        self.running = running
        self.matrix = matrix
        self.usable = usable  # one frozenset for every call: the matrix works out its unusable nodes once
        self.total = matrix.total_pes(usable)
        self.free = [matrix.free_pes(row, usable) for row in range(matrix.mpl)]
        self.widest = max(self.free)  # no job wider than this fits in any row now
        self.starts: list[Start] = []
        self.started_ends: dict[int, float] = {}
        self.reasons: dict[int, str] = {}
        self.reservations: dict[int, Reservation] = {}

    def too_wide(self, job: QueuedJob) -> None:
        self.reasons[job.job_id] = f"PartitionConfig: needs {job.ranks} PEs, the cluster has {self.total}"

    def lowest_row_with_room(self, ranks: int) -> int | None:
        if ranks > self.widest:
            return None
        return next(row for row, free in enumerate(self.free) if free >= ranks)

    def start(self, job: QueuedJob, row: int, backfilled: bool) -> None:
        placement = self.matrix.find(job.ranks, self.usable, row=row)
        assert placement is not None, "the free counts said it fits"
        self.matrix.assign(job.job_id, placement)
        self.free[row] -= job.ranks
        self.widest = max(self.free)
        # A reservation made later in this pass must see this job ending at its estimate.
        self.started_ends[job.job_id] = self.now + runtime_estimate(job.time_limit, self.matrix.mpl)
        self.starts.append(Start(job.job_id, placement, backfilled))

    def releases(self) -> list[list[tuple[float, int]]]:
        """Per row, (estimated end, usable PEs) of every job in the matrix, this pass's starts included."""
        mpl = self.matrix.mpl
        per_row: list[list[tuple[float, int]]] = [[] for _ in range(mpl)]
        usable = self.usable
        for job_id, placement in self.matrix.jobs().items():
            end = self.started_ends.get(job_id)
            if end is None:
                end = _estimated_end(self.now, self.running.get(job_id), mpl)
            pes = placement.ranks if usable is None else sum(1 for node, _ in placement.pes if node in usable)
            if pes:
                per_row[placement.row].append((end, pes))
        return per_row

    def plan(self, reservation: Reservation | None) -> Plan:
        if reservation is not None and not self.reservations:
            self.reservations[reservation.job_id] = reservation
        return Plan(tuple(self.starts), reservation, self.reasons, self.reservations)


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


def _reserve(job: QueuedJob, run: _Pass) -> Reservation:
    """The row where ``job`` can start earliest (ties: lowest row), assuming jobs end at their estimates.

    O(r log r) for the r jobs in the matrix (O(PEs placed) to count them when some nodes are unusable).
    """
    best: Reservation | None = None
    for row, events in enumerate(run.releases()):
        events.sort()
        free = run.free[row]
        shadow = math.inf
        i = 0
        while i < len(events):
            end = events[i][0]
            # Jobs ending at the same instant free their PEs together: all of them count towards extra.
            while i < len(events) and events[i][0] == end:
                free += events[i][1]
                i += 1
            if free >= job.ranks:
                shadow = end
                break
        candidate = Reservation(job.job_id, row, shadow, max(0, free - job.ranks))
        if best is None or candidate.start < best.start:
            best = candidate
    assert best is not None  # mpl >= 1, so there is at least one row
    return best


def _easy(run: _Pass, behind: Sequence[QueuedJob], reservation: Reservation) -> Reservation:
    """Backfill ``behind`` (the jobs after the head) around ``reservation``; return it with the extra PEs
    left. O(mpl) per job that does not start."""
    now, mpl = run.now, run.matrix.mpl
    reserved, shadow, extra = reservation.row, reservation.start, reservation.extra
    others = [row for row in range(mpl) if row != reserved]
    for job in behind:
        ranks = job.ranks
        if ranks > run.total:
            run.too_wide(job)
            continue
        if ranks > run.widest:  # fits in no row now, whatever the reservation allows
            run.reasons[job.job_id] = PRIORITY
            continue
        row = next((r for r in others if run.free[r] >= ranks), None)
        if row is None and run.free[reserved] >= ranks:
            runtime = runtime_estimate(job.time_limit, mpl)
            # An unlimited job never "ends before" the shadow, not even an infinite one: it may hold its PEs
            # forever.
            if math.isfinite(runtime) and now + runtime <= shadow:
                row = reserved
            elif ranks <= extra:
                row = reserved
                extra -= ranks
        if row is None:
            run.reasons[job.job_id] = PRIORITY
            continue
        run.start(job, row, backfilled=True)
    return Reservation(reservation.job_id, reserved, shadow, extra)


def _conservative(run: _Pass, waiting: Sequence[QueuedJob]) -> Plan:
    """Conservative backfilling of ``waiting`` (the head first): the rule is in :func:`schedule`'s docstring.

    O(mpl * n) per job for the profile searches, n the steps of a profile (which grow by one per
    reservation): O(q^2) for q jobs at worst.
    """
    now, mpl = run.now, run.matrix.mpl
    profiles = [FreeProfile(now, run.free[row], events) for row, events in enumerate(run.releases())]
    made: list[tuple[QueuedJob, int, float]] = []
    for job in waiting:
        ranks = job.ranks
        if ranks > run.total:
            run.too_wide(job)
            continue
        duration = runtime_estimate(job.time_limit, mpl)
        if made and ranks <= run.widest:  # the head did not fit now, by definition
            row = next(
                (r for r in range(mpl) if run.free[r] >= ranks and profiles[r].fits(now, duration, ranks)),
                None,
            )
            if row is not None:
                profiles[row].take(now, duration, ranks)
                run.start(job, row, backfilled=True)
                continue
        start, row = min((profile.earliest(ranks, duration), r) for r, profile in enumerate(profiles))
        profiles[row].take(start, duration, ranks)
        made.append((job, row, start))
        run.reasons[job.job_id] = PRIORITY if len(made) > 1 else RESOURCES
    for job, row, start in made:
        extra = profiles[row].free_at(start) if start != math.inf else 0
        run.reservations[job.job_id] = Reservation(job.job_id, row, start, extra)
    return run.plan(run.reservations[made[0][0].job_id])
