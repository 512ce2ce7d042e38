"""Tests of storm.nm.pmi: the PMI-1 wire format, the Wireup state machine, and real MPICH ranks.

The unit tests drive Wireup with the lines MPICH 5 really sends (see the module docstring of
storm.nm.pmi). The integration tests start real MPI ranks (mpi4py and C) on PMI_FD socketpairs and
serve them with MiniShell, a small selectors loop around one Wireup per simulated node and FakeMM,
a stand-in for the MM that merges the nodes' BarrierIn puts.
"""

from __future__ import annotations

import os
import re
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storm.nm.pmi import (
    MAX_LINE,
    BarrierIn,
    Finished,
    Outcome,
    PmiError,
    Wireup,
    format_line,
    mpich_shm_names,
    mpich_shm_prefixes,
    parse_line,
    process_mapping,
)

APPS = Path(__file__).resolve().parent.parent / "tools" / "apps"
SHM = Path("/dev/shm")
MPI_DEADLINE = 60.0  # seconds for one MPI run; a healthy run takes well under 2 s

# ---------------------------------------------------------------------------------------------
# parse_line / format_line


def test_parse_basic_and_order() -> None:
    line = "cmd=get kvsname=K key=PMI_process_mapping\n"
    assert list(parse_line(line).items()) == [
        ("cmd", "get"),
        ("kvsname", "K"),
        ("key", "PMI_process_mapping"),
    ]
    assert parse_line("cmd=barrier_in") == {"cmd": "barrier_in"}  # the newline is optional
    assert parse_line("cmd=init  pmi_version=1   pmi_subversion=1 \n")["pmi_subversion"] == "1"


def test_parse_values_as_mpich_writes_them() -> None:
    put = "cmd=put kvsname=K key=-allgather-1-0-seg-1/9 value=01[3]2F776F=x\n"
    assert parse_line(put)["key"] == "-allgather-1-0-seg-1/9"
    assert parse_line(put)["value"] == "01[3]2F776F=x"  # only the first '=' splits
    assert parse_line("cmd=put key=k value=segments=9")["value"] == "segments=9"
    assert parse_line("mcmd=spawn\n") == {"mcmd": "spawn"}


def test_parse_escapes_and_free_text() -> None:
    assert parse_line(r"cmd=x msg=a\ b\\c")["msg"] == "a b\\c"
    abort = parse_line("cmd=abort exitcode=7 message=application called MPI_Abort(MPI_COMM_WORLD, 7)\n")
    assert abort == {
        "cmd": "abort",
        "exitcode": "7",
        "message": "application called MPI_Abort(MPI_COMM_WORLD, 7)",
    }
    assert parse_line("cmd=abort message=x y exitcode=3")["exitcode"] == "3"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\n",
        "get key=x",
        "key=x cmd=get",
        " cmd=get",
        "cmd=get key",  # a word without '=' outside message/msg
        "cmd=get =x",
        "cmd=get k!y=x",
        "cmd=get key=",
        "cmd=",
        "cmd=get key=a key=b",
        "cmd=get key=a\nkey=b",
        "cmd=get key=a\0",
        "cmd=put value=" + "x" * MAX_LINE,
    ],
)
def test_parse_garbage(line: str) -> None:
    with pytest.raises(PmiError):
        parse_line(line)


def test_format_line() -> None:
    assert format_line({"cmd": "get_result", "rc": 0, "value": "(vector,(0,2,1))"}) == (
        "cmd=get_result rc=0 value=(vector,(0,2,1))\n"
    )
    assert format_line({"cmd": "get_result", "rc": -1, "msg": "key x not found"}) == (
        "cmd=get_result rc=-1 msg=key\\ x\\ not\\ found\n"
    )
    assert format_line({"mcmd": "spawn"}) == "mcmd=spawn\n"


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"rc": 0},
        {"cmd": "x", "a b": "1"},
        {"cmd": "x", "a=b": "1"},
        {"cmd": "x", "a\nb": "1"},
        {"cmd": "x", "": "1"},
        {"cmd": "x", "v": "a\nb"},
        {"cmd": "x", "v": ""},
        {"cmd": "x", "v": True},
        {"cmd": "x", "v": 1.5},
        {"cmd": "x", "v": "y" * MAX_LINE},
    ],
)
def test_format_line_rejects(fields: Any) -> None:
    with pytest.raises(ValueError):
        format_line(fields)


