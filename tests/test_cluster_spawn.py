"""End to end: MPI_Comm_spawn(_multiple) and MPI_Publish_name / MPI_Lookup_name under storm, with real MPI
programs (tests/programs/dynamic.c, built with the environment's mpicc, and mpi4py), real daemons and real
signals. The autouse no_leaks fixture checks after each test that no process (spawned ones included) and no
shared memory (the spawned worlds' MPICH segments included) was left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, run_job, storm_cli
from tests.test_cluster_gang import stopped

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).resolve().parent / "programs"


def build(tmp_path_factory: pytest.TempPathFactory, compiler: str) -> Path:
    binary = tmp_path_factory.mktemp(compiler) / "dynamic"
    mpicc = Path(sys.executable).parent / compiler
    subprocess.run(
        [str(mpicc), "-O1", "-Wall", "-o", str(binary), str(PROGRAMS / "dynamic.c")], check=True, timeout=120
    )
    return binary


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/programs/dynamic.c for MPICH's own ABI (what plain mpicc builds)."""
    return build(tmp_path_factory, "mpicc")


@pytest.fixture(scope="module")
def dynamic_abi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same for the MPI standard ABI, whose port names are long enough for this MPICH (see dynamic.c)."""
    return build(tmp_path_factory, "mpicc_abi")


def submit(client: Client, argv: list[str], ranks: int, cwd: Path) -> int:
    """Submit with a marker in the environment, so that the job's processes can be told from any other's."""
    return client.submit(argv, ranks, cwd=str(cwd), env={**os.environ, "STORM_TEST_DIR": str(cwd)})


def processes(job_id: int, cwd: Path) -> tuple[dict[int, int], dict[int, tuple[str, str]]]:
    """The job's ranks (rank -> pid) and spawned processes (pid -> (spawn, rank in it)) running now."""
    ranks, spawned = {}, {}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("STORM_JOB_ID") != str(job_id) or env.get("STORM_TEST_DIR") != str(cwd):
                continue
            if os.getpgid(proc.pid) != proc.pid:
                continue  # not a process storm started (mpi4py's own helpers, a shell's sleep)
        except (psutil.Error, OSError):
            continue
        if "STORM_SPAWN" in env:
            spawned[proc.pid] = (env["STORM_SPAWN"], env["STORM_RANK"])
        else:
            ranks[int(env["STORM_RANK"])] = proc.pid
    return ranks, spawned


def spawns(client: Client, job_id: int) -> p.SpawnsView:
    """What the MM counted (the request number left out, for comparisons)."""
    view = client.call(p.GetSpawns(job_id=job_id), p.SpawnsView)
    return p.SpawnsView(
        job_id=view.job_id, spawns=view.spawns, processes=view.processes, refused=view.refused,
        last_refusal=view.last_refusal,
    )  # fmt: skip


def gone(pids: list[int]) -> bool:
    return all(stopped(pid) is None for pid in pids)


# ---------------------------------------------------------------------------------------------- spawning


@pytest.mark.parametrize("how", ["single", "multiple"])
def test_children_exchange_data_with_their_parents(
    cluster: LocalCluster, client: Client, tmp_path: Path, dynamic: Path, how: str
) -> None:
    job = run_job(client, [str(dynamic), "exchange", "2", "0", how], 2, tmp_path)
    out = (tmp_path / f"storm-{job.id}.out").read_text()
    assert (job.state, job.exit_code) == ("COMPLETED", 0), out
    assert "FAILED" not in out and out.count(": OK") == 3 * 2 + 2 * 2 + 1, out
    # Both children started on node0, the node of the spawning root (rank 0), one per command in
    # spawn_multiple, and with their command's appnum.
    children = sorted(re.findall(r"child (\d)/2 pid \d+ appnum (\d) on (\S+) argv\[2\] (\S+)", out))
    commands = [("0", "first"), ("1", "second")] if how == "multiple" else [("0", how), ("0", how)]
    assert children == [(str(r), a, "node0", c) for r, (a, c) in enumerate(commands)]
    assert spawns(client, job.id) == p.SpawnsView(job_id=job.id, spawns=1, processes=2)
    shown = storm_cli(cluster, "show", str(job.id)).stdout
    assert "Spawned: 2 process(es) in 1 spawn(s)" in shown
    for node in ("node0", "node1"):  # nothing of the job is left on the nodes (no_leaks checks the rest)
        jobs = cluster.node_dir(node) / "jobs"
        poll(lambda jobs=jobs: not any(jobs.iterdir()), 10, f"{node}'s job directories to go")


