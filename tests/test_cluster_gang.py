"""End to end under gang scheduling: real heartbeats, real SIGSTOP/SIGCONT, sampled from /proc."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from storm.nm import procfs
from storm.nm.switcher import TraceLine
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app

pytestmark = pytest.mark.slow

SLACK = 0.005  # a sample taken this close after a switch is part of the switch


def gang(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    """2 nodes x 1 PE, MPL 2, 100 ms slices; every NM traces its switches."""
    return make_cluster(policy="gang", trace=True, mm_mpl=2, mm_node_timeout=1.5)


def submit(client: Client, argv: list[str], cwd: Path) -> int:
    """Submit with a marker in the environment, so that the job's ranks can be told from any other's."""
    return client.submit(argv, 2, cwd=str(cwd), env={**os.environ, "STORM_TEST_DIR": str(cwd)})


def rank_pids(job_id: int, cwd: Path) -> dict[int, str]:
    """pid -> node of the job's ranks, found by the environment storm gave them."""
    found = {}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("STORM_JOB_ID") == str(job_id) and env.get("STORM_TEST_DIR") == str(cwd):
            found[proc.pid] = env["STORM_NODE"]
    return found


def stopped(pid: int) -> bool | None:
    """True if the process is stopped (state T), None if it is gone."""
    state = procfs.state(pid)
    return None if state in (None, "Z") else state == "T"


def switch_windows(trace: Path) -> list[tuple[float, float]]:
    """(began, done) of every switch an NM traced that changed something."""
    windows = []
    for line in map(TraceLine.parse, trace.read_text().splitlines(keepends=True)):
        if line is not None and line.ranks:
            windows.append((line.switched, line.done + SLACK))
    return windows


def test_two_jobs_take_turns_and_never_run_together_on_a_pe(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = gang(make_cluster)
    bsp = python_app("bsp", "--granularity", "0.002", "--pattern", "allreduce", "--iterations", "400")
    with cluster.client() as client:
        jobs = [submit(client, bsp, tmp_path) for _ in range(2)]
        poll(lambda: all(len(rank_pids(j, tmp_path)) == 2 for j in jobs), 30, "both jobs' ranks to exist")
        ranks = {j: rank_pids(j, tmp_path) for j in jobs}
        rows = {j: client.job(j).row for j in jobs}
        assert sorted(rows.values()) == [0, 1]  # one row each
        # (start, end, node, jobs not stopped there): a round of reads takes time, so it has both ends.
        samples: list[tuple[float, float, str, set[int]]] = []
        while any(stopped(pid) is not None for r in ranks.values() for pid in r):
            for node in ("node0", "node1"):
                begin = time.time()
                running = {
                    j for j, r in ranks.items() for pid, n in r.items() if n == node and stopped(pid) is False
                }
                samples.append((begin, time.time(), node, running))
            time.sleep(0.002)  # a sampling period, not a wait for a condition
        ended = [client.wait(j, timeout=JOB_TIMEOUT) for j in jobs]
    assert all(j.state == "COMPLETED" for j in ended), [j.reason for j in ended]
    for j in jobs:
        assert "bsp: OK" in (tmp_path / f"storm-{j}.out").read_text()
    assert all(j.suspended_time > 0.2 for j in ended)  # each waited while the other's row ran
    windows = {node: switch_windows(cluster.trace_path(node)) for node in ("node0", "node1")}
    assert all(len(w) > 10 for w in windows.values())  # they really took turns, many times
    overlaps = [(begin, end, node) for begin, end, node, running in samples if len(running) > 1]
    outside = [
        (begin, node)
        for begin, end, node in overlaps
        if not any(begin <= done and received <= end for received, done in windows[node])
    ]
    assert len(samples) > 200
    assert outside == [], f"{len(outside)} samples with both jobs running on one PE outside a switch"


def test_a_killed_node_manager_leaves_no_rank_stopped_elsewhere(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = gang(make_cluster)
    with cluster.client() as client:
        jobs = [submit(client, python_app("spin", "--mpi"), tmp_path) for _ in range(2)]
        poll(lambda: all(len(rank_pids(j, tmp_path)) == 2 for j in jobs), 30, "both jobs' ranks to exist")
        survivors = {pid for j in jobs for pid, node in rank_pids(j, tmp_path).items() if node == "node1"}
        cluster.nms[0].signal(signal.SIGKILL)
        ended = [client.wait(j, timeout=JOB_TIMEOUT) for j in jobs]
        assert all(j.state == "NODE_FAIL" and "node0" in j.reason for j in ended)
        # node1 continued and terminated its ranks of both jobs, stopped or not.
        poll(lambda: all(stopped(pid) is None for pid in survivors), 15, "node1's ranks to be gone")
        cluster.nms[0] = cluster.start_nm(0)  # the new NM clears what the killed one left on node0
        cluster.save()
        cluster.wait_nodes_up(["node0"])


def test_without_heartbeats_every_rank_runs_and_gang_resumes_after_the_mm_returns(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = gang(make_cluster)
    with cluster.client() as client:
        jobs = [submit(client, python_app("spin", "--mpi", "--seconds", "6"), tmp_path) for _ in range(2)]
        poll(lambda: all(len(rank_pids(j, tmp_path)) == 2 for j in jobs), 30, "both jobs' ranks to exist")
        pids = [pid for j in jobs for pid in rank_pids(j, tmp_path)]
        poll(lambda: any(stopped(pid) for pid in pids), 10, "gang scheduling to stop one job")
    cluster.mm.signal(signal.SIGKILL)  # type: ignore[union-attr]
    # Heartbeats stop: within the NMs' timeout (1 s) every rank of both jobs runs again.
    poll(lambda: not any(stopped(pid) for pid in pids), 5, "every rank to run without heartbeats")
    cluster.restart_mm()
    cluster.wait_nodes_up(cluster.node_names())
    with cluster.client() as client:
        poll(lambda: any(stopped(pid) for pid in pids), 10, "gang scheduling to resume")
        ended = [client.wait(j, timeout=JOB_TIMEOUT) for j in jobs]
    assert [j.state for j in ended] == ["COMPLETED", "COMPLETED"]
