"""Benchmark: what gang scheduling costs, from the node managers' own traces, on throwaway local clusters.

``storm bench gang`` (or ``python -m storm.tools.bench_gang [--quick] [--json results/gang.json]``) runs
four measurements; every cluster is gang, MPL 2, 100 ms slices unless said otherwise, and every NM traces
each heartbeat (nm/switcher.py: ``seq row sent received done ranks at begun``, all ``time.time()`` of this
host; ``at`` is the instant the heartbeat named, ``begun`` when the NM's switch began):

1. Heartbeat delivery, with 2, 8 and 32 node managers and no jobs, for a window of 5 s each (--quick: 2 s,
   2 and 8 NMs), idle and then under CPU load (two busy-loop processes). Of the heartbeats the MM sent in
   the window: *latency* = received - sent, per NM and heartbeat; *spread* = max - min of begun over the
   NMs, per heartbeat that every NM saw; median, p99 and max of both. *Lost*: heartbeats of the window's
   seq range that some NM never traced (its SUB socket conflates: a late NM skips to the newest). The
   issue's goal: spread p99 under 1 ms with 8 NMs.
2. Context switches: 2 nodes x 1 PE, two 2-rank BSP jobs (2 ms granularity, allreduce) in two rows, so
   that every slice stops one job and continues the other. Of each traced switch that changed ranks
   (ranks > 0) within the window: *NM* = done - begun (signals sent until /proc shows every rank in
   its new state) and *MM* = done - sent (from the MM's send: delivery included).
3. Overhead: CPU time (user + system) of the MM and of each NM per second of wall time, in % of one CPU,
   for an idle batch cluster, an idle gang cluster and the gang cluster of 2 while its jobs switch.
   Section 1 adds the same figures per cluster size. psutil counts clock ticks (10 ms): over a 5 s
   window a figure is good to about 0.2 %.
4. A compute-bound 2-rank BSP job (10 ms granularity, allreduce, ~4 s) alone on a batch cluster and alone
   on a gang cluster (2 nodes x 1 PE), interleaved, 3 runs each (--quick: 1); submit-to-end wall time
   from the job's submit_time and end_time (start-to-end is kept too). The issue's goal: gang/batch of the
   medians at most 1.05.

5. The host's floor for section 1: the same PUB -> N SUB delivery with minimal receivers (a blocking
   ``recv`` loop, real-time priority like the daemons, nothing else), so that the NMs' own cost can be told
   from what this host does to any N processes woken at once.

Percentiles are nearest-rank. Anything else running on the host skews all of it: the JSON keeps the load
average from before the run. It prints a table per section and writes the per-run summaries and
parameters as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies

from storm.mm.protocol import JobState, Policy
from storm.nm.switcher import TraceLine
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster, LocalClusterError, wait_for

SLICE = 0.1
MPL = 2
BATCH = 8  # node managers started at a time: 32 Python interpreters at once crawl on a small machine
NODE_TIMEOUT = 60.0  # for each batch to register
JOB_TIMEOUT = 120.0
BUSY = [sys.executable, "-c", "while True: pass"]
BSP = [sys.executable, "-m", "storm.tools.apps.bsp", "--pattern", "allreduce"]
Json = dict[str, Any]


# ------------------------------------------------------------------------------------------- analysis


def parse_trace(text: str) -> list[TraceLine]:
    """The complete lines of an NM's trace (a line still being written is skipped)."""
    return [t for t in map(TraceLine.parse, text.splitlines(keepends=True)) if t is not None]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary_ms(seconds: list[float]) -> Json:
    """count, median, p99 and max, in milliseconds (zeros for no values)."""
    if not seconds:
        return {"count": 0, "median": 0.0, "p99": 0.0, "max": 0.0}
    ms = [s * 1000 for s in seconds]
    return {"count": len(ms), "median": statistics.median(ms), "p99": percentile(ms, 99), "max": max(ms)}


def in_window(traces: dict[str, list[TraceLine]], start: float, end: float) -> dict[str, list[TraceLine]]:
    """Each node's lines for the heartbeats the MM sent in [start, end)."""
    return {node: [t for t in lines if start <= t.sent < end] for node, lines in traces.items()}


