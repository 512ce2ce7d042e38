"""The machine manager's decisions, with no sockets, no store engine, no clock and no randomness of its own.

Every message that arrives (a client's request, a node manager's report) goes through
:meth:`Controller.handle`, the clock through :meth:`Controller.tick` (liveness, time limits) and
:meth:`Controller.heartbeat` (a gang slice), a restart through :meth:`Controller.recover`. Each returns one
list of effects (mm/effects.py), which the driver carries out in order: the daemon in mm/daemon.py, the
unit tests, a simulator (DESIGN.md section 6). The store (any mm/storage.py Storage) is written during the
call, one transaction per stimulus, so everything is durable before any effect reaches a client or a node.
No stimulus runs a scheduling pass: one that may let a queued job start only makes a pass due
(:attr:`Controller.pass_due`), and the driver calls :meth:`Controller.schedule` when it likes (the daemon
once per burst of messages, a simulator once per instant), so a burst of submissions costs one pass.
Time is always an argument, and the random part of a run's kvsname comes from the ``nonce`` given.

How a job's run goes from its start to its end (holding PEs, endings, requeues) is in mm/runs.py: the
Controller owns a :class:`~storm.mm.runs.RunTable`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from storm.mm import protocol as p
from storm.mm import targets, wireup
from storm.mm.accounting import NotAllowed, history_query
from storm.mm.config import MMConfig
from storm.mm.effects import Attach, Effect, Publish, ReadHistory, Reply, Send, Wait
from storm.mm.holds import array_tasks
from storm.mm.jobs import Job, JobSpec
from storm.mm.limits import LogThrottle
from storm.mm.listing import job_infos, job_page, matrix_view, node_infos
from storm.mm.nodes import DOWN, NodeRegistry
from storm.mm.rights import Credentials
from storm.mm.runs import RunTable, spawn_counts
from storm.mm.slurm_style import format_duration
from storm.mm.states import JobState
from storm.mm.storage import Storage
from storm.mm.streams import attach_output, relay_output
from storm.mm.submission import Rejected, check_fits, job_spec
from storm.mm.tally import TimingTotals

log = logging.getLogger("storm.mm")


@dataclass(frozen=True)
class FromNode:
    """The sender of a message on the node managers' link: ``name`` is its routing id."""

    name: str


