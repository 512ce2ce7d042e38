"""The node manager's decisions, with no sockets: what a node does with what reaches it.

h11's ``Connection`` and dask's ``WorkerState.handle_stimulus`` are the model. :class:`Node` takes what
reaches a node manager (the MM's messages, a job shell's, a heartbeat, the clock, a shell's end, the end of
a kill's grace period), with time passed in, and returns an :class:`Outcome`: the messages to send (to the
MM, to a job shell), the timers to arm and the context switch to check. What the OS must do goes through
the process seam (nm/processes.py: spawn, signal, priorities, shared memory) and the measurement interface
(nm/monitor.py's ``Measurements``: mpihook's records, wait modes, CPU times), which the daemon backs with the
real thing and tests and a simulator with fakes and numbers. The daemon (nm/daemon.py) moves bytes: sockets,
CURVE, the reporter's timer, pidfd watches and shutdown.

A time slice reads as one line (:meth:`Node.heartbeat`): sample the measurements, classify the processes
of the row whose slot ended (FCS), decide the switch for the policy (nm/fcs.py ``decide``), apply it. A
class change is reported to the MM at once, not with the next periodic report. When the heartbeat names the
instant its slot begins (and this node trusts its clock, ``[nm] synchronized_clock``), all of that waits
for the instant: the outcome asks the driver to call :meth:`Node.begin_slot` then (nm/gang.py says when a
node does not wait).

One record per job on the node (:class:`storm.nm.local_jobs.LocalJob`); forgetting a job is one call
(:meth:`Node.forget`), which drops it from every table that follows it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.mm.limits import LogThrottle
from storm.nm.checks import shell_problem
from storm.nm.classes import Classifier
from storm.nm.fcs import Klass
from storm.nm.gang import GangFollower
from storm.nm.local_jobs import LocalJob, LocalJobs
from storm.nm.monitor import Measurements
from storm.nm.processes import Processes
from storm.nm.profile import Profiler
from storm.nm.shells import JobShell
from storm.nm.switcher import ContextSwitcher, SwitchCheck, TraceLine
from storm.nm.timings import Timings

log = logging.getLogger("storm.nm")


@dataclass
class Outcome:
    """What one stimulus makes the node do, in order: messages to the MM, messages to job shells (by the
    routing id of the shell's connection), kills whose grace period to time (job ids: call
    :meth:`Node.escalate` ``kill_grace`` seconds later), ends to watch (through pidfds: the shells of jobs
    a previous NM left, :meth:`Node.shell_exited`; job shells started, :meth:`Node.job_shell_ended`), and a
    context switch to check (nm/switch_check.py, then :meth:`Node.switch_checked`)."""

    to_mm: list[p.Message] = field(default_factory=list)
    to_shells: list[tuple[bytes, p.Message]] = field(default_factory=list)
    escalate: list[int] = field(default_factory=list)
    watch: list[LocalJob] = field(default_factory=list)
    watch_shells: list[JobShell] = field(default_factory=list)
    check: SwitchCheck | None = None
    report_now: bool = False  # register (again) or report without waiting for the reporter's interval
    # A slot to begin at a wall-clock instant: (heartbeat seq, instant); call Node.begin_slot(seq) then.
    slot: tuple[int, float] | None = None


@dataclass
class Following:
    """The MM this node follows and its policy: one value, set on registration."""

    mm_epoch: str = ""
    policy: p.Policy = p.Policy.BATCH
    fcs: p.FcsParameters = field(default_factory=p.FcsParameters)
    report_interval: float = 1.0
    registered: bool = False

    @property
    def cycles(self) -> bool:
        return self.policy.cycles

    @property
    def classifies(self) -> bool:
        return self.policy.classifies


class Node:
    """One node manager's state and decisions. See the module's docstring."""

    def __init__(
        self,
        config: NMConfig,
        name: str,
        cpus: list[int],
        run_dir: Path,
        *,
        epoch: str,
        processes: Processes,
        measurements: Measurements,
        address: str = "",
        host: str = "",
        cluster: str = "",
        trace: Callable[[TraceLine], object] | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.cpus = cpus
        self.epoch = epoch
        self.address = address
        self.host = host
        self.os = processes
        self.monitor = measurements
        self.following = Following()
        self.follower = GangFollower(timeout=config.heartbeat_timeout or 1.0)
        self.timings = Timings()  # for storm-mm's metrics, in every node_status
        self.switcher = ContextSwitcher(
            processes, trace, on_switch=measurements.switched, set_wait=measurements.set_wait
        )
        self.classifier = Classifier(name, measurements, self.switcher)
        self.profiler = Profiler(name) if config.profile else None
        # A heartbeat accepted whose instant has not come yet, and the wall clock when it arrived.
        self.pending: tuple[p.Heartbeat, float] | None = None
        self.local = LocalJobs(
            config, name, cpus, run_dir, processes=processes, switcher=self.switcher, monitor=measurements,
            profiler=self.profiler, cluster=cluster,
        )  # fmt: skip
        self.jobs = self.local.jobs
        self.throttle = LogThrottle()  # warnings about bad input: a flood of garbage must not fill the disk

    # ---------------------------------------------------------------------------------------------- start

    def recover(self) -> Outcome:
        """Re-adopt the jobs a previous storm-nm of this node left (before the shells' socket exists)."""
        adopted = self.local.recover()
        if adopted:
            log.info("re-adopted %d job(s) left by a previous storm-nm", len(adopted))
        return Outcome(watch=[job for job in adopted if job.shell_pidfd >= 0])

    def reports(self) -> list[p.Message]:
        """What the reporter sends now: registration until the MM answers, then the node's status and each
        job's report (its end until acknowledged, else its measurements)."""
        if not self.following.registered:
            register = p.RegisterNode(
                node=self.name, pes=len(self.cpus), nm_epoch=self.epoch, address=self.address, host=self.host,
                jobs=tuple(self.jobs),
            )  # fmt: skip
            return [register]
        switches, p50, p99 = self.switcher.stats()
        out: list[p.Message] = [
            p.NodeStatus(
                node=self.name, nm_epoch=self.epoch, mm_epoch=self.following.mm_epoch, jobs=tuple(self.jobs),
                launched=tuple(j.job_id for j in self.jobs.values() if j.ranks_known and j.done is None),
                switches=switches, switch_p50_ms=p50, switch_p99_ms=p99,
                suspended=tuple(j.job_id for j in self.jobs.values() if j.suspended and j.done is None),
                late_beats=self.follower.late, skewed_beats=self.follower.skewed,
                timings=self.timings.report(late=self.follower.late, skewed=self.follower.skewed),
            )
        ]  # fmt: skip
        for job in list(self.jobs.values()):
            if job.done is not None:
                if job.spawns.failure is not None:  # before the report: what the job ends with
                    out.append(job.spawns.failure)
                out.append(job.done)
            elif self.monitor.watches(job.job_id) or (job.ranks_known and not job.hook_segment):
                out.append(self.job_stats(job.job_id))
        return out

    # ---------------------------------------------------------------------------------------------- the MM

    def from_mm(self, msg: p.Message, now: float, wall: float | None = None) -> Outcome:
        """A message from the MM (decoded already); ``wall``: the wall clock, which a context switch it causes
        is timed by (``now`` if not given)."""
        out = Outcome()
        job = self.jobs.get(getattr(msg, "job_id", -1))
        match msg:
            case p.NodeRegistered():
                self._registered(msg, now, out)
                for local in self.jobs.values():
                    self._suspend(local, local.job_id in msg.suspended, now if wall is None else wall, out)
            case p.SuspendJob() | p.ResumeJob():
                if job is not None and job.done is None and not job.killing:
                    if isinstance(msg, p.ResumeJob):
                        self.switcher.set_row(msg.job_id, msg.row)
                    self._suspend(job, isinstance(msg, p.SuspendJob), now if wall is None else wall, out)
            case p.JobRows():
                for key, row in msg.rows.items():
                    self.switcher.set_row(int(key), row)
            case p.Reregister():
                log.info("storm-mm asks to register again: %s", msg.reason)
                self.following.registered = False
                out.report_now = True
            case p.LaunchJob():
                if msg.job_id not in self.jobs:  # else a repeated launch: the first one is under way
                    launched = self.local.launch(msg)
                    if launched.done is not None:
                        out.to_mm.append(launched.done)
            case p.KillJob():
                if job is None:
                    out.to_mm.append(p.JobNodeDone(job_id=msg.job_id, node=self.name, exits=()))
                elif job.done is not None:
                    out.to_mm.append(job.done)
                else:
                    self._kill(job, msg.reason, out)
            case p.PmiBarrierOut():
                # Only the answer the shell waits for: after an MM restart the same one may come twice.
                if (
                    job is not None
                    and job.done is None
                    and job.barrier is not None
                    and job.barrier.seq == msg.seq
                ):
                    log.debug("job %d: PMI barrier %d out (%d keys)", msg.job_id, msg.seq, len(msg.kvs))
                    job.barrier = None
                    job.next_barrier = msg.seq + 1
                    # job.peer is known: the barrier came from the shell (to this NM, or again after it).
                    out.to_shells.append((job.peer, msg))
            case p.PmiNameResult():  # to the job shell that asked (it matches it by number)
                if job is not None and job.done is None and job.peer:
                    out.to_shells.append((job.peer, msg))
            case p.Ack():
                if job is not None and job.done is not None and msg.what == p.JobNodeDone.op:
                    self.forget(job)
            case p.Error():
                log.warning("storm-mm reported an error: %s: %s", msg.code, msg.text)
            case _:
                log.warning("unexpected %s from the MM", msg.op)
        return self._shells_too(out)

    def _shells_too(self, out: Outcome) -> Outcome:
        """What the stimulus had for job shells, and the job shells it started, into its outcome."""
        out.to_shells.extend(self.local.take_messages())
        if self.local.new_shells:
            out.watch_shells.extend(self.local.new_shells)
            self.local.new_shells = []
        return out

    def _registered(self, msg: p.NodeRegistered, now: float, out: Outcome) -> None:
        following = self.following
        first, new_mm = not following.mm_epoch, msg.mm_epoch != following.mm_epoch
        following.mm_epoch, following.report_interval = msg.mm_epoch, msg.report_interval
        following.registered = True
        log.info("registered with storm-mm %s%s", msg.mm_epoch[:8], "" if first else " (again)")
        if new_mm:  # it adds up what grew since: from zero
            self.timings.restart(late=self.follower.late, skewed=self.follower.skewed)
        for job_id in msg.stale_jobs:
            job = self.jobs.get(job_id)
            if job is not None:
                self._kill(job, "the MM has ended this job", out)
        for key, row in msg.rows.items():
            self.switcher.set_row(int(key), row)
        self._follow(msg, now, out)
        if new_mm:  # barriers the old MM may have lost
            out.to_mm.extend(
                j.barrier for j in self.jobs.values() if j.barrier is not None and j.done is None
            )

    def _follow(self, msg: p.NodeRegistered, now: float, out: Outcome) -> None:
        """Follow the policy of the MM just registered with (heartbeats under gang and FCS)."""
        policy = p.Policy(msg.policy)  # decoding checked it
        self.following.policy, self.following.fcs = policy, msg.fcs
        self.switcher.policy, self.switcher.f_priority = policy, msg.fcs.f_priority
        self.switcher.background_nice = msg.fcs.background_nice
        self.local.spin_blocking = policy.spin_block
        self.classifier.constants = msg.fcs
        self.monitor.spin_ns = int(msg.fcs.spin * 1e9)
        if not self.config.heartbeat_timeout:
            self.follower.timeout = max(1.0, 10 * msg.slice)
        self.follower.follow(msg.mm_epoch, now)
        if self.follower.row is None:
            out.check = self.switcher.switch(None, now=now)  # until a heartbeat says otherwise, all run

    def _suspend(self, job: LocalJob, suspended: bool, wall: float, out: Outcome) -> None:
        """Preemption: hold the job's ranks stopped, or let them run again as the policy says (SIGSTOP and
        SIGCONT through the context switch, which heartbeats then leave alone). Kept in the job's record."""
        changed = self.switcher.set_suspended(job.job_id, suspended and job.done is None)
        if job.suspended != suspended:
            job.suspended = suspended
            log.info("job %d %s", job.job_id, "suspended" if suspended else "resumed")
            with contextlib.suppress(OSError):
                self.local.save_record(job)  # a restarted NM keeps it stopped until the MM says otherwise
        if changed:
            out.check = self.switcher.switch(self.switcher.active, now=wall) or out.check

    # ---------------------------------------------------------------------------------------------- slices

    def heartbeat(self, beat: p.Heartbeat, now: float, wall: float) -> Outcome:
        """A heartbeat arrived (``now`` monotonic, ``wall`` the wall clock its times are in). Its slot begins
        now, or at the instant it names (``Outcome.slot``: the driver then calls :meth:`begin_slot`)."""
        out = Outcome()
        if not self.following.cycles:
            return out
        if not self.follower.accept(beat, now):
            if beat.epoch == self.follower.epoch:
                self._warn(now, "stale heartbeat", "ignored heartbeat %d: replayed or out of order", beat.seq)
            else:  # a restarted MM's, until this NM has registered with it
                log.debug("ignored heartbeat %d of storm-mm %s", beat.seq, beat.epoch[:8])
            return out
        self.timings.heard(beat.sent, wall)
        if self.pending is not None:  # its instant has not come, and the next slot has: it begins now
            self._begin(*self.pending, wall, out)
            self.pending = None
        wait = (
            self.follower.wait(beat, wall, self.config.clock_tolerance)
            if self.config.synchronized_clock
            else 0
        )
        if wait > 0:
            self.pending = (beat, wall)
            out.slot = (beat.seq, beat.at)
        else:
            self._begin(beat, wall, wall, out)
        return out

    def begin_slot(self, seq: int, wall: float) -> Outcome | None:
        """The instant of heartbeat ``seq`` has come (``wall``: the wall clock now): its slot begins, unless
        it began already (a newer heartbeat arrived first). None when that leaves the driver nothing to do:
        an idle node's slot builds no Outcome (an emulator begins hundreds of them in turn at an instant)."""
        pending = self.pending
        if pending is None or pending[0].seq != seq:
            return None
        self.pending = None
        beat, received = pending
        if not self.switcher.units:
            self._begin_idle(beat, received, wall)
            return None
        out = Outcome()
        self._begin(beat, received, wall, out)
        return out

    def _begin_idle(self, beat: p.Heartbeat, received: float, wall: float) -> None:
        """A slot begins on a node without ranks: nothing to sample, classify or signal."""
        at = beat.at
        self.switcher.switch(beat.row, now=wall, seq=beat.seq, sent=beat.sent, received=received, at=at)
        if at:
            self.timings.began(at, wall)

    def _begin(self, beat: p.Heartbeat, received: float, wall: float, out: Outcome) -> None:
        """A slot begins: sample, classify, switch (into ``out``)."""
        switcher = self.switcher
        if not switcher.units:  # no rank here: nothing to sample or classify (most nodes of an idle cluster)
            self._begin_idle(beat, received, wall)
            return
        if beat.at:
            self.timings.began(beat.at, wall)
        self.sample()  # first: who is inside a blocking call as the slice ends
        changed = (
            self.classifier.end_of_slot(self.switcher.active, beat.resets, now=wall)
            if self.following.classifies
            else set()
        )
        check = switcher.switch(
            beat.row, now=wall, seq=beat.seq, sent=beat.sent, received=received, at=beat.at
        )
        out.check = check or out.check  # a slot begun late, just before this one, may have signalled
        if changed:
            out.to_mm.extend(self.job_stats(job_id) for job_id in sorted(changed) if job_id in self.jobs)

    def tick(self, now: float, wall: float) -> Outcome:
        """The clock (every 0.1 s): without heartbeats a slice of that length; with them, if they stopped for
        too long, every job runs rather than some staying stopped for ever."""
        out = Outcome()
        if not self.following.cycles:
            self.sample()
        if self.follower.expired(now):
            log.warning("no heartbeat for %.1f s: letting every job run", self.follower.timeout)
            out.check = self.switcher.switch(None, now=wall)
        out.to_shells.extend(self.local.shells.to_retire(now))
        return out

    def switch_checked(self, check: SwitchCheck, done: float) -> None:
        self.switcher.checked(check, done)
        self.timings.took(done - (check.begun or check.received))

    def sample(self) -> None:
        """Read every rank's record at the end of a slice; profile it too, under the class it had then."""
        self.monitor.sample()
        if self.profiler is None:
            return
        for key, unit in self.switcher.units.items():
            snapshot = self.monitor.snapshot(unit.job_id, unit.index) if unit.pid else None
            if snapshot is not None:
                klass = self.switcher.classes.get(key, Klass.CS).value if self.following.classifies else ""
                self.profiler.update(key, snapshot, klass)

    def job_stats(self, job_id: int) -> p.JobStats:
        """The job's ranks on this node: mpihook's measurements, and under FCS their classes."""
        ranks = []
        for stats in self.monitor.stats(job_id) or self._unmeasured(job_id):
            key = (job_id, stats.rank)
            unit = self.switcher.units.get(key)
            extra: dict[str, object] = {"job_id": job_id, "pe": unit.pe if unit else 0}
            if self.following.classifies:
                state = self.classifier.state(key)
                extra.update(klass=state.klass.value, cslots=state.cslots, tslots=state.tslots)
            ranks.append(dataclasses.replace(stats, **extra))  # type: ignore[arg-type]
        changes = self.classifier.take_changes(job_id)
        profile = self.profiler.entries(job_id) if self.profiler is not None else ()
        return p.JobStats(job_id=job_id, node=self.name, ranks=tuple(ranks), changes=changes, profile=profile)

    def _unmeasured(self, job_id: int) -> list[p.RankStats]:
        """The ranks of a job that runs without mpihook (storm submit --no-hook, [nm] hook = false)."""
        job = self.jobs.get(job_id)
        if job is None or job.hook_segment:
            return []
        return [
            p.RankStats(
                rank=s.rank, node=self.name, pid=job.pids.get(s.rank, 0), state="no-hook", t_cpu=0.0,
                t_comm=0.0, c_comm=0, granularity=None, calls=0, wait_mode="poll",
            )
            for s in job.launch.slots
        ]  # fmt: skip

    # ---------------------------------------------------------------------------------------------- shells

    def from_shell(
        self, identity: bytes, msg: p.Message, caller: tuple[int, int] | None, now: float
    ) -> Outcome:
        """A message from a job shell; ``caller`` is the sender's (pid, uid) as the kernel gives them (None
        if unknown). A refused message changes nothing and is logged."""
        out = Outcome()
        if isinstance(msg, p.ShellReady):
            if caller is not None and caller[0] == msg.pid:  # the kernel vouches for the pid
                out.to_shells.extend(self.local.shells.ready(msg.pid, identity))
            return out
        job_id = getattr(msg, "job_id", -1)
        job = self.jobs.get(job_id)
        if job is None:
            self._warn(
                now, "bad shell", "dropped %s about an unknown job (from %s)", msg.op, describe(caller)
            )
            # A job shell of this node still running a job this NM does not know (the MM ended it while the
            # NM was away): it stops it, and may forget its report. Nobody else gets an answer.
            if caller is not None and self._is_shell(caller[0]):
                if isinstance(msg, p.ShellDone):
                    out.to_shells.append((identity, p.Ack(job_id=job_id, what=msg.op)))
                elif job_id >= 0:
                    out.to_shells.append((identity, p.ShellStop(job_id=job_id)))
            return out
        if caller is None or caller[0] != job.shell_pid:
            self._warn(
                now, "bad shell", "dropped %s from %s: not job %d's shell (pid %d)", msg.op, describe(caller),
                job.job_id, job.shell_pid,
            )  # fmt: skip
            return out
        # The kernel vouches for the sender's pid (SO_PEERCRED), not the routing id it chose: replies go to
        # the connection the shell itself speaks on, whatever id another process may have taken. Any of its
        # messages will do, not only its hello: after an NM restart, what it queued while no NM listened
        # comes first.
        job.peer = identity
        problem = shell_problem(job, msg, self.name, job.next_barrier, self.os.parent)
        if problem is not None:
            self._warn(now, "bad shell", "job %d: refused %s from its shell: %s", job.job_id, msg.op, problem)
            return out
        match msg:
            case p.RanksStarted():
                if self.local.started(job, {int(rank): pid for rank, pid in msg.pids.items()}):
                    out.to_mm.append(p.JobLaunched(job_id=job.job_id, node=self.name, pids=msg.pids))
            case p.RankExited() | p.RankAborted():
                if isinstance(msg, p.RankExited):
                    job.exits[msg.exit.rank] = msg.exit
                    self.switcher.rank_gone(job.job_id, msg.exit.rank)
                if msg.exit.failed and not job.killing:
                    log.info("job %d: %s", job.job_id, msg.exit.describe())
                    out.to_mm.append(p.RankFailed(job_id=job.job_id, node=self.name, exit=msg.exit))
                    self._kill(job, msg.exit.describe(), out)
            case p.PmiBarrierIn():
                log.debug("job %d: PMI barrier %d in (%d keys)", msg.job_id, msg.seq, len(msg.kvs))
                job.barrier = msg
                out.to_mm.append(msg)
            case p.ShellDone():
                out.to_shells.append((identity, p.Ack(job_id=msg.job_id, what=msg.op)))
                if job.done is None:
                    self.local.finish(job, msg.exits)
                    assert job.done is not None
                    out.to_mm.append(job.done)
            case p.JobOutput():  # relayed as it is (the daemon drops it if the link to the MM is backed up)
                out.to_mm.append(msg)
            case p.Spawned() | p.SpawnExited() | p.JobSpawned() | p.PmiName():
                before = job.killing
                out.to_mm.extend(self.local.dynamic(job, msg))
                if job.killing and not before:
                    out.escalate.append(job.job_id)
        return self._shells_too(out)

    def _is_shell(self, pid: int) -> bool:
        """A job shell this NM started, or the shell of a job it knows."""
        return pid in self.local.shells.by_pid or any(j.shell_pid == pid for j in self.jobs.values())

    def shell_exited(self, job_id: int) -> Outcome:
        """The shell of a job a previous NM left ended (its pidfd became readable; the daemon closed it)."""
        out = Outcome()
        job = self.jobs.get(job_id)
        if job is not None:
            job.shell_pidfd = -1
            self._shell_gone(job, out)
        return self._shells_too(out)

    def job_shell_ended(self, pid: int) -> Outcome:
        """A job shell this NM started exited (its pidfd became readable; the daemon closed it): the jobs it
        had not reported end with every rank failed."""
        out = Outcome()
        self.local.shell_ended(pid)
        for job in [j for j in self.jobs.values() if j.shell_pid == pid and j.shell_pidfd < 0]:
            self._shell_gone(job, out)
        return self._shells_too(out)

    def _shell_gone(self, job: LocalJob, out: Outcome) -> None:
        if job.done is None:
            self.local.shell_gone(job, "the job shell ended before reporting (its log is in the node's log)")
            assert job.done is not None
            out.to_mm.append(job.done)

    def retire_shells(self, now: float, *, everyone: bool) -> Outcome:
        """The NM exits: its job shells without a job (``everyone``: all, once every job has been stopped)
        exit; the others serve their jobs on, for the next NM."""
        out = Outcome(to_shells=self.local.shells.to_retire(now, idle_for=0.0, everyone=everyone))
        return self._shells_too(out)

    # ---------------------------------------------------------------------------------------------- ends

    def _kill(self, job: LocalJob, reason: str, out: Outcome) -> None:
        if self.local.kill(job, reason):
            out.escalate.append(job.job_id)

    def escalate(self, job_id: int) -> None:
        """A kill's grace period is over."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.local.escalate(job)

    def forget(self, job: LocalJob) -> None:
        """The MM has the job's final report: nothing of it remains on the node, in any table."""
        self.local.forget(job)
        self.switcher.remove(job.job_id)
        self.monitor.remove(job.job_id)
        self.classifier.forget(job.job_id)
        if self.profiler is not None:
            self.profiler.forget(job.job_id)

    def stop_all(self, reason: str) -> Outcome:
        """Stop every job (the NM shuts down with its jobs): each is killed and saved with why."""
        out = Outcome()
        for job in [j for j in self.jobs.values() if j.done is None]:
            job.stopped_by_nm = reason
            with contextlib.suppress(OSError):
                self.local.save_record(job)  # a report the MM misses is re-sent by the next NM, with why
            self._kill(job, reason, out)
        return self._shells_too(out)

    def abandon(self, why: str) -> list[p.Message]:
        """Shutting down: jobs whose shells did not finish are finished as they are; every job's report."""
        for job in self.jobs.values():
            if job.done is None:
                self.local.shell_gone(job, why)
        return [job.done for job in self.jobs.values() if job.done is not None]

    def _warn(self, now: float, kind: object, text: str, *args: object) -> None:
        self.throttle.warning(log, kind, now, text, *args)


def describe(caller: tuple[int, int] | None) -> str:
    """A job shell socket's peer (pid, uid), for log lines about what it sent."""
    return "an unknown process" if caller is None else f"pid {caller[0]} (uid {caller[1]})"
