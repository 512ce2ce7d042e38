"""The controller with moldable jobs, qualities of service and preemption by suspension, driven directly: time
passed in, no sockets (mm/core.py, mm/runs.py over mm/sizing.py and mm/suspension.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Rejected
from storm.mm.memory_store import MemoryStore
from storm.mm.storage import Storage
from storm.mm.store import Store
from tests.test_core import T0, Core, S, done, kills, launched, launches, reg, stored, take

QOS = {"normal": 0, "mid": 5, "high": 10}


def cluster(store: Storage, nodes: int = 1, pes: int = 2, policy: str = "batch", **mm: object) -> Core:
    """Nodes n1, n2, ... of ``pes`` PEs; preemption by suspension after a minute's run, three QOS."""
    settings: dict[str, object] = {
        "node_timeout": 1000.0, "preemption": "suspend", "preempt_min_run": 60.0, "qos": QOS,
        "qos_users": {"high": ["alice"]}, "mpl": 2 if policy == "gang" else 1,
    }  # fmt: skip
    settings.update(mm)
    ctl = Core(store, MMConfig(**settings), T0, "mm-1", policy=policy)  # type: ignore[arg-type]
    for i in range(nodes):
        reg(ctl, f"n{i + 1}", pes=pes)
    return ctl


def submit(
    ctl: Core, ranks: int, now: float, *, max_ranks: int = 0, qos: str = "", limit: float | None = None,
    user: str = "alice", uid: int = 1000,
) -> int:  # fmt: skip
    msg = p.SubmitJob(
        ranks=ranks, max_ranks=max_ranks, qos=qos, time_limit=limit, argv=("/bin/app",), cwd="/home/alice",
        env={},
    )  # fmt: skip
    reply = ctl.ask(msg, now, uid, user)
    if isinstance(reply, p.Error):
        raise Rejected(reply.code, reply.text)
    assert isinstance(reply, p.JobSubmitted)
    return reply.job_id


def run(ctl: Core, ranks: int, now: float, **kw: object) -> int:
    """Submit a job that starts at once and let its nodes say it runs."""
    job_id = submit(ctl, ranks, now, **kw)  # type: ignore[arg-type]
    launched(ctl, job_id, *ctl.runs.active[job_id].nodes, now=now)
    return job_id


def info(ctl: Core, job_id: int, now: float) -> p.JobInfo:
    (found,) = ctl.job_infos((job_id,), now=now)
    return found


def suspends(out: list[tuple[str, p.Message]]) -> list[tuple[str, int, int]]:
    return [(n, m.job_id, m.by) for n, m in out if isinstance(m, p.SuspendJob)]


def resumes(out: list[tuple[str, p.Message]]) -> list[tuple[str, int, int]]:
    return [(n, m.job_id, m.row) for n, m in out if isinstance(m, p.ResumeJob)]


def finish(ctl: Core, job_id: int, now: float) -> None:
    for node in ctl.runs.active[job_id].nodes:
        done(ctl, job_id, node, now)


# ---------------------------------------------------------------------------------------------- moldable


def test_a_moldable_job_is_launched_at_the_size_it_got_and_a_restarted_mm_keeps_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "storm.db")
    ctl = cluster(store, nodes=2)
    job_id = submit(ctl, 1, T0, max_ranks=16)
    sent = launches(take(ctl))
    assert {n: (m.size, m.ranks_per_node, len(m.slots)) for n, m in sent.items()} == {
        "n1": (4, (2, 2), 2),
        "n2": (4, (2, 2), 2),
    }
    shown = info(ctl, job_id, T0)
    assert (shown.ranks, shown.min_ranks, shown.max_ranks, shown.qos) == (4, 1, 16, "normal")
    again = Core(store, ctl.config, T0 + 1, "mm-2")
    reg(again, "n1", pes=2, nm="e2")  # its NM restarted too and lost the launch: sent again, same size
    assert launches(take(again))["n1"].size == 4 and stored(store, job_id).ranks == 4
    store.close()