_keys = st.from_regex(r"[A-Za-z0-9_./:-]{1,20}", fullmatch=True)
_values = st.text(st.characters(exclude_characters="\n\0", exclude_categories=["Cs"]), min_size=1)


@given(st.dictionaries(_keys.filter(lambda k: k != "cmd"), _values | st.integers(), max_size=6))
def test_format_parse_round_trip(extra: dict[str, str | int]) -> None:
    fields: dict[str, str | int] = {"cmd": "put", **extra}
    assert parse_line(format_line(fields)) == {k: str(v) for k, v in fields.items()}


# ---------------------------------------------------------------------------------------------
# process_mapping / mpich_shm_prefixes


@pytest.mark.parametrize(
    ("ranks_per_node", "expected"),
    [
        ([2], "(vector,(0,1,2))"),
        ([1, 1], "(vector,(0,2,1))"),
        ([4, 4, 4], "(vector,(0,3,4))"),
        ([2, 2, 1], "(vector,(0,2,2),(2,1,1))"),
        ([1, 2, 2, 1], "(vector,(0,1,1),(1,2,2),(3,1,1))"),
        ([3, 1, 3], "(vector,(0,1,3),(1,1,1),(2,1,3))"),
    ],
)
def test_process_mapping(ranks_per_node: list[int], expected: str) -> None:
    assert process_mapping(ranks_per_node) == expected


@pytest.mark.parametrize(
    ("ranks_per_node", "hosts", "expected"),
    [
        ([1, 1], [0, 0], "(vector,(0,1,2))"),  # two node managers of one machine: one MPI node
        ([2, 2, 1], [0, 0, 1], "(vector,(0,1,4),(1,1,1))"),
        ([1, 1, 1, 1], [0, 1, 0, 1], "(vector,(0,2,1),(0,2,1))"),  # a host comes back, as Slurm's cyclic
        ([2, 2], [0, 1], "(vector,(0,2,2))"),
        ([1, 2, 1], [0, 1, 1], "(vector,(0,1,1),(1,1,3))"),
    ],
)
def test_process_mapping_by_host(ranks_per_node: list[int], hosts: list[int], expected: str) -> None:
    assert process_mapping(ranks_per_node, hosts) == expected


@pytest.mark.parametrize(("bad", "hosts"), [([], []), ([0], []), ([2, 0, 1], []), ([-1], []), ([1, 1], [0])])
def test_process_mapping_rejects(bad: list[int], hosts: list[int]) -> None:
    with pytest.raises(ValueError):
        process_mapping(bad, hosts)


def test_mpich_shm_prefixes_known_hashes() -> None:
    # FNV-1a 32-bit test vectors, and names seen in /dev/shm for these kvsnames with MPICH 5.0.2.
    assert mpich_shm_prefixes("") == ("mpich_shm_811c9dc5_", "mpich_vci_811c9dc5_")
    assert mpich_shm_prefixes("a")[0] == "mpich_shm_e40c292c_"
    assert mpich_shm_prefixes("foobar")[0] == "mpich_shm_bf9cf968_"
    assert mpich_shm_prefixes("kvs_storm_42")[0] == "mpich_shm_7408ad22_"
    assert mpich_shm_prefixes("vcijob") == ("mpich_shm_66ec5c4c_", "mpich_vci_66ec5c4c_")


# ---------------------------------------------------------------------------------------------
# Wireup, unit level

KVS = "kvs_test"


