"""The controller and node failures: nodes that come back (a node still stopping ended jobs takes no new
work), and jobs submitted with ``requeue`` that go back to the queue when a node under them is lost."""

from __future__ import annotations

import dataclasses

import pytest

from storm.mm.jobs import TransitionError, requeue
from storm.mm.protocol import JobLaunched, JobNodeDone, PmiBarrierIn, PmiBarrierOut, RankExit, RankFailed
from storm.mm.store import Store
from tests.test_core import (
    T0,
    Core,
    S,
    done,
    expire_n1,
    kills,
    launches,
    make,
    reg,
    running,
    spec,
    state,
    status,
    stored,
    submit,
    take,
    two_nodes,
)


def test_node_back_from_down_drains_the_lost_job_before_taking_new_work(store: Store) -> None:
    ctl = two_nodes(store)
    lost = running(ctl)
    expire_n1(ctl, lost)  # a partition: n1's NM and its rank are alive, the MM wrote them off
    done(ctl, lost, "n2", T0 + 12, RankExit(rank=1, signal=15))
    assert state(ctl, lost) is S.NODE_FAIL
    take(ctl)
    reply = reg(ctl, "n1", now=T0 + 13, jobs=(lost,))  # back, still running the lost rank
    assert reply.stale_jobs == (lost,)
    assert ctl.registry.usable() == {"n2"}
    waiting = submit(ctl, 2, now=T0 + 14)
    assert launches(take(ctl)) == {} and state(ctl, waiting) is S.PENDING
    assert "stopping ended job(s)" in {n.name: n.reason for n in ctl.node_infos()}["n1"]
    # n1 stops the rank and reports: now both nodes take the queued job.
    ctl.job_node_done(JobNodeDone(job_id=lost, node="n1", exits=(RankExit(rank=0, signal=15),)), T0 + 15)
    assert set(launches(take(ctl))) == {"n1", "n2"} and state(ctl, waiting) is S.STARTING
    assert store.get_job(lost).state is S.NODE_FAIL  # type: ignore[union-attr]  # the late report changes nothing


def test_a_node_that_forgets_a_stale_job_is_drained_too(store: Store) -> None:
    ctl = two_nodes(store)
    lost = running(ctl)
    expire_n1(ctl, lost)
    done(ctl, lost, "n2", T0 + 12, RankExit(rank=1, signal=15))
    reg(ctl, "n1", now=T0 + 13, jobs=(lost,))
    take(ctl)
    assert status(ctl, "n1", T0 + 14, jobs=(lost,)) is None
    assert kills(take(ctl)) == {("n1", lost)}  # still listed: told again
    assert ctl.registry.usable() == {"n2"}
    status(ctl, "n1", T0 + 15, jobs=())  # the NM no longer lists it: its report may have been lost
    assert ctl.registry.usable() == {"n1", "n2"}


def test_a_barrier_answer_survives_an_mm_restart(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    for node in ("n1", "n2"):
        ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node=node, seq=0, kvs={f"addr-{node}": node}), T0 + 1)
    answers = [(n, m) for n, m in take(ctl) if isinstance(m, PmiBarrierOut)]
    assert len(answers) == 2  # the MM dies now: say n2's answer was lost on the way
    ctl = Core(store, ctl.config, T0 + 2, "mm-2")
    reg(ctl, "n1", now=T0 + 3, jobs=(job_id,))
    reg(ctl, "n2", now=T0 + 3, jobs=(job_id,))
    take(ctl)
    ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node="n2", seq=0, kvs={"addr-n2": "n2"}), T0 + 4)
    assert take(ctl) == [("n2", PmiBarrierOut(job_id=job_id, seq=0, kvs={"addr-n1": "n1", "addr-n2": "n2"}))]
    # The next barrier works as usual, and the stored answer goes when the job ends.
    for node in ("n1", "n2"):
        ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node=node, seq=1, kvs={}), T0 + 5)
    assert sorted(n for n, m in take(ctl) if isinstance(m, PmiBarrierOut) and m.seq == 1) == ["n1", "n2"]
    done(ctl, job_id, "n1", T0 + 6)
    done(ctl, job_id, "n2", T0 + 6)
    assert store.barriers() == {}


# ---------------------------------------------------------------------------------------------- requeue


def submit_requeue(ctl: Core, ranks: int = 2, now: float = T0) -> int:
    return ctl.submit(dataclasses.replace(spec(ranks), requeue=True), now).id


def run_requeue(ctl: Core, ranks: int = 2, now: float = T0) -> int:
    job_id = submit_requeue(ctl, ranks, now)
    for node in ctl.runs.active[job_id].nodes:
        ctl.job_launched(JobLaunched(job_id=job_id, node=node, pids={"0": 1}), now + 1)
    take(ctl)
    assert state(ctl, job_id) is S.RUNNING
    return job_id


