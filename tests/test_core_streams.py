"""Streamed output (``storm run``) in the pure parts, no sockets: storm-mm's relay and its window
(mm/streams.py, through the Controller as storm-mm drives it), the node manager's check of a job shell's
chunks (nm/checks.py) and what the client writes of them (tools/run_output.py)."""

# ruff: noqa: S105, S106 (the tokens here name attachments: they are no secrets)
from __future__ import annotations

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Attach, Effect, JobEnded, Relay, Reply, Send
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.streams import OutputRelay
from storm.nm.checks import shell_problem
from storm.nm.local_jobs import LocalJob
from storm.tools.run_output import Assembler

T0 = 1000.0
ALICE = Account(1000, 100, "alice")
BOB = Account(1001, 100, "bob")
TOKEN = "c0ffee"


def chunk(data: bytes, offset: int, *, rank: int = 0, stream: str = "out", job_id: int = 1, seq: int = 0,
          node: str = "n0", eof: bool = False) -> p.JobOutput:  # fmt: skip
    return p.JobOutput(
        job_id=job_id, node=node, rank=rank, stream=stream, seq=seq, offset=offset, data=data, eof=eof
    )


# ---------------------------------------------------------------------------------------------- the relay


def test_a_client_gets_at_most_its_window_beyond_what_it_acknowledged() -> None:
    relay = OutputRelay(window=10)
    relay.attach(1, "a")
    assert relay.relay(chunk(b"x" * 6, 0)) == ["a"]
    assert relay.relay(chunk(b"y" * 6, 6)) == []  # 12 bytes unacknowledged would be over 10
    assert relay.relay(chunk(b"z" * 4, 12)) == ["a"]  # exactly the window
    assert relay.jobs[1]["a"].dropped == 6
    relay.attach(1, "a", received=10)  # acknowledges what it took: room again
    assert relay.relay(chunk(b"w" * 8, 16)) == ["a"]


def test_the_end_of_a_stream_always_goes_and_acknowledgements_cannot_exceed_what_was_sent() -> None:
    relay = OutputRelay(window=4)
    relay.attach(1, "a", received=1_000_000)  # a client cannot open its window beyond what it took
    assert relay.relay(chunk(b"12345", 0)) == []
    assert relay.relay(chunk(b"", 5, eof=True)) == ["a"]


def test_each_client_has_a_window_of_its_own_and_a_job_without_clients_costs_nothing() -> None:
    relay = OutputRelay(window=4)
    relay.attach(1, "slow")
    relay.attach(1, "fast")
    assert relay.relay(chunk(b"abcd", 0)) == ["slow", "fast"]
    relay.attach(1, "fast", received=4)
    assert relay.relay(chunk(b"efgh", 4)) == ["fast"]
    assert relay.relay(chunk(b"data", 0, job_id=2)) == []
    relay.forget(1)
    assert relay.relay(chunk(b"more", 8)) == [] and relay.jobs == {}


# ---------------------------------------------------------------------------------------------- the MM core


@pytest.fixture
def ctl() -> Controller:
    c = Controller(MemoryStore(), MMConfig(node_timeout=10.0), "mm-1", nonce=seeded_nonces("mm-1"))
    c.recover(T0)
    for node in ("n0", "n1"):
        msg = p.RegisterNode(node=node, pes=1, nm_epoch=f"{node}-e", address=node)
        c.handle(msg, T0, FromNode(node))
    return c


def submit(ctl: Controller, attach: str = TOKEN, ranks: int = 2) -> tuple[int, list[Effect]]:
    msg = p.SubmitJob(ranks=ranks, argv=("/bin/app",), cwd="/home/alice", env={}, attach=attach)
    effects = ctl.handle(msg, T0, ALICE)
    reply = effects[0]
    assert isinstance(reply, Reply) and isinstance(reply.message, p.JobSubmitted)
    return reply.message.job_id, effects + ctl.schedule(T0)


def test_a_streamed_submission_attaches_its_client_before_any_launch_and_launches_streamed(
    ctl: Controller,
) -> None:
    job_id, effects = submit(ctl)
    kinds = [type(e) for e in effects]
    assert kinds.index(Attach) < kinds.index(Send)
    assert Attach(job_id, TOKEN) in effects
    launches = [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, p.LaunchJob)]
    assert len(launches) == 2 and all(launch.stream for launch in launches)
    plain, effects = submit(ctl, attach="", ranks=1)
    assert not any(isinstance(e, Attach) for e in effects)
    assert plain not in ctl.runs.streams.jobs