def wireup(local: Sequence[int] = (0, 1), size: int = 2, **kw: int) -> Wireup:
    return Wireup(kvsname=KVS, size=size, local_ranks=local, process_mapping="(vector,(0,1,2))", **kw)


def only_reply(out: Outcome, rank: int = 0) -> dict[str, str]:
    assert len(out.replies) == 1
    assert out.replies[0][0] == rank
    assert out.replies[0][1].endswith("\n")
    fields: dict[str, str] = parse_line(out.replies[0][1])
    return fields


def test_startup_sequence_of_mpich() -> None:
    w = wireup()
    assert only_reply(w.handle(0, "cmd=init pmi_version=1 pmi_subversion=1\n")) == {
        "cmd": "response_to_init",
        "rc": "0",
        "pmi_version": "1",
        "pmi_subversion": "1",
    }
    maxes = only_reply(w.handle(0, "cmd=get_maxes\n"))
    assert maxes == {
        "cmd": "maxes",
        "rc": "0",
        "kvsname_max": "256",
        "keylen_max": "64",
        "vallen_max": "1024",
    }
    assert only_reply(w.handle(0, "cmd=get_appnum\n")) == {"cmd": "appnum", "rc": "0", "appnum": "0"}
    assert only_reply(w.handle(0, "cmd=get_my_kvsname\n")) == {"cmd": "my_kvsname", "rc": "0", "kvsname": KVS}
    mapping = only_reply(w.handle(0, f"cmd=get kvsname={KVS} key=PMI_process_mapping\n"))
    assert mapping == {"cmd": "get_result", "rc": "0", "value": "(vector,(0,1,2))"}
    for key in ("PMI_hwloc_xmlfile", "PMI_mpi_memory_alloc_kinds"):
        missing = only_reply(w.handle(0, f"cmd=get kvsname={KVS} key={key}\n"))
        assert missing["cmd"] == "get_result"
        assert missing["rc"] == "-1"
        assert key in missing["msg"]
    assert only_reply(w.handle(1, "cmd=init pmi_version=1 pmi_subversion=1\n"), rank=1)["rc"] == "0"


def test_init_wrong_version_and_universe_size() -> None:
    w = wireup(appnum=3, universe_size=16)
    assert only_reply(w.handle(0, "cmd=init pmi_version=2 pmi_subversion=0"))["rc"] == "-1"
    assert only_reply(w.handle(0, "cmd=get_universe_size")) == {
        "cmd": "universe_size",
        "rc": "0",
        "size": "16",
    }
    assert only_reply(w.handle(0, "cmd=get_appnum"))["appnum"] == "3"
    assert only_reply(wireup().handle(1, "cmd=get_universe_size"), rank=1)["size"] == "2"


def test_put_get_and_errors() -> None:
    w = wireup()
    assert only_reply(w.handle(0, f"cmd=put kvsname={KVS} key=k0 value=v0")) == {
        "cmd": "put_result",
        "rc": "0",
    }
    # local puts are visible to every local rank at once, and a later put overwrites
    assert only_reply(w.handle(1, f"cmd=get kvsname={KVS} key=k0"), rank=1)["value"] == "v0"
    w.handle(1, "cmd=put key=k0 value=v1")  # kvsname is optional
    assert only_reply(w.handle(0, "cmd=get key=k0"))["value"] == "v1"
    bad = [
        "cmd=put kvsname=other key=k value=v",
        "cmd=get kvsname=other key=k0",
        "cmd=put key=k",
        "cmd=get",
        "cmd=put key=" + "k" * 65 + " value=v",
        "cmd=put key=k value=" + "v" * 1025,
    ]
    for line in bad:
        reply = only_reply(w.handle(0, line))
        assert reply["rc"] == "-1", line
        assert reply["cmd"] == ("put_result" if "put" in line else "get_result")
        assert reply["msg"]
    w.handle(0, "cmd=put key=big value=" + "v" * 1024)  # exactly the limit is fine
    assert only_reply(w.handle(0, "cmd=get key=big"))["value"] == "v" * 1024


