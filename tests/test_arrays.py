"""Slurm's --array and --dependency notations as storm reads them (mm/arrays.py, mm/dependency.py): what
each accepts, its canonical text, and a clear refusal of everything else, at the CLI and on the wire."""

from __future__ import annotations

import pytest

from storm.mm import protocol as p
from storm.mm.arrays import (
    MAX_TASK_ID,
    ArrayError,
    expand_array,
    fold,
    parse_array,
    parse_job_ref,
    task_env,
)
from storm.mm.dependency import (
    ArrayCounts,
    Condition,
    DependencyError,
    Verdict,
    combine,
    judge_array,
    judge_job,
    parse_dependency,
)
from storm.mm.slurm_style import expand_path
from storm.mm.states import JobState


@pytest.mark.parametrize(
    ("text", "tasks", "limit", "canonical"),
    [
        ("0-99%10", tuple(range(100)), 10, "0-99%10"),
        ("1,3,5-7", (1, 3, 5, 6, 7), 0, "1,3,5-7"),
        ("0-15:4", (0, 4, 8, 12), 0, "0-12:4"),
        ("7", (7,), 0, "7"),
        ("5-7,1-6", (1, 2, 3, 4, 5, 6, 7), 0, "1-7"),  # overlaps counted once
        ("0,2", (0, 2), 0, "0,2"),  # two evenly spaced ids: a list, not a stepped range
        ("1-7:2%1", (1, 3, 5, 7), 1, "1-7:2%1"),
    ],
)
def test_array_ids_as_slurm_reads_them(text: str, tasks: tuple[int, ...], limit: int, canonical: str) -> None:
    spec = parse_array(text)
    assert (spec.tasks(), spec.limit, str(spec), spec.highest) == (tasks, limit, canonical, tasks[-1])
    assert parse_array(canonical).tasks() == tasks  # the canonical text reads back as the same ids


def test_the_largest_id_is_known_without_expanding_the_ranges() -> None:
    spec = parse_array(f"0-{MAX_TASK_ID}:3,5")
    assert spec.highest == MAX_TASK_ID // 3 * 3  # the last id the step reaches, not the range's end


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "give task ids"),
        ("%4", "give task ids"),
        ("1-x", "'1-x' is not a task id"),
        ("0-99%", "% is not a number of tasks"),
        ("0-99%ten", "%ten is not a number"),
        ("0-99%0", "%0 would run no task"),
        ("9-3", "the range 9-3 ends before it starts"),
        ("0-9:0", "the step of 0-9:0 must be at least 1"),
        ("1,,2", "'' is not a task id"),
        ("-1", "'-1' is not a task id"),
        ("1 - 5", "'1 - 5' is not a task id"),
        ("0-99999999", f"up to {MAX_TASK_ID}"),
        ("٣", "is not a task id"),  # a digit to str.isdigit, not to Slurm
    ],
)
def test_a_bad_array_is_refused_with_its_reason(text: str, says: str) -> None:
    with pytest.raises(ArrayError, match="--array") as refused:
        parse_array(text)
    assert says in str(refused.value)


def test_fold_shows_tasks_as_squeue_does() -> None:
    assert fold([5, 6, 7, 8, 9], 10) == "5-9%10"
    assert fold([1, 2, 4, 6, 8, 9]) == "1-2,4,6,8-9"
    assert fold([0, 3, 6, 9, 10, 20]) == "0-6:3,9-10,20"
    assert fold([]) == ""


@pytest.mark.parametrize(
    ("text", "ref"),
    [("123", (123, None)), ("123_7", (123, (7,))), ("123_[1-3,7]", (123, (1, 2, 3, 7)))],
)
def test_job_references(text: str, ref: tuple[int, tuple[int, ...] | None]) -> None:
    assert parse_job_ref(text) == ref


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("abc", "is not a job id"),
        ("_7", "is not a job id"),
        ("12_", "the task after '_'"),
        ("12_x", "the task after '_'"),
        ("12_[3-1]", "ends before it starts"),
        ("12_[1-3%2]", "a %N limit belongs in --array"),
    ],
)
def test_bad_job_references_are_refused(text: str, says: str) -> None:
    with pytest.raises(ArrayError, match=says.replace("[", r"\[")):
        parse_job_ref(text)


def test_output_names_take_the_array_and_task_ids() -> None:
    pattern = expand_array("/o/%A_%a-%j.%%a.out", 12, 7)
    assert pattern == "/o/12_7-%j.%%a.out"  # %j and %% are the node's to expand, as before
    assert expand_path(pattern, job_id=19, user="u", name="n") == "/o/12_7-19.%a.out"
    assert task_env(12, 7, (0, 7, 9)) == {
        "STORM_ARRAY_JOB_ID": "12",
        "STORM_ARRAY_TASK_ID": "7",
        "STORM_ARRAY_TASK_COUNT": "3",
        "STORM_ARRAY_TASK_MIN": "0",
        "STORM_ARRAY_TASK_MAX": "9",
    }


# ------------------------------------------------------------------------------------------- dependencies


