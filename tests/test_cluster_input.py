"""End to end: bad input gets a clear error, changes nothing, and no daemon dies of it.

Also the per-client limits (message size, submission rate) and what a node manager makes of heartbeats that
are replayed, out of order or from another MM, against a fake MM the test plays. The fuzzers are in
tests/test_fuzz.py.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from storm.mm import protocol as p
from storm.tools.client import Client, ClientError
from storm.tools.local_cluster import LocalCluster
from tests.helpers import poll, storm_cli

pytestmark = pytest.mark.slow


def snapshot(client: Client) -> list[tuple[int, str]]:
    return [(j.id, j.state) for j in client.jobs(everything=True)]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["submit", "-n", "0", "--", "true"], 2, "-n 0: a job needs at least 1 rank"),
        (
            ["submit", "-n", "16-4", "--", "true"],
            2,
            "-n 16-4: the minimum (16) is larger than the maximum (4)",
        ),
        (["submit", "-n", "0-3", "--", "true"], 2, "-n 0-3: a job needs at least 1 rank"),
        (["submit", "-n", "3-8", "--", "true"], 1, "3 ranks requested, but the cluster has only 2 PEs"),
        (["submit", "-n", "1", "--qos", "gold", "--", "true"], 1, "no QOS 'gold' on this cluster"),
        (["submit", "-n", "2"], 2, "a command is required"),
        (["submit", "-n", "2", "--"], 2, "a command is required"),
        (["submit", "-n", "3", "--", "true"], 1, "3 ranks requested, but the cluster has only 2 PEs"),
        (["submit", "-n", "1", "--", "no-such-program-xyz"], 2, "no-such-program-xyz: command not found"),
        (["submit", "-n", "1", "--time", "soon", "--", "true"], 2, "invalid time limit 'soon'"),
        (["show", "999999"], 1, "no job 999999"),
        (["cancel", "999999"], 1, "unknown job"),
        (
            ["submit", "-n", "x", "--", "true"],
            2,
            "-n x: give a number of ranks (4) or a range MIN-MAX (4-16)",
        ),
    ],
)
def test_cli_refuses_bad_input_and_changes_nothing(
    cluster: LocalCluster, client: Client, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    before = snapshot(client)
    result = storm_cli(cluster, *args, cwd=tmp_path)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert message in result.stderr
    assert snapshot(client) == before
    assert list(tmp_path.iterdir()) == []  # not even an output file was made


def raw_dealer(endpoint: str, identity: bytes = b"") -> zmq.Socket[bytes]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    if identity:
        sock.setsockopt(zmq.ROUTING_ID, identity)  # only takes effect before connect
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(endpoint)
    return sock


def node_dealer(cluster: LocalCluster, identity: bytes) -> zmq.Socket[bytes]:
    """A DEALER on the MM's node socket. Where the cluster runs CURVE it presents a node key the MM allows
    (made for this routing id), so that what the test sends reaches the MM's decoder and checks rather than
    stopping at the handshake; keys are what keeps strangers out, and are tested on their own."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    if getattr(cluster, "keys", False):
        cluster._keypair(identity.decode(), allow="nodes")  # type: ignore[attr-defined]
        cluster.curve(sock, identity.decode())  # type: ignore[attr-defined]
    sock.connect(cluster.node_endpoint)
    return sock


GARBAGE = [
    b"",
    b"\x00\xff garbage",
    msgpack.packb([1, 2, 3]),
    msgpack.packb({"op": "submit_job"}),
    msgpack.packb({"op": "launch_job", "req": 5}),
    msgpack.packb({"op": "no_such_op", "req": 6}),
    msgpack.packb({"op": "submit_job", "req": 7, "ranks": True, "argv": ["x"], "cwd": "/", "env": {}}),
    msgpack.packb({"op": "submit_job", "req": 8, "ranks": 1, "argv": [], "cwd": "/", "env": {}}),
    msgpack.packb({"op": "cancel_jobs", "req": 9, "job_ids": ["1"]}),
    msgpack.packb({"op": "list_jobs", "req": 10, "job_ids": [2**64 - 1]}),
]


