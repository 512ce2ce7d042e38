"""End to end: mpihook in ranks started by storm, its statistics live in the MM, its segments cleaned up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.tools.client import Client
from tests.conftest import JOB_TIMEOUT, poll, python_app, run_job

pytestmark = pytest.mark.slow


def hook_segments(job_id: int) -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"storm-hook-{job_id}-")}


def stats(client: Client, job_id: int) -> p.StatsView:
    return client.call(p.GetStats(job_id=job_id), p.StatsView)


def test_a_running_job_reports_its_communication_and_its_segments_go_with_it(
    client: Client, tmp_path: Path
) -> None:
    bsp = python_app("bsp", "--granularity", "2ms", "--imbalance", "2", "--slow", "odd", "--seconds", "30")
    job = client.submit(bsp, 2, cwd=str(tmp_path))
    poll(lambda: len(hook_segments(job)) == 2, 30, "one segment per node")

    def measured() -> bool:
        ranks = stats(client, job).ranks
        return len(ranks) == 2 and all(r.state == "active" and r.c_comm > 100 for r in ranks)

    poll(measured, 30, "both ranks' statistics at the MM")
    by_rank = {r.rank: r for r in stats(client, job).ranks}
    assert {r.node for r in by_rank.values()} == {"node0", "node1"}
    fast, slow = by_rank[0], by_rank[1]  # rank 1 computes twice as much; rank 0 waits for it
    # Ratios, not absolute times: a busy host stretches waits, but not who waits for whom.
    assert fast.t_comm / fast.c_comm > 3 * slow.t_comm / slow.c_comm
    assert fast.t_comm / fast.c_comm > 0.001  # about the 2 ms the slow rank computes more
    assert slow.t_cpu / slow.c_comm > 1.5 * fast.t_cpu / fast.c_comm
    assert fast.granularity == pytest.approx(slow.granularity, rel=0.3)  # both run at the slow one's pace
    client.cancel((job,))
    assert client.wait(job, timeout=JOB_TIMEOUT).state == "CANCELLED"
    assert hook_segments(job) == set()
    assert stats(client, job).ranks == ()


def test_a_crashed_job_leaves_no_segment(client: Client, tmp_path: Path) -> None:
    ended = run_job(client, python_app("fail", "--rank", "1", "--code", "4"), 2, tmp_path)
    assert ended.state == "FAILED"
    assert hook_segments(ended.id) == set()


def test_a_program_without_mpi_runs_and_is_marked_so(client: Client, tmp_path: Path) -> None:
    job = client.submit(["sh", "-c", "sleep 30"], 2, cwd=str(tmp_path))
    poll(lambda: len(stats(client, job).ranks) == 2, 30, "the ranks' first report")
    assert {r.state for r in stats(client, job).ranks} == {"no-mpi"}
    client.cancel((job,))
    client.wait(job, timeout=JOB_TIMEOUT)
    assert hook_segments(job) == set()
