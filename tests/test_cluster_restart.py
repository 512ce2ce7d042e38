"""End to end: SIGKILL (or SIGTERM) of storm-mm or of a storm-nm in the middle of jobs, then a restart.

Nothing is lost and nothing is killed by the restart itself: a restarted NM re-adopts its jobs (the same
processes keep running), jobs whose ranks end while a daemon is down are recorded as they ended, and under
gang scheduling a rank stopped at the moment of the restart runs again.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app
from tests.test_cluster_gang import stopped

pytestmark = pytest.mark.slow

Ranks = dict[tuple[int, int], tuple[int, float]]


def gated(go: Path, message: str) -> list[str]:
    return ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.02; done; echo "{message} $STORM_RANK"']


def gated_mpi(go: Path) -> list[str]:
    """An MPI job that wires up, waits for ``go``, passes one more barrier and finalizes (a PMI barrier
    through every node's NM when the job spans nodes)."""
    code = (
        "import pathlib, sys, time\n"
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "comm.Barrier()\n"
        "print('ready', comm.Get_rank(), flush=True)\n"
        "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.02)\n"
        "comm.Barrier()\n"
        "print('done', comm.Get_rank(), flush=True)\n"
    )
    return [sys.executable, "-c", code, str(go)]


def ranks_on(node: str) -> Ranks:
    """(job, rank) -> (pid, start time) of every rank on ``node`` that this test's clusters run.

    Orphaned job shells are re-parented to pytest (a subreaper), so every rank is a descendant; a rank leads
    its own process group (what its children, such as a shell loop's sleep, do not).
    """
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            env = proc.environ()
            if env.get("STORM_NODE") == node and "STORM_RANK" in env and os.getpgid(proc.pid) == proc.pid:
                found[(int(env["STORM_JOB_ID"]), int(env["STORM_RANK"]))] = (proc.pid, proc.create_time())
        except (psutil.Error, OSError):
            continue
    return found


def same_processes(ranks: Ranks) -> bool:
    """Every one of ``ranks`` still runs as the very process it was (a reused pid has another start time)."""
    for pid, created in ranks.values():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != created or proc.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
    return True


def test_mm_sigkill_restart_keeps_every_job(make_cluster: object, tmp_path: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=2)  # type: ignore[operator]
    go_during, go_after = tmp_path / "go-during", tmp_path / "go-after"
    with cluster.client() as client:
        done = client.submit(["true"], 1, cwd=str(tmp_path))
        assert client.wait(done, timeout=JOB_TIMEOUT).state == "COMPLETED"
        ends_while_down = client.submit(gated(go_during, "during"), 2, cwd=str(tmp_path))
        runs_through = client.submit(gated(go_after, "after"), 2, cwd=str(tmp_path))
        poll(lambda: client.job(runs_through).state == "RUNNING", 30, "both jobs to run")
        queued = client.submit(python_app("hello"), 4, cwd=str(tmp_path))
        assert client.job(queued).state == "PENDING"

    cluster.mm.signal(9)  # type: ignore[union-attr]
    poll(lambda: not cluster.mm.alive(), 10, "storm-mm to die")  # type: ignore[union-attr]
    # One job's ranks end while there is no MM to hear of it.
    go_during.touch()
    out = tmp_path / f"storm-{ends_while_down}.out"
    poll(lambda: out.exists() and out.read_text().count("during") == 2, 30, "the ranks to finish")

    cluster.restart_mm()
    cluster.wait_nodes_up(cluster.node_names())
    with cluster.client() as client:
        assert client.wait(ends_while_down, timeout=JOB_TIMEOUT).state == "COMPLETED"
        assert client.job(runs_through).state == "RUNNING"
        assert client.job(queued).state == "PENDING"
        go_after.touch()
        assert client.wait(runs_through, timeout=JOB_TIMEOUT).state == "COMPLETED"
        hello = client.wait(queued, timeout=JOB_TIMEOUT)
        assert (hello.state, hello.exit_code) == ("COMPLETED", 0)
        assert "hello: OK" in (tmp_path / f"storm-{queued}.out").read_text()
        every = {j.id: j.state for j in client.jobs(everything=True)}
    assert every == dict.fromkeys((done, ends_while_down, runs_through, queued), "COMPLETED")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_nm_restart_keeps_every_job_running(make_cluster: object, tmp_path: Path, sig: int) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=5, mm_node_timeout=30)  # type: ignore[operator]
    go_mpi, go_fail = tmp_path / "go-mpi", tmp_path / "go-fail"
    cwd = str(tmp_path)
    with cluster.client() as client:
        # Placement is deterministic: the MPI job fills node0 and takes node1:0, the rest go to node1.
        mpi = client.submit(gated_mpi(go_mpi), 6, cwd=cwd)
        bsp = client.submit(python_app("bsp", "--granularity", "10ms", "--seconds", "10"), 2, cwd=cwd)
        fails = client.submit(
            ["sh", "-c", f'while [ ! -e "{go_fail}" ]; do sleep 0.02; done; exit 3'], 1, cwd=cwd
        )
        jobs = (mpi, bsp, fails)
        poll(lambda: all(client.job(j).state == "RUNNING" for j in jobs), 30, "the jobs to run")
        assert [client.job(j).nodes for j in jobs] == [("node0", "node1"), ("node1",), ("node1",)]
        wanted = {(mpi, 5), (bsp, 0), (bsp, 1), (fails, 0)}
        poll(lambda: set(ranks_on("node1")) == wanted, 30, "node1's ranks to start")
        before = ranks_on("node1")
        out = tmp_path / f"storm-{mpi}.out"
        poll(lambda: out.exists() and out.read_text().count("ready") == 6, 30, "the MPI job to wire up")

        cluster.kill_nm(1, sig)
        assert same_processes(before)  # nothing of the jobs went with their NM
        # While node1 has no NM: the MPI job's ranks pass their barrier and finalize (a PMI barrier that
        # needs node1's NM), one job's rank fails, and a new job is placed on node1's free PE.
        go_mpi.touch()
        go_fail.touch()
        late = client.submit(["sh", "-c", "echo late $STORM_NODE"], 1, cwd=cwd)
        poll(lambda: out.exists() and out.read_text().count("done") == 6, 30, "every MPI rank to finalize")
        poll(lambda: stopped(before[(fails, 0)][0]) is None, 10, "the failing rank to exit")
        assert client.job(mpi).state == "RUNNING"  # node1's part has not been reported yet

        cluster.revive_nm(1)
        log = Path(cluster.nms[1].log).read_text()
        assert "re-adopted 3 job(s) left by a previous storm-nm" in log
        assert same_processes({k: v for k, v in before.items() if k[0] == bsp})
        ended = {j: client.wait(j, timeout=JOB_TIMEOUT) for j in (mpi, fails, late, bsp)}
    assert (ended[mpi].state, ended[mpi].exit_code) == ("COMPLETED", 0)
    assert (ended[fails].state, ended[fails].exit_code) == ("FAILED", 3)
    assert ended[fails].reason == "rank 0 exited with code 3 on node1"
    assert (ended[late].state, ended[late].nodes) == ("COMPLETED", ("node1",))
    assert "late node1" in (tmp_path / f"storm-{late}.out").read_text()
    assert (ended[bsp].state, ended[bsp].exit_code) == ("COMPLETED", 0)
    assert "bsp: OK" in (tmp_path / f"storm-{bsp}.out").read_text()  # every message checked, across it all
    # The new NM reported and forgot every job (no_leaks then checks processes and shared memory).
    poll(lambda: not any((cluster.node_dir("node1") / "jobs").iterdir()), 10, "node1's job directories to go")


