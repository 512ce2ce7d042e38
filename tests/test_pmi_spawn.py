"""Tests of MPI_Comm_spawn(_multiple) and MPI's names in storm's PMI server (nm/pmi.py, nm/spawn.py,
nm/spawner.py): the blocks MPICH 5.0.2 sends, verbatim, the plan of a spawn, and the job shell's spawner
driven with a fake host. End to end, with real MPI processes: tests/test_cluster_spawn.py."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storm.mm import protocol as p
from storm.nm.pmi import (
    BarrierIn,
    NameRequest,
    Outcome,
    Wireup,
    name_reply,
    parse_line,
    process_mapping,
    spawn_reply,
)
from storm.nm.spawn import (
    SpawnCommand,
    SpawnRequest,
    child_environment,
    choose_pes,
    room_problem,
    world_kvsname,
)
from storm.nm.spawner import NAME_TIMEOUT, PendingNames, Proc, Spawner
from tests.test_pmi import only_reply, wireup

PORT = "tag#0$connentry#20A2D7336E973DA917[2]637577CC2B3200409750[5]4F03$"
# MPI_Comm_spawn_multiple of 2 commands (2 + 1 processes, the first with an info key): logged from a real
# mpi4py rank under mpiexec with PMI_DEBUG=1 (values raw: "a b" is one argument).
SPAWN_MULTIPLE = f"""mcmd=spawn
nprocs=2
execname=/work/main/.venv/bin/python
totspawns=2
spawnssofar=1
argcnt=2
arg1=/tmp/x/sp.py
arg2=a b
preput_num=1
preput_key_0=PARENT_ROOT_PORT_NAME
preput_val_0={PORT}
info_num=1
info_key_0=wdir
info_val_0=/tmp
endcmd
mcmd=spawn
nprocs=1
execname=/work/main/.venv/bin/python
totspawns=2
spawnssofar=2
argcnt=1
arg1=/tmp/x/sp.py
info_num=0
endcmd
"""
SPAWN_ONE = (
    "mcmd=spawn\nnprocs=3\nexecname=./a.out\ntotspawns=1\nspawnssofar=1\nargcnt=0\npreput_num=0\ninfo_num=0\n"
    "endcmd\n"
)


def feed(w: Wireup, block: str, rank: int = 0) -> list[Outcome]:
    return [w.handle(rank, line) for line in block.splitlines(keepends=True)]


def test_spawn_multiple_as_mpich_sends_it() -> None:
    w = wireup()
    outcomes = feed(w, SPAWN_MULTIPLE)
    assert all(o.replies == [] and o.spawn is None for o in outcomes[:-1])  # nothing until the last endcmd
    request = outcomes[-1].spawn
    assert outcomes[-1].replies == []  # the caller answers once it has started them
    assert request == SpawnRequest(
        commands=(
            SpawnCommand("/work/main/.venv/bin/python", 2, ("/tmp/x/sp.py", "a b"), (("wdir", "/tmp"),)),
            SpawnCommand("/work/main/.venv/bin/python", 1, ("/tmp/x/sp.py",)),
        ),
        preput={"PARENT_ROOT_PORT_NAME": PORT},
    )
    assert request.total == 3 and request.appnums() == [0, 0, 1]
    assert request.commands[0].info_value("wdir") == "/tmp" and request.commands[1].info_value("wdir") is None
    assert only_reply(w.handle(0, "cmd=get_appnum"))["rc"] == "0"  # back to normal afterwards
    assert parse_line(spawn_reply()) == {"cmd": "spawn_result", "rc": "0"}
    refused = parse_line(spawn_reply("storm: no room for job 3 on node0"))
    assert refused == {"cmd": "spawn_result", "rc": "-1", "msg": "storm: no room for job 3 on node0"}


def test_spawn_one_and_two_ranks_spawning_at_once() -> None:
    w = wireup()
    first, second = feed(w, SPAWN_ONE, rank=0), []
    # interleaved with another rank's request: each rank's lines are its own
    for line0, line1 in zip(SPAWN_ONE.splitlines(True), SPAWN_MULTIPLE.splitlines(True), strict=False):
        first.append(w.handle(0, line0))
        second.append(w.handle(1, line1))
    second += feed(w, "".join(SPAWN_MULTIPLE.splitlines(True)[len(SPAWN_ONE.splitlines()) :]), rank=1)
    assert [o.spawn.total for o in first if o.spawn] == [3, 3]
    assert [o.spawn.total for o in second if o.spawn] == [3]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("nprocs=2\n", ""), "nprocs must be an integer"),
        (("nprocs=2\n", "nprocs=two\n"), "nprocs must be an integer"),
        (("nprocs=2\n", "nprocs=-1\n"), "nprocs -1 is not between"),
        (("nprocs=2\n", "nprocs=5000\n"), "nprocs 5000 is not between"),
        (
            (
                "execname=/work/main/.venv/bin/python\ntotspawns=2\nspawnssofar=1",
                "totspawns=2\nspawnssofar=1",
            ),
            "no execname",
        ),
        (("argcnt=2\n", "argcnt=3\n"), "arg3 is missing"),
        (("preput_num=1\n", "preput_num=2\n"), "preput_key_1 is missing"),
        (("info_num=1\n", "info_num=1\ninfo_num=1\n"), "info_num given twice"),
        (("arg2=a b\n", "arg2=a b\nnot a field\n"), "line without key=value"),
        (("spawnssofar=2\n", "spawnssofar=3\ntotspawns=3\n"), "totspawns given twice"),
    ],
)
def test_bad_spawn_requests_are_refused_once_at_their_end(change: tuple[str, str], expected: str) -> None:
    w = wireup()
    block = SPAWN_MULTIPLE.replace(*change, 1)
    outcomes = feed(w, block)
    replies = [r for o in outcomes for r in o.replies]
    assert [o.spawn for o in outcomes] == [None] * len(outcomes)
    assert len(replies) == 1 and outcomes[-1].replies == replies, replies
    reply = parse_line(replies[0][1])
    assert reply["cmd"] == "spawn_result" and reply["rc"] == "-1"
    assert expected in reply["msg"], reply["msg"]
    assert only_reply(w.handle(0, "cmd=get_maxes"))["rc"] == "0"


def command(nprocs: int, number: int = 1, of: int = 1) -> str:
    """One command's block of a spawn request, as MPICH writes it."""
    return (
        f"mcmd=spawn\nnprocs={nprocs}\nexecname=./a.out\ntotspawns={of}\nspawnssofar={number}\nargcnt=0\n"
        "info_num=0\nendcmd\n"
    )


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (command(0), "a spawn of 0 processes"),
        (command(4000, 1, 2) + command(97, 2, 2), "a spawn of 4097 processes (1 to 4096 at once)"),
        (command(1, 1, 3) + command(1, 3, 3), "totspawns is not the 2 command(s) sent"),
    ],
)
def test_spawn_of_nothing_or_too_much_is_refused(block: str, expected: str) -> None:
    outcomes = feed(wireup(), block)
    replies = [r for o in outcomes for r in o.replies]
    assert len(replies) == 1 and outcomes[-1].replies == replies
    assert expected in parse_line(replies[0][1])["msg"]


