"""``storm sim dynamic``'s figures: per point, per policy, the saturation points, Fig. 8, and the paper.

Per point (a policy at an offered load), from each job's row (name, size, isolated runtime, submit,
start, end; seconds) and each PE's counters (computing, spinning, switching, idle; ns):

- response = end - submit; wait = start - submit; bounded slowdown = max(1, response / max(isolated
  runtime, 10 s)) (metrics.py's threshold). The isolated runtime, not end - start, is the divisor: under
  time sharing end - start is stretched by the other jobs, which is part of what slowdown measures.
- utilisation = sum(isolated runtime x size) / (PEs x makespan), makespan = last end - first submit.
- accepted load = the isolated work done by the last arrival / (PEs x last arrival time), a job running
  then counted pro rata of its time between start and end: the rate at which the machine took the work
  in while it was being offered. Unlike utilisation it does not fall with the tail of work left after
  the last arrival, which for a few long jobs can be most of the makespan.
- the CPU breakdown: each PE counter's share of all PEs' time (they add up to it).

Saturation (ours, after the paper's "a relatively constant accepted load"): a policy saturates at the
lowest swept load from which its accepted load stays flat: at no higher swept load has it grown by
:data:`TRACKING` (half) of the offered load's growth since. Below saturation the machine takes the work in as
it comes and the accepted load follows the offered load (less the work in flight at the last arrival); once
the machine is full, it stays level. "From which it stays flat", not "where it first grew slowly": with 1,000
jobs, a few of which carry most of the work, one step between two swept loads can be flat by chance (whether
a long job ends just before or after the last arrival) while the next steps climb again. The highest load
swept has nothing after it to show it flat, so a policy saturates within the sweep only below it. The
plateau is the mean accepted load from the saturation point on: the machine's capacity under that policy.

The paper inferred its accepted load "from the accumulation of jobs in the queue"; the mean queue, the
number of jobs waiting for a place (in the matrix, or on PEs under FCFS+EASY) averaged over the arrivals'
span, is reported beside it. The first mean bounded slowdown above sweep.py's 100 is a third opinion.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from storm.tools.sim.metrics import BSLD_THRESHOLD, bounded_slowdown
from storm.tools.sim.sweep import SATURATION_BSLD

Json = dict[str, Any]
Row = Sequence[Any]  # name, size, isolated s, submit, start, end
TRACKING = 0.5  # the accepted load must grow by at least this share of the offered load's growth
FIG8_LOAD = 0.74
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
CPU = ("computing", "spinning", "switching", "idle")
LABELS = {"batch": "FCFS+EASY", "gang": "gang", "sb": "SB", "fcs": "FCS"}
PAPER_SATURATION = {"batch": 0.78, "fcs": 0.88}
BANDS_MS = (10, 100)  # granularity bands' bounds: under 10 ms, 10 to 100 ms, 100 ms and over
HIGH_LOAD = 0.8  # issue 15's "at high load": the swept loads from here up


def summarize(rows: Sequence[Row], pes: Sequence[Sequence[int]], pe_count: int) -> Json:
    """A point's figures (module docstring). O(jobs log jobs + PEs)."""
    responses = [end - submit for _, _, _, submit, _, end in rows]
    waits = [start - submit for _, _, _, submit, start, _ in rows]
    slowdowns = [bounded_slowdown(end - submit, iso) for _, _, iso, submit, _, end in rows]
    work = sum(size * iso for _, size, iso, _, _, _ in rows)
    first = min(r[3] for r in rows)
    makespan = max(r[5] for r in rows) - first
    window = max(r[3] for r in rows) - first
    last = first + window
    taken = sum(size * iso * _share(start, end, last) for _, size, iso, _, start, end in rows)
    totals = [sum(pe[i] for pe in pes) for i in range(4)]
    elapsed = sum(totals)
    return {
        "jobs": len(rows),
        "mean_response": statistics.fmean(responses),
        "median_response": statistics.median(responses),
        "mean_bsld": statistics.fmean(slowdowns),
        "median_bsld": statistics.median(slowdowns),
        "mean_wait": statistics.fmean(waits),
        "makespan": makespan,
        "utilisation": work / (pe_count * makespan) if makespan > 0 else math.inf,
        "accepted_load": taken / (pe_count * window) if window > 0 else math.inf,
        "cpu": {name: (t / elapsed if elapsed else 0.0) for name, t in zip(CPU, totals, strict=True)},
    }


def _share(start: float, end: float, at: float) -> float:
    """How much of a job that ran from ``start`` to ``end`` was done at ``at``, pro rata of time."""
    if at >= end:
        return 1.0
    if at <= start:
        return 0.0
    return (at - start) / (end - start)


