"""The machine manager's decisions, with no sockets: what happens to jobs and nodes when something arrives.

Each entry point takes the current time and records its effects in three places: the store (durably, before
anything else sees them), ``outbox`` (messages for node managers, by node name) and ``ended`` (jobs that just
reached a terminal state, whose waiting clients the daemon answers). The daemon in mm/daemon.py only moves
bytes; the simulator and the unit tests drive this class directly.

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
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from dataclasses import dataclass, field

from storm.mm.config import MMConfig
from storm.mm.jobs import Job, JobSpec, JobState, advance, format_duration, outcome, requeue
from storm.mm.limits import LogThrottle
from storm.mm.matrix import Matrix, Placement
from storm.mm.nodes import DOWN, UP, NodeRegistry
from storm.mm.protocol import (
    Error,
    FcsParameters,
    Heartbeat,
    JobInfo,
    JobLaunched,
    JobNodeDone,
    JobRows,
    JobStats,
    KillJob,
    LaunchJob,
    MatrixView,
    Message,
    NodeInfo,
    NodeRegistered,
    NodeStatus,
    PmiBarrierIn,
    PmiBarrierOut,
    RankExit,
    RankFailed,
    RankSlot,
    RegisterNode,
    Reregister,
    StatsView,
)
from storm.mm.reports import Reports
from storm.mm.requeue import Echoes
from storm.mm.rights import may_manage
from storm.mm.scheduler import QueuedJob, RunningJob, schedule
from storm.mm.slots import GangCycle
from storm.mm.store import Store

log = logging.getLogger("storm.mm")


class Rejected(ValueError):
    """A request that cannot be accepted; ``code`` is the stable word sent to the client."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


@dataclass
class Tracking:
    """What the MM knows of an active job's ranks, node by node (memory only: nodes report it again)."""

    kvsname: str = ""
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


