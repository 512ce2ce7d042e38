"""End to end (issue 17's "Live:" line): a moldable job's size on a real local cluster, as its MPI program
sees it, and a high-priority job suspending a low-priority one, both finishing correctly, the suspension not
charged to the low one's time limit. Real daemons, real mpi4py ranks, the real `storm` command where a user
would type it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, storm_cli

pytestmark = pytest.mark.slow


def wait_file_job(go: Path) -> list[str]:
    """A job that runs until the test creates ``go``."""
    return ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done']


def test_a_moldable_job_gets_every_free_pe_when_the_queue_is_empty_and_fewer_behind_a_long_one(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=2, pes_per_node=2)  # 4 PEs
    # Alone, as a user submits it: all four PEs, which MPI_Comm_size, PMI_SIZE and STORM_SIZE report.
    hello = ["submit", "-n", "1-4", "--wait", "--", sys.executable, "-m", "storm.tools.apps.hello"]
    done = storm_cli(cluster, *hello, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    alone = int(done.stdout.split()[0])
    said = (tmp_path / f"storm-{alone}.out").read_text()
    assert "hello: OK" in said and {f"rank {r}/4 " in said for r in range(4)} == {True}
    shown = json.loads(storm_cli(cluster, "show", str(alone), "--json").stdout)
    assert (shown["ranks"], shown["min_ranks"], shown["max_ranks"], shown["state"]) == (4, 1, 4, "COMPLETED")
    with cluster.client() as client:
        env = client.submit(["sh", "-c", 'echo "$STORM_SIZE $PMI_SIZE"'], 2, cwd=str(tmp_path), max_ranks=3)
        assert client.wait(env, timeout=JOB_TIMEOUT).state == "COMPLETED"
        assert (tmp_path / f"storm-{env}.out").read_text().split("\n")[:3] == ["3 3"] * 3

        # Behind a long queue: a job holds every PE while the moldable one and three others queue.
        go = tmp_path / "go"
        blocker = client.submit(wait_file_job(go), 4, cwd=str(tmp_path))
        poll(lambda: client.job(blocker).state == "RUNNING", 30, "the blocker to run")
        crowded = client.submit(python_app("hello"), 1, cwd=str(tmp_path), max_ranks=4)
        others = [client.submit(["true"], 1, cwd=str(tmp_path)) for _ in range(3)]
        queue = storm_cli(cluster, "queue").stdout
        assert any(line.split()[:1] == [str(crowded)] and " 1-4 " in line for line in queue.splitlines())
        go.touch()  # one pass sees the whole queue: the minima fill the four PEs, nothing is left to share
        job = client.wait(crowded, timeout=JOB_TIMEOUT)
        assert (job.state, job.ranks, job.min_ranks, job.max_ranks) == ("COMPLETED", 1, 1, 4)
        said = (tmp_path / f"storm-{crowded}.out").read_text()
        assert "rank 0/1 " in said and "hello: OK" in said
        assert all(client.wait(j, timeout=JOB_TIMEOUT).state == "COMPLETED" for j in [blocker, *others])


def test_a_high_priority_job_suspends_a_low_one_and_the_suspension_is_not_charged_to_its_limit(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(
        nodes=1, pes_per_node=2, mm_preemption="suspend", mm_preempt_min_run=0.3,
        mm_qos={"normal": 0, "high": 10},
    )  # fmt: skip
    low_report = tmp_path / "low.json"
    # One second of CPU work per rank, checked message by message (bsp counts CPU time, not wall time), under
    # a limit of 5 s; the high job runs 5 s of wall time meanwhile.
    low_app = python_app("bsp", "--granularity", "10ms", "--iterations", "100", "--report", str(low_report))
    high_app = python_app("bsp", "--granularity", "10ms", "--seconds", "5")
    with cluster.client() as client:
        low = client.submit(low_app, 2, cwd=str(tmp_path), time_limit=5.0)
        poll(lambda: client.job(low).state == "RUNNING", 30, "the low-priority job to run")
        high = client.submit(high_app, 2, cwd=str(tmp_path), qos="high")
        poll(lambda: client.job(low).suspended_by == high, 30, "the low-priority job to be suspended")
        queue = storm_cli(cluster, "queue").stdout.splitlines()
        assert any(line.split()[:1] == [str(low)] and "SUSPENDED" in line for line in queue), queue
        ranks = [
            proc
            for proc in psutil.process_iter(["cmdline"])
            if str(low_report) in " ".join(proc.info["cmdline"] or ())
            and "--iterations" in proc.info["cmdline"]
        ]
        assert len(ranks) == 2
        poll(lambda: {r.status() for r in ranks} == {psutil.STATUS_STOPPED}, 5, "its ranks to be stopped")
        shown = client.job(low)
        assert shown.state == "RUNNING" and shown.reason == f"Suspended by job {high} (QOS high, priority 10)"
        first = client.wait(high, timeout=JOB_TIMEOUT)
        job = client.wait(low, timeout=JOB_TIMEOUT)
    assert first.state == "COMPLETED" and "bsp: OK" in (tmp_path / f"storm-{high}.out").read_text()
    assert job.state == "COMPLETED", job.reason
    assert "bsp: OK" in (tmp_path / f"storm-{low}.out").read_text()
    assert all(json.loads(line)["errors"] == 0 for line in low_report.read_text().splitlines())
    assert job.start_time is not None and job.end_time is not None and first.end_time is not None
    # It lived longer than its limit, and was suspended at least as long as the high job ran.
    assert job.end_time - job.start_time > 5.0 and job.suspended_time >= 4.0
    assert job.end_time >= first.end_time and job.suspended_by is None
