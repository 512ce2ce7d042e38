"""Merging nodes (tools/sim/engine.py's ``merge_nodes``) decides the same: on random workloads, a machine of
N single-PE nodes, of N/k nodes of k PEs and of one node of N PEs give every job the same start, end, state
and id under every policy, with the nodes as given and merged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from storm.tools.sim.engine import MAX_NODE_PES, POLICIES, Machine, merged, simulate
from storm.tools.sim.swf import SimJob, Workload

PES = 12  # divisible by 1, 2, 3, 4, 6, 12: nodes of several shapes
SHAPES = [Machine(PES // k, k) for k in (1, 2, 3, 4, 6, 12)]

jobs = st.lists(
    st.tuples(
        st.integers(0, 40),  # gap since the previous arrival (0: arrives at the same instant)
        st.integers(1, 60),  # runtime
        st.integers(1, PES),  # procs
        st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0]),  # limit / runtime (< 1: killed at its limit)
    ),
    min_size=1,
    max_size=40,
)


def workload(drawn: list[tuple[int, int, int, float]]) -> Workload:
    out, now = [], 0.0
    for index, (gap, runtime, procs, factor) in enumerate(drawn):
        now += gap
        limit = max(1.0, runtime * factor)
        out.append(SimJob(index, index + 1, now, float(runtime), procs, limit, index % 3))
    return Workload(out, "runtime", {})


@settings(max_examples=60, deadline=None)
@given(jobs, st.sampled_from(tuple(POLICIES)))
def test_every_shape_of_the_same_pes_decides_the_same(
    drawn: list[tuple[int, int, int, float]], policy: str
) -> None:
    load = workload(drawn)
    runs = {
        (machine, merge): [
            (o.mm_id, o.start, o.end, o.state)
            for o in simulate(load, machine, policy, merge_nodes=merge).outcomes
        ]
        for machine in SHAPES
        for merge in (False, True)
    }
    first = runs[(SHAPES[0], False)]
    for key, outcomes in runs.items():
        assert outcomes == first, f"{key} decides differently from {PES} x 1 under {policy}"


def test_merged_groups_nodes_evenly_up_to_what_a_node_may_register() -> None:
    assert merged(Machine(128, 1)) == Machine(1, 128)
    assert merged(Machine(240, 1)) == Machine(1, 240)
    assert merged(Machine(10_000, 1)) == Machine(4, 2500)  # 10,000 PEs: 4,096 a node at most
    assert merged(Machine(7, MAX_NODE_PES)) == Machine(7, MAX_NODE_PES)
    assert merged(Machine(3, 2000)) == Machine(3, 2000)  # 2 x 2000 > 4,096: nothing to group


def test_a_run_says_on_what_nodes_it_was_simulated() -> None:
    load = workload([(0, 10, 2, 1.0), (1, 5, 1, 1.0)])
    assert simulate(load, Machine(4, 1)).simulated == Machine(1, 4)
    assert simulate(load, Machine(4, 1), merge_nodes=False).simulated is None