def delivery(traces: dict[str, list[TraceLine]]) -> Json:
    """Latency, spread, lateness and losses of the heartbeats in ``traces`` (node -> its lines, one window).

    *latency*: received - sent. *spread*: per heartbeat every NM traced, max - min over the NMs of when the
    switch began (at the instant the heartbeat named, or on arrival). *lateness*: switch began - the
    instant named, per NM and heartbeat that named one (negative: early); *late*: of those, the ones that
    arrived after their instant (they switch at once)."""
    seen = {node: {t.seq: t for t in lines} for node, lines in traces.items()}
    every = set().union(*seen.values()) if seen else set()
    expected = range(min(every), max(every) + 1) if every else range(0)
    missing = {node: [s for s in expected if s not in got] for node, got in seen.items()}
    complete = [s for s in expected if all(s in got for got in seen.values())]
    latency = [got[s].received - got[s].sent for s in complete for got in seen.values()]
    spread = [
        max(got[s].switched for got in seen.values()) - min(got[s].switched for got in seen.values())
        for s in complete
    ]
    named = [t for lines in traces.values() for t in lines if t.at > 0]
    return {
        "heartbeats": len(expected),
        "complete": len(complete),
        "lost": len(expected) - len(complete),  # heartbeats some NM never traced
        "lost_deliveries": sum(len(m) for m in missing.values()),  # (NM, heartbeat) pairs
        "lost_by_node": {node: len(m) for node, m in missing.items() if m},
        "latency_ms": summary_ms(latency),
        "spread_ms": summary_ms(spread),
        "lateness_ms": summary_ms([t.switched - t.at for t in named]),
        "late": sum(1 for t in named if t.received > t.at),
    }


def switching(traces: dict[str, list[TraceLine]]) -> Json:
    """The traced switches that changed ranks: on the NM (done - begun) and from the MM (done - sent)."""
    changed = [t for lines in traces.values() for t in lines if t.ranks > 0]
    return {
        "heartbeats_by_node": {node: len(lines) for node, lines in traces.items()},
        "switches_by_node": {node: sum(1 for t in lines if t.ranks > 0) for node, lines in traces.items()},
        "nm_done_minus_received_ms": summary_ms([t.done - t.switched for t in changed]),  # (the old name)
        "mm_done_minus_sent_ms": summary_ms([t.done - t.sent for t in changed]),
    }


def cpu_percent(before: dict[str, float], after: dict[str, float], wall: float) -> Json:
    """% of one CPU each daemon used between two readings of cpu_seconds, plus the NMs' mean and max."""
    used = {name: 100 * (after[name] - before[name]) / wall for name in before}
    nms = [v for name, v in used.items() if name != "mm"]
    return {"mm": used["mm"], "nm_mean": statistics.mean(nms), "nm_max": max(nms), "by_daemon": used}


# ------------------------------------------------------------------------------------------- clusters


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """User + system CPU seconds of the MM ("mm") and of each NM (by node name; an emulator of many nodes
    as emulatorK) so far."""
    assert cluster.mm is not None
    pids = {"mm": cluster.mm.pid, **{d.name.split()[-1]: d.pid for d in [*cluster.nms, *cluster.emulators]}}
    readings = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        readings[name] = times.user + times.system
    return readings


def start(cluster: LocalCluster) -> None:
    """LocalCluster.up, but node managers start BATCH at a time, each batch with NODE_TIMEOUT to register.

    The caller tears the cluster down (in ``finally``) whatever happens here."""
    if cluster.running():
        raise LocalClusterError(f"a local cluster already runs in {cluster.dir}")
    (cluster.dir / "nodes").mkdir(parents=True, exist_ok=True)
    cluster.write_config()
    cluster.start_mm()
    for first in range(0, cluster.nodes, BATCH):
        batch = range(first, min(first + BATCH, cluster.nodes))
        cluster.nms += [cluster.start_nm(i) for i in batch]
        cluster.save()
        cluster.wait_nodes_up([f"node{i}" for i in batch], timeout=NODE_TIMEOUT)


