"""Benchmark: how long a ``storm`` command takes when a shell runs it, and how fast a shell loop submits.

``storm bench cli`` starts a throwaway local cluster (2 nodes x 1 PE), or uses the running one in
``--dir``, and runs each command as a new process, the way a shell does, ``--repeats`` times, the commands
interleaved so that noise from other work on the host hits them all alike:

- ``python -c pass`` with the interpreter the ``storm`` script names: what any Python program pays before
  it does anything (the floor);
- ``storm --help``, ``storm submit -n 1 -- true``, ``storm queue`` and ``storm show JOBID``, reaching the
  cluster as a user's shell does (``STORM_LOCAL_DIR``).

For each: the median and 90th percentile of the wall time, the median CPU time (user + system), the MM's
share (the same requests sent by this process over a connection already open, interleaved with the
commands; median) and the CLI's own (wall - MM), and what ``python -X importtime`` reports for the
command's own imports (once; importtime slows what it measures: a figure to compare, not a share).
Meanwhile one job holds every PE (``--no-hold``: not), so that the submitted jobs wait and none starts
while a command is timed: the figures are the CLI's and the MM's answers, not the launches of jobs, which
share the same CPUs on one machine. Then the shell loop of issue 18, ``for i in $(seq 200); do storm submit
-n 1 -- true; done`` in bash, twice: with the jobs held in the queue, and once they are cancelled and the
PEs free, with every job starting as it is submitted (what a user sees); the MM's share of a loop is
estimated as 200 times its median answer to a submission.

Before timing, each command runs once with bytecode writing on (even if PYTHONDONTWRITEBYTECODE is set), as
pip compiles an installation's bytecode: the figures are those of an installed storm, not of its first run.
``--baseline STORM`` times another ``storm`` script too (another checkout's ``.venv/bin/storm``) in the same
runs against the same cluster, for a before/after on one machine state.

Goals (issue 18): every command under 60 ms, the loop of 200 under 10 s. It prints a table and writes every
figure as JSON; :func:`measure_cli` is the measurement, for other benchmarks (``storm bench scale``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from storm.mm import protocol as p
from storm.tools.client import Client, local_endpoint
from storm.tools.local_cluster import LocalCluster

Json = dict[str, Any]
COMMAND_GOAL_MS = 60.0
LOOP_GOAL_S = 10.0
COMMANDS = ("python", "help", "submit", "queue", "show")  # python: the floor
GOAL_COMMANDS = ("submit", "queue", "show")  # the goal is theirs; the MM's share is measured for them


def storm_script() -> str:
    """The ``storm`` console script of the running installation."""
    found = shutil.which("storm", path=str(Path(sys.executable).parent)) or shutil.which("storm")
    if found is None:
        raise SystemExit("storm bench cli: no `storm` script found beside this Python or in PATH")
    return found


def interpreter(script: str) -> str:
    """The Python a console script runs with (its #! line)."""
    with open(script, "rb") as file:
        first = file.readline().decode(errors="replace")
    return first[2:].strip().split()[0] if first.startswith("#!") else sys.executable


def argv_of(script: str, command: str, job_id: int) -> list[str]:
    return {
        "python": [interpreter(script), "-c", "pass"],
        "help": [script, "--help"],
        "submit": [script, "submit", "-n", "1", "--", "true"],
        "queue": [script, "queue"],
        "show": [script, "show", str(job_id)],
    }[command]


def run_timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, str]:
    """Wall and CPU seconds of one run, and its output; the command must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False, timeout=60)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode().strip()}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, done.stdout.decode()


def import_ms(argv: list[str], env: dict[str, str], cwd: str, floor: set[str]) -> float:
    """Milliseconds ``python -X importtime`` gives the command's top-level imports not in ``floor``."""
    python, script = interpreter(argv[0]), argv[0]
    done = subprocess.run(
        [python, "-X", "importtime", script, *argv[1:]], env=env, cwd=cwd, capture_output=True, check=False
    )
    return sum(us for name, us in top_imports(done.stderr.decode()) if name not in floor) / 1000


