"""``storm sim reproduce naik``'s report: S and U per class against lambda, FP's best partition count, DP's
tuning, the transient, and issue 17's claims for this paper checked one by one.

How the claims are checked (policies compared: AP, FPJP(128,128,256), FPJP(128,192,192), DP):

- AP matches the best FP at each load: AP's overall mean response within :data:`MATCH` (10%) of the lowest
  of the five FPs', or below it, at every lambda;
- DP best for small jobs at every load: at every lambda DP's small-job mean response is the lowest, or
  above the lowest by less than the two means' combined 95% half-widths (not significantly worse);
- DP best for medium and large jobs at low load (lambda <= :data:`LOW`) and worst at high load
  (lambda >= :data:`HIGH`), in the same sense, per class;
- DP's transient smaller and shorter than FPJP(128,128,256)'s: a lower peak excess of the smoothed mean U
  curve over its steady level, and fewer departures above half that peak (naik_reproduce.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from storm.mm.speedup import Downey
from storm.tools.sim.allocation.naik_dynamic import DpParameters
from storm.tools.sim.allocation.naik_reproduce import (
    FP,
    MAIN,
    TRANSIENT,
    Setup,
    best_fp,
    steady_cells,
    transient_summary,
    tuning_cells,
)
from storm.tools.sim.allocation.naik_workload import CLASSES, SIGMA, assumptions

Json = dict[str, Any]
MATCH = 0.10
LOW = 0.003
HIGH = 0.008


def _s(cells: dict[str, dict[str, Json]], policy: str, rate: str, kind: str, metric: str = "S") -> Json:
    return dict(cells[policy][rate][kind][metric])


def _not_worse(mine: Json, others: Sequence[Json], *, best: bool) -> bool:
    """Whether ``mine`` is the lowest (``best``) or highest of the means, or within the combined 95%
    half-widths of it."""
    for other in others:
        slack = math.hypot(mine["ci95"], other["ci95"])
        if best and mine["mean"] > other["mean"] + slack:
            return False
        if not best and mine["mean"] < other["mean"] - slack:
            return False
    return True


def claims(
    cells: dict[str, dict[str, Json]], transient: dict[str, Json], tuning: Sequence[Json]
) -> list[Json]:
    out: list[Json] = []
    rates = sorted(cells["AP"], key=float)
    fps = best_fp(cells, [float(r) for r in rates])
    ratios = {r: _s(cells, "AP", r, "all")["mean"] / _s(cells, fps[r], r, "all")["mean"] for r in rates}
    misses = [r for r in rates if ratios[r] > 1 + MATCH]
    why = ""
    if misses:
        small = Downey(32, SIGMA)
        parts = []
        for best in sorted({fps[r] for r in misses}):
            size = int(best.split("x")[1].rstrip(")"))
            at = ", ".join(r for r in misses if fps[r] == best)
            ratio = small.speedup(size) / small.speedup(32)
            parts.append(
                f"at {at} the best is {best}, whose partitions run small jobs on {size} processors, past "
                f"their Req of 32, where our substitute speedup is {ratio:.2f}x S(32)"
            )
        why = (
            "; ".join(parts) + ". AP never gives a job more than its Req, so at light load it cannot match a "
            "partition larger than Req: how much that costs depends on the speedup past Req, which the "
            "paper's unpublished tables set. Its own 'FP(1x512) best at low load' needs even more speedup "
            "there."
        )
    out.append({
        "claim": "AP matches the best fixed partitioning at each load",
        "paper": "'AP performs as well as the best FP policy for a given value of lambda' (not shown)",
        "model": "AP / best FP: " + ", ".join(f"{r} {ratios[r]:.2f} ({fps[r]})" for r in rates),
        "agrees": not misses, "why": why,
    })  # fmt: skip
    rivals = [p for p in MAIN if p != "DP"]

    def check(kind: str, chosen: Sequence[str], best: bool) -> list[str]:
        return [
            r for r in chosen
            if not _not_worse(_s(cells, "DP", r, kind), [_s(cells, p, r, kind) for p in rivals], best=best)
        ]  # fmt: skip

    misses = check("small", rates, True)
    out.append({
        "claim": "DP best for small jobs at every load",
        "paper": "Fig. 2: DP lowest at every lambda",
        "model": _table_line(cells, rates, "small"),
        "agrees": not misses,
        "why": "" if not misses else f"DP is significantly worse than another policy at {', '.join(misses)}.",
    })  # fmt: skip
    low = [r for r in rates if float(r) <= LOW]
    high = [r for r in rates if float(r) >= HIGH]
    for kind in ("medium", "large"):
        miss_low = check(kind, low, True)
        miss_high = check(kind, high, False)
        why = ""
        if miss_high:
            at = high[-1]
            worst = max(MAIN, key=lambda p: _s(cells, p, at, kind)["mean"])
            rivals_at = {p: _s(cells, p, at, kind)["mean"] for p in rivals}
            why = (
                f"At {at} the worst is {worst}. Our DP regrows medium and large jobs whenever more than "
                f"M = {DpParameters().grow_threshold} processors are free, so it squeezes them less than the "
                "paper's did: "
                + _tuning_note(tuning, kind, rivals_at)
                + " The paper tuned M and T and does not give them."
            )
        if miss_low:
            why = (why + " " if why else "") + f"DP is not best at low load at {', '.join(miss_low)}."
        out.append({
            "claim": f"DP best for {kind} jobs at low load, worst at high load",
            "paper": f"Fig. {3 if kind == 'medium' else 4}: best at low lambda, above FPJP at high lambda",
            "model": _table_line(cells, [*low, *high], kind),
            "agrees": not miss_low and not miss_high, "why": why.strip(),
        })  # fmt: skip
    if all(p in transient for p in TRANSIENT):
        dp, fpjp = transient["DP"], transient["FPJP(128,128,256)"]
        smaller = dp["peak_excess"] < fpjp["peak_excess"]
        shorter = dp["duration"] < fpjp["duration"]
        out.append({
            "claim": "DP's transient after a burst of 10 small jobs smaller and shorter than FPJP's",
            "paper": "Fig. 7-8: smaller peak, dissipates much faster",
            "model": (
                f"peak excess of the mean U: DP {dp['peak_excess']:.2f}, FPJP {fpjp['peak_excess']:.2f}; "
                f"departures above half of it: DP {dp['duration']}, FPJP {fpjp['duration']}; excess area: DP "
                f"{dp['excess_area']:.0f}, FPJP {fpjp['excess_area']:.0f}"
            ),
            "agrees": smaller and shorter,
            "why": "" if smaller and shorter else (
                f"{'Not smaller' if not smaller else 'Not shorter'}: over {dp['seeds']} sample paths the "
                "mean "
                "curve is noisy (standard deviation of U before the burst: DP "
                f"{dp['sd_before_burst']:.2f}, FPJP {fpjp['sd_before_burst']:.2f})."
            ),
        })  # fmt: skip
    return out


def _table_line(cells: dict[str, dict[str, Json]], rates: Sequence[str], kind: str) -> str:
    parts = []
    for r in rates:
        values = ", ".join(f"{_abbrev(p)} {_s(cells, p, r, kind)['mean']:,.0f}" for p in MAIN)
        parts.append(f"{r}: {values}")
    return "; ".join(parts) + " s"


def _abbrev(policy: str) -> str:
    return {"FPJP(128,128,256)": "FPJP1", "FPJP(128,192,192)": "FPJP2"}.get(policy, policy)


def _tuning_note(tuning: Sequence[Json], kind: str, rivals: dict[str, float]) -> str:
    """What DP's tuning grid says about ``kind`` jobs, against the other policies' means ``rivals`` at the
    tuning rate."""
    if not tuning:
        return ""
    best = min(tuning, key=lambda row: row["all"])
    lazy = max(tuning, key=lambda row: (row["M"], row["all"]))
    worst = all(lazy[kind] > v for v in rivals.values())
    return (
        f"in the tuning grid the best overall (M = {best['M']}, T = {best['T']:g} s) gives {kind} jobs "
        f"{best[kind]:,.0f} s and grows {best['grows']} / shrinks {best['shrinks']} times; M = {lazy['M']} "
        f"(T = {lazy['T']:g} s) gives them {lazy[kind]:,.0f} s, shrinks more often than it grows ("
        f"{lazy['shrinks']} / {lazy['grows']}), as the paper observed, "
        + (
            "is then the worst of the four for them"
            if worst
            else "is still not the worst of the four for them"
        )
        + f", and is {lazy['all'] / best['all'] - 1:.0%} worse overall."
    )


def others(cells: dict[str, dict[str, Json]], fps: dict[str, str], tuning: Sequence[Json]) -> list[Json]:
    """The paper's other statements, as they come out here (not issue 17's claims)."""
    rates = sorted(fps, key=float)
    counts = [int(fps[r].split("(")[1].split("x")[0]) for r in rates]
    rising = all(a <= b for a, b in itertools.pairwise(counts))
    small_u = [_s(cells, "FPJP(128,128,256)", r, "small", "U")["mean"] for r in rates]
    large_u = [_s(cells, "FPJP(128,128,256)", r, "large", "U")["mean"] for r in rates]
    dp = [cells["DP"][r] for r in rates]
    grows, shrinks = sum(c["grows"] for c in dp), sum(c["shrinks"] for c in dp)
    return [
        {
            "statement": "FP's best partition count grows with lambda (the paper's: 1, then 2, then 4)",
            "model": ", ".join(f"{r}: {c}" for r, c in zip(rates, counts, strict=True))
            + ("" if counts[0] == 1 else " (from 4, not 1: the AP claim above says why)"),
            "agrees": rising,
        },
        {
            "statement": "Under FPJP(128,128,256) small jobs' U climbs steeply (to about 22), large jobs' "
            "stays flat",
            "model": f"small {small_u[0]:.2f} -> {small_u[-1]:.2f}; "
            f"large {large_u[0]:.2f} -> {large_u[-1]:.2f}",
            "agrees": small_u[-1] > 5 * small_u[0] and large_u[-1] < 1.5 * large_u[0],
        },
        {
            "statement": "DP shrinks partitions somewhat more often than it grows them",
            "model": f"{shrinks} shrinks, {grows} grows over all runs",
            "agrees": shrinks > grows,
        },
    ]


def build(setup: Setup, runs: Json, command: str, workers: int, wall: float) -> Json:
    from storm.tools.sim.report import storm_version

    cells = steady_cells(runs["steady"])
    rates = sorted(cells["AP"], key=float)
    fps = best_fp(cells, [float(r) for r in rates])
    tuning = tuning_cells(runs["tuning"])
    transient = transient_summary(runs["transient"])
    dp = setup.dp
    return {
        "format": "storm-sim-reproduce-naik/1",
        "command": command,
        "storm_version": storm_version(),
        "workers": workers,
        "setup": {
            "seeds": setup.seeds,
            "departures": setup.departures,
            "warmup": setup.warmup,
            "transient_rate": setup.transient_rate,
            "transient_seeds": setup.transient_seeds,
            "burst": setup.burst,
            "dp": {
                "M": dp.grow_threshold,
                "T": dp.quiet_s,
                "iterations": dp.iterations,
                "data_bytes": dp.data_bytes,
            },
            "tuning_rate": setup.tuning_rate,
        },
        "assumptions": [
            *assumptions(),
            f"DP: M = {dp.grow_threshold} processors, T = {dp.quiet_s:g} s (the best overall mean response "
            "at lambda 0.007 on the grid M in 32-256, T in 300-3600 s; the report's tuning table shows "
            f"lambda {setup.tuning_rate:g}); every job has {dp.iterations} iterations of equal work; data "
            "sets of "
            + ", ".join(f"{k} {v / 1e9:g} GB" for k, v in dp.data_bytes.items())
            + " (small jobs are never reconfigured); each phase moves the data set through Min_sys "
            "processors at 100 MB/s each, plus 5 us per processor involved.",
            "AP's 'more than Min_sys idle processors' is read as 'at least': otherwise 32 idle processors "
            "would wait for a 33rd before a small job (Req 32) could start.",
            "FPJP: each class's share cut into partitions of the class's Req (32 or 128) and one of what is "
            "left (192 = 128 + 64); a job runs on its whole partition. The paper used 'the best "
            "subdivision'.",
            f"Steady state: {setup.seeds} independent runs of {setup.departures:,} departures per policy and "
            f"rate, the first {setup.warmup:,} dropped; 95% intervals from the runs' means (Student's t), "
            "where the paper used the regenerative method to 5%.",
            f"Transient: lambda {setup.transient_rate:g}; t is the first departure after which the running "
            "mean "
            "of U has stayed within 10% of the steady-state mean U (from the runs above) for 100 departures; "
            f"{setup.burst} small jobs arrive at departure t + 100; {setup.transient_seeds} sample paths.",
        ],
        "cells": cells,
        "best_fp": fps,
        "tuning": tuning,
        "transient": transient,
        "claims": claims(cells, transient, tuning),
        "others": others(cells, fps, tuning),
        "transient_runs": runs["transient"],
        "wall": {"seconds": wall},
    }


def _ms(c: Json) -> str:
    return f"{c['mean']:,.0f} ± {c['ci95']:,.0f}"


def markdown(data: Json) -> str:
    cells = data["cells"]
    rates = sorted(cells["AP"], key=float)
    lines = [
        "## storm sim reproduce naik",
        "",
        "Naik, Setia and Squillante (SC'93) on 512 processors in units of 4, Min_sys = 32: AP, "
        "FPJP(128,128,256), "
        "FPJP(128,192,192) and DP against the arrival rate, FP with 1 to 16 partitions, and the transient "
        "after a burst. AP's sizes are storm-mm's own functions (mm/moldable.py); DP reconfigures running "
        "jobs, which needs the application's cooperation: simulator only.",
        "",
        f"Command: `{data['command']}`. storm {data['storm_version']}; {data['wall']['seconds']:,.0f} s on "
        "this "
        f"machine with {data['workers']} worker(s). Seeds: run k of a policy and rate uses job stream k; "
        "the transient's sample path k uses stream 1000 + k.",
        "",
        "### Assumptions (where the paper is silent or garbled)",
        "",
        *[f"- {a}" for a in data["assumptions"]],
        "",
    ]
    figures = {"all": "all jobs (Fig. 1)", "small": "small jobs (Fig. 2)", "medium": "medium jobs (Fig. 3)",
               "large": "large jobs (Fig. 4)"}  # fmt: skip
    for kind, title in figures.items():
        lines += [
            f"### Mean response S, {title} (s, ± the 95% half-width)",
            "",
            "| lambda | " + " | ".join(MAIN) + " | best FP |",
            "|---:|" + "---:|" * (len(MAIN) + 1),
        ]
        for r in rates:
            best = data["best_fp"][r]
            lines.append(
                f"| {r} | "
                + " | ".join(_ms(cells[p][r][kind]["S"]) for p in MAIN)
                + f" | {_ms(cells[best][r][kind]['S'])} {best} |"
            )
        lines.append("")
    lines += [
        "### Mean U = S / time on Req, per class (Fig. 5: DP; Fig. 6: FPJP(128,128,256))",
        "",
        "| lambda | " + " | ".join(f"{_abbrev(p)} {k}" for p in MAIN for k in CLASSES) + " |",
        "|---:|" + "---:|" * (len(MAIN) * len(CLASSES)),
    ]
    for r in rates:
        lines.append(
            f"| {r} | "
            + " | ".join(f"{cells[p][r][k]['U']['mean']:.2f}" for p in MAIN for k in CLASSES)
            + " |"
        )
    lines += [
        "",
        "FPJP1 = FPJP(128,128,256), FPJP2 = FPJP(128,192,192).",
        "",
        "### FP: overall S per partition count (s)",
        "",
    ]
    lines += ["| lambda | " + " | ".join(FP) + " | best |", "|---:|" + "---:|" * (len(FP) + 1)]
    for r in rates:
        lines.append(
            f"| {r} | "
            + " | ".join(f"{cells[p][r]['all']['S']['mean']:,.0f}" for p in FP)
            + f" | {data['best_fp'][r]} |"
        )
    lines += [
        "",
        f"### DP's tuning at lambda {data['setup']['tuning_rate']:g} (mean S, s; reconfigurations over the "
        "runs)",
        "",
        "| M (processors) | T (s) | all | small | medium | large | grows | shrinks |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["tuning"]:
        lines.append(
            f"| {row['M']} | {row['T']:g} | {row['all']:,.0f} | {row['small']:,.0f} | {row['medium']:,.0f} | "
            f"{row['large']:,.0f} | {row['grows']} | {row['shrinks']} |"
        )
    lines += [
        "",
        "### Transient: U after a burst of small jobs at departure t + 100 (Fig. 7: DP, Fig. 8: "
        "FPJP(128,128,256))",
        "",
        "| policy | sample paths | t (median) | steady U (s < 100) | sd of U before the burst | highest "
        "sample after | "
        "peak excess (smoothed mean) | departures above half of it | excess area |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in data["transient"].items():
        ts = sorted(t["t"])
        lines.append(
            f"| {name} | {t['seeds']} | {ts[len(ts) // 2]:,} | {t['steady']:.2f} | "
            f"{t['sd_before_burst']:.2f} | "
            f"{t['peak_sample']:.1f} | {t['peak_excess']:.2f} | {t['duration']} | {t['excess_area']:.0f} |"
        )
    lines += [
        "",
        "The mean curve is the mean over the sample paths at each departure index, smoothed over 21 "
        "departures "
        "for the peak and the duration; the excess area sums the unsmoothed mean above the steady level "
        "after the "
        "burst.",
        "",
        "### Against the paper (issue 17's claims)",
        "",
        "| claim | paper | model | agrees | why it differs |",
        "|---|---|---|---|---|",
    ]
    for c in data["claims"]:
        verdict = {True: "yes", False: "**no**", None: "-"}[c["agrees"]]
        lines.append(f"| {c['claim']} | {c['paper']} | {c['model']} | {verdict} | {c['why']} |")
    lines += ["", "### The paper's other statements", "", "| statement | model | agrees |", "|---|---|---|"]
    for o in data["others"]:
        lines.append(f"| {o['statement']} | {o['model']} | {'yes' if o['agrees'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def plot(data: Json, path: str) -> None:
    """S per class against lambda, U per class for DP and FPJP, and the two transients (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = data["cells"]
    rates = sorted(cells["AP"], key=float)
    xs = [float(r) for r in rates]
    fig, axes = plt.subplots(3, 3, figsize=(17, 13))
    for axis, kind in zip([*axes[0].tolist(), axes[1][0]], ("all", "small", "medium", "large"), strict=True):
        for p in MAIN:
            axis.plot(xs, [cells[p][r][kind]["S"]["mean"] for r in rates], marker="o", label=p)
        axis.plot(xs, [cells[data["best_fp"][r]][r][kind]["S"]["mean"] for r in rates], "k:", label="best FP")
        axis.set_title(f"mean response, {kind} jobs", fontsize=10)
        axis.set_xlabel("arrival rate (jobs/s)")
        axis.set_ylabel("S (s)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis, p in ((axes[1][1], "DP"), (axes[1][2], "FPJP(128,128,256)")):
        for k in CLASSES:
            axis.plot(xs, [cells[p][r][k]["U"]["mean"] for r in rates], marker="o", label=k)
        axis.set_title(f"mean U per class, {p}", fontsize=10)
        axis.set_xlabel("arrival rate (jobs/s)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis, p in ((axes[2][0], "DP"), (axes[2][1], "FPJP(128,128,256)")):
        runs = [r for r in data["transient_runs"] if r["policy"] == p]
        for run in runs:
            axis.plot(range(len(run["u"])), run["u"], ".", markersize=2, color="grey", alpha=0.5)
        mean = data["transient"].get(p, {}).get("mean_curve", [])
        axis.plot(range(len(mean)), mean, "k--", label="mean over sample paths")
        axis.axvline(100, color="red", linewidth=1)
        axis.set_yscale("log")
        axis.set_title(f"U after a burst at departure t + 100, {p}", fontsize=10)
        axis.set_xlabel("departure index s")
        axis.legend(fontsize=7)
    for p in FP:
        axes[2][2].plot(xs, [cells[p][r]["all"]["S"]["mean"] for r in rates], marker="o", label=p)
    axes[2][2].set_yscale("log")
    axes[2][2].set_title("FP: overall mean response", fontsize=10)
    axes[2][2].set_xlabel("arrival rate (jobs/s)")
    axes[2][2].grid(alpha=0.3)
    axes[2][2].legend(fontsize=7)
    fig.suptitle("Naik, Setia and Squillante (SC'93): storm's simulator")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
