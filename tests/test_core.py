"""The MM's decisions (mm/core.py), driven directly: time passed in, no sockets, and each scenario on both
stores, SQLite on disk and memory (mm/memory_store.py), which must decide alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode, Rejected
from storm.mm.effects import Effect, JobEnded, Publish, Reply, Send, Wait
from storm.mm.jobs import Job, JobSpec
from storm.mm.memory_store import MemoryStore
from storm.mm.protocol import KillJob, LaunchJob, RankExit
from storm.mm.rights import Account, Credentials
from storm.mm.runs import seeded_nonces
from storm.mm.states import JobState
from storm.mm.storage import Storage
from storm.mm.store import Store

T0 = 1000.0
S = JobState
Out = list[tuple[str, p.Message]]


@pytest.fixture(params=["sqlite", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """Each scenario in this file runs on a real SQLite store and on the in-memory one."""
    if request.param == "memory":
        yield MemoryStore()
        return
    s = Store(tmp_path / "storm.db")
    yield s
    s.close()


class Core(Controller):
    """The controller driven as storm-mm drives it: every message through ``handle``, as the client or the
    node manager it names, then the pass it made due (storm-mm runs one once the messages that arrived
    together are handled: here each arrives alone), and every effect recorded for the test to read:
    messages for nodes in ``outbox`` (``take`` empties it), ended jobs in ``ended``, clients told to wait in
    ``waits``."""

    def __init__(self, store: Storage, config: MMConfig, now: float, epoch: str, **kw: object) -> None:
        super().__init__(store, config, epoch, nonce=seeded_nonces(epoch), **kw)  # type: ignore[arg-type]
        self.outbox: Out = []
        self.ended: list[p.JobInfo] = []
        self.waits: list[Wait] = []
        self.record(self.recover(now))

    def record(self, effects: list[Effect]) -> p.Message | None:
        """Keep the effects; the reply, if there is one."""
        reply = None
        for effect in effects:
            match effect:
                case Send():
                    self.outbox.append((effect.node, effect.message))
                case Reply():
                    reply = effect.message
                case JobEnded():
                    self.ended.append(effect.info)
                case Wait():
                    self.waits.append(effect)
                case Publish():
                    pass
        return reply

    def handle(self, message: p.Message, now: float, caller: Credentials | FromNode) -> list[Effect]:
        return super().handle(message, now, caller) + self.schedule(now)

    def tick(self, now: float) -> list[Effect]:
        effects = super().tick(now) + self.schedule(now)
        self.record(effects)
        return effects

    def ask(self, msg: p.Message, now: float, uid: int = 1000, user: str = "alice") -> p.Message | None:
        """A client's request (uid, group 100, user); the reply."""
        return self.record(self.handle(msg, now, Account(uid, 100, user)))

    def report(self, msg: p.Message, now: float) -> p.Message | None:
        """A node manager's message, from the node it names; the reply."""
        return self.record(self.handle(msg, now, FromNode(getattr(msg, "node", ""))))

    def submit(self, spec: JobSpec, now: float) -> Job:
        """Submit what ``spec`` says as its user; Rejected as the client would hear it."""
        msg = p.SubmitJob(
            ranks=spec.ranks, argv=spec.argv, cwd=spec.cwd, env=spec.env, name=spec.name,
            time_limit=spec.time_limit, output=spec.output, error=spec.error, requeue=spec.requeue,
            hook=spec.hook,
        )  # fmt: skip
        reply = self.record(self.handle(msg, now, Account(spec.uid, spec.gid, spec.user)))
        if isinstance(reply, p.Error):
            raise Rejected(reply.code, reply.text)
        assert isinstance(reply, p.JobSubmitted)
        job = self.runs.job(reply.job_id)
        assert job is not None
        return job

    def cancel(self, job_ids: tuple[int, ...], uid: int, user: str, now: float) -> dict[str, str]:
        reply = self.ask(p.CancelJobs(job_ids=job_ids), now, uid, user)
        assert isinstance(reply, p.CancelResult)
        return reply.results

    def beat(self, now: float) -> p.Heartbeat | None:
        effects = self.heartbeat(now)
        return effects[0].heartbeat if effects and isinstance(effects[0], Publish) else None

    def node_infos(self) -> list[p.NodeInfo]:
        reply = self.ask(p.ListNodes(), T0)
        assert isinstance(reply, p.NodeList)
        return list(reply.nodes)

    def matrix_view(self) -> p.MatrixView:
        reply = self.ask(p.GetMatrix(), T0)
        assert isinstance(reply, p.MatrixView)
        return reply

    # Node reports by kind, as the tests name them: each goes through handle like any other.

    def register(self, msg: p.RegisterNode, now: float) -> p.NodeRegistered:
        reply = self.report(msg, now)
        assert isinstance(reply, p.NodeRegistered), reply
        return reply

    def node_status(self, msg: p.NodeStatus, now: float) -> p.Message | None:
        return self.report(msg, now)

    def job_node_done(self, msg: p.JobNodeDone, now: float) -> p.Message | None:
        """None when the report is taken (its ack), else the error."""
        reply = self.report(msg, now)
        return None if isinstance(reply, p.Ack) else reply

    job_launched = rank_failed = pmi_barrier_in = job_stats = job_spawned = spawn_failed = pmi_name = report


