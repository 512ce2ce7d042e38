"""``storm sim reproduce lsf``'s runs: Table 3 of Parsons and Sevcik, every discipline x knowledge x seed.

A run is one seed's job stream (lsf_workload.py) through one discipline with one knowledge case, until its
200 tagged jobs have left (or the horizon: then the mean response is a lower bound, the unfinished jobs
counted as leaving at the horizon, as the paper's ">" cells are). Every discipline sees the same streams.
A run depends only on its :class:`Setup`, discipline, knowledge and seed, so the runs go to a pool of
processes in any order. Besides the 40 cells of Table 3, the headline cells (RTC, RTC-ADSUBSET, MIG,
MALL-AD, no knowledge) are run again at other arrival rates (:data:`SENSITIVITY_RATES`): the paper gives
no rate, and the report shows how its claims move with it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from storm.tools.sim.allocation.lsf_cluster import Costs, Discipline, Knowledge, LsfCluster
from storm.tools.sim.allocation.lsf_migrate import Migrate
from storm.tools.sim.allocation.lsf_preempt import Preempt, PreemptAdaptive
from storm.tools.sim.allocation.lsf_rtc import RunToCompletion
from storm.tools.sim.allocation.lsf_workload import (
    PROCESSORS_PER_UNIT,
    LsfWorkload,
    makespan_bound,
    tagged_jobs,
)

Json = dict[str, Any]

DISCIPLINES: dict[str, Callable[[], Discipline]] = {
    "RTC": RunToCompletion,
    "RTC-AD": lambda: RunToCompletion(adaptive=True),
    "RTC-ADSUBSET": lambda: RunToCompletion(adaptive=True, subset=True),
    "PREEMPT": Preempt,
    "PREEMPT-AD": PreemptAdaptive,
    "MIG": Migrate,
    "MIG-AD": lambda: Migrate("adaptive"),
    "MIG-ADSUBSET": lambda: Migrate("adaptive", subset=True),
    "MALL-AD": lambda: Migrate("malleable"),
    "MALL-ADSUBSET": lambda: Migrate("malleable", subset=True),
}
SIMULATOR_ONLY = ("MIG", "MIG-AD", "MIG-ADSUBSET", "MALL-AD", "MALL-ADSUBSET")
KNOWLEDGE = tuple(k.value for k in Knowledge)
HEADLINE = ("RTC", "RTC-ADSUBSET", "MIG", "MALL-AD")
SENSITIVITY_RATES = (1 / 250, 1 / 350, 1 / 400)

# Table 3 verbatim, per discipline in the order of KNOWLEDGE (none, service demand, speedup, both):
# (MRT s, makespan s, unfinished jobs); unfinished > 0 means both figures are lower bounds (the paper's ">").
TABLE3: dict[str, tuple[tuple[float, float, int], ...]] = {
    "RTC": ((5853, 147951, 0), (4040, 140342, 0), (5279, 130361, 0), (5627, 143507, 0)),
    "RTC-AD": ((10611, 129093, 0), (8713, 126531, 0), (8034, 91003, 0), (8946, 126917, 0)),
    "RTC-ADSUBSET": ((8264, 76637, 0), (8410, 81767, 0), (8039, 73324, 0), (8074, 75340, 0)),
    "PREEMPT": ((5793, 145440, 0), (5039, 143686, 0), (5280, 130314, 0), (5028, 143631, 0)),
    "PREEMPT-AD": ((2293, 219105, 2), (1078, 127204, 0), (2207, 172768, 0), (821, 111489, 0)),
    "MIG": ((678, 83985, 0), (662, 81836, 0), (690, 82214, 0), (660, 82708, 0)),
    "MIG-AD": ((769, 88488, 0), (858, 103876, 0), (784, 86080, 0), (1342, 192031, 1)),
    "MIG-ADSUBSET": ((770, 90789, 0), (854, 106065, 0), (769, 85828, 0), (1347, 193772, 1)),
    "MALL-AD": ((667, 77534, 0), (632, 78760, 0), (666, 78215, 0), (650, 78840, 0)),
    "MALL-ADSUBSET": ((681, 78537, 0), (680, 79191, 0), (680, 76481, 0), (644, 78065, 0)),
}
PAPER = {name: dict(zip(KNOWLEDGE, row, strict=True)) for name, row in TABLE3.items()}


@dataclass(frozen=True)
class Setup:
    """What every run shares: the workload, the costs, the seeds and the horizon."""

    seeds: tuple[int, ...] = tuple(range(20))
    workload: LsfWorkload = field(default_factory=LsfWorkload)
    costs: Costs = field(default_factory=Costs)
    horizon_s: float = 2_000_000.0

    def key(self) -> Json:
        return dataclasses.asdict(self)


def run_one(setup: Setup, discipline: str, knowledge: str, seed: int, rate: float | None = None) -> Json:
    """One run's figures. O(the run's events x the discipline's decision cost)."""
    workload = setup.workload if rate is None else dataclasses.replace(setup.workload, rate=rate)
    cluster = LsfCluster(
        DISCIPLINES[discipline](), Knowledge(knowledge), workload.jobs(seed), units=workload.units,
        processors_per_unit=PROCESSORS_PER_UNIT, costs=setup.costs, horizon_s=setup.horizon_s,
    )  # fmt: skip
    result = cluster.run()
    ends = [end if end is not None else result.end_time for _, _, end, _, _ in result.jobs]
    responses = [end - arrival for (_, arrival, _, _, _), end in zip(result.jobs, ends, strict=True)]
    bound = makespan_bound(
        tagged_jobs(workload, seed), setup.costs.dispatch_s, PROCESSORS_PER_UNIT, workload.units
    )
    span = result.end_time * workload.units
    slowest = max(
        (j for j in [*cluster.finished, *cluster.jobs.values()] if j.spec.tagged),
        key=lambda j: ((j.end if j.end is not None else result.end_time) - j.spec.arrival, -j.job_id),
    )
    over5 = sum(t for n, t in result.queue_time.items() if n > 5)
    return {
        "discipline": discipline,
        "knowledge": knowledge,
        "seed": seed,
        "rate": workload.rate,
        "unfinished": sum(end is None for _, _, end, _, _ in result.jobs),
        "mrt": statistics.fmean(responses),
        "median_response": statistics.median(responses),
        "makespan": max(ends),
        "makespan_bound": bound,
        "peak_queue": result.peak_queue,
        "mean_queue": result.mean_queue,
        "queue_over_5_share": over5 / result.end_time if result.end_time > 0 else 0.0,
        "counts": result.counts,
        "slowest": {
            "job": slowest.job_id,
            "response": (slowest.end if slowest.end is not None else result.end_time) - slowest.spec.arrival,
            "work": slowest.spec.work,
            "minimum": slowest.spec.minimum,
            "desired": slowest.spec.desired,
            "kind": slowest.spec.kind,
            "alone": slowest.spec.runtime(slowest.spec.maximum, PROCESSORS_PER_UNIT),
            "preemptions": slowest.preemptions,
            "finished": slowest.end is not None,
        },
        "unit_shares": {k: v / span for k, v in result.unit_seconds.items()} if span > 0 else {},
    }


