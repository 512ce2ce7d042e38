"""The controller across restarts of a node manager or of itself (pure: a real store, no sockets).

A restarted NM registers listing the jobs it re-adopted: they stay RUNNING, one the MM ended meanwhile is
stopped, a launch lost while the NM was down is sent again. A restarted MM knows which nodes had already
finished their part of a job that still runs elsewhere (they forgot it once their report was acknowledged),
and sends a starting job's launch again, the same one, to a node that never got it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing

import pytest

from storm.mm.protocol import RankExit
from storm.mm.store import Store
from tests.test_core import (
    T0,
    Core,
    S,
    done,
    expire_n1,
    kills,
    launched,
    launches,
    make,
    reg,
    running,
    spec,
    state,
    submit,
    take,
    two_nodes,
)
from tests.test_core_gang import gang, start

Restart = Callable[[Core, float], Core]


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
    assert ctl.runs.active[lost].nodes == ctl.runs.active[cancelled].nodes == ("n1",)
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
    assert state(ctl, job_id) is S.NODE_FAIL or ctl.runs.active[job_id].ending is S.NODE_FAIL


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
    ctl = Core(store, ctl.config, T0 + 3, "mm-2")  # the MM restarts
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
    done(ctl, job_id, ctl.runs.active[job_id].nodes[0], T0 + 2)
    assert state(ctl, job_id) is S.COMPLETED and store.node_exits() == {}
    wide = running(ctl)
    done(ctl, wide, "n2", T0 + 3, RankExit(rank=1, signal=9))
    assert store.node_exits() == {wide: {"n2": (RankExit(rank=1, signal=9),)}}


# ------------------------------------------------------------------------------ storm-mm killed mid-start


@pytest.fixture
def restart() -> Iterator[Restart]:
    """storm-mm SIGKILLed and started again: the new one opens the same store file; nothing else survives."""
    opened: list[Store] = []

    def restart_(ctl: Core, now: float) -> Core:
        ctl.store.close()  # every transition was committed before it was acted on
        store = Store(ctl.store.path)
        opened.append(store)
        return Core(store, ctl.config, now, f"mm-{len(opened) + 1}", policy=ctl.policy, fcs=ctl.fcs)

    yield restart_
    for store in opened:
        store.close()


def test_a_launch_lost_with_a_killed_mm_is_sent_again_by_the_next(store: Store, restart: Restart) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    first = launches(take(ctl))
    assert set(first) == {"n1", "n2"} and first["n1"].kvsname == first["n2"].kvsname
    ctl = restart(ctl, T0 + 1)  # killed before n2's launch left (or n2 got it): only n1 has the job
    reg(ctl, "n1", now=T0 + 2, jobs=(job_id,))
    assert take(ctl) == [] and state(ctl, job_id) is S.STARTING
    reg(ctl, "n2", now=T0 + 2, jobs=())
    assert launches(take(ctl)) == {"n2": first["n2"]}  # the same launch: same PMI name, ranks, row
    assert state(ctl, job_id) is S.STARTING and ctl.runs.active[job_id].ending is None
    launched(ctl, job_id, "n2", now=T0 + 3)
    assert state(ctl, job_id) is S.RUNNING and take(ctl) == []
    done(ctl, job_id, "n1", T0 + 4)
    done(ctl, job_id, "n2", T0 + 4)
    assert state(ctl, job_id) is S.COMPLETED


def test_launches_tell_which_nodes_share_a_host_and_a_restart_keeps_what_they_said(
    store: Store, restart: Restart
) -> None:
    ctl = make(store)
    for node, host in (("n1", "h1"), ("n2", "h2"), ("n3", "h1"), ("n4", "")):
        reg(ctl, node, host=host)
    job_id = submit(ctl, 4)
    first = launches(take(ctl))
    assert {n: launch.hosts for n, launch in first.items()} == dict.fromkeys(first, (0, 1, 0, 2))
    assert [first[n].mpi_node for n in ("n1", "n2", "n3", "n4")] == [0, 1, 0, 2]  # n4: a host of its own
    ctl = restart(ctl, T0 + 1)
    for node, host in (("n1", "h1"), ("n2", "h1"), ("n3", "h1"), ("n4", "h1")):  # all claim h1 now
        reg(ctl, node, now=T0 + 2, host=host)
    assert launches(take(ctl)) == first  # what the other nodes were told stands
    launched(ctl, job_id, "n1", "n2", "n3", "n4", now=T0 + 3)
    for node in ("n1", "n2", "n3", "n4"):
        done(ctl, job_id, node, T0 + 4)
    assert state(ctl, job_id) is S.COMPLETED
    submit(ctl, 4, now=T0 + 5)  # the next job is placed by what the nodes say now
    assert {launch.hosts for launch in launches(take(ctl)).values()} == {(0, 0, 0, 0)}


def test_a_killed_mm_that_no_node_heard_from_starts_the_job_everywhere(
    store: Store, restart: Restart
) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    first = launches(take(ctl))
    ctl = restart(ctl, T0 + 1)
    ctl = restart(ctl, T0 + 2)  # twice: a restarted MM does not lose the PMI name either
    reg(ctl, "n2", now=T0 + 3, jobs=())
    reg(ctl, "n1", now=T0 + 3, jobs=())
    assert launches(take(ctl)) == first
    launched(ctl, job_id, "n1", "n2", now=T0 + 4)
    assert state(ctl, job_id) is S.RUNNING
    ctl = restart(ctl, T0 + 5)
    assert ctl.runs.tracking[job_id].launches == {}  # running: a node that lost the job has lost its ranks
    reg(ctl, "n1", now=T0 + 6, jobs=())
    assert kills(take(ctl)) == {("n2", job_id)} and ctl.runs.active[job_id].ending is S.NODE_FAIL


def test_a_job_cancelled_while_starting_is_not_launched_again_after_a_restart(
    store: Store, restart: Restart
) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    take(ctl)
    ctl.cancel((job_id,), 0, "root", T0 + 1)
    ctl = restart(ctl, T0 + 2)
    reg(ctl, "n1", now=T0 + 3, jobs=(job_id,))
    reg(ctl, "n2", now=T0 + 3, jobs=())  # never got it: nothing to stop there
    assert launches(take(ctl)) == {}
    done(ctl, job_id, "n1", T0 + 4, RankExit(rank=0, signal=15))
    assert state(ctl, job_id) is S.CANCELLED


def test_each_run_of_a_requeued_job_has_its_own_pmi_name_and_a_restart_keeps_it(
    store: Store, restart: Restart
) -> None:
    ctl = two_nodes(store)
    job_id = ctl.submit(dataclasses.replace(spec(2), requeue=True), T0).id
    last_run = launches(take(ctl))["n1"].kvsname
    launched(ctl, job_id, "n1", "n2")
    expire_n1(ctl, job_id)
    done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
    assert state(ctl, job_id) is S.PENDING  # requeued; n1 may still be wiping the last run's memory
    ctl = restart(ctl, T0 + 13)
    reg(ctl, "n1", now=T0 + 14)
    reg(ctl, "n2", now=T0 + 14)
    second = launches(take(ctl))
    assert set(second) == {"n1", "n2"} and second["n1"].kvsname == second["n2"].kvsname != last_run
    ctl = restart(ctl, T0 + 15)
    reg(ctl, "n1", now=T0 + 16, jobs=(job_id,))
    reg(ctl, "n2", now=T0 + 16, jobs=())
    assert launches(take(ctl)) == {"n2": second["n2"]}


def test_a_resent_launch_names_the_row_the_job_moved_to(store: Store, restart: Restart) -> None:
    ctl = gang(store)
    a = start(ctl)
    take(ctl)
    b = ctl.submit(spec(2), T0).id  # on row 1, not launched yet
    assert {n: m.row for n, m in launches(take(ctl)).items()} == {"n1": 1, "n2": 1}
    done(ctl, a, "n1", T0 + 1)
    done(ctl, a, "n2", T0 + 1)
    assert ctl.runs.active[b].row == 0
    take(ctl)
    reg(ctl, "n1", now=T0 + 2, jobs=(), nm="e2")  # n1's NM restarted: its launch of b went nowhere
    assert {n: m.row for n, m in launches(take(ctl)).items()} == {"n1": 0}
    ctl = restart(ctl, T0 + 3)
    reg(ctl, "n2", now=T0 + 4, jobs=())
    assert {n: m.row for n, m in launches(take(ctl)).items()} == {"n2": 0}


def test_a_job_placed_by_an_older_mm_has_no_launch_to_send_again(store: Store, restart: Restart) -> None:
    """Stores from before the PMI name was kept: a node that missed the launch has lost the job, as then."""
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    take(ctl)
    with closing(sqlite3.connect(store.path)) as other:  # what the migration leaves such a job
        other.execute("UPDATE jobs SET kvsname = '' WHERE id = ?", (job_id,))
        other.commit()
    ctl = restart(ctl, T0 + 1)
    reg(ctl, "n1", now=T0 + 2, jobs=(job_id,))
    reg(ctl, "n2", now=T0 + 2, jobs=())
    assert launches(take(ctl)) == {} and ctl.runs.active[job_id].ending is S.NODE_FAIL
