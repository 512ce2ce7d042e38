"""Benchmark: mpi4py's own test suite under storm's policies against plain mpiexec, test by test.

``storm bench mpi4py [options]`` (``python -m storm.tools.bench_mpi4py``) fetches the source release of the
installed mpi4py once (tools/mpi4py_suite.py says where it keeps it; ``$STORM_MPI4PY_SRC`` names an unpacked
tree instead) and runs its test modules (all of them, or those ``--modules`` regexes find), each module on
its own with a time limit:

- under ``mpiexec -n N`` on this machine: the baseline, and what each module's time limit under storm is
  measured from (``--factor`` times its mpiexec time, at least ``--min-limit`` seconds);
- as N-rank storm jobs on a fresh local cluster per policy and rank count (two node managers, N/2 PEs each,
  so that ranks both share and span node managers), ``--in-flight`` jobs at a time under the time-sharing
  policies (MPL ``--mpl``), one at a time under batch.

It prints per run (launcher x ranks) the tests run, passed, failed, errors, skipped, regressions against
mpiexec (passed or skipped there, not under storm), hung and crashed modules and the wall time, then every
regression and hang; ``--json`` keeps every test's outcome of every run, ``--markdown`` writes the tables.
The exit status is 0 when no regression and no new hang or crash was found, 1 otherwise, 2 when the suite
cannot be had.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from storm.mm.protocol import POLICIES, Policy
from storm.tools import mpi4py_compare as compare
from storm.tools import mpi4py_suite as suite
from storm.tools.mpi4py_suite import Suite, SuiteRun, SuiteUnavailable

DEFAULT_POLICIES = (Policy.BATCH, Policy.GANG, Policy.FCS)
Json = dict[str, Any]


def row(baseline: SuiteRun, run: SuiteRun) -> Json:
    """One line of the table: counts of ``run``'s tests and what went worse than under ``baseline``."""
    counts = run.counts()
    regressions = compare.regressions(baseline, run) if run is not baseline else []
    return {
        "launcher": run.launcher,
        "ranks": run.ranks,
        "modules": len(run.modules),
        "tests": sum(counts.values()),
        "passed": counts["pass"],
        "failed": counts["fail"],
        "errors": counts["error"],
        "skipped": counts["skip"],
        "not_run": counts["missing"] + counts["crash"] + counts["hang"],
        "regressions": len(regressions),
        "hung": run.hung(),
        "crashed": run.crashed(),
        "seconds": run.seconds,
    }


HEAD = (
    "run",
    "ranks",
    "tests",
    "passed",
    "failed",
    "errors",
    "skipped",
    "not run",
    "regress.",
    "hung",
    "wall s",
)


def cells(r: Json) -> list[str]:
    hung = ",".join(m.removeprefix("test_") for m in r["hung"] + r["crashed"]) or "-"
    keys = ("tests", "passed", "failed", "errors", "skipped", "not_run", "regressions")
    return [r["launcher"], str(r["ranks"]), *(str(r[k]) for k in keys), hung, f"{r['seconds']:.0f}"]


def text_table(rows: list[Json]) -> str:
    table = [list(HEAD), *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEAD))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in table
    )


