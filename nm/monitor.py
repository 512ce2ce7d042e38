"""What the node manager knows of each rank's communication: FCS's measurements (Table 1 of the paper).

Per rank, since its last reset (a class change or the age expiry of FCS; its first MPI call until then):

- T_comm: time waiting in blocking MPI calls, and C_comm: communication events (mpihook counts calls with
  computation before them, so back-to-back calls count once);
- T_cpu: computation time, from the kernel's accounting of the rank's main thread (/proc/PID/schedstat,
  nanoseconds) less the CPU it burnt polling inside MPI (MPICH busy-polls: that is waiting, not work);
- the granularity g = (T_cpu + T_comm) / C_comm, the average time of one compute-and-communicate step.

A rank that gang scheduling stops inside a blocking call would have the whole stop counted as waiting (the
hook measures wall time): the NM, which does the stopping, takes that time out again ("measurements are
taken whenever a process is running", section 2.3 of the paper).

Records are read for every job at every time slice with one pread per job (mpihook/stats.py); the kernel's
CPU time is read only when a measurement starts or is wanted (a rank's first MPI call, a reset, a report, a
classification), and at every slice for the profile with ``[nm] profile`` (nm/profile.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from storm.mm.protocol import RankStats
from storm.mpihook.stats import (
    COLLECTIVES_POLL,
    FINALIZED,
    FOREIGN_MPI,
    THREAD_MULTIPLE,
    WAIT_POLL,
    WAIT_SPINBLOCK,
    HookSegment,
    RankCounters,
)
from storm.nm.fcs import Measurement
from storm.nm.processes import Processes
from storm.nm.profile import Snapshot

log = logging.getLogger("storm.nm")


@dataclass
class Baseline:
    """A rank's counters at its last reset."""

    events: int = 0
    comm_ns: int = 0
    polled_ns: int = 0
    calls: int = 0
    cpu_ns: int = 0
    stopped_ns: int = 0
    stopped_polling_ns: int = 0


def polled(counters: RankCounters) -> int:
    """CPU time the rank spent waiting inside MPI: all of it when polling, the spinning part in spin-block."""
    return counters.comm_ns - counters.block_ns