@pytest.mark.parametrize(
    ("line", "reply_cmd"),
    [
        ("cmd=publish_name service=s", "publish_result"),  # no port
        ("cmd=publish_name port=p", "publish_result"),
        ("cmd=publish_name service=my service port=p", "publish_result"),  # MPICH does not escape
        ("cmd=unpublish_name", "unpublish_result"),
        ("cmd=lookup_name", "lookup_result"),
        ("cmd=lookup_name service=" + "s" * 257, "lookup_result"),
        ("cmd=publish_name service=s port=" + "p" * 1025, "publish_result"),
        ("cmd=spawn nprocs=1 execname=x", "spawn_result"),  # spawn is only ever an mcmd
        ("cmd=initack pmiid=1", "initack"),
        ("cmd=no_such_command", "error"),
        ("garbage", "error"),
        ("cmd=get key", "get_result"),
        ("cmd=put key=a key=b value=c", "put_result"),
        ("cmd=get key=\0", "get_result"),
    ],
)
def test_unsupported_and_garbage_get_rc_minus_1(line: str, reply_cmd: str) -> None:
    reply = only_reply(wireup().handle(0, line))
    assert reply["cmd"] == reply_cmd
    assert reply["rc"] == "-1"
    assert reply["msg"]


def test_abort_and_finalize() -> None:
    w = wireup()
    out = w.handle(1, "cmd=abort exitcode=7 message=abort\n")  # what MPICH 5 sends for MPI_Abort(comm, 7)
    assert out.replies == []  # the client does not wait for an answer
    assert out.finished == Finished(rank=1, aborted=True, exit_code=7, message="abort")
    assert w.handle(1, "cmd=abort").finished == Finished(1, True, 1, "")  # exitcode defaults to 1
    assert w.handle(1, "cmd=abort exitcode=x").finished == Finished(1, True, 1, "")
    spaced = w.handle(1, "cmd=abort exitcode=3 message=Fatal error in PMPI_Send: rank 2 is gone")
    assert spaced.finished == Finished(1, True, 3, "Fatal error in PMPI_Send: rank 2 is gone")
    garbled = w.handle(1, "cmd=abort exitcode=3 =weird")
    assert garbled.finished is not None
    assert garbled.finished.aborted
    out = w.handle(0, "cmd=finalize\n")
    assert only_reply(out) == {"cmd": "finalize_ack", "rc": "0"}
    assert out.finished == Finished(rank=0, aborted=False, exit_code=0, message="")


def test_non_local_rank_is_a_caller_error() -> None:
    with pytest.raises(ValueError):
        wireup(local=(0,)).handle(1, "cmd=get_maxes")


@pytest.mark.parametrize(
    "kw",
    [
        {"kvsname": "has space"},
        {"kvsname": ""},
        {"kvsname": "k" * 257},
        {"size": 0},
        {"local_ranks": []},
        {"local_ranks": [2]},
        {"process_mapping": ""},
        {"process_mapping": "(vector, (0,1,2))"},
    ],
)
def test_constructor_validates(kw: dict[str, Any]) -> None:
    args: dict[str, Any] = {
        "kvsname": KVS,
        "size": 2,
        "local_ranks": [0, 1],
        "process_mapping": "(vector,(0,1,2))",
    }
    with pytest.raises(ValueError):
        Wireup(**{**args, **kw})


