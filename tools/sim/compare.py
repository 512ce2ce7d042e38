"""``storm sim compare``: one workload through ``storm sim`` and through a real local cluster, job by job.

The claim checked is that the simulator predicts the live cluster: the same storm-mm core decides in both, so
with the same nodes, policy, arrivals, runtimes and limits the jobs must start in the same order, and at
times that differ only by what the simulator leaves out on purpose (messages take no time, ranks start and
exit at once): the live launch latency.

The rules both runs follow:

- times: a trace's seconds are multiplied by ``scale`` (0.01: 100 trace seconds run 1 live second); both
  runs use the scaled times, so every figure here is in live seconds.
- estimates: exact, whatever the trace requests (field 9 is ignored): a job's time limit is its scaled
  runtime plus ``grace`` (2 s by default). The grace is there because a live job takes its runtime *plus*
  its launch and exit, and storm-mm would kill it at a limit of exactly its runtime; the simulator gets the
  very same limits, so both schedule (and backfill) with the same estimates.
- a live job is ``python -m storm.tools.apps.spin --seconds RUNTIME`` on each of its ranks (busy
  computing, no MPI, no mpihook), submitted when the workload's clock reaches its arrival.
- origins: the simulator's clock starts at the first arrival (0). The live origin is the MM's submission
  time of the first job, and every live time (submit, start, end) is the MM's own (JobInfo), so a late
  submission by this client shows up as a submit difference instead of being hidden.
- start order: the jobs sorted by (start time, position in the workload). Jobs the MM starts in one pass get
  the same start time live, as they do in the simulation.

Order is only meaningful when no two events that decide it are closer than the live latency can shift
them: :func:`generated` builds workloads in which every arrival and every end (the events that make the
scheduler act) are at least ``gap`` live seconds apart under all three policies (0.5 s by default, against
a launch latency of about 0.1 s here), and :func:`closest_events` reports that distance for any workload.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from storm.mm import protocol as p
from storm.mm.states import JobState
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from storm.tools.sim.engine import POLICIES, Machine, RunResult, simulate
from storm.tools.sim.swf import SimJob, SwfRecord, Workload, to_workload

DEFAULT_SCALE = 0.01
DEFAULT_GRACE = 2.0  # live seconds between a job's runtime and its limit (see the module's docstring)
DEFAULT_GAP = 0.5  # live seconds between any two arrivals or ends in a generated workload
POLL = 0.05  # how often the live run asks the MM whether every job has ended


@dataclass(frozen=True, slots=True)
class Times:
    """One job's life in one run, in live seconds from that run's origin."""

    submit: float
    start: float
    end: float
    state: str


@dataclass(frozen=True, slots=True)
class JobDiff:
    index: int
    number: int
    procs: int
    runtime: float
    sim: Times
    live: Times
    replay: Times  # the simulation again, with the live arrivals and durations (see :func:`replayed`)

    @property
    def replay_start(self) -> float:
        return self.live.start - self.replay.start

    @property
    def overhead(self) -> float:
        """How much longer the job held its PEs live than its runtime: launch and exit."""
        return (self.live.end - self.live.start) - self.runtime

    @property
    def submit(self) -> float:
        return self.live.submit - self.sim.submit

    @property
    def start(self) -> float:
        return self.live.start - self.sim.start

    @property
    def end(self) -> float:
        return self.live.end - self.sim.end


@dataclass
class Comparison:
    policy: str
    machine: Machine
    scale: float
    grace: float
    jobs: list[JobDiff]
    sim_order: list[int]  # job numbers in start order
    live_order: list[int]
    replay_order: list[int]
    closest_events: float  # live seconds between the two closest arrivals/ends of the simulation
    live_wall: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def order_matches(self) -> bool:
        return self.sim_order == self.live_order == self.replay_order


# ------------------------------------------------------------------------------------------ workloads


def scaled(workload: Workload, scale: float, grace: float) -> Workload:
    """Times multiplied by ``scale``; limits exact plus ``grace`` (see the module's docstring)."""
    if not (scale > 0 and grace >= 0):
        raise ValueError("--scale must be positive and --grace not negative")
    jobs = [
        replace(j, submit=j.submit * scale, runtime=j.runtime * scale, limit=j.runtime * scale + grace)
        for j in workload.jobs
    ]
    return replace(workload, jobs=jobs, estimate="runtime", runtime_factor=scale, arrival_factor=1 / scale)


def causes(result: RunResult) -> list[float]:
    """The instants that make the scheduler act: every arrival and every end, one entry per job each."""
    return sorted([o.job.submit for o in result.outcomes] + [o.end for o in result.outcomes])


def closest_events(result: RunResult) -> float:
    """The smallest distance between two arrivals/ends (inf with fewer than two): live latency shifts ends
    by about 0.1 s, so two events closer than a few times that may happen in the other order live."""
    instants = causes(result)
    return min((b - a for a, b in itertools.pairwise(instants)), default=float("inf"))


def generated(
    count: int, machine: Machine, seed: int, *, scale: float, grace: float, gap: float = DEFAULT_GAP
) -> list[SwfRecord]:
    """``count`` jobs (SWF records, trace seconds) of widths 1..all PEs, runtimes 200..800 trace seconds and
    arrivals 100..600 s apart, drawn with ``seed``, such that under every policy no two arrivals or ends are
    closer than ``gap`` live seconds. Built job by job: a draw that brings two events too close (checked by
    simulating the jobs so far, the newest arriving last) is drawn again."""
    rng = random.Random(seed)
    records: list[SwfRecord] = []
    arrival = 0.0
    for number in range(1, count + 1):
        for _ in range(1000):
            submit = arrival + (rng.randint(100, 600) if records else 0)
            runtime = rng.randint(200, 800)
            procs = rng.randint(1, machine.pes)
            record = SwfRecord(number, submit, runtime=runtime, procs=procs, req_procs=procs)
            workload = scaled(to_workload([*records, record], machine.pes), scale, grace)
            if all(
                closest_events(simulate(workload, machine, policy, core="mm")) >= gap for policy in POLICIES
            ):
                records.append(record)
                arrival = submit
                break
        else:
            raise ValueError(f"no workload of {count} jobs with events {gap:g} s apart (seed {seed})")
    return records


# ------------------------------------------------------------------------------------------ the two runs


def sim_times(workload: Workload, machine: Machine, policy: str) -> tuple[dict[int, Times], RunResult]:
    result = simulate(workload, machine, policy, core="mm")  # the whole MM core, as the live run
    times = {o.job.index: Times(o.job.submit, o.start, o.end, o.state) for o in result.outcomes}
    return times, result


def spin(job: SimJob) -> list[str]:
    return [sys.executable, "-m", "storm.tools.apps.spin", "--seconds", f"{job.runtime:.3f}"]


def live_times(
    workload: Workload, machine: Machine, policy: str, directory: Path, timeout: float
) -> tuple[dict[int, Times], float]:
    """Run ``workload`` on a throwaway local cluster (``machine``, batch, [mm] backfill of ``policy``):
    each job submitted when the workload's clock reaches its arrival. Returns MM times from the first
    job's submission, and the wall seconds of the whole run. The cluster is torn down whatever happens."""
    cluster = LocalCluster(
        directory, nodes=machine.nodes, pes_per_node=machine.pes_per_node,
        mm_settings={"backfill": POLICIES[policy]}, nm_settings={"kill_grace": 1.0},
    )  # fmt: skip
    cluster.up()
    try:
        with Client(cluster.endpoint, timeout=30.0) as client:
            ids: dict[int, int] = {}
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            started = time.monotonic()
            for job in workload.jobs:
                # Sleeping until an arrival is the workload's clock, not waiting for a condition.
                delay = started + job.submit - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                ids[job.index] = client.submit(
                    spin(job), job.procs, cwd=str(directory), env=env, time_limit=job.limit, hook=False,
                    name=f"cmp-{job.number}",
                )  # fmt: skip
            infos = _wait_all(client, tuple(ids.values()), timeout)
            wall = time.monotonic() - started
    finally:
        cluster.down()
    by_id = {info.id: info for info in infos}
    origin = by_id[ids[workload.jobs[0].index]].submit_time
    times = {}
    for index, job_id in ids.items():
        info = by_id[job_id]
        assert info.start_time is not None and info.end_time is not None  # ended: _wait_all checked
        times[index] = Times(
            info.submit_time - origin, info.start_time - origin, info.end_time - origin, info.state
        )
    return times, wall


def _wait_all(client: Client, job_ids: tuple[int, ...], timeout: float) -> list[p.JobInfo]:
    deadline = time.monotonic() + timeout
    while True:
        infos = client.jobs(job_ids, everything=True)
        if len(infos) == len(job_ids) and all(JobState(i.state).terminal for i in infos):
            return infos
        if time.monotonic() > deadline:
            left = [i.id for i in infos if not JobState(i.state).terminal]
            raise TimeoutError(f"jobs {left} still not ended {timeout:g} s after the first submission")
        time.sleep(POLL)


def replayed(workload: Workload, live: dict[int, Times]) -> Workload:
    """The workload as the live cluster ran it: each job arriving at its live submission and running for
    as long as it held its PEs live (launch, runtime and exit), with the same limits. Simulating it leaves
    only what the simulator does not model in a job's start: the time the MM takes to act on an event."""
    jobs = [
        replace(j, submit=live[j.index].submit, runtime=live[j.index].end - live[j.index].start)
        for j in workload.jobs
    ]
    # Live submissions are sequential, so their MM times are in workload order, as the engine needs.
    return replace(workload, jobs=jobs)


def order(times: dict[int, Times], workload: Workload) -> list[int]:
    """Job numbers by (start, position in the workload)."""
    jobs = workload.jobs
    return [jobs[i].number for i in sorted(times, key=lambda i: (times[i].start, i))]


def compare(
    workload: Workload,
    machine: Machine,
    policy: str,
    *,
    scale: float,
    grace: float,
    directory: Path | None = None,
) -> Comparison:
    """``workload`` (already scaled, see :func:`scaled`) through the simulator, then live."""
    sim, result = sim_times(workload, machine, policy)
    makespan = max(t.end for t in sim.values())
    timeout = 2 * makespan + 60  # generous: the live run lags the simulation by latency only
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="storm-sim-compare-") as tmp:
            live, wall = live_times(workload, machine, policy, Path(tmp), timeout)
    else:
        directory.mkdir(parents=True, exist_ok=True)
        live, wall = live_times(workload, machine, policy, directory, timeout)
    replay, _ = sim_times(replayed(workload, live), machine, policy)
    diffs = [
        JobDiff(j.index, j.number, j.procs, j.runtime, sim[j.index], live[j.index], replay[j.index])
        for j in workload.jobs
    ]
    comparison = Comparison(
        policy, machine, scale, grace, diffs, order(sim, workload), order(live, workload),
        order(replay, workload), closest_events(result), wall,
    )  # fmt: skip
    late = [d.number for d in diffs if d.live.state != JobState.COMPLETED]
    if late:
        comparison.notes.append(f"jobs not COMPLETED live (a limit too tight? raise --grace): {late}")
    return comparison


