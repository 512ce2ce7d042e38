"""The discrete-event engine of ``storm sim``: storm-mm's own core on a simulated clock.

The engine owns no scheduling logic. It feeds the MM core (:class:`storm.mm.core.Controller`, with the
in-memory store) what a cluster would: node managers registering (mm's RegisterNode), users submitting
(SubmitJob from a caller with the trace's user id), node managers reporting launches and ends
(tools/sim/nodes.py), and the clock (``tick`` for time limits). Whatever the core sends back (launches,
kills, job ends) is carried out at the same simulated instant: messages take no time.

Events are kept in one heap, ordered by (time, kind, job): at one instant, first the jobs whose runtime is
over end (:data:`END`), then time limits are enforced (:data:`LIMIT`), then new jobs arrive (:data:`SUBMIT`),
each kind in job order, so PEs freed at an instant are free for what arrives at it. Once every event of an
instant is delivered, the core runs its scheduling pass (:meth:`Engine._pass`). Nothing here draws a random
number; the seed only makes the core's kvsname nonces (and so the whole run) reproducible.

The core enforces a time limit itself, when its clock shows a job ran *more* than its limit: the engine ticks
it once, at the first representable instant after start + limit, and only for jobs that will still run
then (a tick at any other instant would find nothing to do). A job that ends exactly at its limit completes.

By default the machine is simulated as fewer, larger nodes (:func:`merged`: its nodes grouped evenly, at
most 4,096 PEs a node, the most a node manager may register), which gives the same start and end of every
job (tests/test_sim_nodes_merged.py checks it on random workloads) for three reasons:

- The core schedules simulated jobs in one row (MPL 1) on nodes that are all usable (they never go silent,
  and nothing is requeued, so none is draining), and its scheduler decides from counts of free PEs alone:
  which job starts, EASY's shadow time and extra PEs, conservative backfilling's profiles
  (mm/scheduler.py: "Reservations count PEs, not particular PEs"). The matrix places a job in a row
  whenever the row has that many free PEs, spanning nodes as needed (Matrix.find), so a start never fails
  for want of a node of the right shape. The count of free PEs at an instant is the same on either machine
  if the same jobs started and ended before it: by induction over the events, so are all decisions.
- A job's end is its start plus its runtime, or its time limit: the nodes play no part. Every node of a
  job reports at the same instant, before that instant's pass.
- Nothing else depends on the nodes: there is no compaction with one row, job ids follow submissions,
  and kvsname nonces are drawn once per start, in the order of the starts.

What differs is only what a run costs: a job on k nodes costs 2k messages through the core, one node's
costs 2, and the job's Outcome names no node. ``merge_nodes=False`` simulates the nodes as given. A torus
machine is never merged: where a node sits decides where a job may go. There the core is configured with
the torus (``[mm] topology``, node ``n{i}`` at the place of index i), and places as storm-mm does.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Effect, JobEnded, Publish, Reply, Send, Wait
from storm.mm.jobs import Job
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.torus import parse_dims
from storm.mm.torus_state import TorusLayout
from storm.tools.sim.nodes import InvariantError, SimNodes
from storm.tools.sim.swf import SimJob, Workload

END, LIMIT, SUBMIT = 0, 1, 2  # the order of events at one instant (see the module's docstring)
EVENT_ORDER = (
    "(time, kind, job): at one instant jobs whose runtime is over end, then time limits, then arrivals "
    "(each in job order); the scheduling pass runs after all of them"
)

# What the CLI's --policy names, as the MM's [mm] backfill values. The core schedules batch jobs in one row
# of the matrix (MPL 1) under every one of them.
POLICIES = {"fcfs": "none", "easy": "easy", "conservative": "conservative"}
# The BlueGene/L paper's migration (FCFS + migration, and B+M), on a torus only and in the simulator only:
# storm cannot move a running MPI job (that needs checkpointing), so storm-mm never migrates; the scheduler
# core's pass does it here (mm/torus_scheduler.py), at a cost per migrated job the run states.
MIGRATION_POLICIES = {"migration": "none", "easy+migration": "easy"}
TORUS_POLICIES = ("fcfs", "easy", *MIGRATION_POLICIES)

# What of storm-mm a run drives (see simulate()).
CORES = ("scheduler", "mm")

NOBODY = 65534  # the uid of jobs whose trace gives no user id
MAX_NODE_PES = 4096  # the most PEs a node manager may register (RegisterNode)


class SimError(RuntimeError):
    """The MM core refused something a simulated cluster sent it (a bug in the engine or the core)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One job's life in the simulation, as storm-mm recorded it (times in simulated seconds)."""

    job: SimJob
    mm_id: int
    start: float
    end: float
    state: str

    @property
    def wait(self) -> float:
        return self.start - self.job.submit

    @property
    def response(self) -> float:
        return self.end - self.job.submit