def test_a_moldable_job_gets_fewer_ranks_behind_a_long_queue() -> None:
    ctl = cluster(MemoryStore(), nodes=2)
    blocker = run(ctl, 4, T0)
    moldable = submit(ctl, 1, T0 + 1, max_ranks=4)
    rigid = [submit(ctl, 1, T0 + 1) for _ in range(3)]
    take(ctl)
    finish(ctl, blocker, T0 + 2)  # one pass sees the whole queue: minima 1 + 1 + 1 + 1 fill the 4 PEs
    sizes = {m.job_id: m.size for _, m in take(ctl) if isinstance(m, p.LaunchJob)}
    assert sizes == {moldable: 1, **dict.fromkeys(rigid, 1)}


def test_a_moldable_job_is_refused_on_a_torus_and_a_minimum_wider_than_the_cluster_anywhere() -> None:
    coordinates = {"n1": [0, 0, 0], "n2": [1, 0, 0]}
    torus = cluster(MemoryStore(), nodes=2, topology="torus 2x1x1", coordinates=coordinates, preemption="off")
    with pytest.raises(Rejected, match=r"a moldable job \(-n 1-2\) cannot run on a torus") as refused:
        submit(torus, 1, T0, max_ranks=2)
    assert refused.value.code == "not_supported"
    assert submit(torus, 2, T0) > 0  # a fixed size is fine
    flat = cluster(MemoryStore())
    with pytest.raises(Rejected, match="3 ranks requested, but the cluster has only 2 PEs"):
        submit(flat, 3, T0, max_ranks=8)
    assert (
        stored(flat.store, submit(flat, 1, T0, max_ranks=800)).spec.max_ranks == 800
    )  # capped by what is free


# ---------------------------------------------------------------------------------------------- QOS


def test_a_qos_must_exist_and_be_open_to_the_caller() -> None:
    ctl = cluster(MemoryStore(), nodes=1, operators=["ops"])
    with pytest.raises(
        Rejected, match=r"no QOS 'urgent' on this cluster \(\[mm\] qos has high, mid, normal\)"
    ):
        submit(ctl, 1, T0, qos="urgent")
    with pytest.raises(
        Rejected, match=r"QOS 'high' is not open to bob \(\[mm\] qos_users allows alice\)"
    ) as no:
        submit(ctl, 1, T0, qos="high", user="bob", uid=1001)
    assert no.value.code == "bad_qos" and ctl.store.jobs() == []
    for user, uid in (("alice", 1000), ("ops", 1002), ("root", 0)):
        job = stored(ctl.store, submit(ctl, 1, T0, qos="high", user=user, uid=uid))
        assert (job.spec.qos, job.spec.priority) == ("high", 10)
    mid = info(ctl, submit(ctl, 1, T0, qos="mid", user="bob", uid=1001), T0)  # not listed: open to all
    assert (mid.qos, mid.priority) == ("mid", 5)
    assert info(ctl, submit(ctl, 1, T0, qos="normal"), T0).qos == "normal"


# ---------------------------------------------------------------------------------------------- preemption


def test_a_high_priority_job_suspends_a_low_one_after_its_minimum_run_and_the_suspension_is_not_charged(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "storm.db")
    ctl = cluster(store)
    low = run(ctl, 2, T0, limit=100.0)
    take(ctl)
    high = submit(ctl, 2, T0 + 10, qos="high")
    waiting = info(ctl, high, T0 + 10)
    assert waiting.state == "PENDING"
    assert waiting.reason == f"Resources; may suspend job(s) {low} in 50 s (their minimum run time)"
    ctl.tick(T0 + 59)
    assert take(ctl) == []
    ctl.tick(T0 + 61)
    sent = take(ctl)
    assert sent[0] == ("n1", p.SuspendJob(job_id=low, by=high))  # stopped before the new ranks start
    assert set(launches(sent[1:])) == {"n1"}
    suspended = stored(store, low)
    assert (suspended.state, suspended.suspended_by, suspended.suspended_at) == (S.RUNNING, high, T0 + 61)
    shown = info(ctl, low, T0 + 70)
    assert shown.suspended_by == high and shown.reason == f"Suspended by job {high} (QOS high, priority 10)"
    assert shown.suspended_time == 9.0
    launched(ctl, high, "n1", now=T0 + 62)
    ctl.tick(T0 + 150)  # 150 s since it started, but only 61 of them running: within its 100 s
    assert kills(take(ctl)) == set() and stored(store, low).state is S.RUNNING
    finish(ctl, high, T0 + 200)
    assert resumes(take(ctl)) == [("n1", low, 0)]
    back = stored(store, low)
    assert (back.suspended_by, back.suspended_at, back.resumed_at, back.suspended_time) == (
        None, None, T0 + 200, 139.0,
    )  # fmt: skip
    assert back.reason == "" and info(ctl, low, T0 + 201).suspended_by is None
    ctl.tick(T0 + 238)  # 61 + 38 = 99 s run
    assert kills(take(ctl)) == set()
    ctl.tick(T0 + 240.5)  # 101.5 s run: now the limit is reached
    assert kills(take(ctl)) == {("n1", low)}
    store.close()


