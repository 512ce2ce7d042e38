"""The MM's jobs from placement to their end: the steps of a run, whatever made it move.

A job holds its PEs from STARTING until every node it ran on has reported its ranks gone (or is DOWN): a job
that is being killed keeps its PEs, so a new job never lands on a PE whose old rank still runs. For the same
reason a node that comes back from DOWN takes no new job until it has stopped what it still ran.

When storm ends a job itself (a cancel, a time limit, a failed rank, a lost node) it first records the
*ending* (the terminal state it is heading for and why) in the store, then tells every node to stop the
ranks; the job reaches that state once the last node has reported. A restarted MM finishes what it began.

A job submitted with ``requeue`` that is heading for NODE_FAIL goes back to the queue instead (at most
``max_requeues`` times), with the same id. Nothing of its last run may count for the next: it runs again
only once the last run's nodes that are UP have stopped reporting on it (mm/requeue.py); a lost node, whose
ranks may still run (a partition), is not placed again until it has stopped them, and what it says of the
last run (a launch, a failed rank, a final report) is not taken for the next, which runs on other nodes.

A queued job with a dependency that does not hold yet, or an array task past its array's ``%N``, is
pending but out of the passes' queue: mm/holds.py keeps it, indexed by what releases it, and
:meth:`RunTable.settle` queues what it released (or ends a job whose dependency never can hold).

MPI's name service (:class:`~storm.mm.names.Names`) lives with the runs, since a name lives as long as the
run that published it.

What jobs spawned (MPI_Comm_spawn, counted as node managers report it) is kept durably in the store's meta
table under ``spawns:<job id>``, over all of a job's runs, for ``storm show``; a spawn reported while the MM
was down is not counted.

The Controller (mm/core.py) owns a :class:`RunTable` and decides when, from what arrives; everything here is
called from it. A step that has something to say to a node or to a job's waiting clients appends it to the
effect list ``out`` of the stimulus being handled (mm/effects.py), after the store has it. No step runs a
scheduling pass: what may let a queued job start (a submission, a run's end or requeue, a node that comes up
or stops draining) makes one due (:meth:`RunTable.want_pass`), and the Controller's driver has it run
(:meth:`RunTable.schedule`) when it chooses.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from storm.mm.accounting import usage
from storm.mm.arrays import task_env
from storm.mm.config import MMConfig
from storm.mm.effects import Effect, JobEnded, Send
from storm.mm.holds import NEVER, Holds, array_tasks
from storm.mm.jobs import Job, advance, outcome, requeue
from storm.mm.matrix import Matrix, Placement
from storm.mm.names import Names
from storm.mm.nodes import UP, NodeRegistry
from storm.mm.protocol import (
    FcsParameters,
    JobRows,
    JobSpawned,
    KillJob,
    LaunchJob,
    Policy,
    RankExit,
    RankSlot,
    ResumeJob,
    SpawnsView,
    SuspendJob,
)
from storm.mm.reports import Reports
from storm.mm.requeue import Echoes
from storm.mm.schedule_state import ScheduleState
from storm.mm.scheduler import Start
from storm.mm.slots import GangCycle
from storm.mm.states import JobState
from storm.mm.storage import Storage
from storm.mm.streams import OutputRelay
from storm.mm.suspension import Suspended
from storm.mm.tally import Tally
from storm.mm.torus_state import TorusState

log = logging.getLogger("storm.mm")


@dataclass
class Tracking:
    """What the MM knows of an active job's ranks, node by node (memory only: nodes report it again, and a
    restarted MM rebuilds a starting job's launches from the store, its kvsname included)."""

    kvsname: str = ""
    hosts: tuple[int, ...] = ()  # each node's host, as its launches give them
    launched: set[str] = field(default_factory=set)
    # Nodes whose ranks of the job are gone, with their exits (empty for a node that was lost).
    done: dict[str, tuple[RankExit, ...]] = field(default_factory=dict)
    # Nodes written off without confirming their ranks gone (lost, or silent past kill_timeout).
    written_off: set[str] = field(default_factory=set)
    kill_time: float | None = None
    barriers: dict[int, dict[str, dict[str, str]]] = field(default_factory=dict)
    # The last barrier completed: (seq, merged kvs), kept durably until the job ends.
    last_barrier: tuple[int, dict[str, str]] | None = None
    # Each node's launch until the job runs: sent again to a node whose NM restarted before it arrived.
    launches: dict[str, LaunchJob] = field(default_factory=dict)
    # Spawns already counted, by (node, world): a node manager may report one again after a restart.
    spawned: set[tuple[str, int]] = field(default_factory=set)


