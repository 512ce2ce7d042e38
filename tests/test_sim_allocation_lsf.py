"""The LSF disciplines' simulator (tools/sim/allocation/lsf_*.py): the workload against the paper, timelines
worked out by hand for each kind of preemption, and invariants on random workloads under every discipline
and knowledge case. Small machines and few jobs: fast."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm.speedup import Amdahl
from storm.tools.sim.allocation.jobs import JobSpec
from storm.tools.sim.allocation.lsf_cluster import Costs, Discipline, Knowledge, LsfCluster, Phase
from storm.tools.sim.allocation.lsf_reproduce import DISCIPLINES, Setup, run_one
from storm.tools.sim.allocation.lsf_workload import (
    PAPER_QUARTILES,
    LsfWorkload,
    h2_quantile,
    makespan_bound,
    tagged_jobs,
)


def stream(jobs: list[JobSpec], units: int) -> Iterator[JobSpec]:
    """The given jobs, then untagged one-unit jobs arriving far in the future (the run ends before)."""
    yield from jobs
    later = max(j.arrival for j in jobs) + 1e9
    for i in range(len(jobs), 10**9):
        yield JobSpec(i, later + i, 1.0, 1, 1, units, Amdahl(0.0), tagged=False)


def job(
    job_id: int, arrival: float, work: float, desired: int, *, low: int | None = None, high: int = 2
) -> JobSpec:
    low = desired if low is None else low
    return JobSpec(job_id, arrival, work, low, desired, high, Amdahl(0.0))


def run(discipline: Discipline, jobs: list[JobSpec], units: int = 2, knowledge: Knowledge = Knowledge.NONE):
    cluster = LsfCluster(discipline, knowledge, stream(jobs, units), units=units, processors_per_unit=1)
    result = cluster.run()
    return cluster, {j: end for j, _, end, _, _ in result.jobs}


def test_the_h2_fit_gives_the_papers_quartiles_and_mean() -> None:
    w = LsfWorkload()
    for q, paper in zip((0.25, 0.5, 0.75), PAPER_QUARTILES, strict=True):
        assert h2_quantile(w, q) == pytest.approx(paper, abs=5)
    draws = [j for _, j in zip(range(60_000), w.jobs(3), strict=False)]
    works = [j.work for j in draws]
    assert statistics.fmean(works) == pytest.approx(8000, rel=0.06)
    assert statistics.pstdev(works) / statistics.fmean(works) == pytest.approx(4, rel=0.15)
    assert all(1 <= j.minimum <= j.desired <= j.maximum == 16 for j in draws)
    assert sum(j.kind == "good" for j in draws) / len(draws) == pytest.approx(0.75, abs=0.01)
    gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(draws)]
    assert statistics.fmean(gaps) == pytest.approx(300, rel=0.03)
    assert draws[0].arrival == 0.0 and sum(j.tagged for j in draws) == 200
    # The same seed gives the same stream, another seed another.
    assert tagged_jobs(w, 3) == draws[:200] and tagged_jobs(w, 4) != draws[:200]


def test_makespan_bound() -> None:
    jobs = [job(0, 0.0, 100.0, 1, high=2), job(1, 10.0, 300.0, 2, low=1, high=2)]
    # (a) job 1 alone on both units: 10 + 30 + 150; (b) from t=0 both jobs' areas at their minimum (1 unit):
    # 0 + 30 + 400 / 2 = 230, from t=10 job 1's: 10 + 30 + 300/2 = 190.
    assert makespan_bound(jobs, 30.0, 1, 2) == pytest.approx(230.0)


def test_rtc_timeline_by_hand() -> None:
    # A takes both units at 0 (dispatch 30 s, then 400/2 s); B waits for them and starts at A's end.
    cluster, ends = run(DISCIPLINES["RTC"](), [job(0, 0.0, 400.0, 2), job(1, 10.0, 200.0, 2)])
    assert ends == {0: 230.0, 1: 230.0 + 30 + 100}
    assert [j.first_start for j in cluster.finished] == [0.0, 230.0]


def test_migration_waits_ten_minutes_then_pays_the_checkpoint_and_the_dispatch() -> None:
    # A runs from 30 s; B arrives at 300. A may be checkpointed once it has run 600 s: at the quantum
    # expiry of 660. Its units come free at 720, B is dispatched until 750 and ends at 800; A restarts
    # then with 2000 - 2 x 630 = 740 of work left: 800 + 30 + 370.
    cluster, ends = run(DISCIPLINES["MIG"](), [job(0, 0.0, 2000.0, 2), job(1, 300.0, 100.0, 2)])
    assert ends == pytest.approx({0: 1200.0, 1: 800.0})
    a = next(j for j in cluster.finished if j.job_id == 0)
    assert a.preemptions == 1 and a.progress.done == pytest.approx(2000.0)


def test_simple_preemption_suspends_after_a_minute_and_resumes_in_place() -> None:
    # B arrives at 100: A has run 70 s (>= 60) and B has acquired nothing, so B suspends A at once and is
    # dispatched on A's units (two processes there now); B ends at 230 and A resumes at once: 860 / 2 left.
    cluster, ends = run(DISCIPLINES["PREEMPT"](), [job(0, 0.0, 1000.0, 2), job(1, 100.0, 200.0, 2)])
    assert ends == pytest.approx({0: 660.0, 1: 230.0})
    assert cluster.finished[1].preemptions == 1


def test_demand_without_speedup_lets_a_poor_job_outrank_an_arrival() -> None:
    # A poor job (s = 0.1) on 2 units of 8 processors: 6.4x speedup on 16, so it acquires processor time 2.5x
    # faster than it does work, and demand - acquired reaches 0 at 30 + 1000 s with 60% of its work left.
    poor = JobSpec(0, 0.0, 16_000.0, 2, 2, 2, Amdahl(0.1))
    short = JobSpec(1, 1200.0, 1000.0, 2, 2, 2, Amdahl(0.0))
    ends = {}
    for knowledge in (Knowledge.DEMAND, Knowledge.BOTH):
        cluster = LsfCluster(
            DISCIPLINES["MIG"](), knowledge, stream([poor, short], 2), units=2, processors_per_unit=8
        )
        ends[knowledge] = {j: end for j, _, end, _, _ in cluster.run().jobs}
    # Demand alone: the poor job's estimate is 0, below the short job's 1,000, so it runs to its end
    # (30 + 2,500) and the short one waits for it. Both known: the poor job's remaining demand (8,512) is
    # above 1,000, so it is checkpointed at 1,200 and the short job starts when its units come free:
    # 1,260 + 30 + 1,000 / 16.
    assert ends[Knowledge.DEMAND][0] == pytest.approx(2530.0)
    assert ends[Knowledge.DEMAND][1] == pytest.approx(2530.0 + 30 + 62.5)
    assert ends[Knowledge.BOTH][1] == pytest.approx(1260.0 + 30 + 62.5)


def test_decisions_keep_five_seconds_apart() -> None:
    # B arrives 2 s after A's decision: it is decided at 5 s, dispatched until 35 and ends at 35 + 50.
    _, ends = run(DISCIPLINES["RTC"](), [job(0, 0.0, 100.0, 1), job(1, 2.0, 50.0, 1)])
    assert ends == {0: 130.0, 1: 85.0}


class Checked:
    """A discipline that, after every decision, checks the machine against its jobs."""

    def __init__(self, inner: Discipline) -> None:
        self.inner = inner
        self.name = inner.name
        self.preemptive = inner.preemptive
        self.decisions = 0

    def decide(self, cluster: LsfCluster) -> None:
        self.inner.decide(cluster)
        self.decisions += 1
        holders: dict[int, int] = {}
        processes = [0] * cluster.units
        for j in cluster.jobs.values():
            if j.phase in (Phase.DISPATCHING, Phase.RUNNING, Phase.CHECKPOINTING):
                for u in j.units:
                    assert u not in holders, f"unit {u} held by jobs {holders[u]} and {j.job_id}"
                    holders[u] = j.job_id
            if j.phase in (Phase.DISPATCHING, Phase.RUNNING, Phase.SUSPENDED, Phase.CHECKPOINTING):
                assert j.spec.minimum <= len(j.units) <= j.spec.maximum
                for u in j.units:
                    processes[u] += 1
            if j.phase in (Phase.PENDING, Phase.STOPPED):
                assert not j.units or j.phase is Phase.PENDING
        assert processes == cluster.processes
        assert max(processes) <= cluster.costs.max_processes
        assert [cluster.holder[u] for u in range(cluster.units)] == [
            holders.get(u) for u in range(cluster.units)
        ]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(DISCIPLINES)),
    knowledge=st.sampled_from(list(Knowledge)),
    seed=st.integers(0, 10_000),
    count=st.integers(1, 14),
)
def test_every_discipline_keeps_the_machine_consistent_and_does_all_work(
    name: str, knowledge: Knowledge, seed: int, count: int
) -> None:
    rng = random.Random(seed)
    units = 4
    jobs, clock = [], 0.0
    for i in range(count):
        low = rng.randint(1, units)
        jobs.append(
            JobSpec(
                i,
                clock,
                rng.choice([30.0, 500.0, 5000.0]) * rng.random() + 1,
                low,
                rng.randint(low, units),
                units,
                Amdahl(rng.choice([0.0, 0.001, 0.1])),
            )
        )
        clock += rng.expovariate(1 / 200)
    checked = Checked(DISCIPLINES[name]())
    cluster = LsfCluster(checked, knowledge, stream(jobs, units), units=units, processors_per_unit=8)
    result = cluster.run()
    assert result.finished and checked.decisions > 0
    done = {j.job_id: j for j in cluster.finished}
    for spec in jobs:
        finished = done[spec.job_id]
        # The engine checks the work done at each end; here: no job beats its best possible time.
        assert finished.end >= spec.arrival + 30 + spec.runtime(spec.maximum, 8) - 1e-6
        assert finished.progress.done == pytest.approx(spec.work, rel=1e-6)
    # Deterministic: the same run again gives the same figures.
    again = LsfCluster(
        DISCIPLINES[name](), knowledge, stream(jobs, units), units=units, processors_per_unit=8
    ).run()
    assert again.jobs == result.jobs and again.counts == {**result.counts}


def test_a_run_of_the_reproduction() -> None:
    setup = Setup(seeds=(0,), costs=Costs(), workload=LsfWorkload(tagged=30))
    out = run_one(setup, "MALL-AD", "both", 0)
    assert out["unfinished"] == 0 and out["makespan"] >= out["makespan_bound"] > 0
    assert 0 <= out["queue_over_5_share"] <= 1 and out["peak_queue"] >= 0
    assert out["counts"]["starts"] >= 30
