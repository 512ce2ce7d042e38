"""End to end: mpihook in ranks started by storm, its statistics live in the MM, its segments cleaned up."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.tools import hook_jobs
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, run_job, storm_cli

pytestmark = pytest.mark.slow
PROGRAMS = Path(__file__).parent / "programs"


def stats(client: Client, job_id: int) -> p.StatsView:
    return client.call(p.GetStats(job_id=job_id), p.StatsView)


def test_a_running_job_reports_its_communication_and_its_segments_go_with_it(
    client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    bsp = python_app("bsp", "--granularity", "2ms", "--imbalance", "2", "--slow", "odd", "--seconds", "30")
    job = client.submit(bsp, 2, cwd=str(tmp_path))
    poll(lambda: len(cluster.hook_segments(job)) == 2, 30, "one segment per node")

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
    assert cluster.hook_segments(job) == set()
    assert stats(client, job).ranks == ()


def test_a_crashed_job_leaves_no_segment(client: Client, cluster: LocalCluster, tmp_path: Path) -> None:
    ended = run_job(client, python_app("fail", "--rank", "1", "--code", "4"), 2, tmp_path)
    assert ended.state == "FAILED"
    assert cluster.hook_segments(ended.id) == set()


def test_a_program_without_mpi_runs_and_is_marked_so(
    client: Client, cluster: LocalCluster, tmp_path: Path
) -> None:
    job = client.submit(["sh", "-c", "sleep 30"], 2, cwd=str(tmp_path))
    poll(lambda: len(stats(client, job).ranks) == 2, 30, "the ranks' first report")
    assert {r.state for r in stats(client, job).ranks} == {"no-mpi"}
    client.cancel((job,))
    client.wait(job, timeout=JOB_TIMEOUT)
    assert cluster.hook_segments(job) == set()


# What each rank sees: how many ranks share its memory (MPI's own view of which ranks share a node), and
# whether mpihook is preloaded.
SHARED = (
    "import os\n"
    "from mpi4py import MPI\n"
    "world = MPI.COMM_WORLD\n"
    "shared = world.Split_type(MPI.COMM_TYPE_SHARED).Get_size()\n"
    "hooked = 'mpihook/_hook' in os.environ.get('LD_PRELOAD', '')\n"
    "os.write(1, f'rank {world.Get_rank()}: shared {shared} hook {hooked}\\n'.encode())\n"
    "if len(os.sys.argv) > 1: __import__('time').sleep(float(os.sys.argv[1]))\n"
)


def rank_lines(job_id: int, cwd: Path) -> list[str]:
    return sorted((cwd / f"storm-{job_id}.out").read_text().splitlines())


def test_ranks_on_node_managers_of_one_host_share_memory_as_under_mpiexec(
    client: Client, tmp_path: Path
) -> None:
    """A local cluster's node managers share this machine: MPI must see one node, and use shared memory
    between the ranks, not the network (MPICH's network path between processes of one host hangs programs
    that run under mpiexec; issue 12)."""
    ended = run_job(client, [sys.executable, "-c", SHARED], 2, tmp_path)
    assert ended.state == "COMPLETED" and set(ended.nodes) == {"node0", "node1"}, ended
    assert rank_lines(ended.id, tmp_path) == ["rank 0: shared 2 hook True", "rank 1: shared 2 hook True"]


def test_a_job_submitted_without_the_hook_runs_unmeasured_and_says_so(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    job = client.submit([sys.executable, "-c", SHARED, "30"], 2, cwd=str(tmp_path), hook=False)
    poll(lambda: len(stats(client, job).ranks) == 2, 30, "the ranks' first report")
    assert {(r.state, r.wait_mode) for r in stats(client, job).ranks} == {("no-hook", "poll")}
    assert all(r.pid > 0 for r in stats(client, job).ranks)
    assert cluster.hook_segments(job) == set() and not client.job(job).hook
    shown = storm_cli(cluster, "show", str(job))
    assert "MpiHook: no (submitted with --no-hook)" in shown.stdout, shown
    poll(lambda: len(rank_lines(job, tmp_path)) == 2, 30, "both ranks' line")
    assert rank_lines(job, tmp_path) == ["rank 0: shared 2 hook False", "rank 1: shared 2 hook False"]
    client.cancel((job,))
    assert client.wait(job, timeout=JOB_TIMEOUT).state == "CANCELLED"


def test_a_node_configured_without_the_hook_preloads_it_into_no_job(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    with make_cluster(nm_hook=False).client() as client:
        ended = run_job(client, [sys.executable, "-c", SHARED], 2, tmp_path)
    assert ended.state == "COMPLETED" and ended.hook  # the job asked for it; the nodes said no
    assert rank_lines(ended.id, tmp_path) == ["rank 0: shared 2 hook False", "rank 1: shared 2 hook False"]


DIST_GRAPH = (
    "from mpi4py import MPI\n"
    "world = MPI.COMM_WORLD\n"
    "rank, size = world.Get_rank(), world.Get_size()\n"
    "for weights in (MPI.UNWEIGHTED, [1, 2, 3]):\n"
    "    topo = world.Create_dist_graph([rank], [3], [(rank - 1) % size, rank, (rank + 1) % size], weights)\n"
    "    counts = topo.Get_dist_neighbors_count()\n"
    "    topo.Free()\n"
    "print(f'rank {rank}: neighbours {counts}', flush=True)\n"
)


def test_programs_that_hang_on_mpichs_network_path_within_a_host_run_as_under_mpiexec(
    client: Client, tmp_path: Path
) -> None:
    """MPI_Dist_graph_create (mpi4py's testDistgraphcomm) and two threads in MPI at once (the nxtval-threads
    demo) hang in MPICH 5.0.2 on its UCX path between processes of one host (plain mpiexec with
    MPIR_CVAR_NOLOCAL=1 hangs too). Both ran that way under storm while each node manager was a node of its
    own; the ranks of a local cluster now share memory, as under mpiexec."""
    threads = tmp_path / "threads"
    hook_jobs.mpicc(PROGRAMS / "threads.c", threads, "-pthread")
    out = tmp_path / "out-%j-%t"
    for argv, want in (
        (
            [sys.executable, "-c", DIST_GRAPH],
            ["rank 0: neighbours (3, 3, True)", "rank 1: neighbours (3, 3, True)"],
        ),
        ([str(threads)], ["threads: 0 of 400 numbers handed out wrongly"]),
    ):
        ended = run_job(client, argv, 2, tmp_path, time_limit=60.0, output=str(out))
        assert ended.state == "COMPLETED" and set(ended.nodes) == {"node0", "node1"}, ended
        lines = [line for r in (0, 1) for line in (tmp_path / f"out-{ended.id}-{r}").read_text().splitlines()]
        assert sorted(lines) == want, lines


DEADLOCK = (
    "from mpi4py import MPI\n"
    "world = MPI.COMM_WORLD\n"
    "world.Recv([bytearray(8), MPI.BYTE], source=1 - world.Get_rank())  # both receive first: a deadlock\n"
)


def test_the_watchdog_shows_a_deadlocked_job_with_the_call_it_is_in(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(mm_hang_warning=2.0)
    with cluster.client() as client:
        job = client.submit([sys.executable, "-c", DEADLOCK], 2, cwd=str(tmp_path))
        wanted = "possibly deadlocked: every rank in a blocking MPI call for over"

        def warned() -> bool:
            (info,) = client.jobs((job,))
            return info.warning.startswith(wanted)

        poll(warned, 30, "the watchdog's warning")
        (info,) = client.jobs((job,))
        assert info.warning.endswith(": MPI_Recv (2 of 2)"), info.warning
        show = storm_cli(cluster, "show", str(job)).stdout
        assert f"Warning: {info.warning[:40]}" in show, show
        out = storm_cli(cluster, "stats", str(job)).stdout.splitlines()
        assert out[1].split()[-2:] == ["IN", "CALL"] and all("MPI_Recv" in line for line in out[2:4]), out
        assert out[-1].startswith(f"WARNING: {wanted}"), out
        client.cancel((job,))
        assert client.wait(job, timeout=JOB_TIMEOUT).state == "CANCELLED"


CVARS = "import os; print(os.environ.get('MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM', '-'), flush=True)"


@pytest.mark.parametrize("policy", ["sb", "gang"])
def test_ranks_get_mpichs_yielding_collectives_where_they_may_spin_block(
    policy: str, make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """Under sb and FCS a rank may be told to spin-block: its collectives then use MPICH's algorithms that
    can (mpihook.SPIN_BLOCK_ENVIRONMENT), unless the job chose its own; elsewhere MPICH's defaults stay."""
    cluster = make_cluster(policy=policy, mm_mpl=2)
    out = tmp_path / "out-%j-%t"
    with cluster.client() as client:
        default = run_job(client, [sys.executable, "-c", CVARS], 1, tmp_path, output=str(out))
        env = {**os.environ, "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM": "auto"}
        own = run_job(client, [sys.executable, "-c", CVARS], 1, tmp_path, output=str(out), env=env)
    assert (tmp_path / f"out-{default.id}-0").read_text() == ("mpir\n" if policy == "sb" else "-\n")
    assert (tmp_path / f"out-{own.id}-0").read_text() == "auto\n"