@contextlib.contextmanager
def running(directory: Path, nodes: int, policy: Policy) -> Iterator[LocalCluster]:
    mm: dict[str, object] = {"mpl": MPL, "slice": SLICE} if policy.cycles else {}
    cluster = LocalCluster(
        dir=directory, nodes=nodes, policy=policy, trace=policy.cycles, mm_settings=mm,
        nm_settings={"kill_grace": 1.0},
    )  # fmt: skip
    try:
        start(cluster)
        yield cluster
    finally:
        cluster.down()


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[list[int]]:
    """Busy loops of our own, killed (by their pid) on the way out."""
    procs = [subprocess.Popen(BUSY, stdin=subprocess.DEVNULL) for _ in range(processes)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def read_traces(cluster: LocalCluster, after: float, timeout: float = 10.0) -> dict[str, list[TraceLine]]:
    """Every NM's trace (real and emulated), once each has traced a heartbeat sent after ``after`` (the
    window is complete)."""
    traces: dict[str, list[TraceLine]] = {}

    def complete() -> bool:
        traces.clear()
        traces.update(cluster.trace_lines())
        return all(lines and max(t.sent for t in lines) >= after for lines in traces.values())

    wait_for(complete, timeout, "every node manager to trace the window's last heartbeat")
    return traces


def measure(cluster: LocalCluster, seconds: float) -> tuple[dict[str, list[TraceLine]], Json]:
    """Sleep through a window: the traces of the heartbeats sent in it and the daemons' CPU use."""
    before, t0, w0 = cpu_seconds(cluster), time.time(), time.perf_counter()
    time.sleep(seconds)  # the measurement window itself
    after, t1, wall = cpu_seconds(cluster), time.time(), time.perf_counter() - w0
    traces = read_traces(cluster, t1) if cluster.trace else {}
    return in_window(traces, t0, t1), cpu_percent(before, after, wall)


def priority(cluster: LocalCluster) -> str:
    """How the MM runs (real-time or not), from its log."""
    path = cluster.dir / "mm" / "mm.log"
    found = re.search(r"(real-time priority[^\n]*|ordinary priority[^\n]*)", path.read_text(errors="replace"))
    return found[1] if found else "unknown"


def wait_state(client: Client, job_ids: list[int], timeout: float = JOB_TIMEOUT) -> None:
    """Poll until every job is RUNNING (raise if one ended or the deadline passes)."""

    def all_running() -> bool:
        states = {j.id: JobState(j.state) for j in client.jobs(tuple(job_ids))}
        if any(s.terminal for s in states.values()):
            raise RuntimeError(f"a job ended before the measurement: {states}")
        return all(s is JobState.RUNNING for s in states.values())

    wait_for(all_running, timeout, f"jobs {job_ids} to run", interval=0.01)


def finish(client: Client, job_id: int) -> tuple[float, float]:
    """Wait for the job; (submit-to-end, start-to-end) in seconds from its JobInfo."""
    job = client.wait(job_id, timeout=JOB_TIMEOUT)
    if job.state != JobState.COMPLETED or job.end_time is None or job.start_time is None:
        raise RuntimeError(f"job {job_id} {job.state}: {job.reason}")
    return job.end_time - job.submit_time, job.end_time - job.start_time


# ------------------------------------------------------------------------------------------- sections


def heartbeat_section(work: Path, sizes: list[int], window: float, info: Json) -> list[Json]:
    runs = []
    for nms in sizes:
        with running(work / f"hb{nms}", nms, Policy.GANG) as cluster:
            info.setdefault("daemon_priority", priority(cluster))
            for load in ("idle", "loaded"):
                with cpu_load(2 if load == "loaded" else 0) as busy:
                    traces, cpu = measure(cluster, window)
                runs.append(
                    {"nms": nms, "load": load, "busy_loops": len(busy), **delivery(traces), "cpu": cpu}
                )
    return runs


def switch_section(work: Path, window: float) -> tuple[Json, Json, Json]:
    """(context switches, CPU of the idle gang cluster, CPU while switching)."""
    argv = [*BSP, "--granularity", "0.002", "--seconds", f"{window + 3:g}"]
    with running(work / "switch", 2, Policy.GANG) as cluster, cluster.client(timeout=30) as client:
        _, idle = measure(cluster, window)
        jobs = [client.submit(argv, 2, cwd=str(work), output=str(work / "switch-%j.out")) for _ in range(2)]
        wait_state(client, jobs)
        # RUNNING can come before an NM knows the ranks' pids: start when every NM's last switch moved ranks.
        wait_for(lambda: all(t[-1].ranks > 0 for t in read_traces(cluster, 0).values()), 30, "a switch")
        traces, busy = measure(cluster, window)
        for j in jobs:
            finish(client, j)
    result = {"jobs": 2, "ranks": 2, "argv": argv[1:], "window_seconds": window, **switching(traces)}
    return result, idle, busy


def batch_idle(work: Path, window: float) -> Json:
    with running(work / "batch-idle", 2, Policy.BATCH) as cluster:
        return measure(cluster, window)[1]


def compute_section(work: Path, repeats: int, seconds: float) -> Json:
    iterations = max(1, round(seconds / 0.01))
    argv = [*BSP, "--granularity", "0.01", "--iterations", str(iterations)]
    times: dict[str, list[tuple[float, float]]] = {"batch": [], "gang": []}
    for i in range(repeats):
        for policy in (Policy.BATCH, Policy.GANG):
            with running(work / f"{policy}{i}", 2, policy) as cluster, cluster.client(timeout=30) as client:
                job = client.submit(argv, 2, cwd=str(work), output=str(work / f"{policy}-%j.out"))
                times[policy].append(finish(client, job))
    medians = {p: statistics.median(t[0] for t in runs) for p, runs in times.items()}
    run_medians = {p: statistics.median(t[1] for t in runs) for p, runs in times.items()}
    return {
        "argv": argv[1:],
        "repeats": repeats,
        "submit_to_end_seconds": {p: [t[0] for t in runs] for p, runs in times.items()},
        "start_to_end_seconds": {p: [t[1] for t in runs] for p, runs in times.items()},
        "gang_over_batch": medians["gang"] / medians["batch"],
        "gang_over_batch_start_to_end": run_medians["gang"] / run_medians["batch"],
    }


# One process publishes BEATS heartbeats 100 ms apart to N receivers that only note when each arrived.
FLOOR = r"""
import json, os, subprocess, sys, time, zmq
def fifo():
    try: os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(10))
    except OSError: pass
if sys.argv[1] == "sub":
    fifo(); s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(sys.argv[2])
    got = [(int(s.recv()), time.time()) for _ in range(int(sys.argv[3]))]
    print(json.dumps(got)); sys.exit(0)
n, beats = int(sys.argv[1]), int(sys.argv[2])
fifo(); pub = zmq.Context().socket(zmq.PUB); pub.bind("tcp://127.0.0.1:0")
endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
argv = [sys.executable, __file__, "sub", endpoint, str(beats)]
subs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(n)]
time.sleep(1.5)  # slow joiners: let every subscription arrive before the first counted beat
sent = {}
for i in range(beats + 20):
    sent[i] = time.time(); pub.send(str(i).encode()); time.sleep(0.1)
print(json.dumps({"sent": sent, "received": [json.loads(p.communicate(timeout=60)[0]) for p in subs]}))
"""


def floor_section(sizes: list[int], beats: int) -> list[Json]:
    """Section 5: minimal receivers, so the NMs' figures have a baseline from this very host."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="storm-floor-") as tmp:
        script = Path(tmp) / "floor.py"
        script.write_text(FLOOR)
        outputs = [
            subprocess.run(
                [sys.executable, str(script), str(nms), str(beats)],
                capture_output=True, text=True, check=True, timeout=beats * 0.1 + 120,
            ).stdout
            for nms in sizes
        ]  # fmt: skip
    for nms, out in zip(sizes, outputs, strict=True):
        data = json.loads(out)
        arrivals: dict[int, list[float]] = {}
        for receiver in data["received"]:
            for seq, when in receiver:
                arrivals.setdefault(seq, []).append(when)
        full = {seq: times for seq, times in arrivals.items() if len(times) == nms}
        spread = [max(t) - min(t) for t in full.values()]
        latency = [t - data["sent"][str(seq)] for seq, times in full.items() for t in times]
        runs.append(
            {
                "nms": nms,
                "heartbeats": len(full),
                "latency_ms": summary_ms(latency),
                "spread_ms": summary_ms(spread),
            }
        )
    return runs


def run(sizes: list[int], window: float, repeats: int, compute_seconds: float, out: Path | None) -> Json:
    info: Json = {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}
    info["loadavg_before"] = os.getloadavg()  # other work on the host skews every figure: see how much
    with tempfile.TemporaryDirectory(prefix="storm-bench-gang-") as tmp:
        work = Path(tmp)
        heartbeats = heartbeat_section(work, sizes, window, info)
        switches, gang_idle, gang_busy = switch_section(work, window)
        overhead = {
            "batch_idle": batch_idle(work, window),
            "gang_idle": gang_idle,
            "gang_switching": gang_busy,
        }
        compute = compute_section(work, repeats, compute_seconds)
    floor = floor_section(sizes, int(window * 10))
    at8 = [r["spread_ms"]["p99"] for r in heartbeats if r["nms"] == 8]
    result: Json = {
        "machine": info,
        "parameters": {"slice": SLICE, "mpl": MPL, "window_seconds": window, "sizes": sizes},
        "heartbeats": heartbeats,
        "switching": switches,
        "overhead_cpu_percent": overhead,
        "compute_alone": compute,
        "host_floor": floor,
        "goals": {
            "spread_p99_ms_at_8_nms_under_1": max(at8) < 1.0 if at8 else None,
            "gang_over_batch_at_most_1.05": compute["gang_over_batch"] <= 1.05,
        },
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


# ------------------------------------------------------------------------------------------- output


def print_table(result: Json) -> None:
    p, prio = result["parameters"], result["machine"].get("daemon_priority", "?")
    print(f"heartbeat delivery: gang, MPL {p['mpl']}, {p['slice'] * 1000:g} ms slices, no jobs, {prio}")
    load = result["machine"]["loadavg_before"][0]
    print(f"(ms; CPU in % of one CPU; {p['window_seconds']:g} s per row; load average before: {load:.2f})")
    head = "lat med", "lat p99", "lat max", "spr med", "spr p99", "spr max", "MM cpu", "NM cpu"
    print(f"{'NMs':>4} {'load':6} {'beats':>5} {'lost':>4} " + " ".join(f"{h:>7}" for h in head))
    for r in result["heartbeats"]:
        lat, spr, cpu = r["latency_ms"], r["spread_ms"], r["cpu"]
        cells = [lat["median"], lat["p99"], lat["max"], spr["median"], spr["p99"], spr["max"], cpu["mm"]]
        row = " ".join(f"{c:7.3f}" for c in [*cells, cpu["nm_mean"]])
        print(f"{r['nms']:4} {r['load']:6} {r['heartbeats']:5} {r['lost']:4} {row}")
    s = result["switching"]
    print(f"\ncontext switches: 2 nodes x 1 PE, two 2-rank BSP jobs, {s['window_seconds']:g} s window (ms)")
    print(f"{'':22} {'count':>6} {'median':>8} {'p99':>8} {'max':>8}")
    for name, v in (
        ("NM: done - received", s["nm_done_minus_received_ms"]),
        ("MM: done - sent", s["mm_done_minus_sent_ms"]),
    ):
        print(f"{name:22} {v['count']:6} {v['median']:8.3f} {v['p99']:8.3f} {v['max']:8.3f}")
    print(f"heartbeats traced by node {s['heartbeats_by_node']}, of which switches {s['switches_by_node']}")
    print(f"\n{'daemon CPU, % of one CPU, 2 nodes':34} {'MM':>6} {'NM mean':>8} {'NM max':>8}")
    for name, v in result["overhead_cpu_percent"].items():
        print(f"{name:34} {v['mm']:6.2f} {v['nm_mean']:8.2f} {v['nm_max']:8.2f}")
    c = result["compute_alone"]
    print(f"\ncompute-bound 2-rank BSP alone ({' '.join(c['argv'][-4:])}), {c['repeats']} runs each (s)")
    print(f"{'submit to end':14} {'median':>8} {'min':>8} {'max':>8}")
    for policy, values in c["submit_to_end_seconds"].items():
        print(f"{policy:14} {statistics.median(values):8.3f} {min(values):8.3f} {max(values):8.3f}")
    ratio, run_ratio = c["gang_over_batch"], c["gang_over_batch_start_to_end"]
    print(f"gang/batch of medians {ratio:.3f} (start to end {run_ratio:.3f})")
    print("\nhost floor: minimal SUB receivers, same delivery (ms)")
    print(
        f"{'NMs':>4} {'beats':>5} "
        + " ".join(f"{h:>7}" for h in ("lat med", "lat p99", "lat max", "spr med", "spr p99", "spr max"))
    )
    for r in result["host_floor"]:
        lat, spr = r["latency_ms"], r["spread_ms"]
        cells = [lat["median"], lat["p99"], lat["max"], spr["median"], spr["p99"], spr["max"]]
        print(f"{r['nms']:4} {r['heartbeats']:5} " + " ".join(f"{c:7.3f}" for c in cells))
    print("goals: " + ", ".join(f"{k} {v}" for k, v in result["goals"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench gang", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 s windows, 2 and 8 NMs, 1 run each")
    parser.add_argument("--sizes", help="node manager counts for heartbeat delivery (default 2,8,32)")
    parser.add_argument("--window", type=float, help="seconds per measurement window (default 5)")
    parser.add_argument("--repeats", type=int, help="runs of the compute-bound job per policy (default 3)")
    parser.add_argument("--compute-seconds", type=float, default=4.0, help="CPU seconds of that job")
    parser.add_argument(
        "--json", type=Path, default=Path("results/gang.json"), help="where to write raw figures"
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in (args.sizes or ("2,8" if args.quick else "2,8,32")).split(",")]
    window = args.window or (2.0 if args.quick else 5.0)
    repeats = args.repeats or (1 if args.quick else 3)
    result = run(sizes, window, repeats, args.compute_seconds, args.json)
    print_table(result)
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
