"""The FCS paper's synthetic scenarios in the coscheduling simulator, beside the live runs (issue 15, item 3).

``storm sim scenarios`` (``python -m storm.tools.sim.cosched.scenarios``). Each scenario of
tools/scenarios.py (the jobs ``storm bench scenarios`` submits: BSP jobs, tools/apps/bsp.py) becomes a list
of :class:`Program`: the BSP options are parsed by bsp.py's own parser, and each rank computes its target
per iteration (granularity, times the imbalance on its slow ranks) plus the CPU the real program spends per
iteration outside its burner (Python's loop, mpi4py's calls: :attr:`Calibration.overhead_ns`), then makes
one ring exchange. Each scenario runs under every policy through storm's own cores
(tools/sim/cosched/cluster.py) on the live benchmark's cluster: 2 nodes x 1 PE, MPL 3, 100 ms slices.

The report gives per scenario and policy each job's completion time, the turnaround, the mean response,
and the turnaround over gang's: simulated, live (results/scenarios.json, best of its repeats) and the
paper's (tools/scenarios.py PAPER), the simulated and live ones also in building-block units.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from storm.mm.protocol import FcsParameters
from storm.tools.apps.bsp import parse_args, slow_ranks
from storm.tools.scenarios import SCENARIOS, JobPlan, build, paper_normalised, parse_policy
from storm.tools.sim.cosched.cluster import NS, CoschedCluster, SimJob
from storm.tools.sim.cosched.node import Costs
from storm.tools.sim.cosched.program import Pattern, Program

Json = dict[str, Any]
POLICIES = ("batch", "gang", "sb", "fcs", "fcs@f_priority=always")
LIVE = Path(__file__).resolve().parents[3] / "results" / "scenarios.json"


@dataclass(frozen=True)
class Calibration:
    """The model's costs, chosen once (README, results/sim-scenarios.md say from what)."""

    switch_ns: int = 2_000_000  # a PE's context switch under time slicing
    wakeup_ns: int = 500_000  # CPU a blocked rank needs once its message is in (see the README)
    latency_ns: int = 5_000  # one BSP ring step: two MPI_Sendrecv over loopback
    overhead_ns: int = 55_000  # CPU per iteration outside the burner (Python, mpi4py)
    # The local scheduler's time slice (node.py Costs; 0: fluid sharing): EEVDF's base slice on this
    # machine's 2 CPUs, 0.75 ms x (1 + log2 2) by the kernel's default scaling (its debugfs is not readable
    # here). With fluid sharing complementing's sb and fcs were 0.198 and 0.078 off the live ratios
    # (results/sim-scenarios-slices.md).
    slice_ns: int = 1_500_000

    @property
    def costs(self) -> Costs:
        return Costs(switch_ns=self.switch_ns, wakeup_ns=self.wakeup_ns, slice_ns=self.slice_ns)


def program(plan: JobPlan, ranks: int, calibration: Calibration) -> Program:
    """The BSP job ``plan`` on ``ranks`` ranks as the model's program. O(ranks)."""
    args = parse_args(list(plan.args))
    slow = slow_ranks(args.slow, ranks)
    compute = []
    for rank in range(ranks):
        target = round(args.granularity * (args.imbalance if rank in slow else 1.0) * NS)
        compute.append(target + calibration.overhead_ns if target else 0)
    pattern = {"ring": Pattern.RING, "allreduce": Pattern.ALLREDUCE, "barrier": Pattern.ALLREDUCE}.get(
        args.pattern, Pattern.NONE
    )
    if ranks == 1:
        pattern = Pattern.NONE
    return Program(tuple(compute), args.iterations, pattern, calibration.latency_ns)


def fcs_parameters(settings: dict[str, str], base: FcsParameters | None = None) -> FcsParameters:
    """[fcs] settings of a policy label (``fcs@f_priority=always``) over ``base``.

    The default base is Table 2's constants with ``f_priority = "slot"``: the live scenario runs a plain
    ``fcs`` is set against (results/scenarios.json) were made when that was storm's default, and the
    comparison must stay like for like."""
    base = base or FcsParameters(f_priority="slot")
    typed: dict[str, object] = {}
    for key, value in settings.items():
        if not hasattr(base, key):
            raise ValueError(f"unknown FCS setting {key!r}")
        typed[key] = type(getattr(base, key))(value)
    return replace(base, **typed)  # type: ignore[arg-type]  # each value has its field's type


