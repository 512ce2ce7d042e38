"""``storm sim dynamic --seeds 0,1,2``: one sweep per drawn workload, and what holds across them.

A Lublin-Feitelson workload of 1,000 jobs is one draw of a heavy-tailed model: a few long jobs carry most of
the work, and whether a queue forms at some instant of a run decides much of a point's mean bounded
slowdown. Two policies a few per cent apart on one draw can trade places on the next. Each seed's sweep is
a whole ``storm sim dynamic`` of its own (its points and report in ``<dir>/seed-<n>/``); this module sets
their points side by side per policy and offered load, and checks issue 15's high-load claim on the mean
over the seeds as well as seed by seed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from storm.tools.sim.cosched.dynamic_report import HIGH_LOAD, LABELS

Json = dict[str, Any]
METRICS = ("mean_bsld", "mean_response")


def across(by_seed: Mapping[int, Sequence[Json]]) -> Json:
    """Per policy and target load, each seed's mean bounded slowdown and mean response, and their means
    over the seeds that ran it. O(points)."""
    table: Json = {}
    for seed, points in sorted(by_seed.items()):
        for point in points:
            at = table.setdefault(point["policy"], {}).setdefault(f"{point['target_load']:g}", {})
            for metric in METRICS:
                at.setdefault(metric, {})[str(seed)] = point["summary"][metric]
    for loads in table.values():
        for at in loads.values():
            for metric in METRICS:
                at[f"{metric}_mean"] = statistics.fmean(at[metric].values())
    return table


def claims(table: Json, policy: str = "fcs", rivals: Sequence[str] = ("gang", "sb")) -> list[Json]:
    """Issue 15's "FCS at or below gang and SB in mean bounded slowdown at high load", at each swept load
    from :data:`HIGH_LOAD` up: on the mean over the seeds, and in how many (seed, load) cells."""
    if policy not in table or not all(r in table for r in rivals):
        return []
    out = []
    for rival in rivals:
        loads = sorted((x for x in table[policy] if float(x) >= HIGH_LOAD and x in table[rival]), key=float)
        above = [x for x in loads if table[policy][x]["mean_bsld_mean"] > table[rival][x]["mean_bsld_mean"]]
        cells = [
            (seed, x)
            for x in loads
            for seed, value in table[policy][x]["mean_bsld"].items()
            if seed in table[rival][x]["mean_bsld"]
        ]
        below = sum(table[policy][x]["mean_bsld"][s] <= table[rival][x]["mean_bsld"][s] for s, x in cells)
        out.append(
            {
                "claim": f"{LABELS.get(policy, policy)} at or below {LABELS.get(rival, rival)} in mean "
                f"bounded slowdown at high load (loads >= {HIGH_LOAD:g}), mean over the seeds",
                "loads": loads,
                "above_at": above,
                "agrees": bool(loads) and not above,
                "cells": f"{below} of {len(cells)} (seed, load) cells at or below",
            }
        )
    return out


def markdown(table: Json, checked: Sequence[Json], seeds: Sequence[int]) -> str:
    """The summary: mean bounded slowdown and mean response per policy and load, seed by seed and on
    average, then the claims."""
    lines = [
        f"## storm sim dynamic over seeds {', '.join(str(s) for s in seeds)}",
        "",
        "Each seed draws another workload from the same model (the jobs, their granularities and patterns); "
        "each seed's whole report is in its seed-N/ directory. One draw is one sample of a heavy-tailed "
        "workload: compare policies on the mean over the seeds.",
        "",
    ]
    for metric, title in (("mean_bsld", "Mean bounded slowdown"), ("mean_response", "Mean response (s)")):
        lines += [
            f"### {title}",
            "",
            "| policy | offered load | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
            "|---|---:|" + "---:|" * (len(seeds) + 1),
        ]
        for policy, loads in table.items():
            for load in sorted(loads, key=float):
                at = loads[load]
                values = [at[metric].get(str(s)) for s in seeds]
                cells = " | ".join("-" if v is None else f"{v:.2f}" for v in values)
                lines.append(
                    f"| {LABELS.get(policy, policy)} | {load} | {cells} | {at[f'{metric}_mean']:.2f} |"
                )
        lines.append("")
    if checked:
        lines += ["### Issue 15's claim, across the seeds", "", "| claim | model | agrees |", "|---|---|---|"]
        for c in checked:
            where = "at every load" if not c["above_at"] else f"above at load {', '.join(c['above_at'])}"
            lines.append(f"| {c['claim']} | {where}; {c['cells']} | {'yes' if c['agrees'] else '**no**'} |")
        lines.append("")
    return "\n".join(lines)