@pytest.mark.parametrize(
    ("settings", "qos", "reason"),
    [
        ({}, "mid", None),  # mid > normal: it may
        ({}, "normal", "Resources"),  # the same priority never suspends
        ({"preemption": "off"}, "high", "Resources"),
        ({"preempt_max_jobs": 1}, "high", "Resources"),  # no PE may hold a second job's processes
    ],
)
def test_only_a_higher_priority_suspends_and_only_when_preemption_and_the_process_cap_allow(
    settings: dict[str, object], qos: str, reason: str | None
) -> None:
    ctl = cluster(MemoryStore(), **settings)
    low = run(ctl, 2, T0)
    other = submit(ctl, 1, T0 + 1, qos=qos, user="root", uid=0)
    ctl.tick(T0 + 120)
    job = stored(ctl.store, low)
    if reason is None:
        assert job.suspended_by == other and stored(ctl.store, other).state is S.STARTING
    else:
        assert job.suspended_by is None and info(ctl, other, T0 + 120).reason == reason


def test_the_minimum_run_counts_from_the_last_resume() -> None:
    ctl = cluster(MemoryStore())
    low = run(ctl, 2, T0)
    first = submit(ctl, 2, T0 + 61, qos="high")
    launched(ctl, first, "n1", now=T0 + 61)
    finish(ctl, first, T0 + 100)  # low resumes at T0 + 100
    second = submit(ctl, 2, T0 + 101, qos="high")
    ctl.tick(T0 + 159)
    assert stored(ctl.store, low).suspended_by is None
    assert info(ctl, second, T0 + 159).reason.endswith(
        f"may suspend job(s) {low} in 1 s (their minimum run time)"
    )
    ctl.tick(T0 + 160)
    assert stored(ctl.store, low).suspended_by == second


def test_a_suspension_survives_an_mm_restart_and_the_nodes_hear_it_again(tmp_path: Path) -> None:
    store = Store(tmp_path / "storm.db")
    ctl = cluster(store)
    low = run(ctl, 2, T0)
    high = submit(ctl, 2, T0 + 61, qos="high")
    launched(ctl, high, "n1", now=T0 + 62)
    again = Core(store, ctl.config, T0 + 70, "mm-2")
    registered = reg(again, "n1", pes=2, jobs=(low, high), now=T0 + 71)
    assert registered.suspended == (low,) and registered.rows == {str(low): 0, str(high): 0}
    assert again.runs.matrix.placement_of(low) is None and low in again.runs.state.suspended
    assert info(again, low, T0 + 80).suspended_time == 19.0
    again.tick(T0 + 90)
    assert take(again) == []  # nothing to resume while its PEs run the job that suspended it
    finish(again, high, T0 + 100)
    assert resumes(take(again)) == [("n1", low, 0)]
    assert stored(store, low).suspended_time == 39.0
    store.close()


