"""The node manager's operating-system calls, behind one small interface.

Unit tests substitute a fake :class:`Processes`; the daemon and the end-to-end tests use
:class:`LinuxProcesses`, the real thing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Collection
from pathlib import Path
from typing import Protocol

from storm.nm import procfs
from storm.nm.launcher import Launcher

SHM_DIR = Path("/dev/shm")


class Processes(Protocol):
    def prepare(self) -> None:
        """Get ready to start job shells."""
        ...

    def start_shell(self, shell: dict[str, object], *, uid: int, gid: int, log: int) -> tuple[int, int]:
        """Start a job shell (``storm.nm.shell_server.run_shell_server(**shell)``) in a session of its own,
        as uid/gid with the user's groups, its output going to ``log``; return its pid and a pidfd that is
        readable once it has exited."""
        ...

    def pidfd(self, pid: int) -> int | None:
        """A pidfd of a live process that need not be our child (a job shell a previous storm-nm started),
        readable once it has exited; None if there is no such process. The caller checks afterwards that
        it is the process it expects (its start time): the pidfd then cannot name a reused pid."""
        ...

    def signal_group(self, pgid: int, sig: int) -> bool:
        """Signal a process group; False if it no longer exists."""
        ...

    def signal(self, pid: int, sig: int) -> bool: ...

    def close(self) -> None:
        """Release what the implementation holds (the job shell launcher)."""
        ...

    def start_time(self, pid: int) -> int | None:
        """The kernel's start time of a live process (clock ticks since boot), to tell a pid from its
        reuse; None if there is no such process or it has ended."""
        ...

    def session_members(self, sid: int) -> list[int]:
        """Every process whose session id is ``sid``."""
        ...

    def parent(self, pid: int) -> int | None:
        """The pid of the process's parent, None if there is no such process."""
        ...

    def states(self, pids: list[int]) -> dict[int, str | None]:
        """Each process's state letter from /proc (R, S, D, T, Z, ...), None for a pid that is gone."""
        ...

    def cpu_ns(self, pid: int) -> int | None:
        """CPU time of the process's main thread in nanoseconds (the kernel's accounting), None if gone."""
        ...

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        """The main thread's CPU time and its time runnable but waiting for a CPU (ns); None if gone."""
        ...

    def set_nice(self, pgid: int, nice: int) -> None:
        """The scheduling priority (nice value) of every thread of a process group; gone is no error."""
        ...

    def set_group_nice(self, pid: int, nice: int) -> None:
        """The nice value of the process's autogroup (its session's weight against other sessions when the
        kernel groups tasks by session); gone, or no autogroups, is no error."""
        ...

    def remove_shm(self, names: Collection[str]) -> list[str]:
        """Unlink those of the named /dev/shm entries that exist; return the names removed."""
        ...

    def mapped_shm(self, pids: Collection[int]) -> set[str]:
        """The /dev/shm entries (names) these live processes map or hold open; gone processes hold nothing.

        Open descriptors count too: a segment is opened before it is mapped, and one killed in between
        leaves its name behind all the same."""
        ...


class LinuxProcesses:
    def __init__(self) -> None:
        self._launcher: Launcher | None = None

    def prepare(self) -> None:
        if self._launcher is None:
            self._launcher = Launcher()

    def start_shell(self, shell: dict[str, object], *, uid: int, gid: int, log: int) -> tuple[int, int]:
        self.prepare()
        assert self._launcher is not None
        try:
            groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
        except KeyError:
            groups = [gid]
        return self._launcher.spawn(shell, uid=uid, gid=gid, groups=groups, log=log)

    def pidfd(self, pid: int) -> int | None:
        if pid <= 0:
            return None
        try:
            return os.pidfd_open(pid)
        except OSError:  # ESRCH: no such process
            return None

    def close(self) -> None:
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None

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
        return procfs.start_time(pid)

    def states(self, pids: list[int]) -> dict[int, str | None]:
        return {pid: procfs.state(pid) for pid in pids}

    def set_nice(self, pgid: int, nice: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PGRP, pgid, nice)

    def set_group_nice(self, pid: int, nice: int) -> None:
        # With kernel.sched_autogroup_enabled (the default of most distributions) CFS shares a CPU between
        # sessions first and by nice only within one; a job's ranks share their job shell's session, so
        # without this a rank's nice would not count against other jobs' ranks at all.
        with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))

    def cpu_ns(self, pid: int) -> int | None:
        stat = self.schedstat(pid)
        return None if stat is None else stat[0]

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                on_cpu, waiting, _slices = f.read().split()
            return int(on_cpu), int(waiting)
        except (OSError, ValueError):
            return None

    def session_members(self, sid: int) -> list[int]:
        return [pid for pid in procfs.pids() if procfs.session(pid) == sid]

    def parent(self, pid: int) -> int | None:
        return procfs.parent(pid)

    def mapped_shm(self, pids: Collection[int]) -> set[str]:
        found: set[str] = set()
        prefix = f"{SHM_DIR}/"
        for pid in pids:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                    path = line.split(maxsplit=5)[5:]
                    if path and path[0].startswith(prefix):
                        found.add(path[0][len(prefix) :].removesuffix(" (deleted)"))
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if target.startswith(prefix):
                            found.add(target[len(prefix) :].removesuffix(" (deleted)"))
        return {name for name in found if "/" not in name}

    def remove_shm(self, names: Collection[str]) -> list[str]:
        removed = []
        for name in names:
            try:
                os.unlink(SHM_DIR / name)
            except FileNotFoundError:
                continue
            removed.append(name)
        return removed
