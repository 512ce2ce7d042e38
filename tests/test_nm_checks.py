"""What a node manager refuses from a job shell (nm/checks.py): wrong ranks, foreign pids, replays that
contradict, and PMI barriers out of order. Pure: processes' parents are passed in as a plain mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.nm.checks import foreign_pids, shell_problem
from storm.nm.jobdir import JobDir
from storm.nm.local_jobs import LocalJob

SHELL = 5000
# Each live process's parent: 5001 and 5002 are the shell's children; init, 700 and 5003 are not.
PARENTS = {1: 0, 700: 1, SHELL: 1, 5001: SHELL, 5002: SHELL, 5003: 700}


def parent(pid: int) -> int | None:
    return PARENTS.get(pid)


def local_job(tmp_path: Path) -> LocalJob:
    """Job 7 with ranks 2 and 3 on this node (node index 1 of two)."""
    launch = p.LaunchJob(
        job_id=7, name="j", kvsname="kvs", size=4, row=0, node_index=1, ranks_per_node=(2, 2),
        slots=(p.RankSlot(rank=2, pe=0), p.RankSlot(rank=3, pe=1)), argv=("true",), cwd="/", env={},
        uid=0, gid=0, user="root", output="", error="",
    )  # fmt: skip
    return LocalJob(launch=launch, dir=JobDir.of(tmp_path, 7), shell_pid=SHELL)


def problem(job: LocalJob, msg: p.Message, next_barrier: int | None = 0) -> str | None:
    return shell_problem(job, msg, "n1", next_barrier, parent)


def test_the_shell_s_own_reports_are_accepted(tmp_path: Path) -> None:
    job = local_job(tmp_path)
    exits = (p.RankExit(rank=2, exit_code=0), p.RankExit(rank=3, signal=9))
    for msg in (
        p.ShellHello(job_id=7, pid=SHELL),
        p.RanksStarted(job_id=7, pids={"2": 5001, "3": 5002}),
        p.RanksStarted(job_id=7, pids={"2": 5001, "3": 4242}),  # 4242 has already exited: harmless
        p.RankExited(job_id=7, exit=exits[0]),
        p.RankAborted(job_id=7, exit=p.RankExit(rank=3, exit_code=1, error="called MPI_Abort")),
        p.PmiBarrierIn(job_id=7, node="n1", seq=0, kvs={"k": "v"}),
        p.ShellDone(job_id=7, exits=exits),
        p.ShellDone(job_id=7, exits=()),  # no rank started (the output file could not be opened)
    ):
        assert problem(job, msg) is None, msg


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        (p.ShellHello(job_id=7, pid=4), "hello from pid 4, but the job shell is pid 5000"),
        (p.RanksStarted(job_id=7, pids={"0": 5001}), "rank(s) [0] are not this node's ranks of the job"),
        (p.RanksStarted(job_id=7, pids={"2": 5001, "3": 5001}), "a process id given twice"),
        (p.RanksStarted(job_id=7, pids={"2": SHELL}), "or the shell's own"),
        # The NM would signal these process groups as root: init's, and another process's.
        (p.RanksStarted(job_id=7, pids={"2": 1}), "process(es) [1] are not the job shell's children"),
        (p.RanksStarted(job_id=7, pids={"2": 5001, "3": 5003}), "process(es) [5003] are not the job shell's"),
        (p.RankExited(job_id=7, exit=p.RankExit(rank=9, exit_code=0)), "rank 9 is not one of this node's"),
        (p.RankAborted(job_id=7, exit=p.RankExit(rank=0, exit_code=1)), "rank 0 is not one of this node's"),
        (p.ShellDone(job_id=7, exits=(p.RankExit(rank=2), p.RankExit(rank=2))), "once each"),
        (p.ShellDone(job_id=7, exits=(p.RankExit(rank=5, exit_code=0),)), "exits for ranks [5]"),
        (p.PmiBarrierIn(job_id=7, node="n2", seq=0, kvs={}), "a barrier for node 'n2' sent to node 'n1'"),
        (p.PmiBarrierIn(job_id=7, node="n1", seq=1, kvs={}), "barrier 1 out of order: the next one is 0"),
        (p.KillJob(job_id=7, reason="x"), "kill_job is not a job shell message"),
        (p.Ack(job_id=7, what="shell_done"), "ack is not a job shell message"),
    ],
)
def test_wrong_reports_are_refused(tmp_path: Path, msg: p.Message, expected: str) -> None:
    text = problem(local_job(tmp_path), msg)
    assert text is not None and expected in text


def test_a_repeated_exit_is_accepted_but_a_contradicting_one_is_not(tmp_path: Path) -> None:
    job = local_job(tmp_path)
    job.exits[2] = p.RankExit(rank=2, exit_code=0)
    assert problem(job, p.RankExited(job_id=7, exit=p.RankExit(rank=2, exit_code=0))) is None
    text = problem(job, p.RankExited(job_id=7, exit=p.RankExit(rank=2, signal=9)))
    assert text == "rank 2 already ended otherwise (rank 2 exited with code 0)"


def test_barriers_come_in_order_one_at_a_time(tmp_path: Path) -> None:
    job = local_job(tmp_path)

    def barrier(seq: int) -> p.PmiBarrierIn:
        return p.PmiBarrierIn(job_id=7, node="n1", seq=seq, kvs={})

    # Barrier 3 is the next: 2 (just passed; its answer may have been lost) may come again, nothing else.
    assert [problem(job, barrier(s), next_barrier=3) is None for s in range(6)] == [
        False, False, True, True, False, False,
    ]  # fmt: skip
    job.barrier = barrier(3)  # pending at the MM: only that one, again, is taken
    assert problem(job, barrier(3), next_barrier=3) is None
    assert problem(job, barrier(4), next_barrier=3) == "barrier 4 while barrier 3 is still pending"
    assert problem(job, barrier(2), next_barrier=3) == "barrier 2 while barrier 3 is still pending"
    # A job re-adopted after an NM restart: the order is not known until its next barrier passes.
    job.barrier = None
    assert problem(job, barrier(17), next_barrier=None) is None


def test_foreign_pids_are_live_processes_the_shell_did_not_start() -> None:
    assert foreign_pids({"0": 1, "1": 5001, "2": 700, "3": 4242}, SHELL, parent) == [1, 700]  # 4242: gone
    assert foreign_pids({"0": 5001}, 999_999, parent) == [5001]  # another shell's child