def test_an_oversized_spawn_request_is_swallowed_and_refused() -> None:
    w = wireup()
    lines = ["mcmd=spawn\n", "totspawns=1\n", "spawnssofar=1\n"] + [
        f"x{i}={'v' * 60000}\n" for i in range(20)
    ]
    outcomes = [w.handle(0, line) for line in [*lines, "endcmd\n"]]
    assert all(not o.replies for o in outcomes[:-1])
    assert "longer than" in parse_line(outcomes[-1].replies[0][1])["msg"]
    assert w._spawning == {}


def test_a_cmd_line_in_the_middle_of_a_spawn_ends_it_and_is_served() -> None:
    w = wireup()
    feed(w, "mcmd=spawn\nnprocs=1\n")
    out = w.handle(0, "cmd=get_appnum\n")
    assert [parse_line(line)["cmd"] for _, line in out.replies] == ["spawn_result", "appnum"]
    assert parse_line(out.replies[0][1])["rc"] == "-1"


def test_a_spawned_world_has_its_preput_keys_appnums_and_mapping() -> None:
    mapping = process_mapping([3])
    w = Wireup(
        kvsname="storm_5_ab12cd34-0-1", size=3, local_ranks=range(3), process_mapping=mapping,
        universe_size=2, kvs={"PARENT_ROOT_PORT_NAME": PORT}, appnums={0: 0, 1: 0, 2: 1},
    )  # fmt: skip
    assert only_reply(w.handle(2, "cmd=get key=PARENT_ROOT_PORT_NAME"), 2)["value"] == PORT
    assert only_reply(w.handle(2, "cmd=get key=PMI_process_mapping"), 2)["value"] == "(vector,(0,1,3))"
    assert [only_reply(w.handle(r, "cmd=get_appnum"), r)["appnum"] for r in range(3)] == ["0", "0", "1"]
    assert only_reply(w.handle(0, "cmd=get_universe_size"))["size"] == "2"
    for rank in range(3):  # its barriers are those of a one-node world
        out = w.handle(rank, "cmd=barrier_in")
    assert out.barrier == BarrierIn(0, {})


