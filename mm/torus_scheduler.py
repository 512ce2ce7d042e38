"""Which queued jobs start now on a torus, each in a box: the BlueGene/L paper's schedulers.

Krevat, Castanos and Moreira, "Job Scheduling for the BlueGene/L System", section 2. The queue is in arrival
order; a job of r ranks needs ceil(r / PEs per node) nodes, rounded up to a size that has a box
(mm/torus.py), and every placement is the paper's rule: the free box that leaves the largest free
partition. ``backfill`` chooses the scheduler, as ``[mm] backfill`` does on a flat cluster:

- ``"none"``: **FCFS**. Jobs start in queue order; each is placed at its size or, when no box of that size is
  free but a larger free box exists, grown to the least size that has one. The first job that fits in no
  free box at all (its size exceeds the largest free partition) stops the pass: the head.
- ``"easy"``: **FCFS with backfilling**. The head gets a reservation: the running jobs are released at their
  estimated ends (start + time limit; a job past its estimate ends now, one without a limit never), in
  order, until the largest free partition of the torus that is left holds the head: that end is the shadow
  time. A later job then starts if it fits now, growing by at most ``growth`` nodes (the paper's I = 1), and
  either ends by its estimate before the shadow time, or leaves the head a box at the shadow time: the torus
  as it will be then (the jobs still running, this pass's backfilled ones included) with the job placed still
  has a free box as large as the head. Among its placements that pass that test, the paper's rule chooses.

``migration`` (a :class:`Migration`, the simulator's alone) adds the paper's **migration**: when the FCFS
phase stops, at least ``min_free`` of the torus is free (FN_tor >= 0.1) and the largest free partition holds
at most ``max_share`` of the free nodes (FN_max <= 0.7), every running job is placed again, largest first
(ties in job order), at its size with the same rule on a torus empty of them. A job that finds no box there
stays where it is, and the re-placement starts over for the others. If the largest free partition would not
grow, nothing moves; otherwise the moves are committed and FCFS runs again. With ``"easy"`` this is the
paper's B+M: FCFS, migration, FCFS, backfilling. storm-mm never asks for it: moving a running MPI job needs
checkpointing that storm does not have.

Reasons for jobs that wait: ``Resources`` for the head (with what the torus has free when its nodes are free
but not as a box: the fragmentation the paper is about), ``Priority`` behind it, and ``PartitionConfig`` for
a job no box of the usable nodes can ever hold, which is skipped without blocking others, as on a flat
cluster.

Pure: time comes in, nothing is drawn at random, and the starts and moves are committed into the matrix and
the TorusState passed in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from storm.mm.matrix import Matrix, Placement
from storm.mm.scheduler import (
    PRIORITY,
    RESOURCES,
    Move,
    Plan,
    QueuedJob,
    Reservation,
    RunningJob,
    Start,
    runtime_estimate,
)
from storm.mm.torus import Box
from storm.mm.torus_state import TorusState

TORUS_BACKFILL = ("none", "easy")  # the paper's FCFS and FCFS with backfilling


@dataclass(frozen=True)
class Migration:
    """The paper's gates on migration (its FN_tor and FN_max): attempt one only when at least ``min_free`` of
    the torus is free and the largest free box holds at most ``max_share`` of the free nodes. (0, 1): the
    paper's "full migration", attempted whenever the FCFS phase stops."""

    min_free: float = 0.1
    max_share: float = 0.7

    def __post_init__(self) -> None:
        if not (0 <= self.min_free <= 1 and 0 <= self.max_share <= 1):
            raise ValueError("migration gates are shares of the torus: 0 to 1")


