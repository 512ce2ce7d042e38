"""End to end on a torus: real daemons on a 2 x 2 torus of four node managers place each job in a box, and an
MPI job whose free nodes are not a box waits, saying so, until they are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, storm_cli

pytestmark = pytest.mark.slow

SLEEP = ["sleep", "60"]


def test_jobs_get_boxes_and_a_job_whose_free_nodes_are_no_box_waits(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=4, pes_per_node=1, topology=(2, 2, 1))
    with cluster.client() as client:
        # One-rank jobs on node0 (0,0), node1 (1,0), node2 (0,1): the rule keeps the largest box free.
        first, second, third = (client.submit(SLEEP, 1, cwd=str(tmp_path)) for _ in range(3))
        poll(lambda: all(client.job(j).state == "RUNNING" for j in (first, second, third)), 30, "jobs to run")
        assert [client.job(j).nodes for j in (first, second, third)] == [("node0",), ("node1",), ("node2",)]
        client.cancel((first,))
        poll(lambda: client.job(first).state == "CANCELLED", JOB_TIMEOUT, "the first job to end")
        # node0 and node3 are free, diagonally: two nodes, no box of two. A flat cluster would start it.
        mpi = client.submit(python_app("hello"), 2, cwd=str(tmp_path), output=str(tmp_path / "hello.out"))
        poll(lambda: "not as a box" in client.job(mpi).reason, 10, "the reason to say why the job waits")
        assert client.job(mpi).reason == (
            "Resources: 2 nodes are free but not as a box of 2 on the torus (the largest free box holds 1)"
        )
        client.cancel((second,))  # node1 frees: node1 and node3 are a 1 x 2 box
        ended = client.wait(mpi, timeout=JOB_TIMEOUT)
        assert ended.state == "COMPLETED" and ended.nodes == ("node1", "node3")
        assert ended.box is not None and str(ended.box) == "1x2x1 at (1,0,0)"
        assert "hello: OK" in (tmp_path / "hello.out").read_text()
        shown = storm_cli(cluster, "show", str(mpi))
        assert "Box: 1x2x1 at (1,0,0)" in shown.stdout, shown.stderr
        drawn = storm_cli(cluster, "matrix")
        assert drawn.stdout.splitlines()[2:] == [
            "     x=0      x=1",
            "y=0  node0 .  node1 .",
            f"y=1  node2 {third}  node3 .",
        ]
        client.cancel((third,))
        poll(lambda: client.job(third).state == "CANCELLED", JOB_TIMEOUT, "the last job to end")
