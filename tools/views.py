"""The read commands of the storm CLI: queue, show, nodes, matrix, stats, classes, watch.

Each prints a table for people or, with ``--json``, the records themselves for scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from storm.mm import protocol as p
from storm.mm.slurm_style import format_duration
from storm.tools import cli_arrays
from storm.tools.client import Client


def format_clock(stamp: float | None, *, precise: bool = False) -> str:
    """Local time to the second, or with ``precise`` to the millisecond; '-' for none."""
    if stamp is None:
        return "-"
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))
    return f"{text}.{int(stamp % 1 * 1000):03d}" if precise else text


def elapsed(job: p.JobInfo, now: float) -> float | None:
    """Time the job has run: since it started, less the time gang scheduling kept it stopped."""
    if job.start_time is None:
        return None
    return (job.end_time or now) - job.start_time - job.suspended_time


def ranks_text(job: p.JobInfo) -> str:
    """A job's ranks: ``4``; a moldable one's range while it waits (``4-16``), then the size it got and the
    range (``8 (4-16)``)."""
    if not job.max_ranks:
        return str(job.ranks)
    if job.start_time is None:
        return f"{job.min_ranks}-{job.max_ranks}"
    return f"{job.ranks} ({job.min_ranks}-{job.max_ranks})"


def state_text(job: p.JobInfo) -> str:
    """SUSPENDED for a running job preemption holds stopped (its state is RUNNING), else its state."""
    return "SUSPENDED" if job.suspended_by is not None and job.state == p.JobState.RUNNING else job.state


def as_json(record: Any) -> Any:
    return dataclasses.asdict(record)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def cmd_queue(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        jobs = client.jobs(everything=args.all, last=args.last)
    if args.json:
        print(json.dumps([as_json(j) for j in jobs], indent=1))
        return 0
    now = time.time()
    # An array's pending tasks are one line (123_[5-99%10]); --json above keeps one record per task.
    rows = [
        (
            name, j.name[:20], j.user, state_text(j), ranks_text(j), format_duration(elapsed(j, now)),
            format_duration(j.time_limit), ",".join(j.nodes) or "-",
            "-" if j.exit_code is None else j.exit_code, j.reason or "-",
        )
        for name, j, _count in cli_arrays.folded(jobs)
    ]  # fmt: skip
    headers = ("JOBID", "NAME", "USER", "STATE", "RANKS", "TIME", "LIMIT", "NODES", "EXIT", "REASON")
    print(table(headers, rows))
    return 0


def spawned(view: p.SpawnsView) -> str:
    """What a job spawned (MPI_Comm_spawn), in a few words."""
    text = f"{view.processes} process(es) in {view.spawns} spawn(s)"
    if view.refused:
        text += f"; {view.refused} refused, the last: {view.last_refusal}"
    return text


def cmd_show(args: argparse.Namespace) -> int:
    job_ids, tasks = cli_arrays.references(args.job_ids)
    with Client(args.mm) as client:
        jobs = client.named(job_ids, tasks)
        spawns = {j.id: client.call(p.GetSpawns(job_id=j.id), p.SpawnsView) for j in jobs}
    found = {str(j.id) for j in jobs} | {str(j.array_id) for j in jobs} | set(map(cli_arrays.job_name, jobs))
    missing = [ref for ref in [*map(str, job_ids), *map(str, tasks)] if ref not in found]
    for ref in missing:
        print(f"storm: no job {ref}", file=sys.stderr)
    if args.json:
        counts = {
            j.id: {k: v for k, v in as_json(spawns[j.id]).items() if k not in ("req", "job_id")} for j in jobs
        }
        shown = [{**as_json(j), "spawns": counts[j.id]} for j in jobs]
        listed = len(args.job_ids) > 1 or len(jobs) > 1  # an array's id lists its tasks
        print(json.dumps(shown if listed else shown[0] if shown else None, indent=1))
    else:
        now = time.time()
        for job in jobs:
            fields = [
                ("JobId", job.id), ("Name", job.name), ("User", f"{job.user} ({job.uid})"),
                ("State", state_text(job)), ("Reason", job.reason or "-"),
                ("ExitCode", "-" if job.exit_code is None else job.exit_code),
                ("Ranks", ranks_text(job)), ("Nodes", ",".join(job.nodes) or "-"),
                ("QOS", f"{job.qos or 'normal'} (priority {job.priority})"),
                ("TimeLimit", format_duration(job.time_limit)),
                ("RunTime", format_duration(elapsed(job, now))),
                ("Suspended", format_duration(job.suspended_time)),
                ("Row", "-" if job.row is None else job.row),
                ("Requeue", f"yes (requeued {job.requeues} times)" if job.requeue else "no"),
                ("MpiHook", "yes" if job.hook else "no (submitted with --no-hook)"),
                ("Spawned", spawned(spawns[job.id])),
                ("SubmitTime", format_clock(job.submit_time)), ("StartTime", format_clock(job.start_time)),
                ("EndTime", format_clock(job.end_time)), ("Command", " ".join(job.argv)),
                ("WorkDir", job.cwd), ("StdOut", job.output), ("StdErr", job.error or job.output),
            ]  # fmt: skip
            if job.dependency:
                fields.insert(5, ("Dependency", job.dependency))
            if job.array_id is not None:
                fields[1:1] = [("ArrayJobId", job.array_id), ("ArrayTaskId", job.array_task)]
                fields.insert(3, ("ArrayTasks", job.array))
            if job.warning:
                fields.insert(5, ("Warning", job.warning))
            if job.suspended_by is not None:
                fields.insert(5, ("SuspendedBy", job.suspended_by))
            if job.box is not None:  # a torus: the partition of whole nodes the job holds
                fields.insert(
                    fields.index(("Row", "-" if job.row is None else job.row)), ("Box", str(job.box))
                )
            print("\n".join(f"{k:>11}: {v}" for k, v in fields))
            print()
    return 1 if missing else 0


def render_torus(torus: p.TorusView) -> str:
    """Each layer (z) of the torus as a grid of its nodes, y down and x across: 'node job' ('.' if free,
    '-' where no node is)."""
    x_size, y_size, z_size = torus.dims
    blocks = []
    for z in range(z_size):
        rows = []
        for y in range(y_size):
            cells = []
            for x in range(x_size):
                at = x + x_size * (y + y_size * z)
                name, job = torus.nodes[at], torus.jobs[at]
                cells.append(f"{name} {job or '.'}" if name else "-")
            rows.append((f"y={y}", *cells))
        blocks.append(f"layer z={z}\n" + table(("", *(f"x={x}" for x in range(x_size))), rows))
    return "\n\n".join(blocks)


def render_matrix(view: p.MatrixView) -> str:
    """Rows of the matrix, the active one marked with '*'; '.' for a free PE. On a torus, its layers."""
    if view.torus is not None:
        dims = "x".join(map(str, view.torus.dims))
        title = f"torus {dims}: each job holds a box of whole nodes (node, then the job holding it; '.' free)"
        return title + "\n" + render_torus(view.torus)
    policy = p.Policy(view.policy)
    if policy.cycles:
        active = "-" if view.active_row is None else str(view.active_row)
        name = "flexible coscheduling (FCS)" if policy.classifies else "gang scheduling"
        title = f"{name}, MPL {view.mpl}, {view.slice * 1000:g} ms slices, active row {active}"
    elif policy.spin_block:
        title = f"spin-block scheduling, MPL {view.mpl} (every job runs all the time; waits spin, then block)"
    else:
        title = "batch scheduling (one row: every job runs all the time)"
    rows = [
        (f"{index}{' *' if index == view.active_row else ''}", *(str(job) if job else "." for job in line))
        for index, line in enumerate(view.cells)
    ]
    return title + "\n" + table(("ROW", *view.columns), rows)


def cmd_matrix(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        view = client.call(p.GetMatrix(), p.MatrixView)
    if args.json:
        print(json.dumps(as_json(view), indent=1))
    else:
        print(render_matrix(view))
    return 0


def hook_notes(ranks: tuple[p.RankStats, ...]) -> list[str]:
    """What mpihook could not do for these ranks, said once per kind."""

    def which(pick: Callable[[p.RankStats], bool]) -> str:
        return ",".join(str(r.rank) for r in ranks if pick(r))

    notes = []
    if threaded := which(lambda r: r.thread_multiple):
        notes.append(
            f"ranks {threaded}: MPI_THREAD_MULTIPLE: every MPI call stays MPICH's own blocking call"
            " (measured around it; it spin-blocks inside MPICH's wait loop)"
        )
    if polling := which(lambda r: r.collectives_poll and r.wait_mode == "spin-block"):
        notes.append(
            f"ranks {polling}: their collectives over shared memory poll: the job's"
            " MPIR_CVAR_<COLL>_POSIX_INTRA_ALGORITHM settings choose algorithms that cannot spin-block"
        )
    return notes


def cmd_stats(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        view = client.call(p.GetStats(job_id=args.job_id), p.StatsView)
        spawns = client.call(p.GetSpawns(job_id=args.job_id), p.SpawnsView)
    if args.json:
        print(json.dumps(as_json(view), indent=1))
        return 0
    if args.profile:
        return print_profile(view)
    if not view.ranks:
        live = not p.JobState(view.state).terminal
        print(
            f"job {view.job_id} ({view.state}): "
            + ("no statistics yet" if live else "statistics are kept while a job runs")
            + (f"; spawned {spawned(spawns)}" if spawns.spawns or spawns.refused else "")
        )
        return 0
    print(f"job {view.job_id} ({view.state}), reported {view.age:.1f} s ago; times per communication event:")

    def per_event(seconds: float, events: int) -> str:
        return f"{seconds / events * 1000:.3f}" if events else "-"

    rows = [
        (
            r.rank, r.node, r.pid, r.state, f"{r.t_cpu:.3f}", f"{r.t_comm:.3f}", r.c_comm,
            per_event(r.t_cpu, r.c_comm), per_event(r.t_comm, r.c_comm),
            "-" if r.granularity is None else f"{r.granularity * 1000:.3f}", r.wait_mode,
            f"{r.call} {r.call_time:.1f}s" if r.call else "-",
        )
        for r in view.ranks
    ]  # fmt: skip
    headers = ("RANK", "NODE", "PID", "STATE", "T_CPU(s)", "T_COMM(s)", "C_COMM", "CPU/EV(ms)", "WAIT/EV(ms)",
               "G(ms)", "WAIT", "IN CALL")  # fmt: skip
    print(table(headers, rows))
    for note in hook_notes(view.ranks):
        print(note)
    if view.warning:
        print(f"WARNING: {view.warning}")
    if spawns.spawns or spawns.refused:
        print(f"spawned (not measured): {spawned(spawns)}")
    return 0


PROFILE_PARTS = ("compute", "poll", "blocked", "stopped", "queued")


def print_profile(view: p.StatsView) -> int:
    """Where each process's time went, per class, in seconds and in % of its wall time."""
    if not view.profile:
        print(f"job {view.job_id} ({view.state}): no profile (the nodes profile with [nm] profile = true)")
        return 0
    rows = []
    for e in view.profile:
        parts = [getattr(e, name) for name in PROFILE_PARTS]
        other = max(0.0, e.wall - sum(parts))
        cells = [f"{v:.2f} ({100 * v / e.wall:.0f}%)" if e.wall > 0 else "-" for v in (*parts, other)]
        rows.append((e.rank, e.node, e.klass or "-", f"{e.wall:.2f}", *cells))
    headers = ("RANK", "NODE", "CLASS", "WALL(s)", *(n.upper() for n in PROFILE_PARTS), "OTHER")
    print(f"job {view.job_id} ({view.state}): where each process's time went, per class (seconds)")
    print(table(headers, rows))
    return 0


