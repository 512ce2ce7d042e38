"""Benchmark: storm at scale (issue 18): every figure of the issue's "Done when" beside its goal.

``storm bench scale [--quick] [--parts ...] [--json F] [--markdown F]`` runs, on throwaway local clusters:

1. ``spread``: 8 real node managers, gang (MPL 2, 100 ms slices, the default [mm] switch_lead), no jobs,
   every NM tracing its heartbeats; a window idle, then one under CPU load (two busy loops). Per heartbeat
   every NM traced, the *spread*: max - min over the NMs of when their switch began (at the instant the
   heartbeat named, or on arrival if it came late); per NM and heartbeat, the *lateness*: switch begun -
   the instant named. Median, p99 and max (nearest rank) of both; how many heartbeats arrived after their
   instant (*late*) or were never traced by some NM (*lost*: a SUB socket conflates). Goal: spread p99
   under 1 ms under load.
2. ``emulated``: 1,024 emulated node managers (tools/emulator.py, ``--emulated``), gang, the same window
   idle, with a lead long enough for delivery to all of them on this host (``--lead-emulated``, 50 ms: the
   delivery latency is reported; 1,024 minimal SUB receivers in two processes got a heartbeat 13-15 ms
   after it was sent here, the host's floor, and storm bench gang's part 5 measures it for fewer). Goal:
   spread p99 under 2 ms. The emulators' switches are serial (about 500 nodes per CPU here): the spread
   includes that, as each node's trace says when its own switch began.
3. ``storm``: 1,024 emulated node managers, batch, ``[mm] submit_rate`` off; a workload of 10,000 one-rank
   ``sleep 0.5`` jobs sent over one connection (pipelined); once a third of it has ended storm-mm is
   SIGKILLed and started again. Figures: the time from the kill until every node is registered with the new
   storm-mm, nodes seen DOWN meanwhile (goal: under 10 s, none); then the workload to its end, and from the
   store itself (read after the cluster stopped) each job's rows and state (goal: every job COMPLETED,
   recorded exactly once); jobs per second over the whole workload.
4. ``queue``: the same cluster, whose store was filled beforehand so that 100,000 jobs have finished (the
   workload's and older ones); every PE taken by a long job and 10,000 more queued. Figures: wall time of
   ``storm queue``, ``storm queue --all`` (its default: the newest finished jobs), ``storm nodes`` and
   ``storm show`` of an old job as a user runs them (median of 3, the CLI's start-up included), the MM's
   resident memory, the store's size, and one scheduling pass over the same queue shape, timed in process
   on storm-mm's own Controller and a SQLite store; ``storm history --since`` the workload's start (goal:
   under 1 s) and storm-mm's round trips while the whole history is read (tools/bench_history.py).
5. ``plugins``: launch throughput (issue 18 item 4) and the command line's start-up (item 5): see PLUGINS.
6. ``soak``: tests/test_soak.py's mix of 1,000 short jobs (tools/soak.py: the same jobs, the same checks of
   how each ended) on 3 real NMs x 2 PEs; its rate over the issue's "today" (goal: 3x). ``--against PYTHON``
   (repeatable) times the same mix under another installation's Python too.

``--quick`` shrinks everything (2 s windows, 256 emulated nodes, 2,000 jobs, 10,000 finished, a 300-job
soak). It prints the table and writes every raw figure, the load average before and after each part and the
command as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies
import zmq

from storm.mm import protocol as p
from storm.mm.jobs import Job, JobSpec
from storm.mm.states import JobState
from storm.mm.store import Store
from storm.tools import bench_gang, bench_history, soak
from storm.tools.local_cluster import LocalCluster, wait_for

Json = dict[str, Any]
PARTS = ("spread", "emulated", "storm", "queue", "plugins", "soak")
SLICE = 0.1


@dataclass(frozen=True)
class Figure:
    """One row of the table: what the issue asks (``goal``, "" for a figure reported only) and what ran."""

    part: str
    name: str
    value: float | None  # None: not measured
    unit: str
    goal: str = ""
    met: bool | None = None

    def cell(self) -> str:
        if self.value is None:
            return "not measured"
        if self.value == int(self.value) and abs(self.value) >= 1:
            return f"{self.value:,.0f} {self.unit}".strip()
        return f"{self.value:.3g} {self.unit}".strip()


# --------------------------------------------------------------------------------------------------------
# Plug-in points: the other two parts of issue 18 measure their own goals. For each, the module named is
# imported and the first of its functions listed that it has is measured, through the adapter beside it
# (which turns what the function returns into rows of this table); a module that has none of them runs
# the fallback, which measures what the tools of today measure, or reports the row as not measured.
# The contract for new code: ``scale_figures(work: Path, quick: bool) -> list[Figure]`` (Figure as above,
# or any object with its fields), measuring on throwaway clusters under ``work``.
#   - item 4, launch throughput (tools/bench_launch.py): 1-rank `true` jobs per second end to end on 2
#     node managers, goal >= 500 (its other goal, the soak's mix 3x faster, is part ``soak``'s);
#   - item 5, the command line (tools/bench_cli.py): `storm submit`, `storm queue`, `storm show` under
#     60 ms each; a shell loop of 200 `storm submit -n 1 -- true` under 10 s.

Adapter = Callable[[Callable[..., Any], Path, bool], list[Figure]]


def contract(function: Callable[..., Any], work: Path, quick: bool) -> list[Figure]:
    got = function(work, quick)
    return [f if isinstance(f, Figure) else Figure(**vars(f)) for f in got]


def from_measure_cli(function: Callable[..., Any], work: Path, quick: bool) -> list[Figure]:
    """bench_cli.measure_cli(cluster_dir, repeats, loop) on a cluster of 2 nodes of its own."""
    cluster = LocalCluster(dir=work / "cli", nodes=2, nm_settings={"kill_grace": 1.0})
    cluster.up()
    try:
        result = function(cluster.dir, 3 if quick else 20, 20 if quick else 200)["storm"]
    finally:
        cluster.down()
    medians = {name: result["commands"][name]["wall_ms"]["median"] for name in ("submit", "queue", "show")}
    figures = [
        Figure("cli", f"`storm {name}`, median", ms, "ms", "< 60 ms", ms < 60) for name, ms in medians.items()
    ]
    loop = result["loop"]
    seconds = loop["seconds"] * 200 / loop["count"]  # a shorter loop is judged at the same rate
    figures.append(
        Figure("cli", "shell loop of 200 `storm submit -n 1 -- true`", seconds, "s", "< 10 s", seconds < 10)
    )
    return figures


def launch_fallback(work: Path, quick: bool) -> list[Figure]:
    """A bench_launch without scale_figures: the row is reported, not measured."""
    return [Figure("launch", "1-rank `true` jobs end to end, 2 NMs", None, "jobs/s", ">= 500")]


def cli_fallback(work: Path, quick: bool) -> list[Figure]:
    return [Figure("cli", "shell loop of 200 `storm submit -n 1 -- true`", None, "s", "< 10 s")]


PLUGINS: dict[str, tuple[str, tuple[tuple[str, Adapter], ...], Callable[[Path, bool], list[Figure]]]] = {
    "launch": (
        "storm.tools.bench_launch",
        (("scale_figures", contract),),
        launch_fallback,
    ),
    "cli": (
        "storm.tools.bench_cli",
        (("scale_figures", contract), ("measure_cli", from_measure_cli)),
        cli_fallback,
    ),
}


def plugin_figures(work: Path, quick: bool) -> tuple[list[Figure], Json]:
    figures: list[Figure] = []
    used: Json = {}
    for name, (module_name, functions, fallback) in PLUGINS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        found = [(f, adapt) for f, adapt in functions if module is not None and hasattr(module, f)]
        if found:
            function, adapt = found[0]
            used[name] = f"{module_name}.{function}"
            figures += adapt(getattr(module, function), work, quick)
        else:
            used[name] = (
                f"fallback: {fallback.__name__} ({module_name} has none of {[f for f, _ in functions]})"
            )
            figures += fallback(work, quick)
    return figures, used


# --------------------------------------------------------------------------------------------------------
# Clusters


@contextlib.contextmanager
def cluster_of(
    work: Path, name: str, *, nodes: int = 0, emulated: int = 0, policy: str = "batch", **mm: object
) -> Iterator[LocalCluster]:
    cycles = p.Policy(policy).cycles
    settings = {"mpl": 2, "slice": SLICE, **mm} if cycles else dict(mm)
    cluster = LocalCluster(
        dir=work / name, nodes=nodes, emulated=emulated, policy=policy, trace=cycles, mm_settings=settings,
        nm_settings={"kill_grace": 1.0},
    )  # fmt: skip
    try:
        if nodes:
            bench_gang.start(cluster)  # real node managers a batch at a time (see there)
            cluster.emulators = [
                cluster.start_emulator(k, g) for k, g in enumerate(cluster.emulator_groups())
            ]
            cluster.save()
            cluster.wait_nodes_up(cluster.node_names(), 60)
        else:
            cluster.up()
        yield cluster
    finally:
        cluster.down()


def mm_rss_mb(cluster: LocalCluster) -> float:
    assert cluster.mm is not None
    return float(psutil.Process(cluster.mm.pid).memory_info().rss) / 2**20


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


# --------------------------------------------------------------------------------------------------------
# Parts 1 and 2: spread and lateness


SETTLE = 3.0  # seconds after every node traced a heartbeat: node managers start their job shell launchers


def window(cluster: LocalCluster, seconds: float) -> Json:
    """The heartbeats of one window, as bench_gang reads them, once every node traced one and the host
    settled (the daemons' start-up is not what is measured)."""
    wait_for(lambda: all(cluster.trace_lines().values()), 60, "every node to trace a heartbeat")
    time.sleep(SETTLE)
    traces, cpu = bench_gang.measure(cluster, seconds)
    return {**bench_gang.delivery(traces), "cpu": cpu}


def spread_part(work: Path, quick: bool) -> Json:
    seconds = 2.0 if quick else 10.0
    runs = []
    with cluster_of(work, "spread", nodes=8, policy="gang") as cluster:
        for busy in (0, 2):
            with bench_gang.cpu_load(busy):
                runs.append({"nms": 8, "busy_loops": busy, "load_before": load(), **window(cluster, seconds)})
    return {"window_seconds": seconds, "lead": "default", "runs": runs}


def emulated_part(work: Path, quick: bool, count: int, lead: float) -> Json:
    seconds = 2.0 if quick else 10.0
    with cluster_of(work, "emulated", emulated=count, policy="gang", switch_lead=lead) as cluster:
        run = {"emulated": count, "load_before": load(), **window(cluster, seconds)}
        run["emulator_processes"] = len(cluster.emulators)
    return {"window_seconds": seconds, "lead": lead, "runs": [run]}


# --------------------------------------------------------------------------------------------------------
# Parts 3 and 4: the registration storm, the workload, the queue


def fill_store(path: Path, finished: int) -> None:
    """``finished`` COMPLETED jobs in a new store, as storm-mm would have left them (environment and all)."""
    store = Store(path, "NORMAL")
    spec = JobSpec(
        name="old", uid=os.getuid(), gid=os.getgid(), user="bench", ranks=1, argv=("sleep", "1"), cwd="/tmp",
        env=dict(os.environ), time_limit=60.0, output="/dev/null", error="/dev/null",
    )  # fmt: skip
    try:
        for first in range(0, finished, 10_000):
            with store.transaction():
                for _ in range(first, min(finished, first + 10_000)):
                    job = store.add_job(spec, 1.0)
                    done = Job(
                        id=job.id, spec=spec, state=JobState.COMPLETED, submit_time=1.0, start_time=2.0,
                        end_time=3.0, exit_code=0, placement=(("emu0", 0),), row=0,
                    )  # fmt: skip
                    store.save_job(done)
    finally:
        store.close()


def submit_many(endpoint: str, count: int, argv: tuple[str, ...], window_size: int = 500) -> list[int]:
    """``count`` one-rank jobs over one connection, ``window_size`` in flight; their ids in order."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    env = {"PATH": os.environ.get("PATH", "")}
    ids: dict[int, int] = {}
    sent = 0
    try:
        while len(ids) < count:
            while sent < count and sent - len(ids) < window_size:
                sent += 1
                msg = p.SubmitJob(
                    req=sent, ranks=1, argv=argv, cwd="/tmp", env=env, output="/dev/null", error="/dev/null"
                )
                sock.send(p.encode(msg))
            if not sock.poll(120_000):
                raise RuntimeError("storm-mm stopped answering submissions")
            reply = p.decode(sock.recv(), p.MAX_NODE_MESSAGE)
            if not isinstance(reply, p.JobSubmitted):
                raise RuntimeError(f"a submission was refused: {reply}")
            ids[reply.req] = reply.job_id
    finally:
        sock.close()
    return [ids[req] for req in sorted(ids)]


def ended(cluster: LocalCluster, ids: list[int]) -> int:
    with cluster.client(timeout=60) as client:
        return sum(1 for j in client.jobs(tuple(ids)) if JobState(j.state).terminal)


UNREGISTERED = "not registered since storm-mm started"  # mm/listing.py's reason for a node not back yet


def restart_storm(cluster: LocalCluster) -> Json:
    """SIGKILL storm-mm and start it again; until every node is registered with it (whatever else its reason
    says: a node still stopping jobs that ended meanwhile is back), poll storm nodes, noting any DOWN."""
    killed = time.monotonic()
    cluster.restart_mm(signal.SIGKILL)
    started = time.monotonic() - killed
    names, down = set(cluster.node_names()), set[str]()
    with cluster.client(timeout=30) as client:

        def registered() -> bool:
            nodes = client.nodes()
            down.update(n.name for n in nodes if n.state != p.NodeState.UP)
            back = {n.name for n in nodes if n.state == p.NodeState.UP and n.reason != UNREGISTERED}
            return back == names

        wait_for(registered, 120, "every node to register again", interval=0.25)
    return {
        "mm_restart_seconds": started,
        "registered_seconds": time.monotonic() - killed,
        "down": sorted(down),
    }


def stored(path: Path, first_id: int, last_id: int) -> Json:
    """From the store file itself: rows and states of the jobs with ids from first_id to last_id (a
    workload's, submitted one after the other)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT id, state FROM jobs WHERE id BETWEEN ? AND ?", (first_id, last_id)
        ).fetchall()
        total = db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    finally:
        db.close()
    states: dict[str, int] = {}
    for _, state in rows:
        states[state] = states.get(state, 0) + 1
    return {"rows": len(rows), "distinct_ids": len({r[0] for r in rows}), "states": states, "all_rows": total}


def cli_seconds(cluster: LocalCluster, *args: str, repeats: int = 3) -> float:
    """Median wall time of the real `storm` command (its start-up included), output to a pipe."""
    env = {**os.environ, "STORM_MM": cluster.endpoint}
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "storm.tools.cli", *args], env=env, capture_output=True, check=True,
            timeout=300,
        )  # fmt: skip
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def pass_seconds(queued: int, nodes: int) -> float:
    """One EASY pass over ``queued`` jobs with every PE of ``nodes`` taken, on the Controller and a SQLite
    store in process: the pass storm-mm runs, without the sockets."""
    from storm.mm.config import MMConfig
    from storm.mm.core import Controller, FromNode
    from storm.mm.rights import Account
    from storm.mm.runs import seeded_nonces

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "storm.db", "NORMAL")
        ctl = Controller(store, MMConfig(), "bench", nonce=seeded_nonces(0))
        ctl.recover(0.0)
        for i in range(nodes):
            ctl.handle(p.RegisterNode(node=f"emu{i}", pes=1, nm_epoch="e"), 0.0, FromNode(f"emu{i}"))
        caller = Account(os.getuid(), os.getgid(), "bench")
        for _ in range(nodes + queued):
            submit = p.SubmitJob(ranks=1, argv=("sleep", "1"), cwd="/tmp", env={}, time_limit=600.0)
            ctl.handle(submit, 1.0, caller)
        ctl.schedule(1.0)  # fills every PE
        ctl.runs.want_pass()
        started = time.perf_counter()
        ctl.schedule(2.0)
        seconds = time.perf_counter() - started
        store.close()
    return seconds