def test_barrier_sequencing_two_local_ranks() -> None:
    w = wireup()
    w.handle(0, "cmd=put key=a value=1")
    first = w.handle(0, "cmd=barrier_in\n")
    assert first.replies == []
    assert first.barrier is None
    again = only_reply(w.handle(0, "cmd=barrier_in\n"))  # twice before barrier_out
    assert again["cmd"] == "barrier_out"
    assert again["rc"] == "-1"
    with pytest.raises(ValueError):
        w.barrier_done(0, {})  # not complete on this node yet
    w.handle(1, "cmd=put key=b value=2")
    second = w.handle(1, "cmd=barrier_in\n")
    assert second.replies == []  # nobody is released before barrier_done
    assert second.barrier == BarrierIn(seq=0, puts={"a": "1", "b": "2"})
    with pytest.raises(ValueError):
        w.barrier_done(1, {})  # wrong seq
    released = w.barrier_done(0, {"a": "1", "b": "2", "remote": "r"})
    assert released == [(0, "cmd=barrier_out rc=0\n"), (1, "cmd=barrier_out rc=0\n")]
    with pytest.raises(ValueError):
        w.barrier_done(0, {})  # already done
    assert only_reply(w.handle(1, "cmd=get key=remote"), rank=1)["value"] == "r"
    # barrier 1 carries only the puts made since barrier 0
    w.handle(1, "cmd=put key=c value=3")
    assert w.handle(1, "cmd=barrier_in").barrier is None
    assert w.handle(0, "cmd=barrier_in").barrier == BarrierIn(seq=1, puts={"c": "3"})
    assert [r for r, _ in w.barrier_done(1, {})] == [0, 1]


def test_finalize_leaves_barriers_but_a_dead_rank_does_not() -> None:
    w = wireup(local=(0, 1, 2), size=3)
    assert w.handle(0, "cmd=barrier_in").barrier is None
    # rank 2 finalizes: barrier 0 no longer waits for it...
    assert w.handle(2, "cmd=finalize").barrier is None  # ...but rank 1 is still missing
    w.rank_gone(2)
    done = w.handle(1, "cmd=barrier_in")
    assert done.barrier == BarrierIn(0, {})
    assert only_reply(w.handle(2, "cmd=barrier_in"), rank=2)["rc"] == "-1"  # finalized ranks cannot enter
    assert [r for r, _ in w.barrier_done(0, {})] == [0, 1]
    # a finalize can be what completes a barrier
    w.handle(0, "cmd=barrier_in")
    last = w.handle(1, "cmd=finalize")
    assert last.barrier == BarrierIn(1, {})
    assert last.finished == Finished(1, False, 0, "")
    assert [r for r, _ in w.barrier_done(1, {})] == [0]
    # rank 0 dies in barrier 2 is not a case (it is alone); a dead rank that never finalized blocks:
    w2 = wireup()
    w2.handle(0, "cmd=barrier_in")
    w2.rank_gone(1)
    assert w2.handle(0, "cmd=get_maxes").barrier is None
    # and a rank that vanished inside a barrier gets no barrier_out
    w3 = wireup()
    w3.handle(0, "cmd=barrier_in")
    assert w3.handle(1, "cmd=barrier_in").barrier == BarrierIn(0, {})
    w3.rank_gone(1)
    assert [r for r, _ in w3.barrier_done(0, {})] == [0]


class FakeMM:
    """Stands in for the MM: collects one BarrierIn per node, merges their puts, releases every node."""

    def __init__(self, nodes: Sequence[Wireup]) -> None:
        self.nodes = nodes
        self.arrived: dict[int, dict[int, BarrierIn]] = {}
        self.barriers = 0

    def barrier_in(self, node: int, barrier: BarrierIn) -> list[tuple[int, str]]:
        got = self.arrived.setdefault(barrier.seq, {})
        assert node not in got, f"node {node} entered barrier {barrier.seq} twice"
        got[node] = barrier
        if len(got) < len(self.nodes):
            return []
        merged: dict[str, str] = {}
        for b in got.values():
            merged.update(b.puts)
        del self.arrived[barrier.seq]
        self.barriers += 1
        return [reply for w in self.nodes for reply in w.barrier_done(barrier.seq, merged)]


