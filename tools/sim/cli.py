"""``storm sim run | sweep | generate | compare | dynamic | scenarios | bluegene | reproduce``: the
simulator's command line (``storm sim run --help``).

``point`` is not listed: it is what each job of ``storm sim sweep --submit`` runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storm.tools.sim.engine import (
    CORES,
    MIGRATION_POLICIES,
    POLICIES,
    Machine,
    Progress,
    backfill_of,
    parse_machine,
    simulate,
)
from storm.tools.sim.lublin import MIXES, generate
from storm.tools.sim.metrics import job_rows
from storm.tools.sim.report import (
    MissingExtra,
    dump_json,
    manifest,
    markdown_run,
    plot_run,
    require_matplotlib,
    result_json,
    write_csv,
)
from storm.tools.sim.swf import (
    SwfError,
    Workload,
    file_sha256,
    machine_from_header,
    read_swf,
    save_swf,
    scale_load,
    to_workload,
)

if TYPE_CHECKING:
    from storm.tools.sim.sweep import Point
    from storm.tools.sim.sweep_jobs import Outcome


class SimUsageError(ValueError):
    pass


MIGRATION_NOTE = (
    "simulator only: the BlueGene/L paper's migration (FN_tor >= 0.1, FN_max <= 0.7) moves running jobs, "
    "which storm cannot do to a running MPI job (it has no checkpointing); each job moved stops for the "
    "migration cost"
)


def _machine(args: argparse.Namespace, header: tuple[int, int] | None) -> Machine:
    if getattr(args, "machine", None):
        if args.nodes is not None or args.pes_per_node is not None:
            raise SimUsageError("--machine or --nodes/--pes-per-node, not both")
        return parse_machine(args.machine)
    nodes, pes = args.nodes, args.pes_per_node
    if nodes is None and pes is None:
        if header is None:
            raise SimUsageError(
                "the trace's header has no MaxNodes/MaxProcs: give --nodes and --pes-per-node"
            )
        nodes, pes = header
    elif nodes is None:
        raise SimUsageError("--pes-per-node needs --nodes")
    pes = pes or 1
    if nodes < 1 or pes < 1:
        raise SimUsageError("--nodes and --pes-per-node must be at least 1")
    return Machine(nodes, pes)


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    # Positional, or --trace as the issue and Batsim-style tools spell it; one of the two is required.
    parser.add_argument("trace", nargs="?", help="an SWF file (or --trace FILE)")
    parser.add_argument("--trace", dest="trace_option", metavar="FILE", help="an SWF file")
    parser.add_argument("--nodes", type=int, help="nodes (default: the trace's MaxNodes)")
    parser.add_argument("--pes-per-node", type=int, help="PEs per node (default: MaxProcs / MaxNodes)")
    parser.add_argument(
        "--estimate",
        default="runtime",
        help="limit of jobs without a requested time: runtime (exact, the default) or xK (K x runtime)",
    )
    parser.add_argument("--jobs", type=int, help="simulate only the first N jobs")


def _trace_path(args: argparse.Namespace) -> str:
    if args.trace and args.trace_option and args.trace != args.trace_option:
        raise SimUsageError(f"two traces given: {args.trace} and --trace {args.trace_option}")
    path: str | None = args.trace or args.trace_option
    if not path:
        raise SimUsageError("no trace: give an SWF file (storm sim generate makes one)")
    args.trace = path
    return path


def _load(args: argparse.Namespace) -> tuple[Machine, Workload, str]:
    trace = read_swf(_trace_path(args))
    machine = _machine(args, machine_from_header(trace))
    workload = to_workload(trace.records, machine.pes, args.estimate)
    if args.jobs is not None:
        workload.jobs = workload.jobs[: args.jobs]
    return machine, workload, file_sha256(args.trace)


def cmd_run(args: argparse.Namespace) -> int:
    if args.png:
        require_matplotlib()
    machine, workload, sha = _load(args)
    backfill, migrates = backfill_of(args.policy, machine)
    scaled = scale_load(workload, args.compress, args.stretch)
    show = args.progress or sys.stderr.isatty()
    progress = Progress(len(scaled.jobs)) if show else None
    result = simulate(
        scaled, machine, args.policy, args.seed, progress, core=args.core, migration_cost=args.migration_cost
    )
    rows = job_rows(result.outcomes)
    extra: dict[str, object] = {
        "policy": args.policy, "backfill": backfill, "mpl": 1, "first_jobs": args.jobs, "core": args.core,
    }  # fmt: skip
    if machine.torus is not None:
        extra["torus"] = list(machine.torus)
    if migrates:
        extra["migration"] = MIGRATION_NOTE
        extra["migration_cost_s"] = args.migration_cost
    m = manifest(
        scaled, source=str(args.trace), sha256=sha, seed=args.seed,
        machine=(machine.nodes, machine.pes_per_node), extra=extra,
    )  # fmt: skip
    data = result_json(result, m, rows)
    sys.stdout.write(markdown_run(data))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            dump_json(data, stream)
    if args.csv:
        write_csv(rows, args.csv)
    if args.png:
        plot_run(rows, args.png, f"{Path(args.trace).name}, {args.policy}, load {m['offered_load']:.2f}")
    return 0


def _floats(text: str, what: str) -> list[float]:
    values = [float(x) for x in text.split(",")]
    if not all(v > 0 for v in values):
        raise SimUsageError(f"{what} must be positive")
    return values


def cmd_sweep(args: argparse.Namespace) -> int:
    from storm.tools.sim import sweep

    if args.png:
        require_matplotlib()
    if not args.submit and (args.mm or args.results or args.time):
        raise SimUsageError("--mm, --results and --time go with --submit")
    if args.submit and args.workers:
        raise SimUsageError("--workers: with --submit the cluster runs the points")
    machine, workload, sha = _load(args)
    loads = _floats(args.loads, "--loads")
    seeds = [int(x) for x in args.seeds.split(",")]
    policies = args.policies.split(",")
    for policy in policies:
        if policy not in POLICIES:
            raise SimUsageError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    failures: list[dict[str, object]] = []
    if args.submit:
        from storm.tools.sim import sweep_jobs  # only here: it needs zmq, which the point's jobs do not

        try:
            outcome = _submit_sweep(args, machine, sha, sweep.points(policies, loads, seeds))
        except sweep_jobs.SubmitError as exc:  # the cluster, not the command line: 1, as `storm` commands
            print(f"storm sim sweep: {exc}", file=sys.stderr)
            return 1
        results = outcome.results
        failures = [f.to_json() for f in outcome.failures]
    else:
        results = sweep.run_sweep(
            workload, machine, policies, loads, seeds, scale=args.scale, workers=args.workers
        )
    m = manifest(
        workload, source=str(args.trace), sha256=sha, seed=seeds[0],
        machine=(machine.nodes, machine.pes_per_node),
        extra={"seeds": seeds, "policies": policies, "loads": loads, "scale": args.scale,
               "first_jobs": args.jobs,
               "saturation_rule": f"mean bounded slowdown > {sweep.SATURATION_BSLD:g}"},
    )  # fmt: skip
    text = sweep.markdown(results)
    sys.stdout.write(text)
    if args.json:
        data = {"manifest": m, "runs": results, "curves": sweep.curves(results)}
        if failures:  # only then: a clean submitted sweep writes what a local one writes
            data["failed"] = failures
        with open(args.json, "w", encoding="utf-8") as stream:
            dump_json(data, stream)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    if args.png:
        sweep.plot(results, args.png, f"{Path(args.trace).name}, {machine.pes} PEs")
    if args.submit:
        return _report_submitted(outcome)
    return 0


def _submit_sweep(args: argparse.Namespace, machine: Machine, sha: str, points: list[Point]) -> Outcome:
    from storm.tools.cli import parse_time_limit
    from storm.tools.sim import sweep_jobs

    time_limit = parse_time_limit(args.time) if args.time else None
    directory, temporary = sweep_jobs.results_directory(args.results, [args.json, args.markdown, args.png])
    inputs = sweep_jobs.SweepInputs(
        trace=str(Path(args.trace).absolute()), sha256=sha, machine=machine, estimate=args.estimate,
        first_jobs=args.jobs, scale=args.scale,
    )  # fmt: skip
    try:
        outcome = sweep_jobs.submit_sweep(inputs, points, directory, endpoint=args.mm, time_limit=time_limit)
    except BaseException:
        if temporary and not any(directory.iterdir()):
            directory.rmdir()
        raise
    if temporary and not outcome.failures:
        sweep_jobs.remove_directory(directory)  # every point gave its result: nothing there to look at
    return outcome


def _report_submitted(outcome: Outcome) -> int:
    if not outcome.failures:
        return 0
    lines = [f"storm sim sweep: {len(outcome.failures)} point(s) gave no result:"]
    lines += [f"  {failure.line()}" for failure in outcome.failures]
    lines.append(f"  (the results directory {outcome.directory} is kept)")
    print("\n".join(lines), file=sys.stderr)
    return 1


def cmd_point(args: argparse.Namespace) -> int:
    """One point of a submitted sweep, in its job (``python -m storm.tools.sim.cli point``)."""
    from storm.tools.sim import sweep

    machine, workload, sha = _load(args)
    if sha != args.sha256:
        raise SimUsageError(
            f"{args.trace} here is not the trace the sweep read (sha256 {sha[:12]}..., not "
            f"{args.sha256[:12]}...): it changed since, or this node sees another file at that path"
        )
    result = sweep.run_point(workload, machine, sweep.Point(args.policy, args.load, args.seed), args.scale)
    sweep.write_point(Path(args.out), result, sha)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    trace = generate(args.jobs, args.nodes, args.seed, args.mix)
    save_swf(trace, args.output)
    print(
        f"{args.jobs} jobs of the Lublin-Feitelson model ({args.mix}) for {args.nodes} nodes, "
        f"seed {args.seed}: {args.output}"
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from storm.tools.sim import compare

    machine = Machine(args.nodes, args.pes_per_node)
    if machine.nodes < 1 or machine.pes_per_node < 1:
        raise SimUsageError("--nodes and --pes-per-node must be at least 1")
    if args.trace:
        records = read_swf(args.trace).records
        workload = to_workload(records, machine.pes)
        if args.jobs is not None:
            workload.jobs = workload.jobs[: args.jobs]
    else:
        count = 16 if args.jobs is None else args.jobs
        records = compare.generated(
            count, machine, args.seed, scale=args.scale, grace=args.grace, gap=args.gap
        )
        workload = to_workload(records, machine.pes)
    work = compare.scaled(workload, args.scale, args.grace)
    directory = Path(args.dir) if args.dir else None
    result = compare.compare(
        work, machine, args.policy, scale=args.scale, grace=args.grace, directory=directory
    )
    sys.stdout.write(compare.markdown(result))
    if args.json:
        data = compare.to_json(result)
        data["workload"] = (
            str(args.trace) if args.trace else f"generated: {len(work.jobs)} jobs, seed {args.seed}"
        )
        with open(args.json, "w", encoding="utf-8") as stream:
            dump_json(data, stream)
    return 0 if result.order_matches else 1


def _add_sweep(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="policies x offered loads x seeds, in parallel, with curves")
    _add_workload_options(sw)
    sw.add_argument(
        "--policies", default="fcfs,easy,conservative", help="comma-separated (default all three)"
    )
    sw.add_argument("--loads", default="0.5,0.6,0.7,0.8,0.9,1.0", help="offered loads (comma-separated)")
    sw.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    sw.add_argument(
        "--scale", choices=("arrivals", "runtimes"), default="arrivals", help="how load is raised"
    )
    sw.add_argument("--workers", type=int, help="processes (default: this machine's CPUs)")
    sw.add_argument("--json", help="write every run and the curves here")
    sw.add_argument("--markdown", help="write the table here too")
    sw.add_argument("--png", help="draw the curves here (needs matplotlib)")
    cluster = sw.add_argument_group(
        "on a storm cluster",
        "--submit runs each point as a 1-rank storm job (this Python, `-m storm.tools.sim.cli point`) and "
        "collects the points as their jobs end; the table, --json and --png are what a local sweep writes. "
        "The nodes must see this Python, the trace and the results directory at the same paths as here: a "
        "shared filesystem (a local cluster shares this machine's). A point whose job fails is listed with "
        "its job id, state and stderr file, and the sweep exits 1 after writing the others; Ctrl-C cancels "
        "the jobs it submitted.",
    )
    cluster.add_argument("--submit", action="store_true", help="run the points as jobs on a storm cluster")
    cluster.add_argument(
        "--mm", metavar="ENDPOINT",
        help="storm-mm client endpoint (default: $STORM_MM, the local cluster in $STORM_LOCAL_DIR or "
        "~/.local/state/storm/local, /etc/storm/storm.toml)",
    )  # fmt: skip
    cluster.add_argument(
        "--results", metavar="DIR",
        help="where the jobs write each point's JSON and stderr (default: NAME.points beside --json, "
        "--markdown or --png; else a storm-sweep-* directory here, removed if every point succeeds)",
    )  # fmt: skip
    cluster.add_argument(
        "--time", help="each point job's time limit (storm submit's formats: 30s, 5m, 1:00:00)"
    )
    sw.set_defaults(func=cmd_sweep)


def _add_point(sub: Any) -> None:
    # Not listed: what each job of `sweep --submit` runs (python -m storm.tools.sim.cli point ...).
    pt = sub.add_parser("point", description="One point of `storm sim sweep --submit`, run in its job.")
    _add_workload_options(pt)
    pt.add_argument("--sha256", required=True, help="the trace's sha256 as the sweep read it")
    pt.add_argument("--policy", choices=tuple(POLICIES), required=True)
    pt.add_argument("--load", type=float, required=True, help="target offered load")
    pt.add_argument("--seed", type=int, required=True)
    pt.add_argument("--scale", choices=("arrivals", "runtimes"), required=True)
    pt.add_argument("--out", required=True, help="write the point's JSON here")
    pt.set_defaults(func=cmd_point)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="storm sim", description="Simulate storm-mm on a workload trace.")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="one simulated run of an SWF trace")
    _add_workload_options(run)
    run.add_argument(
        "--machine", metavar="torus:XxYxZ",
        help="the machine instead of --nodes: torus:XxYxZ (a job holds a box of nodes, as on BlueGene/L: "
        "torus:4x4x8 is its 128 supernodes) or flat:N",
    )  # fmt: skip
    run.add_argument(
        "--policy", choices=(*POLICIES, *MIGRATION_POLICIES), default="easy",
        help="batch scheduling (default easy); on a torus also migration and easy+migration (the paper's "
        "Migration and B+M, simulator only)",
    )  # fmt: skip
    run.add_argument(
        "--migration-cost", type=float, default=0.0, metavar="SECONDS",
        help="how long a migrated job stops (default 0, as the paper)",
    )  # fmt: skip
    run.add_argument("--seed", type=int, default=0, help="the MM core's nonces (--core mm; default 0)")
    run.add_argument(
        "--core", choices=CORES, default="scheduler",
        help="what of storm-mm runs: its scheduling state and passes (default, fast), or the whole MM core "
        "with simulated node managers (mm); both decide the same",
    )  # fmt: skip
    run.add_argument("--compress", type=float, default=1.0, help="divide arrival times by this (default 1)")
    run.add_argument(
        "--stretch", type=float, default=1.0, help="multiply runtimes and limits by this (default 1)"
    )
    run.add_argument("--json", help="write every figure and the manifest here")
    run.add_argument("--csv", help="write one line per job here")
    run.add_argument("--png", help="plot waits and the slowdown CDF here (needs matplotlib)")
    run.add_argument(
        "--progress", action="store_true", help="progress bar even when stderr is not a terminal"
    )
    run.set_defaults(func=cmd_run)
    _add_sweep(sub)
    _add_point(sub)
    ge = sub.add_parser("generate", help="a synthetic SWF trace from a workload model")
    ge.add_argument("--model", choices=("lublin",), default="lublin")
    ge.add_argument(
        "--mix", choices=MIXES, default="typed", help="typed: interactive + batch; whole: one fit"
    )
    ge.add_argument("--jobs", type=int, required=True)
    ge.add_argument("--nodes", type=int, required=True, help="machine size the sizes are drawn for")
    ge.add_argument("--seed", type=int, default=0)
    ge.add_argument("-o", "--output", required=True)
    ge.set_defaults(func=cmd_generate)
    co = sub.add_parser(
        "compare",
        help="one workload through storm sim and through a real local cluster: start order and times",
        description="Run a workload both ways (see tools/sim/compare.py for the rules); exit 1 if the start "
        "orders differ.",
    )
    co.add_argument(
        "trace", nargs="?", help="an SWF file (default: a generated workload, see --jobs, --seed)"
    )
    co.add_argument("--nodes", type=int, default=4, help="nodes (default 4)")
    co.add_argument("--pes-per-node", type=int, default=1, help="PEs per node (default 1)")
    co.add_argument(
        "--policy", choices=tuple(POLICIES), default="easy", help="batch scheduling (default easy)"
    )
    co.add_argument("--jobs", type=int, help="jobs to generate (default 16), or the trace's first N")
    co.add_argument("--seed", type=int, default=0, help="seed of the generated workload (default 0)")
    co.add_argument("--scale", type=float, default=0.01, help="live seconds per trace second (default 0.01)")
    co.add_argument(
        "--grace", type=float, default=2.0, help="time limit = scaled runtime + this, live s (default 2)"
    )
    co.add_argument(
        "--gap", type=float, default=0.5,
        help="generated workloads: least live seconds between two arrivals/ends (default 0.5)",
    )  # fmt: skip
    co.add_argument("--dir", help="the local cluster's directory (default: a temporary one, removed)")
    co.add_argument("--json", help="write every job's times and the summary here")
    co.set_defaults(func=cmd_compare)
    from storm.tools.sim.bluegene_cli import add_parser as add_bluegene
    from storm.tools.sim.cosched.dynamic_cli import add_parser as add_dynamic

    add_dynamic(sub)
    add_bluegene(sub)
    from storm.tools.sim.allocation.reproduce_cli import add_parser as add_reproduce

    add_reproduce(sub)
    sub.add_parser(
        "scenarios",
        help="the FCS paper's scenarios under batch, gang, sb and fcs through storm's cores over the node "
        "model, beside the live results (options: storm sim scenarios --help)",
        add_help=False,
    )
    sub.add_parser(
        "clusterschedsim",
        help="ClusterSchedSim's case studies: GS, space sharing and dynamic coscheduling (SB, DCS, PB, "
        "DCS-SB, PB-SB) under Table 1's costs (options: storm sim clusterschedsim --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["scenarios"]:  # its own options (tools/sim/cosched/scenarios.py)
        from storm.tools.sim.cosched.scenarios import main as scenarios_main

        return scenarios_main(given[1:])
    if given[:1] == ["clusterschedsim"]:  # its own options (tools/sim/cosched/clusterschedsim.py)
        from storm.tools.sim.cosched.clusterschedsim import main as clusterschedsim_main

        return clusterschedsim_main(given[1:])
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except (SimUsageError, SwfError, MissingExtra, ValueError, OSError) as exc:
        print(f"storm sim {args.cmd}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