def top_imports(report: str) -> list[tuple[str, int]]:
    """(module, cumulative microseconds) of each import ``-X importtime`` lists at the top level."""
    found = []
    for line in report.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if cumulative.strip().isdigit() and not name[1:].startswith(" "):  # nested ones are indented
            found.append((name.strip(), int(cumulative)))
    return found


def importtime_of_nothing(script: str, env: dict[str, str], cwd: str) -> str:
    """What the interpreter imports by itself (site, an editable install's finder...): not the command's."""
    argv = [interpreter(script), "-X", "importtime", "-c", "pass"]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=True).stderr.decode()


def mm_seconds(client: Client, command: str, job_id: int, cwd: str, submitted: list[int]) -> float:
    """The MM's answer to what ``command`` asks, over this open connection (as the CLI sends it)."""
    started = time.perf_counter()
    if command == "submit":
        output = os.path.join(cwd, "storm-%j.out")
        submitted.append(
            client.submit(["true"], 1, cwd=cwd, env=dict(os.environ), name="true", output=output)
        )
    elif command == "queue":
        client.jobs()
    else:  # show, as views.cmd_show asks: the job, then what it spawned
        client.jobs((job_id,))
        client.call(p.GetSpawns(job_id=job_id), p.SpawnsView)
    return time.perf_counter() - started


def summary(seconds: list[float]) -> Json:
    ordered = sorted(seconds)
    return {
        "median": statistics.median(ordered) * 1000,
        "p90": ordered[math.ceil(0.9 * len(ordered)) - 1] * 1000,  # nearest rank
        "min": ordered[0] * 1000,
        "runs": len(ordered),
    }


def hold_every_pe(client: Client, cwd: str, timeout: float = 30.0) -> int | None:
    """A job that holds every PE of the cluster, so that the jobs submitted after it wait (nothing starts
    while the CLI is timed); None if it does not start within ``timeout`` (a busy cluster)."""
    pes = sum(n.pes for n in client.nodes() if n.state == "UP")
    blocker = client.submit(["sleep", "3600"], pes, cwd=cwd, name="bench-cli-hold", output="/dev/null")
    deadline = time.monotonic() + timeout
    while (state := client.job(blocker).state) != p.JobState.RUNNING:
        if state in p.TERMINAL_STATES or time.monotonic() > deadline:
            client.cancel((blocker,))
            return None
        time.sleep(0.05)
    return blocker


def drain(client: Client, job_ids: list[int], timeout: float = 120.0) -> None:
    """Cancel ``job_ids`` (those still queued or running) and wait until none of them is active."""
    for start in range(0, len(job_ids), 1000):
        client.cancel(tuple(job_ids[start : start + 1000]))
    deadline = time.monotonic() + timeout
    while job_ids and any(j.state in p.ACTIVE_STATES for j in client.jobs(tuple(job_ids))):
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs still active {timeout:g} s after they were cancelled")
        time.sleep(0.1)