def markdown(result: Json) -> str:
    p = result["parameters"]
    lines = [
        f"mpi4py {p['mpi4py']} test suite ({len(p['modules'])} modules), each module alone with a time "
        f"limit; storm: 2 node managers x ranks/2 PEs, MPL {p['mpl']}, {p['in_flight']} job(s) in flight "
        f"under gang and fcs; limits {p['factor']:g} x the mpiexec time, at least {p['min_limit']:g} s. "
        f'"hung" lists modules that hung or crashed.',
        "",
        "| " + " | ".join(HEAD) + " |",
        "|---|" + "---:|" * (len(HEAD) - 2) + "---:|",
    ]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in result["table"]]
    for name, text in result["reports"].items():
        if text:
            lines += ["", f"### {name}", "", "```", text, "```"]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace, source: Path, work: Path) -> Json:
    started = time.time()
    runner = Suite(source, work)
    modules = suite.select_modules(runner.modules(), args.modules or [])
    baselines: dict[int, SuiteRun] = {}
    runs: list[SuiteRun] = []
    for ranks in args.ranks:
        print(f"mpiexec -n {ranks}: {len(modules)} modules", flush=True)
        baselines[ranks] = runner.mpiexec(modules, ranks, args.mpiexec_limit, log=True)
        runs.append(baselines[ranks])
    for policy in args.policies:
        for ranks in args.ranks:
            limits = suite.storm_limits(baselines[ranks], args.factor, args.min_limit, args.mpiexec_limit)
            in_flight = 1 if policy == Policy.BATCH else args.in_flight
            print(f"storm {policy}, {ranks} ranks: {len(modules)} modules, {in_flight} in flight", flush=True)
            directory = work / f"cluster-{policy}-{ranks}"
            with (
                suite.storm_cluster(directory, policy, ranks, mpl=args.mpl) as cluster,
                cluster.client() as c,
            ):
                runs.append(runner.storm(c, policy, modules, ranks, limits, in_flight=in_flight, log=True))
    table = [row(baselines[r.ranks], r) for r in runs]
    reports = {
        f"{r.launcher}, {r.ranks} ranks": compare.report(baselines[r.ranks], r)
        for r in runs
        if r.launcher != "mpiexec"
    }
    return {
        "parameters": {
            "mpi4py": suite.installed_version(), "source": str(source), "modules": modules,
            "ranks": args.ranks, "policies": args.policies, "mpl": args.mpl, "in_flight": args.in_flight,
            "factor": args.factor, "min_limit": args.min_limit, "mpiexec_limit": args.mpiexec_limit,
        },
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "started": started,
        "seconds": time.time() - started,
        "table": table,
        "reports": reports,
        "regressions": {
            f"{r.launcher}-{r.ranks}": [vars(x) for x in compare.regressions(baselines[r.ranks], r)]
            for r in runs
            if r.launcher != "mpiexec"
        },
        "runs": [r.to_json() for r in runs],
    }  # fmt: skip


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench mpi4py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modules",
        action="append",
        metavar="REGEX",
        help="modules to run (re.search; repeatable; default: all)",
    )
    parser.add_argument("--ranks", type=numbers, default=[2, 4], help="rank counts (default 2,4)")
    parser.add_argument(
        "--policies", default=",".join(DEFAULT_POLICIES), help="storm policies (default batch,gang,fcs)"
    )
    parser.add_argument("--mpl", type=int, default=2, help="gang and fcs multiprogramming level (default 2)")
    parser.add_argument(
        "--in-flight", type=int, default=2, help="jobs at a time under gang and fcs, time-shared (default 2)"
    )
    parser.add_argument("--factor", type=float, default=4.0, help="storm limit / mpiexec time (default 4)")
    parser.add_argument("--min-limit", type=float, default=30.0, help="shortest storm limit, s (default 30)")
    parser.add_argument("--mpiexec-limit", type=float, default=600.0, help="mpiexec limit per module, s")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--keep", type=Path, help="keep every rank's output and events in this directory")
    args = parser.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in args.policies if p not in POLICIES]
    if bad or not args.ranks or min(args.ranks) < 1 or args.mpl < 1 or args.in_flight < 1:
        parser.error(
            f"unknown policy {', '.join(bad)}" if bad else "need --ranks >= 1, --mpl and --in-flight >= 1"
        )
    try:
        source = suite.suite_source()
    except SuiteUnavailable as exc:
        print(f"storm bench mpi4py: {exc}", file=sys.stderr)
        return 2
    if args.keep:
        result = run(args, source, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="storm-mpi4py-") as tmp:
            result = run(args, source, Path(tmp))
    print("\n" + text_table(result["table"]))
    for name, text in result["reports"].items():
        if text:
            print(f"\n{name}:\n{text}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nevery outcome: {args.json}")
    failing = any(
        r["regressions"] or r["hung"] or r["crashed"] for r in result["table"] if r["launcher"] != "mpiexec"
    )
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
