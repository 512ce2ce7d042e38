"""Naik, Setia and Squillante's machine (512 processors in units of 4) and its static and adaptive policies.

:class:`NaikCluster` runs a job stream (naik_workload.py) under a policy until a given number of jobs have
departed. A policy is told of every arrival and of every release of processors (a departure, or a
reconfiguration giving some back), and starts jobs through :meth:`NaikCluster.start`; a job on u units
computes at speedup(4u) / work of its work per second and runs until it ends (only DP, naik_dynamic.py,
changes a running job's size). There are no dispatch costs: the paper models none. Events at one instant
come in the order ends, reconfiguration steps, arrivals, each by job id.

- :class:`FixedPartitions` FP(x x 512/x): x equal partitions, one job each, one FCFS queue. A job runs on
  its whole partition (its speedup levels off past its Req, so a larger partition helps it little).
- :class:`Adaptive` AP: an arrival gets min(Req, free) if at least Min_sys processors are free (the paper's
  "more than Min_sys" read as "at least": otherwise 32 free processors would stay idle before a small job),
  else it queues; at a release the free processors are split equally among the queue, each job between
  Min_sys and its Req (:func:`storm.mm.moldable.adaptive_size` and ``equal_split``, storm-mm's own).
- :class:`ClassPartitions` FPJP(x, y, z): x, y, z processors for small, medium and large jobs, each cut
  into partitions of the class's Req (32 or 128) with what is left as one more partition (192 = 128 + 64:
  the paper used "the best subdivision" and does not say which); one FCFS queue per class. A small job takes
  any free partition (its own class's first, then medium, then large), a medium job a medium or large one,
  a large job only a large one. A freed large partition goes to the large queue's head, else the small
  queue's, else the medium's; a freed medium partition to the medium head, else the small head; a freed
  small partition only to the small head.

Per departure the cluster records the job's class, response S_n and U_n = S_n / (its time on Req
processors); invariants are checked as it runs: never more units used than exist, sizes within
[min, max], each job's work done exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from storm.mm.moldable import adaptive_size, equal_split
from storm.tools.sim.allocation.events import EventQueue
from storm.tools.sim.allocation.jobs import JobSpec, Progress
from storm.tools.sim.allocation.naik_workload import MIN_SYS, UNIT, UNITS

END, BOUNDARY, PHASE1, PHASE2, ARRIVAL = range(5)
EVENT_ORDER = (
    "ends, reconfiguration steps (iteration boundary, end of phase 1, end of phase 2), arrivals; then job id"
)


class Live:
    """A job in the machine."""

    __slots__ = ("eligible_at", "end", "partition", "progress", "reconf", "spec", "start", "token", "units",
                 "updated")  # fmt: skip

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.units = 0  # 0 while waiting
        self.progress = Progress(spec)
        self.updated = 0.0
        self.token = 0
        self.start: float | None = None
        self.end: float | None = None
        self.partition: int | None = None
        self.reconf: tuple[str, int] | None = None  # (step, target units) of DP's reconfiguration under way
        self.eligible_at = 0.0  # DP: when it may be reconfigured again

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    @property
    def time_at_req(self) -> float:
        return self.spec.runtime(self.spec.desired, UNIT)


class Policy(Protocol):
    name: str

    def arrive(self, cluster: NaikCluster, job: Live) -> None: ...

    def release(self, cluster: NaikCluster, freed_by: Live | None) -> None: ...

    def waiting(self) -> int: ...

    def step(self, cluster: NaikCluster, kind: int, job: Live) -> None:
        """A reconfiguration step of ``job`` (DP only)."""


@dataclass(frozen=True)
class Departure:
    job_id: int
    kind: str
    arrival: float
    start: float
    end: float
    time_at_req: float

    @property
    def response(self) -> float:
        return self.end - self.arrival

    @property
    def ratio(self) -> float:
        return self.response / self.time_at_req


class NaikCluster:
    """The machine (module docstring). ``on_departure`` is called after each departure (the transient
    experiment injects its burst from it, and sets ``stopped`` when it has what it needs)."""

    def __init__(
        self,
        policy: Policy,
        jobs: Iterator[JobSpec],
        departures: int,
        *,
        on_departure: Callable[[NaikCluster, Departure], None] | None = None,
    ) -> None:
        self.policy = policy
        self.now = 0.0
        self.free = UNITS
        self.running: dict[int, Live] = {}
        self.in_system = 0
        self.departures: list[Departure] = []
        self.counts = {"grow": 0, "shrink": 0}
        self._source = jobs
        self._target = departures
        self._events = EventQueue()
        self._on_departure = on_departure
        self.stopped = False  # an ``on_departure`` hook may end the run early
        self._next: Live | None = None  # the stream's next arrival
        self._injected: dict[int, Live] = {}

    # What a policy uses.

    def start(self, job: Live, units: int, partition: int | None = None) -> None:
        if job.units or job.start is not None:
            raise AssertionError(f"job {job.job_id} has started already")
        if not job.spec.minimum <= units <= job.spec.maximum:
            raise AssertionError(
                f"job {job.job_id}: {units} units outside [{job.spec.minimum}, {job.spec.maximum}]"
            )
        self.take(units)
        job.units = units
        job.partition = partition
        job.start = self.now
        self.running[job.job_id] = job
        self.begin_computing(job)

    def take(self, units: int) -> None:
        if units > self.free or units < 0:
            raise AssertionError(f"{units} units asked for, {self.free} free")
        self.free -= units

    def give_back(self, units: int) -> None:
        self.free += units
        if self.free > UNITS:
            raise AssertionError(f"{self.free} units free of {UNITS}")

    def begin_computing(self, job: Live) -> None:
        job.updated = self.now
        job.token += 1
        self._events.push(self.now + job.progress.time_left(job.units * UNIT), END, job.job_id, job.token)

    def stop_computing(self, job: Live) -> None:
        job.progress.run(self.now - job.updated, job.units * UNIT)
        job.updated = self.now
        job.token += 1

    def schedule(self, delay: float, kind: int, job: Live) -> None:
        self._events.push(self.now + delay, kind, job.job_id, job.token)

    def inject(self, specs: list[JobSpec]) -> None:
        """Jobs arriving now besides the stream's (a burst)."""
        for spec in specs:
            self._injected[spec.job_id] = Live(spec)
            self._events.push(self.now, ARRIVAL, spec.job_id)

    # The run.

    def run(self) -> list[Departure]:
        self._pull()
        while self._events and len(self.departures) < self._target and not self.stopped:
            time, kind, job_id, token = self._events.pop()
            self.now = time
            if kind == ARRIVAL:
                self._arrive(job_id)
            elif kind == END:
                job = self.running.get(job_id)
                if job is not None and job.token == token:
                    self._depart(job)
            else:
                job = self.running[job_id]
                if job.token == token:
                    self.policy.step(self, kind, job)
        return self.departures

    def _pull(self) -> None:
        spec = next(self._source)
        if self._next is not None and spec.arrival < self._next.spec.arrival:
            raise AssertionError("arrivals must not go back in time")
        self._next = Live(spec)
        self._events.push(spec.arrival, ARRIVAL, spec.job_id)

    def _arrive(self, job_id: int) -> None:
        if self._next is not None and job_id == self._next.job_id:
            job = self._next
            self._pull()
        else:
            job = self._injected.pop(job_id)
        self.in_system += 1
        self.policy.arrive(self, job)

    def _depart(self, job: Live) -> None:
        self.stop_computing(job)
        if job.progress.remaining > 1e-6 or not math.isclose(job.progress.done, job.spec.work, rel_tol=1e-6):
            raise AssertionError(f"job {job.job_id} ended with work left")
        del self.running[job.job_id]
        self.in_system -= 1
        units = job.units
        job.units = 0
        job.end = self.now
        self.give_back(units)
        assert job.start is not None
        record = Departure(job.job_id, job.spec.kind, job.spec.arrival, job.start, self.now, job.time_at_req)
        self.departures.append(record)
        self.policy.release(self, job)
        if self._on_departure is not None:
            self._on_departure(self, record)


