"""The coscheduling simulator's node model (tools/sim/cosched/node.py) against answers worked out by hand."""

from __future__ import annotations

import pytest

from storm.tools.sim.cosched.node import (
    Control,
    CoschedModel,
    Costs,
    PeCounters,
    WaitMode,
    nice_weight,
)
from storm.tools.sim.cosched.program import Pattern, Program

MS = 1_000_000
LONG = 10**12


def elapsed(pe: PeCounters) -> int:
    return pe.busy_ns + pe.spin_ns + pe.switch_ns + pe.idle_ns


def test_ring_alone_takes_iterations_times_compute_plus_latency_exactly() -> None:
    model = CoschedModel(2)
    model.add_job(0, 1, Program.balanced(2, 10 * MS, 7, Pattern.RING, latency_ns=20_000), [0, 1])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == 7 * (10 * MS + 20_000)
    for rank in (0, 1):
        c = model.counters((1, rank))
        assert (c.compute_ns, c.poll_ns, c.events, c.iterations) == (70 * MS, 7 * 20_000, 7, 7)
        assert c.comm_ns == 7 * 20_000 and c.block_ns == 0 and c.done and not c.in_call
    assert model.pe_counters(0) == PeCounters(busy_ns=70 * MS, spin_ns=140_000)


def test_allreduce_waits_for_the_slowest_rank() -> None:
    program = Program((3 * MS, 5 * MS, 2 * MS, 5 * MS), 4, Pattern.ALLREDUCE, latency_ns=MS)
    model = CoschedModel(4)
    model.add_job(0, 9, program, [0, 1, 2, 3])
    model.run_until_done(LONG)
    assert model.completion_ns(9) == 4 * (5 * MS + MS) == program.dedicated_ns()
    assert model.counters((9, 2)).poll_ns == 4 * (5 * MS - 2 * MS + MS)
    assert model.counters((9, 1)).comm_ns == 4 * MS


def test_imbalanced_ring_couples_only_neighbours() -> None:
    # Rank 0 is slow; on a ring of 4, rank 2 is not its neighbour and still waits for it one step later.
    program = Program((4 * MS, MS, MS, MS), 3, Pattern.RING)
    model = CoschedModel(4)
    model.add_job(0, 1, program, [0, 1, 2, 3])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == program.dedicated_ns() == 12 * MS
    # Rank 2 leaves step 0 at once (its neighbours arrive with it), then waits 3 ms in steps 1 and 2 for
    # neighbours that rank 0 held back one step earlier.
    assert model.counters((1, 2)).poll_ns == 6 * MS


def test_fair_share_halves_two_equal_processes_and_nice_weights_split_by_linux_table() -> None:
    work = 1024 * 1000
    model = CoschedModel(1)
    model.add_job(0, 1, Program((work,), 1, Pattern.NONE), [0])
    model.add_job(0, 2, Program((work,), 1, Pattern.NONE), [0])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == model.completion_ns(2) == 2 * work
    assert model.counters((1, 0)).events == 0  # no communication, no blocking call

    model = CoschedModel(1)
    model.add_job(0, 1, Program((work,), 1, Pattern.NONE), [0])
    model.add_job(0, 2, Program((work,), 1, Pattern.NONE), [0], Control(nice=5))
    model.run_until_done(LONG)
    assert nice_weight(5) == 335
    assert model.completion_ns(1) == work * (1024 + 335) // 1024  # 1,359,000 ns
    assert model.completion_ns(2) == 2 * work
    assert model.pe_counters(0) == PeCounters(busy_ns=2 * work)


C, L, W, N = 10 * MS, MS, MS // 2, 5


def ring_beside_hogs(wait: Control) -> CoschedModel:
    """Job 1, a 2-rank ring on PEs 0 and 1; on each PE a one-rank job computing for ever (jobs 2 and 3)."""
    model = CoschedModel(2, Costs(wakeup_ns=W))
    model.add_job(0, 1, Program.balanced(2, C, N, Pattern.RING, latency_ns=L), [0, 1], wait)
    model.add_job(0, 2, Program((LONG,), 1, Pattern.NONE), [0])
    model.add_job(0, 3, Program((LONG,), 1, Pattern.NONE), [1])
    model.run_until_done(LONG, jobs=[1])
    return model


def test_a_rank_that_arrives_last_finds_its_message_there() -> None:
    # Rank 0 shares its PE (computes 2C), rank 1 does not (C): rank 1's message reaches rank 0 long before
    # rank 0 calls, so only rank 1 waits, for C + L each time; the job ends L after rank 0's last call.
    model = CoschedModel(2)
    model.add_job(0, 1, Program.balanced(2, C, N, Pattern.RING, latency_ns=L), [0, 1])
    model.add_job(0, 2, Program((LONG,), 1, Pattern.NONE), [0])
    model.run_until_done(LONG, jobs=[1])
    assert model.completion_ns(1) == N * 2 * C + L
    assert model.counters((1, 0)).comm_ns == 0 and model.counters((1, 0)).events == N
    assert model.counters((1, 1)).comm_ns == N * C + L