def time_commands(
    scripts: dict[str, str],
    client: Client,
    repeats: int,
    *,
    env: dict[str, str],
    cwd: str,
    submitted: list[int],
) -> dict[str, Json]:
    """Every command of every script ``repeats`` times, interleaved, with the MM's share of each."""
    writing = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    first = run_timed(argv_of(scripts["storm"], "submit", 0), writing, cwd)[2]
    job_id = int(first.split()[0])
    submitted.append(job_id)
    runs: dict[str, dict[str, list[float]]] = {}
    for name, script in scripts.items():
        for command in COMMANDS:  # bytecode compiled and caches written, as an installation has them
            submitted.extend(ids(run_timed(argv_of(script, command, job_id), writing, cwd)[2], command))
            runs[f"{name} {command}"] = {"wall": [], "cpu": []}
    mm: dict[str, list[float]] = {command: [] for command in GOAL_COMMANDS}
    for _ in range(repeats):
        fresh: list[int] = []
        for command in COMMANDS:
            for name, script in scripts.items():
                wall, cpu, out = run_timed(argv_of(script, command, job_id), env, cwd)
                fresh.extend(ids(out, command))
                runs[f"{name} {command}"]["wall"].append(wall)
                runs[f"{name} {command}"]["cpu"].append(cpu)
            if command in mm:
                mm[command].append(mm_seconds(client, command, job_id, cwd, fresh))
        client.cancel(tuple(fresh))  # `storm queue` lists the same few jobs in every round
        submitted.extend(fresh)
    results: dict[str, Json] = {}
    for name, script in scripts.items():
        floor = {n for n, _ in top_imports(importtime_of_nothing(script, env, cwd))}
        commands: dict[str, Json] = {}
        for command in COMMANDS:
            walls = summary(runs[f"{name} {command}"]["wall"])
            figures: Json = {
                "argv": argv_of(script, command, job_id)[1:],
                "wall_ms": walls,
                "cpu_ms": statistics.median(runs[f"{name} {command}"]["cpu"]) * 1000,
            }
            if command in mm:
                figures["mm_ms"] = statistics.median(mm[command]) * 1000
                figures["own_ms"] = walls["median"] - figures["mm_ms"]
                figures["imports_ms"] = import_ms(argv_of(script, command, job_id), env, cwd, floor)
                figures["goal_met"] = walls["median"] < COMMAND_GOAL_MS
            commands[command] = figures
        results[name] = {"script": script, "python": interpreter(script), "commands": commands}
    return results


def ids(output: str, command: str) -> list[int]:
    """The job ids a ``storm submit`` (or a loop of them) printed."""
    return [int(word) for word in output.split()] if command == "submit" else []


def shell_loop(
    script: str, count: int, env: dict[str, str], cwd: str, mm_submit: float
) -> tuple[Json, list[int]]:
    """``count`` submissions by a bash loop, one ``storm submit`` process each; the ids it printed."""
    body = f'for i in $(seq {count}); do "$0" submit -n 1 -- true || exit 1; done'
    started = time.perf_counter()
    done = subprocess.run(["bash", "-c", body, script], env=env, cwd=cwd, check=True, capture_output=True)
    seconds = time.perf_counter() - started
    mm_share = count * mm_submit
    figures = {
        "count": count,
        "seconds": seconds,
        "per_second": count / seconds,
        "mm_seconds_estimated": mm_share,
        "cli_seconds_estimated": seconds - mm_share,
        # The goal is for 200 submissions: a shorter loop is judged at the same rate.
        "goal_met": seconds * 200 / count < LOOP_GOAL_S,
    }
    return figures, ids(done.stdout.decode(), "submit")