@dataclass(frozen=True)
class Machine:
    """``nodes`` x ``pes_per_node`` PEs; with ``torus`` (X, Y, Z) the nodes sit on a torus (X Y Z of them, one
    PE each, as the BlueGene/L paper's supernodes) and every job holds a box of them."""

    nodes: int
    pes_per_node: int
    torus: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.torus is not None and (self.nodes != math.prod(self.torus) or self.pes_per_node != 1):
            raise ValueError("a torus machine has one node of one PE per position")

    @property
    def pes(self) -> int:
        return self.nodes * self.pes_per_node

    def describe(self) -> str:
        if self.torus is not None:
            return "torus {}x{}x{} ({} nodes of 1 PE)".format(*self.torus, self.nodes)
        return f"flat, {self.nodes} nodes x {self.pes_per_node} PEs"


def parse_machine(text: str) -> Machine:
    """``--machine``: ``torus:XxYxZ`` (as ``storm local up --topology``) or ``flat:N`` (N nodes of 1 PE)."""
    kind, _, size = text.partition(":")
    if kind == "torus":
        dims = parse_dims(size)
        return Machine(math.prod(dims), 1, dims)
    if kind == "flat" and size.isdigit() and int(size) >= 1:
        return Machine(int(size), 1)
    raise ValueError(f"--machine {text!r}: torus:XxYxZ (such as torus:4x4x8) or flat:N (such as flat:128)")


def backfill_of(policy: str, machine: Machine) -> tuple[str, bool]:
    """The ``[mm] backfill`` a policy runs, and whether it migrates; ValueError for a policy the machine does
    not take (migration is a torus's; conservative backfilling a flat machine's)."""
    if machine.torus is not None:
        if policy not in TORUS_POLICIES:
            raise ValueError(f"policy {policy!r} on a torus: one of {', '.join(TORUS_POLICIES)}")
        return {**POLICIES, **MIGRATION_POLICIES}[policy], policy in MIGRATION_POLICIES
    if policy not in POLICIES:
        extra = " (migration needs a torus: --machine torus:XxYxZ)" if policy in MIGRATION_POLICIES else ""
        raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}{extra}")
    return POLICIES[policy], False


@dataclass(frozen=True)
class Capacity:
    """The BlueGene/L paper's split of the machine's capacity (its section 3.2), each a share of N x T: N the
    machine's units (torus nodes, or PEs), T the last end - the first arrival.

    - ``utilized``: the work jobs asked for, sum(size x time run) with the trace's sizes (less any time a
      migration stopped them);
    - ``unused``: free units no queued job asked for, the integral of max(0, free - queued);
    - ``lost``: the rest, counted on its own: free units queued jobs asked for but could not use
      (fragmentation, the queue's order), plus units held beyond the work (a size rounded or grown to a box,
      a migration's pause). The engine checks the three add up to 1 on every run.
    """

    utilized: float
    unused: float
    lost: float
    units: int
    span: float


@dataclass(frozen=True)
class Migrations:
    """The simulator's migrations (MIGRATION_POLICIES): attempted (the gates passed), successful (the largest
    free partition grew, so jobs moved), jobs moved, and what each move cost the job moved."""

    attempts: int
    successes: int
    jobs_moved: int
    cost_s: float


