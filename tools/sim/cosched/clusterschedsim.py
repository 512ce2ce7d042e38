"""ClusterSchedSim's case studies in the coscheduling simulator (issue 15, item 5): storm sim clusterschedsim.

Zhang & Sivasubramaniam (SIMULATION 80(4-5), 2004, section 6) compare gang scheduling (GS), space sharing
and dynamic coscheduling (SB, DCS, PB, DCS-SB, PB-SB) on a communication-intensive and an I/O-intensive
workload (their Fig. 8b, c: GS best on the first, the dynamic schemes on the second), give where the CPU's
time goes (Fig. 9), and how response time moves when the overheads are halved (Table 1). Here each scheme
runs through storm's cores (cluster.py: batch, gang, and sb with the node model's local scheduler for the
dynamic ones, local.py) on both workloads under Table 1's three cost columns.

The paper gives neither workload's parameters (they are in its reference [16]); these are ours:

- the cluster: 16 nodes x 1 PE (ClusterSchedSim models one CPU per node; its case study had 32 nodes),
  MPL 4 (space sharing: 1);
- 32 jobs per workload and seed (two seeds, so that the spread between them shows how much of a
  difference the chaos of scheduling alone makes): 2, 4, 8 or 16 ranks (weights 3, 3, 2, 1); per iteration
  each rank computes the job's granularity, uniform in 1-4 ms, then (I/O-intensive workload only) does
  twice that much I/O, then makes one blocking exchange, a ring or an all-reduce (even odds), 20 us of
  latency (a user-level network's 10-20 us); a dedicated runtime uniform in 0.4-1.6 s sets the iterations
  (a few GS quanta: longer jobs would cost more simulation than a run of a few minutes allows).
  The two workloads draw the same jobs: the I/O one is the communication one with I/O added;
- Poisson arrivals at an offered load of 0.8: the jobs' dedicated PE-seconds over 16 PEs x the arrivals'
  mean span;
- the local scheduler of the dynamic schemes (local.py): 20 ms round-robin slices (TS's quantum at the
  level woken and boosted tasks enter), spin-block threshold 120 us (storm's T_spin, the same in every
  column so that only the costs change), PB's daemon every 10 ms costing what an interrupt does, no
  separate wake-up cost (the switch is it). GS and space sharing: storm's own policies, the MM's slice
  being GS's quantum, each slot change costing GS's switch on every PE.

Table 1's columns: A: GS quantum 200 ms, switch 2 ms, dynamic switch 200 us, interrupt 50 us; B: 100 ms,
1 ms, 100 us, 25 us; C: 100 ms, 2 ms, 100 us, 50 us. The output: mean response per workload and scheme,
normalised to column A (Table 1's form, the paper's numbers beside), loss of capacity (tools/sim/metrics.py,
over N x MPL slots rather than N nodes, so that it is a share), where the PEs' time went (computing,
spinning, switching, interrupts with PB's daemon, idle), and the paper's findings as PASS/DIFFERS lines.
Which seeds, jobs, load and schemes: the command's options. Cost: O(events) per run, a few seconds for a
dynamic scheme on the communication-intensive workload; the 76 runs of the default take about 4 minutes
on one core (``--workers 2`` shares them out between processes: the figures are the same).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from storm.mm.protocol import FcsParameters
from storm.tools.sim.cosched.cluster import DYNAMIC, NS, CoschedCluster, JobResult, SimJob
from storm.tools.sim.cosched.node import Costs, Local, Reschedule
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.metrics import JobRow, loss_of_capacity

Json = dict[str, Any]
MS, US = 1_000_000, 1_000
SCHEMES = ("batch", "gang", "sb", "dcs", "pb", "dcs-sb", "pb-sb")
NAMES = {"batch": "space sharing", "gang": "GS", "sb": "SB", "dcs": "DCS", "pb": "PB", "dcs-sb": "DCS-SB",
         "pb-sb": "PB-SB"}  # fmt: skip
SB_FAMILY = ("sb", "dcs-sb", "pb-sb")
WORKLOADS = ("communication", "io")
# Table 1, normalised response (column A = 1). PB's B figure is garbled in the text ("0. 89"), C missing.
PAPER: dict[str, dict[str, float | None]] = {
    "gang": {"A": 1.0, "B": 0.896, "C": 0.977},
    "sb": {"A": 1.0, "B": 0.648, "C": 0.642},
    "dcs": {"A": 1.0, "B": 0.902, "C": 0.904},
    "pb": {"A": 1.0, "B": None, "C": None},
    "dcs-sb": {"A": 1.0, "B": 0.710, "C": 0.804},
    "pb-sb": {"A": 1.0, "B": 0.670, "C": 0.687},
}
TOLERANCE = 0.10  # |ours - paper| of a normalised response that still counts as the paper's figure


@dataclass(frozen=True)
class Column:
    """One column of Table 1."""

    name: str
    gs_quantum_ns: int
    gs_switch_ns: int
    switch_ns: int  # the dynamic schemes' context switch
    interrupt_ns: int


COLUMNS = (
    Column("A", 200 * MS, 2 * MS, 200 * US, 50 * US),
    Column("B", 100 * MS, 1 * MS, 100 * US, 25 * US),
    Column("C", 100 * MS, 2 * MS, 100 * US, 50 * US),
)


@dataclass(frozen=True)
class Setup:
    """The experiment's own choices (module docstring)."""

    nodes: int = 16
    mpl: int = 4
    jobs: int = 32
    load: float = 0.8
    seeds: tuple[int, ...] = (1, 2)  # one workload pair each; figures are their means, with the spread
    slice_ns: int = 20 * MS
    spin_ns: int = 120 * US
    period_ns: int = 10 * MS
    latency_ns: int = 20 * US
    granularity_ms: tuple[float, float] = (1.0, 4.0)  # computation per iteration, uniform
    runtime_s: tuple[float, float] = (0.4, 1.6)  # dedicated runtime, uniform


