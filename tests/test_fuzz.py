"""Fuzzing: every op's messages, valid and then broken in every way, against the decoder and live daemons.

One mutation engine serves both fuzzers. It builds a valid message of any op (the examples of
tests/test_protocol.py with fields replaced by random values of their declared types, where the message stays
valid), then breaks it: wrong types, missing and extra fields, edge and impossible values, another op,
records nested in lists, and at the byte level truncation, bit flips, insertions, deletions and duplications.

- The property-based fuzzer (hypothesis drives the engine's random choices) checks that the decoder returns
  a valid message of a registered op, which encodes and decodes back to itself, or raises ProtocolError, and
  never anything else.
- The raw-bytes fuzzer sends 10,000 such messages from a fixed seed to a live cluster (the MM's client and
  node sockets, and framed on a node manager's job shell socket), plus raw streams that are no ZeroMQ or
  frames at all to every listening socket,
  while a job runs; then every daemon must be up, answering, with no descriptor leaked, the running job
  untouched, a new job must run correctly, and the store must hold exactly the jobs the fuzz submitted (the
  test decodes each message as the MM does, so it knows which ones were real submissions and cancels).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import json
import math
import random
import socket
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storm.mm import protocol as p
from storm.nm.shell_link import HEADER, frame
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, fd_count, poll, python_app, storm_cli
from tests.test_cluster_input import fake_mm, node_dealer, standalone_nm
from tests.test_protocol import CHANGE, EXAMPLES, JOB_INFO, LAUNCH, NODE_INFO, PROFILE, RANK_STATS, pack

OPS = sorted(p.registered_ops())
HINTS = {cls: typing.get_type_hints(cls) for cls in p.registered_ops().values()}
# A valid instance of each nested record, for when random values do not make one.
RECORDS: dict[type, Any] = {
    p.RankExit: p.RankExit(rank=0, exit_code=0),
    p.RankSlot: p.RankSlot(rank=0, pe=0),
    p.JobInfo: JOB_INFO,
    p.NodeInfo: NODE_INFO,
    p.RankStats: RANK_STATS,
    p.ClassChange: CHANGE,
    p.ProfileEntry: PROFILE[0],
    p.FcsParameters: p.FcsParameters(),
    p.BoxInfo: p.BoxInfo(base=(0, 1, 0), shape=(2, 1, 1)),
    p.TorusView: p.TorusView(dims=(1, 1, 2), nodes=("node0", ""), jobs=(3, 0)),
    p.LaunchJob: LAUNCH,  # in shell_launch
    p.HistoryEntry: EXAMPLES["history"].jobs[0],  # type: ignore[attr-defined]
    p.TaskRef: p.TaskRef(array_id=12, task=3),  # in cancel_jobs and list_jobs
    p.SwitchTimings: EXAMPLES["node_status"].timings,  # in node_status
}
# No '/': a fuzzed submit must never name a real directory for its output.
ALPHABET = "abcxyz0179 _-.:=é中\u2028"


# ------------------------------------------------------------------------------------------- valid messages


def plausible(hint: Any, rng: random.Random) -> Any:
    """A random value of a declared field type (as a constructor takes it: tuples, records)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if len(options) < len(typing.get_args(hint)) and rng.random() < 0.3:
            return None
        return plausible(rng.choice(options), rng)
    if hint is bool:
        return rng.random() < 0.5
    if hint is int:
        return rng.choice([0, 1, 2, 3, 9, 255, 4096, 2**31, 2**63 - 1, rng.randrange(1000)])
    if hint is float:
        return rng.choice([0.0, 0.5, 1.0, 60.0, 1e9, rng.random() * 100])
    if hint is str:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(12)))
    if hint is bytes:
        return rng.randbytes(rng.randrange(8))
    if origin is tuple:
        (item,) = (a for a in typing.get_args(hint) if a is not Ellipsis)
        return tuple(plausible(item, rng) for _ in range(rng.randrange(4)))
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        keys = [str(rng.randrange(10)) if rng.random() < 0.5 else plausible(key_hint, rng) for _ in range(3)]
        return {k: plausible(value_hint, rng) for k in keys[: rng.randrange(4)]}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return vary(RECORDS[hint], rng)
    raise TypeError(f"no generator for {hint!r}")


