"""Jobs and their life cycle: PENDING -> STARTING -> RUNNING -> one terminal state.

The states themselves are mm/states.py's. The record here is what the store keeps and what the MM's
scheduling acts on. Transitions are checked in one place (:func:`advance`) so that no code path can move a
job backwards or out of a terminal state. The one way back is :func:`requeue`: a job submitted with
``--requeue`` whose node failed returns to PENDING, keeping its id and submit time (so it keeps its place in
the queue), and runs again from the start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from storm.mm.protocol import BoxInfo, JobInfo, RankExit
from storm.mm.slurm_style import expand_path
from storm.mm.states import TERMINAL_STATES, JobState
from storm.mm.torus import Box

_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.CANCELLED}),
    JobState.STARTING: frozenset({JobState.RUNNING} | TERMINAL_STATES),
    JobState.RUNNING: TERMINAL_STATES,
}

# What `storm submit --wait` exits with when a job did not end by itself: a caller can tell them apart.
WAIT_EXIT_CODES: dict[JobState, int] = {
    JobState.CANCELLED: 130,
    JobState.TIMEOUT: 124,
    JobState.NODE_FAIL: 125,
}


class TransitionError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What the user asked for; never changes after submission."""

    name: str
    uid: int
    gid: int
    user: str
    ranks: int
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    time_limit: float | None
    output: str
    error: str
    # Run it again (back to PENDING) when a node under it fails, instead of ending it NODE_FAIL.
    requeue: bool = False
    # Preload mpihook into the ranks (storm submit --no-hook: not).
    hook: bool = True
    # A moldable job (storm submit -n MIN-MAX): ``ranks`` is its least size and this its most; 0: exactly
    # ``ranks``. The size it runs at is chosen when it starts (mm/sizing.py) and is its placement's.
    max_ranks: int = 0
    # Its quality of service ("": normal) and that QOS's priority at submission ([mm] qos): higher goes first
    # in the queue and may suspend running jobs of a lower one ([mm] preemption).
    qos: str = ""
    priority: int = 0
    # `storm run`: its ranks' output is streamed to attached clients (and still written to its files).
    stream: bool = False

    @property
    def moldable(self) -> bool:
        return self.max_ranks > self.ranks


@dataclass(frozen=True, kw_only=True)
class Job:
    id: int
    spec: JobSpec
    state: JobState
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    reason: str = ""
    # Rank i runs on placement[i] = (node, pe); empty until the job is placed.
    placement: tuple[tuple[str, int], ...] = ()
    row: int | None = None
    # The terminal state storm is taking the job to (cancel, time limit, failure, lost node): kept in the
    # store, with ``reason`` and ``exit_code``, so that a restarted MM finishes what it began.
    ending: JobState | None = None
    # Seconds stopped by gang scheduling (as of the last save while it runs); not charged to its limit.
    suspended_time: float = 0.0
    # Times the job went back to the queue after a node failure (``requeue`` in its spec).
    requeues: int = 0
    # On a torus: the box of nodes its current (or last) run holds; None on a flat network.
    box: Box | None = None
    # Preemption (mm/suspension.py): while the job's ranks are stopped for a job of a higher priority, that
    # job's id and since when (its state stays RUNNING: its ranks exist, on PEs it has lent); None otherwise.
    # ``resumed_at``: when it last resumed, from which its minimum run time counts again.
    suspended_by: int | None = None
    suspended_at: float | None = None
    resumed_at: float | None = None

    @cached_property
    def nodes(self) -> tuple[str, ...]:
        """The distinct nodes of the placement, in rank order. Cached: the MM asks on every node report,
        and a wide job's placement is long (a frozen record's placement never changes under it)."""
        return tuple(dict.fromkeys([node for node, _pe in self.placement]))

    @property
    def ranks(self) -> int:
        """The size it runs (or ran) at: its placement's, once placed (a moldable job's is chosen then)."""
        return len(self.placement) or self.spec.ranks

    def info(
        self, *, reason: str | None = None, suspended_time: float | None = None, warning: str = ""
    ) -> JobInfo:
        """What clients see of it; the MM's listing gives a queued job's reason and a running job's stopped
        time and warning as of now (one record built, not one and then copies: a queue is long).

        Kept with the record for the same arguments: a job is listed again and again while it is queued or
        runs (a client polling the queue), and a record never changes (a change makes a new one, see
        :func:`advance`)."""
        key = (reason, suspended_time, warning)
        kept = self.__dict__.get("_info")
        if kept is not None and kept[0] == key:
            return kept[1]  # type: ignore[no-any-return]
        info = self._make_info(reason, suspended_time, warning)
        object.__setattr__(self, "_info", (key, info))
        return info

    def _make_info(self, reason: str | None, suspended_time: float | None, warning: str) -> JobInfo:
        spec = self.spec
        return JobInfo(
            id=self.id,
            name=self.spec.name,
            user=self.spec.user,
            uid=self.spec.uid,
            state=self.state.value,
            ranks=self.ranks,
            nodes=self.nodes,
            submit_time=self.submit_time,
            start_time=self.start_time,
            end_time=self.end_time,
            exit_code=self.exit_code,
            reason=self.reason if reason is None else reason,
            time_limit=self.spec.time_limit,
            argv=self.spec.argv,
            cwd=self.spec.cwd,
            output=self._path(self.spec.output),
            error=self._path(self.spec.error),
            row=self.row if self.state.active else None,
            suspended_time=self.suspended_time if suspended_time is None else suspended_time,
            requeue=self.spec.requeue,
            requeues=self.requeues,
            hook=self.spec.hook,
            box=None if self.box is None else BoxInfo(base=self.box.base, shape=self.box.shape),
            min_ranks=spec.ranks if spec.moldable else 0,
            max_ranks=spec.max_ranks if spec.moldable else 0,
            qos=spec.qos or "normal",
            priority=spec.priority,
            suspended_by=self.suspended_by,
            warning=warning,
        )

    def _path(self, pattern: str) -> str:
        return (
            expand_path(pattern, job_id=self.id, user=self.spec.user, name=self.spec.name) if pattern else ""
        )


