"""Benchmark: the FCS paper's synthetic scenarios (section 3) under batch, gang, sb and fcs, on this host.

``storm bench scenarios [options]`` (``python -m storm.tools.bench_scenarios``). For each repeat, each policy
gets a fresh local cluster (``--nodes`` x ``--pes-per-node``, MPL 3, 100 ms slices; batch MPL 1) and runs
every scenario on it in turn: all of a scenario's jobs are submitted together, and each job's completion
time is its end minus the first submission (the MM's own time stamps). Repeats interleave the policies, so
that a slow spell of the host does not land on one policy only. Before anything else, the building block
runs alone under batch (median of the repeats): the unit that normalises our times and the paper's (60 s).

Each scenario gets a table: per policy, each job's completion, the turnaround (the last completion) and
the mean response, best and median of the repeats, the best turnaround over gang's, and the paper's figures
in building-block units beside ours. ``--json`` keeps every raw figure, ``--markdown`` writes the tables,
``--png`` draws each policy's turnaround and mean response over gang's beside the paper's
(tools/scenario_chart.py). Scenarios are defined in tools/scenarios.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from storm.mm import protocol as p
from storm.mm.protocol import POLICIES
from storm.tools import scenario_chart
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from storm.tools.scenarios import (
    PROFILE_PARTS,
    SCENARIOS,
    RunResult,
    Scenario,
    argv,
    best_and_median,
    build,
    paper_normalised,
    parse_policy,
    run_result,
)

Json = dict[str, Any]
JOB_TIMEOUT_FACTOR = 20.0  # a job is given this many building blocks of time before the run is abandoned


@contextlib.contextmanager
def running_cluster(
    directory: Path,
    nodes: int,
    policy: str,
    *,
    pes_per_node: int,
    mm: dict[str, object] | None = None,
    fcs: dict[str, object] | None = None,
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        dir=directory, nodes=nodes, pes_per_node=pes_per_node, policy=policy, mm_settings=mm or {},
        nm_settings={"kill_grace": 1.0, "profile": True}, fcs_settings=fcs or {},
    )  # fmt: skip
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def run_scenario(client: Client, scenario: Scenario, work: Path, unit: float) -> RunResult:
    """Submit every job of the scenario at once and wait for all of them; each must complete correctly."""
    ranks = client_ranks(client)
    ids = [
        client.submit(argv(plan), ranks, cwd=str(work), name=plan.name, output=str(work / "%j.out"))
        for plan in scenario.jobs
    ]
    infos = [client.wait(job_id, timeout=JOB_TIMEOUT_FACTOR * unit * len(ids) + 60) for job_id in ids]
    for info in infos:
        out = work / f"{info.id}.out"
        text = out.read_text() if out.exists() else ""
        if info.state != p.JobState.COMPLETED or info.end_time is None or "bsp: OK" not in text:
            raise RuntimeError(f"{scenario.name}: job {info.id} {info.state} {info.reason}: {text[-300:]}")
    profile = [e for i in infos for e in client.call(p.GetStats(job_id=i.id), p.StatsView).profile]
    return run_result([i.submit_time for i in infos], [i.end_time or 0.0 for i in infos], profile)


def client_ranks(client: Client) -> int:
    """Every job spans the whole cluster, one rank per PE (as in the paper, half the cluster for each)."""
    return sum(n.pes for n in client.nodes() if n.state == p.NodeState.UP)


def measure_unit(work: Path, nodes: int, pes: int, length: float, repeats: int) -> list[float]:
    """The building block alone under batch, start to end, in seconds."""
    scenario = build("alone", length, nodes, pes)
    times = []
    with (
        running_cluster(work / "unit", nodes, p.Policy.BATCH, pes_per_node=pes) as cluster,
        cluster.client() as c,
    ):
        for _ in range(repeats):
            times.append(run_scenario(c, scenario, work, length).turnaround)
    return times


def run(
    scenarios: Sequence[str],
    policies: Sequence[str],
    *,
    repeats: int,
    length: float,
    nodes: int,
    pes: int,
    slice_ms: float,
) -> Json:
    started = time.time()
    load = os.getloadavg()[0]
    runs: dict[str, dict[str, list[RunResult]]] = {s: {pol: [] for pol in policies} for s in scenarios}
    plans = [build(name, length, nodes, pes) for name in scenarios]
    with tempfile.TemporaryDirectory(prefix="storm-scenarios-") as tmp:
        work = Path(tmp)
        unit_times = measure_unit(work, nodes, pes, length, repeats)
        unit = statistics.median(unit_times)
        for rep in range(repeats):
            for label in policies if rep % 2 == 0 else list(reversed(policies)):
                policy, settings = parse_policy(label)
                mm: dict[str, object] = {
                    "mpl": 1 if policy == p.Policy.BATCH else 3,
                    "slice": slice_ms / 1000,
                }
                fcs = {k: setting_value(v) for k, v in settings.items()}
                directory = work / f"{policy}-{len(settings)}-{rep}"
                with (
                    running_cluster(directory, nodes, policy, pes_per_node=pes, mm=mm, fcs=fcs) as cluster,
                    cluster.client() as client,
                ):
                    for scenario in plans:
                        result = run_scenario(client, scenario, directory, unit)
                        runs[scenario.name][label].append(result)
                        print(
                            f"  run {rep + 1}/{repeats} {label:5} {scenario.name:13} turnaround "
                            f"{result.turnaround:7.2f} s, mean response {result.mean_response:7.2f} s",
                            flush=True,
                        )
    return {
        "parameters": {
            "scenarios": list(scenarios), "policies": list(policies), "repeats": repeats, "length": length,
            "nodes": nodes, "pes_per_node": pes, "slice_ms": slice_ms, "mpl": 3,
        },
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "load_average_before": load},
        "started": started,
        "seconds": time.time() - started,
        "unit_seconds": unit_times,
        "unit": unit,
        "jobs": {s: [asdict(j) for j in build(s, length, nodes, pes).jobs] for s in scenarios},
        "runs": {s: {p: [asdict(r) for r in rs] for p, rs in by.items()} for s, by in runs.items()},
        "summary": summarise(runs, unit),
    }  # fmt: skip


def setting_value(text: str) -> object:
    """A variant's setting as storm.toml would hold it: a number where it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def summarise(runs: dict[str, dict[str, list[RunResult]]], unit: float) -> Json:
    summary: Json = {}
    for name, by_policy in runs.items():
        rows: Json = {}
        for policy, results in by_policy.items():
            if not results:
                continue
            best, median = best_and_median(results)
            paper = paper_normalised(name, parse_policy(policy)[0])
            rows[policy] = {
                "best": {**asdict(best), "turnaround": best.turnaround, "mean_response": best.mean_response},
                "median": {
                    **asdict(median), "turnaround": median.turnaround, "mean_response": median.mean_response,
                },
                "best_in_units": {
                    "completion": [c / unit for c in best.completion],
                    "turnaround": best.turnaround / unit,
                    "mean_response": best.mean_response / unit,
                },
                "profile_shares": profile_shares(best.profile),
                "paper_in_units": None if paper is None else {
                    "completion": list(paper[0]), "turnaround": paper[1], "mean_response": paper[2],
                },
            }  # fmt: skip
        gang = rows.get("gang")
        for row in rows.values():
            row["turnaround_over_gang"] = (
                row["best"]["turnaround"] / gang["best"]["turnaround"] if gang else None
            )
            row["mean_response_over_gang"] = (
                row["best"]["mean_response"] / gang["best"]["mean_response"] if gang else None
            )
        best_turnaround = min(r["best"]["turnaround"] for r in rows.values())
        best_response = min(r["best"]["mean_response"] for r in rows.values())
        for row in rows.values():
            row["turnaround_over_best"] = row["best"]["turnaround"] / best_turnaround
            row["mean_response_over_best"] = row["best"]["mean_response"] / best_response
        summary[name] = rows
    return summary


