"""What the node manager knows of each rank's communication: FCS's measurements (Table 1 of the paper).

Per rank, since its last reset (a class change or the age expiry of FCS; the job's start until then):

- T_comm: time waiting in blocking MPI calls, and C_comm: communication events (mpihook counts calls with
  computation before them, so back-to-back calls count once);
- T_cpu: computation time, from the kernel's accounting of the rank's main thread (/proc/PID/schedstat,
  nanoseconds) less the CPU it burnt polling inside MPI (MPICH busy-polls: that is waiting, not work);
- the granularity g = (T_cpu + T_comm) / C_comm, the average time of one compute-and-communicate step.

Records are read for every job at every time slice with one pread per job (mpihook/stats.py); the kernel's
CPU time is read only when a measurement is wanted (a report, a classification).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from storm.mm.protocol import RankStats
from storm.mpihook.stats import FOREIGN_MPI, WAIT_SPINBLOCK, HookSegment, RankCounters
from storm.nm.processes import Processes

log = logging.getLogger("storm.nm")


@dataclass
class Baseline:
    """A rank's counters at its last reset."""

    events: int = 0
    comm_ns: int = 0
    polled_ns: int = 0
    calls: int = 0
    cpu_ns: int = 0


@dataclass
class Measurement:
    t_cpu: float
    t_comm: float
    c_comm: int

    @property
    def granularity(self) -> float | None:
        return (self.t_cpu + self.t_comm) / self.c_comm if self.c_comm else None


def polled(counters: RankCounters) -> int:
    """CPU time the rank spent waiting inside MPI: all of it when polling, the spinning part in spin-block."""
    return counters.comm_ns - counters.block_ns


class JobMonitor:
    """One job's ranks on this node: its hook segment and each rank's baseline."""

    def __init__(self, segment: HookSegment, ranks: list[int]) -> None:
        self.segment = segment
        self.ranks = ranks  # MPI rank of each record index
        self.pids: dict[int, int] = {}  # record index -> pid
        self.latest: list[RankCounters | None] = [None] * len(ranks)
        self.base = [Baseline() for _ in ranks]

    def sample(self) -> None:
        """Read every record of the job (one system call); called at every time slice."""
        fresh = self.segment.read_all()
        self.latest = [new if new is not None else old for new, old in zip(fresh, self.latest, strict=True)]

    def measure(self, index: int, cpu_ns: int | None) -> Measurement | None:
        counters = self.latest[index]
        if counters is None or not counters.active or cpu_ns is None:
            return None
        base = self.base[index]
        comm = counters.comm_ns - base.comm_ns
        work = (cpu_ns - base.cpu_ns) - (polled(counters) - base.polled_ns)
        return Measurement(t_cpu=max(0, work) / 1e9, t_comm=comm / 1e9, c_comm=counters.events - base.events)

    def reset(self, index: int, cpu_ns: int | None) -> None:
        """Start measuring afresh (FCS resets on a class change and on age expiry)."""
        counters = self.latest[index]
        if counters is None or cpu_ns is None:
            return
        self.base[index] = Baseline(
            events=counters.events,
            comm_ns=counters.comm_ns,
            polled_ns=polled(counters),
            calls=counters.calls,
            cpu_ns=cpu_ns,
        )


class Monitor:
    """Every job of the node that runs under mpihook."""

    def __init__(self, processes: Processes, node: str) -> None:
        self.os = processes
        self.node = node
        self.jobs: dict[int, JobMonitor] = {}

    def add(self, job_id: int, segment: HookSegment, ranks: list[int]) -> None:
        self.jobs[job_id] = JobMonitor(segment, ranks)

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.pids = {job.ranks.index(rank): pid for rank, pid in pids.items() if rank in job.ranks}

    def remove(self, job_id: int) -> None:
        """The job's ranks are gone: drop its segment and its name."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            job.segment.close()
            job.segment.unlink()

    def sample(self) -> None:
        for job in self.jobs.values():
            job.sample()

    def set_wait(self, job_id: int, mode: int, spin_ns: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            for index in range(len(job.ranks)):
                job.segment.set_wait(index, mode, spin_ns)

    def stats(self, job_id: int) -> list[RankStats]:
        """The job's ranks as ``storm stats`` shows them (reads each rank's CPU time from the kernel)."""
        job = self.jobs.get(job_id)
        if job is None:
            return []
        result = []
        for index, rank in enumerate(job.ranks):
            pid = job.pids.get(index, 0)
            counters = job.latest[index]
            measurement = job.measure(index, self.os.cpu_ns(pid) if pid else None)
            mode, _spin = job.segment.wait_mode(index)
            if counters is not None and counters.flags & FOREIGN_MPI:
                state = "foreign-mpi"
            elif counters is None or not counters.active:
                state = "no-mpi"
            else:
                state = "active"
            result.append(
                RankStats(
                    rank=rank,
                    node=self.node,
                    pid=pid,
                    state=state,
                    t_cpu=measurement.t_cpu if measurement else 0.0,
                    t_comm=measurement.t_comm if measurement else 0.0,
                    c_comm=measurement.c_comm if measurement else 0,
                    granularity=measurement.granularity if measurement else None,
                    calls=counters.calls if counters else 0,
                    wait_mode="spin-block" if mode == WAIT_SPINBLOCK else "poll",
                )
            )
        return result