def _batch(
    setup: Setup, discipline: str, knowledge: str, seeds: Sequence[int], rate: float | None
) -> list[Json]:
    return [run_one(setup, discipline, knowledge, seed, rate) for seed in seeds]


def run_all(
    setup: Setup,
    disciplines: Sequence[str],
    knowledges: Sequence[str],
    *,
    rates: Sequence[float] = SENSITIVITY_RATES,
    workers: int = 1,
    say: Callable[[str], object] = lambda _text: None,
) -> tuple[list[Json], list[Json]]:
    """Table 3's runs and the sensitivity runs (headline cells, no knowledge, at ``rates``), each list in a
    fixed order whatever the pool's: by discipline, knowledge (or rate), seed."""
    for name in disciplines:
        if name not in DISCIPLINES:
            raise ValueError(f"unknown discipline {name!r}: one of {', '.join(DISCIPLINES)}")
    for k in knowledges:
        if k not in KNOWLEDGE:
            raise ValueError(f"unknown knowledge {k!r}: one of {', '.join(KNOWLEDGE)}")
    table = [(d, k, None) for d in disciplines for k in knowledges]
    extra = [(d, "none", r) for r in rates for d in HEADLINE if d in disciplines]
    tasks = table + extra
    done: dict[tuple[str, str, float | None], list[Json]] = {}
    if workers <= 1:
        for task in tasks:
            done[task] = _batch(setup, task[0], task[1], setup.seeds, task[2])
            say(_progress(task, len(done), len(tasks)))
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_batch, setup, d, k, setup.seeds, r): (d, k, r) for d, k, r in tasks}
            for future in concurrent.futures.as_completed(futures):
                done[futures[future]] = future.result()
                say(_progress(futures[future], len(done), len(tasks)))
    return [run for task in table for run in done[task]], [run for task in extra for run in done[task]]


def _progress(task: tuple[str, str, float | None], count: int, total: int) -> str:
    d, k, r = task
    at = f" at 1/{1 / r:.0f} per s" if r is not None else ""
    return f"{d}, {k}{at}: done ({count}/{total})"


def spread(values: Sequence[float]) -> Json:
    """Mean, median, standard deviation, min, max and the 95% confidence half-width of the mean (normal
    approximation, 1.96 sigma / sqrt(n))."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "mean": mean,
        "median": statistics.median(values),
        "sd": sd,
        "min": min(values),
        "max": max(values),
        "ci95": 1.96 * sd / len(values) ** 0.5,
    }


def cells(runs: Sequence[Json]) -> dict[str, dict[str, Json]]:
    """Per discipline and knowledge (or rate): the spread over seeds of each figure."""
    grouped: dict[tuple[str, str], list[Json]] = {}
    for run in runs:
        grouped.setdefault((run["discipline"], run["knowledge"]), []).append(run)
    out: dict[str, dict[str, Json]] = {}
    for (d, k), group in grouped.items():
        out.setdefault(d, {})[k] = {
            "seeds": len(group),
            "runs_unfinished": sum(r["unfinished"] > 0 for r in group),
            "jobs_unfinished": sum(r["unfinished"] for r in group),
            "mrt": spread([r["mrt"] for r in group]),
            "median_response": spread([r["median_response"] for r in group]),
            "makespan": spread([r["makespan"] for r in group]),
            "makespan_over_bound": spread([r["makespan"] / r["makespan_bound"] for r in group]),
            "peak_queue": spread([float(r["peak_queue"]) for r in group]),
            "mean_queue": spread([r["mean_queue"] for r in group]),
            "queue_over_5_share": spread([r["queue_over_5_share"] for r in group]),
            "unit_shares": {
                name: statistics.fmean(r["unit_shares"].get(name, 0.0) for r in group)
                for name in ("computing", "dispatching", "checkpointing")
            },
        }
    return out


def by_rate(runs: Sequence[Json]) -> dict[str, dict[str, Json]]:
    """The sensitivity runs' cells, keyed by rate (as "1/300") then discipline."""
    out: dict[str, dict[str, Json]] = {}
    for rate in sorted({r["rate"] for r in runs}, reverse=True):
        label = f"1/{1 / rate:.0f}"
        out[label] = {d: c["none"] for d, c in cells([r for r in runs if r["rate"] == rate]).items()}
    return out