def run_one(
    scenario: str, label: str, calibration: Calibration, *, length: float = 10.0, nodes: int = 2, pes: int = 1
) -> Json:
    """One scenario under one policy: each job's completion and response (s), turnaround, mean response."""
    policy, settings = parse_policy(label)
    plan = build(scenario, length, nodes, pes)
    jobs = [SimJob(f"{i}-{j.name}", program(j, nodes * pes, calibration)) for i, j in enumerate(plan.jobs)]
    cluster = CoschedCluster(
        nodes, pes, policy, mpl=3, slice_s=0.1, costs=calibration.costs, fcs=fcs_parameters(settings)
    )
    result = cluster.run(jobs)
    first = min(j.submit for j in result.jobs)
    completion = [j.end - first for j in result.jobs]
    response = [j.response for j in result.jobs]
    return {
        "completion": completion,
        "response": response,
        "turnaround": max(completion),
        "mean_response": statistics.mean(response),
        "wall_seconds": result.wall_seconds,
        "model_events": result.model_events,
        "class_changes": [list(c) for c in result.classes],
    }


def run(
    scenarios: list[str], policies: list[str], calibration: Calibration, length: float, live: Json | None
) -> Json:
    """Every scenario under every policy; with ``alone`` first, as the unit."""
    started = time.perf_counter()
    unit = run_one("alone", "batch", calibration, length=length)["turnaround"]
    out: Json = {
        "parameters": {
            "length": length, "nodes": 2, "pes_per_node": 1, "mpl": 3, "slice_ms": 100.0,
            "calibration": asdict(calibration), "policies": policies, "scenarios": scenarios,
        },
        "unit": unit,
        "live_unit": live["unit"] if live else None,
        "summary": {},
    }  # fmt: skip
    for name in scenarios:
        rows: Json = {}
        for label in policies:
            rows[label] = run_one(name, label, calibration, length=length)
            print(f"{name:14} {label:22} {rows[label]['wall_seconds']:6.1f} s", file=sys.stderr)
        gang = rows.get("gang")
        for label, row in rows.items():
            if gang is not None:
                row["turnaround_over_gang"] = row["turnaround"] / gang["turnaround"]
                row["mean_response_over_gang"] = row["mean_response"] / gang["mean_response"]
            row["in_units"] = {
                "completion": [c / unit for c in row["completion"]],
                "turnaround": row["turnaround"] / unit,
                "mean_response": row["mean_response"] / unit,
            }
            live_row = (live or {}).get("summary", {}).get(name, {}).get(label)
            if live_row is not None:
                row["live"] = {
                    "completion": live_row["best"]["completion"],
                    "turnaround": live_row["best"]["turnaround"],
                    "mean_response": live_row["best"]["mean_response"],
                    "turnaround_over_gang": live_row["turnaround_over_gang"],
                    "mean_response_over_gang": live_row.get("mean_response_over_gang"),
                }
            paper = paper_normalised(name, parse_policy(label)[0])
            if paper is not None:
                row["paper_in_units"] = {
                    "completion": paper[0],
                    "turnaround": paper[1],
                    "mean_response": paper[2],
                }
                gang_paper = paper_normalised(name, "gang")
                if gang_paper is not None:
                    row["paper_turnaround_over_gang"] = paper[1] / gang_paper[1]
        out["summary"][name] = rows
    out["seconds"] = time.perf_counter() - started
    return out


def worst_gap(result: Json) -> float:
    """The largest |simulated - live| turnaround/gang ratio over the scenarios and policies compared."""
    gaps = [
        abs(row["turnaround_over_gang"] - row["live"]["turnaround_over_gang"])
        for rows in result["summary"].values()
        for row in rows.values()
        if "live" in row and "turnaround_over_gang" in row
    ]
    return max(gaps, default=0.0)


