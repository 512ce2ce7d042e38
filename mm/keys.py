"""CURVE keys: the files ``storm keygen`` writes, and the socket options of each side of a CURVE link.

A key pair is two files in ZeroMQ's certificate format (what czmq and pyzmq's ``zmq.auth`` read):
``NAME.key`` holds the public key and may be copied anywhere; ``NAME.key_secret`` holds both keys, is created
mode 0600 and never leaves its host. storm-mm allows a peer by finding its public key among the ``*.key``
files of a directory (mm/auth.py); the file's NAME is what the MM calls the peer (for a remote client: its
user). Node managers and remote clients also need the MM's public key, to know it is the MM they talk to.

This module is imported by the CLI too, so it stays cheap: no asyncio, no configuration parsing.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils import z85

# A key's name becomes a file name and, for a remote client, a user name (before an optional "@host").
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
PUBLIC_SUFFIX, SECRET_SUFFIX = ".key", ".key_secret"
_LINE = re.compile(rb'^\s*(public|secret)-key\s*=\s*"?([^"\s]+)"?\s*$')


class KeyFileError(ValueError):
    """A key file that cannot be used, with what to do about it."""


@dataclass(frozen=True)
class Keypair:
    public: bytes  # Z85 text, 40 characters: what ZeroMQ's CURVE options take
    secret: bytes

    @property
    def fingerprint(self) -> str:
        """A short form of the public key for log lines."""
        return self.public.decode()[:12]


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise KeyFileError(
            f"invalid key name {name!r}: use up to 64 letters, digits, '_', '.', '@' or '-', not first '.'"
        )
    return name


def _banner(kind: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"#   ****  Generated on {now} by storm keygen  ****\n#   ZeroMQ CURVE {kind}\n\n"


def write_keypair(directory: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """A new key pair as ``directory/NAME.key`` (0644) and ``NAME.key_secret`` (0600); returns both paths.

    Existing files are kept (KeyFileError) unless ``force``: replacing a key locks out whoever uses it.
    """
    check_name(name)
    public_path, secret_path = directory / f"{name}{PUBLIC_SUFFIX}", directory / f"{name}{SECRET_SUFFIX}"
    if not force:
        for path in (public_path, secret_path):
            if path.exists():
                raise KeyFileError(f"{path} exists: keep it, or replace it with --force")
    public, secret = zmq.curve_keypair()
    body = f'metadata\ncurve\n    public-key = "{public.decode()}"\n'
    # The secret file is created 0600 from the start (never world-readable, even for an instant), then
    # renamed into place so a reader never sees half a key.
    for path, text, mode in (
        (secret_path, _banner("**Secret** Certificate: keep it on this host, mode 0600") + body
         + f'    secret-key = "{secret.decode()}"\n', 0o600),
        (public_path, _banner("Public Certificate") + body, 0o644),
    ):  # fmt: skip
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)  # whatever the umask
        tmp.replace(path)
    return public_path, secret_path


def _read(path: Path) -> dict[str, bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"no key file {path} (create one with `storm keygen`)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    found: dict[str, bytes] = {}
    for line in data.splitlines():
        match = _LINE.match(line)
        if match:
            key = match[2]
            try:
                valid = len(z85.decode(key)) == 32
            except (ValueError, KeyError, TypeError):
                valid = False
            if not valid:
                raise KeyFileError(f"{path}: the {match[1].decode()} key is not a 40-character Z85 CURVE key")
            found[match[1].decode()] = key
    if "public" not in found:
        raise KeyFileError(f"{path} holds no public-key line: not a ZeroMQ certificate")
    return found


def read_public_key(path: Path) -> bytes:
    """The public key of a ``.key`` (or ``.key_secret``) file."""
    return _read(path)["public"]


def read_keypair(path: Path) -> Keypair:
    """Both keys of a ``.key_secret`` file, which must be readable by its owner only."""
    found = _read(path)
    if "secret" not in found:
        raise KeyFileError(f"{path} holds no secret key: give the NAME.key_secret file, not NAME.key")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeyFileError(f"{path} is readable by others (mode {mode:04o}): chmod 600 {path}")
    return Keypair(found["public"], found["secret"])


# ---------------------------------------------------------------------------------------------- sockets


def curve_server(sock: zmq.Socket[Any], own: Keypair, domain: str) -> None:
    """Make ``sock`` a CURVE server: every peer must present a key that the ZAP handler of ``domain`` allows
    (set before bind: options apply to connections made afterwards)."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, own.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, own.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())


def curve_client(sock: zmq.Socket[Any], own: Keypair, server: bytes) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is ``server`` (set before connect)."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, server)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, own.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, own.secret)


# The handshake events a monitor socket reports, and what each means for the side that sees it.
HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def handshake_problem(event: int, value: int, *, server: bool, peer: str) -> str:
    """Why a handshake with ``peer`` failed, in words an operator can act on.

    Measured with libzmq 4.3.5: a key the server's ZAP handler refuses gives the client AUTH with the
    status code (400) as value; a client with the wrong server key gives the server PROTOCOL
    (cryptographic) and the client NO_DETAIL; a peer without CURVE gives PROTOCOL (mechanism mismatch) on
    the client's side and NO_DETAIL on the server's.
    """
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        if server:
            return f"refused a peer on {peer}: its key is not allowed"
        return f"{peer} refused this key (status {value}): the server does not allow it"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return f"{peer} and this side disagree on CURVE: one of them has no keys configured"
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return f"a peer on {peer} failed the CURVE handshake: it does not hold this side's public key"
        return f"the handshake with {peer} failed (ZMTP protocol error {value:#x})"
    if server:
        return f"a peer on {peer} failed the handshake: it has no keys, or not this server's public key"
    return f"the handshake with {peer} failed: wrong server public key, or the server uses no keys"