def test_nm_sigkill_under_gang_scheduling_leaves_no_rank_stopped(
    make_cluster: object, tmp_path: Path
) -> None:
    """A rank time slicing stopped when its NM died is continued by the next NM, even once its job runs
    alone (no heartbeat would ever continue it); a job the MM ended meanwhile is stopped on that node."""
    cluster: LocalCluster = make_cluster(  # type: ignore[operator]
        policy="gang", mm_mpl=2, mm_node_timeout=30, mm_kill_timeout=1.0
    )
    with cluster.client() as client:
        jobs = [
            client.submit(python_app("spin", "--mpi", "--seconds", "8"), 2, cwd=str(tmp_path))
            for _ in range(2)
        ]
        poll(lambda: {job for job, _ in ranks_on("node1")} == set(jobs), 30, "both jobs' ranks on node1")
        before = ranks_on("node1")
        pid_of = {job: pid for (job, _), (pid, _) in before.items()}
        poll(lambda: any(stopped(pid) for pid in pid_of.values()), 10, "gang scheduling to stop a rank")
        cluster.kill_nm(1, signal.SIGKILL)
        frozen = [job for job, pid in pid_of.items() if stopped(pid)]  # one row is always stopped
        assert frozen, "no rank of node1 was stopped when its NM died"
        keep = frozen[0]
        other = next(job for job in jobs if job != keep)
        # The other job ends while node1 has no NM (written off there after kill_timeout): from now on
        # heartbeats only ever name the row of `keep`, so they would never continue its rank on node1.
        client.cancel((other,))
        assert client.wait(other, timeout=JOB_TIMEOUT).state == "CANCELLED"
        assert stopped(pid_of[keep]) is True

        cluster.revive_nm(1)
        poll(lambda: stopped(pid_of[keep]) is False, 5, "the stopped rank to run again")
        poll(lambda: stopped(pid_of[other]) is None, 10, "the cancelled job's rank on node1 to be stopped")
        assert same_processes({k: v for k, v in before.items() if k[0] == keep})
        ended = client.wait(keep, timeout=JOB_TIMEOUT)
    assert (ended.state, ended.exit_code) == ("COMPLETED", 0)


