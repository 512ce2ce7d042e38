"""nm/shell_link.py: the NM's and the job shells' ends of their link, over real Unix sockets in one event loop
(the end-to-end tests run them in real daemons and shells)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from storm.nm import shell_link
from storm.nm.shell_link import HEADER, Frames, NmLink, ShellListener, Who, frame

LIMIT = 4 << 20


def test_frames_come_whole_however_the_stream_is_cut() -> None:
    rng = random.Random(7)
    messages = [rng.randbytes(rng.choice([0, 1, 5, 300, 70_000])) for _ in range(200)]
    stream = b"".join(frame(m) for m in messages)
    frames, got, at = Frames(LIMIT), [], 0
    while at < len(stream):
        step = rng.choice([1, 2, 3, 4, 5, 100, 65_536])
        got += frames.feed(stream[at : at + step])
        at += step
    assert got == messages
    assert frames.buffer == bytearray()


def test_a_length_over_the_limit_ends_the_stream_before_its_bytes_come() -> None:
    frames = Frames(100)
    assert frames.feed(frame(b"x" * 100)) == [b"x" * 100]
    assert frames.feed(frame(b"before") + HEADER.pack(101)) == [b"before"]
    assert frames.broken == "a message of 101 bytes exceeds the limit of 100"
    assert frames.feed(frame(b"after")) == []


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop run until ``condition`` holds (a deadline, not a sleep standing in for an event)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


class Ends:
    """A listener (the NM) and a link (a job shell) on ``path``, recording what each end sees."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.at_nm: list[tuple[bytes, bytes, Who]] = []
        self.at_shell: list[bytes] = []
        self.events: list[str] = []
        self.nm = self.listener()
        self.shell = NmLink(
            str(path), LIMIT, self.at_shell.append,
            lambda n: self.events.append(f"connected {n}"), lambda: self.events.append("lost"),
        )  # fmt: skip

    def listener(self) -> ShellListener:
        return ShellListener(self.path, LIMIT, lambda i, m, w: self.at_nm.append((i, m, w)))


def test_messages_cross_both_ways_and_the_nm_knows_the_sender_by_its_pid(tmp_path: Path) -> None:
    async def main() -> None:
        before = fds()
        ends = Ends(tmp_path / "shells.sock")
        ends.nm.start()
        ends.shell.start()
        assert ends.events == ["connected 1"]
        big = random.Random(1).randbytes(3 << 20)  # more than a socket buffer: sent in parts, in order
        for message in (b"hello", big, b"after"):
            ends.shell.send(message)
        await until(lambda: len(ends.at_nm) == 3)
        identity = ends.at_nm[0][0]
        assert [(m, w) for i, m, w in ends.at_nm] == [
            (m, (os.getpid(), os.getuid())) for m in (b"hello", big, b"after")
        ]
        assert {i for i, m, w in ends.at_nm} == {identity}
        ends.nm.send(identity, big)
        ends.nm.send(identity, b"reply")
        ends.nm.send(b"shell-999", b"nobody")  # an identity with no connection: dropped
        await until(lambda: len(ends.at_shell) == 2)
        assert ends.at_shell == [big, b"reply"]
        assert await ends.shell.drained(1.0)
        ends.shell.stop()
        await until(lambda: not ends.nm.peers)  # the NM saw it go
        ends.nm.stop()
        assert ends.events == ["connected 1"]  # a stop is not a loss
        assert fds() == before

    asyncio.run(main())


