"""/proc/PID/stat, read in one place: a process's state, parent and start time (and its session, which
getsid(2) tells more cheaply).

The node manager's OS seam (nm/processes.py) reads it to tell a process from a later one with the same pid
and to find a job's processes; benchmarks and tests read it to see what the NM did to ranks. Nothing here
imports the rest of storm, so a tool can read /proc without building the NM's launcher.
"""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on, so field N of proc(5) is ``[N - 3]``; None if the process
    is gone."""
    try:  # os-level calls: the NM reads a few of these per job, and pathlib's costs more than the read
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    return stat[stat.rindex(")") + 2 :].split()


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z...), None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else fields[0]


def parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return None if fields is None else int(fields[1])


def session(pid: int) -> int | None:
    """The process's session id, None if it is gone. getsid(2), not its stat file: finding a job's processes
    asks this of every pid on the node, and one system call costs a tenth of opening, reading and parsing."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, what names one process for good.
    None if it is gone or a zombie (it has ended; only its parent's wait is missing)."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def pids() -> list[int]:
    """Every process's pid (some may be gone by the time they are read)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
