"""The MM's durable state: one SQLite file in WAL mode.

Every job transition is committed (with ``synchronous=FULL`` by default, so it also survives a power loss)
before anyone is told about it. The MM holds unfinished jobs in memory and reads finished ones from here.
Node records survive restarts so that a restarted MM knows which nodes to wait for.

The schema has a version (``meta.schema_version``); a store written by an older storm-mm is migrated in place,
in one transaction, when it is opened. A store from a newer storm-mm is refused rather than misread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack

from storm.mm.jobs import Job, JobSpec
from storm.mm.protocol import ClassChange, ProfileEntry, RankExit
from storm.mm.states import ACTIVE_STATES, JobState
from storm.mm.storage import NodeRecord, StoreError
from storm.mm.torus import Box

SCHEMA_VERSION = 6


def _sql_states(states: frozenset[JobState]) -> str:
    """An SQL list of job states, in JobState's order: the same text on every start."""
    return "(" + ", ".join(f"'{s}'" for s in JobState if s in states) + ")"


_UNFINISHED = _sql_states(frozenset(s for s in JobState if not s.terminal))  # queued or holding PEs
_PLACED = _sql_states(ACTIVE_STATES)  # holding PEs

# What turns a store of version N into version N + 1 (the schema below is always the newest).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: jobs go back to the queue after a node failure (submit --requeue), and count how often.
    1: ("ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0",),
    # 3: a placed job's PMI name, so that a restarted MM can send a launch a node missed (jobs placed by an
    # older storm-mm have none: a node that missed theirs loses the job, as it did then).
    2: ("ALTER TABLE jobs ADD COLUMN kvsname TEXT NOT NULL DEFAULT ''",),
    # 4: which of a placed job's nodes share a host (its launches tell MPI), for the same reason.
    3: ("ALTER TABLE jobs ADD COLUMN hosts TEXT NOT NULL DEFAULT ''",),
    # 5: on a torus, the box a job holds ('' elsewhere, and for jobs of an older storm-mm).
    4: ("ALTER TABLE jobs ADD COLUMN box TEXT NOT NULL DEFAULT ''",),
    # 6: preemption by suspension: which job suspended a running one, since when, and its last resume (NULL:
    # never, as for every job of an older storm-mm). A moldable job's range, its QOS and priority are in the
    # spec (absent from older specs: a fixed size, normal, 0).
    5: (
        "ALTER TABLE jobs ADD COLUMN suspended_by INTEGER",
        "ALTER TABLE jobs ADD COLUMN suspended_at REAL",
        "ALTER TABLE jobs ADD COLUMN resumed_at REAL",
    ),
}

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- kvsname: the PMI name of the job's current (or last) run. Its launches carry it and MPICH names its shared
-- memory after it; it is random per run, so it is kept for a restarted MM to send a lost launch again.
-- hosts: the host number of each of its nodes, as its launches give them (comma-separated; '': none).
-- box: on a torus, the box it holds, 'x,y,z/a,b,c' (base / shape); '' on a flat network.
-- suspended_by, suspended_at: while preemption holds a running job's ranks stopped, the job that suspended it
-- and since when (NULL otherwise); resumed_at: its last resume.
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    state TEXT NOT NULL,
    spec BLOB NOT NULL,
    submit_time REAL NOT NULL,
    start_time REAL,
    end_time REAL,
    exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    placement BLOB NOT NULL,
    row INTEGER,
    ending TEXT,
    suspended_time REAL NOT NULL DEFAULT 0,
    requeues INTEGER NOT NULL DEFAULT 0,
    kvsname TEXT NOT NULL DEFAULT '',
    hosts TEXT NOT NULL DEFAULT '',
    box TEXT NOT NULL DEFAULT '',
    suspended_by INTEGER,
    suspended_at REAL,
    resumed_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_active ON jobs (state)
    WHERE state IN {_UNFINISHED};