class Controller:
    def __init__(
        self,
        store: Store,
        config: MMConfig,
        now: float,
        mm_epoch: str,
        *,
        policy: str = "batch",
        fcs: FcsParameters | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.mm_epoch = mm_epoch
        self.policy = policy
        self.fcs = fcs or FcsParameters()
        # Under gang and FCS the rows take turns with heartbeats; in batch and sb every placed job may run.
        tslots_max = self.fcs.tslots_max if policy == "fcs" else None
        self.cycle = GangCycle(config.slice, tslots_max) if policy in ("gang", "fcs") else None
        self.heartbeat_port = 0  # set by the daemon once it has bound its PUB socket
        self.matrix = Matrix(config.mpl)
        self.registry = NodeRegistry(config.node_timeout)
        self.pending: dict[int, Job] = {}
        self.active: dict[int, Job] = {}
        self.tracking: dict[int, Tracking] = {}
        self.reasons: dict[int, str] = {}
        # Requeued jobs waiting for the last run's reports to stop arriving (see mm/requeue.py).
        self.echoes = Echoes()
        self.outbox: list[tuple[str, Message]] = []
        self.ended: list[Job] = []
        self.reports = Reports(store)
        self.throttle = LogThrottle()  # lines about refused node reports: a bad node must not fill the disk
        self._recover(now)

    # ---------------------------------------------------------------------------------------------- restart

    def _recover(self, now: float) -> None:
        """Rebuild memory from the store: queued jobs wait, placed jobs keep their PEs until nodes report."""
        self.registry.load(self.store.nodes(), now)
        for node in self.registry.all():
            self.matrix.add_node(node.name, node.pes)  # DOWN ones too: they may come back
        barriers = self.store.barriers()
        node_exits = self.store.node_exits()  # nodes that had finished their part of a running job
        for job in self.store.jobs(active_only=True):
            if job.state is JobState.PENDING:
                self.pending[job.id] = job
                continue
            self.active[job.id] = job
            launched = set(job.nodes) if job.state is JobState.RUNNING else set()
            self.tracking[job.id] = Tracking(
                launched=launched,
                done=dict(node_exits.get(job.id, {})),
                kill_time=now if job.ending else None,
                last_barrier=barriers.get(job.id),
            )
            self.matrix.assign(job.id, Placement(row=job.row or 0, pes=job.placement))
            if self.cycle is not None:
                self.cycle.add(job.id, now, job.suspended_time)
        down = {n.name for n in self.registry.all() if n.state == DOWN}
        for job in list(self.active.values()):
            for name in down.intersection(job.nodes):
                self._node_lost(job, name, f"node {name} was DOWN when storm-mm restarted", now)
        if self.pending or self.active:
            log.info("recovered %d queued and %d running jobs", len(self.pending), len(self.active))

    # ---------------------------------------------------------------------------------------------- clients

    def submit(self, spec: JobSpec, now: float) -> Job:
        total = self.matrix.total_pes()
        if total == 0:
            raise Rejected("no_nodes", "the cluster has no nodes: start a node manager first")
        if spec.ranks > total:
            raise Rejected(
                "too_many_ranks", f"{spec.ranks} ranks requested, but the cluster has only {total} PEs"
            )
        if spec.time_limit is None and self.config.default_time_limit > 0:
            spec = dataclasses.replace(spec, time_limit=self.config.default_time_limit)
        job = self.store.add_job(spec, now)
        self.pending[job.id] = job
        self.schedule(now)
        return self.active.get(job.id) or self.pending.get(job.id) or job

    def cancel(self, job_ids: tuple[int, ...], uid: int, user: str, now: float) -> dict[str, str]:
        results: dict[str, str] = {}
        for job_id in job_ids:
            job = self.pending.get(job_id) or self.active.get(job_id) or self.store.get_job(job_id)
            if job is None:
                results[str(job_id)] = "unknown job"
            elif not may_manage(uid, user, job.spec.uid, self.config.operators):
                results[str(job_id)] = f"permission denied: job {job_id} belongs to {job.spec.user}"
            elif job.state.terminal:
                results[str(job_id)] = f"already {job.state.value}"
            elif job.state is JobState.PENDING:
                del self.pending[job_id]
                self._finish(advance(job, JobState.CANCELLED, now, reason=f"cancelled by {user}"))
                results[str(job_id)] = "cancelled"
            else:
                self._end(job, JobState.CANCELLED, None, f"cancelled by {user}", now)
                results[str(job_id)] = "cancelled" if job_id not in self.active else "cancelling"
        self.schedule(now)
        return results

    def job_infos(
        self, job_ids: tuple[int, ...] = (), everything: bool = False, now: float | None = None
    ) -> list[JobInfo]:
        """Jobs by id, or the active ones (all with ``everything``); ``now`` updates suspended times."""
        live = {**self.pending, **self.active}
        if job_ids:
            jobs = [live.get(i) or self.store.get_job(i) for i in job_ids]
            found = [j for j in jobs if j is not None]
        elif everything:
            found = [live.get(j.id, j) for j in self.store.jobs()]
        else:
            found = sorted(live.values(), key=lambda j: j.id)
        infos = []
        for job in found:
            info = job.info()
            if job.state is JobState.PENDING and job.id in self.reasons:
                waits = self.reasons[job.id]
                info = dataclasses.replace(info, reason=f"{waits} ({job.reason})" if job.requeues else waits)
            if job.id in self.active and now is not None:
                info = dataclasses.replace(info, suspended_time=self.suspended(job, now))
            infos.append(info)
        return infos

    def suspended(self, job: Job, now: float) -> float:
        """Seconds the job's ranks have been stopped by gang scheduling, up to now."""
        if self.cycle is None or job.row is None:
            return job.suspended_time
        return self.cycle.suspended_time(job.id, job.row, now)

    def matrix_view(self) -> MatrixView:
        columns = self.matrix.columns()
        index = {pe: i for i, pe in enumerate(columns)}
        cells = []
        for row in self.matrix.cells():
            line = [0] * len(columns)
            for pe, job_id in row.items():
                line[index[pe]] = job_id
            cells.append(tuple(line))
        cycle = self.cycle
        return MatrixView(
            policy=self.policy,
            mpl=self.matrix.mpl,
            slice=self.config.slice,
            active_row=None if cycle is None else cycle.active,
            seq=0 if cycle is None else cycle.seq,
            columns=tuple(f"{node}:{pe}" for node, pe in columns),
            cells=tuple(cells),
        )

    def heartbeat(self, now: float) -> Heartbeat | None:
        """The next time slice under gang scheduling (None in batch): call it once per slice."""
        if self.cycle is None:
            return None
        rows = {job_id: placement.row for job_id, placement in self.matrix.jobs().items()}
        row = self.cycle.advance(now, self.matrix.occupied_rows(), rows)
        return Heartbeat(
            epoch=self.mm_epoch,
            seq=self.cycle.seq,
            row=0 if row is None else row,
            sent=now,
            slice=self.cycle.slice,
            resets=self.cycle.resets,
        )

    def node_infos(self) -> list[NodeInfo]:
        jobs: dict[str, list[int]] = {}
        pes_used: dict[str, int] = {}
        for job in self.active.values():
            for name in job.nodes:
                jobs.setdefault(name, []).append(job.id)
            for name, _pe in job.placement:
                pes_used[name] = pes_used.get(name, 0) + 1
        infos = []
        for n in sorted(self.registry.all(), key=lambda n: n.name):
            if n.state == DOWN:
                reason = n.reason
            elif not n.confirmed:
                reason = "not registered since storm-mm started"
            elif n.stale:
                reason = f"stopping ended job(s) {', '.join(map(str, sorted(n.stale)))}"
            else:
                reason = ""
            infos.append(
                NodeInfo(
                    name=n.name,
                    state=n.state,
                    pes=n.pes,
                    pes_used=pes_used.get(n.name, 0),
                    address=n.address,
                    last_seen=n.last_seen,
                    reason=reason,
                    jobs=tuple(jobs.get(n.name, ())),
                    switches=n.switches,
                    switch_p50_ms=n.switch_p50_ms,
                    switch_p99_ms=n.switch_p99_ms,
                )
            )
        return infos

    # ---------------------------------------------------------------------------------------------- nodes

    def register(self, msg: RegisterNode, now: float) -> NodeRegistered:
        node = self.registry.register(msg.node, msg.pes, msg.nm_epoch, msg.address, now)
        self.echoes.forget_node(msg.node)  # all it sent before registering has arrived
        try:
            self.matrix.add_node(msg.node, msg.pes)
        except ValueError:
            node.pes = self.matrix.nodes()[msg.node]
            log.warning("node %s reports %d PEs but jobs occupy its %d: kept", msg.node, msg.pes, node.pes)
        self.store.save_node(node.record())
        listed = set(msg.jobs)
        for job in list(self.active.values()):
            track = self.tracking[job.id]
            if msg.node in job.nodes and job.id not in listed and msg.node not in track.done:
                launch = track.launches.get(msg.node)
                if launch is not None and msg.node not in track.launched and job.ending is None:
                    # Its launch was lost (sent while the node manager was restarting): send it again.
                    self.outbox.append((msg.node, launch))
                    continue
                reason = f"node {msg.node}: its node manager no longer knows the job"
                self._node_lost(job, msg.node, reason, now)
        for job_id in sorted(listed):
            starting = self.active.get(job_id)
            if starting is not None and starting.state is JobState.STARTING and msg.node in starting.nodes:
                self._launched(starting, msg.node, now)  # re-adopted by a restarted NM before it reported
            self._stop_if_over(msg.node, job_id)
        log.info("node %s registered with %d PEs (%s)", msg.node, msg.pes, msg.address or "no address")
        self.schedule(now)
        rows = {str(j.id): j.row or 0 for j in self.active.values() if msg.node in j.nodes}
        return NodeRegistered(
            node=msg.node,
            mm_epoch=self.mm_epoch,
            report_interval=self.config.node_timeout / 5,
            stale_jobs=tuple(sorted(node.stale)),
            policy=self.policy,
            heartbeat_port=self.heartbeat_port,
            slice=self.config.slice,
            rows=rows,
            fcs=self.fcs,
        )

    def node_status(self, msg: NodeStatus, now: float) -> Reregister | None:
        node = self.registry.get(msg.node)
        if (
            msg.mm_epoch != self.mm_epoch
            or node is None
            or not self.registry.seen(msg.node, msg.nm_epoch, now)
        ):
            return Reregister(reason="unknown node manager: register first")
        node.switches, node.switch_p50_ms, node.switch_p99_ms = (
            msg.switches,
            msg.switch_p50_ms,
            msg.switch_p99_ms,
        )
        was_draining = bool(node.stale)
        node.stale &= set(msg.jobs)  # jobs the NM no longer lists are gone from the node
        echoes_over = self.echoes.heard(msg.node, msg.jobs)
        for job_id in msg.jobs:
            job = self.active.get(job_id)
            if job is not None and job.state is JobState.STARTING and msg.node in job.nodes:
                self._launched(job, msg.node, now)  # the launch report may have been lost
            elif self._stop_if_over(msg.node, job_id):
                self.outbox.append((msg.node, KillJob(job_id=job_id, reason="the job has ended")))
        if (was_draining and not node.stale) or echoes_over:
            self.schedule(now)
        return None

    def _stop_if_over(self, node_name: str, job_id: int) -> bool:
        """A node still has ranks of a job: remember to stop them if the job is over (or over for that node).

        Returns True when the node must be told (again) to stop the job.
        """
        node = self.registry.get(node_name)
        job = self.active.get(job_id)
        assert node is not None
        # Not among the job's nodes: ranks of an earlier run of a requeued job, on a node that was lost.
        if job is None or node_name not in job.nodes or node_name in self.tracking[job_id].done:
            node.stale.add(job_id)  # ended, or written off on this node: its PEs may be reused elsewhere
            return True
        if job.ending is not None:
            self.outbox.append((node_name, KillJob(job_id=job_id, reason=job.reason)))
        return False

    # Each job report below returns an error for the node (and changes nothing) when the node has no ranks
    # of the job: see _foreign.

    def job_launched(self, msg: JobLaunched, now: float) -> Error | None:
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.active.get(msg.job_id)
        if job is None or msg.node not in job.nodes or msg.node in self.tracking[job.id].done:
            self._stop_if_over(msg.node, msg.job_id)
            self.outbox.append((msg.node, KillJob(job_id=msg.job_id, reason="the job has ended")))
            return None
        self._launched(job, msg.node, now)
        return None

    def _launched(self, job: Job, node: str, now: float) -> None:
        track = self.tracking[job.id]
        track.launched.add(node)
        if job.state is JobState.STARTING and track.launched >= set(job.nodes):
            track.launches.clear()
            job = advance(job, JobState.RUNNING, now, start_time=job.start_time)
            self.store.save_job(job)
            self.active[job.id] = job

    def rank_failed(self, msg: RankFailed, now: float) -> Error | None:
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.active.get(msg.job_id)
        # A node written off (or outside a requeued job's new run) speaks for ranks that no longer count.
        if job is not None and msg.node in job.nodes and msg.node not in self.tracking[job.id].done:
            self._end(job, JobState.FAILED, msg.exit.status, f"{msg.exit.describe()} on {msg.node}", now)
        return None

    def job_node_done(self, msg: JobNodeDone, now: float) -> Error | None:
        """None when the report is taken (the node is then acknowledged: it may forget the job)."""
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        node = self.registry.get(msg.node)
        job = self.active.get(msg.job_id)
        if job is None or msg.node not in job.nodes or msg.node in self.tracking[job.id].done:
            if node is not None and msg.job_id in node.stale:
                node.stale.discard(msg.job_id)
                if not node.stale:
                    self.schedule(now)
            return None  # a re-sent report, or the last word from a node that was written off
        track = self.tracking[job.id]
        track.done[msg.node] = msg.exits
        if not set(track.done) >= set(job.nodes):
            # Stored before the ack, after which the node forgets the job: an MM restarted before the job's
            # other nodes report must know this one finished its part rather than lost it.
            self.store.save_node_exits(job.id, msg.node, msg.exits)
        self.reports.node_done(msg)
        failed = [e for e in msg.exits if e.failed]
        if msg.reason:
            self._end(job, JobState.NODE_FAIL, None, msg.reason, now)
        elif failed:
            self._end(job, JobState.FAILED, failed[0].status, f"{failed[0].describe()} on {msg.node}", now)
        self._maybe_finish(job.id, now)
        return None

    def job_stats(self, msg: JobStats, now: float) -> Error | None:
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        if msg.job_id in self.active and msg.node in self.active[msg.job_id].nodes:
            self.reports.job_stats(msg, now)
        return None

    def stats_view(self, job_id: int, now: float) -> StatsView:
        job = self.active.get(job_id) or self.pending.get(job_id) or self.store.get_job(job_id)
        if job is None:
            raise Rejected("unknown_job", f"no job {job_id}")
        return self.reports.view(job, now)

    def pmi_barrier_in(self, msg: PmiBarrierIn, now: float) -> Error | None:
        """Collect one node's arrival at a cross-node PMI barrier; answer all nodes when the last arrives.

        The answer is stored before it is sent: a node whose copy was lost (the MM restarted) asks again
        and gets it again, rather than waiting for nodes that have long passed the barrier. A node waits
        for the answer to each barrier before it enters the next, so one more than a barrier ahead of the
        job's current one is refused.
        """
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.active.get(msg.job_id)
        if job is None or msg.node not in job.nodes:
            return None
        track = self.tracking[job.id]
        if track.last_barrier is not None and msg.seq <= track.last_barrier[0]:
            seq, kvs = track.last_barrier
            if msg.seq == seq:
                self.outbox.append((msg.node, PmiBarrierOut(job_id=job.id, seq=seq, kvs=kvs)))
            return None
        current = 0 if track.last_barrier is None else track.last_barrier[0] + 1
        if msg.seq > current + 1:
            text = f"PMI barrier {msg.seq} of job {job.id}, but the job is at barrier {current}"
            return self._refuse(msg.node, text, now)
        arrived = track.barriers.setdefault(msg.seq, {})
        arrived[msg.node] = msg.kvs
        if set(arrived) >= set(job.nodes):
            merged: dict[str, str] = {}
            for kvs in arrived.values():
                merged.update(kvs)
            del track.barriers[msg.seq]
            self.store.save_barrier(job.id, msg.seq, merged)
            track.last_barrier = (msg.seq, merged)
            for node in job.nodes:
                self.outbox.append((node, PmiBarrierOut(job_id=job.id, seq=msg.seq, kvs=merged)))
        return None

    def _foreign(self, node_name: str, job_id: int, what: str, now: float) -> Error | None:
        """An error when ``node_name`` has no ranks of the job, as far as the MM knows; None when it may.

        An authenticated node manager still speaks only for its own ranks. It may have those of the job's
        current (or last) run on it, of an earlier run of a requeued job it has not confirmed gone
        (``stale``), or of a requeued job's last run whose reports may still be on their way (``echoes``).
        """
        job = self.active.get(job_id) or self.pending.get(job_id) or self.store.get_job(job_id)
        node = self.registry.get(node_name)
        if (
            (job is not None and node_name in job.nodes)
            or (node is not None and job_id in node.stale)
            or self.echoes.expects(job_id, node_name)
        ):
            return None
        return self._refuse(node_name, f"{what} about job {job_id}, which has no ranks on {node_name}", now)

    def _refuse(self, node: str, text: str, now: float) -> Error:
        """A node report that must change nothing: a log line (throttled per node) and the error for it."""
        self.throttle.warning(log, ("refused", node), now, "node %s: refused %s", node, text)
        return Error(code="bad_request", text=text)

    # ---------------------------------------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Node liveness, time limits and stuck kills; call it a few times a second."""
        for node in self.registry.expire(now):
            log.warning("node %s is DOWN: %s", node.name, node.reason)
            self.store.save_node(node.record())
            self.echoes.forget_node(node.name)
            # The node keeps its matrix columns (no new job goes to a node that is not UP), and a lost job
            # keeps its PEs elsewhere until those nodes confirm its ranks are gone.
            for job in [j for j in self.active.values() if node.name in j.nodes]:
                self._node_lost(job, node.name, f"node {node.name} DOWN: {node.reason}", now)
        for job in list(self.active.values()):
            track = self.tracking[job.id]
            limit = job.spec.time_limit
            started = job.start_time
            ran = 0.0 if started is None else now - started - self.suspended(job, now)
            if job.ending is None and limit is not None and started is not None and ran > limit:
                reason = f"time limit of {format_duration(limit)} reached"
                self._end(job, JobState.TIMEOUT, None, reason, now)
            elif track.kill_time is not None and now - track.kill_time > self.config.kill_timeout:
                for name in job.nodes:
                    if name not in track.done:
                        log.error("job %d: node %s did not confirm its ranks stopped", job.id, name)
                        track.done[name] = ()
                        track.written_off.add(name)
                self._maybe_finish(job.id, now)
        self.schedule(now)

    def schedule(self, now: float) -> None:
        if not self.pending:
            self.reasons = {}
            return
        held = self.echoes.held(self.pending)
        queue = [
            QueuedJob(job_id=j.id, ranks=j.spec.ranks, time_limit=j.spec.time_limit)
            for j in self.pending.values()
            if j.id not in held
        ]
        running = {
            j.id: RunningJob(job_id=j.id, start_time=j.start_time or now, time_limit=j.spec.time_limit)
            for j in self.active.values()
        }
        plan = schedule(now, queue, running, self.matrix, self.registry.usable())
        self.reasons = dict(plan.reasons)
        for job_id, nodes in held.items():
            self.reasons[job_id] = f"Requeued: last run's reports still due from {','.join(sorted(nodes))}"
        for start in plan.starts:
            self._start(self.pending.pop(start.job_id), start.placement, now)

    # ---------------------------------------------------------------------------------------------- internals

    def _start(self, job: Job, placement: Placement, now: float) -> None:
        job = advance(job, JobState.STARTING, now, placement=placement.pes, row=placement.row, reason="")
        self.store.save_job(job)
        track = Tracking(kvsname=f"storm_{job.id}_{secrets.token_hex(4)}")
        self.active[job.id] = job
        self.tracking[job.id] = track
        if self.cycle is not None:
            self.cycle.add(job.id, now)
        counts = tuple(sum(1 for n, _ in placement.pes if n == node) for node in placement.nodes)
        spec = job.spec
        for index, node in enumerate(placement.nodes):
            slots = tuple(RankSlot(rank=r, pe=pe) for r, (n, pe) in enumerate(placement.pes) if n == node)
            launch = LaunchJob(
                job_id=job.id, name=spec.name, kvsname=track.kvsname, size=spec.ranks, row=placement.row,
                node_index=index,
                ranks_per_node=counts, slots=slots, argv=spec.argv, cwd=spec.cwd, env=spec.env,
                uid=spec.uid, gid=spec.gid, user=spec.user, output=spec.output, error=spec.error,
            )  # fmt: skip
            track.launches[node] = launch
            self.outbox.append((node, launch))
        log.info("job %d started on %s", job.id, ",".join(placement.nodes))

    def _node_lost(self, job: Job, node: str, reason: str, now: float) -> None:
        """The node's ranks of the job are written off: nothing more is expected from it."""
        track = self.tracking[job.id]
        if node not in track.done:
            track.done[node] = ()
            track.written_off.add(node)
        self._end(job, JobState.NODE_FAIL, None, reason, now)

    def _end(self, job: Job, state: JobState, exit_code: int | None, reason: str, now: float) -> None:
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
                self.outbox.append((node, KillJob(job_id=job.id, reason=job.reason)))
        self._maybe_finish(job.id, now)

    def _maybe_finish(self, job_id: int, now: float) -> None:
        job = self.active.get(job_id)
        if job is None:
            return
        track = self.tracking[job_id]
        if not set(track.done) >= set(job.nodes):
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
        if track.last_barrier is not None:
            self.store.forget_barrier(job_id)  # the next run wires up afresh
        if len(job.nodes) > 1:
            self.store.forget_node_exits(job_id)  # only jobs on several nodes store them
        self.reports.forget(job_id)
        del self.active[job_id]
        del self.tracking[job_id]
        self.matrix.release(job_id)
        if again:
            self._requeue(job, track)
        else:
            self._finish(advance(job, state, now, exit_code=code, reason=reason, suspended_time=suspended))
        self._compact()
        self.schedule(now)  # its PEs are free: start what waited for them now, not at the next tick

    def _requeue(self, job: Job, track: Tracking) -> None:
        """Back to the queue, stored before anything else: the next run starts from scratch, same id."""
        last_run = job.nodes
        job = requeue(job, f"requeued {job.requeues + 1}/{self.config.max_requeues} after {job.reason}")
        self.store.save_job(job)
        self.pending[job.id] = job
        up = {n.name for n in self.registry.all() if n.state == UP and n.confirmed}
        self.echoes.add(job.id, up.intersection(last_run))
        # An UP node that never confirmed its ranks gone may still run them under this id: it takes no job
        # (above all not this one) until its reports stop listing it. A DOWN node is sorted out when it
        # registers again, listing the job (see _stop_if_over).
        for name in track.written_off:
            node = self.registry.get(name)
            if node is not None and node.state == UP and node.confirmed:
                node.stale.add(job.id)
        log.info("job %d %s", job.id, job.reason)

    def _compact(self) -> None:
        """Move jobs into lower rows freed by an ending job, and tell their nodes."""
        moved = self.matrix.compact()
        by_node: dict[str, dict[str, int]] = {}
        for job_id, row in moved.items():
            job = dataclasses.replace(self.active[job_id], row=row)
            self.store.save_job(job)
            self.active[job_id] = job
            for node in job.nodes:
                by_node.setdefault(node, {})[str(job_id)] = row
        for node, rows in by_node.items():
            self.outbox.append((node, JobRows(rows=rows)))
        if moved:
            log.info(
                "matrix compacted: %s", ", ".join(f"job {j} -> row {r}" for j, r in sorted(moved.items()))
            )

    def _finish(self, job: Job) -> None:
        self.store.save_job(job)
        self.ended.append(job)
        log.info("job %d %s%s", job.id, job.state.value, f": {job.reason}" if job.reason else "")