def test_garbage_on_the_client_socket_gets_error_replies(cluster: LocalCluster, client: Client) -> None:
    before = snapshot(client)
    sock = raw_dealer(cluster.endpoint)
    try:
        for data in GARBAGE:
            sock.send(data)
            reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
            assert isinstance(reply, p.Error), (data, reply)
            assert reply.code == "bad_request" and reply.text
        # Two frames instead of one: no reply is possible (which frame was the request?), no harm done.
        sock.send_multipart([b"a", b"b"])
    finally:
        sock.close()
    assert snapshot(client) == before
    assert client.nodes()  # the MM still answers


def test_garbage_on_the_node_socket_leaves_the_mm_up(cluster: LocalCluster, client: Client) -> None:
    before = snapshot(client)
    sock = node_dealer(cluster, b"intruder")
    try:
        for data in GARBAGE[:3]:
            sock.send(data)
            assert isinstance(p.decode(sock.recv(), p.MAX_NODE_MESSAGE), p.Error)
        # Well-formed but wrong: reports from a node that never registered, about jobs that do not exist or
        # that run elsewhere. The MM believes none of them and asks the sender to register first.
        for fake in (
            p.JobNodeDone(job_id=424242, node="intruder", exits=(p.RankExit(rank=0, exit_code=0),)),
            p.JobLaunched(job_id=424242, node="intruder", pids={"0": 4242}),
            p.RankFailed(job_id=1, node="intruder", exit=p.RankExit(rank=0, signal=9)),
            p.PmiBarrierIn(job_id=1, node="intruder", seq=0, kvs={"k": "v"}),
            p.NodeStatus(node="intruder", nm_epoch="x", mm_epoch="y", jobs=(1, 2)),
        ):
            sock.send(p.encode(fake))
            reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
            assert isinstance(reply, p.Reregister) and "register first" in reply.reason, (fake, reply)
        # A node message naming another node than the sender's routing id.
        sock.send(p.encode(p.NodeStatus(node="node0", nm_epoch="x", mm_epoch="y")))
        assert isinstance(p.decode(sock.recv(), p.MAX_NODE_MESSAGE), p.Error)
    finally:
        sock.close()
    assert snapshot(client) == before
    assert {n.name: n.state for n in client.nodes()} == {"node0": "UP", "node1": "UP"}


def test_oversized_requests_get_a_clear_error_up_to_the_cut_off(
    cluster: LocalCluster, client: Client
) -> None:
    before = snapshot(client)
    sock = raw_dealer(cluster.endpoint)
    try:
        big = p.SubmitJob(req=21, ranks=1, argv=("true",), cwd="/", env={"BIG": "x" * p.MAX_CLIENT_MESSAGE})
        data = p.encode(big)
        sock.send(data)
        reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
        assert isinstance(reply, p.Error) and reply.code == "too_large"
        assert reply.text == (
            f"request of {len(data)} bytes is over the [mm] max_message_bytes limit of {p.MAX_CLIENT_MESSAGE}"
        )
    finally:
        sock.close()
    # Over four times the limit, ZeroMQ cuts the connection before the MM reads (or buffers) the message.
    cut = zmq.Context.instance().socket(zmq.DEALER)
    cut.setsockopt(zmq.LINGER, 0)
    monitor = cut.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        monitor.setsockopt(zmq.RCVTIMEO, 10_000)
        cut.connect(cluster.endpoint)
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_CONNECTED
        cut.send(b"x" * (4 * p.MAX_CLIENT_MESSAGE + 1))
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        cut.disable_monitor()
        monitor.close()
        cut.close()
    assert snapshot(client) == before
    assert client.nodes()


