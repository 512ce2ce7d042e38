"""storm: the command line (``storm --help``).

Read commands take ``--json`` for scripts. Exit status: 0 on success, 1 when storm refused or failed,
2 for a usage error; ``storm submit --wait`` exits with the job's own exit code.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storm.mm import protocol as p
from storm.mm.slurm_style import expand_path
from storm.tools import cli_arrays, views
from storm.tools.cli_history import add_history_command
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


def parse_ranks(text: str) -> tuple[int, int]:
    """``-n``: a number of ranks (``4``), or Slurm's range form (``4-16``) for a moldable job whose size
    storm-mm picks when it starts it. Returns (least, most); most is 0 for a fixed size (as is ``4-4``)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not match:
        raise UsageError(f"-n {text}: give a number of ranks (4) or a range MIN-MAX (4-16)")
    low = int(match[1])
    high = int(match[2]) if match[2] is not None else low
    if low < 1:
        raise UsageError(f"-n {text}: a job needs at least 1 rank")
    if high < low:
        raise UsageError(f"-n {text}: the minimum ({low}) is larger than the maximum ({high})")
    if high >= 2**31:
        raise UsageError(f"-n {text}: too many ranks")
    return low, (high if high > low else 0)


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

    Names that depend on the job id (%j), an array task (%A, %a) or the node (%N) are created by the job
    shells, in append mode.
    """
    path = pattern if os.path.isabs(pattern) else os.path.join(cwd, pattern)
    directory = os.path.dirname(path) or "/"
    if not os.path.exists(directory):
        raise UsageError(f"output directory {directory} does not exist")
    if not os.path.isdir(directory):
        raise UsageError(f"output directory {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"output directory {directory} is not writable")
    if not any(f"%{c}" in path for c in "jNAa"):
        names = {expand_path(path, job_id=0, user=user, name=name, rank=r) for r in range(ranks)}
        for file in names:
            try:
                with open(file, "w"):
                    pass
            except OSError as exc:
                raise UsageError(f"cannot write output file {file}: {exc.strerror}") from None
    return path


def submission(args: argparse.Namespace) -> tuple[list[str], int, dict[str, object]]:
    """What ``storm submit`` and ``storm run`` ask for (their shared options): the command, the ranks and
    the other submit_job fields, checked here first."""
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError(f"a command is required: storm {args.cmd} -n RANKS -- COMMAND [ARGS...]")
    ranks, max_ranks = parse_ranks(args.ranks)
    extra = cli_arrays.submit_fields(args)  # before any output file is made
    cwd = os.getcwd()
    env = dict(os.environ)
    check_command(argv, env, cwd)
    time_limit = parse_time_limit(args.time) if args.time else None
    name = args.name or os.path.basename(argv[0])
    user = pwd.getpwuid(os.getuid()).pw_name
    # Per-rank file names known now are truncated for the ranks the job will have at least.
    output = prepare_outputs(args.output or "storm-%j.out", ranks, cwd, user, name)
    error = prepare_outputs(args.error, ranks, cwd, user, name) if args.error else ""
    fields: dict[str, object] = dict(extra)
    if max_ranks:
        fields["max_ranks"] = max_ranks
    if args.qos:
        fields["qos"] = args.qos
    fields.update(
        cwd=cwd, env=env, name=name, time_limit=time_limit, output=output, error=error, requeue=args.requeue,
        hook=args.hook, **run_as(args.uid, args.gid),
    )  # fmt: skip
    return argv, ranks, fields


def cmd_submit(args: argparse.Namespace) -> int:
    argv, ranks, fields = submission(args)
    with Client(args.mm) as client:
        submitted = client.submit_job(argv, ranks, **fields)
        print(submitted.job_id, flush=True)  # an array's id: its tasks are ID_TASK
        if not args.wait:
            return 0
        # An array: every task, and the highest exit status (sbatch --wait's).
        tasks = submitted.job_ids or (submitted.job_id,)
        return max(wait_for_job(client, job_id, cancel=submitted.job_id) for job_id in tasks)


def run_as(uid: str | None, gid: str | None) -> dict[str, object]:
    """``--uid``/``--gid`` (names or numbers, as sbatch takes them) as submit_job fields. The MM accepts only
    the caller's own: storm never runs a job as someone else, and says so rather than ignore the request."""
    fields: dict[str, object] = {}
    if uid is not None:
        if uid.isdigit():
            fields["uid"] = int(uid)
        else:
            fields["user"] = uid
    if gid is not None:
        if gid.isdigit():
            fields["gid"] = int(gid)
        else:
            try:
                fields["gid"] = grp.getgrnam(gid).gr_gid
            except KeyError:
                raise UsageError(f"--gid: no group {gid!r}") from None
    return fields


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a CURVE key pair in ZeroMQ's format for an MM, a node manager or a remote user (mm/auth.py)."""
    from storm.mm.keys import KeyFileError, write_keypair
    from storm.tools.client import default_key

    directory = Path(args.dir) if args.dir else default_key().parent
    if not args.dir and os.geteuid() == 0:
        directory = Path("/etc/storm/keys")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        public, secret = write_keypair(directory, args.name, force=args.force)
    except KeyFileError as exc:
        print(f"storm keygen: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"storm keygen: cannot write to {directory}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"public key {public}\nsecret key {secret} (mode 0600: it never leaves this host)")
    if args.name == "mm":
        print(
            f"storm-mm reads the secret key as [mm] key (it runs as user storm: chown storm {secret}); copy"
            f" {public.name} to every node ([nm] mm_key) and remote user ($STORM_MM_KEY)"
        )
    else:
        print(
            f"allow it on storm-mm's host by copying {public.name} into [mm] node_keys (a node manager) or"
            " [mm] client_keys (a remote user: the name before any '@' is the user)"
        )
    return 0


