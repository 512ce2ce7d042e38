"""End to end: jobs run as the user who submitted them, and users can touch only their own jobs.

The tests act as the unprivileged users `nobody` and `daemon` (an operator of the test cluster), whose
processes must be able to run this Python (CI makes /root traversable for that); elsewhere they are skipped
with the reason.
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

from storm.tools.client import Client, ClientError
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, start_cluster

pytestmark = pytest.mark.slow


OPERATOR = "daemon"  # in [mm] operators of the test cluster: may cancel anyone's jobs


def nobody(name: str = "nobody") -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"there is no user {name!r} on this machine")


def as_nobody(
    argv: list[str], cwd: Path, env: dict[str, str], name: str = "nobody"
) -> subprocess.CompletedProcess[str]:
    user = nobody(name)
    return subprocess.run(
        argv, cwd=cwd, env=env, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
        capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A cluster outside pytest's private tmp directory, so that other users reach its sockets."""
    path = Path(tempfile.mkdtemp(prefix="storm-cluster-"))
    path.chmod(0o755)
    c = start_cluster(path, nodes=2, pes_per_node=1, mm_operators=[OPERATOR])
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


def storm_as_nobody(
    cluster: LocalCluster, cwd: Path, *args: str, user: str = "nobody"
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "STORM_MM": cluster.endpoint}
    return as_nobody([sys.executable, "-m", "storm.tools.cli", *args], cwd, env, user)


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


def test_users_may_cancel_only_their_own_jobs_and_operators_any(
    cluster: LocalCluster, client: Client, workdir: Path
) -> None:
    mine = client.submit(["sleep", "60"], 1, cwd=str(workdir))
    poll(lambda: client.job(mine).state == "RUNNING", 30, "root's job to run")
    refused = storm_as_nobody(cluster, workdir, "cancel", str(mine))
    assert refused.returncode == 1
    assert refused.stderr == f"job {mine}: permission denied: job {mine} belongs to root\n"
    assert client.job(mine).state == "RUNNING"
    operator = storm_as_nobody(cluster, workdir, "cancel", str(mine), user=OPERATOR)
    assert (operator.returncode, operator.stdout) == (0, f"job {mine}: cancelling\n"), operator.stderr
    job = client.wait(mine, timeout=JOB_TIMEOUT)
    assert (job.state, job.reason) == ("CANCELLED", f"cancelled by {OPERATOR}")


def test_a_job_asking_to_run_as_another_user_is_refused(
    cluster: LocalCluster, client: Client, workdir: Path
) -> None:
    before = [j.id for j in client.jobs(everything=True)]
    user = nobody()
    why = "storm runs a job only as the user who submits it"
    me = f"you are nobody (uid {user.pw_uid}): {why}"
    group = f"yours is {user.pw_gid}: {why}, with their group"
    for args, text in (
        (["--uid", "root"], f"the job asks to run as user root, but {me}"),
        (["--uid", "0"], f"the job asks to run as uid 0, but {me}"),
        (["--gid", "0"], f"the job asks to run with gid 0, but {group}"),
    ):
        refused = storm_as_nobody(cluster, workdir, "submit", "-n", "1", *args, "--", "true")
        assert (refused.returncode, refused.stdout) == (1, ""), refused.stderr
        assert refused.stderr == f"storm submit: {text}\n"
    # Root is no exception: it runs jobs as root only.
    with pytest.raises(ClientError) as as_root:
        client.submit(["true"], 1, cwd=str(workdir), user="nobody")
    assert as_root.value.code == "permission_denied"
    assert str(as_root.value) == f"the job asks to run as user nobody, but you are root (uid 0): {why}"
    assert [j.id for j in client.jobs(everything=True)] == before  # nothing refused was stored
    # Asking for oneself is what happens anyway, and is accepted.
    own = ["--uid", "nobody", "--gid", str(user.pw_gid)]
    mine = storm_as_nobody(cluster, workdir, "submit", "-n", "1", *own, "--wait", "--", "true")
    assert mine.returncode == 0, mine.stderr
    assert client.job(int(mine.stdout)).user == "nobody"
