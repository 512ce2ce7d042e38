"""The FCS paper's dynamic workload (tools/sim/cosched/dynamic.py), the coscheduling driver made faster,
and Program.dedicated_ns extrapolated: each faster path shown to give what it gave before. Small
workloads only: fast, no traces."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from storm.tools.sim.cosched.cluster import NS, CoschedCluster, SimJob
from storm.tools.sim.cosched.dynamic import Draws, fit_size, from_lublin, from_trace, program_for
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.cosched.scenarios import Calibration
from storm.tools.sim.swf import SwfRecord

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


def test_lublin_workload_fits_the_machine_and_offers_what_it_says() -> None:
    w = from_lublin(300, 16, 2, seed=4)
    assert len(w.jobs) == 300 and w.pes == 32
    assert all(1 <= j.size <= 32 for j in w.jobs)
    assert min(j.arrival_s for j in w.jobs) == 0.0
    # The paper's definition, by hand: sum(isolated runtime x size) / (PEs x last arrival).
    work = sum(j.program.dedicated_ns() / NS * j.program.ranks for j in w.jobs)
    assert w.offered_load() == pytest.approx(work / (32 * max(j.arrival_s for j in w.jobs)))
    # The runtimes are scaled for 80% load over the reference span (up to the programs' rounding).
    assert w.last_arrival_s == pytest.approx(7200.0, rel=1e-9)
    assert w.offered_load() == pytest.approx(0.8, rel=0.01)
    for load in (0.5, 0.9):
        jobs = w.at_load(load)
        span = max(j.submit_ns for j in jobs) / NS
        assert work / (32 * span) == pytest.approx(load, rel=1e-6)
        # Only the arrivals move: the programs and the limits stay.
        assert [j.program for j in jobs] == [j.program for j in w.jobs]
    for job, sim in zip(w.jobs, w.at_load(0.7), strict=True):
        assert sim.time_limit == math.ceil(job.isolated_s) >= job.isolated_s
        assert job.isolated_ns == job.program.dedicated_ns()


def test_the_draws_are_per_seed_and_look_as_asked() -> None:
    a, b, c = from_lublin(400, seed=2), from_lublin(400, seed=2), from_lublin(400, seed=3)
    assert a == b and a != c
    multi = [j for j in a.jobs if j.size > 1]
    patterns = {j.program.pattern for j in multi}
    assert patterns == {Pattern.RING, Pattern.ALLREDUCE, Pattern.NONE}
    assert all(j.program.pattern is Pattern.NONE and not j.imbalanced for j in a.jobs if j.size == 1)
    share = sum(j.imbalanced for j in multi) / len(multi)
    assert 0.4 < share < 0.6
    for job in a.jobs:
        compute = job.program.compute_ns
        if job.imbalanced:  # the odd ranks compute twice the even ones'
            assert all(c == round(2 * compute[0]) for c in compute[1::2])
            assert set(compute[::2]) == {compute[0]}
        else:
            assert len(set(compute)) == 1
    # Log-uniform over 1 ms .. 1 s: a median near the geometric middle, 32 ms. Jobs shorter than their
    # draw have fewer, shorter iterations, so look at the long jobs only.
    long = [j.granularity_ns / MS for j in a.jobs if j.isolated_s > 10]
    assert min(long) >= 1 and max(long) <= 1000 and 8 < statistics.median(long) < 120


def test_a_program_runs_as_long_as_its_target() -> None:
    draws = Draws()
    for pattern in Pattern:
        for imbalanced in (False, True):
            for target, granularity in ((60 * NS, MS), (5 * NS, 300 * MS), (40 * MS, 900 * MS)):
                program = program_for(
                    8, target, granularity, pattern=pattern, imbalanced=imbalanced, draws=draws
                )
                slowest = max(program.compute_ns) + program.latency_ns
                assert abs(program.dedicated_ns() - target) <= slowest, (pattern, imbalanced, target)


def test_a_trace_is_fitted_to_the_machine() -> None:
    assert [fit_size(p, 32, 128, "scale") for p in (1, 4, 64, 128)] == [1, 1, 16, 32]
    assert [fit_size(p, 32, 128, "cap") for p in (1, 33, 128)] == [1, 32, 32]
    assert [fit_size(p, 32, 128, "drop") for p in (32, 33)] == [32, None]
    records = [SwfRecord(i + 1, 100.0 * i, runtime=50.0 + i, procs=[1, 64, 128, 8][i % 4]) for i in range(10)]
    records.append(SwfRecord(11, 5000.0, runtime=0, procs=4))  # never ran: left out, as storm sim does
    w = from_trace(records, 128, "t.swf", count=None, nodes=16, pes_per_node=2, sizes="drop")
    assert len(w.jobs) == 5 and all(j.size <= 32 for j in w.jobs)  # 1 and 8 only
    w = from_trace(records, 128, "t.swf", count=6, nodes=16, pes_per_node=2)
    assert [j.size for j in w.jobs] == [1, 16, 32, 2, 1, 16]
    assert w.offered_load() == pytest.approx(0.8, rel=0.01)


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


def test_the_faster_driver_runs_a_drawn_workload_as_before() -> None:
    w = from_lublin(24, 3, 1, seed=5, span_s=20.0)
    same_as_before("fcs", w.at_load(0.9))
