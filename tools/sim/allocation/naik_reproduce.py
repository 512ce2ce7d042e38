"""``storm sim reproduce naik``'s runs: steady state per class against lambda, FP's best partition count, DP's
tuning, and the transient after a burst of small jobs.

- Steady state: every policy (AP, FPJP(128,128,256), FPJP(128,192,192), DP and FP with 1, 2, 4, 8, 16
  partitions) at every lambda, ``seeds`` independent runs of ``departures`` departures each, the first
  ``warmup`` of each dropped. Per class: mean response S and mean U = S / (time on Req), with a 95%
  confidence interval from the runs' means (Student's t). The paper used the regenerative method to 5%
  at 95%; independent replications are simpler and the report gives each interval.
- Transient (the paper's section 4.3): at lambda = 0.007, a run reaches steady state (the running mean of
  U over departures has stayed within 10% of its steady-state value, from the steady-state runs, for 100
  departures: that departure is t); at departure t + 100 ten small jobs arrive at once; U is recorded for
  departures t .. t + 400, over ``transient_seeds`` seeds, under DP and FPJP(128,128,256).
- DP's tuning: M and T over a small grid at one lambda, to show what the report's defaults were chosen
  from (the paper tuned them and does not give them).

Each run depends only on its arguments, so runs go to a pool of processes in any order.
"""

from __future__ import annotations

import concurrent.futures
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from storm.tools.sim.allocation.naik_cluster import (
    Adaptive,
    ClassPartitions,
    Departure,
    FixedPartitions,
    NaikCluster,
    Policy,
)
from storm.tools.sim.allocation.naik_dynamic import DpParameters, Dynamic
from storm.tools.sim.allocation.naik_workload import CLASSES, NaikWorkload, applications

Json = dict[str, Any]
RATES = (0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009)
MAIN = ("AP", "FPJP(128,128,256)", "FPJP(128,192,192)", "DP")
FP = ("FP(1x512)", "FP(2x256)", "FP(4x128)", "FP(8x64)", "FP(16x32)")
TRANSIENT = ("DP", "FPJP(128,128,256)")
BURST_BASE = 10_000_000  # job ids of the burst's jobs
TUNING_M = (32, 64, 128, 256)
TUNING_T = (300.0, 1800.0)


@dataclass(frozen=True)
class Setup:
    seeds: int = 5
    departures: int = 40_000
    warmup: int = 4_000
    transient_rate: float = 0.007
    transient_seeds: int = 10
    burst: int = 10
    dp: DpParameters = field(default_factory=DpParameters)
    tuning_rate: float = 0.009


def make_policy(name: str, dp: DpParameters) -> Policy:
    if name == "AP":
        return Adaptive()
    if name == "DP":
        return Dynamic(dp)
    if name.startswith("FPJP("):
        small, medium, large = (int(x) for x in name[5:-1].split(","))
        return ClassPartitions(small, medium, large)
    if name.startswith("FP("):
        return FixedPartitions(int(name[3:].split("x", maxsplit=1)[0]))
    raise ValueError(f"unknown policy {name!r}")


def steady_run(setup: Setup, name: str, rate: float, seed: int, dp: DpParameters | None = None) -> Json:
    """One steady-state run: per class, the mean S and U of the departures after the warm-up."""
    cluster = NaikCluster(
        make_policy(name, dp or setup.dp), NaikWorkload(rate=rate).jobs(seed), setup.departures
    )
    kept = cluster.run()[setup.warmup :]
    out: Json = {"policy": name, "rate": rate, "seed": seed, "counts": dict(cluster.counts)}
    for kind in ("all", *CLASSES):
        chosen = [d for d in kept if kind in ("all", d.kind)]
        out[kind] = {
            "jobs": len(chosen),
            "S": statistics.fmean(d.response for d in chosen) if chosen else None,
            "U": statistics.fmean(d.ratio for d in chosen) if chosen else None,
        }
    return out


