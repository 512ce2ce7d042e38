"""ClusterSchedSim's local scheduler and dynamic coscheduling in the node model (tools/sim/cosched/local.py:
Costs.local on top of slices.py), against timelines worked out by hand, and the shortcut against the event
path under it. Times in ms; SW is a local context switch (0.2 ms), INTR an interrupt (0.05 ms)."""

from __future__ import annotations

import random

import pytest

from storm.tools.sim.cosched.node import (
    Control,
    CoschedModel,
    Costs,
    Local,
    PeCounters,
    Reschedule,
    WaitMode,
)
from storm.tools.sim.cosched.program import Pattern, Program

MS = 1_000_000
US = 1_000
LONG = 10**12
SW, INTR = 200 * US, 50 * US
BLOCK = Control(wait=WaitMode.SPIN_BLOCK, spin_ns=500 * US)


def hog(ms: float) -> Program:
    return Program((round(ms * MS),), 1, Pattern.NONE)


def costs(local: Local, slice_ms: float = 10) -> Costs:
    return Costs(slice_ns=round(slice_ms * MS), local=local)


def ring(fast_ms: float, slow_ms: float) -> Program:
    """Rank 0 (on the shared PE 0) computes ``fast_ms``, rank 1 (alone on PE 1) ``slow_ms``: one step."""
    return Program((round(fast_ms * MS), round(slow_ms * MS)), 1, Pattern.RING, latency_ns=100 * US)


def test_every_change_of_the_running_process_costs_a_switch() -> None:
    # A (10 ms) and B (7 ms), 3 ms slices, switch 0.5 ms: A 0-3, B 3.5-6.5, A 7-10, B 10.5-13.5, A 14-17,
    # B 17.5-18.5 (ends), A 19-20 (ends): six switches.
    for shortcut in (True, False):
        model = CoschedModel(1, costs(Local(switch_ns=500 * US), 3), shortcut=shortcut)
        model.add_job(0, 1, hog(10), [0])
        model.add_job(0, 2, hog(7), [0])
        model.run_until_done(LONG)
        assert (model.completion_ns(1), model.completion_ns(2)) == (20 * MS, 18_500 * US)
        assert model.pe_counters(0) == PeCounters(busy_ns=17 * MS, switch_ns=3 * MS, switches=6)


def test_a_woken_process_goes_to_the_head_of_the_ready_queue() -> None:
    # PE 0: R0 (spin 0), then hogs H1 and H2 (each newcomer right behind the runner: queue R0, H2, H1).
    # R0 computes 0-1 and blocks; H2 runs 1-11, H1 11-21. R0's message is in at 15.1: it wakes and goes
    # behind H1, ahead of H2, so it returns at 21. Slices.py's plain queue puts it last: H2 runs 21-31 first,
    # and R0 runs from the nanosecond after H2's slice ends (slices.py: a slice is (begin, end]).
    block_at_once = Control(wait=WaitMode.SPIN_BLOCK, spin_ns=0)
    for local, end in ((Local(), 21 * MS), (None, 31 * MS + 1)):
        model = CoschedModel(2, Costs(slice_ns=10 * MS, local=local))
        model.add_job(0, 3, ring(1, 15), [0, 1], block_at_once)
        model.add_job(0, 1, hog(100), [0])
        model.add_job(0, 2, hog(100), [0])
        model.run_until_done(LONG)
        assert model.completion_ns(3) == end


def test_dcs_boosts_a_blocked_receiver_to_run_right_after_its_message() -> None:
    # PE 0: hog H (100 ms), then R0 (computes 1 ms, spins 0.5 ms); PE 1: R1 (20 ms). H runs 0-10 (the
    # slice grid); switch 10-10.2, R0 computes 10.2-11.2, spins to 11.7 and blocks; switch, H from 11.9.
    # R0's message is in at 20.1: interrupt 20.1-20.15, R0 is woken and preempts H, switch to 20.35, R0
    # returns at 20.35. Then switch back to H, which ends at 20.55 + (100 - 10 - 8.2) = 102.35.
    local = Local(Reschedule.DCS, switch_ns=SW, interrupt_ns=INTR)
    for shortcut in (True, False):
        model = CoschedModel(2, costs(local), shortcut=shortcut)
        model.add_job(0, 1, hog(100), [0])
        model.add_job(0, 2, ring(1, 20), [0, 1], BLOCK)
        model.run_until_done(LONG)
        assert (model.completion_ns(2), model.completion_ns(1)) == (20_350 * US, 102_350 * US)
        assert model.pe_counters(0) == PeCounters(
            busy_ns=101 * MS,
            spin_ns=500 * US,
            switch_ns=4 * SW + INTR,
            interrupt_ns=INTR,
            switches=4,
            interrupts=1,
        )
        c = model.counters((2, 0))
        assert (c.spin_ns, c.wakeups, c.exit_ns) == (500 * US, 1, 20_350 * US)
    # Without the boost (SB) R0 waits behind H for the slice's end, on the grid at 30 ms: it returns at 30.2.
    model = CoschedModel(2, costs(Local(switch_ns=SW)))
    model.add_job(0, 1, hog(100), [0])
    model.add_job(0, 2, ring(1, 20), [0, 1], BLOCK)
    model.run_until_done(LONG)
    assert model.completion_ns(2) == 30_200 * US


