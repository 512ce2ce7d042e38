"""End to end: FCFS order and EASY backfilling with real jobs on 2 nodes x 1 PE."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from storm.tools.client import Client
from tests.helpers import JOB_TIMEOUT, poll

pytestmark = pytest.mark.slow


def wait_file_job(go: Path) -> list[str]:
    """A job that runs until the test creates ``go``: the test, not a sleep, decides when it ends."""
    return ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done']


def test_jobs_wider_than_free_pes_run_in_submission_order(client: Client, tmp_path: Path) -> None:
    ids = [client.submit(["true"], 2, cwd=str(tmp_path)) for _ in range(4)]
    jobs = [client.wait(i, timeout=JOB_TIMEOUT) for i in ids]
    assert all(j.state == "COMPLETED" for j in jobs)
    for earlier, later in itertools.pairwise(jobs):
        assert earlier.end_time is not None and later.start_time is not None
        assert later.start_time >= earlier.end_time  # each needed all PEs: strictly one after the other


def test_easy_backfills_a_short_job_but_not_one_that_would_delay_the_head(
    client: Client, tmp_path: Path
) -> None:
    go_r, go_s = tmp_path / "go-r", tmp_path / "go-s"
    # R holds one PE and promises to end within 60 s: the 2-rank head H can start then at the latest.
    r = client.submit(wait_file_job(go_r), 1, cwd=str(tmp_path), time_limit=60.0)
    poll(lambda: client.job(r).state == "RUNNING", 30, "R to run")
    h = client.submit(["true"], 2, cwd=str(tmp_path), name="head")
    s = client.submit(wait_file_job(go_s), 1, cwd=str(tmp_path), time_limit=10.0, name="short")
    long_ = client.submit(["true"], 1, cwd=str(tmp_path), time_limit=120.0, name="long")

    # S ends (by its limit) before R's promised end, so it may use the free PE now; L may not.
    poll(lambda: client.job(s).state == "RUNNING", 30, "the short job to be backfilled")
    assert client.job(h).state == "PENDING" and client.job(h).reason == "Resources"
    assert client.job(long_).state == "PENDING" and client.job(long_).reason == "Priority"

    go_s.touch()
    client.wait(s, timeout=JOB_TIMEOUT)
    # The freed PE goes to nobody: H needs two, and L would delay H.
    assert client.job(long_).state == "PENDING"
    go_r.touch()
    jobs = {j.name: j for j in (client.wait(i, timeout=JOB_TIMEOUT) for i in (r, h, s, long_))}
    assert all(j.state == "COMPLETED" for j in jobs.values())
    head, short, late = jobs["head"], jobs["short"], jobs["long"]
    assert short.start_time is not None and head.start_time is not None and late.start_time is not None
    assert short.start_time < head.start_time  # backfilled ahead of the head
    assert late.start_time >= head.start_time  # but the long job was not


def test_oversubscribed_ranks_queue_until_pes_free(client: Client, tmp_path: Path) -> None:
    go = tmp_path / "go"
    first = client.submit(wait_file_job(go), 1, cwd=str(tmp_path))
    second = client.submit(wait_file_job(go), 1, cwd=str(tmp_path))
    third = client.submit(["true"], 1, cwd=str(tmp_path))
    poll(lambda: client.job(second).state == "RUNNING", 30, "two one-rank jobs to run")
    assert client.job(first).nodes != client.job(second).nodes  # one PE each: different nodes
    assert client.job(third).state == "PENDING"
    go.touch()
    assert client.wait(third, timeout=JOB_TIMEOUT).state == "COMPLETED"
