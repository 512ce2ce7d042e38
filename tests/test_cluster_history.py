"""End to end: `storm history` on a throwaway cluster, jobs of several states and users, the CPU time the
nodes measured, and under FCS the time each job's ranks spent in each class.

Acting as another user is as in tests/test_cluster_users.py (`nobody`, and `daemon` as an operator).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests import test_cluster_users
from tests.helpers import JOB_TIMEOUT, python_app, storm_cli
from tests.test_cluster_users import OPERATOR, as_nobody, storm_as_nobody

# test_cluster_users's cluster (other users reach its sockets; `daemon` an operator), one per module.
cluster = test_cluster_users.cluster

pytestmark = pytest.mark.slow

# A rank that burns CPU_SECONDS of its own CPU time (not wall time) and exits.
CPU_SECONDS = 0.3
BURN = [
    sys.executable, "-c",
    f"import time\nt = time.process_time()\nwhile time.process_time() - t < {CPU_SECONDS}: pass",
]  # fmt: skip


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    probe = as_nobody([sys.executable, "-c", "import storm.tools.cli"], Path("/"), {})
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable}: {probe.stderr.strip()[-200:]}")
    path = Path(tempfile.mkdtemp(prefix="storm-history-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def history(cluster: LocalCluster, *args: str) -> list[dict[str, Any]]:
    done = storm_cli(cluster, "history", "--json", *args)
    assert done.returncode == 0, done.stderr
    jobs: list[dict[str, Any]] = json.loads(done.stdout)
    return jobs


def ids(jobs: list[dict[str, Any]]) -> list[int]:
    return [j["id"] for j in jobs]


@pytest.fixture(scope="module")
def jobs(cluster: LocalCluster, workdir: Path) -> dict[str, int]:
    """One of each: completed (`true`), failed (exit 3), cancelled, CPU-burning (2 ranks), nobody's."""
    found: dict[str, int] = {}
    cwd = str(workdir)
    with cluster.client() as client:
        found["true"] = client.submit(["true"], 1, cwd=cwd, name="true")
        found["failed"] = client.submit(["sh", "-c", "exit 3"], 1, cwd=cwd, name="fails")
        found["burn"] = client.submit(BURN, 2, cwd=cwd, name="burn")
        for key in ("true", "failed", "burn"):
            client.wait(found[key], timeout=JOB_TIMEOUT)
        found["cancelled"] = client.submit(["sleep", "60"], 1, cwd=cwd, name="sleeps")
        client.cancel((found["cancelled"],))
        client.wait(found["cancelled"], timeout=JOB_TIMEOUT)
    submitted = storm_as_nobody(cluster, workdir, "submit", "--wait", "-n", "1", "--name", "theirs", "true")
    assert submitted.returncode == 0, submitted.stderr
    mine = history(cluster, "--name", "theirs", "--allusers")
    assert len(mine) == 1
    found["nobody"] = mine[0]["id"]
    return found


def test_filters_select_by_state_user_name_and_id(cluster: LocalCluster, jobs: dict[str, int]) -> None:
    everything = history(cluster, "--since", "now-1hour")  # root: every user's, as sacct
    assert set(jobs.values()) <= set(ids(everything))
    assert ids(everything) == sorted(ids(everything))
    by_id = {j["id"]: j for j in everything}
    assert by_id[jobs["true"]]["state"] == "COMPLETED" and by_id[jobs["failed"]]["exit_code"] == 3
    assert by_id[jobs["nobody"]]["user"] == "nobody" and by_id[jobs["burn"]]["ranks"] == 2
    assert ids(history(cluster, "--state", "failed,CANCELLED")) == sorted([jobs["failed"], jobs["cancelled"]])
    assert ids(history(cluster, "--user", "nobody")) == [jobs["nobody"]]
    assert ids(history(cluster, "--name", "burn,fails")) == sorted([jobs["burn"], jobs["failed"]])
    assert ids(history(cluster, "--jobs", f"{jobs['true']},{jobs['nobody']}")) == [
        jobs["true"],
        jobs["nobody"],
    ]
    assert ids(history(cluster, "--until", "now-1hour")) == []  # none submitted by then
    assert ids(history(cluster, "--since", "now+1hour")) == []  # all had ended by then
    assert len(history(cluster, "--limit", "2")) == 2


