"""Benchmark: how soon ``storm classes`` shows a class change that a node manager made.

``storm bench classes`` starts a throwaway FCS cluster (2 nodes x 1 PE, 100 ms slices unless told
otherwise), runs coarse-grained BSP jobs (every rank becomes DC after its cslots_min slots) one after the
other, and polls the MM's class history (``storm classes --history``) every 2 ms. For each change it takes
the time from the node manager's decision (the change's own timestamp, taken at the end of the slot) to the
moment a client first sees it: one heartbeat's delivery is not in it, the NM's processing and report, the
MM's handling and the client's round trip are. Node managers report a change at the slot it happens
(nm/node.py); before, it waited for the next periodic report (up to the report interval, 2 s here).

It prints a table and writes every raw figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from storm.mm import protocol as p
from storm.mm.protocol import JobState, Policy
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster

COARSE = [sys.executable, "-m", "storm.tools.apps.bsp", "--granularity", "0.3", "--seconds", "6"]
POLL = 0.002


def watch(client: Client, job_id: int, timeout: float) -> list[float]:
    """Seconds from each of the job's class changes to its first sight, until the job ends."""
    seen: dict[tuple[int, str, float], float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.call(p.GetClasses(job_ids=(job_id,), history=True), p.ClassesView)
        now = time.time()
        for change in view.changes:
            seen.setdefault((change.rank, change.new, change.time), now - change.time)
        if JobState(client.job(job_id).state).terminal:
            break
        time.sleep(POLL)  # a sampling period
    return list(seen.values())


def run(jobs: int, slice_: float, output: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="storm-bench-classes-") as tmp:
        cluster = LocalCluster(
            Path(tmp), nodes=2, pes_per_node=1, policy=Policy.FCS, mm_settings={"slice": slice_},
            fcs_settings={"cslots_min": 3},
        )  # fmt: skip
        cluster.up()
        try:
            latencies: list[float] = []
            with cluster.client() as client:
                for _ in range(jobs):
                    job_id = client.submit(COARSE, 2, cwd=tmp)
                    latencies += watch(client, job_id, 60.0)
        finally:
            cluster.down()
    ms = sorted(x * 1000 for x in latencies)
    result: dict[str, object] = {
        "host": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0))},
        "slice_ms": slice_ * 1000,
        "changes": len(ms),
        "latency_ms": ms,
        "median_ms": statistics.median(ms) if ms else None,
        "max_ms": ms[-1] if ms else None,
        "median_over_slice": statistics.median(ms) / (slice_ * 1000) if ms else None,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench classes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--slice", type=float, default=0.1, help="the MM's time slice in seconds")
    parser.add_argument("--json", type=Path, default=Path("results/classes.json"))
    args = parser.parse_args(argv)
    result = run(args.jobs, args.slice, args.json)
    print(f"{'changes':>8} {'slice ms':>9} {'median ms':>10} {'max ms':>8} {'median/slice':>13}")
    if result["changes"]:
        print(
            f"{result['changes']:>8} {result['slice_ms']:>9.0f} {result['median_ms']:>10.1f} "
            f"{result['max_ms']:>8.1f} {result['median_over_slice']:>13.2f}"
        )
    else:
        print("no class change seen")
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
