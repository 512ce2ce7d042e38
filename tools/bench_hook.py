"""Benchmark of mpihook: accuracy, cost, spin-block, and the cost of reading a record in the NM.

``storm bench hook`` (or ``python -m storm.tools.bench_hook [--quick] [--json results/hook.json]``) runs every
job with the environment's ``mpiexec`` (no storm daemons), 2 ranks, each rank with the hook preloaded and a
record of its own in a segment this process creates, as storm-nm would:

1. Accuracy (the issue's acceptance criterion): BSP jobs, Python (``bsp.py``) and C (``bsp.c``), ring
   pattern, granularity 1, 10 and 100 ms, balanced and 2:1 imbalanced (odd ranks slow), polling; plus the
   imbalanced 10 ms jobs spin-blocking. Each rank snapshots its own record after the warm-up and after the
   measured loop (bsp.py through a subclass, bsp.c through a header compiled in: PROBE_HEADER, in
   tools/hook_jobs.py), so the hook's figures cover exactly the loop. Per rank: *events* (must equal the
   iterations), the wait per communication, hook (comm_ns / events) against the app's own (comm_seconds /
   iterations), and the CPU time per communication, hook ((the app's CPU time - (comm_ns - block_ns)) /
   events: the CPU the rank spent less what it burnt waiting inside MPI) against the app's
   compute_cpu_per_iteration.
2. Overhead: the 1 ms balanced BSP job's loop wall time (the slowest rank's), ring and allreduce patterns,
   without the hook and with it (polling), interleaved, N runs each; medians. (With the hook every blocking
   collective runs as its nonblocking form: see mpihook/coll.c.) And the median round trip of ``pingpong``
   without the hook, with it polling and with it spin-blocking.
3. Spin-block: rank 1 of ``pingpong`` waits (in MPI_Recv, then in MPI_Allreduce) for rank 0, which is
   stopped with SIGSTOP for a second, once polling and once spin-blocking, the modes switched through the
   segment while the job runs; then, still waiting, switched back to polling. CPU use of rank 1
   (/proc/PID/task/*/schedstat: time on a CPU, and demanded: on a CPU or waiting for one).
4. Ping-pong with both ranks running, the wait mode switched every 100 ms: median round trip per mode.
5. The NM's side: the cost of HookSegment.read_all() and read() per record, for 2, 8 and 64 ranks.

It prints a table per section and writes every figure as JSON. Anything else running on the host skews the
wall times (CPU-time figures much less): the JSON keeps the load average from before the run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from storm import mpihook
from storm.mpihook.stats import WAIT_POLL, WAIT_SPINBLOCK, HookSegment, RankCounters
from storm.nm import procfs
from storm.tools.hook_jobs import (
    RUN_TIMEOUT,
    SPIN_NS,
    build_bsp,
    build_pingpong,
    check,
    command,
    hook_segment,
    kill_tree,
    python_bsp,
    run,
    set_mode,
)
from storm.tools.local_cluster import wait_for

CALIBRATION_EXCHANGES = 100
CALIBRATION_WORK = 0.001  # CPU seconds before each
Json = dict[str, Any]

# ------------------------------------------------------------------------------------------------ accuracy


def probe_bsp(argv: list[str]) -> int:
    """bsp.py with snapshots of this rank's record around its measured loop (like PROBE_HEADER)."""
    from storm.tools.apps import bsp

    segment = HookSegment.attach(os.environ["STORM_HOOK_SEGMENT"])
    index = int(os.environ["STORM_HOOK_INDEX"])
    snapshots: dict[str, Json] = {}

    def take(key: str) -> None:
        counters = segment.read(index)
        assert counters is not None  # the hook does not write while this thread is outside MPI
        snapshots[key] = counters._asdict() | thread_sched()

    class Probed(bsp.Rank):
        exchanges = 0

        def exchange(self, it: int, flag: bool) -> bool:
            if self.exchanges == bsp.WARMUP:  # the first exchange of the measured loop
                take("before")
            self.exchanges += 1
            return super().exchange(it, flag)

        def run(self) -> dict[str, Any]:
            line = super().run()
            take("after")
            self.calibrate()
            with open(f"{os.environ['STORM_PROBE_OUT']}.{self.rank}", "w", encoding="utf-8") as f:
                f.write(json.dumps(snapshots) + "\n")
            return line

        def calibrate(self) -> None:
            # What the app's timer counts around an exchange and the hook's cannot (mpi4py's argument
            # handling, the header's packing): the same calls to MPI_PROC_NULL, which return at once, each
            # after some computation as in the loop, so that they find caches as cold as it leaves them.
            null, byte = self.mpi.PROC_NULL, self.mpi.BYTE
            burner, work = bsp.Burner(), min(self.target, CALIBRATION_WORK)
            take("calibration_before")
            app = 0.0
            for it in range(CALIBRATION_EXCHANGES):
                burner.burn(work)
                t0 = time.perf_counter()
                bsp.HEADER.pack_into(self.send, 0, self.rank, it << 1)
                self.comm.Sendrecv([self.send, byte], null, 0, [self.from_left, byte], null, 0)
                self.comm.Sendrecv([self.send, byte], null, 1, [self.from_right, byte], null, 1)
                app += time.perf_counter() - t0
            take("calibration_after")
            snapshots["calibration"] = {"exchanges": CALIBRATION_EXCHANGES, "app_ns": round(app * 1e9)}

    bsp.Rank = Probed  # type: ignore[misc]  # bsp.main builds its ranks from the module's Rank
    try:
        return bsp.main(argv)
    finally:
        segment.close()


