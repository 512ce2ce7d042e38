"""The node model of the coscheduling simulator: PEs shared by the processes of parallel programs.

Every process (one rank of a job, pinned to one PE) is, at any instant, in one phase:

- computing: it needs CPU to finish its iteration's computation;
- waiting in a blocking call, on the CPU: busy polling, or the spin phase of spin-block;
- blocked: the spin phase of spin-block ran out (``spin_ns`` of wall time after the call began) before the
  message came; it uses no CPU until the message arrives, then needs ``Costs.wakeup_ns`` of CPU before its
  call returns;
- in I/O (``Program.io_ns`` after each computation): no CPU, not runnable, for that much wall time;
- done, once it finished its iterations.

The outside (the node manager's core, through the simulator's driver) says per process whether it is
stopped (SIGSTOP) or runnable, its nice value, and how its blocking calls wait (``Control``). As in mpihook,
the wait mode is read when a call begins. A stopped process gets no CPU and cannot return from a call.

The local scheduler is a fluid model of CFS: the PE's time is divided among its runnable processes that are
not blocked or done, in proportion to the weights of their nice values (Linux's table); a polling waiter
takes its share as a computing process does. Whenever the outside changes which processes of a PE may run,
the PE pays a context switch (``Costs.switch_ns``) during which nobody progresses. The fluid model ignores
CFS's slices of a few milliseconds: a polling process notices its message at once even while it shares the
PE. That is what makes the model analytic. ``Costs.slice_ns`` replaces it by round-robin slices (slices.py),
on which ``Costs.local`` builds ClusterSchedSim's switch costs and dynamic coscheduling (local.py).

The model is event driven: between two events nothing changes, so every process's progress is a rate times
the time elapsed. Events are the instants where something changes: a computation or a wake-up ends (it
depends on the PE's rates, so each PE has one pending event that is replaced when its rates change), a
message arrives, a spin phase runs out, a context switch ends, or the outside changes a process's control.
Events at equal times run in the order they were scheduled, which depends only on the calls made, so a run
is deterministic. Time is integer nanoseconds; no wall clock, no randomness.

The counters a process reports are the figures storm-nm reads (mpihook's record, mpihook/stats.py, and the
kernel's CPU time, nm/monitor.py): ``events``, ``calls``, ``comm_ns``, ``spin_ns``, ``block_ns``,
``in_call``, ``enter_ns``, ``exit_ns`` as the hook counts them (a call's time counts when it returns), and
``cpu_ns`` as /proc shows it; besides the model's own breakdown (``compute_ns``, ``poll_ns``,
``wakeup_cpu_ns``, ``blocked_ns``, ``stopped_ns``), which the profile of nm/profile.py names the same way.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import replace

from storm.tools.sim.cosched import local, slices
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.cosched.records import (
    NICE_WEIGHTS,
    NO_COSTS,
    RUNNABLE,
    Control,
    Costs,
    Local,
    PeCounters,
    Phase,
    ProcessCounters,
    ProcessKey,
    Reschedule,
    WaitMode,
    _Job,
    _Pe,
    _Process,
    credit,
    nice_weight,
)

# The records are part of the model's interface: callers import them from here.
__all__ = [
    "NICE_WEIGHTS",
    "NO_COSTS",
    "RUNNABLE",
    "Control",
    "CoschedModel",
    "Costs",
    "Local",
    "PeCounters",
    "Phase",
    "ProcessCounters",
    "ProcessKey",
    "Reschedule",
    "WaitMode",
    "nice_weight",
]

# Event kinds; the heap orders events by (time, sequence number).
_PE, _ARRIVE, _SPIN, _CHECKPOINT = 0, 1, 2, 3
# A job alone is walked ahead by this many of its iterations at first, doubling to the cap: short walks
# waste little when a slice ends early, long ones keep the number of checkpoint events low.
_FIRST_CHUNK, _LAST_CHUNK = 16, 4096


class CoschedModel:
    """PEs, the processes placed on them, and their progress, advanced event by event.

    Cost: an event costs O(log E) for the heap plus O(n) for the n processes of the PE it concerns (their
    progress and the PE's next event are recomputed); reading counters is O(1) after :meth:`advance`.
    """

    def __init__(self, pes: int, costs: Costs = NO_COSTS, start_ns: int = 0, shortcut: bool = True) -> None:
        """``shortcut=False`` runs every job event by event (the reference the shortcut is tested against)."""
        if pes < 1:
            raise ValueError("a model needs at least one PE")
        self.costs = costs
        self.now = start_ns
        self._pes = [_Pe(synced_ns=start_ns, index=i) for i in range(pes)]
        self._processes: list[_Process] = []
        self._index: dict[ProcessKey, int] = {}
        self._jobs: dict[int, _Job] = {}
        self._heap: list[tuple[int, int, int, int, int]] = []
        self._seq = 0
        self._dirty: set[int] = set()  # PEs where a job may have become alone
        self.shortcut = shortcut
        self._boosts_on_arrival = costs.local is not None and costs.local.reschedule is Reschedule.DCS
        self.events_run = 0
        # True: an event at every end of a round-robin slice while others wait (the reference slices.py's
        # rounds are tested against); False: only where someone's phase changes.
        self.step_slices = False
        self.steps_jumped = 0  # iterations of jobs alone the shortcut skipped by whole periods (shortcut.py)

    # -- what the driver calls --------------------------------------------------------------------------

    def add_job(
        self, now: int, job_id: int, program: Program, placement: Sequence[int], control: Control = RUNNABLE
    ) -> None:
        """Start ``program``'s ranks at ``now``, rank r on PE ``placement[r]``, all under ``control``.
        A launch costs no context switch."""
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already in the model")
        if len(placement) != program.ranks or not all(0 <= pe < len(self._pes) for pe in placement):
            raise ValueError("the placement must name one existing PE per rank")
        self.advance(now)
        for pe in set(placement):
            self._rejoin(self._pes[pe].owner, now)
            self._sync(pe, now)
        n = program.ranks
        job = _Job(program, [], [0] * n, [[0, 0] for _ in range(n)], [0, 0], [0, 0])
        self._jobs[job_id] = job
        for rank, pe in enumerate(placement):
            index = len(self._processes)
            process = _Process(
                index, job_id, rank, pe, program.compute_ns[rank], control, nice_weight(control.nice)
            )
            process.remaining = process.compute_ns
            self._processes.append(process)
            self._index[job_id, rank] = index
            self._pes[pe].processes.append(index)
            job.processes.append(index)
        for index in job.processes:
            self._progress(self._processes[index], now)
        for pe in set(placement):
            self._reschedule(pe, now)
        self._dirty.update(placement)
        self._go_alone(now)

    def control(self, now: int, key: ProcessKey, control: Control) -> None:
        """Apply the node manager's decision for one process from ``now`` on."""
        self.advance(now)
        process = self._processes[self._index[key]]
        pe = self._pes[process.pe]
        self._rejoin(pe.owner, now)
        self._sync(process.pe, now)
        old = process.control
        process.control = control
        process.weight = nice_weight(control.nice)
        if (
            old.stopped != control.stopped
            and process.phase is not Phase.DONE
            and any(not self._processes[i].control.stopped for i in pe.processes if self._alive(i))
        ):
            pe.switch_until = max(pe.switch_until, now + self.costs.switch_ns)  # local.py's may be later
        if not control.stopped:
            self._progress(process, now)
        self._reschedule(process.pe, now)
        self._dirty.add(process.pe)
        self._go_alone(now)

    def advance(self, until: int) -> None:
        """Run every event up to ``until``; counters are brought to that instant when read (a PE's
        progress is the same whether or not it is synced in between). O(E log E + E x n) for E events and
        n processes per PE."""
        if until < self.now:
            raise ValueError(f"time runs forward: {until} < {self.now}")
        heap = self._heap
        while heap and heap[0][0] <= until:
            entry = heapq.heappop(heap)
            time, _, kind, a, _ = entry
            if self._stale(entry):
                continue
            self.events_run += 1
            if kind == _CHECKPOINT:
                job = self._jobs[a]
                self._materialize(job, time)
                if job.alone:
                    self._checkpoint(job)
            elif kind == _PE:
                here = self._pes[a]
                self._sync(a, time)
                for index in list(here.processes):
                    self._progress(self._processes[index], time)
                self._reschedule(a, time)
                if here.switch_until == time:
                    self._dirty.add(a)
            else:
                process = self._processes[a]
                self._sync(process.pe, time)
                self._progress(process, time)
                if kind == _ARRIVE:
                    local.arrived(self, process, time)
                self._reschedule(process.pe, time)
            if self._dirty and (not heap or heap[0][0] > time):
                self._go_alone(time)  # once every event of the instant has run
        self.now = until
        if self._dirty:
            self._go_alone(until)

    def _stale(self, entry: tuple[int, int, int, int, int]) -> bool:
        """An event that no longer stands: its PE's rates changed, its process moved on, is done, is stopped
        (a stopped process changes nothing until continued, and control() looks at it then) or alone."""
        _, _, kind, a, b = entry
        if kind == _PE:
            return self._pes[a].version != b
        if kind == _CHECKPOINT:
            job = self._jobs[a]
            return not job.alone or job.epoch != b
        p = self._processes[a]
        return p.step != b or p.phase is Phase.DONE or p.control.stopped or self._jobs[p.job].alone

    def counters(self, key: ProcessKey) -> ProcessCounters:
        """A copy of the process's counters now."""
        return replace(self.reading(key))

    def reading(self, key: ProcessKey) -> ProcessCounters:
        """The process's counters themselves, brought to now: read them at once, the model changes them as
        it runs. For the node manager's seams, which read a few fields every time slice (a copy each
        costs more than the read). O(1) unless its job's walk must be applied."""
        process = self._processes[self._index[key]]
        self._read(process.pe)
        return process.counters

    def pe_counters(self, pe: int) -> PeCounters:
        p = self._pes[pe]
        self._read(pe)
        return PeCounters(p.busy, p.spin, p.switch, p.idle, p.interrupt, p.switches, p.interrupts)

    def completion_ns(self, job_id: int) -> int | None:
        """When the job's last rank finished its iterations; None while it runs."""
        self._catch_up(job_id)
        return self._jobs[job_id].completion_ns

    def keys(self) -> Iterable[ProcessKey]:
        return self._index.keys()

    def next_event_ns(self) -> int | None:
        """When something next changes by itself (None: nothing will until the outside acts). O(stale)."""
        while self._heap:
            if not self._stale(self._heap[0]):
                return self._heap[0][0]
            heapq.heappop(self._heap)
        return None

    def run_until_done(self, limit_ns: int, jobs: Iterable[int] | None = None) -> None:
        """Advance event by event until every job (of ``jobs``, if given) has finished, or to ``limit_ns``."""
        watched = [self._jobs[j] for j in jobs] if jobs is not None else list(self._jobs.values())
        while any(job.completion_ns is None for job in watched):
            upcoming = self.next_event_ns()
            if upcoming is None or upcoming > limit_ns:
                self.advance(limit_ns)
                return
            self.advance(upcoming)

    # -- the shortcut: jobs alone on their PEs (shortcut.py) ----------------------------------------------

    def _go_alone(self, now: int) -> None:
        """Drop finished processes from the dirty PEs' lists, and hand every job now alone on its PEs to
        the shortcut. O(m) for the m processes on dirty PEs and the PEs of their jobs."""
        dirty, self._dirty = self._dirty, set()
        for pe in dirty:
            # A finished process stays in the model (its counters) but leaves its PE's list, which every
            # sync and rescheduling walks: kept, it would make each of them O(processes ever placed there).
            here = self._pes[pe]
            here.processes = [i for i in here.processes if self._processes[i].phase is not Phase.DONE]
        if not self.shortcut:
            return
        seen: set[int] = set()
        for pe in dirty:
            for index in self._pes[pe].processes:
                job_id = self._processes[index].job
                if job_id in seen:
                    continue
                seen.add(job_id)
                job = self._jobs[job_id]
                if self._is_alone(job, now):
                    self._detach(job_id, job, now)

    def _is_alone(self, job: _Job, now: int) -> bool:
        if job.alone or job.completion_ns is not None:
            return False
        # shortcut.py's recurrence knows no I/O phase and no local scheduler (local.py says when it holds).
        if job.program.io_ns or not local.shortcut_safe(self, job):
            return False
        for index in job.processes:
            p = self._processes[index]
            if p.phase is Phase.DONE:
                continue
            pe = self._pes[p.pe]
            if p.control.stopped or pe.switch_until > now or pe.owner is not None:
                return False
            for other in pe.processes:
                o = self._processes[other]
                if other != index and o.phase is not Phase.DONE and not o.control.stopped:
                    return False
        return True

    def _detach(self, job_id: int, job: _Job, now: int) -> None:
        for index in job.processes:
            p = self._processes[index]
            if p.phase is not Phase.DONE:
                self._sync(p.pe, now)
                pe = self._pes[p.pe]
                pe.owner = job_id
                pe.version += 1  # its pending event is the shortcut's business now
        job.alone, job.fast_ns, job.epoch = True, now, job.epoch + 1
        per_iteration = max(job.program.compute_ns) + job.program.latency_ns + self.costs.wakeup_ns + 1
        job.chunk_ns = _FIRST_CHUNK * per_iteration
        self._checkpoint(job)

    def _checkpoint(self, job: _Job) -> None:
        """Walk the job ahead by a chunk; its next event is its end if that comes first, else the chunk's."""
        from storm.tools.sim.cosched.shortcut import advance_alone, compute_left

        target = job.fast_ns + job.chunk_ns
        earliest = job.fast_ns + compute_left(self, job)
        if earliest > target:
            # It cannot end before every rank computed what it has left: no look-ahead till then, which
            # a gang slice usually ends first (the walk to the slice's end is then the only one).
            job.pending = None
            self._push(earliest, _CHECKPOINT, self._job_id(job), job.epoch)
            return
        finished, apply = advance_alone(self, job, target)
        if finished is not None:
            target = finished
            _, apply = advance_alone(self, job, target)
        last = _LAST_CHUNK * (max(job.program.compute_ns) + job.program.latency_ns + self.costs.wakeup_ns + 1)
        job.chunk_ns = min(2 * job.chunk_ns, last)
        job.pending = (target, apply)
        self._push(target, _CHECKPOINT, self._job_id(job), job.epoch)

    def _job_id(self, job: _Job) -> int:
        return self._processes[job.processes[0]].job

    def _materialize(self, job: _Job, now: int) -> None:
        """Bring a job alone to ``now``: its walk, if the checkpoint is now, else a new one. On its end it
        leaves the shortcut, and its PEs may hold a job alone."""
        from storm.tools.sim.cosched.shortcut import advance_alone

        if now > job.fast_ns:
            if job.pending is not None and job.pending[0] == now:
                job.pending[1]()
            else:
                advance_alone(self, job, now)[1]()
        job.pending = None
        if job.completion_ns is not None:
            self._leave_shortcut(job, now)

    def _read(self, pe: int) -> None:
        """Bring a PE's counters to ``now``: its job alone's walk, or its own sync."""
        owner = self._pes[pe].owner
        if owner is None:
            self._sync(pe, self.now)
        else:
            self._catch_up(owner)

    def _catch_up(self, job_id: int | None) -> None:
        if job_id is not None and self._jobs[job_id].alone:
            self._materialize(self._jobs[job_id], self.now)

    def _rejoin(self, job_id: int | None, now: int) -> None:
        """The outside acts on a PE of a job alone: bring it to ``now`` and back to the event path, with
        the events it would have pending."""
        if job_id is None or not self._jobs[job_id].alone:
            return
        job = self._jobs[job_id]
        self._materialize(job, now)
        if not job.alone:
            return
        self._leave_shortcut(job, now)
        for index in job.processes:
            p = self._processes[index]
            if p.phase in (Phase.WAIT, Phase.BLOCKED) and p.ready_ns is not None and p.ready_ns > now:
                self._push(p.ready_ns, _ARRIVE, index, p.step)
            if p.phase is Phase.WAIT and p.mode is WaitMode.SPIN_BLOCK and p.spin_deadline > now:
                self._push(p.spin_deadline, _SPIN, index, p.step)

    def _leave_shortcut(self, job: _Job, now: int) -> None:
        job.alone, job.pending = False, None
        job.epoch += 1
        for index in job.processes:
            pe = self._processes[index].pe
            if self._pes[pe].owner is not None and self._jobs[self._pes[pe].owner or 0] is job:
                self._pes[pe].owner = None
                self._reschedule(pe, now)
                self._dirty.add(pe)

    # -- the model ---------------------------------------------------------------------------------------

    def _on_cpu(self, p: _Process, now: int) -> bool:
        """Whether ``p`` may see what happened: always when the PE is shared fluidly, only while it runs
        under slices."""
        return not self.costs.slice_ns or slices.on_cpu(self, p, now)

    def _alive(self, index: int) -> bool:
        return self._processes[index].phase is not Phase.DONE

    def _competing(self, pe: _Pe) -> list[_Process]:
        """The processes the local scheduler shares the PE among."""
        processes = self._processes
        competing = []
        for index in pe.processes:
            p = processes[index]
            phase = p.phase
            # Spelled out rather than `in ON_CPU`: compiled, this is the model's most frequent test.
            if not p.control.stopped and (
                phase is Phase.COMPUTE or phase is Phase.WAIT or phase is Phase.WAKING
            ):
                competing.append(p)
        return competing

    def _sync(self, pe_index: int, now: int) -> None:
        """Bring the PE's processes from its last sync to ``now`` at constant rates. O(n).

        Each competing process gets ``eff x w / W`` ns of CPU; the fraction of a nanosecond left over is
        carried to the next sync, so syncing more often (reading counters, other PEs' events) never delays
        a computation, which would otherwise need a further event a few nanoseconds later."""
        pe = self._pes[pe_index]
        dt = now - pe.synced_ns
        if dt <= 0:
            return
        switching = min(dt, max(0, pe.switch_until - pe.synced_ns))
        pe.switch += switching
        eff = dt - switching
        used = 0
        # Slices (slices.py) give the CPU to one runner at a time: no shares, no carries to keep.
        competing = [] if self.costs.slice_ns else self._competing(pe)
        total = sum(p.weight for p in competing)
        if not self.costs.slice_ns and total != pe.total:
            # Carries are counted in the old total: drop them (under 1 ns each). Only here, on an interval
            # of positive length, so that a state that lasts no time (a rank that blocks and is woken at
            # the same instant) changes nothing, whatever order the events of that instant run in.
            pe.total = total
            for p in competing:
                p.carry = 0
        for index in pe.processes:
            p = self._processes[index]
            c = p.counters
            if p.phase is Phase.DONE:
                continue
            if p.control.stopped:
                c.stopped_ns += dt
            elif p.phase is Phase.BLOCKED:
                c.blocked_ns += dt
            elif p.phase is Phase.IO:
                c.io_ns += dt
        if self.costs.slice_ns:
            used = slices.sync(self, pe, pe.synced_ns + switching, now)
        for p in competing:
            share, p.carry = divmod(eff * p.weight + p.carry, total)
            used += credit(pe, p, share)
        pe.idle += eff - used
        pe.synced_ns = now

    def _reschedule(self, pe_index: int, now: int) -> None:
        """Replace the PE's pending event by the first instant its rates change by themselves.
        O(n + log E)."""
        pe = self._pes[pe_index]
        pe.version += 1
        if self.costs.slice_ns:
            slices.update_queue(self, pe_index, now)
            change = slices.next_change(self, pe, now)
            if pe.switch_until > now:
                change = pe.switch_until if change is None else min(change, pe.switch_until)
            if change is not None:
                self._push(change, _PE, pe_index, pe.version)
            return
        delay = max(0, pe.switch_until - now)
        competing = self._competing(pe)
        total = sum(p.weight for p in competing)
        fresh = total != pe.total  # the next sync drops the carries
        soonest: int | None = now + delay if delay else None
        for p in competing:
            if p.phase is not Phase.WAIT:
                carry = 0 if fresh else p.carry
                finish = now + delay + max(0, -(-(p.remaining * total - carry) // p.weight))
                soonest = finish if soonest is None else min(soonest, finish)
        if soonest is not None:
            self._push(soonest, _PE, pe_index, pe.version)

    def _push(self, time: int, kind: int, a: int, b: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, kind, a, b))

    def _progress(self, p: _Process, now: int) -> None:
        """Move a process through every phase change due at ``now`` (its PE synced to ``now``)."""
        while True:
            if p.phase is Phase.COMPUTE:
                if p.remaining > 0:
                    return
                self._end_computation(p, now)
            elif p.phase is Phase.WAIT:
                if p.control.stopped:
                    return
                if p.ready_ns is not None and p.ready_ns <= now:
                    if not self._on_cpu(p, now):
                        # Under slices: its message is in, and the test it makes when it next runs finds it
                        # before it looks at the clock, so it does not block, however late that is (and
                        # blocking here would turn straight back into this wait: a loop at one instant).
                        return
                    self._return(p, now)
                elif p.mode is WaitMode.SPIN_BLOCK and p.spin_deadline <= now:
                    p.phase = Phase.BLOCKED
                    p.block_from = now
                else:
                    return
            elif p.phase is Phase.BLOCKED:
                if p.control.stopped or p.ready_ns is None or p.ready_ns > now:
                    return
                if p.block_from == now:
                    # The message came at the instant the spin ran out: the spin catches it. Which of the
                    # two events ran first must not matter (the shortcut does not order them).
                    p.phase, p.block_from = Phase.WAIT, None
                    continue
                p.phase = Phase.WAKING
                p.remaining = self.costs.wakeup_ns
                p.counters.wakeups += 1
            elif p.phase is Phase.WAKING:
                if p.remaining > 0 or not self._on_cpu(p, now):
                    return
                self._return(p, now)
            elif p.phase is Phase.IO:
                if p.control.stopped or p.io_until > now:
                    return
                self._enter_call(p, now)
            else:
                return

    def _end_computation(self, p: _Process, now: int) -> None:
        io = self._jobs[p.job].program.io_ns
        if io:
            p.phase, p.io_until = Phase.IO, now + io
            self._push(p.io_until, _SPIN, p.index, p.step)  # a timer of its own, as a spin's end is
            return
        self._enter_call(p, now)

    def _enter_call(self, p: _Process, now: int) -> None:
        job = self._jobs[p.job]
        if not job.program.communicates:
            self._next_iteration(p, job, now)
            return
        p.counters.in_call = True
        p.counters.enter_ns = now
        p.phase = Phase.WAIT
        p.mode = p.control.wait
        p.block_from = None
        if p.mode is WaitMode.SPIN_BLOCK:
            p.spin_deadline = now + p.control.spin_ns
            self._push(p.spin_deadline, _SPIN, p.index, p.step)
        if p.ready_ns is not None and p.ready_ns > now and not self._boosts_on_arrival:
            self._push(p.ready_ns, _ARRIVE, p.index, p.step)  # known before the call: see _set_ready
        self._arrive(job, p.rank, p.step, now)

    def _arrive(self, job: _Job, rank: int, step: int, now: int) -> None:
        """``rank`` begins ``step``: work out which ranks now know when their messages are all in."""
        program = job.program
        job.entered[rank] = step + 1
        job.enter_ns[rank][step % 2] = now
        if program.pattern is Pattern.ALLREDUCE and program.ranks > 1:
            # One counter per step: a rank cannot begin step k + 2 before every rank has left step k.
            slot = step % 2
            job.arrived[slot] += 1
            job.last_arrival[slot] = max(job.last_arrival[slot], now)
            if job.arrived[slot] == program.ranks:
                ready = job.last_arrival[slot] + program.latency_ns
                job.arrived[slot], job.last_arrival[slot] = 0, 0
                for index in job.processes:
                    self._set_ready(self._processes[index], step, ready)
            return
        table = program.partner_table
        for q in (rank, *table[rank]):
            process = self._processes[job.processes[q]]
            if process.step != step or process.ready_ns is not None:
                continue
            partners = table[q]
            if all(job.entered[s] > step for s in partners):
                last = max((job.enter_ns[s][step % 2] for s in partners), default=None)
                self._set_ready(process, step, now if last is None else last + program.latency_ns)

    def _set_ready(self, p: _Process, step: int, ready: int) -> None:
        """``p``'s messages for ``step`` are all in at ``ready``. The arrival is an event only for a
        process in its call by then: one still computing (or in I/O) finds the messages when it enters
        the call, which pushes the event if they are not in yet (about a third of all arrivals, each a
        sync and a rescheduling for nothing). DCS acts on arrivals whatever the phase: all are events."""
        p.ready_ns = ready
        if p.phase not in (Phase.COMPUTE, Phase.IO) or self._boosts_on_arrival:
            self._push(ready, _ARRIVE, p.index, step)

    def _return(self, p: _Process, now: int) -> None:
        c = p.counters
        spin = block = 0
        if p.mode is WaitMode.SPIN_BLOCK:
            spin = (now if p.block_from is None else p.block_from) - c.enter_ns
            block = 0 if p.block_from is None else now - p.block_from
        c.events += 1
        c.calls += 1
        c.comm_ns += now - c.enter_ns
        c.spin_ns += spin
        c.block_ns += block
        c.in_call = False
        c.exit_ns = now
        p.ready_ns = None
        self._next_iteration(p, self._jobs[p.job], now)

    def _next_iteration(self, p: _Process, job: _Job, now: int) -> None:
        p.counters.iterations += 1
        p.step += 1
        if p.step < job.program.iterations:
            p.phase = Phase.COMPUTE
            p.remaining = p.compute_ns
            return
        p.phase = Phase.DONE
        p.counters.done = True
        self._dirty.add(p.pe)
        job.finished += 1
        if job.finished == job.program.ranks:
            job.completion_ns = now