def cmd_classes(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        view = client.call(p.GetClasses(job_ids=tuple(args.job_ids), history=args.history), p.ClassesView)
    if args.json:
        print(json.dumps(as_json(view)["changes" if args.history else "processes"], indent=1))
        return 0
    if args.history:
        changes = [
            (format_clock(c.time, precise=True), c.job_id, c.rank, c.node, c.tslots, f"{c.old} -> {c.new}")
            for c in view.changes
        ]
        print(
            table(("TIME", "JOB", "RANK", "NODE", "SLOT", "CHANGE"), changes)
            if changes
            else "no class changes recorded"
        )
        return 0
    rows = [
        (
            r.job_id, r.rank, r.node, r.pe, r.klass or "-", f"{r.t_cpu:.3f}", f"{r.t_comm:.3f}", r.c_comm,
            "-" if r.granularity is None else f"{r.granularity * 1000:.3f}", r.cslots, r.tslots, r.wait_mode,
        )
        for r in view.processes
    ]  # fmt: skip
    headers = (
        "JOB", "RANK", "NODE", "PE", "CLASS", "T_CPU(s)", "T_COMM(s)", "C_COMM", "G(ms)",
        "CSLOTS", "TSLOTS", "WAIT",
    )  # fmt: skip
    print(table(headers, rows) if rows else "no running job has reported yet")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from storm.tools.watch import watch

    try:
        return watch(args.mm, args.interval, args.once, {"always": True, "never": False}.get(args.color))
    except KeyboardInterrupt:
        return 0


def switch_cell(n: p.NodeInfo) -> str:
    """Context switches, their time to take effect, and heartbeats not switched at their instant."""
    cell = f"{n.switches} ({n.switch_p50_ms:.1f}/{n.switch_p99_ms:.1f} ms)" if n.switches else "-"
    missed = [
        f"{count} {what}" for count, what in ((n.late_beats, "late"), (n.skewed_beats, "skewed")) if count
    ]
    return f"{cell}, {', '.join(missed)}" if missed else cell


def cmd_nodes(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        nodes = client.nodes()
        torus = any(n.coords for n in nodes)
        jobs = client.jobs() if torus and not args.json else []
    if args.json:
        print(json.dumps([as_json(n) for n in nodes], indent=1))
        return 0
    rows = [
        (
            n.name,
            *(("-" if not n.coords else ",".join(map(str, n.coords)),) if torus else ()),
            n.state,
            n.pes,
            n.pes_used,
            ",".join(map(str, n.jobs)) or "-",
            switch_cell(n),
            n.address or "-",
            n.reason or "-",
        )
        for n in nodes
    ]
    headers = ("NODE", *(("X,Y,Z",) if torus else ()), "STATE", "PES", "USED", "JOBS", "SWITCHES (p50/p99)")
    print(table((*headers, "ADDRESS", "REASON"), rows))
    boxed = [j for j in jobs if j.box is not None and p.JobState(j.state).active]
    if boxed:
        held = {j.id: [n.name for n in nodes if j.id in n.jobs] for j in boxed}
        print("\nboxes on the torus:")
        print("\n".join(f"  job {j.id}: {j.box} on {','.join(held[j.id])}" for j in boxed))
    return 0
