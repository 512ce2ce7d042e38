"""``storm sim dynamic``: the FCS paper's dynamic experiment (its section 5, first set) in the simulator.

Only argparse is imported here, so that every ``storm sim`` command starts fast; the simulator is imported
when the command runs. The defaults are the paper's setup (:class:`dynamic_sweep.Setup`'s, which a test
holds equal to these).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

POLICIES = "batch,gang,sb,fcs"
LOADS = "0.5,0.6,0.7,0.74,0.8,0.85,0.9,0.95,1,1.1,1.2"
DEFAULTS = {
    "count": 1000, "seed": 0, "span": 7200.0, "mix": "typed", "sizes": "scale", "nodes": 16,
    "pes_per_node": 2, "mpl": 6, "slice_ms": 100.0, "granularity": "1,1000", "imbalanced": 0.5,
}  # fmt: skip
DESCRIPTION = """\
The FCS paper's dynamic experiment (section 5, first set): 1,000 Lublin-Feitelson jobs (or an SWF
trace's) as BSP programs of drawn granularity, pattern and imbalance, on 16 nodes x 2 PEs under
FCFS+EASY, gang, SB and FCS (MPL 6, 100 ms slices), swept over offered loads. Each point's JSON is
written into --dir as it ends, and a sweep run again with the same options reuses it. Writes
report.json, report.md and report.png (with matplotlib) into --dir and prints the Markdown."""
EXAMPLES = """examples:
  storm sim dynamic -j 2                                  # the paper's setup, into ./storm-sim-dynamic/
  storm sim dynamic --policies batch,fcs --loads 0.7,0.8,0.9 --dir quick
  storm sim dynamic --trace NASA-iPSC-1993-3.1-cln.swf --sizes scale --dir nasa
  storm sim dynamic --policies sb,fcs,"fcs@cslots_min=5" --loads 1,1.2 --wakeup-us 2000 --dir what-if
"""


def add_parser(sub: Any) -> None:
    """``storm sim dynamic``'s options, on the subcommand parsers of tools/sim/cli.py."""
    dy = sub.add_parser(
        "dynamic",
        help="the FCS paper's dynamic workload under batch, gang, sb and fcs over offered loads",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = DEFAULTS
    work = dy.add_argument_group("workload")
    work.add_argument("--count", type=int, default=d["count"], help="jobs in the workload (default 1000)")
    work.add_argument("--seed", type=int, default=d["seed"], help="model's and draws' seed (default 0)")
    work.add_argument(
        "--seeds", metavar="N,N,...",
        help="one sweep per seed (each in DIR/seed-N), and a report across them in DIR",
    )  # fmt: skip
    work.add_argument(
        "--span", type=float, default=d["span"],
        help="simulated seconds the arrivals span at 80%% offered load; sets the runtime scale (default "
        "7200: the paper ran its workload live, in hours)",
    )  # fmt: skip
    work.add_argument("--mix", choices=("typed", "whole"), default=d["mix"], help="Lublin model's job mix")
    work.add_argument("--trace", metavar="FILE", help="an SWF trace's jobs instead of the model's")
    work.add_argument(
        "--sizes", choices=("scale", "cap", "drop"), default=d["sizes"],
        help="--trace: a job's size times PEs / the trace's PEs (scale, the default), at most the PEs "
        "(cap), or jobs wider than the machine left out (drop, as storm sim run does)",
    )  # fmt: skip
    work.add_argument(
        "--granularity", metavar="MIN,MAX", default=d["granularity"],
        help="computation per iteration, ms, drawn log-uniform (default 1,1000)",
    )  # fmt: skip
    work.add_argument(
        "--imbalanced", type=float, default=d["imbalanced"],
        help="share of jobs whose odd ranks compute 2x per iteration (default 0.5)",
    )  # fmt: skip
    machine = dy.add_argument_group("cluster")
    machine.add_argument("--nodes", type=int, default=d["nodes"], help="default 16 (the paper's Crescendo)")
    machine.add_argument("--pes-per-node", type=int, default=d["pes_per_node"], help="default 2")
    machine.add_argument("--mpl", type=int, default=d["mpl"], help="time-sharing policies' MPL (default 6)")
    machine.add_argument("--slice-ms", type=float, default=d["slice_ms"], help="time slice (default 100)")
    machine.add_argument(
        "--wakeup-us", type=float, default=None,
        help="CPU a blocked rank needs once its message is in (default: the calibrated 500)",
    )  # fmt: skip
    sweep = dy.add_argument_group("sweep")
    sweep.add_argument(
        "--policies", default=POLICIES,
        help=f"comma-separated (default {POLICIES}); fcs@key=value;... sets [fcs] constants",
    )  # fmt: skip
    sweep.add_argument("--loads", default=LOADS, help=f"offered loads (default {LOADS})")
    sweep.add_argument(
        "-j", "--jobs", type=int, default=None, help="points run at once (default: this machine's CPUs)"
    )
    sweep.add_argument(
        "--dir", type=Path, default=Path("storm-sim-dynamic"),
        help="the points (points/*.json) and the reports go here (default ./storm-sim-dynamic)",
    )  # fmt: skip
    dy.set_defaults(func=command)


def _numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what}: comma-separated numbers, not {text!r}") from None
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"{what}: positive numbers, not {text!r}")
    return values