def test_a_chunk_from_one_of_the_jobs_nodes_is_relayed_and_from_any_other_node_is_not(
    ctl: Controller,
) -> None:
    job_id, _ = submit(ctl)
    msg = chunk(b"hello\n", 0, job_id=job_id, node="n1", rank=1)
    assert ctl.output(msg, FromNode("n1"), T0) == [Relay(job_id, TOKEN, msg)]
    assert ctl.handle(msg, T0, FromNode("n1")) == [Relay(job_id, TOKEN, msg)]  # the same through handle
    other = ctl.output(chunk(b"x", 0, job_id=job_id, node="n2"), FromNode("n2"), T0)
    assert other == [Reply(p.Reregister(reason="unknown node 'n2': register first"))]  # as any report
    ctl.handle(p.RegisterNode(node="n2", pes=1, nm_epoch="n2-e", address="n2"), T0, FromNode("n2"))
    assert ctl.output(chunk(b"x", 0, job_id=job_id, node="n2"), FromNode("n2"), T0) == []  # not the job's
    refused = ctl.output(msg, FromNode("n0"), T0)  # a node speaking for another
    assert refused == [Reply(p.Error(code="bad_request", text="node name differs from routing id"))]


def test_attach_output_reattaches_says_the_state_and_refuses_other_users(ctl: Controller) -> None:
    job_id, _ = submit(ctl)
    again = p.AttachOutput(req=7, job_id=job_id, token="second")
    effects = ctl.handle(again, T0, ALICE)
    reply = effects[0]
    assert isinstance(reply, Reply) and isinstance(reply.message, p.OutputAttached)
    assert (reply.message.req, reply.message.mm_epoch, reply.message.state) == (7, "mm-1", "STARTING")
    assert Attach(job_id, "second") in effects
    assert set(ctl.runs.streams.jobs[job_id]) == {TOKEN, "second"}
    refused = ctl.handle(p.AttachOutput(req=8, job_id=job_id, token="bob"), T0, BOB)
    assert [type(e) for e in refused] == [Reply] and isinstance(refused[0].message, p.Error)  # type: ignore[union-attr]
    assert refused[0].message.code == "permission_denied"  # type: ignore[union-attr]
    unknown = ctl.handle(p.AttachOutput(req=9, job_id=99, token="t"), T0, ALICE)
    assert unknown[0].message.code == "unknown_job"  # type: ignore[union-attr]


def test_a_jobs_attachments_end_with_it_and_an_ended_job_is_not_attached_again(ctl: Controller) -> None:
    job_id, _ = submit(ctl)
    effects = ctl.handle(p.CancelJobs(job_ids=(job_id,)), T0, ALICE)
    for node in ("n0", "n1"):
        effects += ctl.handle(p.JobNodeDone(job_id=job_id, node=node, exits=()), T0 + 1, FromNode(node))
    assert any(isinstance(e, JobEnded) for e in effects)
    assert job_id not in ctl.runs.streams.jobs
    late = ctl.handle(p.AttachOutput(req=3, job_id=job_id, token=TOKEN), T0 + 2, ALICE)
    reply = late[0]
    assert isinstance(reply, Reply) and isinstance(reply.message, p.OutputAttached)
    assert reply.message.state == "CANCELLED" and len(late) == 1  # told the end; nothing attached


def test_a_restarted_mm_launches_a_queued_streamed_job_streamed() -> None:
    store = MemoryStore()
    first = Controller(store, MMConfig(node_timeout=10.0), "mm-1", nonce=seeded_nonces("mm-1"))
    first.recover(T0)
    first.handle(p.RegisterNode(node="n0", pes=1, nm_epoch="n0-e", address="n0"), T0, FromNode("n0"))
    msg = p.SubmitJob(ranks=1, argv=("/bin/app",), cwd="/home/alice", env={}, attach=TOKEN)
    first.handle(msg, T0, ALICE)  # storm-mm stops before the pass that would start it
    second = Controller(store, MMConfig(node_timeout=10.0), "mm-2", nonce=seeded_nonces("mm-2"))
    second.recover(T0 + 1)
    second.handle(p.RegisterNode(node="n0", pes=1, nm_epoch="n0-e", address="n0"), T0 + 30, FromNode("n0"))
    effects = second.schedule(T0 + 30)
    launch = [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, p.LaunchJob)]
    assert launch and launch[0].stream


