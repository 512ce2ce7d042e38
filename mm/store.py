"""The MM's durable state: one SQLite file in WAL mode.

Every job transition is committed (with ``synchronous=FULL`` by default, so it also survives a power loss)
before anyone is told about it. The MM holds unfinished jobs in memory and reads finished ones from here.
Node records survive restarts so that a restarted MM knows which nodes to wait for.

The schema has a version (``meta.schema_version``); a store written by an older storm-mm is migrated in place,
in one transaction, when it is opened. A store from a newer storm-mm is refused rather than misread. The
schema and its migrations are in mm/store_schema.py, a job's row in mm/job_rows.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack

from storm.mm.accounting import Usage
from storm.mm.job_rows import JOB_COLUMNS, pack_box, pack_spec, row_to_job, spec_field
from storm.mm.jobs import Job, JobSpec
from storm.mm.protocol import ClassChange, ProfileEntry, RankExit
from storm.mm.states import JobState
from storm.mm.storage import NodeRecord, StoreError
from storm.mm.store_schema import INDEXES, MIGRATIONS, PLACED, SCHEMA, SCHEMA_VERSION, UNFINISHED


class Store:
    """The MM's store in SQLite (implements mm/storage.py's Storage)."""

    def __init__(self, path: Path, synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise StoreError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Autocommit mode: transactions are explicit (see `transaction`), so a commit is never implicit.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.create_function("storm_spec", 2, spec_field, deterministic=True)
        self._depth = 0
        self._begun = False  # BEGIN issued for the current transaction
        self.commits = 0  # so far (storm-mm logs it when it stops)
        # In a savepoint() block: "pending" until it writes; then "set" (SAVEPOINT issued), or "whole"
        # when its first write began the transaction (a ROLLBACK then undoes exactly the block's writes).
        self._savepoint = ""
        try:
            self._open(synchronous.upper())
        except BaseException:
            self._db.close()  # a connection is in a reference cycle: only closing it frees the files now
            raise

    def _open(self, synchronous: str) -> None:
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(SCHEMA)
            version = self.get_meta("schema_version")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a storm job store: {exc}") from None
        if version is None:
            self.set_meta("schema_version", str(SCHEMA_VERSION))
        elif not version.isdigit() or int(version) > SCHEMA_VERSION or int(version) < min(MIGRATIONS):
            raise StoreError(f"{self.path}: schema version {version}, this storm-mm reads {SCHEMA_VERSION}")
        elif int(version) < SCHEMA_VERSION:
            self._migrate(int(version))
        self._db.executescript(INDEXES)

    def _migrate(self, version: int) -> None:
        """Bring an older store up to this version, all steps in one transaction (all or nothing)."""
        try:
            with self._writing():
                for step in range(version, SCHEMA_VERSION):
                    for statement in MIGRATIONS[step]:
                        self._db.execute(statement)
                self.set_meta("schema_version", str(SCHEMA_VERSION))
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path}: cannot migrate from schema version {version} to {SCHEMA_VERSION}: {exc}"
            ) from None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several writes into one durable commit (nested uses join the outer one).

        The database transaction begins with the first write, so a block that writes nothing (most clock
        ticks and status reports) costs no lock and no commit. An exception that leaves the outermost block
        rolls everything back; one caught inside an inner block does not undo that block's writes (there
        are no savepoints).
        """
        depth = self._depth
        self._depth = depth + 1
        try:
            yield
        except BaseException:
            self._depth = depth
            if depth == 0 and self._begun:
                self._begun = False
                self._db.execute("ROLLBACK")
            raise
        self._depth = depth
        if depth == 0 and self._begun:
            self._begun = False
            self._db.execute("COMMIT")
            self.commits += 1

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction (the MM's group commit: several stimuli, one commit), a block whose writes
        are undone if it raises, while the transaction's other writes stay. Costs nothing if it writes
        nothing."""
        assert self._depth > 0 and not self._savepoint, "a savepoint belongs in a transaction, one at a time"
        self._savepoint = "pending"
        try:
            yield
        except BaseException:
            if self._savepoint == "set":
                self._db.execute("ROLLBACK TO stimulus")
                self._db.execute("RELEASE stimulus")
            elif self._savepoint == "whole" and self._begun:
                self._begun = False
                self._db.execute("ROLLBACK")
            raise
        else:
            if self._savepoint == "set":
                self._db.execute("RELEASE stimulus")
        finally:
            self._savepoint = ""

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write: inside the current transaction, which it begins if it is the first."""
        with self.transaction():
            if not self._begun:
                self._db.execute("BEGIN IMMEDIATE")
                self._begun = True
                if self._savepoint == "pending":
                    self._savepoint = "whole"
            elif self._savepoint == "pending":
                self._db.execute("SAVEPOINT stimulus")
                self._savepoint = "set"
            yield

    def close(self) -> None:
        self._db.close()

    # -- meta

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._writing():
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # -- jobs

    def add_job(self, spec: JobSpec, now: float) -> Job:
        with self._writing():
            cur = self._db.execute(
                "INSERT INTO jobs (state, spec, submit_time, placement, uid, user, name, ranks)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    JobState.PENDING.value,
                    pack_spec(spec),
                    now,
                    msgpack.packb([]),
                    spec.uid,
                    spec.user,
                    spec.name,
                    spec.ranks,
                ),
            )
        job_id = cur.lastrowid
        assert job_id is not None
        return Job(id=job_id, spec=spec, state=JobState.PENDING, submit_time=now)

    def add_array(self, spec: JobSpec, tasks: tuple[int, ...], now: float) -> list[Job]:
        """One PENDING job per task id, in task order, in one transaction; the array's id is the first's.
        The spec is packed once: every task has the same."""
        packed, placement = pack_spec(spec), msgpack.packb([])
        with self._writing():
            cur = self._db.execute(
                "INSERT INTO jobs (state, spec, submit_time, placement, array_task) VALUES (?, ?, ?, ?, ?)",
                (JobState.PENDING.value, packed, now, placement, tasks[0]),
            )
            first = cur.lastrowid
            assert first is not None
            self._db.execute("UPDATE jobs SET array_id = id WHERE id = ?", (first,))
            self._db.executemany(
                "INSERT INTO jobs (state, spec, submit_time, placement, array_id, array_task) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(JobState.PENDING.value, packed, now, placement, first, task) for task in tasks[1:]],
            )
            # One writer (storm-mm holds the store's lock), so the ids that follow the first are the tasks'.
            rows = self._db.execute(
                "SELECT id, array_task FROM jobs WHERE array_id = ? ORDER BY array_task", (first,)
            ).fetchall()
        pending = JobState.PENDING
        return [
            Job(id=int(i), spec=spec, state=pending, submit_time=now, array_id=first, array_task=int(t))
            for i, t in rows
        ]

    def array_tasks(self, array_id: int) -> list[Job]:
        """Every task of the array, in task order ([] if ``array_id`` names no array)."""
        query = f"SELECT {JOB_COLUMNS} FROM jobs WHERE array_id = ? ORDER BY array_task"  # noqa: S608
        return [row_to_job(r) for r in self._db.execute(query, (array_id,)).fetchall()]

    def save_job(self, job: Job) -> None:
        with self._writing():
            cur = self._db.execute(
                "UPDATE jobs SET state = ?, start_time = ?, end_time = ?, exit_code = ?, reason = ?, "
                "placement = ?, row = ?, ending = ?, suspended_time = ?, requeues = ?, box = ?, "
                "suspended_by = ?, suspended_at = ?, resumed_at = ? WHERE id = ?",
                (
                    job.state.value,
                    job.start_time,
                    job.end_time,
                    job.exit_code,
                    job.reason,
                    msgpack.packb([list(p) for p in job.placement]),
                    job.row,
                    None if job.ending is None else job.ending.value,
                    job.suspended_time,
                    job.requeues,
                    pack_box(job.box),
                    job.suspended_by,
                    job.suspended_at,
                    job.resumed_at,
                    job.id,
                ),
            )
            if cur.rowcount != 1:
                raise StoreError(f"job {job.id} is not in the store")

    def save_wireup(self, job_id: int, kvsname: str, hosts: tuple[int, ...] = ()) -> None:
        """The PMI name of the job's run that is starting and the host of each of its nodes, as its launches
        give them (join the transaction that places the job)."""
        with self._writing():
            cur = self._db.execute(
                "UPDATE jobs SET kvsname = ?, hosts = ? WHERE id = ?",
                (kvsname, ",".join(map(str, hosts)), job_id),
            )
            if cur.rowcount != 1:
                raise StoreError(f"job {job_id} is not in the store")

    def wireups(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        """(PMI name, hosts) of the placed jobs (STARTING or RUNNING) that have a PMI name."""
        rows = self._db.execute(
            f"SELECT id, kvsname, hosts FROM jobs WHERE state IN {PLACED} AND kvsname != ''"  # noqa: S608
        ).fetchall()
        return {
            int(job_id): (str(name), tuple(int(h) for h in str(hosts).split(",") if h))
            for job_id, name, hosts in rows
        }

    def get_job(self, job_id: int) -> Job | None:
        query = f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?"  # noqa: S608 (constant column list)
        row = self._db.execute(query, (job_id,)).fetchone()
        return None if row is None else row_to_job(row)

    def jobs(
        self,
        job_ids: Iterable[int] | None = None,
        *,
        active_only: bool = False,
        newest: int = 0,
        before: int = 0,
    ) -> list[Job]:
        if job_ids is not None:
            found = (self.get_job(i) for i in job_ids)
            return [j for j in found if j is not None]
        where = [f"state IN {UNFINISHED}"] if active_only else []
        if before:
            where.append(f"id < {int(before)}")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        if newest:  # by the primary key, backwards: a page of the newest costs its rows, not the table
            query = f"SELECT {JOB_COLUMNS} FROM jobs{clause} ORDER BY id DESC LIMIT {int(newest)}"  # noqa: S608
            return [row_to_job(r) for r in reversed(self._db.execute(query).fetchall())]
        query = f"SELECT {JOB_COLUMNS} FROM jobs{clause} ORDER BY id"  # noqa: S608 (constants only)
        rows = self._db.execute(query).fetchall()
        return [row_to_job(r) for r in rows]

    def save_usage(self, job_id: int, usage: Usage) -> None:
        times = usage.class_times
        with self._writing():
            self._db.execute(
                "UPDATE jobs SET cpu_user = ?, cpu_system = ?, time_cs = ?, time_f = ?, time_dc = ?"
                " WHERE id = ?",
                (
                    usage.cpu_user, usage.cpu_system, *((None,) * 3 if times is None else
                    (times.get("CS", 0.0), times.get("F", 0.0), times.get("DC", 0.0))), job_id,
                ),
            )  # fmt: skip

    # -- PMI barriers

    def save_barrier(self, job_id: int, seq: int, kvs: dict[str, str]) -> None:
        with self._writing():
            self._db.execute(
                "INSERT INTO barriers (job_id, seq, kvs) VALUES (?, ?, ?) "
                "ON CONFLICT(job_id) DO UPDATE SET seq = excluded.seq, kvs = excluded.kvs",
                (job_id, seq, msgpack.packb(kvs)),
            )

    def barriers(self) -> dict[int, tuple[int, dict[str, str]]]:
        rows = self._db.execute("SELECT job_id, seq, kvs FROM barriers").fetchall()
        return {int(job_id): (int(seq), msgpack.unpackb(kvs)) for job_id, seq, kvs in rows}

    def forget_barrier(self, job_id: int) -> None:
        with self._writing():
            self._db.execute("DELETE FROM barriers WHERE job_id = ?", (job_id,))

    # -- nodes' final reports on jobs still running elsewhere

    def save_node_exits(self, job_id: int, node: str, exits: Iterable[RankExit]) -> None:
        packed = msgpack.packb(
            [[e.rank, e.exit_code, e.signal, e.error, e.cpu_user, e.cpu_system] for e in exits]
        )
        with self._writing():
            self._db.execute(
                "INSERT OR REPLACE INTO node_exits (job_id, node, exits) VALUES (?, ?, ?)",
                (job_id, node, packed),
            )

    def node_exits(self) -> dict[int, dict[str, tuple[RankExit, ...]]]:
        found: dict[int, dict[str, tuple[RankExit, ...]]] = {}
        for job_id, node, packed in self._db.execute("SELECT job_id, node, exits FROM node_exits"):
            exits = tuple(  # (the CPU seconds are absent from an older storm-mm's)
                RankExit(rank=r[0], exit_code=r[1], signal=r[2], error=r[3], cpu_user=r[4], cpu_system=r[5])
                if len(r) >= 6
                else RankExit(rank=r[0], exit_code=r[1], signal=r[2], error=r[3])
                for r in msgpack.unpackb(packed)
            )
            found.setdefault(int(job_id), {})[str(node)] = exits
        return found

    def forget_node_exits(self, job_id: int) -> None:
        with self._writing():
            self._db.execute("DELETE FROM node_exits WHERE job_id = ?", (job_id,))

    # -- FCS class changes

    def add_class_changes(self, changes: Iterable[ClassChange]) -> None:
        with self._writing():
            self._db.executemany(
                "INSERT INTO class_changes (job_id, rank, node, time, old, new, tslots)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(c.job_id, c.rank, c.node, c.time, c.old, c.new, c.tslots) for c in changes],
            )

    def class_changes(self, job_ids: Iterable[int]) -> list[ClassChange]:
        result: list[ClassChange] = []
        for job_id in job_ids:
            rows = self._db.execute(
                "SELECT job_id, rank, node, time, old, new, tslots FROM class_changes"
                " WHERE job_id = ? ORDER BY time",
                (job_id,),
            ).fetchall()
            result.extend(
                ClassChange(job_id=j, rank=r, node=n, time=t, old=o, new=w, tslots=s)
                for j, r, n, t, o, w, s in rows
            )
        return result

    def add_profile(self, job_id: int, entries: Iterable[ProfileEntry]) -> None:
        with self._writing():
            self._db.executemany(
                "INSERT INTO profiles (job_id, rank, node, klass, wall, compute, poll, blocked, stopped,"
                " queued) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job_id,
                        e.rank,
                        e.node,
                        e.klass,
                        e.wall,
                        e.compute,
                        e.poll,
                        e.blocked,
                        e.stopped,
                        e.queued,
                    )
                    for e in entries
                ],
            )

    def profile(self, job_id: int) -> list[ProfileEntry]:
        rows = self._db.execute(
            "SELECT rank, node, klass, wall, compute, poll, blocked, stopped, queued FROM profiles"
            " WHERE job_id = ? ORDER BY rank, klass",
            (job_id,),
        ).fetchall()
        return [
            ProfileEntry(rank=r, node=n, klass=k, wall=w, compute=c, poll=po, blocked=b, stopped=st, queued=q)
            for r, n, k, w, c, po, b, st, q in rows
        ]

    # -- nodes

    def save_node(self, node: NodeRecord) -> None:
        with self._writing():
            self._db.execute(
                "INSERT INTO nodes (name, pes, state, reason, address, last_seen) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET pes = excluded.pes, state = excluded.state, "
                "reason = excluded.reason, address = excluded.address, last_seen = excluded.last_seen",
                (node.name, node.pes, node.state, node.reason, node.address, node.last_seen),
            )

    def nodes(self) -> list[NodeRecord]:
        rows = self._db.execute(
            "SELECT name, pes, state, reason, address, last_seen FROM nodes ORDER BY name"
        ).fetchall()
        return [
            NodeRecord(name=r[0], pes=r[1], state=r[2], reason=r[3], address=r[4], last_seen=r[5])
            for r in rows
        ]
