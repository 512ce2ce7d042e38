"""The job life cycle: allowed transitions, time stamps, outcomes and output file names."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from storm.mm.jobs import (
    WAIT_EXIT_CODES,
    Job,
    JobSpec,
    TransitionError,
    advance,
    outcome,
    requeue,
)
from storm.mm.protocol import JOB_STATES, JobInfo, RankExit
from storm.mm.slurm_style import expand_path
from storm.mm.states import TERMINAL_STATES as TERMINAL
from storm.mm.states import JobState

S = JobState
# Written out by hand (not derived from the module) so that a change to the graph fails here.
ALLOWED = {
    (S.PENDING, S.STARTING),
    (S.PENDING, S.CANCELLED),
    *((S.STARTING, s) for s in (S.RUNNING, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.NODE_FAIL)),
    *((S.RUNNING, s) for s in (S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.NODE_FAIL)),
}
ENDS = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def spec(**changes: object) -> JobSpec:
    values: dict[str, object] = {
        "name": "sim", "uid": 1000, "gid": 100, "user": "alice", "ranks": 4, "argv": ("/bin/sim", "-v"),
        "cwd": "/home/alice", "env": {"PATH": "/bin"}, "time_limit": 600.0,
        "output": "/out/%x-%j.%t.txt", "error": "",
    }  # fmt: skip
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


def job(state: JobState = S.PENDING, **changes: object) -> Job:
    return Job(id=42, spec=spec(), state=state, submit_time=10.0, **changes)  # type: ignore[arg-type]


def test_job_states_match_the_protocol() -> None:
    assert tuple(s.value for s in JobState) == JOB_STATES
    assert {s.value for s in TERMINAL} == set(ENDS)


@pytest.mark.parametrize(("old", "new"), list(itertools.product(JobState, JobState)))
def test_transition_graph(old: JobState, new: JobState) -> None:
    before = job(old)
    if (old, new) in ALLOWED:
        after = advance(before, new, 50.0)
        assert after.state is new
        assert before.state is old  # the record is immutable: a new one is returned
        assert after.id == before.id and after.spec == before.spec
    else:
        with pytest.raises(TransitionError, match=f"job 42: {old} -> {new} is not allowed"):
            advance(before, new, 50.0)


def test_time_stamps() -> None:
    starting = advance(job(), S.STARTING, 20.0)
    assert (starting.start_time, starting.end_time) == (20.0, None)
    running = advance(starting, S.RUNNING, 25.0)
    assert (running.start_time, running.end_time) == (20.0, None)  # RUNNING keeps the start time
    done = advance(running, S.COMPLETED, 90.0, exit_code=0)
    assert (done.start_time, done.end_time, done.exit_code) == (20.0, 90.0, 0)
    cancelled = advance(job(), S.CANCELLED, 30.0, reason="cancelled by bob")
    assert (cancelled.start_time, cancelled.end_time, cancelled.reason) == (None, 30.0, "cancelled by bob")
    # Explicit values win over the stamps.
    assert advance(job(), S.STARTING, 20.0, start_time=5.0).start_time == 5.0
    assert advance(running, S.FAILED, 90.0, end_time=80.0).end_time == 80.0


def test_advance_applies_other_changes() -> None:
    placed = advance(job(), S.STARTING, 20.0, placement=(("n1", 0), ("n2", 3)), row=1, reason="")
    assert placed.placement == (("n1", 0), ("n2", 3)) and placed.row == 1


def test_terminal_and_active() -> None:
    assert [s.value for s in JobState if s.terminal] == list(ENDS)
    assert [s.value for s in JobState if s.active] == ["STARTING", "RUNNING"]
    assert not S.PENDING.terminal and not S.PENDING.active
    assert all(not (s.terminal and s.active) for s in JobState)


def test_wait_exit_codes_are_distinct_and_not_for_completed() -> None:
    assert len(set(WAIT_EXIT_CODES.values())) == len(WAIT_EXIT_CODES)
    assert S.COMPLETED not in WAIT_EXIT_CODES and S.FAILED not in WAIT_EXIT_CODES


# ---------------------------------------------------------------------------------------------- outcome


def test_outcome_all_zero_is_completed() -> None:
    exits = [RankExit(rank=r, exit_code=0) for r in range(4)]
    assert outcome(exits) == (S.COMPLETED, 0, "")
    assert outcome([]) == (S.COMPLETED, 0, "")


def test_outcome_first_failure_wins() -> None:
    exits = [
        RankExit(rank=0, exit_code=0),
        RankExit(rank=2, signal=11),
        RankExit(rank=1, exit_code=3),
    ]
    assert outcome(exits) == (S.FAILED, 139, "rank 2 killed by signal 11")
    assert outcome(list(reversed(exits))) == (S.FAILED, 3, "rank 1 exited with code 3")


def test_outcome_counts_errors_and_ranks_that_never_started() -> None:
    assert outcome([RankExit(rank=0, exit_code=0, error="no MPI_Finalize")]) == (
        S.FAILED,
        1,
        "rank 0 exited with code 0: no MPI_Finalize",
    )
    assert outcome([RankExit(rank=0, exit_code=0), RankExit(rank=1, error="ENOENT")]) == (
        S.FAILED,
        127,
        "rank 1 did not start: ENOENT",
    )


# ---------------------------------------------------------------------------------------------- paths


def expand(pattern: str, rank: int | None = None, node: str | None = None) -> str:
    return expand_path(pattern, job_id=7, user="bob", name="run", rank=rank, node=node)


@pytest.mark.parametrize(
    ("pattern", "rank", "node", "expected"),
    [
        ("out-%j.txt", None, None, "out-7.txt"),
        ("%u/%x/%j", None, None, "bob/run/7"),
        ("r%t-%N", 3, "n12", "r3-n12"),
        ("r%t-n%N", None, None, "r%t-n%N"),
        ("r%t-n%N", 0, None, "r0-n%N"),
        ("r%t-n%N", None, "n1", "r%t-nn1"),
        ("100%%", None, None, "100%"),
        ("%%j", None, None, "%j"),
        ("%%%j", None, None, "%7"),
        ("%q%J%", None, None, "%q%J%"),
        ("%", None, None, "%"),
        ("", 1, "n", ""),
        ("plain", 1, "n", "plain"),
        ("%j%j", None, None, "77"),
    ],
)
def test_expand_path(pattern: str, rank: int | None, node: str | None, expected: str) -> None:
    assert expand(pattern, rank, node) == expected


def test_expand_path_substitutes_values_literally() -> None:
    # A value that itself contains % sequences is not expanded again.
    assert expand_path("%x-%j", job_id=1, user="u", name="a%jb") == "a%jb-1"


# ---------------------------------------------------------------------------------------------- info


def test_nodes_in_rank_order_without_repeats() -> None:
    j = job(S.RUNNING, placement=(("n2", 0), ("n2", 1), ("n10", 0), ("n1", 0)))
    assert j.nodes == ("n2", "n10", "n1")
    assert job().nodes == ()


def test_info() -> None:
    j = job(
        S.FAILED,
        start_time=11.0,
        end_time=20.5,
        exit_code=137,
        reason="rank 0 killed by signal 9",
        placement=(("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)),
        row=0,
    )
    info = j.info()
    assert info == JobInfo(
        id=42, name="sim", user="alice", uid=1000, state="FAILED", ranks=4, nodes=("n1", "n2"),
        submit_time=10.0, start_time=11.0, end_time=20.5, exit_code=137, reason="rank 0 killed by signal 9",
        time_limit=600.0, argv=("/bin/sim", "-v"), cwd="/home/alice", output="/out/sim-42.%t.txt", error="",
        qos="normal",
    )  # fmt: skip


def test_info_kept_with_the_record_follows_every_change() -> None:
    """A record keeps what clients saw of it (the MM lists a queued job again and again), but never hands it
    out for other arguments or once the job has moved on."""
    queued = job()
    first = queued.info(reason="Resources")
    assert queued.info(reason="Resources") is first  # kept
    assert queued.info(reason="Priority").reason == "Priority"  # other arguments: built anew
    assert queued.info(reason="Resources").reason == "Resources"
    started = advance(queued, S.STARTING, 12.0, placement=(("n1", 0),), row=0)
    info = started.info(suspended_time=0.0)
    assert (info.state, info.start_time, info.nodes, info.reason) == ("STARTING", 12.0, ("n1",), "")
    ended = advance(started, S.COMPLETED, 13.0, exit_code=0)
    assert (ended.info().state, ended.info().end_time) == ("COMPLETED", 13.0)
    assert ended.info() == dataclasses.replace(ended).info()  # the same as a record never listed


def test_a_moldable_jobs_info_gives_its_range_and_the_size_it_got() -> None:
    asked = Job(
        id=7, spec=spec(ranks=2, max_ranks=8, qos="high", priority=10), state=S.PENDING, submit_time=1.0
    )
    waiting = asked.info()
    assert (waiting.ranks, waiting.min_ranks, waiting.max_ranks) == (2, 2, 8)
    assert (waiting.qos, waiting.priority, waiting.suspended_by) == ("high", 10, None)
    placed = advance(asked, S.STARTING, 2.0, placement=tuple(("n1", pe) for pe in range(5)), row=0)
    assert (placed.ranks, placed.info().ranks, placed.info().min_ranks, placed.info().max_ranks) == (
        5,
        5,
        2,
        8,
    )
    stopped = dataclasses.replace(advance(placed, S.RUNNING, 3.0), suspended_by=9, suspended_at=4.0)
    assert stopped.info().suspended_by == 9 and stopped.info().state == "RUNNING"
    # A range of one size is a fixed size.
    assert not spec(ranks=4, max_ranks=4).moldable and job().info().max_ranks == 0


def test_a_requeued_job_is_no_longer_suspended() -> None:
    placed = dataclasses.replace(
        job(S.RUNNING, placement=(("n1", 0),), row=0), suspended_by=3, suspended_at=5.0, resumed_at=4.0
    )
    failing = dataclasses.replace(placed, spec=spec(requeue=True), ending=S.NODE_FAIL, reason="node n1 DOWN")
    again = requeue(failing, "requeued 1/5")
    assert (again.suspended_by, again.suspended_at, again.resumed_at) == (None, None, None)


def test_info_expands_the_error_path_too() -> None:
    j = Job(id=5, spec=spec(output="", error="%u.err"), state=S.PENDING, submit_time=0.0)
    info = j.info()
    assert (info.output, info.error, info.state, info.nodes) == ("", "alice.err", "PENDING", ())
