"""The controller under gang scheduling: heartbeats, rows, compaction, time limits that skip suspension."""

from __future__ import annotations

import dataclasses

import pytest

from storm.mm.config import MMConfig
from storm.mm.protocol import (
    ClassChange,
    FcsParameters,
    JobNodeDone,
    JobRows,
    JobStats,
    LaunchJob,
    ProfileEntry,
    RankExit,
    RankStats,
)
from storm.mm.store import Store
from tests.test_core import T0, Core, S, done, launched, reg, spec, state, stored, take


def gang(store: Store, mpl: int = 2, nodes: int = 2) -> Core:
    config = MMConfig(node_timeout=100.0, mpl=mpl, slice=0.1)
    ctl = Core(store, config, T0, "mm-1", policy="gang")
    for i in range(nodes):
        reg(ctl, f"n{i + 1}")
    return ctl


def start(ctl: Core, ranks: int = 2, now: float = T0, **kw: object) -> int:
    job_id = ctl.submit(spec(ranks, **kw), now).id  # type: ignore[arg-type]
    launched(ctl, job_id, *ctl.runs.active[job_id].nodes, now=now)
    return job_id


def test_two_wide_jobs_take_two_rows_and_alternate(store: Store) -> None:
    ctl = gang(store)
    a, b = start(ctl), start(ctl)
    launches = [m for _, m in take(ctl) if isinstance(m, LaunchJob)]
    assert {(m.job_id, m.row) for m in launches} == {(a, 0), (b, 1)}
    beats = [ctl.beat(T0 + i * 0.1) for i in range(4)]
    assert [(h.seq, h.row) for h in beats if h] == [(1, 0), (2, 1), (3, 0), (4, 1)]
    assert all(h is not None and h.epoch == "mm-1" and h.slice == 0.1 for h in beats)
    view = ctl.matrix_view()
    assert (view.policy, view.mpl, view.active_row, view.columns) == ("gang", 2, 1, ("n1:0", "n2:0"))
    assert view.cells == ((a, a), (b, b))


def test_batch_sends_no_heartbeats(store: Store) -> None:
    ctl = Core(store, MMConfig(node_timeout=100.0), T0, "mm-1")
    reg(ctl, "n1")
    assert ctl.beat(T0) is None
    assert ctl.matrix_view().active_row is None


def test_an_ended_job_lets_the_other_row_move_down_and_its_nodes_hear_of_it(store: Store) -> None:
    ctl = gang(store)
    a, b = start(ctl), start(ctl)
    take(ctl)
    ctl.beat(T0)
    done(ctl, a, "n1", T0 + 1)
    done(ctl, a, "n2", T0 + 1)
    moves = [(n, m) for n, m in take(ctl) if isinstance(m, JobRows)]
    assert sorted(moves, key=lambda nm: nm[0]) == [
        ("n1", JobRows(rows={str(b): 0})),
        ("n2", JobRows(rows={str(b): 0})),
    ]
    assert stored(store, b).row == 0
    assert [ctl.beat(T0 + 1 + i * 0.1).row for i in range(3)] == [0, 0, 0]  # type: ignore[union-attr]


def test_registration_tells_the_policy_slice_port_and_rows(store: Store) -> None:
    ctl = gang(store)
    ctl.heartbeat_port = 6999
    a, b = start(ctl), start(ctl)
    reply = reg(ctl, "n1", jobs=(a, b))
    assert (reply.policy, reply.slice, reply.heartbeat_port) == ("gang", 0.1, 6999)
    assert reply.rows == {str(a): 0, str(b): 1}


def test_suspended_time_does_not_count_against_the_limit(store: Store) -> None:
    ctl = gang(store)
    a = start(ctl, time_limit=1.0)
    start(ctl)  # the other row: a runs only every other slice
    now = T0
    while stored(store, a).ending is None and now < T0 + 10:
        ctl.beat(now)
        ctl.tick(now)
        now = round(now + 0.1, 6)
    # 1 s of running at half the machine takes about 2 s of wall time before the limit strikes.
    assert stored(store, a).ending is S.TIMEOUT and state(ctl, a) is S.RUNNING  # its ranks are being stopped
    assert now - T0 == pytest.approx(2.1, abs=0.15)
    info = ctl.job_infos((a,), now=now)[0]
    assert info.suspended_time == pytest.approx(1.0, abs=0.15) and info.row == 0


