"""Benchmark: what storm-mm's metrics cost, in process (no cluster, no sockets).

``storm bench metrics`` (or ``python -m storm.tools.bench_metrics``) builds storm-mm's core (mm/core.py,
an in-memory store) with ``--nodes`` node managers of 4 PEs registered, every PE held by a running one-rank
job whose node reported its FCS class, and ``--queued`` jobs waiting behind them, then times:

- a scrape: the snapshot of the core's state alone (mm/metrics.py), and the whole rendering as storm-mm
  serves it (prometheus_client's text format), wall and CPU time, the best of ``--repeats``; and its size;
- the nodes' reports: a node_status's size without and with a node's timings (every bucket counted), and
  storm-mm's time to decode and handle one with timings against without (each round adds to every
  bucket), so the share of a CPU a thousand nodes' timings cost the MM at one report per node every 2 s;
- a node's side: the time to count one heartbeat's delivery and lateness (nm/timings.py).

With ``--live N`` it also starts a throwaway gang cluster of N emulated node managers (tools/emulator.py)
with the endpoint on and two jobs on every PE (two rows: every node switches every slice), and after a
``--seconds`` window reads what an operator would: the wall time of a
scrape over HTTP, the heartbeat and switch timings the nodes reported (quantiles as Prometheus's
``histogram_quantile`` interpolates them in the buckets) and storm-mm's CPU over the window.

The best of several runs is reported: noise on a shared machine only ever adds time. It prints a table and
writes every figure as JSON (``--json``).
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
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Reply
from storm.mm.exporter import registry_for
from storm.mm.memory_store import MemoryStore
from storm.mm.metrics import snapshot
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.tally import PASS_BOUNDS, Histogram
from storm.nm.timings import Timings
from storm.tools.local_cluster import LocalCluster, wait_for

T0 = 1_000_000.0
PES = 4
REPORT_INTERVAL = 2.0  # seconds between two node_status of one node: [mm] node_timeout 10 s / 5
ALICE = Account(1000, 100, "alice")


def best(repeats: int, work: Callable[[], object]) -> tuple[float, float]:
    """The best wall and CPU seconds of ``repeats`` runs of ``work``."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        begin, begin_cpu = time.perf_counter(), time.process_time()
        work()
        wall = min(wall, time.perf_counter() - begin)
        cpu = min(cpu, time.process_time() - begin_cpu)
    return wall, cpu


def submit(core: Controller, count: int, now: float) -> list[int]:
    msg = p.SubmitJob(ranks=1, argv=("sleep", "600"), cwd="/tmp", env={}, name="bench")
    ids = []
    for _ in range(count):
        (reply, *_) = core.handle(msg, now, ALICE)
        assert isinstance(reply, Reply) and isinstance(reply.message, p.JobSubmitted), reply
        ids.append(reply.message.job_id)
    return ids


def busy_core(nodes: int, queued: int) -> Controller:
    """A core whose every PE runs a classified one-rank job, with ``queued`` jobs waiting."""
    core = Controller(MemoryStore(), MMConfig(node_timeout=3600.0), "bench", nonce=seeded_nonces(1))
    core.recover(T0)
    names = [f"n{i:04d}" for i in range(nodes)]
    for name in names:
        core.handle(p.RegisterNode(node=name, pes=PES, nm_epoch=f"{name}-e", address=""), T0, FromNode(name))
    running = submit(core, nodes * PES, T0)
    core.schedule(T0)
    classes = ("CS", "F", "DC")
    for job_id in running:
        job = core.runs.active[job_id]
        (node,) = job.nodes
        core.handle(p.JobLaunched(job_id=job_id, node=node, pids={"0": job_id}), T0, FromNode(node))
        rank = p.RankStats(
            rank=0, node=node, pid=job_id, state="active", t_cpu=1.0, t_comm=0.5, c_comm=10, granularity=0.15,
            calls=10, wait_mode="poll", job_id=job_id, klass=classes[job_id % 3],
        )  # fmt: skip
        core.handle(p.JobStats(job_id=job_id, node=node, ranks=(rank,)), T0, FromNode(node))
    submit(core, queued, T0 + 1)
    core.schedule(T0 + 1)
    return core


def full_timings(round_: int) -> p.SwitchTimings:
    """A node's timings after a long time: every bucket counted, growing by one per round."""
    buckets = len(p.TIMING_BOUNDS) + 1
    counts = tuple(1_000_000 + round_ * (i + 1) for i in range(buckets))
    total = 1234.5 + round_
    return p.SwitchTimings(
        delivery=counts, delivery_sum=total, lateness=counts, lateness_sum=total, duration=counts,
        duration_sum=total, late=round_, skewed=round_,
    )  # fmt: skip