class JobMonitor:
    """One job's ranks on this node: its hook segment and each rank's baseline."""

    def __init__(
        self, segment: HookSegment, ranks: list[int], clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.clock = clock  # CLOCK_MONOTONIC, the hook's clock; a simulator passes its own
        self.segment = segment
        self.ranks = ranks  # MPI rank of each record index
        self.pids: dict[int, int] = {}  # record index -> pid
        self.latest: list[RankCounters | None] = [None] * len(ranks)
        self.base = [Baseline() for _ in ranks]
        self.modes = [WAIT_POLL] * len(ranks)
        # Time stopped by gang scheduling while inside a blocking call, in all and while polling.
        self.stopped_ns = [0] * len(ranks)
        self.stopped_polling_ns = [0] * len(ranks)
        self._paused: dict[int, tuple[int, bool]] = {}  # index -> (monotonic ns at the stop, polling)
        self.sampled_ns = 0  # when the records were last read
        self.all_active = False  # every rank's latest record says it entered MPI
        # For the profile: when each rank started (monotonic ns) and how long it has been stopped in all.
        self.start_ns = [0] * len(ranks)
        self.stopped_all_ns = [0] * len(ranks)
        self.resumed_ns = [0] * len(ranks)

    def sampled_since_stop(self, index: int) -> bool:
        paused = self._paused.get(index)
        return paused is None or self.sampled_ns > paused[0]

    def pause(self, index: int, now_ns: int) -> None:
        """The rank was just stopped; if it proves to be inside a blocking call, that stop is not waiting."""
        self._paused[index] = (now_ns, self.modes[index] == WAIT_POLL)

    def resume(self, index: int, now_ns: int) -> None:
        """The rank is continued. Whether it sat in a blocking call all along is read from the record as
        sampled while it was stopped: a stopped process enters and leaves no call, whereas the sample
        before the stop may predate a call it entered just before the signal (a whole slot misjudged)."""
        paused = self._paused.pop(index, None)
        counters = self.latest[index]
        if paused is not None:
            self.stopped_all_ns[index] += now_ns - paused[0]
            self.resumed_ns[index] = now_ns
        if paused is not None and counters is not None and counters.in_call:
            since, polling = paused
            self.stopped_ns[index] += now_ns - since
            if polling:
                self.stopped_polling_ns[index] += now_ns - since

    def sample(self) -> list[int]:
        """Read every record of the job (one system call); called at every time slice.

        Returns the indexes of ranks that have just entered MPI: their measurements start there, not
        with the start-up of their program.
        """
        fresh = self.segment.read_all()
        self.sampled_ns = self.clock()
        if self.all_active and all(fresh):
            # Every rank had entered MPI (the hook never clears ACTIVE) and every record was read (all():
            # None is the only false one): no rank begins, no old record is kept.
            self.latest = fresh
            return []
        began = [
            i for i, (new, old) in enumerate(zip(fresh, self.latest, strict=True))
            if new is not None and new.active and not (old is not None and old.active)
        ]  # fmt: skip
        self.latest = [new if new is not None else old for new, old in zip(fresh, self.latest, strict=True)]
        self.all_active = all(c is not None and c.active for c in self.latest)
        return began

    def measure(self, index: int, cpu_ns: int | None) -> Measurement | None:
        counters = self.latest[index]
        if counters is None or not counters.active or cpu_ns is None:
            return None
        base = self.base[index]
        comm = (counters.comm_ns - base.comm_ns) - (self.stopped_ns[index] - base.stopped_ns)
        polled_ns = (polled(counters) - base.polled_ns) - (
            self.stopped_polling_ns[index] - base.stopped_polling_ns
        )
        work = (cpu_ns - base.cpu_ns) - polled_ns
        # A stop is subtracted when the rank resumes, its call's time only when the call returns: clamp.
        return Measurement(
            t_cpu=max(0, work) / 1e9, t_comm=max(0, comm) / 1e9, c_comm=counters.events - base.events
        )

    def snapshot(self, index: int, schedstat: tuple[int, int], now_ns: int) -> Snapshot:
        """The rank's cumulative profile (nm/profile.py), from the kernel's ``schedstat`` and its record."""
        counters = self.latest[index]
        paused = self._paused.get(index)
        poll = blocked = 0
        if counters is not None and counters.active:
            stopped_spinblocking = self.stopped_ns[index] - self.stopped_polling_ns[index]
            poll = max(0, polled(counters) - self.stopped_polling_ns[index])
            blocked = max(0, counters.block_ns - stopped_spinblocking)
            if counters.in_call:
                # The record counts a call's time when it returns; until then, estimate it from its start
                # (since the rank last resumed), in the rank's wait mode: the totals correct themselves when
                # the call returns.
                since = max(counters.enter_ns, self.resumed_ns[index])
                running = max(0, (paused[0] if paused else now_ns) - since)
                if self.modes[index] == WAIT_SPINBLOCK:
                    blocked += running
                else:
                    poll += running
        stopped = self.stopped_all_ns[index] + (now_ns - paused[0] if paused else 0)
        cpu, queued = schedstat
        return Snapshot(
            wall=now_ns - self.start_ns[index],
            cpu=cpu,
            queued=queued,
            poll=poll,
            blocked=blocked,
            stopped=stopped,
        )

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
            stopped_ns=self.stopped_ns[index],
            stopped_polling_ns=self.stopped_polling_ns[index],
        )


class Gone:
    """What :meth:`Measurements.measure_rank` says of a rank that has left MPI: its MPI_Finalize returned,
    or its process has ended and its exit has not reached the node yet. Nothing is left to judge it by: its
    last slots show no communication, which would make the rank of a job that communicated all along DC at
    its very end. (None says something else: a rank that never entered MPI through the hook, which FCS takes
    for one that does not communicate.)"""


