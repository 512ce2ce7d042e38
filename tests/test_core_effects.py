"""The MM core as a pure function of its inputs: one list of effects per stimulus, the same list for the same
inputs on either store, nothing from SQLite, the OS's randomness or the clock, and what one job costs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Effect, JobEnded, Publish, Reply, Send, Wait
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.storage import Storage
from storm.mm.store import Store

T0 = 1000.0
ALICE = Account(1000, 100, "alice")


def encoded(effects: list[Effect]) -> bytes:
    """The effects as the wire would carry them, with whom each is for."""
    parts = []
    for effect in effects:
        match effect:
            case Send():
                parts += [b"send", effect.node.encode(), p.encode(effect.message)]
            case Reply():
                parts += [b"reply", p.encode(effect.message)]
            case Wait():
                parts += [b"wait", str((effect.job_id, effect.req)).encode()]
            case JobEnded():
                parts += [b"ended", p.encode(p.JobList(jobs=(effect.info,)))]
            case Publish():
                parts += [b"publish", p.encode(effect.heartbeat)]
    return b"\0".join(parts)


def node(name: str, pes: int = 2, jobs: tuple[int, ...] = ()) -> p.RegisterNode:
    return p.RegisterNode(node=name, pes=pes, nm_epoch=f"{name}-e1", address=f"{name}:1", jobs=jobs)


def job(ranks: int, requeue: bool = False, time_limit: float | None = None) -> p.SubmitJob:
    return p.SubmitJob(
        ranks=ranks, argv=("/bin/app",), cwd="/home/alice", env={}, requeue=requeue, time_limit=time_limit
    )


def exits(*ranks: int, signal: int = 0) -> tuple[p.RankExit, ...]:
    return tuple(
        p.RankExit(rank=r, exit_code=0 if not signal else None, signal=signal or None) for r in ranks
    )


def workload(store: Storage, seed: int | str) -> list[bytes]:
    """Three nodes, five jobs: submit, launch, done, cancel, a time limit, a lost node and a requeue."""
    ctl = Controller(store, MMConfig(node_timeout=10.0, max_requeues=1), "mm-1", nonce=seeded_nonces(seed))
    out = [encoded(ctl.recover(T0))]

    def from_node(msg: p.Message, now: float) -> None:
        out.append(encoded(ctl.handle(msg, now, FromNode(getattr(msg, "node", "")))))

    def from_alice(msg: p.Message, now: float) -> None:
        out.append(encoded(ctl.handle(msg, now, ALICE)))

    def status(now: float, *names: str) -> None:
        for name in names:
            listed = tuple(j.id for j in ctl.runs.active.values() if name in j.nodes)
            from_node(p.NodeStatus(node=name, nm_epoch=f"{name}-e1", mm_epoch="mm-1", jobs=listed), now)

    def settle(now: float) -> None:
        """The driver's pass once everything of one instant is in, as a simulator runs it."""
        out.append(encoded(ctl.schedule(now)))

    settle(T0)
    for name in ("n1", "n2", "n3"):
        from_node(node(name), T0)
    settle(T0)
    from_alice(job(2), T0 + 1)  # 1: n1
    from_alice(job(4, requeue=True), T0 + 1)  # 2: n2, n3
    from_alice(job(2, time_limit=5.0), T0 + 1)  # 3: waits
    from_alice(p.WaitJob(req=7, job_id=1), T0 + 1)
    settle(T0 + 1)
    from_node(p.JobLaunched(job_id=1, node="n1", pids={"0": 10, "1": 11}), T0 + 2)
    for name in ("n2", "n3"):
        from_node(p.JobLaunched(job_id=2, node=name, pids={"0": 12}), T0 + 2)
    settle(T0 + 2)
    from_node(p.JobNodeDone(job_id=1, node="n1", exits=exits(0, 1)), T0 + 3)  # 1 done: 3 starts on n1
    settle(T0 + 3)
    from_node(p.JobLaunched(job_id=3, node="n1", pids={"0": 13}), T0 + 4)
    from_alice(job(1), T0 + 4)  # 4: waits
    settle(T0 + 4)
    from_alice(p.CancelJobs(req=8, job_ids=(4,)), T0 + 5)
    settle(T0 + 5)
    status(T0 + 8, "n1", "n2")  # n3 falls silent
    settle(T0 + 8)
    out.append(encoded(ctl.tick(T0 + 10.5)))  # job 3 over its limit
    settle(T0 + 10.5)
    out.append(encoded(ctl.tick(T0 + 12)))  # n3 DOWN: job 2 ends NODE_FAIL, to be requeued
    from_node(p.JobNodeDone(job_id=3, node="n1", exits=exits(0, 1, signal=15)), T0 + 12)
    from_node(p.JobNodeDone(job_id=2, node="n2", exits=exits(0, 1, signal=15)), T0 + 12)
    settle(T0 + 12)
    status(T0 + 13, "n1", "n2")  # n2 no longer lists job 2: its run is over, it may run again
    settle(T0 + 13)
    from_alice(job(1), T0 + 14)  # 5
    settle(T0 + 14)
    from_alice(p.ListJobs(req=9, all=True), T0 + 15)
    from_alice(p.ListNodes(req=10), T0 + 15)
    return out


