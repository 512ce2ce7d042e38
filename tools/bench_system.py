"""Benchmark: storm's own costs in one place: heartbeats, switches, launch, monitoring, daemon CPU.

``storm bench system [--quick] [--parts gang,launch,hook] [--reuse DIR] [--json F] [--markdown F]`` runs
the three system benchmarks in turn, each on its own throwaway cluster or processes, in this order:

- gang (tools/bench_gang.py): heartbeat delivery latency and spread across 2, 8 (and 32) node managers,
  context-switch enactment (NM: heartbeat received to every rank in its new state; MM: sent to the same),
  the CPU the MM and the NMs use idle and while switching, and a compute-bound job's gang/batch time;
- launch (tools/bench_launch.py): a 2-rank hello, storm's submit to running and to done against
  ``mpiexec -n 2`` on the same host in the same run, and the throughput of a stream of one-rank jobs;
- hook (tools/bench_hook.py): what mpihook costs a 1 ms BSP job, ping-pong round trips with and without
  it, the CPU a rank uses waiting for a stopped peer (polling vs spin-block) and the NM's read of a record.

Each part prints its own tables; then one table of headline figures beside the goals of the issues that
set them. ``--reuse DIR`` takes a part from ``DIR/<part>.json`` (what ``storm bench <part>`` wrote)
instead of running it, so the figures of earlier runs can be collected without measuring again.
``--quick`` shortens every part (2 s windows, 2 and 8 NMs, 3 launches, 50 jobs, 2 hook runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Json = dict[str, Any]
PARTS = ("gang", "launch", "hook")


@dataclass(frozen=True)
class Figure:
    """One headline figure: where it comes from, its value, and the goal an issue set for it, if any."""

    part: str
    name: str
    value: float
    unit: str
    goal: str = ""
    met: bool | None = None

    def cell(self) -> str:
        if self.unit == "%":
            return f"{self.value:.2f} %"
        if self.unit == "x":
            return f"{self.value:.3f}x"
        return f"{self.value:.3g} {self.unit}"


def gang_figures(result: Json) -> list[Figure]:
    figures = []
    for row in result["heartbeats"]:
        if row["load"] != "idle":
            continue
        where = f"heartbeat to {row['nms']} NMs"
        spread_p99 = row["spread_ms"]["p99"]
        eight = row["nms"] == 8
        figures += [
            Figure("gang", f"{where}: latency, median", row["latency_ms"]["median"], "ms"),
            Figure("gang", f"{where}: spread, median", row["spread_ms"]["median"], "ms"),
            Figure(
                "gang", f"{where}: spread, p99", spread_p99, "ms",
                "< 1 ms at 8 NMs" if eight else "", spread_p99 < 1.0 if eight else None,
            ),
            Figure("gang", f"{where}: heartbeats skipped (a late NM takes the newest)", row["lost"], ""),
        ]  # fmt: skip
    switching = result["switching"]
    for key, label in (("nm_done_minus_received_ms", "NM"), ("mm_done_minus_sent_ms", "MM")):
        for stat in ("median", "p99"):
            figures.append(
                Figure("gang", f"switch enacted ({label} view), {stat}", switching[key][stat], "ms")
            )
    for state, cpu in result["overhead_cpu_percent"].items():
        label = state.replace("_", " ")
        figures += [
            Figure("gang", f"MM CPU, {label} (2 NMs)", cpu["mm"], "%"),
            Figure("gang", f"NM CPU, {label} (mean of 2)", cpu["nm_mean"], "%"),
        ]
    ratio = result["compute_alone"]["gang_over_batch"]
    figures.append(
        Figure("gang", "compute-bound job alone, gang / batch", ratio, "x", "<= 1.05", ratio <= 1.05)
    )
    return figures


def launch_figures(result: Json) -> list[Figure]:
    median = {name: statistics.median(values) for name, values in result["hello_2_ranks_seconds"].items()}
    ratios = result["ratios_of_medians"]
    stream = result["throughput_true_jobs"]
    hello = "2-rank hello"
    return [
        Figure("launch", f"{hello}, submit to running, median", median["storm_submit_to_running"], "s"),
        Figure("launch", f"{hello}, submit to done, median", median["storm_submit_to_done"], "s"),
        Figure("launch", f"{hello}, mpiexec, median", median["mpiexec"], "s"),
        Figure("launch", "submit to done / mpiexec", ratios["storm_done_over_mpiexec"], "x"),
        Figure("launch", "`storm submit --wait` / mpiexec", ratios["storm_cli_over_mpiexec"], "x"),
        Figure(
            "launch", f"throughput, {stream['jobs']} one-rank jobs", stream["completed_per_second"], "jobs/s"
        ),
    ]


def hook_figures(result: Json) -> list[Figure]:
    figures = [
        Figure("hook", f"1 ms BSP {job} with the hook, slowdown", 100 * o["slowdown"], "%")
        for job, o in result["overhead"].items()
    ]
    trips = result["pingpong_round_trip_ns"]
    modes = {"none": "without the hook", "poll": "hook polling", "spin-block": "hook spin-blocking"}
    figures += [
        Figure("hook", f"ping-pong round trip, {modes.get(m, m)}", ns / 1e3, "us") for m, ns in trips.items()
    ]
    for op, holds in result["stopped_peer"].items():
        for hold in holds:
            if hold["label"] in ("poll", "spin-block"):
                name = f"waiting for a stopped peer ({op}), {hold['label']}: CPU used"
                figures.append(Figure("hook", name, 100 * hold["used"], "%"))
    # Relative errors of microsecond waits say little (a balanced 1 ms job barely waits): waits of a
    # millisecond or more are judged relatively, all of them by their absolute error.
    samples = result["accuracy"]
    long_waits = [abs(s["wait_error"]) for s in samples if s["app_wait"] >= 1e-3]
    if samples:
        figures += [
            Figure(
                "hook",
                "wait per event vs the application's, worst error (waits >= 1 ms)",
                100 * max(long_waits, default=0.0),
                "%",
            ),
            Figure(
                "hook",
                "wait per event vs the application's, worst absolute error",
                1e6 * max(abs(s["hook_wait"] - s["app_wait"]) for s in samples),
                "us",
            ),
            Figure(
                "hook",
                "CPU per event vs the application's, worst error",
                100 * max(abs(s["cpu_error"]) for s in samples),
                "%",
            ),
        ]
    for read in result["read_cost"]:
        figures.append(Figure("hook", f"NM reads {read['nranks']} records", read["read_all_us"], "us"))
    return figures  # fmt: skip


FIGURES: dict[str, Callable[[Json], list[Figure]]] = {
    "gang": gang_figures,
    "launch": launch_figures,
    "hook": hook_figures,
}


def run_part(part: str, quick: bool) -> Json:
    """Run one part as ``storm bench <part>`` would, printing its tables, and return its raw figures."""
    if part == "gang":
        from storm.tools import bench_gang

        sizes = [2, 8] if quick else [2, 8, 32]
        gang = bench_gang.run(sizes, 2.0 if quick else 5.0, 1 if quick else 3, 4.0, None)
        bench_gang.print_table(gang)
        return gang
    if part == "launch":
        from storm.tools import bench_launch

        launch: Json = bench_launch.run(3 if quick else 10, 50 if quick else 200, 2, 1, None)
        bench_launch.print_table(launch)
        return launch
    from storm import mpihook
    from storm.tools import bench_hook

    with tempfile.TemporaryDirectory(prefix="storm-bench-system-") as tmp:
        hook = bench_hook.run_all(quick, 2 if quick else 5, mpihook.hook_library(), Path(tmp))
    bench_hook.print_tables(hook)
    return hook


def markdown(figures: Sequence[Figure], sources: dict[str, str]) -> str:
    lines = [
        "| part | figure | value | goal |",
        "|---|---|---:|---|",
    ]
    for f in figures:
        goal = "" if not f.goal else f"{f.goal}: {'met' if f.met else 'missed'}"
        lines.append(f"| {f.part} | {f.name} | {f.cell()} | {goal} |")
    lines += ["", "Sources: " + "; ".join(f"{part} {source}" for part, source in sources.items()) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench system", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows and fewer runs")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS)} (default all)")
    parser.add_argument("--reuse", type=Path, help="take each part from DIR/<part>.json if it is there")
    parser.add_argument("--json", type=Path, help="write every raw figure and the headline here")
    parser.add_argument("--markdown", type=Path, help="write the headline table here")
    args = parser.parse_args(argv)
    parts = [part for part in args.parts.split(",") if part]
    unknown = [part for part in parts if part not in PARTS]
    if unknown or not parts:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    raw: Json = {}
    sources: dict[str, str] = {}
    started = time.time()
    for part in parts:
        saved = args.reuse / f"{part}.json" if args.reuse else None
        if saved is not None and saved.exists():
            try:
                raw[part] = json.loads(saved.read_text())
            except ValueError as exc:
                parser.error(f"{saved}: not JSON ({exc})")
            sources[part] = f"from {saved}"
            continue
        print(f"\n== {part}", flush=True)
        raw[part] = run_part(part, args.quick)
        sources[part] = "measured in this run" + (" (--quick)" if args.quick else "")
    try:
        figures = [figure for part in parts for figure in FIGURES[part](raw[part])]
    except (KeyError, TypeError) as exc:
        parser.error(f"a reused result lacks a figure this benchmark reports ({exc!r}); rerun that part")
    text = markdown(figures, sources)
    print("\n" + text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    if args.json:
        result = {
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "kernel": platform.release()},
            "started": started, "seconds": time.time() - started, "quick": args.quick, "sources": sources,
            "headline": [asdict(f) for f in figures], "raw": raw,
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