def wait_for_job(client: Client, job_id: int, cancel: int | None = None) -> int:
    """Block until the job ends; the first Ctrl-C cancels it (``cancel``: that job, or the whole array of
    that id, instead), as with srun; a second one stops waiting."""
    from storm.mm.jobs import WAIT_EXIT_CODES  # the MM's job model (and torus): only --wait needs it

    try:
        job = client.wait(job_id)
    except KeyboardInterrupt:
        target = job_id if cancel is None else cancel
        print(f"storm: cancelling job {target} (Ctrl-C again to stop waiting)", file=sys.stderr)
        client.cancel((target,))
        job = client.wait(job_id)
    state = p.JobState(job.state)
    if state is p.JobState.COMPLETED:
        return 0
    print(f"storm: job {job_id} {job.state}: {job.reason}", file=sys.stderr)
    return WAIT_EXIT_CODES.get(state) or job.exit_code or 1


def cmd_cancel(args: argparse.Namespace) -> int:
    job_ids, tasks = cli_arrays.references(args.job_ids)
    with Client(args.mm) as client:
        results = client.cancel(job_ids, tasks)
    status = 0
    for key in [str(j) for j in job_ids] + [str(t) for t in tasks]:
        result = results.get(key, "no answer")
        ok = result in ("cancelled", "cancelling")
        status |= 0 if ok else 1
        print(f"job {key}: {result}", file=sys.stdout if ok else sys.stderr)
    return status


def cmd_local(args: argparse.Namespace) -> int:
    from storm.tools.cli_local import local  # (the local cluster's code loads for `storm local` alone)

    return local(args)


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"storm.tools.bench_{args.which}")
    status: int = module.main(args.options)
    return status


# tools/sim/cli.py's actions, named here so that `storm --help` need not import the simulator.
SIM_ACTIONS = (
    "run",
    "sweep",
    "generate",
    "compare",
    "scenarios",
    "dynamic",
    "clusterschedsim",
    "bluegene",
    "reproduce",
)


def cmd_sim(args: argparse.Namespace) -> int:
    from storm.tools.sim.cli import main as sim_main

    return sim_main([args.action, *args.options])


# ---------------------------------------------------------------------------------------------- parser


SUBMIT_EPILOG = (
    "A range (-n 4-16) makes the job moldable: storm-mm picks its size when it starts it, fewer ranks when "
    "the queue is long, more when it is empty ([mm] moldable: rtc-ad or subset), and the ranks see it in "
    "STORM_SIZE, PMI_SIZE and MPI_Comm_size. A running job never changes size and never moves: migration "
    "and malleability need the application's cooperation (checkpoint, reconfiguration), which storm does "
    "not have; only the simulator models them (storm sim reproduce lsf). --qos picks a quality of service "
    "([mm] qos, qos_users): a higher priority goes first in the queue and, with [mm] preemption = "
    "'suspend', may suspend running jobs of a lower one (they continue when it ends)."
)


def add_job_commands(sub: Any) -> None:
    from storm.tools.cli_run import add_run_command

    s = sub.add_parser(
        "submit", help="submit a job", description="Submit a job; prints its id.", epilog=SUBMIT_EPILOG
    )
    add_submit_options(s)
    s.add_argument("--wait", "-W", action="store_true", help="wait for the job and exit with its exit code")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    s.set_defaults(func=cmd_submit)
    add_run_command(sub, add_submit_options)
    c = sub.add_parser("cancel", help="cancel jobs (an array's id: every task of it; ID_TASK: one task)")
    c.add_argument(
        "job_ids", nargs="+", type=cli_arrays.job_ref, metavar="JOBID", help="123, 123_7, 123_[1-3]"
    )
    c.set_defaults(func=cmd_cancel)


