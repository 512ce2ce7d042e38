"""End to end: node managers that stop reporting (stopped, killed), die, or come back; requeued jobs."""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, storm_cli

pytestmark = pytest.mark.slow

FAST = {"mm_node_timeout": 1.5}

# Each rank appends "pid node" to run-RANK in its working directory, wires up MPI through storm, and then,
# on the job's first run, idles until it is killed; on a later run (a requeued job) it finishes at once.
RECORDING = [
    sys.executable, "-c",
    "import os, pathlib, time\n"
    "from mpi4py import MPI\n"
    "path = pathlib.Path(f'run-{MPI.COMM_WORLD.Get_rank()}')\n"
    "first = not path.exists()\n"
    "with path.open('a') as f: f.write(f\"{os.getpid()} {os.environ['STORM_NODE']}\\n\")\n"
    "MPI.COMM_WORLD.Barrier()\n"
    "while first: time.sleep(0.05)\n",
]  # fmt: skip


def runs(directory: Path, ranks: int) -> dict[int, tuple[int, str]]:
    """Wait until every rank of the first run has started; its (pid, node) by rank."""
    paths = [directory / f"run-{rank}" for rank in range(ranks)]
    poll(lambda: all(p.exists() and p.read_text().endswith("\n") for p in paths), 30, "the ranks to start")
    found = {}
    for rank, path in enumerate(paths):
        pid, node = path.read_text().splitlines()[0].split()
        found[rank] = (int(pid), node)
    return found


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def node_states(client: Client) -> dict[str, str]:
    return {n.name: n.state for n in client.nodes()}


def test_silent_node_goes_down_its_job_fails_and_it_rejoins_cleanly(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(**FAST)
    with cluster.client() as client:
        job = client.submit(python_app("spin", "--mpi"), 2, cwd=str(tmp_path))
        poll(lambda: client.job(job).state == "RUNNING", 30, "the job to run")
        frozen = cluster.nms[0]
        frozen.signal(signal.SIGSTOP)  # the NM stops reporting; its ranks keep running
        try:
            poll(lambda: {n.name: n.state for n in client.nodes()}["node0"] == "DOWN", 10, "node0 DOWN")
            ended = client.wait(job, timeout=JOB_TIMEOUT)
        finally:
            frozen.signal(signal.SIGCONT)
        assert ended.state == "NODE_FAIL"
        assert ended.reason.startswith("node node0 DOWN")
        # Back again, node0 learns its job is over, stops the ranks it kept, and takes new work.
        cluster.wait_nodes_up(["node0"])
        again = client.submit(python_app("hello"), 2, cwd=str(tmp_path))
        assert client.wait(again, timeout=JOB_TIMEOUT).state == "COMPLETED"


def test_killed_node_manager_goes_down_its_job_fails_and_it_rejoins_cleanly(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """SIGKILL, no restart until the node is DOWN: the job ends NODE_FAIL, its rank elsewhere is stopped."""
    cluster = make_cluster(**FAST)
    with cluster.client() as client:
        job = client.submit(RECORDING, 2, cwd=str(tmp_path))
        old = runs(tmp_path, 2)
        cluster.nms[0].signal(signal.SIGKILL)  # its job shell and rank 0 live on, unseen
        poll(lambda: node_states(client)["node0"] == "DOWN", 10, "node0 DOWN")
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        assert (ended.state, ended.requeue, ended.requeues) == ("NODE_FAIL", False, 0)
        assert ended.reason.startswith("node node0 DOWN: no report for"), ended.reason
        assert not running(old[1][0]), "rank 1 on node1 outlived its job"
        # A new node manager on node0 stops what the old one left (the MM has ended it) and takes work.
        cluster.nms[0] = cluster.start_nm(0)
        cluster.save()
        cluster.wait_nodes_up(["node0"])
        poll(lambda: not running(old[0][0]), 10, "node0's leftover rank to be stopped")
        again = client.submit(python_app("hello"), 2, cwd=str(tmp_path))
        assert client.wait(again, timeout=JOB_TIMEOUT).state == "COMPLETED"


@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
def test_a_requeue_job_runs_again_elsewhere_and_the_lost_node_stops_the_old_run(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, fault: str
) -> None:
    """`storm submit --requeue`: node0's NM stopped (or killed) under the job; the job goes back to the queue,
    runs again on node1 and node2 under the same id, and node0, back, stops its old rank and rejoins."""
    cluster = make_cluster(nodes=3, **FAST)
    submitted = storm_cli(cluster, "submit", "-n", "2", "--requeue", "--", *RECORDING, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout)
    with cluster.client() as client:
        old = runs(tmp_path, 2)
        first = client.job(job)
        assert [node for _pid, node in old.values()] == ["node0", "node1"]
        cluster.nms[0].signal(getattr(signal, fault))
        try:
            poll(lambda: node_states(client)["node0"] == "DOWN", 10, "node0 DOWN")
            ended = client.wait(job, timeout=JOB_TIMEOUT)  # the second run: it ends by itself
            assert (ended.state, ended.requeues, ended.id) == ("COMPLETED", 1, job)
            assert ended.submit_time == first.submit_time
            assert (ended.start_time or 0) > (first.start_time or 0)
            assert set(ended.nodes) == {"node1", "node2"}
            assert not running(old[1][0]), "the first run's rank 1 outlived it"
            shown = storm_cli(cluster, "show", str(job))
            assert "Requeue: yes (requeued 1 times)" in shown.stdout, shown.stdout
        finally:
            if fault == "SIGSTOP":
                cluster.nms[0].signal(signal.SIGCONT)
            else:
                cluster.nms[0] = cluster.start_nm(0)
                cluster.save()
        # Back, node0 is told its job has ended; it stops the first run's rank 0, then takes work again.
        cluster.wait_nodes_up(["node0"])
        poll(lambda: not running(old[0][0]), 10, "node0's rank of the first run to be stopped")
        lines = {rank: (tmp_path / f"run-{rank}").read_text().splitlines() for rank in (0, 1)}
        assert [len(v) for v in lines.values()] == [2, 2]  # each rank ran twice: once per run
        again = client.submit(python_app("hello"), 3, cwd=str(tmp_path))
        assert client.wait(again, timeout=JOB_TIMEOUT).state == "COMPLETED"


def test_nodes_listing_and_json(make_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cluster = make_cluster(nodes=3, pes_per_node=1)
    with cluster.client() as client:
        nodes = client.nodes()
    assert [(n.name, n.state, n.pes, n.pes_used) for n in nodes] == [
        ("node0", "UP", 1, 0), ("node1", "UP", 1, 0), ("node2", "UP", 1, 0),
    ]  # fmt: skip


def test_stopping_node_managers_ends_their_jobs_node_fail(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster()
    with cluster.client() as client:
        job = client.submit(python_app("spin", "--mpi"), 2, cwd=str(tmp_path))
        poll(lambda: client.job(job).state == "RUNNING", 30, "the job to run")
        LocalCluster.stop(cluster.nms)  # SIGTERM: each NM stops its ranks and reports why
        ended = client.wait(job, timeout=JOB_TIMEOUT)
    assert ended.state == "NODE_FAIL"
    assert re.fullmatch(r"storm-nm on node[01] shut down", ended.reason), ended.reason