def test_polling_beside_a_hog_keeps_half_the_pe_while_it_waits() -> None:
    # Both ranks compute at half speed (2C), then poll L: the hogs get half of everything.
    model = ring_beside_hogs(Control(wait=WaitMode.POLL))
    done = N * (2 * C + L)
    assert model.completion_ns(1) == done
    c = model.counters((1, 0))
    assert (c.poll_ns, c.comm_ns, c.block_ns, c.spin_ns) == (N * L // 2, N * L, 0, 0)
    assert model.counters((2, 0)).compute_ns == done // 2


def test_spin_block_beside_a_hog_gives_the_pe_away_and_pays_the_wake_up_at_half_speed() -> None:
    # T_spin = 0: each rank blocks as it calls; its hog has the PE alone for L; the wake-up's W of CPU takes
    # 2W at half share. The job is slower by 2W a step, each hog gets C + L + W a step.
    model = ring_beside_hogs(Control(wait=WaitMode.SPIN_BLOCK, spin_ns=0))
    period = 2 * C + L + 2 * W
    assert model.completion_ns(1) == N * period
    c = model.counters((1, 0))
    assert (c.poll_ns, c.wakeup_cpu_ns, c.blocked_ns) == (0, N * W, N * L)
    assert (c.spin_ns, c.block_ns, c.comm_ns) == (0, N * (L + 2 * W), N * (L + 2 * W))
    assert model.counters((2, 0)).compute_ns == N * (C + L + W)
    assert model.pe_counters(0).switch_ns == N * W


def test_a_spin_longer_than_the_wait_never_blocks() -> None:
    model = ring_beside_hogs(Control(wait=WaitMode.SPIN_BLOCK, spin_ns=2 * L))
    assert model.completion_ns(1) == N * (2 * C + L)
    c = model.counters((1, 1))
    assert (c.block_ns, c.spin_ns, c.poll_ns, c.wakeup_cpu_ns) == (0, N * L, N * L // 2, 0)


def test_a_stopped_rank_makes_its_partner_wait_and_continuing_it_costs_a_switch() -> None:
    model = CoschedModel(2, Costs(switch_ns=MS))
    model.add_job(0, 1, Program.balanced(2, 10 * MS, 4, Pattern.RING), [0, 1])
    model.control(5 * MS, (1, 1), Control(stopped=True))
    model.control(25 * MS, (1, 1), Control())
    model.run_until_done(LONG)
    # Rank 1 finishes its first computation at 25 + 1 (switch) + 5 = 31 ms instead of 10 ms.
    assert model.completion_ns(1) == 40 * MS + 21 * MS
    assert model.counters((1, 1)).stopped_ns == 20 * MS
    assert model.counters((1, 0)).poll_ns == 21 * MS
    assert model.pe_counters(1).switch_ns == MS
    assert model.pe_counters(0).switch_ns == 0


def test_a_blocked_rank_stopped_when_its_message_comes_wakes_only_when_continued() -> None:
    model = CoschedModel(2, Costs(wakeup_ns=W))
    block = Control(wait=WaitMode.SPIN_BLOCK, spin_ns=0)
    model.add_job(0, 1, Program((MS, 5 * MS), 1, Pattern.RING), [0, 1], block)
    model.control(2 * MS, (1, 0), Control(stopped=True, wait=WaitMode.SPIN_BLOCK, spin_ns=0))
    model.control(9 * MS, (1, 0), block)
    model.run_until_done(LONG)
    c = model.counters((1, 0))
    assert model.completion_ns(1) == 9 * MS + W
    assert (c.blocked_ns, c.stopped_ns, c.block_ns) == (MS, 7 * MS, 8 * MS + W)


def test_gang_scheduling_two_rings_with_a_context_switch_per_slice() -> None:
    slot, switch = 100 * MS, 10 * MS
    model = CoschedModel(2, Costs(switch_ns=switch))
    program = Program.balanced(2, 30 * MS, 6, Pattern.RING)
    model.add_job(0, 1, program, [0, 1])
    model.add_job(0, 2, program, [0, 1], Control(stopped=True))
    for n in range(1, 4):
        running, stopped = (1, 2) if n % 2 == 0 else (2, 1)
        for rank in (0, 1):
            model.control(n * slot, (stopped, rank), Control(stopped=True))
            model.control(n * slot, (running, rank), Control())
    model.run_until_done(LONG)
    # Job 1 runs in [0, 100) and [210, 290); job 2 in [110, 200) and [310, 400).
    assert model.completion_ns(1) == 290 * MS
    assert model.completion_ns(2) == 400 * MS
    pe = model.pe_counters(0)
    assert pe == PeCounters(busy_ns=360 * MS, switch_ns=30 * MS, idle_ns=10 * MS)
    assert elapsed(pe) == model.now
    assert model.counters((2, 0)).stopped_ns == 200 * MS


def test_the_wait_mode_is_read_when_a_call_begins() -> None:
    # Switching rank 0 to spin-block in the middle of its (polling) wait changes nothing until its next call.
    model = CoschedModel(2)
    model.add_job(0, 1, Program((MS, 10 * MS), 2, Pattern.RING), [0, 1])
    model.control(5 * MS, (1, 0), Control(wait=WaitMode.SPIN_BLOCK, spin_ns=0))
    model.run_until_done(LONG)
    c = model.counters((1, 0))
    assert c.poll_ns == 9 * MS and c.blocked_ns == 9 * MS and c.events == 2


def test_the_same_calls_give_the_same_run() -> None:
    def run() -> list[object]:
        model = CoschedModel(2, Costs(switch_ns=MS, wakeup_ns=W))
        for job in range(4):
            program = Program((3 * MS + job, 2 * MS), 20, Pattern.ALLREDUCE if job % 2 else Pattern.RING, 7)
            model.add_job(0, job, program, [job % 2, 1 - job % 2], Control(wait=WaitMode.SPIN_BLOCK))
        model.run_until_done(LONG)
        return [model.counters(key) for key in sorted(model.keys())] + [model.pe_counters(0), model.now]

    assert run() == run()


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="nice"):
        Control(nice=20)
    with pytest.raises(ValueError, match="placement"):
        CoschedModel(1).add_job(0, 1, Program.balanced(2, MS, 1), [0, 1])
    model = CoschedModel(1)
    model.advance(5)
    with pytest.raises(ValueError, match="forward"):
        model.advance(4)