def measure_cli(
    cluster_dir: Path,
    repeats: int = 20,
    loop: int = 200,
    *,
    storm: str | None = None,
    baseline: str | None = None,
    hold: bool = True,
) -> Json:
    """Time ``storm`` commands against the local cluster running in ``cluster_dir`` (see the module's
    docstring) and return the figures (JSON). ``storm``: the script to time (default this installation's);
    ``baseline``: another one, timed alongside; ``hold``: keep the cluster's PEs taken by one job while the
    commands and the first loop are timed, so that no job starts meanwhile (the CLI and the MM's answers
    alone; needs an idle cluster), then the loop again with the jobs running as they are submitted."""
    endpoint = local_endpoint(cluster_dir)
    if endpoint is None:
        raise RuntimeError(f"no local cluster runs in {cluster_dir}")
    scripts = {"storm": storm or storm_script(), **({"baseline": baseline} if baseline else {})}
    env = {k: v for k, v in os.environ.items() if k != "STORM_MM"} | {"STORM_LOCAL_DIR": str(cluster_dir)}
    load_before = os.getloadavg()
    submitted: list[int] = []
    with tempfile.TemporaryDirectory(prefix="storm-bench-cli-") as cwd, Client(endpoint) as client:
        blocker = hold_every_pe(client, cwd) if hold else None
        try:
            results = time_commands(scripts, client, repeats, env=env, cwd=cwd, submitted=submitted)
            mm_submit = results["storm"]["commands"]["submit"]["mm_ms"] / 1000
            for name, script in scripts.items():
                results[name]["held"] = blocker is not None
                if loop and blocker is not None:
                    results[name]["loop_held"], queued = shell_loop(script, loop, env, cwd, mm_submit)
                    submitted.extend(queued)
        finally:  # a cluster of the caller's (--dir) is left without the blocker, whatever happened
            drain(client, [*submitted, *([blocker] if blocker else [])])
        if loop:
            for name, script in scripts.items():
                results[name]["loop"], _ = shell_loop(script, loop, env, cwd, mm_submit)
    return {
        "host": {
            "machine": platform.machine(),
            "cpus": len(os.sched_getaffinity(0)),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "repeats": repeats,
        "goals": {"command_ms": COMMAND_GOAL_MS, "loop_seconds": LOOP_GOAL_S, "loop_count": 200},
        **results,
    }


def code_version() -> str:
    here = Path(__file__).resolve().parent
    git = ["git", "-C", str(here), "describe", "--always", "--dirty"]
    out = subprocess.run(git, capture_output=True, check=False)
    return out.stdout.decode().strip() or "unknown"


def report(result: Json) -> str:
    host = result["host"]
    lines = [
        f"storm bench cli: code {result.get('code', '?')}, {result['repeats']} runs of each command,"
        f" load {host['load_before'][0]:.2f} before, {host['load_after'][0]:.2f} after ({host['cpus']} CPUs)",
        f"{'':9}{'command':<22}{'wall ms':>8}{'p90':>7}{'cpu ms':>8}{'mm ms':>7}{'own ms':>8}"
        f"{'imports':>9}  goal < {COMMAND_GOAL_MS:g} ms",
    ]
    names = [n for n in ("baseline", "storm") if n in result]
    for command in COMMANDS:
        for name in names:
            f = result[name]["commands"][command]
            label = "python -c pass" if command == "python" else " ".join(["storm", *f["argv"]])
            mm = f"{f['mm_ms']:7.1f}{f['own_ms']:8.1f}{f['imports_ms']:9.1f}" if "mm_ms" in f else " " * 24
            goal = ("met" if f["goal_met"] else "MISSED") if "goal_met" in f else ""
            lines.append(
                f"{name:<9}{label[:22]:<22}{f['wall_ms']['median']:8.1f}{f['wall_ms']['p90']:7.1f}"
                f"{f['cpu_ms']:8.1f}{mm}  {goal}"
            )
    if not all(result[name]["held"] for name in names):
        lines.append("(the cluster's PEs could not be held: jobs ran while the commands were timed)")
    for name in names:
        for key, what in (("loop_held", "jobs held in the queue"), ("loop", "jobs running as submitted")):
            loop = result[name].get(key)
            if loop:
                lines.append(
                    f"{name:<9}shell loop of {loop['count']} x `storm submit -n 1 -- true`, {what}:"
                    f" {loop['seconds']:.2f} s, {loop['per_second']:.1f}/s (goal 200 in < {LOOP_GOAL_S:g} s:"
                    f" {'met' if loop['goal_met'] else 'MISSED'}); the MM's answers about"
                    f" {loop['mm_seconds_estimated']:.2f} s of it"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench cli", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--loop", type=int, default=200, help="submissions in the shell loop (0: none)")
    parser.add_argument("--dir", type=Path, help="a running local cluster's directory (default: start one)")
    parser.add_argument("--baseline", metavar="STORM", help="another storm script to time alongside")
    parser.add_argument("--no-hold", dest="hold", action="store_false", help="let the jobs run meanwhile")
    parser.add_argument("--json", type=Path, default=Path("results/cli.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.loop < 0:
        parser.error("--repeats must be at least 1 and --loop at least 0")
    if args.dir is not None:
        result = measure_cli(
            args.dir.absolute(), args.repeats, args.loop, baseline=args.baseline, hold=args.hold
        )
    else:
        with tempfile.TemporaryDirectory(prefix="storm-bench-cli-") as tmp:
            cluster = LocalCluster(Path(tmp), nodes=2, pes_per_node=1)
            cluster.up()
            try:
                result = measure_cli(
                    Path(tmp), args.repeats, args.loop, baseline=args.baseline, hold=args.hold
                )
            finally:
                cluster.down()
    result = {"code": code_version(), **result}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(report(result))
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
