"""What each caller may do with jobs: pure rules, used by mm/core.py and mm/daemon.py.

A user may cancel only their own jobs; root and ``[mm] operators`` (user names or uids) may cancel any
(``cancel_jobs`` is the only client request that changes a job; the others only read). A job runs as the
caller, who is who the kernel says (a local client) or whom the key names (a remote one, see mm/auth.py):
a ``submit_job`` that asks for another uid, gid or user is refused, not quietly corrected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Credentials(Protocol):
    """Who sent a client request: the kernel's word (a local client) or its key's (a remote one)."""

    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def user(self) -> str: ...


@dataclass(frozen=True)
class Account:
    """Credentials given directly (tests, a simulator); storm-mm takes them from the socket."""

    uid: int
    gid: int
    user: str


def is_operator(uid: int, user: str, operators: Sequence[str]) -> bool:
    """Root, or listed in ``[mm] operators`` by user name or uid."""
    return uid == 0 or user in operators or str(uid) in operators


def may_manage(uid: int, user: str, owner_uid: int, operators: Sequence[str]) -> bool:
    """Whether the caller may cancel (or otherwise change) a job of ``owner_uid``."""
    return uid == owner_uid or is_operator(uid, user, operators)


class RunAs(Protocol):
    """What a submission asks to run as (protocol.SubmitJob's fields): None or "" for the caller."""

    @property
    def uid(self) -> int | None: ...
    @property
    def gid(self) -> int | None: ...
    @property
    def user(self) -> str: ...


def run_as_problem(asked: RunAs, *, uid: int, gid: int, user: str) -> str | None:
    """Why a submission asking to run as ``asked`` must be refused for this caller (uid, gid, user), or None.

    storm runs a job only as the user who submits it, root included (root uses ``runuser -u USER --
    storm submit ...``): a request for anyone else is refused with this text rather than ignored.
    """
    why = "storm runs a job only as the user who submits it"
    if asked.uid is not None and asked.uid != uid:
        return f"the job asks to run as uid {asked.uid}, but you are {user} (uid {uid}): {why}"
    if asked.user and asked.user != user:
        return f"the job asks to run as user {asked.user}, but you are {user} (uid {uid}): {why}"
    if asked.gid is not None and asked.gid != gid:
        return f"the job asks to run with gid {asked.gid}, but yours is {gid}: {why}, with their group"
    return None


def key_user(name: str) -> str:
    """The user a remote client's key names: ``alice`` for ``alice.key`` and ``alice@laptop.key``."""
    return name.split("@", 1)[0]