def setup_from(args: argparse.Namespace) -> Any:
    """The sweep's :class:`Setup` from the options; ValueError with the option's name if one is wrong."""
    from storm.tools.sim.cosched.dynamic import Draws
    from storm.tools.sim.cosched.dynamic_sweep import Setup
    from storm.tools.sim.cosched.scenarios import Calibration
    from storm.tools.sim.swf import file_sha256

    if args.count < 2:
        raise ValueError("--count: at least 2 jobs")
    if args.span <= 0 or args.slice_ms <= 0:
        raise ValueError("--span and --slice-ms must be positive")
    if args.nodes < 1 or args.pes_per_node < 1 or args.mpl < 1:
        raise ValueError("--nodes, --pes-per-node and --mpl must be at least 1")
    if args.nodes * args.pes_per_node < 2:
        raise ValueError("--nodes x --pes-per-node: at least 2 PEs (the Lublin model needs 2)")
    granularity = _numbers(args.granularity, "--granularity")
    if len(granularity) != 2 or granularity[0] > granularity[1]:
        raise ValueError(f"--granularity: MIN,MAX in ms with MIN <= MAX, not {args.granularity!r}")
    if not 0 <= args.imbalanced <= 1:
        raise ValueError("--imbalanced: a share between 0 and 1")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError("--jobs: at least 1")
    draws = Draws(granularity_min_s=granularity[0] / 1000, granularity_max_s=granularity[1] / 1000,
                  imbalanced_share=args.imbalanced)  # fmt: skip
    calibration = Calibration()
    if args.wakeup_us is not None:
        if not args.wakeup_us >= 0:
            raise ValueError("--wakeup-us: a number of microseconds, at least 0")
        calibration = dataclasses.replace(calibration, wakeup_ns=round(args.wakeup_us * 1000))
    trace = str(Path(args.trace).resolve()) if args.trace else None
    return Setup(
        count=args.count, seed=args.seed, span_s=args.span, mix=args.mix, trace=trace,
        trace_sha256=file_sha256(trace) if trace else None, sizes=args.sizes, nodes=args.nodes,
        pes_per_node=args.pes_per_node, mpl=args.mpl, slice_s=args.slice_ms / 1000, draws=draws,
        calibration=calibration,
    )  # fmt: skip


def describe(setup: Any, workload: Any) -> str:
    """The report's first paragraph: what was run, and which choices are ours."""
    d = setup.draws
    return (
        f"## storm sim dynamic\n\n{workload.source}; {setup.nodes} nodes x {setup.pes_per_node} PEs; "
        f"FCFS+EASY (MPL 1) and gang, SB, FCS at MPL {setup.mpl}, {setup.slice_s * 1000:g} ms slices, the "
        f"calibrated costs (context switch {setup.calibration.switch_ns / 1e6:g} ms, wake-up "
        f"{setup.calibration.wakeup_ns / 1e3:g} us, local slices {setup.calibration.slice_ns / 1e6:g} ms), "
        f"FCS's shipped constants. Ours, not the paper's: the runtime scale (the model's runtimes x "
        f"{workload.runtime_factor:.4g}, so that at 80% load the arrivals span {setup.span_s:g} s; mean "
        f"isolated runtime {sum(j.isolated_s for j in workload.jobs) / len(workload.jobs):.1f} s), the "
        f"granularity (log-uniform {d.granularity_min_s * 1000:g} to {d.granularity_max_s * 1000:g} ms: the "
        f"paper gives no distribution), ring / all-reduce / none with equal chances, "
        f"{d.imbalanced_share:.0%} of the jobs imbalanced (odd ranks compute {d.imbalance:g}x), requested "
        f"time = isolated runtime rounded up to a second (EASY multiplies it by the MPL). Offered load = "
        f"sum(isolated runtime x size) / (PEs x last arrival), reached by multiplying the arrival times."
    )


def command(args: argparse.Namespace) -> int:
    from storm.tools.sim.cosched import dynamic_seeds
    from storm.tools.sim.report import dump_json

    setup = setup_from(args)
    loads = _numbers(args.loads, "--loads")
    policies = [p for p in args.policies.split(",") if p]
    workers = args.jobs or len(os.sched_getaffinity(0))
    if args.seeds is None:
        sys.stdout.write(_sweep(setup, policies, loads, args.dir, workers)[0])
        return 0
    seeds = _seeds(args.seeds)
    by_seed = {}
    for seed in seeds:
        by_seed[seed] = _sweep(
            dataclasses.replace(setup, seed=seed), policies, loads, args.dir / f"seed-{seed}", workers
        )[1]
    table = dynamic_seeds.across(by_seed)
    checked = dynamic_seeds.claims(table)
    text = dynamic_seeds.markdown(table, checked, seeds)
    with open(args.dir / "report.json", "w", encoding="utf-8") as stream:
        dump_json({"seeds": seeds, "setup": setup.key(), "table": table, "claims": checked}, stream)
    (args.dir / "report.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: comma-separated integers, not {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: distinct integers, not {text!r}")
    return seeds


def _sweep(
    setup: Any, policies: list[str], loads: list[float], directory: Path, workers: int
) -> tuple[str, list[dict[str, Any]]]:
    """Run (or read back) one setup's points, write its report.json, report.md and report.png into
    ``directory``; returns the Markdown and the points."""
    from storm.tools.sim.cosched import dynamic_report, dynamic_sweep
    from storm.tools.sim.report import dump_json

    points = dynamic_sweep.run_sweep(setup, policies, loads, directory, workers=workers)
    workload = setup.workload()
    data = {
        "setup": setup.key(),
        "source": workload.source,
        **dynamic_report.report(points, {j.name: j.granularity_ns for j in workload.jobs}),
    }
    text = dynamic_report.markdown(data, describe(setup, workload))
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "report.json", "w", encoding="utf-8") as stream:
        dump_json(data, stream)
    (directory / "report.md").write_text(text, encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is not None:
        dynamic_report.plot(points, str(directory / "report.png"), workload.source)
    else:
        print("storm sim dynamic: no matplotlib, so no report.png", file=sys.stderr)
    return text, points