class Controller:
    """What arrives at the MM (client requests, node reports, the clock, a restart), decided.

    Call :meth:`recover` once, before anything else: it rebuilds memory from the store.
    """

    def __init__(
        self,
        store: Storage,
        config: MMConfig,
        mm_epoch: str,
        *,
        nonce: Callable[[], str],
        policy: str = p.Policy.BATCH,
        fcs: p.FcsParameters | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.mm_epoch = mm_epoch
        self.policy = policy
        self.fcs = fcs or p.FcsParameters()
        self.heartbeat_port = 0  # set by the daemon once it has bound its PUB socket
        self.registry = NodeRegistry(config.node_timeout)
        self.runs = RunTable(store, config, self.registry, nonce, policy=policy, fcs=self.fcs)
        self.throttle = LogThrottle()  # lines about refused node reports: a bad node must not fill the disk
        self.timings = TimingTotals()  # the nodes' heartbeat and switch timings, for the metrics
        self._recovered = False
        # After a restart: the nodes known before that have not registered again, until when passes wait for
        # them, and the latest that can be (see recover).
        self._returning: set[str] = set()
        self._settle_until = self._settle_limit = 0.0

    # ---------------------------------------------------------------------------------------------- stimuli

    def recover(self, now: float) -> list[Effect]:
        """Rebuild memory from the store: queued jobs wait, placed jobs keep their PEs until nodes report;
        a job on a node that was DOWN is written off there (its kills and ends are the effects)."""
        if self._recovered:
            raise RuntimeError("the controller has recovered already")
        self._recovered = True
        out: list[Effect] = []
        runs = self.runs
        runs.want_pass()  # queued jobs wait for one, whatever else the restart found
        with self.store.transaction():
            self.registry.load(self.store.nodes(), now)
            runs.recover(now)
            runs.settle(now, out)  # a dependency judged afresh: what can never hold ends
            down = {n.name for n in self.registry.all() if n.state == DOWN}
            for job in list(runs.active.values()):
                for name in down.intersection(job.nodes):
                    runs.node_lost(job, name, f"node {name} was DOWN when storm-mm restarted", now, out)
        if runs.pending or runs.active:
            log.info("recovered %d queued and %d running jobs", len(runs.pending), len(runs.active))
        # A registration storm: every node manager learns of the restart at its next report and registers
        # again. Until they all have, no pass starts anything, as long as they keep coming (a report
        # interval after the last one back, two after the restart at least, the node timeout at most, when
        # the missing ones are DOWN anyway): jobs started on the first nodes back made the traffic that kept
        # the others waiting (1,024 emulated nodes in the middle of a workload took 12 s to register).
        self._returning = {n.name for n in self.registry.all() if n.state != DOWN}
        self._settle_until = now + 2 * self.config.node_timeout / 5 if self._returning else now
        self._settle_limit = now + self.config.node_timeout
        return out

    def handle(self, message: p.Message, now: float, caller: Credentials | FromNode) -> list[Effect]:
        """One message from a client (``caller``: who the socket says it is) or from a node manager.

        The reply to the sender, if any, comes first in the list; a bad request gets an error reply and
        changes nothing.
        """
        assert self._recovered, "recover() first"
        out: list[Effect] = []
        with self.store.transaction():
            if isinstance(caller, FromNode):
                reply = self._node_message(message, caller.name, now, out)
            else:
                try:
                    reply = self._client_request(message, caller, now, out)
                except Rejected as exc:
                    reply = p.error_for(message, exc.code, str(exc))
        return out if reply is None else [Reply(reply), *out]

    def tick(self, now: float) -> list[Effect]:
        """Node liveness, time limits and stuck kills; call it a few times a second. It always makes a pass
        due (backfilling depends on the time), which the driver runs with :meth:`schedule` after it.
        O(n + a) for n nodes and a placed jobs (and a job's nodes for each node gone DOWN)."""
        out: list[Effect] = []
        runs = self.runs
        with self.store.transaction():
            for node in self.registry.expire(now):
                log.warning("node %s is DOWN: %s", node.name, node.reason)
                self.store.save_node(node.unsaved() or node.record())
                runs.echoes.forget_node(node.name)
                # The node keeps its matrix columns (no new job goes to a node that is not UP), and a lost
                # job keeps its PEs elsewhere until those nodes confirm its ranks are gone.
                for job in [j for j in runs.active.values() if node.name in j.nodes]:
                    runs.node_lost(job, node.name, f"node {node.name} DOWN: {node.reason}", now, out)
            for job in list(runs.active.values()):
                track = runs.tracking[job.id]
                limit = job.spec.time_limit
                started = job.start_time
                ran = 0.0 if started is None else now - started - runs.suspended(job, now)
                if job.ending is None and limit is not None and started is not None and ran > limit:
                    reason = f"time limit of {format_duration(limit)} reached"
                    runs.end(job, JobState.TIMEOUT, reason, now, out)
                elif track.kill_time is not None and now - track.kill_time > self.config.kill_timeout:
                    for name in job.nodes:
                        if name not in track.done:
                            log.error("job %d: node %s did not confirm its ranks stopped", job.id, name)
                            track.done[name] = ()
                            track.written_off.add(name)
                    runs.maybe_finish(job.id, now, out)
        runs.want_pass()
        return out

    def next_deadline(self, now: float) -> float | None:
        """The earliest time at which a running job may reach its time limit (None: no job has one), for
        the driver to call :meth:`tick` then rather than up to a tick late. A job whose ranks are stopped
        meanwhile (gang scheduling, preemption) reaches it later: :meth:`tick` then finds nothing due, and
        this names the new time."""
        runs = self.runs
        deadlines = [
            job.start_time + job.spec.time_limit + runs.suspended(job, now)
            for job in runs.active.values()
            if job.spec.time_limit is not None and job.start_time is not None and job.ending is None
        ]
        return min(deadlines, default=None)

    def schedule(self, now: float) -> list[Effect]:
        """One scheduling pass over the queue if one is due, its launches as effects; [] (and no pass)
        otherwise. Stored in one commit before any launch is returned."""
        if not self.runs.pass_due:
            return []
        if now < self._settle_until and self._returning:
            self.runs.pass_due = False  # due again at the next tick, or when the last node is back
            return []
        out: list[Effect] = []
        with self.store.transaction():
            self.runs.schedule(now, out)
        return out

    @property
    def pass_due(self) -> bool:
        """Something may have let a queued job start since the last pass (see :meth:`schedule`)."""
        return self.runs.pass_due

    def heartbeat(self, now: float) -> list[Effect]:
        """The next time slice under gang scheduling (nothing in batch): call it once per slice.

        It names the instant its slot begins on every node, ``[mm] switch_lead`` from ``now`` (at most half
        a slice), so that nodes switch together rather than as it reaches each (0: on arrival)."""
        cycle = self.runs.cycle
        if cycle is None:
            return []
        rows = {job_id: placement.row for job_id, placement in self.runs.matrix.jobs().items()}
        row = cycle.advance(now, self.runs.matrix.occupied_rows(), rows)
        lead = min(self.config.switch_lead, cycle.slice / 2)
        beat = p.Heartbeat(
            epoch=self.mm_epoch,
            seq=cycle.seq,
            row=0 if row is None else row,
            sent=now,
            slice=cycle.slice,
            resets=cycle.resets,
            at=now + lead if lead > 0 else 0.0,
        )
        return [Publish(beat)]

    # ---------------------------------------------------------------------------------------------- clients

    def _client_request(
        self, msg: p.Message, caller: Credentials, now: float, out: list[Effect]
    ) -> p.Message | None:
        match msg:
            case p.SubmitJob():
                jobs = self._submit(self.job_spec(msg, caller), now, out)
                if msg.attach:  # before any of its output can exist: the client misses none of it
                    for job in jobs:
                        self.runs.streams.attach(job.id, msg.attach)
                        out.append(Attach(job.id, msg.attach))
                ids = tuple(j.id for j in jobs) if msg.array else ()
                return p.JobSubmitted(req=msg.req, job_id=jobs[0].id, job_ids=ids)
            case p.AttachOutput():
                return attach_output(self, msg, caller, now, out)
            case p.ListJobs():
                return self._list_jobs(msg, now)
            case p.GetMatrix():
                runs = self.runs
                view = matrix_view(runs.matrix, runs.cycle, self.policy, self.config.slice, runs.torus)
                return dataclasses.replace(view, req=msg.req)
            case p.GetStats():
                return dataclasses.replace(self.stats_view(msg.job_id, now), req=msg.req)
            case p.GetClasses():
                if msg.history:
                    return p.ClassesView(req=msg.req, changes=tuple(self.store.class_changes(msg.job_ids)))
                processes = tuple(self.runs.reports.processes(msg.job_ids))
                return p.ClassesView(req=msg.req, processes=processes)
            case p.CancelJobs():
                named = targets.named(self.runs, msg.job_ids, msg.tasks)
                results = targets.cancel(
                    self.runs, named, caller, operators=self.config.operators, now=now, out=out
                )
                return p.CancelResult(req=msg.req, results=results)
            case p.WaitJob():
                infos = self.job_infos((msg.job_id,), now=now)
                if not infos:
                    raise Rejected("unknown_job", f"no job {msg.job_id}")
                if not JobState(infos[0].state).terminal:
                    out.append(Wait(job_id=msg.job_id, req=msg.req))
                    return None
                return p.JobList(req=msg.req, jobs=tuple(infos))
            case p.ListNodes():
                nodes = node_infos(self.registry.all(), self.runs.active.values(), self.runs.torus)
                return p.NodeList(req=msg.req, nodes=tuple(nodes))
            case p.GetSpawns():
                return dataclasses.replace(self.spawns_view(msg.job_id), req=msg.req)
            case p.JobHistory():
                try:
                    query = history_query(msg, caller, self.config.operators, p.HISTORY_PAGE)
                except NotAllowed as exc:
                    raise Rejected("permission_denied", str(exc)) from None
                out.append(ReadHistory(query, msg.req))
                return None
        raise Rejected("bad_request", f"{msg.op} is not a client request")

    def output(self, msg: p.JobOutput, sender: FromNode, now: float) -> list[Effect]:
        """A chunk of a streamed job's output from a node (mm/streams.py): relayed, never stored."""
        return relay_output(self, msg, sender.name, now)

    def job_spec(self, msg: p.SubmitJob, caller: Credentials) -> JobSpec:
        """What a submission asks for, run as its caller, with the defaults filled in (mm/submission.py)."""
        return job_spec(msg, caller, self.config)

    def _submit(self, spec: JobSpec, now: float, out: list[Effect]) -> list[Job]:
        """One job, or an array's tasks (one write, one commit); a dependency on no known job is refused."""
        runs = self.runs
        check_fits(spec, runs.matrix, runs.torus)
        if spec.dependency:
            try:
                runs.holds.resolve(spec.dependency)
            except ValueError as exc:
                raise Rejected("bad_dependency", f"--dependency {spec.dependency}: {exc}") from None
        if spec.array:
            jobs = self.store.add_array(spec, array_tasks(spec.array)[0], now)
        else:
            jobs = [self.store.add_job(spec, now)]
        for job in jobs:
            runs.enqueue(job)
        runs.settle(now, out)  # a dependency that can never hold ends the job at once
        runs.want_pass()
        return jobs

    def _list_jobs(self, msg: p.ListJobs, now: float) -> p.JobList:
        """Jobs by id, the active ones, or (``all``) a page of the store's newest (see ListJobs)."""
        if msg.arrays or msg.tasks:
            named = targets.named(self.runs, msg.arrays, msg.tasks)
            ids = msg.job_ids + tuple(job.id for _key, jobs in named for job in jobs)
            return p.JobList(req=msg.req, jobs=tuple(self.job_infos(tuple(dict.fromkeys(ids)), now=now)))
        if not msg.all or msg.job_ids:
            return p.JobList(req=msg.req, jobs=tuple(self.job_infos(msg.job_ids, msg.all, now)))
        page = min(msg.limit or p.LIST_PAGE, p.LIST_PAGE)
        infos, older = job_page(self.runs, self.config.hang_warning, now, page, msg.before)
        return p.JobList(req=msg.req, jobs=tuple(infos), older=older)

    # Queries: what the replies above are made of (tests read them directly too).

    def job_infos(
        self, job_ids: tuple[int, ...] = (), everything: bool = False, now: float | None = None
    ) -> list[p.JobInfo]:
        """Jobs by id, or the active ones (all with ``everything``); ``now`` updates suspended times."""
        return job_infos(self.runs, self.config.hang_warning, job_ids, everything, now)

    def stats_view(self, job_id: int, now: float) -> p.StatsView:
        job = self.runs.job(job_id)
        if job is None:
            raise Rejected("unknown_job", f"no job {job_id}")
        return self.runs.reports.view(job, now, self.config.hang_warning)

    def spawns_view(self, job_id: int) -> p.SpawnsView:
        if self.runs.job(job_id) is None:
            raise Rejected("unknown_job", f"no job {job_id}")
        return spawn_counts(self.store.get_meta(f"spawns:{job_id}"), job_id)

    # ---------------------------------------------------------------------------------------------- nodes

    def _node_message(self, msg: p.Message, sender: str, now: float, out: list[Effect]) -> p.Message | None:
        node = getattr(msg, "node", None)
        if node is not None and node != sender:
            # The routing id is what replies are addressed to; a mismatch would misroute them.
            return p.Error(code="bad_request", text="node name differs from routing id")
        if node is not None and not isinstance(msg, p.RegisterNode) and self.registry.get(node) is None:
            # A node that never registered has no jobs, PEs or state here: nothing it reports can be true.
            self.throttle.warning(log, ("unknown", node), now, "%s from unknown node %r", msg.op, node)
            return p.Reregister(reason=f"unknown node {node!r}: register first")
        match msg:
            case p.RegisterNode():
                return self._register(msg, now, out)
            case p.NodeStatus():
                return self._node_status(msg, now, out)
            # Job reports are answered only when refused (an error), and a final report taken with an ack.
            case p.JobLaunched():
                return self._job_launched(msg, now, out)
            case p.RankFailed():
                return self._rank_failed(msg, now, out)
            case p.JobNodeDone():
                return self._job_node_done(msg, now, out) or p.Ack(job_id=msg.job_id, what=msg.op)
            case p.JobStats():
                return self._job_stats(msg, now)
            case p.PmiBarrierIn() | p.JobSpawned() | p.SpawnFailed() | p.PmiName():
                return self._wireup(msg, now, out)
            case p.JobOutput():
                out.extend(self.output(msg, FromNode(sender), now))
                return None
        return p.Error(code="bad_request", text=f"{msg.op} is not a node message")

    def _register(self, msg: p.RegisterNode, now: float, out: list[Effect]) -> p.NodeRegistered:
        """A node manager (re)registers. O(a + j) for a placed jobs and the j jobs it lists; no commit when
        the store already holds the node as it is (a restarted MM's registration storm)."""
        runs = self.runs
        node = self.registry.register(msg.node, msg.pes, msg.nm_epoch, msg.address, now, host=msg.host)
        runs.echoes.forget_node(msg.node)  # all it sent before registering has arrived
        if msg.node in self._returning:  # one more back after a restart: passes wait for the rest a while
            self._returning.discard(msg.node)
            self._settle_until = min(
                max(self._settle_until, now + self.config.node_timeout / 5), self._settle_limit
            )
        try:
            runs.matrix.add_node(msg.node, msg.pes)
        except ValueError:
            node.pes = runs.matrix.nodes()[msg.node]
            log.warning("node %s reports %d PEs but jobs occupy its %d: kept", msg.node, msg.pes, node.pes)
        record = node.unsaved()
        if record is not None:
            self.store.save_node(record)
        listed = set(msg.jobs)
        for job in list(runs.active.values()):
            track = runs.tracking[job.id]
            if msg.node in job.nodes and job.id not in listed and msg.node not in track.done:
                launch = track.launches.get(msg.node)
                if launch is not None and msg.node not in track.launched and job.ending is None:
                    # Its launch was lost (sent while the node manager was restarting): send it again.
                    out.append(Send(msg.node, launch))
                    continue
                reason = f"node {msg.node}: its node manager no longer knows the job"
                runs.node_lost(job, msg.node, reason, now, out)
        for job_id in sorted(listed):
            starting = runs.active.get(job_id)
            if starting is not None and starting.state is JobState.STARTING and msg.node in starting.nodes:
                self.runs.launched(starting, msg.node, now)  # re-adopted by a restarted NM before it reported
            self._stop_if_over(msg.node, job_id, out)
        log.info("node %s registered with %d PEs (%s)", msg.node, msg.pes, msg.address or "no address")
        runs.want_pass()
        mine = [j for j in runs.active.values() if msg.node in j.nodes]
        rows = {str(j.id): j.row or 0 for j in mine}
        return p.NodeRegistered(
            node=msg.node,
            mm_epoch=self.mm_epoch,
            report_interval=self.config.node_timeout / 5,
            stale_jobs=tuple(sorted(node.stale)),
            policy=self.policy,
            heartbeat_port=self.heartbeat_port,
            slice=self.config.slice,
            rows=rows,
            fcs=self.fcs,
            suspended=tuple(sorted(j.id for j in mine if j.suspended_by is not None)),
        )

    def _node_status(self, msg: p.NodeStatus, now: float, out: list[Effect]) -> p.Reregister | None:
        """A node's periodic report: its liveness and its jobs. O(j) for the j jobs it lists, no commit."""
        node = self.registry.get(msg.node)
        if (
            msg.mm_epoch != self.mm_epoch
            or node is None
            or not self.registry.seen(msg.node, msg.nm_epoch, now)
        ):
            return p.Reregister(reason="unknown node manager: register first")
        node.switches, node.switch_p50_ms, node.switch_p99_ms = (
            msg.switches,
            msg.switch_p50_ms,
            msg.switch_p99_ms,
        )
        node.late_beats, node.skewed_beats = msg.late_beats, msg.skewed_beats
        self.timings.report(msg.node, msg.nm_epoch, msg.timings)
        was_draining = bool(node.stale)
        node.stale &= set(msg.jobs)  # jobs the NM no longer lists are gone from the node
        echoes_over = self.runs.echoes.heard(msg.node, msg.jobs)
        launched, held = set(msg.launched), set(msg.suspended)
        for job_id in msg.jobs:
            job = self.runs.active.get(job_id)
            if job is not None and job.state is JobState.STARTING and msg.node in job.nodes:
                if job_id in launched:
                    self.runs.launched(job, msg.node, now)  # the launch report may have been lost
            elif self._stop_if_over(msg.node, job_id, out):
                out.append(Send(msg.node, p.KillJob(job_id=job_id, reason="the job has ended")))
            elif (
                job is not None and job.ending is None and (job.suspended_by is not None) != (job_id in held)
            ):
                # A suspend_job or resume_job the node missed (or its NM restarted): said again.
                again: p.Message = (
                    p.ResumeJob(job_id=job_id, row=job.row or 0)
                    if job.suspended_by is None
                    else p.SuspendJob(job_id=job_id, by=job.suspended_by)
                )
                out.append(Send(msg.node, again))
        if (was_draining and not node.stale) or echoes_over:
            self.runs.want_pass()
        return None

    def _stop_if_over(self, node_name: str, job_id: int, out: list[Effect]) -> bool:
        """A node still has ranks of a job: remember to stop them if the job is over (or over for that node).

        Returns True when the node must be told (again) to stop the job.
        """
        node = self.registry.get(node_name)
        job = self.runs.active.get(job_id)
        assert node is not None
        # Not among the job's nodes: ranks of an earlier run of a requeued job, on a node that was lost.
        if job is None or node_name not in job.nodes or node_name in self.runs.tracking[job_id].done:
            node.stale.add(job_id)  # ended, or written off on this node: its PEs may be reused elsewhere
            return True
        if job.ending is not None:
            out.append(Send(node_name, p.KillJob(job_id=job_id, reason=job.reason)))
        return False

    # Each job report below returns an error for the node (and changes nothing) when the node has no ranks
    # of the job: see _foreign.

    def _job_launched(self, msg: p.JobLaunched, now: float, out: list[Effect]) -> p.Error | None:
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.runs.active.get(msg.job_id)
        if job is None or msg.node not in job.nodes or msg.node in self.runs.tracking[job.id].done:
            self._stop_if_over(msg.node, msg.job_id, out)
            out.append(Send(msg.node, p.KillJob(job_id=msg.job_id, reason="the job has ended")))
            return None
        self.runs.launched(job, msg.node, now)
        return None

    def _rank_failed(self, msg: p.RankFailed, now: float, out: list[Effect]) -> p.Error | None:
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        job = self.runs.active.get(msg.job_id)
        # A node written off (or outside a requeued job's new run) speaks for ranks that no longer count.
        if job is not None and msg.node in job.nodes and msg.node not in self.runs.tracking[job.id].done:
            reason = f"{msg.exit.describe()} on {msg.node}"
            self.runs.end(job, JobState.FAILED, reason, now, out, exit_code=msg.exit.status)
        return None

    def _job_node_done(self, msg: p.JobNodeDone, now: float, out: list[Effect]) -> p.Error | None:
        """None when the report is taken (the node is then acknowledged: it may forget the job)."""
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        runs = self.runs
        node = self.registry.get(msg.node)
        job = runs.active.get(msg.job_id)
        if job is None or msg.node not in job.nodes or msg.node in runs.tracking[job.id].done:
            if node is not None and msg.job_id in node.stale:
                node.stale.discard(msg.job_id)
                if not node.stale:
                    runs.want_pass()
            return None  # a re-sent report, or the last word from a node that was written off
        track = runs.tracking[job.id]
        track.done[msg.node] = msg.exits
        if len(track.done) < len(job.nodes) or not set(track.done) >= set(job.nodes):
            # Stored before the ack, after which the node forgets the job: an MM restarted before the job's
            # other nodes report must know this one finished its part rather than lost it.
            self.store.save_node_exits(job.id, msg.node, msg.exits)
        runs.reports.node_done(msg)
        failed = [e for e in msg.exits if e.failed]
        if msg.reason:
            runs.end(job, JobState.NODE_FAIL, msg.reason, now, out)
        elif failed:
            reason = f"{failed[0].describe()} on {msg.node}"
            runs.end(job, JobState.FAILED, reason, now, out, exit_code=failed[0].status)
        runs.maybe_finish(job.id, now, out)
        return None

    def _job_stats(self, msg: p.JobStats, now: float) -> p.Error | None:
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        if msg.job_id in self.runs.active and msg.node in self.runs.active[msg.job_id].nodes:
            self.runs.reports.job_stats(msg, now)
        return None

    def _wireup(self, msg: wireup.WireupReport, now: float, out: list[Effect]) -> p.Error | None:
        """A PMI barrier, an MPI_Comm_spawn's outcome or an MPI name request from a node (mm/wireup.py)."""
        refused = self._foreign(msg.node, msg.job_id, msg.op, now)
        if refused is not None:
            return refused
        problem = wireup.handle(self.runs, self.store, msg, now, out)
        return None if problem is None else self._refuse(msg.node, problem, now)

    def _foreign(self, node_name: str, job_id: int, what: str, now: float) -> p.Error | None:
        """An error when ``node_name`` has no ranks of the job, as far as the MM knows; None when it may.

        An authenticated node manager still speaks only for its own ranks. It may have those of the job's
        current (or last) run on it, of an earlier run of a requeued job it has not confirmed gone
        (``stale``), or of a requeued job's last run whose reports may still be on their way (``echoes``).
        """
        job = self.runs.job(job_id)
        node = self.registry.get(node_name)
        if (
            (job is not None and node_name in job.nodes)
            or (node is not None and job_id in node.stale)
            or self.runs.echoes.expects(job_id, node_name)
        ):
            return None
        return self._refuse(node_name, f"{what} about job {job_id}, which has no ranks on {node_name}", now)

    def _refuse(self, node: str, text: str, now: float) -> p.Error:
        """A node report that must change nothing: a log line (throttled per node) and the error for it."""
        self.throttle.warning(log, ("refused", node), now, "node %s: refused %s", node, text)
        return p.Error(code="bad_request", text=text)
