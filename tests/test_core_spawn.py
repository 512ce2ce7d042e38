"""The MM's side of dynamic processes (mm/core.py, mm/runs.py), driven directly: MPI's name service
(publish, lookup, unpublish), what jobs spawned, and a spawned process's failure ending its job."""

from __future__ import annotations

from storm.mm import protocol as p
from storm.mm.names import NAMES_PER_USER
from storm.mm.protocol import RankExit
from storm.mm.store import Store
from tests.test_core import T0, Core, S, done, make, reg, running, state, stored, take, two_nodes

PORT = "tag#0$connentry#0200A7F1$"


def name(
    ctl: Core, job_id: int, node: str, action: str, service: str, port: str = "", seq: int = 1
) -> p.Message:
    """Send a pmi_name as the job's node manager would; return what goes back to that node."""
    msg = p.PmiName(job_id=job_id, node=node, seq=seq, action=action, service=service, port=port)
    error = ctl.pmi_name(msg, T0 + 2)
    if error is not None:
        return error
    out = take(ctl)
    assert len(out) == 1 and out[0][0] == node, out
    return out[0][1]


def ok(port: str = "", seq: int = 1, job_id: int = 1) -> p.PmiNameResult:
    return p.PmiNameResult(job_id=job_id, seq=seq, ok=True, port=port)


def test_publish_lookup_unpublish_within_a_job_and_across_jobs_of_one_user(store: Store) -> None:
    ctl = two_nodes(store)
    first, second = running(ctl, 1), running(ctl, 1)
    n1, n2 = ctl.runs.active[first].nodes[0], ctl.runs.active[second].nodes[0]
    assert name(ctl, first, n1, "publish", "ocean", PORT) == ok(job_id=first)
    # any process of the same job, or of another job of the same user, finds it
    assert name(ctl, first, n1, "lookup", "ocean", seq=2) == ok(PORT, seq=2, job_id=first)
    assert name(ctl, second, n2, "lookup", "ocean", seq=7) == ok(PORT, seq=7, job_id=second)
    # the same publish again (its answer was lost, the shell timed out and the program retried): done
    assert name(ctl, first, n1, "publish", "ocean", PORT) == ok(job_id=first)
    # another job of the user cannot take it, nor unpublish it
    taken = name(ctl, second, n2, "publish", "ocean", "tag#1$other$")
    assert isinstance(taken, p.PmiNameResult) and not taken.ok
    assert taken.error == f"storm: the name 'ocean' is already published by job {first} of user alice"
    stolen = name(ctl, second, n2, "unpublish", "ocean")
    assert isinstance(stolen, p.PmiNameResult) and not stolen.ok
    assert stolen.error == f"storm: job {first}, not job {second}, has published the name 'ocean'"
    assert name(ctl, first, n1, "unpublish", "ocean") == ok(job_id=first)
    gone = name(ctl, second, n2, "lookup", "ocean")
    assert isinstance(gone, p.PmiNameResult) and not gone.ok and gone.port == ""
    assert gone.error == "storm: no job of user alice has published the name 'ocean'"  # at once: no waiting
    again = name(ctl, first, n1, "unpublish", "ocean")
    assert (
        isinstance(again, p.PmiNameResult) and again.error == "storm: no job has published the name 'ocean'"
    )


def test_names_are_per_user(store: Store) -> None:
    ctl = two_nodes(store)
    alices, bobs = running(ctl, 1), running(ctl, 1, uid=1001, user="bob")
    a, b = ctl.runs.active[alices].nodes[0], ctl.runs.active[bobs].nodes[0]
    assert name(ctl, alices, a, "publish", "svc", PORT) == ok(job_id=alices)
    unseen = name(ctl, bobs, b, "lookup", "svc")
    assert isinstance(unseen, p.PmiNameResult) and not unseen.ok and "user bob" in unseen.error
    assert name(ctl, bobs, b, "publish", "svc", "tag#9$bob$") == ok(job_id=bobs)  # bob's own "svc"
    assert name(ctl, alices, a, "lookup", "svc") == ok(PORT, job_id=alices)
    assert name(ctl, bobs, b, "lookup", "svc") == ok("tag#9$bob$", job_id=bobs)


def test_a_job_s_names_end_with_it(store: Store) -> None:
    ctl = two_nodes(store)
    owner, other = running(ctl, 1), running(ctl, 1)
    node, other_node = ctl.runs.active[owner].nodes[0], ctl.runs.active[other].nodes[0]
    assert name(ctl, owner, node, "publish", "a", PORT) == ok(job_id=owner)
    assert name(ctl, owner, node, "publish", "b", PORT) == ok(job_id=owner)
    done(ctl, owner, node, T0 + 3)
    assert state(ctl, owner) is S.COMPLETED
    for service in ("a", "b"):
        lookup = name(ctl, other, other_node, "lookup", service)
        assert isinstance(lookup, p.PmiNameResult) and not lookup.ok
    assert name(ctl, other, other_node, "publish", "a", "tag#2$") == ok(job_id=other)  # free again
    # the ended job's node may still ask (a late request): it is told the job has ended
    late = name(ctl, owner, node, "lookup", "a")
    assert isinstance(late, p.PmiNameResult) and late.error == f"storm: job {owner} has ended"