@given(st.lists(st.text(st.characters(exclude_characters="\0", exclude_categories=["Cs"]), max_size=80)))
def test_garbage_inside_a_spawn_never_raises(lines: list[str]) -> None:
    w = wireup()
    w.handle(0, "mcmd=spawn\n")
    for line in lines:
        w.handle(0, line + "\n")
    w.handle(0, "endcmd\n")
    out = w.handle(0, "cmd=get_maxes\n")  # whatever happened, the rank is served again
    assert parse_line(out.replies[-1][1])["cmd"] == "maxes"


def test_name_requests_are_handed_to_the_caller() -> None:
    w = wireup()
    publish = w.handle(0, f"cmd=publish_name service=mpi4py-0 port={PORT}\n")
    assert publish.replies == [] and publish.name == NameRequest("publish", "mpi4py-0", PORT)
    assert w.handle(1, "cmd=lookup_name service=mpi4py-0\n").name == NameRequest("lookup", "mpi4py-0")
    assert w.handle(0, "cmd=unpublish_name service=mpi4py-0\n").name == NameRequest("unpublish", "mpi4py-0")
    # what MPICH expects back (Hydra's replies: rc=0, the lookup's port=; else rc=1 and msg=)
    assert parse_line(name_reply("publish")) == {"cmd": "publish_result", "rc": "0"}
    assert parse_line(name_reply("lookup", port=PORT)) == {"cmd": "lookup_result", "rc": "0", "port": PORT}
    assert parse_line(name_reply("unpublish")) == {"cmd": "unpublish_result", "rc": "0"}
    failed = parse_line(name_reply("lookup", error="storm: no job of user u has published the name x"))
    assert failed == {
        "cmd": "lookup_result",
        "rc": "1",
        "msg": "storm: no job of user u has published the name x",
    }
    spaced = only_reply(w.handle(0, "cmd=publish_name service=a b port=p\n"))
    assert "cannot carry a service name with a space" in spaced["msg"]


def test_the_plan_of_a_spawn() -> None:
    assert world_kvsname("storm_5_ab12cd34", 1, 3) == "storm_5_ab12cd34-1-3"
    with pytest.raises(ValueError):
        world_kvsname("k", 0, 0)
    # least loaded PE first, the job's slot order among equals
    assert choose_pes({}, [2, 0], 5) == [2, 0, 2, 0, 2]
    assert choose_pes({2: 3, 0: 1}, [2, 0], 3) == [0, 0, 2]
    assert room_problem(job_id=4, node="node0", live=10, wanted=6, pes=2, limit=8) is None
    text = room_problem(job_id=4, node="node0", live=10, wanted=7, pes=2, limit=8)
    assert text is not None
    for part in ("storm", "job 4", "node node0", "spawn_limit = 8", "at most 16", "7 process(es)"):
        assert part in text, text
    assert "spawn_limit is 0" in (room_problem(job_id=4, node="n", live=0, wanted=1, pes=1, limit=0) or "")
    env = child_environment(
        {"PATH": "/bin", "PMI_RANK": "9", "STORM_HOOK_SEGMENT": "/x", "LD_PRELOAD": "mine.so"},
        job_id=4, node="node0", world=2, rank=1, size=3,
    )  # fmt: skip
    assert env == {
        "PATH": "/bin", "LD_PRELOAD": "mine.so", "PMI_RANK": "1", "PMI_SIZE": "3", "PMI_SPAWNED": "1",
        "STORM_JOB_ID": "4", "STORM_NODE": "node0", "STORM_RANK": "1", "STORM_SIZE": "3", "STORM_SPAWN": "2",
    }  # fmt: skip


def test_pending_name_requests_are_answered_or_time_out() -> None:
    names = PendingNames()
    proc = Proc(rank=0, pe=0)
    first = names.add(proc, NameRequest("lookup", "s"), now=100.0)
    second = names.add(proc, NameRequest("publish", "t", "p"), now=101.0)
    answer = names.answer(p.PmiNameResult(job_id=1, seq=first, ok=True, port=PORT))
    assert answer == (proc, f"cmd=lookup_result rc=0 port={PORT}\n")
    assert names.answer(p.PmiNameResult(job_id=1, seq=first, ok=True, port=PORT)) is None  # answered once
    assert names.expire(100.0 + NAME_TIMEOUT) == []
    [(who, line)] = names.expire(101.0 + NAME_TIMEOUT)
    assert (
        who is proc and parse_line(line)["rc"] == "1" and "no answer from storm-mm" in parse_line(line)["msg"]
    )
    assert names.answer(p.PmiNameResult(job_id=1, seq=second, ok=True)) is None  # too late: dropped


