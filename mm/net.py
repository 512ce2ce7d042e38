"""ZeroMQ plumbing that storm-mm and storm-nm share: binding an endpoint, who a local peer is, and watching
CURVE handshakes.

Both daemons serve local peers on ``ipc://`` sockets whose callers the kernel names (storm-mm's clients,
storm-nm's job shells), and both hold TCP links secured with CURVE (mm/keys.py) whose failed handshakes
only show in a socket monitor. Who may connect is decided elsewhere (mm/auth.py on the MM).
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import resource
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from storm.mm.keys import HANDSHAKE_FAILURES, handshake_problem
from storm.mm.limits import LogThrottle

# storm-mm holds two TCP connections per node manager (requests, heartbeats) and an emulator four fds per
# emulated node (two connections, two ZeroMQ mailboxes): a thousand nodes pass the usual soft limit of 1,024.
OPEN_FILES = 65536

REFUSAL_EVERY = 60.0  # seconds between log lines about the same refused peer
RETRY_REFUSED = 2.0  # seconds before a client whose handshake was refused tries again
IPC_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL


class Caller:
    """Who sent a message over a local socket, as the kernel reported it."""

    def __init__(self, uid: int, gid: int, pid: int) -> None:
        self.uid, self.gid, self.pid = uid, gid, pid
        self._user: str | None = None

    @property
    def user(self) -> str:
        """The uid's name, looked up when first asked for: a lookup reads the password database, and most
        messages (a wait, a job shell's report) never need it."""
        if self._user is None:
            try:
                self._user = pwd.getpwuid(self.uid).pw_name
            except KeyError:
                self._user = str(self.uid)
        return self._user


def peer_credentials(frame: zmq.Frame) -> Caller | None:
    """libzmq exposes SO_PEERCRED of an ipc peer as the Peer-Address 'localhost:UID:GID:PID'."""
    try:
        address = frame.get("Peer-Address")
    except zmq.ZMQError:
        return None
    parts = str(address).split(":")
    if len(parts) != 4 or not all(x.isdigit() for x in parts[1:]):
        return None
    return Caller(int(parts[1]), int(parts[2]), int(parts[3]))


def bind(socket: zmq.asyncio.Socket, endpoint: str) -> str:
    """Bind ``socket`` and return the endpoint it got (a port 0 becomes the kernel's choice); a daemon that
    cannot listen where it was told exits with a message rather than a traceback."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if len(path.encode()) > IPC_PATH_MAX:
            raise SystemExit(f"cannot listen on {endpoint}: a socket path is limited to {IPC_PATH_MAX} bytes")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        raise SystemExit(f"cannot listen on {endpoint}: {exc}") from None
    real = socket.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(real, bytes)
    return real.decode()


def watch_handshakes(
    sock: zmq.asyncio.Socket,
    peer: str,
    *,
    server: bool,
    logger: logging.Logger,
    advice: str = "",
    reconnect: Callable[[], None] | None = None,
) -> Coroutine[Any, Any, None]:
    """Log every kind of failed CURVE handshake on ``sock`` once, then at most once a minute with a count.

    On the MM, the refusals its ZAP handler (mm/auth.py's Gatekeeper) logs are the ones it decides; these
    are the ones that never reach it (no keys, the wrong MM key) and, on a client, the refusals it is told of
    (``advice`` says what to do there). Peers retry every 100 ms, hence the throttle. libzmq gives up on a
    connection refused by ZAP or failed by a protocol error (measured); ``reconnect`` is then called
    RETRY_REFUSED seconds later, so that a node whose key the operator allows afterwards joins without a
    restart.

    The monitor starts now: call this before the socket connects, or the first handshake may fail unseen.
    Run the returned coroutine as a task; cancelling it disables the monitor and closes its socket.
    """
    # A server hears of a ZAP refusal too (AUTH), which the Gatekeeper has logged with more to say.
    events = HANDSHAKE_FAILURES & ~zmq.EVENT_HANDSHAKE_FAILED_AUTH if server else HANDSHAKE_FAILURES
    monitor = sock.get_monitor_socket(events)
    monitor.setsockopt(zmq.LINGER, 0)

    async def watch() -> None:
        throttle = LogThrottle(rate=1 / REFUSAL_EVERY, burst=1)
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                problem = handshake_problem(event["event"], event["value"], server=server, peer=peer)
                throttle.warning(logger, event["event"], time.monotonic(), "%s%s", problem, advice)
                if reconnect is not None and event["event"] != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    await asyncio.sleep(RETRY_REFUSED)
                    reconnect()
        finally:
            sock.disable_monitor()
            monitor.close()

    return watch()


def raise_open_files(wanted: int = OPEN_FILES) -> str:
    """Raise this process's soft limit on open files towards ``wanted`` (never past the hard limit, which
    only root may raise: systemd's default hard limit is 524,288); what it is now, for the log."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return f"{soft} open files"