GONE = Gone()


class Measurements(Protocol):
    """What the node core needs of its ranks' measurements. The daemon's :class:`Monitor` reads mpihook's
    records and /proc; a test or a simulator can answer with numbers. Ranks are named by (job id, record
    index), the index being the rank's position among the job's slots on this node."""

    spin_ns: int

    def create(self, job_id: int, name: str, ranks: list[int], uid: int, gid: int) -> bool:
        """Make the job's record segment before its ranks start, every rank polling; False if it cannot."""
        ...

    def attach(self, job_id: int, name: str, ranks: list[int]) -> bool:
        """Measure a re-adopted job again from its segment, every rank polling; False if it cannot."""
        ...

    def watches(self, job_id: int) -> bool:
        """Whether the job is measured."""
        ...

    def started(self, job_id: int, pids: dict[int, int]) -> None: ...

    def backdate(self, job_id: int, starts: dict[int, int]) -> None:
        """Re-adopted ranks started at these kernel start times (clock ticks since boot), not now."""
        ...

    def remove(self, job_id: int) -> None:
        """The job's ranks are gone: drop its segment and its name."""
        ...

    def sample(self) -> None:
        """Read every job's records: the end of a time slice."""
        ...

    def set_wait(self, job_id: int, index: int, spin_block: bool) -> None: ...

    def switched(self, job_id: int, index: int, running: bool) -> None: ...

    def snapshot(self, job_id: int, index: int) -> Snapshot | None: ...

    def measure_rank(self, job_id: int, index: int) -> Measurement | Gone | None: ...

    def reset_rank(self, job_id: int, index: int) -> None: ...

    def stats(self, job_id: int) -> list[RankStats]: ...