def test_the_same_inputs_give_byte_identical_effects() -> None:
    store = MemoryStore()
    first, second = workload(store, seed=1), workload(MemoryStore(), seed=1)
    assert first == second
    # The workload went where it says: every kind of end, and a requeued job placed again.
    ends = {j.id: (j.state.value, j.requeues) for j in store.jobs()}
    assert ends == {
        1: ("COMPLETED", 0), 2: ("STARTING", 1), 3: ("TIMEOUT", 0), 4: ("CANCELLED", 0), 5: ("PENDING", 0)
    }  # fmt: skip
    everything = b"".join(first)
    assert everything.count(b"launch_job") == 1 + 2 + 1 + 2 and b"node n3 DOWN" in everything
    # The kvsname nonce is an input like any other: another seed, other launches.
    assert workload(MemoryStore(), seed=2) != first


def test_sqlite_and_memory_stores_decide_alike(tmp_path: Path) -> None:
    sqlite = Store(tmp_path / "storm.db")
    try:
        assert workload(sqlite, seed=1) == workload(MemoryStore(), seed=1)
    finally:
        sqlite.close()


def test_the_core_imports_neither_sqlite_nor_secrets() -> None:
    code = (
        "import sys, storm.mm.core, storm.mm.memory_store; "
        "print(sorted(m for m in ('sqlite3', 'secrets', 'storm.mm.store') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------- dispatch


@pytest.fixture
def ctl() -> Controller:
    ctl = Controller(MemoryStore(), MMConfig(node_timeout=10.0), "mm-1", nonce=seeded_nonces(0))
    assert ctl.recover(T0) == []
    return ctl


def test_a_reply_comes_first_and_everything_after_it_is_stored_already(ctl: Controller) -> None:
    ctl.handle(node("n1"), T0, FromNode("n1"))
    ctl.schedule(T0)
    assert ctl.handle(job(2), T0, ALICE) == [Reply(p.JobSubmitted(job_id=1))]
    queued = ctl.store.get_job(1)
    assert queued is not None and queued.state == "PENDING"  # stored before the client hears of it
    [launch] = ctl.schedule(T0)
    stored = ctl.store.get_job(1)
    assert isinstance(launch, Send) and isinstance(launch.message, p.LaunchJob)
    assert stored is not None and stored.state == "STARTING"
    assert ctl.store.wireups()[1][0] == launch.message.kvsname


def test_a_submission_runs_as_its_caller_with_storms_defaults(ctl: Controller) -> None:
    ctl.handle(node("n1"), T0, FromNode("n1"))
    ctl.handle(job(1), T0, Account(1001, 101, "bob"))
    spec = ctl.store.get_job(1).spec  # type: ignore[union-attr]
    assert (spec.uid, spec.gid, spec.user, spec.name) == (1001, 101, "bob", "app")
    assert spec.output == "/home/alice/storm-%j.out"
    asked = p.SubmitJob(req=3, ranks=1, argv=("/bin/app",), cwd="/", env={}, user="alice")
    [refused] = ctl.handle(asked, T0, Account(1001, 101, "bob"))
    assert isinstance(refused, Reply) and isinstance(refused.message, p.Error)
    assert (refused.message.req, refused.message.code) == (3, "permission_denied")
    assert ctl.store.get_job(2) is None


def test_messages_on_the_wrong_link_or_from_the_wrong_sender_change_nothing(ctl: Controller) -> None:
    [wrong_link] = ctl.handle(node("n1"), T0, ALICE)
    assert wrong_link == Reply(p.Error(code="bad_request", text="register_node is not a client request"))
    [not_a_node_message] = ctl.handle(p.ListNodes(req=4), T0, FromNode("n1"))
    assert not_a_node_message == Reply(p.Error(code="bad_request", text="list_nodes is not a node message"))
    [spoofed] = ctl.handle(node("n1"), T0, FromNode("n2"))
    assert spoofed == Reply(p.Error(code="bad_request", text="node name differs from routing id"))
    launched = p.JobLaunched(job_id=1, node="n9", pids={})
    [unknown] = ctl.handle(launched, T0, FromNode("n9"))
    assert unknown == Reply(p.Reregister(reason="unknown node 'n9': register first"))
    assert ctl.registry.all() == [] and ctl.store.nodes() == []


def test_a_waiting_client_is_answered_when_its_job_ends(ctl: Controller) -> None:
    ctl.handle(node("n1"), T0, FromNode("n1"))
    ctl.handle(job(1), T0, ALICE)
    ctl.schedule(T0)
    assert ctl.handle(p.WaitJob(req=5, job_id=1), T0, ALICE) == [Wait(job_id=1, req=5)]
    done = ctl.handle(p.JobNodeDone(job_id=1, node="n1", exits=exits(0)), T0 + 1, FromNode("n1"))
    assert done[0] == Reply(p.Ack(job_id=1, what="job_node_done"))
    [ended] = [e for e in done if isinstance(e, JobEnded)]
    assert (ended.info.id, ended.info.state) == (1, "COMPLETED")


def test_waiting_for_a_queued_job_waits_for_its_end_not_its_start(ctl: Controller) -> None:
    """A PENDING job is neither active nor ended: `storm wait` must hold, not answer with PENDING."""
    ctl.handle(node("n1"), T0, FromNode("n1"))
    ctl.handle(job(2), T0, ALICE)
    ctl.handle(job(2), T0, ALICE)  # batch: one job per PE, so job 2 waits for job 1
    ctl.schedule(T0)
    assert [i.state for i in ctl.job_infos((1, 2), now=T0)] == ["STARTING", "PENDING"]
    assert ctl.handle(p.WaitJob(req=6, job_id=2), T0, ALICE) == [Wait(job_id=2, req=6)]


# ---------------------------------------------------------------------------------------------- cost


def one_node(store: Storage) -> Controller:
    """A controller with one registered 2-PE node, n1."""
    ctl = Controller(store, MMConfig(), "mm-1", nonce=seeded_nonces(0))
    ctl.recover(T0)
    ctl.handle(node("n1"), T0, FromNode("n1"))
    ctl.schedule(T0)
    return ctl


def one_job(ctl: Controller) -> tuple[list[str], list[str]]:
    """One 2-rank job on n1, submitted (and waited for) to done: the MM's messages in and out."""
    inputs: list[tuple[p.Message, Account | FromNode]] = [
        (job(2), ALICE),
        (p.WaitJob(req=2, job_id=1), ALICE),
        (p.JobLaunched(job_id=1, node="n1", pids={"0": 1, "1": 2}), FromNode("n1")),
        (p.JobNodeDone(job_id=1, node="n1", exits=exits(0, 1)), FromNode("n1")),
    ]
    sent = []
    for msg, caller in inputs:
        for effect in ctl.handle(msg, T0 + 1, caller) + ctl.schedule(T0 + 1):
            match effect:
                case Send() | Reply():
                    sent.append(effect.message.op)
                case JobEnded():
                    sent.append("job_list")  # to the waiting client
    return [m.op for m, _ in inputs], sent


def test_one_two_rank_job_costs_eight_mm_messages_and_four_commits(tmp_path: Path) -> None:
    """Submit is one commit, the pass that places it one (two writes), RUNNING one, COMPLETED one; a wait
    commits nothing."""
    store = Store(tmp_path / "storm.db")
    commits: list[str] = []
    try:
        ctl = one_node(store)
        store._db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip() == "COMMIT" else None)
        received, sent = one_job(ctl)
    finally:
        store.close()
    assert received == ["submit_job", "wait_job", "job_launched", "job_node_done"]
    assert sent == ["job_submitted", "launch_job", "ack", "job_list"]
    assert len(commits) == 4
