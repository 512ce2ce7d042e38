"""Benchmark: how long one scheduling pass takes over a long queue on a large machine.

``storm bench schedule`` (or ``python -m storm.tools.bench_schedule``) needs no cluster: it builds
matrices of ``nodes x pes`` PEs in memory (1,024 x 4 and a small 64 x 4 by default), fills every row partly
with running jobs, queues 1,000 and 10,000 jobs of random widths and time limits (seeded, so every run and
every version of the code sees the same workload) and times one ``schedule()`` pass per backfill mode. A
pass commits its starts into the matrix, so every repetition gets a fresh copy, built outside the timing;
the best of ``--repeats`` is reported, since noise on a shared machine only ever adds time.

It prints a table and writes every figure as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from storm.mm.matrix import Matrix
from storm.mm.scheduler import QueuedJob, RunningJob, schedule

MODES = ("easy", "conservative", "none")
NOW = 100_000.0


@dataclass(frozen=True)
class Workload:
    nodes: dict[str, int]
    mpl: int
    running: list[tuple[int, int, int, float, float | None]]  # job id, ranks, row, start, limit
    queue: list[QueuedJob]
    usable: frozenset[str]


def _limit(rng: random.Random) -> float | None:
    # Mostly limited jobs of minutes to a day; a few without a limit, which can never backfill by time.
    return None if rng.random() < 0.05 else float(rng.choice([60, 300, 600, 1800, 3600, 4 * 3600, 86400]))


def _width(rng: random.Random, total: int) -> int:
    # Many small jobs, fewer wide ones: the shape of most HPC traces.
    roll = rng.random()
    if roll < 0.5:
        return rng.randint(1, 4)
    if roll < 0.8:
        return rng.randint(5, 32)
    if roll < 0.95:
        return rng.randint(33, 256)
    return rng.randint(257, max(257, total // 4))


def workload(*, nodes: int, pes: int, queued: int, mpl: int, fill: float, down: int, seed: int) -> Workload:
    rng = random.Random(seed)
    names = {f"node{i + 1}": pes for i in range(nodes)}
    total = nodes * pes
    matrix = Matrix(mpl)
    for name, count in names.items():
        matrix.add_node(name, count)
    running: list[tuple[int, int, int, float, float | None]] = []
    job_id = 1
    for row in range(mpl):
        used = 0
        while used < fill * total:
            ranks = min(_width(rng, total), total - used)
            placement = matrix.find(ranks, row=row)
            if placement is None:
                break
            matrix.assign(job_id, placement)
            limit = _limit(rng)
            # Somewhere inside its limit: a job past its estimate would count as ending now and pull the
            # head's reservation to now, which leaves nothing to backfill and nothing to measure.
            running.append((job_id, ranks, row, NOW - rng.uniform(0, limit or 3600), limit))
            used += ranks
            job_id += 1
    queue = [QueuedJob(job_id + i, _width(rng, total), _limit(rng)) for i in range(queued)]
    usable = frozenset(list(names)[down:])
    return Workload(names, mpl, running, queue, usable)


def fresh(load: Workload) -> tuple[Matrix, dict[int, RunningJob]]:
    """The workload's matrix and running jobs, rebuilt from its recorded placements' widths and rows."""
    matrix = Matrix(load.mpl)
    for name, count in load.nodes.items():
        matrix.add_node(name, count)
    running: dict[int, RunningJob] = {}
    for job_id, ranks, row, start, limit in load.running:
        placement = matrix.find(ranks, row=row)
        assert placement is not None
        matrix.assign(job_id, placement)
        running[job_id] = RunningJob(job_id, start, limit)
    return matrix, running


def supports_modes() -> bool:
    # The same file also times the code before backfill modes existed (see the module docstring of
    # storm.mm.scheduler for the modes): there only "easy" can be measured.
    return "backfill" in inspect.signature(schedule).parameters


def time_pass(load: Workload, mode: str, repeats: int) -> tuple[float, int]:
    """The best time of ``repeats`` passes in seconds, and how many jobs a pass started."""
    best = float("inf")
    started = 0
    for _ in range(repeats):
        matrix, running = fresh(load)
        kwargs = {"backfill": mode} if supports_modes() else {}
        begin = time.perf_counter()
        plan = schedule(NOW, load.queue, running, matrix, load.usable, **kwargs)
        best = min(best, time.perf_counter() - begin)
        started = len(plan.starts)
    return best, started


def run(
    *,
    cases: list[tuple[int, int, int]],
    modes: list[str],
    mpl: int,
    fill: float,
    down: int,
    repeats: int,
    seed: int,
) -> dict[str, object]:
    results: list[dict[str, object]] = []
    for nodes, pes, queued in cases:
        load = workload(nodes=nodes, pes=pes, queued=queued, mpl=mpl, fill=fill, down=down, seed=seed)
        for mode in modes:
            seconds, started = time_pass(load, mode, repeats)
            results.append(
                {
                    "nodes": nodes,
                    "pes": pes,
                    "queued": queued,
                    "mode": mode,
                    "seconds": seconds,
                    "started": started,
                }
            )
            print(
                f"{nodes:>6} {pes:>4} {nodes * pes:>6} {queued:>7} {mode:>13} "
                f"{seconds * 1000:>10.1f} {started:>8}",
                flush=True,
            )
    return {
        "host": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0))},
        "python": platform.python_version(),
        "mpl": mpl,
        "fill": fill,
        "down": down,
        "repeats": repeats,
        "seed": seed,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench schedule", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="64x4:1000,1024x4:1000,1024x4:10000", help="NODESxPES:QUEUED,...")
    parser.add_argument("--modes", default=",".join(MODES), help="backfill modes to time")
    parser.add_argument("--mpl", type=int, default=1, help="rows of the matrix")
    parser.add_argument("--fill", type=float, default=0.75, help="share of each row running jobs hold")
    parser.add_argument("--down", type=int, default=0, help="nodes left out of the usable set")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("results/schedule.json"))
    args = parser.parse_args(argv)
    cases = []
    for case in args.cases.split(","):
        size, queued = case.split(":")
        nodes, pes = size.split("x")
        cases.append((int(nodes), int(pes), int(queued)))
    modes = args.modes.split(",") if supports_modes() else ["easy"]
    print(f"{'nodes':>6} {'pes':>4} {'PEs':>6} {'queued':>7} {'mode':>13} {'pass ms':>10} {'started':>8}")
    result = run(
        cases=cases,
        modes=modes,
        mpl=args.mpl,
        fill=args.fill,
        down=args.down,
        repeats=args.repeats,
        seed=args.seed,
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