def curves(points: Sequence[Json]) -> dict[str, list[Json]]:
    """Per policy, its points' summaries by offered load, each with the load and the run's speed."""
    out: dict[str, list[Json]] = {}
    for point in points:
        line = out.setdefault(point["policy"], [])
        line.append(
            {
                "target_load": point["target_load"],
                "offered_load": point["offered_load"],
                **point["summary"],
                "mean_queue": mean_queue(point["jobs"]),
                "wall_seconds": point["run"]["wall_seconds"],
                "jobs_per_wall_second": point["run"]["jobs_per_wall_second"],
            }
        )
    for line in out.values():
        line.sort(key=lambda pt: pt["offered_load"])
    return out


def saturation(line: Sequence[Json]) -> float | None:
    """The lowest offered load from which the accepted load stays flat (module docstring); None if no
    swept load but the highest is followed only by flat ones. O(loads^2)."""
    for i, base in enumerate(line[:-1]):
        if all(
            after["accepted_load"] - base["accepted_load"]
            < TRACKING * (after["offered_load"] - base["offered_load"])
            for after in line[i + 1 :]
        ):
            return float(base["offered_load"])
    return None


def plateau(line: Sequence[Json]) -> float | None:
    """The mean accepted load from the saturation point on (None if the policy does not saturate)."""
    at = saturation(line)
    if at is None:
        return None
    return statistics.fmean(pt["accepted_load"] for pt in line if pt["offered_load"] >= at)


def mean_queue(rows: Sequence[Row]) -> float:
    """The number of jobs submitted and not yet started, averaged over the time from the first to the
    last submission (0 if they all came at once). O(jobs log jobs)."""
    first = min(r[3] for r in rows)
    last = max(r[3] for r in rows)
    if last <= first:
        return 0.0
    # At an instant, starts count before submissions: a job placed as it arrives never waited.
    changes = sorted([(r[3], 1) for r in rows] + [(r[4], -1) for r in rows], key=lambda c: (c[0], c[1]))
    waiting, at, area = 0, first, 0.0
    for instant, step in changes:
        when = min(instant, last)
        area += waiting * (when - at)
        at = when
        if when >= last:
            break
        waiting += step
    return float(area / (last - first))


def bsld_saturation(line: Sequence[Json]) -> float | None:
    """The lowest offered load whose mean bounded slowdown exceeds sweep.py's threshold (None: never)."""
    return next((float(pt["offered_load"]) for pt in line if pt["mean_bsld"] > SATURATION_BSLD), None)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def fig8(points: Sequence[Json], load: float = FIG8_LOAD) -> Json | None:
    """At the swept load nearest ``load``: per policy, the response-time quantiles of the shorter and the
    longer half of the jobs by isolated runtime (the paper's 500 shortest and 500 longest of 1,000)."""
    loads = sorted({p["target_load"] for p in points})
    if not loads:
        return None
    nearest = min(loads, key=lambda x: (abs(x - load), x))
    out: Json = {"load": nearest, "halves": {"shortest": {}, "longest": {}}, "responses": {}}
    for point in points:
        if point["target_load"] != nearest:
            continue
        rows = sorted(point["jobs"], key=lambda r: (r[2], r[0]))
        half = len(rows) // 2
        halves = {"shortest": rows[:half], "longest": rows[len(rows) - half :]}
        out["size"] = half
        for name, part in halves.items():
            responses = [r[5] - r[3] for r in part]
            out["halves"][name][point["policy"]] = {f"{q:g}": quantile(responses, q) for q in QUANTILES}
            out["responses"].setdefault(name, {})[point["policy"]] = sorted(responses)
    return out


def band_names() -> list[str]:
    bounds = [f"{b:g}" for b in BANDS_MS]
    return (
        [f"< {bounds[0]} ms"]
        + [f"{a}-{b} ms" for a, b in itertools.pairwise(bounds)]
        + [f">= {bounds[-1]} ms"]
    )


