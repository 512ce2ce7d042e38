"""storm-mm's preemption by suspension (mm/preemption.py): Parsons and Sevcik's four rules for LSF-PREEMPT,
and the wider rule a machine manager with job priorities uses, by example and by property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm.preemption import (
    PreemptionRules,
    Rank,
    Running,
    Waiting,
    choose_preemptions,
    outranks,
    ran_long_enough,
    victims_for,
)

RULES = PreemptionRules()


def units(*u: int) -> frozenset[int]:
    return frozenset(u)


def test_rule_3_minimum_run_time() -> None:
    assert not ran_long_enough(100.0, 159.9, RULES)
    assert ran_long_enough(100.0, 160.0, RULES)
    assert ran_long_enough(0.0, 600.0, PreemptionRules(min_run_s=600))


def test_rule_2_ranks() -> None:
    r = Running(1, units(0), 0.0, acquired=1000.0, remaining=500.0, priority=1)
    assert outranks(Waiting(2, 1, acquired=499.0), r, Rank.ACQUIRED, RULES)
    assert not outranks(Waiting(2, 1, acquired=500.0), r, Rank.ACQUIRED, RULES)  # "50% less": strictly under
    assert outranks(Waiting(2, 1, remaining=449.0), r, Rank.DEMAND, RULES)
    assert not outranks(Waiting(2, 1, remaining=450.0), r, Rank.DEMAND, RULES)
    assert outranks(Waiting(2, 1, priority=2), r, Rank.PRIORITY, RULES)
    assert not outranks(Waiting(2, 1, priority=1), r, Rank.PRIORITY, RULES)


def test_rigid_rule_takes_a_job_of_the_same_size_the_worst_ranked() -> None:
    running = [
        Running(1, units(0, 1), 0.0, acquired=900.0),
        Running(2, units(2, 3), 0.0, acquired=5000.0),
        Running(3, units(4, 5, 6, 7), 0.0, acquired=9000.0),
    ]
    free, procs = frozenset[int](), {u: 1 for u in range(8)}
    found = victims_for(Waiting(9, 2), running, free=free, processes=procs, now=100.0, rank=Rank.ACQUIRED)
    assert found is not None and found.victims == (2,) and found.units == units(2, 3)
    assert (
        victims_for(Waiting(9, 3), running, free=free, processes=procs, now=100.0, rank=Rank.ACQUIRED) is None
    )


def test_minimum_run_time_and_process_cap_protect_a_job() -> None:
    running = [Running(1, units(0, 1), 50.0, acquired=900.0)]
    procs = {0: 1, 1: 1}
    assert (
        victims_for(Waiting(9, 2), running, free=frozenset(), processes=procs, now=100.0, rank=Rank.ACQUIRED)
        is None
    )
    full = {0: 5, 1: 1}
    assert (
        victims_for(Waiting(9, 2), running, free=frozenset(), processes=full, now=200.0, rank=Rank.ACQUIRED)
        is None
    )
    assert victims_for(
        Waiting(9, 2), running, free=frozenset(), processes=procs, now=200.0, rank=Rank.ACQUIRED
    )


def test_a_suspended_job_takes_back_exactly_its_own_units() -> None:
    running = [Running(1, units(0, 1), 0.0, acquired=900.0), Running(2, units(2), 0.0, acquired=800.0)]
    mine = Waiting(9, 3, suspended_on=units(0, 1, 2), acquired=100.0)
    found = victims_for(mine, running, free=frozenset(), processes={}, now=100.0, rank=Rank.ACQUIRED)
    assert found is not None and found.victims == (1, 2) and found.units == units(0, 1, 2)
    # One of the jobs on its units may not be suspended yet: it waits.
    young = [running[0], Running(2, units(2), 90.0, acquired=800.0)]
    assert victims_for(mine, young, free=frozenset(), processes={}, now=100.0, rank=Rank.ACQUIRED) is None


def test_priority_rule_suspends_as_few_lower_priority_jobs_as_will_do() -> None:
    running = [
        Running(1, units(0, 1, 2, 3), 0.0, priority=0),
        Running(2, units(4, 5, 6, 7), 0.0, priority=1),
        Running(3, units(8, 9), 0.0, priority=5),
    ]
    found = victims_for(
        Waiting(9, 6, priority=3), running, free=units(10, 11), processes={}, now=100.0, rank=Rank.PRIORITY,
        same_size=False,
    )  # fmt: skip
    assert found is not None and found.victims == (1,)  # the lowest priority first; the free units first
    assert found.units == units(10, 11, 0, 1, 2, 3)
    # Fits in the free units alone: nothing to suspend.
    small = Waiting(9, 2, priority=3)
    alone = victims_for(
        small, running, free=units(10, 11), processes={}, now=100.0, rank=Rank.PRIORITY, same_size=False
    )
    assert alone is None


def test_the_best_ranked_waiting_job_gets_the_victim() -> None:
    running = [Running(1, units(0, 1), 0.0, acquired=10_000.0)]
    waiting = [Waiting(5, 2, acquired=300.0), Waiting(4, 2, acquired=0.0)]
    out = choose_preemptions(
        running, waiting, free=frozenset(), processes={0: 1, 1: 1}, now=100.0, rank=Rank.ACQUIRED
    )
    assert [(p.by, p.victims) for p in out] == [(4, (1,))]


@settings(max_examples=300, deadline=None)
@given(
    layout=st.lists(st.integers(1, 3), min_size=1, max_size=6),
    since=st.lists(st.floats(0, 200), min_size=6, max_size=6),
    priorities=st.lists(st.integers(0, 4), min_size=12, max_size=12),
    wanted=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    free_count=st.integers(0, 3),
    suspended=st.lists(st.integers(0, 4), min_size=20, max_size=20),
    same_size=st.booleans(),
)
def test_preemptions_never_share_a_unit_nor_break_a_rule(
    layout: list[int],
    since: list[float],
    priorities: list[int],
    wanted: list[int],
    free_count: int,
    suspended: list[int],
    same_size: bool,
) -> None:
    running, next_unit = [], 0
    for i, width in enumerate(layout):
        running.append(
            Running(i, frozenset(range(next_unit, next_unit + width)), since[i], priority=priorities[i])
        )
        next_unit += width
    free = frozenset(range(next_unit, next_unit + free_count))
    procs = {u: (1 if u < next_unit else 0) + suspended[u] for u in range(next_unit + free_count)}
    waiting = [Waiting(100 + i, size, priority=priorities[6 + i]) for i, size in enumerate(wanted)]
    now = 150.0
    out = choose_preemptions(
        running, waiting, free=free, processes=procs, now=now, rank=Rank.PRIORITY, same_size=same_size
    )
    by_id = {r.job_id: r for r in running}
    wants = {w.job_id: w for w in waiting}
    used: set[int] = set()
    suspended_ids: set[int] = set()
    available = set(free)
    for p in out:
        job = wants[p.by]
        assert len(p.units) == job.size
        assert not p.units & used  # no unit given twice
        used |= p.units
        assert p.victims and not set(p.victims) & suspended_ids
        suspended_ids |= set(p.victims)
        victim_units = frozenset().union(*(by_id[v].units for v in p.victims))
        # Free units, those of this preemption's victims, and those earlier victims left unused.
        assert p.units <= available | victim_units
        available = (available | victim_units) - p.units
        for v in p.victims:
            assert now - by_id[v].since >= RULES.min_run_s
            assert job.priority > by_id[v].priority
        if same_size:
            assert len(p.victims) == 1 and by_id[p.victims[0]].units == p.units
    # Every unit a newcomer runs on holds at most the cap, counting the processes left suspended.
    for u in used:
        assert procs[u] + 1 <= RULES.max_processes


def test_rules_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        PreemptionRules(max_processes=0)
    with pytest.raises(ValueError):
        PreemptionRules(acquired_fraction=1.5)