class Monitor:
    """Every job of the node that runs under mpihook: :class:`Measurements` from its records and /proc."""

    def __init__(self, processes: Processes, node: str, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.clock = clock  # CLOCK_MONOTONIC, the hook's clock; a simulator passes its own
        self.os = processes
        self.node = node
        self.jobs: dict[int, JobMonitor] = {}
        self.spin_ns = 120_000  # T_spin for ranks told to spin-block (the MM's FCS parameters say)

    def add(self, job_id: int, segment: HookSegment, ranks: list[int]) -> None:
        self.jobs[job_id] = JobMonitor(segment, ranks, self.clock)

    def create(self, job_id: int, name: str, ranks: list[int], uid: int, gid: int) -> bool:
        try:
            segment = HookSegment.create(name, job_id, len(ranks), uid, gid)
        except (OSError, ValueError) as exc:
            log.warning("job %d: no mpihook statistics: %s", job_id, exc)
            return False
        for index in range(len(ranks)):
            segment.set_wait(index, WAIT_POLL, self.spin_ns)
        self.add(job_id, segment, ranks)
        return True

    def attach(self, job_id: int, name: str, ranks: list[int]) -> bool:
        try:
            segment = HookSegment.attach(name)
            for index in range(segment.nranks):
                segment.set_wait(index, WAIT_POLL, self.spin_ns)
        except (OSError, ValueError) as exc:
            log.warning("job %d: no mpihook statistics after the restart: %s", job_id, exc)
            return False
        self.add(job_id, segment, ranks)
        return True

    def watches(self, job_id: int) -> bool:
        return job_id in self.jobs

    def backdate(self, job_id: int, starts: dict[int, int]) -> None:
        """Profiles count wall time from each rank's real start, as its CPU time does (not from now)."""
        watched = self.jobs.get(job_id)
        if watched is None:
            return
        boot_now, mono_now = time.clock_gettime_ns(time.CLOCK_BOOTTIME), time.monotonic_ns()
        tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        for rank, start in starts.items():
            if rank in watched.ranks:
                watched.start_ns[watched.ranks.index(rank)] = mono_now - max(0, boot_now - start * tick)

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.pids = {job.ranks.index(rank): pid for rank, pid in pids.items() if rank in job.ranks}
            now = self.clock()
            for index in job.pids:
                job.start_ns[index] = now

    def remove(self, job_id: int) -> None:
        """The job's ranks are gone: drop its segment and its name."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            job.segment.close()
            job.segment.unlink()

    def sample(self) -> None:
        for job in self.jobs.values():
            self._sample(job)

    def _sample(self, job: JobMonitor) -> None:
        for index in job.sample():
            pid = job.pids.get(index)
            job.reset(index, self.os.cpu_ns(pid) if pid else None)

    def set_wait(self, job_id: int, index: int, spin_block: bool) -> None:
        """Tell one rank (by record index) to busy-poll or to spin-block in its blocking calls."""
        job = self.jobs.get(job_id)
        mode = WAIT_SPINBLOCK if spin_block else WAIT_POLL
        if job is not None and job.modes[index] != mode:
            job.segment.set_wait(index, mode, self.spin_ns)
            job.modes[index] = mode

    def switched(self, job_id: int, index: int, running: bool) -> None:
        """Time slicing stopped or continued one rank of the job."""
        job = self.jobs.get(job_id)
        if job is not None:
            if running and not job.sampled_since_stop(index):
                self._sample(job)  # continued without a heartbeat's sample since it was stopped
            now = self.clock()
            if running:
                job.resume(index, now)
            else:
                job.pause(index, now)

    def snapshot(self, job_id: int, index: int) -> Snapshot | None:
        """The rank's profile so far (one /proc read); None if it is not running (yet, or any more)."""
        job = self.jobs.get(job_id)
        pid = None if job is None else job.pids.get(index)
        stat = self.os.schedstat(pid) if pid else None
        if job is None or stat is None:
            return None
        return job.snapshot(index, stat, self.clock())

    def measure_rank(self, job_id: int, index: int) -> Measurement | Gone | None:
        """The rank's measurement since its last reset (reads its CPU time from the kernel); GONE once it
        has left MPI (see :class:`Gone`), None if it never entered MPI through the hook."""
        job = self.jobs.get(job_id)
        pid = None if job is None else job.pids.get(index)
        if job is None or not pid:
            return None
        counters = job.latest[index]
        if counters is not None and counters.flags & FINALIZED:
            return GONE
        cpu_ns = self.os.cpu_ns(pid)
        return GONE if cpu_ns is None else job.measure(index, cpu_ns)

    def reset_rank(self, job_id: int, index: int) -> None:
        job = self.jobs.get(job_id)
        pid = None if job is None else job.pids.get(index)
        if job is not None and pid:
            job.reset(index, self.os.cpu_ns(pid))

    def stats(self, job_id: int) -> list[RankStats]:
        """The job's ranks as ``storm stats`` shows them (reads each rank's CPU time from the kernel)."""
        job = self.jobs.get(job_id)
        if job is None:
            return []
        result = []
        now_ns = self.clock()
        for index, rank in enumerate(job.ranks):
            pid = job.pids.get(index, 0)
            counters = job.latest[index]
            in_call = bool(counters and counters.active and counters.in_call and counters.call_name)
            flags = counters.flags if counters is not None else 0
            measurement = job.measure(index, self.os.cpu_ns(pid) if pid else None)
            mode = job.modes[index]
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
                    granularity=measurement.granularity if measurement and measurement.c_comm else None,
                    calls=counters.calls if counters else 0,
                    wait_mode="spin-block" if mode == WAIT_SPINBLOCK else "poll",
                    call=counters.call_name if in_call and counters else "",
                    call_time=max(0, now_ns - counters.enter_ns) / 1e9 if in_call and counters else 0.0,
                    thread_multiple=bool(flags & THREAD_MULTIPLE),
                    collectives_poll=bool(flags & COLLECTIVES_POLL),
                )
            )
        return result