def make(store: Storage, now: float = T0, epoch: str = "mm-1", **config: float) -> Core:
    return Core(store, MMConfig(node_timeout=10.0, **config), now, epoch)  # type: ignore[arg-type]


def spec(ranks: int, uid: int = 1000, user: str = "alice", time_limit: float | None = None) -> JobSpec:
    return JobSpec(
        name="app", uid=uid, gid=100, user=user, ranks=ranks, argv=("/bin/app", "-x"), cwd="/home/alice",
        env={"PATH": "/bin"}, time_limit=time_limit, output="/home/alice/o-%j", error="",
    )  # fmt: skip


def reg(
    ctl: Core,
    node: str,
    pes: int = 1,
    now: float = T0,
    jobs: tuple[int, ...] = (),
    nm: str = "e1",
    host: str = "",
) -> p.NodeRegistered:
    msg = p.RegisterNode(
        node=node, pes=pes, nm_epoch=f"{node}-{nm}", address=f"{node}:1", jobs=jobs, host=host
    )
    return ctl.register(msg, now)


def status(
    ctl: Core,
    node: str,
    now: float,
    jobs: tuple[int, ...] = (),
    nm: str = "e1",
    launched: tuple[int, ...] | None = None,
) -> p.Reregister | None:
    """The node lists ``jobs``, whose ranks have all started unless ``launched`` says which did."""
    msg = p.NodeStatus(
        node=node, nm_epoch=f"{node}-{nm}", mm_epoch=ctl.mm_epoch, jobs=jobs,
        launched=jobs if launched is None else launched,
    )  # fmt: skip
    return ctl.node_status(msg, now)


def alive(ctl: Core, now: float) -> None:
    """Every UP node reports, listing its active jobs."""
    for node in ctl.registry.all():
        if node.state == "UP" and node.confirmed:
            jobs = tuple(j.id for j in ctl.runs.active.values() if node.name in j.nodes)
            assert status(ctl, node.name, now, jobs=jobs) is None


def take(ctl: Core) -> Out:
    out, ctl.outbox = ctl.outbox, []
    return out


def launches(out: Out) -> dict[str, LaunchJob]:
    found = [(n, m) for n, m in out if isinstance(m, LaunchJob)]
    assert len({n for n, _ in found}) == len(found), "two launches to one node"
    return dict(found)


def kills(out: Out) -> set[tuple[str, int]]:
    return {(n, m.job_id) for n, m in out if isinstance(m, KillJob)}


def submit(ctl: Core, ranks: int, now: float = T0, **kw: object) -> int:
    return ctl.submit(spec(ranks, **kw), now).id  # type: ignore[arg-type]


def done(ctl: Core, job_id: int, node: str, now: float, *exits: RankExit) -> None:
    if not exits:
        job = ctl.runs.active[job_id]
        exits = tuple(RankExit(rank=r, exit_code=0) for r, (n, _) in enumerate(job.placement) if n == node)
    ctl.job_node_done(p.JobNodeDone(job_id=job_id, node=node, exits=exits), now)


def launched(ctl: Core, job_id: int, *nodes: str, now: float = T0 + 1) -> None:
    for node in nodes:
        ctl.job_launched(p.JobLaunched(job_id=job_id, node=node, pids={"0": 1}), now)


def stored(store: Store, job_id: int) -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def state(ctl: Core, job_id: int) -> JobState:
    return stored(ctl.store, job_id).state


