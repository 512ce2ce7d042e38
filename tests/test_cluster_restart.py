"""End to end: SIGKILL of storm-mm in the middle of jobs, then a restart: nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from storm.tools.local_cluster import LocalCluster
from tests.conftest import JOB_TIMEOUT, poll, python_app

pytestmark = pytest.mark.slow


def gated(go: Path, message: str) -> list[str]:
    return ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done; echo "{message} $STORM_RANK"']


def test_mm_sigkill_restart_keeps_every_job(make_cluster: object, tmp_path: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=2)  # type: ignore[operator]
    go_during, go_after = tmp_path / "go-during", tmp_path / "go-after"
    with cluster.client() as client:
        done = client.submit(["true"], 1, cwd=str(tmp_path))
        assert client.wait(done, timeout=JOB_TIMEOUT).state == "COMPLETED"
        ends_while_down = client.submit(gated(go_during, "during"), 2, cwd=str(tmp_path))
        runs_through = client.submit(gated(go_after, "after"), 2, cwd=str(tmp_path))
        poll(lambda: client.job(runs_through).state == "RUNNING", 30, "both jobs to run")
        queued = client.submit(python_app("hello"), 4, cwd=str(tmp_path))
        assert client.job(queued).state == "PENDING"

    cluster.mm.signal(9)  # type: ignore[union-attr]
    poll(lambda: not cluster.mm.alive(), 10, "storm-mm to die")  # type: ignore[union-attr]
    # One job's ranks end while there is no MM to hear of it.
    go_during.touch()
    out = tmp_path / f"storm-{ends_while_down}.out"
    poll(lambda: out.exists() and out.read_text().count("during") == 2, 30, "the ranks to finish")

    cluster.restart_mm()
    cluster.wait_nodes_up(cluster.node_names())
    with cluster.client() as client:
        assert client.wait(ends_while_down, timeout=JOB_TIMEOUT).state == "COMPLETED"
        assert client.job(runs_through).state == "RUNNING"
        assert client.job(queued).state == "PENDING"
        go_after.touch()
        assert client.wait(runs_through, timeout=JOB_TIMEOUT).state == "COMPLETED"
        hello = client.wait(queued, timeout=JOB_TIMEOUT)
        assert (hello.state, hello.exit_code) == ("COMPLETED", 0)
        assert "hello: OK" in (tmp_path / f"storm-{queued}.out").read_text()
        every = {j.id: j.state for j in client.jobs(everything=True)}
    assert every == dict.fromkeys((done, ends_while_down, runs_through, queued), "COMPLETED")
