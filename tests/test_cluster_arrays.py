"""End to end: job arrays and dependencies on a real throwaway cluster (storm-mm, storm-nm, real processes,
real SQLite), through the CLI where users meet them, and across a SIGKILL of storm-mm."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.tools import cli
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll

pytestmark = pytest.mark.slow


def most_at_once(jobs: Sequence[p.JobInfo]) -> int:
    """The most jobs that held PEs at once, from their recorded start and end times (an end at the instant
    of a start comes first: the task that ended gave its slot to the one that started)."""
    events = []
    for job in jobs:
        assert job.start_time is not None and job.end_time is not None, job
        events += [(job.start_time, 1), (job.end_time, -1)]
    most = now = 0
    for _time, step in sorted(events):
        now += step
        most = max(most, now)
    return most


def gated(go: Path, then: str) -> list[str]:
    return ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done; {then}']


def finished(client: Client, job_ids: Sequence[int]) -> list[p.JobInfo]:
    for job_id in job_ids:
        client.wait(job_id, timeout=JOB_TIMEOUT)
    return client.jobs(tuple(job_ids))


def test_a_100_task_array_runs_at_most_10_at_once_each_in_its_own_file(
    make_cluster: object, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=8)  # type: ignore[operator]
    monkeypatch.setenv("STORM_MM", cluster.endpoint)
    monkeypatch.chdir(tmp_path)
    script = 'echo "task $STORM_ARRAY_TASK_ID of $STORM_ARRAY_JOB_ID: $STORM_ARRAY_TASK_COUNT"; sleep 0.2'
    argv = ["submit", "-n", "1", "--array", "0-99%10", "-o", "out-%A_%a.txt", "--", "sh", "-c", script]
    assert cli.main(argv) == 0
    array = int(capsys.readouterr().out)
    seen = 0
    folded: list[str] = []  # queue lines of tasks held by the limit
    with cluster.client() as client:
        tasks = client.named((array,))
        assert [t.array_task for t in tasks] == list(range(100))
        ids = [t.id for t in tasks]
        deadline = time.monotonic() + 120
        while True:  # and while it runs, as a user would see it, one look per round trip
            assert time.monotonic() < deadline, "the array did not end in 120 s"
            jobs = client.named((array,))
            holding = [j for j in jobs if j.state in ("STARTING", "RUNNING")]
            assert len(holding) <= 10
            seen = max(seen, len(holding))
            if all(p.JobState(j.state).terminal for j in jobs):
                break
            assert cli.main(["queue"]) == 0
            lines = capsys.readouterr().out.splitlines()
            pending = [line for line in lines if line.startswith(f"{array}_[")]
            assert len(pending) <= 2  # folded: those waiting for PEs, and those held by the limit
            folded += [line for line in pending if line.rstrip().endswith("JobArrayTaskLimit")]
        jobs = finished(client, ids)
    assert {j.state for j in jobs} == {"COMPLETED"}
    assert most_at_once(jobs) <= 10 and seen >= 5  # the limit held, and was reached near enough to matter
    assert folded and folded[0].startswith(f"{array}_[") and "PENDING" in folded[0], folded[:1]
    for job in jobs:
        out = tmp_path / f"out-{array}_{job.array_task}.txt"
        assert out.read_text() == f"task {job.array_task} of {array}: 100\n"
        assert job.output == str(out)


def test_a_chain_of_three_runs_in_order_and_afterok_on_a_failure_never_runs(
    make_cluster: object, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=2)  # type: ignore[operator]
    monkeypatch.setenv("STORM_MM", cluster.endpoint)
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "log"

    def submit(*options: str, step: str) -> int:
        command = ["sh", "-c", f"sleep 0.3; echo {step} >> {log}"]
        assert cli.main(["submit", "-n", "1", *options, "--", *command]) == 0
        return int(capsys.readouterr().out)

    a = submit(step="a")
    b = submit("--dependency", f"afterok:{a}", step="b")
    c = submit("-d", f"afterany:{b}", step="c")
    assert cli.main(["queue"]) == 0
    queue = capsys.readouterr().out
    assert any(
        line.startswith(str(c)) and line.rstrip().endswith("Dependency") for line in queue.splitlines()
    )
    fails = cluster_submit(cluster, ["false"], tmp_path)
    never = cluster_submit(cluster, ["true"], tmp_path, dependency=f"afterok:{fails}")
    with cluster.client() as client:
        jobs = {j.id: j for j in finished(client, (a, b, c, never))}
    assert log.read_text() == "a\nb\nc\n"
    assert [jobs[j].state for j in (a, b, c)] == ["COMPLETED"] * 3
    assert jobs[a].end_time <= jobs[b].start_time and jobs[b].end_time <= jobs[c].start_time  # type: ignore[operator]
    assert jobs[never].state == "CANCELLED" and jobs[never].start_time is None
    assert jobs[never].reason.startswith(f"DependencyNeverSatisfied: job {fails} ended FAILED")
    assert cli.main(["show", "--json", str(never)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dependency"] == f"afterok:{fails}" and shown["reason"] == jobs[never].reason
    assert cli.main(["submit", "-n", "1", "-d", "afterok:99999", "--", "true"]) == 1
    assert "--dependency afterok:99999: no job 99999" in capsys.readouterr().err


def cluster_submit(cluster: LocalCluster, argv: list[str], cwd: Path, **options: object) -> int:
    with cluster.client() as client:
        return client.submit(argv, 1, cwd=str(cwd), **options)


def test_cancel_and_show_one_task_or_the_whole_array(
    make_cluster: object, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, pes_per_node=2)  # type: ignore[operator]
    monkeypatch.setenv("STORM_MM", cluster.endpoint)
    go = tmp_path / "go"
    with cluster.client() as client:
        submitted = client.submit_job(gated(go, "true"), 1, cwd=str(tmp_path), array="0-5%2")
        array = submitted.job_id
        poll(lambda: client.job(submitted.job_ids[1]).state == "RUNNING", 30, "two tasks to run")
    assert cli.main(["show", f"{array}_3"]) == 0
    shown = capsys.readouterr().out
    assert f"ArrayJobId: {array}" in shown and "ArrayTaskId: 3" in shown and "JobArrayTaskLimit" in shown
    assert cli.main(["cancel", f"{array}_3", f"{array}_1"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"job {array}_3: cancelled", f"job {array}_1: cancelling"]
    assert cli.main(["cancel", str(array)]) == 0
    assert capsys.readouterr().out == f"job {array}: cancelling\n"
    with cluster.client() as client:
        jobs = finished(client, submitted.job_ids)
    assert [j.state for j in jobs] == ["CANCELLED"] * 6
    started = [j.start_time is not None for j in jobs]
    # Task 2 may have taken task 1's slot before the whole array was cancelled; 3 was cancelled while held,
    # and 4 and 5 never had a slot.
    assert started[:2] == [True, True] and started[3:] == [False, False, False]


def test_arrays_and_dependencies_survive_an_mm_sigkill(make_cluster: object, tmp_path: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=4)  # type: ignore[operator]
    go = tmp_path / "go"
    log = tmp_path / "log"
    cwd = str(tmp_path)
    with cluster.client() as client:
        array = client.submit_job(gated(go, "sleep 0.1"), 1, cwd=cwd, array="0-11%3", output=f"{cwd}/t-%a")
        a = client.submit(gated(go, f"echo a >> {log}"), 1, cwd=cwd)
        b = client.submit(["sh", "-c", f"echo b >> {log}"], 1, cwd=cwd, dependency=f"afterok:{a}")
        c = client.submit(["sh", "-c", f"echo c >> {log}"], 1, cwd=cwd, dependency=f"afterok:{b}")
        fails = client.submit(gated(go, "exit 3"), 1, cwd=cwd)
        never = client.submit(["true"], 1, cwd=cwd, dependency=f"afterok:{fails}")
        whole = client.submit(["true"], 1, cwd=cwd, dependency=f"afterok:{array.job_id}")
        running = [*array.job_ids[:3], a, fails]
        poll(
            lambda: {j.state for j in client.jobs(tuple(running))} == {"RUNNING"}, 30, "the first jobs to run"
        )
        held = {j.id: j.reason for j in client.jobs((*array.job_ids[3:], b, c, never, whole))}
        assert set(held.values()) == {"JobArrayTaskLimit", "Dependency"}

    cluster.mm.signal(9)  # type: ignore[union-attr]
    poll(lambda: not cluster.mm.alive(), 10, "storm-mm to die")  # type: ignore[union-attr]
    go.touch()  # the running jobs end while no MM hears of it
    cluster.restart_mm()
    cluster.wait_nodes_up(cluster.node_names())
    with cluster.client() as client:
        tasks = finished(client, array.job_ids)
        jobs = {j.id: j for j in finished(client, (a, b, c, fails, never, whole))}
    assert {t.state for t in tasks} == {"COMPLETED"} and most_at_once(tasks) <= 3
    assert [(tmp_path / f"t-{t.array_task}").exists() for t in tasks] == [True] * 12
    assert log.read_text() == "a\nb\nc\n"
    assert [jobs[j].state for j in (a, b, c, whole)] == ["COMPLETED"] * 4
    assert jobs[a].end_time <= jobs[b].start_time and jobs[b].end_time <= jobs[c].start_time  # type: ignore[operator]
    assert max(t.end_time for t in tasks) <= jobs[whole].start_time  # type: ignore[operator, type-var]
    assert (jobs[fails].state, jobs[never].state) == ("FAILED", "CANCELLED")
    assert jobs[never].reason.startswith(f"DependencyNeverSatisfied: job {fails} ended FAILED")


def test_submit_wait_on_an_array_waits_for_every_task_and_exits_with_the_highest_status(
    make_cluster: object, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, pes_per_node=2)  # type: ignore[operator]
    monkeypatch.setenv("STORM_MM", cluster.endpoint)
    monkeypatch.chdir(tmp_path)
    argv = ["submit", "-n", "1", "-a", "0,3,1%2", "--wait", "--", "sh", "-c", "exit $STORM_ARRAY_TASK_ID"]
    assert cli.main(argv) == 3
    array = int(capsys.readouterr().out)
    with cluster.client() as client:
        jobs = client.named((array,))
    assert [(j.array_task, j.state, j.exit_code) for j in jobs] == [
        (0, "COMPLETED", 0),
        (1, "FAILED", 1),
        (3, "FAILED", 3),
    ]