def test_a_user_sees_only_their_own_jobs_and_an_operator_everyones(
    cluster: LocalCluster, jobs: dict[str, int], workdir: Path
) -> None:
    own = storm_as_nobody(cluster, workdir, "history", "--json", "--since", "now-1hour")
    assert own.returncode == 0, own.stderr
    assert [j["id"] for j in json.loads(own.stdout)] == [jobs["nobody"]]
    refused = storm_as_nobody(cluster, workdir, "history", "--user", "root")
    assert refused.returncode == 1
    assert "only root and [mm] operators see other users' jobs" in refused.stderr
    operator = storm_as_nobody(cluster, workdir, "history", "--json", "--allusers", user=OPERATOR)
    assert operator.returncode == 0, operator.stderr
    assert set(jobs.values()) <= {j["id"] for j in json.loads(operator.stdout)}


def test_cpu_time_is_measured_on_the_nodes(cluster: LocalCluster, jobs: dict[str, int]) -> None:
    found = {j["id"]: j for j in history(cluster, "--jobs", f"{jobs['burn']},{jobs['true']}")}
    burn, true = found[jobs["burn"]], found[jobs["true"]]
    # Each rank used at least what it burned, and no rank more than the wall time it ran.
    assert burn["total_cpu"] >= 2 * CPU_SECONDS
    assert burn["total_cpu"] <= burn["elapsed"] * burn["ranks"]
    assert true["total_cpu"] is not None and true["total_cpu"] < 0.1
    assert burn["class_times"] == {}  # batch: no FCS classes


def test_formats_csv_and_a_bad_field(cluster: LocalCluster, jobs: dict[str, int]) -> None:
    wanted = f"{jobs['failed']},{jobs['burn']}"
    table = storm_cli(cluster, "history", "--jobs", wanted, "--format", "JobID,JobName,State,ExitCode,NTasks")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["JobID", "JobName", "State", "ExitCode", "NTasks"]
    assert lines[1].split() == [str(jobs["failed"]), "fails", "FAILED", "3:0", "1"]
    assert lines[2].split() == [str(jobs["burn"]), "burn", "COMPLETED", "0:0", "2"]
    got = storm_cli(cluster, "history", "--jobs", wanted, "--csv", "-o", "jobid,user,totalcpu,nodelist")
    rows = list(csv.reader(io.StringIO(got.stdout)))
    assert rows[0] == ["JobID", "User", "TotalCPU", "NodeList"]
    assert rows[2][0] == str(jobs["burn"]) and rows[2][1] == "root" and rows[2][3] == "node0,node1"
    minutes, seconds = rows[2][2].split(":")
    assert int(minutes) * 60 + float(seconds) >= 2 * CPU_SECONDS
    bad = storm_cli(cluster, "history", "--format", "JobID,Nonsense")
    assert bad.returncode == 2
    assert "unknown field 'Nonsense'" in bad.stderr and "TotalCPU" in bad.stderr and "TimeDC" in bad.stderr
    when = storm_cli(cluster, "history", "--since", "last tuesday")
    assert when.returncode == 2 and "YYYY-MM-DD[THH:MM[:SS]]" in when.stderr


def test_class_times_under_fcs(make_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    """A coarse-grained job (2 s between communications) turns DC after cslots_MIN slots: its history has
    time in CS, then DC, summing to at most its elapsed time times its ranks."""
    cluster = make_cluster(policy="fcs", mm_mpl=2)
    env = {**os.environ, "STORM_TEST_DIR": str(tmp_path)}
    argv = python_app("bsp", "--granularity", "2s", "--seconds", "6")
    with cluster.client() as client:
        job_id = client.submit(argv, 2, cwd=str(tmp_path), name="coarse", env=env)
        assert client.wait(job_id, timeout=JOB_TIMEOUT).state == "COMPLETED"
        check_class_times(cluster, client, job_id)


def check_class_times(cluster: LocalCluster, client: Client, job_id: int) -> None:
    (job,) = history(cluster, "--jobs", str(job_id))
    times = job["class_times"]
    assert set(times) == {"CS", "F", "DC"}
    assert times["CS"] > 0 and times["DC"] > 0, times
    assert sum(times.values()) <= job["elapsed"] * job["ranks"] + 1e-6
    assert job["total_cpu"] > 0
    shown = storm_cli(cluster, "history", "--jobs", str(job_id), "-P", "-o", "JobID,TimeCS,TimeF,TimeDC")
    assert shown.stdout.splitlines()[0] == "JobID|TimeCS|TimeF|TimeDC"
    assert shown.stdout.splitlines()[1].startswith(f"{job_id}|")
