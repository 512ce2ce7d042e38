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

On a torus machine (``Machine.torus``) the state holds a TorusState and its passes are storm-mm's torus
schedulers (mm/torus_scheduler.py); the MIGRATION_POLICIES, the simulator's alone, add the paper's migration
to them: a pass's moves take the jobs' ranks to their new PEs, and each moved job stops for the migration
cost (its end and limit move later; the events already on the heap are skipped when they come). Every run
also integrates the free units and those no queued job asks for between instants, for the BlueGene/L
paper's capacity split (engine.Capacity), which must add up to 1 (an InvariantError otherwise).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

from storm.mm.matrix import Matrix
from storm.mm.schedule_state import ScheduleState
from storm.mm.scheduler import Move
from storm.mm.torus_scheduler import Migration
from storm.mm.torus_state import TorusLayout, TorusState
from storm.tools.sim.engine import (
    END,
    LIMIT,
    SUBMIT,
    Capacity,
    Machine,
    Migrations,
    Outcome,
    RunResult,
    backfill_of,
    kill_time,
    merged,
)
from storm.tools.sim.nodes import InvariantError
from storm.tools.sim.swf import Workload

COMPLETED, TIMEOUT = "COMPLETED", "TIMEOUT"


class FastEngine:
    """One simulated run of ``workload`` on ``machine`` under ``policy`` (engine.backfill_of says which
    policies a machine takes).

    ``seed`` is recorded only: nothing here draws a random number (the Controller's kvsnames are not made).
    On a torus, the MIGRATION_POLICIES migrate (the pass's moves), and each migrated job stops for
    ``migration_cost`` seconds: its end and its time limit move that much later.
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
        migration_cost: float = 0.0,
    ) -> None:
        backfill, migrates = backfill_of(policy, machine)  # refuses what the machine does not take
        if not (migration_cost >= 0 and math.isfinite(migration_cost)):
            raise ValueError(f"migration_cost must be >= 0 seconds, not {migration_cost}")
        self.workload = workload
        self.machine = machine
        self.simulated = merged(machine) if merge_nodes else machine
        self.policy = policy
        self.seed = seed
        self.progress = progress
        self.migration_cost = migration_cost
        matrix = Matrix(1)
        for index in range(self.simulated.nodes):
            matrix.add_node(f"n{index}", self.simulated.pes_per_node)
        self.torus: TorusState | None = None
        if machine.torus is not None:
            self.torus = TorusState(TorusLayout.numbered(machine.torus))
        migration = Migration() if migrates else None
        self.state = ScheduleState(matrix, backfill, self.torus, migration)
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
        self._reset()
        heap = self.heap = []
        if jobs:
            heap.append((jobs[0].submit, SUBMIT, 0))
        events = passes = 0
        # The capacity split (engine.Capacity), integrated between instants: free units, and of them those
        # no queued job asks for.
        free_time = unused_time = 0.0
        queued_units = 0
        last = jobs[0].submit if jobs else 0.0
        progress = self.progress
        while heap:
            now = heap[0][0]
            if self.done < count:  # past the last end only superseded events are left (see _end)
                free = self._free_units()
                free_time += free * (now - last)
                unused_time += max(0, free - queued_units) * (now - last)
                last = now
            due = False
            while heap and heap[0][0] == now:
                _, kind, index = heapq.heappop(heap)
                events += 1
                if kind == SUBMIT:
                    job = jobs[index]
                    state.enqueue(index + 1, job.procs, job.limit)
                    queued_units += self.wanted[index]
                    if index + 1 < count:
                        heapq.heappush(heap, (jobs[index + 1].submit, SUBMIT, index + 1))
                    due = True
                elif self._end(index, kind, now) or kind == LIMIT:
                    due = True  # PEs were freed; and storm-mm's tick makes a pass due whatever it finds
            if due:
                passes += 1
                if queued:
                    plan = state.run_pass(now)
                    if plan.moves:
                        self._moves(plan.moves)
                    for start in plan.starts:
                        index = start.job_id - 1
                        queued_units -= self.wanted[index]
                        held = start.box.volume if start.box is not None else len(start.placement.pes)
                        self._start(index, start.placement.pes, held, now)
            if progress is not None:
                progress(self.done, now)
        wall = time.perf_counter() - started
        simulated = self.simulated if self.simulated != self.machine else None
        outcomes = self._outcomes()
        return RunResult(
            outcomes, self.machine, self.policy, self.seed, wall, events, passes, simulated,
            capacity=self._capacity(free_time, unused_time), migrations=self._migrations(),
        )  # fmt: skip

    def _reset(self) -> None:
        """Per-job records of a run, in workload order."""
        jobs = self.workload.jobs
        count = len(jobs)
        self.starts = [math.nan] * count
        self.ends = [math.nan] * count
        self.states = [""] * count
        self.busy = {}
        self.holding: dict[int, tuple[tuple[str, int], ...]] = {}  # index -> the PEs its ranks hold
        self.held = [0] * count  # units (torus nodes, or PEs) each job held
        self.paused = [0.0] * count  # seconds migrations stopped each job
        self.due = [math.inf] * count  # when each job's END (its runtime over) is due
        self.killed_at = [math.inf] * count  # when each job's LIMIT is due
        self.wanted = [self._wanted(job.procs) for job in jobs]

    def _wanted(self, procs: int) -> int:
        """The units a queued job of ``procs`` ranks asks for: its box's nodes on a torus, else PEs."""
        if self.torus is None:
            return procs
        rounded = self.torus.torus.round_size(procs)
        return procs if rounded is None else rounded

    def _free_units(self) -> int:
        if self.torus is not None:
            return self.torus.torus.nodes - self.torus.taken.bit_count()
        return self.state.matrix.free_pes(0)

    def _start(self, index: int, pes: tuple[tuple[str, int], ...], held: int, now: float) -> None:
        """A pass started job ``index`` (of the workload) on ``pes``: check it, put its end on the heap."""
        job = self.workload.jobs[index]
        if now < job.submit:
            raise InvariantError(f"job {index + 1} starts at {now}, before its submission ({job.submit})")
        self._claim(index, pes)
        self.starts[index] = now
        self.held[index] = held
        self.due[index] = now + job.runtime
        heapq.heappush(self.heap, (self.due[index], END, index))
        if job.runtime > job.limit:
            self.killed_at[index] = kill_time(now, job.limit)
            heapq.heappush(self.heap, (self.killed_at[index], LIMIT, index))

    def _claim(self, index: int, pes: tuple[tuple[str, int], ...]) -> None:
        busy = self.busy
        taken = busy.keys() & pes
        if taken:
            node, pe = min(taken)
            holder = busy[(node, pe)]
            raise InvariantError(f"job {index + 1} placed on {node}:{pe}, where job {holder} still runs")
        busy.update(dict.fromkeys(pes, index + 1))
        self.holding[index] = pes

    def _moves(self, moves: tuple[Move, ...]) -> None:
        """Migration moved running jobs (a job's new PEs may be another's old ones: all leave, then all
        arrive); each stops for the migration cost."""
        busy = self.busy
        for move in moves:
            index = move.job_id - 1
            if self.states[index] or math.isnan(self.starts[index]):
                raise InvariantError(f"job {index + 1} migrated while not running")
            for pe in self.holding.pop(index):
                del busy[pe]
        cost = self.migration_cost
        for move in moves:
            index = move.job_id - 1
            self._claim(index, move.placement.pes)
            if cost > 0:
                # Its end and its limit move later; the events already on the heap are skipped (see _end).
                self.paused[index] += cost
                self.due[index] += cost
                heapq.heappush(self.heap, (self.due[index], END, index))
                if math.isfinite(self.killed_at[index]):
                    self.killed_at[index] += cost
                    heapq.heappush(self.heap, (self.killed_at[index], LIMIT, index))

    def _end(self, index: int, kind: int, now: float) -> bool:
        """Job ``index``'s runtime (END) or limit (LIMIT) is over: it ends, unless it ended already or the
        event is one a migration moved later."""
        if self.states[index]:
            return False  # killed at its limit before its runtime was over
        if now != (self.due[index] if kind == END else self.killed_at[index]):
            return False  # superseded: a migration stopped the job and moved this event later
        self.states[index] = TIMEOUT if kind == LIMIT else COMPLETED
        self.ends[index] = now
        placement = self.state.end(index + 1)
        if placement is None:
            raise InvariantError(f"job {index + 1} ended without holding PEs")
        busy = self.busy
        for pe in self.holding.pop(index):
            del busy[pe]
        self.done += 1
        return True

    def _capacity(self, free_time: float, unused_time: float) -> Capacity | None:
        """engine.Capacity from the integrals of the run; InvariantError unless the three shares add up to
        1, which holds only if the free units the scheduler's state showed at every instant are the machine
        less what the jobs' records say they held."""
        jobs = self.workload.jobs
        if not jobs:
            return None
        units = self.torus.torus.nodes if self.torus is not None else self.simulated.pes
        span = max(self.ends) - jobs[0].submit
        if span <= 0:
            return None
        work = held = 0.0
        for i, job in enumerate(jobs):
            ran = self.ends[i] - self.starts[i]
            work += job.procs * (ran - self.paused[i])
            held += self.held[i] * ran
        whole = units * span
        utilized, unused = work / whole, unused_time / whole
        lost = (free_time - unused_time + held - work) / whole
        if abs(utilized + unused + lost - 1) > 1e-9:
            raise InvariantError(
                f"capacity utilized {utilized:.12f} + unused {unused:.12f} + lost {lost:.12f} != 1: the free "
                "units the scheduler showed differ from what the jobs held"
            )
        return Capacity(utilized, unused, lost, units, span)

    def _migrations(self) -> Migrations | None:
        if self.state.migration is None or self.torus is None:
            return None
        t = self.torus
        return Migrations(t.migrations, t.migrated, t.jobs_moved, self.migration_cost)

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