def test_two_node_exchange_through_fake_mm() -> None:
    mapping = process_mapping([1, 1])
    nodes = [Wireup(kvsname=KVS, size=2, local_ranks=[r], process_mapping=mapping) for r in (0, 1)]
    mm = FakeMM(nodes)
    for rank, node in enumerate(nodes):
        node.handle(rank, f"cmd=put kvsname={KVS} key=-allgather-1-{rank} value=addr{rank}")
    # before the barrier, the other node's key is not visible
    assert only_reply(nodes[0].handle(0, "cmd=get key=-allgather-1-1"))["rc"] == "-1"
    b0 = nodes[0].handle(0, "cmd=barrier_in").barrier
    assert b0 == BarrierIn(0, {"-allgather-1-0": "addr0"})
    assert mm.barrier_in(0, b0) == []
    b1 = nodes[1].handle(1, "cmd=barrier_in").barrier
    assert b1 is not None
    assert sorted(mm.barrier_in(1, b1)) == [(0, "cmd=barrier_out rc=0\n"), (1, "cmd=barrier_out rc=0\n")]
    for rank, node in enumerate(nodes):
        for other in (0, 1):
            got = only_reply(node.handle(rank, f"cmd=get key=-allgather-1-{other}"), rank=rank)
            assert got["value"] == f"addr{other}"


# ---------------------------------------------------------------------------------------------
# Real MPI ranks