def workload(kind: str, setup: Setup, seed: int) -> list[SimJob]:
    """The jobs of one workload; both kinds draw the same sizes, granularities, patterns and runtimes.
    O(jobs)."""
    if kind not in WORKLOADS:
        raise ValueError(f"unknown workload {kind!r}: one of {', '.join(WORKLOADS)}")
    rng = random.Random(seed)
    sizes = [(s, w) for s, w in ((2, 3), (4, 3), (8, 2), (16, 1)) if s <= setup.nodes] or [(setup.nodes, 1)]
    drawn = []
    for _ in range(setup.jobs):
        ranks = rng.choices([s for s, _ in sizes], weights=[w for _, w in sizes])[0]
        compute = round(rng.uniform(*setup.granularity_ms) * MS / US) * US
        pattern = rng.choice((Pattern.RING, Pattern.ALLREDUCE))
        runtime = rng.uniform(*setup.runtime_s) * NS
        gap = rng.expovariate(1.0)
        io = 2 * compute if kind == "io" else 0
        iterations = max(1, round(runtime / (compute + io + setup.latency_ns)))
        drawn.append((Program.balanced(ranks, compute, iterations, pattern, setup.latency_ns, io_ns=io), gap))
    work = sum(p.dedicated_ns() * p.ranks for p, _ in drawn)
    mean_gap = work / (setup.load * setup.nodes * setup.jobs)
    jobs, at = [], 0.0
    for i, (program, gap) in enumerate(drawn):
        jobs.append(SimJob(f"{kind[:4]}{i:02}", program, round(at)))
        at += gap * mean_gap
    return jobs


