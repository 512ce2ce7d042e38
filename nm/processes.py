"""The node manager's operating-system calls, behind one small interface.

Unit tests substitute a fake :class:`Processes`; the daemon and the end-to-end tests use
:class:`LinuxProcesses`, the real thing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

SHM_DIR = Path("/dev/shm")


class Processes(Protocol):
    def spawn(
        self, argv: list[str], *, env: dict[str, str], cwd: str, uid: int, gid: int, log_path: Path
    ) -> int:
        """Start a process in a session of its own, as uid/gid (with the user's groups); return its pid."""
        ...

    def pidfd(self, pid: int) -> int:
        """A file descriptor that becomes readable when the process exits."""
        ...

    def reap(self, pid: int) -> int | None:
        """The wait status of an exited child, or None while it runs."""
        ...

    def signal_group(self, pgid: int, sig: int) -> bool:
        """Signal a process group; False if it no longer exists."""
        ...

    def signal(self, pid: int, sig: int) -> bool: ...

    def start_time(self, pid: int) -> int | None:
        """The kernel's start time of a process (clock ticks since boot), to tell a pid from its reuse."""
        ...

    def session_members(self, sid: int) -> list[int]:
        """Every process whose session id is ``sid``."""
        ...

    def remove_shm(self, names: Collection[str]) -> list[str]:
        """Unlink those of the named /dev/shm entries that exist; return the names removed."""
        ...


class LinuxProcesses:
    def spawn(
        self, argv: list[str], *, env: dict[str, str], cwd: str, uid: int, gid: int, log_path: Path
    ) -> int:
        as_other = uid != os.geteuid()
        groups: list[int] | None = None
        if as_other:
            import pwd

            try:
                groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
            except KeyError:
                groups = [gid]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                user=uid if as_other else None,
                group=gid if as_other else None,
                extra_groups=groups,
                close_fds=True,
            )
        # The daemon reaps the pid itself (through its pidfd); marking the Popen object finished keeps its
        # destructor from warning about a child it no longer owns.
        proc.returncode = 0
        return proc.pid

    def pidfd(self, pid: int) -> int:
        return os.pidfd_open(pid)

    def reap(self, pid: int) -> int | None:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        return status if got == pid else None

    def signal_group(self, pgid: int, sig: int) -> bool:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True

    def signal(self, pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def start_time(self, pid: int) -> int | None:
        fields = _stat_fields(pid)
        return None if fields is None else int(fields[19])

    def session_members(self, sid: int) -> list[int]:
        members = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = _stat_fields(int(entry))
                if fields is not None and int(fields[3]) == sid:
                    members.append(int(entry))
        return members

    def remove_shm(self, names: Collection[str]) -> list[str]:
        removed = []
        for name in names:
            try:
                os.unlink(SHM_DIR / name)
            except FileNotFoundError:
                continue
            removed.append(name)
        return removed


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    return stat[stat.rindex(")") + 2 :].split()


def describe_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) of a wait status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status), None
