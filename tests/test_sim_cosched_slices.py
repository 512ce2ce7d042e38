"""Round-robin time slices in the node model (tools/sim/cosched/slices.py), against timelines worked out by
hand. Times in ms; the slice is 3 ms; a process alone whose PE gets a second one keeps the PE until the
next multiple of 3 ms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from storm.tools.sim.cosched.node import Control, CoschedModel, Costs, WaitMode
from storm.tools.sim.cosched.program import Pattern, Program
from tests.test_sim_cosched_shortcut import Case, cases, run

MS = 1_000_000
US = 1_000
LONG = 10**12
SLICE = Costs(slice_ns=3 * MS)


def hog(ms: float) -> Program:
    return Program((round(ms * MS),), 1, Pattern.NONE)


def test_two_hogs_alternate_every_slice() -> None:
    # A (10 ms) runs 0-3, B (7 ms) 3-6, A 6-9, B 9-12, A 12-15, B 15-16 and ends, A 16-17 and ends.
    model = CoschedModel(1, SLICE)
    model.add_job(0, 1, hog(10), [0])
    model.add_job(0, 2, hog(7), [0])
    model.run_until_done(LONG)
    assert (model.completion_ns(1), model.completion_ns(2)) == (17 * MS, 16 * MS)
    assert model.pe_counters(0).busy_ns == 17 * MS
    # The fluid model shares the PE evenly: B ends at 14 ms, A at 17.
    fluid = CoschedModel(1)
    fluid.add_job(0, 1, hog(10), [0])
    fluid.add_job(0, 2, hog(7), [0])
    fluid.run_until_done(LONG)
    assert (fluid.completion_ns(1), fluid.completion_ns(2)) == (17 * MS, 14 * MS)


def test_nice_scales_the_slice() -> None:
    # nice 5 weighs 335 against 1024: a 3 ms slice becomes 3 x 335 / 1024 ms = 981445 ns (rounded down).
    model = CoschedModel(1, SLICE)
    model.add_job(0, 1, hog(4), [0])
    model.add_job(0, 2, hog(4), [0], Control(nice=5))
    short = 3 * MS * 335 // 1024
    model.advance(3 * MS + short)
    assert model.counters((2, 0)).compute_ns == short
    assert model.counters((1, 0)).compute_ns == 3 * MS


def test_a_polling_rank_notices_its_message_only_in_its_own_slice() -> None:
    # PE 0: a 100 ms hog and rank 0 of a ring (1 ms of computation); PE 1: rank 1 alone (6.5 ms).
    # PE 0: hog 0-3; rank 0 computes 3-4 and polls to the end of its slice at 6; its message is in at
    # 6.5 + 0.1 = 6.6 while the hog runs 6-9; rank 0 notices it as it runs again, a nanosecond after 9
    # (a slice is (begin, end]), and ends. Rank 1's message came at 4.1, it returns when it enters at 6.5.
    # The hog lost 3 ms and that nanosecond to rank 0: it ends at 103 ms + 1 ns.
    ring = Program((1 * MS, 6_500 * US), 1, Pattern.RING, latency_ns=100 * US)
    for shortcut in (True, False):
        model = CoschedModel(2, SLICE, shortcut=shortcut)
        model.add_job(0, 1, hog(100), [0])
        model.add_job(0, 2, ring, [0, 1])
        model.run_until_done(LONG)
        assert model.completion_ns(2) == 9 * MS + 1
        assert model.completion_ns(1) == 103 * MS + 1
        c = model.counters((2, 0))
        assert (c.compute_ns, c.poll_ns, c.comm_ns, c.exit_ns) == (MS, 2 * MS + 1, 5 * MS + 1, 9 * MS + 1)
        assert model.counters((2, 1)).exit_ns == 6_500 * US
    # Fluid: rank 0 computes 0-2 at half the PE and returns at 6.6 ms.
    fluid = CoschedModel(2)
    fluid.add_job(0, 1, hog(100), [0])
    fluid.add_job(0, 2, ring, [0, 1])
    fluid.run_until_done(LONG)
    assert fluid.completion_ns(2) == 6_600 * US


def test_a_woken_rank_waits_for_the_running_hogs_slice_to_end() -> None:
    # As above with rank 0 in spin-block (0.5 ms of spin), rank 1 computing 10 ms, wake-up 0.2 ms.
    # PE 0: hog 0-3; rank 0 computes 3-4, spins 4-4.5, blocks and gives the rest of its slice up; the hog
    # runs alone. Rank 0's message is in at 10.1: it wakes, and the hog keeps the PE to the next multiple
    # of 3 ms, 12; rank 0 pays its wake-up 12-12.2 and ends.
    costs = Costs(wakeup_ns=200 * US, slice_ns=3 * MS)
    ring = Program((1 * MS, 10 * MS), 1, Pattern.RING, latency_ns=100 * US)
    block = Control(wait=WaitMode.SPIN_BLOCK, spin_ns=500 * US)
    for shortcut in (True, False):
        model = CoschedModel(2, costs, shortcut=shortcut)
        model.add_job(0, 1, hog(100), [0])
        model.add_job(0, 2, ring, [0, 1], block)
        model.run_until_done(LONG)
        assert model.completion_ns(2) == 12_200 * US
        c = model.counters((2, 0))
        assert (c.spin_ns, c.block_ns, c.wakeups, c.wakeup_cpu_ns) == (500 * US, 7_700 * US, 1, 200 * US)
        assert c.blocked_ns == 10_100 * US - 4_500 * US
        # The hog: 0-3, 4.5-12, then alone from 12.2 for its remaining 89.5 ms.
        assert model.completion_ns(1) == 12_200 * US + 89_500 * US


def test_a_lone_process_is_never_sliced() -> None:
    # A ring alone on its PEs ends at iterations x (compute + latency) whatever the slice.
    program = Program.balanced(2, 10 * MS, 7, Pattern.RING, latency_ns=20_000)
    for shortcut in (True, False):
        model = CoschedModel(2, Costs(slice_ns=1 * MS), shortcut=shortcut)
        model.add_job(0, 1, program, [0, 1])
        model.run_until_done(LONG)
        assert model.completion_ns(1) == 7 * (10 * MS + 20_000)
        assert model.events_run < 40  # no slice events


@pytest.mark.parametrize("wait", list(WaitMode))
def test_slice_zero_is_the_fluid_model(wait: WaitMode) -> None:
    # Costs(slice_ns=0) spelled out against the default Costs, with stops, nice and contention.
    def run(costs: Costs) -> list[object]:
        model = CoschedModel(2, costs, shortcut=False)
        model.add_job(0, 1, hog(40), [0])
        model.add_job(0, 2, Program((2 * MS, 3 * MS), 5, Pattern.RING, latency_ns=50 * US), [0, 1])
        model.add_job(0, 3, Program((MS, MS), 8, Pattern.ALLREDUCE), [1, 0], Control(nice=3, wait=wait))
        model.control(7 * MS, (1, 0), Control(stopped=True))
        model.control(15 * MS, (1, 0), Control())
        model.run_until_done(LONG)
        return [model.completion_ns(j) for j in (1, 2, 3)] + [model.counters(k) for k in sorted(model.keys())]

    base = Costs(switch_ns=100 * US, wakeup_ns=30 * US)
    assert run(Costs(switch_ns=100 * US, wakeup_ns=30 * US, slice_ns=0)) == run(base)
    assert run(base) != run(Costs(switch_ns=100 * US, wakeup_ns=30 * US, slice_ns=2 * MS))


def test_negative_costs_are_refused() -> None:
    with pytest.raises(ValueError):
        Costs(slice_ns=-1)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(cases().filter(lambda case: case.costs.slice_ns > 0))
def test_whole_rounds_give_exactly_what_an_event_per_slice_gives(case: Case) -> None:
    # slices.py skips the slice ends where nobody changes phase: the reference steps through every one.
    for shortcut in (False, True):
        assert run(case, shortcut) == run(case, shortcut, step_slices=True)


def test_rounds_between_long_computations_cost_no_events() -> None:
    # Three hogs of 300, 200 and 100 slices each: the events are their ends, not their 600 slice ends.
    model = CoschedModel(1, SLICE)
    for job, slices in enumerate((300, 200, 100)):
        model.add_job(0, job, hog(slices * 3), [0])
    model.run_until_done(LONG)
    assert [model.completion_ns(j) for j in range(3)] == [600 * 3 * MS, 500 * 3 * MS, 300 * 3 * MS]
    assert model.events_run < 10
    stepped = CoschedModel(1, SLICE)
    stepped.step_slices = True
    for job, slices in enumerate((300, 200, 100)):
        stepped.add_job(0, job, hog(slices * 3), [0])
    stepped.run_until_done(LONG)
    assert [stepped.completion_ns(j) for j in range(3)] == [600 * 3 * MS, 500 * 3 * MS, 300 * 3 * MS]
    assert stepped.events_run > 500
