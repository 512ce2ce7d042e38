"""``storm sim bluegene``: the experiments of Krevat, Castanos and Moreira, "Job Scheduling for the BlueGene/L
System" (sections 3.2-3.4), on storm-mm's own scheduling code.

Each trace is run on a 4 x 4 x 8 torus of 128 nodes (the paper's supernodes) under its four schedulers,
FCFS, backfilling, migration and both (B+M), and on a flat 128-node machine under FCFS and backfilling as
the baseline of its Fig. 5, with every runtime multiplied by c (0.7 to 1.4 in steps of 0.05, and beyond for
the saturation region). Every run goes through tools/sim/fast.py, which drives mm/schedule_state.py and
mm/torus_scheduler.py as storm-mm does (migration being the simulator's alone), and measures the paper's
capacity split, checking that it adds up to 1.

Workloads (:func:`workload`): a trace's jobs in arrival order, its first ``jobs`` (the paper took 10,000-job
spans); sizes scaled to 128 nodes (x 128 / the trace's processors, rounded up) when the trace's machine is
not 128; time limits from the trace's requested times, or when it has none the runtime (exact estimates:
the paper does not say what it used for the NASA log, which has none).

Each point (trace, machine, scheduler, c) depends only on the :class:`Setup` and is written to
``<dir>/points/`` as it ends (renamed into place); a sweep run again with the same setup reads the points
already there, so a long sweep can be stopped and resumed. The report is tools/sim/bluegene_report.py's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storm.tools.sim.engine import Machine, parse_machine, simulate
from storm.tools.sim.metrics import BSLD_THRESHOLD, job_rows, summarize
from storm.tools.sim.swf import SwfRecord, Workload, file_sha256, machine_from_header, read_swf, scale_load
from storm.tools.sim.swf import to_workload as swf_workload

Json = dict[str, Any]
POINT_FORMAT = "storm-sim-bluegene-point/1"
NODES = 128  # the paper's 4 x 4 x 8 supernodes, and its logs' machines
TORUS = "torus:4x4x8"
FLAT = f"flat:{NODES}"
# (label, machine, storm sim policy): the paper's four schedulers, then its flat baseline (Fig. 5).
SCHEDULERS: tuple[tuple[str, str, str], ...] = (
    ("FCFS", TORUS, "fcfs"),
    ("Backfill", TORUS, "easy"),
    ("Migration", TORUS, "migration"),
    ("B+M", TORUS, "easy+migration"),
    ("flat FCFS", FLAT, "fcfs"),
    ("flat Backfill", FLAT, "easy"),
)
LABELS = tuple(label for label, _, _ in SCHEDULERS)
# The paper's c: 0.7 to 1.4 in steps of 0.05, then ours beyond, into the saturation region.
PAPER_LOADS = tuple(round(0.7 + 0.05 * i, 2) for i in range(15))
# Up to 10: there nearly every job waits from the start, so the utilization is what a scheduler packs
# with a queue that never empties (the plateau of :func:`saturation`).
BEYOND = (1.5, 1.6, 1.8, 2.0, 2.4, 3.0, 4.0, 6.0, 10.0)


@dataclass(frozen=True)
class Setup:
    """What a point depends on besides its scheduler and c."""

    trace: str  # absolute path
    trace_sha256: str
    jobs: int = 10_000
    migration_cost_s: float = 0.0

    def key(self) -> Json:
        return dataclasses.asdict(self)

    @property
    def name(self) -> str:
        return Path(self.trace).name


def scaled_records(records: list[SwfRecord], processors: int) -> list[SwfRecord]:
    """Sizes (allocated and requested processors) x NODES / ``processors``, rounded up: a trace of another
    machine's size on the paper's 128 nodes."""
    if processors == NODES:
        return records

    def scale(size: int) -> int:
        return -(-size * NODES // processors) if size > 0 else size

    return [dataclasses.replace(r, procs=scale(r.procs), req_procs=scale(r.req_procs)) for r in records]


def workload(setup: Setup) -> tuple[Workload, int]:
    """The setup's jobs, and the processors of the trace's machine (its header's, else its widest job)."""
    trace = read_swf(setup.trace)
    if file_sha256(setup.trace) != setup.trace_sha256:
        raise ValueError(f"{setup.trace} changed since the sweep began (its sha256 differs)")
    header = machine_from_header(trace)
    processors = header[0] * header[1] if header else max(r.procs for r in trace.records)
    work = swf_workload(scaled_records(trace.records, processors), NODES)
    work.jobs = work.jobs[: setup.jobs]
    return work, processors


def run_point(setup: Setup, label: str, c: float) -> Json:
    """One run: ``label``'s scheduler (SCHEDULERS) with runtimes x ``c``."""
    machine_text, policy = next((m, p) for name, m, p in SCHEDULERS if name == label)
    machine: Machine = parse_machine(machine_text)
    work, _ = workload(setup)
    loaded = scale_load(work, 1.0, c)
    started = time.perf_counter()
    cost = setup.migration_cost_s if "migration" in policy else 0.0
    result = simulate(loaded, machine, policy, migration_cost=cost)
    wall = time.perf_counter() - started
    rows = job_rows(result.outcomes)
    summary = summarize(rows, machine.pes)
    assert result.capacity is not None  # the scheduler core always measures it
    return {
        "format": POINT_FORMAT,
        "setup": setup.key(),
        "scheduler": label,
        "machine": machine_text,
        "policy": policy,
        "c": c,
        "offered_load": loaded.offered_load(machine.pes),
        "capacity": dataclasses.asdict(result.capacity),
        "summary": dataclasses.asdict(summary),
        "migrations": None if result.migrations is None else dataclasses.asdict(result.migrations),
        "wall_s": wall,
    }


def point_path(directory: Path, setup: Setup, label: str, c: float) -> Path:
    stem = Path(setup.trace).stem.replace(".", "_")
    return directory / "points" / f"{stem}-{label.replace(' ', '_').replace('+', 'p')}-c{c:g}.json"


def read_point(path: Path, setup: Setup) -> Json | None:
    """A point written by an equal setup, or None (missing, half written, another setup's)."""
    try:
        data: Json = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("format") == POINT_FORMAT and data.get("setup") == setup.key()
    return data if ok else None


def _compute(setup: Setup, label: str, c: float, path: Path) -> Json:
    data = run_point(setup, label, c)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return data


def run_sweep(
    setups: list[Setup],
    labels: list[str],
    loads: list[float],
    directory: Path,
    *,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[Json]:
    """Every (setup, scheduler, c) point, reusing those already in ``directory``; in that order."""
    todo = [(setup, label, c) for setup in setups for label in labels for c in loads]
    found: dict[int, Json] = {}
    missing = []
    for i, (setup, label, c) in enumerate(todo):
        path = point_path(directory, setup, label, c)
        known = read_point(path, setup)
        if known is not None:
            found[i] = known
        else:
            missing.append((i, setup, label, c, path))
    say = progress or (lambda text: None)
    say(f"{len(todo) - len(missing)} of {len(todo)} points reused from {directory / 'points'}")
    if workers <= 1:
        for i, setup, label, c, path in missing:
            found[i] = _compute(setup, label, c, path)
            say(f"{setup.name} {label} c={c:g}: done")
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(_compute, s, lab, c, path): (i, s, lab, c) for i, s, lab, c, path in missing
            }
            for future in concurrent.futures.as_completed(futures):
                i, setup, label, c = futures[future]
                found[i] = future.result()
                say(f"{setup.name} {label} c={c:g}: done")
    return [found[i] for i in range(len(todo))]


def stderr_progress(text: str) -> None:
    print(f"storm sim bluegene: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- reading


def curve(points: list[Json], trace: str, label: str) -> list[Json]:
    """One scheduler's points on one trace, by c."""
    return sorted((p for p in points if Path(p["setup"]["trace"]).name == trace and p["scheduler"] == label),
                  key=lambda p: p["c"])  # fmt: skip


def saturation(line: list[Json]) -> Json:
    """Where a scheduler saturates, read two ways (both beside the paper's figures in the report):

    - ``plateau``: the highest utilization the sweep reached. Past saturation more work only lengthens
      the queue, and the utilization creeps towards what the scheduler can pack with a queue that never
      empties: the vertical part of the paper's wait-against-utilization curves. ``flat`` says whether the
      last two points are within one point of each other (else the sweep did not reach it, and it is a
      lower bound).
    - ``onset``: the utilization of the first point whose mean bounded slowdown exceeds 100 (``storm sim
      sweep``'s rule), where waits start to grow without bound.
    """
    utils = [p["capacity"]["utilized"] for p in line]
    onset = next((p["capacity"]["utilized"] for p in line if p["summary"]["mean_bsld"] > 100), None)
    top = max(utils) if utils else 0.0
    flat = len(utils) >= 2 and abs(utils[-1] - utils[-2]) < 0.01
    return {"plateau": top, "flat": flat, "onset": onset}


__all__ = ["BEYOND", "BSLD_THRESHOLD", "LABELS", "PAPER_LOADS", "SCHEDULERS", "Setup", "run_sweep"]
