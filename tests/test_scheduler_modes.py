"""Backfill modes (easy, conservative, none) and the fast scheduler against the plain reference."""

from __future__ import annotations

import math

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from storm.mm import matrix as matrix_module
from storm.mm.free_profile import FreeProfile
from storm.mm.matrix import Matrix
from storm.mm.scheduler import BACKFILL_MODES, Plan, QueuedJob, Reservation, RunningJob, schedule
from tests.scheduler_reference import ReferenceMatrix, reference_schedule
from tests.test_scheduler import cluster, q, started

PARTITION = "PartitionConfig: needs 9 PEs, the cluster has 8"


def test_easy_backfills_a_job_that_would_delay_the_second_reservation() -> None:
    # 6 PEs, job 1 holds 4 until 100. The head (4 PEs) reserves [100, 150) with 2 PEs extra; job 11 needs
    # all 6 and, under conservative backfilling, reserves them from 150 on. Job 12 (2 PEs, 1000 s) fits
    # now and in EASY's extra PEs, but would still hold them at 150: conservative keeps it waiting.
    queue = [q(10, 4, 50), q(11, 6, 10), q(12, 2, 1000)]
    matrix, running = cluster({"n1": 6}, runs=[(1, 4, 0.0, 100.0, None, None)])
    easy = schedule(0.0, queue, running, matrix, backfill="easy")
    assert started(easy) == [(12, True)]
    assert easy.reasons == {10: "Resources", 11: "Priority"}
    assert easy.reservation == Reservation(job_id=10, row=0, start=100.0, extra=0)

    matrix, running = cluster({"n1": 6}, runs=[(1, 4, 0.0, 100.0, None, None)])
    conservative = schedule(0.0, queue, running, matrix, backfill="conservative")
    assert conservative.starts == ()
    assert conservative.reasons == {10: "Resources", 11: "Priority", 12: "Priority"}
    # The head's reservation is EASY's; its 2 extra PEs stay free since nothing else runs then.
    assert conservative.reservation == Reservation(job_id=10, row=0, start=100.0, extra=2)
    assert conservative.reservations == {
        10: Reservation(10, 0, 100.0, 2),
        11: Reservation(11, 0, 150.0, 0),
        12: Reservation(12, 0, 160.0, 4),  # after job 11's 10 s: the first time 2 PEs stay free for 1000 s
    }
    assert matrix.jobs().keys() == {1}


def test_conservative_starts_a_job_that_delays_no_reservation() -> None:
    # As above, but job 12 ends (at 140) before job 11 needs its PEs at 150: it starts now, using the head's
    # extra PEs, so they are no longer extra at 100.
    queue = [q(10, 4, 50), q(11, 6, 10), q(12, 2, 140)]
    matrix, running = cluster({"n1": 6}, runs=[(1, 4, 0.0, 100.0, None, None)])
    plan = schedule(0.0, queue, running, matrix, backfill="conservative")
    assert started(plan) == [(12, True)]
    assert plan.reservations == {10: Reservation(10, 0, 100.0, 0), 11: Reservation(11, 0, 150.0, 0)}


def test_none_blocks_behind_the_head_but_not_behind_a_too_wide_job() -> None:
    # 8 PEs, job 1 holds 4 until 100. Job 10 is wider than the cluster: skipped. Job 11 starts; job 12 (all
    # 8 PEs) is the head. EASY would start 13 (ends by 100) and 15 (ends at 50); strict FCFS starts neither.
    queue = [q(10, 9, 10), q(11, 2, 10), q(12, 8, 10), q(13, 1, 10), q(14, 9, 10), q(15, 1, 50)]
    matrix, running = cluster({"n1": 8}, runs=[(1, 4, 0.0, 100.0, None, None)])
    plan = schedule(0.0, queue, running, matrix, backfill="none")
    assert started(plan) == [(11, False)]
    assert plan.reasons == {10: PARTITION, 12: "Resources", 13: "Priority", 14: PARTITION, 15: "Priority"}
    assert plan.reservation == Reservation(job_id=12, row=0, start=100.0, extra=0)
    assert matrix.jobs().keys() == {1, 11}

    matrix, running = cluster({"n1": 8}, runs=[(1, 4, 0.0, 100.0, None, None)])
    easy = schedule(0.0, queue, running, matrix)
    assert started(easy) == [(11, False), (13, True), (15, True)]


def test_an_unknown_mode_is_refused_before_anything_starts() -> None:
    matrix, running = cluster({"n1": 4})
    with pytest.raises(ValueError, match="backfill must be one of easy, conservative, none"):
        schedule(0.0, [q(1, 1, 10)], running, matrix, backfill="aggressive")
    assert matrix.jobs() == {}


def test_a_profile_search_that_found_nothing_for_one_duration_still_finds_a_shorter_one() -> None:
    """Found by the property below: 3 PEs free now, 2 from 75 on. No unlimited 3-PE job ever fits, asked
    twice (the second search starts where the first left off, past every step); a 15 s one fits now. The
    second search once concluded that no step ever had 3 PEs free, and the third believed it."""
    profile = FreeProfile(50.0, 3, [(75.0, 0)])  # a step at 75 (a job ending then on no usable PE)
    profile.take(75.0, math.inf, 1)  # and a reservation from 75 on
    assert (profile.times, profile.free) == ([50.0, 75.0], [3, 2])
    assert profile.earliest(3, math.inf) == math.inf
    assert profile.earliest(3, math.inf) == math.inf
    assert profile.earliest(3, 15.0) == 50.0
    assert profile.earliest(3, 30.0) == math.inf  # 50 + 30 runs into the step with 2