def test_submissions_are_limited_per_user_with_a_clear_error(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(mm_submit_rate=0.5, mm_submit_burst=3)
    with cluster.client() as client:
        ids = [client.submit(["true"], 1, cwd=str(tmp_path), output="/dev/null") for _ in range(3)]
        with pytest.raises(ClientError) as refused:
            client.submit(["true"], 1, cwd=str(tmp_path), output="/dev/null")
        assert refused.value.code == "rate_limited"
        me = pwd.getpwuid(os.getuid()).pw_name
        expected = (
            rf"too many submissions from {me}: at most 0.5 per second after a burst of 3;"
            r" try again in [0-2]\.\d\d s"
        )
        assert re.fullmatch(expected, str(refused.value)), str(refused.value)
        result = storm_cli(cluster, "submit", "-n", "1", "--output", "/dev/null", "--", "true", cwd=tmp_path)
        assert result.returncode == 1 and f"storm submit: too many submissions from {me}" in result.stderr
        # The bucket refills at one token per two seconds (the CLI above must start within that time).
        poll(lambda: submitted(client, tmp_path, ids), 5.0, "a submission to be accepted again")
        assert len(ids) == 4
        assert [j.id for j in client.jobs(everything=True)] == ids  # nothing refused was stored


def submitted(client: Client, cwd: Path, ids: list[int]) -> bool:
    try:
        ids.append(client.submit(["true"], 1, cwd=str(cwd), output="/dev/null"))
    except ClientError as exc:
        assert exc.code == "rate_limited"
        return False
    return True


# ---------------------------------------------------------------------------------------------- heartbeats


@contextlib.contextmanager
def standalone_nm(
    mm: str, run_dir: Path, *options: str, name: str = "n1"
) -> Iterator[subprocess.Popen[bytes]]:
    """A storm-nm of the test's own (not a cluster's) talking to ``mm`` (the cluster's, or a fake MM the test
    plays), logging to ``run_dir`` + ".log"."""
    argv = [
        sys.executable, "-m", "storm.nm.main", "--name", name, "--mm", mm, "--run-dir", str(run_dir),
        "--pes", "1", "--realtime", "false", "--log-level", "debug", *options,
    ]  # fmt: skip
    with open(run_dir.with_suffix(".log"), "ab") as log:
        nm = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        yield nm
    finally:
        nm.send_signal(signal.SIGTERM)
        nm.wait(timeout=30)


def fake_mm() -> tuple[zmq.Socket[bytes], str]:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def test_replayed_and_out_of_order_heartbeats_change_nothing(tmp_path: Path) -> None:
    """The NM switches only on a newer heartbeat of the MM it registered with; every other one is logged and
    ignored. Its trace (one line per heartbeat it acted on) shows which it took."""
    mm, endpoint = fake_mm()
    beats = zmq.Context.instance().socket(zmq.XPUB)  # XPUB: it hears when the NM has subscribed
    beats.setsockopt(zmq.LINGER, 0)
    beats.setsockopt(zmq.RCVTIMEO, 10_000)
    port = beats.bind_to_random_port("tcp://127.0.0.1")
    run_dir, trace = tmp_path / "nm", tmp_path / "trace"
    log = tmp_path / "nm.log"
    try:
        with standalone_nm(endpoint, run_dir, "--trace", str(trace)):
            identity, first = mm.recv_multipart()
            assert isinstance(p.decode(first), p.RegisterNode)
            registered = p.NodeRegistered(
                node="n1", mm_epoch="mm-a", report_interval=1.0, policy="gang", heartbeat_port=port, slice=0.1
            )
            mm.send_multipart([identity, p.encode(registered)])
            assert beats.recv() == b"\x01"  # subscribed to everything

            def beat(seq: int, epoch: str = "mm-a") -> None:
                heartbeat = p.Heartbeat(epoch=epoch, seq=seq, row=0, sent=time.time(), slice=0.1)
                beats.send(p.encode(heartbeat))

            def traced() -> list[int]:
                return (
                    [int(line.split()[0]) for line in trace.read_text().splitlines()]
                    if trace.exists()
                    else []
                )

            for seq, epoch, outcome in [
                (1, "mm-a", "taken"),
                (2, "mm-a", "taken"),
                (2, "mm-a", "ignored heartbeat 2: replayed or out of order"),
                (1, "mm-a", "ignored heartbeat 1: replayed or out of order"),
                (9, "mm-b", "ignored heartbeat 9 of storm-mm mm-b"),
                (3, "mm-a", "taken"),
            ]:
                beat(seq, epoch)
                if outcome == "taken":
                    poll(lambda s=seq: traced()[-1:] == [s], 10.0, f"heartbeat {seq} to be taken")
                else:
                    poll(lambda o=outcome: o in log.read_text(), 10.0, f"'{outcome}' in the log")
            assert traced() == [1, 2, 3]
            assert "Traceback" not in log.read_text()
    finally:
        mm.close()
        beats.close()


def test_client_socket_is_a_local_socket_open_to_all_users(cluster: LocalCluster) -> None:
    path = cluster.endpoint.removeprefix("ipc://")
    assert cluster.endpoint.startswith("ipc://")
    assert os.stat(path).st_mode & 0o777 == 0o666