@dataclass
class RunResult:
    """What a run produced: every job's outcome (workload order) and the run's own costs."""

    outcomes: list[Outcome]
    machine: Machine
    policy: str
    seed: int
    wall_seconds: float
    events: int
    passes: int
    simulated: Machine | None = None  # the nodes the core saw, when not ``machine``'s (see merged())
    capacity: Capacity | None = None  # the scheduler core measures it (tools/sim/fast.py)
    migrations: Migrations | None = None  # runs of MIGRATION_POLICIES


@contextmanager
def quiet_core() -> Iterator[None]:
    """The core logs a line per job start and end: at thousands of jobs a second that is most of the cost."""
    logger = logging.getLogger("storm.mm")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class Progress:
    """A one-line progress bar on ``stream`` (stderr), redrawn at most every 0.2 s of wall clock."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total = max(total, 1)
        self.stream = stream
        self.last = 0.0
        self.started = time.perf_counter()

    def __call__(self, done: int, now: float) -> None:
        wall = time.perf_counter()
        if wall - self.last < 0.2 and done < self.total:
            return
        self.last = wall
        share = done / self.total
        bar = "#" * int(30 * share)
        rate = done / max(wall - self.started, 1e-9)
        self.stream.write(
            f"\r[{bar:<30}] {done}/{self.total} jobs, simulated {now / 86400:.1f} d, {rate:,.0f} jobs/s"
        )
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def merged(machine: Machine) -> Machine:
    """The same PEs as the fewest nodes that group ``machine``'s evenly, of at most MAX_NODE_PES PEs each
    (``machine`` itself if its nodes are that large already). The module's docstring says why a run on it
    decides the same."""
    if machine.torus is not None:
        return machine  # a node's place on the torus decides where a job may go: nothing merges
    nodes, pes = machine.nodes, machine.pes_per_node
    groups = [d for d in range(1, nodes + 1) if nodes % d == 0 and pes * d <= MAX_NODE_PES]
    if not groups:
        return machine
    return Machine(nodes // groups[-1], pes * groups[-1])


def kill_time(start: float, limit: float) -> float:
    """The first representable instant at which a job started at ``start`` ran more than ``limit``: when
    storm-mm's tick, which kills a job that ran *more* than its limit, first finds it over."""
    kill = start + limit
    while kill - start <= limit:
        kill = math.nextafter(kill, math.inf)
    return kill


