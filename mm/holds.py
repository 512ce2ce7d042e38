"""Pending jobs kept out of the scheduling pass until something releases them: a dependency that does not
hold yet (reason ``Dependency``) and array tasks past their array's ``%N`` limit (``JobArrayTaskLimit``).

A held job is not in the pass's queue (mm/schedule_state.py), so a pass costs what the jobs that may start
cost, however many wait on others: 10,000 tasks of a ``%10`` array are 10 jobs to a pass, not 10,000. Each
held job is indexed by what releases it, and only that looks at it again:

- a dependency, by every job (``on_job``) and whole array (``on_array``) it names: when one of those starts
  or ends, its dependents alone are judged again (mm/dependency.py), O(d x c) for d dependents of c
  conditions each. One that holds goes on to its array's limit; one that never can is *doomed*: storm-mm
  ends it CANCELLED with ``DependencyNeverSatisfied`` and why (and judges its own dependents in turn).
- an array task over the limit, by its array's :class:`Gate`: tasks in the pass's queue or holding PEs take
  the gate's slots, at most ``%N``; a task that ends frees its slot for the held task of the lowest id,
  O(log h) for h held tasks. A requeued task (``--requeue``) keeps its slot.

Whole-array conditions look at :class:`~storm.mm.dependency.ArrayCounts`, kept here for every array that
has a task not ended (loaded from the store when a task is first seen, then moved by starts and ends): O(1)
per event. An array whose tasks have all ended is read from the store when a dependency names it.

Nothing here is durable: a job's dependency and array are in its spec and the store's columns, so a
restarted storm-mm rebuilds all of this by admitting its queued jobs again (mm/runs.py's recover), and,
the conditions being monotonic, judges them as before. The RunTable (mm/runs.py) tells this module what
happens (:meth:`Holds.admit`, :meth:`Holds.running`, :meth:`Holds.started`, :meth:`Holds.ended`) and
takes what it released (:meth:`Holds.take`); this module decides nothing else.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from storm.mm.arrays import parse_array
from storm.mm.dependency import (
    ArrayCounts,
    Condition,
    Verdict,
    combine,
    judge_array,
    judge_job,
    parse_dependency,
)
from storm.mm.jobs import Job
from storm.mm.states import JobState

DEPENDENCY = "Dependency"  # Slurm's reasons, which storm queue shows
ARRAY_LIMIT = "JobArrayTaskLimit"
NEVER = "DependencyNeverSatisfied"


@functools.lru_cache(maxsize=256)
def array_tasks(text: str) -> tuple[tuple[int, ...], int]:
    """An array's task ids and limit from its spec's canonical text (every task shares it: parsed once)."""
    spec = parse_array(text)
    return spec.tasks(), spec.limit


def started(job: Job) -> bool:
    """The job has started at least once (a requeued job has, though its next run has not)."""
    return job.start_time is not None or job.requeues > 0


@dataclass
class Gate:
    """An array's ``%N``: the tasks that hold its slots (queued for a pass, or holding PEs), and the tasks
    waiting for one, lowest job id (task id) first."""

    limit: int
    slots: set[int] = field(default_factory=set)
    held: list[int] = field(default_factory=list)  # a heap; an id no longer in ``waiting`` is skipped
    waiting: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Resolved:
    """A condition with its target known: a job (``array`` False) or every task of an array."""

    kind: str
    target: int
    array: bool
    text: str  # as the user wrote it: "12", "12_3"


class Holds:
    """The held jobs and what releases them (see the module's docstring).

    ``job`` finds a job by id wherever it is (queued, placed, or ended in the store); ``tasks`` reads an
    array's tasks from the store."""

    def __init__(self, job: Callable[[int], Job | None], tasks: Callable[[int], list[Job]]) -> None:
        self.job = job
        self.tasks = tasks
        self.reasons: dict[int, str] = {}  # held job -> why (Dependency, JobArrayTaskLimit)
        self.waiting: dict[int, tuple[tuple[Resolved, ...], bool]] = {}  # job -> (conditions, any)
        self.on_job: dict[int, set[int]] = {}
        self.on_array: dict[int, set[int]] = {}
        self.gates: dict[int, Gate] = {}
        self.counts: dict[int, ArrayCounts] = {}
        self._ready: list[int] = []
        self._doomed: list[tuple[int, str]] = []
        self._resolved: dict[str, tuple[tuple[Resolved, ...], bool]] = {}

    # ------------------------------------------------------------------------------------ dependencies

    def resolve(self, text: str) -> tuple[tuple[Resolved, ...], bool]:
        """A dependency's conditions with their targets known; ValueError naming an ID that names nothing.
        Cached by text: the tasks of an array share theirs, and what an ID names never changes."""
        found = self._resolved.get(text)
        if found is not None:
            return found
        dependency = parse_dependency(text)
        resolved = tuple(self._resolve(c) for c in dependency.conditions)
        if len(self._resolved) >= 1024:
            self._resolved.clear()
        self._resolved[text] = found = (resolved, dependency.any)
        return found

    def _resolve(self, c: Condition) -> Resolved:
        if c.task is None:
            job = self.job(c.job_id)
            if job is None:
                raise ValueError(f"no job {c.job_id}")
            whole = job.array_id == job.id  # an array's id names every task, as in Slurm
            return Resolved(c.kind, c.job_id, whole, c.target)
        task = next((j for j in self.tasks(c.job_id) if j.array_task == c.task), None)
        if task is None:
            head = self.job(c.job_id)
            if head is None or head.array_id != head.id:
                raise ValueError(f"no job array {c.job_id}")
            raise ValueError(f"array {c.job_id} has no task {c.task}")
        return Resolved(c.kind, task.id, False, c.target)

    def _judge(self, c: Resolved) -> tuple[Verdict, str]:
        if c.array:
            return judge_array(c.kind, c.target, self._counts(c.target))
        job = self.job(c.target)
        if job is None:  # only if the store lost it
            return Verdict.NEVER, f"job {c.text} is not in storm-mm's store"
        verdict, why = judge_job(c.kind, c.target, job.state, started(job))
        if why and c.text != str(c.target):
            why = f"task {c.text}: {why}"
        return verdict, why

    def _counts(self, array_id: int) -> ArrayCounts:
        counts = self.counts.get(array_id)
        return counts if counts is not None else counts_of(self.tasks(array_id))

    # ------------------------------------------------------------------------------------ events

    def admit(self, job: Job) -> bool:
        """A pending job (submitted, recovered, requeued) asks to join the pass's queue: True if it may now;
        else it is held (or doomed: see :meth:`take`). O(c) for a dependency of c conditions."""
        if job.array_id is not None and job.array_id not in self.counts:
            self.counts[job.array_id] = counts_of(self.tasks(job.array_id))
        # A requeued job's dependency held before its first start, and holds for good.
        if job.spec.dependency and job.requeues == 0:
            try:
                conditions, any_ = self.resolve(job.spec.dependency)
            except ValueError as exc:  # named a job when submitted: only a damaged store loses one
                self._doomed.append((job.id, str(exc)))
                return False
            verdict, why = combine([self._judge(c) for c in conditions], any_)
            if verdict is Verdict.NEVER:
                self._doomed.append((job.id, why))
                return False
            if verdict is Verdict.WAIT:
                self.waiting[job.id] = (conditions, any_)
                self.reasons[job.id] = DEPENDENCY
                for c in conditions:
                    (self.on_array if c.array else self.on_job).setdefault(c.target, set()).add(job.id)
                return False
        return self._gate(job)

    def _gate(self, job: Job) -> bool:
        if job.array_id is None:
            return True
        _tasks, limit = array_tasks(job.spec.array)
        if not limit:
            return True
        gate = self.gates.get(job.array_id)
        if gate is None:
            gate = self.gates[job.array_id] = Gate(limit)
        if job.id in gate.slots:  # requeued: it keeps its slot
            return True
        if len(gate.slots) < limit:
            gate.slots.add(job.id)
            return True
        heapq.heappush(gate.held, job.id)
        gate.waiting.add(job.id)
        self.reasons[job.id] = ARRAY_LIMIT
        return False

    def running(self, job: Job) -> None:
        """A job that holds PEs already (a restarted storm-mm's placed jobs): it takes its array's slot."""
        if job.array_id is None:
            return
        if job.array_id not in self.counts:
            self.counts[job.array_id] = counts_of(self.tasks(job.array_id))
        _tasks, limit = array_tasks(job.spec.array)
        if limit:
            self.gates.setdefault(job.array_id, Gate(limit)).slots.add(job.id)

    def started(self, job: Job) -> None:
        """The job was placed: its dependents with ``after`` may go. O(its dependents and its array's)."""
        first = job.requeues == 0
        if job.array_id is not None and first:
            counts = self.counts.get(job.array_id)
            if counts is not None:
                counts.unstarted -= 1
                if counts.unstarted == 0 and job.array_id in self.on_array:
                    self._wake(self.on_array[job.array_id])
        if first and job.id in self.on_job:
            self._wake(self.on_job[job.id])

    def ended(self, job: Job) -> None:
        """The job reached its terminal state: its slot is free, its dependents are judged again.
        O(log h) for its array's gate, plus O(d x c) for its d dependents."""
        self.reasons.pop(job.id, None)
        self.waiting.pop(job.id, None)  # cancelled while held: its index entries are dropped when met
        array_id = job.array_id
        if array_id is not None:
            gate = self.gates.get(array_id)
            if gate is not None:
                if job.id in gate.slots:
                    gate.slots.discard(job.id)
                    self._next(gate)
                gate.waiting.discard(job.id)
            counts = self.counts.get(array_id)
            if counts is not None:
                counts.unfinished -= 1
                if not started(job):
                    counts.unstarted -= 1
                if job.state is not JobState.COMPLETED:
                    counts.failed += 1
                    if counts.first_failed is None:
                        counts.first_failed = (job.id, job.array_task or 0, job.state.value)
                if counts.unfinished == 0:
                    del self.counts[array_id]
                    self.gates.pop(array_id, None)
                if array_id in self.on_array:
                    self._wake(self.on_array[array_id])
                    if counts.unfinished == 0:
                        del self.on_array[array_id]  # every condition on it is decided now
        dependents = self.on_job.pop(job.id, None)
        if dependents:
            self._wake(dependents)

    def take(self) -> tuple[list[int], list[tuple[int, str]]]:
        """What was released since the last take: jobs that may join the queue, and jobs whose dependency
        can never hold, with why (the RunTable ends them, which may release more: take again)."""
        ready, doomed = self._ready, self._doomed
        self._ready, self._doomed = [], []
        return ready, doomed

    # ------------------------------------------------------------------------------------ inside

    def _next(self, gate: Gate) -> None:
        """A slot is free: the held task of the lowest id takes it."""
        while gate.held and len(gate.slots) < gate.limit:
            job_id = heapq.heappop(gate.held)
            if job_id in gate.waiting:
                gate.waiting.discard(job_id)
                gate.slots.add(job_id)
                self.reasons.pop(job_id, None)
                self._ready.append(job_id)

    def _wake(self, dependents: set[int]) -> None:
        """Judge these held jobs again (a job they name started or ended). O(d x c)."""
        for job_id in sorted(dependents):  # in order of id: the older dependent first to the queue
            held = self.waiting.get(job_id)
            if held is None:
                dependents.discard(job_id)  # released or ended already
                continue
            conditions, any_ = held
            verdict, why = combine([self._judge(c) for c in conditions], any_)
            if verdict is Verdict.WAIT:
                continue
            del self.waiting[job_id]
            self.reasons.pop(job_id, None)
            for c in conditions:
                index = self.on_array if c.array else self.on_job
                waiters = index.get(c.target)
                if waiters is not None and waiters is not dependents:
                    waiters.discard(job_id)
            dependents.discard(job_id)
            if verdict is Verdict.NEVER:
                self._doomed.append((job_id, why))
                continue
            job = self.job(job_id)
            if job is not None and self._gate(job):
                self._ready.append(job_id)


def counts_of(tasks: list[Job]) -> ArrayCounts:
    """An array's counts from its tasks' records. O(tasks)."""
    counts = ArrayCounts(tasks=len(tasks))
    for job in tasks:
        if not job.state.terminal:
            counts.unfinished += 1
            if not started(job):
                counts.unstarted += 1
        elif job.state is not JobState.COMPLETED:
            counts.failed += 1
            if counts.first_failed is None:
                counts.first_failed = (job.id, job.array_task or 0, job.state.value)
    return counts
