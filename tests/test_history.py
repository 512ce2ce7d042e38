"""Accounting without a cluster: what a job used (mm/accounting.py), who may see which jobs, the core's
answer to a history request, the store's query (mm/history_db.py) and its plan, and the CLI's times and
fields (tools/cli_history.py). End to end: tests/test_cluster_history.py."""

from __future__ import annotations

import argparse
import datetime
import sqlite3
from contextlib import closing
from pathlib import Path

import msgpack
import pytest

from storm.mm import protocol as p
from storm.mm.accounting import HistoryQuery, NotAllowed, class_seconds, cpu_seconds, history_query, usage
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import ReadHistory, Reply
from storm.mm.history_db import HistoryReader
from storm.mm.jobs import Job, JobSpec, advance
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.states import JobState
from storm.mm.store import Store
from storm.tools import cli_history as ch
from tests.test_store import downgrade_to_version_6

ALICE = Account(1001, 100, "alice")
BOB = Account(1002, 100, "bob")
ROOT = Account(0, 0, "root")
OPERATOR = Account(1003, 100, "olga")


def change(rank: int, time: float, old: str, new: str) -> p.ClassChange:
    return p.ClassChange(job_id=1, rank=rank, node="n1", time=time, old=old, new=new)


# -------------------------------------------------------------------------------------------- usage


def test_cpu_seconds_sum_the_measured_ranks_and_none_is_none() -> None:
    exits = [
        p.RankExit(rank=0, exit_code=0, cpu_user=1.5, cpu_system=0.25),
        p.RankExit(rank=1, exit_code=0, cpu_user=0.5, cpu_system=0.0),
        p.RankExit(rank=2, error="did not start"),
    ]
    assert cpu_seconds(exits) == (2.0, 0.25)
    assert cpu_seconds([p.RankExit(rank=0, exit_code=0)]) == (None, None)


def test_class_seconds_follow_each_ranks_changes_from_cs_clamped_to_the_run() -> None:
    changes = [
        change(0, 12.0, "CS", "DC"),
        change(0, 15.0, "DC", "F"),
        change(1, 5.0, "CS", "DC"),  # before the start (an earlier run's clock): from the start
        change(1, 30.0, "DC", "CS"),  # after the end: changes nothing
        change(7, 12.0, "CS", "F"),  # no such rank
    ]
    times = class_seconds(changes, ranks=2, start=10.0, end=20.0)
    assert times == {"CS": 2.0, "F": 5.0, "DC": 3.0 + 10.0}
    assert sum(times.values()) == pytest.approx(2 * (20.0 - 10.0))


def test_a_job_without_fcs_has_no_class_times_and_one_that_never_started_none_counted() -> None:
    assert usage([], None, 2, 1.0, 2.0).class_times is None
    assert usage([], [], 2, None, 2.0).class_times == {}
    assert usage([], [], 2, 1.0, 3.0).class_times == {"CS": 4.0, "F": 0.0, "DC": 0.0}


# ----------------------------------------------------------------------------------------- visibility


def test_a_user_sees_their_own_jobs_and_is_told_why_not_others() -> None:
    own = history_query(p.JobHistory(), ALICE, (), 100)
    assert (own.uids, own.users) == ((1001,), ())
    named = history_query(p.JobHistory(users=("alice", "1001")), ALICE, (), 100)
    assert (named.uids, named.users) == ((1001,), ())
    with pytest.raises(NotAllowed, match=r"bob.*only root and \[mm\] operators"):
        history_query(p.JobHistory(users=("alice", "bob")), ALICE, (), 100)
    with pytest.raises(NotAllowed, match="every user's jobs"):
        history_query(p.JobHistory(all_users=True), ALICE, (), 100)


def test_root_sees_everyone_by_default_and_an_operator_when_asking() -> None:
    assert history_query(p.JobHistory(), ROOT, (), 100).uids == ()
    assert history_query(p.JobHistory(), OPERATOR, ("olga",), 100).uids == (1003,)
    everyone = history_query(p.JobHistory(all_users=True), OPERATOR, ("olga",), 100)
    assert (everyone.uids, everyone.users) == ((), ())
    some = history_query(p.JobHistory(users=("bob", "1001")), OPERATOR, ("olga",), 100)
    assert (some.uids, some.users) == ((1001,), ("bob",))
    assert history_query(p.JobHistory(limit=500), ROOT, (), 100).limit == 100


