"""``storm sim reproduce lsf | naik``: two papers' results on the processor-allocation simulator (issue 17).

Only argparse is imported here, so that every ``storm sim`` command starts fast; the simulator is imported
when the command runs. Each writes report.md, report.json and report.png (with matplotlib) into --dir and
prints the Markdown. report.json keeps everything that depends on the wall clock under ``wall``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LSF_DESCRIPTION = """\
Parsons and Sevcik, "Implementing Multiprocessor Scheduling Disciplines" (JSSPP 1997), Table 3: the 10
LSF disciplines x 4 knowledge cases on 16 workstations x 8 processors with LSF's costs, each averaged over
--seeds job streams of 200 tagged jobs (the same streams for every discipline), beside the paper's
figures; queue peaks; the headline cells again at other arrival rates; issue 17's claims checked one by
one. MIG and MALL need the application to checkpoint or reconfigure: simulator only."""
NAIK_DESCRIPTION = """\
Naik, Setia and Squillante, "Performance Analysis of Job Scheduling Policies in Parallel Supercomputing
Environments" (SC'93): mean response and U per class against the arrival rate for AP, FPJP(128,128,256),
FPJP(128,192,192) and DP; FP's best partition count per rate; DP's tuning; the transient after a burst of
10 small jobs at rate 0.007; issue 17's claims checked one by one. DP reconfigures running jobs, which the
application must do: simulator only."""


def add_parser(sub: Any) -> None:
    """``storm sim reproduce``'s options, on the subcommand parsers of tools/sim/cli.py."""
    re = sub.add_parser(
        "reproduce",
        help="reproduce a paper's results on the processor-allocation simulator: lsf (Parsons-Sevcik), naik",
        description="Reproduce a paper's results (issue 17); see storm sim reproduce lsf --help.",
    )
    papers = re.add_subparsers(dest="paper", required=True, metavar="PAPER")
    lsf = papers.add_parser(
        "lsf", help="Parsons and Sevcik's Table 3", description=LSF_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    lsf.add_argument("--seeds", type=int, default=20, help="job streams per cell, seeds 0..N-1 (default 20)")
    lsf.add_argument("--rate", type=float, default=300.0, help="mean seconds between arrivals (default 300)")
    lsf.add_argument(
        "--quantum", type=float, default=60.0, help="preemptive disciplines' quantum, s (default 60)"
    )
    lsf.add_argument("--disciplines", help="comma-separated (default all ten)")
    lsf.add_argument("--no-rates", action="store_true", help="skip the headline cells at other arrival rates")
    _common(lsf, "results/sim-lsf")
    lsf.set_defaults(func=command_lsf)
    naik = papers.add_parser(
        "naik", help="Naik, Setia and Squillante's partitioning policies", description=NAIK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    naik.add_argument("--seeds", type=int, default=5, help="independent runs per policy and rate (default 5)")
    naik.add_argument("--departures", type=int, default=40_000, help="departures per run (default 40000)")
    naik.add_argument("--warmup", type=int, default=4_000, help="first departures of a run left out (4000)")
    naik.add_argument("--transient-seeds", type=int, default=10, help="sample paths of the transient (10)")
    naik.add_argument(
        "--rates", help="comma-separated arrival rates, jobs/s (default 0.001 to 0.009 by 0.001)"
    )
    _common(naik, "results/sim-naik")
    naik.set_defaults(func=command_naik)


def _common(parser: argparse.ArgumentParser, directory: str) -> None:
    parser.add_argument(
        "-j", "--jobs", type=int, default=None, help="runs at once (default: this machine's CPUs)"
    )
    parser.add_argument(
        "--dir", type=Path, default=Path(directory), help=f"where the report goes ({directory})"
    )


def _workers(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise ValueError("-j: at least 1")
    return int(args.jobs or len(os.sched_getaffinity(0)))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _write(directory: Path, data: dict[str, Any], text: str, draw: Any, what: str) -> None:
    from storm.tools.sim.report import dump_json

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "report.json", "w", encoding="utf-8") as stream:
        dump_json(data, stream)
    (directory / "report.md").write_text(text, encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is not None:
        draw(data, str(directory / "report.png"))
    else:
        print(f"storm sim reproduce {what}: no matplotlib, so no report.png", file=sys.stderr)
    sys.stdout.write(text)


def lsf_command_line(args: argparse.Namespace, workers: int) -> str:
    parts = ["storm sim reproduce lsf", f"-j {workers}", f"--dir {args.dir}", f"--seeds {args.seeds}",
             f"--rate {args.rate:g}", f"--quantum {args.quantum:g}"]  # fmt: skip
    if args.disciplines:
        parts.append(f"--disciplines {args.disciplines}")
    if args.no_rates:
        parts.append("--no-rates")
    return " ".join(parts)


def command_lsf(args: argparse.Namespace) -> int:
    import dataclasses

    from storm.tools.sim.allocation import lsf_report, lsf_reproduce
    from storm.tools.sim.allocation.lsf_cluster import EVENT_ORDER, Costs
    from storm.tools.sim.allocation.lsf_workload import LsfWorkload, assumptions
    from storm.tools.sim.report import storm_version

    if args.seeds < 1 or args.rate <= 0 or args.quantum <= 0:
        raise ValueError("--seeds at least 1; --rate and --quantum positive")
    names = args.disciplines.split(",") if args.disciplines else list(lsf_reproduce.DISCIPLINES)
    workers = _workers(args)
    setup = lsf_reproduce.Setup(
        seeds=tuple(range(args.seeds)),
        workload=LsfWorkload(rate=1 / args.rate),
        costs=Costs(quantum_s=args.quantum),
    )
    rates = () if args.no_rates else lsf_reproduce.SENSITIVITY_RATES
    began = time.monotonic()
    runs, swept = lsf_reproduce.run_all(
        setup, names, lsf_reproduce.KNOWLEDGE, rates=rates, workers=workers, say=_say
    )
    wall = time.monotonic() - began
    cells = lsf_reproduce.cells(runs)
    label = f"1/{args.rate:g}"
    by_rate = lsf_reproduce.by_rate(swept)
    if all(d in cells for d in lsf_reproduce.HEADLINE):
        by_rate[label] = {d: cells[d]["none"] for d in lsf_reproduce.HEADLINE}
    by_rate = dict(sorted(by_rate.items(), key=lambda item: float(item[0].split("/")[1])))
    costs = setup.costs
    data: dict[str, Any] = {
        "format": "storm-sim-reproduce-lsf/1",
        "command": lsf_command_line(args, workers),
        "storm_version": storm_version(),
        "setup": dataclasses.asdict(setup),
        "seeds_text": f"0-{args.seeds - 1}" if args.seeds > 1 else "0",
        "event_order": EVENT_ORDER,
        "workers": workers,
        "horizon_s": setup.horizon_s,
        "rate_label": label,
        "intro": (
            f"{len(names)} disciplines x 4 knowledge cases x {args.seeds} job streams of "
            f"{setup.workload.tagged} "
            "tagged jobs each (jobs keep arriving until the tagged ones have left), on 16 workstations "
            "counted "
            "as 8 processors each, every decision through the discipline's code with LSF's costs. RTC-AD, "
            "RTC-ADSUBSET, PREEMPT and AP-style sizing call storm-mm's own functions (mm/moldable.py, "
            "mm/preemption.py); MIG and MALL checkpoint or resize running jobs, which needs the "
            "application's "
            "cooperation: they exist only in the simulator."
        ),
        "assumptions": [
            *assumptions(setup.workload),
            f"Costs: dispatch {costs.dispatch_s:g} s for every start and restart (the paper's 'up to thirty "
            f"seconds'), processors held {costs.checkpoint_hold_s:g} s per checkpoint ('more than a "
            "minute'), "
            f"decisions at least {costs.decision_floor_s:g} s apart, minimum runs "
            f"{costs.simple_min_run_s:g} s "
            f"(PREEMPT) and {costs.migrate_min_run_s:g} s (MIG, MALL), at most {costs.max_processes} "
            "processes "
            "per workstation. Suspending and resuming cost nothing; a checkpoint keeps all work done.",
            f"Quantum: {costs.quantum_s:g} s (the paper gives none; 300 s and 600 s move MIG's and MALL-AD's "
            "mean response by less than 3%).",
            "PREEMPT's thresholds: without demand knowledge X must have acquired < 50% of R's processor "
            "time; "
            "with it, X's remaining demand must be < 90% of R's ('10% less'; the other reading, < 10%, "
            "preempts far less). Remaining demand = demand x the share left when speedup is known too, else "
            "demand - acquired processor time (as if every processor did work).",
            "Multilevel feedback (no demand knowledge) orders by acquired processor time, then arrival. A "
            "new "
            "job takes the units with the fewest suspended processes first (then the lowest numbered).",
            "MALL-AD's resizing costs what a migration costs (a checkpoint, then a dispatch); the paper's "
            "'10% "
            "re-allocation overhead' is not modelled apart from that.",
        ],
        "cells": cells,
        "rates": by_rate,
        "counts": {
            d: {
                name: statistics.fmean(
                    r["counts"][name] for r in runs if r["discipline"] == d and r["knowledge"] == "none"
                )
                for name in ("checkpoints", "suspensions", "starts")
            }
            for d in names
        },
        "bound_mean": statistics.fmean(
            r["makespan_bound"] for r in runs if r["discipline"] == names[0] and r["knowledge"] == "none"
        ),
        "paper": lsf_reproduce.PAPER,
        "runs": runs,
        "rate_runs": swept,
        "wall": {"seconds": wall},
    }
    data["claims"] = (
        lsf_report.claims(cells, by_rate, runs) if set(lsf_reproduce.HEADLINE) <= set(cells) else []
    )
    data["notes"] = lsf_report.notes(cells, runs)
    text = lsf_report.markdown(data)
    _write(args.dir, data, text, lsf_report.plot, "lsf")
    return 0


def naik_command_line(args: argparse.Namespace, workers: int) -> str:
    line = (
        f"storm sim reproduce naik -j {workers} --dir {args.dir} --seeds {args.seeds} --departures "
        f"{args.departures} --warmup {args.warmup} --transient-seeds {args.transient_seeds}"
    )
    return line + (f" --rates {args.rates}" if args.rates else "")


def command_naik(args: argparse.Namespace) -> int:
    from storm.tools.sim.allocation import naik_report, naik_reproduce

    if args.seeds < 2 or args.transient_seeds < 1 or not 0 <= args.warmup < args.departures:
        raise ValueError(
            "--seeds at least 2 (for intervals), --transient-seeds at least 1, 0 <= --warmup < --departures"
        )
    workers = _workers(args)
    setup = naik_reproduce.Setup(
        seeds=args.seeds, departures=args.departures, warmup=args.warmup, transient_seeds=args.transient_seeds
    )
    rates: tuple[float, ...] = naik_reproduce.RATES
    if args.rates:
        try:
            rates = tuple(float(x) for x in args.rates.split(","))
        except ValueError:
            raise ValueError(f"--rates: comma-separated numbers, not {args.rates!r}") from None
        if min(rates) <= 0:
            raise ValueError("--rates: positive numbers")
    began = time.monotonic()
    runs = naik_reproduce.run_all(setup, rates=rates, workers=workers, say=_say)
    wall = time.monotonic() - began
    data = naik_report.build(setup, runs, naik_command_line(args, workers), workers, wall)
    text = naik_report.markdown(data)
    _write(args.dir, data, text, naik_report.plot, "naik")
    return 0
