"""A fixed-step reference of the node model (node.py), slow and plain, to hold the event-driven model to.

Time moves in steps of ``dt_ns``. In each step every PE first pays what is left of its context switch, then
shares the rest among its competing processes by nice weight, exactly as node.py's fluid scheduler does;
a process that finishes its computation or wake-up in the middle of a step wastes the rest of its share.
At the end of every step each process takes every phase change that is due, looking only at the clock and
at the times ranks began their steps (kept whole, per rank and step). So every change the event-driven
model makes at an instant t happens here at the first step boundary at or after t: later by less than
``dt_ns``. That lag, added up along a chain of dependent changes, is what the tests allow between the two.

Cost: O(steps x processes), with no heap and no analytic shortcut. Meant for small cases only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from storm.tools.sim.cosched.node import (
    NO_COSTS,
    RUNNABLE,
    Control,
    Costs,
    PeCounters,
    Phase,
    ProcessCounters,
    ProcessKey,
    WaitMode,
    nice_weight,
)
from storm.tools.sim.cosched.program import Program


@dataclass
class _Rank:
    job: int
    rank: int
    pe: int
    control: Control
    phase: Phase = Phase.COMPUTE
    remaining: int = 0
    step: int = 0
    mode: WaitMode = WaitMode.POLL
    spin_deadline: int = 0
    block_from: int | None = None
    counters: ProcessCounters = field(default_factory=ProcessCounters)


@dataclass
class _SteppedJob:
    program: Program
    keys: list[ProcessKey]
    began: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, step) -> when
    finished: int = 0
    completion_ns: int | None = None


class SteppedModel:
    """The same model as :class:`~storm.tools.sim.cosched.node.CoschedModel`, the same calls, in fixed steps.
    Every time passed in must fall on a step boundary."""

    def __init__(self, pes: int, costs: Costs = NO_COSTS, dt_ns: int = 1_000_000, start_ns: int = 0) -> None:
        self.costs = costs
        self.dt = dt_ns
        self.now = start_ns
        self._start = start_ns
        self._ranks: dict[ProcessKey, _Rank] = {}
        self._jobs: dict[int, _SteppedJob] = {}
        self._switch_until = [start_ns] * pes
        self._pe = [PeCounters() for _ in range(pes)]

    def add_job(
        self, now: int, job_id: int, program: Program, placement: Sequence[int], control: Control = RUNNABLE
    ) -> None:
        if program.io_ns:
            raise ValueError("the stepped reference has no I/O phase (Program.io_ns): only node.py models it")
        self.advance(now)
        keys = [(job_id, rank) for rank in range(program.ranks)]
        self._jobs[job_id] = _SteppedJob(program, keys)
        for (job, rank), pe in zip(keys, placement, strict=True):
            self._ranks[job, rank] = _Rank(job, rank, pe, control, remaining=program.compute_ns[rank])
        self._settle(now)

    def control(self, now: int, key: ProcessKey, control: Control) -> None:
        self.advance(now)
        r = self._ranks[key]
        changed = r.control.stopped != control.stopped and r.phase is not Phase.DONE
        r.control = control
        others = [o for o in self._ranks.values() if o.pe == r.pe and o.phase is not Phase.DONE]
        if changed and any(not o.control.stopped for o in others):
            self._switch_until[r.pe] = now + self.costs.switch_ns
        self._settle(now)

    def advance(self, until: int) -> None:
        if (until - self._start) % self.dt:
            raise ValueError(f"{until} is not on a step boundary")
        while self.now < until:
            self._step()
            self.now += self.dt
            self._settle(self.now)

    def counters(self, key: ProcessKey) -> ProcessCounters:
        return replace(self._ranks[key].counters)

    def pe_counters(self, pe: int) -> PeCounters:
        return self._pe[pe]

    def completion_ns(self, job_id: int) -> int | None:
        return self._jobs[job_id].completion_ns

    def run_until_done(self, limit_ns: int, jobs: Iterable[int] | None = None) -> None:
        watched = [self._jobs[j] for j in jobs] if jobs is not None else list(self._jobs.values())
        while self.now < limit_ns and any(j.completion_ns is None for j in watched):
            self.advance(self.now + self.dt)

    def _step(self) -> None:
        for pe in range(len(self._pe)):
            here = [r for r in self._ranks.values() if r.pe == pe and r.phase is not Phase.DONE]
            switching = min(self.dt, max(0, self._switch_until[pe] - self.now))
            eff = self.dt - switching
            busy = spin = wake = 0
            for r in here:
                if r.control.stopped:
                    r.counters.stopped_ns += self.dt
                elif r.phase is Phase.BLOCKED:
                    r.counters.blocked_ns += self.dt
            competing = [
                r for r in here
                if not r.control.stopped and r.phase in (Phase.COMPUTE, Phase.WAIT, Phase.WAKING)
            ]  # fmt: skip
            total = sum(nice_weight(r.control.nice) for r in competing)
            for r in competing:
                share = eff * nice_weight(r.control.nice) // total
                if r.phase is Phase.WAIT:
                    r.counters.poll_ns += share
                    spin += share
                    continue
                used = min(share, r.remaining)
                r.remaining -= used
                if r.phase is Phase.COMPUTE:
                    r.counters.compute_ns += used
                    busy += used
                else:
                    r.counters.wakeup_cpu_ns += used
                    wake += used
            old = self._pe[pe]
            self._pe[pe] = PeCounters(
                busy_ns=old.busy_ns + busy,
                spin_ns=old.spin_ns + spin,
                switch_ns=old.switch_ns + switching + wake,
                idle_ns=old.idle_ns + eff - busy - spin - wake,
            )

    def _ready(self, r: _Rank) -> int | None:
        """When the messages of r's current step are all in, if every partner has begun that step."""
        job = self._jobs[r.job]
        partners = job.program.partners(r.rank)
        if not partners:
            return job.began.get((r.rank, r.step))
        times = [job.began.get((p, r.step)) for p in partners]
        if any(t is None for t in times):
            return None
        return max(t for t in times if t is not None) + job.program.latency_ns

    def _settle(self, now: int) -> None:
        """Every phase change due at ``now``, repeated until none is left (a change can make another due)."""
        changed = True
        while changed:
            changed = False
            for r in self._ranks.values():
                changed |= self._change(r, now)

    def _change(self, r: _Rank, now: int) -> bool:
        job = self._jobs[r.job]
        c = r.counters
        if r.phase is Phase.COMPUTE and r.remaining <= 0:
            if not job.program.communicates:
                self._iteration_done(r, now)
                return True
            r.phase, r.mode, r.block_from = Phase.WAIT, r.control.wait, None
            r.spin_deadline = now + r.control.spin_ns
            c.in_call, c.enter_ns = True, now
            job.began[r.rank, r.step] = now
            return True
        ready = self._ready(r) if r.phase in (Phase.WAIT, Phase.BLOCKED) else None
        arrived = ready is not None and ready <= now
        if r.phase is Phase.WAIT and not r.control.stopped:
            if arrived:
                self._return(r, now)
                return True
            if r.mode is WaitMode.SPIN_BLOCK and r.spin_deadline <= now:
                r.phase, r.block_from = Phase.BLOCKED, now
                return True
        if r.phase is Phase.BLOCKED and not r.control.stopped and arrived:
            r.phase, r.remaining = Phase.WAKING, self.costs.wakeup_ns
            r.counters.wakeups += 1
            return True
        if r.phase is Phase.WAKING and r.remaining <= 0:
            self._return(r, now)
            return True
        return False

    def _return(self, r: _Rank, now: int) -> None:
        c = r.counters
        if r.mode is WaitMode.SPIN_BLOCK:
            c.spin_ns += (now if r.block_from is None else r.block_from) - c.enter_ns
            c.block_ns += 0 if r.block_from is None else now - r.block_from
        c.events += 1
        c.calls += 1
        c.comm_ns += now - c.enter_ns
        c.in_call, c.exit_ns = False, now
        self._iteration_done(r, now)

    def _iteration_done(self, r: _Rank, now: int) -> None:
        job = self._jobs[r.job]
        r.counters.iterations += 1
        r.step += 1
        if r.step < job.program.iterations:
            r.phase, r.remaining = Phase.COMPUTE, job.program.compute_ns[r.rank]
            return
        r.phase = Phase.DONE
        r.counters.done = True
        job.finished += 1
        if job.finished == job.program.ranks:
            job.completion_ns = now