def two_nodes(store: Store, **config: float) -> Core:
    ctl = make(store, **config)
    reg(ctl, "n1")
    reg(ctl, "n2")
    return ctl


def running(ctl: Core, ranks: int = 2, **kw: object) -> int:
    job_id = submit(ctl, ranks, **kw)
    launched(ctl, job_id, *ctl.runs.active[job_id].nodes)
    take(ctl)
    assert state(ctl, job_id) is S.RUNNING
    return job_id


# ---------------------------------------------------------------------------------------------- submit


def test_submit_without_nodes(store: Store) -> None:
    ctl = make(store)
    with pytest.raises(Rejected) as info:
        ctl.submit(spec(1), T0)
    assert info.value.code == "no_nodes"
    assert store.jobs() == [] and ctl.outbox == []


def test_submit_more_ranks_than_pes(store: Store) -> None:
    ctl = two_nodes(store)
    with pytest.raises(Rejected) as info:
        ctl.submit(spec(3), T0)
    assert info.value.code == "too_many_ranks"
    assert str(info.value) == "3 ranks requested, but the cluster has only 2 PEs"
    assert store.jobs() == [] and ctl.outbox == []


def test_start_sends_one_launch_per_node(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2, now=T0 + 5)
    assert state(ctl, job_id) is S.STARTING
    placed = stored(store, job_id)
    assert placed.start_time == T0 + 5 and placed.placement == (("n1", 0), ("n2", 0))
    sent = take(ctl)
    assert len(sent) == 2
    by_node = launches(sent)
    assert set(by_node) == {"n1", "n2"}
    one, two = by_node["n1"], by_node["n2"]
    assert (one.node_index, one.slots) == (0, (p.RankSlot(rank=0, pe=0),))
    assert (two.node_index, two.slots) == (1, (p.RankSlot(rank=1, pe=0),))
    assert one.kvsname == two.kvsname and one.kvsname.startswith(f"storm_{job_id}_")
    for launch in (one, two):
        assert (launch.job_id, launch.size, launch.ranks_per_node) == (job_id, 2, (1, 1))
        assert (launch.argv, launch.cwd, launch.uid, launch.gid, launch.user) == (
            ("/bin/app", "-x"), "/home/alice", 1000, 100, "alice",
        )  # fmt: skip
        assert launch.env == {"PATH": "/bin"} and launch.output == "/home/alice/o-%j"


def test_block_distribution_on_wider_nodes(store: Store) -> None:
    ctl = make(store)
    reg(ctl, "n1", pes=4)
    reg(ctl, "n2", pes=4)
    job_id = submit(ctl, 6)
    by_node = launches(take(ctl))
    assert by_node["n1"].ranks_per_node == by_node["n2"].ranks_per_node == (4, 2)
    assert [s.rank for s in by_node["n1"].slots] == [0, 1, 2, 3]
    assert [(s.rank, s.pe) for s in by_node["n2"].slots] == [(4, 0), (5, 1)]
    assert by_node["n1"].job_id == by_node["n2"].job_id == job_id