class MiniShell:
    """Starts real ranks with PMI_FD socketpairs and serves them: one Wireup per simulated node."""

    def __init__(self, argv: Sequence[str], ranks_per_node: Sequence[int], out_dir: Path) -> None:
        self.kvsname = f"storm-test-{os.getpid()}-{secrets.token_hex(4)}"
        self.size = sum(ranks_per_node)
        mapping = process_mapping(ranks_per_node)
        self.node_of: dict[int, int] = {}
        self.nodes: list[Wireup] = []
        for node, count in enumerate(ranks_per_node):
            local = range(len(self.node_of), len(self.node_of) + count)
            self.node_of.update(dict.fromkeys(local, node))
            self.nodes.append(
                Wireup(kvsname=self.kvsname, size=self.size, local_ranks=local, process_mapping=mapping)
            )
        self.mm = FakeMM(self.nodes)
        self.finished: dict[int, Finished] = {}
        self.lines: dict[int, list[str]] = {r: [] for r in range(self.size)}
        self.out = {r: out_dir / f"{self.kvsname}.{r}.out" for r in range(self.size)}
        self.sel = selectors.DefaultSelector()
        self.socks: dict[int, socket.socket] = {}
        self.bufs: dict[int, bytes] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PMI_")}
        try:
            for rank in range(self.size):
                ours, theirs = socket.socketpair()
                rank_env = {
                    **env,
                    "PMI_FD": str(theirs.fileno()),
                    "PMI_RANK": str(rank),
                    "PMI_SIZE": str(self.size),
                }
                with self.out[rank].open("wb") as out:
                    self.procs[rank] = subprocess.Popen(
                        argv, env=rank_env, pass_fds=[theirs.fileno()], stdout=out, stderr=subprocess.STDOUT
                    )
                theirs.close()
                self.socks[rank] = ours
                self.bufs[rank] = b""
                self.sel.register(ours, selectors.EVENT_READ, rank)
        except BaseException:
            self.close()
            raise

    def _send(self, replies: list[tuple[int, str]]) -> None:
        for rank, line in replies:
            if rank in self.socks:
                self.socks[rank].sendall(line.encode())

    def _serve_once(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            rank: int = key.data
            data = self.socks[rank].recv(65536)
            node = self.nodes[self.node_of[rank]]
            if not data:
                self.sel.unregister(self.socks.pop(rank))
                node.rank_gone(rank)
                continue
            self.bufs[rank] += data
            while b"\n" in self.bufs[rank]:
                raw, self.bufs[rank] = self.bufs[rank].split(b"\n", 1)
                line = raw.decode(errors="replace") + "\n"
                self.lines[rank].append(line)
                outcome = node.handle(rank, line)
                self._send(outcome.replies)
                if outcome.finished is not None:
                    self.finished[rank] = outcome.finished
                if outcome.barrier is not None:
                    self._send(self.mm.barrier_in(self.node_of[rank], outcome.barrier))

    def serve_until(self, done: Callable[[], bool], timeout: float = MPI_DEADLINE) -> None:
        """Serve PMI until ``done()``; TimeoutError (processes are killed by close()) after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"MPI job {self.kvsname} not done after {timeout} s: {self.output()}")
            self._serve_once(min(left, 0.05))

    def serve_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._serve_once(min(left, 0.05))

    def exited(self) -> bool:
        return not self.socks and all(p.poll() is not None for p in self.procs.values())

    def run(self, timeout: float = MPI_DEADLINE) -> dict[int, int]:
        self.serve_until(self.exited, timeout)
        return {rank: p.wait() for rank, p in self.procs.items()}

    def output(self, rank: int | None = None) -> str:
        ranks = [rank] if rank is not None else sorted(self.out)
        return "\n".join(self.out[r].read_text(errors="replace") for r in ranks if self.out[r].exists())

    def close(self) -> None:
        """Kill (by pid) every rank still running, reap them, close the sockets."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(timeout=10)
        for sock in self.socks.values():
            sock.close()
        self.sel.close()

    def __enter__(self) -> MiniShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mpich_files() -> set[str]:
    return {name for name in os.listdir(SHM) if name.startswith("mpich_")} if SHM.is_dir() else set()


def files_of(kvsname: str, names: set[str]) -> set[str]:
    return {name for name in names if name.startswith(mpich_shm_prefixes(kvsname))}


@pytest.fixture
def shm_guard() -> Iterator[list[str]]:
    """Collects the kvsnames a test runs; afterwards /dev/shm must hold no new mpich_* file of theirs.

    (Only files of our own jobs are judged: other jobs may run on this machine at the same time.)
    """
    kvsnames: list[str] = []
    before = mpich_files()
    yield kvsnames
    leftover = {name for kvs in kvsnames for name in files_of(kvs, mpich_files() - before)}
    for name in leftover:
        (SHM / name).unlink(missing_ok=True)
    assert not leftover, f"MPI jobs left shm segments behind: {sorted(leftover)}"


@pytest.fixture(scope="session")
def hello_c(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mpicc = Path(sys.executable).parent / "mpicc"
    if not mpicc.exists():
        pytest.skip("no mpicc next to the Python interpreter (the mpich wheel provides one)")
    exe = tmp_path_factory.mktemp("hello_c") / "hello_mpi"
    subprocess.run(
        [str(mpicc), "-O1", "-Wall", "-o", str(exe), str(APPS / "hello_mpi.c")], check=True, timeout=120
    )
    return exe


HELLO_LINE = re.compile(
    r"rank (\d+)/(\d+) on \S+ pid \d+: allreduce=(\d+) \(expected (\d+)\), from left=(\d+) \(expected (\d+)\)"
)


def check_hello(shell: MiniShell, codes: dict[int, int]) -> None:
    out = shell.output(0)
    assert codes == dict.fromkeys(range(shell.size), 0), shell.output()
    n = shell.size
    found = [m.groups() for m in HELLO_LINE.finditer(out)]
    expected_sum = str(n * (n + 1) // 2)
    assert found == [
        (str(r), str(n), expected_sum, expected_sum, str((r - 1) % n), str((r - 1) % n)) for r in range(n)
    ]
    assert out.rstrip().endswith("hello: OK")
    assert shell.finished == {r: Finished(r, False, 0, "") for r in range(n)}  # every rank finalized
    assert shell.mm.barriers >= 1  # MPICH 5: 1 barrier (finalize) on one node; 2 across nodes


@pytest.mark.parametrize("ranks_per_node", [[2], [1, 1]], ids=["1node-x2", "2nodes-x1"])
@pytest.mark.parametrize("program", ["python", "c"])
def test_hello_real_ranks(
    program: str,
    ranks_per_node: list[int],
    tmp_path: Path,
    shm_guard: list[str],
    request: pytest.FixtureRequest,
) -> None:
    if program == "python":
        argv = [sys.executable, "-m", "storm.tools.apps.hello"]
    else:
        argv = [str(request.getfixturevalue("hello_c"))]
    with MiniShell(argv, ranks_per_node, tmp_path) as shell:
        shm_guard.append(shell.kvsname)
        check_hello(shell, shell.run())
        if len(ranks_per_node) > 1:  # across nodes, MPICH exchanges addresses through the KVS
            assert any(line.startswith("cmd=put ") for line in shell.lines[0])


@pytest.mark.parametrize("ranks_per_node", [[2, 1], [2, 2]], ids=["3ranks-2+1", "4ranks-2+2"])
def test_hello_by_path_shm_and_network_mixed(
    ranks_per_node: list[int], tmp_path: Path, shm_guard: list[str]
) -> None:
    with MiniShell([sys.executable, str(APPS / "hello.py")], ranks_per_node, tmp_path) as shell:
        shm_guard.append(shell.kvsname)
        check_hello(shell, shell.run())


def test_abort_reaches_the_shell_and_mpich_keeps_running(tmp_path: Path, shm_guard: list[str]) -> None:
    code = "from mpi4py import MPI\nc = MPI.COMM_WORLD\nc.Barrier()\n"
    code += "if c.rank == 1:\n    c.Abort(7)\nc.recv(source=1)\n"
    with MiniShell([sys.executable, "-c", code], [2], tmp_path) as shell:
        shm_guard.append(shell.kvsname)
        shell.serve_until(lambda: 1 in shell.finished)
        assert shell.finished[1] == Finished(1, True, 7, "abort")
        assert shell.procs[1].poll() is None  # MPICH 5 relies on the process manager to kill it
        shell.close()  # which is what the job shell does
        assert files_of(shell.kvsname, mpich_files())  # killed ranks leave their shm segment behind
        for name in files_of(shell.kvsname, mpich_files()):
            (SHM / name).unlink()


def test_fail_app_rank_exits_before_finalize(tmp_path: Path, shm_guard: list[str]) -> None:
    argv = [sys.executable, "-m", "storm.tools.apps.fail", "--rank", "1", "--code", "3", "--after", "0.2"]
    with MiniShell(argv, [1, 1], tmp_path) as shell:
        shm_guard.append(shell.kvsname)
        shell.serve_until(lambda: shell.procs[1].poll() is not None)
        assert shell.procs[1].returncode == 3
        assert 1 not in shell.finished  # no finalize, no abort: it just vanished
        assert "rank 1/2 exits with code 3" in shell.output(1)
        shell.serve_for(0.5)
        assert shell.procs[0].poll() is None  # its peer keeps spinning in the receive
        shell.close()
        for name in files_of(shell.kvsname, mpich_files()):
            (SHM / name).unlink()


@pytest.mark.parametrize("ranks_per_node", [[2], [1, 1]], ids=["1node-x2", "2nodes-x1"])
def test_mpich_shm_names_of_a_killed_job(
    ranks_per_node: list[int], tmp_path: Path, shm_guard: list[str]
) -> None:
    argv = [sys.executable, "-m", "storm.tools.apps.spin", "--mpi"]
    before = mpich_files()
    with MiniShell(argv, ranks_per_node, tmp_path) as shell:
        shm_guard.append(shell.kvsname)
        prefix = mpich_shm_prefixes(shell.kvsname)[0]
        wanted = {f"{prefix}{node}" for node in range(len(ranks_per_node))}  # one per node, named by node id
        shell.serve_until(lambda: wanted <= mpich_files())
        shell.close()  # SIGKILL mid-run
        left = mpich_files() - before
        assert wanted <= left, sorted(left)
        assert files_of(shell.kvsname, left) == wanted  # one segment a node; no mpich_vci_ by default
        exact = {name for node in range(len(ranks_per_node)) for name in mpich_shm_names(shell.kvsname, node)}
        assert wanted <= exact  # what a node manager removes, node by node
        for name in wanted:
            (SHM / name).unlink()