def costs(scheme: str, column: Column, setup: Setup) -> tuple[Costs, float]:
    """The node model's costs and the MM's slice (s) of ``scheme`` under ``column``."""
    if scheme == "batch":
        return Costs(), column.gs_quantum_ns / NS  # nothing is ever switched
    if scheme == "gang":
        return Costs(switch_ns=column.gs_switch_ns), column.gs_quantum_ns / NS
    reschedule = DYNAMIC[scheme][0] if scheme in DYNAMIC else Reschedule.NONE
    if scheme != "sb" and scheme not in DYNAMIC:
        raise ValueError(f"unknown scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    dcs, pb = reschedule is Reschedule.DCS, reschedule is Reschedule.PB
    local = Local(
        reschedule, switch_ns=column.switch_ns, interrupt_ns=column.interrupt_ns if dcs else 0,
        period_ns=setup.period_ns if pb else 0, daemon_ns=column.interrupt_ns if pb else 0,
    )  # fmt: skip
    return Costs(switch_ns=column.switch_ns, slice_ns=setup.slice_ns, local=local), column.gs_quantum_ns / NS


def _row(j: JobResult, ranks: int) -> JobRow:
    """A job as tools/sim/metrics.py's loss of capacity reads it (slowdown and limit unused there)."""
    return JobRow(
        number=j.mm_id, user=0, procs=ranks, submit=j.submit, start=j.start, end=j.end,
        wait=j.start - j.submit, response=j.response, runtime=j.end - j.start, limit=0.0, bsld=0.0,
        state=j.state,
    )  # fmt: skip


def _job(job: SimJob) -> Json:
    p = job.program
    return {
        "name": job.name, "submit": job.submit_ns / NS, "ranks": p.ranks, "compute_ms": p.compute_ns[0] / MS,
        "io_ms": p.io_ns / MS, "iterations": p.iterations, "pattern": p.pattern.value,
        "dedicated": p.dedicated_ns() / NS,
    }  # fmt: skip


def run_one(scheme: str, column: Column, jobs: list[SimJob], setup: Setup) -> Json:
    """One workload under one scheme and cost column: responses, loss of capacity, where PE time went."""
    cost, slice_s = costs(scheme, column, setup)
    mpl = 1 if scheme == "batch" else setup.mpl
    cluster = CoschedCluster(
        setup.nodes,
        1,
        scheme,
        mpl=mpl,
        slice_s=slice_s,
        costs=cost,
        fcs=FcsParameters(spin=setup.spin_ns / NS),
    )
    result = cluster.run(jobs)
    ranks = {job.name: job.program.ranks for job in jobs}
    rows = [_row(j, ranks[j.name]) for j in result.jobs]
    pes = result.pes
    total = sum(p.busy_ns + p.spin_ns + p.switch_ns + p.idle_ns for p in pes)
    interrupt = sum(p.interrupt_ns for p in pes)
    return {
        "mean_response": statistics.fmean(j.response for j in result.jobs),
        "mean_wait": statistics.fmean(j.start - j.submit for j in result.jobs),
        "makespan": max(j.end for j in result.jobs) - min(j.submit for j in result.jobs),
        "loss_of_capacity": loss_of_capacity(rows, setup.nodes * mpl),
        "cpu": {
            "computing": sum(p.busy_ns for p in pes) / total,
            "spinning": sum(p.spin_ns for p in pes) / total,
            "switching": (sum(p.switch_ns for p in pes) - interrupt) / total,
            "interrupts": interrupt / total,
            "idle": sum(p.idle_ns for p in pes) / total,
        },
        "switches_per_pe_s": sum(p.switches for p in pes) / (total / NS),
        "interrupts_per_pe_s": sum(p.interrupts for p in pes) / (total / NS),
        "responses": [j.response for j in result.jobs],
        "wall_seconds": result.wall_seconds,
        "model_events": result.model_events,
    }


_Task = tuple[str, str, str, int]  # workload, scheme, column, seed


def _task(task: _Task, setup: Setup) -> Json:
    kind, scheme, column, seed = task
    return run_one(scheme, {c.name: c for c in COLUMNS}[column], workload(kind, setup, seed), setup)


def _mean(rows: list[Json], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def _aggregate(runs: list[Json], base: list[Json]) -> Json:
    """One scheme and column over the seeds: means, and each seed's response over its column A's."""
    normalised = [r["mean_response"] / b["mean_response"] for r, b in zip(runs, base, strict=True)]
    return {
        "normalised": statistics.fmean(normalised),
        "normalised_spread": max(normalised) - min(normalised),
        **{k: _mean(runs, k) for k in ("mean_response", "mean_wait", "makespan", "loss_of_capacity")},
        **{k: _mean(runs, k) for k in ("switches_per_pe_s", "interrupts_per_pe_s")},
        "cpu": {k: statistics.fmean(r["cpu"][k] for r in runs) for k in runs[0]["cpu"]},
        "wall_seconds": sum(r["wall_seconds"] for r in runs),
        "model_events": sum(r["model_events"] for r in runs),
        "seeds": runs,
    }


def run(
    setup: Setup, schemes: tuple[str, ...] = SCHEMES, columns: tuple[Column, ...] = COLUMNS, workers: int = 1
) -> Json:
    """Every workload of every seed under every scheme and column (space sharing costs nothing: run once,
    reported in every column), on ``workers`` processes. The figures do not depend on ``workers``."""
    started = time.perf_counter()
    names = [c.name for c in columns]
    tasks = [
        (kind, scheme, name, seed)
        for kind in WORKLOADS
        for scheme in schemes
        for name in (names[:1] if scheme == "batch" else names)
        for seed in setup.seeds
    ]
    done: dict[_Task, Json] = {}
    with ProcessPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        outcomes = pool.map(_task, tasks, [setup] * len(tasks)) if pool else (_task(t, setup) for t in tasks)
        for task, row in zip(tasks, outcomes, strict=True):
            done[task] = row
            print(
                f"{task[0]:13} {task[1]:7} {task[2]} seed {task[3]} {row['wall_seconds']:6.1f} s",
                file=sys.stderr,
            )
    out: Json = {"setup": asdict(setup), "columns": [asdict(c) for c in columns], "schemes": list(schemes)}
    out["workloads"] = {}
    for kind in WORKLOADS:
        rows: Json = {}
        for scheme in schemes:
            ran = names[:1] * len(names) if scheme == "batch" else names
            runs = {
                n: [done[kind, scheme, r, seed] for seed in setup.seeds]
                for n, r in zip(names, ran, strict=True)
            }
            rows[scheme] = {n: _aggregate(runs[n], runs[names[0]]) for n in names}
        jobs = {seed: workload(kind, setup, seed) for seed in setup.seeds}
        out["workloads"][kind] = {
            "jobs": {str(seed): [_job(j) for j in js] for seed, js in jobs.items()},
            "offered_load": statistics.fmean(
                sum(j.program.dedicated_ns() * j.program.ranks for j in js)
                / (setup.nodes * max(j.submit_ns for j in js))
                for js in jobs.values()
            ),
            "schemes": rows,
        }
    out["checks"] = checks(out)
    out["seconds"] = time.perf_counter() - started
    return out


def _line(claim: str, ok: bool, measured: str) -> Json:
    return {"claim": claim, "verdict": "PASS" if ok else "DIFFERS", "measured": measured}


def checks(result: Json) -> list[Json]:
    """The paper's findings against the run, each PASS or DIFFERS with the figures it was judged on. A
    finding that one normalised response is below another passes only by more than the spread between
    the seeds of the figures compared: a smaller difference is as likely the chaos of scheduling."""
    lines = []
    for kind, data in result["workloads"].items():
        rows = data["schemes"]
        have = [s for s in rows if s in PAPER]
        for col in ("B", "C"):
            if not all(col in rows[s] for s in have):
                continue
            for scheme in have:
                paper = PAPER[scheme][col]
                if paper is None:
                    continue
                ours = rows[scheme][col]["normalised"]
                lines.append(_line(
                    f"{kind}: Table 1 column {col}, {NAMES[scheme]} {paper:.3f} (within {TOLERANCE})",
                    abs(ours - paper) <= TOLERANCE, f"{ours:.3f}",
                ))  # fmt: skip
            family = [s for s in SB_FAMILY if s in rows]
            if "dcs" in rows and family:
                cuts = {s: 1 - rows[s][col]["normalised"] for s in (*family, "dcs")}
                noise = max(rows[s][col].get("normalised_spread", 0.0) for s in cuts)
                lines.append(_line(
                    f"{kind}: column {col} (switch halved) cuts the SB family's response more than DCS's",
                    min(cuts[s] for s in family) > cuts["dcs"] + noise,
                    "cut by "
                    + ", ".join(f"{NAMES[s]} {c:.1%}" for s, c in cuts.items()) + f"; spread {noise:.3f}",
                ))  # fmt: skip
        if "gang" in rows and {"B", "C"} <= set(rows["gang"]):
            b, c = rows["gang"]["B"]["normalised"], rows["gang"]["C"]["normalised"]
            noise = max(rows["gang"][n].get("normalised_spread", 0.0) for n in ("B", "C"))
            lines.append(_line(
                f"{kind}: GS gains more with its switch halved too (B) than from a shorter quantum alone (C)",
                b + noise < c, f"B {b:.3f}, C {c:.3f}; spread {noise:.3f}",
            ))  # fmt: skip
        dynamic = [s for s in rows if s not in ("batch", "gang")]
        if {"B", "C"} <= set(rows.get("dcs-sb", {})) and len(dynamic) > 1:
            gaps = {s: rows[s]["C"]["normalised"] - rows[s]["B"]["normalised"] for s in dynamic}
            noise = max(rows[s][n].get("normalised_spread", 0.0) for s in dynamic for n in ("B", "C"))
            lines.append(_line(
                f"{kind}: DCS-SB is the dynamic scheme most sensitive to the interrupt cost (C - B)",
                all(gaps["dcs-sb"] > g + noise for s, g in gaps.items() if s != "dcs-sb"),
                ", ".join(f"{NAMES[s]} {g:+.3f}" for s, g in gaps.items()) + f"; spread {noise:.3f}",
            ))  # fmt: skip
        if "gang" not in rows or not dynamic:
            continue
        mean = {s: rows[s]["A"]["mean_response"] for s in ("gang", *dynamic)}
        order = ", ".join(f"{NAMES[s]} {mean[s]:.2f}" for s in sorted(mean, key=lambda s: mean[s]))
        if kind == "communication":
            lines.append(_line(
                "communication: GS has the lowest mean response (Fig. 8b), column A",
                min(mean, key=lambda s: mean[s]) == "gang", order + " s",
            ))  # fmt: skip
        else:
            beat = [s for s in dynamic if mean[s] < mean["gang"]]
            lines.append(_line(
                "io: every dynamic scheme beats GS (Fig. 8c), column A", len(beat) == len(dynamic),
                f"{len(beat)} of {len(dynamic)}: " + order + " s",
            ))  # fmt: skip
        if "pb" in rows:
            gs, pb = rows["gang"]["A"]["cpu"], rows["pb"]["A"]["cpu"]
            lines.append(_line(
                f"{kind}: GS spins less than PB but idles more (Fig. 9), column A",
                gs["spinning"] < pb["spinning"] and gs["idle"] > pb["idle"],
                f"spinning GS {gs['spinning']:.1%} PB {pb['spinning']:.1%}, idle GS {gs['idle']:.1%} "
                f"PB {pb['idle']:.1%}",
            ))  # fmt: skip
    return lines


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(result: Json) -> str:
    setup = result["setup"]
    names = [c["name"] for c in result["columns"]]
    lines = [
        f"{setup['nodes']} nodes x 1 PE, MPL {setup['mpl']}, {setup['jobs']} jobs per workload at offered "
        f"load {setup['load']:g} (seeds {', '.join(map(str, setup['seeds']))}); dynamic schemes: "
        f"{setup['slice_ns'] / MS:g} ms slices, spin {setup['spin_ns'] / US:g} us, PB period "
        f"{setup['period_ns'] / MS:g} ms; message latency {setup['latency_ns'] / US:g} us. Columns: "
        + "; ".join(
            f"{c['name']}: GS quantum {c['gs_quantum_ns'] / MS:g} ms, switch {c['gs_switch_ns'] / MS:g} ms, "
            f"dynamic switch {c['switch_ns'] / US:g} us, interrupt {c['interrupt_ns'] / US:g} us"
            for c in result["columns"]
        )
        + f". Run: {result['seconds']:.0f} s.",
        "",
        "## Table 1: mean response normalised to column A (ours / paper)",
        "",
        "Ours: the mean over the seeds of each seed's mean response over its column A's, and in brackets how "
        "far apart the seeds' figures are.",
        "",
        "| scheme | "
        + " | ".join(f"{k} {n}" for k in result["workloads"] for n in names)
        + " | paper "
        + " | paper ".join(names)
        + " |",
        "|---|" + "---:|" * (len(names) * (len(result["workloads"]) + 1)),
    ]
    schemes = result["schemes"]
    for scheme in schemes:
        ours = [result["workloads"][k]["schemes"][scheme][n] for k in result["workloads"] for n in names]
        paper = [PAPER.get(scheme, {}).get(n) for n in names]
        shown = [
            _f(p) if not (scheme == "pb" and n == "B") else "0.89?" for p, n in zip(paper, names, strict=True)
        ]
        lines.append(
            f"| {NAMES[scheme]} | "
            + " | ".join(f"{x['normalised']:.3f} ({x['normalised_spread']:.3f})" for x in ours)
            + " | "
            + " | ".join(shown)
            + " |"
        )
    for kind, data in result["workloads"].items():
        rows = data["schemes"]
        lines += [
            "",
            f"## {kind} workload (offered load {data['offered_load']:.2f})",
            "",
            "| scheme | "
            + " | ".join(f"response {n} (s)" for n in names)
            + " | wait A (s) | loss of capacity A | computing | spinning | switching | interrupts | idle "
            "| switches / PE-s | interrupts / PE-s |",
            "|---|" + "---:|" * (len(names) + 9),
        ]
        for scheme in schemes:
            a = rows[scheme][names[0]]
            cpu = a["cpu"]
            lines.append(
                f"| {NAMES[scheme]} | "
                + " | ".join(_f(rows[scheme][n]["mean_response"], 2) for n in names)
                + f" | {a['mean_wait']:.2f} | {a['loss_of_capacity']:.3f} | "
                + " | ".join(
                    f"{cpu[k]:.1%}" for k in ("computing", "spinning", "switching", "interrupts", "idle")
                )
                + f" | {a['switches_per_pe_s']:.1f} | {a['interrupts_per_pe_s']:.1f} |"
            )
    lines += ["", "## The paper's findings", ""]
    lines += [f"- {c['verdict']}: {c['claim']}: {c['measured']}" for c in result["checks"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm sim clusterschedsim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="of " + ", ".join(SCHEMES))
    parser.add_argument("--columns", default="A,B,C", help="Table 1's columns to run (A is the unit)")
    parser.add_argument("--jobs", type=int, default=Setup.jobs, help="jobs per workload (default 32)")
    parser.add_argument("--nodes", type=int, default=Setup.nodes, help="nodes of one PE (default 16)")
    parser.add_argument("--mpl", type=int, default=Setup.mpl, help="multiprogramming level (default 4)")
    parser.add_argument("--load", type=float, default=Setup.load, help="offered load (default 0.8)")
    parser.add_argument("--seeds", default="1,2", help="one workload pair per seed (default 1,2)")
    parser.add_argument(
        "--workers", type=int, default=1, help="processes running the simulations (default 1)"
    )
    parser.add_argument("--report", type=Path, help="judge and show a run's JSON again instead of running")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    args = parser.parse_args(argv)
    schemes = tuple(args.schemes.split(","))
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        parser.error(f"unknown schemes {', '.join(unknown)}: of {', '.join(SCHEMES)}")
    by_name = {c.name: c for c in COLUMNS}
    wanted = args.columns.split(",")
    if not wanted or wanted[0] != "A" or any(n not in by_name for n in wanted):
        parser.error("--columns: A first (the unit), then any of B, C")
    seeds = tuple(int(x) for x in args.seeds.split(","))
    setup = Setup(nodes=args.nodes, mpl=args.mpl, jobs=args.jobs, load=args.load, seeds=seeds)
    if args.report:
        result = json.loads(args.report.read_text())
        result["checks"] = checks(result)
    else:
        result = run(setup, schemes, tuple(by_name[n] for n in wanted), workers=args.workers)
    text = markdown(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
