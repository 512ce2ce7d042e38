"""``storm sim bluegene``'s options and command (tools/sim/bluegene.py runs the sweep, bluegene_report.py
writes the report). Only argparse is imported until the command runs, so every ``storm sim`` starts fast."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
The BlueGene/L paper's experiments (Krevat, Castanos, Moreira, sections 3.2-3.4): each trace on a 4x4x8
torus under FCFS, backfilling, migration and B+M, and on a flat 128-node machine under FCFS and
backfilling, with every runtime multiplied by c. Reports saturation beside the paper's, its findings
checked, the capacity split (utilized, unused, lost, checked to add up to 1 on every run), wait,
response, bounded slowdown and migrations. Migration is the simulator's alone: storm cannot move a
running MPI job. Writes report.md, report.json and plots into --dir; each point's JSON is kept in
--dir/points and reused when the same sweep runs again."""
EXAMPLES = """examples:
  storm sim bluegene NASA-iPSC-1993-3.1-cln.swf hpc2n-2002-subset.swf -j 2 --dir results/sim-bluegene
  storm sim bluegene lublin.swf --loads 0.8,1.0,1.2 --schedulers FCFS,Migration --dir quick
"""


def add_parser(sub: Any) -> None:
    from_paper = "0.7,0.75,...,1.4 (the paper's) and 1.5,1.6,1.8,2,2.4,3,4,6,10 beyond, into saturation"
    bg = sub.add_parser(
        "bluegene",
        help="the BlueGene/L paper's torus schedulers (FCFS, backfill, migration, B+M) and a flat baseline, "
        "runtimes x c",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bg.add_argument("traces", nargs="+", metavar="TRACE", help="SWF traces (sizes scaled to 128 nodes)")
    bg.add_argument("--jobs", type=int, default=10_000, help="each trace's first N jobs (default 10000)")
    bg.add_argument("--loads", help=f"values of c, comma-separated (default {from_paper})")
    bg.add_argument(
        "--schedulers", help="comma-separated of FCFS, Backfill, Migration, B+M, flat FCFS, flat Backfill"
    )
    bg.add_argument(
        "--migration-cost", type=float, default=0.0, metavar="SECONDS",
        help="how long a migrated job stops (default 0, as the paper, which left it unquantified)",
    )  # fmt: skip
    bg.add_argument("-j", "--workers", type=int, help="points run at once (default: this machine's CPUs)")
    bg.add_argument(
        "--dir", type=Path, default=Path("storm-sim-bluegene"), help="default ./storm-sim-bluegene"
    )
    bg.set_defaults(func=command)


def _values(text: str | None, default: tuple[float, ...]) -> list[float]:
    if text is None:
        return list(default)
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--loads: comma-separated numbers, not {text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError("--loads: positive numbers")
    return values


def given(args: argparse.Namespace) -> str:
    """The command that makes this report again (the options that differ from the defaults)."""
    words = ["storm", "sim", "bluegene", *args.traces]
    if args.jobs != 10_000:
        words += ["--jobs", str(args.jobs)]
    for flag, value in (("--loads", args.loads), ("--schedulers", args.schedulers)):
        if value is not None:
            words += [flag, value]
    if args.migration_cost:
        words += ["--migration-cost", f"{args.migration_cost:g}"]
    if args.workers:
        words += ["-j", str(args.workers)]
    return " ".join(shlex.quote(w) for w in [*words, "--dir", str(args.dir)])


def notes(setups: list[Any], migration_cost: float, saturation: dict[str, dict[str, Any]]) -> list[str]:
    """Why our figures may differ from the paper's: what we used where it used something else, with the
    figures of our workloads beside its Table 1 (``saturation``: bluegene_report.saturations)."""
    from storm.tools.sim.bluegene import workload
    from storm.tools.sim.bluegene_report import paper_log

    found = []
    for setup in setups:
        work, processors = workload(setup)
        sizes = [job.procs for job in work.jobs]
        span = (work.jobs[-1].submit - work.jobs[0].submit) / 86400 if work.jobs else 0.0
        exact = all(job.estimated for job in work.jobs)
        scaled = f", sizes x 128/{processors} rounded up" if processors != 128 else ""
        log = paper_log(setup.name)
        paper = "NASA: 6.3 / 14.4" if log == "NASA" else "SDSC: 9.7 / 14.8"
        found.append(
            f"{setup.name}: its first {len(work.jobs):,} jobs (the paper: 10,000-job spans), {span:.1f} days"
            f"{scaled}; size mean / sd {statistics.fmean(sizes):.1f} / {statistics.pstdev(sizes):.1f} nodes "
            f"(paper, {paper}); dropped {sum(work.dropped.values())} records "
            f"({', '.join(f'{k}: {v}' for k, v in work.dropped.items() if v) or 'none'}); time limits "
            + (
                "= runtimes (the log has no requested times: exact estimates)"
                if exact
                else "the requested times"
            )
        )
        sat = saturation.get(setup.name, {})
        if log == "NASA" and {"FCFS", "flat FCFS", "Migration"} <= set(sat):
            torus, flat, moved = (100 * sat[k]["plateau"] for k in ("FCFS", "flat FCFS", "Migration"))
            found.append(
                f"{setup.name} is the Parallel Workloads Archive's cleaned log: 24,025 one-node jobs of one "
                "user were removed from it, so its jobs are larger and fewer than the paper's (mean size "
                "6.3). Small jobs are what fragments a torus and what backfilling packs. Here the torus "
                f"costs FCFS {flat - torus:.1f} points of utilization against the flat machine ({torus:.1f}% "
                f"against {flat:.1f}%), which bounds what migration can win back: it reaches {moved:.1f}% "
                "(the paper: 77% to 80%)."
            )
            found.append(
                "Backfilling reaches higher utilizations than the paper's ~90% because its estimates are "
                "exact (runtime = limit, since the log has none); the paper does not say which estimates it "
                "used."
            )
        else:
            found.append(
                f"{setup.name} stands in for the paper's SDSC log (not in this workspace): both have sizes "
                f"of all kinds; its figures are compared with SDSC's, so only the orderings are expected to "
                f"hold."
            )
    found += [
        "Ties: among placements that leave equally large free partitions the first shape (a, b, c) in "
        "lexicographic order, then the first base by node index, wins; migration re-places running jobs "
        "largest first, ties in job order. The paper does not say how it broke ties.",
        "The paper's one-second delay between a schedule and a start event is left out: it is 1 s x size per "
        "job of lost capacity, under 0.01% on these traces.",
        f"Migration costs {migration_cost:g} s per job moved (the paper did not quantify it). It is "
        f"simulated only: storm-mm never migrates, since moving a running MPI job needs checkpointing storm "
        f"does not have.",
        "Both logs' machines had 128 nodes, one BG/L supernode each here, as the paper treats them.",
    ]
    return found


def command(args: argparse.Namespace) -> int:
    from storm.tools.sim.bluegene import BEYOND, LABELS, PAPER_LOADS, Setup, run_sweep, stderr_progress
    from storm.tools.sim.bluegene_report import markdown, plot, report, saturations
    from storm.tools.sim.report import dump_json
    from storm.tools.sim.swf import file_sha256

    if args.jobs < 1:
        raise ValueError("--jobs: at least 1")
    if not args.migration_cost >= 0:
        raise ValueError("--migration-cost: seconds, >= 0")
    labels = list(LABELS) if args.schedulers is None else [s.strip() for s in args.schedulers.split(",")]
    unknown = [label for label in labels if label not in LABELS]
    if unknown:
        raise ValueError(f"--schedulers: {', '.join(unknown)} unknown; of {', '.join(LABELS)}")
    loads = _values(args.loads, PAPER_LOADS + BEYOND)
    setups = []
    for trace in args.traces:
        path = str(Path(trace).resolve())
        setups.append(Setup(path, file_sha256(path), args.jobs, args.migration_cost))
    workers = args.workers or len(os.sched_getaffinity(0))
    points = run_sweep(setups, labels, loads, args.dir, workers=workers, progress=stderr_progress)
    command_line = given(args)
    sat = saturations(points, [s.name for s in setups])
    data = report(points, setups, command_line, notes(setups, args.migration_cost, sat))
    intro = (
        f"## storm sim bluegene\n\nMade by `{command_line}`. The BlueGene/L paper's experiments on "
        f"storm-mm's own scheduling code (mm/torus_scheduler.py through mm/schedule_state.py, driven by "
        f"tools/sim/fast.py): each trace on a 4x4x8 torus of 128 nodes under FCFS, Backfill (EASY on the "
        f"torus), Migration and B+M, and on a flat 128-node machine under FCFS and Backfill; runtimes x c "
        f"for c in {', '.join(f'{c:g}' for c in loads)}."
    )
    text = markdown(data, intro)
    args.dir.mkdir(parents=True, exist_ok=True)
    with open(args.dir / "report.json", "w", encoding="utf-8") as stream:
        dump_json(data, stream)
    (args.dir / "report.md").write_text(text, encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is not None:
        plot(points, [s.name for s in setups], args.dir)
    else:
        print("storm sim bluegene: no matplotlib, so no plots", file=sys.stderr)
    sys.stdout.write(text)
    return 0
