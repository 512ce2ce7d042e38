"""storm: the command line (``storm --help``).

Read commands take ``--json`` for scripts. Exit status: 0 on success, 1 when storm refused or failed,
2 for a usage error; ``storm submit --wait`` exits with the job's own exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pwd
import re
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storm.mm import protocol as p
from storm.mm.jobs import WAIT_EXIT_CODES, JobState, expand_path, format_duration
from storm.tools.client import Client, ClientError, default_local_dir


class UsageError(ValueError):
    pass


def parse_time_limit(text: str) -> float:
    """Slurm's formats (a bare number is minutes; M:S, H:M:S, D-H, D-H:M, D-H:M:S) plus 30s / 5m / 2h / 1d."""
    text = text.strip()
    suffixed = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text)
    if suffixed:
        seconds = float(suffixed[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[suffixed[2]]
    else:
        match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
        if not match:
            raise UsageError(
                f"invalid time limit {text!r}: use minutes, M:S, H:M:S, D-H:M:S, or 30s/5m/2h/1d"
            )
        days, a, b, c = match.groups()
        if days is not None:  # D-H, D-H:M, D-H:M:S
            seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        elif c is not None:  # H:M:S
            seconds = int(a) * 3600 + int(b) * 60 + int(c)
        elif b is not None:  # M:S
            seconds = int(a) * 60 + int(b)
        else:  # minutes
            seconds = int(a) * 60
    if seconds <= 0:
        raise UsageError("a time limit must be positive")
    return float(seconds)


def format_clock(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))


def elapsed(job: p.JobInfo, now: float) -> float | None:
    """Time the job has run: since it started, less the time gang scheduling kept it stopped."""
    if job.start_time is None:
        return None
    return (job.end_time or now) - job.start_time - job.suspended_time


def as_json(record: Any) -> Any:
    return dataclasses.asdict(record)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


# ---------------------------------------------------------------------------------------------- commands


def check_command(argv: list[str], env: dict[str, str], cwd: str) -> None:
    """Refuse a command that cannot run here, before it is queued (it would fail on the nodes anyway)."""
    program = argv[0]
    if "/" in program:
        path = program if os.path.isabs(program) else os.path.join(cwd, program)
        if not os.path.isfile(path):
            raise UsageError(f"{program}: no such file")
        if not os.access(path, os.X_OK):
            raise UsageError(f"{program}: not executable")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise UsageError(f"{program}: command not found in PATH")


def prepare_outputs(pattern: str, ranks: int, cwd: str, user: str, name: str) -> str:
    """Make the output path absolute; truncate files whose names are known now (Slurm's open mode).

    Names that depend on the job id (%j) or node (%N) are created by the job shells, in append mode.
    """
    path = pattern if os.path.isabs(pattern) else os.path.join(cwd, pattern)
    directory = os.path.dirname(path) or "/"
    if not os.path.exists(directory):
        raise UsageError(f"output directory {directory} does not exist")
    if not os.path.isdir(directory):
        raise UsageError(f"output directory {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"output directory {directory} is not writable")
    if "%j" not in path and "%N" not in path:
        names = {expand_path(path, job_id=0, user=user, name=name, rank=r) for r in range(ranks)}
        for file in names:
            try:
                with open(file, "w"):
                    pass
            except OSError as exc:
                raise UsageError(f"cannot write output file {file}: {exc.strerror}") from None
    return path


def cmd_submit(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("a command is required: storm submit -n RANKS -- COMMAND [ARGS...]")
    if args.ranks < 1:
        raise UsageError(f"-n must be at least 1, not {args.ranks}")
    cwd = os.getcwd()
    env = dict(os.environ)
    check_command(argv, env, cwd)
    time_limit = parse_time_limit(args.time) if args.time else None
    name = args.name or os.path.basename(argv[0])
    user = pwd.getpwuid(os.getuid()).pw_name
    output = prepare_outputs(args.output or "storm-%j.out", args.ranks, cwd, user, name)
    error = prepare_outputs(args.error, args.ranks, cwd, user, name) if args.error else ""
    with Client(args.mm) as client:
        job_id = client.submit(
            argv, args.ranks, cwd=cwd, env=env, name=name, time_limit=time_limit, output=output, error=error
        )
        print(job_id, flush=True)
        if not args.wait:
            return 0
        return wait_for_job(client, job_id)


def wait_for_job(client: Client, job_id: int) -> int:
    """Block until the job ends; the first Ctrl-C cancels it (as with srun), a second one stops waiting."""
    try:
        job = client.wait(job_id)
    except KeyboardInterrupt:
        print(f"storm: cancelling job {job_id} (Ctrl-C again to stop waiting)", file=sys.stderr)
        client.cancel((job_id,))
        job = client.wait(job_id)
    state = JobState(job.state)
    if state is JobState.COMPLETED:
        return 0
    print(f"storm: job {job_id} {job.state}: {job.reason}", file=sys.stderr)
    return WAIT_EXIT_CODES.get(state) or job.exit_code or 1


def cmd_queue(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        jobs = client.jobs(everything=args.all)
    if args.json:
        print(json.dumps([as_json(j) for j in jobs], indent=1))
        return 0
    now = time.time()
    rows = [
        (
            j.id, j.name[:20], j.user, j.state, j.ranks, format_duration(elapsed(j, now)),
            format_duration(j.time_limit), ",".join(j.nodes) or "-",
            "-" if j.exit_code is None else j.exit_code, j.reason or "-",
        )
        for j in jobs
    ]  # fmt: skip
    headers = ("JOBID", "NAME", "USER", "STATE", "RANKS", "TIME", "LIMIT", "NODES", "EXIT", "REASON")
    print(table(headers, rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        jobs = client.jobs(tuple(args.job_ids))
    missing = sorted(set(args.job_ids) - {j.id for j in jobs})
    for job_id in missing:
        print(f"storm: no job {job_id}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                [as_json(j) for j in jobs] if len(args.job_ids) > 1 else as_json(jobs[0]) if jobs else None,
                indent=1,
            )
        )
    else:
        now = time.time()
        for job in jobs:
            fields = [
                ("JobId", job.id), ("Name", job.name), ("User", f"{job.user} ({job.uid})"),
                ("State", job.state), ("Reason", job.reason or "-"),
                ("ExitCode", "-" if job.exit_code is None else job.exit_code),
                ("Ranks", job.ranks), ("Nodes", ",".join(job.nodes) or "-"),
                ("TimeLimit", format_duration(job.time_limit)),
                ("RunTime", format_duration(elapsed(job, now))),
                ("Suspended", format_duration(job.suspended_time)),
                ("Row", "-" if job.row is None else job.row),
                ("SubmitTime", format_clock(job.submit_time)), ("StartTime", format_clock(job.start_time)),
                ("EndTime", format_clock(job.end_time)), ("Command", " ".join(job.argv)),
                ("WorkDir", job.cwd), ("StdOut", job.output), ("StdErr", job.error or job.output),
            ]  # fmt: skip
            print("\n".join(f"{k:>11}: {v}" for k, v in fields))
            print()
    return 1 if missing else 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        results = client.cancel(tuple(args.job_ids))
    status = 0
    for job_id in args.job_ids:
        result = results.get(str(job_id), "no answer")
        ok = result in ("cancelled", "cancelling")
        status |= 0 if ok else 1
        print(f"job {job_id}: {result}", file=sys.stdout if ok else sys.stderr)
    return status


def render_matrix(view: p.MatrixView) -> str:
    """Rows of the matrix, the active one marked with '*'; '.' for a free PE."""
    if view.policy == "gang":
        active = "-" if view.active_row is None else str(view.active_row)
        title = f"gang scheduling, MPL {view.mpl}, {view.slice * 1000:g} ms slices, active row {active}"
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


def cmd_stats(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        view = client.call(p.GetStats(job_id=args.job_id), p.StatsView)
    if args.json:
        print(json.dumps(as_json(view), indent=1))
        return 0
    if not view.ranks:
        live = view.state in ("PENDING", "STARTING", "RUNNING")
        print(
            f"job {view.job_id} ({view.state}): "
            + ("no statistics yet" if live else "statistics are kept while a job runs")
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
        )
        for r in view.ranks
    ]  # fmt: skip
    headers = ("RANK", "NODE", "PID", "STATE", "T_CPU(s)", "T_COMM(s)", "C_COMM", "CPU/EV(ms)", "WAIT/EV(ms)",
               "G(ms)", "WAIT")  # fmt: skip
    print(table(headers, rows))
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    with Client(args.mm) as client:
        nodes = client.nodes()
    if args.json:
        print(json.dumps([as_json(n) for n in nodes], indent=1))
        return 0
    rows = [
        (
            n.name,
            n.state,
            n.pes,
            n.pes_used,
            ",".join(map(str, n.jobs)) or "-",
            f"{n.switches} ({n.switch_p50_ms:.1f}/{n.switch_p99_ms:.1f} ms)" if n.switches else "-",
            n.address or "-",
            n.reason or "-",
        )
        for n in nodes
    ]
    print(table(("NODE", "STATE", "PES", "USED", "JOBS", "SWITCHES (p50/p99)", "ADDRESS", "REASON"), rows))
    return 0


def cmd_local(args: argparse.Namespace) -> int:
    from storm.tools.local_cluster import LocalCluster, LocalClusterError, status

    directory = Path(args.dir).absolute() if args.dir else default_local_dir()
    try:
        if args.action == "up":
            return local_up(args, directory)
        if args.action == "down":
            LocalCluster.load(directory).down()
            print(f"storm local cluster in {directory} stopped")
        else:
            print(status(directory))
    except LocalClusterError as exc:
        print(f"storm local: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"storm.tools.bench_{args.which}")
    status: int = module.main(args.options)
    return status


def local_up(args: argparse.Namespace, directory: Path) -> int:
    from storm.tools.local_cluster import LocalCluster

    if args.nodes < 1:
        raise UsageError("--nodes must be at least 1")
    pes = args.pes_per_node or max(1, len(os.sched_getaffinity(0)) // args.nodes)
    mpl = args.mpl if args.mpl is not None else (2 if args.policy == "gang" else 1)
    if args.policy == "batch" and mpl != 1:
        raise UsageError("batch runs one job per PE: --mpl needs --policy gang")
    if mpl < 1 or args.slice_ms <= 0:
        raise UsageError("--mpl must be at least 1 and --slice-ms positive")
    settings: dict[str, object] = {"mpl": mpl, "slice": args.slice_ms / 1000}
    cluster = LocalCluster(
        dir=directory, nodes=args.nodes, pes_per_node=pes, policy=args.policy, mm_settings=settings
    )
    cluster.up()
    scheduling = f"gang, MPL {mpl}, {args.slice_ms:g} ms slices" if args.policy == "gang" else "batch"
    print(f"storm local cluster up: {args.nodes} node(s) x {pes} PE(s), {scheduling}, state in {directory}")
    if directory != default_local_dir():
        print(f"  point the CLI at it with: export STORM_LOCAL_DIR={directory}")
    print("  try: storm submit -n 2 --wait -- python -m storm.tools.apps.hello")
    if args.detach:
        return 0
    print("  (Ctrl-C stops it)", flush=True)
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # taken by sigtimedwait below, not by a handler
    while cluster.running() and signal.sigtimedwait(stop_signals, 1.0) is None:
        pass
    cluster.down()
    print("storm local cluster stopped")
    return 0


# ---------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="storm", description="Run and watch MPI jobs on a storm cluster.")
    parser.add_argument(
        "--mm", help="storm-mm client endpoint (default: $STORM_MM, the local cluster, /etc/storm)"
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("submit", help="submit a job", description="Submit a job; prints its id.")
    s.add_argument("-n", "--ranks", type=int, required=True, help="number of MPI ranks (processes)")
    s.add_argument("--name", "-J", help="job name (default: the command's name)")
    s.add_argument("--time", "-t", help="time limit: minutes, M:S, H:M:S, D-H:M:S, or 30s/5m/2h/1d")
    s.add_argument(
        "--output", "-o", help="stdout file; %%j job id, %%t rank, %%N node (default storm-%%j.out)"
    )
    s.add_argument("--error", "-e", help="stderr file (default: with stdout)")
    s.add_argument("--wait", "-W", action="store_true", help="wait for the job and exit with its exit code")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    s.set_defaults(func=cmd_submit)

    q = sub.add_parser("queue", help="list pending and running jobs")
    q.add_argument("--all", "-a", action="store_true", help="include finished jobs")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_queue)

    sh = sub.add_parser("show", help="show jobs in detail")
    sh.add_argument("job_ids", type=int, nargs="+", metavar="JOBID")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)

    c = sub.add_parser("cancel", help="cancel jobs")
    c.add_argument("job_ids", type=int, nargs="+", metavar="JOBID")
    c.set_defaults(func=cmd_cancel)

    m = sub.add_parser("matrix", help="the Ousterhout matrix: rows (time slots) x PEs")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_matrix)

    st = sub.add_parser("stats", help="a running job's MPI communication, per rank (mpihook)")
    st.add_argument("job_id", type=int, metavar="JOBID")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_stats)

    n = sub.add_parser("nodes", help="list node managers")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=cmd_nodes)

    lo = sub.add_parser(
        "local", help="a whole cluster on this machine", description="Start or stop a local cluster."
    )
    lo.add_argument("action", choices=("up", "down", "status"))
    lo.add_argument("--nodes", "-N", type=int, default=2, help="node managers to start (default 2)")
    lo.add_argument("--pes-per-node", "-P", type=int, default=0, help="PEs per node (default: CPUs / nodes)")
    lo.add_argument("--dir", help=f"state directory (default {default_local_dir()})")
    lo.add_argument("--detach", "-d", action="store_true", help="return once all nodes registered")
    lo.add_argument("--policy", choices=("batch", "gang"), default="batch", help="scheduling (default batch)")
    lo.add_argument("--mpl", type=int, help="rows of the matrix: jobs sharing a PE (gang; default 2)")
    lo.add_argument("--slice-ms", type=float, default=100.0, help="time slice in ms (gang; default 100)")
    lo.set_defaults(func=cmd_local)

    b = sub.add_parser("bench", help="benchmarks (each starts its own throwaway cluster)")
    b.add_argument(
        "which",
        choices=("launch", "gang", "hook"),
        help="launch: start latency, throughput vs mpiexec; gang: heartbeats, switches; hook: mpihook's cost",
    )
    b.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options (--help)")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except (UsageError, p.ProtocolError) as exc:
        print(f"storm {args.cmd}: {exc}", file=sys.stderr)
        return 2
    except ClientError as exc:
        print(f"storm {args.cmd}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
