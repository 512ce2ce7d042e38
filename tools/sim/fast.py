"""``storm sim``'s fast engine: storm-mm's scheduling state and passes, without the job records around them.

Like Cobalt's Qsim, which replays a workload through the production scheduler component rather than the
whole daemon, this engine drives the :class:`~storm.mm.schedule_state.ScheduleState` that storm-mm's
RunTable owns: the same queue, the same running jobs, the same Ousterhout matrix, the same scheduling pass
(mm/scheduler.py). What it leaves out is what decides nothing in a batch replay: job records and their
store, kvsnames, launch messages, node managers' reports. That is worth about six times the speed
(tools/bench_sim.py), and ``--core mm`` (tools/sim/engine.py, the whole Controller with simulated node
managers) stays for checking: tests/test_sim_cores.py has both decide the same start, end and state for
every job on random workloads under every policy, time limits exceeded included.

What must match the Controller-driven run, and why it does:

- Events at an instant, in the order (time, kind, job) of engine.py: ends, then time limits, then
  arrivals; a pass after all of them when one is due. A pass is due when storm-mm's would be: after a
  submission, after a job's end (it frees PEs), after a time-limit check (a tick always makes one due:
  backfilling depends on the time). A pass with nothing queued changes nothing and costs nothing.
- A job's id is its place in the submissions (1, 2, ...), as the store numbers them.
- A job over its limit is killed at the first representable instant after start + limit, as storm-mm's
  tick kills a job that ran *more* than its limit; it ends TIMEOUT there. Others end COMPLETED at start +
  runtime (a job that ends exactly at its limit completes).

The same invariants as the simulated node managers check are checked here, on the placements the passes
make: a PE holds at most one job at a time, no job starts before it arrives, every job ends.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

from storm.mm.matrix import Matrix
from storm.mm.schedule_state import ScheduleState
from storm.tools.sim.engine import (
    END,
    LIMIT,
    SUBMIT,
    Machine,
    Outcome,
    RunResult,
    kill_time,
    merged,
    mm_config,
)
from storm.tools.sim.nodes import InvariantError
from storm.tools.sim.swf import Workload

COMPLETED, TIMEOUT = "COMPLETED", "TIMEOUT"


class FastEngine:
    """One simulated run of ``workload`` on ``machine`` under ``policy`` (a key of engine.POLICIES).

    ``seed`` is recorded only: nothing here draws a random number (the Controller's kvsnames are not made).
    """

    def __init__(
        self,
        workload: Workload,
        machine: Machine,
        policy: str = "easy",
        seed: int = 0,
        progress: Callable[[int, float], None] | None = None,
        *,
        merge_nodes: bool = True,
    ) -> None:
        config = mm_config(policy)  # refuses an unknown policy as the other engine does
        self.workload = workload
        self.machine = machine
        self.simulated = merged(machine) if merge_nodes else machine
        self.policy = policy
        self.seed = seed
        self.progress = progress
        matrix = Matrix(config.mpl)
        for index in range(self.simulated.nodes):
            matrix.add_node(f"n{index}", self.simulated.pes_per_node)
        self.state = ScheduleState(matrix, config.backfill)
        self.heap: list[tuple[float, int, int]] = []  # (time, kind, workload index): engine.EVENT_ORDER
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.states: list[str] = []  # "" while the job has not ended
        self.busy: dict[tuple[str, int], int] = {}  # (node, PE) -> the job holding it
        self.done = 0

    def run(self) -> RunResult:
        started = time.perf_counter()
        jobs = self.workload.jobs
        count = len(jobs)
        state = self.state
        queued = state.queued
        self.starts = [math.nan] * count
        self.ends = [math.nan] * count
        self.states = [""] * count
        self.busy = {}
        heap = self.heap = []
        if jobs:
            heap.append((jobs[0].submit, SUBMIT, 0))
        events = passes = 0
        progress = self.progress
        while heap:
            now = heap[0][0]
            due = False
            while heap and heap[0][0] == now:
                _, kind, index = heapq.heappop(heap)
                events += 1
                if kind == SUBMIT:
                    job = jobs[index]
                    state.enqueue(index + 1, job.procs, job.limit)
                    if index + 1 < count:
                        heapq.heappush(heap, (jobs[index + 1].submit, SUBMIT, index + 1))
                    due = True
                elif self._end(index, kind, now) or kind == LIMIT:
                    due = True  # PEs were freed; and storm-mm's tick makes a pass due whatever it finds
            if due:
                passes += 1
                if queued:
                    for start in state.run_pass(now).starts:
                        self._start(start.job_id - 1, start.placement.pes, now)
            if progress is not None:
                progress(self.done, now)
        wall = time.perf_counter() - started
        simulated = self.simulated if self.simulated != self.machine else None
        return RunResult(
            self._outcomes(), self.machine, self.policy, self.seed, wall, events, passes, simulated
        )

    def _start(self, index: int, pes: tuple[tuple[str, int], ...], now: float) -> None:
        """A pass started job ``index`` (of the workload) on ``pes``: check it, put its end on the heap."""
        job = self.workload.jobs[index]
        if now < job.submit:
            raise InvariantError(f"job {index + 1} starts at {now}, before its submission ({job.submit})")
        busy = self.busy
        taken = busy.keys() & pes
        if taken:
            node, pe = min(taken)
            holder = busy[(node, pe)]
            raise InvariantError(f"job {index + 1} placed on {node}:{pe}, where job {holder} still runs")
        busy.update(dict.fromkeys(pes, index + 1))
        self.starts[index] = now
        heapq.heappush(self.heap, (now + job.runtime, END, index))
        if job.runtime > job.limit:
            heapq.heappush(self.heap, (kill_time(now, job.limit), LIMIT, index))

    def _end(self, index: int, kind: int, now: float) -> bool:
        """Job ``index``'s runtime (END) or limit (LIMIT) is over: it ends, unless it ended already."""
        if self.states[index]:
            return False  # killed at its limit before its runtime was over
        self.states[index] = TIMEOUT if kind == LIMIT else COMPLETED
        self.ends[index] = now
        placement = self.state.end(index + 1)
        if placement is None:
            raise InvariantError(f"job {index + 1} ended without holding PEs")
        busy = self.busy
        for pe in placement.pes:
            del busy[pe]
        self.done += 1
        return True

    def _outcomes(self) -> list[Outcome]:
        """Every job's outcome, after checking the run's end invariants."""
        state = self.state
        if state.queued or state.running or self.busy:
            raise InvariantError(
                f"jobs left at the end: {len(state.queued)} queued, {len(state.running)} placed"
            )
        outcomes = []
        for job in self.workload.jobs:
            i = job.index
            if not self.states[i]:
                raise InvariantError(f"job {job.number} of the trace never ended")
            outcomes.append(Outcome(job, i + 1, self.starts[i], self.ends[i], self.states[i]))
        return outcomes
