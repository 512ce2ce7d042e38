"""Moldable jobs in a scheduling pass (mm/sizing.py, mm/schedule_state.py): RTC-AD's sizes from the queue and
the free PEs, SUBSET's holds, and the queue's order by priority. Pure: no store, no clock."""

from __future__ import annotations

import pytest

from storm.mm.matrix import Matrix, Placement
from storm.mm.schedule_state import ScheduleState
from storm.mm.scheduler import PRIORITY, RESOURCES, QueuedJob
from storm.mm.sizing import HELD, pass_sizes


def machine(nodes: int = 2, pes: int = 4, mpl: int = 1) -> Matrix:
    matrix = Matrix(mpl)
    for i in range(nodes):
        matrix.add_node(f"n{i}", pes)
    return matrix


def started(state: ScheduleState, now: float) -> dict[int, int]:
    """Job id -> ranks of every job the pass at ``now`` starts."""
    return {start.job_id: start.placement.ranks for start in state.run_pass(now).starts}


def test_a_moldable_job_alone_gets_its_maximum_or_every_free_pe() -> None:
    state = ScheduleState(machine())  # 8 PEs
    state.enqueue(1, 2, None, max_ranks=6)
    assert started(state, 0.0) == {1: 6}
    state.enqueue(2, 1, None, max_ranks=16)
    assert started(state, 1.0) == {2: 2}  # the two PEs left, not its 16
    assert state.ranges == {}  # a started job's size is fixed


@pytest.mark.parametrize(("behind", "size"), [(0, 8), (1, 6), (2, 4), (3, 2), (6, 2)])
def test_the_longer_the_queue_behind_a_moldable_job_the_fewer_ranks_it_gets(behind: int, size: int) -> None:
    """RTC-AD: first fit at the minima, then the PEs they leave go to the moldable job (8 PEs, jobs of 2)."""
    state = ScheduleState(machine())
    state.enqueue(1, 2, None, max_ranks=8)
    for job_id in range(2, 2 + behind):
        state.enqueue(job_id, 2, None)
    sizes = started(state, 0.0)
    assert sizes[1] == size
    assert sum(sizes.values()) <= 8 and len(sizes) == 1 + min(behind, 3)


def test_moldable_jobs_share_the_leftover_equally_and_fixed_jobs_take_only_their_size() -> None:
    state = ScheduleState(machine())
    state.enqueue(1, 1, None, max_ranks=8)
    state.enqueue(2, 3, None)
    state.enqueue(3, 1, None, max_ranks=8)
    assert started(state, 0.0) == {1: 3, 2: 3, 3: 2}  # 3 PEs left after the minima: one more to the first


def test_a_moldable_job_that_does_not_fit_waits_at_its_minimum_and_gets_the_reservation() -> None:
    matrix = machine()
    state = ScheduleState(matrix)
    state.enqueue(1, 6, 100.0)
    assert started(state, 0.0) == {1: 6}
    state.enqueue(2, 4, None, max_ranks=8)  # 2 PEs free: not even its minimum fits
    state.enqueue(3, 2, 50.0)  # ends before job 1 does: may backfill
    plan = state.run_pass(1.0)
    assert [(s.job_id, s.placement.ranks) for s in plan.starts] == [(3, 2)]
    assert plan.reservation is not None and plan.reservation.job_id == 2
    assert plan.reservation.start == 100.0 and plan.reasons == {2: RESOURCES}


def test_a_higher_priority_goes_first_in_the_queue_and_first_come_first_served_within_one() -> None:
    state = ScheduleState(machine())
    state.enqueue(1, 8, None)
    state.enqueue(2, 8, None, priority=5)
    state.enqueue(3, 8, None, priority=5)
    plan = state.run_pass(0.0)
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.reasons == {3: RESOURCES, 1: PRIORITY}


def test_subset_commits_to_fewer_first_fit_jobs_as_the_system_fills_and_holds_back_the_others() -> None:
    """Minima 3, 3, 4, 4 on 8 PEs: first fit takes the two 3s (6 PEs); with 20 jobs in the system SUBSET
    commits to none of them and packs 4 + 4 = 8 instead. Jobs of a fixed size are never held back."""
    queue = [QueuedJob(i, size, None) for i, size in enumerate((3, 3, 4, 4))]
    ranges = {i: (q.ranks, 8) for i, q in enumerate(queue)}
    assert pass_sizes(queue, ranges, 8, jobs_in_system=20) == ({0: 4, 1: 4, 2: 4, 3: 4}, frozenset())
    sizes, held = pass_sizes(queue, ranges, 8, jobs_in_system=20, subset=True)
    assert (sizes, held) == ({0: 3, 1: 3, 2: 4, 3: 4}, frozenset({0, 1}))
    assert pass_sizes(queue, {2: (4, 8), 3: (4, 8)}, 8, jobs_in_system=20, subset=True)[1] == frozenset()
    state = ScheduleState(machine(), subset=True)
    for job in queue:
        state.enqueue(job.job_id + 1, job.ranks, None, max_ranks=8)
    for job_id in range(5, 21):  # the rest of the system: queued behind, too wide to start
        state.enqueue(job_id, 9, None)
    plan = state.run_pass(0.0)
    assert {s.job_id: s.placement.ranks for s in plan.starts} == {3: 4, 4: 4}
    assert plan.reasons[1] == plan.reasons[2] == HELD


def test_under_gang_scheduling_the_size_is_for_the_row_with_most_room() -> None:
    matrix = machine(mpl=2)
    state = ScheduleState(matrix)
    state.enqueue(1, 5, None)
    assert started(state, 0.0) == {1: 5}
    state.enqueue(2, 2, None, max_ranks=8)
    plan = state.run_pass(1.0)  # row 0 has 3 free, row 1 all 8: the job takes row 1, whole
    assert [(s.job_id, s.placement.row, s.placement.ranks) for s in plan.starts] == [(2, 1, 8)]


def test_a_restarted_mm_places_a_moldable_job_at_the_size_it_got() -> None:
    matrix = machine()
    state = ScheduleState(matrix)
    state.place(7, Placement(0, (("n0", 0), ("n0", 1), ("n0", 2))), 5.0, None, priority=3, since=6.0)
    assert matrix.placement_of(7) is not None and state.since[7] == 6.0 and state.priorities[7] == 3
    state.enqueue(8, 1, None, max_ranks=8)
    assert started(state, 7.0) == {8: 5}