def time_reports(core: Controller, rounds: int, with_timings: bool) -> float:
    """Seconds per node_status storm-mm decodes and its core handles, best round of ``rounds`` (every node
    reports once)."""
    names = sorted(n.name for n in core.registry.all())
    per_node = {n: tuple(j.id for j in core.runs.active.values() if n in j.nodes) for n in names}
    fastest = float("inf")
    for round_ in range(rounds):
        timings = full_timings(round_) if with_timings else None
        messages = [
            p.NodeStatus(
                node=n, nm_epoch=f"{n}-e", mm_epoch=core.mm_epoch, jobs=per_node[n], launched=per_node[n],
                timings=timings,
            )
            for n in names
        ]  # fmt: skip
        sent = [(FromNode(m.node), p.encode(m)) for m in messages]
        now = T0 + 2 + round_
        begin = time.perf_counter()
        for sender, data in sent:
            core.handle(p.decode(data, p.MAX_NODE_MESSAGE), now, sender)
        fastest = min(fastest, (time.perf_counter() - begin) / len(sent))
    return fastest


def node_side(heartbeats: int) -> float:
    """Seconds a node spends counting one heartbeat's delivery and lateness."""
    timings = Timings()
    begin = time.perf_counter()
    for i in range(heartbeats):
        timings.heard(T0 + i * 0.1, T0 + i * 0.1 + 0.0004)
        timings.began(T0 + i * 0.1 + 0.02, T0 + i * 0.1 + 0.02003)
    return (time.perf_counter() - begin) / heartbeats


def run(nodes: int, queued: int, repeats: int) -> dict[str, Any]:
    core = busy_core(nodes, queued)
    registry = registry_for(core, Histogram(PASS_BOUNDS))
    snap_wall, snap_cpu = best(repeats, lambda: snapshot(core))
    render_wall, render_cpu = best(repeats, lambda: generate_latest(registry))
    plain = p.NodeStatus(node="n0001", nm_epoch="e", mm_epoch="m", jobs=(1, 2, 3, 4), launched=(1, 2, 3, 4))
    timed = p.NodeStatus(
        node="n0001", nm_epoch="e", mm_epoch="m", jobs=(1, 2, 3, 4), launched=(1, 2, 3, 4),
        timings=full_timings(10_000),
    )  # fmt: skip
    without = time_reports(core, repeats, with_timings=False)
    with_ = time_reports(core, repeats, with_timings=True)
    extra = max(0.0, with_ - without)
    snap = snapshot(core)
    return {
        "host": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0))},
        "python": platform.python_version(),
        "nodes": nodes,
        "pes": nodes * PES,
        "queued": queued,
        "running": snap.queue.get(("STARTING", "None"), 0) + snap.queue.get(("RUNNING", "None"), 0),
        "repeats": repeats,
        "snapshot_ms": snap_wall * 1000,
        "snapshot_cpu_ms": snap_cpu * 1000,
        "scrape_ms": render_wall * 1000,
        "scrape_cpu_ms": render_cpu * 1000,
        "scrape_bytes": len(generate_latest(registry)),
        "node_status_bytes": len(p.encode(plain)),
        "node_status_with_timings_bytes": len(p.encode(timed)),
        "report_us": without * 1e6,
        "report_with_timings_us": with_ * 1e6,
        "timings_cpu_share": extra * nodes / REPORT_INTERVAL,  # of one CPU, at one report per node per 2 s
        "node_heartbeat_us": node_side(100_000) * 1e6,
    }


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) buckets: linear within the
    bucket the rank falls in; the highest finite bound if it falls above them all."""
    total = buckets[-1][1]
    if not total:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def scrape(endpoint: str) -> tuple[float, dict[str, list[tuple[dict[str, str], float]]]]:
    """One GET /metrics: its wall time and its samples by name."""
    begin = time.perf_counter()
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    took = time.perf_counter() - begin
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return took, samples


def live(emulated: int, seconds: float) -> dict[str, Any]:
    """The endpoint of a gang cluster of ``emulated`` emulated node managers (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="storm-bench-metrics-") as work:
        cluster = LocalCluster(
            dir=Path(work), nodes=0, emulated=emulated, pes_per_node=PES, policy="gang",
            mm_settings={"metrics_endpoint": "127.0.0.1:0", "mpl": 2, "switch_lead": 0.05},
        )  # fmt: skip
        cluster.up()
        try:
            with cluster.client() as client:  # two rows of jobs on every PE: every node switches every slice
                jobs = [client.submit(["sleep", "3600"], emulated * PES, cwd=work) for _ in range(2)]
                wait_for(lambda: all(client.job(j).state == "RUNNING" for j in jobs), 120, "the jobs to run")

            def heard(samples: dict[str, list[tuple[dict[str, str], float]]]) -> float:
                return samples["storm_heartbeat_delivery_seconds_count"][0][1]

            wait_for(
                lambda: heard(scrape(cluster.metrics_endpoint)[1]) >= emulated, 120, "every node's timings"
            )
            _, first = scrape(cluster.metrics_endpoint)
            time.sleep(seconds)  # the window measured (a benchmark's, not a wait for a condition)
            walls = [scrape(cluster.metrics_endpoint)[0] for _ in range(20)]
            _, last = scrape(cluster.metrics_endpoint)
        finally:
            cluster.down()

    def grown(name: str) -> float:
        return last[name][0][1] - first[name][0][1]

    out: dict[str, Any] = {
        "emulated": emulated,
        "window_seconds": seconds,
        "scrape_wall_ms": {"median": statistics.median(walls) * 1000, "max": max(walls) * 1000},
        "mm_cpu_share": grown("process_cpu_seconds_total") / seconds
        if "process_cpu_seconds_total" in last
        else None,
        "heartbeats_sent": grown("storm_heartbeats_sent_total"),
        "late": grown("storm_heartbeats_late_total"),
        "skewed": grown("storm_heartbeats_skewed_total"),
    }
    for name in ("heartbeat_delivery", "switch_lateness", "switch_duration"):
        metric = f"storm_{name}_seconds"
        before = {labels["le"]: value for labels, value in first[f"{metric}_bucket"]}
        buckets = [
            (float(le), value - before[le])
            for labels, value in last[f"{metric}_bucket"]
            for le in [labels["le"]]
        ]
        out[name] = {
            "count": buckets[-1][1],
            **{f"p{q * 100:g}_ms": quantile(q, buckets) * 1000 for q in (0.5, 0.99, 0.999)},
        }
    return out


