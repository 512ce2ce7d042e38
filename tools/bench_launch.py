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
import contextlib
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import zmq

from storm.mm import protocol as p
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


def measure_throughput(
    jobs: int = 1000,
    nodes: int = 2,
    *,
    pes_per_node: int = 1,
    window: int = 200,
    warmup: int = 50,
    directory: Path | None = None,
) -> dict[str, object]:
    """Jobs per second end to end for a stream of one-rank ``true`` jobs on a throwaway local cluster.

    ``jobs`` one-rank ``true`` jobs go to ``nodes`` node managers of ``pes_per_node`` PEs each through one
    client connection, at most ``window`` of them unanswered (each submission's reply is followed at once by
    a ``wait_job``), after ``warmup`` jobs that are not counted. The time is from the first submission sent
    to the last job's end recorded: storm-mm answers a ``wait_job`` only once the job's terminal state is
    committed to its store. Every job must end COMPLETED.

    Returns ``jobs_per_second`` and a breakdown: CPU milliseconds per job of storm-mm, of the node managers
    and of what they start (launcher, job shells and ranks), and of this client; the median and 99th
    percentile of each job's wait in the queue (submit to start) and run (start to end) as storm-mm recorded
    them; the host's load average before the run. It uses only what every storm has (a local cluster and
    the client protocol), so it can measure an older installation too (``--against``).
    """
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="storm-bench-tp-")))
        cluster = LocalCluster(
            dir=directory / "cluster", nodes=nodes, pes_per_node=pes_per_node,
            mm_settings={"submit_rate": 1_000_000.0, "submit_burst": 1_000_000},
            nm_settings={"kill_grace": 1.0},
        )  # fmt: skip
        cluster.up()
        stack.callback(cluster.down)
        cwd = str(directory)
        _stream(cluster.endpoint, warmup, window, cwd)  # daemons warm: caches, connections, job shells
        load = os.getloadavg()
        daemons = {"mm": [cluster.mm.pid] if cluster.mm else [], "nm": [d.pid for d in cluster.nms]}
        before, client_before = _cpu(daemons), _own_cpu()
        started = time.perf_counter()
        infos = _stream(cluster.endpoint, jobs, window, cwd)
        seconds = time.perf_counter() - started
        after, client_after = _cpu(daemons), _own_cpu()
    failed = [i.id for i in infos if i.state != JobState.COMPLETED]
    if failed:
        raise RuntimeError(f"{len(failed)} throughput job(s) did not complete, e.g. {failed[:5]}")
    cpu_ms = {name: 1000 * (after[name] - before[name]) / jobs for name in after}
    cpu_ms["client"] = 1000 * (client_after - client_before) / jobs
    queued = [i.start_time - i.submit_time for i in infos if i.start_time is not None]
    ran = [i.end_time - i.start_time for i in infos if i.start_time is not None and i.end_time is not None]
    return {
        "jobs": jobs,
        "nodes": nodes,
        "pes_per_node": pes_per_node,
        "window": window,
        "seconds": seconds,
        "jobs_per_second": jobs / seconds,
        "completed_per_second": jobs / seconds,  # the name storm bench system reads
        "cpu_ms_per_job": cpu_ms,
        "cpu_ms_per_job_total": sum(cpu_ms.values()),
        "queued_ms": _percentiles(queued),
        "ran_ms": _percentiles(ran),
        "load_before": list(load),
        "cpus": len(os.sched_getaffinity(0)),
    }


SCALE_RUNS = 5  # streams behind `storm bench scale`'s launch row: one run moves by 10-20% with the host