def by_granularity(points: Sequence[Json], granularity: Mapping[str, int], loads: Sequence[float]) -> Json:
    """At each of ``loads`` (targets), per policy: the mean bounded slowdown of the jobs in each
    granularity band (:data:`BANDS_MS`; a job's granularity is its even ranks' computation per
    iteration, ns), the bands' job counts, and the run's class changes (FCS's). O(points x jobs)."""

    def band(name: str) -> int:
        return sum(granularity[name] >= bound * 1_000_000 for bound in BANDS_MS)

    out: Json = {"bands": band_names(), "loads": {}}
    for point in points:
        if point["target_load"] not in loads:
            continue
        slowdowns: list[list[float]] = [[] for _ in out["bands"]]
        for name, _, iso, submit, _, end in point["jobs"]:
            slowdowns[band(name)].append(bounded_slowdown(end - submit, iso))
        at = out["loads"].setdefault(f"{point['target_load']:g}", {"counts": [len(b) for b in slowdowns]})
        at[point["policy"]] = {
            "mean_bsld": [statistics.fmean(b) if b else None for b in slowdowns],
            "class_changes": point["run"].get("class_changes", {}),
        }
    return out


def _at_every_load(drawn: dict[str, list[Json]], policy: str, metric: str, best: bool) -> list[float]:
    """The offered loads at which ``policy`` is not the lowest (``best``) or the highest of all policies
    in ``metric``; loads are matched by their target."""
    misses = []
    for point in drawn.get(policy, []):
        others = [
            pt[metric]
            for name, line in drawn.items()
            if name != policy
            for pt in line
            if pt["target_load"] == point["target_load"]
        ]
        if not others:
            continue
        if (best and point[metric] > min(others)) or (not best and point[metric] < max(others)):
            misses.append(point["target_load"])
    return misses


def _above_others(
    drawn: dict[str, list[Json]], policy: str, others: Sequence[str], metric: str, low: float
) -> list[float]:
    """The swept loads from ``low`` up at which ``policy``'s ``metric`` is above any of ``others``'."""
    misses = []
    for point in drawn[policy]:
        if point["target_load"] < low:
            continue
        rivals = [pt[metric] for o in others for pt in drawn[o] if pt["target_load"] == point["target_load"]]
        if rivals and point[metric] > min(rivals):
            misses.append(point["target_load"])
    return misses


def claims(drawn: dict[str, list[Json]], figure: Json | None) -> list[Json]:
    """The paper's section 5.2 statements, each checked against the model: agrees, and where not."""
    out: list[Json] = []

    def add(claim: str, paper: str, misses: list[float] | None, model: str = "") -> None:
        if misses is None:
            out.append({"claim": claim, "paper": paper, "model": model or "not swept", "agrees": None})
            return
        where = ", ".join(f"{x:g}" for x in misses)
        text = model or ("at every load" if not misses else f"not at load {where}")
        out.append({"claim": claim, "paper": paper, "model": text, "agrees": not misses})

    have = all(p in drawn for p in ("batch", "fcs"))
    sat = {policy: saturation(line) for policy, line in drawn.items()}
    if have:
        b, f = sat["batch"], sat["fcs"]
        text = f"FCFS+EASY {_load(b)}, FCS {_load(f)}"
        later = _later(f, b)
        misses = None if later is None else [] if later else [0.0]  # None: neither saturates in the sweep
        add("FCS saturates later than FCFS+EASY", "78% vs 88%", misses, text)
    for metric, name in (("mean_response", "mean response"), ("mean_bsld", "mean bounded slowdown")):
        if "fcs" in drawn:
            add(
                f"FCS has the lowest {name}",
                "at every load (Fig. 7)",
                _at_every_load(drawn, "fcs", metric, True),
            )
        if "batch" in drawn:
            add(
                f"FCFS+EASY has the highest {name}", "at every load (Fig. 7)",
                _at_every_load(drawn, "batch", metric, False),
            )  # fmt: skip
    if all(p in drawn for p in ("fcs", "gang", "sb")):
        add(
            "FCS at or below gang and SB in mean bounded slowdown at high load",
            f"issue 15 (loads >= {HIGH_LOAD:g})",
            _above_others(drawn, "fcs", ("gang", "sb"), "mean_bsld", HIGH_LOAD),
        )
    if "batch" in drawn:
        add(
            "FCFS+EASY has the lowest median bounded slowdown", "favours long jobs (Fig. 7d)",
            _at_every_load(drawn, "batch", "median_bsld", True),
        )  # fmt: skip
    if figure is not None and figure["halves"]["shortest"]:
        for half, policy, what in (("shortest", "fcs", "FCS"), ("longest", "batch", "FCFS+EASY")):
            medians = {p: q["0.5"] for p, q in figure["halves"][half].items()}
            if policy in medians and len(medians) > 1:
                best = min(medians, key=lambda p: medians[p])
                add(
                    f"{what} gives the {figure['size']} {half} jobs the lowest median response",
                    f"Fig. 8 at 74% load ({half})",
                    [] if medians[policy] <= medians[best] else [figure["load"]],
                    f"lowest: {LABELS.get(best, best)} ({medians[best]:.1f} s); "
                    f"{what} {medians[policy]:.1f} s",
                )  # fmt: skip
    return out


