"""storm-mm's moldable sizing (mm/moldable.py) and the speedup models it reads (mm/speedup.py): Parsons and
Sevcik's RTC-AD and SUBSET rules and Naik et al.'s AP, pure functions checked by example, against brute
force and by property."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm.moldable import (
    MoldableRequest,
    adaptive_size,
    choose_sizes,
    committed_count,
    equal_split,
    first_fit,
    min_surplus_subset,
    share_leftover,
)
from storm.mm.speedup import Amdahl, Downey, efficiency


def test_amdahl_gives_the_papers_figures() -> None:
    good, poor = Amdahl(0.001), Amdahl(0.1)
    assert good.speedup(128) == pytest.approx(113.6, abs=0.05)  # Parsons-Sevcik's "114 on 128"
    assert poor.speedup(16) == pytest.approx(6.4, abs=0.05)
    assert poor.speedup(128) == pytest.approx(9.3, abs=0.05)
    assert efficiency(poor, 8) == pytest.approx(0.588, abs=0.001)  # the paper's "58%"
    with pytest.raises(ValueError):
        Amdahl(1.5)
    with pytest.raises(ValueError):
        poor.speedup(0.5)


@settings(max_examples=200, deadline=None)
@given(
    parallelism=st.floats(1, 600),
    variance=st.floats(0, 5),
    n=st.floats(1, 2000),
    step=st.floats(0.001, 500),
)
def test_downey_starts_at_one_never_falls_and_never_gains_efficiency(
    parallelism: float, variance: float, n: float, step: float
) -> None:
    model = Downey(parallelism, variance)
    assert model.speedup(1) == pytest.approx(1.0)
    a, b = model.speedup(n), model.speedup(n + step)
    assert b >= a - 1e-9 * a
    assert b <= parallelism + 1e-9
    assert efficiency(model, n + step) <= efficiency(model, n) + 1e-9


def test_downey_is_continuous_where_its_pieces_meet() -> None:
    for a, sigma in ((32, 0.5), (128, 2 / 3), (64, 1.0), (50, 2.5)):
        model = Downey(a, sigma)
        corners = [a, 2 * a - 1] if sigma <= 1 else [a + a * sigma - sigma]
        for corner in corners:
            assert model.speedup(corner - 1e-7) == pytest.approx(model.speedup(corner + 1e-7), rel=1e-6)


def brute_force_subset(sizes: list[int], capacity: int) -> tuple[int, tuple[bool, ...]]:
    """The best sum and, among the subsets reaching it, the inclusion vector that is largest in index order
    (job 0 taken if it can be, then job 1, ...)."""
    best: tuple[int, tuple[bool, ...]] = (0, tuple(False for _ in sizes))
    for taken in itertools.product((True, False), repeat=len(sizes)):
        total = sum(s for s, t in zip(sizes, taken, strict=True) if t)
        if total <= capacity and (total, taken) > best:
            best = (total, taken)
    return best


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 20), max_size=9), capacity=st.integers(0, 70))
def test_the_subset_sum_is_minimal_and_earliest_against_brute_force(sizes: list[int], capacity: int) -> None:
    chosen = min_surplus_subset(sizes, capacity)
    best, taken = brute_force_subset(sizes, capacity)
    assert sum(sizes[i] for i in chosen) == best
    assert tuple(i in chosen for i in range(len(sizes))) == taken
    assert chosen == sorted(chosen)


def test_subset_fills_what_first_fit_leaves() -> None:
    queue = [MoldableRequest(1, 6, 16), MoldableRequest(2, 5, 16), MoldableRequest(3, 5, 16)]
    assert first_fit([6, 5, 5], 10) == [0]
    assert choose_sizes(queue, 10, jobs_in_system=3) == [(1, 10)]
    # N' = floor(1 x (1 - 3/5)) = 0: the subset sum finds 5 + 5, with no surplus.
    assert committed_count(1, 3) == 0
    assert choose_sizes(queue, 10, jobs_in_system=3, subset=True) == [(2, 5), (3, 5)]
    # Light load: SUBSET commits to most of the first fit, and here picks what RTC-AD picks.
    small = [MoldableRequest(i, 2, 4) for i in range(4)]
    assert committed_count(4, 4) == 3
    assert choose_sizes(small, 10, jobs_in_system=4, subset=True) == choose_sizes(small, 10, jobs_in_system=4)


def test_committed_count_follows_the_formula() -> None:
    assert committed_count(4, 10, 5.0) == 2  # floor(4 x (1 - 10/20))
    assert committed_count(4, 20, 5.0) == 0
    assert committed_count(4, 1, 5.0) == 3  # floor(4 x 0.95)
    assert committed_count(2, 5, 5.0) == 1  # floor(2 x 0.5): rounding must not lose the exact half
    assert committed_count(0, 9) == 0


requests = st.lists(
    st.tuples(st.integers(1, 8), st.integers(0, 8), st.sampled_from([None, 0.0, 0.001, 0.05, 0.1, 0.5])),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(
    drawn=requests,
    free=st.integers(0, 40),
    in_system=st.integers(0, 60),
    subset=st.booleans(),
    known=st.booleans(),
)
def test_choose_sizes_stays_within_each_range_and_the_free_units(
    drawn: list[tuple[int, int, float | None]], free: int, in_system: int, subset: bool, known: bool
) -> None:
    queue = [
        MoldableRequest(i, low, low + extra, Amdahl(s) if known and s is not None else None)
        for i, (low, extra, s) in enumerate(drawn)
    ]
    out = choose_sizes(queue, free, jobs_in_system=in_system, subset=subset, processors_per_unit=8)
    by_id = {r.job_id: r for r in queue}
    ids = [job_id for job_id, _ in out]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert sum(size for _, size in out) <= free
    for job_id, size in out:
        assert by_id[job_id].minimum <= size <= by_id[job_id].maximum
    if not subset:
        assert ids == [queue[i].job_id for i in first_fit([r.minimum for r in queue], free)]
    # Nothing is left idle that a chosen job could still take.
    if any(size < by_id[j].maximum for j, size in out):
        assert sum(size for _, size in out) == free


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 10), min_size=1, max_size=7),
    room=st.lists(st.integers(0, 10), min_size=7, max_size=7),
    leftover=st.integers(0, 40),
)
def test_equi_allocation_gives_to_the_smallest(sizes: list[int], room: list[int], leftover: int) -> None:
    caps = [s + r for s, r in zip(sizes, room, strict=False)]
    out = share_leftover(sizes, caps, leftover)
    assert sum(out) - sum(sizes) == min(leftover, sum(c - s for s, c in zip(sizes, caps, strict=True)))
    for i, j in itertools.permutations(range(len(out)), 2):
        if out[j] > sizes[j] and out[i] < caps[i]:
            assert out[j] <= out[i] + 1  # j's last unit went when i had at least out[j] - 1


@settings(max_examples=300, deadline=None)
@given(
    drawn=st.lists(
        st.tuples(st.integers(1, 6), st.integers(0, 8), st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.3])),
        min_size=1,
        max_size=6,
    ),
    leftover=st.integers(0, 30),
)
def test_speedup_knowledge_gives_each_unit_to_the_most_efficient(
    drawn: list[tuple[int, int, float]], leftover: int
) -> None:
    sizes = [low for low, _, _ in drawn]
    caps = [low + extra for low, extra, _ in drawn]
    models = [Amdahl(s) for _, _, s in drawn]
    out = share_leftover(sizes, caps, leftover, models, processors_per_unit=8)
    for i, j in itertools.permutations(range(len(out)), 2):
        if out[j] > sizes[j] and out[i] < caps[i]:
            # j's last unit left j at least as efficient as i would have been with one more.
            assert efficiency(models[j], out[j] * 8) >= efficiency(models[i], (out[i] + 1) * 8) - 1e-12


def test_speedup_knowledge_favours_the_efficient_job() -> None:
    good, poor = MoldableRequest(1, 2, 16, Amdahl(0.001)), MoldableRequest(2, 2, 16, Amdahl(0.1))
    assert choose_sizes([good, poor], 16, jobs_in_system=2, processors_per_unit=8) == [(1, 14), (2, 2)]
    # Without knowledge the two are equal.
    blind = [MoldableRequest(1, 2, 16), MoldableRequest(2, 2, 16)]
    assert choose_sizes(blind, 16, jobs_in_system=2) == [(1, 8), (2, 8)]


def test_adaptive_partitioning_sizes() -> None:
    assert adaptive_size(32, 100, 8) == 32
    assert adaptive_size(32, 20, 8) == 20
    assert adaptive_size(32, 7, 8) is None
    assert adaptive_size(4, 5, 8) == 4  # a request below the minimum is met when it fits
    # Each between the minimum and its request, equal otherwise; first come first served.
    assert equal_split([8, 8, 32], 30, 8) == [8, 8, 14]
    assert equal_split([8, 32, 8], 20, 8) == [8, 12]
    assert equal_split([32, 32], 7, 8) == []
    assert equal_split([32, 32, 32], 60, 8) == [20, 20, 20]
