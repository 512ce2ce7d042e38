"""The link between storm-nm and its job shells: a Unix stream socket carrying messages, each a 4-byte
length (big-endian) and one encoded message of storm.mm.protocol.

It was a ZeroMQ ROUTER (the NM) and DEALERs (the shells) on an ``ipc://`` endpoint. A message then crossed
four threads: the sender's, its ZeroMQ context's I/O thread, the receiver's I/O thread and the receiver's.
On this project's 2-core hosts, with 2 or 4 processes loading the CPUs, a 200-byte message's round trip
between two event loops took 99-131 us (median) and 1.2-1.9 ms (90th percentile) through ZeroMQ, against
77-91 us and 120-134 us here (``storm bench link``, tools/bench_link.py); a one-rank job crosses this
link four times, three of them while its PE is held. Here the kernel hands each message from one event
loop to the other.

What stays as it was with ZeroMQ:

- the NM knows a shell by the pid the kernel reports for its connection (SO_PEERCRED, read when it is
  accepted), and replies to the connection the shell speaks on, named by an opaque identity;
- a message the NM sends to a connection that has closed is dropped;
- a connection that announces a message above the limit (MAX_NODE_MESSAGE, ZeroMQ's MAXMSGSIZE before) is
  closed, as is one that sends anything else than frames, and one that leaves more than twice the limit
  unread (where ZeroMQ dropped messages beyond its high-water mark: memory stays bounded either way);
- a shell that loses its NM tries again every RECONNECT seconds and keeps what it sends meanwhile (up to
  KEPT_MAX messages, ZeroMQ's default high-water mark), to be sent first once connected.

Nothing here waits: sends go to the kernel at once, and what it does not take yet goes when the socket is
writable, in order. Both ends run on the event loop through add_reader and add_writer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import itertools
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("storm.nm")

HEADER = struct.Struct(">I")
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
READ_SIZE = 1 << 18  # bytes asked of the kernel per read
READS = 64  # reads per turn of the loop, so that one busy peer does not starve the others
RECONNECT = 0.1  # seconds between a shell's attempts to reach its NM (ZeroMQ's reconnect interval)
KEPT_MAX = 1000  # messages a shell keeps while it has no NM
BACKLOG = 128
ACCEPT_RETRY = 0.1  # seconds before accepting again when out of descriptors
DRAIN_POLL = 0.01  # seconds between looks while waiting for unsent bytes to go (only when stopping)
PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL (mm/net.py's IPC_PATH_MAX: that module
# brings pyzmq, which job shells no longer load)


class Frames:
    """Cuts a byte stream into messages. Pure: bytes in, whole messages out."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.broken = ""  # why the stream is not frames (a length above the limit): nothing more comes out

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes, in order; the rest of a message stays for the next feed. The
        messages before a length above the limit still come out; then :attr:`broken` says why no more will.
        O(len(data)) plus the bytes kept."""
        if self.broken:
            return []
        buffer = self.buffer
        buffer += data
        messages: list[bytes] = []
        start, end = 0, len(buffer)
        while end - start >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, start)
            if length > self.limit:
                self.broken = f"a message of {length} bytes exceeds the limit of {self.limit}"
                buffer.clear()
                return messages
            stop = start + HEADER.size + length
            if stop > end:
                break
            messages.append(bytes(buffer[start + HEADER.size : stop]))
            start = stop
        if start:
            del buffer[:start]
        return messages


def frame(message: bytes) -> bytes:
    return HEADER.pack(len(message)) + message


class Connection:
    """One connected socket served from the running loop: each whole message goes to ``on_message``; when
    the peer closes, or sends what is not a frame, the socket is closed and ``on_close`` called (once)."""

    def __init__(
        self,
        sock: socket.socket,
        limit: int,
        on_message: Callable[[bytes], None],
        on_close: Callable[[str], None],
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.frames = Frames(limit)
        self.unsent = bytearray()  # what the kernel did not take yet
        self.on_message = on_message
        self.on_close = on_close
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.fd, self._readable)

    def send(self, message: bytes) -> None:
        """Send now, or once the socket can take it, after what came before; dropped once closed."""
        if self.closed:
            return
        data = frame(message)
        if self.unsent:
            self.unsent += data
            self._check_unsent()
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.close(f"send: {exc.strerror}")
            return
        if sent < len(data):
            self.unsent += memoryview(data)[sent:]
            self.loop.add_writer(self.fd, self._writable)
            self._check_unsent()

    def _check_unsent(self) -> None:
        if len(self.unsent) > 2 * self.frames.limit:
            self.close(f"the peer left more than {2 * self.frames.limit} bytes unread")

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(f"send: {exc.strerror}")
            return
        del self.unsent[:sent]
        if not self.unsent:
            self.loop.remove_writer(self.fd)

    def _readable(self) -> None:
        for _ in range(READS):
            try:
                data = self.sock.recv(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.close(f"receive: {exc.strerror}")
                return
            if not data:
                self.close("closed by the peer")
                return
            for message in self.frames.feed(data):
                try:
                    self.on_message(message)
                except Exception:
                    log.exception("error while handling a message; carrying on")
                if self.closed:  # (the handler closed it)
                    return
            if self.frames.broken:
                self.close(self.frames.broken)
                return
            if len(data) < READ_SIZE:
                return  # (most likely all there was: the loop calls again if not)

    def close(self, why: str = "closed") -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.unsent:
            self.loop.remove_writer(self.fd)
        self.sock.close()
        self.on_close(why)


Who = tuple[int, int]  # (pid, uid) of a peer, as the kernel reported them when it connected


class ShellListener:
    """storm-nm's end: accepts job shells on ``path`` and hands each message to ``handle(identity, message,
    who)``; :meth:`send` answers a connection by its identity."""

    def __init__(self, path: Path, limit: int, handle: Callable[[bytes, bytes, Who], None]) -> None:
        self.path = path
        self.limit = limit
        self.handle = handle
        self.peers: dict[bytes, Connection] = {}
        self.sock: socket.socket | None = None
        self._numbers = itertools.count(1)

    def start(self) -> None:
        """Listen (a socket file left by an NM before is replaced: one NM per run directory, its lock). An NM
        that cannot exits with a message rather than a traceback."""
        if len(os.fsencode(self.path)) > PATH_MAX:
            raise SystemExit(f"cannot listen on {self.path}: a socket path is limited to {PATH_MAX} bytes")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(self.path))
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            raise SystemExit(f"cannot listen on {self.path}: {exc.strerror}") from None
        sock.setblocking(False)
        self.sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Not now: accepting again at once would spin while the descriptors are short.
                    log.warning("cannot accept a job shell's connection: %s", exc.strerror)
                    loop = asyncio.get_running_loop()
                    loop.remove_reader(self.sock.fileno())
                    loop.call_later(ACCEPT_RETRY, self._resume)
                return
            pid, uid, _gid = PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
            )
            identity = b"shell-%d" % next(self._numbers)
            closed = functools.partial(self._closed, identity)
            self.peers[identity] = Connection(conn, self.limit, self._handler(identity, (pid, uid)), closed)

    def _handler(self, identity: bytes, who: Who) -> Callable[[bytes], None]:
        def handle(message: bytes) -> None:
            self.handle(identity, message, who)

        return handle

    def _resume(self) -> None:
        if self.sock is not None:
            asyncio.get_running_loop().add_reader(self.sock.fileno(), self._accept)

    def _closed(self, identity: bytes, why: str) -> None:
        self.peers.pop(identity, None)
        log.debug("job shell connection %s ended: %s", identity.decode(), why)

    def send(self, identity: bytes, message: bytes) -> None:
        peer = self.peers.get(identity)
        if peer is not None:
            peer.send(message)

    def stop(self) -> None:
        """Stop listening and close every connection (their shells reconnect to the next NM)."""
        if self.sock is not None:
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for peer in list(self.peers.values()):
            peer.close("the NM stopped")


class NmLink:
    """A job shell's end: connected to ``path`` from :meth:`start` on, and again whenever the connection is
    lost. Each message goes to ``handle``; ``connected(n)`` is called after the n-th connection is made (what
    was kept meanwhile already sent), ``lost()`` when one ends."""

    def __init__(
        self,
        path: str,
        limit: int,
        handle: Callable[[bytes], None],
        connected: Callable[[int], None],
        lost: Callable[[], None],
    ) -> None:
        self.path = path
        self.limit = limit
        self.handle = handle
        self.connected = connected
        self.lost = lost
        self.connection: Connection | None = None
        self.kept: collections.deque[bytes] = collections.deque()  # sent while not connected
        self.connections = 0
        self.stopped = False
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._connect()

    def _connect(self) -> None:
        self._timer = None
        if self.stopped:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)  # a full backlog fails (EAGAIN) rather than blocks: tried again later
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            self._timer = asyncio.get_running_loop().call_later(RECONNECT, self._connect)
            return
        self.connection = Connection(sock, self.limit, self.handle, self._lost)
        self.connections += 1
        while self.kept:
            self.connection.send(self.kept.popleft())
        self.connected(self.connections)

    def _lost(self, why: str) -> None:
        self.connection = None
        if self.stopped:
            return
        self.lost()
        self._timer = asyncio.get_running_loop().call_later(RECONNECT, self._connect)

    def send(self, message: bytes) -> None:
        if self.connection is not None:
            self.connection.send(message)
        elif len(self.kept) < KEPT_MAX:
            self.kept.append(message)

    @property
    def backed_up(self) -> bool:
        """Whether a send would wait: no connection, or bytes the kernel has not taken yet."""
        return self.connection is None or bool(self.connection.unsent)

    async def drained(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` seconds) until everything sent has gone to the kernel; whether it has."""
        deadline = time.monotonic() + timeout
        while self._waiting() and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL)
        return not self._waiting()

    def _waiting(self) -> bool:
        return bool(self.kept) or (self.connection is not None and bool(self.connection.unsent))

    def stop(self) -> None:
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.connection is not None:
            self.connection.close("the job shell stopped")
