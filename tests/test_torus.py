"""The torus's geometry: sizes, boxes, masks, growth, and what the configuration may say of a torus."""

from __future__ import annotations

import pytest

from storm.mm.torus import MAX_BOXES, Box, Torus, box_count, parse_dims, parse_topology
from storm.mm.torus_state import TorusLayout, torus_of

PAPER_SIZES = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 15, 16, 18, 20, 21, 24, 27, 28, 30, 32, 36, 40, 42, 45, 48, 54, 56,
    60, 63, 64, 72, 80, 84, 96, 112, 128,
)  # fmt: skip


def test_the_papers_torus_has_38_sizes_and_rounds_up_to_them() -> None:
    torus = torus_of((4, 4, 8))
    assert torus.sizes == PAPER_SIZES and len(torus.sizes) == 38
    assert [torus.round_size(n) for n in (11, 17, 65, 97, 113, 128)] == [12, 18, 72, 112, 128, 128]
    assert torus.round_size(129) is None
    with pytest.raises(ValueError, match="at least one node"):
        torus.round_size(0)


def test_every_distinct_box_is_in_the_table_once() -> None:
    for dims in ((1, 1, 1), (2, 3, 1), (3, 3, 3), (4, 4, 8)):
        torus = torus_of(dims)
        boxes = [box for size in torus.sizes for box in torus.boxes(size)]
        assert len(boxes) == box_count(dims)
        assert len({torus.mask(box) for box in boxes}) == len(boxes)  # no node set twice
    assert box_count((4, 4, 8)) == 9633 and box_count((8, 8, 8)) == 185_193


def test_a_box_wraps_around() -> None:
    torus = torus_of((4, 4, 8))
    box = Box((3, 0, 7), (2, 1, 2))
    assert box.coords(torus.dims) == [(3, 0, 7), (0, 0, 7), (3, 0, 0), (0, 0, 0)]
    assert torus.mask(box) == sum(1 << torus.index(c) for c in box.coords(torus.dims))
    assert str(box) == "2x1x2 at (3,0,7)" and box.volume == 4
    with pytest.raises(ValueError, match="does not fit"):
        torus.mask(Box((0, 0, 0), (5, 1, 1)))


def test_the_papers_growth_example() -> None:
    # A 4 x 4 torus (one plane) whose only free nodes are a 2 x 2 square: a job of 3 cannot run as 3, and
    # grows to the least size with a free box: 4.
    torus = Torus((4, 4, 1))
    square = torus.mask(Box((1, 1, 0), (2, 2, 1)))
    taken = torus.all & ~square
    assert torus.place(taken, 3) is None
    assert torus.grow(taken, 3) == Box((1, 1, 0), (2, 2, 1))
    assert torus.grow(taken, 3, most=3) is None  # growth bounded, as backfilling bounds it
    assert torus.grow(taken, 5) is None  # nothing free holds 5


def test_placement_keeps_the_largest_partition_free() -> None:
    # On an empty 4 x 4 x 8 torus a whole 4 x 4 plane leaves the other seven planes: the rule takes it over
    # the 16-node shapes that cut through more planes.
    torus = torus_of((4, 4, 8))
    assert torus.place(0, 16) == Box((0, 0, 0), (4, 4, 1))
    assert torus.largest_free(torus.mask(Box((0, 0, 0), (4, 4, 1)))) == 112
    # Ties go to the first shape, then the first base: a single node at the origin.
    assert torus.place(0, 1) == Box((0, 0, 0), (1, 1, 1))


def test_a_torus_too_large_to_tabulate_is_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match=r"8x8x16 has 783,\d{3} distinct boxes.*supernodes"):
        Torus((8, 8, 16))
    assert box_count((8, 8, 8)) <= MAX_BOXES


@pytest.mark.parametrize(
    ("text", "dims"),
    [
        ("flat", None),
        ("", None),
        ("torus 4x4x8", (4, 4, 8)),
        ("torus:2x2x2", (2, 2, 2)),
        ("torus 1 x 2 x 3", (1, 2, 3)),
    ],
)
def test_topologies(text: str, dims: tuple[int, int, int] | None) -> None:
    assert parse_topology(text) == dims


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("ring 4", "neither 'flat' nor 'torus XxYxZ'"),
        ("torus", "neither"),
        ("torus 4x4", "not a torus's dimensions"),
        ("torus 0x4x4", "1 to 255"),
    ],
)
def test_bad_topologies_say_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_topology(text)
    assert parse_dims("3x2x1") == (3, 2, 1)


def test_a_layout_from_coordinates() -> None:
    layout = TorusLayout.from_coordinates((2, 1, 2), {"a": [0, 0, 0], "b": [1, 0, 1]})
    assert layout.names == ("a", None, None, "b")
    assert layout.coordinates() == {"a": (0, 0, 0), "b": (1, 0, 1)}
    with pytest.raises(ValueError, match="nodes a and c are both at"):
        TorusLayout.from_coordinates((2, 1, 2), {"a": [0, 0, 0], "c": [0, 0, 0]})
    with pytest.raises(ValueError, match="node a at \\[2, 0, 0\\]"):
        TorusLayout.from_coordinates((2, 1, 2), {"a": [2, 0, 0]})
    with pytest.raises(ValueError, match="none is given"):
        TorusLayout.from_coordinates((2, 1, 2), {})
    assert TorusLayout.numbered((2, 2, 1)).names == ("n0", "n1", "n2", "n3")
