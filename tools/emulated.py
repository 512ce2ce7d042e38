"""Emulated ranks: what stands under storm-nm's own core (nm/node.py's ``Node``) in an emulated node manager.

An emulated node manager (tools/emulator.py) is the real node core with real sockets to storm-mm, whose
ranks are simulated: no process is forked. This module is its operating system and its job shells, with
no I/O of its own (the emulator moves the bytes and keeps the time):

- :class:`EmulatedProcesses` is nm/processes.py's ``Processes`` for every node of one emulator: it hands
  out pids (increasing, so that a later process has a later start time, as the core's checks expect),
  keeps which job and rank each is, and takes signals. SIGSTOP and SIGCONT change only what /proc would say
  (state ``T``); an emulated rank's time runs on while it is stopped (its run time is wall time). SIGTERM or
  SIGKILL to a rank's group or to the job shell ends the job's ranks at once, killed by that signal: the
  job is then in :attr:`EmulatedProcesses.killed` for the emulator to play its shell's last report.
- :class:`NoMeasurements` is nm/monitor.py's ``Measurements`` for ranks that run without mpihook, as
  ``storm submit --no-hook`` ones do: nothing is measured, and the node reports them ``no-hook``.
- :func:`ranks_started`, :func:`shell_done` and :func:`run_time` are the job shell's part (nm/shell.py):
  the ranks' pids once they "exist", and how they ended once their time is up.

A job's run time is read from its command, so that a workload means the same on real and emulated nodes:
``sleep N`` runs N seconds, ``true`` none and exits 0, ``false`` none and exits 1; any other command runs
``STORM_EMULATED_SECONDS`` from its environment, or the emulator's default. Every rank of the job exits
with that code.
"""

from __future__ import annotations

import signal
from collections.abc import Collection
from dataclasses import dataclass, field

from storm.mm import protocol as p
from storm.nm.fcs import Measurement
from storm.nm.local_jobs import LocalJob
from storm.nm.profile import Snapshot

RUN_TIME_VARIABLE = "STORM_EMULATED_SECONDS"
FIRST_PID = 1000
_ENDING = (signal.SIGTERM, signal.SIGKILL)


@dataclass
class EmulatedJob:
    """One node's part of a job: its shell, its ranks (rank -> pid) and how each ended (rank -> exit)."""

    node: str
    job_id: int
    shell: int
    ranks: dict[int, int] = field(default_factory=dict)
    exits: dict[int, p.RankExit] = field(default_factory=dict)
    killed_by: int = 0  # the signal that ended it, if one did (ranks it never spawned died of it too)


@dataclass
class Process:
    job: EmulatedJob
    rank: int  # -1: the job shell
    stopped: bool = False
    alive: bool = True


class EmulatedProcesses:
    """Pids, states and signals of every emulated node of one emulator (see the module's docstring)."""

    def __init__(self) -> None:
        self.next_pid = FIRST_PID
        self.procs: dict[int, Process] = {}
        self.jobs: dict[tuple[str, int], EmulatedJob] = {}  # (node, job id) -> its part there
        self.starting: list[tuple[str, int]] = []  # shells started since the emulator last looked
        self.killed: list[EmulatedJob] = []  # jobs whose ranks a signal ended since the emulator looked

    def _spawn(self, job: EmulatedJob, rank: int) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        self.procs[pid] = Process(job, rank)
        return pid

    # -- nm/processes.py's Processes

    def prepare(self) -> None:
        pass

    def close(self) -> None:
        pass

    def start_shell(self, shell: dict[str, object], *, uid: int, gid: int, log: int) -> tuple[int, int]:
        """A job shell that forks nothing: the emulator plays it (its pidfd: -1, never readable)."""
        node, job_id = str(shell["node"]), int(str(shell["jobdir"]).rsplit("/", 1)[-1])
        job = EmulatedJob(node, job_id, 0)
        job.shell = self._spawn(job, -1)
        self.jobs[(node, job_id)] = job
        self.starting.append((node, job_id))
        return job.shell, -1

    def pidfd(self, pid: int) -> int | None:
        return None  # an emulator's processes die with it: nothing to re-adopt

    def signal_group(self, pgid: int, sig: int) -> bool:
        return self.signal(pgid, sig)

    def signal(self, pid: int, sig: int) -> bool:
        proc = self.procs.get(pid)
        if proc is None or not proc.alive:
            return False
        if sig == signal.SIGSTOP:
            proc.stopped = True
        elif sig == signal.SIGCONT:
            proc.stopped = False
        elif sig in _ENDING and not proc.job.killed_by:
            # The shell, or a rank (the shell stops the others): every rank still running ends now.
            job = proc.job
            job.killed_by = int(sig)
            for rank, rank_pid in job.ranks.items():
                if rank not in job.exits:
                    job.exits[rank] = p.RankExit(rank=rank, signal=int(sig))
                    self.procs[rank_pid].alive = False
            self.killed.append(job)
        return True

    def start_time(self, pid: int) -> int | None:
        proc = self.procs.get(pid)
        return pid if proc is not None and proc.alive else None

    def session_members(self, sid: int) -> list[int]:
        proc = self.procs.get(sid)
        if proc is None:
            return []
        job = proc.job
        return [pid for pid in (job.shell, *job.ranks.values()) if self.procs[pid].alive]

    def states(self, pids: list[int]) -> dict[int, str | None]:
        found: dict[int, str | None] = {}
        for pid in pids:
            proc = self.procs.get(pid)
            found[pid] = None if proc is None or not proc.alive else "T" if proc.stopped else "S"
        return found

    def cpu_ns(self, pid: int) -> int | None:
        return 0 if self.start_time(pid) is not None else None

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        return (0, 0) if self.start_time(pid) is not None else None

    def set_nice(self, pgid: int, nice: int) -> None:
        pass

    def set_group_nice(self, pid: int, nice: int) -> None:
        pass

    def remove_shm(self, names: Collection[str]) -> list[str]:
        return []

    def mapped_shm(self, pids: Collection[int]) -> set[str]:
        return set()

    # -- the emulator's side

    def spawn_ranks(self, node: str, job_id: int, ranks: list[int]) -> dict[int, int] | None:
        """The shell "spawns" its ranks: their pids, or None if the shell is gone (the job was killed)."""
        job = self.jobs.get((node, job_id))
        if job is None or job.killed_by or not self.procs[job.shell].alive:
            return None
        for rank in ranks:
            job.ranks[rank] = self._spawn(job, rank)
        return dict(job.ranks)

    def end(self, node: str, job_id: int, code: int) -> EmulatedJob | None:
        """The job's time is up: its ranks still running exit with ``code``. None if it is gone already."""
        job = self.jobs.get((node, job_id))
        if job is None:
            return None
        for rank, pid in job.ranks.items():
            if rank not in job.exits:
                job.exits[rank] = p.RankExit(rank=rank, exit_code=code)
                self.procs[pid].alive = False
        return job

    def reap(self, node: str, job_id: int) -> None:
        """The job shell exits after its last report: nothing of the job is left."""
        job = self.jobs.pop((node, job_id), None)
        if job is not None:
            for pid in (job.shell, *job.ranks.values()):
                self.procs.pop(pid, None)


