"""The CLI's part of job arrays and dependencies: ``storm submit --array/--dependency``, job references such
as ``123_7`` for ``storm cancel`` and ``storm show``, and how ``storm queue`` folds an array's pending
tasks into one line, as squeue does (``123_[5-99%10]``).

The notations are read by mm/arrays.py and mm/dependency.py, as storm-mm reads them, so that a typo is a
usage error before anything is sent.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from storm.mm import protocol as p

# mm/arrays.py and mm/dependency.py are imported where a job uses arrays or dependencies: every storm command
# builds this parser, and most never need them (each storm call starts faster without).

ARRAY_HELP = (
    "a job array, one job per task id, Slurm's syntax: 0-99, 1,3,5-7, 0-15:4; %%N runs at most N tasks at "
    "once (0-99%%10). Each task has STORM_ARRAY_TASK_ID (and _JOB_ID, _COUNT, _MIN, _MAX); %%A and %%a in "
    "--output and --error are the array's id and the task id"
)
DEPENDENCY_HELP = (
    "start only once other jobs have: after:ID (started), afterany:ID (ended), afterok:ID (completed), "
    "afternotok:ID (failed); ID:ID... for several, ',' all must hold, '?' any one; ID 123 (a whole array by "
    "its id) or 123_4 (one task). One that can never hold ends the job (DependencyNeverSatisfied)"
)


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--array`` and ``--dependency`` for ``storm submit`` (sbatch's -a and -d)."""
    parser.add_argument("--array", "-a", metavar="IDS[%N]", help=ARRAY_HELP)
    parser.add_argument("--dependency", "-d", metavar="KIND:ID[:ID...]", help=DEPENDENCY_HELP)


class UsageError(ValueError):
    """A bad option, reported as the CLI's other usage errors are (exit status 2)."""


def submit_fields(args: argparse.Namespace) -> dict[str, object]:
    """submit_job's array and dependency fields, checked here first; UsageError says what is wrong."""
    fields: dict[str, object] = {}
    if not (args.array or args.dependency):
        return fields
    from storm.mm.arrays import ArrayError, parse_array
    from storm.mm.dependency import DependencyError, parse_dependency

    try:
        if args.array:
            fields["array"] = str(parse_array(args.array))
        if args.dependency:
            fields["dependency"] = str(parse_dependency(args.dependency))
    except (ArrayError, DependencyError) as exc:
        raise UsageError(str(exc)) from None
    return fields


def references(texts: Sequence[str]) -> tuple[tuple[int, ...], tuple[p.TaskRef, ...]]:
    """Job references as users write them: job (or array) ids, and tasks (``123_7``, ``123_[1-3]``)."""
    ids: list[int] = []
    tasks: list[p.TaskRef] = []
    for text in texts:
        try:
            job_id, refs = p.TaskRef.parse(text)
        except p.ProtocolError as exc:
            raise UsageError(str(exc)) from None
        if job_id is not None:
            ids.append(job_id)
        tasks.extend(refs)
    return tuple(ids), tuple(tasks)


def job_ref(text: str) -> str:
    """argparse's check of a JOBID argument (123, 123_7, 123_[1-3]): the text, or a clear usage error."""
    try:
        p.TaskRef.parse(text)
    except p.ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def job_name(job: p.JobInfo) -> str:
    """What users look for: ``123_7`` for a task of array 123 (its own id is in ``storm show``), else the
    job's id."""
    return str(job.id) if job.array_id is None else f"{job.array_id}_{job.array_task}"


def folded(jobs: Sequence[p.JobInfo]) -> list[tuple[str, p.JobInfo, int]]:
    """``storm queue``'s lines: (JOBID, the job shown, how many it stands for). An array's pending tasks
    that wait for the same reason are one line, ``123_[5-99%10]`` (squeue's folding), at the place of the
    first; every other job and task is a line of its own. O(jobs)."""
    groups: dict[tuple[int, str], list[p.JobInfo]] = {}
    lines: list[tuple[Any, ...]] = []
    for job in jobs:
        if job.array_id is not None and job.state == p.JobState.PENDING:
            key = (job.array_id, job.reason)
            if key not in groups:
                groups[key] = []
                lines.append(key)
            groups[key].append(job)
        else:
            lines.append((job,))
    out: list[tuple[str, p.JobInfo, int]] = []
    for line in lines:
        if len(line) == 1:
            out.append((job_name(line[0]), line[0], 1))
            continue
        tasks = groups[line]
        first = tasks[0]
        if len(tasks) == 1:
            out.append((job_name(first), first, 1))
            continue
        from storm.mm.arrays import fold, parse_array

        limit = parse_array(first.array).limit if first.array else 0
        ids = fold(sorted(t.array_task or 0 for t in tasks), limit)
        out.append((f"{first.array_id}_[{ids}]", first, len(tasks)))
    return out