T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% confidence interval (Student's t, normal beyond 16 values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    t = T975[len(values) - 2] if len(values) - 2 < len(T975) else 1.96
    return mean, t * statistics.stdev(values) / len(values) ** 0.5


def steady_cells(runs: Sequence[Json]) -> dict[str, dict[str, Json]]:
    """Per policy, per rate (as "%g"): per class, S and U with their intervals."""
    grouped: dict[tuple[str, float], list[Json]] = {}
    for run in runs:
        grouped.setdefault((run["policy"], run["rate"]), []).append(run)
    out: dict[str, dict[str, Json]] = {}
    for (name, rate), group in sorted(grouped.items(), key=lambda item: (item[0][0], item[0][1])):
        cell: Json = {
            "grows": sum(r["counts"]["grow"] for r in group),
            "shrinks": sum(r["counts"]["shrink"] for r in group),
        }
        for kind in ("all", *CLASSES):
            for metric in ("S", "U"):
                values = [r[kind][metric] for r in group if r[kind][metric] is not None]
                mean, half = mean_ci(values) if values else (float("nan"), float("nan"))
                cell.setdefault(kind, {})[metric] = {"mean": mean, "ci95": half}
        out.setdefault(name, {})[f"{rate:g}"] = cell
    return out


class BurstWatch:
    """The transient run's departure hook: finds t, injects the burst at t + 100, records U_t .. U_t+400."""

    def __init__(self, steady_u: float, burst: int, seed: int, window: int = 100, after: int = 400) -> None:
        self.steady_u = steady_u
        self.burst = burst
        self.window = window
        self.after = after
        self.rng = random.Random(seed * 7919 + 1)
        self.total = 0.0
        self.count = 0
        self.inside = 0  # consecutive departures with the running mean within 10%
        self.t: int | None = None
        self.u: list[float] = []
        self.done = False

    def __call__(self, cluster: NaikCluster, departure: Departure) -> None:
        self.count += 1
        self.total += departure.ratio
        if self.t is None:
            close = abs(self.total / self.count - self.steady_u) <= 0.1 * self.steady_u
            self.inside = self.inside + 1 if close else 0
            if self.inside >= self.window:
                self.t = self.count
        if self.t is None:
            return
        self.u.append(departure.ratio)
        if self.count == self.t + self.window:
            small = applications()["small"]
            workload = NaikWorkload()
            cluster.inject([
                workload.job(BURST_BASE + i, cluster.now, self.rng.choice(small)) for i in range(self.burst)
            ])  # fmt: skip
        if len(self.u) > self.after:
            self.done = True
            cluster.stopped = True


SEARCH = 200_000  # departures a transient run may take to reach steady state


def transient_run(setup: Setup, name: str, seed: int, steady_u: float) -> Json:
    """One transient sample path: U from departure t to t + 400, the burst at t + 100. A RuntimeError if
    the running mean never settles near ``steady_u`` within :data:`SEARCH` departures (a steady-state value
    from runs too short to be right)."""
    watch = BurstWatch(steady_u, setup.burst, seed)
    jobs = NaikWorkload(rate=setup.transient_rate).jobs(1000 + seed)
    cluster = NaikCluster(make_policy(name, setup.dp), jobs, SEARCH, on_departure=watch)
    cluster.run()
    if not watch.done:
        raise RuntimeError(
            f"{name}, sample path {seed}: the running mean of U did not stay within 10% of the steady-state "
            f"{steady_u:.3g} for 100 departures within {SEARCH:,} departures: run longer steady states "
            "(--departures)"
        )
    return {"policy": name, "seed": seed, "t": watch.t, "u": watch.u[: watch.after + 1]}


def tuning_run(setup: Setup, grow: int, quiet: float, seed: int) -> Json:
    params = DpParameters(grow_threshold=grow, quiet_s=quiet)
    run = steady_run(setup, "DP", setup.tuning_rate, seed, params)
    run["M"], run["T"] = grow, quiet
    return run


def _pool_map(
    workers: int, calls: list[tuple[Callable[..., Json], tuple[Any, ...]]], say: Callable[[str], object]
) -> list[Json]:
    """Each call's result, in the calls' order, run ``workers`` at a time."""
    if workers <= 1:
        out = []
        for i, (fn, args) in enumerate(calls):
            out.append(fn(*args))
            if (i + 1) % 20 == 0 or i + 1 == len(calls):
                say(f"{i + 1}/{len(calls)} runs")
        return out
    results: dict[int, Json] = {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fn, *args): i for i, (fn, args) in enumerate(calls)}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            if len(results) % 20 == 0 or len(results) == len(calls):
                say(f"{len(results)}/{len(calls)} runs")
    return [results[i] for i in range(len(calls))]


