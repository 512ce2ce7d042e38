"""Simulated node managers: they answer storm-mm as storm-nm does, with the ranks' lives decided by the trace.

A node registers with its PEs; on a LaunchJob it reports the job launched at once (no process to start), and
its ranks run until the engine says the job's runtime is over (:meth:`SimNodes.finish`), when the node reports
every rank exited 0. A KillJob (a time limit, a cancel) ends the node's ranks at once, killed by SIGTERM.

The nodes also check what the MM core decided, on every run, whatever the caller asked for: a PE holds at
most one rank at a time, no rank starts before its job was submitted, a job launches once per node and
ends after it started. A breach raises :class:`InvariantError` at the instant it happens.
"""

from __future__ import annotations

import functools
import signal

from storm.mm import protocol as p

_DONE = p.RankExit
_SIGTERM = int(signal.SIGTERM)


@functools.lru_cache(maxsize=4096)
def _exits(ranks: tuple[int, ...], killed: bool) -> tuple[p.RankExit, ...]:
    """The exits of a node's ranks: shared between reports (immutable), since ranks are block-distributed
    and the same few blocks recur job after job."""
    if killed:
        return tuple(_DONE(rank=r, signal=_SIGTERM) for r in ranks)
    return tuple(_DONE(rank=r, exit_code=0) for r in ranks)


@functools.lru_cache(maxsize=4096)
def _pids(ranks: tuple[int, ...]) -> dict[str, int]:
    """Made-up process ids of a node's ranks, shared between reports: nothing changes them."""
    return {str(r): 1000 + r for r in ranks}


class InvariantError(AssertionError):
    """The MM core did something no scheduler may do (two ranks on one PE, a start before submission...)."""


class SimNodes:
    """``count`` nodes named n0, n1, ... of ``pes`` PEs each. ``submit_times`` are the jobs' submission
    times by MM job id (filled by the engine as the MM accepts them)."""

    def __init__(self, count: int, pes: int) -> None:
        if count < 1 or pes < 1:
            raise ValueError("a machine needs at least one node of at least one PE")
        self.names = [f"n{i}" for i in range(count)]
        self.pes = pes
        self.submit_times: dict[int, float] = {}
        # node -> PE -> the job whose rank holds it: the no-PE-used-twice invariant.
        self.busy: dict[str, dict[int, int]] = {name: {} for name in self.names}
        # job id -> node -> its ranks there, while they run.
        self.ranks: dict[int, dict[str, tuple[int, ...]]] = {}
        self.slots: dict[tuple[int, str], tuple[int, ...]] = {}  # (job, node) -> PEs its ranks hold
        self.launched: set[tuple[int, str]] = set()
        self.start_times: dict[int, float] = {}

    def registrations(self) -> list[p.RegisterNode]:
        return [
            p.RegisterNode(node=name, pes=self.pes, nm_epoch=f"{name}-sim", address=f"sim:{name}")
            for name in self.names
        ]

    def receive(self, node: str, message: p.Message, now: float) -> list[p.Message]:
        """What the node manager of ``node`` says back to the MM about ``message`` (in order)."""
        if type(message) is p.LaunchJob:
            return [self._launch(node, message, now)]
        if type(message) is p.KillJob:
            done = self._end(node, message.job_id, killed=True)
            return [] if done is None else [done]
        # JobRows (a matrix compaction), PMI answers: nothing a batch simulation's ranks act on.
        return []

    def finish(self, job_id: int) -> list[p.JobNodeDone]:
        """The job's runtime is over: every node still running its ranks reports them exited 0."""
        nodes = self.ranks.get(job_id)
        if not nodes:
            return []  # killed already (its time limit came first)
        reports = []
        for node in list(nodes):
            done = self._end(node, job_id, killed=False)
            if done is not None:
                reports.append(done)
        return reports

    def running(self, job_id: int) -> bool:
        return bool(self.ranks.get(job_id))

    def _launch(self, node: str, launch: p.LaunchJob, now: float) -> p.JobLaunched:
        job_id = launch.job_id
        key = (job_id, node)
        if key in self.launched:
            raise InvariantError(f"job {job_id} launched twice on {node}")
        submitted = self.submit_times.get(job_id)
        if submitted is None or now < submitted:
            raise InvariantError(f"job {job_id} starts at {now} before its submission ({submitted})")
        self.launched.add(key)
        busy = self.busy.get(node)
        if busy is None:
            raise InvariantError(f"job {job_id} placed on {node}, which is not a node of the machine")
        slots = launch.slots
        pes = tuple([slot.pe for slot in slots])
        # Set operations rather than a check per PE: a wide job's launch is most of a simulated start.
        if max(pes) >= self.pes:
            raise InvariantError(f"job {job_id} placed on {node}:{max(pes)}, which has {self.pes} PEs")
        taken = busy.keys() & pes
        if taken:
            pe = min(taken)
            raise InvariantError(f"job {job_id} placed on {node}:{pe}, where job {busy[pe]} still runs")
        claimed = dict.fromkeys(pes, job_id)
        if len(claimed) < len(pes):
            raise InvariantError(f"job {job_id} placed twice on one PE of {node}: {sorted(pes)}")
        busy.update(claimed)
        self.slots[key] = pes
        ranks = tuple([slot.rank for slot in slots])
        self.ranks.setdefault(job_id, {})[node] = ranks
        self.start_times.setdefault(job_id, now)
        return p.JobLaunched(job_id=job_id, node=node, pids=_pids(ranks))

    def _end(self, node: str, job_id: int, *, killed: bool) -> p.JobNodeDone | None:
        nodes = self.ranks.get(job_id)
        if nodes is None or node not in nodes:
            return None  # a kill for ranks already gone (the MM tells every node; some may be done)
        ranks = nodes.pop(node)
        if not nodes:
            del self.ranks[job_id]
        busy = self.busy[node]
        for pe in self.slots.pop((job_id, node)):
            del busy[pe]
        return p.JobNodeDone(job_id=job_id, node=node, exits=_exits(ranks, killed))

    def check_idle(self) -> None:
        """At the end of a run: no rank is left on any PE."""
        if any(self.busy.values()) or self.ranks:
            raise InvariantError(f"ranks still running at the end: jobs {sorted(self.ranks)}")