def test_restart_keeps_suspended_time_and_rows(store: Store) -> None:
    ctl = gang(store)
    a, b = start(ctl), start(ctl)
    for i in range(10):
        ctl.beat(T0 + i * 0.1)
    done(ctl, a, "n1", T0 + 1.0)
    done(ctl, a, "n2", T0 + 1.0)
    suspended = stored(store, a).suspended_time
    assert suspended == pytest.approx(0.5, abs=0.01)
    again = Core(store, MMConfig(node_timeout=100.0, mpl=2, slice=0.1), T0 + 2, "mm-2", policy="gang")
    assert again.runs.matrix.placement_of(b).row == 0  # type: ignore[union-attr]
    assert again.beat(T0 + 2).row == 0  # type: ignore[union-attr]


def fcs(store: Store, tslots_max: int = 4) -> Core:
    config = MMConfig(node_timeout=100.0, mpl=2, slice=0.1)
    params = FcsParameters(cslots_min=2, tslots_max=tslots_max)
    ctl = Core(store, config, T0, "mm-1", policy="fcs", fcs=params)
    for i in range(2):
        reg(ctl, f"n{i + 1}")
    return ctl


def test_fcs_heartbeats_announce_each_jobs_reset_and_nodes_get_the_constants(store: Store) -> None:
    ctl = fcs(store, tslots_max=2)
    a, b = start(ctl), start(ctl)
    assert reg(ctl, "n1", jobs=(a, b)).fcs == FcsParameters(cslots_min=2, tslots_max=2)
    beats = [ctl.beat(T0 + i * 0.1) for i in range(9)]
    # Rows alternate (a, b, a, ...); each job's 2nd, 4th... slot ends at the beat that starts its 3rd, 5th...
    assert [h.resets for h in beats if h] == [(), (), (), (a,), (b,), (), (), (a,), (b,)]


def test_class_changes_are_stored_and_the_latest_measurements_served(store: Store) -> None:
    ctl = fcs(store)
    a = start(ctl)
    rank = RankStats(
        rank=0, node="n1", pid=5, state="active", t_cpu=1.0, t_comm=1.0, c_comm=500, granularity=0.004,
        calls=1000, wait_mode="spin-block", job_id=a, pe=0, klass="F", cslots=0, tslots=20,
    )  # fmt: skip
    change = ClassChange(job_id=a, rank=0, node="n1", time=T0 + 2, old="CS", new="F", tslots=20)
    ctl.job_stats(JobStats(job_id=a, node="n1", ranks=(rank,), changes=(change,)), T0 + 2)
    ctl.job_stats(JobStats(job_id=a + 99, node="n1", ranks=(rank,), changes=(change,)), T0 + 2)  # unknown job
    assert ctl.runs.reports.processes(()) == [rank] and ctl.runs.reports.processes((a,)) == [rank]
    assert store.class_changes([a]) == [change]
    assert store.class_changes([a + 99]) == []  # nothing is recorded for a job the MM does not run there


def test_a_jobs_profile_is_live_while_it_runs_and_stored_when_it_ends(store: Store) -> None:
    ctl = fcs(store)
    a = start(ctl)
    live = ProfileEntry(rank=0, node="n1", klass="CS", wall=1.0, compute=0.5, poll=0.1, blocked=0.0,
                        stopped=0.4, queued=0.0)  # fmt: skip
    ctl.job_stats(JobStats(job_id=a, node="n1", ranks=(), profile=(live,)), T0 + 1)
    assert ctl.stats_view(a, T0 + 1.5).profile == (live,)
    final = {n: dataclasses.replace(live, node=n, rank=i, wall=2.0) for i, n in enumerate(("n1", "n2"))}
    for node, entry in final.items():
        exits = (RankExit(rank=entry.rank, exit_code=0),)
        msg = JobNodeDone(job_id=a, node=node, exits=exits, profile=(entry,))
        ctl.job_node_done(msg, T0 + 2)
        ctl.job_node_done(msg, T0 + 2)  # re-sent: stored once
    assert state(ctl, a) is S.COMPLETED
    view = ctl.stats_view(a, T0 + 3)
    assert (view.state, view.ranks, view.profile) == ("COMPLETED", (), (final["n1"], final["n2"]))
