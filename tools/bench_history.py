"""Benchmark: `storm history` over a long history, and what a big history query costs storm-mm's others.

``storm bench history [--finished N] [--json F]`` fills a store with N finished jobs (default 100,000),
their ends spread evenly over the last 30 days (so ``--since now-1day`` selects about 1/30 of them), starts
storm-mm on it with two emulated node managers, and measures:

- the wall time of the real command ``storm history --since now-1day`` and ``--since`` 7 days ago (median
  of 3, the CLI's start-up included), and how many jobs each printed;
- storm-mm's responsiveness while a big query runs: a probe client sends a small request (``list_jobs`` of
  one job) every PROBE_INTERVAL and times each answer, first with nothing else going on, then while another
  client pages through the whole history (every job, 10,000 a page) again and again. Median, p99 and max of
  the probe's round trips, both ways, and how long the whole history took to read.

``storm bench scale``'s queue part runs :func:`measure` on its own cluster (10,000 queued, 100,000
finished) and adds :func:`figures` to its table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from storm.mm import protocol as p
from storm.mm.accounting import HistoryQuery
from storm.mm.history_db import HistoryReader
from storm.mm.jobs import Job, JobSpec
from storm.mm.states import JobState
from storm.mm.store import Store
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster

Json = dict[str, Any]
PROBE_INTERVAL = 0.01
DAY = 86400.0


def fill(path: Path, finished: int, now: float) -> None:
    """``finished`` COMPLETED one-rank jobs (with a whole environment, as storm-mm keeps it), ending evenly
    over the 30 days before ``now``, in a new store."""
    store = Store(path, "NORMAL")
    spec = JobSpec(
        name="old", uid=os.getuid(), gid=os.getgid(), user="bench", ranks=1, argv=("sleep", "1"), cwd="/tmp",
        env=dict(os.environ), time_limit=60.0, output="/dev/null", error="/dev/null",
    )  # fmt: skip
    step = 30 * DAY / max(1, finished)
    try:
        for first in range(0, finished, 10_000):
            with store.transaction():
                for i in range(first, min(finished, first + 10_000)):
                    end = now - 30 * DAY + (i + 1) * step
                    job = store.add_job(spec, end - 2.0)
                    done = Job(
                        id=job.id, spec=spec, state=JobState.COMPLETED, submit_time=end - 2.0,
                        start_time=end - 1.0, end_time=end, exit_code=0, placement=(("emu0", 0),), row=0,
                    )  # fmt: skip
                    store.save_job(done)
    finally:
        store.close()


def cli_run(endpoint: str, *args: str, repeats: int = 3) -> tuple[float, int]:
    """Median wall time of the real `storm history` with ``args`` (output to a pipe), and its job lines."""
    env = {**os.environ, "STORM_MM": endpoint}
    times, lines = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "storm.tools.cli", "history", "--noheader", *args],
            env=env, capture_output=True, text=True, check=True, timeout=300,
        )  # fmt: skip
        times.append(time.perf_counter() - started)
        lines = len(done.stdout.splitlines())
    return statistics.median(times), lines


def read_all(endpoint: str) -> int:
    """Every job of the history, page by page, as `storm history --allusers --since` the epoch reads it."""
    with Client(endpoint, timeout=120) as client:
        count, after = 0, 0
        while True:
            page = client.call(p.JobHistory(all_users=True, since=0.0, after=after), p.HistoryPage)
            count += len(page.jobs)
            if not page.more:
                return count
            after = page.more


def probe(endpoint: str, stop: threading.Event, seconds: float) -> list[float]:
    """Round trips (ms) of a small request, one every PROBE_INTERVAL, until ``stop`` or ``seconds``."""
    found: list[float] = []
    ends = time.monotonic() + seconds
    with Client(endpoint, timeout=60) as client:
        while not stop.is_set() and time.monotonic() < ends:
            started = time.perf_counter()
            client.call(p.ListJobs(job_ids=(1,)), p.JobList)
            found.append((time.perf_counter() - started) * 1e3)
            stop.wait(PROBE_INTERVAL)
    return found


def summary(ms: list[float]) -> Json:
    ordered = sorted(ms)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "median": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max": ordered[-1],
    }


def read_queue(endpoint: str) -> int:
    """Every job as `storm queue --all --last 0` reads it: list_jobs pages, which storm-mm answers on its
    event loop (the control: what a history read would cost the loop if it were answered there)."""
    with Client(endpoint, timeout=120) as client:
        return len(client.jobs(everything=True))


def read_loop(endpoint: str, seconds: float, queue: bool) -> None:
    """Whole-history reads back to back for ``seconds`` (at least one); prints [[seconds, jobs], ...]."""
    reads: list[tuple[float, int]] = []
    ends = time.monotonic() + seconds
    while not reads or time.monotonic() < ends:
        started = time.perf_counter()
        rows = read_queue(endpoint) if queue else read_all(endpoint)
        reads.append((time.perf_counter() - started, rows))
    print(json.dumps(reads))


def probed_reads(endpoint: str, seconds: float, queue: bool) -> tuple[list[float], list[list[float]]]:
    """The probe while whole-history reads run back to back in a process of their own (in this one they
    would hold the probe's GIL while decoding)."""
    argv = [sys.executable, "-m", "storm.tools.bench_history", "--read-loop", endpoint]
    argv += ["--seconds", str(seconds), *(["--queue"] if queue else [])]
    reader = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        busy = probe(endpoint, threading.Event(), seconds)
        out, _ = reader.communicate(timeout=600)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    return busy, (json.loads(out) if reader.returncode == 0 else [])


def responsiveness(endpoint: str, seconds: float) -> Json:
    """The probe alone for ``seconds``, then while the whole history is read again and again as `storm
    history` reads it (off the loop), then as `storm queue --all` reads it (on the loop: the control)."""
    idle = probe(endpoint, threading.Event(), seconds)
    busy, reads = probed_reads(endpoint, seconds, queue=False)
    control, queue_reads = probed_reads(endpoint, seconds, queue=True)
    return {
        "probe_idle_ms": summary(idle),
        "probe_during_ms": summary(busy),
        "probe_during_queue_all_ms": summary(control),
        "queue_all_seconds": statistics.median([s for s, _ in queue_reads]) if queue_reads else None,
        "full_reads": len(reads),
        "full_read_seconds": statistics.median([s for s, _ in reads]) if reads else None,
        "full_rows": int(reads[-1][1]) if reads else 0,
    }


def measure(endpoint: str, since: float, *, seconds: float = 5.0) -> Json:
    """The figures on a running cluster: `storm history --since` ``since`` (epoch seconds), and the
    responsiveness while the whole history is read."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    wall, rows = cli_run(endpoint, "--allusers", "--since", stamp)
    return {
        "since": stamp,
        "history_seconds": wall,
        "history_rows": rows,
        **responsiveness(endpoint, seconds),
    }


def page_seconds(store: Path) -> float:
    """Median time storm-mm's reader takes to read and encode one full page of the history (in process)."""
    reader = HistoryReader(store)
    try:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            reader.answer(HistoryQuery(since=0.0, limit=p.HISTORY_PAGE), 1)
            times.append(time.perf_counter() - started)
    finally:
        reader.close()
    return statistics.median(times)


def figures(result: Json, part: str, stored: int) -> list[Json]:
    """Rows for storm bench scale's table (its Figure's fields)."""
    if "history_seconds" not in result:
        return []
    during, idle = result["probe_during_ms"], result["probe_idle_ms"]
    return [
        {"part": part, "name": f"`storm history --since` over {stored:,} stored ({result['history_rows']:,} "
         "shown)", "value": result["history_seconds"], "unit": "s", "goal": "< 1 s",
         "met": result["history_seconds"] < 1.0},
        {"part": part, "name": f"whole history read ({result['full_rows']:,} jobs, by pages)",
         "value": result["full_read_seconds"], "unit": "s"},
        {"part": part, "name": "MM round trip meanwhile: p99 (idle p99)", "value": during.get("p99"),
         "unit": f"ms ({idle.get('p99', 0):.3g} ms)"},
        {"part": part, "name": "MM round trip meanwhile: max (idle max)", "value": during.get("max"),
         "unit": f"ms ({idle.get('max', 0):.3g} ms)"},
        {"part": part, "name": "  the same during `storm queue --all` reads (on the loop): p99",
         "value": result["probe_during_queue_all_ms"].get("p99"), "unit": "ms"},
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=100_000, help="finished jobs in the store")
    parser.add_argument("--seconds", type=float, default=5.0, help="each probe window (s; default 5)")
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument("--read-loop", metavar="ENDPOINT", help=argparse.SUPPRESS)  # (the reader's process)
    parser.add_argument("--queue", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.read_loop:
        read_loop(args.read_loop, args.seconds, args.queue)
        return 0
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="storm-bench-history-") as tmp:
        directory = Path(tmp) / "history"
        (directory / "mm").mkdir(parents=True)
        store = directory / "mm" / "storm.db"
        started = time.perf_counter()
        fill(store, args.finished, now)
        filled = time.perf_counter() - started
        cluster = LocalCluster(dir=directory, nodes=0, emulated=2, nm_settings={"kill_grace": 1.0})
        try:
            cluster.up()
            day = cli_run(cluster.endpoint, "--allusers", "--since", "now-1day")
            week = cli_run(cluster.endpoint, "--allusers", "--since", "now-7days")
            busy = responsiveness(cluster.endpoint, args.seconds)
        finally:
            cluster.down()
        size = store.stat().st_size / 2**20
        page = page_seconds(store)
    result: Json = {
        "finished": args.finished, "fill_seconds": filled, "store_mb": size,
        "since_1day": {"seconds": day[0], "rows": day[1]},
        "since_7days": {"seconds": week[0], "rows": week[1]},
        **busy, "page_read_encode_seconds": page, "load_after": [round(v, 2) for v in os.getloadavg()],
    }  # fmt: skip
    idle, during, control = busy["probe_idle_ms"], busy["probe_during_ms"], busy["probe_during_queue_all_ms"]
    print(f"store: {args.finished:,} finished jobs, {size:.0f} MiB")
    for label, (wall, rows) in (("now-1day", day), ("now-7days", week)):
        print(f"storm history --since {label}: {wall:.3f} s for {rows:,} jobs (goal < 1 s)")
    print(f"whole history by pages: {busy['full_read_seconds']:.3f} s for {busy['full_rows']:,} jobs")
    print(f"the same jobs by `storm queue --all` pages (on the MM's loop): {busy['queue_all_seconds']:.3f} s")
    for name, s in (
        ("idle", idle),
        ("during whole-history reads", during),
        ("during `storm queue --all` reads (control)", control),
    ):
        print(
            f"MM round trip {name}: median {s['median']:.2f} ms, p99 {s['p99']:.2f} ms, max {s['max']:.2f} ms"
            f" ({s['count']} probes)"
        )
    print(
        f"one page of {p.HISTORY_PAGE:,} jobs read and encoded by storm-mm's reader: {page * 1e3:.0f} ms (how"
        " long the MM's loop would stall per page if it answered on the loop)"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
