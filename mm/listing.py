"""What clients see of the jobs, the nodes and the matrix (``storm jobs``, ``storm nodes``, ``storm matrix``):
functions of the Controller's state (mm/core.py), which answers with them; they change nothing."""

from __future__ import annotations

from collections.abc import Iterable

from storm.mm.jobs import Job
from storm.mm.matrix import Matrix
from storm.mm.nodes import DOWN, Node
from storm.mm.protocol import JobInfo, MatrixView, NodeInfo, TorusView
from storm.mm.runs import RunTable
from storm.mm.slots import GangCycle
from storm.mm.states import JobState
from storm.mm.torus_state import TorusState


def job_infos(
    runs: RunTable,
    hang_warning: float,
    job_ids: tuple[int, ...] = (),
    everything: bool = False,
    now: float | None = None,
) -> list[JobInfo]:
    """Jobs by id, or the active ones (all with ``everything``); ``now`` updates suspended times.
    O(a log a) for a active jobs; with ``everything``, O(every job stored): see job_page."""
    live = {**runs.pending, **runs.active}
    if job_ids:
        jobs = [runs.job(i) for i in job_ids]
        found = [j for j in jobs if j is not None]
    elif everything:
        found = [live.get(j.id, j) for j in runs.store.jobs()]
    else:
        found = sorted(live.values(), key=lambda j: j.id)
    return _infos(runs, found, hang_warning, now)


def job_page(
    runs: RunTable, hang_warning: float, now: float, page: int, before: int = 0
) -> tuple[list[JobInfo], int]:
    """The store's newest ``page`` jobs (of ids below ``before`` if given) and, with the first page
    (``before`` 0), every active job, in order of id; and the id below which older ones remain (0: none).

    O(page + a log a): the rows are read by the primary key, backwards, so a page of a long history costs
    the page, not the history (``storm queue --all`` over 100,000 finished jobs held storm-mm for 4.5 s)."""
    live = {**runs.pending, **runs.active}
    rows = runs.store.jobs(newest=page + 1, before=before)  # one more than the page: are there older ones?
    older = rows[1].id if len(rows) > page else 0  # oldest first: the extra one is dropped
    stored = {j.id: live.get(j.id, j) for j in (rows[1:] if older else rows)}
    if not before:
        stored.update(live)
    return _infos(runs, [stored[i] for i in sorted(stored)], hang_warning, now), older


def _infos(runs: RunTable, found: list[Job], hang_warning: float, now: float | None) -> list[JobInfo]:
    """The jobs' records, a queued job's reason and a running one's stopped time as of ``now``. O(jobs)."""
    infos = []
    active = runs.active
    for job in found:
        if job.state is JobState.PENDING:
            infos.append(job.info(reason=pending_reason(runs, job)))
        elif job.id in active and now is not None:
            warning = runs.reports.hang(job, now, hang_warning)
            infos.append(job.info(suspended_time=runs.suspended(job, now), warning=warning))
        else:
            infos.append(job.info())
    return infos


def pending_reason(runs: RunTable, job: Job) -> str:
    """Why a queued job waits, as `storm queue` says it: the last pass's reason, or what holds it out of the
    passes (with what requeued the job, if it was), else the job's own reason (why it was requeued; "" before
    its first pass)."""
    waits = runs.reasons.get(job.id) or runs.holds.reasons.get(job.id)  # held: Dependency, JobArrayTaskLimit
    if waits is None:
        return job.reason
    return f"{waits} ({job.reason})" if job.requeues else waits


def node_infos(
    nodes: Iterable[Node], active: Iterable[Job], torus: TorusState | None = None
) -> list[NodeInfo]:
    """Every node by name, with the active jobs on it, its PEs in use and why it takes no job, if so; on a
    torus its place, and the jobs whose box holds it (also where none of their ranks is).

    O(n log n + r) for n nodes and r placed ranks: `storm nodes` at 1,024 nodes costs the MM 5-10 ms (the
    records' encoding about as much again)."""
    jobs: dict[str, list[int]] = {}
    pes_used: dict[str, int] = {}
    places = torus.layout.coordinates() if torus is not None else {}
    for job in active:
        held = job.nodes
        if torus is not None and job.id in torus.boxes:
            held = tuple(torus.names_of(torus.boxes[job.id]))
        for name in held:
            jobs.setdefault(name, []).append(job.id)
        for name, _pe in job.placement:
            pes_used[name] = pes_used.get(name, 0) + 1
    infos = []
    for n in sorted(nodes, key=lambda n: n.name):
        if n.state == DOWN:
            reason = n.reason
        elif not n.confirmed:
            reason = "not registered since storm-mm started"
        elif n.stale:
            reason = f"stopping ended job(s) {', '.join(map(str, sorted(n.stale)))}"
        elif torus is not None and n.name not in places:
            reason = "not on the torus ([mm] coordinates): takes no job"
        else:
            reason = ""
        infos.append(
            NodeInfo(
                name=n.name,
                state=n.state,
                pes=n.pes,
                pes_used=pes_used.get(n.name, 0),
                address=n.address,
                last_seen=n.last_seen,
                reason=reason,
                jobs=tuple(jobs.get(n.name, ())),
                switches=n.switches,
                switch_p50_ms=n.switch_p50_ms,
                switch_p99_ms=n.switch_p99_ms,
                coords=places.get(n.name, ()),
                late_beats=n.late_beats,
                skewed_beats=n.skewed_beats,
            )
        )
    return infos


def torus_view(torus: TorusState) -> TorusView:
    """Which job holds each position of the torus (0: none), and its node ("" where none is)."""
    jobs = [0] * torus.torus.nodes
    for job_id, held in torus.masks.items():
        left = held
        while left:
            low = left & -left
            jobs[low.bit_length() - 1] = job_id
            left ^= low
    return TorusView(
        dims=torus.torus.dims, nodes=tuple(name or "" for name in torus.layout.names), jobs=tuple(jobs)
    )


def matrix_view(
    matrix: Matrix, cycle: GangCycle | None, policy: str, slice_: float, torus: TorusState | None = None
) -> MatrixView:
    columns = matrix.columns()
    index = {pe: i for i, pe in enumerate(columns)}
    cells = []
    for row in matrix.cells():
        line = [0] * len(columns)
        for pe, job_id in row.items():
            line[index[pe]] = job_id
        cells.append(tuple(line))
    return MatrixView(
        policy=policy,
        mpl=matrix.mpl,
        slice=slice_,
        active_row=None if cycle is None else cycle.active,
        seq=0 if cycle is None else cycle.seq,
        columns=tuple(f"{node}:{pe}" for node, pe in columns),
        cells=tuple(cells),
        torus=None if torus is None else torus_view(torus),
    )
