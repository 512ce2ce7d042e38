"""``storm sim sweep``: policies x offered loads x seeds, run in parallel on this machine's cores, and the
classic curves (mean bounded slowdown and mean wait against offered load, one line per policy).

Load is raised by compressing arrival times (``--scale arrivals``, the FCS paper's section 5.1) or by
stretching runtimes (``--scale runtimes``, the BlueGene/L paper's c). Each target load L gives the factor
L / (the trace's own offered load).

Saturation: a policy is saturated at the lowest swept load where its mean bounded slowdown exceeds
:data:`SATURATION_BSLD` (100: a typical job waits a hundred times its runtime, so the queue has stopped
draining within the trace's span). The curves mark that point; a policy that never crosses it is reported
as saturating above the highest load swept.

With ``--submit`` the same points run as jobs on a storm cluster (tools/sim/sweep_jobs.py): each job calls
:func:`run_point` and writes what it returns with :func:`write_point`, and the sweep reads it back with
:func:`read_point`, so both ways report the same figures.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storm.tools.sim.engine import Machine, simulate
from storm.tools.sim.metrics import BSLD_THRESHOLD, job_rows, summarize
from storm.tools.sim.swf import Workload, scale_load

SATURATION_BSLD = 100.0
POINT_FORMAT = "storm-sim-point/1"  # a point's file, written by its job under ``storm sim sweep --submit``


@dataclass(frozen=True)
class Point:
    policy: str
    target_load: float
    seed: int


def points(policies: list[str], loads: list[float], seeds: list[int]) -> list[Point]:
    """The sweep's points in the order results are reported (a local and a submitted sweep share it)."""
    return [Point(pol, load, seed) for pol in policies for load in loads for seed in seeds]


def _factors(workload: Workload, pes: int, target: float, scale: str) -> tuple[float, float]:
    base = workload.offered_load(pes)
    factor = target / base
    return (factor, 1.0) if scale == "arrivals" else (1.0, factor)


def run_point(workload: Workload, machine: Machine, point: Point, scale: str) -> dict[str, Any]:
    """One simulation of the sweep (in a worker process, or in a storm job with ``--submit``)."""
    arrival, runtime = _factors(workload, machine.pes, point.target_load, scale)
    scaled = scale_load(workload, arrival, runtime)
    result = simulate(scaled, machine, point.policy, point.seed)
    rows = job_rows(result.outcomes)
    summary = summarize(rows, machine.pes)
    return {
        "policy": point.policy,
        "seed": point.seed,
        "target_load": point.target_load,
        "offered_load": scaled.offered_load(machine.pes),
        "arrival_compression": arrival,
        "runtime_stretch": runtime,
        "summary": dataclasses.asdict(summary),
        "wall": {
            "seconds": result.wall_seconds,
            "jobs_per_second": len(rows) / max(result.wall_seconds, 1e-9),
        },
    }


def write_point(path: Path, result: dict[str, Any], sha256: str) -> None:
    """Write a point's result whole; renamed into place, so the sweep never reads half a file."""
    data = {
        "format": POINT_FORMAT,
        "trace_sha256": sha256,
        "job": {"id": os.environ.get("STORM_JOB_ID"), "node": os.environ.get("STORM_NODE")},
        "result": result,
    }
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as stream:
        json.dump(data, stream, indent=1, sort_keys=True)
        stream.write("\n")
    os.replace(partial, path)