def run_all(
    setup: Setup,
    *,
    rates: Sequence[float] = RATES,
    workers: int = 1,
    say: Callable[[str], object] = lambda _t: None,
) -> Json:
    """Every run the report needs: steady state, DP's tuning grid, then the transient (which needs the
    steady state's U at its rate)."""
    rates = sorted(set(rates) | {setup.transient_rate})
    policies = (*MAIN, *FP)
    steady_calls = [
        (steady_run, (setup, p, r, s)) for p in policies for r in rates for s in range(setup.seeds)
    ]
    tuning_calls = [
        (tuning_run, (setup, m, t, s)) for m in TUNING_M for t in TUNING_T for s in range(setup.seeds)
    ]
    say(f"steady state and DP's tuning: {len(steady_calls) + len(tuning_calls)} runs")
    done = _pool_map(workers, [*steady_calls, *tuning_calls], say)
    steady, tuning = done[: len(steady_calls)], done[len(steady_calls) :]
    cells = steady_cells(steady)
    key = f"{setup.transient_rate:g}"
    transient_calls = [
        (transient_run, (setup, p, s, cells[p][key]["all"]["U"]["mean"]))
        for p in TRANSIENT for s in range(setup.transient_seeds)
    ]  # fmt: skip
    say(f"transient: {len(transient_calls)} runs")
    transient = _pool_map(workers, transient_calls, say)
    return {"steady": steady, "tuning": tuning, "transient": transient}


def tuning_cells(runs: Sequence[Json]) -> list[Json]:
    """Per (M, T): S per class over the seeds, and the reconfigurations counted."""
    grouped: dict[tuple[int, float], list[Json]] = {}
    for run in runs:
        grouped.setdefault((run["M"], run["T"]), []).append(run)
    out = []
    for (grow, quiet), group in sorted(grouped.items()):
        row: Json = {"M": grow, "T": quiet, "grows": sum(r["counts"]["grow"] for r in group),
                     "shrinks": sum(r["counts"]["shrink"] for r in group)}  # fmt: skip
        for kind in ("all", *CLASSES):
            row[kind] = statistics.fmean(r[kind]["S"] for r in group)
        out.append(row)
    return out


SMOOTH = 21  # departures in the transient's centred moving average


def transient_summary(runs: Sequence[Json]) -> dict[str, Json]:
    """Per policy: the mean U curve over the seeds (departure index s = 0..400, the burst at 100), its
    steady level (the mean over s < 100), the spread of the samples before the burst, and the burst's
    effect on the curve smoothed over :data:`SMOOTH` departures: the peak excess over the steady level,
    how many departures after the burst it stays above half that excess (the last such s - 100), and the
    excess area (sum over s >= 100 of the mean curve above the steady level)."""
    out: dict[str, Json] = {}
    for name in sorted({r["policy"] for r in runs}):
        curves = [r["u"] for r in runs if r["policy"] == name]
        length = min(len(c) for c in curves)
        mean = [statistics.fmean(c[s] for c in curves) for s in range(length)]
        steady = statistics.fmean(mean[:100])
        before = [c[s] for c in curves for s in range(100)]
        half = SMOOTH // 2
        smooth = [statistics.fmean(mean[max(0, s - half) : s + half + 1]) for s in range(length)]
        excess = [x - steady for x in smooth]
        peak = max(excess[100:])
        lasting = [s for s in range(100, length) if excess[s] >= 0.5 * peak]
        out[name] = {
            "seeds": len(curves),
            "t": [r["t"] for r in runs if r["policy"] == name],
            "mean_curve": mean,
            "steady": steady,
            "sd_before_burst": statistics.pstdev(before),
            "peak_sample": max(c[s] for c in curves for s in range(100, length)),
            "peak_excess": peak,
            "duration": (max(lasting) - 100) if lasting else 0,
            "excess_area": sum(max(x - steady, 0.0) for x in mean[100:]),
        }
    return out


def best_fp(cells: dict[str, dict[str, Json]], rates: Sequence[float]) -> dict[str, str]:
    """Per rate, the FP with the lowest overall S."""
    return {f"{r:g}": min(FP, key=lambda p: cells[p][f"{r:g}"]["all"]["S"]["mean"]) for r in rates}
