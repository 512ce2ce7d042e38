"""The largest free partition three ways (POP, brute force, the bitmask table) and the paper's placement rule,
held against plain oracles on random partly filled tori of several shapes."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm.torus import Box, Torus
from storm.mm.torus_pop import largest_free_brute, largest_free_pop, y_runs
from storm.mm.torus_state import torus_of

Largest = Callable[[tuple[int, int, int], Sequence[bool]], tuple[int, Box | None]]
# Small shapes get many examples, 4 x 4 x 8 (the paper's) fewer: brute force costs ~13 ms there.
SHAPES = [(1, 1, 1), (2, 1, 1), (1, 3, 2), (2, 2, 2), (3, 3, 3), (2, 3, 4), (4, 4, 2), (1, 5, 3), (4, 4, 8)]


def tori(shapes: list[tuple[int, int, int]]) -> st.SearchStrategy[tuple[tuple[int, int, int], list[bool]]]:
    """A shape and which of its nodes are free: each node free with a drawn probability, so nearly empty and
    nearly full tori both come up."""

    @st.composite
    def draw(data: st.DrawFn) -> tuple[tuple[int, int, int], list[bool]]:
        dims = data(st.sampled_from(shapes))
        share = data(st.floats(0, 1))
        seed = data(st.integers(0, 2**32 - 1))
        rng = random.Random(seed)
        return dims, [rng.random() >= share for _ in range(dims[0] * dims[1] * dims[2])]

    return draw()


def taken_mask(free: list[bool]) -> int:
    return sum(1 << i for i, f in enumerate(free) if not f)


def check_box(dims: tuple[int, int, int], free: list[bool], volume: int, box: Box | None) -> None:
    """``box`` is free and has ``volume`` nodes (None exactly when nothing is free)."""
    if volume == 0:
        assert box is None and not any(free)
        return
    assert box is not None and box.volume == volume
    torus = torus_of(dims)
    assert all(free[torus.index(c)] for c in box.coords(dims))


@settings(max_examples=2500, deadline=None)
@given(tori(SHAPES[:-1]))
def test_pop_brute_force_and_the_table_agree_on_small_tori(
    case: tuple[tuple[int, int, int], list[bool]],
) -> None:
    dims, free = case
    pop, pop_box = largest_free_pop(dims, free)
    brute, brute_box = largest_free_brute(dims, free)
    assert pop == brute == torus_of(dims).largest_free(taken_mask(free))
    check_box(dims, free, pop, pop_box)
    check_box(dims, free, brute, brute_box)


@settings(max_examples=150, deadline=None)
@given(tori([(4, 4, 8)]))
def test_pop_brute_force_and_the_table_agree_on_the_papers_torus(
    case: tuple[tuple[int, int, int], list[bool]],
) -> None:
    dims, free = case
    torus = torus_of(dims)
    taken = taken_mask(free)
    pop, box = largest_free_pop(dims, free)
    assert pop == largest_free_brute(dims, free)[0] == torus.largest_free(taken)
    check_box(dims, free, pop, box)
    assert torus.largest_free_box(taken) == (None if pop == 0 else torus.largest_free_box(taken))
    for size in (1, pop, pop + 1):
        assert torus.has_free(taken, size) == (pop >= size)


def test_pop_on_hand_made_tori() -> None:
    # A 4 x 4 x 1 torus with one taken node: the largest free box is a 4 x 3 band beside it (12 nodes).
    free = [True] * 16
    free[5] = False
    assert largest_free_pop((4, 4, 1), free)[0] == 12
    # The paper's Fig. 9 situation in miniature: a plane whose free nodes wrap around the edge.
    free = [False] * 16
    for x, y in ((3, 0), (0, 0), (3, 1), (0, 1)):
        free[x + 4 * y] = True
    volume, box = largest_free_pop((4, 4, 1), free)
    assert volume == 4 and box is not None and box.shape == (2, 2, 1) and box.base == (3, 0, 0)
    assert largest_free_pop((2, 2, 2), [True] * 8)[0] == 8
    assert largest_free_pop((2, 2, 2), [False] * 8) == (0, None)


def test_y_runs_wrap_around() -> None:
    # A ring of 5 along y: taken at y = 2. From y = 3 the run wraps through 4, 0, 1.
    free = [True, True, False, True, True]
    assert y_runs((1, 5, 1), free) == [2, 1, 0, 4, 3]
    assert y_runs((1, 3, 1), [True] * 3) == [3, 3, 3]


def naive_placement(torus: Torus, taken: int, size: int, largest: Largest = largest_free_brute) -> Box | None:
    """The paper's rule read literally: every free box of the size, the largest free partition it leaves
    computed by ``largest`` (brute force, or POP, which the tests above hold to it), the first of the best."""
    dims = torus.dims
    best: Box | None = None
    best_left = -1
    for box in torus.boxes(size):
        mask = torus.mask(box)
        if mask & taken:
            continue
        after = taken | mask
        left = largest(dims, [not after >> i & 1 for i in range(torus.nodes)])[0]
        if left > best_left:
            best, best_left = box, left
    return best


@settings(max_examples=400, deadline=None)
@given(tori(SHAPES[1:7]), st.integers(1, 64))
def test_placement_is_the_papers_rule(case: tuple[tuple[int, int, int], list[bool]], wanted: int) -> None:
    dims, free = case
    torus = torus_of(dims)
    size = torus.round_size(min(wanted, torus.nodes))
    assert size is not None
    taken = taken_mask(free)
    assert torus.place(taken, size) == naive_placement(torus, taken, size)
    assert torus.fits(taken, size) == (naive_placement(torus, taken, size) is not None)


def test_placement_on_the_papers_torus_against_the_rule() -> None:
    torus = torus_of((4, 4, 8))
    rng = random.Random(7)
    for share in (0.3, 0.5, 0.7):
        free = [rng.random() < share for _ in range(torus.nodes)]
        taken = taken_mask(free)
        for size in (1, 4, 6):
            assert torus.place(taken, size) == naive_placement(torus, taken, size, largest_free_pop)