def test_node_status_makes_up_for_a_lost_suspend_or_resume() -> None:
    ctl = cluster(MemoryStore())
    low = run(ctl, 2, T0)
    high = submit(ctl, 2, T0 + 61, qos="high")
    launched(ctl, high, "n1", now=T0 + 61)
    take(ctl)

    def status(suspended: tuple[int, ...], now: float) -> list[tuple[str, p.Message]]:
        msg = p.NodeStatus(
            node="n1", nm_epoch="n1-e1", mm_epoch="mm-1", jobs=(low, high), launched=(low, high),
            suspended=suspended,
        )  # fmt: skip
        ctl.node_status(msg, now)
        return take(ctl)

    assert status((), T0 + 62) == [("n1", p.SuspendJob(job_id=low, by=high))]
    assert status((low,), T0 + 63) == []
    finish(ctl, high, T0 + 70)
    assert resumes(take(ctl)) == [("n1", low, 0)]
    msg = p.NodeStatus(
        node="n1", nm_epoch="n1-e1", mm_epoch="mm-1", jobs=(low,), launched=(low,), suspended=(low,)
    )  # the NM restarted before the resume reached it, and its record says suspended
    ctl.node_status(msg, T0 + 71)
    assert take(ctl) == [("n1", p.ResumeJob(job_id=low, row=0))]


def test_a_cancelled_suspended_job_ends_with_its_suspension_counted() -> None:
    ctl = cluster(MemoryStore())
    low = run(ctl, 2, T0)
    high = submit(ctl, 2, T0 + 61, qos="high")
    take(ctl)
    assert ctl.cancel((low,), 1000, "alice", T0 + 80) == {str(low): "cancelling"}
    assert kills(take(ctl)) == {("n1", low)}
    ctl.tick(T0 + 85)
    assert resumes(take(ctl)) == []  # its PEs still run the job that suspended it: its ranks die there
    done(ctl, low, "n1", T0 + 90, p.RankExit(rank=0, signal=15), p.RankExit(rank=1, signal=15))
    ended = stored(ctl.store, low)
    assert (ended.state, ended.suspended_time, ended.suspended_by) == (S.CANCELLED, 29.0, None)
    assert stored(ctl.store, high).state is S.STARTING


def test_a_suspended_job_suspends_a_lower_one_that_took_its_pes_to_come_back() -> None:
    """PREEMPT's rule 1: mid (priority 5) is suspended by a one-rank high job; a normal job starts on the PE
    high did not need; when high ends, mid takes its PEs back from it once it has run its minimum."""
    ctl = cluster(MemoryStore())
    mid = run(ctl, 2, T0, qos="mid")
    high = submit(ctl, 1, T0 + 61, qos="high")
    assert [(j, b) for _, j, b in suspends(take(ctl))] == [(mid, high)]
    launched(ctl, high, "n1", now=T0 + 61)
    normal = run(ctl, 1, T0 + 62)
    assert {pe for _, pe in stored(ctl.store, normal).placement} != {
        pe for _, pe in stored(ctl.store, high).placement
    }
    finish(ctl, high, T0 + 70)
    assert resumes(take(ctl)) == []  # one of its PEs is the normal job's
    assert info(ctl, mid, T0 + 70).reason == f"Suspended by job {high} (QOS high, priority 10)"
    ctl.tick(T0 + 122)  # the normal job has run its minute
    sent = take(ctl)
    assert suspends(sent) == [("n1", normal, mid)] and resumes(sent) == [("n1", mid, 0)]
    finish(ctl, mid, T0 + 130)
    assert resumes(take(ctl)) == [("n1", normal, 0)]


def test_a_starting_job_is_never_suspended() -> None:
    ctl = cluster(MemoryStore())
    starting = submit(ctl, 2, T0)  # its nodes never say its ranks started
    high = submit(ctl, 2, T0 + 1, qos="high")
    ctl.tick(T0 + 200)
    assert stored(ctl.store, starting).suspended_by is None and stored(ctl.store, high).state is S.PENDING
    assert info(ctl, high, T0 + 200).reason == "Resources"


