"""Benchmark: the torus allocator. The largest free partition three ways, and one scheduling pass.

``storm bench torus`` (or ``python -m storm.tools.bench_torus``) needs no cluster:

- **Largest free partition.** On 4 x 4 x 8 (the BlueGene/L paper's) and 8 x 8 x 8 tori with a share of their
  nodes taken at random (seeded), times the paper's POP (O(M^5)), the plain brute force it is tested
  against (O(M^9)) and the bitmask table storm's passes use (mm/torus.py), each on the same states, every
  state new to the table (it remembers answers). Prints the mean per call and the ratios the issue asks for.
- **A scheduling pass.** A 4 x 4 x 8 torus three quarters full of running jobs, hundreds of queued jobs of
  mixed sizes and time limits, one pass of mm/torus_scheduler.py per scheduler, each on a fresh copy with
  a fresh table (so nothing is remembered from an earlier pass): the best of ``--repeats``.

It prints tables and writes every figure as JSON (``--json``, default results/bench-torus.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storm.mm.matrix import Matrix, Placement
from storm.mm.scheduler import QueuedJob, RunningJob
from storm.mm.torus import Box, Coord, Torus
from storm.mm.torus_pop import largest_free_brute, largest_free_pop
from storm.mm.torus_scheduler import Migration, schedule_torus
from storm.mm.torus_state import TorusLayout, TorusState

NOW = 100_000.0
# name -> (backfill, migrates): the paper's four schedulers.
SCHEDULERS = {
    "FCFS": ("none", False), "Backfill": ("easy", False), "Migration": ("none", True), "B+M": ("easy", True),
}  # fmt: skip


def states(dims: Coord, share: float, count: int, seed: int) -> list[list[bool]]:
    """``count`` tori with each node taken with probability ``share`` (free[i] per node)."""
    rng = random.Random(seed)
    nodes = dims[0] * dims[1] * dims[2]
    return [[rng.random() >= share for _ in range(nodes)] for _ in range(count)]


def time_largest(dims: Coord, share: float, count: int, seed: int) -> dict[str, Any]:
    """Mean seconds per call of POP, brute force and the table on the same ``count`` states (checked
    equal)."""
    tori = states(dims, share, count, seed)
    table = Torus(dims)  # fresh: nothing remembered
    taken = [sum(1 << i for i, free in enumerate(state) if not free) for state in tori]
    found: dict[str, list[int]] = {"pop": [], "brute": [], "table": []}
    seconds: dict[str, float] = {}

    def pop(state: list[bool], mask: int) -> int:
        return largest_free_pop(dims, state)[0]

    def brute(state: list[bool], mask: int) -> int:
        return largest_free_brute(dims, state)[0]

    def bitmasks(state: list[bool], mask: int) -> int:
        return table.largest_free(mask)

    ways: list[tuple[str, Callable[[list[bool], int], int]]] = [
        ("pop", pop),
        ("brute", brute),
        ("table", bitmasks),
    ]
    for name, run in ways:
        begin = time.perf_counter()
        found[name] = [run(state, mask) for state, mask in zip(tori, taken, strict=True)]
        seconds[name] = (time.perf_counter() - begin) / count
    if not found["pop"] == found["brute"] == found["table"]:
        raise AssertionError(f"the three disagree on {dims} at {share}: a bug, not a timing")
    mean = statistics.fmean(found["pop"])
    return {
        "dims": list(dims), "taken_share": share, "states": count, "mean_largest": mean,
        **{f"{name}_s": value for name, value in seconds.items()},
    }  # fmt: skip


def _size(rng: random.Random) -> int:
    # Sizes of all kinds, many small: the mix that fragments a torus (the paper's SDSC log).
    roll = rng.random()
    if roll < 0.4:
        return rng.randint(1, 8)
    if roll < 0.8:
        return rng.randint(9, 32)
    return rng.randint(33, 96)


def _limit(rng: random.Random) -> float:
    return float(rng.choice([600, 1800, 3600, 4 * 3600, 86400]))


Running = list[tuple[int, Box, float, float]]


def scenario(dims: Coord, queued: int, fill: float, seed: int) -> tuple[Running, list[QueuedJob]]:
    """Running jobs (id, box, start, limit) and a queue of ``queued`` jobs: jobs placed by the paper's rule
    until none fits, then jobs taken away at random until ``fill`` of the torus is held, which leaves the
    holes a torus has after jobs came and went."""
    rng = random.Random(seed)
    torus = Torus(dims)
    taken = 0
    placed: dict[int, Box] = {}
    job_id = 1
    while True:
        size = torus.round_size(min(_size(rng), torus.nodes - taken.bit_count()) or 1)
        box = torus.place(taken, size) if size is not None and taken != torus.all else None
        if box is None:
            break
        taken |= torus.mask(box)
        placed[job_id] = box
        job_id += 1
    while taken.bit_count() > fill * torus.nodes:
        gone = rng.choice(sorted(placed))
        taken &= ~torus.mask(placed.pop(gone))
    running = []
    for held, box in placed.items():
        limit = _limit(rng)
        running.append((held, box, NOW - rng.uniform(0, limit), limit))
    queue = [QueuedJob(job_id + i, _size(rng), _limit(rng)) for i in range(queued)]
    return running, queue


def time_pass(dims: Coord, queued: int, fill: float, seed: int, repeats: int) -> list[dict[str, Any]]:
    running, queue = scenario(dims, queued, fill, seed)
    rows = []
    for name, (backfill, migrates) in SCHEDULERS.items():
        best = cpu = float("inf")
        started = moved = 0
        for _ in range(repeats):
            layout = TorusLayout.numbered(dims)
            layout = TorusLayout(Torus(dims), layout.names, layout.index)  # a fresh table: nothing remembered
            state = TorusState(layout)
            matrix = Matrix(1)
            for node in layout.index:
                matrix.add_node(node, 1)
            jobs: dict[int, RunningJob] = {}
            for job_id, box, start, limit in running:
                state.assign(job_id, box)
                matrix.assign(job_id, Placement(0, tuple((n, 0) for n in state.names_of(box))))
                jobs[job_id] = RunningJob(job_id, start, limit)
            migration = Migration() if migrates else None
            begin, begin_cpu = time.perf_counter(), time.process_time()
            plan = schedule_torus(NOW, queue, jobs, state, matrix, backfill=backfill, migration=migration)
            best = min(best, time.perf_counter() - begin)
            cpu = min(cpu, time.process_time() - begin_cpu)
            started, moved = len(plan.starts), len(plan.moves)
        rows.append({
            "dims": list(dims), "queued": queued, "running": len(running), "scheduler": name, "seconds": best,
            "cpu_seconds": cpu, "started": started, "moved": moved,
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench torus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default="0.1,0.3,0.5,0.7", help="shares of nodes taken, comma-separated")
    parser.add_argument("--states", type=int, default=20, help="random tori per shape and share (default 20)")
    parser.add_argument("--queues", default="100,500,1000", help="queued jobs per pass, comma-separated")
    parser.add_argument("--fill", type=float, default=0.75, help="share of the torus running jobs hold")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("results/bench-torus.json"))
    args = parser.parse_args(argv)
    shares = [float(s) for s in args.shares.split(",")]
    print("largest free partition, mean ms per call (the same random states for all three)")
    print(f"{'torus':>7} {'taken':>6} {'largest':>8} {'POP':>9} {'brute':>10} {'table':>8} {'brute/POP':>10}")
    largest = []
    for dims in ((4, 4, 8), (8, 8, 8)):
        for share in shares:
            row = time_largest(dims, share, args.states, args.seed)
            largest.append(row)
            pop, brute, table = (row[k] * 1e3 for k in ("pop_s", "brute_s", "table_s"))
            shape = "x".join(map(str, dims))
            print(
                f"{shape:>7} {share:>6.0%} {row['mean_largest']:>8.1f} {pop:>9.2f} {brute:>10.1f} "
                f"{table:>8.3f} {brute / pop:>9.0f}x",
                flush=True,
            )
    pop_small = statistics.fmean(r["pop_s"] for r in largest if r["dims"] == [4, 4, 8])
    brute_big = statistics.fmean(r["brute_s"] for r in largest if r["dims"] == [8, 8, 8])
    pop_big = statistics.fmean(r["pop_s"] for r in largest if r["dims"] == [8, 8, 8])
    print(
        f"means over the shares: POP on 4x4x8 {pop_small * 1e3:.2f} ms, brute force on 8x8x8 "
        f"{brute_big * 1e3:.1f} ms ({brute_big / pop_small:.0f}x); POP on 8x8x8 {pop_big * 1e3:.2f} ms, "
        f"{brute_big / pop_big:.0f}x faster than brute force there"
    )
    print(
        f"\none pass on a 4x4x8 torus {args.fill:.0%} full, best of {args.repeats} (a fresh table each time)"
    )
    columns = ("queued", 7), ("running", 8), ("scheduler", 10), ("pass ms", 9), ("cpu ms", 8), ("started", 8)
    print(" ".join(f"{name:>{width}}" for name, width in columns) + f" {'moved':>6}")
    passes = []
    for queued in (int(q) for q in args.queues.split(",")):
        for row in time_pass((4, 4, 8), queued, args.fill, args.seed, args.repeats):
            passes.append(row)
            wall, cpu = row["seconds"] * 1e3, row["cpu_seconds"] * 1e3
            print(
                f"{row['queued']:>7} {row['running']:>8} {row['scheduler']:>10} {wall:>9.1f} {cpu:>8.1f} "
                f"{row['started']:>8} {row['moved']:>6}",
                flush=True,
            )
    result = {
        "host": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0))},
        "python": platform.python_version(),
        "seed": args.seed,
        "largest_free": largest,
        "summary": {"pop_4x4x8_s": pop_small, "brute_8x8x8_s": brute_big, "pop_8x8x8_s": pop_big},
        "passes": passes,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