class NoMeasurements:
    """Measurements of ranks without mpihook: none (the node core reports them ``no-hook``)."""

    spin_ns = 0

    def create(self, job_id: int, name: str, ranks: list[int], uid: int, gid: int) -> bool:
        return False

    def attach(self, job_id: int, name: str, ranks: list[int]) -> bool:
        return False

    def watches(self, job_id: int) -> bool:
        return False

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        pass

    def backdate(self, job_id: int, starts: dict[int, int]) -> None:
        pass

    def remove(self, job_id: int) -> None:
        pass

    def sample(self) -> None:
        pass

    def set_wait(self, job_id: int, index: int, spin_block: bool) -> None:
        pass

    def switched(self, job_id: int, index: int, running: bool) -> None:
        pass

    def snapshot(self, job_id: int, index: int) -> Snapshot | None:
        return None

    def measure_rank(self, job_id: int, index: int) -> Measurement | None:
        return None

    def reset_rank(self, job_id: int, index: int) -> None:
        pass

    def stats(self, job_id: int) -> list[p.RankStats]:
        return []


def run_time(launch: p.LaunchJob, default: float) -> tuple[float, int]:
    """How long the job's emulated ranks run (seconds) and the code they exit with (module docstring)."""
    command = launch.argv[0].rsplit("/", 1)[-1]
    if command == "true":
        return 0.0, 0
    if command == "false":
        return 0.0, 1
    if command == "sleep" and len(launch.argv) == 2:
        try:
            return max(0.0, float(launch.argv[1])), 0
        except ValueError:
            pass
    try:
        return max(0.0, float(launch.env.get(RUN_TIME_VARIABLE, default))), 0
    except ValueError:
        return default, 0


def ranks_started(job: LocalJob, pids: dict[int, int]) -> p.RanksStarted:
    """What the job shell says once its ranks exist."""
    return p.RanksStarted(job_id=job.job_id, pids={str(rank): pid for rank, pid in pids.items()})


def shell_done(job: LocalJob, ended: EmulatedJob) -> list[p.Message]:
    """What the job shell says when its ranks have ended: each failed rank as it ends (so that the node
    reports the failure at once, as nm/shell.py does), then every rank's exit."""

    def missing(rank: int) -> p.RankExit:  # a rank the shell never spawned died of the kill, if any
        return p.RankExit(rank=rank, signal=ended.killed_by) if ended.killed_by else p.RankExit(rank=rank)

    exits = tuple(ended.exits.get(s.rank) or missing(s.rank) for s in job.launch.slots)
    failed: list[p.Message] = [p.RankExited(job_id=job.job_id, exit=e) for e in exits if e.failed]
    return [*failed, p.ShellDone(job_id=job.job_id, exits=exits)]
