"""The controller and nodes that come back: a node still stopping ended jobs takes no new work."""

from __future__ import annotations

from storm.mm.core import Controller
from storm.mm.protocol import JobNodeDone, PmiBarrierIn, PmiBarrierOut, RankExit
from storm.mm.store import Store
from tests.test_core import (
    T0,
    S,
    done,
    expire_n1,
    kills,
    launches,
    reg,
    running,
    state,
    status,
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
    ctl = Controller(store, ctl.config, T0 + 2, "mm-2")
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
