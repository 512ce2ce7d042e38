"""Benchmark: how fast storm starts jobs, against mpiexec on the same machine in the same run.

``storm bench launch`` starts a throwaway local cluster (2 nodes x 1 PE unless told otherwise) and measures:

- submit-to-running and submit-to-done of a 2-rank mpi4py hello job, through the Python client (the MM's
  own latency) and through the ``storm submit --wait`` command (what a user waits, CLI start-up included),
  against ``mpiexec -n 2`` of the same program; interleaved, so that noise hits both alike;
- jobs per second for a stream of one-rank ``true`` jobs submitted as fast as one client can.

It prints a table and writes every raw figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from storm.mm.protocol import JobState
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster

HELLO = [sys.executable, "-m", "storm.tools.apps.hello"]


def wait_running(client: Client, job_id: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (state := JobState(client.job(job_id).state)) is not JobState.RUNNING and not state.terminal:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not start")
        time.sleep(0.001)


def one_storm_run(client: Client, cwd: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    job_id = client.submit(HELLO, 2, cwd=str(cwd), output=str(cwd / "hello-%j.out"))
    wait_running(client, job_id)
    t_running = time.perf_counter()
    job = client.wait(job_id, timeout=60)
    t_done = time.perf_counter()
    if job.state != JobState.COMPLETED:
        raise RuntimeError(f"hello job {job_id} {job.state}: {job.reason}")
    return t_running - t0, t_done - t0


def one_cli_run(cluster: LocalCluster, cwd: Path) -> float:
    env = {**os.environ, "STORM_MM": cluster.endpoint}
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "storm.tools.cli", "submit", "-n", "2", "--wait", "--output", "cli-%j.out"]
    subprocess.run([*argv, "--", *HELLO], env=env, cwd=cwd, check=True, capture_output=True, timeout=60)
    return time.perf_counter() - t0


def one_mpiexec_run(cwd: Path) -> float:
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    t0 = time.perf_counter()
    subprocess.run([mpiexec, "-n", "2", *HELLO], cwd=cwd, check=True, capture_output=True, timeout=60)
    return time.perf_counter() - t0


def throughput(client: Client, cwd: Path, jobs: int) -> dict[str, float]:
    t0 = time.perf_counter()
    ids = [client.submit(["true"], 1, cwd=str(cwd), output="/dev/null") for _ in range(jobs)]
    t_submitted = time.perf_counter()
    ends = [client.wait(i, timeout=600) for i in ids]
    t_done = time.perf_counter()
    failed = [j.id for j in ends if j.state != JobState.COMPLETED]
    if failed:
        raise RuntimeError(f"throughput jobs failed: {failed}")
    return {
        "jobs": jobs,
        "submit_seconds": t_submitted - t0,
        "total_seconds": t_done - t0,
        "submitted_per_second": jobs / (t_submitted - t0),
        "completed_per_second": jobs / (t_done - t0),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(repeats: int, jobs: int, nodes: int, pes: int, out: Path | None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="storm-bench-") as tmp:
        work = Path(tmp)
        cluster = LocalCluster(
            dir=work / "cluster", nodes=nodes, pes_per_node=pes, nm_settings={"kill_grace": 1.0}
        )
        cluster.up()
        try:
            with cluster.client(timeout=60) as client:
                one_storm_run(client, work)  # warm the page cache for both
                one_mpiexec_run(work)
                storm_running, storm_done, cli_done, mpiexec_done = [], [], [], []
                for _ in range(repeats):
                    running, done = one_storm_run(client, work)
                    storm_running.append(running)
                    storm_done.append(done)
                    cli_done.append(one_cli_run(cluster, work))
                    mpiexec_done.append(one_mpiexec_run(work))
                stream = throughput(client, work, jobs)
        finally:
            cluster.down()
    result: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "cluster": {"nodes": nodes, "pes_per_node": pes},
        "repeats": repeats,
        "hello_2_ranks_seconds": {
            "storm_submit_to_running": storm_running,
            "storm_submit_to_done": storm_done,
            "storm_cli_submit_wait": cli_done,
            "mpiexec": mpiexec_done,
        },
        "ratios_of_medians": {
            "storm_done_over_mpiexec": statistics.median(storm_done) / statistics.median(mpiexec_done),
            "storm_cli_over_mpiexec": statistics.median(cli_done) / statistics.median(mpiexec_done),
        },
        "throughput_true_jobs": stream,
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def print_table(result: dict[str, object]) -> None:
    times = result["hello_2_ranks_seconds"]
    assert isinstance(times, dict)
    print(f"2-rank mpi4py hello, {result['repeats']} runs each (seconds)")
    print(f"{'':28} {'median':>8} {'min':>8} {'max':>8}")
    for name, values in times.items():
        s = summary(values)
        print(f"{name:28} {s['median']:8.3f} {s['min']:8.3f} {s['max']:8.3f}")
    ratios = result["ratios_of_medians"]
    assert isinstance(ratios, dict)
    for name, value in ratios.items():
        print(f"{name:28} {value:8.2f}x")
    stream = result["throughput_true_jobs"]
    assert isinstance(stream, dict)
    print(
        f"throughput: {stream['jobs']} one-rank `true` jobs, {stream['completed_per_second']:.1f} jobs/s "
        f"completed ({stream['submitted_per_second']:.0f}/s accepted)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=200, help="jobs in the throughput stream")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--pes-per-node", type=int, default=1)
    parser.add_argument(
        "--json", type=Path, default=Path("results/launch.json"), help="where to write raw figures"
    )
    args = parser.parse_args(argv)
    result = run(args.repeats, args.jobs, args.nodes, args.pes_per_node, args.json)
    print_table(result)
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