# ---------------------------------------------------------------------------------------------- the NM


def local_job(stream: bool) -> LocalJob:
    launch = p.LaunchJob(
        job_id=1, name="app", kvsname="k", size=2, row=0, node_index=0, ranks_per_node=(1, 1),
        slots=(p.RankSlot(rank=1, pe=0),), argv=("/bin/app",), cwd="/", env={}, uid=1000, gid=100,
        user="alice", output="o", error="", stream=stream,
    )  # fmt: skip
    return LocalJob(launch=launch, dir=None, shell_pid=50)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stream", "msg", "problem"),
    [
        (True, chunk(b"x", 0, rank=1), None),
        (False, chunk(b"x", 0, rank=1), "output of a job that is not streamed"),
        (True, chunk(b"x", 0, rank=0), "output of rank 0 on node 'n0', not one of this node's ranks"),
        (True, chunk(b"x", 0, rank=1, node="n9"), "output of rank 1 on node 'n9', not one of this node's"),
    ],
)
def test_the_node_manager_relays_only_a_streamed_jobs_output_of_its_own_ranks(
    stream: bool, msg: p.JobOutput, problem: str | None
) -> None:
    found = shell_problem(local_job(stream), msg, "n0", None, lambda pid: 50)
    assert found == problem or (problem is not None and found is not None and found.startswith(problem))


# ---------------------------------------------------------------------------------------------- the client


def written(pairs: list[tuple[str, bytes]]) -> dict[str, bytes]:
    out: dict[str, bytes] = {"out": b"", "err": b""}
    for stream, data in pairs:
        out[stream] += data
    return out


def test_without_label_chunks_are_written_as_they_come_partial_lines_too() -> None:
    a = Assembler()
    assert a.chunk(chunk(b"par", 0)) == [("out", b"par")]
    assert a.chunk(chunk(b"tial\n", 3, seq=1)) == [("out", b"tial\n")]
    assert a.chunk(chunk(b"oops\n", 0, stream="err")) == [("err", b"oops\n")]
    assert a.chunk(chunk(b"", 8, seq=2, eof=True)) == [] and a.missed == 0


def test_label_prefixes_complete_lines_and_keeps_a_partial_one_for_its_end() -> None:
    a = Assembler(label=True)
    assert a.chunk(chunk(b"one\ntw", 0, rank=3)) == [("out", b"3: one\n")]
    assert a.chunk(chunk(b"o\nthree", 6, rank=3, seq=1)) == [("out", b"3: two\n")]
    assert a.chunk(chunk(b"x\n", 0, rank=0, stream="err")) == [("err", b"0: x\n")]
    assert a.finish() == [("out", b"3: three\n")]


def test_a_gap_is_counted_and_a_cut_line_stands_alone() -> None:
    a = Assembler(label=True)
    a.chunk(chunk(b"start", 0))
    out = written(a.chunk(chunk(b"end\n", 105, seq=2)))  # 100 bytes dropped on the way
    assert out["out"] == b"0: start\n0: end\n" and a.missed == 100
    a.chunk(chunk(b"", 150, seq=3, eof=True))  # the stream was longer than what came: also missed
    assert a.missed == 141


def test_what_was_written_already_is_not_written_twice() -> None:
    a = Assembler()
    a.chunk(chunk(b"abcdef", 0))
    assert a.chunk(chunk(b"defgh", 3, seq=1)) == [("out", b"gh")]
    a.chunk(chunk(b"", 8, seq=2, eof=True))
    assert a.chunk(chunk(b"late", 8, seq=3)) == [] and a.missed == 0


def test_a_requeued_jobs_next_run_is_written_whole_whether_or_not_the_last_one_ended() -> None:
    a = Assembler(label=True)
    a.chunk(chunk(b"run 1, cut", 0, rank=0))  # its node was lost: no end
    a.chunk(chunk(b"run 1\n", 0, rank=1))
    a.chunk(chunk(b"", 6, rank=1, seq=1, eof=True))
    assert a.chunk(chunk(b"run 2\n", 0, rank=0)) == [("out", b"0: run 1, cut\n"), ("out", b"0: run 2\n")]
    assert a.chunk(chunk(b"run 2\n", 0, rank=1)) == [("out", b"1: run 2\n")]
    assert a.missed == 0