def storm_and_queue_parts(work: Path, quick: bool, count: int, parts: set[str]) -> tuple[Json, Json]:
    """Parts 3 and 4 on one cluster (the queue part needs the store part 3 leaves)."""
    jobs = 2_000 if quick else 10_000
    finished = 10_000 if quick else 100_000
    queued = 2_000 if quick else 10_000
    directory = work / "storm"
    (directory / "mm").mkdir(parents=True)
    store_path = directory / "mm" / "storm.db"
    fill_store(store_path, finished - jobs)
    first_id = finished - jobs + 1
    storm: Json = {"emulated": count, "jobs": jobs, "argv": ["sleep", "0.5"]}
    queue: Json = {}
    with cluster_of(work, "storm", emulated=count, submit_rate=0.0) as cluster:  # sent at once: no limit
        storm["mm_rss_mb_idle"] = mm_rss_mb(cluster)
        storm["load_before"] = load()
        started, since = time.monotonic(), time.time()
        ids = submit_many(cluster.endpoint, jobs, ("sleep", "0.5"))
        storm["submitted_seconds"] = time.monotonic() - started
        if ids[0] != first_id:
            raise RuntimeError(f"the workload's first job is {ids[0]}, not {first_id}")
        if "storm" in parts:
            wait_for(lambda: ended(cluster, ids[: jobs // 3]) == jobs // 3, 600, "a third of the workload")
            storm["restart"] = restart_storm(cluster)
        wait_for(lambda: ended(cluster, ids) == jobs, 1200, "the workload to end", interval=0.5)
        storm["workload_seconds"] = time.monotonic() - started
        storm["jobs_per_second"] = jobs / storm["workload_seconds"]
        if "queue" in parts:
            queue = queue_part(cluster, count, queued, finished)
            queue["history"] = bench_history.measure(cluster.endpoint, since)  # the workload's and after
    storm["stored"] = stored(store_path, first_id, first_id + jobs - 1)
    queue["store_mb"] = store_path.stat().st_size / 2**20
    return storm, queue


def queue_part(cluster: LocalCluster, count: int, queued: int, finished: int) -> Json:
    submit_many(cluster.endpoint, count, ("sleep", "3600"))  # every PE
    submit_many(cluster.endpoint, queued, ("sleep", "1"))
    with cluster.client(timeout=60) as client:
        wait_for(lambda: sum(j.state == JobState.RUNNING for j in client.jobs()) >= count, 120, "PEs taken")
        listed = client.jobs()
    result: Json = {
        "finished": finished,
        "queued": sum(j.state == JobState.PENDING for j in listed),
        "running": sum(j.state == JobState.RUNNING for j in listed),
        "load_before": load(),
        "storm_queue_seconds": cli_seconds(cluster, "queue"),
        "storm_queue_all_seconds": cli_seconds(cluster, "queue", "--all"),
        "storm_nodes_seconds": cli_seconds(cluster, "nodes"),
        "storm_show_seconds": cli_seconds(cluster, "show", "1"),
        "mm_rss_mb": mm_rss_mb(cluster),
        "pass_seconds": pass_seconds(queued, count),
    }
    return result


# --------------------------------------------------------------------------------------------------------
# Figures, the table, the command


def spread_figures(part: str, runs: list[Json], goal_ms: float, where: str) -> list[Figure]:
    figures = []
    for run in runs:
        loaded = run.get("busy_loops", 0) > 0
        counted = loaded or part == "emulated"  # the goal is under load for real NMs, idle for emulated
        label = f"{where}{', CPU load' if loaded else ', idle' if part == 'spread' else ''}"
        spread, late = run["spread_ms"], run["lateness_ms"]
        figures += [
            Figure(part, f"{label}: spread median", spread["median"], "ms"),
            Figure(
                part, f"{label}: spread p99", spread["p99"], "ms", f"< {goal_ms:g} ms" if counted else "",
                spread["p99"] < goal_ms if counted else None,
            ),
            Figure(part, f"{label}: spread max", spread["max"], "ms"),
            Figure(part, f"{label}: lateness median", late["median"], "ms"),
            Figure(part, f"{label}: lateness p99", late["p99"], "ms"),
            Figure(part, f"{label}: lateness max", late["max"], "ms"),
            Figure(part, f"{label}: delivery latency p99", run["latency_ms"]["p99"], "ms"),
            Figure(part, f"{label}: arrived late", run["late"], f"of {run['lateness_ms']['count']}"),
        ]  # fmt: skip
    return figures


def figures_of(result: Json) -> list[Figure]:
    out: list[Figure] = []
    if "spread" in result:
        out += spread_figures("spread", result["spread"]["runs"], 1.0, "heartbeat to 8 real NMs")
    if "emulated" in result:
        n = result["emulated"]["runs"][0]["emulated"]
        out += spread_figures("emulated", result["emulated"]["runs"], 2.0, f"heartbeat to {n:,} emulated NMs")
    storm = result.get("storm", {})
    if "restart" in storm:
        r, n = storm["restart"], storm["emulated"]
        out += [
            Figure("storm", f"{n:,} emulated NMs registered after MM SIGKILL", r["registered_seconds"], "s",
                   "< 10 s", r["registered_seconds"] < 10),
            Figure("storm", "  of which storm-mm's own restart", r["mm_restart_seconds"], "s"),
            Figure("storm", "nodes seen DOWN meanwhile", len(r["down"]), "", "none", not r["down"]),
        ]  # fmt: skip
    if "stored" in storm:
        s, jobs = storm["stored"], storm["jobs"]
        once = s["rows"] == s["distinct_ids"] == jobs and s["states"] == {"COMPLETED": jobs}
        out += [
            Figure("storm", f"{jobs:,}-job workload: COMPLETED, each recorded once",
                   s["states"].get("COMPLETED", 0), f"of {jobs:,}", "all, once", once),
            Figure("storm", "workload throughput (submit to last end, restart included)",
                   storm["jobs_per_second"], "jobs/s"),
            Figure("storm", "MM memory, idle with the nodes registered", storm["mm_rss_mb_idle"], "MiB"),
        ]  # fmt: skip
    queue = result.get("queue", {})
    if "storm_queue_seconds" in queue:
        q = f"{queue['queued']:,} queued, {queue['finished']:,} finished"
        out += [
            Figure("queue", f"`storm queue`, {q}", queue["storm_queue_seconds"], "s", "interactive (< 1 s)",
                   queue["storm_queue_seconds"] < 1.0),
            Figure("queue", "`storm queue --all` (newest finished)", queue["storm_queue_all_seconds"], "s"),
            Figure("queue", "`storm show` of an old job", queue["storm_show_seconds"], "s"),
            Figure("queue", "`storm nodes`", queue["storm_nodes_seconds"], "s"),
            Figure("queue", "one scheduling pass over it (in process)", queue["pass_seconds"] * 1e3, "ms"),
            Figure("queue", "MM memory with that queue", queue["mm_rss_mb"], "MiB"),
            Figure("queue", "store size", queue["store_mb"], "MiB"),
        ]  # fmt: skip
    out += [
        Figure(**f)
        for f in bench_history.figures(queue.get("history", {}), "queue", queue.get("finished", 0))
    ]
    out += [Figure(**f) for f in result.get("plugins", {}).get("figures", [])]
    if "soak" in result:
        out += [Figure(**f) for f in soak.figures(result["soak"])]
    return out


def table(figures: list[Figure]) -> str:
    lines = ["| part | figure | value | goal | met |", "| --- | --- | --- | --- | --- |"]
    for f in figures:
        met = "" if f.met is None else "yes" if f.met else "NO"
        lines.append(f"| {f.part} | {f.name} | {f.cell()} | {f.goal} | {met} |")
    return "\n".join(lines)


def run(
    parts: set[str], quick: bool, emulated: int, lead: float, *, argv: list[str], against: tuple[str, ...]
) -> Json:  # fmt: skip
    result: Json = {
        "command": " ".join(["storm bench scale", *argv]),
        "machine": {
            "cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
            "load_before": load(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "parameters": {"quick": quick, "emulated": emulated, "lead_emulated": lead, "slice": SLICE},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="storm-bench-scale-") as tmp:
        work = Path(tmp)
        if "spread" in parts:
            result["spread"] = spread_part(work, quick)
        if "emulated" in parts:
            result["emulated"] = emulated_part(work, quick, emulated, lead)
        if parts & {"storm", "queue"}:
            result["storm"], result["queue"] = storm_and_queue_parts(work, quick, emulated, parts)
        if "plugins" in parts:
            figures, used = plugin_figures(work, quick)
            result["plugins"] = {"used": used, "figures": [asdict(f) for f in figures]}
        if "soak" in parts:
            result["soak"] = soak.scale_part(work, quick, against)
    result["machine"]["load_after"] = load()
    result["figures"] = [asdict(f) for f in figures_of(result)]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, 256 nodes, 2,000 jobs")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"which parts (default all: {','.join(PARTS)})"
    )
    parser.add_argument("--emulated", type=int, help="emulated node managers (default 1,024; --quick 256)")
    parser.add_argument(
        "--lead-emulated", type=float, default=0.05,
        help="[mm] switch_lead for the emulated nodes (s; default 0.05, the most a 100 ms slice allows: "
        "delivery to 1,024 took 15-43 ms on this 2-CPU host)",
    )  # fmt: skip
    parser.add_argument(
        "--against", action="append", default=[], metavar="PYTHON",
        help="part soak: time the same mix under this Python's storm too (e.g. another checkout's venv)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if parts - set(PARTS):
        parser.error(f"unknown part(s) {', '.join(sorted(parts - set(PARTS)))}; known: {', '.join(PARTS)}")
    emulated = args.emulated or (256 if args.quick else 1024)
    # What was asked, as given: `storm bench scale` passes its options here, sys.argv holds "bench scale" too.
    given = sys.argv[1:] if argv is None else argv
    result = run(parts, args.quick, emulated, args.lead_emulated, argv=given, against=tuple(args.against))
    text = table([Figure(**f) for f in result["figures"]])
    print(text)
    machine = result["machine"]
    before, after = machine["load_before"], machine["load_after"]
    print(f"\nload average before {before}, after {after}; {machine['cpus']} CPUs")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(f"# storm bench scale\n\n`{result['command']}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
