"""A run's results as people and programs read them: a Markdown table, JSON with a manifest, CSV per job,
and PNG plots (matplotlib, the ``bench`` extra: checked before a run starts, see :func:`require_matplotlib`).

The JSON keeps everything that depends on the wall clock under one key, ``wall``: drop it and two runs of
the same inputs are byte for byte the same.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.metadata
import json
from pathlib import Path
from typing import Any, TextIO

from storm.tools.sim.engine import EVENT_ORDER, RunResult
from storm.tools.sim.metrics import BSLD_THRESHOLD, JobRow, Summary, job_rows, summarize
from storm.tools.sim.swf import Workload


class MissingExtra(RuntimeError):
    """An optional dependency (matplotlib) that an output needs is not installed."""


def require_matplotlib() -> None:
    """Fail before a long run rather than after it, if --png cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtra(
            "--png needs matplotlib: pip install 'storm-fcs[bench]' (or pip install matplotlib)"
        ) from None


def storm_version() -> str:
    try:
        return importlib.metadata.version("storm-fcs")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def manifest(
    workload: Workload,
    *,
    source: str,
    sha256: str,
    seed: int,
    machine: tuple[int, int],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """What a result was computed from: enough to run it again and to know what was left out."""
    nodes, pes_per_node = machine
    return {
        "storm_version": storm_version(),
        "trace": source,
        "trace_sha256": sha256,
        "machine": {"nodes": nodes, "pes_per_node": pes_per_node, "pes": nodes * pes_per_node},
        "jobs": len(workload.jobs),
        "dropped": dict(workload.dropped),
        "estimate_rule": (
            f"{workload.estimate}: the time limit of a job without a requested time (SWF field 9) "
            + (
                "is its runtime"
                if workload.estimate == "runtime"
                else f"is {workload.estimate[1:]} x its runtime"
            )
        ),
        "jobs_estimated": workload.estimated,
        "jobs_over_limit": workload.over_limit,
        "load_factors": {
            "arrival_compression": workload.arrival_factor,
            "runtime_stretch": workload.runtime_factor,
        },
        "offered_load": workload.offered_load(nodes * pes_per_node),
        "seed": seed,
        "bsld_threshold_s": BSLD_THRESHOLD,
        "event_order": EVENT_ORDER,
        **extra,
    }


def result_json(
    result: RunResult, manifest_: dict[str, Any], rows: list[JobRow] | None = None
) -> dict[str, Any]:
    rows = job_rows(result.outcomes) if rows is None else rows
    summary = summarize(rows, result.machine.pes)
    jobs = len(rows)
    simulated = result.simulated or result.machine
    manifest_ = {
        **manifest_,
        # The nodes storm-mm's core saw: tools/sim/engine.py merges nodes when that decides the same.
        "simulated_as": {
            "nodes": simulated.nodes,
            "pes_per_node": simulated.pes_per_node,
            "nodes_merged": result.simulated is not None,
        },
    }
    return {
        "manifest": manifest_,
        "policy": result.policy,
        "summary": dataclasses.asdict(summary),
        "capacity": None if result.capacity is None else dataclasses.asdict(result.capacity),
        "migrations": None if result.migrations is None else dataclasses.asdict(result.migrations),
        "events": result.events,
        "jobs": [dataclasses.asdict(r) for r in rows],
        "wall": {
            "seconds": result.wall_seconds,
            "jobs_per_second": jobs / result.wall_seconds if result.wall_seconds > 0 else None,
        },
    }


def dump_json(data: dict[str, Any], stream: TextIO) -> None:
    json.dump(data, stream, indent=1, sort_keys=True)
    stream.write("\n")


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


SUMMARY_COLUMNS = (
    ("policy", "policy"),
    ("load", "offered load"),
    ("jobs", "jobs"),
    ("mean_wait", "mean wait (s)"),
    ("median_wait", "median wait (s)"),
    ("mean_response", "mean response (s)"),
    ("median_response", "median response (s)"),
    ("mean_bsld", "mean BSLD"),
    ("median_bsld", "median BSLD"),
    ("utilization", "utilization"),
    ("loss_of_capacity", "loss of capacity"),
    ("makespan", "makespan (s)"),
    ("jobs_per_second", "sim jobs/s"),
)


def summary_cells(
    policy: str, load: float, summary: Summary, jobs_per_second: float | None
) -> dict[str, str]:
    return {
        "policy": policy,
        "load": f"{load:.3f}",
        "jobs": str(summary.jobs),
        "mean_wait": _seconds(summary.mean_wait),
        "median_wait": _seconds(summary.median_wait),
        "mean_response": _seconds(summary.mean_response),
        "median_response": _seconds(summary.median_response),
        "mean_bsld": f"{summary.mean_bsld:.2f}",
        "median_bsld": f"{summary.median_bsld:.2f}",
        "utilization": f"{summary.utilization:.3f}",
        "loss_of_capacity": f"{summary.loss_of_capacity:.3f}",
        "makespan": _seconds(summary.makespan),
        "jobs_per_second": "-" if jobs_per_second is None else f"{jobs_per_second:,.0f}",
    }


def markdown_table(lines: list[dict[str, str]]) -> str:
    header = "| " + " | ".join(title for _, title in SUMMARY_COLUMNS) + " |"
    rule = "| " + " | ".join("---" for _ in SUMMARY_COLUMNS) + " |"
    body = ["| " + " | ".join(line[key] for key, _ in SUMMARY_COLUMNS) + " |" for line in lines]
    return "\n".join([header, rule, *body])


def markdown_run(data: dict[str, Any]) -> str:
    m = data["manifest"]
    summary = Summary(**data["summary"])
    cells = summary_cells(data["policy"], m["offered_load"], summary, data["wall"]["jobs_per_second"])
    dropped = ", ".join(f"{why}: {n}" for why, n in m["dropped"].items()) or "none"
    notes = [
        f"trace {m['trace']} (sha256 {m['trace_sha256'][:16]}...), {m['machine']['nodes']} nodes x "
        f"{m['machine']['pes_per_node']} PEs, storm {m['storm_version']}, seed {m['seed']}",
        *_merged_note(m),
        f"dropped: {dropped}; estimate rule: {m['estimate_rule']} ({m['jobs_estimated']} jobs)",
        f"load factors: arrivals compressed x{m['load_factors']['arrival_compression']:g}, runtimes "
        f"stretched x{m['load_factors']['runtime_stretch']:g}; "
        f"bounded slowdown threshold {m['bsld_threshold_s']:g} s",
        f"end states: {', '.join(f'{k} {v}' for k, v in summary.states.items())}"
        f" ({m['jobs_over_limit']} jobs run longer than their limit: storm ends them TIMEOUT)",
        *_torus_notes(data),
    ]
    return markdown_table([cells]) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def _torus_notes(data: dict[str, Any]) -> list[str]:
    """The BlueGene/L paper's capacity split, and what migration did (and that only a simulator does it)."""
    notes = []
    m, capacity, migrations = data["manifest"], data.get("capacity"), data.get("migrations")
    if "torus" in m:
        dims = "x".join(map(str, m["torus"]))
        notes.append(
            f"torus {dims}: every job holds a box of whole nodes, placed to leave the largest free box"
        )
    if capacity is not None:
        notes.append(
            f"capacity (BlueGene/L paper, 3.2): utilized {capacity['utilized']:.3f}, unused "
            f"{capacity['unused']:.3f}, lost {capacity['lost']:.3f} (checked to add up to 1)"
        )
    if migrations is not None:
        rate = migrations["successes"] / migrations["attempts"] if migrations["attempts"] else 0.0
        notes.append(
            f"migrations: {migrations['attempts']} attempted, {migrations['successes']} successful "
            f"({rate:.0%}), {migrations['jobs_moved']} jobs moved at {migrations['cost_s']:g} s each; "
            f"{m['migration']}"
        )
    return notes


def _merged_note(m: dict[str, Any]) -> list[str]:
    merged = m.get("simulated_as")
    if not merged or not merged["nodes_merged"]:
        return []
    return [
        f"simulated as {merged['nodes']} nodes x {merged['pes_per_node']} PEs: the same decisions at a "
        "fraction of the messages (tools/sim/engine.py says why)"
    ]


def write_csv(rows: list[JobRow], path: str | Path) -> None:
    names = [f.name for f in dataclasses.fields(JobRow)]
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(names)
        for row in rows:
            writer.writerow([getattr(row, name) for name in names])


def plot_run(rows: list[JobRow], path: str | Path, title: str) -> None:
    """Two panels: wait time against submit time, and the CDF of bounded slowdown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.scatter([r.submit / 3600 for r in rows], [r.wait / 3600 for r in rows], s=2)
    left.set_xlabel("submit time (h)")
    left.set_ylabel("wait (h)")
    left.set_title("wait per job")
    slowdowns = sorted(r.bsld for r in rows)
    right.plot(slowdowns, [(i + 1) / len(slowdowns) for i in range(len(slowdowns))])
    right.set_xscale("log")
    right.set_xlabel(f"bounded slowdown (threshold {BSLD_THRESHOLD:g} s)")
    right.set_ylabel("fraction of jobs")
    right.set_title("bounded slowdown CDF")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