def thread_sched() -> dict[str, int]:
    """This thread's time on a CPU and waiting for one (ns), and how often it was preempted."""
    run_ns, runqueue_ns, _ = (int(x) for x in Path("/proc/thread-self/schedstat").read_text().split())
    status = Path("/proc/thread-self/status").read_text()
    preempted = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return {"run_ns": run_ns, "runqueue_ns": runqueue_ns, "preempted": preempted}


@dataclasses.dataclass
class Sample:
    """One rank of one accuracy run: the hook's figures for the measured loop and the app's own."""

    language: str
    granularity: float
    imbalance: float
    mode: str
    rank: int
    slow: bool
    iterations: int
    events: int
    app_wait: float  # comm_seconds / iterations
    hook_wait: float  # comm_ns / events
    app_cpu: float  # compute_cpu_per_iteration
    hook_cpu: float  # (cpu_seconds - (comm_ns - block_ns)) / events
    block_share: float  # block_ns / comm_ns
    runqueue: float  # seconds the rank waited for a CPU during the loop, per iteration
    preempted: int  # times the rank was preempted during the loop
    unseen: float = 0.0  # per exchange, what the app's timer counts around its MPI calls (0 for C: a few ns)

    @property
    def wait_error(self) -> float:
        return abs(self.hook_wait - self.app_wait) / self.app_wait if self.app_wait else 0.0

    @property
    def cpu_error(self) -> float:
        return abs(self.hook_cpu - self.app_cpu) / self.app_cpu


def iterations_for(granularity: float) -> int:
    """About 0.3-0.6 s of loop per run, and at least 8 iterations."""
    return max(8, round(0.3 / granularity))


def accuracy_run(
    program: Sequence[str],
    language: str,
    *,
    hook: Path,
    workdir: Path,
    granularity: float,
    imbalance: float = 1.0,
    mode: int = WAIT_POLL,
    iterations: int | None = None,
) -> list[Sample]:
    """One probed BSP job; a Sample per rank."""
    n = iterations or iterations_for(granularity)
    report, probes = workdir / f"report-{os.getpid()}.jsonl", workdir / f"probe-{os.getpid()}"
    args = [f"--granularity={granularity}", f"--imbalance={imbalance}", "--slow=odd", "--pattern=ring"]
    with hook_segment(2, mode) as segment:
        argv = command(
            [*program, *args, f"--iterations={n}", f"--report={report}"], 2, hook=hook, segment=segment.name,
            env={"STORM_PROBE_OUT": str(probes)},
        )  # fmt: skip
        check(run(argv, cwd=workdir))
    samples = []
    for line in report.read_text().splitlines():
        app = json.loads(line)
        probe = json.loads(Path(f"{probes}.{app['rank']}").read_text())
        before, after = probe["before"], probe["after"]
        events = after["events"] - before["events"]
        comm = (after["comm_ns"] - before["comm_ns"]) / 1e9
        block = (after["block_ns"] - before["block_ns"]) / 1e9
        samples.append(
            Sample(
                language=language, granularity=granularity, imbalance=imbalance,
                mode="spin-block" if mode == WAIT_SPINBLOCK else "poll", rank=app["rank"], slow=app["slow"],
                iterations=app["iterations"], events=events, app_wait=app["comm_seconds"] / app["iterations"],
                hook_wait=comm / max(events, 1), app_cpu=app["compute_cpu_per_iteration"],
                hook_cpu=(app["cpu_seconds"] - (comm - block)) / max(events, 1),
                block_share=block / comm if comm else 0.0,
                runqueue=(after["runqueue_ns"] - before["runqueue_ns"]) / 1e9 / app["iterations"],
                preempted=after["preempted"] - before["preempted"], unseen=unseen(probe),
            )
        )  # fmt: skip
        Path(f"{probes}.{app['rank']}").unlink()
    report.unlink()
    return samples


