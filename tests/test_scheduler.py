"""FCFS with EASY backfilling on the matrix: starts, the head's reservation, and reasons for waiting."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from storm.mm.matrix import Matrix, Placement
from storm.mm.scheduler import Plan, QueuedJob, Reservation, RunningJob, schedule

# (job id, ranks, start time, time limit, usable nodes, row) of a job already in the matrix.
Run = tuple[int, int, float, float | None, Collection[str] | None, int | None]


def cluster(
    nodes: dict[str, int], mpl: int = 1, runs: Sequence[Run] = ()
) -> tuple[Matrix, dict[int, RunningJob]]:
    matrix = Matrix(mpl)
    for node, pes in nodes.items():
        matrix.add_node(node, pes)
    running: dict[int, RunningJob] = {}
    for job_id, ranks, start, limit, usable, row in runs:
        placement = matrix.find(ranks, usable, row)
        assert placement is not None, f"test setup: job {job_id} does not fit"
        matrix.assign(job_id, placement)
        running[job_id] = RunningJob(job_id, start, limit)
    return matrix, running


def q(job_id: int, ranks: int, limit: float | None) -> QueuedJob:
    return QueuedJob(job_id, ranks, limit)


def started(plan: Plan) -> list[tuple[int, bool]]:
    return [(start.job_id, start.backfilled) for start in plan.starts]


def test_fcfs_starts_in_order_and_stops_at_the_first_job_that_does_not_fit() -> None:
    matrix, running = cluster({"n1": 8})
    queue = [q(1, 4, 100), q(2, 2, 100), q(3, 4, 100), q(4, 4, 10), q(5, 3, 1)]
    plan = schedule(10.0, queue, running, matrix)
    assert started(plan) == [(1, False), (2, False)]
    assert plan.reasons == {3: "Resources", 4: "Priority", 5: "Priority"}
    # The starts are committed, where the plan says.
    for start in plan.starts:
        assert matrix.placement_of(start.job_id) == start.placement
    assert matrix.free_pes(0) == 2
    # Jobs 1 and 2 started now count as running until now + limit: both free their PEs at 110.
    assert plan.reservation == Reservation(job_id=3, row=0, start=110.0, extra=4)


@pytest.mark.parametrize(("limit", "admitted"), [(90.0, True), (91.0, False)])
def test_backfill_only_when_it_ends_by_the_shadow_time(limit: float, admitted: bool) -> None:
    # A (6 of 8 PEs) ends at 100; the head needs all 8, so nothing is extra and only time can admit B.
    matrix, running = cluster({"n1": 8}, runs=[(1, 6, 0.0, 100.0, None, None)])
    plan = schedule(10.0, [q(2, 8, 50), q(3, 2, limit)], running, matrix)
    assert plan.reservation == Reservation(job_id=2, row=0, start=100.0, extra=0)
    if admitted:
        assert started(plan) == [(3, True)]
        assert plan.starts[0].placement == Placement(0, (("n1", 6), ("n1", 7)))
        assert plan.reasons == {2: "Resources"}
    else:
        assert plan.starts == ()
        assert plan.reasons == {2: "Resources", 3: "Priority"}
        assert matrix.placement_of(3) is None


def test_long_jobs_use_extra_pes_and_consume_them() -> None:
    # 10 PEs, A holds 6 until 100, the head needs 8: at 100 two PEs are extra.
    matrix, running = cluster({"n1": 10}, runs=[(1, 6, 0.0, 100.0, None, None)])
    queue = [q(2, 8, 10), q(3, 2, 1000), q(4, 2, 1000), q(5, 2, 50)]
    plan = schedule(0.0, queue, running, matrix)
    # Job 3 takes the extra PEs; job 4 would fit now but would delay the head; job 5 ends before 100.
    assert started(plan) == [(3, True), (5, True)]
    assert plan.reasons == {2: "Resources", 4: "Priority"}
    assert plan.reservation == Reservation(job_id=2, row=0, start=100.0, extra=0)


def test_unlimited_jobs_only_in_extra_pes() -> None:
    matrix, running = cluster({"n1": 10}, runs=[(1, 6, 0.0, 100.0, None, None)])
    queue = [q(2, 8, 10), q(3, 3, None), q(4, 2, None), q(5, 1, None)]
    plan = schedule(0.0, queue, running, matrix)
    # Job 3 fits now (4 free) but is wider than the 2 extra PEs; job 4 takes them; none left for job 5.
    assert started(plan) == [(4, True)]
    assert plan.reasons == {2: "Resources", 3: "Priority", 5: "Priority"}


def test_a_job_missing_from_running_counts_as_unlimited() -> None:
    matrix, _ = cluster({"n1": 10}, runs=[(1, 6, 0.0, 100.0, None, None)])
    queue = [q(2, 8, 10), q(3, 1, 1e6), q(4, 3, None), q(5, 2, None)]
    plan = schedule(0.0, queue, {}, matrix)
    # Job 1 may never end, so the head waits "forever"; with every PE free then, 10 - 8 = 2 are extra.
    # Any finite job ends before that; an unlimited one has to fit in the extra PEs: job 5 takes both.
    assert plan.reservation == Reservation(job_id=2, row=0, start=math.inf, extra=0)
    assert started(plan) == [(3, True), (5, True)]
    assert plan.reasons == {2: "Resources", 4: "Priority"}


def test_oversize_job_gets_partition_config_and_does_not_block() -> None:
    matrix, running = cluster({"n1": 4, "n2": 4})
    queue = [q(1, 9, 10), q(2, 4, 10), q(3, 4, 10), q(4, 9, 10), q(5, 4, 10)]
    plan = schedule(0.0, queue, running, matrix, usable=["n1", "n2", "unknown"])
    # Job 1 is skipped, not a head: jobs 2 and 3 start in FCFS order, and job 5 is the head.
    assert started(plan) == [(2, False), (3, False)]
    assert plan.reasons == {
        1: "PartitionConfig: needs 9 PEs, the cluster has 8",
        4: "PartitionConfig: needs 9 PEs, the cluster has 8",
        5: "Resources",
    }
    assert plan.reservation is not None
    assert plan.reservation.job_id == 5
    # Restricted to one node, a 5-rank job can never start, and the reason gives the usable size.
    matrix, running = cluster({"n1": 4, "n2": 4})
    plan = schedule(0.0, [q(1, 5, 10), q(2, 4, 10)], running, matrix, usable=["n2"])
    assert plan.reasons == {1: "PartitionConfig: needs 5 PEs, the cluster has 4"}
    assert started(plan) == [(2, False)]
    assert plan.starts[0].placement.nodes == ("n2",)
    assert plan.reservation is None


def test_usable_nodes_bound_placements_and_the_shadow_time() -> None:
    # Job 1 on n1 ends soon, but n1 is not usable: only job 2 on n2 can free PEs for the head.
    runs: list[Run] = [(1, 4, 0.0, 10.0, ["n1"], None), (2, 2, 0.0, 100.0, ["n2"], None)]
    matrix, running = cluster({"n1": 4, "n2": 4}, runs=runs)
    plan = schedule(0.0, [q(3, 4, 10), q(4, 2, 100)], running, matrix, usable={"n2"})
    assert plan.reservation == Reservation(job_id=3, row=0, start=100.0, extra=0)
    assert started(plan) == [(4, True)]
    assert plan.starts[0].placement.nodes == ("n2",)


def test_mpl_stretches_the_backfill_estimate() -> None:
    # The same shadow time (100) and the same candidate (2 PEs, 60 s): it ends at 60 alone on the
    # machine, but at 120 when it shares its PEs with another row.
    queue = [q(10, 4, 10), q(11, 2, 60), q(12, 1, None)]
    matrix, running = cluster({"n1": 4}, mpl=1, runs=[(1, 2, 0.0, 100.0, None, None)])
    plan = schedule(0.0, queue, running, matrix)
    assert plan.reservation == Reservation(job_id=10, row=0, start=100.0, extra=0)
    assert started(plan) == [(11, True)]
    assert plan.reasons == {10: "Resources", 12: "Priority"}

    # mpl = 2: job 1's 50 s limit stretches to 100. Row 1 is nearly full with a long job, so its shadow
    # is later and the reservation stays in row 0.
    runs: list[Run] = [(1, 2, 0.0, 50.0, None, 0), (2, 3, 0.0, 1000.0, None, 1)]
    matrix, running = cluster({"n1": 4}, mpl=2, runs=runs)
    plan = schedule(0.0, queue, running, matrix)
    assert plan.reservation == Reservation(job_id=10, row=0, start=100.0, extra=0)
    # Job 11 would overrun the shadow in row 0 and is too wide for row 1; job 12 (unlimited) may not use
    # row 0 at all, but takes row 1's last PE freely.
    assert started(plan) == [(12, True)]
    assert plan.starts[0].placement == Placement(1, (("n1", 3),))
    assert plan.reasons == {10: "Resources", 11: "Priority"}


def test_reservation_picks_the_earliest_row_and_counts_ties_as_extra() -> None:
    runs: list[Run] = [
        (1, 6, 0.0, 100.0, None, 0),  # row 0: ends at 200 with mpl 2
        (2, 2, 0.0, 300.0, None, 0),  # row 0: ends at 600
        (3, 4, 0.0, 50.0, None, 1),  # row 1: ends at 100
        (4, 4, 0.0, 50.0, None, 1),  # row 1: ends at 100 too
    ]
    matrix, running = cluster({"n1": 8}, mpl=2, runs=runs)
    plan = schedule(0.0, [q(5, 4, 10)], running, matrix)
    # Row 0 could take the head at 200; row 1 at 100, when jobs 3 and 4 free 8 PEs together: 4 extra.
    assert plan.reservation == Reservation(job_id=5, row=1, start=100.0, extra=4)
    assert plan.reasons == {5: "Resources"}


def test_reservation_ties_go_to_the_lowest_row() -> None:
    runs: list[Run] = [(1, 4, 0.0, 50.0, None, 0), (2, 4, 0.0, 50.0, None, 1)]
    matrix, running = cluster({"n1": 4}, mpl=2, runs=runs)
    plan = schedule(0.0, [q(3, 4, 10)], running, matrix)
    assert plan.reservation == Reservation(job_id=3, row=0, start=100.0, extra=0)


def test_backfill_prefers_rows_other_than_the_reserved_one() -> None:
    # Row 0 frees 4 PEs at 100 (head needs 3: 1 extra); row 1 only at 200, so the head reserves row 0.
    runs: list[Run] = [(1, 2, 0.0, 50.0, None, 0), (2, 3, 0.0, 100.0, None, 1)]
    matrix, running = cluster({"n1": 4}, mpl=2, runs=runs)
    plan = schedule(0.0, [q(3, 3, 10), q(4, 1, 1000), q(5, 1, 1000)], running, matrix)
    # Job 4 could use row 0's extra PE but takes row 1's free PE, leaving the extra PE for job 5.
    assert [(s.job_id, s.placement.row) for s in plan.starts] == [(4, 1), (5, 0)]
    assert all(s.backfilled for s in plan.starts)
    assert plan.reservation == Reservation(job_id=3, row=0, start=100.0, extra=0)


def test_a_running_job_past_its_estimate_ends_now() -> None:
    matrix, running = cluster({"n1": 4}, runs=[(1, 2, 0.0, 10.0, None, None)])
    plan = schedule(50.0, [q(2, 4, 10), q(3, 1, 1), q(4, 2, 5)], running, matrix)
    # Job 1 should have ended at 10: the head may start any moment, so nothing may delay it.
    assert plan.reservation == Reservation(job_id=2, row=0, start=50.0, extra=0)
    assert plan.starts == ()
    assert plan.reasons == {2: "Resources", 3: "Priority", 4: "Priority"}


def test_schedule_is_deterministic() -> None:
    runs: list[Run] = [
        (1, 3, 0.0, 100.0, None, 0),
        (2, 3, 0.0, 100.0, None, 0),
        (3, 5, 0.0, None, None, 1),
        (4, 1, 5.0, 20.0, None, 1),
    ]
    queue = [q(10, 7, 50), q(11, 2, 30), q(12, 1, None), q(13, 2, 500), q(14, 1, 10), q(15, 3, 1)]
    nodes = {"node10": 3, "node2": 2, "node9": 3}
    matrix_a, running_a = cluster(nodes, mpl=2, runs=runs)
    matrix_b, running_b = cluster(dict(reversed(nodes.items())), mpl=2, runs=runs)
    plan_a = schedule(10.0, queue, running_a, matrix_a)
    plan_b = schedule(10.0, queue, dict(reversed(running_b.items())), matrix_b)
    assert plan_a == plan_b
    assert matrix_a.cells() == matrix_b.cells()
    assert plan_a.starts  # the scenario does start something, so the comparison covers placements


def test_invalid_input_is_refused() -> None:
    matrix, running = cluster({"n1": 4}, runs=[(1, 2, 0.0, 10.0, None, None)])
    with pytest.raises(ValueError, match="twice"):
        schedule(0.0, [q(2, 1, 1), q(2, 1, 1)], running, matrix)
    with pytest.raises(ValueError, match="already in the matrix"):
        schedule(0.0, [q(1, 1, 1)], running, matrix)
    assert matrix.jobs().keys() == {1}  # refused before anything was committed
    with pytest.raises(ValueError):
        QueuedJob(5, 0, 10)
    with pytest.raises(ValueError):
        QueuedJob(5, 1, 0)
    with pytest.raises(ValueError):
        RunningJob(5, 0.0, math.nan)


# --------------------------------------------------------------------------------------------------------
# Property: assuming every job ends exactly at its estimate, the head can start in its reserved row at the
# shadow time (no backfill delayed it), it could not start in any row before then, and the reported extra
# PEs are exactly what is left over in that row at that time.


def estimated_end(now: float, start: float, limit: float | None, mpl: int) -> float:
    return math.inf if limit is None else max(now, start + limit * mpl)


def matrix_at(matrix: Matrix, jobs: dict[int, Placement], ends: dict[int, float], keep: float) -> Matrix:
    """A copy of ``matrix`` holding only the jobs whose estimated end is after ``keep``."""
    copy = Matrix(matrix.mpl)
    for node, pes in matrix.nodes().items():
        copy.add_node(node, pes)
    for job_id, placement in jobs.items():
        if ends[job_id] > keep:
            copy.assign(job_id, placement)
    return copy


# Few, round values, so that jobs often end at the same time or exactly at the shadow time.
limits = st.sampled_from([None, 5.0, 10.0, 25.0, 50.0])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_backfill_never_delays_the_head(data: st.DataObject) -> None:
    names = ["n1", "n2", "n3"][: data.draw(st.integers(1, 3), label="nodes")]
    nodes = {name: data.draw(st.integers(2, 6), label=f"pes {name}") for name in names}
    mpl = data.draw(st.integers(1, 2), label="mpl")
    usable = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(names), min_size=1)), label="usable")
    now = 50.0
    matrix, running = cluster(nodes, mpl)
    ends: dict[int, float] = {}
    for job_id in range(1, data.draw(st.integers(0, 5), label="running") + 1):
        placement = matrix.find(data.draw(st.integers(1, 4)), row=data.draw(st.integers(0, mpl - 1)))
        if placement is None:
            continue
        began, limit = data.draw(st.sampled_from([30.0, 40.0, 50.0])), data.draw(limits)
        matrix.assign(job_id, placement)
        running[job_id] = RunningJob(job_id, began, limit)
        ends[job_id] = estimated_end(now, began, limit, mpl)
    # Mostly a first job that does not fit now, and narrow ones behind it to backfill.
    total = matrix.total_pes(usable)
    most_free = max(matrix.free_pes(row, usable) for row in range(mpl))
    wide = st.integers(most_free + 1, total) if most_free < total else st.integers(1, total + 1)
    widths = [data.draw(wide), *data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=6))]
    queue = [QueuedJob(100 + i, ranks, data.draw(limits)) for i, ranks in enumerate(widths)]
    before = matrix.jobs()

    plan = schedule(now, queue, running, matrix, usable)

    limits_of = {job.job_id: job.time_limit for job in queue}
    for start in plan.starts:
        ends[start.job_id] = estimated_end(now, now, limits_of[start.job_id], mpl)
        assert usable is None or set(start.placement.nodes) <= usable
    assert sorted([*plan.reasons, *(s.job_id for s in plan.starts)]) == sorted(limits_of)
    reservation = plan.reservation
    if reservation is None:
        assert "Resources" not in plan.reasons.values()
        return
    head = next(job for job in queue if job.job_id == reservation.job_id)
    assert plan.reasons[head.job_id] == "Resources"
    if not math.isfinite(reservation.start):
        return
    event("finite reservation")
    in_row = [s for s in plan.starts if s.backfilled and s.placement.row == reservation.row]
    event(f"backfills into the reserved row: {min(len(in_row), 2)}")

    at_shadow = matrix_at(matrix, matrix.jobs(), ends, reservation.start)
    assert at_shadow.free_pes(reservation.row, usable) - head.ranks == reservation.extra >= 0
    # Earliest: in the state the reservation was computed from (before backfilling), the head fits in no
    # row during the last interval before the shadow time.
    fcfs = before | {s.job_id: s.placement for s in plan.starts if not s.backfilled}
    just_before = max((end for end in ends.values() if end < reservation.start), default=-math.inf)
    assert matrix_at(matrix, fcfs, ends, just_before).find(head.ranks, usable) is None