def test_a_requeue_job_whose_node_is_lost_goes_back_to_the_queue_and_runs_again(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = run_requeue(ctl)
    first = stored(store, job_id)
    expire_n1(ctl, job_id)  # n1 cut off: its NM and rank live on
    assert kills(take(ctl)) == {("n2", job_id)}
    assert state(ctl, job_id) is S.RUNNING  # n2's rank still holds its PE
    done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert (job.state, job.requeues, job.submit_time) == (S.PENDING, 1, first.submit_time)
    assert (job.start_time, job.end_time, job.placement, job.row, job.exit_code, job.ending) == (
        None, None, (), None, None, None,
    )  # fmt: skip
    assert job.reason == "requeued 1/5 after node n1 DOWN: no report for 11.0 s"
    assert ctl.ended == []  # nobody waiting for the job hears of an end
    (info,) = ctl.job_infos((job_id,))
    assert (info.state, info.requeue, info.requeues) == ("PENDING", True, 1)
    assert info.reason == f"Requeued: last run's reports still due from n2 ({job.reason})"
    assert status(ctl, "n2", T0 + 12.5) is None  # n2 no longer lists it: nothing more of the last run to come
    (info,) = ctl.job_infos((job_id,))
    assert info.reason == f"PartitionConfig: needs 2 PEs, the cluster has 1 ({job.reason})"  # only n2 is UP
    # n1 comes back still running the old rank: it stops it before the job (or anything) runs there.
    reply = reg(ctl, "n1", now=T0 + 13, jobs=(job_id,))
    assert reply.stale_jobs == (job_id,) and ctl.registry.usable() == {"n2"}
    assert launches(take(ctl)) == {}
    ctl.job_node_done(JobNodeDone(job_id=job_id, node="n1", exits=(RankExit(rank=0, signal=15),)), T0 + 14)
    sent = take(ctl)
    assert set(launches(sent)) == {"n1", "n2"}
    again = stored(store, job_id)
    assert (again.state, again.start_time, again.reason, again.requeues) == (S.STARTING, T0 + 14, "", 1)
    assert launches(sent)["n1"].kvsname != "" and launches(sent)["n1"].job_id == job_id
    for node in ("n1", "n2"):
        ctl.job_launched(JobLaunched(job_id=job_id, node=node, pids={"0": 1}), T0 + 15)
        done(ctl, job_id, node, T0 + 16)
    finished = stored(store, job_id)
    assert (finished.state, finished.requeues, finished.submit_time) == (S.COMPLETED, 1, first.submit_time)
    assert [j.id for j in ctl.ended] == [job_id]


def test_without_requeue_or_past_the_limit_the_job_ends_node_fail(store: Store) -> None:
    ctl = two_nodes(store, max_requeues=1)
    job_id = run_requeue(ctl)
    expire_n1(ctl, job_id)
    done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
    assert state(ctl, job_id) is S.PENDING  # the first loss: requeued
    status(ctl, "n2", T0 + 12.5)
    reg(ctl, "n1", now=T0 + 13)  # back, its NM restarted: nothing left there
    ctl.job_launched(JobLaunched(job_id=job_id, node="n1", pids={"0": 1}), T0 + 14)
    ctl.job_launched(JobLaunched(job_id=job_id, node="n2", pids={"0": 1}), T0 + 14)
    assert state(ctl, job_id) is S.RUNNING
    # The second loss is one too many.
    status(ctl, "n2", T0 + 20, jobs=(job_id,))
    ctl.tick(T0 + 24)
    assert {n.name: n.state for n in ctl.registry.all()} == {"n1": "DOWN", "n2": "UP"}
    done(ctl, job_id, "n2", T0 + 25, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert (job.state, job.requeues) == (S.NODE_FAIL, 1)
    assert job.reason == "node n1 DOWN: no report for 11.0 s (not requeued again: max_requeues is 1)"
    # max_requeues = 0 turns requeueing off; a job submitted without --requeue is never requeued.
    for config, again in (({"max_requeues": 0}, True), ({}, False)):
        ctl = make(Store(store.path.with_name(f"other-{again}.db")), **config)  # type: ignore[arg-type]
        reg(ctl, "n1")
        reg(ctl, "n2")
        job_id = ctl.submit(dataclasses.replace(spec(2), requeue=again), T0).id
        expire_n1(ctl, job_id)
        done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
        assert (state(ctl, job_id), stored(ctl.store, job_id).requeues) == (S.NODE_FAIL, 0)
        ctl.store.close()


def test_the_old_run_on_a_returning_node_cannot_touch_the_new_run(store: Store) -> None:
    ctl = make(store)
    for node in ("n1", "n2", "n3"):
        reg(ctl, node)
    job_id = run_requeue(ctl)
    assert ctl.runs.active[job_id].nodes == ("n1", "n2")
    for node in ("n2", "n3"):
        status(ctl, node, T0 + 8, jobs=(job_id,) if node == "n2" else ())
    ctl.tick(T0 + 11)  # n1 DOWN
    done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
    status(ctl, "n2", T0 + 12.5)
    assert set(launches(take(ctl))) == {"n2", "n3"}  # the new run, on the nodes that are UP
    # n1's old rank, still alive, says things about the job: none of them counts for the new run.
    reply = reg(ctl, "n1", now=T0 + 13, jobs=(job_id,))
    assert reply.stale_jobs == (job_id,)
    ctl.job_launched(JobLaunched(job_id=job_id, node="n1", pids={"0": 1}), T0 + 13)
    ctl.rank_failed(RankFailed(job_id=job_id, node="n1", exit=RankExit(rank=0, exit_code=1)), T0 + 13)
    assert status(ctl, "n1", T0 + 13, jobs=(job_id,)) is None
    assert kills(take(ctl)) == {("n1", job_id)}  # only n1 is told to stop, the new run goes on
    assert ctl.registry.usable() == {"n2", "n3"}
    job = stored(store, job_id)
    assert (job.state, job.ending, job.nodes) == (S.STARTING, None, ("n2", "n3"))
    ctl.pmi_barrier_in(PmiBarrierIn(job_id=job_id, node="n1", seq=0, kvs={"evil": "1"}), T0 + 13)
    assert take(ctl) == []
    ctl.job_node_done(JobNodeDone(job_id=job_id, node="n1", exits=(RankExit(rank=0, exit_code=1),)), T0 + 14)
    assert "n1" in ctl.registry.usable()  # stopped: n1 takes work again; n2 and n3 run the job
    for node in ("n2", "n3"):
        ctl.job_launched(JobLaunched(job_id=job_id, node=node, pids={"0": 1}), T0 + 15)
    for node, rank in (("n2", 0), ("n3", 1)):
        ctl.job_node_done(
            JobNodeDone(job_id=job_id, node=node, exits=(RankExit(rank=rank, exit_code=0),)), T0 + 16
        )
    assert (state(ctl, job_id), stored(store, job_id).exit_code) == (S.COMPLETED, 0)


def test_an_up_node_that_never_confirmed_the_old_run_takes_no_work_until_it_has(store: Store) -> None:
    ctl = two_nodes(store, kill_timeout=30.0)
    reg(ctl, "n3")
    job_id = run_requeue(ctl)
    status(ctl, "n2", T0 + 8, jobs=(job_id,))
    status(ctl, "n3", T0 + 8)
    ctl.tick(T0 + 11)  # n1 DOWN; n2 is told to stop its rank but never confirms
    for now in (T0 + 20, T0 + 30, T0 + 41):
        status(ctl, "n2", now, jobs=(job_id,))
        status(ctl, "n3", now)
        ctl.tick(now + 1)
    assert stored(store, job_id).state is S.PENDING  # written off after kill_timeout: requeued
    assert ctl.registry.usable() == {"n3"}  # n2 may still run the old rank under the same id
    assert stored(store, job_id).placement == ()
    assert status(ctl, "n2", T0 + 43, jobs=(job_id,)) is None
    assert ("n2", job_id) in kills(take(ctl))
    status(ctl, "n2", T0 + 44, jobs=())  # gone now
    assert ctl.registry.usable() == {"n2", "n3"}
    assert set(ctl.runs.active[job_id].nodes) == {"n2", "n3"}


def test_a_requeue_in_progress_survives_an_mm_restart(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = run_requeue(ctl)
    expire_n1(ctl, job_id)
    assert stored(store, job_id).ending is S.NODE_FAIL  # stored before any kill went out
    ctl = Core(store, ctl.config, T0 + 12, "mm-2")  # the MM dies before n2 confirms
    reg(ctl, "n2", now=T0 + 12, jobs=(job_id,))
    take(ctl)
    done(ctl, job_id, "n2", T0 + 13, RankExit(rank=1, signal=15))
    assert (state(ctl, job_id), stored(store, job_id).requeues) == (S.PENDING, 1)
    # ... and a requeued job is still queued, and still marked, after another restart.
    ctl = Core(store, ctl.config, T0 + 14, "mm-3")
    assert list(ctl.runs.pending) == [job_id] and ctl.runs.pending[job_id].spec.requeue
    reg(ctl, "n1", now=T0 + 15)
    reg(ctl, "n2", now=T0 + 15)
    assert set(launches(take(ctl))) == {"n1", "n2"}
    assert stored(store, job_id).requeues == 1


def test_only_a_requeue_job_ending_node_fail_goes_back(store: Store) -> None:
    ctl = two_nodes(store)
    plain = running(ctl)
    with pytest.raises(TransitionError):
        requeue(dataclasses.replace(ctl.runs.active[plain], ending=S.NODE_FAIL), "x")  # not submitted with it
    job = dataclasses.replace(ctl.runs.active[plain], spec=dataclasses.replace(spec(2), requeue=True))
    with pytest.raises(TransitionError):
        requeue(job, "x")  # not heading for NODE_FAIL (a cancel, a time limit, a failed rank end it for good)
    with pytest.raises(TransitionError):
        requeue(dataclasses.replace(job, ending=S.NODE_FAIL, state=S.COMPLETED), "x")
    assert requeue(dataclasses.replace(job, ending=S.NODE_FAIL), "x").state is S.PENDING


def test_a_requeue_job_that_fails_by_itself_or_is_cancelled_ends_for_good(store: Store) -> None:
    ctl = two_nodes(store)
    failing = run_requeue(ctl)
    ctl.rank_failed(RankFailed(job_id=failing, node="n1", exit=RankExit(rank=0, exit_code=3)), T0 + 2)
    done(ctl, failing, "n1", T0 + 3, RankExit(rank=0, exit_code=3))
    done(ctl, failing, "n2", T0 + 3, RankExit(rank=1, signal=15))
    assert (state(ctl, failing), stored(store, failing).exit_code) == (S.FAILED, 3)
    cancelled = run_requeue(ctl, now=T0 + 4)
    ctl.cancel((cancelled,), 1000, "alice", T0 + 5)
    for node, rank in (("n1", 0), ("n2", 1)):
        done(ctl, cancelled, node, T0 + 6, RankExit(rank=rank, signal=15))
    assert (state(ctl, cancelled), stored(store, cancelled).requeues) == (S.CANCELLED, 0)


def test_copies_of_the_last_runs_reports_cannot_end_the_next_run(store: Store) -> None:
    """A node re-sends its final report until it is acknowledged: copies may arrive after the requeue."""
    ctl = make(store)
    for node in ("n1", "n2", "n3"):
        reg(ctl, node)
    job_id = run_requeue(ctl)
    for node in ("n2", "n3"):
        status(ctl, node, T0 + 8, jobs=(job_id,) if node == "n2" else ())
    ctl.tick(T0 + 11)  # n1 DOWN
    last_report = JobNodeDone(job_id=job_id, node="n2", exits=(RankExit(rank=1, signal=15),))
    ctl.job_node_done(last_report, T0 + 12)
    assert state(ctl, job_id) is S.PENDING and launches(take(ctl)) == {}  # held: n2 may say more
    # What n2 sent before it heard the acknowledgement arrives now; none of it may touch the job.
    ctl.job_node_done(last_report, T0 + 12.1)
    ctl.rank_failed(RankFailed(job_id=job_id, node="n2", exit=RankExit(rank=1, signal=15)), T0 + 12.1)
    ctl.job_launched(JobLaunched(job_id=job_id, node="n2", pids={"1": 5}), T0 + 12.1)
    assert stored(store, job_id).state is S.PENDING
    assert status(ctl, "n2", T0 + 12.2, jobs=(job_id,)) is None  # still listed: it has not heard the ack
    assert launches(take(ctl)) == {}
    assert status(ctl, "n2", T0 + 12.3) is None  # forgotten: everything it sent before has arrived
    assert set(launches(take(ctl))) == {"n2", "n3"}
    job = stored(store, job_id)
    assert (job.state, job.ending, job.nodes, job.requeues) == (S.STARTING, None, ("n2", "n3"), 1)
    # A node that goes DOWN, or registers again, owes nothing more either; a cancel ends the wait.
    for way in ("down", "register", "cancel"):
        other = make(Store(store.path.with_name(f"{way}.db")))
        for node in ("n1", "n2", "n3"):
            reg(other, node)
        held = run_requeue(other)
        status(other, "n2", T0 + 8, jobs=(held,))
        status(other, "n3", T0 + 8)
        other.tick(T0 + 11)
        done(other, held, "n2", T0 + 12, RankExit(rank=1, signal=15))
        assert held in other.runs.echoes.held(other.runs.pending)
        if way == "down":
            status(other, "n3", T0 + 20)
            other.tick(T0 + 22.5)  # n2 silent since T0 + 12: DOWN
        elif way == "register":
            reg(other, "n2", now=T0 + 13, nm="e2")
        else:
            other.cancel((held,), 1000, "alice", T0 + 13)
        assert other.runs.echoes.held(other.runs.pending) == {}, way
        other.store.close()