_FIELDS = frozenset(f.name for f in dataclasses.fields(Job))


def advance(job: Job, state: JobState, now: float, **changes: object) -> Job:
    """The job in its new state; raises TransitionError for a move the life cycle does not allow."""
    if state not in _ALLOWED.get(job.state, frozenset()):
        raise TransitionError(f"job {job.id}: {job.state} -> {state} is not allowed")
    if state is JobState.STARTING:
        changes.setdefault("start_time", now)
    if state.terminal:
        changes.setdefault("end_time", now)
    if not _FIELDS.issuperset(changes):
        raise TypeError(f"a job has no field {sorted(set(changes) - _FIELDS)[0]!r}")
    # A copy of the record's attributes rather than Job(**fields): a frozen dataclass sets each field through
    # object.__setattr__, and a job advances three times in its life, in a simulator thousands of times a
    # second. Job has no __post_init__ to skip. The cached node list stays valid unless the placement changes.
    values = dict(job.__dict__)
    values.pop("_info", None)  # what clients saw of the old record
    if "placement" in changes:
        values.pop("nodes", None)
    values.update(changes)
    values["state"] = state
    moved = object.__new__(Job)
    object.__setattr__(moved, "__dict__", values)
    return moved


def requeue(job: Job, reason: str) -> Job:
    """The job back in the queue after its node failed, as if never started, its id and submit time kept.

    Only a job storm was ending NODE_FAIL (every node has confirmed its ranks gone, or was written off) may
    go back; start, end, placement (and box), exit code and suspended time start afresh with the next run.
    """
    if not job.state.active or job.ending is not JobState.NODE_FAIL or not job.spec.requeue:
        raise TransitionError(f"job {job.id}: only a --requeue job ending NODE_FAIL can be requeued")
    return dataclasses.replace(
        job, state=JobState.PENDING, start_time=None, end_time=None, exit_code=None, reason=reason,
        placement=(), row=None, ending=None, suspended_time=0.0, requeues=job.requeues + 1, box=None,
        suspended_by=None, suspended_at=None, resumed_at=None,
    )  # fmt: skip


def outcome(exits: list[RankExit]) -> tuple[JobState, int, str]:
    """State, exit code and reason of a job whose ranks all ended by themselves.

    The first failure in time order names the job's exit code, as mpiexec reports the first rank to fail.
    """
    for exit_ in exits:
        if exit_.failed:
            return JobState.FAILED, exit_.status, exit_.describe()
    return JobState.COMPLETED, 0, ""