def unseen(probe: Mapping[str, Any]) -> float:
    """Seconds per exchange that the app's timer counts and the hook's cannot, from the probe's exchanges
    with MPI_PROC_NULL (the app's time for them less the hook's)."""
    if "calibration" not in probe:
        return 0.0
    hook_ns: int = probe["calibration_after"]["comm_ns"] - probe["calibration_before"]["comm_ns"]
    app_ns: int = probe["calibration"]["app_ns"]
    exchanges: int = probe["calibration"]["exchanges"]
    return max(0.0, (app_ns - hook_ns) / 1e9 / exchanges)


# ---------------------------------------------------------------------------------------------- overhead


def bsp_wall(
    program: Sequence[str],
    hook: Path | None,
    workdir: Path,
    *,
    pattern: str,
    granularity: float,
    iterations: int,
) -> float:
    """The loop wall time of a balanced BSP job (its slowest rank), with the hook polling or without it."""
    report = workdir / f"wall-{os.getpid()}.jsonl"
    args = [*program, f"--granularity={granularity}", "--imbalance=1", f"--iterations={iterations}"]
    args.append(f"--pattern={pattern}")
    with hook_segment(2) as segment:
        argv = command([*args, f"--report={report}"], 2, hook=hook, segment=segment.name if hook else None)
        check(run(argv, cwd=workdir))
    wall = max(json.loads(line)["wall_seconds"] for line in report.read_text().splitlines())
    report.unlink()
    return float(wall)


def parse_windows(stdout: str) -> list[tuple[int, int, int, int]]:
    """pingpong's windows: (start_ns, end_ns, round trips, median round trip ns)."""
    windows = []
    for line in stdout.splitlines():
        if line.startswith("window "):
            start, end, count, median, _ = (int(x) for x in line.split()[1:])
            windows.append((start, end, count, median))
    return windows


def pingpong_median(pingpong: Path, hook: Path | None, mode: int, seconds: float = 0.5) -> float:
    """Median round trip (ns) of a pingpong run in one wait mode (or without the hook)."""
    with hook_segment(2, mode) as segment:
        argv = command(
            [str(pingpong), "--seconds", str(seconds)], 2, hook=hook, segment=segment.name if hook else None
        )
        windows = parse_windows(check(run(argv)).stdout)[1:]  # the first one includes connection set-up
    return float(statistics.median(w[3] for w in windows))


# -------------------------------------------------------------------------------------------- spin-block


def cpu_times(pid: int) -> tuple[int, int]:
    """Nanoseconds a process's threads spent on a CPU and waiting for one (/proc/PID/task/*/schedstat)."""
    ran = waited = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError):
            fields = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran, waited


@dataclasses.dataclass
class Hold:
    """Rank 1's CPU use while rank 0 was stopped, and what its record says of the whole wait."""

    label: str
    seconds: float
    used: float  # share of one CPU it ran on
    demanded: float  # share of one CPU it ran on or waited for
    block_ns: int = 0  # of the call it waited in (published when the call returns)
    spin_ns: int = 0


