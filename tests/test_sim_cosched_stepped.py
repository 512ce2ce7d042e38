"""The event-driven node model (tools/sim/cosched/node.py) against its fixed-step reference (stepped.py).

Tolerance: the reference makes every phase change at the first step boundary at or after the instant the
event model makes it, so each change is late by less than dt. A rank's iteration has at most three changes
(its computation ends, its message is noticed or its spin runs out, its wake-up ends), and a late change
delays a neighbour on the same PE (it keeps its share longer) or a partner (it calls later) by at most as
much, never more: delays add along the chain, they do not multiply. So a job may end later by up to
3 dt per iteration of every job (any may share a PE with it), plus dt per control change. One thing is not
continuous: a message arriving within dt of the spin deadline can block in one model and not in the other,
which costs a wake-up (W of CPU, n W of wall at an n-way share) and changes the neighbours' shares while it
waits: counted as the calls that were woken in one model and not the other (see tolerance()). A stop that
lands between the two models' ends of a job is the other discontinuity (see stops()). Latency (to 20 ms)
and wake-ups (5 ms) are drawn larger than 3 dt, so a model that lost either would fall outside the band of
the cases without flips or stops. Counts (iterations, calls) and the CPU spent computing must agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from storm.tools.sim.cosched.node import Control, CoschedModel, Costs, PeCounters, WaitMode
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.cosched.stepped import SteppedModel

MS = 1_000_000
DT = MS
LIMIT = 20_000 * MS


@dataclass(frozen=True)
class Case:
    pes: int
    costs: Costs
    jobs: tuple[tuple[Program, tuple[int, ...], Control], ...]
    changes: tuple[tuple[int, int, Control], ...]  # (time, job, control for all its ranks), times on dt


@st.composite
def cases(draw: st.DrawFn) -> Case:
    pes = draw(st.integers(1, 3))
    costs = Costs(
        switch_ns=draw(st.sampled_from([0, MS, 3 * MS])),
        wakeup_ns=draw(st.sampled_from([0, 5 * MS])),
    )
    jobs = []
    for _ in range(draw(st.integers(1, 3))):
        ranks = draw(st.integers(1, 3))
        program = Program(
            tuple(draw(st.integers(5 * MS, 40 * MS)) for _ in range(ranks)),
            draw(st.integers(1, 4)),
            draw(st.sampled_from(list(Pattern))),
            draw(st.integers(0, 20 * MS)),
        )
        placement = tuple(draw(st.integers(0, pes - 1)) for _ in range(ranks))
        jobs.append((program, placement, draw(controls())))
    changes = []
    for _ in range(draw(st.integers(0, 4))):
        changes.append(
            (draw(st.integers(0, 30)) * 10 * DT, draw(st.integers(0, len(jobs) - 1)), draw(controls()))
        )
    changes.sort(key=lambda c: c[0])
    return Case(pes, costs, tuple(jobs), tuple(changes))


@st.composite
def controls(draw: st.DrawFn) -> Control:
    return Control(
        stopped=draw(st.booleans()),
        nice=draw(st.sampled_from([0, 0, 3, -2])),
        wait=draw(st.sampled_from(list(WaitMode))),
        spin_ns=draw(st.sampled_from([0, 120_000, 4 * MS, 30 * MS])),
    )


def run(model: CoschedModel | SteppedModel, case: Case) -> None:
    for job, (program, placement, control) in enumerate(case.jobs):
        model.add_job(0, job, program, placement, control)
    end = 0
    for time, job, control in case.changes:
        for rank in range(case.jobs[job][0].ranks):
            model.control(time, (job, rank), control)
        end = time
    # Nothing may stay stopped for ever: continue everything after the last change.
    for job, (program, _, control) in enumerate(case.jobs):
        for rank in range(program.ranks):
            model.control(
                end + 10 * DT,
                (job, rank),
                Control(nice=control.nice, wait=control.wait, spin_ns=control.spin_ns),
            )
    model.run_until_done(LIMIT)


def tolerance(case: Case, flips: int) -> int:
    """3 dt per iteration of every job, dt per change, a flip's cost per flip, and the length of every stop
    (see stops()).

    A flip (a call that blocked in one model and not in the other) costs a wake-up at the widest share, and
    more: while the rank waits, blocked it leaves its PE to its neighbours, spinning it takes its share, so
    they run slower for as long as the wait lasts, at most the partner's computation at that share plus the
    latency (found by hypothesis: two ranks of a ring on one PE, one blocking in one model only)."""
    crowd = max(sum(placement.count(pe) for _, placement, _ in case.jobs) for pe in range(case.pes))
    iterations = sum(p.iterations for p, _, _ in case.jobs)
    compute = max(max(p.compute_ns) for p, _, _ in case.jobs)
    latency = max(p.latency_ns for p, _, _ in case.jobs)
    flip = crowd * (case.costs.wakeup_ns + compute) + latency
    return 3 * DT * iterations + DT * (len(case.changes) + 2) + flips * flip + stops(case)


def stops(case: Case) -> int:
    """The other discontinuity: a stop that lands after a job ended in one model and before it ended in the
    other holds it up in that one only, for as long as the stop lasts (until the job's next change, or the
    final continue). Its neighbours on a PE may gain as much. Bounded by the sum of all stops' lengths
    (found by hypothesis: a rank done at 44 ms in one model and stopped at 50 ms in the other, for 10 ms)."""
    last = max((time for time, _, _ in case.changes), default=0)
    # A job may start stopped: that is a stop at time 0 too.
    controls = [(0, job, control) for job, (_, _, control) in enumerate(case.jobs)] + list(case.changes)
    total = 0
    for i, (time, job, control) in enumerate(controls):
        if control.stopped:
            later = [t for t, j, _ in controls[i + 1 :] if j == job]
            total += (later[0] if later else last + 10 * DT) - time
    return total


def elapsed(pe: PeCounters) -> int:
    return pe.busy_ns + pe.spin_ns + pe.switch_ns + pe.idle_ns


# Derandomized: the same cases in every run (hypothesis found two discontinuities of the band with random
# seeds, now counted); run with `--hypothesis-seed=N` (and derandomize off) to search further.
@settings(max_examples=300, deadline=None, derandomize=True)
@given(cases())
def test_the_event_model_follows_the_stepped_reference(case: Case) -> None:
    fast, slow = CoschedModel(case.pes, case.costs), SteppedModel(case.pes, case.costs, DT)
    run(fast, case)
    run(slow, case)
    keys = [(job, rank) for job, (program, _, _) in enumerate(case.jobs) for rank in range(program.ranks)]
    flips = sum(abs(fast.counters(key).wakeups - slow.counters(key).wakeups) for key in keys)
    for job, (program, _, _) in enumerate(case.jobs):
        done_fast, done_slow = fast.completion_ns(job), slow.completion_ns(job)
        assert done_fast is not None and done_slow is not None
        assert abs(done_fast - done_slow) <= tolerance(case, flips), (job, done_fast, done_slow)
        for rank in range(program.ranks):
            a, b = fast.counters((job, rank)), slow.counters((job, rank))
            assert (a.iterations, a.events, a.compute_ns) == (b.iterations, b.events, b.compute_ns)
            assert a.compute_ns == program.iterations * program.compute_ns[rank]
            assert a.events == (program.iterations if program.communicates else 0)
            for counted in (a, b):
                assert counted.wakeup_cpu_ns == counted.wakeups * case.costs.wakeup_ns
    for pe in range(case.pes):
        assert elapsed(fast.pe_counters(pe)) == fast.now
        assert elapsed(slow.pe_counters(pe)) == slow.now
