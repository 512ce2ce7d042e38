"""``storm sim dynamic``'s sweep: a dynamic workload (dynamic.py) under each policy at each offered load.

Each (policy, load) is a point: one run of :class:`CoschedCluster` on the 16 x 2 PEs, MPL 6 (1 under
``batch``, which is storm-mm's FCFS with EASY backfilling), 100 ms slices, the calibrated costs
(scenarios.py :class:`Calibration`) and FCS's shipped constants. A point depends only on its
:class:`Setup`, policy and load, so it is deterministic and the points run in any order, in a pool of
processes. Each point's JSON is written into ``<dir>/points/`` as soon as it finishes (renamed into place:
never half a file), and a sweep started again with the same setup reads the points already there instead
of running them: a long sweep can be stopped, inspected and resumed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storm.mm.protocol import FcsParameters
from storm.tools.scenarios import parse_policy
from storm.tools.sim.cosched.cluster import NS, CoschedCluster
from storm.tools.sim.cosched.dynamic import Draws, DynamicWorkload, from_lublin, from_trace
from storm.tools.sim.cosched.dynamic_report import summarize
from storm.tools.sim.cosched.scenarios import Calibration, fcs_parameters
from storm.tools.sim.swf import file_sha256, machine_from_header, read_swf

Json = dict[str, Any]
POLICIES = ("batch", "gang", "sb", "fcs")
LOADS = (0.5, 0.6, 0.7, 0.74, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.2)
POINT_FORMAT = "storm-sim-dynamic-point/1"


@dataclass(frozen=True)
class Setup:
    """What a point depends on besides its policy and load: the workload's recipe and the cluster."""

    count: int = 1000
    seed: int = 0
    span_s: float = 7200.0
    mix: str = "typed"
    trace: str | None = None  # an SWF file instead of the model
    trace_sha256: str | None = None
    sizes: str = "scale"
    nodes: int = 16
    pes_per_node: int = 2
    mpl: int = 6
    slice_s: float = 0.1
    draws: Draws = field(default_factory=Draws)
    calibration: Calibration = field(default_factory=Calibration)

    @property
    def pes(self) -> int:
        return self.nodes * self.pes_per_node

    def key(self) -> Json:
        """The setup as JSON: a point file is reused only if it was made from an equal one."""
        return dataclasses.asdict(self)

    def workload(self) -> DynamicWorkload:
        """The jobs, the same every time for an equal setup (a trace is checked against its sha256)."""
        if self.trace is None:
            return from_lublin(
                self.count, self.nodes, self.pes_per_node, self.seed, span_s=self.span_s, mix=self.mix,
                draws=self.draws,
            )  # fmt: skip
        trace = read_swf(self.trace)
        if self.trace_sha256 is not None and file_sha256(self.trace) != self.trace_sha256:
            raise ValueError(f"{self.trace} changed since the sweep began (its sha256 differs)")
        header = machine_from_header(trace)
        trace_pes = header[0] * header[1] if header else max(r.procs for r in trace.records)
        return from_trace(
            trace.records, trace_pes, Path(self.trace).name, count=self.count, nodes=self.nodes,
            pes_per_node=self.pes_per_node, seed=self.seed, span_s=self.span_s, sizes=self.sizes,
            draws=self.draws,
        )  # fmt: skip


