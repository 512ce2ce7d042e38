"""End to end: real daemons, real MPI ranks, real signals. One cluster of 2 nodes x 1 PE per module."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import poll, python_app, run_job, storm_cli

pytestmark = pytest.mark.slow


def test_mpi4py_job_spans_two_node_managers(client: Client, tmp_path: Path) -> None:
    job = run_job(client, python_app("hello"), 2, tmp_path)
    assert (job.state, job.exit_code) == ("COMPLETED", 0)
    assert job.nodes == ("node0", "node1")
    out = (tmp_path / f"storm-{job.id}.out").read_text()
    assert "hello: OK" in out
    # Each rank reports the node manager that started it: the two ranks really sit on different nodes.
    assert re.search(r"rank 0/2 on node0 pid \d+: allreduce=3 \(expected 3\), from left=1", out), out
    assert re.search(r"rank 1/2 on node1 pid \d+: allreduce=3 \(expected 3\), from left=0", out), out


def test_c_program_compiled_with_mpicc(client: Client, tmp_path: Path, hello_c: Path) -> None:
    job = run_job(client, [str(hello_c)], 2, tmp_path, output=str(tmp_path / "c-%j.out"))
    assert (job.state, job.exit_code) == ("COMPLETED", 0)
    out = (tmp_path / f"c-{job.id}.out").read_text()
    assert "rank 1/2 on node1" in out and "hello: OK" in out


def test_cli_submit_wait_prints_id_and_exits_with_job_code(cluster: LocalCluster, tmp_path: Path) -> None:
    ok = storm_cli(cluster, "submit", "-n", "2", "--wait", "--", *python_app("hello"), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    job_id = int(ok.stdout.strip())
    assert "hello: OK" in (tmp_path / f"storm-{job_id}.out").read_text()
    bad = storm_cli(cluster, "submit", "-n", "1", "--wait", "--", "sh", "-c", "exit 7", cwd=tmp_path)
    assert bad.returncode == 7
    assert "FAILED" in bad.stderr and "exited with code 7" in bad.stderr


def test_per_rank_output_files_and_separate_stderr(client: Client, tmp_path: Path) -> None:
    script = 'echo "out of rank $STORM_RANK on $STORM_NODE"; echo "err of rank $STORM_RANK" >&2'
    job = run_job(
        client, ["sh", "-c", script], 2, tmp_path,
        output=str(tmp_path / "o-%j-%t.txt"), error=str(tmp_path / "e-%j-%t.txt"),
    )  # fmt: skip
    assert job.state == "COMPLETED"
    for rank, node in ((0, "node0"), (1, "node1")):
        assert (tmp_path / f"o-{job.id}-{rank}.txt").read_text() == f"out of rank {rank} on {node}\n"
        assert (tmp_path / f"e-{job.id}-{rank}.txt").read_text() == f"err of rank {rank}\n"


def test_failing_rank_fails_job_and_kills_its_peer(client: Client, tmp_path: Path) -> None:
    # Rank 1 exits with code 3 without MPI_Finalize; rank 0 blocks in a receive that never completes.
    job = run_job(client, python_app("fail", "--rank", "1", "--code", "3"), 2, tmp_path)
    assert (job.state, job.exit_code) == ("FAILED", 3)
    assert "rank 1 exited with code 3" in job.reason and "node1" in job.reason
    # The no_leaks fixture then checks that rank 0 was killed and that /dev/shm holds nothing of the job.


def test_mpi_abort_stops_the_job_with_its_code(client: Client, tmp_path: Path) -> None:
    code = (
        "from mpi4py import MPI; import time; c = MPI.COMM_WORLD; c.Barrier(); "
        "c.Abort(9) if c.rank == 0 else time.sleep(60)"
    )
    job = run_job(client, ["python", "-c", code], 2, tmp_path)
    assert (job.state, job.exit_code) == ("FAILED", 9)
    assert "MPI_Abort" in job.reason


def test_cancel_pending_and_running_jobs(client: Client, tmp_path: Path) -> None:
    running = client.submit(python_app("spin", "--mpi"), 2, cwd=str(tmp_path))
    poll(lambda: client.job(running).state == "RUNNING", 30, "the spin job to run")
    pending = client.submit(python_app("spin"), 2, cwd=str(tmp_path))
    assert client.job(pending).state == "PENDING"
    results = client.cancel((pending, running))
    assert results == {str(pending): "cancelled", str(running): "cancelling"}
    assert client.job(pending).state == "CANCELLED"
    done = client.wait(running, timeout=30)
    assert done.state == "CANCELLED" and done.reason == "cancelled by root"
    assert done.start_time is not None and client.job(pending).start_time is None
    assert client.cancel((running,)) == {str(running): "already CANCELLED"}


def test_time_limit_ends_job_with_timeout(client: Client, tmp_path: Path) -> None:
    job = run_job(client, python_app("spin"), 1, tmp_path, time_limit=1.0)
    assert job.state == "TIMEOUT"
    assert job.reason == "time limit of 0:00:01 reached"
    assert job.start_time is not None and job.end_time is not None
    assert 1.0 <= job.end_time - job.start_time < 1.0 + 10  # limit, plus the grace of the kill


def test_missing_program_fails_with_127_and_a_reason(client: Client, tmp_path: Path) -> None:
    job = run_job(client, ["/nonexistent/program"], 2, tmp_path)
    assert (job.state, job.exit_code) == ("FAILED", 127)
    assert "cannot execute /nonexistent/program" in job.reason


def test_unwritable_output_fails_the_job_clearly(client: Client, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    job = run_job(client, ["true"], 1, tmp_path, output=str(blocker / "out"))
    assert job.state == "FAILED"
    assert "cannot open output file" in job.reason


def test_a_rank_gets_only_its_descriptors_and_default_signals(client: Client, tmp_path: Path) -> None:
    """The job shell starts ranks with posix_spawn (nm/process_start.py): nothing of the shell's may leak
    into them, and SIGPIPE and SIGXFSZ, which Python ignores, are not ignored in the program."""
    code = (
        "import os\n"
        "def is_open(fd):\n"
        "    try:\n        os.fstat(fd)\n    except OSError:\n        return False\n    return True\n"
        "pmi = int(os.environ['PMI_FD'])\n"
        "print(sorted(fd for fd in range(1024) if is_open(fd) and fd != pmi), os.readlink('/proc/self/fd/0'),"
        " os.getcwd())\n"
    )
    job = run_job(client, ["python", "-c", code], 1, tmp_path, output=str(tmp_path / "fds.out"))
    assert job.state == "COMPLETED", job.reason
    assert (tmp_path / "fds.out").read_text() == f"[0, 1, 2] /dev/null {tmp_path}\n"
    job = run_job(client, ["cat", "/proc/self/status"], 1, tmp_path, output=str(tmp_path / "status.out"))
    assert job.state == "COMPLETED", job.reason
    [ignored] = [line.split()[1] for line in (tmp_path / "status.out").read_text().splitlines()
                 if line.startswith("SigIgn:")]  # fmt: skip
    assert int(ignored, 16) & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)) == 0, ignored


def test_a_program_is_found_on_the_job_path_from_its_working_directory(
    client: Client, tmp_path: Path
) -> None:
    """Searched on the PATH the job carries (not the job shell's), relative entries from the job's cwd."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "storm-test-program"
    program.write_text('#!/bin/sh\necho "found in $(pwd)"\n')
    program.chmod(0o755)
    env = {**os.environ, "PATH": f"bin:{os.environ.get('PATH', os.defpath)}"}
    job = run_job(client, ["storm-test-program"], 1, tmp_path, env=env, output=str(tmp_path / "p.out"))
    assert job.state == "COMPLETED", job.reason
    assert (tmp_path / "p.out").read_text() == f"found in {tmp_path}\n"
    missing = run_job(client, ["storm-no-such-program"], 1, tmp_path, env=env)
    assert (missing.state, missing.exit_code) == ("FAILED", 127)
    assert "cannot execute storm-no-such-program: No such file or directory" in missing.reason


def test_non_mpi_program_runs_on_every_rank(client: Client, tmp_path: Path) -> None:
    job = run_job(client, ["sh", "-c", "echo $STORM_RANK of $STORM_SIZE"], 2, tmp_path)
    assert job.state == "COMPLETED"
    lines = sorted((tmp_path / f"storm-{job.id}.out").read_text().splitlines())
    assert lines == ["0 of 2", "1 of 2"]


def test_each_rank_is_pinned_to_its_pe_and_leads_its_own_session(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    code = (
        "import os; print(os.environ['STORM_RANK'], os.environ['STORM_NODE'], "
        "sorted(os.sched_getaffinity(0)), os.getpgrp() == os.getpid(), os.getsid(0) == os.getpid())"
    )
    # One file per rank: with unbuffered output (PYTHONUNBUFFERED, inherited) print's pieces are separate
    # writes, and two ranks appending to one file may interleave them.
    job = run_job(client, ["python", "-c", code], 2, tmp_path, output=str(tmp_path / "pin-%t.out"))
    assert job.state == "COMPLETED"
    cpus = {
        name: json.loads((cluster.node_dir(name) / "nm.json").read_text())["cpus"]
        for name in cluster.node_names()
    }
    for rank, node in ((0, "node0"), (1, "node1")):
        assert (tmp_path / f"pin-{rank}.out").read_text() == f"{rank} {node} {cpus[node]} True True\n"


def test_ranks_on_a_node_of_several_cpus_are_pinned_each_to_its_own(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """There the job shell pins each rank once started (nm/shell.py); on a node of one CPU (above) the
    ranks inherit the shell's."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    cluster = make_cluster(nodes=1, pes_per_node=2)
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    with cluster.client() as client:
        job = run_job(client, ["python", "-c", code], 2, tmp_path, output=str(tmp_path / "pin-%t.out"))
    assert job.state == "COMPLETED"
    cpus = json.loads((cluster.node_dir("node0") / "nm.json").read_text())["cpus"]
    pinned = [json.loads((tmp_path / f"pin-{rank}.out").read_text()) for rank in (0, 1)]
    assert all(len(one) == 1 for one in pinned) and sorted(c for [c] in pinned) == sorted(cpus)
