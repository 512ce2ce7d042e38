"""A ZeroMQ socket served from the event loop's watch of its descriptor, without pyzmq's futures.

storm-nm's socket to the MM carries a few messages per job each way (its job shells have a link of their
own, nm/shell_link.py). pyzmq's awaitable receive and send made a future, callbacks and extra event-loop
turns of every one of them: a good part of the NM's CPU per job. A :class:`Link` reads and writes through a
shadow of the socket (a plain socket on the same ZeroMQ socket) that never waits:

- receiving: the loop watches the socket's descriptor; when it is ready, every message waiting (up to
  BATCH, then the loop's other work gets a turn) goes to the handler, in order, synchronously;
- sending: at once if ZeroMQ takes the message (it queues up to the socket's high-water mark, also while the
  peer is away), else kept, in order, and sent when the socket can take more. A send never waits, so
  nothing that sends has to be a coroutine; what is kept is bounded by what the sender produces (storm-nm's
  reporter sends nothing new while anything is kept).

A ZeroMQ descriptor signals changes, not messages: a message that came while the handler ran, or that a
send took note of, is there without a wake-up. So after handling and after sending the link looks at
ZMQ_EVENTS again and schedules itself if a message waits (or kept sends can go).

The socket's own asyncio methods must not be used for I/O while a link serves it (they would watch the same
descriptor); options, connect and disconnect are fine.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import cast

import zmq
import zmq.asyncio

log = logging.getLogger("storm.nm")

BATCH = 100  # messages handled before the event loop's other work gets a turn
# Plain ints: arithmetic on pyzmq's enum constants goes through the enum machinery, on every message.
EVENTS, POLLIN, POLLOUT, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.NOBLOCK)
DRAIN_POLL = 0.01  # seconds between looks while waiting for kept sends to go (only when stopping)

Frames = list[zmq.Frame]


class Link:
    """``socket`` served through the loop: each message's frames go to ``handle`` (exceptions it lets out
    are logged and the next message is handled)."""

    def __init__(self, socket: zmq.asyncio.Socket, handle: Callable[[Frames], None]) -> None:
        self.socket = socket
        self.shadow: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)
        self.handle = handle
        self.kept: collections.deque[list[bytes]] = collections.deque()  # sends ZeroMQ did not take yet
        self.fd = -1
        self._due = False  # a turn of _ready is scheduled
        self._busy = False  # in _ready, which looks again when done

    def start(self) -> None:
        """Serve the socket from the running loop (messages already waiting are handled soon)."""
        self.fd = cast(int, self.shadow.getsockopt(zmq.FD))
        asyncio.get_running_loop().add_reader(self.fd, self._ready)
        self.look_again()

    def stop(self) -> None:
        """No more reading; kept sends stay kept (see :meth:`drained`)."""
        if self.fd >= 0:
            asyncio.get_running_loop().remove_reader(self.fd)
            self.fd = -1

    def send(self, frames: list[bytes]) -> None:
        """Send now if ZeroMQ takes it, else once it can, after whatever was kept before it."""
        if not self.kept:
            try:
                self.shadow.send_multipart(frames, NOBLOCK)
            except zmq.Again:
                self.kept.append(frames)
        else:
            self.kept.append(frames)
        self.look_again()

    async def drained(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` seconds) until every kept send has gone to ZeroMQ; whether it has."""
        deadline = time.monotonic() + timeout
        while self.kept and time.monotonic() < deadline:
            self._flush()
            if self.kept:
                await asyncio.sleep(DRAIN_POLL)
        return not self.kept

    def _events(self) -> int:
        return cast(int, self.shadow.getsockopt(EVENTS))  # (not .EVENTS: pyzmq's attributes are slow)

    def _flush(self) -> None:
        while self.kept:
            try:
                self.shadow.send_multipart(self.kept[0], NOBLOCK)
            except zmq.Again:
                return
            self.kept.popleft()

    def _ready(self) -> None:
        self._due = False
        self._busy = True
        try:
            if self.kept:
                self._flush()
            for _ in range(BATCH):
                if self.fd < 0 or not self._events() & POLLIN:
                    break
                try:
                    frames = self.shadow.recv_multipart(NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    self.handle(frames)
                except Exception:
                    log.exception("error while handling a message; carrying on")
        finally:
            self._busy = False
        self.look_again()

    def look_again(self) -> None:
        """Schedule a turn if a message waits, or kept sends can go, that the descriptor may not signal."""
        if self._due or self._busy or self.fd < 0:
            return
        events = self._events()
        if events & POLLIN or (self.kept and events & POLLOUT):
            self._due = True
            asyncio.get_running_loop().call_soon(self._ready)
