"""Benchmark: what job arrays and dependencies cost storm-mm's core (in memory and on SQLite, no cluster).

``storm bench arrays`` (or ``python -m storm.tools.bench_arrays``) drives storm-mm's own Controller
(mm/core.py) as its daemon does, on a real SQLite store in a temporary directory, on 64 nodes of 4 PEs kept
full by one wide job, and times:

- **submit**: one ``submit_job`` of a ``--tasks``-task array (one request, one commit) against as many
  single submissions (one request and one commit each);
- **pass**: one scheduling pass with ``--held`` two-rank tasks waiting, once held by their array's ``%10``
  (out of the pass's queue: mm/holds.py) and once as plain queued jobs, which every pass walks;
- **release**: the cancel of a queued job that ``--held`` jobs wait for (``afterany``), which judges exactly
  those dependents and queues them, stored in the same commit.

Best of ``--repeats``, wall and CPU seconds; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.store import Store

ALICE = Account(1000, 100, "alice")
NOW = 1000.0


def controller(directory: Path) -> Controller:
    """64 nodes x 4 PEs, all but one held by a running job (job 1): a queued job of two ranks waits, and
    every pass tries it."""
    store = Store(directory / "storm.db")  # synchronous=FULL, as storm-mm by default
    OPENED.append(store)
    ctl = Controller(
        store, MMConfig(node_timeout=1e9, max_array_size=100_001), "bench", nonce=seeded_nonces(0)
    )
    ctl.recover(NOW)
    for i in range(64):
        node = f"n{i}"
        ctl.handle(p.RegisterNode(node=node, pes=4, nm_epoch=f"{node}-1", address=""), NOW, FromNode(node))
    ctl.handle(submit(255), NOW, ALICE)
    ctl.schedule(NOW)
    return ctl


def submit(ranks: int = 1, **fields: object) -> p.SubmitJob:
    return p.SubmitJob(ranks=ranks, argv=("/bin/true",), cwd="/tmp", env={"PATH": "/bin"}, **fields)  # type: ignore[arg-type]


def timed(action: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


OPENED: list[Store] = []  # closed after each run: a benchmark run in a test must leave no file open


def best(make: Callable[[Path], Callable[[], object]], repeats: int) -> tuple[float, float]:
    """The least wall (and CPU) seconds of ``repeats`` runs, each on a fresh store."""
    results = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as directory:
            try:
                action = make(Path(directory))
                results.append(timed(action))
            finally:
                while OPENED:
                    OPENED.pop().close()
    return min(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench arrays", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks in the submitted array (default 1000)")
    parser.add_argument("--held", type=int, default=10_000, help="jobs waiting in a pass (default 10000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    n, held = args.tasks, args.held
    figures: dict[str, tuple[float, float]] = {}

    def array_submit(directory: Path) -> Callable[[], object]:
        ctl = controller(directory)
        return lambda: ctl.handle(submit(array=f"0-{n - 1}"), NOW, ALICE)

    def single_submits(directory: Path) -> Callable[[], object]:
        ctl = controller(directory)
        return lambda: [ctl.handle(submit(), NOW, ALICE) for _ in range(n)]

    def pass_over(queued: bool) -> Callable[[Path], Callable[[], object]]:
        def make(directory: Path) -> Callable[[], object]:
            ctl = controller(directory)
            if queued:
                for _ in range(held):
                    ctl.handle(submit(2), NOW, ALICE)
            else:
                ctl.handle(submit(2, array=f"0-{held - 1}%10"), NOW, ALICE)
            ctl.schedule(NOW)

            def one_pass() -> None:
                ctl.runs.want_pass()
                ctl.schedule(NOW)

            return one_pass

        return make

    def release(directory: Path) -> Callable[[], object]:
        ctl = controller(directory)
        ctl.handle(submit(2), NOW, ALICE)  # job 2: queued, it waits for PEs
        ctl.handle(submit(2, array=f"0-{held - 1}", dependency="afterany:2"), NOW, ALICE)
        return lambda: ctl.handle(p.CancelJobs(job_ids=(2,)), NOW, ALICE)  # ends at once: all released

    figures[f"submit: one array of {n} tasks"] = best(array_submit, args.repeats)
    figures[f"submit: {n} single jobs"] = best(single_submits, args.repeats)
    figures[f"pass: {held} tasks held by %10"] = best(pass_over(False), args.repeats)
    figures[f"pass: {held} jobs queued"] = best(pass_over(True), args.repeats)
    figures[f"release: {held} dependents of one job"] = best(release, args.repeats)
    width = max(map(len, figures))
    print(f"{'':{width}}  {'wall ms':>9}  {'cpu ms':>9}")
    for name, (wall, cpu) in figures.items():
        print(f"{name:{width}}  {wall * 1000:9.2f}  {cpu * 1000:9.2f}")
    if args.json:
        data = {name: {"wall_s": wall, "cpu_s": cpu} for name, (wall, cpu) in figures.items()}
        command = " ".join(["storm bench arrays", *(argv if argv is not None else sys.argv[1:])])
        Path(args.json).write_text(json.dumps({"command": command, "figures": data}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
