"""A simulated time-shared cluster: storm-mm's core, storm-nm's core on every node, the node model under
them (issue 15, item 2).

The MM side is :class:`storm.mm.core.Controller` with the in-memory store, configured with the policy, the
MPL, the slice and FCS's constants, as tools/sim/engine.py drives it for batch traces. The node side is one
:class:`storm.nm.node.Node` per node, whole, over tools/sim/cosched/adapters.py's seams, so that what a
simulated node decides (SIGSTOP/SIGCONT, nice, poll or spin-block, FCS's classes) is what storm-nm decides:

- a submission is a SubmitJob to the MM; its launches go to the nodes' cores (``Node.from_mm``), which
  start a job shell through the process seam; once every node of the job has one, the driver starts the
  job's :class:`Program` in the model and plays the shell: RanksStarted with the ranks' pids
  (``Node.from_shell``), whereupon the node core signals and steers them as the current slice wants;
- every slice the MM's ``heartbeat(now)`` makes a Heartbeat, which every node core with jobs gets
  (``Node.heartbeat``): it samples the measurements, classifies (FCS) and switches; the switch's check is
  answered as done (``Node.switch_checked``) after the model's context-switch cost. A node core without
  jobs gets the last heartbeat only, just before anything else reaches it (:meth:`_heartbeat`);
- when the model says the job's program has ended, the driver plays the shell again (ShellDone), and the
  node core reports JobNodeDone to the MM, which frees the job's PEs and starts what is queued.

ClusterSchedSim's dynamic coscheduling (issue 15 item 2: DCS, PB, DCS-SB, PB-SB) is no storm policy: the
cores run it as sb (every rank runnable, no heartbeat), and the node model's local scheduler
(``Costs.local``, local.py) reschedules; DCS and PB busy-wait, so their ranks poll whatever the node core
asks, the -SB ones spin-block as sb's do.

Messages take no time. Between two instants where the driver acts (a heartbeat, a submission) the model
runs up to the first instant a running job could end (:meth:`_horizon`), where the driver looks for jobs
that ended, and so on. Deterministic: the MM's nonces are seeded, pids are handed out in order, nothing
reads a wall clock but the run's own cost.

Cost: a run is O(E x n) in the model's events E (n processes per PE) plus O(S x R) for S slices of the R
ranks on nodes with jobs through the node cores; the model dominates for fine-grained jobs.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.config import MMConfig, NMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Effect, JobEnded, Publish, Reply, Send
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.nm.node import Node, Outcome
from storm.tools.sim.cosched.adapters import ProcessTable, SimMonitor, SimProcesses
from storm.tools.sim.cosched.node import NO_COSTS, RUNNABLE, CoschedModel, Costs, PeCounters, Phase
from storm.tools.sim.cosched.program import Program
from storm.tools.sim.cosched.records import Reschedule, WaitMode

NS = 1_000_000_000
UNBOUNDED = 2**63  # a horizon without running jobs
# The dynamic schemes: the node model's rescheduling, and the wait mode forced on every rank (None: sb's).
DYNAMIC = {
    "dcs": (Reschedule.DCS, WaitMode.POLL), "pb": (Reschedule.PB, WaitMode.POLL),
    "dcs-sb": (Reschedule.DCS, None), "pb-sb": (Reschedule.PB, None),
}  # fmt: skip
POLICIES = ("batch", "gang", "sb", "fcs", *DYNAMIC)


class SimulationError(RuntimeError):
    """A core refused what the simulated cluster sent it, or the run could not finish."""


@dataclass(frozen=True)
class SimJob:
    """A job to submit: its program (one rank per PE it asks for) at ``submit_ns``, with its requested time
    in seconds (None: unlimited). The limit only informs the MM's EASY reservations: the driver never calls
    the MM's tick, so no job is killed at its limit."""

    name: str
    program: Program
    submit_ns: int = 0
    time_limit: float | None = None


@dataclass(frozen=True)
class JobResult:
    name: str
    mm_id: int
    submit: float  # seconds, the MM's records
    start: float
    end: float
    state: str

    @property
    def response(self) -> float:
        return self.end - self.submit


@dataclass
class ClusterResult:
    policy: str
    jobs: list[JobResult]
    wall_seconds: float
    model_events: int
    slices: int
    pes: list[PeCounters] = field(default_factory=list)
    # Per process (job name, rank): where its time went in the model, and its class changes under FCS.
    stopped_ns: dict[tuple[str, int], int] = field(default_factory=dict)
    classes: list[tuple[float, str, int, str, str]] = field(default_factory=list)  # time, job, rank, old, new