def test_launched_from_every_node_makes_it_running(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    launched(ctl, job_id, "n1")
    assert state(ctl, job_id) is S.STARTING
    launched(ctl, job_id, "n1")  # repeated: still waiting for n2
    assert state(ctl, job_id) is S.STARTING
    launched(ctl, job_id, "n2", now=T0 + 3)
    job = stored(store, job_id)
    assert job.state is S.RUNNING and job.start_time == T0  # started when placed


def test_completion_frees_the_pes_for_the_queue(store: Store) -> None:
    ctl = two_nodes(store)
    first = running(ctl)
    second = submit(ctl, 2, now=T0 + 1)
    assert state(ctl, second) is S.PENDING and ctl.outbox == []
    done(ctl, first, "n1", T0 + 9)
    assert state(ctl, first) is S.RUNNING and ctl.ended == [] and ctl.outbox == []
    done(ctl, first, "n2", T0 + 10)
    finished = stored(store, first)
    assert (finished.state, finished.exit_code, finished.end_time) == (S.COMPLETED, 0, T0 + 10)
    assert finished.reason == ""
    assert ctl.ended == [finished.info()]
    assert ctl.runs.matrix.placement_of(first) is None
    assert state(ctl, second) is S.STARTING  # at once, not at the next tick
    assert set(launches(take(ctl))) == {"n1", "n2"}


def test_second_node_reports_first(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    done(ctl, job_id, "n2", T0 + 2)
    assert state(ctl, job_id) is S.RUNNING
    done(ctl, job_id, "n1", T0 + 3)
    assert state(ctl, job_id) is S.COMPLETED


def test_a_failed_rank_in_the_final_report(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    done(ctl, job_id, "n1", T0 + 2, RankExit(rank=0, signal=11))
    assert kills(take(ctl)) == {("n2", job_id)}
    done(ctl, job_id, "n2", T0 + 3, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert (job.state, job.exit_code, job.reason) == (S.FAILED, 139, "rank 0 killed by signal 11 on n1")


@pytest.mark.parametrize("n2_done_first", [False, True])
def test_rank_failed(store: Store, n2_done_first: bool) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    if n2_done_first:
        done(ctl, job_id, "n2", T0 + 1)
    ctl.rank_failed(p.RankFailed(job_id=job_id, node="n1", exit=RankExit(rank=0, exit_code=3)), T0 + 2)
    expected = {("n1", job_id)} if n2_done_first else {("n1", job_id), ("n2", job_id)}
    assert kills(take(ctl)) == expected
    assert state(ctl, job_id) is S.RUNNING  # the ranks are not gone yet
    if not n2_done_first:
        done(ctl, job_id, "n2", T0 + 3, RankExit(rank=1, signal=15))
    done(ctl, job_id, "n1", T0 + 4, RankExit(rank=0, exit_code=3))
    job = stored(store, job_id)
    assert (job.state, job.exit_code, job.reason) == (S.FAILED, 3, "rank 0 exited with code 3 on n1")


# ---------------------------------------------------------------------------------------------- cancel


def test_cancel_pending(store: Store) -> None:
    ctl = two_nodes(store)
    running(ctl)
    queued = submit(ctl, 1)
    assert ctl.cancel((queued,), 1000, "alice", T0 + 5) == {str(queued): "cancelled"}
    job = stored(store, queued)
    assert (job.state, job.end_time, job.reason) == (S.CANCELLED, T0 + 5, "cancelled by alice")
    assert ctl.ended == [job.info()] and ctl.outbox == [] and queued not in ctl.runs.pending


def test_cancel_running_waits_for_every_node(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    assert ctl.cancel((job_id,), 1000, "alice", T0 + 5) == {str(job_id): "cancelling"}
    sent = take(ctl)
    assert kills(sent) == {("n1", job_id), ("n2", job_id)}
    assert {m.reason for _, m in sent if isinstance(m, KillJob)} == {"cancelled by alice"}
    assert state(ctl, job_id) is S.RUNNING
    done(ctl, job_id, "n1", T0 + 6, RankExit(rank=0, signal=15))
    assert state(ctl, job_id) is S.RUNNING and ctl.ended == []
    done(ctl, job_id, "n2", T0 + 7, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert (job.state, job.exit_code, job.end_time) == (S.CANCELLED, 143, T0 + 7)
    assert job.reason == "cancelled by alice"


def test_cancel_starting_job(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    take(ctl)
    assert ctl.cancel((job_id,), 0, "root", T0 + 1) == {str(job_id): "cancelling"}
    done(ctl, job_id, "n1", T0 + 2)
    done(ctl, job_id, "n2", T0 + 2)
    job = stored(store, job_id)
    assert (job.state, job.exit_code) == (S.CANCELLED, None)


def test_cancel_permissions_and_unknown_jobs(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    assert ctl.cancel((job_id, 999), 2000, "bob", T0) == {
        str(job_id): f"permission denied: job {job_id} belongs to alice",
        "999": "unknown job",
    }
    assert ctl.outbox == [] and state(ctl, job_id) is S.RUNNING
    assert ctl.cancel((job_id,), 0, "root", T0) == {str(job_id): "cancelling"}
    done(ctl, job_id, "n1", T0 + 1)
    done(ctl, job_id, "n2", T0 + 1)
    assert ctl.cancel((job_id,), 1000, "alice", T0 + 2) == {str(job_id): "already CANCELLED"}


def test_kill_timeout_ends_a_job_whose_node_never_confirms(store: Store) -> None:
    ctl = two_nodes(store, kill_timeout=30.0)
    job_id = running(ctl)
    ctl.cancel((job_id,), 1000, "alice", T0)
    done(ctl, job_id, "n1", T0 + 1)
    status(ctl, "n1", T0 + 29)
    status(ctl, "n2", T0 + 29)
    ctl.tick(T0 + 30)
    assert state(ctl, job_id) is S.RUNNING
    ctl.tick(T0 + 30.5)
    assert state(ctl, job_id) is S.CANCELLED


# ---------------------------------------------------------------------------------------------- time


def test_time_limit(store: Store) -> None:
    ctl = two_nodes(store)
    assert ctl.next_deadline(T0) is None  # no job has a limit: the driver ticks at its own pace
    job_id = running(ctl, time_limit=60.0)
    start = ctl.runs.active[job_id].start_time
    assert start is not None and ctl.next_deadline(T0 + 1) == start + 60.0  # when to tick to end it on time
    alive(ctl, T0 + 55)
    ctl.tick(T0 + 60)
    assert ctl.outbox == []
    ctl.tick(T0 + 60.5)
    sent = take(ctl)
    assert kills(sent) == {("n1", job_id), ("n2", job_id)}
    assert {m.reason for _, m in sent if isinstance(m, KillJob)} == {"time limit of 0:01:00 reached"}
    ctl.tick(T0 + 61)
    assert kills(take(ctl)) == set()  # the kill is sent once
    done(ctl, job_id, "n1", T0 + 61, RankExit(rank=0, signal=15))
    done(ctl, job_id, "n2", T0 + 61, RankExit(rank=1, exit_code=0))
    job = stored(store, job_id)
    assert (job.state, job.exit_code, job.reason) == (S.TIMEOUT, 143, "time limit of 0:01:00 reached")


def test_default_time_limit(store: Store) -> None:
    ctl = two_nodes(store, default_time_limit=30.0)
    assert stored(store, submit(ctl, 1)).spec.time_limit == 30.0


def expire_n1(ctl: Core, job_id: int) -> None:
    """n2 keeps reporting, n1 falls silent; n1 is DOWN after the tick."""
    status(ctl, "n2", T0 + 8, jobs=(job_id,))
    ctl.tick(T0 + 10)
    assert ctl.registry.usable() == {"n1", "n2"}
    ctl.tick(T0 + 11)


def test_node_expiry_fails_its_job(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    expire_n1(ctl, job_id)
    assert [(n.name, n.state) for n in store.nodes()] == [("n1", "DOWN"), ("n2", "UP")]
    assert kills(take(ctl)) == {("n2", job_id)}
    assert state(ctl, job_id) is S.RUNNING  # n2's rank may still run
    done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert job.state is S.NODE_FAIL
    assert job.reason == "node n1 DOWN: no report for 11.0 s"
    assert job.exit_code == 143  # what the surviving rank died of; nothing is invented for the lost one
    assert status(ctl, "n1", T0 + 13) is not None  # a DOWN node must register again


def test_node_expiry_keeps_the_surviving_pes_until_they_report(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    queued = submit(ctl, 1)
    expire_n1(ctl, job_id)
    assert launches(take(ctl)) == {}, "a new job landed on n2 while the old rank is still being killed"
    done(ctl, job_id, "n2", T0 + 12, RankExit(rank=1, signal=15))
    assert set(launches(take(ctl))) == {"n2"} and state(ctl, queued) is S.STARTING


# ---------------------------------------------------------------------------------------------- nodes


def test_status_from_unknown_or_stale_senders(store: Store) -> None:
    ctl = two_nodes(store)
    assert status(ctl, "n1", T0 + 1) is None
    assert isinstance(status(ctl, "n9", T0 + 1), p.Reregister)
    assert isinstance(status(ctl, "n1", T0 + 1, nm="old"), p.Reregister)
    old_mm = p.NodeStatus(node="n1", nm_epoch="n1-e1", mm_epoch="mm-0", jobs=())
    assert isinstance(ctl.node_status(old_mm, T0 + 1), p.Reregister)
    status(ctl, "n1", T0 + 9)
    ctl.tick(T0 + 10.5)  # n2 last reported at T0: DOWN; n1 at T0 + 9: UP
    assert {n.name: n.state for n in ctl.registry.all()} == {"n1": "UP", "n2": "DOWN"}


def test_status_listing_an_unknown_job_kills_it(store: Store) -> None:
    ctl = two_nodes(store)
    assert status(ctl, "n2", T0 + 1, jobs=(77,)) is None
    sent = take(ctl)
    assert kills(sent) == {("n2", 77)}
    # A launch report of a job the MM never placed there is refused (see test_core_reports.py); the node's
    # next status, listing the job, has it killed.
    assert status(ctl, "n1", T0 + 1, jobs=(78,)) is None
    assert kills(take(ctl)) == {("n1", 78)}


def test_status_listing_a_starting_job_marks_it_launched(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    status(ctl, "n1", T0 + 1, jobs=(job_id,))
    assert state(ctl, job_id) is S.STARTING
    status(ctl, "n2", T0 + 2, jobs=(job_id,))
    assert state(ctl, job_id) is S.RUNNING
    assert kills(ctl.outbox) == set()


def test_a_listed_job_whose_shell_is_still_starting_stays_starting(store: Store) -> None:
    """A node holds the job, but its ranks have not started yet (a slow fork): not RUNNING until they have."""
    ctl = two_nodes(store)
    job_id = submit(ctl, 2)
    status(ctl, "n1", T0 + 1, jobs=(job_id,))
    status(ctl, "n2", T0 + 2, jobs=(job_id,), launched=())
    assert state(ctl, job_id) is S.STARTING
    assert kills(take(ctl)) == set()
    status(ctl, "n2", T0 + 3, jobs=(job_id,))
    assert state(ctl, job_id) is S.RUNNING


def test_register_reports_stale_jobs(store: Store) -> None:
    ctl = two_nodes(store)
    live = running(ctl, ranks=1)
    finished = running(ctl, ranks=1)
    node_of = {j: ctl.runs.active[j].nodes[0] for j in (live, finished)}
    done(ctl, finished, node_of[finished], T0 + 2)
    reply = reg(ctl, node_of[live], now=T0 + 3, jobs=(555, finished, live))
    assert reply.stale_jobs == (finished, 555)
    assert (reply.node, reply.mm_epoch, reply.report_interval) == (node_of[live], "mm-1", 2.0)
    assert state(ctl, live) is S.RUNNING


def test_reregistered_node_that_forgot_a_job(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    reg(ctl, "n1", now=T0 + 3, nm="e2", jobs=())  # its NM restarted and lost the ranks
    assert kills(take(ctl)) == {("n2", job_id)}
    done(ctl, job_id, "n2", T0 + 4, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert job.state is S.NODE_FAIL
    assert job.reason == "node n1: its node manager no longer knows the job"


def test_pmi_barrier(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    ctl.pmi_barrier_in(p.PmiBarrierIn(job_id=job_id, node="n1", seq=0, kvs={"a": "1", "x": "n1"}), T0)
    ctl.pmi_barrier_in(p.PmiBarrierIn(job_id=job_id, node="n3", seq=0, kvs={"evil": "1"}), T0)  # not its node
    ctl.pmi_barrier_in(p.PmiBarrierIn(job_id=999, node="n2", seq=0, kvs={}), T0)
    ctl.pmi_barrier_in(p.PmiBarrierIn(job_id=job_id, node="n1", seq=1, kvs={"b": "2"}), T0)
    assert ctl.outbox == []
    ctl.pmi_barrier_in(p.PmiBarrierIn(job_id=job_id, node="n2", seq=0, kvs={"c": "3", "x": "n2"}), T0)
    sent = take(ctl)
    assert sorted(n for n, _ in sent) == ["n1", "n2"]
    merged = {"a": "1", "c": "3", "x": "n2"}
    assert all(m == p.PmiBarrierOut(job_id=job_id, seq=0, kvs=merged) for _, m in sent)
    ctl.pmi_barrier_in(p.PmiBarrierIn(job_id=job_id, node="n2", seq=1, kvs={}), T0)
    assert [m for _, m in take(ctl)] == [p.PmiBarrierOut(job_id=job_id, seq=1, kvs={"b": "2"})] * 2


def test_repeated_node_reports_are_harmless(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    done(ctl, job_id, "n1", T0 + 1)
    done(ctl, job_id, "n1", T0 + 2)
    assert state(ctl, job_id) is S.RUNNING
    done(ctl, job_id, "n2", T0 + 3)
    final = stored(store, job_id)
    done(ctl, job_id, "n2", T0 + 4, RankExit(rank=1, exit_code=0))
    done(ctl, job_id, "n1", T0 + 4, RankExit(rank=0, exit_code=9))
    launched(ctl, job_id, "n1", now=T0 + 5)
    assert stored(store, job_id) == final and final.state is S.COMPLETED
    assert len(ctl.ended) == 1
    assert kills(take(ctl)) == {("n1", job_id)}  # only the late launch report earns a kill


# ---------------------------------------------------------------------------------------------- restart


def before_restart(store: Store) -> tuple[int, int]:
    """n1, n2 with 1 PE: job A (1 rank, 60 s limit) runs on n1, job B (2 ranks) waits."""
    ctl = two_nodes(store)
    a = running(ctl, ranks=1, time_limit=60.0)
    b = submit(ctl, 2)
    assert ctl.runs.active[a].placement == (("n1", 0),) and state(ctl, b) is S.PENDING
    return a, b


def test_restart_keeps_queued_and_running_jobs(store: Store) -> None:
    a, b = before_restart(store)
    ctl = make(store, now=T0 + 20, epoch="mm-2")
    assert list(ctl.runs.pending) == [b] and list(ctl.runs.active) == [a]
    assert ctl.runs.active[a].state is S.RUNNING
    assert ctl.runs.matrix.placement_of(a) is not None and ctl.runs.matrix.placement_of(a).pes == (("n1", 0),)  # type: ignore[union-attr]
    infos = {n.name: n for n in ctl.node_infos()}
    assert infos["n1"].reason == "not registered since storm-mm started" and infos["n1"].jobs == (a,)
    assert isinstance(status(ctl, "n1", T0 + 21, jobs=(a,)), p.Reregister)  # its old MM epoch is gone
    reg(ctl, "n2", now=T0 + 21)
    reply = reg(ctl, "n1", now=T0 + 21, jobs=(a,))
    assert reply.stale_jobs == () and reply.mm_epoch == "mm-2"
    c = submit(ctl, 1, now=T0 + 22, time_limit=10.0)  # ends before A's limit: may backfill
    assert ctl.runs.active[c].placement == (("n2", 0),)  # n1's PE is still A's
    assert state(ctl, b) is S.PENDING
    assert {i.id: i.reason for i in ctl.job_infos()}[b] == "Resources"
    done(ctl, a, "n1", T0 + 30)
    assert state(ctl, a) is S.COMPLETED
    done(ctl, c, "n2", T0 + 31)
    assert state(ctl, b) is S.STARTING


def test_restart_still_enforces_the_time_limit(store: Store) -> None:
    a, _ = before_restart(store)
    ctl = make(store, now=T0 + 20, epoch="mm-2")
    reg(ctl, "n1", now=T0 + 21, jobs=(a,))
    status(ctl, "n1", T0 + 55)
    ctl.tick(T0 + 61)
    assert kills(take(ctl)) == {("n1", a)}


def test_restart_node_that_never_comes_back(store: Store) -> None:
    a, _ = before_restart(store)
    ctl = make(store, now=T0 + 20, epoch="mm-2")
    reg(ctl, "n2", now=T0 + 21)
    status(ctl, "n2", T0 + 29)
    ctl.tick(T0 + 30)
    assert state(ctl, a) is S.RUNNING
    ctl.tick(T0 + 30.5)
    job = stored(store, a)
    assert job.state is S.NODE_FAIL
    assert job.reason == "node n1 DOWN: no report for 10.5 s"
    assert {n.name: n.state for n in store.nodes()} == {"n1": "DOWN", "n2": "UP"}


def test_restart_with_a_down_node_keeps_the_surviving_pes(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    expire_n1(ctl, job_id)  # the job waits for n2's report when the MM stops
    ctl = make(store, now=T0 + 20, epoch="mm-2")
    assert kills(take(ctl)) == {("n2", job_id)}
    reg(ctl, "n2", now=T0 + 21, jobs=(job_id,))
    take(ctl)
    submit(ctl, 1, now=T0 + 22)
    assert launches(take(ctl)) == {}, "a new job landed on n2 while the old rank is still being killed"


# ---------------------------------------------------------------------------------------------- views


def test_job_infos_and_node_infos(store: Store) -> None:
    ctl = make(store)
    reg(ctl, "n1", pes=2)
    reg(ctl, "n2", pes=1)
    a = running(ctl, ranks=2)
    b = running(ctl, ranks=1)
    c = submit(ctl, 2)
    done(ctl, b, "n2", T0 + 5)
    assert [i.id for i in ctl.job_infos()] == [a, c]
    assert [i.id for i in ctl.job_infos(everything=True)] == [a, b, c]
    assert [(i.id, i.state) for i in ctl.job_infos((c, b, 404))] == [(c, "PENDING"), (b, "COMPLETED")]
    assert ctl.job_infos((c,))[0].reason == "Resources"  # the queue's reason, not the stored one
    assert stored(store, c).reason == ""
    infos = {n.name: n for n in ctl.node_infos()}
    assert [(n.pes, n.pes_used, n.jobs, n.state, n.reason) for n in infos.values()] == [
        (2, 2, (a,), "UP", ""),
        (1, 0, (), "UP", ""),
    ]
    assert infos["n1"].address == "n1:1" and infos["n1"].last_seen == T0


# ---------------------------------------------------------------------------------------------- backfill


def test_easy_backfilling(store: Store) -> None:
    ctl = two_nodes(store)
    long = running(ctl, ranks=1, time_limit=100.0)
    wide = submit(ctl, 2, now=T0 + 1)
    short = submit(ctl, 1, now=T0 + 2, time_limit=10.0)
    assert state(ctl, short) is S.STARTING and state(ctl, wide) is S.PENDING
    assert ctl.runs.active[short].nodes == ("n2",) and ctl.runs.active[long].nodes == ("n1",)
    assert {i.id: i.reason for i in ctl.job_infos()} == {long: "", wide: "Resources", short: ""}


def test_no_backfill_that_would_delay_the_head(store: Store) -> None:
    ctl = two_nodes(store)
    running(ctl, ranks=1, time_limit=100.0)
    wide = submit(ctl, 2, now=T0 + 1)
    late = submit(ctl, 1, now=T0 + 2, time_limit=200.0)
    assert state(ctl, late) is S.PENDING
    assert {i.id: i.reason for i in ctl.job_infos((wide, late))} == {wide: "Resources", late: "Priority"}


def test_a_kill_is_sent_again_when_the_node_registers_again(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    ctl.cancel((job_id,), 1000, "alice", T0 + 1)
    take(ctl)
    reg(ctl, "n1", now=T0 + 2, jobs=(job_id,))  # same NM, reconnected: the first kill may be lost
    assert kills(take(ctl)) == {("n1", job_id)}
    assert state(ctl, job_id) is S.RUNNING


def test_restart_remembers_a_cancel_in_progress(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    assert ctl.cancel((job_id,), 1000, "alice", T0 + 1) == {str(job_id): "cancelling"}
    ctl = make(store, now=T0 + 2, epoch="mm-2")
    reg(ctl, "n1", now=T0 + 3, jobs=(job_id,))
    reg(ctl, "n2", now=T0 + 3, jobs=(job_id,))
    done(ctl, job_id, "n1", T0 + 4, RankExit(rank=0, signal=15))
    done(ctl, job_id, "n2", T0 + 4, RankExit(rank=1, signal=15))
    job = stored(store, job_id)
    assert (job.state, job.reason) == (S.CANCELLED, "cancelled by alice")


def test_a_node_back_from_down_is_told_to_stop_the_lost_job(store: Store) -> None:
    ctl = two_nodes(store)
    job_id = running(ctl)
    expire_n1(ctl, job_id)  # a network partition: n1's NM and its rank are alive
    take(ctl)
    reply = reg(ctl, "n1", now=T0 + 12, jobs=(job_id,))
    assert ("n1", job_id) in kills(take(ctl)) or job_id in reply.stale_jobs


def test_restart_after_a_node_shrank_under_a_running_job(store: Store) -> None:
    ctl = make(store)
    reg(ctl, "n1", pes=4)
    job_id = running(ctl, ranks=4)
    reg(ctl, "n1", pes=2, now=T0 + 1, jobs=(job_id,))  # refused while the job holds n1:2 and n1:3
    assert ctl.runs.matrix.nodes() == {"n1": 4}
    restarted = make(store, now=T0 + 2, epoch="mm-2")  # must not raise
    assert list(restarted.runs.active) == [job_id]