def _load(x: float | None) -> str:
    return "above the loads swept" if x is None else f"{x:.3f}"


def _later(a: float | None, b: float | None) -> bool | None:
    """Whether saturation ``a`` comes later than ``b``; None if neither is within the sweep (a policy that
    never saturates in it saturates later than one that does)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        return a is None
    return a > b


def report(points: Sequence[Json], granularity: Mapping[str, int] | None = None) -> Json:
    """Every figure of the report, as JSON; with the jobs' granularities (ns, by name), the mean bounded
    slowdown per granularity band at Fig. 8's load and at the highest load every policy was swept at."""
    drawn = curves(points)
    figure = fig8(points)
    saturations = {
        policy: {
            "accepted_load_rule": saturation(line),
            "plateau": plateau(line),
            "bsld_rule": bsld_saturation(line),
        }
        for policy, line in drawn.items()
    }
    gap = None
    if "batch" in saturations and "fcs" in saturations:
        b, f = saturations["batch"]["accepted_load_rule"], saturations["fcs"]["accepted_load_rule"]
        gap = None if b is None or f is None else round(100 * (f - b), 1)
    if figure is not None:
        figure = {k: v for k, v in figure.items() if k != "responses"}
    bands = None
    if granularity is not None and drawn:
        common = set.intersection(*({pt["target_load"] for pt in line} for line in drawn.values()))
        picked = (
            sorted({figure["load"]} & common | {max(common)}) if figure and common else sorted(common)[-1:]
        )
        bands = by_granularity(points, granularity, picked)
    return {
        "curves": drawn,
        "saturation": saturations,
        "gap_fcs_minus_batch_points": gap,
        "paper": {"saturation": PAPER_SATURATION, "gap_points": 10},
        "fig8": figure,
        "granularity": bands,
        "claims": claims(drawn, fig8(points)),
    }


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def markdown(data: Json, setup_text: str) -> str:
    """The report: the setup, the table per policy and load, saturation, Fig. 8, the paper's claims."""
    lines = [setup_text, "", "### Per policy and offered load", ""]
    lines += [
        "| policy | offered load | mean response (s) | median response (s) | mean BSLD | median BSLD "
        "| utilisation | accepted load | mean queue | computing | spinning | switching | idle | makespan (s) "
        "| wall (s) | jobs/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, line in data["curves"].items():
        for pt in line:
            cpu = pt["cpu"]
            lines.append(
                f"| {LABELS.get(policy, policy)} | {pt['offered_load']:.3f} | {_f(pt['mean_response'])} | "
                f"{_f(pt['median_response'], 2)} | {_f(pt['mean_bsld'], 2)} | {_f(pt['median_bsld'], 2)} | "
                f"{pt['utilisation']:.3f} | {pt['accepted_load']:.3f} | {pt['mean_queue']:.2f} | "
                + " | ".join(f"{cpu[name]:.3f}" for name in CPU)
                + f" | {_f(pt['makespan'], 0)} | {_f(pt['wall_seconds'])} | "
                + f"{_f(pt['jobs_per_wall_second'], 2)} |"
            )
    lines += [
        "",
        f"Bounded slowdown: max(1, response / max(isolated runtime, {BSLD_THRESHOLD:g} s)). Utilisation: "
        "sum(isolated runtime x size) / (PEs x makespan). Accepted load: the isolated work done by the last "
        "arrival (running jobs pro rata of their time) / (PEs x last arrival). Mean queue: jobs waiting "
        "for a place, averaged over the arrivals' span. CPU shares: the PEs' time computing, polling or "
        "spinning in calls, in context switches and wake-ups, and idle. Wall: this machine's "
        "seconds for the run; jobs/s: jobs simulated per wall second.",
        "",
        "### Saturation",
        "",
        "Rule (ours, after the paper's 'relatively constant accepted load'): the lowest swept offered load "
        f"from which the accepted load stays flat, growing by less than {TRACKING:g} x the offered load's "
        "growth to every higher load swept (so never the highest load swept). Plateau: the mean accepted "
        "load from there on, the machine's capacity under the policy. Beside them, the first load whose mean "
        f"BSLD exceeds {SATURATION_BSLD:g} (storm sim sweep's rule).",
        "",
        "| policy | saturates at (accepted-load rule) | plateau | mean BSLD > 100 from | paper |",
        "|---|---:|---:|---:|---:|",
    ]
    for policy, sat in data["saturation"].items():
        paper = PAPER_SATURATION.get(policy)
        lines.append(
            f"| {LABELS.get(policy, policy)} | {_load(sat['accepted_load_rule'])} | "
            f"{_f(sat['plateau'], 3)} | {_load(sat['bsld_rule'])} | "
            f"{'~' + format(paper, '.0%') if paper else '-'} |"
        )
    gap = data["gap_fcs_minus_batch_points"]
    lines += [
        "",
        f"FCS minus FCFS+EASY: {'-' if gap is None else f'{gap:+.1f}'} points "
        "(paper: about +10, 78% to 88%).",
        "",
    ]
    figure = data["fig8"]
    if figure is not None:
        lines += [
            f"### Fig. 8: response times at load {figure['load']:g}, the {figure['size']} shortest and the "
            f"{figure['size']} longest jobs by isolated runtime",
            "",
        ]
        for half, by_policy in figure["halves"].items():
            policies = list(by_policy)
            lines += [
                f"{half.capitalize()} jobs, response (s) at each quantile:",
                "",
                "| quantile | " + " | ".join(LABELS.get(p, p) for p in policies) + " |",
                "|---:|" + "---:|" * len(policies),
            ]
            for q in QUANTILES:
                lines.append(
                    f"| {q:g} | " + " | ".join(_f(by_policy[p][f"{q:g}"], 2) for p in policies) + " |"
                )
            lines.append("")
    lines += _granularity_lines(data.get("granularity"))
    lines += [
        "### Against the paper (section 5.2)",
        "",
        "| claim | paper | model | agrees |",
        "|---|---|---|---|",
    ]
    for c in data["claims"]:
        agrees = {True: "yes", False: "**no**", None: "-"}[c["agrees"]]
        lines.append(f"| {c['claim']} | {c['paper']} | {c['model']} | {agrees} |")
    return "\n".join(lines) + "\n"


def _granularity_lines(bands: Json | None) -> list[str]:
    if not bands or not bands["loads"]:
        return []
    lines = ["### Mean bounded slowdown by granularity (even ranks' computation per iteration)", ""]
    for load, at in bands["loads"].items():
        policies = [p for p in at if p != "counts"]
        lines += [
            f"At load {load}:",
            "",
            "| policy | "
            + " | ".join(f"{b} ({n} jobs)" for b, n in zip(bands["bands"], at["counts"], strict=True))
            + " |",
            "|---|" + "---:|" * len(bands["bands"]),
        ]
        for policy in policies:
            lines.append(
                f"| {LABELS.get(policy, policy)} | "
                + " | ".join(_f(x, 2) for x in at[policy]["mean_bsld"])
                + " |"
            )
        changes = at.get("fcs", {}).get("class_changes")
        if changes:
            lines += ["", "FCS's class changes: " + ", ".join(f"{k} {v}" for k, v in changes.items()) + "."]
        lines.append("")
    return lines


def plot(points: Sequence[Json], path: str, title: str) -> None:
    """Fig. 7's four curves and Fig. 8's two CDFs in one PNG (matplotlib, imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = curves(points)
    figure = fig8(points)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = (
        ("mean_response", "mean response (s)", axes[0][0]),
        ("mean_bsld", "mean bounded slowdown", axes[0][1]),
        ("median_response", "median response (s)", axes[1][0]),
        ("median_bsld", "median bounded slowdown", axes[1][1]),
    )
    colors: dict[str, str] = {}
    for metric, label, axis in panels:
        for policy, line in drawn.items():
            xs = [pt["offered_load"] for pt in line]
            (curve,) = axis.plot(
                xs, [pt[metric] for pt in line], marker="o", label=LABELS.get(policy, policy),
                color=colors.get(policy),
            )  # fmt: skip
            colors[policy] = curve.get_color()
            sat = saturation(line)
            if sat is not None:
                axis.axvline(sat, color=colors[policy], linestyle=":", linewidth=1)
        axis.set_xlabel("offered load")
        axis.set_ylabel(label)
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for half, axis in (("shortest", axes[0][2]), ("longest", axes[1][2])):
        if figure is None:
            axis.set_visible(False)
            continue
        for policy, responses in figure["responses"].get(half, {}).items():
            ys = [(i + 1) / len(responses) for i in range(len(responses))]
            axis.step(responses, ys, where="post", label=LABELS.get(policy, policy), color=colors.get(policy))
        axis.set_xscale("log")
        axis.set_xlabel("response time (s)")
        axis.set_ylabel("cumulative share")
        axis.set_title(f"{figure['size']} {half} jobs, load {figure['load']:g}", fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title + " (dotted: saturation)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
