"""What the jobs a client names are, as Slurm's users name them: ``123`` is job 123, or, when 123 is an
array's id, every task of that array (scancel and scontrol do so); ``123_7`` is task 7 of array 123.

Lookups over the RunTable (mm/runs.py) and its store, for the Controller's cancel_jobs and list_jobs, and
the cancel itself. An array's tasks are one indexed read of the store (O(tasks)), each taken from memory if
it has not ended.
"""

from __future__ import annotations

from collections.abc import Iterable

from storm.mm.effects import Effect
from storm.mm.jobs import Job, advance
from storm.mm.protocol import TaskRef
from storm.mm.rights import Credentials, may_manage
from storm.mm.runs import RunTable
from storm.mm.states import JobState


def current(runs: RunTable, job: Job) -> Job:
    """The job's record as it is now: the RunTable's while it has not ended, else the store's."""
    return runs.pending.get(job.id) or runs.active.get(job.id) or job


def array(runs: RunTable, array_id: int) -> list[Job] | None:
    """Every task of the array, in task order; None if ``array_id`` names no array."""
    head = runs.job(array_id)
    if head is None or head.array_id != head.id:
        return None
    return [current(runs, task) for task in runs.store.array_tasks(array_id)]


def task(runs: RunTable, ref: TaskRef) -> Job | None:
    """The task ``ref`` names, or None."""
    found = array(runs, ref.array_id)
    return next((j for j in found or () if j.array_task == ref.task), None)


def named(runs: RunTable, job_ids: Iterable[int], tasks: Iterable[TaskRef]) -> list[tuple[str, list[Job]]]:
    """Per reference, as the client wrote it ("123", "123_7"): the jobs it names (an array's id: every
    task; [] for none), in the order given, references to one task of an array grouped by array (one read)."""
    found: list[tuple[str, list[Job]]] = []
    for job_id in job_ids:
        tasks_of = array(runs, job_id)
        job = runs.job(job_id) if tasks_of is None else None
        found.append((str(job_id), tasks_of if tasks_of is not None else [job] if job is not None else []))
    by_array: dict[int, dict[int, Job]] = {}
    for ref in tasks:
        if ref.array_id not in by_array:
            by_array[ref.array_id] = {j.array_task or 0: j for j in array(runs, ref.array_id) or ()}
        job = by_array[ref.array_id].get(ref.task)
        found.append((str(ref), [] if job is None else [job]))
    return found


def cancel(
    runs: RunTable,
    named: list[tuple[str, list[Job]]],
    caller: Credentials,
    *,
    operators: list[str],
    now: float,
    out: list[Effect],
) -> dict[str, str]:
    """Cancel what each reference names (see :func:`named`): per reference ``cancelled``, ``cancelling``
    (ranks still being stopped), or why not. An array's answer is that of its tasks that had not ended:
    cancelling if one of them still runs, and the first refusal if any."""
    results: dict[str, str] = {}
    for key, jobs in named:
        answers = [_cancel(runs, job, caller, operators, now, out) for job in jobs if not job.state.terminal]
        if not jobs:
            results[key] = "unknown job"
        elif not answers:
            results[key] = f"already {jobs[0].state.value}" if len(jobs) == 1 else "every task had ended"
        else:
            refused = [a for a in answers if not a.startswith("cancel")]
            results[key] = refused[0] if refused else max(answers)  # "cancelling" sorts after "cancelled"
    runs.settle(now, out)  # jobs that waited for these (afterany...) go, or never will
    runs.want_pass()
    return results


def _cancel(  # noqa: PLR0917 (one job of cancel's, with its arguments)
    runs: RunTable, job: Job, caller: Credentials, operators: list[str], now: float, out: list[Effect]
) -> str:
    if not may_manage(caller.uid, caller.user, job.spec.uid, operators):
        return f"permission denied: job {job.id} belongs to {job.spec.user}"
    if job.state is JobState.PENDING:
        runs.withdraw(job.id)
        runs.finish(advance(job, JobState.CANCELLED, now, reason=f"cancelled by {caller.user}"), out)
        return "cancelled"
    runs.end(job, JobState.CANCELLED, f"cancelled by {caller.user}", now, out)
    return "cancelled" if job.id not in runs.active else "cancelling"