def mm_config(policy: str, machine: Machine | None = None) -> MMConfig:
    """The MM's configuration for a simulated batch cluster under ``policy`` (a key of POLICIES): on a torus
    ``machine``, with the torus as ``[mm] topology`` and node ``n{i}`` at the place of index i (x fastest)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    # Simulated nodes never go silent and answer kills at once: liveness and kill timeouts never fire.
    config = MMConfig(mpl=1, backfill=POLICIES[policy], node_timeout=math.inf, kill_timeout=math.inf)
    if machine is None or machine.torus is None:
        return config
    layout = TorusLayout.numbered(machine.torus)
    places = {name: list(place) for name, place in layout.coordinates().items()}
    return dataclasses.replace(config, topology="torus {}x{}x{}".format(*machine.torus), coordinates=places)


class Engine:
    """One simulated run of ``workload`` on ``machine`` under ``policy`` (see POLICIES)."""

    def __init__(
        self,
        workload: Workload,
        machine: Machine,
        policy: str = "easy",
        seed: int = 0,
        progress: Callable[[int, float], None] | None = None,
        *,
        merge_nodes: bool = True,
    ) -> None:
        self.workload = workload
        self.machine = machine
        self.simulated = merged(machine) if merge_nodes else machine  # see the module's docstring
        self.policy = policy
        self.seed = seed
        self.progress = progress
        if policy in MIGRATION_POLICIES:
            raise ValueError(
                f"policy {policy}: migration runs in the scheduler core only (--core scheduler); storm-mm's "
                "Controller never migrates, since storm cannot move a running MPI job"
            )
        self.ctl = Controller(MemoryStore(), mm_config(policy, machine), "sim", nonce=seeded_nonces(seed))
        self.nodes = SimNodes(self.simulated.nodes, self.simulated.pes_per_node)
        self.heap: list[tuple[float, int, int]] = []
        self.inbox: deque[tuple[str, p.Message]] = deque()  # (node, report) on its way to the MM
        self.mm_ids: dict[int, int] = {}  # workload index -> MM job id
        self.indices: dict[int, int] = {}  # MM job id -> workload index
        self.ended: dict[int, Job] = {}  # MM job id -> its record at the end
        self.callers: dict[int, Account] = {}  # uid -> the account its jobs are submitted as
        self.events = 0
        self.passes = 0
        self.now = 0.0

    # ------------------------------------------------------------------------------------------ the run

    def run(self) -> RunResult:
        started = time.perf_counter()
        jobs = self.workload.jobs
        with quiet_core():
            self._carry_out(self.ctl.recover(0.0), None)
            for registration in self.nodes.registrations():
                self._from_node(registration.node, registration, 0.0)
            self._drain(0.0)
            self._pass(0.0)
            if jobs:
                heapq.heappush(self.heap, (jobs[0].submit, SUBMIT, 0))
            heap = self.heap
            while heap:
                now = heap[0][0]
                self.now = now
                while heap and heap[0][0] == now:
                    _, kind, index = heapq.heappop(heap)
                    self.events += 1
                    if kind == END:
                        self._end(index, now)
                    elif kind == LIMIT:
                        self._carry_out(self.ctl.tick(now), None)
                    else:
                        self._submit(jobs[index], now)
                        if index + 1 < len(jobs):
                            heapq.heappush(heap, (jobs[index + 1].submit, SUBMIT, index + 1))
                    self._drain(now)
                self._pass(now)
                if self.progress is not None:
                    self.progress(len(self.ended), now)
        wall = time.perf_counter() - started
        simulated = self.simulated if self.simulated != self.machine else None
        return RunResult(
            self._outcomes(), self.machine, self.policy, self.seed, wall, self.events, self.passes, simulated
        )

    def _pass(self, now: float) -> None:
        """The core's scheduling pass for this instant, after all of its events, as storm-mm runs one per
        burst of messages. Its launches are answered at once, which may make another pass due (a job that
        ends as it starts cannot, here, but a driver should not assume so): run until none is."""
        ctl = self.ctl
        while ctl.pass_due:
            self.passes += 1
            self._carry_out(ctl.schedule(now), None)
            self._drain(now)

    # ------------------------------------------------------------------------------------------ stimuli

    def _submit(self, job: SimJob, now: float) -> None:
        uid = job.user if job.user >= 0 else NOBODY
        caller = self.callers.get(uid)
        if caller is None:
            caller = self.callers[uid] = Account(uid, uid, f"user{uid}")
        msg = p.SubmitJob(
            ranks=job.procs, argv=("swf-job",), cwd="/sim", env={}, name=f"swf-{job.number}",
            time_limit=job.limit,
        )  # fmt: skip
        effects = self.ctl.handle(msg, now, caller)
        reply = effects[0]
        if not (type(reply) is Reply and type(reply.message) is p.JobSubmitted):
            raise SimError(f"job {job.number} of the trace refused: {reply}")
        mm_id = reply.message.job_id
        self.mm_ids[job.index] = mm_id
        self.indices[mm_id] = job.index
        self.nodes.submit_times[mm_id] = now
        self._carry_out(effects[1:], None)

    def _end(self, mm_id: int, now: float) -> None:
        for report in self.nodes.finish(mm_id):
            self.inbox.append((report.node, report))

    def _from_node(self, node: str, message: p.Message, now: float) -> None:
        self._carry_out(self.ctl.handle(message, now, FromNode(node)), node)

    def _drain(self, now: float) -> None:
        inbox = self.inbox
        while inbox:
            node, message = inbox.popleft()
            self._from_node(node, message, now)

    def _carry_out(self, effects: list[Effect], origin: str | None) -> None:
        now = self.now
        for effect in effects:
            if isinstance(effect, Send):
                message = effect.message
                if isinstance(message, p.LaunchJob):
                    self._launching(message, now)
                for report in self.nodes.receive(effect.node, message, now):
                    self.inbox.append((effect.node, report))
            elif isinstance(effect, Reply):
                if isinstance(effect.message, p.Error):
                    raise SimError(f"storm-mm refused a report of node {origin}: {effect.message.text}")
            elif isinstance(effect, JobEnded):
                self.ended[effect.job.id] = effect.job
            elif not isinstance(effect, Wait | Publish):
                raise SimError(f"unexpected effect {effect!r}")

    def _launching(self, launch: p.LaunchJob, now: float) -> None:
        """The job's first launch: its end (and, if it would overrun, its time limit) goes on the heap."""
        mm_id = launch.job_id
        if self.nodes.running(mm_id):
            return
        job = self.workload.jobs[self.indices[mm_id]]
        heapq.heappush(self.heap, (now + job.runtime, END, mm_id))
        if job.runtime > job.limit:
            heapq.heappush(self.heap, (kill_time(now, job.limit), LIMIT, mm_id))

    # ------------------------------------------------------------------------------------------ results

    def _outcomes(self) -> list[Outcome]:
        """Every job's outcome, after checking the run's end invariants."""
        self.nodes.check_idle()
        if self.ctl.runs.pending or self.ctl.runs.active:
            runs = self.ctl.runs
            raise InvariantError(
                f"jobs left in storm-mm: {len(runs.pending)} queued, {len(runs.active)} placed"
            )
        outcomes = []
        for job in self.workload.jobs:
            mm_id = self.mm_ids.get(job.index)
            info = self.ended.get(mm_id) if mm_id is not None else None
            if info is None or info.start_time is None or info.end_time is None:
                raise InvariantError(f"job {job.number} of the trace never ended")
            if info.start_time < job.submit or info.end_time < info.start_time:
                raise InvariantError(
                    f"job {job.number}: submitted {job.submit}, "
                    f"started {info.start_time}, ended {info.end_time}"
                )
            outcomes.append(Outcome(job, info.id, info.start_time, info.end_time, info.state.value))
        return outcomes


