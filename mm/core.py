"""The machine manager's decisions, with no sockets: what happens to jobs and nodes when something arrives.

Each entry point takes the current time and records its effects in three places: the store (durably, before
anything else sees them), ``outbox`` (messages for node managers, by node name) and ``ended`` (jobs that just
reached a terminal state, whose waiting clients the daemon answers). The daemon in mm/daemon.py only moves
bytes; the simulator and the unit tests drive this class directly.

How a job's run goes from its start to its end (holding PEs, endings, requeues) is in mm/runs.py, which
this class builds on.
"""

from __future__ import annotations

import dataclasses
import logging

from storm.mm.config import MMConfig
from storm.mm.jobs import Job, JobSpec, advance
from storm.mm.limits import LogThrottle
from storm.mm.matrix import Placement
from storm.mm.nodes import DOWN
from storm.mm.protocol import (
    Error,
    FcsParameters,
    Heartbeat,
    JobInfo,
    JobLaunched,
    JobNodeDone,
    JobSpawned,
    JobStats,
    KillJob,
    MatrixView,
    NodeInfo,
    NodeRegistered,
    NodeStatus,
    PmiBarrierIn,
    PmiBarrierOut,
    PmiName,
    PmiNameResult,
    Policy,
    RankFailed,
    RegisterNode,
    Reregister,
    SpawnFailed,
    SpawnsView,
    StatsView,
)
from storm.mm.rights import may_manage
from storm.mm.runs import Runs, Tracking, spawn_counts
from storm.mm.slurm_style import format_duration
from storm.mm.states import JobState
from storm.mm.store import Store

log = logging.getLogger("storm.mm")


class Rejected(ValueError):
    """A request that cannot be accepted; ``code`` is the stable word sent to the client."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


class Controller(Runs):
    """What arrives at the MM (client requests, node reports, the clock, a restart), decided."""

    def __init__(
        self,
        store: Store,
        config: MMConfig,
        now: float,
        mm_epoch: str,
        *,
        policy: str = Policy.BATCH,
        fcs: FcsParameters | None = None,
    ) -> None:
        super().__init__(store, config, mm_epoch, policy=policy, fcs=fcs)
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
        wireups = self.store.wireups()
        for job in self.store.jobs(active_only=True):
            if job.state is JobState.PENDING:
                self.pending[job.id] = job
                continue
            self.active[job.id] = job
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
                # A launch may have been lost with the old MM: `register` sends it again to a node that
                # does not list the job (nodes that do are taken as launched).
                track.launches = self._launches(job, track)
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

    def job(self, job_id: int) -> Job | None:
        """A job wherever it is: queued, placed, or (ended) in the store."""
        return self.pending.get(job_id) or self.active.get(job_id) or self.store.get_job(job_id)

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
            job = self.job(job_id)
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
            jobs = [self.job(i) for i in job_ids]
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
                warning = self.reports.hang(job, now, self.config.hang_warning)
                info = dataclasses.replace(info, suspended_time=self.suspended(job, now), warning=warning)
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
        node = self.registry.register(msg.node, msg.pes, msg.nm_epoch, msg.address, now, host=msg.host)
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
        job = self.job(job_id)
        if job is None:
            raise Rejected("unknown_job", f"no job {job_id}")
        return self.reports.view(job, now, self.config.hang_warning)

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

    # ---------------------------------------------------------------------------------------------- dynamic

    def job_spawned(self, msg: JobSpawned, now: float) -> Error | None:
        """A node started the processes of an MPI_Comm_spawn of the job, or refused one: counted."""
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.active.get(msg.job_id)
        if job is not None and msg.node in job.nodes:
            self.count_spawn(msg)
        return None

    def spawn_failed(self, msg: SpawnFailed, now: float) -> Error | None:
        """A spawned process failed: the job ends FAILED, as when one of its ranks fails."""
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.active.get(msg.job_id)
        if job is not None and msg.node in job.nodes and msg.node not in self.tracking[job.id].done:
            self._end(job, JobState.FAILED, msg.exit.status, msg.describe(), now)
        return None

    def spawns_view(self, job_id: int) -> SpawnsView:
        if self.job(job_id) is None:
            raise Rejected("unknown_job", f"no job {job_id}")
        return spawn_counts(self.store.get_meta(f"spawns:{job_id}"), job_id)

    def pmi_name(self, msg: PmiName, now: float) -> Error | None:
        """A process's MPI_Publish_name, MPI_Lookup_name or MPI_Unpublish_name, answered at once to its node
        (names: see mm/runs.py)."""
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.active.get(msg.job_id)
        port, error = "", f"storm: job {msg.job_id} has ended"
        if job is not None and job.ending is None and msg.node in job.nodes:
            port, error = self.names.request(
                msg.action,
                uid=job.spec.uid,
                user=job.spec.user,
                job_id=job.id,
                service=msg.service,
                port=msg.port,
            )
        elif job is not None and job.ending is not None:
            error = f"storm: job {msg.job_id} is ending ({job.reason})"
        result = PmiNameResult(job_id=msg.job_id, seq=msg.seq, ok=not error, port=port, error=error)
        self.outbox.append((msg.node, result))
        return None

    def _foreign(self, node_name: str, job_id: int, what: str, now: float) -> Error | None:
        """An error when ``node_name`` has no ranks of the job, as far as the MM knows; None when it may.

        An authenticated node manager still speaks only for its own ranks. It may have those of the job's
        current (or last) run on it, of an earlier run of a requeued job it has not confirmed gone
        (``stale``), or of a requeued job's last run whose reports may still be on their way (``echoes``).
        """
        job = self.job(job_id)
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
