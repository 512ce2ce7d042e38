"""storm.mm.sd_notify: the messages, the environment, real datagrams, and pings that come from the loop."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from storm.mm.sd_notify import Notifier, NotifyError, format_message, socket_address, watchdog_interval

# ---------------------------------------------------------------------------------------------- pure parts


def test_message_is_newline_separated_assignments_in_order() -> None:
    assert (
        format_message({"READY": 1, "STATUS": "policy gang; 3 nodes"})
        == b"READY=1\nSTATUS=policy gang; 3 nodes"
    )
    assert format_message({"WATCHDOG": 1}) == b"WATCHDOG=1"
    assert format_message({"STOPPING": 1, "STATUS": "stopping"}) == b"STOPPING=1\nSTATUS=stopping"


def test_a_status_stays_one_assignment() -> None:
    # A newline in a status text would start a second assignment (here a forged READY=1).
    assert format_message({"STATUS": "bad\nREADY=1\r\nx"}) == b"STATUS=bad READY=1  x"


@pytest.mark.parametrize("fields", [{}, {"ready": 1}, {"READY=1\nX": 1}, {"": 1}, {"1X": 1}])
def test_malformed_messages_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(NotifyError):
        format_message(fields)


def test_socket_addresses() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@storm/notify") == b"\0storm/notify"  # abstract namespace
    for bad in ("@", "relative/path", "vsock:2:1234"):
        with pytest.raises(NotifyError, match="NOTIFY_SOCKET"):
            socket_address(bad)


def test_watchdog_interval_is_half_the_timeout_for_this_process_only() -> None:
    assert watchdog_interval({}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, 42) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "42"}, 42) == 0.25
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "43"}, 42) is None
    for env in ({"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "-5"}, {"WATCHDOG_USEC": "1", "WATCHDOG_PID": "x"}):
        with pytest.raises(NotifyError):
            watchdog_interval(env, 42)


def test_from_environment_reads_and_removes_the_variables() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7", "HOME": "/root"}
    notifier = Notifier.from_environment(env, pid=7)
    assert (notifier.address, notifier.watchdog_seconds) == (b"\0x", 1.0)
    assert env == {"HOME": "/root"}  # nothing the daemon starts can pose as it
    kept = {"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": "2000000"}
    assert Notifier.from_environment(kept, pid=7, unset=False).watchdog_seconds == 1.0
    assert kept == {"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": "2000000"}


def test_without_a_socket_everything_is_a_no_op() -> None:
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "1000000"}, pid=1)
    assert not notifier.enabled and notifier.watchdog_seconds is None
    assert not notifier.ready("x") and not notifier.status("x") and not notifier.stopping()
    asyncio.run(asyncio.wait_for(notifier.watchdog(), 1.0))  # returns at once: no pings to send


def test_a_malformed_environment_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "storm.sd_notify"):
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@n", "WATCHDOG_USEC": "soon"}, pid=1)
    assert not notifier.enabled
    assert "WATCHDOG_USEC='soon'" in caplog.text


# ---------------------------------------------------------------------------------------------- datagrams


class Receiver:
    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def all(self) -> list[tuple[bytes, int]]:
        """Every datagram queued now, with the sender's pid."""
        out: list[tuple[bytes, int]] = []
        size = struct.calcsize("iII")
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(size))
            except BlockingIOError:
                return out
            (pid,) = [
                struct.unpack("iII", d[:size])[0]
                for level, kind, d in ancillary
                if kind == socket.SCM_CREDENTIALS
            ]
            out.append((data, pid))


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Receiver, str]]:
    if request.param == "path":
        r, env = Receiver(str(tmp_path / "notify")), str(tmp_path / "notify")
    else:
        name = f"storm-test-{uuid.uuid4().hex}"
        r, env = Receiver(b"\0" + name.encode()), f"@{name}"
    yield r, env
    r.sock.close()


def test_notifications_arrive_as_datagrams_from_this_process(receiver: tuple[Receiver, str]) -> None:
    r, env = receiver
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": env})
    assert notifier.ready("serving") and notifier.status("busy") and notifier.stopping()
    assert r.all() == [
        (b"READY=1\nSTATUS=serving", os.getpid()),
        (b"STATUS=busy", os.getpid()),
        (b"STOPPING=1\nSTATUS=stopping", os.getpid()),
    ]


def test_a_missing_manager_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    with caplog.at_level(logging.WARNING, "storm.sd_notify"):
        assert not notifier.ready("x")
        assert not notifier.send(WATCHDOG=1)
    assert caplog.text.count("could not notify systemd") == 1


def test_watchdog_pings_come_from_the_loop_and_stop_while_it_hangs(receiver: tuple[Receiver, str]) -> None:
    r, env = receiver
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": env, "WATCHDOG_USEC": "100000"})
    assert notifier.watchdog_seconds == 0.05

    async def scenario() -> tuple[int, int]:
        task = asyncio.create_task(notifier.watchdog())
        received: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 10.0
        while len(received) < 3:  # the loop runs: pings come
            assert time.monotonic() < deadline, "no watchdog pings"
            await asyncio.sleep(0.01)
            received += r.all()
        assert {data for data, _ in received} == {b"WATCHDOG=1"}
        r.all()
        time.sleep(0.3)  # the loop hangs, as in a blocking call: six intervals without a ping
        during = len(r.all())
        deadline = time.monotonic() + 10.0
        after = 0
        while not after:  # and they resume with the loop
            assert time.monotonic() < deadline, "pings did not resume"
            await asyncio.sleep(0.01)
            after = len(r.all())
        task.cancel()
        return during, after

    during, after = asyncio.run(scenario())
    assert during == 0 and after >= 1