def vary(base: Any, rng: random.Random, share: float = 0.5) -> Any:
    """``base`` with about ``share`` of its fields replaced by random values, each kept only if the result is
    still valid (the constructor checks): a valid message, different on every call."""
    hints = typing.get_type_hints(type(base))
    for f in dataclasses.fields(base):
        if rng.random() < share:
            with contextlib.suppress(p.ProtocolError):  # then the field keeps its value
                base = dataclasses.replace(base, **{f.name: plausible(hints[f.name], rng)})
    return base


def valid_message(op: str, rng: random.Random, examples: dict[str, p.Message] | None = None) -> p.Message:
    return typing.cast(p.Message, vary((examples or EXAMPLES)[op], rng))


# ---------------------------------------------------------------------------------------------- mutations

WRONG_TYPES: list[Any] = [None, True, False, 0, -1, 1.5, "", "text", b"\x00bytes", [], [1, "a"], {}, {"k": 1}]
EDGES: dict[type, list[Any]] = {
    int: [-1, 0, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)],
    float: [math.nan, math.inf, -math.inf, -0.0, -1.0, 1e308, 5e-324, 0.0],
    str: ["", "\x00", "a\x00b", "x" * 300, "\u2028", "=", "-1", "99999999999999999999"],
    list: [[], [None] * 40, [[[]]]],
    dict: [{}, {"": ""}, {"0": -1}, {str(i): i for i in range(40)}],
}
Location = tuple[Any, ...]