def read_point(path: Path, point: Point, sha256: str) -> dict[str, Any]:
    """What :func:`run_point` returned for ``point``, from its job's file; ValueError if it is not that."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"no result in {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != POINT_FORMAT:
        raise ValueError(f"{path} is not a point result ({POINT_FORMAT})")
    result = data.get("result")
    if not isinstance(result, dict):
        raise ValueError(f"{path} has no result")
    found = (result.get("policy"), result.get("target_load"), result.get("seed"))
    if found != (point.policy, point.target_load, point.seed) or data.get("trace_sha256") != sha256:
        raise ValueError(f"{path} holds another point or trace: {found}")
    return result


def run_sweep(
    workload: Workload,
    machine: Machine,
    policies: list[str],
    loads: list[float],
    seeds: list[int],
    *,
    scale: str = "arrivals",
    workers: int | None = None,
) -> list[dict[str, Any]]:
    """Every (policy, load, seed), in that order in the result whatever order the workers finish in."""
    if scale not in ("arrivals", "runtimes"):
        raise ValueError("scale: arrivals or runtimes")
    todo = points(policies, loads, seeds)
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1 or len(todo) == 1:
        return [run_point(workload, machine, point, scale) for point in todo]
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_point, workload, machine, point, scale) for point in todo]
        return [future.result() for future in futures]


def curves(results: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per policy, per load (seeds averaged): offered load, mean bounded slowdown, mean wait."""
    grouped: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for r in results:
        grouped.setdefault(r["policy"], {}).setdefault(r["target_load"], []).append(r)
    out: dict[str, list[dict[str, float]]] = {}
    for policy, by_load in grouped.items():
        line = []
        for load in sorted(by_load):
            runs = by_load[load]
            n = len(runs)
            line.append(
                {
                    "offered_load": sum(r["offered_load"] for r in runs) / n,
                    "mean_bsld": sum(r["summary"]["mean_bsld"] for r in runs) / n,
                    "mean_wait": sum(r["summary"]["mean_wait"] for r in runs) / n,
                    "utilization": sum(r["summary"]["utilization"] for r in runs) / n,
                    "loss_of_capacity": sum(r["summary"]["loss_of_capacity"] for r in runs) / n,
                }
            )
        out[policy] = line
    return out


def saturation(line: list[dict[str, float]]) -> float | None:
    """The lowest offered load whose mean bounded slowdown exceeds SATURATION_BSLD (None: never)."""
    for point in line:
        if point["mean_bsld"] > SATURATION_BSLD:
            return point["offered_load"]
    return None


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| policy | offered load | mean BSLD | mean wait (s) | utilization | loss of capacity |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    drawn = curves(results)
    for policy, line in drawn.items():
        lines += [
            f"| {policy} | {pt['offered_load']:.3f} | {pt['mean_bsld']:.2f} | {pt['mean_wait']:,.0f} | "
            f"{pt['utilization']:.3f} | {pt['loss_of_capacity']:.3f} |"
            for pt in line
        ]
    lines.append("")
    for policy, line in drawn.items():
        sat = saturation(line)
        where = f"{sat:.3f}" if sat is not None else f"above {line[-1]['offered_load']:.3f} (never crossed)"
        lines.append(f"- {policy} saturates (mean BSLD > {SATURATION_BSLD:g}) at offered load {where}")
    lines.append(f"- bounded slowdown threshold {BSLD_THRESHOLD:g} s; values averaged over seeds")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, line in curves(results).items():
        xs = [pt["offered_load"] for pt in line]
        (drawn,) = left.plot(xs, [pt["mean_bsld"] for pt in line], marker="o", label=policy)
        right.plot(
            xs, [pt["mean_wait"] / 3600 for pt in line], marker="o", label=policy, color=drawn.get_color()
        )
        sat = saturation(line)
        if sat is not None:
            for axis in (left, right):
                axis.axvline(sat, color=drawn.get_color(), linestyle=":", linewidth=1)
    left.axhline(SATURATION_BSLD, color="grey", linestyle="--", linewidth=0.8)
    left.set_yscale("log")
    left.set_xlabel("offered load")
    left.set_ylabel(f"mean bounded slowdown ({BSLD_THRESHOLD:g} s)")
    right.set_xlabel("offered load")
    right.set_ylabel("mean wait (h)")
    for axis in (left, right):
        axis.legend()
        axis.grid(alpha=0.3)
    fig.suptitle(title + " (dotted: saturation)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