def run_point(setup: Setup, workload: DynamicWorkload, policy: str, load: float) -> Json:
    """One run: the jobs at ``load`` under ``policy``. Returns the point's JSON (its per-job rows, the
    PEs' counters, the summary); cost: the run's."""
    jobs = workload.at_load(load)
    name, settings = parse_policy(policy)
    cluster = CoschedCluster(
        setup.nodes, setup.pes_per_node, name, mpl=setup.mpl, slice_s=setup.slice_s,
        costs=setup.calibration.costs, fcs=fcs_parameters(settings, FcsParameters()), seed=setup.seed,
        profile=False,
    )  # fmt: skip
    # Far beyond any run that ends: every job one after the other, twice over, after the last arrival.
    limit = 2 * (max(j.submit_ns for j in jobs) + sum(j.isolated_ns for j in workload.jobs)) + 3600 * NS
    result = cluster.run(jobs, limit_ns=limit)
    by_name = {j.name: j for j in workload.jobs}
    rows = [
        [r.name, by_name[r.name].size, by_name[r.name].isolated_s, r.submit, r.start, r.end]
        for r in result.jobs
    ]
    pes = [[c.busy_ns, c.spin_ns, c.switch_ns, c.idle_ns] for c in result.pes]
    changes: dict[str, int] = {}
    for _, _, _, old, new in result.classes:
        changes[f"{old}->{new}"] = changes.get(f"{old}->{new}", 0) + 1
    return {
        "format": POINT_FORMAT,
        "setup": setup.key(),
        "policy": policy,
        "target_load": load,
        "offered_load": workload.offered_load(workload.arrival_factor(load)),
        "arrival_factor": workload.arrival_factor(load),
        "summary": summarize(rows, pes, setup.pes),
        "run": {
            "wall_seconds": result.wall_seconds,
            "jobs_per_wall_second": len(rows) / max(result.wall_seconds, 1e-9),
            "model_events": result.model_events,
            "slices": result.slices,
            "class_changes": dict(sorted(changes.items())),
        },
        "pes": pes,
        "jobs": rows,
    }


def point_path(directory: Path, policy: str, load: float) -> Path:
    return directory / "points" / f"{policy}-{load:.3f}.json"


def write_point(path: Path, point: Json) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as stream:
        json.dump(point, stream, indent=None, separators=(",", ":"))
        stream.write("\n")
    os.replace(partial, path)


def read_point(path: Path, setup: Setup, policy: str, load: float) -> Json | None:
    """The point in ``path`` if it is this setup's (policy, load); None if absent or another's."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != POINT_FORMAT:
        return None
    # Through JSON, as the file went: tuples become lists, and equal setups compare equal.
    if data.get("setup") != json.loads(json.dumps(setup.key())):
        return None
    if data.get("policy") != policy or data.get("target_load") != load:
        return None
    return data


def _run_and_write(setup: Setup, workload: DynamicWorkload, policy: str, load: float, path: Path) -> Json:
    point = run_point(setup, workload, policy, load)
    write_point(path, point)
    return point


def run_sweep(
    setup: Setup,
    policies: list[str],
    loads: list[float],
    directory: Path,
    *,
    workers: int = 1,
    say: Callable[[str], object] | None = None,
) -> list[Json]:
    """Every (policy, load), in that order in the result: read back from ``directory`` when already there,
    else run (``workers`` at a time) and written there as each finishes."""
    for policy in policies:
        name, settings = parse_policy(policy)
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}: one of {', '.join(POLICIES)}")
        if settings and name != "fcs":
            raise ValueError(f"{policy!r}: only fcs takes settings (fcs@cslots_min=5;f_priority=slot)")
        fcs_parameters(settings, FcsParameters())  # an unknown or mistyped setting fails here, not later
    if not loads or min(loads) <= 0:
        raise ValueError("offered loads must be positive")
    tell = say or (lambda text: print(text, file=sys.stderr))
    workload = setup.workload()
    todo = [(policy, load) for policy in policies for load in loads]
    done: dict[tuple[str, float], Json] = {}
    for policy, load in todo:
        found = read_point(point_path(directory, policy, load), setup, policy, load)
        if found is not None:
            done[policy, load] = found
            tell(f"{policy} at {load:g}: read from {point_path(directory, policy, load)}")
    missing = [pl for pl in todo if pl not in done]

    def report(policy: str, load: float, point: Json) -> None:
        done[policy, load] = point
        run = point["run"]
        tell(
            f"{policy} at {load:g}: {run['wall_seconds']:.1f} s, {run['jobs_per_wall_second']:.1f} jobs/s "
            f"({len(done)}/{len(todo)})"
        )

    if workers <= 1 or len(missing) <= 1:
        for policy, load in missing:
            path = point_path(directory, policy, load)
            report(policy, load, _run_and_write(setup, workload, policy, load, path))
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(
                    _run_and_write, setup, workload, policy, load, point_path(directory, policy, load)
                ): (policy, load)
                for policy, load in missing
            }
            for future in concurrent.futures.as_completed(futures):
                report(*futures[future], future.result())
    return [done[pl] for pl in todo]