def add_submit_options(s: argparse.ArgumentParser) -> None:
    """The options of a job's submission, which storm submit and storm run share."""
    s.add_argument(
        "-n", "--ranks", required=True, metavar="N|MIN-MAX",
        help="number of MPI ranks (processes), or a range for a moldable job (storm-mm picks the size)",
    )  # fmt: skip
    s.add_argument("--qos", "-q", help="quality of service ([mm] qos; default normal)")
    s.add_argument("--name", "-J", help="job name (default: the command's name)")
    s.add_argument("--time", "-t", help="time limit: minutes, M:S, H:M:S, D-H:M:S, or 30s/5m/2h/1d")
    s.add_argument(
        "--output",
        "-o",
        help="stdout file; %%j job id, %%t rank, %%N node, %%A %%a array and task (default storm-%%j.out)",
    )
    s.add_argument("--error", "-e", help="stderr file (default: with stdout)")
    s.add_argument(
        "--requeue",
        action="store_true",
        help="if a node under the job fails, run it again (same id) instead of ending it NODE_FAIL",
    )
    s.add_argument(
        "--no-hook",
        dest="hook",
        action="store_false",
        help="run the ranks without mpihook: no statistics, FCS cannot classify them, waits always poll",
    )
    cli_arrays.add_options(s)
    s.add_argument("--uid", help="run as this user: only yourself is accepted (jobs run as their submitter)")
    s.add_argument("--gid", help="run with this group: only your own is accepted")


def add_view_commands(sub: Any) -> None:
    q = sub.add_parser("queue", help="list pending and running jobs")
    q.add_argument("--all", "-a", action="store_true", help="include finished jobs (the newest --last)")
    q.add_argument(
        "--last",
        type=int,
        default=1000,
        metavar="N",
        help="with --all: the newest N jobs (default 1000; 0: all)",
    )
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=views.cmd_queue)
    sh = sub.add_parser("show", help="show jobs in detail (an array's id: every task of it)")
    sh.add_argument(
        "job_ids", nargs="+", type=cli_arrays.job_ref, metavar="JOBID", help="123, 123_7, 123_[1-3]"
    )
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=views.cmd_show)
    n = sub.add_parser("nodes", help="list node managers")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=views.cmd_nodes)
    m = sub.add_parser("matrix", help="the Ousterhout matrix: rows (time slots) x PEs")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=views.cmd_matrix)
    st = sub.add_parser("stats", help="a running job's MPI communication, per rank (mpihook)")
    st.add_argument("job_id", type=int, metavar="JOBID")
    st.add_argument("--profile", action="store_true", help="where each process's time went, per class")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=views.cmd_stats)
    cl = sub.add_parser("classes", help="FCS: each process's class and measurements (or --history)")
    cl.add_argument("job_ids", type=int, nargs="*", metavar="JOBID", help="default: every running job")
    cl.add_argument("--history", action="store_true", help="the timeline of class changes (needs JOBIDs)")
    cl.add_argument("--json", action="store_true")
    cl.set_defaults(func=views.cmd_classes)
    w = sub.add_parser("watch", help="live view of the matrix, the classes and the queue")
    w.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    w.add_argument("--once", action="store_true", help="print one frame and exit")
    w.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    w.set_defaults(func=views.cmd_watch)


