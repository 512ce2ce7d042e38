"""The SQLite job store, on real files: durability settings, round trips across restarts, transactions."""

from __future__ import annotations

import dataclasses
import gc
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import msgpack
import pytest

from storm.mm.jobs import Job, JobSpec, advance
from storm.mm.protocol import ClassChange, ProfileEntry
from storm.mm.states import JobState
from storm.mm.store import NodeRecord, Store, StoreError
from storm.mm.store_schema import SCHEMA_VERSION
from storm.mm.torus import Box
from tests.helpers import open_fds

Opener = Callable[..., Store]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "storm.db"  # the parent directory does not exist yet


@pytest.fixture
def open_store() -> Iterator[Opener]:
    """Open stores that are all closed at the end of the test, even when it fails."""
    opened: list[Store] = []

    def open_(path: Path, synchronous: str = "FULL") -> Store:
        store = Store(path, synchronous)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def spec(n: int = 1, **changes: object) -> JobSpec:
    values: dict[str, object] = {
        "name": f"job{n}", "uid": 1000 + n, "gid": 100, "user": "alice", "ranks": n, "argv": ("/bin/x", "é"),
        "cwd": "/home/alice", "env": {"PATH": "/bin", "LANG": "C.UTF-8"}, "time_limit": 60.5,
        "output": "/o/%j", "error": "/e/%t",
    }  # fmt: skip
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


def peek(path: Path, query: str) -> list[tuple[object, ...]]:
    """What another process reading the file would see."""
    with closing(sqlite3.connect(path)) as other:
        return other.execute(query).fetchall()


def pragma(store: Store, name: str) -> object:
    return store._db.execute(f"PRAGMA {name}").fetchone()[0]


@pytest.mark.parametrize(("setting", "level"), [("FULL", 2), ("NORMAL", 1), ("EXTRA", 3), ("normal", 1)])
def test_wal_and_synchronous(db: Path, open_store: Opener, setting: str, level: int) -> None:
    store = open_store(db, setting)
    assert pragma(store, "journal_mode") == "wal"
    assert pragma(store, "synchronous") == level
    assert db.exists() and db.parent.is_dir()
    assert peek(db, "PRAGMA journal_mode") == [("wal",)]  # persistent in the file itself


@pytest.mark.parametrize("setting", ["OFF", "", "full; DROP TABLE jobs", "2"])
def test_bad_synchronous_is_refused(db: Path, setting: str) -> None:
    with pytest.raises(StoreError, match="synchronous must be FULL, NORMAL or EXTRA"):
        Store(db, setting)
    assert not db.exists()