@contextlib.contextmanager
def running_pingpong(
    pingpong: Path, hook: Path, args: Sequence[str], segment: HookSegment
) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """pingpong started under the hook; yields it and its ranks' pids. Ends it cleanly (SIGUSR1 to rank 0),
    or kills it if it will not end."""
    argv = command([str(pingpong), "--seconds", "120", *args], 2, hook=hook, segment=segment.name)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [0, 0]
    try:

        def started() -> bool:
            records = segment.read_all()
            if proc.poll() is not None:
                raise RuntimeError(f"pingpong ended early: {proc.communicate()}")
            return all(r is not None and r.active and r.calls > 100 for r in records)

        wait_for(started, 30.0, "pingpong's ranks to communicate", interval=0.005)
        records = segment.read_all()
        pids = [r.pid for r in records if r is not None]
        yield proc, pids[0], pids[1]
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            if pids[0]:
                os.kill(pids[0], signal.SIGUSR1)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()


def counters(segment: HookSegment, index: int) -> RankCounters:
    for _ in range(1000):
        record = segment.read(index)
        if record is not None:
            return record
    raise RuntimeError(f"record {index} stayed busy")


def switch(segment: HookSegment, mode: int, spin_ns: int = SPIN_NS) -> None:
    """Set every rank's mode, then wait until rank 1 is in the new one: a call reads the mode before it
    counts itself, so the first call counted after the change may have read the old mode, the second not."""
    set_mode(segment, mode, spin_ns)
    calls = counters(segment, 1).calls
    wait_for(
        lambda: counters(segment, 1).calls >= calls + 2, 10.0, "rank 1 to make new calls", interval=0.005
    )


def hold(segment: HookSegment, pid: int, label: str, seconds: float) -> Hold:
    """Measure rank 1 (``pid``) for ``seconds`` (rank 0 stopped meanwhile)."""
    first = counters(segment, 1)
    ran0, waited0 = cpu_times(pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    ran1, waited1 = cpu_times(pid)
    elapsed = time.monotonic() - t0
    last = counters(segment, 1)
    if not (first.in_call and last.in_call and first.calls == last.calls):
        raise RuntimeError(f"rank 1 was not waiting in one call all along: {first} {last}")
    used, demanded = (ran1 - ran0) / 1e9 / elapsed, (ran1 - ran0 + waited1 - waited0) / 1e9 / elapsed
    return Hold(label=label, seconds=elapsed, used=used, demanded=demanded)


def stopped_peer(
    pingpong: Path, hook: Path, op: str = "sendrecv", seconds: float = 1.0, threads: bool = False
) -> list[Hold]:
    """Rank 1 waiting for a stopped rank 0: polling, then switched to spin-block mid-wait; spin-blocking, then
    switched to polling mid-wait. ``threads``: MPI_THREAD_MULTIPLE (the hook leaves the calls blocking)."""
    holds = []
    args = ["--op", op, "--threads", "1" if threads else "0"]
    with (
        hook_segment(2) as segment,
        running_pingpong(pingpong, hook, args, segment) as (_, pid0, pid1),
    ):
        for mode, label in ((WAIT_POLL, "poll"), (WAIT_SPINBLOCK, "spin-block")):
            switch(segment, mode)
            os.kill(pid0, signal.SIGSTOP)
            wait_for(
                lambda: procfs.state(pid0) == "T" and counters(segment, 1).in_call,
                5.0,
                "rank 0 to stop",
                interval=0.005,
            )
            before = counters(segment, 1)
            time.sleep(0.05)  # rank 1 through its spin phase
            phase = [hold(segment, pid1, label, seconds)]
            # storm-nm switches it to the other mode in the middle of the wait
            other, then = (WAIT_POLL, "poll") if mode == WAIT_SPINBLOCK else (WAIT_SPINBLOCK, "spin-block")
            set_mode(segment, other)
            time.sleep(0.05)  # through a spin phase
            phase.append(hold(segment, pid1, f"{label}, then {then} (same call)", seconds / 2))
            os.kill(pid0, signal.SIGCONT)
            # The stalled call has returned once its time is in comm_ns (a later call may have begun sooner).
            stalled = int(0.9 * sum(h.seconds for h in phase) * 1e9)
            wait_for(
                lambda: counters(segment, 1).comm_ns - before.comm_ns >= stalled,  # noqa: B023
                10.0,
                "rank 1's wait to end",
                interval=0.005,
            )
            after = counters(segment, 1)
            for h in phase:
                h.block_ns, h.spin_ns = after.block_ns - before.block_ns, after.spin_ns - before.spin_ns
            holds += phase
    return holds


def pingpong_modes(pingpong: Path, hook: Path, seconds: float = 2.0, period: float = 0.1) -> Json:
    """Both ranks running, the mode of both switched every ``period``: median round trip per mode."""
    switches: list[tuple[int, int]] = []
    with hook_segment(2) as segment:
        argv = command(
            [str(pingpong), "--seconds", str(seconds), "--window", "5"], 2, hook=hook, segment=segment.name
        )
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        mode = WAIT_POLL
        try:
            while proc.poll() is None:
                set_mode(segment, mode)
                switches.append((time.monotonic_ns(), mode))
                time.sleep(period)
                mode = WAIT_SPINBLOCK if mode == WAIT_POLL else WAIT_POLL
            out, err = proc.communicate(timeout=RUN_TIMEOUT)
        except BaseException:
            kill_tree(proc.pid)
            proc.communicate()
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"pingpong failed: {out}\n{err}")
    guard = 2_000_000  # a call that began before a switch may still be in the old mode
    medians: dict[int, list[int]] = {WAIT_POLL: [], WAIT_SPINBLOCK: []}
    for start, end, _, median in parse_windows(out)[1:]:
        for (t, m), (t_next, _) in zip(switches, [*switches[1:], (2**63, 0)], strict=True):
            if t + guard <= start and end <= t_next:
                medians[m].append(median)
    poll, spin = (float(statistics.median(medians[m])) if medians[m] else float("nan") for m in medians)
    return {
        "poll_ns": poll,
        "spinblock_ns": spin,
        "ratio": spin / poll,
        "windows": {"poll": len(medians[0]), "spin-block": len(medians[1])},
    }


