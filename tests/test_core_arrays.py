"""Job arrays and dependencies in storm-mm's core (mm/holds.py through mm/core.py), driven without sockets:
tasks submitted in one write, the %N limit, Slurm's dependency kinds, DependencyNeverSatisfied, cancels of
an array or a task, requeues, and a restarted MM that judges everything as before."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.core import Rejected
from storm.mm.memory_store import MemoryStore
from storm.mm.protocol import JobLaunched, RankExit
from storm.mm.store import Store
from tests import test_core
from tests.test_core import T0, Core, S, done, make, reg, spec, state, status, take

# Each scenario on a real SQLite store and on the in-memory one, which must decide alike: test_core's fixture.
store = test_core.store


def submit(
    ctl: Core, ranks: int = 1, now: float = T0, *, array: str = "", dependency: str = "", **kw: object
) -> p.JobSubmitted:
    """Submit as alice; Rejected as the client would hear it."""
    base = spec(ranks)
    msg = p.SubmitJob(
        ranks=ranks, argv=base.argv, cwd=base.cwd, env=base.env, output="/home/alice/o-%A_%a-%j",
        array=array, dependency=dependency, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    reply = ctl.ask(msg, now)
    if isinstance(reply, p.Error):
        raise Rejected(reply.code, reply.text)
    assert isinstance(reply, p.JobSubmitted)
    return reply


def one(ctl: Core, now: float = T0, **kw: object) -> int:
    return submit(ctl, now=now, **kw).job_id  # type: ignore[arg-type]


def start_all(ctl: Core, now: float) -> list[int]:
    """Every launch sent since the last take is reported started; the jobs, in order of id."""
    started = sorted({m.job_id for _n, m in take(ctl) if isinstance(m, p.LaunchJob)})
    for job_id in started:
        for node in ctl.runs.active[job_id].nodes:
            ctl.job_launched(JobLaunched(job_id=job_id, node=node, pids={"0": 1}), now)
    return started


def finish(ctl: Core, job_id: int, now: float, code: int = 0) -> None:
    for node in ctl.runs.active[job_id].nodes:
        done(ctl, job_id, node, now, RankExit(rank=0, exit_code=code))


def reason(ctl: Core, job_id: int) -> str:
    (info,) = ctl.job_infos((job_id,))
    return info.reason


def cluster(store: Store, pes: int = 4, **config: object) -> Core:
    ctl = make(store, **config)  # type: ignore[arg-type]
    reg(ctl, "n1", pes=pes)
    return ctl


# --------------------------------------------------------------------------------------------------- arrays


def test_an_array_is_one_request_and_one_commit_and_each_task_is_a_job(store: Store) -> None:
    ctl = cluster(store)
    commits = store.commits
    reply = submit(ctl, array="0-15:4,20")
    assert store.commits - commits == 2  # the submission, then the pass that starts four tasks
    ids = reply.job_ids
    assert reply.job_id == ids[0] and len(ids) == 5 and list(ids) == list(range(ids[0], ids[0] + 5))
    tasks = store.array_tasks(ids[0])
    assert [(j.id, j.array_id, j.array_task) for j in tasks] == [
        (job_id, ids[0], task) for job_id, task in zip(ids, (0, 4, 8, 12, 20), strict=True)
    ]
    sent = [m.job_id for _n, m in take(ctl) if isinstance(m, p.LaunchJob)]
    assert sent == list(ids[:4])  # 4 PEs
    infos = {i.id: i for i in ctl.job_infos(ids)}
    assert infos[ids[2]].output == f"/home/alice/o-{ids[0]}_8-{ids[2]}"
    assert (infos[ids[2]].array_id, infos[ids[2]].array_task, infos[ids[2]].array) == (ids[0], 8, "0-12:4,20")


def test_each_task_has_its_ids_in_its_environment_and_output_names(store: Store) -> None:
    ctl = cluster(store, pes=1)
    ids = submit(ctl, array="3,5,9").job_ids
    for task, job_id in zip((3, 5, 9), ids, strict=True):
        (launch,) = [m for _n, m in take(ctl) if isinstance(m, p.LaunchJob)]
        assert launch.job_id == job_id
        assert {k: v for k, v in launch.env.items() if k.startswith("STORM_ARRAY")} == {
            "STORM_ARRAY_JOB_ID": str(ids[0]),
            "STORM_ARRAY_TASK_ID": str(task),
            "STORM_ARRAY_TASK_COUNT": "3",
            "STORM_ARRAY_TASK_MIN": "3",
            "STORM_ARRAY_TASK_MAX": "9",
        }
        assert launch.output == f"/home/alice/o-{ids[0]}_{task}-%j"  # %j is the node's to fill in
        start_all_from(ctl, launch.job_id)
        finish(ctl, job_id, T0 + task)
    assert [state(ctl, i) for i in ids] == [S.COMPLETED] * 3


def start_all_from(ctl: Core, job_id: int) -> None:
    for node in ctl.runs.active[job_id].nodes:
        ctl.job_launched(JobLaunched(job_id=job_id, node=node, pids={"0": 1}), T0)


def test_the_limit_keeps_all_but_n_tasks_out_of_the_pass_and_frees_a_slot_per_end(store: Store) -> None:
    ctl = cluster(store, pes=8)
    ids = submit(ctl, array="0-99%3").job_ids
    running = start_all(ctl, T0 + 1)
    assert running == list(ids[:3])  # 8 PEs free, 3 tasks at most
    assert list(ctl.runs.state.queued) == []  # the 97 others are not in the pass's queue at all
    assert {reason(ctl, i) for i in ids[3:]} == {"JobArrayTaskLimit"}
    most = 3
    now = T0 + 2
    while ctl.runs.active:
        finish(ctl, min(ctl.runs.active), now)  # the oldest ends, the next task takes its slot
        start_all(ctl, now)
        most = max(most, len(ctl.runs.active))
        assert len(ctl.runs.active) + len(ctl.runs.state.queued) <= 3
        now += 1
    assert most == 3 and [state(ctl, i) for i in ids] == [S.COMPLETED] * 100
    assert ctl.runs.holds.gates == {} and ctl.runs.holds.counts == {}  # nothing kept of a finished array


def test_tasks_in_the_queue_wait_for_pes_as_any_job(store: Store) -> None:
    ctl = cluster(store, pes=1)
    ids = submit(ctl, array="0-4%2").job_ids
    start_all(ctl, T0)
    assert [reason(ctl, i) for i in ids[1:]] == ["Resources", *["JobArrayTaskLimit"] * 3]


def test_an_array_past_max_array_size_is_refused_before_anything_is_stored(store: Store) -> None:
    ctl = cluster(store, max_array_size=10)
    with pytest.raises(Rejected) as refused:
        submit(ctl, array="0-5,10")
    assert refused.value.code == "bad_array"
    assert "task id 10 is past this cluster's largest, 9 ([mm] max_array_size = 10" in str(refused.value)
    assert store.jobs() == []
    default = cluster(MemoryStore())
    with pytest.raises(Rejected, match="largest, 1000 "):
        submit(default, array="0-1001")
    assert len(submit(default, array="0-1000%5").job_ids) == 1001  # Slurm's default MaxArraySize


def test_cancel_an_array_or_one_task(store: Store) -> None:
    ctl = cluster(store, pes=2)
    ids = submit(ctl, array="0-5%2").job_ids
    start_all(ctl, T0)
    first, third = p.TaskRef(array_id=ids[0], task=0), p.TaskRef(array_id=ids[0], task=2)
    reply = ctl.ask(p.CancelJobs(job_ids=(), tasks=(third, first)), T0 + 1)
    assert isinstance(reply, p.CancelResult)
    assert reply.results == {f"{ids[0]}_2": "cancelled", f"{ids[0]}_0": "cancelling"}
    assert state(ctl, ids[2]) is S.CANCELLED and state(ctl, ids[0]) is S.RUNNING  # its ranks are stopping
    reply = ctl.ask(p.CancelJobs(job_ids=(ids[0],)), T0 + 2)  # the array's id: every task
    assert isinstance(reply, p.CancelResult) and reply.results == {str(ids[0]): "cancelling"}
    assert {m.job_id for _n, m in take(ctl) if isinstance(m, p.KillJob)} == {ids[0], ids[1]}
    finish(ctl, ids[0], T0 + 3, code=143)
    finish(ctl, ids[1], T0 + 3, code=143)
    assert [state(ctl, i) for i in ids] == [S.CANCELLED] * 6
    assert take(ctl) == [] and ctl.runs.state.queued == {}  # no task started after the cancel
    reply = ctl.ask(p.CancelJobs(job_ids=(ids[0], 9999), tasks=(p.TaskRef(array_id=ids[0], task=9),)), T0 + 4)
    assert isinstance(reply, p.CancelResult)
    assert reply.results == {
        str(ids[0]): "every task had ended",
        "9999": "unknown job",
        f"{ids[0]}_9": "unknown job",
    }
    bob = ctl.ask(p.CancelJobs(job_ids=(one(ctl, T0 + 5),)), T0 + 5, uid=1001, user="bob")
    assert isinstance(bob, p.CancelResult) and next(iter(bob.results.values())).startswith(
        "permission denied"
    )


def test_show_lists_an_array_by_its_id_and_a_task_by_its_name(store: Store) -> None:
    ctl = cluster(store, pes=1)
    ids = submit(ctl, array="0-2").job_ids
    alone = one(ctl)
    reply = ctl.ask(p.ListJobs(arrays=(ids[0], alone), tasks=(p.TaskRef(array_id=ids[0], task=2),)), T0)
    assert isinstance(reply, p.JobList)
    assert [j.id for j in reply.jobs] == [*ids, alone]  # task 2 once, though named twice
    reply = ctl.ask(p.ListJobs(job_ids=(ids[0],)), T0)  # by job id: that job alone, as before
    assert isinstance(reply, p.JobList) and [j.id for j in reply.jobs] == [ids[0]]


# ------------------------------------------------------------------------------------------- dependencies


def test_a_chain_of_three_runs_in_order(store: Store) -> None:
    ctl = cluster(store)
    a = one(ctl)
    b = one(ctl, dependency=f"afterok:{a}")
    c = one(ctl, dependency=f"afterany:{b}")
    assert start_all(ctl, T0) == [a]
    assert reason(ctl, b) == reason(ctl, c) == "Dependency"
    assert set(ctl.runs.state.queued) == set()  # held jobs are not in the pass's queue
    assert ctl.runs.holds.on_job == {a: {b}, b: {c}}  # indexed by what releases them
    finish(ctl, a, T0 + 1)
    assert start_all(ctl, T0 + 1) == [b]
    finish(ctl, b, T0 + 2)
    assert start_all(ctl, T0 + 2) == [c]
    finish(ctl, c, T0 + 3)
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[a].end_time <= jobs[b].start_time and jobs[b].end_time <= jobs[c].start_time  # type: ignore[operator]


def test_afterok_on_a_failed_job_ends_the_chain_with_dependency_never_satisfied(store: Store) -> None:
    ctl = cluster(store)
    a = one(ctl)
    b = one(ctl, dependency=f"afterok:{a}")
    c = one(ctl, dependency=f"afterok:{b}")
    d = one(ctl, dependency=f"afternotok:{a}")
    start_all(ctl, T0)
    finish(ctl, a, T0 + 1, code=3)
    assert state(ctl, a) is S.FAILED
    jobs = {j.id: j for j in store.jobs()}
    assert (jobs[b].state, jobs[c].state) == (S.CANCELLED, S.CANCELLED)
    assert jobs[b].reason == (
        f"DependencyNeverSatisfied: job {a} ended FAILED (afterok:{a} needs it ended COMPLETED)"
    )
    assert jobs[c].reason.startswith(f"DependencyNeverSatisfied: job {b} ended CANCELLED")  # in turn
    assert {i.id for i in ctl.ended} >= {b, c}  # anyone waiting for them hears of their end
    assert start_all(ctl, T0 + 1) == [d]  # afternotok holds
    assert ctl.runs.holds.waiting == {} and ctl.runs.holds.reasons == {}


def test_a_dependency_that_can_never_hold_when_submitted_ends_the_job_at_once(store: Store) -> None:
    ctl = cluster(store)
    a = one(ctl)
    start_all(ctl, T0)
    finish(ctl, a, T0 + 1)
    b = one(ctl, T0 + 2, dependency=f"afternotok:{a}")
    assert state(ctl, b) is S.CANCELLED and f"job {a} ended COMPLETED" in reason(ctl, b)
    c = one(ctl, T0 + 2, dependency=f"afterok:{a}")  # holds already: starts at once
    assert start_all(ctl, T0 + 2) == [c]


@pytest.mark.parametrize(
    ("dependency", "says"),
    [
        ("afterok:999", "no job 999"),
        ("afterok:{a}_0", "no job array {a}"),
        ("afterok:{array}_7", "array {array} has no task 7"),
        ("afterok:{a}:998", "no job 998"),
    ],
)
def test_unknown_ids_are_refused_at_submit(store: Store, dependency: str, says: str) -> None:
    ctl = cluster(store)
    a = one(ctl)
    array = submit(ctl, array="0-1").job_id
    before = store.jobs()
    with pytest.raises(Rejected) as refused:
        submit(ctl, dependency=dependency.format(a=a, array=array))
    assert refused.value.code == "bad_dependency"
    assert says.format(a=a, array=array) in str(refused.value)
    assert store.jobs() == before


def test_after_holds_once_the_job_started_and_any_one_is_enough_with_a_question_mark(store: Store) -> None:
    ctl = cluster(store, pes=1)
    a = one(ctl)
    b = one(ctl)
    after = one(ctl, ranks=1, dependency=f"after:{b}")
    either = one(ctl, dependency=f"afterok:{a}?afterok:{b}")
    assert start_all(ctl, T0) == [a]
    assert reason(ctl, after) == reason(ctl, either) == "Dependency"
    finish(ctl, a, T0 + 1)
    assert start_all(ctl, T0 + 1) == [b]  # either is released by a's end, behind b in the queue
    assert reason(ctl, either) == "Resources" and reason(ctl, after) == "Priority"  # b started: released
    finish(ctl, b, T0 + 2, code=1)  # b's failure changes nothing for after
    assert start_all(ctl, T0 + 2) == [either]
    finish(ctl, either, T0 + 3)
    assert start_all(ctl, T0 + 3) == [after]


def test_dependencies_on_a_whole_array_and_on_one_task(store: Store) -> None:
    ctl = cluster(store, pes=2)
    ids = submit(ctl, array="0-3%2").job_ids
    array = ids[0]
    whole = one(ctl, dependency=f"afterany:{array}")
    task = one(ctl, dependency=f"afterok:{array}_1")
    started = one(ctl, dependency=f"after:{array}")
    assert ctl.runs.holds.on_array == {array: {whole, started}} and ctl.runs.holds.on_job == {ids[1]: {task}}
    assert start_all(ctl, T0) == list(ids[:2])
    finish(ctl, ids[1], T0 + 1)
    assert start_all(ctl, T0 + 1) == [ids[2]]  # task 1 done: its dependent waits for a PE behind task 2
    assert reason(ctl, task) == "Resources"
    finish(ctl, ids[0], T0 + 2, code=2)
    assert start_all(ctl, T0 + 2) == [task]  # task 3 took the array's slot, behind it in the queue
    assert reason(ctl, started) == "Dependency"  # task 3 has not started yet
    finish(ctl, task, T0 + 3)
    assert start_all(ctl, T0 + 3) == [ids[3]]
    assert reason(ctl, started) == "Resources" and reason(ctl, whole) == "Dependency"  # every task started
    finish(ctl, ids[2], T0 + 4)
    finish(ctl, ids[3], T0 + 4)
    assert start_all(ctl, T0 + 4) == [whole, started]
    afterok = one(ctl, T0 + 5, dependency=f"afterok:{array}")  # one task failed: can never hold
    assert reason(ctl, afterok) == (
        f"DependencyNeverSatisfied: task {array}_0 (job {ids[0]}) ended FAILED (afterok:{array} needs every "
        "task of the array to end COMPLETED)"
    )


def test_an_array_with_a_dependency_waits_then_honours_its_limit(store: Store) -> None:
    ctl = cluster(store)
    a = one(ctl)
    ids = submit(ctl, array="0-5%2", dependency=f"afterany:{a}").job_ids
    assert {reason(ctl, i) for i in ids} == {"Dependency"}
    start_all(ctl, T0)
    finish(ctl, a, T0 + 1, code=9)
    assert start_all(ctl, T0 + 1) == list(ids[:2])
    assert {reason(ctl, i) for i in ids[2:]} == {"JobArrayTaskLimit"}


def test_a_requeued_job_has_not_ended_for_afterany_but_has_started_for_after(store: Store) -> None:
    ctl = make(store)
    reg(ctl, "n1", pes=2)
    reg(ctl, "n2", pes=2)
    a = one(ctl, ranks=2, requeue=True)
    any_ = one(ctl, dependency=f"afterany:{a}")
    after = one(ctl, dependency=f"after:{a}")
    assert start_all(ctl, T0 + 1) == [a, after]  # a started as it was submitted: after holds already
    assert ctl.runs.active[a].nodes == ("n1",) and ctl.runs.active[after].nodes == ("n2",)
    status(ctl, "n2", T0 + 8, jobs=(after,))
    ctl.tick(T0 + 11)  # n1 is lost with a's ranks: a goes back to the queue
    assert state(ctl, a) is S.PENDING and stored_requeues(store, a) == 1
    assert reason(ctl, any_) == "Dependency"  # not ended: it runs again
    reg(ctl, "n1", pes=2, now=T0 + 12, nm="e2")
    assert start_all(ctl, T0 + 12) == [a]
    assert reason(ctl, any_) == "Dependency"
    finish(ctl, a, T0 + 13)
    assert start_all(ctl, T0 + 13) == [any_]


def stored_requeues(store: Store, job_id: int) -> int:
    job = store.get_job(job_id)
    assert job is not None
    return job.requeues


def test_a_requeued_task_keeps_its_array_slot(store: Store) -> None:
    ctl = make(store)
    reg(ctl, "n1", pes=2)
    reg(ctl, "n2", pes=2)
    ids = submit(ctl, ranks=2, array="0-3%1", requeue=True).job_ids
    start_all(ctl, T0 + 1)
    task = ctl.runs.active[ids[0]]
    lost = task.nodes[0]
    status(ctl, "n2" if lost == "n1" else "n1", T0 + 8, jobs=(ids[0],))
    ctl.tick(T0 + 11)
    assert state(ctl, ids[0]) is S.PENDING and ids[0] in ctl.runs.state.queued
    assert {reason(ctl, i) for i in ids[1:]} == {"JobArrayTaskLimit"}


# ------------------------------------------------------------------------------------------------ restart


@pytest.fixture
def db(tmp_path: Path) -> Iterator[list[Store]]:
    opened: list[Store] = []
    yield opened
    for s in opened:
        s.close()


def reopen(ctl: Core, opened: list[Store], now: float) -> Core:
    """storm-mm killed and started again on the same store file: nothing but the store survives."""
    ctl.store.close()
    store = Store(ctl.store.path)  # type: ignore[attr-defined]
    opened.append(store)
    new = Core(store, ctl.config, now, f"mm-{len(opened) + 1}")
    reg(new, "n1", pes=4, now=now, jobs=tuple(ctl.runs.active))
    return new


def test_a_restarted_mm_keeps_the_limit_and_the_dependencies(tmp_path: Path, db: list[Store]) -> None:
    store = Store(tmp_path / "storm.db")
    db.append(store)
    ctl = cluster(store)
    ids = submit(ctl, array="0-9%2").job_ids
    a = one(ctl)
    b = one(ctl, dependency=f"afterok:{a}")
    c = one(ctl, dependency=f"afterok:{ids[0]}")  # the whole array
    start_all(ctl, T0)
    finish(ctl, ids[0], T0 + 1)
    start_all(ctl, T0 + 1)
    running = sorted(ctl.runs.active)
    assert running == [ids[1], ids[2], a]
    ctl = reopen(ctl, db, T0 + 2)
    status(ctl, "n1", T0 + 2, jobs=tuple(running))
    ctl.tick(T0 + 5)
    assert not [m for _n, m in take(ctl) if isinstance(m, p.LaunchJob)]
    assert sorted(ctl.runs.active) == running  # no third task started: the limit survived
    assert {reason(ctl, i) for i in ids[3:]} == {"JobArrayTaskLimit"}
    assert reason(ctl, b) == reason(ctl, c) == "Dependency"
    finish(ctl, a, T0 + 5, code=1)
    assert state(ctl, b) is S.CANCELLED and reason(ctl, b).startswith("DependencyNeverSatisfied: job")
    started = []
    for job_id in ids[1:]:
        assert state(ctl, c) is S.PENDING
        finish(ctl, job_id, T0 + 6)
        started += start_all(ctl, T0 + 6)
        assert len([j for j in ctl.runs.active.values() if j.array_id == ids[0]]) <= 2
    assert [state(ctl, i) for i in ids] == [S.COMPLETED] * 10
    assert started == [*ids[3:], c]  # c once the whole array had completed


def test_a_dependency_is_stored_with_the_job(tmp_path: Path, db: list[Store]) -> None:
    store = Store(tmp_path / "storm.db")
    db.append(store)
    ctl = cluster(store)
    a = one(ctl)
    b = one(ctl, dependency=f"afterok:{a},afterany:{a}")
    job = store.get_job(b)
    assert job is not None and job.spec.dependency == f"afterok:{a},afterany:{a}"
    (info,) = ctl.job_infos((b,))
    assert info.dependency == job.spec.dependency
    assert dataclasses.replace(job, reason="") == job


def test_a_thousand_held_tasks_are_not_in_the_pass_and_are_released_by_what_they_wait_for(
    store: Store,
) -> None:
    ctl = cluster(store, pes=4)
    a = one(ctl)
    ids = submit(ctl, array="0-999%10", dependency=f"afterok:{a}").job_ids
    assert len(ids) == 1000 and ctl.runs.state.queued == {}  # a pass sees none of them
    assert ctl.runs.holds.on_job == {a: set(ids)}  # indexed by the one job whose end releases them
    passes = ctl.runs.passes
    start_all(ctl, T0)
    finish(ctl, a, T0 + 1)
    assert ctl.runs.passes - passes <= 3  # the end and its release: no pass per held task
    assert start_all(ctl, T0 + 1) == list(ids[:4])  # 4 PEs free
    assert list(ctl.runs.state.queued) == list(ids[4:10])  # the limit's 10 slots, no more, in the queue
    assert {reason(ctl, i) for i in ids[10:]} == {"JobArrayTaskLimit"}


def test_the_arrays_benchmark_reports_every_figure(tmp_path: Path) -> None:
    from storm.tools import bench_arrays

    out = tmp_path / "bench.json"
    assert bench_arrays.main(["--tasks", "20", "--held", "50", "--repeats", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["figures"]
    assert sorted(figures) == sorted([
        "submit: one array of 20 tasks", "submit: 20 single jobs", "pass: 50 tasks held by %10",
        "pass: 50 jobs queued", "release: 50 dependents of one job",
    ])  # fmt: skip
    assert all(f["wall_s"] > 0 and f["cpu_s"] >= 0 for f in figures.values())
