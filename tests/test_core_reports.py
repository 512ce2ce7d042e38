"""The controller and job reports a node manager has no business sending, driven directly (no sockets).

A node manager that got past authentication (its CURVE key) still speaks only for its own ranks: a report
about a job with no ranks on it, or a PMI barrier more than one ahead of the job's current one, is refused
with an error for the node and a throttled log line, and changes nothing. Reports a node may still send
about an earlier run of a requeued job are taken as before (tests/test_core_nodes.py).
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from storm.mm import protocol as p
from storm.mm.protocol import JobLaunched, JobNodeDone, JobStats, PmiBarrierIn, RankExit, RankFailed
from storm.mm.store import Store
from tests.test_core import T0, Core, S, kills, make, reg, running, status, stored, submit, take
from tests.test_core_nodes import run_requeue


def three_nodes(store: Store) -> Core:
    ctl = make(store)
    for node in ("n1", "n2", "n3"):
        reg(ctl, node)
    return ctl


def reports(job_id: int, node: str, seq: int = 0) -> list[p.Message]:
    """Every kind of job report a node manager sends to the MM."""
    failed = RankExit(rank=0, exit_code=3)
    return [
        JobLaunched(job_id=job_id, node=node, pids={"0": 4242}),
        RankFailed(job_id=job_id, node=node, exit=failed),
        JobNodeDone(job_id=job_id, node=node, exits=(failed,)),
        PmiBarrierIn(job_id=job_id, node=node, seq=seq, kvs={"evil": "1"}),
        JobStats(job_id=job_id, node=node, ranks=()),
    ]


def report(ctl: Core, msg: p.Message, now: float) -> p.Error | None:
    match msg:
        case JobLaunched():
            return ctl.job_launched(msg, now)
        case RankFailed():
            return ctl.rank_failed(msg, now)
        case JobNodeDone():
            return ctl.job_node_done(msg, now)
        case PmiBarrierIn():
            return ctl.pmi_barrier_in(msg, now)
        case JobStats():
            return ctl.job_stats(msg, now)
    raise AssertionError(f"{msg.op} is not a job report")


def snapshot(ctl: Core, job_id: int) -> object:
    """Everything a report could change about a job and the nodes."""
    track = ctl.runs.tracking.get(job_id)
    nodes = [(n.name, n.state, set(n.stale)) for n in ctl.registry.all()]
    return (
        stored(ctl.store, job_id),
        ctl.runs.active.get(job_id),
        track and repr(track),
        nodes,
        ctl.store.barriers(),
    )


def test_reports_about_a_job_without_ranks_on_the_node_are_refused(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ctl = three_nodes(store)
    job_id = running(ctl)  # on n1 and n2
    assert stored(store, job_id).nodes == ("n1", "n2")
    before = snapshot(ctl, job_id)
    with caplog.at_level(logging.WARNING, logger="storm.mm"):
        for msg in [*reports(job_id, "n3"), *reports(999, "n1")]:  # not n3's job; a job that never was
            refused = report(ctl, msg, T0 + 2)
            assert isinstance(refused, p.Error) and refused.code == "bad_request", msg
            job = getattr(msg, "job_id", None)
            node = getattr(msg, "node", None)
            assert refused.text == f"{msg.op} about job {job}, which has no ranks on {node}"
    assert snapshot(ctl, job_id) == before and take(ctl) == []
    assert ctl.registry.usable() == {"n1", "n2", "n3"}  # n3 is not drained for a job it never had
    assert caplog.messages[0] == f"node n3: refused job_launched about job {job_id}, which has no ranks on n3"
    assert len(caplog.messages) == 10

    # The job's own nodes are heard as before, and a late launch report of an ended job stops it.
    assert (
        report(ctl, RankFailed(job_id=job_id, node="n2", exit=RankExit(rank=1, exit_code=3)), T0 + 3) is None
    )
    assert stored(store, job_id).ending is S.FAILED and kills(take(ctl)) == {("n1", job_id), ("n2", job_id)}
    for node, rank in (("n1", 0), ("n2", 1)):
        done = JobNodeDone(job_id=job_id, node=node, exits=(RankExit(rank=rank, exit_code=3),))
        assert report(ctl, done, T0 + 4) is None
    assert stored(store, job_id).state is S.FAILED
    take(ctl)
    assert report(ctl, JobLaunched(job_id=job_id, node="n1", pids={"0": 7}), T0 + 5) is None
    assert kills(take(ctl)) == {("n1", job_id)}
    assert isinstance(report(ctl, JobLaunched(job_id=job_id, node="n3", pids={"0": 7}), T0 + 5), p.Error)


def test_refusals_are_logged_at_a_bounded_rate_per_node(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ctl = three_nodes(store)
    job_id = running(ctl)
    foreign = RankFailed(job_id=job_id, node="n3", exit=RankExit(rank=0, exit_code=1))
    with caplog.at_level(logging.WARNING, logger="storm.mm"):
        for _ in range(100):
            assert isinstance(ctl.rank_failed(foreign, T0), p.Error)
        assert len(caplog.messages) == 10  # a burst, then one a second
        assert isinstance(ctl.job_launched(JobLaunched(job_id=999, node="n1", pids={}), T0), p.Error)
        assert len(caplog.messages) == 11  # another node's lines are not held back by n3's
        ctl.rank_failed(foreign, T0 + 1)
    assert caplog.messages[-1].endswith("(90 similar line(s) not logged)")
    assert stored(store, job_id).state is S.RUNNING


def test_a_barrier_more_than_one_ahead_of_the_jobs_is_refused(store: Store) -> None:
    ctl = three_nodes(store)
    job_id = running(ctl)
    before = snapshot(ctl, job_id)
    refused = ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node="n1", seq=2, kvs={"early": "1"}), T0 + 1)
    assert refused == p.Error(
        code="bad_request", text=f"PMI barrier 2 of job {job_id}, but the job is at barrier 0"
    )
    assert snapshot(ctl, job_id) == before and take(ctl) == [] and ctl.runs.tracking[job_id].barriers == {}
    # Barriers 0 and 1 pass; barrier 2 is then the current one and 3 one ahead: both taken, 4 refused.
    for seq in (0, 1):
        for node in ("n1", "n2"):
            assert ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node=node, seq=seq, kvs={}), T0 + 2) is None
    assert sorted(m.seq for _, m in take(ctl) if isinstance(m, p.PmiBarrierOut)) == [0, 0, 1, 1]
    for seq in (2, 3):
        assert ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node="n1", seq=seq, kvs={}), T0 + 3) is None
    refused = ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node="n2", seq=4, kvs={"x": "y"}), T0 + 3)
    assert isinstance(refused, p.Error) and "barrier 4" in refused.text
    assert set(ctl.runs.tracking[job_id].barriers) == {2, 3} and take(ctl) == []
    # A repeat of the barrier just passed is still answered again (a node whose answer was lost).
    assert ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node="n2", seq=1, kvs={}), T0 + 4) is None
    assert take(ctl) == [("n2", p.PmiBarrierOut(job_id=job_id, seq=1, kvs={}))]


def test_a_requeued_jobs_last_run_may_still_report_but_no_other_node(store: Store) -> None:
    ctl = three_nodes(store)
    job_id = run_requeue(ctl)  # n1 and n2
    status(ctl, "n2", T0 + 8, jobs=(job_id,))
    status(ctl, "n3", T0 + 8)
    ctl.tick(T0 + 11)  # n1 DOWN: the job goes back to the queue once n2 confirms
    ctl.job_node_done(JobNodeDone(job_id=job_id, node="n2", exits=(RankExit(rank=1, signal=15),)), T0 + 12)
    assert stored(store, job_id).state is S.PENDING
    take(ctl)
    # n2 may still send what it sent before the ack: taken (and changing nothing); n3 never ran it.
    for msg in reports(job_id, "n2"):
        assert report(ctl, msg, T0 + 12.1) is None, msg.op
    for msg in reports(job_id, "n3"):
        assert isinstance(report(ctl, msg, T0 + 12.1), p.Error), msg.op
    assert stored(store, job_id).state is S.PENDING
    # n1 comes back still running the old rank: its reports are taken, and it is told to stop.
    assert reg(ctl, "n1", now=T0 + 13, jobs=(job_id,)).stale_jobs == (job_id,)
    assert report(ctl, JobLaunched(job_id=job_id, node="n1", pids={"0": 1}), T0 + 13) is None
    assert ("n1", job_id) in kills(take(ctl))
    other = submit(ctl, 1, now=T0 + 14)
    assert isinstance(report(ctl, JobLaunched(job_id=other, node="n1", pids={"0": 1}), T0 + 14), p.Error)


# ------------------------------------------------------------------------------------------- the watchdog


def in_call(rank: int, node: str, call: str, seconds: float, job_id: int = 1) -> p.RankStats:
    return p.RankStats(
        rank=rank, node=node, pid=100 + rank, state="active", t_cpu=1.0, t_comm=seconds, c_comm=10,
        granularity=0.1, calls=10, wait_mode="poll", job_id=job_id, call=call, call_time=seconds,
    )  # fmt: skip


def warning(ctl: Core, job_id: int, now: float) -> tuple[str, str]:
    """What storm show and storm stats say of the job."""
    (info,) = ctl.job_infos((job_id,), now=now)
    return info.warning, ctl.stats_view(job_id, now).warning


def test_the_watchdog_reports_a_job_whose_every_rank_sits_in_one_call(store: Store) -> None:
    ctl = make(store, hang_warning=60.0)
    for node in ("n1", "n2"):
        reg(ctl, node)
    job_id = running(ctl, 2)
    stuck = {
        "n1": in_call(0, "n1", "MPI_Recv", 50.0, job_id),
        "n2": in_call(1, "n2", "MPI_Barrier", 55.0, job_id),
    }
    for node, stats in stuck.items():
        assert ctl.job_stats(JobStats(job_id=job_id, node=node, ranks=(stats,)), T0) is None
    assert warning(ctl, job_id, T0) == ("", "")  # 50 s: not yet
    text = (
        "possibly deadlocked: every rank in a blocking MPI call for over 60 s: "
        "MPI_Barrier (1 of 2), MPI_Recv (1 of 2)"
    )
    assert warning(ctl, job_id, T0 + 10.0) == (text, text)  # the reports age with the clock
    # A rank that returned from its call clears the warning: the job is not stuck.
    free = dataclasses.replace(stuck["n2"], call="", call_time=0.0)
    ctl.job_stats(JobStats(job_id=job_id, node="n2", ranks=(free,)), T0 + 10.0)
    assert warning(ctl, job_id, T0 + 10.0) == ("", "")


@pytest.mark.parametrize(("hang_warning", "reported"), [(0.0, ("n1", "n2")), (1.0, ("n1",))])
def test_the_watchdog_is_off_by_default_and_needs_every_rank(
    hang_warning: float, reported: tuple[str, ...], store: Store
) -> None:
    ctl = make(store, hang_warning=hang_warning)
    for node in ("n1", "n2"):
        reg(ctl, node)
    job_id = running(ctl, 2)
    for rank, node in enumerate(reported):
        stats = in_call(rank, node, "MPI_Recv", 99.0, job_id)
        ctl.job_stats(JobStats(job_id=job_id, node=node, ranks=(stats,)), T0)
    assert warning(ctl, job_id, T0 + 100.0) == ("", "")


def test_a_rank_report_says_which_call_only_with_its_time() -> None:
    with pytest.raises(p.ProtocolError):
        dataclasses.replace(in_call(0, "n1", "", 0.0), call_time=3.0)
    with pytest.raises(p.ProtocolError):
        in_call(0, "n1", "MPI_" + "x" * 64, 3.0)
