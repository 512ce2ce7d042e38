"""The MM's store in memory: mm/storage.py's Storage without a disk, for tests and a simulator.

It answers as the SQLite store (mm/store.py) does, orders included, so that the core decides the same with
either; nothing survives the process. A transaction only groups (a write is never undone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from types import TracebackType

from storm.mm.accounting import Usage
from storm.mm.jobs import Job, JobSpec
from storm.mm.protocol import ClassChange, ProfileEntry, RankExit
from storm.mm.states import JobState
from storm.mm.storage import NodeRecord, StoreError

_ACTIVE = (JobState.PENDING, JobState.STARTING, JobState.RUNNING)


class _Transaction:
    """A block of writes: a plain context manager, as a generator-based one costs a simulator (which opens
    several per stimulus, hundreds of thousands a run) more than the writes themselves."""

    __slots__ = ("_store",)

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        self._store._depth += 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        store = self._store
        store._depth -= 1
        if store._depth == 0:
            store.commits += 1


class MemoryStore:
    def __init__(self) -> None:
        self._meta: dict[str, str] = {}
        self._jobs: dict[int, Job] = {}
        self._wireups: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._last_id = 0
        self._arrays: dict[int, list[int]] = {}  # array id -> its tasks' job ids, in task order
        self._barriers: dict[int, tuple[int, dict[str, str]]] = {}
        self._node_exits: dict[int, dict[str, tuple[RankExit, ...]]] = {}
        self._class_changes: dict[int, list[ClassChange]] = {}  # per job: asked for at each end under FCS
        self.usages: dict[int, Usage] = {}
        self._profiles: dict[int, list[ProfileEntry]] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._depth = 0
        self.commits = 0  # outermost write blocks ended: what SQLite would have committed
        self._transaction = _Transaction(self)  # reentrant: the depth is the store's, not the block's

    def transaction(self) -> _Transaction:
        return self._transaction

    def close(self) -> None:
        pass

    # -- meta

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction():
            self._meta[key] = value

    # -- jobs

    def add_job(self, spec: JobSpec, now: float) -> Job:
        with self.transaction():
            self._last_id += 1
            job = Job(id=self._last_id, spec=spec, state=JobState.PENDING, submit_time=now)
            self._jobs[job.id] = job
        return job

    def add_array(self, spec: JobSpec, tasks: tuple[int, ...], now: float) -> list[Job]:
        with self.transaction():
            first = self._last_id + 1
            jobs = [
                Job(id=first + i, spec=spec, state=JobState.PENDING, submit_time=now, array_id=first,
                    array_task=task)
                for i, task in enumerate(tasks)
            ]  # fmt: skip
            self._last_id += len(jobs)
            self._jobs.update((job.id, job) for job in jobs)
            self._arrays[first] = [job.id for job in jobs]
        return jobs

    def array_tasks(self, array_id: int) -> list[Job]:
        return [self._jobs[i] for i in self._arrays.get(array_id, ())]

    def save_job(self, job: Job) -> None:
        with self.transaction():
            old = self._jobs.get(job.id)
            if old is None:
                raise StoreError(f"job {job.id} is not in the store")
            # As the SQLite store: the spec and submit time are written once, by add_job. The core saves
            # records derived from the stored one, which carry both already: no copy needed then.
            if job.spec is not old.spec or job.submit_time != old.submit_time:
                job = dataclasses.replace(job, spec=old.spec, submit_time=old.submit_time)
            self._jobs[job.id] = job

    def save_wireup(self, job_id: int, kvsname: str, hosts: tuple[int, ...] = ()) -> None:
        with self.transaction():
            if job_id not in self._jobs:
                raise StoreError(f"job {job_id} is not in the store")
            self._wireups[job_id] = (kvsname, tuple(hosts))

    def wireups(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        return {
            job_id: wireup
            for job_id, wireup in sorted(self._wireups.items())
            if wireup[0] and self._jobs[job_id].state in (JobState.STARTING, JobState.RUNNING)
        }

    def get_job(self, job_id: int) -> Job | None:
        return self._jobs.get(job_id)

    def jobs(
        self,
        job_ids: Iterable[int] | None = None,
        *,
        active_only: bool = False,
        newest: int = 0,
        before: int = 0,
    ) -> list[Job]:
        if job_ids is not None:
            return [self._jobs[i] for i in job_ids if i in self._jobs]
        found = [
            j
            for i, j in sorted(self._jobs.items())
            if (not active_only or j.state in _ACTIVE) and (not before or i < before)
        ]
        return found[-newest:] if newest else found

    # -- PMI barriers

    def save_barrier(self, job_id: int, seq: int, kvs: dict[str, str]) -> None:
        with self.transaction():
            self._barriers[job_id] = (seq, dict(kvs))

    def barriers(self) -> dict[int, tuple[int, dict[str, str]]]:
        return {job_id: (seq, dict(kvs)) for job_id, (seq, kvs) in self._barriers.items()}

    def forget_barrier(self, job_id: int) -> None:
        with self.transaction():
            self._barriers.pop(job_id, None)

    # -- nodes' final reports on jobs still running elsewhere

    def save_node_exits(self, job_id: int, node: str, exits: Iterable[RankExit]) -> None:
        with self.transaction():
            self._node_exits.setdefault(job_id, {})[node] = tuple(exits)

    def node_exits(self) -> dict[int, dict[str, tuple[RankExit, ...]]]:
        return {job_id: dict(by_node) for job_id, by_node in self._node_exits.items()}

    def forget_node_exits(self, job_id: int) -> None:
        with self.transaction():
            self._node_exits.pop(job_id, None)

    # -- measurements

    def save_usage(self, job_id: int, usage: Usage) -> None:
        with self.transaction():
            self.usages[job_id] = usage

    def add_class_changes(self, changes: Iterable[ClassChange]) -> None:
        with self.transaction():
            for c in changes:
                self._class_changes.setdefault(c.job_id, []).append(c)

    def class_changes(self, job_ids: Iterable[int]) -> list[ClassChange]:
        result: list[ClassChange] = []
        for job_id in job_ids:
            result.extend(sorted(self._class_changes.get(job_id, ()), key=lambda c: c.time))
        return result

    def add_profile(self, job_id: int, entries: Iterable[ProfileEntry]) -> None:
        with self.transaction():
            self._profiles.setdefault(job_id, []).extend(entries)

    def profile(self, job_id: int) -> list[ProfileEntry]:
        return sorted(self._profiles.get(job_id, []), key=lambda e: (e.rank, e.klass))

    # -- nodes

    def save_node(self, node: NodeRecord) -> None:
        with self.transaction():
            self._nodes[node.name] = node

    def nodes(self) -> list[NodeRecord]:
        return [record for _, record in sorted(self._nodes.items())]