MPI4PY_SPAWNER = """
import os, sys
from mpi4py import MPI
parent = MPI.Comm.Get_parent()
if parent == MPI.COMM_NULL:
    # Each rank spawns from COMM_SELF, at the same time: every node spawns for its own rank.
    child = MPI.COMM_SELF.Spawn(sys.executable, [__file__], 2)
    nodes = child.gather(None, root=MPI.ROOT)
    # One write: the ranks share the output file, and print() writes its pieces one by one when unbuffered.
    os.write(1, f"rank {MPI.COMM_WORLD.rank} on {os.environ['STORM_NODE']} children on {nodes}\\n".encode())
    assert nodes == [os.environ['STORM_NODE']] * 2, nodes
    child.Disconnect()
else:
    parent.gather(os.environ['STORM_NODE'], root=0)
    parent.Disconnect()
"""


def test_every_rank_spawns_on_its_own_node_with_mpi4py(client: Client, tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(MPI4PY_SPAWNER)
    job = run_job(client, [sys.executable, str(script)], 2, tmp_path)
    out = (tmp_path / f"storm-{job.id}.out").read_text()
    assert (job.state, job.exit_code) == ("COMPLETED", 0), out
    assert sorted(re.findall(r"rank (\d) on (\S+) children on", out)) == [("0", "node0"), ("1", "node1")], out
    assert spawns(client, job.id) == p.SpawnsView(job_id=job.id, spawns=2, processes=4)


def test_a_spawn_beyond_the_limit_fails_fast_with_a_clear_message(
    cluster: LocalCluster, client: Client, tmp_path: Path, dynamic: Path
) -> None:
    # The default [nm] spawn_limit is 16 per PE, and the job holds 1 PE on node0.
    job = run_job(client, [str(dynamic), "toomany", "17"], 2, tmp_path)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job.reason
    out = (
        tmp_path / f"storm-{job.id}.out"
    ).read_text()  # stdout and stderr, as the job did not separate them
    refusal = (
        f"storm: MPI_Comm_spawn of 17 process(es) refused for job {job.id} on node node0: it already has 0"
        " spawned process(es) there, and a job may have at most 16 per PE it holds on the node ([nm]"
        " spawn_limit = 16, 1 PE(s): at most 16)"
    )
    assert refusal in out
    took = re.search(r"spawn of 17 refused after ([\d.]+) s with class (\d+) \(MPI_ERR_OTHER (\d+)", out)
    assert took is not None, out
    assert float(took[1]) < 2.0 and took[2] == took[3]  # at once, and MPICH says "Other MPI error"
    missing = run_job(client, [str(dynamic), "toomany", "1", "/nonexistent/program"], 1, tmp_path)
    text = (tmp_path / f"storm-{missing.id}.out").read_text()
    assert missing.state == "COMPLETED" and "cannot execute /nonexistent/program" in text
    view = spawns(client, job.id)
    assert (view.spawns, view.processes, view.refused, view.last_refusal) == (0, 0, 1, refusal)
    assert (
        "1 refused, the last: storm: MPI_Comm_spawn of 17" in storm_cli(cluster, "show", str(job.id)).stdout
    )
    assert refusal in Path(cluster.nms[0].log).read_text()  # and in the node manager's log


def test_cancelling_a_job_kills_its_spawned_processes(client: Client, tmp_path: Path, dynamic: Path) -> None:
    job_id = submit(client, [str(dynamic), "exchange", "2", "60"], 2, tmp_path)
    poll(lambda: len(processes(job_id, tmp_path)[1]) == 2, 30, "the children to start")
    children = list(processes(job_id, tmp_path)[1])
    assert client.cancel((job_id,)) == {str(job_id): "cancelling"}
    job = client.wait(job_id, timeout=JOB_TIMEOUT)
    assert job.state == "CANCELLED"
    assert gone(children)  # the job ended only once they had: no straggler outlives it


def test_a_failing_child_fails_its_job(client: Client, tmp_path: Path, dynamic: Path) -> None:
    job = run_job(client, [str(dynamic), "exchange", "2", "0", "single", "fail"], 2, tmp_path)
    assert (job.state, job.exit_code) == ("FAILED", 4)
    assert job.reason == "spawned process 0 of spawn 1 (from rank 0) exited with code 4 on node0"


def test_children_are_stopped_and_continued_with_their_job_under_gang(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, dynamic: Path
) -> None:
    cluster = make_cluster(policy="gang", mm_mpl=2, mm_node_timeout=5)
    with cluster.client() as client:
        job = submit(client, [str(dynamic), "exchange", "2", "6"], 2, tmp_path)
        other = submit(client, python_app("spin", "--mpi"), 2, tmp_path)
        poll(lambda: len(processes(job, tmp_path)[1]) == 2, 30, "the children to start")
        # Rows take turns once the other job runs (under load its start can take seconds: CI saw 4 s pass
        # with no switch at all).
        poll(lambda: client.job(other).state == "RUNNING", 30, "the other job to run")
        ranks, children = processes(job, tmp_path)
        root = ranks[0]
        # Pinned as ranks are (to the root's PE on node0), each leading a session (and process group) of its
        # own, as ranks do.
        for pid in children:
            assert os.sched_getaffinity(pid) == os.sched_getaffinity(root)
            assert os.getpgid(pid) == pid and os.getsid(pid) == pid and os.getsid(root) == root
        together, apart = {True: 0, False: 0}, 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            states = [stopped(pid) for pid in (root, *children)]
            if None in states:
                break
            if len(set(states)) == 1:
                together[bool(states[0])] += 1
            else:
                apart += 1  # a sample taken in the middle of a switch
            time.sleep(0.003)  # a sampling period, not a wait for a condition
        assert together[True] > 20 and together[False] > 20, (together, apart)  # both rows took turns
        assert apart < 0.2 * (together[True] + together[False]), (together, apart)
        client.cancel((other,))
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        client.wait(other, timeout=JOB_TIMEOUT)
    out = (tmp_path / f"storm-{job}.out").read_text()
    assert (ended.state, ended.exit_code) == ("COMPLETED", 0), out
    assert "spawn: OK" in out and ended.suspended_time > 0.5


def test_an_nm_restart_re_adopts_spawned_processes(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, dynamic: Path
) -> None:
    cluster = make_cluster(policy="gang", mm_mpl=2, mm_node_timeout=30)
    with cluster.client() as client:
        job = submit(client, [str(dynamic), "exchange", "2", "60"], 2, tmp_path)
        other = submit(client, python_app("spin", "--mpi"), 2, tmp_path)
        poll(lambda: len(processes(job, tmp_path)[1]) == 2, 30, "the children to start")
        children = list(processes(job, tmp_path)[1])
        poll(lambda: all(stopped(pid) for pid in children), 10, "gang scheduling to stop the children")
        cluster.kill_nm(0, signal.SIGKILL)  # while they are stopped: nobody would continue them
        cluster.revive_nm(0)
        log = Path(cluster.nms[0].log).read_text()
        assert "re-adopted 2 job(s) left by a previous storm-nm" in log
        record = json.loads((cluster.node_dir("node0") / "jobs" / str(job) / "nm.json").read_text())
        assert sorted(pid for pid, _start, _pe in record["spawns"]["children"].values()) == sorted(children)
        assert record["spawns"]["worlds"] == {"1": 0}
        # The new NM continued them, and time-slices them with the job again.
        poll(lambda: all(stopped(pid) is False for pid in children), 10, "the children to run again")
        poll(lambda: all(stopped(pid) for pid in children), 10, "the new NM to stop them with the job")
        client.cancel((job, other))
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        client.wait(other, timeout=JOB_TIMEOUT)
    assert ended.state == "CANCELLED"
    assert gone(children)  # killed by the NM that re-adopted them; no_leaks checks their shared memory


# ---------------------------------------------------------------------------------------------- names


def test_publish_and_lookup_connect_two_ranks_of_a_job(
    client: Client, tmp_path: Path, dynamic_abi: Path
) -> None:
    job = run_job(client, [str(dynamic_abi), "names", f"storm-test-{os.getpid()}"], 2, tmp_path)
    out = (tmp_path / f"storm-{job.id}.out").read_text()
    assert (job.state, job.exit_code) == ("COMPLETED", 0), out
    exchanged = "connect, send and receive through a looked-up port"
    for check in ("publish", "lookup", "a name taken is refused", "connect", exchanged, "unpublish"):
        assert f"{check}: OK" in out, out
    assert out.count("a missing name fails at once: OK") == 2
    assert "FAILED" not in out


def test_publish_and_lookup_connect_two_jobs_of_one_user(
    client: Client, tmp_path: Path, dynamic_abi: Path
) -> None:
    service = f"storm-test-jobs-{os.getpid()}"
    client_job = submit(client, [str(dynamic_abi), "client", service], 1, tmp_path)  # looks up until found
    server_job = submit(client, [str(dynamic_abi), "server", service], 1, tmp_path)
    ended = {j: client.wait(j, timeout=JOB_TIMEOUT) for j in (client_job, server_job)}
    outs = {j: (tmp_path / f"storm-{j}.out").read_text() for j in ended}
    assert all((e.state, e.exit_code) == ("COMPLETED", 0) for e in ended.values()), outs
    assert ended[client_job].nodes != ended[server_job].nodes  # one job on each node
    assert "connect, send and receive through a looked-up port: OK" in outs[client_job]
    assert "unpublish: OK" in outs[server_job]


NAME_TIMEOUT_PROGRAM = """
import pathlib, sys, time
from mpi4py import MPI
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.02)
start = time.monotonic()
try:
    MPI.Lookup_name('anything')
    print('lookup answered', flush=True)
except MPI.Exception as exc:
    print('lookup failed after', round(time.monotonic() - start, 1), 's with class', exc.Get_error_class(),
          'MPI_ERR_NAME', MPI.ERR_NAME, flush=True)
"""


def test_a_rank_waits_for_a_silent_mm_no_longer_than_the_timeout(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    from storm.nm.spawner import NAME_TIMEOUT

    cluster = make_cluster(nodes=1, mm_node_timeout=60)
    go = tmp_path / "go"
    with cluster.client() as client:
        job = submit(client, [sys.executable, "-c", NAME_TIMEOUT_PROGRAM, str(go)], 1, tmp_path)
        poll(lambda: client.job(job).state == "RUNNING", 30, "the job to run")
        assert cluster.mm is not None
        cluster.mm.signal(signal.SIGSTOP)  # the MM hears the request but never answers while stopped
        try:
            go.touch()
            out = tmp_path / f"storm-{job}.out"
            poll(lambda: "lookup" in out.read_text(), NAME_TIMEOUT + 20, "the lookup to give up")
        finally:
            cluster.mm.signal(signal.SIGCONT)
        ended = client.wait(job, timeout=JOB_TIMEOUT)
    text = out.read_text()
    failed = re.search(r"lookup failed after ([\d.]+) s with class (\d+) MPI_ERR_NAME (\d+)", text)
    assert failed is not None, text
    assert NAME_TIMEOUT - 0.5 <= float(failed[1]) < NAME_TIMEOUT + 5 and failed[2] == failed[3]
    assert ended.state == "COMPLETED"
