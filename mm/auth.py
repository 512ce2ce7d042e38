"""Who may talk to storm-mm (what each caller may then do is mm/rights.py).

Local clients use the MM's ``ipc://`` socket, and the kernel says who they are (SO_PEERCRED:
mm/net.py's ``peer_credentials``). Node managers, their heartbeat subscriptions and remote clients use TCP
with CURVE (mm/keys.py): the MM holds a key pair and each peer must present a public key the operator
allowed by copying it into a directory, ``[mm] node_keys`` for node managers and ``[mm] client_keys`` for
remote clients. The two are separate ZAP domains, so a user's client key can never register a node (which
would receive other users' jobs) and a node key is no user.

The ZAP handler is storm's own (:class:`Gatekeeper`), not pyzmq's ``zmq.auth`` Authenticator, which it
resembles: the Authenticator keeps one "allow any" switch for all domains, names a peer by its key's Z85
text, logs refusals only at debug level and reads a directory only when told to. Here each domain has its
own directory, read again whenever it changes (allowing or revoking a key is copying or removing a file,
with no restart; a revoked key's open connections stay until they break), a peer is named after its key
file (for a remote client ``alice.key`` or ``alice@laptop.key`` is user ``alice``), and each refusal is
logged once per peer address, then at most once a minute with a count.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils import z85

from storm.mm.keys import PUBLIC_SUFFIX, KeyFileError, read_public_key
from storm.mm.limits import LogThrottle
from storm.mm.net import REFUSAL_EVERY

log = logging.getLogger("storm.mm")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq sends its ZAP requests (RFC 27)
NODES, CLIENTS = "nodes", "clients"  # ZAP domains
STAMP_DOUBT_NS = 2_000_000_000


class AllowedKeys:
    """The ``*.key`` files of a directory: public key -> the file's name (without ``.key``).

    Read again when the directory's modification time changes, which copying, renaming or removing a file
    does (editing one in place does not: replace keys, as ``cp`` and ``storm keygen`` do).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.keys: dict[bytes, str] = {}
        self.problems: list[str] = []  # files that are not keys, for the log
        self._stamp: int | None = None

    def refresh(self) -> None:
        try:
            stamp = self.directory.stat().st_mtime_ns
        except OSError:
            stamp = None
        # File times tick coarsely (a jiffy), so a change in the same tick as the last read keeps the stamp:
        # a stamp younger than STAMP_DOUBT is not trusted, and the directory is read again.
        if stamp is not None and stamp == self._stamp and time.time_ns() - stamp > STAMP_DOUBT_NS:
            return
        self._stamp = stamp
        keys, problems = {}, []
        try:
            paths = sorted(self.directory.glob(f"*{PUBLIC_SUFFIX}"))
        except OSError as exc:
            paths, problems = [], [f"cannot read {self.directory}: {exc}"]
        for path in paths:
            try:
                keys[read_public_key(path)] = path.name[: -len(PUBLIC_SUFFIX)]
            except KeyFileError as exc:
                problems.append(str(exc))
        for problem in set(problems) - set(self.problems):  # each once, not at every read
            log.warning("allowed keys: %s", problem)
        self.keys, self.problems = keys, problems

    def name(self, public: bytes) -> str | None:
        """The name ``public`` (Z85) is allowed under, or None."""
        self.refresh()
        return self.keys.get(public)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    user_id: str  # the peer's name (its key file's), handed to the socket as the messages' User-Id
    reason: str


def judge(
    domains: dict[str, AllowedKeys], domain: str, mechanism: bytes, credentials: list[bytes]
) -> Verdict:
    """One ZAP request: only CURVE, only in a known domain, only with an allowed key."""
    if domain not in domains:
        return Verdict(False, "", f"unknown ZAP domain {domain!r}")
    if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
        return Verdict(False, "", f"{mechanism.decode(errors='replace')} is not accepted: CURVE keys only")
    public = z85.encode(credentials[0])
    name = domains[domain].name(public)
    if name is None:
        where = domains[domain].directory
        return Verdict(False, "", f"public key {public.decode()} is not in {where}")
    return Verdict(True, name, "OK")


class Gatekeeper:
    """storm-mm's ZAP handler: answers libzmq's authentication requests for the MM's CURVE sockets.

    It must be bound before any CURVE socket accepts a connection: without a ZAP handler libzmq lets any
    CURVE client in. ``serve`` runs on the MM's event loop.
    """

    def __init__(self, ctx: zmq.asyncio.Context, domains: dict[str, AllowedKeys]) -> None:
        self.domains = domains
        self.throttle = LogThrottle(rate=1 / REFUSAL_EVERY, burst=1)
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)
        for keys in domains.values():
            keys.refresh()

    def close(self) -> None:
        self.socket.close()

    async def serve(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            try:
                self.answer(frames)
            except Exception:
                log.exception("unexpected error in a ZAP request; carrying on")

    def answer(self, frames: list[bytes]) -> None:
        # ROUTER envelope, empty delimiter, then RFC 27: version, request id, domain, address, identity,
        # mechanism, credentials...
        if len(frames) < 8 or frames[1] != b"":
            log.warning("malformed ZAP request of %d frames dropped", len(frames))
            return
        envelope, (version, request_id, domain, address, _identity, mechanism, *credentials) = (
            frames[:2], frames[2:],
        )  # fmt: skip
        if version != b"1.0":
            verdict = Verdict(False, "", "ZAP version 1.0 only")
        else:
            verdict = judge(self.domains, domain.decode(errors="replace"), mechanism, credentials)
        if not verdict.allowed:
            peer = address.decode(errors="replace")
            kind = (domain, address)  # a peer that tries key after key still gets one line a minute
            self.throttle.warning(
                log, kind, time.monotonic(), "refused a %s connection from %s: %s",
                domain.decode(errors="replace").rstrip("s"), peer, verdict.reason,
            )  # fmt: skip
        status = (b"200", b"OK") if verdict.allowed else (b"400", verdict.reason.encode()[:255])
        self.socket.send_multipart([*envelope, b"1.0", request_id, *status, verdict.user_id.encode(), b""])


def domain_keys(node_keys: str, client_keys: str) -> dict[str, AllowedKeys]:
    """The MM's ZAP domains from its configuration; a missing directory is a start-up error."""
    domains = {}
    for domain, directory in ((NODES, node_keys), (CLIENTS, client_keys)):
        if not directory:
            continue
        if not os.path.isdir(directory):
            raise KeyFileError(f"[mm] {domain[:-1]}_keys: no directory {directory} (mkdir it)")
        domains[domain] = AllowedKeys(Path(directory))
    return domains