@pytest.mark.parametrize(
    ("text", "conditions", "any_", "canonical"),
    [
        ("afterok:12", (Condition("afterok", 12),), False, "afterok:12"),
        (
            "afterok:12:13_4,after:14",
            (Condition("afterok", 12), Condition("afterok", 13, 4), Condition("after", 14)),
            False,
            "afterok:12:13_4,after:14",
        ),
        (
            "afterany:1,afterany:2",
            (Condition("afterany", 1), Condition("afterany", 2)),
            False,
            "afterany:1:2",
        ),
        (
            "afterok:1?afternotok:2",
            (Condition("afterok", 1), Condition("afternotok", 2)),
            True,
            "afterok:1?afternotok:2",
        ),
    ],
)
def test_dependencies_as_slurm_writes_them(
    text: str, conditions: tuple[Condition, ...], any_: bool, canonical: str
) -> None:
    dependency = parse_dependency(text)
    assert (dependency.conditions, dependency.any, str(dependency)) == (conditions, any_, canonical)
    assert parse_dependency(canonical) == dependency


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is not KIND:ID"),
        ("afterok", "afterok needs a job id"),
        ("afterok:", "afterok needs a job id"),
        ("afterok:x", "'x' is not a job id"),
        ("afterok:12_x", "'12_x' is not a job id"),
        ("afterok:0", "'0' is not a job id"),
        ("afterok:1,,afterok:2", "'' is not KIND:ID"),
        ("afterok:1,afterany:2?after:3", "not both"),
        ("singleton", "singleton, aftercorr and +time are not supported"),
        ("afterok:12+5", "'12+5' is not a job id"),
        ("before:12", "KIND one of after, afterany, afterok, afternotok"),
        ("afterok:" + ":".join(["1"] * 1001), "more than 1000"),
    ],
)
def test_a_bad_dependency_is_refused_with_its_reason(text: str, says: str) -> None:
    with pytest.raises(DependencyError, match="--dependency") as refused:
        parse_dependency(text)
    assert says in str(refused.value)


def test_the_wire_refuses_what_the_cli_would() -> None:
    base = {"ranks": 1, "argv": ("true",), "cwd": "/", "env": {}}
    good = p.SubmitJob(**base, array="0-9%2", dependency="afterok:4")  # type: ignore[arg-type]
    assert p.decode(p.encode(good)) == good
    for field, value, says in [
        ("array", "0-x", "is not a task id"),
        ("dependency", "afterok", "needs a job id"),
        ("array", "1" * 5000, "too long"),
    ]:
        bad = dict(p.decode(p.encode(good)).__dict__, **{field: value})
        with pytest.raises(p.ProtocolError, match=says):
            p.SubmitJob(**{k: v for k, v in bad.items() if k != "req"})
    assert p.TaskRef.parse("12_[0-1]") == (
        None,
        (p.TaskRef(array_id=12, task=0), p.TaskRef(array_id=12, task=1)),
    )
    assert p.TaskRef.parse("12") == (12, ())
    with pytest.raises(p.ProtocolError, match="is not a job id"):
        p.TaskRef.parse("twelve")


@pytest.mark.parametrize(
    ("kind", "state", "started", "verdict"),
    [
        ("after", JobState.PENDING, False, Verdict.WAIT),
        ("after", JobState.PENDING, True, Verdict.MET),  # requeued after its first start
        ("after", JobState.RUNNING, True, Verdict.MET),
        ("after", JobState.CANCELLED, False, Verdict.MET),  # it never will start
        ("afterany", JobState.RUNNING, True, Verdict.WAIT),
        ("afterany", JobState.PENDING, True, Verdict.WAIT),  # requeued: not ended until its last run has
        ("afterany", JobState.NODE_FAIL, True, Verdict.MET),
        ("afterok", JobState.COMPLETED, True, Verdict.MET),
        ("afterok", JobState.FAILED, True, Verdict.NEVER),
        ("afterok", JobState.PENDING, True, Verdict.WAIT),
        ("afternotok", JobState.TIMEOUT, True, Verdict.MET),
        ("afternotok", JobState.COMPLETED, True, Verdict.NEVER),
    ],
)
def test_each_kind_of_condition_on_a_job(kind: str, state: JobState, started: bool, verdict: Verdict) -> None:
    got, why = judge_job(kind, 12, state, started)
    assert got is verdict
    assert (f"job 12 ended {state.value}" in why) == (verdict is Verdict.NEVER)


def test_conditions_on_a_whole_array() -> None:
    running = ArrayCounts(tasks=4, unfinished=3, unstarted=1)
    assert judge_array("after", 5, running)[0] is Verdict.WAIT
    assert judge_array("after", 5, ArrayCounts(tasks=4, unfinished=3))[0] is Verdict.MET
    assert judge_array("afterany", 5, running)[0] is Verdict.WAIT
    failed = ArrayCounts(tasks=4, unfinished=2, failed=1, first_failed=(7, 2, "FAILED"))
    verdict, why = judge_array("afterok", 5, failed)
    assert verdict is Verdict.NEVER and "task 5_2 (job 7) ended FAILED" in why  # before the rest end
    assert judge_array("afternotok", 5, failed)[0] is Verdict.WAIT
    done = ArrayCounts(tasks=4)
    assert judge_array("afterok", 5, done)[0] is Verdict.MET
    verdict, why = judge_array("afternotok", 5, done)
    assert verdict is Verdict.NEVER and "every task of array 5 ended COMPLETED" in why


def test_all_or_any() -> None:
    met, wait, never = (Verdict.MET, ""), (Verdict.WAIT, ""), (Verdict.NEVER, "job 3 ended FAILED")
    assert combine([met, wait], False)[0] is Verdict.WAIT
    assert combine([met, wait, never], False) == never
    assert combine([met, wait], True)[0] is Verdict.MET
    assert combine([never, wait], True)[0] is Verdict.WAIT
    assert combine([never, never], True) == (Verdict.NEVER, "job 3 ended FAILED; job 3 ended FAILED")
