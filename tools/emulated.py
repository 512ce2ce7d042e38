"""Emulated ranks and job shells: what stands under storm-nm's own core (nm/node.py's ``Node``) in an
emulated node manager.

An emulated node manager (tools/emulator.py) is the real node core with real sockets to storm-mm, whose
ranks are simulated: no process is forked. This module is its operating system and its job shells, with
no I/O of its own (the emulator moves the bytes, keeps the time and carries messages between the two):

- :class:`EmulatedProcesses` is nm/processes.py's ``Processes`` for every node of one emulator, and the job
  shells those nodes start. Pids are handed out increasing, so that a later process has a later start time,
  as the core's checks expect. As in storm-nm, a job shell serves every job of one user on its node
  (nm/shell_server.py) and leads a session of its own; each rank it "spawns" is its child and leads a
  session (and process group) of its own, so a rank's group and session are the rank alone.
- A job shell plays nm/shell_server.py's and nm/shell.py's protocol: once started it says ``shell_ready``;
  a ``shell_launch`` makes the job's ranks exist at once (``ranks_started``); each rank that ends is
  reported (``rank_exited``), the last one with the job's ``shell_done``, after which the job is kept until
  the NM acknowledges that report; ``shell_stop`` stops the job's ranks (SIGCONT, SIGTERM); after
  ``shell_retire`` it exits as soon as none of its jobs has a process left. What the shells say is queued
  in :attr:`EmulatedProcesses.said` (a job shell's exit as ``None``, for the core's ``job_shell_ended``),
  the run times to keep in :attr:`EmulatedProcesses.timers`.
- Signals mean what they mean to real processes: SIGSTOP and SIGCONT change only what /proc would say
  (state ``T``), and an emulated rank's time runs on while it is stopped (its run time is wall time); a
  signal whose default action ends a process ends the rank, killed by it (a stopped one once continued,
  except by SIGKILL), and its shell reports that as it would a real one. SIGTERM to a job shell stops the
  ranks of all its jobs; SIGKILL kills the shell alone, leaving its ranks to run on as orphans.
- :class:`NoMeasurements` is nm/monitor.py's ``Measurements`` for ranks that run without mpihook, as
  ``storm submit --no-hook`` ones do: nothing is measured, and the node reports them ``no-hook``.

A job's run time is read from its command (:func:`run_time`), so that a workload means the same on real and
emulated nodes: ``sleep N`` runs N seconds, ``true`` none and exits 0, ``false`` none and exits 1; any other
command runs ``STORM_EMULATED_SECONDS`` from its environment, or the emulator's default. Every rank of the
job exits with that code.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from storm.mm import protocol as p
from storm.nm.fcs import Measurement
from storm.nm.profile import Snapshot

RUN_TIME_VARIABLE = "STORM_EMULATED_SECONDS"
FIRST_PID = 1000
LAUNCHER_PID = FIRST_PID - 1  # the parent of every job shell, as nm/launcher.py's process is storm-nm's
INIT_PID = 1  # the parent of a rank whose job shell died
# Signals whose default action does not end a process: they stop it, or nothing happens.
_STOPPING = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
_IGNORED = frozenset({signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH})


@dataclass(eq=False)
class EmulatedShell:
    """A user's job shell on one node. ``identity`` is the routing id of its connection to the NM."""

    node: str
    uid: int
    pid: int
    identity: bytes
    jobs: dict[int, EmulatedJob] = field(default_factory=dict)  # until the NM acknowledges their report
    retired: bool = False
    alive: bool = True


@dataclass(eq=False)
class EmulatedJob:
    """One node's part of a job in its job shell: its ranks (rank -> pid), how each ended (rank -> exit)."""

    shell: EmulatedShell
    launch: p.LaunchJob
    ranks: dict[int, int] = field(default_factory=dict)
    exits: dict[int, p.RankExit] = field(default_factory=dict)
    done: bool = False  # its shell_done is out


