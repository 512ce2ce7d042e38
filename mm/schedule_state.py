"""What storm-mm's scheduling passes see, kept as jobs come and go: the queue, the running jobs, the matrix.

A pass (mm/scheduler.py) decides from three things: the queued jobs in first-come-first-served order, when
each placed job started and how long it may run, and the Ousterhout matrix. :class:`ScheduleState` keeps
them up to date between passes, so that a pass costs what the scheduler does and not a rebuild of its
inputs from the job records, and it is the one place that says how a pass's starts and a job's end change
them. storm-mm's RunTable (mm/runs.py) owns one beside its job records; ``storm sim`` drives one directly
when it replays batch workloads (tools/sim/fast.py), so both run the same decisions on the same state.

Two things refine the queue: a job's priority (its QOS's) puts it ahead of every job of a lower one (first
come, first served within a priority), and a moldable job's size is chosen at each pass until it starts
(mm/sizing.py). Preemption by suspension (mm/suspension.py) moves jobs between the matrix and
:attr:`ScheduleState.suspended`: :meth:`ScheduleState.preempt` and :meth:`ScheduleState.resume_free`.
"""

from __future__ import annotations

from collections.abc import Collection

from storm.mm.matrix import Matrix, Placement
from storm.mm.preemption import PreemptionRules
from storm.mm.scheduler import BACKFILL_MODES, Plan, QueuedJob, RunningJob, schedule
from storm.mm.sizing import HELD, pass_sizes, sized
from storm.mm.suspension import Candidate, Outlook, Suspended, Suspension, free_row, preemptions
from storm.mm.torus import Box
from storm.mm.torus_scheduler import TORUS_BACKFILL, Migration, schedule_torus
from storm.mm.torus_state import TorusState


