"""The context switch on one node: stop the ranks of every job outside the active row, continue the others.

A whole job's local ranks are stopped or continued together, each rank by its process group (which holds
whatever the rank forked). Stops go out before continues, so that two jobs never run on one PE on purpose.
Signals are asynchronous: a switch has taken effect when /proc shows every stopped rank in state 'T' and no
continued one in it. How long that takes, from the heartbeat's arrival, is recorded for ``storm nodes`` and
for the benchmarks, which can also ask for one trace line per heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from storm.nm.gang import runnable
from storm.nm.processes import Processes

log = logging.getLogger("storm.nm")

VERIFY_POLL = 0.0005
VERIFY_LIMIT = 0.5
SAMPLES = 1000


@dataclass
class SwitchedJob:
    row: int
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid of the ranks still alive
    running: bool = True


class ContextSwitcher:
    def __init__(
        self,
        processes: Processes,
        trace: TextIO | None = None,
        on_switch: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.os = processes
        self.on_switch = on_switch  # told (job id, running) whenever a job is stopped or continued
        self.jobs: dict[int, SwitchedJob] = {}
        self.active: int | None = None
        self.trace = trace
        self.durations: deque[float] = deque(maxlen=SAMPLES)  # seconds from arrival to effect
        self.switches = 0
        self._verifying: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------------- jobs

    def add(self, job_id: int, row: int) -> None:
        self.jobs[job_id] = SwitchedJob(row=row)

    def set_row(self, job_id: int, row: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.row = row

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        """The job's ranks exist: put them in the state the current slice wants at once."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.pids = dict(pids)
        job.running = True
        if not runnable({job_id: job.row}, self.active)[job_id]:
            self._signal(job, signal.SIGSTOP)
            job.running = False
            self._told(job_id, running=False)

    def rank_gone(self, job_id: int, rank: int) -> None:
        """A rank ended: never signal its process group again (its number may be reused)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.pids.pop(rank, None)

    def remove(self, job_id: int) -> None:
        """The job is over or being killed: it is no longer switched (the kill continues it first)."""
        self.jobs.pop(job_id, None)

    # ------------------------------------------------------------------------------------------- switching

    def switch(self, active: int | None, *, seq: int = -1, sent: float | None = None) -> None:
        """Make ``active`` the running row (None: every job runs), and check that it took effect."""
        received = time.time()
        self.active = active
        wanted = runnable({job_id: job.row for job_id, job in self.jobs.items()}, active)
        stop = [job for job_id, job in self.jobs.items() if job.running and not wanted[job_id]]
        cont = [job for job_id, job in self.jobs.items() if not job.running and wanted[job_id]]
        for job_id, job in self.jobs.items():
            if job in stop:
                self._signal(job, signal.SIGSTOP)
                job.running = False
                self._told(job_id, running=False)
        for job_id, job in self.jobs.items():
            if job in cont:
                self._signal(job, signal.SIGCONT)
                job.running = True
                self._told(job_id, running=True)
        expected = {pid: False for job in stop for pid in job.pids.values()}
        expected.update({pid: True for job in cont for pid in job.pids.values()})
        if not expected:
            self._record(seq, active, sent, received, received, ranks=0)
            return
        self.switches += 1
        if self._verifying is not None and not self._verifying.done():
            self._verifying.cancel()  # a newer switch supersedes the check of the last one
        self._verifying = asyncio.get_running_loop().create_task(
            self._verify(expected, seq, active, sent, received)
        )

    def _told(self, job_id: int, *, running: bool) -> None:
        if self.on_switch is not None:
            self.on_switch(job_id, running)

    def _signal(self, job: SwitchedJob, sig: int) -> None:
        for pid in job.pids.values():
            self.os.signal_group(pid, sig)

    async def _verify(
        self, expected: dict[int, bool], seq: int, active: int | None, sent: float | None, received: float
    ) -> None:
        deadline = received + VERIFY_LIMIT
        pending = dict(expected)
        while pending:
            states = self.os.states(list(pending))
            for pid, running in list(pending.items()):
                state = states.get(pid)
                if state is None or state == "Z" or (state == "T") != running:
                    del pending[pid]  # gone, or in the wanted state
            if pending:
                if time.time() > deadline:
                    log.warning("context switch %d: %d rank(s) not yet in their new state", seq, len(pending))
                    break
                await asyncio.sleep(VERIFY_POLL)
        done = time.time()
        self.durations.append(done - received)
        self._record(seq, active, sent, received, done, ranks=len(expected))

    def _record(
        self, seq: int, active: int | None, sent: float | None, received: float, done: float, *, ranks: int
    ) -> None:
        """One trace line: seq row sent received done ranks (row -1: every job runs)."""
        if self.trace is not None and seq >= 0:
            row = -1 if active is None else active
            self.trace.write(f"{seq} {row} {sent or 0.0:.6f} {received:.6f} {done:.6f} {ranks}\n")

    def stats(self) -> tuple[int, float, float]:
        """Switches so far, and the median and 99th percentile of their duration in milliseconds."""
        if not self.durations:
            return self.switches, 0.0, 0.0
        ms = sorted(d * 1000 for d in self.durations)
        return self.switches, statistics.median(ms), ms[min(len(ms) - 1, int(0.99 * len(ms)))]