@functools.lru_cache(maxsize=1 << 16)
def _slot(rank: int, pe: int) -> RankSlot:
    """One rank's slot, shared between launches: a record is immutable, and a launch carries one per rank
    (its check costs more than the rest of a small job's start in a simulator)."""
    return RankSlot(rank=rank, pe=pe)


def spawn_counts(raw: str | None, job_id: int) -> SpawnsView:
    """A job's spawn counts as the store's meta table keeps them (zero if it never spawned)."""
    try:
        data = json.loads(raw) if raw else {}
        return SpawnsView(
            job_id=job_id, **{k: data[k] for k in ("spawns", "processes", "refused", "last_refusal")}
        )
    except (ValueError, TypeError, KeyError):
        return SpawnsView(job_id=job_id)


def seeded_nonces(seed: int | str) -> Callable[[], str]:
    """Kvsname nonces that are the same for the same seed: for tests and a simulator (storm-mm draws its
    own from the OS, see mm/daemon.py)."""
    rng = random.Random(seed)
    return lambda: f"{rng.getrandbits(32):08x}"


class RunTable:
    """The MM's jobs, queued and placed, and what a run goes through: its start on its nodes, its end
    everywhere, its finish (or requeue) once every node has reported, and the start of what its PEs free.

    ``nonce`` gives the random part of each run's kvsname (8 hex digits); ``registry`` is the Controller's.
    """

    def __init__(
        self,
        store: Storage,
        config: MMConfig,
        registry: NodeRegistry,
        nonce: Callable[[], str],
        *,
        policy: str = Policy.BATCH,
        fcs: FcsParameters,
    ) -> None:
        self.store = store
        self.config = config
        self.registry = registry
        self.nonce = nonce
        # Under gang and FCS the rows take turns with heartbeats; in batch and sb every placed job may run.
        tslots_max = fcs.tslots_max if policy == Policy.FCS else None
        self.cycle = GangCycle(config.slice, tslots_max) if Policy(policy).cycles else None
        self.matrix = Matrix(config.mpl)
        self.pending: dict[int, Job] = {}
        self.active: dict[int, Job] = {}
        self.tracking: dict[int, Tracking] = {}
        self.reasons: dict[int, str] = {}
        # Requeued jobs waiting for the last run's reports to stop arriving (see mm/requeue.py).
        self.echoes = Echoes()
        self.reports = Reports(store)
        self.names = Names()
        self.streams = OutputRelay()  # clients attached to streamed jobs' output (storm run)
        self.pass_due = False  # see want_pass
        self.classifies = Policy(policy).classifies  # FCS: a job's time per class is stored as it ends
        # The queue and the placed jobs as the scheduler sees them: every job that enters or leaves
        # ``pending`` does so through enqueue() and withdraw() (or a pass's starts) to keep them in step.
        layout = config.torus_layout()
        self.torus = None if layout is None else TorusState(layout)
        self.state = ScheduleState(
            self.matrix, config.backfill, self.torus, subset=config.moldable == "subset"
        )
        self.rules = config.preemption_rules()  # None: preemption is off
        # Queued jobs a pass does not see until a dependency or their array's limit lets them (mm/holds.py).
        self.holds = Holds(self.job, store.array_tasks)
        self.passes = 0  # passes run so far: what coalescing saves is counted by tests and benchmarks
        self.tally = Tally()  # runs started, ended and requeued, for the metrics (mm/metrics.py)

    def job(self, job_id: int) -> Job | None:
        """A job wherever it is: queued, placed, or (ended) in the store."""
        return self.pending.get(job_id) or self.active.get(job_id) or self.store.get_job(job_id)

    def suspended(self, job: Job, now: float) -> float:
        """Seconds the job's ranks have been stopped by gang scheduling or preemption, up to now."""
        if job.suspended_at is not None:  # preempted: out of the matrix, the cycle no longer counts it
            return job.suspended_time + max(0.0, now - job.suspended_at)
        if self.cycle is None or job.row is None:
            return job.suspended_time
        return self.cycle.suspended_time(job.id, job.row, now)

    def recover(self, now: float) -> None:
        """Rebuild the table from the store after a restart: queued jobs wait, placed jobs keep their PEs
        until their nodes report (the Controller then writes off those on nodes that were DOWN)."""
        # DOWN ones too: they may come back. All at once: one rebuild of the free counts, not one per node.
        self.matrix.add_nodes({node.name: node.pes for node in self.registry.all()})
        barriers = self.store.barriers()
        node_exits = self.store.node_exits()  # nodes that had finished their part of a running job
        wireups = self.store.wireups()
        queued = []
        for job in self.store.jobs(active_only=True):
            if job.state is JobState.PENDING:
                queued.append(job)  # admitted once every placed job holds its array's slot again
                continue
            self.active[job.id] = job
            self.holds.running(job)
            launched = set(job.nodes) if job.state is JobState.RUNNING else set()
            kvsname, hosts = wireups.get(job.id, ("", ()))
            track = self.tracking[job.id] = Tracking(
                kvsname=kvsname,
                hosts=hosts,
                launched=launched,
                done=dict(node_exits.get(job.id, {})),
                kill_time=now if job.ending else None,
                last_barrier=barriers.get(job.id),
            )
            if job.state is JobState.STARTING and track.kvsname:  # none if placed by an older storm-mm
                # A launch may have been lost with the old MM: the Controller sends it again to a node that
                # registers without listing the job (nodes that do are taken as launched).
                track.launches = self.launches(job, track)
            started = job.start_time if job.start_time is not None else now  # stored by an older storm-mm
            if job.suspended_at is not None:  # its ranks wait stopped on their PEs, which others may hold
                ran = max(0.0, job.suspended_at - started - job.suspended_time)
                pes = job.placement
                self.state.hold(
                    Suspended(job.id, pes, job.spec.priority, job.spec.time_limit, ran, job.suspended_at)
                )
                continue
            placement = Placement(job.row or 0, job.placement)
            self.state.place(
                job.id, placement, started, job.spec.time_limit, job.box, priority=job.spec.priority,
                since=job.resumed_at,
            )  # fmt: skip
            if self.cycle is not None:
                self.cycle.add(job.id, now, job.suspended_time)
        for job in queued:
            self.enqueue(job)

    def enqueue(self, job: Job) -> None:
        """A pending job (a submission, a recovered or requeued job) joins the end of the queue, unless a
        dependency or its array's limit holds it (mm/holds.py): then it joins when released (see settle)."""
        self.pending[job.id] = job
        if (job.array_id is None and not job.spec.dependency) or self.holds.admit(job):
            self._queue(job)

    def _queue(self, job: Job) -> None:
        spec = job.spec
        self.state.enqueue(
            job.id, spec.ranks, spec.time_limit, max_ranks=spec.max_ranks, priority=spec.priority
        )

    def withdraw(self, job_id: int) -> Job:
        """A pending job leaves the queue (or the holds) without starting (a cancel); its record."""
        if job_id in self.state.queued:
            self.state.withdraw(job_id)
        return self.pending.pop(job_id)

    def settle(self, now: float, out: list[Effect]) -> None:
        """What the holds released since the last call: jobs join the end of the queue (a pass is due), and
        jobs whose dependency can never hold end CANCELLED, saying why; their own dependents are judged in
        turn. O(what was released). Call it after any stimulus that may start or end a job."""
        while True:
            ready, doomed = self.holds.take()
            if not ready and not doomed:
                return
            for job_id in ready:
                job = self.pending.get(job_id)
                if job is not None:
                    self._queue(job)
                    self.want_pass()
            for job_id, why in doomed:
                if job_id in self.pending:
                    job = self.withdraw(job_id)
                    self.finish(advance(job, JobState.CANCELLED, now, reason=f"{NEVER}: {why}"), out)

    def want_pass(self) -> None:
        """Something may let a queued job start: a pass is due. Many of these between two passes cost one,
        which starts the same jobs as one pass after each would have, for the stimuli of one instant."""
        self.pass_due = True

    def schedule(self, now: float, out: list[Effect]) -> None:
        """One scheduling pass: start what fits, note why the rest waits (Controller.schedule runs it).

        With suspended jobs or preemption, in this order: suspended jobs whose PEs are free resume (unless a
        queued job outranks them), jobs of a higher priority suspend what they may (mm/suspension.py), the
        pass starts what fits, and suspended jobs whose PEs are still free resume."""
        self.pass_due = False
        self.passes += 1
        state = self.state
        if not self.pending and not state.suspended:
            self.reasons = {}
            return
        held = self.echoes.held(self.pending)
        usable = self.registry.usable()
        for job_id, row in state.resume_free(now, usable, deferring=True):
            self._resumed(job_id, row, now, out)
        waits: dict[int, str] = {}
        if self.rules is not None and (self.pending or state.suspended):
            found, outlook = state.preempt(now, self.rules, usable, exempt=self._exempt(), held=held)
            for suspension in found:
                for victim in suspension.victims:
                    self._suspended(victim, suspension.by, now, out)
                if suspension.resumed:
                    self._resumed(suspension.by, suspension.placement.row, now, out)
                else:
                    start = Start(suspension.by, suspension.placement, backfilled=False)
                    self._start(self.pending.pop(suspension.by), start, now, out)
            for job_id, later in outlook.items():
                victims = ", ".join(map(str, later.victims))
                waits[job_id] = (
                    f"may suspend job(s) {victims} in {later.at - now:.0f} s (their minimum run time)"
                )
        self.reasons = {}
        if self.pending:
            plan = state.run_pass(now, usable, held)
            self.reasons = dict(plan.reasons)
            for job_id, nodes in held.items():
                self.reasons[job_id] = (
                    f"Requeued: last run's reports still due from {','.join(sorted(nodes))}"
                )
            for start in plan.starts:
                self._start(self.pending.pop(start.job_id), start, now, out)
        for job_id, wait in waits.items():
            if job_id in self.reasons:
                self.reasons[job_id] = f"{self.reasons[job_id]}; {wait}"
        for job_id, row in state.resume_free(now, usable):
            self._resumed(job_id, row, now, out)
        self.settle(now, out)  # jobs waiting for these starts (after:ID)

    def _exempt(self) -> set[int]:
        """Placed jobs that may not be suspended: those starting (their ranks may not exist yet) or ending."""
        return {j.id for j in self.active.values() if j.state is not JobState.RUNNING or j.ending is not None}

    def _suspended(self, job_id: int, by: int, now: float, out: list[Effect]) -> None:
        """The job left the matrix for ``by``: stored suspended (its gang-stopped time so far kept), then
        every node of it is told to stop its ranks."""
        job = self.active[job_id]
        stopped = job.suspended_time
        if self.cycle is not None and job.row is not None:
            stopped = self.cycle.pause(job_id, job.row, now)
        preemptor = self.pending.get(by) or self.active.get(by)
        qos = (
            f" (QOS {preemptor.spec.qos or 'normal'}, priority {preemptor.spec.priority})"
            if preemptor
            else ""
        )
        job = dataclasses.replace(
            job, suspended_by=by, suspended_at=now, suspended_time=stopped, row=None,
            reason=f"Suspended by job {by}{qos}",
        )  # fmt: skip
        self.store.save_job(job)
        self.active[job_id] = job
        track = self.tracking[job_id]
        out.extend(
            Send(node, SuspendJob(job_id=job_id, by=by)) for node in job.nodes if node not in track.done
        )
        log.info("job %d suspended by job %d", job_id, by)

    def _resumed(self, job_id: int, row: int, now: float, out: list[Effect]) -> None:
        """The job is back in the matrix, in ``row``: stored running, then its nodes continue its ranks."""
        job = self.active[job_id]
        assert job.suspended_at is not None
        stopped = job.suspended_time + max(0.0, now - job.suspended_at)
        job = dataclasses.replace(
            job,
            suspended_by=None,
            suspended_at=None,
            resumed_at=now,
            suspended_time=stopped,
            row=row,
            reason="",
        )
        self.store.save_job(job)
        self.active[job_id] = job
        if self.cycle is not None:
            self.cycle.add(job_id, now, stopped)
        track = self.tracking[job_id]
        out.extend(
            Send(node, ResumeJob(job_id=job_id, row=row)) for node in job.nodes if node not in track.done
        )
        log.info("job %d resumed in row %d", job_id, row)

    def _start(self, job: Job, start: Start, now: float, out: list[Effect]) -> None:
        placement = start.placement
        job = advance(
            job, JobState.STARTING, now, placement=placement.pes, row=placement.row, reason="", box=start.box
        )
        # Random per run: MPICH names a node's shared memory after it, so a requeued job's next run must not
        # meet segments its last one may still leave behind, nor a job of another store with the same id.
        # Stored with the placement (one commit) before any launch goes out: a restarted MM sends the same.
        track = Tracking(kvsname=f"storm_{job.id}_{self.nonce()}", hosts=self.registry.hosts(job.nodes))
        with self.store.transaction():
            self.store.save_job(job)
            self.store.save_wireup(job.id, track.kvsname, track.hosts)
        self.active[job.id] = job
        self.tracking[job.id] = track
        self.holds.started(job)
        self.tally.started += 1
        if self.cycle is not None:
            self.cycle.add(job.id, now)
        track.launches = self.launches(job, track)
        out.extend(Send(node, launch) for node, launch in track.launches.items())
        where = f" (box {job.box})" if job.box is not None else ""
        if job.spec.moldable:
            where += f" with {job.ranks} ranks (asked {job.spec.ranks}-{job.spec.max_ranks})"
        # At DEBUG: its end's line says where it ran, and two lines per job cost a stream of short jobs
        # about a twentieth of storm-mm's time.
        log.debug("job %d started on %s%s", job.id, ",".join(job.nodes), where)

    def launches(self, job: Job, track: Tracking) -> dict[str, LaunchJob]:
        """Each node's launch of a placed job, from what the store keeps: a restarted MM rebuilds them."""
        per_node: dict[str, list[RankSlot]] = {}  # one walk of the placement, not one per node
        for rank, (node, pe) in enumerate(job.placement):
            per_node.setdefault(node, []).append(_slot(rank, pe))
        nodes = job.nodes
        counts = tuple(len(per_node[node]) for node in nodes)
        spec = job.spec
        env, output, error = spec.env, job.output_pattern(spec.output), job.output_pattern(spec.error)
        if job.array_id is not None:  # the task's own STORM_ARRAY_* (its spec is the whole array's)
            env = {**env, **task_env(job.array_id, job.array_task or 0, array_tasks(spec.array)[0])}
        launches = {}
        for index, node in enumerate(nodes):
            slots = tuple(per_node[node])
            launches[node] = LaunchJob(
                job_id=job.id, name=spec.name, kvsname=track.kvsname, size=job.ranks, row=job.row or 0,
                node_index=index, ranks_per_node=counts, hosts=track.hosts, slots=slots, argv=spec.argv,
                cwd=spec.cwd, env=env, uid=spec.uid, gid=spec.gid, user=spec.user, output=output,
                error=error, hook=spec.hook, stream=spec.stream,
            )  # fmt: skip
        return launches

    def launched(self, job: Job, node: str, now: float) -> None:
        """The node's ranks of the job exist: once every node's do, a starting job is RUNNING."""
        track = self.tracking[job.id]
        track.launched.add(node)
        launched, nodes = track.launched, job.nodes  # lengths first: sets cost O(k) per report of k
        if job.state is JobState.STARTING and len(launched) >= len(nodes) and launched >= set(nodes):
            track.launches.clear()
            job = advance(job, JobState.RUNNING, now, start_time=job.start_time)
            self.store.save_job(job)
            self.active[job.id] = job

    def node_lost(self, job: Job, node: str, reason: str, now: float, out: list[Effect]) -> None:
        """The node's ranks of the job are written off: nothing more is expected from it."""
        track = self.tracking[job.id]
        if node not in track.done:
            track.done[node] = ()
            track.written_off.add(node)
        self.end(job, JobState.NODE_FAIL, reason, now, out)

    def end(
        self,
        job: Job,
        state: JobState,
        reason: str,
        now: float,
        out: list[Effect],
        *,
        exit_code: int | None = None,
    ) -> None:
        """Stop a job everywhere. The first ending is the one that counts; it is stored before any kill."""
        track = self.tracking[job.id]
        if job.ending is None:
            job = dataclasses.replace(job, ending=state, exit_code=exit_code, reason=reason)
            self.store.save_job(job)
            self.active[job.id] = job
            track.kill_time = now
            log.info("job %d ending %s: %s", job.id, state.value, reason)
        for node in job.nodes:
            if node not in track.done:
                out.append(Send(node, KillJob(job_id=job.id, reason=job.reason)))
        self.maybe_finish(job.id, now, out)

    def maybe_finish(self, job_id: int, now: float, out: list[Effect]) -> None:
        job = self.active.get(job_id)
        if job is None:
            return
        track = self.tracking[job_id]
        # The lengths first: a job on k nodes is asked once per node report, and sets cost O(k) each.
        if len(track.done) < len(job.nodes) or not set(track.done) >= set(job.nodes):
            return
        exits = [e for node in job.nodes for e in track.done[node]]
        if job.ending is not None:
            state, code, reason = job.ending, job.exit_code, job.reason
            if code is None:
                code = next((e.status for e in exits if e.failed), None)
        else:
            state, code, reason = outcome(exits)
        again = state is JobState.NODE_FAIL and job.spec.requeue
        if again and job.requeues >= self.config.max_requeues:
            again = False
            reason = f"{reason} (not requeued again: max_requeues is {self.config.max_requeues})"
        suspended = job.suspended_time
        if self.cycle is not None:
            self.cycle.account(now, {j: p.row for j, p in self.matrix.jobs().items()})
            suspended = self.cycle.forget(job_id)
        if job.suspended_at is not None:  # ended while preemption held it (cancelled, a node lost)
            suspended = job.suspended_time + max(0.0, now - job.suspended_at)
            job = dataclasses.replace(job, suspended_by=None, suspended_at=None)
        if track.last_barrier is not None:
            self.store.forget_barrier(job_id)  # the next run wires up afresh
        if len(job.nodes) > 1:
            self.store.forget_node_exits(job_id)  # only jobs on several nodes store them
        self.reports.forget(job_id)
        if self.names.forget(job_id):
            log.info("job %d: its published names are gone with it", job_id)
        del self.active[job_id]
        del self.tracking[job_id]
        self.state.end(job_id)
        if again:
            self._requeue(job, track)
        else:
            ended = advance(job, state, now, exit_code=code, reason=reason, suspended_time=suspended)
            changes = self.store.class_changes((job_id,)) if self.classifies else None
            self.store.save_usage(job_id, usage(exits, changes, job.ranks, job.start_time, now))
            self.finish(ended, out)
        self._compact(out)
        self.settle(now, out)  # jobs waiting for its end (afterany:ID...), or for its array slot
        self.want_pass()  # its PEs are free: what waited for them starts at the next pass, not the next tick

    def _requeue(self, job: Job, track: Tracking) -> None:
        """Back to the queue, stored before anything else: the next run starts from scratch, same id."""
        last_run = job.nodes
        job = requeue(job, f"requeued {job.requeues + 1}/{self.config.max_requeues} after {job.reason}")
        self.store.save_job(job)
        self.enqueue(job)
        self.tally.requeued += 1
        up = {n.name for n in self.registry.all() if n.state == UP and n.confirmed}
        self.echoes.add(job.id, up.intersection(last_run))
        # An UP node that never confirmed its ranks gone may still run them under this id: it takes no job
        # (above all not this one) until its reports stop listing it. A DOWN node is sorted out when it
        # registers again, listing the job (see the Controller's _stop_if_over).
        for name in track.written_off:
            node = self.registry.get(name)
            if node is not None and node.state == UP and node.confirmed:
                node.stale.add(job.id)
        log.info("job %d %s", job.id, job.reason)

    def _compact(self, out: list[Effect]) -> None:
        """Move jobs into lower rows freed by an ending job, and tell their nodes."""
        moved = self.matrix.compact()
        by_node: dict[str, dict[str, int]] = {}
        for job_id, row in moved.items():
            job = dataclasses.replace(self.active[job_id], row=row)
            self.store.save_job(job)
            self.active[job_id] = job
            track = self.tracking[job_id]  # a launch sent again must name the row the job now has
            track.launches = {n: dataclasses.replace(launch, row=row) for n, launch in track.launches.items()}
            for node in job.nodes:
                by_node.setdefault(node, {})[str(job_id)] = row
        out.extend(Send(node, JobRows(rows=rows)) for node, rows in by_node.items())
        if moved:
            log.info(
                "matrix compacted: %s", ", ".join(f"job {j} -> row {r}" for j, r in sorted(moved.items()))
            )

    def count_spawn(self, msg: JobSpawned) -> None:
        """A spawn a node reported for an active job: counted once, durably (see the module's docstring)."""
        track = self.tracking[msg.job_id]
        if not msg.refused and (msg.node, msg.world) in track.spawned:
            return
        key = f"spawns:{msg.job_id}"
        view = spawn_counts(self.store.get_meta(key), msg.job_id)
        if msg.refused:
            view = dataclasses.replace(view, refused=view.refused + 1, last_refusal=msg.refused)
            log.info("job %d: a spawn was refused on %s: %s", msg.job_id, msg.node, msg.refused)
        else:
            track.spawned.add((msg.node, msg.world))
            view = dataclasses.replace(view, spawns=view.spawns + 1, processes=view.processes + msg.processes)
        fields = ("spawns", "processes", "refused", "last_refusal")
        self.store.set_meta(key, json.dumps({name: getattr(view, name) for name in fields}))

    def finish(self, job: Job, out: list[Effect]) -> None:
        """The job is in its terminal state: stored, then its waiting clients are answered; what waits for
        it is judged again (released by the next settle)."""
        self.store.save_job(job)
        self.tally.end(job.state)
        self.streams.forget(job.id)
        out.append(JobEnded(job))
        if job.array_id is not None or self.holds.on_job:
            self.holds.ended(job)
        where = f" on {','.join(job.nodes)}" if job.placement else ""
        log.info("job %d %s%s%s", job.id, job.state.value, where, f": {job.reason}" if job.reason else "")