def test_mm_sigkill_between_two_nodes_final_reports(make_cluster: object, tmp_path: Path) -> None:
    """One node finished its part of a job (reported, acknowledged, forgotten) before the MM died: the
    restarted MM still waits for the other node, and records the job as its last rank ends. A job whose rank
    fails while the MM is down is recorded FAILED with that rank's exit code."""
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=2)  # type: ignore[operator]
    # Ranks 0 and 1 (node0) end with 0 on go0, rank 2 (node1) with 5 on go2; the other job's rank with 4.
    wide = 'while [ ! -e "go$STORM_RANK" ]; do sleep 0.02; done; exit $((STORM_RANK / 2 * 5))'
    alone = 'while [ ! -e "go-alone" ]; do sleep 0.02; done; exit 4'
    with cluster.client() as client:
        job = client.submit(["sh", "-c", wide], 3, cwd=str(tmp_path))
        other = client.submit(["sh", "-c", alone], 1, cwd=str(tmp_path))
        poll(lambda: client.job(other).state == client.job(job).state == "RUNNING", 30, "the jobs to run")
        assert (client.job(job).nodes, client.job(other).nodes) == (("node0", "node1"), ("node1",))
        for rank in (0, 1):
            (tmp_path / f"go{rank}").touch()
        node0_dir = cluster.node_dir("node0") / "jobs" / str(job)
        poll(lambda: not node0_dir.exists(), 10, "node0 to report its part and forget the job")
        assert client.job(job).state == "RUNNING"

    cluster.mm.signal(signal.SIGKILL)  # type: ignore[union-attr]
    poll(lambda: not cluster.mm.alive(), 10, "storm-mm to die")  # type: ignore[union-attr]
    (tmp_path / "go-alone").touch()
    exits = cluster.node_dir("node1") / "jobs" / str(other) / "shell" / "exits.msg"
    poll(exits.exists, 10, "the rank to fail while there is no MM")

    cluster.restart_mm()
    cluster.wait_nodes_up(cluster.node_names())  # node0 registers without the job: it is not lost
    with cluster.client() as client:
        assert client.job(job).state == "RUNNING"
        (tmp_path / "go2").touch()
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        failed = client.wait(other, timeout=JOB_TIMEOUT)
    assert (ended.state, ended.exit_code, ended.reason) == ("FAILED", 5, "rank 2 exited with code 5 on node1")
    assert (failed.state, failed.exit_code) == ("FAILED", 4)
    assert failed.reason == "rank 0 exited with code 4 on node1"


def test_mm_sigkill_while_a_job_starts_sends_its_lost_launch_again(
    make_cluster: object, tmp_path: Path
) -> None:
    """node1's NM is down when a two-node MPI job is placed (its launch goes nowhere) and storm-mm is
    SIGKILLed while the job is starting: the restarted MM sends node1 the same launch (the job's PMI name
    kept in the store), rather than ending the job NODE_FAIL, and the job wires up across both nodes."""
    cluster: LocalCluster = make_cluster(nodes=2, pes_per_node=1, mm_node_timeout=30)  # type: ignore[operator]
    cluster.kill_nm(1)  # node1 stays UP for the MM until the timeout
    with cluster.client() as client:
        job = client.submit(python_app("hello"), 2, cwd=str(tmp_path))
        poll(lambda: set(ranks_on("node0")) == {(job, 0)}, 30, "node0's rank to start")
        assert client.job(job).state == "STARTING"  # waiting for node1's launch report
    cluster.restart_mm()
    cluster.revive_nm(1)  # registers without the job
    with cluster.client() as client:
        ended = client.wait(job, timeout=JOB_TIMEOUT)
    assert (ended.state, ended.exit_code, ended.nodes) == ("COMPLETED", 0, ("node0", "node1"))
    assert "hello: OK" in (tmp_path / f"storm-{job}.out").read_text()
