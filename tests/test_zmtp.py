"""tools/zmtp.py's Dealer against libzmq's own ROUTER (through pyzmq): what storm-mm's client socket is."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from storm.tools import client as client_module
from storm.tools.client import Client, ClientError
from storm.tools.zmtp import Dealer, ZmtpError


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], str]]:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    path = str(tmp_path / "mm.sock")
    yield sock, path
    sock.close()


def bound(router: tuple[zmq.Socket[bytes], str]) -> tuple[zmq.Socket[bytes], str]:
    sock, path = router
    sock.bind(f"ipc://{path}")
    return sock, path


@pytest.mark.parametrize("size", [0, 255, 256, 1 << 20])  # short and long frames, both ways
def test_a_request_and_its_reply_cross_as_libzmq_frames_them(
    router: tuple[zmq.Socket[bytes], str], size: int
) -> None:
    sock, path = bound(router)
    dealer = Dealer(path, 10.0, 2 << 20)
    try:
        body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        dealer.send(body)
        assert sock.poll(10_000)
        peer, got = sock.recv_multipart()  # a ROUTER sees [identity, body], as from a DEALER
        assert got == body and peer
        sock.send_multipart([peer, body[::-1]])
        assert dealer.recv(10.0) == body[::-1]
    finally:
        dealer.close()


def test_nothing_within_the_timeout_is_none_and_the_reply_still_comes(
    router: tuple[zmq.Socket[bytes], str],
) -> None:
    sock, path = bound(router)
    dealer = Dealer(path, 10.0, 1 << 20)
    try:
        dealer.send(b"ask")
        assert sock.poll(10_000)
        peer, _ = sock.recv_multipart()
        assert dealer.recv(0.05) is None
        sock.send_multipart([peer, b"late"])
        assert dealer.recv(10.0) == b"late"
    finally:
        dealer.close()


def test_heartbeats_are_answered(router: tuple[zmq.Socket[bytes], str]) -> None:
    """A ROUTER that PINGs every millisecond and drops a peer silent for 50 ms keeps this one."""
    sock, _ = router
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 50)
    sock, path = bound(router)
    dealer = Dealer(path, 10.0, 1 << 20)
    try:
        dealer.send(b"ask")
        assert sock.poll(10_000)
        peer, _ = sock.recv_multipart()
        assert dealer.recv(0.3) is None  # some 300 PINGs, each answered: the connection stays
        sock.send_multipart([peer, b"still here"])
        assert dealer.recv(10.0) == b"still here"
    finally:
        dealer.close()


def test_a_closed_connection_is_an_error_not_a_wait(router: tuple[zmq.Socket[bytes], str]) -> None:
    sock, path = bound(router)
    dealer = Dealer(path, 10.0, 1 << 20)
    try:
        sock.close()
        with pytest.raises(ZmtpError, match="closed"):
            dealer.recv(10.0)
    finally:
        dealer.close()


def test_a_curve_server_is_an_error_not_a_wait(router: tuple[zmq.Socket[bytes], str]) -> None:
    sock, _ = router
    _, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    _, path = bound(router)
    with pytest.raises(ZmtpError):  # libzmq drops a peer of another mechanism, maybe before it greets
        Dealer(path, 10.0, 1 << 20)


def test_an_oversized_frame_is_refused_before_it_is_read(router: tuple[zmq.Socket[bytes], str]) -> None:
    sock, path = bound(router)
    dealer = Dealer(path, 10.0, 1000)
    try:
        dealer.send(b"ask")
        assert sock.poll(10_000)
        peer, _ = sock.recv_multipart()
        sock.send_multipart([peer, bytes(1001)])
        with pytest.raises(ZmtpError, match="exceeds"):
            dealer.recv(10.0)
    finally:
        dealer.close()


# ---------------------------------------------------------------------------------------------------------
# Client with ONE_SHOT, as the storm program sets it for a short command (tests/test_startup.py runs
# those commands through it end to end)


def test_one_shot_client_without_an_mm_behind_the_socket_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket file left by an MM that died: refused at once (pyzmq would wait out the timeout)."""
    monkeypatch.setattr(client_module, "ONE_SHOT", True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(tmp_path / "mm.sock"))  # the file stays; nobody listens behind it
    with pytest.raises(ClientError, match="no storm-mm listens") as refused:
        Client(f"ipc://{tmp_path}/mm.sock", timeout=30.0)
    assert refused.value.code == "unreachable"


def test_one_shot_client_whose_mm_goes_away_says_so(
    router: tuple[zmq.Socket[bytes], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "ONE_SHOT", True)
    sock, path = bound(router)
    with Client(f"ipc://{path}", timeout=30.0) as one_shot:
        sock.close()
        with pytest.raises(ClientError, match="did it stop or restart") as lost:
            one_shot.nodes()
        assert lost.value.code == "unreachable"
