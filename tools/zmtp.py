"""A ZeroMQ DEALER in the standard library alone: how a ``storm`` command that asks storm-mm one thing
reaches it on its local ``ipc://`` endpoint.

Importing pyzmq costs about 9 ms, a fifth of a ``storm submit`` (issue 18), for one request and its reply
over one Unix socket. What libzmq's DEALER says to the MM's ROUTER there is ZMTP 3.0 with the NULL
mechanism (https://rfc.zeromq.org/spec/23/ and /spec/37/): a 64-byte greeting each way, a READY command
each way naming the socket types, then messages, one frame each in storm's protocol. This says the same,
so storm-mm cannot tell the difference, and the kernel still names the caller to it (SO_PEERCRED).

It is not a ZeroMQ socket: it connects once and does not reconnect. A command that ends when its answer
comes wants exactly that (a closed connection is an error at once, not a wait for a reply that cannot come);
everything that keeps a connection (``storm watch``, scripts, the tests), and every ``tcp://`` endpoint,
where CURVE is needed, uses pyzmq (tools/client.py decides).
"""

from __future__ import annotations

import _socket  # socket.py would add some 2 ms (its enums, selectors) for nothing used here
import time

# Signature (0xFF, 8 bytes of padding: libzmq puts the length of its empty identity + 1, 0x7F), version 3.0,
# the mechanism's name padded to 20 bytes, as-server 0, and 31 bytes of filler.
GREETING = b"\xff" + (1).to_bytes(8, "big") + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
MORE, LONG, COMMAND = 0x01, 0x02, 0x04  # frame flags


class ZmtpError(ConnectionError):
    """The connection failed, closed, or the peer spoke something else."""


def command(name: bytes, body: bytes = b"") -> bytes:
    return frame(bytes([len(name)]) + name + body, COMMAND)


def frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) <= 255:
        return bytes([flags, len(body)]) + body
    return bytes([flags | LONG]) + len(body).to_bytes(8, "big") + body


def properties(*pairs: tuple[bytes, bytes]) -> bytes:
    """ZMTP metadata: each name (after one byte of length) and value (after four)."""
    return b"".join(
        bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value for name, value in pairs
    )


class Dealer:
    """One ZMTP connection to a ROUTER listening on the Unix socket ``path``, as a DEALER."""

    def __init__(self, path: str, timeout: float, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(path)
            ready = command(b"READY", properties((b"Socket-Type", b"DEALER"), (b"Identity", b"")))
            self._sock.sendall(GREETING + ready)
            self._handshake(deadline)
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, deadline: float) -> None:
        greeting = self._read(64, deadline)
        if greeting is None:
            raise ZmtpError("no ZMTP greeting")
        if greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
            raise ZmtpError("the peer does not speak ZMTP 3")
        if greeting[12:32].rstrip(b"\0") != b"NULL":
            mechanism = greeting[12:32].rstrip(b"\0").decode(errors="replace")
            raise ZmtpError(f"the peer wants the {mechanism} mechanism, not NULL")
        found = self._frame(deadline)
        if found is None:
            raise ZmtpError("no READY from the peer")
        flags, body = found
        if flags & COMMAND and body.startswith(b"\x05ERROR"):
            raise ZmtpError(body[7 : 7 + body[6]].decode(errors="replace") if len(body) > 6 else "refused")
        if not flags & COMMAND or not body.startswith(b"\x05READY"):
            raise ZmtpError("the peer's first frame is not READY")

    def send(self, body: bytes) -> None:
        self._write(frame(body))

    def recv(self, timeout: float | None) -> bytes | None:
        """The next message (its first frame; storm's have one), or None if none came within ``timeout``
        seconds (None: wait for ever). PINGs are answered and other commands ignored, as libzmq does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        parts: list[bytes] = []
        while True:
            found = self._frame(deadline)
            if found is None:
                return None
            flags, body = found
            if flags & COMMAND:
                if body.startswith(b"\x04PING") and len(body) >= 7:  # TTL (2 bytes), then the context
                    self._write(command(b"PONG", body[7:]))
                continue
            parts.append(body)
            if not flags & MORE:
                return parts[0]

    def _write(self, data: bytes) -> None:
        self._sock.settimeout(None)
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise ZmtpError(f"cannot send: {exc.strerror or exc}") from None

    def _frame(self, deadline: float | None) -> tuple[int, bytes] | None:
        head = self._read(2, deadline)
        if head is None:
            return None
        flags, size = head[0], head[1]
        if flags & LONG:
            rest = self._read(7, deadline)
            if rest is None:
                return None
            size = int.from_bytes(head[1:] + rest, "big")
        if size > self.max_frame:
            raise ZmtpError(f"a frame of {size} bytes exceeds the limit of {self.max_frame}")
        body = self._read(size, deadline)
        return None if body is None else (flags, body)

    def _read(self, count: int, deadline: float | None) -> bytes | None:
        """``count`` bytes, or None at the deadline (what was read stays buffered for the next call)."""
        while len(self._buffer) < count:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return None
            self._sock.settimeout(wait)
            try:
                chunk = self._sock.recv(max(65536, count - len(self._buffer)))
            except TimeoutError:
                return None
            except OSError as exc:
                raise ZmtpError(f"connection lost: {exc.strerror or exc}") from None
            if not chunk:
                raise ZmtpError("the peer closed the connection")
            self._buffer += chunk
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def close(self) -> None:
        self._sock.close()
