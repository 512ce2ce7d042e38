"""Naik, Setia and Squillante's policies in the simulator (tools/sim/allocation/naik_*.py): the workload
against Table 1, FPJP's and DP's rules on timelines worked out by hand, invariants on random runs."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm.speedup import Downey
from storm.tools.sim.allocation.jobs import JobSpec
from storm.tools.sim.allocation.naik_cluster import Adaptive, ClassPartitions, FixedPartitions, NaikCluster
from storm.tools.sim.allocation.naik_dynamic import DpParameters, Dynamic
from storm.tools.sim.allocation.naik_reproduce import FP, MAIN, BurstWatch, Setup, make_policy, steady_run
from storm.tools.sim.allocation.naik_workload import CLASSES, TABLE1, NaikWorkload, applications, spread


def test_table_1_holds_and_req_is_the_most_efficient_size() -> None:
    apps = applications()
    for kind, (count, req, mean, low, high) in TABLE1.items():
        times = [a.time_at_req for a in apps[kind]]
        assert len(times) == count
        assert min(times) == pytest.approx(low) and max(times) == pytest.approx(high)
        assert statistics.fmean(times) == pytest.approx(mean, rel=1e-6)
        model = apps[kind][0].speedup
        # Req maximises speedup x efficiency (the processor working set).
        assert max(range(1, 600), key=lambda n: model.speedup(n) ** 2 / n) == req
    assert spread(4, 1.0, 9.0, 2.0) == pytest.approx(sorted(spread(4, 1.0, 9.0, 2.0)))


def test_class_ratio_and_offered_load() -> None:
    w = NaikWorkload(rate=0.009)
    draws = [j for _, j in zip(range(100_000), w.jobs(2), strict=False)]
    shares = [sum(j.kind == k for j in draws) / len(draws) for k in CLASSES]
    assert shares == pytest.approx([320 / 329, 8 / 329, 1 / 329], abs=0.002)
    assert w.offered_load() == pytest.approx(0.705, abs=0.001)
    assert all(j.minimum == 8 and j.maximum == 128 and j.desired in (8, 32) for j in draws)


def app_job(job_id: int, arrival: float, kind: str, seconds_at_req: float) -> JobSpec:
    req = 8 if kind == "small" else 32
    model = Downey(req * 4, 2 / 3)
    return JobSpec(job_id, arrival, seconds_at_req * model.speedup(req * 4), 8, req, 128, model, kind)


def given_jobs(jobs: list[JobSpec]) -> Iterator[JobSpec]:
    yield from jobs
    for i in range(len(jobs), 10**9):
        yield app_job(i, 1e12 + i, "small", 10.0)


def test_fpjp_partitions_and_who_gets_a_freed_one() -> None:
    policy = ClassPartitions(128, 128, 256)
    assert [p for p in policy.partitions] == [("small", 8)] * 4 + [
        ("medium", 32),
        ("large", 32),
        ("large", 32),
    ]
    jobs = [app_job(i, 0.0, "small", 100.0) for i in range(5)]  # 4 small partitions, then the medium one
    jobs += [app_job(5, 0.0, "medium", 50.0)]  # a large partition: medium jobs may use them
    jobs += [app_job(6, 0.0, "large", 1000.0), app_job(7, 0.0, "large", 1000.0)]  # one runs, one waits
    jobs += [app_job(8, 1.0, "small", 10.0)]  # nothing free: waits for a small partition... or a large one
    cluster = NaikCluster(policy, given_jobs(jobs), len(jobs))
    departures = {d.job_id: d for d in cluster.run()}
    # The medium job ends first (on a large partition, 128 PEs, its Req: 50 s). The freed large partition goes
    # to the large queue's head (job 7), not to the small job waiting since t = 1 (job 8) ...
    assert departures[5].end == pytest.approx(50.0)
    assert departures[7].start == pytest.approx(50.0)
    # ... which gets the medium partition when job 4, the small job that took it, ends: on 128 PEs it ran
    # faster than at its Req (S(128) = 32 against S(32) = 24.2).
    assert departures[4].end == pytest.approx(100.0 * 24.2 / 32, rel=0.01)
    assert departures[8].start == pytest.approx(departures[4].end)
    assert all(departures[i].end == pytest.approx(100.0) for i in range(4))


def test_dp_shrinks_a_large_job_at_its_iteration_boundary_for_a_small_arrival() -> None:
    params = DpParameters()
    large = app_job(0, 0.0, "large", 10_000.0)
    smalls = [app_job(i, 1.0, "small", 5_000.0) for i in range(1, 13)]  # 12 x 8 units: the machine is full
    late = app_job(13, 100.0, "small", 20_000.0)
    policy = Dynamic(params)
    cluster = NaikCluster(policy, given_jobs([large, *smalls, late]), 1)  # until the first small job ends
    cluster.run()
    assert cluster.counts == {"grow": 0, "shrink": 1}
    # 14 jobs in the system: P/N = 128 // 14 = 9 units. The large job (100 iterations of 100 s at 128 PEs) is
    # at its iteration boundary at 100 s; phase 1 takes 4 GB / (32 x 100 MB/s) + 5 us x 128 PEs, and then the
    # 23 units it gives back go to the waiting small job, at its Req (8).
    phase = 4e9 / (32 * 100e6) + 5e-6 * 128
    assert cluster.running[13].start == pytest.approx(100.0 + phase)
    assert cluster.running[0].units == 9 and cluster.running[13].units == 8
    assert cluster.free == 128 - 9 - 11 * 8 - 8


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from([*MAIN, *FP]),
    rate=st.sampled_from([0.002, 0.006, 0.010]),
    seed=st.integers(0, 1000),
)
def test_every_policy_conserves_processors_and_work(name: str, rate: float, seed: int) -> None:
    policy = make_policy(name, DpParameters(quiet_s=60.0))
    cluster = NaikCluster(policy, NaikWorkload(rate=rate).jobs(seed), 600)
    departures = cluster.run()
    assert len(departures) == 600
    used = sum(j.units for j in cluster.running.values())
    assert used + cluster.free == 128 or name == "DP"  # DP may hold units reserved for a growth
    assert used <= 128 - cluster.free
    for d in departures:
        # No job beats its time on its best size (the engine checks the work each one did).
        assert d.end - d.arrival >= d.time_at_req * 0.74 - 1e-9
    assert cluster.in_system == len(cluster.running) + policy.waiting()


def test_steady_runs_are_deterministic() -> None:
    setup = Setup(departures=800, warmup=80)
    assert steady_run(setup, "DP", 0.008, 3) == steady_run(setup, "DP", 0.008, 3)
    assert steady_run(setup, "AP", 0.008, 3) != steady_run(setup, "AP", 0.008, 4)


def test_the_burst_arrives_once_the_running_mean_has_settled() -> None:
    watch = BurstWatch(steady_u=1.0, burst=10, seed=0, window=5, after=20)
    cluster = NaikCluster(Adaptive(), NaikWorkload(rate=0.001).jobs(0), 10**6, on_departure=watch)
    cluster.run()
    assert watch.done and watch.t is not None and len(watch.u) == 21
    # Ten small jobs joined the stream after departure t + 5.
    assert sum(d.job_id >= 10_000_000 for d in cluster.departures) >= 1
    assert all(d.job_id < 10_000_000 for d in cluster.departures[: watch.t + 5])


def test_fixed_partitions_refuse_an_uneven_split() -> None:
    with pytest.raises(ValueError):
        FixedPartitions(3)
    with pytest.raises(ValueError):
        ClassPartitions(128, 128, 128)
