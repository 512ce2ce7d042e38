"""mm/schedule_state.py: the scheduler's view of the jobs, kept between passes."""

from __future__ import annotations

import pytest

from storm.mm.matrix import Matrix, Placement
from storm.mm.schedule_state import ScheduleState


def state(pes: int = 4, backfill: str = "easy") -> ScheduleState:
    matrix = Matrix(1)
    matrix.add_node("n0", pes)
    return ScheduleState(matrix, backfill)


def test_a_pass_starts_what_fits_in_queue_order_and_keeps_the_rest_queued() -> None:
    s = state()
    s.enqueue(1, 3, 10.0)
    s.enqueue(2, 3, 10.0)
    s.enqueue(3, 1, 5.0)  # fits beside job 1 and ends before job 2 could start: backfilled
    plan = s.run_pass(100.0)
    assert [start.job_id for start in plan.starts] == [1, 3]
    assert list(s.queued) == [2]
    assert {j: (r.start_time, r.time_limit) for j, r in s.running.items()} == {
        1: (100.0, 10.0),
        3: (100.0, 5.0),
    }
    assert s.matrix.free_pes(0) == 0


def test_an_end_frees_the_pes_for_the_next_pass() -> None:
    s = state()
    s.enqueue(1, 4, None)
    s.enqueue(2, 2, None)
    s.run_pass(0.0)
    assert list(s.queued) == [2]
    placement = s.end(1)
    assert placement is not None and len(placement.pes) == 4 and 1 not in s.running
    assert [start.job_id for start in s.run_pass(1.0).starts] == [2]
    assert s.end(1) is None  # ended already: nothing to free


def test_held_jobs_wait_without_losing_their_place() -> None:
    s = state()
    s.enqueue(1, 2, None)
    s.enqueue(2, 2, None)
    assert [start.job_id for start in s.run_pass(0.0, held={1}).starts] == [2]
    assert list(s.queued) == [1]
    assert [start.job_id for start in s.run_pass(1.0).starts] == [1]


def test_a_job_started_at_time_zero_counts_as_started_then() -> None:
    """EASY's shadow time comes from when running jobs started: 0.0 is a start like any other."""
    s = state(backfill="easy")
    s.enqueue(1, 4, 10.0)
    s.run_pass(0.0)
    s.enqueue(2, 4, 10.0)
    plan = s.run_pass(4.0)
    assert plan.reservation is not None and plan.reservation.start == 10.0


def test_recovered_placements_and_bad_calls() -> None:
    s = state()
    s.place(7, Placement(0, (("n0", 0), ("n0", 1))), 3.0, None)
    assert s.matrix.free_pes(0) == 2 and s.running[7].start_time == 3.0
    with pytest.raises(ValueError, match="queued or placed already"):
        s.enqueue(7, 1, None)
    s.enqueue(8, 1, None)
    with pytest.raises(ValueError, match="queued or placed already"):
        s.enqueue(8, 1, None)
    s.withdraw(8)
    assert not s.queued
    with pytest.raises(KeyError):
        s.withdraw(8)
    with pytest.raises(ValueError, match="backfill must be one of"):
        ScheduleState(Matrix(1), "greedy")
