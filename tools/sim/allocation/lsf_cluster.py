"""The machine Parsons and Sevcik's disciplines run on: 16 workstations of 8 processors, with LSF's costs.

A discipline (lsf_rtc.py, lsf_preempt.py, lsf_migrate.py) is asked to decide at every arrival and
departure, and preemptive ones also when a quantum expires, but never twice within ``decision_floor_s``
(5 s: the paper's scheduler "makes decisions at most once every five seconds"); a decision due sooner waits
for the floor. It acts through four operations, each with the paper's cost (section 5):

- :meth:`LsfCluster.start` a pending or checkpointed job on free units: LSF takes ``dispatch_s`` (30 s, the
  paper's "up to thirty seconds": we take the bound) to dispatch it, during which its units are held and it
  does no work;
- :meth:`LsfCluster.suspend` (SIGTSTP) and :meth:`LsfCluster.resume` (SIGCONT) a job in place, at once;
  a suspended job's processes stay on its units, and no unit ever holds more than ``max_processes`` (5);
- :meth:`LsfCluster.checkpoint` a job (migration or malleability): it stops computing at once, keeping what
  it did, and its units stay unavailable for ``checkpoint_hold_s`` (60 s, the paper's "more than a minute")
  before it joins the stopped queue, from which any start restarts it.

Per job the machine keeps its :class:`Phase`, units, acquired processor time and remaining work; a running
job on u units computes at speedup(8u) / work of its work per second. Knowledge (none, service demand,
speedup, both) decides what a discipline may read: :meth:`LsfCluster.priority` orders jobs by acquired
processor time (or remaining demand if known, estimated as demand - acquired time unless speedup is known
too), and :meth:`LsfCluster.known_speedup` is None unless speedup is known.

Deterministic: events at one instant in the order ends, checkpoint releases, dispatch completions,
arrivals, quantum expiries, decisions, each by job id (events.py). Invariants are checked as the run goes:
no unit held by two jobs, never more than ``max_processes`` processes on a unit, sizes within [min, max],
and each finished job did exactly its work.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from storm.mm.speedup import SpeedupModel
from storm.tools.sim.allocation.events import EventQueue
from storm.tools.sim.allocation.jobs import JobSpec, Progress

END, RELEASED, DISPATCHED, ARRIVAL, QUANTUM, DECIDE = range(6)
EVENT_ORDER = (
    "ends, checkpoint releases, dispatch completions, arrivals, quantum expiries, decisions; then job id"
)


class Knowledge(enum.Enum):
    """What the scheduler is told about jobs (the columns of the paper's Table 3)."""

    NONE = "none"
    DEMAND = "service demand"
    SPEEDUP = "speedup"
    BOTH = "both"

    @property
    def demand(self) -> bool:
        return self in (Knowledge.DEMAND, Knowledge.BOTH)

    @property
    def speedup(self) -> bool:
        return self in (Knowledge.SPEEDUP, Knowledge.BOTH)


class Phase(enum.Enum):
    PENDING = "pending"  # never started
    DISPATCHING = "dispatching"  # units held, not computing yet
    RUNNING = "running"
    SUSPENDED = "suspended"  # simple preemption: processes stay on the units
    CHECKPOINTING = "checkpointing"  # migration: units held until the checkpoint is written
    STOPPED = "stopped"  # checkpointed: holds nothing
    DONE = "done"


WAITING = (Phase.PENDING, Phase.SUSPENDED, Phase.CHECKPOINTING, Phase.STOPPED)


@dataclass(frozen=True)
class Costs:
    """LSF's costs on the paper's platform (section 5) and the thresholds of its disciplines."""

    dispatch_s: float = 30.0
    checkpoint_hold_s: float = 60.0
    decision_floor_s: float = 5.0
    quantum_s: float = 60.0  # ours: the paper gives no quantum
    simple_min_run_s: float = 60.0  # PREEMPT: run at least this since a start or resume
    migrate_min_run_s: float = 600.0  # MIG, MALL
    max_processes: int = 5


class Job:
    """A job in the machine: its spec, phase, units and progress."""

    __slots__ = ("end", "first_start", "phase", "preemptions", "progress", "since", "size", "spec", "token",
                 "units", "updated")  # fmt: skip

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.phase = Phase.PENDING
        self.units: frozenset[int] = frozenset()
        self.size = 0  # units of its current (or last) allocation
        self.progress = Progress(spec)
        self.since = math.inf  # when it last started computing (after a dispatch) or resumed
        self.updated = 0.0
        self.token = 0
        self.first_start: float | None = None
        self.end: float | None = None
        self.preemptions = 0

    @property
    def job_id(self) -> int:
        return self.spec.job_id


class Discipline(Protocol):
    name: str
    preemptive: bool

    def decide(self, cluster: LsfCluster) -> None: ...


@dataclass
class RunResult:
    """What one run measured: per tagged job (arrival, end or None, work, kind) and the machine's totals."""

    discipline: str
    knowledge: str
    jobs: list[tuple[int, float, float | None, float, str]]
    finished: bool  # every tagged job ended before the horizon
    end_time: float
    peak_queue: int
    mean_queue: float  # time-averaged over [0, end_time]
    queue_time: dict[int, float] = field(default_factory=dict)  # seconds spent with n jobs waiting
    counts: dict[str, int] = field(default_factory=dict)
    unit_seconds: dict[str, float] = field(default_factory=dict)  # held units x time, by what they did


class LsfCluster:
    """The event-driven machine (module docstring). ``run`` takes jobs from ``jobs`` as they arrive."""

    def __init__(
        self,
        discipline: Discipline,
        knowledge: Knowledge,
        jobs: Iterator[JobSpec],
        *,
        units: int = 16,
        processors_per_unit: int = 8,
        costs: Costs = Costs(),
        horizon_s: float = 2_000_000.0,
    ) -> None:
        self.discipline = discipline
        self.knowledge = knowledge
        self.units = units
        self.processors_per_unit = processors_per_unit
        self.costs = costs
        self.horizon_s = horizon_s
        self.now = 0.0
        self.jobs: dict[int, Job] = {}  # every job in the system (not done)
        self.holder: list[int | None] = [None] * units  # the job dispatching, running or checkpointing there
        self.processes = [0] * units  # jobs with processes on the unit, suspended ones included
        self._source = jobs
        self._upcoming: JobSpec | None = None
        self._events = EventQueue()
        self._decision_due: float | None = None
        self._last_decision = -math.inf
        self._quantum_due = False
        self.finished: list[Job] = []  # the jobs that have ended, in the order they ended
        self._tagged_left = 0
        self._counts = {
            "starts": 0,
            "restarts": 0,
            "suspensions": 0,
            "resumes": 0,
            "checkpoints": 0,
            "decisions": 0,
        }
        self._unit_seconds = {"computing": 0.0, "dispatching": 0.0, "checkpointing": 0.0}
        self._queue_area = 0.0
        self._queue_peak = 0
        self._queue_time: dict[int, float] = {}
        self._clock_mark = 0.0

    # What a discipline reads.

    def in_phase(self, *phases: Phase) -> list[Job]:
        """The jobs in any of ``phases``, by job id."""
        return sorted((j for j in self.jobs.values() if j.phase in phases), key=lambda j: j.job_id)

    def free_units(self) -> list[int]:
        """Units no job dispatches, runs or checkpoints on (suspended processes may be there), ascending."""
        return [u for u in range(self.units) if self.holder[u] is None]

    def remaining_demand(self, job: Job) -> float:
        """The remaining service demand as the scheduler estimates it (demand knowledge only): exact with
        speedup knowledge, else demand less acquired processor time (as if every processor did work)."""
        if self.knowledge.speedup:
            return job.spec.work * job.progress.remaining
        return max(job.spec.work - job.progress.acquired, 0.0)

    def priority(self, job: Job) -> tuple[float, int]:
        """Smaller first: remaining demand if known, else acquired processor time; then job id (so pending
        jobs, which have acquired nothing, go first come, first served)."""
        key = self.remaining_demand(job) if self.knowledge.demand else job.progress.acquired
        return (key, job.job_id)

    def ordered(self, jobs: Iterable[Job]) -> list[Job]:
        return sorted(jobs, key=self.priority)

    def known_speedup(self, job: Job) -> SpeedupModel | None:
        return job.spec.speedup if self.knowledge.speedup else None

    def ran_for(self, job: Job) -> float:
        """Seconds a running job has computed since it started or last resumed (0 while dispatching)."""
        return max(self.now - job.since, 0.0) if job.phase is Phase.RUNNING else 0.0

    # What a discipline does.

    def start(self, job: Job, units: Iterable[int]) -> None:
        """Dispatch a pending or stopped ``job`` on ``units``: free, and each under the process cap."""
        chosen = frozenset(units)
        if job.phase not in (Phase.PENDING, Phase.STOPPED):
            raise AssertionError(f"job {job.job_id} cannot start from {job.phase.value}")
        if not job.spec.minimum <= len(chosen) <= job.spec.maximum:
            raise AssertionError(
                f"job {job.job_id}: {len(chosen)} units outside [{job.spec.minimum}, {job.spec.maximum}]"
            )
        for u in chosen:
            if self.holder[u] is not None:
                raise AssertionError(
                    f"unit {u} is held by job {self.holder[u]}: job {job.job_id} cannot start there"
                )
            if self.processes[u] + 1 > self.costs.max_processes:
                raise AssertionError(f"unit {u} would hold more than {self.costs.max_processes} processes")
        for u in chosen:
            self.holder[u] = job.job_id
            self.processes[u] += 1
        self._counts["restarts" if job.phase is Phase.STOPPED else "starts"] += 1
        job.phase = Phase.DISPATCHING
        job.units = chosen
        job.size = len(chosen)
        job.updated = self.now
        if job.first_start is None:
            job.first_start = self.now
        job.token += 1
        self._events.push(self.now + self.costs.dispatch_s, DISPATCHED, job.job_id, job.token)

    def suspend(self, job: Job) -> None:
        """Stop a running job where it is; its processes stay on its units."""
        self._leave_running(job)
        job.phase = Phase.SUSPENDED
        for u in job.units:
            self.holder[u] = None
        job.preemptions += 1
        self._counts["suspensions"] += 1

    def resume(self, job: Job) -> None:
        """Continue a suspended job on its own units, which no other job may hold."""
        if job.phase is not Phase.SUSPENDED:
            raise AssertionError(f"job {job.job_id} is {job.phase.value}, not suspended")
        for u in job.units:
            if self.holder[u] is not None:
                raise AssertionError(
                    f"unit {u} is held by job {self.holder[u]}: job {job.job_id} cannot resume"
                )
        for u in job.units:
            self.holder[u] = job.job_id
        self._counts["resumes"] += 1
        self._begin_running(job)

    def checkpoint(self, job: Job) -> None:
        """Checkpoint a running job: it stops now and its units come free after the hold."""
        self._leave_running(job)
        job.phase = Phase.CHECKPOINTING
        job.preemptions += 1
        self._counts["checkpoints"] += 1
        self._events.push(self.now + self.costs.checkpoint_hold_s, RELEASED, job.job_id, job.token)

    # The run.

    def run(self) -> RunResult:
        """Run until every tagged job (the stream's first ones) has left, or the horizon."""
        first = next(self._source)
        self._upcoming = first
        self._tagged_left = int(first.tagged)
        self._events.push(first.arrival, ARRIVAL, first.job_id)
        while self._events and self._tagged_left > 0:
            time, kind, job_id, token = self._events.pop()
            if time > self.horizon_s:
                break
            self._account(time)
            self.now = time
            self._handle(kind, job_id, token)
        end_time = self.horizon_s if self._tagged_left else self.now
        self._account(end_time)
        tagged = sorted(
            (j for j in [*self.finished, *self.jobs.values()] if j.spec.tagged), key=lambda j: j.job_id
        )
        return RunResult(
            discipline=self.discipline.name,
            knowledge=self.knowledge.value,
            jobs=[(j.job_id, j.spec.arrival, j.end, j.spec.work, j.spec.kind) for j in tagged],
            finished=self._tagged_left == 0,
            end_time=end_time,
            peak_queue=self._queue_peak,
            mean_queue=self._queue_area / end_time if end_time > 0 else 0.0,
            queue_time=dict(sorted(self._queue_time.items())),
            counts=dict(self._counts),
            unit_seconds=dict(self._unit_seconds),
        )

    def _handle(self, kind: int, job_id: int, token: int) -> None:
        if kind == ARRIVAL:
            spec = self._upcoming
            assert spec is not None and spec.job_id == job_id
            self.jobs[job_id] = Job(spec)
            upcoming = next(self._source)
            if upcoming.arrival < spec.arrival:
                raise AssertionError("arrivals must not go back in time")
            self._tagged_left += int(upcoming.tagged)
            self._upcoming = upcoming
            self._events.push(upcoming.arrival, ARRIVAL, upcoming.job_id)
            self._want_decision()
        elif kind == END:
            job = self.jobs.get(job_id)
            if job is None or job.token != token or job.phase is not Phase.RUNNING:
                return
            self._leave_running(job)
            if job.progress.remaining > 1e-6 or not math.isclose(
                job.progress.done, job.spec.work, rel_tol=1e-6
            ):
                raise AssertionError(f"job {job_id} ended with work left: {job.progress.remaining}")
            for u in job.units:
                self.holder[u] = None
                self.processes[u] -= 1
            job.phase = Phase.DONE
            job.end = self.now
            del self.jobs[job_id]
            self.finished.append(job)
            if job.spec.tagged:
                self._tagged_left -= 1
            self._want_decision()
        elif kind == DISPATCHED:
            job = self.jobs.get(job_id)
            if job is None or job.token != token or job.phase is not Phase.DISPATCHING:
                return
            self._begin_running(job)
        elif kind == RELEASED:
            job = self.jobs[job_id]
            if job.phase is not Phase.CHECKPOINTING or job.token != token:
                raise AssertionError(f"job {job_id}: a release while {job.phase.value}")
            for u in job.units:
                self.holder[u] = None
                self.processes[u] -= 1
            job.units = frozenset()
            job.phase = Phase.STOPPED
            self._want_decision()
        elif kind == QUANTUM:
            self._quantum_due = False
            self._want_decision()
        elif kind == DECIDE:
            self._decision_due = None
            self._decide()

    def _want_decision(self) -> None:
        at = max(self.now, self._last_decision + self.costs.decision_floor_s)
        if self._decision_due is None:
            self._decision_due = at
            self._events.push(at, DECIDE)

    def _decide(self) -> None:
        self._last_decision = self.now
        self._counts["decisions"] += 1
        for job in self.jobs.values():
            if job.phase is Phase.RUNNING:
                self._bring_up_to_date(job)
        self.discipline.decide(self)
        if self.discipline.preemptive and not self._quantum_due and self.in_phase(*WAITING):
            self._quantum_due = True
            self._events.push(self.now + self.costs.quantum_s, QUANTUM)

    def _processors(self, job: Job) -> int:
        return job.size * self.processors_per_unit

    def _bring_up_to_date(self, job: Job) -> None:
        job.progress.run(self.now - job.updated, self._processors(job))
        job.updated = self.now

    def _begin_running(self, job: Job) -> None:
        job.phase = Phase.RUNNING
        job.since = self.now
        job.updated = self.now
        job.token += 1
        self._events.push(
            self.now + job.progress.time_left(self._processors(job)), END, job.job_id, job.token
        )

    def _leave_running(self, job: Job) -> None:
        if job.phase is not Phase.RUNNING:
            raise AssertionError(f"job {job.job_id} is {job.phase.value}, not running")
        self._bring_up_to_date(job)
        job.token += 1

    def _account(self, until: float) -> None:
        """Integrate the queue length and the units' use from the last event to ``until``."""
        span = until - self._clock_mark
        if span <= 0:
            return
        waiting = 0
        for job in self.jobs.values():
            if job.phase in WAITING:
                waiting += 1
            elif job.phase is Phase.RUNNING:
                self._unit_seconds["computing"] += span * job.size
            elif job.phase is Phase.DISPATCHING:
                self._unit_seconds["dispatching"] += span * job.size
            if job.phase is Phase.CHECKPOINTING:
                self._unit_seconds["checkpointing"] += span * job.size
        self._queue_area += waiting * span
        self._queue_time[waiting] = self._queue_time.get(waiting, 0.0) + span
        self._queue_peak = max(self._queue_peak, waiting)
        self._clock_mark = until