def nodes_needed(ranks: int, per_node: int) -> int:
    """Whole nodes for ``ranks`` ranks at ``per_node`` ranks a node."""
    return -(-ranks // per_node)


def schedule_torus(
    now: float,
    queue: Sequence[QueuedJob],
    running: Mapping[int, RunningJob],
    state: TorusState,
    matrix: Matrix,
    *,
    usable: Collection[str] | None = None,
    backfill: str = "easy",
    migration: Migration | None = None,
    growth: int = 1,
) -> Plan:
    """One pass at ``now`` over ``queue`` (FCFS order) on the torus of ``state`` (the module's docstring).

    ``running`` gives the start and limit of the jobs already placed (one missing counts as unlimited);
    only nodes in ``usable`` (None: every node the matrix knows) take new jobs. The plan's starts and moves
    are already in ``matrix`` (row 0, a job's ranks filling its box's nodes in order) and in ``state``.

    Cost: a job that cannot start costs O(1) once its size has failed in this state (sizes are cached
    until a start changes the torus), otherwise one :meth:`Torus.largest_free`; a start costs a placement
    (:meth:`Torus.place`). The reservation costs one largest-free query per distinct estimated end until the
    head fits; a backfill test one query per candidate box. A migration re-places every running job, once
    per job that stays, O(r^2) placements at worst for r running jobs.
    """
    if backfill not in TORUS_BACKFILL:
        raise ValueError(f"backfill on a torus must be one of {', '.join(TORUS_BACKFILL)}, not {backfill!r}")
    if growth < 0:
        raise ValueError(f"growth must be >= 0 nodes, not {growth}")
    if matrix.mpl != 1:
        raise ValueError("a torus holds one job per node: the matrix must have one row")
    run = _Pass(now, running, state, matrix, None if usable is None else frozenset(usable))
    head = run.fcfs(queue, 0)
    if head is not None and migration is not None and run.migrate(migration):
        head = run.fcfs(queue, head)
    if head is None:
        return run.plan(None)
    job = queue[head]
    run.reasons[job.job_id] = run.blocked_reason(run.size(job))
    behind = queue[head + 1 :]
    if backfill == "none":
        for other in behind:
            run.reasons[other.job_id] = PRIORITY if run.size(other) is not None else run.too_big(other)
        return run.plan(None)
    return run.plan(run.backfill(job, behind, growth))


class _Pass:
    """One pass's working state: the taken nodes as they grow, the starts and moves made, and caches of the
    sizes that cannot start in the current state."""

    def __init__(
        self,
        now: float,
        running: Mapping[int, RunningJob],
        state: TorusState,
        matrix: Matrix,
        usable: frozenset[str] | None,
    ) -> None:
        self.now = now
        self.running = running
        self.state = state
        self.torus = state.torus
        self.matrix = matrix
        self.blocked, self.per_node = state.view(matrix, usable)
        # The largest box of usable nodes, jobs or not: a job larger than that cannot run on these nodes.
        self.ceiling = self.torus.largest_free(self.blocked)
        self._sizes: dict[int, int | None] = {}  # ranks -> size(): queues hold many jobs of a few sizes
        self.starts: list[Start] = []
        self.moves: list[Move] = []
        self.reasons: dict[int, str] = {}
        self.started_ends: dict[int, float] = {}
        self._refresh()

    def _refresh(self) -> None:
        """The torus changed (a start, a migration): forget what was known of the old state."""
        self.taken = self.state.taken | self.blocked
        self._largest: int | None = None
        self.failed: set[tuple[int, int, bool]] = set()  # (size, most, kept) that found no box in this state

    @property
    def largest(self) -> int:
        if self._largest is None:
            self._largest = self.torus.largest_free(self.taken)
        return self._largest

    def size(self, job: QueuedJob) -> int | None:
        """The nodes the job needs, rounded to a size that has a box; None if no box of usable nodes can hold
        it (or no torus node has registered)."""
        ranks = job.ranks
        if ranks in self._sizes:
            return self._sizes[ranks]
        size = None
        if self.per_node > 0:
            size = self.torus.round_size(nodes_needed(ranks, self.per_node))
            if size is not None and size > self.ceiling:
                size = None
        self._sizes[ranks] = size
        return size

    def too_big(self, job: QueuedJob) -> str:
        return (
            f"PartitionConfig: needs {nodes_needed(job.ranks, max(self.per_node, 1))} nodes of "
            f"{max(self.per_node, 1)} PEs, the largest box of usable nodes on the torus has {self.ceiling}"
        )

    def blocked_reason(self, size: int | None) -> str:
        free = self.torus.nodes - self.taken.bit_count()
        if size is not None and free >= size:
            return (
                f"{RESOURCES}: {free} nodes are free but not as a box of {size} on the torus (the largest "
                f"free box holds {self.largest})"
            )
        return RESOURCES

    def place(self, size: int, most: int | None, keep: Callable[[int], bool] | None = None) -> Box | None:
        """The paper's placement at the least size from ``size`` to ``most`` that has a free box (``keep``:
        see Torus.place); remembered when none has, until the torus changes. (One pass uses one ``keep``,
        whose answers change only when a start changes the torus, so its failures are remembered too.)"""
        if size > self.largest:
            return None
        key = (size, -1 if most is None else most, keep is not None)
        if key in self.failed:
            return None
        box = self.torus.grow(self.taken, size, most, keep)
        if box is None:
            self.failed.add(key)
        return box

    def start(self, job: QueuedJob, box: Box, backfilled: bool) -> None:
        placement = self._placement(box, job.ranks)
        self.state.assign(job.job_id, box)
        self.matrix.assign(job.job_id, placement)
        self.started_ends[job.job_id] = self.now + runtime_estimate(job.time_limit, 1)
        self.starts.append(Start(job.job_id, placement, backfilled, box))
        self._refresh()

    def _placement(self, box: Box, ranks: int) -> Placement:
        """Ranks block-distributed over the box's nodes in its order, ``per_node`` a node."""
        pes: list[tuple[str, int]] = []
        for name in self.state.names_of(box):
            take = min(self.per_node, ranks - len(pes))
            if take <= 0:
                break
            pes.extend((name, pe) for pe in range(take))
        return Placement(0, tuple(pes))

    def fcfs(self, queue: Sequence[QueuedJob], first: int) -> int | None:
        """Start jobs in queue order from ``first``, each grown as much as it needs; the head's position."""
        for position in range(first, len(queue)):
            job = queue[position]
            size = self.size(job)
            if size is None:
                self.reasons[job.job_id] = self.too_big(job)
                continue
            box = self.place(size, None)
            if box is None:
                return position
            self.start(job, box, backfilled=False)
        return None

    def migrate(self, rule: Migration) -> bool:
        """The paper's migration (module docstring); True when it moved jobs."""
        torus, state = self.torus, self.state
        free = torus.nodes - self.taken.bit_count()
        before = self.largest
        if free < rule.min_free * torus.nodes or before > rule.max_share * free:
            return False
        state.migrations += 1
        movable = sorted(state.boxes, key=lambda job_id: (-state.boxes[job_id].volume, job_id))
        fixed = self.blocked
        for job_id, mask in state.masks.items():
            if job_id not in state.boxes:
                fixed |= mask  # held without a box (placed before the torus): never moved
        staying: set[int] = set()
        while True:
            taken = fixed
            for job_id in staying:
                taken |= state.masks[job_id]
            placed: dict[int, Box] = {}
            for job_id in movable:
                if job_id in staying:
                    continue
                box = torus.place(taken, state.boxes[job_id].volume)
                if box is None:
                    staying.add(job_id)
                    break
                placed[job_id] = box
                taken |= torus.mask(box)
            else:
                break
        if torus.largest_free(taken) <= before:
            return False  # cancelled: the largest free partition would not grow
        state.migrated += 1
        moved = [(job_id, box) for job_id, box in placed.items() if box != state.boxes[job_id]]
        # Out of their old boxes first, all of them, since a job's new box may be another's old one.
        ranks = {job_id: self.matrix.release(job_id) for job_id, _ in moved}
        for job_id, _ in moved:
            state.release(job_id)
        started = {start.job_id: i for i, start in enumerate(self.starts)}
        for job_id, box in moved:
            old = ranks[job_id]
            placement = self._placement(box, old.ranks if old is not None else box.volume * self.per_node)
            state.assign(job_id, box)
            self.matrix.assign(job_id, placement)
            at = started.get(job_id)
            if at is None:
                self.moves.append(Move(job_id, box, placement))
            else:  # started in this pass: it starts where it is now, and never ran elsewhere
                self.starts[at] = dataclasses.replace(self.starts[at], placement=placement, box=box)
        state.jobs_moved += len(moved)
        self._refresh()
        return True

    def backfill(self, head: QueuedJob, behind: Sequence[QueuedJob], growth: int) -> Reservation:
        """EASY on the torus (module docstring): the head's reservation, then the jobs behind it."""
        need = self.size(head)
        assert need is not None, "a head that no box can hold is skipped, never the head"
        shadow, at_shadow = self._shadow(need)
        torus = self.torus

        def leaves_head_a_box(mask: int) -> bool:
            return torus.has_free(at_shadow | mask, need)

        for job in behind:
            size = self.size(job)
            if size is None:
                self.reasons[job.job_id] = self.too_big(job)
                continue
            runtime = runtime_estimate(job.time_limit, 1)
            # An unlimited job never ends "before" the shadow, not even an infinite one.
            early = math.isfinite(runtime) and self.now + runtime <= shadow
            box = self.place(size, size + growth, None if early else leaves_head_a_box)
            if box is None:
                self.reasons[job.job_id] = PRIORITY
                continue
            self.start(job, box, backfilled=True)
            if not early:
                at_shadow |= torus.mask(box)
        return Reservation(head.job_id, 0, shadow, 0)

    def _shadow(self, need: int) -> tuple[float, int]:
        """When the head can start, as jobs end by their estimates, and the torus taken at that time."""
        ends = sorted((self._estimated_end(job_id), job_id) for job_id in self.state.masks)
        taken = self.taken
        i = 0
        while i < len(ends):
            end = ends[i][0]
            if math.isinf(end):
                break
            # Jobs ending at one instant free their nodes together.
            while i < len(ends) and ends[i][0] == end:
                taken &= ~self.state.masks[ends[i][1]]
                i += 1
            if self.torus.has_free(taken, need):
                return end, taken
        return math.inf, taken

    def _estimated_end(self, job_id: int) -> float:
        started = self.started_ends.get(job_id)
        if started is not None:
            return started
        job = self.running.get(job_id)
        if job is None:
            return math.inf
        # Past its estimate, a job may end any moment: counting it as ending now keeps the shadow time out
        # of the past (as mm/scheduler.py does).
        return max(self.now, job.start_time + runtime_estimate(job.time_limit, 1))

    def plan(self, reservation: Reservation | None) -> Plan:
        reservations = {reservation.job_id: reservation} if reservation is not None else {}
        return Plan(tuple(self.starts), reservation, self.reasons, reservations, tuple(self.moves))