def test_the_core_answers_a_history_request_with_a_read_and_refuses_with_a_clear_error() -> None:
    ctl = Controller(MemoryStore(), MMConfig(operators=("olga",)), "e", nonce=seeded_nonces(0))
    ctl.recover(0.0)
    (effect,) = ctl.handle(p.JobHistory(req=7, since=5.0, states=("FAILED",)), 1.0, ALICE)
    assert isinstance(effect, ReadHistory) and effect.req == 7
    assert effect.query == HistoryQuery(uids=(1001,), states=("FAILED",), since=5.0, limit=p.HISTORY_PAGE)
    (refused,) = ctl.handle(p.JobHistory(req=8, users=("bob",)), 1.0, ALICE)
    assert isinstance(refused, Reply) and isinstance(refused.message, p.Error)
    assert refused.message.code == "permission_denied" and refused.message.req == 8


def test_the_core_stores_cpu_time_when_a_job_ends() -> None:
    store = MemoryStore()
    ctl = Controller(store, MMConfig(), "e", nonce=seeded_nonces(0))
    ctl.recover(0.0)
    ctl.handle(p.RegisterNode(node="n1", pes=2, nm_epoch="x"), 0.0, FromNode("n1"))
    submit = p.SubmitJob(ranks=2, argv=("/bin/true",), cwd="/tmp", env={})
    ctl.handle(submit, 1.0, ALICE)
    ctl.schedule(1.0)
    ctl.handle(p.JobLaunched(job_id=1, node="n1", pids={"0": 10, "1": 11}), 2.0, FromNode("n1"))
    exits = (
        p.RankExit(rank=0, exit_code=0, cpu_user=0.75, cpu_system=0.5),
        p.RankExit(rank=1, exit_code=0, cpu_user=0.25, cpu_system=0.0),
    )
    ctl.handle(p.JobNodeDone(job_id=1, node="n1", exits=exits), 3.0, FromNode("n1"))
    assert store.get_job(1).state is JobState.COMPLETED  # type: ignore[union-attr]
    assert store.usages[1].cpu_user == 1.0 and store.usages[1].cpu_system == 0.5
    assert store.usages[1].class_times is None  # batch: no classes


# ---------------------------------------------------------------------------------------------- store


def spec(user: str, uid: int, name: str, ranks: int = 1) -> JobSpec:
    return JobSpec(
        name=name, uid=uid, gid=100, user=user, ranks=ranks, argv=("x",), cwd="/", env={"BIG": "x" * 2000},
        time_limit=None, output="", error="",
    )  # fmt: skip


