"""End to end: node managers that stop reporting, die, or come back."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from storm.tools.local_cluster import LocalCluster
from tests.conftest import JOB_TIMEOUT, poll, python_app

pytestmark = pytest.mark.slow

FAST = {"mm_node_timeout": 1.5}


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


def test_killed_node_manager_restarts_and_clears_what_it_left(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(**FAST)
    with cluster.client() as client:
        job = client.submit(python_app("spin", "--mpi"), 2, cwd=str(tmp_path))
        poll(lambda: client.job(job).state == "RUNNING", 30, "the job to run")
        cluster.restart_nm(1)  # SIGKILL: its job shell and rank are orphaned
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        assert ended.state == "NODE_FAIL"
        assert "node1" in ended.reason
        cluster.wait_nodes_up(["node1"])
        assert (
            client.wait(client.submit(["true"], 2, cwd=str(tmp_path)), timeout=JOB_TIMEOUT).state
            == "COMPLETED"
        )
    # no_leaks then proves the new node manager killed the orphaned shell and rank.


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