def markdown(result: Json) -> str:
    given = result["parameters"]
    cal = given["calibration"]
    slice_ms = cal.get("slice_ns", 0) / 1e6
    local = f"{slice_ms:g} ms round-robin slices" if slice_ms else "fluid sharing"
    live_unit = f" (live {result['live_unit']:.2f} s)" if result["live_unit"] else " (no live run to compare)"
    lines = [
        f"Simulated building block ({given['length']:g} s of computation) alone under batch: "
        f"{result['unit']:.2f} s{live_unit}. 2 nodes x 1 PE, MPL 3, "
        f"100 ms slices. Costs: context switch {cal['switch_ns'] / 1e6:g} ms, wake-up "
        f"{cal['wakeup_ns'] / 1e3:g} us, ring step latency {cal['latency_ns'] / 1e3:g} us, CPU per iteration "
        f"outside the burner {cal['overhead_ns'] / 1e3:g} us, local scheduler "
        f"{local}."
        + (
            f" Worst |simulated - live| turnaround / gang: {worst_gap(result):.3f}."
            if result["live_unit"]
            else ""
        ),
        "",
    ]
    for name, rows in result["summary"].items():
        lines += [
            f"### {name}",
            "",
            "| policy | jobs sim (s) | jobs live (s) | turnaround sim / live (s) "
            "| mean response sim / live (s) | turnaround / gang: sim | live | paper | gap |",
            "|---|---|---|---|---|---:|---:|---:|---:|",
        ]
        for label, row in rows.items():
            live = row.get("live")
            sim_jobs = ", ".join(f"{c:.1f}" for c in row["completion"])
            live_jobs = ", ".join(f"{c:.1f}" for c in live["completion"]) if live else "-"
            ratio = row.get("turnaround_over_gang")
            live_ratio = live["turnaround_over_gang"] if live else None
            paper_ratio = row.get("paper_turnaround_over_gang")
            gap = abs(ratio - live_ratio) if ratio is not None and live_ratio is not None else None

            def f(x: float | None) -> str:
                return "-" if x is None else f"{x:.3f}"

            live_turnaround = f"{live['turnaround']:.1f}" if live else "-"
            live_response = f"{live['mean_response']:.1f}" if live else "-"
            lines.append(
                f"| {label} | {sim_jobs} | {live_jobs} | {row['turnaround']:.1f} / {live_turnaround} | "
                f"{row['mean_response']:.1f} / {live_response} | {f(ratio)} | {f(live_ratio)} | "
                f"{f(paper_ratio)} | {f(gap)} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm sim scenarios", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(s for s in SCENARIOS if s != "alone"))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--length", type=float, default=10.0, help="building block, seconds (default 10)")
    parser.add_argument("--live", type=Path, default=LIVE, help="the live results (results/scenarios.json)")
    parser.add_argument("--switch-us", type=float, default=Calibration.switch_ns / 1e3)
    parser.add_argument("--wakeup-us", type=float, default=Calibration.wakeup_ns / 1e3)
    parser.add_argument("--latency-us", type=float, default=Calibration.latency_ns / 1e3)
    parser.add_argument("--overhead-us", type=float, default=Calibration.overhead_ns / 1e3)
    parser.add_argument(
        "--slice-ms",
        type=float,
        default=Calibration.slice_ns / 1e6,
        help="the local scheduler's time slice (0: fluid sharing; default 1.5)",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    args = parser.parse_args(argv)
    calibration = Calibration(
        switch_ns=round(args.switch_us * 1e3), wakeup_ns=round(args.wakeup_us * 1e3),
        latency_ns=round(args.latency_us * 1e3), overhead_ns=round(args.overhead_us * 1e3),
        slice_ns=round(args.slice_ms * 1e6),
    )  # fmt: skip
    live = json.loads(args.live.read_text()) if args.live and args.live.exists() else None
    if live is not None and live.get("parameters", {}).get("length") != args.length:
        # Another experiment: its ratios are not what this one should match.
        print(f"{args.live}: other building blocks than {args.length:g} s; not compared", file=sys.stderr)
        live = None
    result = run(args.scenarios.split(","), args.policies.split(","), calibration, args.length, live)
    text = markdown(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