def ended(store: Store, s: JobSpec, submit: float, end: float, state: JobState = JobState.COMPLETED) -> Job:
    job = store.add_job(s, submit)
    placed = [("n1", pe) for pe in range(s.ranks)]
    job = advance(job, JobState.STARTING, submit + 1, placement=tuple(placed))
    job = advance(job, JobState.RUNNING, submit + 1)
    job = advance(job, state, end, exit_code=0 if state is JobState.COMPLETED else 3)
    store.save_job(job)
    return job


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A store: alice's and bob's jobs ending at 100, 200, ..., one still queued, one running."""
    path = tmp_path / "storm.db"
    store = Store(path, "NORMAL")
    for i in range(1, 9):
        who = (("alice", 1001), ("bob", 1002))[i % 2]
        state = JobState.FAILED if i % 3 == 0 else JobState.COMPLETED
        ended(store, spec(*who, f"j{i}", ranks=1 + i % 2), 100.0 * i - 50, 100.0 * i, state)
    store.add_job(spec("alice", 1001, "queued"), 950.0)  # 9
    running = store.add_job(spec("bob", 1002, "running"), 960.0)  # 10
    store.save_job(advance(running, JobState.STARTING, 961.0, placement=(("n2", 0),)))
    store.close()
    return path


def ids(reader: HistoryReader, **query: object) -> list[int]:
    return [j.id for j in reader.page(HistoryQuery(**query))[0]]  # type: ignore[arg-type]


def test_the_query_filters_by_window_user_state_name_and_ids(filled: Path) -> None:
    reader = HistoryReader(filled)
    try:
        assert ids(reader) == list(range(1, 11))
        # Not ended before 550: jobs ending at 600.. and the unfinished ones.
        assert ids(reader, since=550.0) == [6, 7, 8, 9, 10]
        assert ids(reader, since=550.0, until=900.0) == [6, 7, 8]  # 9 and 10 were submitted after 900
        assert ids(reader, uids=(1001,)) == [2, 4, 6, 8, 9]
        assert ids(reader, users=("bob",), since=550.0) == [7, 10]
        assert ids(reader, uids=(1001,), users=("bob",), since=750.0) == [8, 9, 10]
        assert ids(reader, states=("FAILED",)) == [3, 6]
        assert ids(reader, states=("PENDING", "STARTING")) == [9, 10]
        assert ids(reader, names=("j2", "j5", "nope")) == [2, 5]
        assert ids(reader, job_ids=(5, 3, 42)) == [3, 5]
        entry = reader.page(HistoryQuery(job_ids=(5,)))[0][0]
        assert (entry.user, entry.uid, entry.name, entry.ranks, entry.nodes) == (
            "bob",
            1002,
            "j5",
            2,
            ("n1",),
        )
        assert (entry.start_time, entry.end_time, entry.state) == (451.0, 500.0, "COMPLETED")
        assert reader.page(HistoryQuery(job_ids=(9,)))[0][0].ranks == 1  # queued: the size asked
    finally:
        reader.close()


def test_the_packed_answer_decodes_to_the_typed_page(filled: Path) -> None:
    store = Store(filled)
    changes = [p.ClassChange(job_id=5, rank=0, node="n1", time=460.0, old="CS", new="DC")]
    store.save_usage(5, usage([p.RankExit(rank=0, exit_code=0, cpu_user=0.5)], changes, 2, 451.0, 500.0))
    store.close()
    reader = HistoryReader(filled)
    try:
        for query in (HistoryQuery(), HistoryQuery(limit=4, after=2), HistoryQuery(job_ids=(42,))):
            entries, more = reader.page(query)
            assert p.decode(reader.answer(query, 9)) == p.HistoryPage(req=9, jobs=tuple(entries), more=more)
        assert reader.page(HistoryQuery(job_ids=(5,)))[0][0].class_times["DC"] == 40.0
    finally:
        reader.close()


def test_pages_follow_one_another(filled: Path) -> None:
    reader = HistoryReader(filled)
    try:
        seen, after = [], 0
        while True:
            page, more = reader.page(HistoryQuery(limit=3, after=after))
            seen += [j.id for j in page]
            if not more:
                break
            assert more == page[-1].id
            after = more
        assert seen == list(range(1, 11))
    finally:
        reader.close()


def test_usage_is_stored_and_read_back(filled: Path) -> None:
    store = Store(filled)
    store.save_usage(
        4, usage([p.RankExit(rank=0, exit_code=0, cpu_user=0.5, cpu_system=0.25)], None, 1, 1, 2)
    )
    changes = [p.ClassChange(job_id=5, rank=0, node="n1", time=460.0, old="CS", new="DC")]
    store.save_usage(5, usage([], changes, 2, 451.0, 500.0))
    store.close()
    reader = HistoryReader(filled)
    try:
        four, five = reader.page(HistoryQuery(job_ids=(4, 5)))[0]
        assert (four.cpu_user, four.cpu_system, four.class_times) == (0.5, 0.25, {})
        assert five.cpu_user is None and five.class_times == {"CS": 9.0 + 49.0, "F": 0.0, "DC": 40.0}
    finally:
        reader.close()


def test_the_window_is_answered_from_the_end_time_index(filled: Path) -> None:
    """Without the index (or with a query SQLite walks in order of id), every row of a long history is
    read: the plan must search jobs_end, for the ended jobs and for the unfinished ones."""
    reader = HistoryReader(filled)
    try:
        for query in (
            HistoryQuery(since=550.0),
            HistoryQuery(since=550.0, until=900.0, uids=(1001,), users=("bob",), states=("FAILED",)),
            HistoryQuery(since=550.0, names=("j6",), after=6, limit=2),
        ):
            plan = reader.query_plan(query)
            searches = [step for step in plan if step.startswith("SEARCH")]
            assert searches and all("USING INDEX jobs_end" in s for s in searches), plan
        by_id = reader.query_plan(HistoryQuery(job_ids=(3, 5)))
        assert any("PRIMARY KEY" in step for step in by_id), by_id
    finally:
        reader.close()


def test_a_version_6_store_gets_its_users_names_and_sizes_from_the_specs(tmp_path: Path) -> None:
    path = tmp_path / "storm.db"
    store = Store(path)
    ended(store, spec("carol", 1005, "old", ranks=3), 10.0, 20.0)
    store.close()
    downgrade_to_version_6(path)
    Store(path).close()  # migrated
    with closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT uid, user, name, ranks, cpu_user, time_cs FROM jobs").fetchone()
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert row == (1005, "carol", "old", 3, None, None)
    assert "jobs_end" in indexes


def test_an_old_node_exit_record_still_reads_and_a_new_one_keeps_cpu(tmp_path: Path) -> None:
    store = Store(tmp_path / "storm.db")
    try:
        store.save_node_exits(1, "n1", [p.RankExit(rank=0, exit_code=0, cpu_user=1.0, cpu_system=2.0)])
        with store.transaction():  # as an older storm-mm wrote it: four fields an exit
            store._db.execute(
                "INSERT INTO node_exits (job_id, node, exits) VALUES (2, 'n1', ?)",
                (msgpack.packb([[0, 1, None, "x"]]),),
            )
        exits = store.node_exits()
        assert exits[1]["n1"][0].cpu_system == 2.0
        assert exits[2]["n1"][0] == p.RankExit(rank=0, exit_code=1, error="x")
    finally:
        store.close()


# ------------------------------------------------------------------------------------------------ CLI


NOW = datetime.datetime(2024, 3, 15, 14, 30, 0).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-03-01", datetime.datetime(2024, 3, 1)),
        ("2024-03-01T08:15", datetime.datetime(2024, 3, 1, 8, 15)),
        ("2024-03-01T08:15:30", datetime.datetime(2024, 3, 1, 8, 15, 30)),
        ("03/02", datetime.datetime(2024, 3, 2)),
        ("03/02/23", datetime.datetime(2023, 3, 2)),
        ("0302", datetime.datetime(2024, 3, 2)),
        ("10:05", datetime.datetime(2024, 3, 15, 10, 5)),
        ("midnight", datetime.datetime(2024, 3, 15)),
        ("noon", datetime.datetime(2024, 3, 15, 12)),
        ("yesterday", datetime.datetime(2024, 3, 14)),
        ("now", datetime.datetime(2024, 3, 15, 14, 30)),
        ("now-1hour", datetime.datetime(2024, 3, 15, 13, 30)),
        ("now-2days", datetime.datetime(2024, 3, 13, 14, 30)),
        ("now-90", datetime.datetime(2024, 3, 15, 14, 28, 30)),
        ("now-1week", datetime.datetime(2024, 3, 8, 14, 30)),
        ("NOW+30minutes", datetime.datetime(2024, 3, 15, 15, 0)),
        ("2h", datetime.datetime(2024, 3, 15, 12, 30)),
        ("30m", datetime.datetime(2024, 3, 15, 14, 0)),
    ],
)
def test_times_as_sacct_and_storm_take_them(text: str, expected: datetime.datetime) -> None:
    assert ch.parse_when(text, NOW) == expected.timestamp()


@pytest.mark.parametrize("text", ["2024-13-01", "now-3fortnights", "soon", "25:00", "now-"])
def test_a_bad_time_is_refused_with_the_formats(text: str) -> None:
    with pytest.raises(ch.HistoryUsageError, match=r"invalid time|unknown unit"):
        ch.parse_when(text, NOW)


def test_a_bad_field_lists_the_valid_ones() -> None:
    with pytest.raises(ch.HistoryUsageError, match=r"unknown field 'Bogus'.*JobID, JobName.*TimeDC"):
        ch.parse_format("JobID,Bogus")
    chosen = ch.parse_format("jobid%4,TOTALCPU,timeF")
    assert [(h, w) for h, _, w in chosen] == [("JobID", 4), ("TotalCPU", 0), ("TimeF", 0)]


def entry(**changes: object) -> p.HistoryEntry:
    values: dict[str, object] = {
        "id": 7, "name": "sim", "user": "alice", "uid": 1001, "state": "FAILED", "ranks": 4,
        "nodes": ("n1", "n2"), "submit_time": NOW - 7200, "start_time": NOW - 3700, "end_time": NOW - 100,
        "exit_code": 137, "reason": "rank 0 killed by signal 9", "suspended_time": 600.0,
        "cpu_user": 3661.5, "cpu_system": 12.25, "class_times": {"CS": 1.5, "F": 0.0, "DC": 10.0},
    }  # fmt: skip
    values.update(changes)
    return p.HistoryEntry(**values)  # type: ignore[arg-type]


def test_fields_are_shown_as_sacct_shows_them() -> None:
    job = entry()
    shown = {header: value(job, NOW) for header, value in ch.FIELDS.values()}
    assert shown["Elapsed"] == "00:50:00"  # 3600 s run, 600 s of it suspended
    assert shown["CPUTime"] == "03:20:00"  # elapsed x 4 ranks
    assert shown["TotalCPU"] == "01:01:14"
    assert shown["SystemCPU"] == "00:12.250"
    assert shown["ExitCode"] == "0:9"
    assert shown["NodeList"] == "n1,n2" and shown["NNodes"] == "2"
    assert (shown["TimeCS"], shown["TimeDC"]) == ("00:01.500", "00:10.000")
    pending = entry(
        start_time=None, end_time=None, exit_code=None, cpu_user=None, cpu_system=None, class_times={}
    )
    shown = {header: value(pending, NOW) for header, value in ch.FIELDS.values()}
    assert (shown["Start"], shown["Elapsed"], shown["TotalCPU"], shown["TimeCS"]) == ("Unknown", "", "", "")
    assert ch.exit_code(entry(exit_code=3)) == "3:0"


def options(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "user": None, "allusers": False, "state": None, "since": None, "until": None, "name": None,
        "jobs": None, "limit": None, "csv": False, "noheader": False, "parsable2": False,
    }  # fmt: skip
    values.update(given)
    return argparse.Namespace(**values)


def test_the_request_defaults_to_midnight_unless_jobs_are_named() -> None:
    asked = ch.request(options(state=["failed,timeout", "COMPLETED"], user=["bob,1001"]), NOW)
    assert asked.since == datetime.datetime(2024, 3, 15).timestamp() and asked.until is None
    assert asked.states == ("FAILED", "TIMEOUT", "COMPLETED") and asked.users == ("bob", "1001")
    assert ch.request(options(jobs=["3,4"]), NOW).since is None
    with pytest.raises(ch.HistoryUsageError, match="unknown state"):
        ch.request(options(state=["DONE"]), NOW)
    with pytest.raises(ch.HistoryUsageError, match="before --since"):
        ch.request(options(since="now-1hour", until="now-2hours"), NOW)


def test_an_until_before_midnight_moves_the_default_since_to_its_own_day() -> None:
    """Just after midnight, `--until now-1hour` means yesterday evening (it used to be refused as before the
    default --since, today's midnight)."""
    just_after = datetime.datetime(2024, 3, 15, 0, 20).timestamp()
    asked = ch.request(options(until="now-1hour"), just_after)
    assert asked.until == just_after - 3600
    assert asked.since == datetime.datetime(2024, 3, 14).timestamp()
    assert ch.request(options(until="now-1hour"), NOW).since == datetime.datetime(2024, 3, 15).timestamp()


def test_csv_and_parsable_output() -> None:
    fields = ch.parse_format("JobID,JobName,State")
    jobs = [entry(name="a,b"), entry(id=8, name="c")]
    assert (
        ch.render(jobs, fields, NOW, options(csv=True)) == 'JobID,JobName,State\n7,"a,b",FAILED\n8,c,FAILED'
    )
    assert ch.render(jobs, fields, NOW, options(parsable2=True, noheader=True)) == "7|a,b|FAILED\n8|c|FAILED"
    table = ch.render(jobs, ch.parse_format("JobID%6,State"), NOW, options()).splitlines()
    assert table[0] == "JobID   State" and table[1] == "7       FAILED"