# --------------------------------------------------------------------------------------------------------
# Property: on random clusters, running sets, usable sets, queues and MPLs, the fast scheduler decides
# exactly what the plain reference (the code before the free counts, plus brute-force modes) decides.

NAMES = ["n1", "n2", "n3", "n10"]
limits = st.sampled_from([None, 5.0, 10.0, 25.0, 50.0, 200.0])


@pytest.mark.parametrize("max_skipped", [0, 64])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_fast_and_reference_agree(data: st.DataObject, max_skipped: int) -> None:
    saved = matrix_module.MAX_SKIPPED
    matrix_module.MAX_SKIPPED = max_skipped  # 0: the walk over usable nodes, 64: the bucket path
    try:
        check_agreement(data)
    finally:
        matrix_module.MAX_SKIPPED = saved


def check_agreement(data: st.DataObject) -> None:
    names = NAMES[: data.draw(st.integers(1, 4), label="nodes")]
    nodes = {name: data.draw(st.integers(1, 5), label=f"pes {name}") for name in names}
    mpl = data.draw(st.integers(1, 3), label="mpl")
    mode = data.draw(st.sampled_from(BACKFILL_MODES), label="mode")
    # None (all nodes), some of them (with a name the matrix does not know), or rarely none at all.
    some = st.sets(st.sampled_from(names), min_size=1).map(lambda chosen: sorted({*chosen, "ghost"}))
    kind = data.draw(st.sampled_from(["all", "some", "some", "nothing"]), label="usable kind")
    usable = None if kind == "all" else [] if kind == "nothing" else data.draw(some, label="usable")
    now = 50.0
    fast, plain = Matrix(mpl), ReferenceMatrix(mpl)
    for name, pes in nodes.items():
        fast.add_node(name, pes)
        plain.add_node(name, pes)
    running: dict[int, RunningJob] = {}
    job_id = 0
    for row in range(mpl):  # a few jobs in every row, so that rows are mostly busy and heads common
        for ranks in data.draw(
            st.lists(st.integers(1, 5), min_size=1, max_size=5), label=f"running in row {row}"
        ):
            where = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(names), min_size=1)))
            placement = plain.find(ranks, where, row)
            if placement is None:
                continue
            job_id += 1
            fast.assign(job_id, placement)
            plain.assign(job_id, placement)
            if data.draw(st.integers(0, 4)):  # else missing from running: counts as unlimited
                began = data.draw(st.sampled_from([0.0, 30.0, 45.0, 50.0]))
                running[job_id] = RunningJob(job_id, began, data.draw(limits))
    total = plain.total_pes(usable)
    # Mostly jobs that fit the usable PEs, a few that never can (they must not block anything).
    width = st.integers(1, max(1, total)) | st.just(total + 1)
    widths = data.draw(st.lists(width, min_size=1, max_size=12), label="widths")
    most_free = max(plain.free_pes(row, usable) for row in range(mpl))
    if most_free < total and data.draw(st.integers(0, 3), label="head first"):
        # Mostly a job early in the queue that does not fit now: a head, and jobs behind it to backfill.
        widths.insert(data.draw(st.integers(0, 2)), data.draw(st.integers(most_free + 1, total)))
    queue = [QueuedJob(100 + i, ranks, data.draw(limits)) for i, ranks in enumerate(widths)]

    expected = reference_schedule(now, queue, running, plain, usable, backfill=mode)
    plan = schedule(now, queue, running, fast, usable, backfill=mode)

    assert plan == expected
    assert fast.jobs() == plain.jobs()
    assert fast.counted() == fast.recount()
    backfilled = sum(start.backfilled for start in plan.starts)
    event(f"{mode}: backfilled {min(backfilled, 2)}, reservations {min(len(plan.reservations), 3)}")
    if mode == "conservative" and plan.reservation is not None:
        # Only running jobs precede the head in the profile: it reserves where and when EASY's head would.
        easy_matrix = ReferenceMatrix(mpl)
        for name, pes in nodes.items():
            easy_matrix.add_node(name, pes)
        for job_id, placement in fast.jobs().items():
            if job_id < 100:
                easy_matrix.assign(job_id, placement)
        easy = reference_schedule(now, queue, running, easy_matrix, usable, backfill="easy")
        assert easy.reservation is not None
        assert (easy.reservation.row, easy.reservation.start) == (
            plan.reservation.row,
            plan.reservation.start,
        )


def test_plan_has_no_reservations_when_everything_starts() -> None:
    matrix, running = cluster({"n1": 4})
    for mode in BACKFILL_MODES:
        plan = schedule(0.0, [q(len(matrix.jobs()) + 1, 1, 10)], running, matrix, backfill=mode)
        assert plan == Plan(plan.starts, None, {}, {})
        assert len(plan.starts) == 1