def test_add_job_assigns_increasing_ids(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    jobs = [store.add_job(spec(n), now=100.0 + n) for n in range(1, 5)]
    ids = [j.id for j in jobs]
    assert ids == sorted(ids) and len(set(ids)) == 4 and ids[0] >= 1
    assert all(j.state is JobState.PENDING for j in jobs)
    assert jobs[2] == Job(id=ids[2], spec=spec(3), state=JobState.PENDING, submit_time=103.0)
    assert store.jobs() == jobs


def test_ids_are_not_reused_after_a_restart(db: Path, open_store: Opener) -> None:
    first = open_store(db).add_job(spec(), 1.0)
    second = open_store(db).add_job(spec(), 2.0)
    assert second.id > first.id


def test_every_field_survives_a_restart(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    finished = store.add_job(spec(1), 10.0)
    running = store.add_job(spec(2, time_limit=None, env={}, output="", error=""), 11.0)
    pending = store.add_job(spec(3, max_ranks=16, qos="high", priority=-2), 12.0)
    finished = advance(finished, JobState.STARTING, 20.0, placement=(("n1", 0),), row=0)
    finished = advance(finished, JobState.RUNNING, 21.0)
    finished = advance(finished, JobState.FAILED, 30.5, exit_code=137, reason="rank 0 killed by signal 9")
    running = advance(running, JobState.STARTING, 22.0, placement=(("n10", 3), ("n2", 0)), row=2)
    running = advance(running, JobState.RUNNING, 23.0, suspended_by=3, suspended_at=24.0, resumed_at=23.5)
    store.save_job(finished)
    store.save_job(running)
    store.close()

    again = open_store(db)
    assert again.get_job(finished.id) == finished
    assert again.get_job(running.id) == running
    assert again.get_job(pending.id) == pending
    assert again.jobs() == [finished, running, pending]
    loaded = again.get_job(running.id)
    assert loaded is not None
    assert loaded.spec.time_limit is None and loaded.spec.argv == ("/bin/x", "é")
    assert loaded.placement == (("n10", 3), ("n2", 0)) and loaded.row == 2
    assert again.get_meta("schema_version") == str(SCHEMA_VERSION)


def test_active_only_and_by_id(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    a, b, c, d = (store.add_job(spec(n), float(n)) for n in range(1, 5))
    b = advance(b, JobState.STARTING, 5.0, placement=(("n1", 0),), row=0)
    c = advance(advance(c, JobState.STARTING, 5.0), JobState.RUNNING, 6.0)
    d = advance(d, JobState.CANCELLED, 7.0)
    for job in (b, c, d):
        store.save_job(job)
    assert [j.id for j in store.jobs(active_only=True)] == [a.id, b.id, c.id]
    assert store.jobs(active_only=True) == [a, b, c]
    assert [j.id for j in store.jobs()] == [a.id, b.id, c.id, d.id]
    assert store.jobs([d.id, 999, a.id]) == [d, a]
    assert store.jobs([]) == []


def test_unknown_jobs(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    assert store.get_job(1) is None
    ghost = Job(id=7, spec=spec(), state=JobState.PENDING, submit_time=0.0)
    with pytest.raises(StoreError, match="job 7 is not in the store"):
        store.save_job(ghost)
    assert store.jobs() == []
    store.add_job(spec(), 1.0)  # the failed save left no transaction open


def test_nested_transactions_commit_once_at_the_outer_end(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    with store.transaction():
        first = store.add_job(spec(1), 1.0)  # add_job opens its own (nested) transaction
        with store.transaction():
            second = store.add_job(spec(2), 2.0)
        assert peek(db, "SELECT id FROM jobs") == []  # not committed yet, not even the inner part
    assert peek(db, "SELECT id FROM jobs ORDER BY id") == [(first.id,), (second.id,)]
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")] == [
        "BEGIN IMMEDIATE",
        "COMMIT",
    ]


def test_an_exception_rolls_back_everything(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    kept = store.add_job(spec(1), 1.0)
    store.save_node(NodeRecord(name="n1", pes=1, state="UP", reason="", address="", last_seen=1.0))
    with pytest.raises(KeyError), store.transaction():
        store.save_job(advance(kept, JobState.CANCELLED, 2.0))
        lost = store.add_job(spec(2), 2.0)
        with store.transaction():
            store.save_node(NodeRecord(name="n1", pes=9, state="DOWN", reason="x", address="", last_seen=2.0))
            store.set_meta("k", "v")
            raise KeyError("boom")
    assert peek(db, "SELECT id, state FROM jobs") == [(kept.id, "PENDING")]
    assert peek(db, "SELECT name, pes, state FROM nodes") == [("n1", 1, "UP")]
    assert store.get_job(lost.id) is None and store.get_meta("k") is None
    # The store is usable afterwards and commits on its own again.
    again = store.add_job(spec(3), 3.0)
    assert peek(db, "SELECT id FROM jobs ORDER BY id") == [(kept.id,), (again.id,)]


def test_a_failed_savepoint_undoes_only_its_own_writes_in_a_group_commit(
    db: Path, open_store: Opener
) -> None:
    """storm-mm's group commit: several stimuli in one transaction, each in a savepoint; one that raises
    leaves nothing, the others are committed together, once."""
    store = open_store(db)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    with store.transaction():
        with store.savepoint():
            pass  # a stimulus that writes nothing costs no statement
        with store.savepoint():
            first = store.add_job(spec(1), 1.0)
        with pytest.raises(KeyError), store.savepoint(), store.transaction():
            store.add_job(spec(2), 2.0)
            store.set_meta("k", "v")
            raise KeyError("boom")
        with store.savepoint():
            third = store.add_job(spec(3), 3.0)
        assert peek(db, "SELECT id FROM jobs") == []  # nothing is visible before the one commit
    assert peek(db, "SELECT id FROM jobs ORDER BY id") == [(first.id,), (third.id,)]
    assert store.get_meta("k") is None
    assert statements.count("COMMIT") == 1 and statements.count("BEGIN IMMEDIATE") == 1
    # The first writer began the transaction: it needs no savepoint of its own.
    assert statements.count("SAVEPOINT stimulus") == 2 and statements.count("ROLLBACK TO stimulus") == 1
    # A first writer that fails: its transaction is rolled back whole, the store usable again.
    with store.transaction():
        with pytest.raises(KeyError), store.savepoint():
            store.add_job(spec(4), 4.0)
            raise KeyError("boom")
        with store.savepoint():
            fifth = store.add_job(spec(5), 5.0)
    assert peek(db, "SELECT id FROM jobs ORDER BY id") == [(first.id,), (third.id,), (fifth.id,)]


def test_nodes_round_trip_and_upsert(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    assert store.nodes() == []
    n10 = NodeRecord(name="n10", pes=4, state="UP", reason="", address="10.0.0.10:1", last_seen=5.5)
    n2 = NodeRecord(name="n2", pes=2, state="DOWN", reason="no report for 11.0 s", address="", last_seen=3.0)
    store.save_node(n10)
    store.save_node(n2)
    assert store.nodes() == [n10, n2]  # by name
    n10b = NodeRecord(name="n10", pes=8, state="DOWN", reason="gone", address="a", last_seen=9.0)
    store.save_node(n10b)
    store.close()
    assert open_store(db).nodes() == [n10b, n2]
    assert peek(db, "SELECT count(*) FROM nodes") == [(2,)]


def refusal(db: Path) -> str:
    """The message of the StoreError that refuses to open ``db``."""
    with pytest.raises(StoreError) as info:
        Store(db)
    text = str(info.value)
    del info
    gc.collect()  # the refused store's connection is only closed by the collector (see the next test)
    return text


def test_schema_version_mismatch(db: Path, open_store: Opener) -> None:
    open_store(db).close()
    with closing(sqlite3.connect(db)) as other:
        other.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        other.commit()
    assert refusal(db) == f"{db}: schema version 99, this storm-mm reads {SCHEMA_VERSION}"


def test_a_refused_store_closes_its_files(db: Path) -> None:
    first = Store(db)
    first.set_meta("schema_version", "99")
    # Closed first: SQLite keeps an fd open while another connection of the process locks the same file.
    first.close()
    before = open_fds()
    with pytest.raises(StoreError) as info:
        Store(db)
    leaked = open_fds() - before
    del info
    gc.collect()  # sqlite3 connections sit in a reference cycle: without close() only gc frees them
    assert leaked == set()


def test_meta(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    assert store.get_meta("absent") is None
    store.set_meta("epoch", "a")
    store.set_meta("epoch", "b")
    assert store.get_meta("epoch") == "b"
    assert peek(db, "SELECT value FROM meta WHERE key = 'epoch'") == [("b",)]


def test_class_changes_survive_a_restart_in_time_order_per_job(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    late = ClassChange(job_id=1, rank=0, node="n1", time=20.0, old="F", new="DC", tslots=45)
    early = ClassChange(job_id=1, rank=1, node="n2", time=10.0, old="CS", new="F", tslots=20)
    other = ClassChange(job_id=2, rank=0, node="n1", time=15.0, old="CS", new="DC", tslots=21)
    store.add_class_changes([late, other])
    store.add_class_changes([early])
    store.close()
    again = open_store(db)
    assert again.class_changes([1]) == [early, late]
    assert again.class_changes([2, 1]) == [other, early, late]
    assert again.class_changes([3]) == []


def test_a_jobs_profile_survives_a_restart(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    cs = ProfileEntry(rank=0, node="n1", klass="CS", wall=3.0, compute=1.0, poll=0.5, blocked=0.0,
                      stopped=1.5, queued=0.0)  # fmt: skip
    dc = dataclasses.replace(cs, klass="DC", rank=1, node="n2", blocked=0.25)
    store.add_profile(4, [dc])
    store.add_profile(4, [cs])
    store.add_profile(5, [cs])
    store.close()
    again = open_store(db)
    assert again.profile(4) == [cs, dc]  # by rank, then class
    assert again.profile(6) == []


def test_requeue_fields_survive_a_restart(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    job = store.add_job(spec(2, requeue=True), 1.0)
    job = dataclasses.replace(job, requeues=3, reason="requeued 3/5 after node n1 DOWN")
    store.save_job(job)
    store.close()
    again = open_store(db).get_job(job.id)
    assert again == job and again.spec.requeue and again.requeues == 3


def placed(job: Job, node: str = "n1") -> Job:
    return advance(job, JobState.STARTING, 2.0, placement=((node, 0),), row=0)


def test_pmi_names_and_hosts_of_placed_jobs_survive_a_restart(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    pending, starting, running, finished = (store.add_job(spec(n), 1.0) for n in (1, 2, 3, 4))
    starting = placed(starting, "n1")
    running = advance(placed(running, "n2"), JobState.RUNNING, 3.0)
    finished = advance(placed(finished, "n3"), JobState.COMPLETED, 4.0)
    with store.transaction():
        for job, name, hosts in (
            (starting, "storm_2_ab", (0, 0, 1)),
            (running, "storm_3_cd", ()),
            (finished, "storm_4_ef", (0,)),
        ):
            store.save_job(job)
            store.save_wireup(job.id, name, hosts)
    with pytest.raises(StoreError, match="job 99 is not in the store"):
        store.save_wireup(99, "storm_99_00")
    store.close()
    again = open_store(db)
    assert again.wireups() == {starting.id: ("storm_2_ab", (0, 0, 1)), running.id: ("storm_3_cd", ())}
    assert again.get_job(pending.id) == pending and again.get_job(running.id) == running
    again.save_wireup(starting.id, "storm_2_12", (0, 1, 1))  # a requeued job's next run: its own
    assert again.wireups()[starting.id] == ("storm_2_12", (0, 1, 1))


def downgrade_to_version_7(db: Path) -> None:
    """What storm-mm wrote before job arrays and dependencies: no array columns (nor their index), no array
    nor dependency in specs."""
    with closing(sqlite3.connect(db)) as other:
        other.execute("DROP INDEX jobs_array")
        for column in ("array_id", "array_task"):
            other.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        for job_id, blob in other.execute("SELECT id, spec FROM jobs").fetchall():
            old = msgpack.unpackb(blob)
            del old["array"], old["dependency"]
            other.execute("UPDATE jobs SET spec = ? WHERE id = ?", (msgpack.packb(old), job_id))
        other.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
        other.commit()


def downgrade_to_version_6(db: Path) -> None:
    """What storm-mm wrote before accounting: no user, name, size nor usage columns, no index on end_time."""
    downgrade_to_version_7(db)
    with closing(sqlite3.connect(db)) as other:
        other.execute("DROP INDEX jobs_end")
        for column in ACCOUNTING_COLUMNS:
            other.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        other.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
        other.commit()


ACCOUNTING_COLUMNS = (
    *("uid", "user", "name", "ranks"),
    *("cpu_user", "cpu_system", "time_cs", "time_f", "time_dc"),
)


def test_a_version_7_store_is_migrated_in_place_and_takes_arrays(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    older = store.add_job(spec(2), 1.0)
    store.close()
    downgrade_to_version_7(db)
    migrated = open_store(db)
    assert migrated.get_meta("schema_version") == str(SCHEMA_VERSION) == "8"
    assert migrated.jobs() == [older]  # outside arrays, without a dependency: as the older MM ran it
    array = dataclasses.replace(spec(1), array="0-2,7%2", dependency=f"afterok:{older.id}")
    tasks = migrated.add_array(array, (0, 1, 2, 7), 2.0)
    assert [(j.id, j.array_id, j.array_task) for j in tasks] == [
        (older.id + 1 + i, older.id + 1, task) for i, task in enumerate((0, 1, 2, 7))
    ]
    migrated.close()
    again = open_store(db)
    assert again.array_tasks(older.id + 1) == tasks and again.array_tasks(older.id) == []
    assert again.get_job(tasks[3].id) == tasks[3] and tasks[3].spec.dependency == f"afterok:{older.id}"
    plan = again._db.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE array_id = ? ORDER BY array_task", (tasks[0].id,)
    ).fetchall()
    assert "jobs_array" in str(plan)  # an array's tasks are read by the index, not by a scan


def downgrade_to_version_5(db: Path) -> None:
    """What storm-mm wrote before preemption: no suspension columns, no range, QOS nor priority in specs."""
    downgrade_to_version_6(db)
    with closing(sqlite3.connect(db)) as other:
        for column in ("suspended_by", "suspended_at", "resumed_at"):
            other.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        for job_id, blob in other.execute("SELECT id, spec FROM jobs").fetchall():
            old = msgpack.unpackb(blob)
            del old["max_ranks"], old["qos"], old["priority"]
            other.execute("UPDATE jobs SET spec = ? WHERE id = ?", (msgpack.packb(old), job_id))
        other.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
        other.commit()


def test_a_version_5_store_is_migrated_in_place_and_keeps_a_suspension(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    running = advance(placed(store.add_job(spec(2), 1.0)), JobState.RUNNING, 2.0)
    store.save_job(running)
    store.close()
    downgrade_to_version_5(db)
    migrated = open_store(db)
    assert migrated.get_meta("schema_version") == str(SCHEMA_VERSION) == "8"
    assert migrated.jobs() == [running]  # never suspended, a fixed size, normal QOS: as the older MM ran it
    suspended = dataclasses.replace(running, suspended_by=9, suspended_at=3.5, reason="Suspended by job 9")
    migrated.save_job(suspended)
    moldable = migrated.add_job(spec(3, max_ranks=8, qos="high", priority=10), 4.0)
    migrated.close()
    again = open_store(db)
    assert again.get_job(running.id) == suspended and again.get_job(moldable.id) == moldable
    resumed = dataclasses.replace(suspended, suspended_by=None, suspended_at=None, resumed_at=6.0)
    again.save_job(resumed)
    assert again.get_job(running.id) == resumed


def downgrade_to_version_4(db: Path) -> None:
    """What storm-mm wrote before it knew of tori: no box column."""
    downgrade_to_version_5(db)
    with closing(sqlite3.connect(db)) as other:
        other.execute("ALTER TABLE jobs DROP COLUMN box")
        other.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
        other.commit()


def test_a_version_4_store_is_migrated_in_place_and_a_box_is_kept(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    flat = placed(store.add_job(spec(1), 1.0))
    store.save_job(flat)
    store.close()
    downgrade_to_version_4(db)
    migrated = open_store(db)
    assert migrated.get_meta("schema_version") == str(SCHEMA_VERSION) == "8"
    assert migrated.jobs() == [flat]  # placed by the older storm-mm: no box
    boxed = dataclasses.replace(flat, box=Box((3, 0, 7), (2, 4, 1)))
    migrated.save_job(boxed)
    migrated.close()
    assert open_store(db).get_job(flat.id) == boxed


def downgrade_to_version_3(db: Path) -> None:
    """What storm-mm wrote before it knew which nodes share a host."""
    downgrade_to_version_4(db)
    with closing(sqlite3.connect(db)) as other:
        other.execute("ALTER TABLE jobs DROP COLUMN hosts")
        other.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
        other.commit()


def test_a_version_3_store_is_migrated_in_place(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    starting = placed(store.add_job(spec(1), 1.0))
    store.save_job(starting)
    store.save_wireup(starting.id, "storm_1_ab", (0,))
    store.close()
    downgrade_to_version_3(db)
    migrated = open_store(db)
    assert migrated.get_meta("schema_version") == str(SCHEMA_VERSION) == "8"
    assert migrated.wireups() == {starting.id: ("storm_1_ab", ())}  # every node a host of its own, as then
    migrated.save_wireup(starting.id, "storm_1_cd", (0, 0))
    assert migrated.wireups() == {starting.id: ("storm_1_cd", (0, 0))}


def downgrade_to_version_2(db: Path) -> None:
    """What storm-mm wrote before it kept a placed job's PMI name."""
    downgrade_to_version_3(db)
    with closing(sqlite3.connect(db)) as other:
        other.execute("ALTER TABLE jobs DROP COLUMN kvsname")
        other.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        other.commit()


def test_a_version_2_store_is_migrated_in_place(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    queued = store.add_job(spec(1), 1.0)
    starting = placed(store.add_job(spec(2), 1.0))
    store.save_job(starting)
    store.save_wireup(starting.id, "storm_2_ab")
    store.close()
    downgrade_to_version_2(db)
    assert "kvsname" not in {row[1] for row in peek(db, "PRAGMA table_info(jobs)")}
    migrated = open_store(db)
    assert migrated.get_meta("schema_version") == str(SCHEMA_VERSION) == "8"
    assert migrated.jobs() == [queued, starting]
    assert migrated.wireups() == {}  # placed by the older storm-mm: its name was never kept
    migrated.save_wireup(starting.id, "storm_2_cd")
    assert peek(db, "SELECT id, kvsname FROM jobs ORDER BY id") == [
        (queued.id, ""),
        (starting.id, "storm_2_cd"),
    ]


def downgrade_to_version_1(db: Path) -> None:
    """What storm-mm wrote before jobs could be requeued: no requeues column, no flag in the specs."""
    downgrade_to_version_2(db)
    with closing(sqlite3.connect(db)) as other:
        other.execute("ALTER TABLE jobs DROP COLUMN requeues")
        for job_id, blob in other.execute("SELECT id, spec FROM jobs").fetchall():
            old = msgpack.unpackb(blob)
            del old["requeue"], old["hook"]  # the hook flag came later still, with no schema change
            other.execute("UPDATE jobs SET spec = ? WHERE id = ?", (msgpack.packb(old), job_id))
        other.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        other.commit()


def test_a_version_1_store_is_migrated_in_place(db: Path, open_store: Opener) -> None:
    store = open_store(db)
    old = store.add_job(spec(1), 1.0)
    store.close()
    downgrade_to_version_1(db)
    assert peek(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [("1",)]
    migrated = open_store(db)
    assert migrated.get_meta("schema_version") == str(SCHEMA_VERSION) == "8"
    assert migrated.get_job(old.id) == old  # not a --requeue job, never requeued
    job = migrated.add_job(spec(2, requeue=True), 2.0)
    migrated.save_job(dataclasses.replace(job, requeues=1))
    assert peek(db, "SELECT id, requeues FROM jobs ORDER BY id") == [(old.id, 0), (job.id, 1)]


def test_a_failed_migration_changes_nothing(db: Path) -> None:
    Store(db).close()
    with closing(sqlite3.connect(db)) as other:  # version 1 by its label, yet the column is there
        other.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        other.commit()
    assert refusal(db).startswith(
        f"{db}: cannot migrate from schema version 1 to {SCHEMA_VERSION}: duplicate column name"
    )
    assert peek(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [("1",)]
