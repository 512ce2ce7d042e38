"""The two engines of ``storm sim`` decide the same: on random workloads, the scheduler-only engine
(tools/sim/fast.py) and the whole MM core with simulated node managers (tools/sim/engine.py) give every job
the same id, start, end and state under every policy, with jobs killed at their limits, on nodes of several
shapes as given and merged."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.tools.sim.engine import POLICIES, Machine, simulate
from storm.tools.sim.fast import FastEngine
from storm.tools.sim.nodes import InvariantError
from storm.tools.sim.swf import SimJob, Workload

jobs = st.lists(
    st.tuples(
        st.integers(0, 30),  # gap since the previous arrival (0: arrives at the same instant)
        st.integers(1, 60),  # runtime
        st.integers(1, 8),  # procs
        st.sampled_from([0.5, 1.0, 1.0, 2.0, 4.0]),  # limit / runtime (< 1: killed at its limit)
    ),
    min_size=1,
    max_size=50,
)


def workload(drawn: list[tuple[int, int, int, float]]) -> Workload:
    out, now = [], 0.0
    for index, (gap, runtime, procs, factor) in enumerate(drawn):
        now += gap
        out.append(SimJob(index, index + 1, now, float(runtime), procs, max(1.0, runtime * factor), 0))
    return Workload(out, "runtime", {})


def decisions(load: Workload, machine: Machine, policy: str, core: str, merge: bool) -> list[object]:
    result = simulate(load, machine, policy, merge_nodes=merge, core=core)
    return [(o.mm_id, o.start, o.end, o.state) for o in result.outcomes]


@settings(max_examples=80, deadline=None)
@given(
    jobs,
    st.sampled_from(tuple(POLICIES)),
    st.sampled_from([Machine(8, 1), Machine(4, 2), Machine(2, 4), Machine(3, 3)]),
    st.booleans(),
)
def test_the_scheduler_engine_decides_as_the_whole_core(
    drawn: list[tuple[int, int, int, float]], policy: str, machine: Machine, merge: bool
) -> None:
    load = workload([d for d in drawn if d[2] <= machine.pes])
    if not load.jobs:
        return
    whole = decisions(load, machine, policy, "mm", merge)
    assert decisions(load, machine, policy, "scheduler", merge) == whole


def test_the_random_workloads_exercise_waiting_backfilling_and_time_limits() -> None:
    """The property above is about queues, not an idle machine: a fixed draw of its kind waits, times out,
    and starts jobs out of order under EASY."""
    drawn = [(0, 50, 8, 1.0), (1, 10, 4, 0.5), (0, 5, 2, 2.0), (2, 40, 6, 1.0), (0, 3, 2, 1.0)]
    load = workload(drawn)
    result = simulate(load, Machine(8, 1), "easy")
    states = {o.state for o in result.outcomes}
    order = sorted(result.outcomes, key=lambda o: (o.start, o.mm_id))
    assert "TIMEOUT" in states and "COMPLETED" in states
    assert any(o.start > o.job.submit for o in result.outcomes)
    assert [o.mm_id for o in order] != sorted(o.mm_id for o in order)  # a backfilled job jumped ahead
    assert decisions(load, Machine(8, 1), "easy", "mm", True) == decisions(
        load, Machine(8, 1), "easy", "scheduler", True
    )


def test_unknown_core_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown core 'fast'"):
        simulate(workload([(0, 1, 1, 1.0)]), Machine(1, 1), core="fast")


def test_a_placement_on_a_held_pe_breaks_the_invariant() -> None:
    """The engine's own check, not the matrix's: a pass that placed a job on a held PE is caught."""
    load = workload([(0, 10, 1, 1.0), (0, 10, 1, 1.0)])
    engine = FastEngine(load, Machine(2, 1))
    real = engine.state.run_pass

    def same_pe_twice(now: float, *args: object, **kw: object) -> object:
        plan = real(now)
        if len(plan.starts) == 2:
            first, second = plan.starts
            plan = dataclasses.replace(
                plan, starts=(first, dataclasses.replace(second, placement=first.placement))
            )
        return plan

    engine.state.run_pass = same_pe_twice  # type: ignore[method-assign,assignment]
    with pytest.raises(InvariantError, match="where job 1 still runs"):
        engine.run()
