"""What the MM core needs of durable storage: the :class:`Storage` protocol and the records it keeps.

Two stores implement it: SQLite in mm/store.py (storm-mm), and memory in mm/memory_store.py (tests and a
simulator). The core (mm/core.py, mm/runs.py, mm/reports.py) sees only this protocol, so it never touches
SQLite itself. Every write method is durable when it returns, unless it runs inside ``transaction()``,
whose writes become durable together when the outermost block ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from storm.mm.accounting import Usage
from storm.mm.jobs import Job, JobSpec
from storm.mm.protocol import ClassChange, ProfileEntry, RankExit


class StoreError(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True)
class NodeRecord:
    name: str
    pes: int
    state: str
    reason: str
    address: str
    last_seen: float


class Storage(Protocol):
    """Exactly the store methods the MM core uses."""

    def transaction(self) -> AbstractContextManager[None]:
        """Group writes into one durable commit; nested blocks join the outermost one."""
        ...

    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...

    # -- jobs
    def add_job(self, spec: JobSpec, now: float) -> Job:
        """A new PENDING job with the next id (ids are never reused)."""
        ...

    def add_array(self, spec: JobSpec, tasks: tuple[int, ...], now: float) -> list[Job]:
        """A job array: one new PENDING job per task id (``tasks``: distinct, increasing), in one write, in
        task order; each has the array's id, the first one's job id."""
        ...

    def array_tasks(self, array_id: int) -> list[Job]:
        """Every task of the array, in task order ([] if ``array_id`` names no array)."""
        ...

    def save_job(self, job: Job) -> None:
        """Everything of a job but its spec and submit time, which never change; StoreError if unknown."""
        ...

    def save_wireup(self, job_id: int, kvsname: str, hosts: tuple[int, ...] = ()) -> None: ...
    def wireups(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        """(PMI name, hosts) of the placed jobs (STARTING or RUNNING) that have a PMI name."""
        ...

    def get_job(self, job_id: int) -> Job | None: ...
    def jobs(
        self,
        job_ids: Iterable[int] | None = None,
        *,
        active_only: bool = False,
        newest: int = 0,
        before: int = 0,
    ) -> list[Job]:
        """Jobs by id, else all (PENDING, STARTING, RUNNING with ``active_only``) in order of id; with
        ``newest``, only that many, the newest (of ids below ``before`` if given)."""
        ...

    # -- PMI barriers
    def save_barrier(self, job_id: int, seq: int, kvs: dict[str, str]) -> None: ...
    def barriers(self) -> dict[int, tuple[int, dict[str, str]]]: ...
    def forget_barrier(self, job_id: int) -> None: ...

    # -- nodes' final reports on jobs still running elsewhere
    def save_node_exits(self, job_id: int, node: str, exits: Iterable[RankExit]) -> None: ...
    def node_exits(self) -> dict[int, dict[str, tuple[RankExit, ...]]]: ...
    def forget_node_exits(self, job_id: int) -> None: ...

    # -- measurements
    def save_usage(self, job_id: int, usage: Usage) -> None:
        """What an ended job used (mm/accounting.py), for `storm history`."""
        ...

    def add_class_changes(self, changes: Iterable[ClassChange]) -> None: ...
    def class_changes(self, job_ids: Iterable[int]) -> list[ClassChange]:
        """Per job in the order asked, each job's changes in order of time."""
        ...

    def add_profile(self, job_id: int, entries: Iterable[ProfileEntry]) -> None: ...
    def profile(self, job_id: int) -> list[ProfileEntry]:
        """In order of rank, then class."""
        ...

    # -- nodes
    def save_node(self, node: NodeRecord) -> None: ...
    def nodes(self) -> list[NodeRecord]:
        """In order of name."""
        ...