# -------------------------------------------------------------------------------------------- NM reading


def read_cost(nranks: int, repeat: int = 2000) -> Json:
    """Seconds per HookSegment.read_all() and per read(), for a segment of ``nranks`` records."""
    with hook_segment(nranks) as segment:
        t0 = time.perf_counter()
        for _ in range(repeat):
            segment.read_all()
        all_ = (time.perf_counter() - t0) / repeat
        t0 = time.perf_counter()
        for _ in range(repeat):
            segment.read(0)
        one = (time.perf_counter() - t0) / repeat
    return {
        "nranks": nranks,
        "read_all_us": all_ * 1e6,
        "read_all_per_record_us": all_ * 1e6 / nranks,
        "read_us": one * 1e6,
    }


# ---------------------------------------------------------------------------------------------------- main


def run_all(quick: bool, runs: int, hook: Path, workdir: Path) -> Json:
    result: Json = {"host": platform.node(), "loadavg_before": os.getloadavg(), "quick": quick}
    bsp_c, bsp_probe, pingpong = build_bsp(workdir), build_bsp(workdir, probe=True), build_pingpong(workdir)
    programs = {"python": python_bsp(probe=True), "c": [str(bsp_probe)]}

    samples: list[Sample] = []
    granularities = (0.001, 0.01) if quick else (0.001, 0.01, 0.1)
    for language, program in programs.items():
        for granularity in granularities:
            for imbalance in (1.0, 2.0):
                samples += accuracy_run(
                    program,
                    language,
                    hook=hook,
                    workdir=workdir,
                    granularity=granularity,
                    imbalance=imbalance,
                )
        samples += accuracy_run(
            program,
            language,
            hook=hook,
            workdir=workdir,
            granularity=0.01,
            imbalance=2.0,
            mode=WAIT_SPINBLOCK,
        )
    result["accuracy"] = [
        dataclasses.asdict(s) | {"wait_error": s.wait_error, "cpu_error": s.cpu_error} for s in samples
    ]

    walls: dict[str, dict[str, list[float]]] = {}
    for language, program in (("python", python_bsp()), ("c", [str(bsp_c)])):
        for pattern in ("ring", "allreduce"):
            job = walls[f"{language} {pattern}"] = {"none": [], "hook": []}
            for _ in range(runs):
                for variant in ("none", "hook"):
                    library = hook if variant == "hook" else None
                    job[variant].append(
                        bsp_wall(
                            program, library, workdir, pattern=pattern, granularity=0.001, iterations=500
                        )
                    )
    result["overhead"] = {}
    for job_name, w in walls.items():
        none, with_hook = statistics.median(w["none"]), statistics.median(w["hook"])
        result["overhead"][job_name] = {
            "runs": w, "median_none": none, "median_hook": with_hook, "slowdown": with_hook / none - 1
        }  # fmt: skip
    trips: dict[str, list[float]] = {"none": [], "poll": [], "spin-block": []}
    for _ in range(runs):
        trips["none"].append(pingpong_median(pingpong, None, WAIT_POLL))
        trips["poll"].append(pingpong_median(pingpong, hook, WAIT_POLL))
        trips["spin-block"].append(pingpong_median(pingpong, hook, WAIT_SPINBLOCK))
    result["pingpong_round_trip_ns"] = {k: statistics.median(v) for k, v in trips.items()}
    result["stopped_peer"] = {
        op: [dataclasses.asdict(h) for h in stopped_peer(pingpong, hook, op)]
        for op in ("sendrecv", "allreduce")
    }
    result["pingpong_switching"] = pingpong_modes(pingpong, hook)
    result["read_cost"] = [read_cost(n) for n in (2, 8, 64)]
    return result