# ------------------------------------------------------------------------------------------ results


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def stats(values: list[float]) -> dict[str, float]:
    """max, median and p95 of |values| (and the signed mean: the typical lag)."""
    absolute = [abs(v) for v in values]
    return {
        "max_abs": max(absolute),
        "median_abs": statistics.median(absolute),
        "p95_abs": _quantile(absolute, 0.95),
        "mean": statistics.fmean(values),
    }


def summary(c: Comparison) -> dict[str, Any]:
    return {
        "order_matches": c.order_matches,
        "start": stats([d.start for d in c.jobs]),
        "end": stats([d.end for d in c.jobs]),
        "submit": stats([d.submit for d in c.jobs]),
        "start_vs_replay": stats([d.replay_start for d in c.jobs]),
        "overhead": stats([d.overhead for d in c.jobs]),
        "closest_events_s": c.closest_events,
    }


def to_json(c: Comparison) -> dict[str, Any]:
    return {
        "policy": c.policy,
        "backfill": POLICIES[c.policy],
        "machine": {"nodes": c.machine.nodes, "pes_per_node": c.machine.pes_per_node},
        "scale": c.scale,
        "grace_s": c.grace,
        "limit_rule": f"exact estimates: time limit = scaled runtime + {c.grace:g} s, in both runs",
        "origin_rule": "sim: first arrival; live: the MM's submit_time of the first job (MM clock)",
        "summary": summary(c),
        "sim_order": c.sim_order,
        "live_order": c.live_order,
        "replay_order": c.replay_order,
        "live_wall_s": c.live_wall,
        "notes": c.notes,
        "jobs": [
            {
                "index": d.index, "number": d.number, "procs": d.procs, "runtime": d.runtime,
                "sim": asdict(d.sim), "live": asdict(d.live), "replay": asdict(d.replay),
                "diff": {"submit": d.submit, "start": d.start, "end": d.end,
                         "start_vs_replay": d.replay_start, "overhead": d.overhead},
            }
            for d in c.jobs
        ],
    }  # fmt: skip


