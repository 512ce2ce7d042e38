"""``storm sim sweep --submit``: each point as a storm job, collected as the jobs end, with the same table,
JSON and PNG as a local sweep; failing points reported with their job; Ctrl-C cancels the jobs.

Unit tests (no cluster) cover the point command's JSON round trip and the refusals; the end-to-end tests
(marked slow) run the sweep against the shared throwaway cluster of conftest.py (2 nodes x 1 PE).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from storm.tools.sim import cli, sweep, sweep_jobs
from storm.tools.sim.engine import Machine
from storm.tools.sim.swf import file_sha256, read_swf, to_workload
from tests.helpers import JOB_TIMEOUT, poll

POLICIES = ["fcfs", "easy"]
LOADS = [0.6, 0.9]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Lublin-Feitelson workload for 8 nodes (the header names the machine): made here, so the
    tests need no shared traces; big enough that EASY backfills and the loads differ."""
    path = tmp_path_factory.mktemp("trace") / "tiny.swf"
    assert cli.main(["generate", "--jobs", "120", "--nodes", "8", "--seed", "3", "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def matplotlib_drawn(tmp_path_factory: pytest.TempPathFactory) -> None:
    """matplotlib keeps its font files open once it has drawn (a cache, not a leak): draw before the leak
    check counts."""
    warm = tmp_path_factory.mktemp("warm")
    summary = {"mean_bsld": 200.0, "mean_wait": 1.0, "utilization": 0.5, "loss_of_capacity": 0.1}
    sweep.plot(
        [{"policy": "easy", "target_load": 1.0, "offered_load": 1.0, "summary": summary}],
        warm / "s.png",
        "warm",
    )


def inputs_for(path: Path) -> tuple[sweep_jobs.SweepInputs, Any, Machine]:
    machine = Machine(8, 1)
    workload = to_workload(read_swf(str(path)).records, machine.pes)
    inputs = sweep_jobs.SweepInputs(
        trace=str(path), sha256=file_sha256(str(path)), machine=machine, estimate="runtime",
        first_jobs=None, scale="arrivals",
    )  # fmt: skip
    return inputs, workload, machine


def without_wall(data: Any) -> Any:
    """Everything but what the wall clock measured (the simulated figures are deterministic)."""
    if isinstance(data, dict):
        return {k: without_wall(v) for k, v in data.items() if k != "wall"}
    if isinstance(data, list):
        return [without_wall(v) for v in data]
    return data


# ---------------------------------------------------------------------------------------------- no cluster


@pytest.mark.parametrize("load", [0.7, 1 / 3])  # 1/3: a float that only its repr gives back exactly
def test_point_command_writes_what_run_point_returns(trace: Path, tmp_path: Path, load: float) -> None:
    inputs, workload, machine = inputs_for(trace)
    point = sweep.Point("easy", load, 1)
    out = tmp_path / "p.json"
    argv = sweep_jobs.point_argv(inputs, point, out)
    assert argv[:4] == [sys.executable, "-m", "storm.tools.sim.cli", "point"]
    assert cli.main(argv[3:]) == 0  # the job's own parser, in process
    got = sweep.read_point(out, point, inputs.sha256)
    expected = sweep.run_point(workload, machine, point, "arrivals")
    assert set(got) == set(expected)
    assert without_wall(got) == without_wall(expected)
    assert got["target_load"] == load and got["wall"]["seconds"] > 0
    assert not list(tmp_path.glob("*.partial"))


def test_point_command_passes_every_workload_option(trace: Path, tmp_path: Path) -> None:
    inputs = dataclasses.replace(
        inputs_for(trace)[0], machine=Machine(4, 2), estimate="x2", first_jobs=50, scale="runtimes"
    )
    point = sweep.Point("conservative", 0.8, 0)
    assert cli.main(sweep_jobs.point_argv(inputs, point, tmp_path / "p.json")[3:]) == 0
    got = sweep.read_point(tmp_path / "p.json", point, inputs.sha256)
    work = to_workload(read_swf(str(trace)).records, 8, "x2")
    work.jobs = work.jobs[:50]
    expected = sweep.run_point(work, Machine(4, 2), point, "runtimes")
    assert without_wall(got) == without_wall(expected)
    assert got["summary"]["jobs"] == 50 and got["arrival_compression"] == 1.0


def test_a_point_file_for_another_point_or_trace_is_refused(trace: Path, tmp_path: Path) -> None:
    inputs, _, _ = inputs_for(trace)
    point = sweep.Point("fcfs", 0.6, 0)
    out = tmp_path / "p.json"
    with pytest.raises(ValueError, match="no result"):
        sweep.read_point(out, point, inputs.sha256)
    assert cli.main(sweep_jobs.point_argv(inputs, point, out)[3:]) == 0
    with pytest.raises(ValueError, match="another point"):
        sweep.read_point(out, sweep.Point("fcfs", 0.7, 0), inputs.sha256)
    with pytest.raises(ValueError, match="another point"):
        sweep.read_point(out, point, "0" * 64)
    out.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        sweep.read_point(out, point, inputs.sha256)
    out.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a point result"):
        sweep.read_point(out, point, inputs.sha256)


def test_a_point_refuses_a_trace_that_is_not_the_sweeps(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, _, _ = inputs_for(trace)
    other = dataclasses.replace(inputs, sha256="f" * 64)
    out = tmp_path / "p.json"
    assert cli.main(sweep_jobs.point_argv(other, sweep.Point("easy", 0.6, 0), out)[3:]) == 2
    assert "not the trace the sweep read" in capsys.readouterr().err
    assert not out.exists()


def test_results_directory_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert sweep_jobs.results_directory("r", ["a.json"]) == (tmp_path / "r", False)
    assert sweep_jobs.results_directory(None, [None, "out/t.md", "x.png"]) == (
        tmp_path / "out/t.points",
        False,
    )
    made, temporary = sweep_jobs.results_directory(None, [None, None, None])
    assert temporary and made.parent == tmp_path and made.name.startswith("storm-sweep-") and made.is_dir()


def test_submit_without_a_cluster_is_a_clear_error_and_leaves_nothing(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    nowhere = f"ipc://{tmp_path}/no-mm.sock"
    assert cli.main(["sweep", str(trace), "--loads", "0.5", "--submit", "--mm", nowhere]) == 1
    assert f"no storm-mm listens at {nowhere}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # the temporary results directory is gone again


def test_submit_options_need_submit_and_loads_must_be_positive(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sweep", str(trace), "--loads", "0.5", "--mm", "ipc:///x"]) == 2
    assert "go with --submit" in capsys.readouterr().err
    assert cli.main(["sweep", str(trace), "--loads", "0.5", "--submit", "--workers", "2"]) == 2
    assert cli.main(["sweep", str(trace), "--loads", "0.5,0"]) == 2
    assert "--loads must be positive" in capsys.readouterr().err


def test_job_ids_are_shown_in_runs() -> None:
    assert sweep_jobs._ids([3, 4, 5, 7, 9, 10]) == "3-5, 7, 9-10"


# ---------------------------------------------------------------------------------------------- a cluster


def sweep_args(trace: Path, cluster: LocalCluster, out: Path) -> list[str]:
    return [
        "sweep", "--trace", str(trace), "--policies", ",".join(POLICIES),
        "--loads", ",".join(map(str, LOADS)), "--submit", "--mm", cluster.endpoint,
        "--json", f"{out}.json", "--markdown", f"{out}.md", "--png", f"{out}.png",
    ]  # fmt: skip


def sweep_jobs_on(client: Client, after: int) -> list[p.JobInfo]:
    return [j for j in client.jobs(everything=True) if j.id > after and j.name.startswith("sim-")]


def last_job(client: Client) -> int:
    return max((j.id for j in client.jobs(everything=True)), default=0)


@pytest.mark.slow
@pytest.mark.usefixtures("matplotlib_drawn")
def test_a_submitted_sweep_gives_what_a_local_sweep_gives(
    trace: Path, cluster: LocalCluster, client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = last_job(client)
    assert cli.main(sweep_args(trace, cluster, tmp_path / "jobs")) == 0
    captured = capsys.readouterr()
    assert "4 of 4 points done" in captured.err
    ran = sweep_jobs_on(client, before)
    assert len(ran) == 4 and all(j.state == "COMPLETED" and j.ranks == 1 for j in ran)
    assert {j.name for j in ran} == {f"sim-{pol}-{load:g}-s0" for pol in POLICIES for load in LOADS}

    local = ["sweep", str(trace), "--policies", ",".join(POLICIES), "--loads", ",".join(map(str, LOADS))]
    local += [
        "--workers",
        "1",
        "--json",
        str(tmp_path / "local.json"),
        "--markdown",
        str(tmp_path / "local.md"),
    ]
    assert cli.main(local) == 0
    assert captured.out == capsys.readouterr().out
    submitted = json.loads((tmp_path / "jobs.json").read_text())
    in_process = json.loads((tmp_path / "local.json").read_text())
    assert without_wall(submitted) == without_wall(in_process)
    assert [r["policy"] for r in submitted["runs"]] == ["fcfs", "fcfs", "easy", "easy"]
    assert all(r["wall"]["seconds"] > 0 for r in submitted["runs"])
    assert (tmp_path / "jobs.md").read_text() == (tmp_path / "local.md").read_text()
    assert (tmp_path / "jobs.png").stat().st_size > 0
    assert len(list((tmp_path / "jobs.points").glob("*.json"))) == 4


@pytest.mark.slow
@pytest.mark.usefixtures("matplotlib_drawn")
def test_a_failing_point_is_reported_with_its_job_and_the_sweep_fails(
    trace: Path,
    cluster: LocalCluster,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One point's job is told a trace path that does not exist on its node; the others still count."""
    real = sweep_jobs.point_argv
    missing = tmp_path / "not-on-the-node.swf"

    def one_bad(inputs: sweep_jobs.SweepInputs, point: sweep.Point, out: Path) -> list[str]:
        if point == sweep.Point("easy", LOADS[0], 0):
            inputs = dataclasses.replace(inputs, trace=str(missing))
        return real(inputs, point, out)

    monkeypatch.setattr(sweep_jobs, "point_argv", one_bad)
    before = last_job(client)
    assert cli.main(sweep_args(trace, cluster, tmp_path / "s")) == 1
    err = capsys.readouterr().err
    failed = [j for j in sweep_jobs_on(client, before) if j.state != "COMPLETED"]
    assert [(j.name, j.state, j.exit_code) for j in failed] == [(f"sim-easy-{LOADS[0]:g}-s0", "FAILED", 2)]
    job_id = failed[0].id
    stderr = tmp_path / "s.points" / f"002-easy-{LOADS[0]:g}-0.err"
    assert f"easy load {LOADS[0]:g} seed 0: job {job_id} FAILED: exit code 2" in err
    assert f"stderr: {stderr}" in err and "4 of 4 points done" in err
    assert "No such file" in stderr.read_text() and str(missing) in stderr.read_text()
    data = json.loads((tmp_path / "s.json").read_text())
    assert [(r["policy"], r["target_load"]) for r in data["runs"]] == [
        ("fcfs", LOADS[0]), ("fcfs", LOADS[1]), ("easy", LOADS[1])
    ]  # fmt: skip
    assert [(f["job_id"], f["state"], f["stderr"]) for f in data["failed"]] == [
        (job_id, "FAILED", str(stderr))
    ]
    assert (tmp_path / "s.png").stat().st_size > 0 and (tmp_path / "s.md").exists()


@pytest.fixture
def full_cluster(cluster: LocalCluster, client: Client, tmp_path: Path) -> Iterator[list[int]]:
    """Both PEs held by jobs that never end on their own, so that submitted points stay pending."""
    blockers = [client.submit(["sleep", "600"], 1, cwd=str(tmp_path), name="blocker") for _ in range(2)]
    try:
        poll(lambda: all(j.state == "RUNNING" for j in client.jobs(tuple(blockers))), JOB_TIMEOUT, "blockers")
        yield blockers
    finally:
        client.cancel(tuple(blockers))
        for job_id in blockers:
            client.wait(job_id, timeout=JOB_TIMEOUT)


@pytest.mark.slow
def test_ctrl_c_cancels_the_jobs_it_submitted(
    trace: Path, cluster: LocalCluster, client: Client, tmp_path: Path, full_cluster: list[int]
) -> None:
    before = max(full_cluster)
    log = tmp_path / "stderr"
    args = sweep_args(trace, cluster, tmp_path / "s")[:-6]  # no outputs: a temporary results directory
    with open(log, "w") as stream:
        proc = subprocess.Popen(
            [sys.executable, "-m", "storm.tools.sim.cli", *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
            stderr=stream, env={k: v for k, v in os.environ.items() if k != "STORM_MM"},
        )  # fmt: skip
    try:
        # Once it says so, the sweep knows all four job ids (a job merely queued might not be known yet).
        poll(lambda: "points submitted" in log.read_text(), JOB_TIMEOUT, "the sweep to submit its points")
        points = sweep_jobs_on(client, before)
        assert len(points) == 4 and {j.state for j in points} == {"PENDING"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=JOB_TIMEOUT) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ids = tuple(j.id for j in points)
    assert {j.state for j in client.jobs(ids)} == {"CANCELLED"}
    assert f"cancelled jobs {ids[0]}-{ids[-1]}" in log.read_text()


@pytest.mark.slow
def test_a_rate_limited_sweep_waits_as_storm_mm_asks_and_loses_nothing(
    trace: Path, make_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    limited: LocalCluster = make_cluster(nodes=1, pes_per_node=1, mm_submit_rate=5.0, mm_submit_burst=1)
    args = ["sweep", str(trace), "--policies", "fcfs", "--loads", "0.5,0.7,0.9", "--submit"]
    args += ["--mm", limited.endpoint, "--json", str(tmp_path / "s.json")]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "storm-mm limits submissions" in err and "3 of 3 points done" in err
    data = json.loads((tmp_path / "s.json").read_text())
    assert [r["target_load"] for r in data["runs"]] == [0.5, 0.7, 0.9] and "failed" not in data
