"""The controller across restarts of a node manager or of itself (pure: a real store, no sockets).

A restarted NM registers listing the jobs it re-adopted: they stay RUNNING, one the MM ended meanwhile is
stopped, a launch lost while the NM was down is sent again. A restarted MM knows which nodes had already
finished their part of a job that still runs elsewhere (they forgot it once their report was acknowledged).
"""

from __future__ import annotations

from storm.mm.core import Controller
from storm.mm.protocol import RankExit
from storm.mm.store import Store
from tests.test_core import (
    T0,
    S,
    done,
    kills,
    launched,
    launches,
    make,
    reg,
    running,
    state,
    submit,
    take,
    two_nodes,
)


def test_a_restarted_nm_listing_its_jobs_keeps_them_running(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    reply = reg(ctl, "n1", now=T0 + 5, jobs=(job_id,), nm="e2")  # a new NM, same node, the job re-adopted
    assert reply.stale_jobs == () and reply.rows == {str(job_id): 0}
    assert take(ctl) == [] and state(ctl, job_id) is S.RUNNING
    done(ctl, job_id, "n1", T0 + 6)
    done(ctl, job_id, "n2", T0 + 6)
    assert state(ctl, job_id) is S.COMPLETED


def test_a_restarted_nm_is_told_to_stop_what_the_mm_ended_meanwhile(store: Store) -> None:
    ctl = make(store, kill_timeout=5.0)  # shorter than the node timeout: n1 is not DOWN yet
    reg(ctl, "n1", pes=2)
    reg(ctl, "n2", pes=2)
    lost, cancelled = running(ctl, ranks=1), running(ctl, ranks=1)
    assert ctl.active[lost].nodes == ctl.active[cancelled].nodes == ("n1",)
    # n1's NM is down: kills go nowhere. The MM gives up on one job after kill_timeout...
    ctl.cancel((lost,), 0, "root", T0 + 2)
    later = T0 + 3 + ctl.config.kill_timeout
    ctl.tick(later)
    assert state(ctl, lost) is S.CANCELLED
    ctl.cancel((cancelled,), 0, "root", later)  # ...and still waits for the other
    take(ctl)
    reply = reg(ctl, "n1", pes=2, now=later + 1, jobs=(lost, cancelled), nm="e2")
    assert kills(take(ctl)) == {("n1", cancelled)}  # still waited for: stopped, then reported
    assert reply.stale_jobs == (lost,)  # over for the MM: the NM stops it before taking new work
    done(ctl, cancelled, "n1", later + 2, RankExit(rank=0, signal=15))
    assert state(ctl, cancelled) is S.CANCELLED


def test_a_launch_lost_while_the_nm_restarted_is_sent_again(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    first = launches(take(ctl))
    launched(ctl, job_id, "n2")  # n1's NM was down: its launch went nowhere
    reply = reg(ctl, "n1", now=T0 + 2, jobs=(), nm="e2")
    assert reply.stale_jobs == () and state(ctl, job_id) is S.STARTING
    assert launches(take(ctl)) == {"n1": first["n1"]}
    launched(ctl, job_id, "n1", now=T0 + 3)
    assert state(ctl, job_id) is S.RUNNING
    # Once it runs, a node that no longer knows the job has lost it.
    reg(ctl, "n1", now=T0 + 4, jobs=(), nm="e3")
    assert state(ctl, job_id) is S.NODE_FAIL or ctl.active[job_id].ending is S.NODE_FAIL


def test_a_starting_job_a_restarted_nm_lists_is_launched(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    take(ctl)
    launched(ctl, job_id, "n2")
    reg(ctl, "n1", now=T0 + 2, jobs=(job_id,), nm="e2")  # re-adopted before it could report the launch
    assert state(ctl, job_id) is S.RUNNING and take(ctl) == []


def test_a_node_that_finished_its_part_before_the_mm_restarted_is_not_lost(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    done(ctl, job_id, "n1", T0 + 2)  # acknowledged: n1's NM forgets the job
    assert state(ctl, job_id) is S.RUNNING
    ctl = Controller(store, ctl.config, T0 + 3, "mm-2")  # the MM restarts
    reg(ctl, "n1", now=T0 + 4, jobs=())
    reg(ctl, "n2", now=T0 + 4, jobs=(job_id,))
    assert state(ctl, job_id) is S.RUNNING and take(ctl) == []
    done(ctl, job_id, "n2", T0 + 5, RankExit(rank=1, exit_code=5))  # its last rank fails
    job = store.get_job(job_id)
    assert job is not None and (job.state, job.exit_code) == (S.FAILED, 5)
    assert store.node_exits() == {}  # kept only while the job ran


def test_node_exits_are_stored_only_for_jobs_on_several_nodes(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl, ranks=1)
    done(ctl, job_id, ctl.active[job_id].nodes[0], T0 + 2)
    assert state(ctl, job_id) is S.COMPLETED and store.node_exits() == {}
    wide = running(ctl)
    done(ctl, wide, "n2", T0 + 3, RankExit(rank=1, signal=9))
    assert store.node_exits() == {wide: {"n2": (RankExit(rank=1, signal=9),)}}