def markdown(c: Comparison) -> str:
    s = summary(c)
    lines = [
        f"# storm sim compare: {c.policy} on {c.machine.nodes} x {c.machine.pes_per_node} PEs, "
        f"scale {c.scale:g}, limit = runtime + {c.grace:g} s",
        "",
        "| job | PEs | runtime | sim start | live start | start diff | sim end | live end | end diff "
        "| overhead | vs replay | live |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for d in sorted(c.jobs, key=lambda d: (d.sim.start, d.index)):
        lines.append(
            f"| {d.number} | {d.procs} | {d.runtime:.2f} | {d.sim.start:.3f} | {d.live.start:.3f} "
            f"| {d.start:+.3f} | {d.sim.end:.3f} | {d.live.end:.3f} | {d.end:+.3f} | {d.overhead:+.3f} "
            f"| {d.replay_start:+.3f} | {d.live.state} |"
        )
    lines += [
        "",
        f"start order: sim {c.sim_order}",
        f"             live {c.live_order}",
        f"           replay {c.replay_order}",
        f"order matches: {'yes' if c.order_matches else 'NO'}",
        "",
        "| live - sim (s) | max abs | median abs | p95 abs | mean |",
        "|---|---:|---:|---:|---:|",
    ]
    for key in ("submit", "start", "end", "overhead", "start_vs_replay"):
        v = s[key]
        lines.append(
            f"| {key} | {v['max_abs']:.3f} | {v['median_abs']:.3f} | {v['p95_abs']:.3f} | {v['mean']:+.3f} |"
        )
    lines += [
        "",
        f"closest arrivals/ends in the simulation: {c.closest_events:.3f} s; live run {c.live_wall:.1f} s",
    ]
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines) + "\n"
