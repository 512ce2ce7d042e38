"""What a restarted storm-nm reads of the jobs an earlier one left (nm/jobdir.py's records): which of a job's
ranks still run as the same processes, and, for a job nobody can follow, which sessions to kill and what
to sweep. Functions of the record and the OS seam (nm/processes.py); nm/local_jobs.py re-adopts the rest.

A record is the NM's own file, but it may be old or damaged: a field of the wrong type raises TypeError or
ValueError (KeyError if missing), which the caller takes as "cannot re-adopt".
"""

from __future__ import annotations

import logging
import signal

from storm.mm import protocol as p
from storm.nm.children import SPAWNED_MPI_NODE
from storm.nm.jobdir import JobDir
from storm.nm.pmi import mpich_shm_names
from storm.nm.processes import Processes
from storm.nm.spawn import world_kvsname

log = logging.getLogger("storm.nm")


def live_ranks(os: Processes, record: dict[str, object]) -> tuple[dict[int, int], dict[int, int]]:
    """The recorded ranks still running as the same processes (pid and start time): their pids and start
    times."""
    ranks = record.get("ranks") or {}
    if not isinstance(ranks, dict):
        raise ValueError("ranks is not a map")
    live, starts = {}, {}
    for rank, (pid, start) in ranks.items():
        if start is not None and os.start_time(integer(pid)) == integer(start):
            live[int(rank)], starts[int(rank)] = integer(pid), integer(start)
    return live, starts


def record_leaders(os: Processes, record: dict[str, object]) -> list[int]:
    """The sessions of a job nobody can follow, from its record: its ranks' (its shell's, for a job of an
    older storm-nm, whose shell's session held its ranks). A leader that is gone may still have a session
    (a pid is not reused while a session carries it); another process with its pid: the pid was reused.
    A job shell that serves other jobs too is left alone: it is told to stop this job when it speaks of it."""
    if record.get("own_shell", True):
        shell = integer(record["shell_pid"])
        started = os.start_time(shell)
        return [shell] if shell > 0 and (started is None or started == record.get("shell_start")) else []
    ranks = record.get("ranks") or {}
    if not isinstance(ranks, dict):
        raise ValueError("ranks is not a map")
    leaders = []
    for pid, start in ranks.values():
        now = os.start_time(integer(pid))
        if now is None or now == start:
            leaders.append(integer(pid))
    return leaders


def sweep(os: Processes, jobdir: JobDir, record: dict[str, object] | None) -> None:
    """Kill what a job nobody can follow left running, remove its shared memory and its directory."""
    try:
        if record is not None:
            victims = [pid for leader in record_leaders(os, record) for pid in os.session_members(leader)]
            for pid in victims:
                os.signal(pid, signal.SIGKILL)
            if victims:
                log.warning("job %s: killed %d process(es) it left", jobdir.path.name, len(victims))
            # "node_index": what a storm-nm from before hosts were known wrote (then the same number)
            kvsname, index = str(record["kvsname"]), integer(record.get("mpi_node", record.get("node_index")))
            leftovers = list(mpich_shm_names(kvsname, index))
            spawned = record.get("spawns")
            worlds = spawned.get("worlds", {}) if isinstance(spawned, dict) else {}
            launch = jobdir.load_launch()  # the node index of the worlds' names, as launched
            decoded = None if launch is None else p.decode(launch, p.MAX_NODE_MESSAGE)
            if isinstance(decoded, p.LaunchJob) and isinstance(worlds, dict):
                for world in worlds:
                    name = world_kvsname(kvsname, decoded.node_index, int(world))
                    leftovers.extend(mpich_shm_names(name, SPAWNED_MPI_NODE))
            if record.get("hook_segment"):
                leftovers.append(str(record["hook_segment"]).lstrip("/"))
            os.remove_shm(leftovers)
    except (KeyError, TypeError, ValueError, p.ProtocolError) as exc:
        log.warning("job %s: unreadable record: %s", jobdir.path.name, exc)
    jobdir.remove()


def integer(value: object) -> int:
    """A record's integer field (TypeError for anything else, a bool included)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def optional_integer(value: object) -> int | None:
    return None if value is None else integer(value)