def scale_figures(work: Path, quick: bool) -> list[SimpleNamespace]:
    """`storm bench scale`'s rows (fields of its Figure): the median of SCALE_RUNS streams of 1,000 jobs on
    2 node managers (one of 200 if ``quick``), judged against issue 18's goal, the slowest and fastest run
    beside it. The runs' clusters live under ``work``."""
    runs = 1 if quick else SCALE_RUNS
    jobs = 200 if quick else 1000
    rates = sorted(
        _rate(measure_throughput(jobs, 2, directory=_fresh(work / f"launch{i}"))) for i in range(runs)
    )
    median = statistics.median(rates)
    name = "1-rank `true` jobs end to end, 2 NMs" + (f" (median of {runs} runs)" if runs > 1 else "")
    rows = [_row(name, median, goal=">= 500", met=median >= 500)]
    if runs > 1:
        rows += [_row("  slowest run", rates[0]), _row("  fastest run", rates[-1])]
    return rows


def _row(name: str, value: float, goal: str = "", met: bool | None = None) -> SimpleNamespace:
    return SimpleNamespace(part="launch", name=name, value=value, unit="jobs/s", goal=goal, met=met)


def _fresh(directory: Path) -> Path:
    directory.mkdir(parents=True)
    return directory


def _stream(endpoint: str, jobs: int, window: int, cwd: str) -> list[p.JobInfo]:
    """Submit ``jobs`` one-rank ``true`` jobs over one DEALER, each followed by its ``wait_job``, with at most
    ``window`` jobs unfinished; the jobs' records as their waits returned them."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    env = dict(os.environ)  # a user's environment travels with every job: its size is part of the cost
    reqs = itertools.count(1)
    ended: list[p.JobInfo] = []
    submitted = 0
    deadline = time.monotonic() + 60 + jobs / 10
    try:
        while len(ended) < jobs:
            while submitted < jobs and submitted - len(ended) < window:
                msg = p.SubmitJob(
                    req=next(reqs), ranks=1, argv=("true",), cwd=cwd, env=env, output="/dev/null"
                )
                sock.send(p.encode(msg))
                submitted += 1
            if not sock.poll(max(1, int(1000 * (deadline - time.monotonic())))):
                raise TimeoutError(f"{jobs - len(ended)} of {jobs} jobs had not ended in time")
            reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
            if isinstance(reply, p.JobSubmitted):
                sock.send(p.encode(p.WaitJob(req=next(reqs), job_id=reply.job_id)))
            elif isinstance(reply, p.JobList):
                ended.extend(reply.jobs)
            else:
                raise RuntimeError(f"storm-mm answered {reply}")
    finally:
        sock.close()
    return ended


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on (field N of proc(5) is ``[N - 3]``), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _tree_cpu(pid: int) -> tuple[float, float]:
    """Seconds of CPU of a process itself, and of everything under it (live descendants and every child
    reaped so far, which the kernel adds to its parent's)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _stat(int(e))) is not None}
    children: dict[int, list[int]] = {}
    for child, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(child)
    if pid not in stats:
        return 0.0, 0.0
    own = stats[pid]
    below = (int(own[13]) + int(own[14])) / tick
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop()
        below += sum(int(v) for v in stats[child][11:15]) / tick  # utime, stime, cutime, cstime
        pending.extend(children.get(child, []))
    return (int(own[11]) + int(own[12])) / tick, below


def _cpu(daemons: dict[str, list[int]]) -> dict[str, float]:
    result = {"mm": 0.0, "nm": 0.0, "nm_children": 0.0}
    for name, pids in daemons.items():
        for pid in pids:
            own, below = _tree_cpu(pid)
            result[name] += own
            if name == "nm":
                result["nm_children"] += below
    return result


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    return {
        "median": 1000 * statistics.median(ordered),
        "p99": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(repeats: int, jobs: int, nodes: int, pes: int, out: Path | None) -> dict[str, object]:
    """The hello latencies against mpiexec, then the throughput stream (measure_throughput)."""
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
        finally:
            cluster.down()
    stream = measure_throughput(jobs, nodes, pes_per_node=pes)
    result: dict[str, object] = {
        "machine": machine(),
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
    write(result, out)
    return result


def machine() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


def write(result: dict[str, object], out: Path | None) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")


def measure_elsewhere(python: str, jobs: int, nodes: int, pes: int) -> dict[str, object]:
    """measure_throughput run by another installation's interpreter (this file, its storm): old and new code
    measured in one run, interleaved, so that the host's load hits both alike."""
    argv = [python, __file__, "--worker", str(jobs), str(nodes), str(pes)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not measure: {done.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def throughput_runs(
    repeats: int, jobs: int, nodes: int, pes: int, *, against: str | None = None, out: Path | None = None
) -> dict[str, object]:
    """``storm bench launch --throughput``: measure_throughput ``repeats`` times (and as many times through
    the ``against`` interpreter, alternating)."""
    ours: list[dict[str, object]] = []
    theirs: list[dict[str, object]] = []
    for _ in range(repeats):
        ours.append(measure_throughput(jobs, nodes, pes_per_node=pes))
        print_throughput(ours[-1], "this storm")
        if against:
            theirs.append(measure_elsewhere(against, jobs, nodes, pes))
            print_throughput(theirs[-1], against)
    result: dict[str, object] = {"machine": machine(), "runs": ours}
    if against:
        result["against"] = {"python": against, "runs": theirs}
        rates = [statistics.median(_rate(r) for r in runs) for runs in (ours, theirs)]
        result["speedup_of_medians"] = rates[0] / rates[1]
        ratio = rates[0] / rates[1]
        print(f"jobs/s, median of {repeats}: {rates[0]:.0f} here, {rates[1]:.0f} there: {ratio:.2f}x")
    write(result, out)
    return result


def _rate(stream: dict[str, object]) -> float:
    rate = stream["jobs_per_second"]
    assert isinstance(rate, float)
    return rate


def print_throughput(stream: dict[str, object], label: str = "") -> None:
    cpu = stream["cpu_ms_per_job"]
    queued, ran = stream["queued_ms"], stream["ran_ms"]
    assert isinstance(cpu, dict) and isinstance(queued, dict) and isinstance(ran, dict)
    load = stream.get("load_before", [0.0])
    assert isinstance(load, list)
    print(
        f"{label + ': ' if label else ''}{stream['jobs']} one-rank `true` jobs on {stream['nodes']} nodes x "
        f"{stream['pes_per_node']} PE: {_rate(stream):.0f} jobs/s end to end "
        f"(load {load[0]:.2f} before)"
    )
    parts = ", ".join(f"{name} {value:.2f}" for name, value in cpu.items())
    print(f"  CPU ms per job: {parts}; total {stream['cpu_ms_per_job_total']:.2f}")
    print(
        f"  per job, ms (median / p99): queued {queued['median']:.1f} / {queued['p99']:.1f}, "
        f"ran {ran['median']:.1f} / {ran['p99']:.1f}"
    )


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
    print_throughput(stream, "throughput")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the throughput stream")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--pes-per-node", type=int, default=1)
    parser.add_argument(
        "--throughput", action="store_true", help="only the throughput stream, --repeats times"
    )
    parser.add_argument(
        "--against", metavar="PYTHON",
        help="with --throughput: also measure the storm installed for this interpreter, alternating",
    )  # fmt: skip
    parser.add_argument(
        "--json", type=Path, default=None, help="where to write raw figures (results/launch.json without"
        " --throughput, else none)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.throughput:
        throughput_runs(
            args.repeats, args.jobs, args.nodes, args.pes_per_node, against=args.against, out=args.json
        )
    else:
        out = args.json or Path("results/launch.json")
        print_table(run(args.repeats, args.jobs, args.nodes, args.pes_per_node, out))
        print(f"raw figures: {out}")
    return 0


def worker(argv: list[str]) -> int:
    """For measure_elsewhere: one measurement, as JSON on stdout."""
    jobs, nodes, pes = (int(a) for a in argv)
    print(json.dumps(measure_throughput(jobs, nodes, pes_per_node=pes)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker(sys.argv[2:]))
    sys.exit(main())