def add_cluster_commands(sub: Any) -> None:
    lo = sub.add_parser(
        "local", help="a whole cluster on this machine", description="Start or stop a local cluster."
    )
    lo.add_argument("action", choices=("up", "down", "status"))
    lo.add_argument("--nodes", "-N", type=int, help="node managers to start (default 2, or the torus's)")
    lo.add_argument(
        "--topology", metavar="torus:XxYxZ",
        help="nodes on a torus, nodeI at x + X (y + Y z) = I: every job gets a box of them (default flat)",
    )  # fmt: skip
    lo.add_argument(
        "--emulate", type=int, default=0, metavar="N",
        help="also N emulated node managers: storm-nm's core with simulated ranks, many to a process "
        "(a job runs as long as its command says: sleep N, true); with it --nodes defaults to 0",
    )  # fmt: skip
    lo.add_argument("--pes-per-node", "-P", type=int, default=0, help="PEs per node (default: CPUs / nodes)")
    lo.add_argument("--dir", help=f"state directory (default {default_local_dir()})")
    lo.add_argument("--detach", "-d", action="store_true", help="return once all nodes registered")
    lo.add_argument("--policy", choices=p.POLICIES, default=p.Policy.BATCH, help="scheduling (default batch)")
    lo.add_argument("--mpl", type=int, help="rows of the matrix: jobs sharing a PE (default 2 but in batch)")
    lo.add_argument("--slice-ms", type=float, default=100.0, help="time slice in ms (gang, fcs; default 100)")
    lo.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="an [mm] setting in TOML, e.g. preemption=suspend or 'qos={normal=0,high=10}' (repeatable)",
    )  # fmt: skip
    lo.set_defaults(func=cmd_local)
    k = sub.add_parser(
        "keygen",
        help="create a CURVE key pair (MM, node manager or remote user)",
        description="Write NAME.key (public) and NAME.key_secret (mode 0600) in ZeroMQ's key file format.",
    )
    k.add_argument("name", metavar="NAME", help="mm, a node's name, or a user name (user@host for a 2nd key)")
    k.add_argument("--dir", help="where to write (default /etc/storm/keys as root, else ~/.config/storm)")
    k.add_argument("--force", action="store_true", help="replace an existing key pair (locks out its users)")
    k.set_defaults(func=cmd_keygen)
    b = sub.add_parser(
        "bench", help="benchmarks (each but schedule and sim starts its own throwaway cluster)"
    )
    kinds = (
        "launch: start latency, throughput vs mpiexec; gang: heartbeats, switches; hook: mpihook's cost; "
        "scenarios: the FCS paper's workloads under every policy; system: launch, gang and hook in one "
        "table; mpi4py: mpi4py's own test suite under storm's policies against mpiexec; "
        "schedule: one scheduling pass over long queues, per backfill mode (in memory, no cluster); "
        "submit: submissions accepted per second from one client connection; "
        "cli: how long storm submit, queue and show take from a shell, and a shell loop of submissions; "
        "sim: simulated jobs per second of storm sim per trace and policy (in memory, no cluster); "
        "torus: the largest free partition (POP, brute force, the bitmask table) and a pass on a torus; "
        "scale: issue 18's figures beside its goals (heartbeat spread, 1,024 emulated node managers, "
        "a registration storm, 10,000 jobs, long queues, launch and CLI plug-ins); "
        "history: storm history over 100,000 stored jobs, and storm-mm's answers while a big one runs; "
        "arrays: submitting an array, a pass with held tasks, releasing dependents (in memory, no cluster); "
        "metrics: what a scrape and the nodes' timings cost storm-mm (in memory, no cluster); "
        "link: a message's round trip over the NM's link to its job shells against ZeroMQ (no cluster)"
    )
    which = (
        "launch",
        "gang",
        "hook",
        "scenarios",
        "system",
        "mpi4py",
        "classes",
        "schedule",
        "submit",
        "cli",
        "sim",
        "torus",
        "scale",
        "history",
        "arrays",
        "metrics",
        "link",
    )
    b.add_argument("which", choices=which, help=kinds)
    b.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options (--help)")
    b.set_defaults(func=cmd_bench)
    si = sub.add_parser(
        "sim",
        help="simulate storm-mm's scheduling of a workload trace (SWF)",
        description="Discrete-event simulation with storm-mm's own core: run, sweep, generate, compare; "
        "with storm-nm's cores over the node model: scenarios (the FCS paper's synthetic ones), dynamic (its "
        "dynamic workload over offered loads), clusterschedsim (ClusterSchedSim's schemes); bluegene (the "
        "BlueGene/L paper's torus schedulers); on the processor-allocation simulator: reproduce (the LSF and "
        "the partitioning papers' results).",
    )
    si.add_argument("action", choices=SIM_ACTIONS)
    si.add_argument("options", nargs=argparse.REMAINDER, help="the action's own options (--help)")
    si.set_defaults(func=cmd_sim)


GROUPS: dict[str, Callable[[Any], None]] = {
    **dict.fromkeys(("submit", "run", "cancel"), add_job_commands),
    **dict.fromkeys(("queue", "show", "nodes", "matrix", "stats", "classes", "watch"), add_view_commands),
    "history": add_history_command,
    **dict.fromkeys(("local", "keygen", "bench", "sim"), add_cluster_commands),
}


def command_word(argv: list[str]) -> str:
    """The command ``argv`` runs: its first word that is neither an option nor the value of ``--mm``; ""
    if there is none (or an option comes first that only the whole parser knows, such as --help)."""
    words = iter(argv)
    for word in words:
        if word == "--mm":
            next(words, None)
        elif not word.startswith("--mm="):
            return "" if word.startswith("-") else word
    return ""


def build_parser(command: str = "") -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, only the parsers of its group (a storm call builds
    what it runs, not the forty-odd parsers of every command: a millisecond off each short command)."""
    parser = argparse.ArgumentParser(prog="storm", description="Run and watch MPI jobs on a storm cluster.")
    parser.add_argument(
        "--mm", help="storm-mm client endpoint (default: $STORM_MM, the local cluster, /etc/storm)"
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    group = GROUPS.get(command)
    for add in [group] if group else list(dict.fromkeys(GROUPS.values())):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(command_word(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except (UsageError, cli_arrays.UsageError, p.ProtocolError) as exc:
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