class FakeHost:
    """The job shell as the Spawner sees it: records what it was asked to start, fails on request."""

    def __init__(self, tmp: Path, fail_at: int = -1) -> None:
        self.launch = p.LaunchJob(
            job_id=7, name="j", kvsname="storm_7_00ff00ff", size=3, row=0, node_index=1,
            ranks_per_node=(1, 2), slots=(p.RankSlot(rank=1, pe=3), p.RankSlot(rank=2, pe=0)),
            argv=("x",), cwd=str(tmp), env={"PATH": os.environ["PATH"]}, uid=0, gid=0, user="u",
            output="o", error="",
        )  # fmt: skip
        self.node, self.stopping = "node1", False
        self.started: list[tuple[Proc, list[str], str]] = []
        self.notices: list[str] = []
        self.killed: list[int] = []
        self.fail_at = fail_at
        self.tmp = tmp

    def open_outputs(self, rank: int) -> tuple[int, int]:
        fd = os.open(self.tmp / f"out-{rank}", os.O_WRONLY | os.O_CREAT, 0o600)
        return fd, fd

    def start_process(
        self, proc: Proc, argv: list[str], env: dict[str, str], cwd: str, outputs: tuple[int, int]
    ) -> str:
        if len(self.started) == self.fail_at:
            return "cannot execute it: gone"
        proc.pid = 1000 + len(self.started)
        self.started.append((proc, argv, cwd))
        return ""

    def notice(self, proc: Proc, text: str) -> None:
        self.notices.append(text)

    def kill(self, proc: Proc) -> None:
        self.killed.append(proc.pid)


def run_spawn(spawner: Spawner, parent: Proc, request: SpawnRequest) -> tuple[str, list[p.Message]]:
    sent: list[p.Message] = []

    async def send(msg: p.Message) -> None:
        sent.append(msg)

    spawner.send = send
    return asyncio.run(spawner.spawn(parent, request)), sent


def test_the_spawner_starts_a_world_pinned_round_robin_and_reports_it(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    spawner = Spawner(host, spawn_limit=2, send=lambda m: asyncio.sleep(0))
    request = SpawnRequest(
        commands=(SpawnCommand("true", 2), SpawnCommand("sh", 1, ("-c", "x"), (("wdir", "sub"),))),
        preput={"PARENT_ROOT_PORT_NAME": PORT},
    )
    reply, sent = run_spawn(spawner, Proc(rank=2, pe=0), request)
    assert reply == spawn_reply()
    assert [(proc.world, proc.rank, proc.pe, proc.out_rank) for proc, _, _ in host.started] == [
        (1, 0, 3, 2), (1, 1, 0, 2), (1, 2, 3, 2),
    ]  # fmt: skip
    assert host.started[2][1][1:] == ["-c", "x"] and host.started[2][2] == str(tmp_path / "sub")
    assert host.started[0][1][0] == shutil.which("true")
    assert sent == [p.Spawned(job_id=7, world=1, parent=2, pids={"0": 1000, "1": 1001, "2": 1002},
                              pes={"0": 3, "1": 0, "2": 3})]  # fmt: skip
    world = spawner.worlds[1].wireup
    assert world.kvsname == "storm_7_00ff00ff-1-1" and world.size == 3
    # 3 live of at most 2 x 2: one more fits, two do not (refused whole, nothing started)
    reply, sent = run_spawn(spawner, Proc(rank=1, pe=3), SpawnRequest((SpawnCommand("true", 2),), {}))
    assert parse_line(reply)["rc"] == "-1" and len(host.started) == 3
    assert sent == [p.JobSpawned(job_id=7, node="node1", world=0, processes=0, refused=host.notices[0])]
    assert "at most 2 per PE" in host.notices[0] and "job 7" in host.notices[0]


def test_the_spawner_refuses_a_missing_program_and_abandons_a_failed_start(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, fail_at=1)
    spawner = Spawner(host, spawn_limit=4, send=lambda m: asyncio.sleep(0))
    reply, sent = run_spawn(
        spawner, Proc(rank=1, pe=3), SpawnRequest((SpawnCommand("no-such-program-x", 1),), {})
    )
    assert "cannot execute no-such-program-x" in parse_line(reply)["msg"] and not host.started
    reply, sent = run_spawn(spawner, Proc(rank=1, pe=3), SpawnRequest((SpawnCommand("true", 2),), {}))
    assert "gone" in parse_line(reply)["msg"]
    assert host.killed == [1000]  # the one started before the failure; its exit will count for nothing
    assert not spawner.reportable(host.started[0][0]) and spawner.live() == []
    assert [type(m) for m in sent] == [p.JobSpawned]
    host.stopping = True
    reply, _ = run_spawn(spawner, Proc(rank=1, pe=3), SpawnRequest((SpawnCommand("true", 1),), {}))
    assert "is ending" in parse_line(reply)["msg"]