def locations(value: Any, here: Location = ()) -> list[Location]:
    """Every place in a decoded msgpack body: the root, map values and list items, at any depth."""
    found = [here]
    if isinstance(value, dict):
        for key, item in value.items():
            found += locations(item, (*here, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += locations(item, (*here, index))
    return found


def at(body: Any, where: Location) -> Any:
    for key in where:
        body = body[key]
    return body


def mutate_body(body: Any, rng: random.Random) -> Any:
    """One structural mutation of a decoded message (a copy; the argument is left alone)."""
    body = copy.deepcopy(body)
    places = locations(body)
    inner = [w for w in places if w]
    kind = rng.choice(["retype", "edge", "drop", "extra", "op", "nest"])
    if kind == "op" and isinstance(body, dict):
        body["op"] = rng.choice([*OPS, "", "no_such_op", "SUBMIT_JOB", 5, None, b"submit_job"])
        return body
    if kind == "drop":
        keyed = [w for w in inner if isinstance(at(body, w[:-1]), dict)]
        if keyed:
            where = rng.choice(keyed)
            del at(body, where[:-1])[where[-1]]
            return body
    if kind == "extra":
        maps = [w for w in places if isinstance(at(body, w), dict)]
        if maps:
            name = rng.choice(["x", "req", "op", "node", "job_id", "\x00", *HINTS[rng.choice(list(HINTS))]])
            at(body, rng.choice(maps))[name] = rng.choice(WRONG_TYPES)
            return body
    where = rng.choice(inner) if inner else ()
    value = at(body, where)
    if kind == "edge" and type(value) in EDGES:
        new = rng.choice(EDGES[type(value)])
    elif kind == "nest":
        new = rng.choice([[value], {"v": value}, [value, value]])
    else:
        new = rng.choice(WRONG_TYPES)
    if not where:
        return new
    at(body, where[:-1])[where[-1]] = new
    return body


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One byte-level mutation: what a broken or hostile peer sends."""
    n = len(data)
    i, j = sorted((rng.randrange(n + 1), rng.randrange(n + 1)))
    kind = rng.choice(["truncate", "flip", "insert", "delete", "duplicate", "append", "replace"])
    if kind == "truncate":
        return data[:i]
    if kind == "flip" and n:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == "insert":
        return data[:i] + rng.randbytes(rng.randint(1, 16)) + data[i:]
    if kind == "delete":
        return data[:i] + data[j:]
    if kind == "duplicate":
        return data[:j] + data[i:j] + data[j:]
    if kind == "append":
        return data + rng.randbytes(rng.randint(1, 16))
    return rng.randbytes(rng.randrange(64))


def mutated(msg: p.Message, rng: random.Random) -> bytes:
    """``msg`` broken by one to three mutations, structural first, then possibly at the byte level."""
    body = msgpack.unpackb(p.encode(msg), raw=False)
    data = b""
    for _ in range(rng.randint(1, 3)):
        if data or rng.random() < 0.3:
            data = mutate_bytes(data or pack(body), rng)
        else:
            body = mutate_body(body, rng)
    return data or pack(body)


def random_object(rng: random.Random, depth: int = 0) -> Any:
    if depth < 3 and rng.random() < 0.4:
        if rng.random() < 0.5:
            return [random_object(rng, depth + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(["op", "req", "a", ""]): random_object(rng, depth + 1) for _ in range(3)}
    return rng.choice([*WRONG_TYPES, *EDGES[int], *EDGES[str], rng.choice(OPS)])


def payload(rng: random.Random, examples: dict[str, p.Message], ops: list[str]) -> bytes:
    """One fuzzed message: mostly valid messages of ``ops`` broken (or not: 15% stay valid), some raw."""
    roll = rng.random()
    if roll < 0.08:
        return rng.randbytes(rng.randrange(200))
    if roll < 0.13:
        return pack(random_object(rng))
    msg = valid_message(rng.choice(ops), rng, examples)
    return p.encode(msg) if roll < 0.28 else mutated(msg, rng)


def decoded(data: bytes, limit: int = p.MAX_NODE_MESSAGE) -> p.Message | None:
    """What a daemon makes of ``data``: a valid message or None (a ProtocolError); nothing else may happen."""
    try:
        msg = p.decode(data, limit)
    except p.ProtocolError as exc:
        assert str(exc)
        return None
    assert type(msg) is p.registered_ops()[msg.op]
    assert p.decode(p.encode(msg), p.MAX_NODE_MESSAGE) == msg  # what was accepted can be passed on as it is
    return msg


# ---------------------------------------------------------------------------------------------- properties


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(OPS), st.randoms(use_true_random=False))
def test_broken_messages_decode_to_valid_ones_or_raise_protocol_error(op: str, rng: random.Random) -> None:
    msg = valid_message(op, rng)
    assert decoded(p.encode(msg)) == msg
    decoded(mutated(msg, rng))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(OPS), st.randoms(use_true_random=False))
def test_unknown_fields_are_ignored_anywhere(op: str, rng: random.Random) -> None:
    msg = valid_message(op, rng)
    body = msgpack.unpackb(p.encode(msg), raw=False)
    maps = [w for w in locations(body) if isinstance(at(body, w), dict) and (not w or isinstance(w[-1], int))]
    for where in rng.sample(maps, min(len(maps), 3)):  # the message and records nested in lists
        at(body, where)["zz_newer_peer_field"] = random_object(rng)
    assert decoded(pack(body)) == msg


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(OPS), st.randoms(use_true_random=False), st.integers(0, 64))
def test_a_message_cut_short_is_a_protocol_error(op: str, rng: random.Random, cut: int) -> None:
    data = p.encode(valid_message(op, rng))
    with pytest.raises(p.ProtocolError, match="not a msgpack message"):
        p.decode(data[: max(0, len(data) - 1 - cut)])
    with pytest.raises(p.ProtocolError, match="exceeds the limit"):
        p.decode(data, max_bytes=len(data) - 1)


def test_the_mutation_engine_reaches_every_outcome() -> None:
    """The fuzzers above are only as good as their inputs: they must produce valid messages of every op,
    refusals for each kind of reason, and no message the engine cannot build."""
    rng = random.Random(7)
    accepted: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    for i in range(3000):
        data = payload(rng, EXAMPLES, OPS)
        try:
            accepted[p.decode(data, p.MAX_NODE_MESSAGE).op] += 1
        except p.ProtocolError as exc:
            text = str(exc)
            for reason in ("not a msgpack", "unknown op", "missing field", "expected", "must", "needs"):
                if reason in text:
                    reasons[reason] += 1
        assert i < 100 or sum(accepted.values()) > 0
    assert set(accepted) == set(OPS)
    assert all(reasons[r] >= 10 for r in ("not a msgpack", "unknown op", "missing field", "expected", "must"))


# ---------------------------------------------------------------------------------------------- live daemons

SEED = 20261121
CLIENT_MESSAGES, NODE_MESSAGES, SHELL_MESSAGES = 4000, 3000, 3000
MAX_MESSAGE = 64 << 10  # [mm] max_message_bytes of the fuzzed cluster: oversized messages stay cheap
FUZZ_NODE = "fuzz"  # the node socket's fuzzer: a routing id no real node has
REPLY_TIMEOUT_MS = 10_000


def dealer(endpoint: str, identity: bytes = b"") -> zmq.Socket[bytes]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    if identity:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    sock.connect(endpoint)
    return sock


def client_examples(work: Path) -> dict[str, p.Message]:
    """Seeds for the client socket: a submit of `true` in the test's directory (outputs land there)."""
    submit = p.SubmitJob(req=1, ranks=1, argv=("true",), cwd=str(work), env={"FUZZ": "1"}, name="fuzz")
    return {**EXAMPLES, "submit_job": submit}


def node_examples() -> dict[str, p.Message]:
    """Seeds for the node socket, in the name of a node that never registered."""
    return {
        op: dataclasses.replace(msg, node=FUZZ_NODE) if hasattr(msg, "node") else msg
        for op, msg in EXAMPLES.items()
    }


Counts = collections.Counter[str]


def fuzz_client_socket(
    cluster: LocalCluster, rng: random.Random, work: Path, spare: int, counts: Counts
) -> tuple[dict[int, p.SubmitJob], set[int]]:
    """Send CLIENT_MESSAGES fuzzed requests, each followed by a list_nodes whose reply closes its window:
    every message gets its reply (or, for a valid wait_job, gets it later) and the MM answers after each.

    Returns the submissions the MM accepted (job id -> the request as the MM decodes it) and the job ids of
    real cancels; a cancel of job ``spare`` is not sent (that job must run on untouched)."""
    examples = client_examples(work)
    submits: dict[int, p.SubmitJob] = {}
    cancels: set[int] = set()
    sock = dealer(cluster.endpoint)
    try:
        sent = 0
        while sent < CLIENT_MESSAGES:
            data = payload(rng, examples, OPS)
            if sent % 500 == 250:  # over the limit, but under ZeroMQ's cut-off: a clear error
                data = pack({"op": "list_jobs", "req": 3, "pad": "x" * MAX_MESSAGE})
            msg: p.Message | None = None
            if sent % 1000 == 999:
                sock.send_multipart([data, b"second frame"])  # dropped unread: a request is one frame
            else:
                msg = decoded(data, MAX_MESSAGE) if len(data) <= MAX_MESSAGE else None
                if isinstance(msg, p.CancelJobs) and spare in msg.job_ids:
                    counts["client messages skipped (would cancel the running job)"] += 1
                    continue
                if isinstance(msg, p.CancelJobs):
                    cancels.update(msg.job_ids)
                sock.send(data)
            sent += 1
            sentinel = 2**62 + sent
            sock.send(p.encode(p.ListNodes(req=sentinel)))
            replies = []
            while True:
                reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
                if isinstance(reply, p.NodeList) and reply.req == sentinel:
                    break
                key = f"{reply.op}:{reply.code}" if isinstance(reply, p.Error) else reply.op
                counts[f"client reply {key}"] += 1
                replies.append(reply)
            accepted = [r.job_id for r in replies if isinstance(r, p.JobSubmitted)]
            if accepted:  # only a real submission is answered so, and only once
                assert isinstance(msg, p.SubmitJob) and len(accepted) == 1, (msg, replies)
                submits[accepted[0]] = msg
    finally:
        sock.close()
    counts["client messages"] = CLIENT_MESSAGES
    return submits, cancels


def fuzz_node_socket(cluster: LocalCluster, rng: random.Random, counts: Counts) -> None:
    """NODE_MESSAGES fuzzed node reports from a node that never registered: each gets exactly one answer
    (an error, or 'register first'). None may register a node: with an allowed key that is what a node
    does, and the fuzzer's own key is allowed only so that its messages get past the handshake."""
    examples = node_examples()
    ops = [op for op in OPS if op != "register_node"]
    sock = node_dealer(cluster, FUZZ_NODE.encode())
    try:
        sent = 0
        while sent < NODE_MESSAGES:
            data = payload(rng, examples, ops)
            if isinstance(decoded(data), p.RegisterNode):
                counts["node messages skipped (would register)"] += 1
                continue
            sock.send(data)
            sent += 1
            reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
            key = f"{reply.op}:{reply.code}" if isinstance(reply, p.Error) else reply.op
            counts[f"node reply {key}"] += 1
    finally:
        sock.close()
    counts["node messages"] = NODE_MESSAGES


def fuzz_shell_socket(cluster: LocalCluster, rng: random.Random, job_id: int, counts: Counts) -> None:
    """SHELL_MESSAGES fuzzed job shell reports to node0's NM, most about a job that runs there, framed on two
    connections in turn: the NM must drop every one (the sender is not that job's shell: not its pid). Then,
    on a third, a frame announcing more than MAX_NODE_MESSAGE bytes: the NM closes that connection unread."""
    examples = {
        op: dataclasses.replace(msg, job_id=job_id) if hasattr(msg, "job_id") else msg
        for op, msg in EXAMPLES.items()
    }
    path = str(cluster.node_dir("node0") / "shells.sock")
    with unix_stream(path) as impostor, unix_stream(path) as stranger:
        for i in range(SHELL_MESSAGES):
            (impostor if i % 2 else stranger).sendall(frame(payload(rng, examples, OPS)))
    counts["shell messages"] = SHELL_MESSAGES
    with unix_stream(path) as big:
        big.sendall(HEADER.pack(p.MAX_NODE_MESSAGE + 1))
        assert big.recv(1) == b"", "the NM kept a connection that announced an oversized message"
    counts["shell messages over the limit"] += 1


def unix_stream(path: str) -> socket.socket:
    """A connection to a Unix stream socket, whose reads give up after REPLY_TIMEOUT_MS."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(REPLY_TIMEOUT_MS / 1000)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f\x03\x01NULL" + b"\x00" * 16


def raw_streams(targets: list[tuple[int, Any]], rng: random.Random, counts: Counts) -> None:
    """Bytes that are not ZeroMQ at all (or a greeting followed by garbage) on every listening socket."""
    for family, address in targets:
        for _ in range(20):
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(2.0)
                s.connect(address)
                head = ZMTP_GREETING[: rng.randrange(len(ZMTP_GREETING) + 1)] if rng.random() < 0.5 else b""
                with contextlib.suppress(OSError):  # the daemon hung up first: what it should do
                    s.sendall(head + rng.randbytes(rng.randrange(1, 512)))
            counts["raw streams"] += 1


def tcp(endpoint: str) -> tuple[int, tuple[str, int]]:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return socket.AF_INET, (host, int(port))


def daemons(cluster: LocalCluster) -> list[int]:
    assert cluster.mm is not None
    return [cluster.mm.pid, *(nm.pid for nm in cluster.nms)]


def queue(cluster: LocalCluster, cwd: Path, everything: bool = True) -> list[p.JobInfo]:
    """`storm queue [--all] --json`, read back through the protocol's own validation."""
    result = storm_cli(cluster, "queue", "--json", *(["--all"] if everything else []), cwd=cwd)
    assert result.returncode == 0, result.stderr
    listed = p.decode(pack({"op": "job_list", "jobs": json.loads(result.stdout)}), p.MAX_NODE_MESSAGE)
    assert isinstance(listed, p.JobList)
    return list(listed.jobs)


def check_finished(job: p.JobInfo) -> None:
    """A job in a final state that hangs together."""
    assert job.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), job
    assert job.end_time is not None and job.submit_time <= job.end_time, job
    assert job.start_time is None or job.submit_time <= job.start_time <= job.end_time, job
    assert (job.state == "COMPLETED") == (job.exit_code == 0), job
    assert job.state != "CANCELLED" or "cancelled by" in job.reason, job


@pytest.mark.slow
def test_ten_thousand_fuzzed_messages_leave_every_daemon_up(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = make_cluster(nodes=2, policy="gang", mm_mpl=2, mm_max_message_bytes=MAX_MESSAGE)
    work = tmp_path / "fuzz" / "work"
    work.mkdir(parents=True)
    rng = random.Random(SEED)
    counts: collections.Counter[str] = collections.Counter()
    with cluster.client() as client:
        # A job that runs on both nodes throughout: the fuzz must not touch it.
        sleeper = client.submit(["sleep", "60"], 2, cwd=str(work), output=str(work / "sleeper.out"))
        poll(lambda: client.job(sleeper).state == "RUNNING", JOB_TIMEOUT, "the sleeper to run")
        fds = {pid: fd_count(pid) for pid in daemons(cluster)}
        started = time.monotonic()

        submits, cancels = fuzz_client_socket(cluster, rng, work, sleeper, counts)
        fuzz_node_socket(cluster, rng, counts)
        fuzz_shell_socket(cluster, rng, sleeper, counts)
        # Beyond ZeroMQ's cut-off (4 x max_message_bytes): the MM drops the connection unread.
        for _ in range(3):
            big = dealer(cluster.endpoint)
            big.send(b"\x81" + b"x" * (4 * MAX_MESSAGE + 1))
            big.close()
            counts["client messages over the cut-off"] += 1
        subscriber = zmq.Context.instance().socket(zmq.SUB)
        subscriber.setsockopt(zmq.LINGER, 0)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"s" * 4096)  # a subscription far over what the MM takes
        subscriber.connect(cluster.heartbeat_endpoint)
        raw_streams(
            [
                (socket.AF_UNIX, cluster.endpoint.removeprefix("ipc://")),
                tcp(cluster.node_endpoint),
                tcp(cluster.heartbeat_endpoint),
                (socket.AF_UNIX, str(cluster.node_dir("node0") / "shells.sock")),
            ],
            rng,
            counts,
        )
        subscriber.close()
        fuzz_seconds = time.monotonic() - started

        # Every daemon is up, answers, and holds no more descriptors than before (connections closed).
        assert all(d.alive() for d in [cluster.mm, *cluster.nms] if d is not None)
        poll(
            lambda: all(fd_count(pid) <= before for pid, before in fds.items()),
            10.0,
            f"the daemons' descriptors to return to {fds}",
        )
        assert {n.name: n.state for n in client.nodes()} == {"node0": "UP", "node1": "UP"}
        assert client.job(sleeper).state == "RUNNING"
        # A new job runs correctly across both nodes (MPI wire-up through both NMs and the MM).
        hello = client.wait(
            client.submit(python_app("hello"), 2, cwd=str(work), output=str(work / "hello.out")),
            timeout=JOB_TIMEOUT,
        )
        assert hello.state == "COMPLETED" and "hello: OK" in (work / "hello.out").read_text()
        assert client.cancel((sleeper,)) in ({str(sleeper): "cancelling"}, {str(sleeper): "cancelled"})

    # The store holds the sleeper, exactly the fuzz's real submissions in order, and hello; all end.
    poll(lambda: not queue(cluster, work, everything=False), JOB_TIMEOUT, "every job to end")
    jobs = queue(cluster, work)
    assert {j.id: (j.argv, j.cwd) for j in jobs[1:-1]} == {
        job_id: (s.argv, s.cwd) for job_id, s in submits.items()
    }
    for job in jobs[1:-1]:  # a fuzzed submission may be moldable (-n MIN-MAX): it ran at a size in its range
        asked = submits[job.id]
        assert asked.ranks <= job.ranks <= max(asked.ranks, asked.max_ranks), (job, asked)
    assert jobs[0].id == sleeper and jobs[0].state == "CANCELLED"
    assert jobs[-1].id == hello.id
    for job in jobs:
        check_finished(job)
        assert job.state != "CANCELLED" or job.id in cancels or job.id == sleeper
    for name in ("mm/mm.log", "nodes/node0.log", "nodes/node1.log"):
        assert "Traceback" not in (cluster.dir / name).read_text(), name

    total = CLIENT_MESSAGES + NODE_MESSAGES + SHELL_MESSAGES
    with capsys.disabled():
        print(
            f"\nfuzz (seed {SEED}): {total} messages in {fuzz_seconds:.1f} s, {len(submits)} real submissions"
        )
        for key, value in sorted(counts.items()):
            print(f"  {key}: {value}")


# ------------------------------------------------------------------------------------------- an NM's MM side


@pytest.mark.slow
def test_an_nm_survives_a_fuzzed_mm(tmp_path: Path) -> None:
    """What a node manager accepts from its MM: 1,000 fuzzed messages (no valid launch: that would start a
    job), then it still takes a registration, answers a kill and reports to the MM."""
    sock, endpoint = fake_mm()
    try:
        with standalone_nm(endpoint, tmp_path / "nm") as nm:
            identity, first = sock.recv_multipart()
            assert identity == b"n1" and isinstance(p.decode(first), p.RegisterNode)
            rng = random.Random(SEED)
            examples = {
                **EXAMPLES,
                "node_registered": dataclasses.replace(EXAMPLES["node_registered"], node="n1"),
            }
            sent = 0
            while sent < 1000:
                data = payload(rng, examples, [op for op in OPS if op != "launch_job"])
                if not isinstance(decoded(data), p.LaunchJob):
                    sock.send_multipart([identity, data])
                    sent += 1
            registered = p.NodeRegistered(node="n1", mm_epoch="fuzz-mm", report_interval=0.2)
            sock.send_multipart([identity, p.encode(registered)])
            sock.send_multipart([identity, p.encode(p.KillJob(job_id=424242, reason="fuzz"))])
            seen: collections.Counter[str] = collections.Counter()

            def answered() -> bool:
                msg = p.decode(sock.recv_multipart()[1], p.MAX_NODE_MESSAGE)
                seen[msg.op] += isinstance(msg, p.JobNodeDone) and msg.job_id == 424242
                seen["status"] += isinstance(msg, p.NodeStatus) and msg.mm_epoch == "fuzz-mm"
                return seen["job_node_done"] >= 1 and seen["status"] >= 2

            poll(answered, 30.0, "the NM to answer a kill for an unknown job and report its status")
            assert nm.poll() is None
        assert "Traceback" not in (tmp_path / "nm.log").read_text()
    finally:
        sock.close()