def test_a_shell_keeps_what_it_sends_while_its_nm_is_away_and_says_it_to_the_next(tmp_path: Path) -> None:
    async def main() -> None:
        before = fds()
        ends = Ends(tmp_path / "shells.sock")
        ends.shell.start()  # nothing listens yet: it keeps trying
        ends.shell.send(b"early")
        assert ends.shell.backed_up and ends.events == []
        ends.nm.start()
        await until(lambda: ends.events == ["connected 1"])
        await until(lambda: [m for i, m, w in ends.at_nm] == [b"early"])

        ends.nm.stop()  # the NM goes: the shell notices, keeps what it sends, and finds the next one
        await until(lambda: ends.events == ["connected 1", "lost"])
        for n in range(shell_link.KEPT_MAX + 5):
            ends.shell.send(b"%d" % n)
        assert len(ends.shell.kept) == shell_link.KEPT_MAX  # (ZeroMQ's high-water mark: the rest dropped)
        ends.at_nm.clear()
        ends.nm = ends.listener()
        ends.nm.start()
        await until(lambda: len(ends.at_nm) == shell_link.KEPT_MAX)
        assert ends.events == ["connected 1", "lost", "connected 2"]
        assert [m for i, m, w in ends.at_nm] == [b"%d" % n for n in range(shell_link.KEPT_MAX)]
        ends.shell.stop()
        ends.nm.stop()
        assert fds() == before

    asyncio.run(main())


def test_the_nm_closes_a_connection_that_sends_what_is_not_a_frame_and_serves_the_others(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        ends = Ends(tmp_path / "shells.sock")
        ends.nm.start()
        ends.shell.start()
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as rogue:
            rogue.setblocking(False)
            await loop.sock_connect(rogue, str(tmp_path / "shells.sock"))
            await loop.sock_sendall(rogue, frame(b"fine") + HEADER.pack(LIMIT + 1) + b"rest")
            assert await asyncio.wait_for(loop.sock_recv(rogue, 10), 5.0) == b""  # closed by the NM
        await until(lambda: len(ends.nm.peers) == 1)  # the shell's connection only
        assert [m for i, m, w in ends.at_nm] == [b"fine"]
        ends.shell.send(b"still served")
        await until(lambda: len(ends.at_nm) == 2)
        assert ends.at_nm[1][1] == b"still served"
        ends.shell.stop()
        ends.nm.stop()

    asyncio.run(main())


def test_the_nm_closes_a_connection_that_leaves_its_messages_unread(tmp_path: Path) -> None:
    async def main() -> None:
        heard: list[bytes] = []
        listener = ShellListener(tmp_path / "shells.sock", 1 << 20, lambda i, m, w: heard.append(i))
        listener.start()
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
            idle.setblocking(False)
            await loop.sock_connect(idle, str(tmp_path / "shells.sock"))
            await loop.sock_sendall(idle, frame(b"hello"))  # so that the NM has its identity to answer
            await until(lambda: len(heard) == 1)
            peer = listener.peers[heard[0]]
            for _ in range(2):  # up to twice the limit unread: kept
                listener.send(heard[0], bytes(1 << 20))
            assert not peer.closed and len(peer.unsent) > 1 << 20
            listener.send(heard[0], bytes(1 << 20))  # beyond: the connection goes
            assert peer.closed and heard[0] not in listener.peers
        listener.stop()

    asyncio.run(main())


def test_an_nm_that_cannot_listen_says_why(tmp_path: Path) -> None:
    async def main() -> None:
        deep = tmp_path / ("d" * 100) / "shells.sock"
        with pytest.raises(SystemExit, match="a socket path is limited to 107 bytes"):
            ShellListener(deep, LIMIT, lambda i, m, w: None).start()
        with pytest.raises(SystemExit, match="No such file or directory"):
            ShellListener(tmp_path / "missing" / "shells.sock", LIMIT, lambda i, m, w: None).start()

    before = fds()
    asyncio.run(main())
    assert fds() == before


def test_a_new_nm_replaces_the_socket_file_an_earlier_one_left(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "shells.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as old:
            old.bind(str(path))  # an NM killed before it could remove its socket
        ends = Ends(path)
        ends.nm.start()
        ends.shell.start()
        ends.shell.send(b"to the new one")
        await until(lambda: len(ends.at_nm) == 1)
        ends.shell.stop()
        ends.nm.stop()

    asyncio.run(main())
