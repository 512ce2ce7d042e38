"""What storm-mm's scheduling passes see, kept as jobs come and go: the queue, the running jobs, the matrix.

A pass (mm/scheduler.py) decides from three things: the queued jobs in first-come-first-served order, when
each placed job started and how long it may run, and the Ousterhout matrix. :class:`ScheduleState` keeps
them up to date between passes, so that a pass costs what the scheduler does and not a rebuild of its
inputs from the job records, and it is the one place that says how a pass's starts and a job's end change
them. storm-mm's RunTable (mm/runs.py) owns one beside its job records; ``storm sim`` drives one directly
when it replays batch workloads (tools/sim/fast.py), so both run the same decisions on the same state.
"""

from __future__ import annotations

from collections.abc import Collection

from storm.mm.matrix import Matrix, Placement
from storm.mm.scheduler import BACKFILL_MODES, Plan, QueuedJob, RunningJob, schedule
from storm.mm.torus import Box
from storm.mm.torus_scheduler import TORUS_BACKFILL, Migration, schedule_torus
from storm.mm.torus_state import TorusState


class ScheduleState:
    """The scheduler's view of the jobs, on ``matrix``, passes run with ``backfill`` (see schedule()).

    With ``torus`` the cluster's nodes sit on a torus and every job holds a box of them: passes are
    mm/torus_scheduler.py's (``backfill`` "none" or "easy": the BlueGene/L paper's FCFS and backfilling),
    placing jobs in both the torus and the matrix. ``migration`` adds the paper's migration to those passes:
    only the simulator asks for it (storm cannot move a running MPI job), and reads each pass's moves.
    """

    def __init__(
        self,
        matrix: Matrix,
        backfill: str = "easy",
        torus: TorusState | None = None,
        migration: Migration | None = None,
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
        # Every placed job: start and limit never change while it holds its PEs.
        self.running: dict[int, RunningJob] = {}

    def enqueue(self, job_id: int, ranks: int, time_limit: float | None) -> None:
        """The job joins the end of the queue (ValueError if it is queued or placed already)."""
        if job_id in self.queued or job_id in self.running:
            raise ValueError(f"job {job_id} is queued or placed already")
        self.queued[job_id] = QueuedJob(job_id=job_id, ranks=ranks, time_limit=time_limit)

    def withdraw(self, job_id: int) -> None:
        """The job leaves the queue without starting (a cancel)."""
        del self.queued[job_id]

    def place(
        self,
        job_id: int,
        placement: Placement,
        start_time: float,
        time_limit: float | None,
        box: Box | None = None,
    ) -> None:
        """A job placed before this state existed (a restarted MM) takes its PEs again, and on a torus its
        box (or, placed without one, the nodes its ranks are on)."""
        self.matrix.assign(job_id, placement)
        if self.torus is not None:
            try:
                if box is None:
                    raise ValueError("placed without a box")
                self.torus.assign(job_id, box)
            except ValueError:
                # Placed on a flat network, or on a torus configured otherwise then: it holds its nodes.
                self.torus.assign_nodes(job_id, placement.nodes)
        self.running[job_id] = RunningJob(job_id, start_time, time_limit)

    def end(self, job_id: int) -> Placement | None:
        """The job's PEs (and torus nodes) are free; its placement (None if it held none)."""
        self.running.pop(job_id, None)
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
        if self.torus is not None:
            plan = schedule_torus(
                now, queue, self.running, self.torus, self.matrix, usable=usable, backfill=self.backfill,
                migration=self.migration,
            )  # fmt: skip
        else:
            plan = schedule(now, queue, self.running, self.matrix, usable, backfill=self.backfill)
        for start in plan.starts:
            job = queued.pop(start.job_id)
            self.running[job.job_id] = RunningJob(job.job_id, now, job.time_limit)
        return plan