class FixedPartitions:
    """FP(x x 512/x)."""

    def __init__(self, partitions: int) -> None:
        if partitions < 1 or UNITS % partitions:
            raise ValueError(f"512 processors do not split into {partitions} equal partitions of whole units")
        self.name = f"FP({partitions}x{UNITS * UNIT // partitions})"
        self.size = UNITS // partitions
        self.holder: list[int | None] = [None] * partitions
        self.queue: deque[Live] = deque()

    def waiting(self) -> int:
        return len(self.queue)

    def arrive(self, cluster: NaikCluster, job: Live) -> None:
        self.queue.append(job)
        self.release(cluster, None)

    def step(self, cluster: NaikCluster, kind: int, job: Live) -> None:
        raise AssertionError(f"{self.name} does not reconfigure jobs")

    def release(self, cluster: NaikCluster, freed_by: Live | None) -> None:
        if freed_by is not None and freed_by.partition is not None:
            self.holder[freed_by.partition] = None
        for index, holder in enumerate(self.holder):
            if holder is None and self.queue:
                job = self.queue.popleft()
                self.holder[index] = job.job_id
                cluster.start(job, self.size, index)


class Adaptive:
    """AP, through storm-mm's sizing rules."""

    name = "AP"

    def __init__(self) -> None:
        self.queue: deque[Live] = deque()

    def waiting(self) -> int:
        return len(self.queue)

    def arrive(self, cluster: NaikCluster, job: Live) -> None:
        size = adaptive_size(job.spec.desired, cluster.free, MIN_SYS // UNIT) if not self.queue else None
        if size is None:
            self.queue.append(job)
        else:
            cluster.start(job, size)

    def step(self, cluster: NaikCluster, kind: int, job: Live) -> None:
        raise AssertionError(f"{self.name} does not reconfigure jobs")

    def release(self, cluster: NaikCluster, freed_by: Live | None) -> None:
        sizes = equal_split([j.spec.desired for j in self.queue], cluster.free, MIN_SYS // UNIT)
        for size in sizes:
            cluster.start(self.queue.popleft(), size)


CLASS_ORDER = {"small": 0, "medium": 1, "large": 2}
# Which classes may take a free partition of each class, in the order they are served.
SERVED = {"large": ("large", "small", "medium"), "medium": ("medium", "small"), "small": ("small",)}
TAKES = {"small": ("small", "medium", "large"), "medium": ("medium", "large"), "large": ("large",)}


class ClassPartitions:
    """FPJP(x, y, z)."""

    def __init__(self, small: int, medium: int, large: int) -> None:
        if small + medium + large != UNITS * UNIT:
            raise ValueError("FPJP's three shares must add up to 512 processors")
        self.name = f"FPJP({small},{medium},{large})"
        self.partitions: list[tuple[str, int]] = []  # (class, units)
        for kind, share, req in (("small", small, 32), ("medium", medium, 128), ("large", large, 128)):
            if share % UNIT or (0 < share < MIN_SYS):
                raise ValueError(f"the {kind} share must be whole units and at least {MIN_SYS} processors")
            whole, rest = divmod(share, req)
            sizes = [req] * whole + ([rest] if rest else [])
            self.partitions += [(kind, size // UNIT) for size in sizes]
        self.holder: list[int | None] = [None] * len(self.partitions)
        self.queues: dict[str, deque[Live]] = {kind: deque() for kind in CLASS_ORDER}

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def arrive(self, cluster: NaikCluster, job: Live) -> None:
        if not self.queues[job.spec.kind]:
            for kind in TAKES[job.spec.kind]:
                for index, (pkind, units) in enumerate(self.partitions):
                    if pkind == kind and self.holder[index] is None:
                        self.holder[index] = job.job_id
                        cluster.start(job, units, index)
                        return
        self.queues[job.spec.kind].append(job)

    def step(self, cluster: NaikCluster, kind: int, job: Live) -> None:
        raise AssertionError(f"{self.name} does not reconfigure jobs")

    def release(self, cluster: NaikCluster, freed_by: Live | None) -> None:
        if freed_by is None or freed_by.partition is None:
            return
        index = freed_by.partition
        self.holder[index] = None
        pkind, units = self.partitions[index]
        for kind in SERVED[pkind]:
            if self.queues[kind]:
                job = self.queues[kind].popleft()
                self.holder[index] = job.job_id
                cluster.start(job, units, index)
                return