@dataclass(eq=False)
class Process:
    shell: EmulatedShell
    job: EmulatedJob | None  # None: the job shell itself
    rank: int = -1
    stopped: bool = False
    pending: int = 0  # a signal that ends it once it is continued


Said = tuple[EmulatedShell, p.Message | None]  # what a job shell said to its NM; None: it exited


class EmulatedProcesses:
    """Pids, states and signals of every emulated node of one emulator, and their job shells (see the
    module's docstring). ``default_run_time`` is the run time of a command that says none."""

    def __init__(self, default_run_time: float = 0.0) -> None:
        self.default_run_time = default_run_time
        self.next_pid = FIRST_PID
        self.procs: dict[int, Process] = {}  # every live process: job shells and ranks
        self.shells: dict[bytes, EmulatedShell] = {}  # live job shells by the routing id of their connection
        self.said: deque[Said] = deque()  # for the emulator to deliver to the shells' NMs, in order
        self.timers: list[tuple[float, EmulatedJob, int]] = []  # (seconds, job, exit code): its run time

    def _spawn(self, shell: EmulatedShell, job: EmulatedJob | None, rank: int = -1) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        self.procs[pid] = Process(shell, job, rank)
        return pid

    # -- nm/processes.py's Processes

    def prepare(self) -> None:
        pass

    def close(self) -> None:
        pass

    def start_shell(self, shell: dict[str, object], *, uid: int, gid: int, log: int) -> tuple[int, int]:
        """A user's job shell that forks nothing (its pidfd: -1, never readable: its end is said instead).
        It says shell_ready once the emulator delivers what it said."""
        pid = self.next_pid
        started = EmulatedShell(str(shell["node"]), uid, pid, b"emulated-shell-%d" % pid)
        self._spawn(started, None)
        self.shells[started.identity] = started
        self.said.append((started, p.ShellReady(pid=pid)))
        return pid, -1

    def pidfd(self, pid: int) -> int | None:
        return None  # an emulator's processes die with it: nothing to re-adopt

    def signal_group(self, pgid: int, sig: int) -> bool:
        return self.signal(pgid, sig)  # every emulated process leads its group, and is alone in it

    def signal(self, pid: int, sig: int) -> bool:
        proc = self.procs.get(pid)
        if proc is None:
            return False
        if sig == 0 or sig in _IGNORED:
            return True
        if sig in _STOPPING:
            proc.stopped = True
        elif sig == signal.SIGCONT:
            proc.stopped = False
            if proc.pending:
                self._ended(proc, proc.pending)
        elif proc.stopped and sig != signal.SIGKILL:
            proc.pending = proc.pending or sig  # delivered when it is continued
        else:
            self._ended(proc, sig)
        return True

    def start_time(self, pid: int) -> int | None:
        return pid if pid in self.procs else None

    def session_members(self, sid: int) -> list[int]:
        return [sid] if sid in self.procs else []  # a rank's session, or a shell's, is the process alone

    def parent(self, pid: int) -> int | None:
        proc = self.procs.get(pid)
        if proc is None:
            return None
        if proc.job is None:
            return LAUNCHER_PID
        return proc.shell.pid if proc.shell.alive else INIT_PID

    def states(self, pids: list[int]) -> dict[int, str | None]:
        found: dict[int, str | None] = {}
        for pid in pids:
            proc = self.procs.get(pid)
            found[pid] = None if proc is None else "T" if proc.stopped else "S"
        return found

    def cpu_ns(self, pid: int) -> int | None:
        return 0 if pid in self.procs else None

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        return (0, 0) if pid in self.procs else None

    def set_nice(self, pgid: int, nice: int) -> None:
        pass

    def set_group_nice(self, pid: int, nice: int) -> None:
        pass

    def remove_shm(self, names: Collection[str]) -> list[str]:
        return []

    def mapped_shm(self, pids: Collection[int]) -> set[str]:
        return set()

    # -- the job shells: what their NM sends them, and their ranks' ends

    def to_shell(self, identity: bytes, msg: p.Message) -> None:
        """A message from an NM to the job shell on connection ``identity`` (dropped if none is there, as
        a ROUTER drops what it cannot route)."""
        shell = self.shells.get(identity)
        if shell is None:
            return
        match msg:
            case p.ShellLaunch():
                self._launch(shell, msg.launch)
            case p.ShellStop():
                job = shell.jobs.get(msg.job_id)
                if job is not None:
                    self.stop(job)
            case p.ShellRetire():
                shell.retired = True
                self._check_finished(shell)
            case p.Ack() if msg.what == p.ShellDone.op:
                shell.jobs.pop(msg.job_id, None)
                self._check_finished(shell)
            case _:
                pass  # answers to PMI and name requests: emulated ranks make none

    def _launch(self, shell: EmulatedShell, launch: p.LaunchJob) -> None:
        if launch.job_id in shell.jobs:
            return  # a repeated launch: the first one is under way
        job = EmulatedJob(shell, launch)
        shell.jobs[launch.job_id] = job
        for slot in launch.slots:
            job.ranks[slot.rank] = self._spawn(shell, job, slot.rank)
        pids = {str(rank): pid for rank, pid in job.ranks.items()}
        self.said.append((shell, p.RanksStarted(job_id=launch.job_id, pids=pids)))
        seconds, code = run_time(launch, self.default_run_time)
        self.timers.append((seconds, job, code))

    def time_up(self, job: EmulatedJob, code: int) -> None:
        """The job's run time is over: its ranks still running exit with ``code``."""
        for rank, pid in job.ranks.items():
            if pid in self.procs:
                self._exit(job, rank, pid, p.RankExit(rank=rank, exit_code=code))

    def stop(self, job: EmulatedJob) -> None:
        """shell_stop (nm/shell.py's Shell.stop): SIGCONT and SIGTERM to each rank still running."""
        for pid in list(job.ranks.values()):
            if pid in self.procs:
                self.signal(pid, signal.SIGCONT)
                self.signal(pid, signal.SIGTERM)

    def _ended(self, proc: Process, sig: int) -> None:
        """``proc`` dies of ``sig``."""
        job = proc.job
        if job is not None:
            self._exit(job, proc.rank, job.ranks[proc.rank], p.RankExit(rank=proc.rank, signal=sig))
            return
        shell = proc.shell
        if sig == signal.SIGTERM:  # nm/shell_server.py's handler: every job's ranks are stopped
            for job in list(shell.jobs.values()):
                self.stop(job)
        else:
            self._shell_exits(shell)

    def _exit(self, job: EmulatedJob, rank: int, pid: int, exit: p.RankExit) -> None:
        """A rank ends; its shell reaps it and reports: the last one with the job's shell_done."""
        del self.procs[pid]
        job.exits[rank] = exit
        shell = job.shell
        if not shell.alive:
            return  # an orphan: nobody reports it
        if len(job.exits) < len(job.ranks):
            self.said.append((shell, p.RankExited(job_id=job.launch.job_id, exit=exit)))
            return
        job.done = True
        exits = tuple(job.exits[r] for r in sorted(job.exits))
        self.said.append((shell, p.ShellDone(job_id=job.launch.job_id, exits=exits)))
        self._check_finished(shell)

    def _check_finished(self, shell: EmulatedShell) -> None:
        """A retired job shell exits once none of its jobs has a process left."""
        if shell.alive and shell.retired and all(job.done for job in shell.jobs.values()):
            self._shell_exits(shell)

    def _shell_exits(self, shell: EmulatedShell) -> None:
        shell.alive = False
        del self.procs[shell.pid]
        del self.shells[shell.identity]
        self.said.append((shell, None))


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