def test_dcs_boosts_a_ready_process_that_is_not_running() -> None:
    # PE 0: H runs 0-10 with R0 queued behind it, still to compute. R0's message is in at 5.1 (R1 entered
    # at 5): interrupt and switch, R0 computes 5.35-6.35 and returns at once; R1's message is in at 6.45.
    # H resumes after a switch at 6.55 with 94.9 ms to go.
    local = Local(Reschedule.DCS, switch_ns=SW, interrupt_ns=INTR)
    for shortcut in (True, False):
        model = CoschedModel(2, costs(local), shortcut=shortcut)
        model.add_job(0, 1, hog(100), [0])
        model.add_job(0, 2, ring(1, 5), [0, 1])
        model.run_until_done(LONG)
        assert (model.completion_ns(2), model.completion_ns(1)) == (6_450 * US, 101_450 * US)
        assert model.pe_counters(0).interrupts == 1 and model.pe_counters(1).interrupts == 0


def test_dcs_leaves_a_running_destination_alone_and_interrupts_for_a_lone_blocked_one() -> None:
    # A balanced ring alone on its PEs: polling ranks always run when their message comes, so no interrupt
    # and the shortcut walks it; spinning 0 and blocking, each step costs an interrupt on every PE.
    program = Program.balanced(2, MS, 20, Pattern.RING, latency_ns=100 * US)
    local = Local(Reschedule.DCS, switch_ns=SW, interrupt_ns=INTR)
    model = CoschedModel(2, costs(local))
    model.add_job(0, 1, program, [0, 1])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == 20 * 1_100 * US and model.pe_counters(0).interrupts == 0
    assert model.events_run < 10
    for shortcut in (True, False):
        model = CoschedModel(2, costs(local), shortcut=shortcut)
        model.add_job(0, 1, program, [0, 1], Control(wait=WaitMode.SPIN_BLOCK, spin_ns=0))
        model.run_until_done(LONG)
        assert model.completion_ns(1) == 20 * (1_100 * US + INTR)
        assert model.pe_counters(0) == PeCounters(
            busy_ns=20 * MS, switch_ns=20 * INTR, idle_ns=20 * 100 * US, interrupt_ns=20 * INTR, interrupts=20
        )


def test_pb_takes_the_pe_from_a_polling_process_at_the_period() -> None:
    # PE 0: R0 (polls), then H (50 ms); period 4 ms, daemon 0.03 ms. R0 computes 0-1 and polls. At 4 the
    # daemon finds it busy-waiting: daemon 4-4.03, switch, H runs 4.23-14.23 (a full slice); R0 polls again
    # 14.43-16; at 16 the daemon hands the PE back to H, 16.23-26.23. R0's message is in at 25.1, but a
    # daemon only moves a busy-waiter, and H computes: R0 gets the PE at 26.23 and returns at 26.43.
    local = Local(Reschedule.PB, switch_ns=SW, period_ns=4 * MS, daemon_ns=30 * US)
    for shortcut in (True, False):
        model = CoschedModel(2, costs(local), shortcut=shortcut)
        model.add_job(0, 2, ring(1, 25), [0, 1])
        model.add_job(0, 1, hog(50), [0])
        model.run_until_done(LONG)
        assert (model.completion_ns(2), model.completion_ns(1)) == (26_430 * US, 56_630 * US)
        assert model.pe_counters(0) == PeCounters(
            busy_ns=51 * MS, spin_ns=4_570 * US, switch_ns=5 * SW + 60 * US, interrupt_ns=60 * US, switches=5,
            interrupts=2,
        )  # fmt: skip


