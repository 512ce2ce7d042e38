"""End to end: jobs run as the user who submitted them, and users can touch only their own jobs.

The tests act as the unprivileged user `nobody`, whose processes must be able to run this Python (CI
makes /root traversable for that); elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.conftest import JOB_TIMEOUT, poll, start_cluster

pytestmark = pytest.mark.slow


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("there is no user 'nobody' on this machine")


def as_nobody(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    user = nobody()
    return subprocess.run(
        argv, cwd=cwd, env=env, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
        capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A cluster outside pytest's private tmp directory, so that other users reach its sockets."""
    path = Path(tempfile.mkdtemp(prefix="storm-cluster-"))
    path.chmod(0o755)
    c = start_cluster(path, nodes=2, pes_per_node=1)
    yield c
    c.down()
    shutil.rmtree(path)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory nobody can write to (pytest's own tmp directories are private to root)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    probe = as_nobody([sys.executable, "-c", "import storm.tools.cli"], Path("/"), {})
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable}: {probe.stderr.strip()[-200:]}")
    path = Path(tempfile.mkdtemp(prefix="storm-users-"))
    path.chmod(0o777)  # nobody writes its job's output here
    yield path
    shutil.rmtree(path)


def storm_as_nobody(cluster: LocalCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "STORM_MM": cluster.endpoint}
    return as_nobody([sys.executable, "-m", "storm.tools.cli", *args], cwd, env)


def test_job_runs_as_the_submitting_user(cluster: LocalCluster, client: Client, workdir: Path) -> None:
    result = storm_as_nobody(
        cluster, workdir, "submit", "-n", "2", "--wait", "--", "sh", "-c", "id -u; id -g"
    )
    assert result.returncode == 0, result.stderr
    job = client.job(int(result.stdout))
    user = nobody()
    assert (job.user, job.uid) == ("nobody", user.pw_uid)
    out = workdir / f"storm-{job.id}.out"
    assert out.read_text().split() == [str(user.pw_uid), str(user.pw_gid)] * 2
    assert out.stat().st_uid == user.pw_uid  # the job shell opened it as the user, not as root


def test_output_is_opened_with_the_users_own_permissions(
    cluster: LocalCluster, client: Client, workdir: Path
) -> None:
    private = workdir / "root-only"
    private.mkdir(mode=0o700)
    submit = (
        "import sys; from storm.tools.client import Client; "
        f"print(Client({cluster.endpoint!r}).submit(['true'], 1, output={str(private / 'out')!r}))"
    )
    result = as_nobody([sys.executable, "-c", submit], workdir, {"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    job = client.wait(int(result.stdout), timeout=JOB_TIMEOUT)
    assert job.state == "FAILED"
    assert f"cannot open output file {private / 'out'}: Permission denied" in job.reason
    assert not (private / "out").exists()


def test_users_may_cancel_only_their_own_jobs(cluster: LocalCluster, client: Client, workdir: Path) -> None:
    go = workdir / "go"
    mine = client.submit(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done'], 1, cwd=str(workdir))
    poll(lambda: client.job(mine).state == "RUNNING", 30, "root's job to run")
    refused = storm_as_nobody(cluster, workdir, "cancel", str(mine))
    assert refused.returncode == 1
    assert f"permission denied: job {mine} belongs to root" in refused.stderr
    assert client.job(mine).state == "RUNNING"
    go.touch()
    assert client.wait(mine, timeout=JOB_TIMEOUT).state == "COMPLETED"