def table(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The figures as the rows of a table: what, a figure, another."""
    rows = [
        (f"scrape: snapshot of the core ({r['running']:,} running, {r['queued']:,} queued)",
         f"{r['snapshot_ms']:.2f} ms", f"cpu {r['snapshot_cpu_ms']:.2f} ms"),
        ("scrape: rendered as served", f"{r['scrape_ms']:.2f} ms", f"{r['scrape_bytes']:,} bytes"),
        ("node_status without / with timings", f"{r['node_status_bytes']} B",
         f"{r['node_status_with_timings_bytes']} B"),
        ("storm-mm per node_status without / with timings", f"{r['report_us']:.1f} us",
         f"{r['report_with_timings_us']:.1f} us"),
        (f"timings of {r['nodes']:,} nodes, a report each per {REPORT_INTERVAL:g} s",
         f"{r['timings_cpu_share'] * 100:.3f} %", "of a CPU"),
        ("a node: one heartbeat's delivery and lateness counted", f"{r['node_heartbeat_us']:.2f} us", ""),
    ]  # fmt: skip
    lv = r.get("live")
    if lv is None:
        return rows
    wall = lv["scrape_wall_ms"]
    rows.append(
        (f"live, {lv['emulated']:,} emulated nodes (gang): GET /metrics", f"{wall['median']:.2f} ms",
         f"max {wall['max']:.2f} ms")
    )  # fmt: skip
    for name in ("heartbeat_delivery", "switch_lateness", "switch_duration"):
        q = lv[name]
        what = f"live: {name.replace('_', ' ')} p50 ({q['count']:,.0f} observed)"
        rows.append((what, f"{q['p50_ms']:.3f} ms", f"p99 {q['p99_ms']:.3f} ms"))
    share = lv["mm_cpu_share"]
    rows.append(
        ("live: storm-mm's CPU over the window", "-" if share is None else f"{share * 100:.1f} %",
         f"{lv['late']:.0f} late, {lv['skewed']:.0f} skewed heartbeats")
    )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench metrics", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1024, help="node managers of 4 PEs (default 1,024)")
    parser.add_argument("--queued", type=int, default=10_000, help="jobs waiting (default 10,000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--live", type=int, default=0, metavar="N", help="also N emulated nodes, live (gang)")
    parser.add_argument("--seconds", type=float, default=30.0, help="the live window (default 30 s)")
    parser.add_argument("--json", type=Path, default=Path("results/metrics.json"))
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.queued < 0 or args.repeats < 1 or args.live < 0 or args.seconds <= 0:
        parser.error("--nodes and --repeats must be at least 1, --queued and --live not negative")
    result: dict[str, Any] = {
        "command": ["storm", "bench", "metrics", *(sys.argv[1:] if argv is None else argv)]
    }
    result.update(run(args.nodes, args.queued, args.repeats))
    if args.live:
        result["live"] = live(args.live, args.seconds)
    rows = table(result)
    width = max(len(row[0]) for row in rows)
    for name, a, b in rows:
        print(f"{name:<{width}}  {a:>12}  {b}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
