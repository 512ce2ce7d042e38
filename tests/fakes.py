"""Fakes of the node manager's two seams, for driving its core without processes: the whole of
nm/processes.py's ``Processes`` and nm/monitor.py's ``Measurements``, each recording what it was asked."""

from __future__ import annotations

import signal
from collections.abc import Collection
from dataclasses import dataclass, field

from storm.mm.protocol import RankStats
from storm.nm.fcs import Measurement
from storm.nm.monitor import Measurements
from storm.nm.processes import Processes
from storm.nm.profile import Snapshot


class FakeProcesses:
    """Processes whose pids are handed out in order (a pid's start time is the pid, so a later pid started
    later); every signalled process reaches the state it was signalled to at once."""

    def __init__(self, first_pid: int = 1000) -> None:
        self.next_pid = first_pid
        self.shells: list[dict[str, object]] = []  # what start_shell was given
        self.signals: list[tuple[int, int]] = []  # (pgid, signal) sent to process groups
        self.direct: list[tuple[int, int]] = []  # (pid, signal) sent to single processes
        self.nice: dict[int, int] = {}
        self.group_nice: dict[int, int] = {}
        self.stopped: set[int] = set()
        self.gone: set[int] = set()
        self.sessions: dict[int, list[int]] = {}  # session leader's pid -> the session's members
        self.parents: dict[int, int] = {}  # pid -> its parent's
        self.shm: set[str] = set()  # /dev/shm entries that exist
        self.removed: list[str] = []
        self.cpu: dict[int, int] = {}
        self.holds: dict[int, set[str]] = {}  # pid -> /dev/shm entries it maps or holds open
        self.held_asked: list[dict[int, bool]] = []  # per mapped_shm call: pid -> was it stopped then

    def spawn(self) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        return pid

    def prepare(self) -> None:
        pass

    def start_shell(self, shell: dict[str, object], *, uid: int, gid: int, log: int) -> tuple[int, int]:
        self.shells.append(shell)
        pid = self.spawn()
        self.sessions[pid] = [pid]
        return pid, 10_000 + pid  # a pidfd nobody reads: the tests end shells by calling the core

    def child(self, parent: int) -> int:
        """A new process of ``parent`` (a job shell's rank), leading a session of its own."""
        pid = self.spawn()
        self.parents[pid] = parent
        self.sessions[pid] = [pid]
        return pid

    def pidfd(self, pid: int) -> int | None:
        return None if pid in self.gone else 10_000 + pid

    def signal_group(self, pgid: int, sig: int) -> bool:
        self.signals.append((pgid, sig))
        if sig == signal.SIGSTOP:
            self.stopped.add(pgid)
        elif sig == signal.SIGCONT:
            self.stopped.discard(pgid)
        return pgid not in self.gone

    def signal(self, pid: int, sig: int) -> bool:
        self.direct.append((pid, sig))
        return pid not in self.gone

    def close(self) -> None:
        pass

    def start_time(self, pid: int) -> int | None:
        return None if pid in self.gone or pid >= self.next_pid else pid

    def session_members(self, sid: int) -> list[int]:
        return [pid for pid in self.sessions.get(sid, []) if pid not in self.gone]

    def parent(self, pid: int) -> int | None:
        return None if pid in self.gone or pid >= self.next_pid else self.parents.get(pid, 1)

    def states(self, pids: list[int]) -> dict[int, str | None]:
        return {pid: None if pid in self.gone else "T" if pid in self.stopped else "R" for pid in pids}

    def cpu_ns(self, pid: int) -> int | None:
        return None if pid in self.gone else self.cpu.get(pid, 0)

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        return None if pid in self.gone else (self.cpu.get(pid, 0), 0)

    def set_nice(self, pgid: int, nice: int) -> None:
        self.nice[pgid] = nice

    def set_group_nice(self, pid: int, nice: int) -> None:
        self.group_nice[pid] = nice

    def remove_shm(self, names: Collection[str]) -> list[str]:
        removed = [name for name in names if name in self.shm]
        self.shm.difference_update(removed)
        self.removed.extend(removed)
        return removed

    def mapped_shm(self, pids: Collection[int]) -> set[str]:
        self.held_asked.append({pid: pid in self.stopped for pid in pids})
        return {name for pid in pids if pid not in self.gone for name in self.holds.get(pid, ())}


@dataclass
class FakeJob:
    ranks: list[int]
    pids: dict[int, int] = field(default_factory=dict)  # record index -> pid
    waits: dict[int, bool] = field(default_factory=dict)  # record index -> told to spin-block
    running: dict[int, bool] = field(default_factory=dict)


class FakeMeasurements:
    """Measurements given by the test: ``measured[(job id, record index)]``, None for a rank that has not
    entered MPI. Resets and wait modes are recorded."""

    def __init__(self) -> None:
        self.spin_ns = 120_000
        self.jobs: dict[int, FakeJob] = {}
        self.segments: dict[int, str] = {}
        self.measured: dict[tuple[int, int], Measurement | None] = {}
        self.resets: list[tuple[int, int]] = []
        self.samples = 0

    def create(self, job_id: int, name: str, ranks: list[int], uid: int, gid: int) -> bool:
        self.jobs[job_id] = FakeJob(ranks=ranks)
        self.segments[job_id] = name
        return True

    def attach(self, job_id: int, name: str, ranks: list[int]) -> bool:
        return self.create(job_id, name, ranks, 0, 0)

    def watches(self, job_id: int) -> bool:
        return job_id in self.jobs

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.pids = {job.ranks.index(rank): pid for rank, pid in pids.items() if rank in job.ranks}

    def backdate(self, job_id: int, starts: dict[int, int]) -> None:
        pass

    def remove(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)

    def sample(self) -> None:
        self.samples += 1

    def set_wait(self, job_id: int, index: int, spin_block: bool) -> None:
        if job_id in self.jobs:
            self.jobs[job_id].waits[index] = spin_block

    def switched(self, job_id: int, index: int, running: bool) -> None:
        if job_id in self.jobs:
            self.jobs[job_id].running[index] = running

    def snapshot(self, job_id: int, index: int) -> Snapshot | None:
        return None

    def measure_rank(self, job_id: int, index: int) -> Measurement | None:
        return self.measured.get((job_id, index))

    def reset_rank(self, job_id: int, index: int) -> None:
        self.resets.append((job_id, index))

    def stats(self, job_id: int) -> list[RankStats]:
        job = self.jobs.get(job_id)
        if job is None:
            return []
        return [
            RankStats(
                rank=rank, node="", pid=job.pids.get(index, 0), state="active", t_cpu=0.0, t_comm=0.0,
                c_comm=0, granularity=None, calls=0,
                wait_mode="spin-block" if job.waits.get(index) else "poll",
            )
            for index, rank in enumerate(job.ranks)
        ]  # fmt: skip


def _conforms(processes: FakeProcesses, measurements: FakeMeasurements) -> tuple[Processes, Measurements]:
    """mypy checks here that the fakes satisfy the whole of both protocols."""
    return processes, measurements
