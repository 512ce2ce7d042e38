"""What a simulated run measured: per job and for the whole run.

Per job: wait = start - submit, response = end - submit, runtime = end - start (as storm ran it: a job
killed at its limit ran its limit), and the bounded slowdown max(1, response / max(runtime, 10 s)), the
Feitelson-Rudolph definition with the 10 s threshold the papers use (:data:`BSLD_THRESHOLD`).

Per run: mean and median of each, makespan = last end - first submit, utilization = sum(runtime x PEs) /
(P x makespan), and the loss of capacity of ClusterSchedSim (Zhang & Sivasubramaniam 2004): the PE-seconds
left idle while at least one job waited, integrated over the run, / (P x makespan).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from storm.tools.sim.engine import Outcome

BSLD_THRESHOLD = 10.0  # seconds: runtimes below it count as this long in the bounded slowdown


def bounded_slowdown(response: float, runtime: float, threshold: float = BSLD_THRESHOLD) -> float:
    return max(1.0, response / max(runtime, threshold))


@dataclass(frozen=True)
class JobRow:
    """One line of the per-job table (``--csv``)."""

    number: int
    user: int
    procs: int
    submit: float
    start: float
    end: float
    wait: float
    response: float
    runtime: float
    limit: float
    bsld: float
    state: str


@dataclass(frozen=True)
class Summary:
    jobs: int
    mean_wait: float
    median_wait: float
    mean_response: float
    median_response: float
    mean_bsld: float
    median_bsld: float
    max_wait: float
    utilization: float
    loss_of_capacity: float
    makespan: float
    states: dict[str, int]


def job_rows(outcomes: Sequence[Outcome]) -> list[JobRow]:
    rows = []
    for o in outcomes:
        runtime = o.end - o.start
        response = o.end - o.job.submit
        rows.append(
            JobRow(
                number=o.job.number, user=o.job.user, procs=o.job.procs, submit=o.job.submit, start=o.start,
                end=o.end, wait=o.start - o.job.submit, response=response, runtime=runtime, limit=o.job.limit,
                bsld=bounded_slowdown(response, runtime), state=o.state,
            )
        )  # fmt: skip
    return rows


def loss_of_capacity(rows: Sequence[JobRow], pes: int) -> float:
    """Idle PE-seconds while a job waits, over the run, as a share of P x makespan."""
    if not rows:
        return 0.0
    # (time, queued change, busy PEs change); at one instant the order does not matter: the spans between
    # instants are what is integrated.
    changes: list[tuple[float, int, int]] = []
    for r in rows:
        changes.append((r.submit, 1, 0))
        changes.append((r.start, -1, r.procs))
        changes.append((r.end, 0, -r.procs))
    changes.sort()
    queued = busy = 0
    lost = 0.0
    last = changes[0][0]
    for at, dq, db in changes:
        if queued > 0 and at > last:
            lost += (pes - busy) * (at - last)
        last = at
        queued += dq
        busy += db
    span = makespan(rows)
    return lost / (pes * span) if span > 0 else 0.0


def makespan(rows: Sequence[JobRow]) -> float:
    if not rows:
        return 0.0
    return max(r.end for r in rows) - min(r.submit for r in rows)


def summarize(rows: Sequence[JobRow], pes: int) -> Summary:
    if not rows:
        return Summary(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {})
    waits = [r.wait for r in rows]
    responses = [r.response for r in rows]
    slowdowns = [r.bsld for r in rows]
    span = makespan(rows)
    work = sum(r.runtime * r.procs for r in rows)
    states: dict[str, int] = {}
    for r in rows:
        states[r.state] = states.get(r.state, 0) + 1
    return Summary(
        jobs=len(rows),
        mean_wait=statistics.fmean(waits),
        median_wait=statistics.median(waits),
        mean_response=statistics.fmean(responses),
        median_response=statistics.median(responses),
        mean_bsld=statistics.fmean(slowdowns),
        median_bsld=statistics.median(slowdowns),
        max_wait=max(waits),
        utilization=work / (pes * span) if span > 0 else 0.0,
        loss_of_capacity=loss_of_capacity(rows, pes),
        makespan=span,
        states=dict(sorted(states.items())),
    )