def profile_shares(profile: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each class's share of its processes' wall time per category, and its share of all process time."""
    everything = sum(row["wall"] for row in profile.values()) or 1.0
    return {
        klass: {
            "of_all": row["wall"] / everything,
            **{k: v / row["wall"] if row["wall"] else 0.0 for k, v in row.items() if k != "wall"},
        }
        for klass, row in profile.items()
    }


def profile_table(rows: Json) -> list[str]:
    """Where the processes' time went in each policy's best run, per class, in % of their wall time."""
    parts = [*PROFILE_PARTS, "other"]
    lines = [
        "| policy | class | share of process time | " + " | ".join(parts) + " |",
        "|---|---|---:|" + "---:|" * len(parts),
    ]
    for policy, row in rows.items():
        for klass, shares in sorted(row["profile_shares"].items()):
            cells = " | ".join(f"{100 * shares[k]:.0f}%" for k in parts)
            lines.append(f"| {policy} | {klass} | {100 * shares['of_all']:.0f}% | {cells} |")
    return lines


def markdown(result: Json) -> str:
    """One table per scenario, in seconds and in building-block units beside the paper's."""
    given = result["parameters"]
    lines = [
        f"Building block (1 ms BSP ring, {given['length']:g} s of computation) alone under batch: "
        f"{result['unit']:.2f} s = 1 unit. {given['nodes']} node(s) x {given['pes_per_node']} PE, MPL 3, "
        f"{given['slice_ms']:g} ms slices, best of {given['repeats']} (median in brackets).",
        "",
    ]
    for name, rows in result["summary"].items():
        jobs = len(result["jobs"][name])
        head = [f"job {i + 1} (s)" for i in range(jobs)]
        lines += [
            f"### {name}: {build(name, 1, 2, 1).title}",
            "",
            "| policy | " + " | ".join(head) + " | turnaround (s) | mean response (s) | turnaround / gang "
            "| ours in units: jobs, turnaround, response | paper in units |",
            "|---|" + "---:|" * (jobs + 3) + "---|---|",
        ]
        for policy, row in rows.items():
            best, median = row["best"], row["median"]
            cells = [
                f"{b:.1f} ({m:.1f})" for b, m in zip(best["completion"], median["completion"], strict=True)
            ]
            units = row["best_in_units"]
            ours = ", ".join(f"{c:.2f}" for c in units["completion"])
            ours += f"; {units['turnaround']:.2f}; {units['mean_response']:.2f}"
            paper = row["paper_in_units"]
            theirs = (
                "-" if paper is None else ", ".join(f"{c:.2f}" for c in paper["completion"])
                + f"; {paper['turnaround']:.2f}; {paper['mean_response']:.2f}"
            )  # fmt: skip
            ratio = row["turnaround_over_gang"]
            lines.append(
                f"| {policy} | " + " | ".join(cells)
                + f" | {best['turnaround']:.1f} ({median['turnaround']:.1f})"
                + f" | {best['mean_response']:.1f} ({median['mean_response']:.1f})"
                + f" | {'-' if ratio is None else f'{ratio:.3f}'} | {ours} | {theirs} |"
            )  # fmt: skip
        best = min(rows, key=lambda policy: rows[policy]["best"]["turnaround"])
        if any(row["profile_shares"] for row in rows.values()):
            note = "" if best == p.Policy.FCS else f" FCS is not the best here ({best} is):"
            lines += ["", f"Where the time went.{note}", "", *profile_table(rows)]
        lines.append("")
    return "\n".join(lines)


def main(argv_: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench scenarios", description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS[1:]), help=f"any of {','.join(SCENARIOS)}")
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="default: batch,gang,sb,fcs; a variant with [fcs] settings: fcs@f_priority=always;cslots_min=10",
    )
    parser.add_argument("--repeats", "-r", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("--length", type=float, default=10.0, help="building block's seconds (default 10)")
    parser.add_argument("--nodes", "-N", type=int, default=2, help="node managers (default 2)")
    parser.add_argument("--pes-per-node", "-P", type=int, default=1, help="PEs per node (default 1)")
    parser.add_argument("--slice-ms", type=float, default=100.0, help="time slice (default 100)")
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--png", type=Path, help="draw the bar chart here (needs matplotlib)")
    args = parser.parse_args(argv_)
    scenarios = [s for s in args.scenarios.split(",") if s]
    policies = [pol for pol in args.policies.split(",") if pol]
    bad = [s for s in scenarios if s not in SCENARIOS] + [pol for pol in policies if not known(pol)]
    if bad or not scenarios or not policies or args.repeats < 1 or args.length <= 0 or args.nodes < 2:
        parser.error(
            f"unknown {', '.join(bad)}" if bad else "need scenarios, policies, --repeats >= 1, --length > 0, "
            "--nodes >= 2 (the paper's imbalance alternates nodes)"
        )  # fmt: skip
    if args.png and not chart_available():
        parser.error("--png needs matplotlib: pip install 'storm[bench]'")
    result = run(
        scenarios, policies, repeats=args.repeats, length=args.length, nodes=args.nodes,
        pes=args.pes_per_node, slice_ms=args.slice_ms,
    )  # fmt: skip
    text = markdown(result)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"raw figures: {args.json}")
    if args.png:
        p = result["parameters"]
        title = (
            f"{p['nodes']} nodes x {p['pes_per_node']} PE, {p['length']:g} s building block, "
            f"best of {p['repeats']}; black ticks: the paper"
        )
        scenario_chart.draw(result["summary"], args.png, title)
        print(f"chart: {args.png}")
    return 0


def chart_available() -> bool:
    """Checked before the run, so that an hour of measuring does not end in an ImportError."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def known(label: str) -> bool:
    try:
        parse_policy(label)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
