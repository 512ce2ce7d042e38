"""The Ousterhout matrix: packing policy, rows, node changes and refused assignments."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from storm.mm.matrix import Matrix, Placement, node_sort_key


def make(nodes: dict[str, int], mpl: int = 1) -> Matrix:
    matrix = Matrix(mpl)
    for node, pes in nodes.items():
        matrix.add_node(node, pes)
    return matrix


def place(
    matrix: Matrix, job_id: int, ranks: int, usable: Collection[str] | None = None, row: int | None = None
) -> Placement:
    placement = matrix.find(ranks, usable, row)
    assert placement is not None
    matrix.assign(job_id, placement)
    return placement


def test_node_sort_key_is_natural() -> None:
    names = ["node10", "node2", "gpu1", "node1", "node01", "n", "node2a"]
    assert sorted(names, key=node_sort_key) == ["gpu1", "n", "node01", "node1", "node2", "node2a", "node10"]


def test_placement_properties_and_validation() -> None:
    placement = Placement(0, (("b", 0), ("b", 1), ("a", 3)))
    assert placement.nodes == ("b", "a")
    assert placement.ranks == 3
    with pytest.raises(ValueError):
        Placement(0, ())
    with pytest.raises(ValueError):
        Placement(0, (("a", 0), ("a", 0)))
    with pytest.raises(ValueError):
        Placement(-1, (("a", 0),))


def test_mpl_must_be_positive() -> None:
    assert Matrix(3).mpl == 3
    assert len(Matrix(3).cells()) == 3
    with pytest.raises(ValueError):
        Matrix(0)


def test_single_node_job_goes_to_best_fit_node() -> None:
    matrix = make({"n1": 8, "n2": 4, "n3": 4})
    place(matrix, 1, 1, usable=["n2"])  # n2 now has 3 free, n3 4, n1 8
    placement = matrix.find(3)
    assert placement == Placement(0, (("n2", 1), ("n2", 2), ("n2", 3)))
    # With 4 ranks n2 no longer fits: n3 and n1 do, n3 is tighter.
    assert matrix.find(4) == Placement(0, tuple(("n3", i) for i in range(4)))


def test_best_fit_ties_go_to_natural_node_order() -> None:
    matrix = make({"node10": 4, "node9": 4})
    assert matrix.find(2) == Placement(0, (("node9", 0), ("node9", 1)))


def test_wide_job_spans_fewest_nodes_most_free_first() -> None:
    matrix = make({"a": 4, "b": 4, "c": 4})
    place(matrix, 1, 3, usable=["a"])  # free: a 1, b 4, c 4
    place(matrix, 2, 1, usable=["b"])  # free: a 1, b 3, c 4
    # 6 ranks: c (4) then b gives the remaining 2 on its lowest free PEs; a is not touched.
    placement = matrix.find(6)
    assert placement == Placement(0, (("b", 1), ("b", 2), ("c", 0), ("c", 1), ("c", 2), ("c", 3)))
    assert placement.nodes == ("b", "c")


def test_wide_job_ties_by_natural_order_and_ranks_block_distributed() -> None:
    matrix = make({"node10": 2, "node2": 2, "node3": 2})
    placement = matrix.find(4)
    # All nodes have 2 free: ties go node2, node3; node10 is not needed.
    assert placement is not None
    assert placement.pes == (("node2", 0), ("node2", 1), ("node3", 0), ("node3", 1))
    placement = matrix.find(6)
    assert placement is not None
    assert placement.nodes == ("node2", "node3", "node10")
    assert placement.pes[4:] == (("node10", 0), ("node10", 1))


def test_released_cells_are_reused() -> None:
    matrix = make({"n1": 4})
    first = place(matrix, 1, 2)
    place(matrix, 2, 2)
    assert matrix.find(1) is None
    assert matrix.release(1) == first
    assert matrix.release(1) is None
    assert matrix.placement_of(1) is None
    assert matrix.find(2) == first
    assert matrix.free_pes(0) == 2


def test_job_that_does_not_fit_row_0_goes_to_row_1() -> None:
    matrix = make({"n1": 4}, mpl=2)
    place(matrix, 1, 3)
    small = matrix.find(1)
    assert small == Placement(0, (("n1", 3),))  # lower rows fill first
    wide = matrix.find(2)
    assert wide == Placement(1, (("n1", 0), ("n1", 1)))
    place(matrix, 2, 4, row=1)
    assert matrix.find(2) is None
    assert matrix.cells() == [{("n1", i): 1 for i in range(3)}, {("n1", i): 2 for i in range(4)}]


def test_find_row_restricts_to_that_row() -> None:
    matrix = make({"n1": 4}, mpl=3)
    place(matrix, 1, 4, row=1)
    assert matrix.find(2, row=1) is None
    assert matrix.find(2, row=2) == Placement(2, (("n1", 0), ("n1", 1)))
    assert matrix.find(2) == Placement(0, (("n1", 0), ("n1", 1)))
    with pytest.raises(ValueError):
        matrix.find(1, row=3)
    with pytest.raises(ValueError):
        matrix.find(0)


def test_usable_restricts_nodes() -> None:
    matrix = make({"n1": 4, "n2": 2, "n3": 4})
    assert matrix.total_pes(["n1", "n2", "ghost"]) == 6
    assert matrix.total_pes() == 10
    placement = matrix.find(5, usable={"n1", "n3"})
    assert placement is not None
    assert set(placement.nodes) == {"n1", "n3"}
    assert matrix.find(7, usable=["n1", "n2"]) is None
    assert matrix.find(2, usable=[]) is None
    place(matrix, 1, 4, usable=["n3"])
    assert matrix.free_pes(0, usable=["n3", "n2"]) == 2
    assert matrix.free_pes(0) == 6


def test_add_node_resize_rules() -> None:
    matrix = make({"n2": 4, "n10": 2})
    assert matrix.nodes() == {"n2": 4, "n10": 2}
    assert matrix.columns()[0] == ("n2", 0)
    assert matrix.columns()[-1] == ("n10", 1)
    place(matrix, 1, 1, usable=["n2"])
    matrix.add_node("n2", 4)  # same count while busy: no-op
    assert matrix.placement_of(1) is not None
    with pytest.raises(ValueError, match="runs jobs"):
        matrix.add_node("n2", 8)
    assert matrix.nodes()["n2"] == 4
    matrix.add_node("n10", 6)  # idle: resize allowed
    assert matrix.total_pes() == 10
    assert matrix.find(6) == Placement(0, tuple(("n10", i) for i in range(6)))
    with pytest.raises(ValueError):
        matrix.add_node("n3", 0)


def test_move_keeps_the_pes_and_refuses_a_taken_row() -> None:
    matrix = make({"a": 2, "b": 2}, mpl=3)
    first = place(matrix, 1, 2, usable=["a"])  # row 0, a:0-1
    place(matrix, 2, 2, usable=["a"])  # row 1, a:0-1
    place(matrix, 3, 2, usable=["b"])  # row 0, b:0-1
    matrix.move(2, 2)
    assert matrix.placement_of(2) == Placement(2, first.pes)
    with pytest.raises(ValueError, match="taken by job 1"):
        matrix.move(2, 0)
    assert matrix.placement_of(2) == Placement(2, first.pes)  # unchanged by the refusal
    with pytest.raises(ValueError):
        matrix.move(99, 0)
    assert matrix.occupied_rows() == [0, 2]
    assert matrix.row_jobs(0) == {1, 3} and matrix.row_jobs(1) == set() and matrix.row_jobs(2) == {2}


def test_compact_moves_jobs_down_into_free_cells_of_lower_rows() -> None:
    matrix = make({"a": 2, "b": 2}, mpl=3)
    place(matrix, 1, 4)  # row 0, everything
    place(matrix, 2, 2, usable=["a"])  # row 1, a
    place(matrix, 3, 2, usable=["b"])  # row 1, b
    place(matrix, 4, 2, usable=["b"])  # row 2, b
    matrix.release(1)  # row 0 empties
    # 2 and 3 fit into row 0 on their own PEs; then b is free in row 1, where 4 goes (b is job 3's in row 0).
    assert matrix.compact() == {2: 0, 3: 0, 4: 1}
    assert matrix.occupied_rows() == [0, 1]
    assert matrix.compact() == {}  # nothing left to gain
    assert {j: p.row for j, p in matrix.jobs().items()} == {2: 0, 3: 0, 4: 1}


def test_assign_conflicts_raise_and_change_nothing() -> None:
    matrix = make({"n1": 2, "n2": 2}, mpl=2)
    matrix.assign(1, Placement(0, (("n1", 0), ("n1", 1))))
    with pytest.raises(ValueError, match="already placed"):
        matrix.assign(1, Placement(1, (("n2", 0),)))
    with pytest.raises(ValueError, match="taken by job 1"):
        matrix.assign(2, Placement(0, (("n2", 0), ("n1", 1))))
    with pytest.raises(ValueError, match="unknown PE"):
        matrix.assign(2, Placement(0, (("n2", 0), ("n2", 2))))
    with pytest.raises(ValueError, match="unknown PE"):
        matrix.assign(2, Placement(0, (("n9", 0),)))
    with pytest.raises(ValueError, match="outside"):
        matrix.assign(2, Placement(2, (("n2", 0),)))
    # None of the refused attempts left a cell behind.
    assert matrix.jobs() == {1: Placement(0, (("n1", 0), ("n1", 1)))}
    assert matrix.free_pes(0) == 2
    assert matrix.free_pes(1) == 4
    # The same PE in another row is a different cell.
    matrix.assign(2, Placement(1, (("n1", 0),)))
    assert matrix.cells()[1] == {("n1", 0): 2}