def test_pb_costs_nothing_on_a_pe_with_nobody_waiting_for_it() -> None:
    program = Program((MS, 3 * MS), 30, Pattern.RING, latency_ns=100 * US)
    model = CoschedModel(2, costs(Local(Reschedule.PB, switch_ns=SW, period_ns=MS, daemon_ns=30 * US)))
    model.add_job(0, 1, program, [0, 1])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == program.dedicated_ns()
    assert model.pe_counters(0).interrupts == 0 and model.events_run < 10  # the shortcut walked it


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="needs a period"):
        Local(Reschedule.PB)
    with pytest.raises(ValueError, match="reschedule=DCS"):
        Local(interrupt_ns=INTR)
    with pytest.raises(ValueError, match="reschedule=PB"):
        Local(Reschedule.DCS, period_ns=MS)
    with pytest.raises(ValueError, match="negative"):
        Local(switch_ns=-1)
    with pytest.raises(ValueError, match="slice_ns > 0"):
        Costs(local=Local())


def _case(rng: random.Random) -> tuple[int, Costs, list[tuple[int, Program, list[int], Control]]]:
    kind = rng.choice(list(Reschedule))
    local = Local(
        kind, switch_ns=rng.choice([0, 30 * US]),
        interrupt_ns=rng.choice([0, 20 * US]) if kind is Reschedule.DCS else 0,
        period_ns=rng.choice([150 * US, 1000 * US]) if kind is Reschedule.PB else 0,
        daemon_ns=rng.choice([0, 10 * US]) if kind is Reschedule.PB else 0,
    )  # fmt: skip
    pes = rng.randint(1, 3)
    jobs = []
    for _ in range(rng.randint(1, 3)):
        ranks = rng.randint(1, 3)
        program = Program(
            tuple(rng.choice([100 * US, 333 * US, 1000 * US]) for _ in range(ranks)), rng.randint(1, 40),
            rng.choice(list(Pattern)), rng.choice([0, 20 * US, 120 * US]), io_ns=rng.choice([0, 0, 200 * US]),
        )  # fmt: skip
        control = Control(wait=rng.choice(list(WaitMode)), spin_ns=rng.choice([0, 50 * US, 400 * US]))
        jobs.append(
            (rng.choice([0, 0, 500 * US]), program, [rng.randint(0, pes - 1) for _ in range(ranks)], control)
        )
    jobs.sort(key=lambda j: j[0])
    return (
        pes,
        Costs(wakeup_ns=rng.choice([0, 70 * US]), slice_ns=rng.choice([90 * US, 400 * US]), local=local),
        jobs,
    )


def _run(
    pes: int, cost: Costs, jobs: list[tuple[int, Program, list[int], Control]], shortcut: bool
) -> object:
    model = CoschedModel(pes, cost, shortcut=shortcut)
    seen: list[object] = []
    for job_id, (start, program, placement, control) in enumerate(jobs):
        model.add_job(start, job_id, program, placement, control)
    for stop in (2 * MS, 5 * MS):  # the outside acts in the middle: stop job 0, continue it 1 ms later
        model.advance(stop)
        seen.append([model.counters(k) for k in sorted(model.keys())])
        for rank in range(jobs[0][1].ranks):
            model.control(stop, (0, rank), Control(stopped=True))
        for rank in range(jobs[0][1].ranks):
            model.control(stop + MS, (0, rank), jobs[0][3])
    model.run_until_done(LONG)
    seen += [model.completion_ns(j) for j in range(len(jobs))]
    seen += [model.counters(k) for k in sorted(model.keys())] + [model.pe_counters(p) for p in range(pes)]
    return seen


def test_the_shortcut_gives_what_the_event_path_gives_under_every_local_scheduler() -> None:
    rng = random.Random(15)
    for _ in range(40):
        pes, cost, jobs = _case(rng)
        assert _run(pes, cost, jobs, True) == _run(pes, cost, jobs, False), (cost, jobs)


def test_each_pe_keeps_its_own_time() -> None:
    # As the PB timeline above, on PE 1 of 2: its daemon runs 2 ms (1/2 of the 4 ms period) past each
    # multiple of the period, and a lone runner's slice, when contention begins, ends 5 ms past a multiple
    # of 10. R1 computes 0-1 and polls; the daemon gives H the PE at 2 (H 2.23-12.23), then R1 polls again
    # from 12.43 until the daemon at 14 (H 14.23-24.23); R1 runs from 24.43 and finds its message at 25.1.
    # In step with PE 0's timers, gang scheduled as it were, the same would end at 26.43.
    local = Local(Reschedule.PB, switch_ns=SW, period_ns=4 * MS, daemon_ns=30 * US)
    for shortcut in (True, False):
        model = CoschedModel(2, costs(local), shortcut=shortcut)
        model.add_job(0, 2, ring(25, 1), [0, 1])
        model.add_job(0, 1, hog(50), [1])
        model.run_until_done(LONG)
        assert model.completion_ns(2) == 25_100 * US
        assert model.pe_counters(1).interrupts == 2 and model.pe_counters(0).interrupts == 0