class ScheduleState:
    """The scheduler's view of the jobs, on ``matrix``, passes run with ``backfill`` (see schedule()).

    With ``torus`` the cluster's nodes sit on a torus and every job holds a box of them: passes are
    mm/torus_scheduler.py's (``backfill`` "none" or "easy": the BlueGene/L paper's FCFS and backfilling),
    placing jobs in both the torus and the matrix. ``migration`` adds the paper's migration to those passes:
    only the simulator asks for it (storm cannot move a running MPI job), and reads each pass's moves.
    ``subset``: moldable jobs are sized by RTC-ADSUBSET rather than RTC-AD (mm/sizing.py).
    """

    def __init__(
        self,
        matrix: Matrix,
        backfill: str = "easy",
        torus: TorusState | None = None,
        migration: Migration | None = None,
        *,
        subset: bool = False,
    ) -> None:
        if backfill not in BACKFILL_MODES:
            raise ValueError(f"backfill must be one of {', '.join(BACKFILL_MODES)}, not {backfill!r}")
        if torus is not None and backfill not in TORUS_BACKFILL:
            raise ValueError(
                f"backfill on a torus must be one of {', '.join(TORUS_BACKFILL)}, not {backfill!r}"
            )
        if migration is not None and torus is None:
            raise ValueError("migration re-places jobs on a torus: it needs one")
        self.matrix = matrix
        self.backfill = backfill
        self.torus = torus
        self.migration = migration
        # In the order jobs joined the queue (submission, or a requeue), which is the FCFS order.
        self.queued: dict[int, QueuedJob] = {}
        # Every placed job: start and limit never change while it holds its PEs (a resume places it anew).
        self.running: dict[int, RunningJob] = {}
        self.subset = subset
        # Queued moldable jobs: (least, most) ranks. Jobs of a priority other than 0, queued, placed or
        # suspended. When each placed job started or last resumed (preemption's minimum run counts from it).
        self.ranges: dict[int, tuple[int, int]] = {}
        self.priorities: dict[int, int] = {}
        self.since: dict[int, float] = {}
        # Jobs preemption suspended, out of the matrix, in the order they were suspended.
        self.suspended: dict[int, Suspended] = {}

    def enqueue(
        self, job_id: int, ranks: int, time_limit: float | None, *, max_ranks: int = 0, priority: int = 0
    ) -> None:
        """The job joins the end of the queue, ``ranks`` to ``max_ranks`` of them if it is moldable
        (ValueError if it is queued, placed or suspended already)."""
        if job_id in self.queued or job_id in self.running or job_id in self.suspended:
            raise ValueError(f"job {job_id} is queued or placed already")
        self.queued[job_id] = QueuedJob(job_id=job_id, ranks=ranks, time_limit=time_limit)
        if max_ranks > ranks:
            self.ranges[job_id] = (ranks, max_ranks)
        if priority:
            self.priorities[job_id] = priority

    def withdraw(self, job_id: int) -> None:
        """The job leaves the queue without starting (a cancel)."""
        del self.queued[job_id]
        self.ranges.pop(job_id, None)
        self.priorities.pop(job_id, None)

    def place(
        self,
        job_id: int,
        placement: Placement,
        start_time: float,
        time_limit: float | None,
        box: Box | None = None,
        *,
        priority: int = 0,
        since: float | None = None,
    ) -> None:
        """A job placed before this state existed (a restarted MM) takes its PEs again, and on a torus its
        box (or, placed without one, the nodes its ranks are on). ``since``: its last resume, if any."""
        self.matrix.assign(job_id, placement)
        if priority:
            self.priorities[job_id] = priority
        self.since[job_id] = start_time if since is None else since
        if self.torus is not None:
            try:
                if box is None:
                    raise ValueError("placed without a box")
                self.torus.assign(job_id, box)
            except ValueError:
                # Placed on a flat network, or on a torus configured otherwise then: it holds its nodes.
                self.torus.assign_nodes(job_id, placement.nodes)
        self.running[job_id] = RunningJob(job_id, start_time, time_limit)

    def hold(self, job: Suspended) -> None:
        """A job suspended before this state existed (a restarted MM): its ranks wait on their PEs."""
        self.suspended[job.job_id] = job
        if job.priority:
            self.priorities[job.job_id] = job.priority

    def end(self, job_id: int) -> Placement | None:
        """The job's PEs (and torus nodes) are free; its placement (None if it held none)."""
        self.running.pop(job_id, None)
        self.since.pop(job_id, None)
        self.priorities.pop(job_id, None)
        self.suspended.pop(job_id, None)
        if self.torus is not None:
            self.torus.release(job_id)
        return self.matrix.release(job_id)

    def run_pass(self, now: float, usable: Collection[str] | None = None, held: Collection[int] = ()) -> Plan:
        """One pass at ``now`` over the queue, less the ``held`` jobs, on the nodes in ``usable`` (None:
        all). The jobs it starts are in the matrix and running from ``now`` when it returns.

        Cost: the scheduler's (schedule()), plus O(q) for q queued jobs only when some are held."""
        queued = self.queued
        queue = list(queued.values())
        if held:
            queue = [job for job in queue if job.job_id not in held]
        if self.priorities:  # a stable sort: first come, first served within a priority
            priorities = self.priorities
            queue.sort(key=lambda job: -priorities.get(job.job_id, 0))
        holds: frozenset[int] = frozenset()
        if self.ranges:
            free = max(self.matrix.free_pes(row, usable) for row in range(self.matrix.mpl))
            in_system = len(queued) + len(self.running) + len(self.suspended)
            sizes, holds = pass_sizes(queue, self.ranges, free, jobs_in_system=in_system, subset=self.subset)
            queue = sized(queue, sizes, holds)
        if self.torus is not None:
            plan = schedule_torus(
                now, queue, self.running, self.torus, self.matrix, usable=usable, backfill=self.backfill,
                migration=self.migration,
            )  # fmt: skip
        else:
            plan = schedule(now, queue, self.running, self.matrix, usable, backfill=self.backfill)
        for start in plan.starts:
            job = queued.pop(start.job_id)
            self.ranges.pop(job.job_id, None)
            self.running[job.job_id] = RunningJob(job.job_id, now, job.time_limit)
            self.since[job.job_id] = now
        for job_id in holds:
            plan.reasons[job_id] = HELD
        return plan

    # ------------------------------------------------------------------------------------------ preemption

    def resume_free(
        self, now: float, usable: Collection[str] | None = None, *, deferring: bool = False
    ) -> list[tuple[int, int]]:
        """Suspended jobs whose PEs are all free in some row go back into the matrix, in the lowest such row:
        the highest priority first, then the earliest suspended. With ``deferring``, those that a queued job
        outranks wait (the pass may give it their PEs first). Returns (job id, row) per resume, done.
        O(s x mpl x PEs of a job) for s suspended jobs."""
        if not self.suspended:
            return []
        top = max((self.priorities.get(j, 0) for j in self.queued), default=None) if deferring else None
        order = sorted(self.suspended.values(), key=lambda s: (-s.priority, s.at, s.job_id))
        resumed = []
        for job in order:
            if top is not None and top > job.priority:
                continue
            row = free_row(self.matrix, job.pes, usable)
            if row is not None:
                self._resume(job, row, now)
                resumed.append((job.job_id, row))
        return resumed

    def preempt(
        self,
        now: float,
        rules: PreemptionRules,
        usable: Collection[str] | None = None,
        *,
        exempt: Collection[int] = (),
        held: Collection[int] = (),
    ) -> tuple[list[Suspension], dict[int, Outlook]]:
        """Suspend what queued and suspended jobs of a higher priority may suspend now (mm/suspension.py),
        and place them: a queued job leaves the queue, running from ``now`` on its PEs, a suspended one
        resumes. ``exempt``: placed jobs not to suspend (starting, ending); ``held``: queued jobs that may
        not start. Returns what was done, and when the others could. Not on a torus. O(1) when every job
        has priority 0, O(q + r) when no queued or suspended job outranks a running one; else add
        mm/suspension.py's cost."""
        priorities = self.priorities
        if self.torus is not None or not self.running or not priorities:  # no priorities: all are equal
            return [], {}
        lowest = min(priorities.get(j, 0) for j in self.running)
        pending = [
            Candidate(job_id, self.ranges.get(job_id, (job.ranks, 0))[0], priorities.get(job_id, 0))
            for job_id, job in self.queued.items()
            if priorities.get(job_id, 0) > lowest and job_id not in held
        ]
        waiting = [s for s in self.suspended.values() if s.priority > lowest]
        if not pending and not waiting:
            return [], {}
        running = {
            j: (self.since.get(j, r.start_time), priorities.get(j, 0)) for j, r in self.running.items()
        }
        found, outlook = preemptions(
            now, self.matrix, pending, waiting, running, rules=rules, usable=usable, exempt=exempt
        )
        for suspension in found:
            for victim in suspension.victims:
                self._suspend(victim, now)
            if suspension.resumed:
                self._resume(self.suspended[suspension.by], suspension.placement.row, now)
            else:
                job = self.queued.pop(suspension.by)
                self.ranges.pop(job.job_id, None)
                self.matrix.assign(job.job_id, suspension.placement)
                self.running[job.job_id] = RunningJob(job.job_id, now, job.time_limit)
                self.since[job.job_id] = now
        return found, outlook

    def _suspend(self, job_id: int, now: float) -> None:
        placement = self.matrix.release(job_id)
        assert placement is not None, "only placed jobs are suspended"
        run = self.running.pop(job_id)
        self.since.pop(job_id, None)
        self.suspended[job_id] = Suspended(
            job_id, placement.pes, self.priorities.get(job_id, 0), run.time_limit, now - run.start_time, now
        )

    def _resume(self, job: Suspended, row: int, now: float) -> None:
        self.matrix.assign(job.job_id, Placement(row, job.pes))
        del self.suspended[job.job_id]
        # Backfilling's estimate of its end goes on from where it stopped.
        self.running[job.job_id] = RunningJob(job.job_id, now - job.ran, job.time_limit)
        self.since[job.job_id] = now