def print_tables(result: Json) -> None:
    print("1. Accuracy: hook vs app, per rank (wait and CPU time per communication, ms)")
    print(
        f"{'lang':6} {'gran':>6} {'imb':>3} {'mode':10} {'rank':>4} {'iters':>5} {'events':>6} "
        f"{'app wait':>9} {'hook wait':>9} {'err':>6} {'app cpu':>8} {'hook cpu':>8} {'err':>6}"
    )
    for s in result["accuracy"]:
        ms = {k: s[k] * 1e3 for k in ("granularity", "app_wait", "hook_wait", "app_cpu", "hook_cpu")}
        print(
            f"{s['language']:6} {ms['granularity']:5g}ms {s['imbalance']:3g} {s['mode']:10} {s['rank']:4} "
            f"{s['iterations']:5} {s['events']:6} {ms['app_wait']:9.4f} {ms['hook_wait']:9.4f} "
            f"{s['wait_error']:6.1%} {ms['app_cpu']:8.4f} {ms['hook_cpu']:8.4f} {s['cpu_error']:6.1%}"
        )
    print("\n2. Overhead: 1 ms balanced BSP loop wall time (s), medians")
    for job_name, o in result["overhead"].items():
        print(
            f"  {job_name:16} without {o['median_none']:.4f}  with hook {o['median_hook']:.4f}  "
            f"slowdown {o['slowdown']:+.2%}"
        )
    trips = result["pingpong_round_trip_ns"]
    print(
        f"  pingpong median round trip: no hook {trips['none'] / 1e3:.2f} us, hook polling "
        f"{trips['poll'] / 1e3:.2f} us, hook spin-blocking {trips['spin-block'] / 1e3:.2f} us"
    )
    print("\n3. Rank 1 waiting for a stopped rank 0: share of one CPU (used / demanded)")
    for op, holds in result["stopped_peer"].items():
        for h in holds:
            print(
                f"  {op:9} {h['label']:34} used {h['used']:6.1%}  demanded {h['demanded']:6.1%}  "
                f"block {h['block_ns'] / 1e9:.3f} s"
            )
    sw = result["pingpong_switching"]
    print(
        f"\n4. Ping-pong, modes switched every 100 ms: poll {sw['poll_ns'] / 1e3:.2f} us, spin-block "
        f"{sw['spinblock_ns'] / 1e3:.2f} us, ratio {sw['ratio']:.2f}"
    )
    print("\n5. NM side: HookSegment reads")
    for r in result["read_cost"]:
        print(
            f"  {r['nranks']:3} ranks: read_all {r['read_all_us']:.2f} us "
            f"({r['read_all_per_record_us']:.2f} us/record), read(i) {r['read_us']:.2f} us"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench hook", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="granularities 1 and 10 ms only, 2 runs")
    parser.add_argument("--runs", type=int, help="interleaved runs per overhead variant (default 5)")
    parser.add_argument(
        "--json", type=Path, default=Path("results/hook.json"), help="where to write the figures"
    )
    args = parser.parse_args(argv)
    runs = args.runs or (2 if args.quick else 5)
    hook = mpihook.hook_library()
    with tempfile.TemporaryDirectory(prefix="storm-bench-hook-") as tmp:
        result = run_all(args.quick, runs, hook, Path(tmp))
    print_tables(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nraw figures: {args.json}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe-bsp"]:  # a rank of a probed BSP job (accuracy_run)
        sys.exit(probe_bsp(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