def test_an_ending_job_publishes_nothing_and_a_node_speaks_only_for_its_jobs(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl, 1)
    node = ctl.runs.active[job_id].nodes[0]
    elsewhere = "n2" if node == "n1" else "n1"
    refused = name(ctl, job_id, elsewhere, "publish", "x", PORT)
    assert isinstance(refused, p.Error) and refused.code == "bad_request"
    assert "has no ranks on" in refused.text
    ctl.cancel((job_id,), 1000, "alice", T0 + 1)
    take(ctl)
    ending = name(ctl, job_id, node, "publish", "x", PORT)
    assert isinstance(ending, p.PmiNameResult) and not ending.ok
    assert ending.error == f"storm: job {job_id} is ending (cancelled by alice)"


def test_a_user_may_publish_only_so_many_names(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl, 1)
    node = ctl.runs.active[job_id].nodes[0]
    names = ctl.runs.names
    for i in range(NAMES_PER_USER):
        answer = names.request("publish", uid=1000, user="alice", job_id=job_id, service=f"s{i}", port="p")
        assert answer[1] == ""
    full = name(ctl, job_id, node, "publish", "one-more", PORT)
    assert isinstance(full, p.PmiNameResult) and "has 1024 names published" in full.error


def test_names_are_soft_state_a_restarted_mm_knows_none(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl, 1)
    node = ctl.runs.active[job_id].nodes[0]
    assert name(ctl, job_id, node, "publish", "x", PORT) == ok(job_id=job_id)
    restarted = make(store, epoch="mm-2")
    reg(restarted, node, jobs=(job_id,))
    take(restarted)
    lookup = name(restarted, job_id, node, "lookup", "x")
    assert isinstance(lookup, p.PmiNameResult) and not lookup.ok  # the owner must publish again
    assert name(restarted, job_id, node, "publish", "x", PORT) == ok(job_id=job_id)


def test_spawns_are_counted_once_durably_and_shown(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl, 2)
    view = ctl.spawns_view(job_id)
    assert (view.spawns, view.processes, view.refused) == (0, 0, 0)
    for node, world, processes in (("n1", 1, 2), ("n1", 2, 3), ("n2", 1, 1), ("n1", 2, 3)):  # n1's 2: again
        ctl.job_spawned(p.JobSpawned(job_id=job_id, node=node, world=world, processes=processes), T0 + 2)
    refusal = "storm: MPI_Comm_spawn of 9 process(es) refused for job 1 on node n2"
    ctl.job_spawned(p.JobSpawned(job_id=job_id, node="n2", world=0, processes=0, refused=refusal), T0 + 2)
    assert take(ctl) == []
    view = ctl.spawns_view(job_id)
    assert (view.spawns, view.processes, view.refused, view.last_refusal) == (3, 6, 1, refusal)
    done(ctl, job_id, "n1", T0 + 3)
    done(ctl, job_id, "n2", T0 + 3)
    assert state(ctl, job_id) is S.COMPLETED
    assert make(store, epoch="mm-2").spawns_view(job_id) == view  # kept after the end, and a restart


def test_a_spawned_process_failing_fails_the_job(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl, 2)
    exit_ = RankExit(rank=1, exit_code=3)
    ctl.spawn_failed(p.SpawnFailed(job_id=job_id, node="n2", world=2, parent=1, exit=exit_), T0 + 2)
    assert {(n, m.job_id) for n, m in take(ctl) if isinstance(m, p.KillJob)} == {
        ("n1", job_id),
        ("n2", job_id),
    }
    done(ctl, job_id, "n1", T0 + 3)
    done(ctl, job_id, "n2", T0 + 3, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert (job.state, job.exit_code) == (S.FAILED, 3)
    assert job.reason == "spawned process 1 of spawn 2 (from rank 1) exited with code 3 on n2"
    # a report from a node with no ranks of the job is refused, and changes nothing
    other = running(ctl, 1)
    foreign = "n2" if ctl.runs.active[other].nodes[0] == "n1" else "n1"
    error = ctl.spawn_failed(p.SpawnFailed(job_id=other, node=foreign, world=1, parent=0, exit=exit_), T0 + 4)
    assert isinstance(error, p.Error) and state(ctl, other) is S.RUNNING