def test_under_gang_scheduling_a_suspended_job_leaves_its_row_and_heartbeats_skip_it() -> None:
    ctl = cluster(MemoryStore(), policy="gang", slice=1.0)
    first, second = run(ctl, 2, T0), run(ctl, 2, T0)
    assert {j: ctl.runs.matrix.placement_of(j).row for j in (first, second)} == {first: 0, second: 1}  # type: ignore[union-attr]
    for i in range(61):
        ctl.beat(T0 + i)
    assert ctl.runs.cycle is not None
    slots = dict(ctl.runs.cycle.slots)
    high = submit(ctl, 2, T0 + 61, qos="high")
    victim = stored(ctl.store, first if stored(ctl.store, first).suspended_by == high else second)
    assert victim.suspended_by == high and victim.row is None
    assert ctl.runs.matrix.placement_of(high).row == 0  # type: ignore[union-attr]
    gang_stopped = victim.suspended_time  # the slices of the other row before it was suspended
    assert 29.0 <= gang_stopped <= 32.0
    rows = {ctl.beat(T0 + 61 + i).row for i in range(4)}  # type: ignore[union-attr]
    assert rows == {0, 1}
    assert info(ctl, victim.id, T0 + 71).suspended_time == gang_stopped + 10
    launched(ctl, high, "n1", now=T0 + 61)
    finish(ctl, high, T0 + 81)
    # The other job moved down into row 0 as high's row emptied (compaction): the victim resumes in row 1.
    assert [(j, r) for _, j, r in resumes(take(ctl))] == [(victim.id, 1)]
    assert {ctl.runs.matrix.placement_of(j).row for j in (first, second)} == {0, 1}  # type: ignore[union-attr]
    assert ctl.runs.cycle.suspended[victim.id] == gang_stopped + 20
    assert ctl.runs.cycle.slots[victim.id] == slots[victim.id]  # FCS's count goes on where it stopped


def test_a_suspended_job_whose_pes_free_up_waits_for_a_queued_job_that_outranks_it() -> None:
    ctl = cluster(MemoryStore())
    low = run(ctl, 2, T0)
    first = submit(ctl, 2, T0 + 61, qos="high")
    launched(ctl, first, "n1", now=T0 + 61)
    second = submit(ctl, 2, T0 + 62, qos="high")  # may not suspend first: the same priority
    assert info(ctl, second, T0 + 62).reason == "Resources"
    take(ctl)
    finish(ctl, first, T0 + 70)  # low's PEs are free, but second comes first: not a minute's wait for it
    sent = take(ctl)
    assert resumes(sent) == [] and set(launches(sent)) == {"n1"}
    assert stored(ctl.store, second).state is S.STARTING and stored(ctl.store, low).suspended_by == first
    launched(ctl, second, "n1", now=T0 + 70)
    finish(ctl, second, T0 + 80)
    assert resumes(take(ctl)) == [("n1", low, 0)]


def test_the_hang_watchdog_says_nothing_of_a_suspended_job() -> None:
    ctl = cluster(MemoryStore(), hang_warning=30.0)
    low = run(ctl, 2, T0)
    ranks = tuple(
        p.RankStats(
            rank=r, node="n1", pid=100 + r, state="active", t_cpu=1.0, t_comm=50.0, c_comm=10,
            granularity=0.1, calls=10, wait_mode="poll", job_id=low, call="MPI_Recv", call_time=50.0,
        )
        for r in (0, 1)
    )  # fmt: skip
    ctl.job_stats(p.JobStats(job_id=low, node="n1", ranks=ranks), T0 + 61)
    assert info(ctl, low, T0 + 61).warning.startswith("possibly deadlocked")
    submit(ctl, 2, T0 + 61, qos="high")
    assert stored(ctl.store, low).suspended_by is not None and info(ctl, low, T0 + 62).warning == ""


def test_a_job_of_a_negative_priority_resumes_when_nothing_waits() -> None:
    ctl = cluster(MemoryStore(), qos={"normal": 0, "scavenger": -10})
    low = run(ctl, 2, T0, qos="scavenger")
    normal = submit(ctl, 2, T0 + 61)
    assert stored(ctl.store, low).suspended_by == normal
    launched(ctl, normal, "n1", now=T0 + 61)
    finish(ctl, normal, T0 + 70)
    assert resumes(take(ctl)) == [("n1", low, 0)]
