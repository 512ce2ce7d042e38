"""The size a moldable job gets when a scheduling pass starts it: Parsons and Sevcik's RTC-AD over the queue.

A moldable job (``storm submit -n 4-16``, Slurm's range form) waits with a range of sizes. Each pass decides
its size anew, and the size it starts with is the size it keeps: storm cannot reshape a running MPI program.
The rule is mm/moldable.py's :func:`~storm.mm.moldable.choose_sizes`, the function ``storm sim reproduce
lsf`` runs for LSF-RTC-AD and LSF-RTC-ADSUBSET: this module only says what storm-mm gives it.

- The requests are the queue in the pass's order (priority, then first come, first served), every job with
  its range; a job of a fixed size is a range of one size, so it counts as it will start.
- The free units are the free PEs of the row of the matrix that has most (on the usable nodes). Under gang
  scheduling a job goes to the lowest row with room for it, and a row with more room than the others is where
  a wide job can go, so the rule sizes as if the queue were to start there.
- First fit at the minima picks the jobs that fit, in order; the PEs they leave are shared out one at a time
  to the chosen moldable job with the fewest (nothing is known of their speedup), up to each one's maximum. So
  a moldable job gets its maximum (or the free PEs) when it is alone, and fewer as the queue behind it grows.
  Jobs of a fixed size take no more than their size.
- A moldable job the rule does not choose waits at its minimum: the pass (FCFS and backfilling) sees it at
  that size, the least it could start with, and so makes its reservation for it.
- With SUBSET, the rule commits to only N' of the first-fit jobs as the system fills (L jobs in it, queued,
  running and suspended) and picks the rest by a subset sum that packs the free PEs best. A moldable job it
  leaves out although its minimum fits is held back from the pass (reason :data:`HELD`); jobs of a fixed size
  are never held back (EASY backfilling decides for them, as it always does).

The pass itself then decides which jobs start (mm/scheduler.py): the sizes only replace the moldable jobs'
ranks in it. Where the two disagree (a rigid job the rule counted but backfilling keeps waiting), the moldable
job simply got fewer PEs than it could have. Pure functions of their arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from storm.mm.moldable import MoldableRequest, choose_sizes, first_fit
from storm.mm.scheduler import QueuedJob

MOLDABLE_RULES = ("rtc-ad", "subset")  # [mm] moldable
HELD = "Moldable: held back by the SUBSET rule, to pack the free PEs with other jobs"


def pass_sizes(
    queue: Sequence[QueuedJob],
    ranges: Mapping[int, tuple[int, int]],
    free: int,
    *,
    jobs_in_system: int,
    subset: bool = False,
) -> tuple[dict[int, int], frozenset[int]]:
    """The size of every moldable job of ``queue`` (job id -> ranks) for a pass on ``free`` PEs, and the
    moldable jobs SUBSET holds back. ``ranges`` gives each moldable job's (minimum, maximum); ``queue`` is in
    the pass's order. O(n log n + u log n) for n queued jobs and u free PEs; ``subset`` adds O(n x u / w)."""
    moldable = [job.job_id for job in queue if job.job_id in ranges]
    if not moldable:
        return {}, frozenset()
    requests = [MoldableRequest(job.job_id, *ranges.get(job.job_id, (job.ranks, job.ranks))) for job in queue]
    chosen = dict(choose_sizes(requests, free, jobs_in_system=jobs_in_system, subset=subset))
    sizes = {job_id: chosen.get(job_id, ranges[job_id][0]) for job_id in moldable}
    held: frozenset[int] = frozenset()
    if subset:
        fits = first_fit([request.minimum for request in requests], free)
        held = frozenset(
            requests[i].job_id
            for i in fits
            if requests[i].job_id in ranges and requests[i].job_id not in chosen
        )
    return sizes, held


def sized(queue: Sequence[QueuedJob], sizes: Mapping[int, int], held: frozenset[int]) -> list[QueuedJob]:
    """The queue as the pass sees it: moldable jobs at their sizes, those held back left out. O(n)."""
    return [
        dataclasses.replace(job, ranks=sizes[job.job_id]) if job.job_id in sizes else job
        for job in queue
        if job.job_id not in held
    ]