def simulate(
    workload: Workload,
    machine: Machine,
    policy: str = "easy",
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
    *,
    merge_nodes: bool = True,
    core: str = "scheduler",
    migration_cost: float = 0.0,
) -> RunResult:
    """Run ``workload`` through storm-mm on ``machine`` (the module's docstring says what ``merge_nodes``
    does). ``core`` is what of storm-mm runs (:data:`CORES`): ``"scheduler"``, its scheduling state and
    passes (tools/sim/fast.py); ``"mm"``, its whole Controller with simulated node managers (:class:`Engine`).
    Both decide the same (tests/test_sim_cores.py); the first is several times faster, and alone runs the
    MIGRATION_POLICIES, each migrated job stopped for ``migration_cost`` seconds."""
    backfill_of(policy, machine)  # a policy the machine does not take: refused before anything runs
    if core == "mm":
        if migration_cost:
            raise ValueError("migration_cost: migration runs in the scheduler core only")
        return Engine(workload, machine, policy, seed, progress, merge_nodes=merge_nodes).run()
    if core != "scheduler":
        raise ValueError(f"unknown core {core!r}: one of {', '.join(CORES)}")
    from storm.tools.sim.fast import FastEngine  # it builds on this module

    engine = FastEngine(
        workload, machine, policy, seed, progress, merge_nodes=merge_nodes, migration_cost=migration_cost
    )
    return engine.run()


__all__ = [
    "CORES",
    "EVENT_ORDER",
    "MIGRATION_POLICIES",
    "TORUS_POLICIES",
    "Capacity",
    "Engine",
    "InvariantError",
    "Machine",
    "Migrations",
    "Outcome",
    "RunResult",
    "SimError",
    "merged",
    "parse_machine",
    "simulate",
]