def mm_policy(policy: str, costs: Costs) -> str:
    """The storm policy the cores run ``policy`` as, once ``costs`` are checked to reschedule as it does."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    want = DYNAMIC[policy][0] if policy in DYNAMIC else Reschedule.NONE
    have = Reschedule.NONE if costs.local is None else costs.local.reschedule
    if have is not want:
        raise ValueError(
            f"policy {policy} needs Costs.local with reschedule={want.name}, not {costs.local} "
            "(the node model's local scheduler, local.py)"
        )
    return "sb" if policy in DYNAMIC else policy


def mm_config(policy: str, mpl: int, slice_s: float) -> MMConfig:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    # Simulated nodes never go silent and end on their own: liveness and kill timeouts never fire. Messages
    # take no time, so a heartbeat's slot begins as it arrives, on every node at once: it names no instant.
    return MMConfig(
        mpl=1 if policy == "batch" else mpl, slice=slice_s, backfill="easy", node_timeout=math.inf,
        kill_timeout=math.inf, switch_lead=0.0,
    )  # fmt: skip


class CoschedCluster:
    """``nodes`` x ``pes_per_node`` PEs under ``policy``; :meth:`run` simulates a list of jobs once."""

    def __init__(
        self,
        nodes: int,
        pes_per_node: int,
        policy: str,
        *,
        mpl: int = 3,
        slice_s: float = 0.1,
        costs: Costs = NO_COSTS,
        fcs: p.FcsParameters | None = None,
        seed: int = 0,
        profile: bool = True,
    ) -> None:
        """``profile``: the node cores profile every rank at every slice, as the live benchmark's do
        ([nm] profile); it decides nothing, and a long run is faster without it."""
        self.nodes_count = nodes
        self.pes_per_node = pes_per_node
        self.policy_name = policy
        self.policy = p.Policy(mm_policy(policy, costs))
        self.slice_ns = round(slice_s * NS)
        self.costs = costs
        self.model = CoschedModel(nodes * pes_per_node, costs)
        self.table = ProcessTable(self.model, DYNAMIC[policy][1] if policy in DYNAMIC else None)
        self.fcs = fcs or p.FcsParameters()
        self.ctl = Controller(
            MemoryStore(), mm_config(self.policy.value, mpl, slice_s), "sim-mm", nonce=seeded_nonces(seed),
            policy=self.policy, fcs=self.fcs,
        )  # fmt: skip
        self.caller = Account(os.getuid(), os.getgid(), "sim")  # launches run as a user this host knows
        self.nodes: dict[str, Node] = {}
        self.monitors: dict[str, SimMonitor] = {}
        self.inbox: deque[tuple[str, p.Message]] = deque()  # node reports on their way to the MM
        self.launches: dict[int, dict[str, p.LaunchJob]] = {}  # job -> node -> its launch, until started
        self.programs: dict[int, tuple[str, Program]] = {}  # MM job id -> (name, program)
        self.running: list[int] = []  # MM job ids started in the model and not ended
        self.running_ids: set[int] = set()  # the same, to look up
        self.horizon: int | None = None  # no running job can end before this (None: to be worked out)
        self.bounds: list[tuple[int, int]] = []  # heap of (a bound on the job's end, job id): _horizon
        self.step_events = False  # True: the model is run one event instant at a time, as it was
        self.ended: dict[int, JobEnded] = {}
        self.class_changes: list[p.ClassChange] = []  # FCS: as the node cores report them to the MM
        self.slices = 0
        self.now_ns = 0
        self.profile = profile
        # A node without jobs gets only the last heartbeat, just before anything else reaches it (see
        # _heartbeat). False: every node gets every heartbeat as it is sent (the tests compare the two).
        self.defer_idle = True
        self.deferred: dict[str, tuple[p.Heartbeat, float]] = {}
        self.kept = 0  # node heartbeats kept, not delivered

    # ------------------------------------------------------------------------------------------ the run

    def run(self, jobs: list[SimJob], limit_ns: int = 3600 * NS) -> ClusterResult:
        started = time.perf_counter()
        logger = logging.getLogger("storm")
        level = logger.level
        logger.setLevel(logging.WARNING)  # the cores log a line per launch, switch and end
        try:
            # The node cores keep each job's directory as storm-nm does; in memory where the host has a
            # tmpfs for it, since a run makes and removes thousands of them.
            scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
            with tempfile.TemporaryDirectory(prefix="storm-sim-", dir=scratch) as run_dir:
                self._boot(Path(run_dir))
                self._run(sorted(jobs, key=lambda j: j.submit_ns), limit_ns)
                for name in list(self.deferred):
                    self._node(name)  # every node core ends as it would have with every heartbeat
        finally:
            logger.setLevel(level)
        return self._result(time.perf_counter() - started)

    def _boot(self, run_dir: Path) -> None:
        self._carry_out(self.ctl.recover(0.0), None)
        for i in range(self.nodes_count):
            name = f"n{i}"
            processes = SimProcesses(self.table)
            self.monitors[name] = SimMonitor(processes, name)
            node = Node(
                NMConfig(kill_grace=1.0, profile=self.profile), name, list(range(self.pes_per_node)),
                run_dir / name, epoch=f"sim-nm-{i}", processes=processes, measurements=self.monitors[name],
            )  # fmt: skip
            # Any path will do: a simulated rank loads no library, but the node core makes a job's record
            # segment (and so measures it) only when mpihook is there to write it.
            node.local.hook_library = Path("/sim/libstormhook.so")
            self.nodes[name] = node
            for report in node.reports():
                self.inbox.append((name, report))
        self._settle()

    def _run(self, jobs: list[SimJob], limit_ns: int) -> None:
        submits = deque(jobs)
        cycles = self.policy.cycles
        next_beat = 0 if cycles else None
        while submits or self.running or self.ctl.runs.pending or self.ctl.runs.active:
            candidates = [t for t in (next_beat, submits[0].submit_ns if submits else None) if t is not None]
            boundary = min(candidates) if candidates else None
            self._run_model(boundary)
            if boundary is None:
                if self.running or self.ctl.runs.pending or self.ctl.runs.active:
                    raise SimulationError("jobs remain but nothing will happen: a deadlock in the model")
                break
            if boundary > limit_ns:
                raise SimulationError(f"the run passed its limit of {limit_ns / NS:.0f} s")
            self._at(boundary)
            while submits and submits[0].submit_ns == boundary:
                self._submit(submits.popleft())
            self._settle()  # jobs submitted now are placed before this instant's heartbeat names a row
            self._finish_ended()
            if next_beat == boundary:
                self._heartbeat()
                next_beat += self.slice_ns
            self._settle()
            # A job whose ranks all waited, stopped, for messages already in ends the instant the heartbeat
            # continues them: now, not at the model's next event.
            self._finish_ended()

    def _run_model(self, until: int | None) -> None:
        """Run the model event by event up to ``until`` (None: until nothing is left to happen), ending
        jobs as their programs end. O(events x (n + running jobs))."""
        model = self.model
        while True:
            upcoming = model.next_event_ns()
            if upcoming is None or (until is not None and upcoming > until):
                return
            # Every event before the horizon at once: one advance instead of one per event instant (each
            # brings every PE up to its instant), and no job's end is passed by.
            horizon = upcoming if self.step_events else self._horizon()
            limit = horizon if until is None else min(horizon, until)
            target = upcoming if limit <= upcoming or limit == UNBOUNDED else limit
            self._at(target)
            self._finish_ended()

    def _finish_ended(self) -> None:
        """End the jobs whose program has ended, and then those that ended of what that set off (a node
        core continuing another job's ranks), until none is left at this instant."""
        while ended := self._ended():
            late = [j for j in ended if (self.model._jobs[j].completion_ns or 0) < self.now_ns]
            if late:
                raise SimulationError(f"jobs {late} ended before {self.now_ns} ns: their end was run past")
            self._end_jobs()
            self._settle()

    def _horizon(self) -> int:
        """An instant no running job can end before: the least, over the running jobs, of when the job's
        slowest rank could end if it had its PE to itself from the instant its state is as of.

        A rank needs the CPU of what is left of its computation and of every later iteration's, and it
        gets at most a nanosecond of CPU per nanosecond. Its state is as of its PE's last sync, or, for a
        job the model's shortcut walks, as of the walk (``fast_ns``). A job's bound never decreases as its
        state moves on (it gets at most as much CPU as time passes), so the bounds wait in a heap and only
        those reached are worked out again: O(k (ranks + log J)) for the k jobs whose bound is reached, of
        the J running."""
        if self.horizon is not None and self.horizon > self.now_ns:
            return self.horizon
        bounds = self.bounds
        fresh: set[int] = set()
        while bounds:
            bound, job_id = bounds[0]
            if job_id not in self.running_ids:
                heapq.heappop(bounds)  # ended
            elif bound > self.now_ns or job_id in fresh:
                break
            else:
                heapq.heapreplace(bounds, (self._bound(job_id), job_id))
                fresh.add(job_id)
        # Without running jobs nothing can end: no bound on the step (the caller stops at its boundary).
        self.horizon = bounds[0][0] if bounds else UNBOUNDED
        return self.horizon

    def _bound(self, job_id: int) -> int:
        """When job ``job_id`` could end at the soonest (see _horizon). O(its ranks)."""
        model = self.model
        job = model._jobs[job_id]
        iterations = job.program.iterations
        end = 0
        for index in job.processes:
            process = model._processes[index]
            if process.phase is Phase.DONE:
                continue
            since = job.fast_ns if job.alone else model._pes[process.pe].synced_ns
            need = (iterations - process.step - 1) * process.compute_ns
            if process.phase is Phase.COMPUTE:
                need += process.remaining
            end = max(end, since + need)
        return end

    def _ended(self) -> list[int]:
        """The running jobs whose program has ended, in the order they were started. O(running jobs).

        Read from the model's record of each job as it stands. ``completion_ns`` would first catch up
        every job that the model's shortcut walks (one alone on its PEs), and after every event that was
        most of a run's time; it is not needed: such a job's end is an event of its own, which
        ``advance`` has run by the time the end is due."""
        jobs = self.model._jobs
        return [j for j in self.running if jobs[j].completion_ns is not None]

    def _at(self, now_ns: int) -> None:
        self.model.advance(now_ns)
        self.now_ns = self.table.now_ns = now_ns

    @property
    def now(self) -> float:
        return self.now_ns / NS

    # ------------------------------------------------------------------------------------------ stimuli

    def _submit(self, job: SimJob) -> None:
        msg = p.SubmitJob(
            ranks=job.program.ranks, argv=("bsp",), cwd="/tmp", env={}, name=job.name,
            time_limit=job.time_limit,
        )  # fmt: skip
        effects = self.ctl.handle(msg, self.now, self.caller)
        reply = effects[0]
        if not (isinstance(reply, Reply) and isinstance(reply.message, p.JobSubmitted)):
            raise SimulationError(f"job {job.name} refused: {reply}")
        self.programs[reply.message.job_id] = (job.name, job.program)
        self._carry_out(effects[1:], None)

    def _heartbeat(self) -> None:
        """The MM's heartbeat to every node core. O(nodes) plus the node cores' work on their jobs.

        A node core without jobs would only take note of the heartbeat: nothing to sample, classify or
        switch, nothing to report. The heartbeat is kept for it instead, replaced by the next, and given to
        it (at the instant it was sent) before anything else reaches it: its state is then what it would
        have been, since a heartbeat's effects on a node without jobs do not depend on the ones before
        (the newest seq and row win). In the dynamic sweeps most node heartbeats are of this kind."""
        for effect in self.ctl.heartbeat(self.now):
            if isinstance(effect, Publish):
                self.slices += 1
                for name, node in self.nodes.items():
                    if self.defer_idle and not (node.jobs or node.switcher.units or self.monitors[name].jobs):
                        self.deferred[name] = (effect.heartbeat, self.now)
                        self.kept += 1
                    else:
                        self._outcome(name, self._node(name).heartbeat(effect.heartbeat, self.now, self.now))

    def _node(self, name: str) -> Node:
        """The node core ``name``, about to be told something: first the heartbeat kept for it, if any."""
        node = self.nodes[name]
        kept = self.deferred.pop(name, None)
        if kept is not None:
            beat, sent = kept
            out = node.heartbeat(beat, sent, sent)
            if out.to_mm or out.check is not None or out.report_now:
                raise SimulationError(f"{name} acted on a heartbeat kept while it had no jobs")
        return node

    def _end_jobs(self) -> None:
        """Play the job shells of the jobs whose program ended: every rank exited with 0."""
        for job_id in self._ended():
            self.running.remove(job_id)
            self.running_ids.discard(job_id)
            self.horizon = None
            for name, node in self.nodes.items():
                local = node.jobs.get(job_id)
                if local is None:
                    continue
                exits = tuple(p.RankExit(rank=s.rank, exit_code=0) for s in local.launch.slots)
                done = p.ShellDone(job_id=job_id, exits=exits)
                out = self._node(name).from_shell(b"shell", done, (local.shell_pid, os.getuid()), self.now)
                self._outcome(name, out)

    def _start_jobs(self) -> None:
        """Jobs every node of which has its launch: start the program in the model, then tell each node
        core its ranks' pids as the shell would. Jobs in MM id order."""
        for job_id in sorted(self.launches):
            launches = self.launches[job_id]
            first = next(iter(launches.values()))
            if len(launches) < len(first.ranks_per_node):
                continue
            del self.launches[job_id]
            _, program = self.programs[job_id]
            placement = [0] * program.ranks
            pids: dict[str, dict[str, int]] = {}
            for name, launch in launches.items():
                shell = self.nodes[name].jobs[job_id].shell_pid
                base = int(name[1:]) * self.pes_per_node
                pids[name] = {}
                for slot in launch.slots:
                    placement[slot.rank] = base + slot.pe
                    pid = self.table.spawn()
                    self.table.sessions[shell].append(pid)
                    pids[name][str(slot.rank)] = pid
            controls = {}
            for name in sorted(pids):
                for rank_text, pid in pids[name].items():
                    controls[int(rank_text)] = self.table.add_rank(pid, (job_id, int(rank_text)), RUNNABLE)
            self.model.add_job(self.now_ns, job_id, program, placement)
            for rank, control in controls.items():
                if control != RUNNABLE:
                    self.model.control(self.now_ns, (job_id, rank), control)
            self.running.append(job_id)
            self.running_ids.add(job_id)
            heapq.heappush(self.bounds, (self._bound(job_id), job_id))
            self.horizon = None
            for name in sorted(pids):
                shell = self.nodes[name].jobs[job_id].shell_pid
                msg = p.RanksStarted(job_id=job_id, pids=pids[name])
                self._outcome(
                    name, self._node(name).from_shell(b"shell", msg, (shell, os.getuid()), self.now)
                )

    # ------------------------------------------------------------------------------------------ messages

    def _settle(self) -> None:
        """Deliver every message on its way, run the MM's scheduling passes and start what they launched,
        until nothing is left to do at this instant."""
        while True:
            while self.inbox:
                name, msg = self.inbox.popleft()
                self._carry_out(self.ctl.handle(msg, self.now, FromNode(name)), name)
            if self.ctl.pass_due:
                self._carry_out(self.ctl.schedule(self.now), None)
                continue
            if any(len(ls) >= len(next(iter(ls.values())).ranks_per_node) for ls in self.launches.values()):
                self._start_jobs()
                continue
            if not self.inbox:
                return

    def _carry_out(self, effects: list[Effect], origin: str | None) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                if isinstance(effect.message, p.LaunchJob):
                    self.launches.setdefault(effect.message.job_id, {})[effect.node] = effect.message
                self._outcome(effect.node, self._node(effect.node).from_mm(effect.message, self.now))
            elif isinstance(effect, Reply):
                if origin is None:
                    continue
                if isinstance(effect.message, p.Error):
                    raise SimulationError(f"storm-mm refused a report of {origin}: {effect.message.text}")
                self._outcome(origin, self._node(origin).from_mm(effect.message, self.now))
            elif isinstance(effect, JobEnded):
                self.ended[effect.job.id] = effect
            elif not isinstance(effect, Publish):
                continue  # Wait: no client waits in a simulation

    def _outcome(self, name: str, out: Outcome) -> None:
        """What a node core decided: its reports go to the MM, its switch is done after the switch cost."""
        node = self._node(name)
        for msg in out.to_mm:
            self.inbox.append((name, msg))
            if isinstance(msg, p.JobStats):
                self.class_changes.extend(msg.changes)
        if out.check is not None:
            node.switch_checked(out.check, self.now + self.costs.switch_ns / NS)
        if out.report_now:
            for msg in node.reports():
                self.inbox.append((name, msg))

    # ------------------------------------------------------------------------------------------ results

    def _result(self, wall: float) -> ClusterResult:
        jobs = []
        for job_id in sorted(self.programs):
            name, _ = self.programs[job_id]
            ended = self.ended.get(job_id)
            if ended is None:
                raise SimulationError(f"job {job_id} ({name}) never ended")
            record = ended.job
            if record.start_time is None or record.end_time is None:
                raise SimulationError(f"job {job_id} ({name}) has no start or end time")
            jobs.append(
                JobResult(
                    name, job_id, record.submit_time, record.start_time, record.end_time, record.state.value
                )
            )
        stopped = {
            (self.programs[job][0], rank): self.model.counters((job, rank)).stopped_ns
            for job, rank in self.model.keys()  # noqa: SIM118 (keys() is the model's API, not a dict's)
        }
        classes = [(c.time, self.programs[c.job_id][0], c.rank, c.old, c.new) for c in self.class_changes]
        return ClusterResult(
            policy=self.policy_name, jobs=jobs, wall_seconds=wall, model_events=self.model.events_run,
            slices=self.slices, pes=[self.model.pe_counters(i) for i in range(self.model_pes)],
            stopped_ns=stopped, classes=sorted(classes),
        )  # fmt: skip

    @property
    def model_pes(self) -> int:
        return self.nodes_count * self.pes_per_node