-- The last PMI barrier each running job completed: a node that missed its answer (the MM restarted in
-- between) asks again and gets the same answer.
CREATE TABLE IF NOT EXISTS barriers (
    job_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    kvs BLOB NOT NULL
);
-- FCS's timeline: every class change of every process, as its node reported it.
CREATE TABLE IF NOT EXISTS class_changes (
    job_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    time REAL NOT NULL,
    old TEXT NOT NULL,
    new TEXT NOT NULL,
    tslots INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS class_changes_job ON class_changes (job_id, time);
CREATE TABLE IF NOT EXISTS profiles (
    job_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    klass TEXT NOT NULL,
    wall REAL NOT NULL,
    compute REAL NOT NULL,
    poll REAL NOT NULL,
    blocked REAL NOT NULL,
    stopped REAL NOT NULL,
    queued REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS profiles_job ON profiles (job_id);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    pes INTEGER NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '',
    last_seen REAL NOT NULL
);
-- A node's final report on a job that still runs elsewhere (its ranks' exits), until the job ends: a
-- restarted MM must not take a node that finished its part (and forgot the job) for one that lost it.
CREATE TABLE IF NOT EXISTS node_exits (
    job_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    exits BLOB NOT NULL,
    PRIMARY KEY (job_id, node)
);
"""

_JOB_COLUMNS = (
    "id, state, spec, submit_time, start_time, end_time, exit_code, reason, placement, row, ending, "
    "suspended_time, requeues, box, suspended_by, suspended_at, resumed_at"
)


def _pack_box(box: Box | None) -> str:
    return "" if box is None else "{},{},{}/{},{},{}".format(*box.base, *box.shape)


def _unpack_box(text: str) -> Box | None:
    if not text:
        return None
    base, shape = (tuple(int(v) for v in part.split(",")) for part in text.split("/"))
    return Box((base[0], base[1], base[2]), (shape[0], shape[1], shape[2]))


def _pack_spec(spec: JobSpec) -> bytes:
    packed: bytes = msgpack.packb(
        {
            "name": spec.name,
            "uid": spec.uid,
            "gid": spec.gid,
            "user": spec.user,
            "ranks": spec.ranks,
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "env": spec.env,
            "time_limit": spec.time_limit,
            "output": spec.output,
            "error": spec.error,
            "requeue": spec.requeue,
            "hook": spec.hook,
            "max_ranks": spec.max_ranks,
            "qos": spec.qos,
            "priority": spec.priority,
            "stream": spec.stream,
        }
    )
    return packed


def _unpack_spec(blob: bytes) -> JobSpec:
    d = msgpack.unpackb(
        blob
    )  # fields added later (requeue, hook, ...) are absent from older jobs: defaults hold
    d["argv"] = tuple(d["argv"])
    return JobSpec(**d)


def _row_to_job(row: tuple[object, ...]) -> Job:
    (
        job_id,
        state,
        spec,
        submit,
        start,
        end,
        code,
        reason,
        placement,
        mrow,
        ending,
        suspended,
        requeues,
        box,
        suspended_by,
        suspended_at,
        resumed_at,
    ) = row
    assert isinstance(spec, bytes) and isinstance(placement, bytes)
    return Job(
        id=int(job_id),  # type: ignore[call-overload]
        spec=_unpack_spec(spec),
        state=JobState(str(state)),
        submit_time=float(submit),  # type: ignore[arg-type]
        start_time=None if start is None else float(start),  # type: ignore[arg-type]
        end_time=None if end is None else float(end),  # type: ignore[arg-type]
        exit_code=None if code is None else int(code),  # type: ignore[call-overload]
        reason=str(reason),
        placement=tuple((str(n), int(p)) for n, p in msgpack.unpackb(placement)),
        row=None if mrow is None else int(mrow),  # type: ignore[call-overload]
        ending=None if ending is None else JobState(str(ending)),
        suspended_time=float(suspended),  # type: ignore[arg-type]
        requeues=int(requeues),  # type: ignore[call-overload]
        box=_unpack_box(str(box)),
        suspended_by=None if suspended_by is None else int(suspended_by),  # type: ignore[call-overload]
        suspended_at=None if suspended_at is None else float(suspended_at),  # type: ignore[arg-type]
        resumed_at=None if resumed_at is None else float(resumed_at),  # type: ignore[arg-type]
    )


class Store:
    """The MM's store in SQLite (implements mm/storage.py's Storage)."""

    def __init__(self, path: Path, synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise StoreError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Autocommit mode: transactions are explicit (see `transaction`), so a commit is never implicit.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
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
            self._db.executescript(_SCHEMA)
            version = self.get_meta("schema_version")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a storm job store: {exc}") from None
        if version is None:
            self.set_meta("schema_version", str(SCHEMA_VERSION))
        elif not version.isdigit() or int(version) > SCHEMA_VERSION or int(version) < min(_MIGRATIONS):
            raise StoreError(f"{self.path}: schema version {version}, this storm-mm reads {SCHEMA_VERSION}")
        elif int(version) < SCHEMA_VERSION:
            self._migrate(int(version))

    def _migrate(self, version: int) -> None:
        """Bring an older store up to this version, all steps in one transaction (all or nothing)."""
        try:
            with self._writing():
                for step in range(version, SCHEMA_VERSION):
                    for statement in _MIGRATIONS[step]:
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
                "INSERT INTO jobs (state, spec, submit_time, placement) VALUES (?, ?, ?, ?)",
                (JobState.PENDING.value, _pack_spec(spec), now, msgpack.packb([])),
            )
        job_id = cur.lastrowid
        assert job_id is not None
        return Job(id=job_id, spec=spec, state=JobState.PENDING, submit_time=now)

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
                    _pack_box(job.box),
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
            f"SELECT id, kvsname, hosts FROM jobs WHERE state IN {_PLACED} AND kvsname != ''"  # noqa: S608
        ).fetchall()
        return {
            int(job_id): (str(name), tuple(int(h) for h in str(hosts).split(",") if h))
            for job_id, name, hosts in rows
        }

    def get_job(self, job_id: int) -> Job | None:
        query = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?"  # noqa: S608 (constant column list)
        row = self._db.execute(query, (job_id,)).fetchone()
        return None if row is None else _row_to_job(row)

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
        where = [f"state IN {_UNFINISHED}"] if active_only else []
        if before:
            where.append(f"id < {int(before)}")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        if newest:  # by the primary key, backwards: a page of the newest costs its rows, not the table
            query = f"SELECT {_JOB_COLUMNS} FROM jobs{clause} ORDER BY id DESC LIMIT {int(newest)}"  # noqa: S608
            return [_row_to_job(r) for r in reversed(self._db.execute(query).fetchall())]
        query = f"SELECT {_JOB_COLUMNS} FROM jobs{clause} ORDER BY id"  # noqa: S608 (constants only)
        rows = self._db.execute(query).fetchall()
        return [_row_to_job(r) for r in rows]

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
        packed = msgpack.packb([[e.rank, e.exit_code, e.signal, e.error] for e in exits])
        with self._writing():
            self._db.execute(
                "INSERT OR REPLACE INTO node_exits (job_id, node, exits) VALUES (?, ?, ?)",
                (job_id, node, packed),
            )

    def node_exits(self) -> dict[int, dict[str, tuple[RankExit, ...]]]:
        found: dict[int, dict[str, tuple[RankExit, ...]]] = {}
        for job_id, node, packed in self._db.execute("SELECT job_id, node, exits FROM node_exits"):
            exits = tuple(
                RankExit(rank=rank, exit_code=code, signal=sig, error=error)
                for rank, code, sig, error in msgpack.unpackb(packed)
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
