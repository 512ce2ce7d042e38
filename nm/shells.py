"""The node's job shells as storm-nm keeps them: one per user (uid and gid) it started, serving that user's
jobs on the node (nm/shell_server.py), until it is retired.

Pure bookkeeping, no I/O: which job shell takes a user's next job, what to send it (held back until it has
said ``shell_ready``, since the NM learns its connection from that), which ones have been idle long enough
to retire, and what a job shell's end means. Job shells a previous storm-nm started are not kept here: they
finish the jobs they have, which the NM re-adopts one by one (nm/local_jobs.py), and then exit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storm.mm import protocol as p


@dataclass
class JobShell:
    """A job shell this NM started for a user."""

    uid: int
    gid: int
    pid: int
    start: int | None  # the kernel's start time, to tell it from a reused pid
    pidfd: int  # readable once it has exited: the daemon watches it
    log: Path  # its stderr
    peer: bytes = b""  # the routing id of its connection, once it has said shell_ready
    waiting: list[p.Message] = field(default_factory=list)  # for it, until it is ready
    jobs: set[int] = field(default_factory=set)  # jobs it runs (until their report reaches the NM)
    idle_since: float | None = None  # without a job since (as first seen so)


class JobShells:
    """The job shells this NM started, by user. ``idle`` is how long one may go without a job before it
    is retired ([nm] shell_idle)."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self.by_user: dict[tuple[int, int], JobShell] = {}
        self.by_pid: dict[int, JobShell] = {}

    def for_user(self, uid: int, gid: int) -> JobShell | None:
        """The job shell that takes the user's next job, if one runs."""
        return self.by_user.get((uid, gid))

    def add(self, shell: JobShell) -> None:
        self.by_user[(shell.uid, shell.gid)] = shell
        self.by_pid[shell.pid] = shell

    def send(self, shell: JobShell, msg: p.Message) -> list[tuple[bytes, p.Message]]:
        """What goes out to the job shell now: ``msg`` (after anything held back), or nothing until it is
        ready."""
        if not shell.peer:
            shell.waiting.append(msg)
            return []
        return [(shell.peer, msg)]

    def ready(self, pid: int, peer: bytes) -> list[tuple[bytes, p.Message]]:
        """A job shell said shell_ready on connection ``peer``: what was held back for it goes out."""
        shell = self.by_pid.get(pid)
        if shell is None:
            return []  # one a previous NM started: its jobs tell their own state
        shell.peer = peer
        held, shell.waiting = shell.waiting, []
        return [(peer, msg) for msg in held]

    def took(self, shell: JobShell, job_id: int) -> None:
        shell.jobs.add(job_id)
        shell.idle_since = None

    def released(self, pid: int, job_id: int) -> None:
        """The job is over as far as its job shell is concerned (its report reached the NM)."""
        shell = self.by_pid.get(pid)
        if shell is not None:
            shell.jobs.discard(job_id)

    def to_retire(
        self, now: float, *, idle_for: float | None = None, everyone: bool = False
    ) -> list[tuple[bytes, p.Message]]:
        """Retire the job shells without a job for ``idle_for`` seconds (default ``idle``), or ``everyone``
        (the NM exits after stopping every job): they take no new job from now on, and exit once idle."""
        limit = self.idle if idle_for is None else idle_for
        out: list[tuple[bytes, p.Message]] = []
        for shell in list(self.by_user.values()):
            if shell.jobs and not everyone:
                continue
            if shell.idle_since is None:
                shell.idle_since = now  # idle since the last look (the NM looks every tenth of a second)
            idle = now - shell.idle_since >= limit
            if everyone or idle:
                del self.by_user[(shell.uid, shell.gid)]
                out.extend(self.send(shell, p.ShellRetire()))
        return out

    def ended(self, pid: int) -> JobShell | None:
        """The job shell's process ended: forgotten (its jobs, if any, end with it)."""
        shell = self.by_pid.pop(pid, None)
        if shell is not None and self.by_user.get((shell.uid, shell.gid)) is shell:
            del self.by_user[(shell.uid, shell.gid)]
        return shell

    def all(self) -> list[JobShell]:
        return list(self.by_pid.values())
