"""The matrix's incremental free counts against a recount, and its placements against the plain scan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm import matrix as matrix_module
from storm.mm.matrix import Matrix
from tests.scheduler_reference import ReferenceMatrix

NAMES = ["n1", "n2", "n3", "n10", "gpu1"]


def check_counts(matrix: Matrix, usable: frozenset[str]) -> None:
    recount = matrix.recount()
    assert matrix.counted() == recount
    for row, free in enumerate(recount):
        assert matrix.free_pes(row) == sum(free.values())
        assert matrix.free_pes(row, usable) == sum(n for node, n in free.items() if node in usable)


@pytest.mark.parametrize("max_skipped", [0, 64])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_counts_and_placements_follow_every_change(data: st.DataObject, max_skipped: int) -> None:
    """Random add_node/assign/release/move/compact sequences: after each step the kept counts equal a
    recount from the cells, and find() chooses what the plain scan of every node chooses, through the bucket
    path (max_skipped 64) and the walk over usable nodes (0)."""
    saved = matrix_module.MAX_SKIPPED
    matrix_module.MAX_SKIPPED = max_skipped
    try:
        mpl = data.draw(st.integers(1, 3), label="mpl")
        fast, plain = Matrix(mpl), ReferenceMatrix(mpl)
        # One frozenset object for the whole run, as the scheduler passes: the matrix keeps its counts.
        usable = frozenset(data.draw(st.sets(st.sampled_from([*NAMES, "ghost"])), label="usable"))
        next_id = 1
        for _ in range(data.draw(st.integers(1, 25), label="steps")):
            step = data.draw(
                st.sampled_from(["add", "place", "place", "place", "release", "move", "compact"])
            )
            if step == "add" or not fast.nodes():
                node, pes = data.draw(st.sampled_from(NAMES)), data.draw(st.integers(1, 5))
                try:
                    fast.add_node(node, pes)
                except ValueError:
                    with pytest.raises(ValueError):
                        plain.add_node(node, pes)
                else:
                    plain.add_node(node, pes)
            elif step == "place":
                ranks = data.draw(st.integers(1, 12))
                where = data.draw(st.sampled_from([None, usable, sorted(usable)]))
                row = data.draw(st.one_of(st.none(), st.integers(0, mpl - 1)))
                placement = fast.find(ranks, where, row)
                assert placement == plain.find(ranks, where, row)
                if placement is not None:
                    fast.assign(next_id, placement)
                    plain.assign(next_id, placement)
                    next_id += 1
            elif step == "release" and fast.jobs():
                job_id = data.draw(st.sampled_from(sorted(fast.jobs())))
                assert fast.release(job_id) == plain.release(job_id)
            elif step == "move" and fast.jobs():
                job_id, row = (
                    data.draw(st.sampled_from(sorted(fast.jobs()))),
                    data.draw(st.integers(0, mpl - 1)),
                )
                try:
                    fast.move(job_id, row)
                except ValueError:
                    with pytest.raises(ValueError):
                        plain.move(job_id, row)
                else:
                    plain.move(job_id, row)
            elif step == "compact":
                assert fast.compact() == plain.compact()
            assert fast.jobs() == plain.jobs()
            check_counts(fast, usable)
            assert fast.total_pes(usable) == plain.total_pes(usable)
    finally:
        matrix_module.MAX_SKIPPED = saved


def test_a_changed_usable_set_is_not_served_from_the_cache() -> None:
    matrix = Matrix(1)
    for node in ("a", "b"):
        matrix.add_node(node, 4)
    only_a = frozenset({"a"})
    assert matrix.free_pes(0, only_a) == 4
    assert matrix.free_pes(0, frozenset({"b"})) == 4
    matrix.assign(1, matrix.find(3, only_a) or pytest.fail("fits"))
    assert matrix.free_pes(0, only_a) == 1
    assert matrix.free_pes(0, {"a"}) == 1  # a plain set is recounted, never cached
    matrix.add_node("c", 2)  # indices shift: the counts are rebuilt
    assert matrix.free_pes(0, only_a) == 1
    assert matrix.free_pes(0) == 7
