"""``python -m storm.tools.bench_sim``: how fast ``storm sim`` simulates, in jobs per second.

Runs each policy on a trace (``--trace``, repeatable) or, when none is given, on a generated Lublin-Feitelson
workload (tools/sim/lublin.py), and prints one line per run: jobs, wall seconds and CPU seconds of the
engine's run (parsing and reports left out), and jobs per second by each, the best of ``--repeat`` runs.
The machine shares its cores with whatever else runs: CPU time is the steadier figure when it is busy.

``--nodes-as-given`` simulates the trace's nodes rather than merging them (tools/sim/engine.py); it is
ignored by a storm whose engine cannot merge nodes, so that the same script measures an older checkout
(``PYTHONPATH=<a tree with storm/ in it> python tools/bench_sim.py``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from storm.tools.sim.engine import POLICIES, Machine, simulate
from storm.tools.sim.lublin import generate
from storm.tools.sim.swf import Workload, machine_from_header, read_swf, to_workload


def _workloads(args: argparse.Namespace) -> list[tuple[str, Machine, Workload]]:
    loads = []
    for trace in args.trace or []:
        parsed = read_swf(trace)
        header = machine_from_header(parsed)
        if header is None:
            raise SystemExit(f"{trace}: the header has no MaxNodes/MaxProcs")
        machine = Machine(*header)
        loads.append((Path(trace).name, machine, to_workload(parsed.records, machine.pes, args.estimate)))
    if not loads:
        machine = Machine(args.lublin_nodes, 1)
        generated = generate(args.lublin_jobs, machine.nodes, args.seed)
        name = f"lublin-{args.lublin_jobs}x{machine.nodes}-seed{args.seed}"
        loads.append((name, machine, to_workload(generated.records, machine.pes, args.estimate)))
    if args.jobs is not None:
        for _, _, load in loads:
            load.jobs = load.jobs[: args.jobs]
    return loads


def measure(
    load: Workload, machine: Machine, policy: str, repeat: int, *, as_given: bool, core: str
) -> dict[str, Any]:
    """The best wall and CPU time of ``repeat`` runs of the engine."""
    parameters = inspect.signature(simulate).parameters
    options: dict[str, Any] = {"merge_nodes": not as_given} if "merge_nodes" in parameters else {}
    if "core" in parameters:
        options["core"] = core
    walls, cpus = [], []
    for _ in range(repeat):
        cpu = time.process_time()
        result = simulate(load, machine, policy, **options)
        cpus.append(time.process_time() - cpu)
        walls.append(result.wall_seconds)
    simulated = getattr(result, "simulated", None) or machine
    jobs = len(load.jobs)
    return {
        "policy": policy,
        "core": core if "core" in parameters else "mm",
        "jobs": jobs,
        "machine": [machine.nodes, machine.pes_per_node],
        "simulated_as": [simulated.nodes, simulated.pes_per_node],
        "wall_s": min(walls),
        "cpu_s": min(cpus),
        "jobs_per_s_wall": jobs / min(walls),
        "jobs_per_s_cpu": jobs / max(min(cpus), 1e-9),
        "passes": result.passes,
    }


def _ratios(lines: list[dict[str, Any]], first: str, second: str) -> None:
    """CPU jobs/s of core ``first`` over ``second``, per workload and policy: measured in this one run."""
    rate = {(x["workload"], x["policy"], x["core"]): x["jobs_per_s_cpu"] for x in lines}
    print(f"\n| workload | policy | {first} / {second} (CPU jobs/s) |\n| --- | --- | --- |")
    for workload, policy, core in rate:
        if core == first and (workload, policy, second) in rate:
            ratio = rate[(workload, policy, first)] / rate[(workload, policy, second)]
            print(f"| {workload} | {policy} | {ratio:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_sim", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", action="append", help="an SWF trace (repeatable; default: Lublin)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (default all)")
    parser.add_argument("--jobs", type=int, help="only the first N jobs of each workload")
    parser.add_argument("--estimate", default="runtime", help="as storm sim run --estimate")
    parser.add_argument("--repeat", type=int, default=1, help="runs per line, the best is kept")
    parser.add_argument("--nodes-as-given", action="store_true", help="do not merge nodes")
    parser.add_argument(
        "--cores", default="scheduler,mm", help="simulate(core=...) to compare (default both; see engine.py)"
    )
    parser.add_argument("--lublin-jobs", type=int, default=5000)
    parser.add_argument("--lublin-nodes", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="of the Lublin workload")
    parser.add_argument("--json", help="write the lines here too")
    args = parser.parse_args(argv)
    lines = []
    cores = args.cores.split(",")
    print(
        "| workload | policy | core | jobs | simulated as | wall s | CPU s | jobs/s (wall) | jobs/s (CPU) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, machine, load in _workloads(args):
        for policy in args.policies.split(","):
            for core in cores:
                measured = measure(
                    load, machine, policy, args.repeat, as_given=args.nodes_as_given, core=core
                )
                line = {"workload": name, **measured}
                lines.append(line)
                shape = "{} x {}".format(*line["simulated_as"])
                print(
                    f"| {name} | {policy} | {line['core']} | {line['jobs']} | {shape} | "
                    f"{line['wall_s']:.2f} | {line['cpu_s']:.2f} | "
                    f"{line['jobs_per_s_wall']:,.0f} | {line['jobs_per_s_cpu']:,.0f} |",
                    flush=True,
                )
    if len(cores) == 2:
        _ratios(lines, *cores)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(
                {"python": platform.python_version(), "argv": sys.argv, "runs": lines}, stream, indent=1
            )
            stream.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
