"""The gang cycle: row rotation and suspended-time accounting, with time passed in."""

from __future__ import annotations

import pytest

from storm.mm.slots import GangCycle


def test_rows_take_turns_skipping_empty_ones() -> None:
    cycle = GangCycle(slice=0.1)
    rows = {1: 0, 2: 2}
    seen = [cycle.advance(t / 10, [0, 2], rows) for t in range(5)]
    assert seen == [0, 2, 0, 2, 0]
    assert cycle.seq == 5


def test_a_single_row_runs_all_the_time() -> None:
    cycle = GangCycle(slice=0.1)
    cycle.add(7, 0.0)
    assert [cycle.advance(t / 10, [1], {7: 1}) for t in range(4)] == [1, 1, 1, 1]
    assert cycle.suspended_time(7, 1, 0.45) == 0.0


def test_an_empty_matrix_has_no_active_row() -> None:
    cycle = GangCycle(slice=0.1)
    assert cycle.advance(0.0, [], {}) is None
    assert cycle.active is None and cycle.seq == 1


def test_each_job_is_charged_the_slices_of_other_rows() -> None:
    cycle = GangCycle(slice=0.1)
    rows = {1: 0, 2: 1}
    cycle.add(1, 0.0)
    cycle.add(2, 0.0)
    for t in (0.0, 0.1, 0.2, 0.3):  # rows 0, 1, 0, 1
        cycle.advance(t, [0, 1], rows)
    cycle.account(0.4, rows)
    assert cycle.suspended[1] == pytest.approx(0.2)  # rows 1 ran in [0.1, 0.2) and [0.3, 0.4)
    assert cycle.suspended[2] == pytest.approx(0.2)


def test_a_job_starting_mid_slice_is_charged_from_its_start_only() -> None:
    cycle = GangCycle(slice=0.1)
    cycle.add(1, 0.0)
    cycle.advance(0.0, [0], {1: 0})  # row 0 runs
    cycle.add(2, 0.04)  # placed in row 1, which is not running
    assert cycle.suspended_time(2, 1, 0.1) == pytest.approx(0.06)
    cycle.advance(0.1, [0, 1], {1: 0, 2: 1})  # now row 1 runs
    assert cycle.suspended[2] == pytest.approx(0.06)
    assert cycle.suspended_time(1, 0, 0.15) == pytest.approx(0.05)  # the current slice counts
    assert cycle.forget(2) == pytest.approx(0.06)
    assert 2 not in cycle.suspended


def test_accounting_before_a_move_charges_the_old_row() -> None:
    cycle = GangCycle(slice=0.1)
    cycle.add(1, 0.0)
    cycle.add(2, 0.0)
    cycle.advance(0.0, [0, 1], {1: 0, 2: 1})  # row 0 runs; job 2 waits in row 1
    cycle.account(0.05, {1: 0, 2: 1})  # job 1 ended at 0.05; job 2 is about to move to row 0
    cycle.forget(1)
    assert cycle.suspended_time(2, 0, 0.1) == pytest.approx(0.05)  # in the running row from 0.05 on


def test_fcs_resets_each_job_every_tslots_max_of_its_own_slots() -> None:
    cycle = GangCycle(slice=0.1, tslots_max=3)
    rows = {1: 0, 2: 1}
    resets = []
    for t in range(13):  # rows 0, 1, 0, 1, ...: each job gets a slot every other beat
        cycle.advance(t / 10, [0, 1], rows)
        resets.append(cycle.resets)
    # A slot ends at the beat after its row became active: job 1's 3rd and 6th end at beats 5 and 11.
    assert [(beat, r) for beat, r in enumerate(resets) if r] == [(5, (1,)), (6, (2,)), (11, (1,)), (12, (2,))]
    assert cycle.slots == {1: 6, 2: 6}


def test_gang_never_resets_and_a_forgotten_job_starts_counting_again() -> None:
    gang = GangCycle(slice=0.1)
    for t in range(40):
        gang.advance(t / 10, [0], {1: 0})
        assert gang.resets == ()
    fcs = GangCycle(slice=0.1, tslots_max=2)
    fcs.advance(0.0, [0], {1: 0})
    fcs.advance(0.1, [0], {1: 0})  # job 1's first slot ended
    fcs.forget(1)
    fcs.advance(0.2, [0], {1: 0})  # counted from scratch: one slot, no reset yet
    assert fcs.resets == () and fcs.slots == {1: 1}


def test_a_job_counts_whole_slots_only_even_one_started_in_an_empty_matrix() -> None:
    cycle = GangCycle(slice=0.1, tslots_max=2)
    assert cycle.advance(0.0, [], {}) is None  # the heartbeat names row 0, where a new job runs at once
    cycle.advance(0.1, [0], {1: 0})  # job 1 was placed mid-slot: not a whole slot of its own
    assert cycle.slots == {}
    cycle.advance(0.2, [0], {1: 0})
    assert cycle.slots == {1: 1}  # row 0 was named by the last heartbeat, and job 1 there all along
    cycle.advance(0.3, [0], {1: 0})
    assert cycle.resets == (1,)
