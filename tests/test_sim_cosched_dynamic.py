"""The coscheduling simulator's driver made faster, and Program.dedicated_ns extrapolated: each shown to
give what it gave before. Small workloads only: fast."""

from __future__ import annotations

import dataclasses
import random

import pytest

from storm.tools.sim.cosched.cluster import CoschedCluster, SimJob
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.cosched.scenarios import Calibration

MS = 1_000_000


def naive_dedicated(program: Program) -> int:
    """The leave-time recurrence, every iteration (what dedicated_ns extrapolates)."""
    leave = [0] * program.ranks
    for _ in range(program.iterations):
        enter = [leave[r] + program.compute_ns[r] for r in range(program.ranks)]
        if not program.communicates:
            leave = enter
            continue
        leave = [
            max([enter[r]] + [enter[p] + program.latency_ns for p in program.partners(r)])
            for r in range(program.ranks)
        ]
    return max(leave)


def test_dedicated_ns_extrapolates_exactly() -> None:
    rng = random.Random(7)
    for _ in range(600):
        ranks = rng.randint(1, 7)
        compute = tuple(rng.choice((0, rng.randint(0, 90))) for _ in range(ranks))
        program = Program(compute, rng.randint(1, 30), rng.choice(list(Pattern)), rng.randint(0, 60))
        assert program.dedicated_ns() == naive_dedicated(program), program


def as_before(cluster: CoschedCluster) -> CoschedCluster:
    """The driver as it was before it was made faster: every heartbeat to every node core, and after every
    event each running job caught up by ``completion_ns`` to see whether it ended."""
    cluster.defer_idle = False

    def ended() -> list[int]:
        return [j for j in cluster.running if cluster.model.completion_ns(j) is not None]

    cluster._ended = ended  # type: ignore[method-assign]
    return cluster


def same_as_before(policy: str, jobs: list[SimJob], nodes: int = 3) -> None:
    results = []
    for before in (True, False):
        cluster = CoschedCluster(nodes, 1, policy, mpl=3, costs=Calibration().costs)
        if before:
            as_before(cluster)
        result = cluster.run(jobs)
        assert (cluster.kept > 0) == (not before and policy in ("gang", "fcs"))
        results.append(dataclasses.replace(result, wall_seconds=0.0))
    assert results[0] == results[1]


@pytest.mark.parametrize("policy", ["gang", "sb", "fcs"])
def test_the_faster_driver_runs_as_before(policy: str) -> None:
    # Nodes fall idle and get jobs again, in several rows; jobs alone on their PEs (the model's shortcut)
    # and jobs sharing them; classes under FCS, stops under gang.
    imbalanced = Program((MS, 2_200_000), 400, latency_ns=5_000)
    jobs = [
        SimJob("a", Program.balanced(1, 3 * MS, 300), 0),
        SimJob("b", imbalanced, 200 * MS, time_limit=2.0),
        SimJob("c", Program.balanced(3, MS, 700, latency_ns=5_000), 450 * MS),
        SimJob("d", Program.balanced(2, 20 * MS, 40, Pattern.ALLREDUCE), 2_350 * MS),
        SimJob("e", Program.balanced(1, 5 * MS, 100), 4_000 * MS),
    ]
    same_as_before(policy, jobs)
