"""End to end: bad input gets a clear error, changes nothing, and no daemon dies of it."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest
import zmq

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.conftest import storm_cli

pytestmark = pytest.mark.slow


def snapshot(client: Client) -> list[tuple[int, str]]:
    return [(j.id, j.state) for j in client.jobs(everything=True)]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["submit", "-n", "0", "--", "true"], 2, "-n must be at least 1"),
        (["submit", "-n", "2"], 2, "a command is required"),
        (["submit", "-n", "2", "--"], 2, "a command is required"),
        (["submit", "-n", "3", "--", "true"], 1, "3 ranks requested, but the cluster has only 2 PEs"),
        (["submit", "-n", "1", "--", "no-such-program-xyz"], 2, "no-such-program-xyz: command not found"),
        (["submit", "-n", "1", "--time", "soon", "--", "true"], 2, "invalid time limit 'soon'"),
        (["show", "999999"], 1, "no job 999999"),
        (["cancel", "999999"], 1, "unknown job"),
        (["submit", "-n", "x", "--", "true"], 2, "invalid int value"),
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
        # Two frames instead of one, and a message over the size limit: no reply is possible, no harm done.
        sock.send_multipart([b"a", b"b"])
        sock.send(b"x" * (p.MAX_CLIENT_MESSAGE + 1))
    finally:
        sock.close()
    assert snapshot(client) == before
    assert client.nodes()  # the MM still answers


def test_garbage_on_the_node_socket_leaves_the_mm_up(cluster: LocalCluster, client: Client) -> None:
    before = snapshot(client)
    sock = raw_dealer(cluster.node_endpoint, b"intruder")
    try:
        for data in GARBAGE[:3]:
            sock.send(data)
            assert isinstance(p.decode(sock.recv(), p.MAX_NODE_MESSAGE), p.Error)
        # Well-formed but wrong: a report about a job that does not exist, from a node that does not exist.
        fake = p.JobNodeDone(job_id=424242, node="intruder", exits=(p.RankExit(rank=0, exit_code=0),))
        sock.send(p.encode(fake))
        assert isinstance(p.decode(sock.recv(), p.MAX_NODE_MESSAGE), p.Ack)
        # A node message naming another node than the sender's routing id.
        sock.send(p.encode(p.NodeStatus(node="node0", nm_epoch="x", mm_epoch="y")))
        assert isinstance(p.decode(sock.recv(), p.MAX_NODE_MESSAGE), p.Error)
    finally:
        sock.close()
    assert snapshot(client) == before
    assert {n.name: n.state for n in client.nodes()} == {"node0": "UP", "node1": "UP"}


def test_client_socket_is_a_local_socket_open_to_all_users(cluster: LocalCluster) -> None:
    path = cluster.endpoint.removeprefix("ipc://")
    assert cluster.endpoint.startswith("ipc://")
    assert os.stat(path).st_mode & 0o777 == 0o666
