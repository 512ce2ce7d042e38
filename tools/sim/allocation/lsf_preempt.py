"""Parsons and Sevcik's simple preemptive disciplines (section 5.1): LSF-PREEMPT and LSF-PREEMPT-AD.

A suspended job keeps its processes on its units and resumes only there; no unit holds more than five
processes. Decisions come at arrivals, departures and quantum expiries.

LSF-PREEMPT (rigid): first the free units go to waiting jobs as in RTC (in priority order: a suspended job
resumes if all its units are free; a pending job starts at its desired size on free units under the process
cap). Then running jobs are suspended by better waiting jobs under the paper's four rules, which are
storm-mm's own: :func:`storm.mm.preemption.choose_preemptions` with the same-size rule, ranked by acquired
processor time (half of the running job's) or, when demand is known, by remaining demand (10% under it).

LSF-PREEMPT-AD (adaptive, a matrix of rows): row 0 holds the running jobs, and the suspended jobs go into
further rows (each in the first row where its units are free). For each row, and for one more empty row,
the units the row leaves uncommitted are filled with pending jobs at their minimum size (first fit in
priority order) and, when demand is known, with jobs of other rows whose units are all uncommitted there.
A row must also hold every job that has not run the minimum time since it started or resumed; a row that
cannot (its jobs overlap one) is skipped. The row whose best job ranks best wins (ties: the lower row,
so the running row stays when it is as good). Its pending jobs share the units left in it (equally, or by
efficiency when speedup is known: :func:`storm.mm.moldable.share_leftover`); running jobs not in it are
suspended, its suspended jobs resumed, its pending jobs started. The minimum run time and the process cap
are mm/preemption.py's.
"""

from __future__ import annotations

from storm.mm.moldable import share_leftover
from storm.mm.preemption import (
    PreemptionRules,
    Rank,
    Running,
    Waiting,
    choose_preemptions,
    ran_long_enough,
    within_process_cap,
)
from storm.tools.sim.allocation.lsf_cluster import Job, LsfCluster, Phase


def rules_for(cluster: LsfCluster) -> PreemptionRules:
    return PreemptionRules(
        min_run_s=cluster.costs.simple_min_run_s, max_processes=cluster.costs.max_processes
    )


def rank_for(cluster: LsfCluster) -> Rank:
    return Rank.DEMAND if cluster.knowledge.demand else Rank.ACQUIRED


def _usable(cluster: LsfCluster, units: list[int]) -> list[int]:
    """Of ``units``, those that can take one more process (rule 4), the fewest processes first (then by
    number), so that a new job avoids the units suspended jobs wait to resume on."""
    rules, counts = rules_for(cluster), dict(enumerate(cluster.processes))
    return sorted(
        (u for u in units if within_process_cap((u,), counts, 1, rules)),
        key=lambda u: (cluster.processes[u], u),
    )


class Preempt:
    """LSF-PREEMPT: rigid sizes, simple preemption by the same-size rule."""

    name = "PREEMPT"
    preemptive = True

    def decide(self, cluster: LsfCluster) -> None:
        waiting = cluster.ordered(cluster.in_phase(Phase.PENDING, Phase.SUSPENDED))
        for job in waiting:
            free = cluster.free_units()
            if job.phase is Phase.SUSPENDED:
                if job.units <= set(free):
                    cluster.resume(job)
                continue
            usable = _usable(cluster, free)
            if job.spec.desired <= len(usable):
                cluster.start(job, usable[: job.spec.desired])
        rank = rank_for(cluster)
        running = [
            Running(j.job_id, j.units, j.since, j.progress.acquired, cluster.remaining_demand(j))
            for j in cluster.in_phase(Phase.RUNNING)
        ]
        still = [
            Waiting(
                j.job_id,
                j.spec.desired if j.phase is Phase.PENDING else len(j.units),
                j.units if j.phase is Phase.SUSPENDED else None,
                j.progress.acquired,
                cluster.remaining_demand(j),
            )
            for j in cluster.in_phase(Phase.PENDING, Phase.SUSPENDED)
        ]
        open_units = frozenset(cluster.free_units())
        counts = dict(enumerate(cluster.processes))
        chosen = choose_preemptions(
            running,
            still,
            free=open_units,
            processes=counts,
            now=cluster.now,
            rank=rank,
            rules=rules_for(cluster),
        )
        for p in chosen:
            for victim in p.victims:
                cluster.suspend(cluster.jobs[victim])
            job = cluster.jobs[p.by]
            if job.phase is Phase.SUSPENDED:
                cluster.resume(job)
            else:
                cluster.start(job, sorted(p.units))


class PreemptAdaptive:
    """LSF-PREEMPT-AD: the matrix of rows (module docstring)."""

    name = "PREEMPT-AD"
    preemptive = True

    def decide(self, cluster: LsfCluster) -> None:
        rules = rules_for(cluster)
        live = cluster.in_phase(Phase.RUNNING, Phase.DISPATCHING)
        must = [
            j
            for j in live
            if j.phase is Phase.DISPATCHING or not ran_long_enough(j.since, cluster.now, rules)
        ]
        rows: list[list[Job]] = [live]
        for job in cluster.ordered(cluster.in_phase(Phase.SUSPENDED)):
            for row in rows[1:]:
                if not any(job.units & other.units for other in row):
                    row.append(job)
                    break
            else:
                rows.append([job])
        rows.append([])
        pending = cluster.in_phase(Phase.PENDING)
        best: tuple[tuple[float, int], int, list[Job], dict[int, list[int]]] | None = None
        for index, row in enumerate(rows):
            filled = self._fill(cluster, row, must, pending, rows)
            if filled is None:
                continue
            members, placed = filled
            if not members and not placed:
                continue
            score = min(cluster.priority(j) for j in [*members, *(cluster.jobs[i] for i in placed)])
            if best is None or score < best[0]:
                best = (score, index, members, placed)
        if best is None:
            return
        _, _, members, placed = best
        keep = {j.job_id for j in members}
        for job in live:
            if job.job_id not in keep and job.phase is Phase.RUNNING:
                cluster.suspend(job)
        for job in members:
            if job.phase is Phase.SUSPENDED:
                cluster.resume(job)
        for job_id, units in placed.items():
            cluster.start(cluster.jobs[job_id], units)

    def _fill(
        self, cluster: LsfCluster, row: list[Job], must: list[Job], pending: list[Job], rows: list[list[Job]]
    ) -> tuple[list[Job], dict[int, list[int]]] | None:
        """The row's jobs with the must-run ones added (None if they do not fit), and the pending jobs
        placed in what it leaves: job id -> units, their leftovers shared."""
        members = list(row)
        used: set[int] = set().union(*(j.units for j in members))
        for job in must:
            if job in members:
                continue
            if job.units & used:
                return None
            members.append(job)
            used |= job.units
        open_units = [u for u in range(cluster.units) if u not in used]
        candidates: list[Job] = list(pending)
        if cluster.knowledge.demand:
            # Jobs of other rows may move here when every unit they use is uncommitted in this row.
            candidates += [
                j for other in rows for j in other if j not in members and j.phase is not Phase.DISPATCHING
            ]
        placed: dict[int, list[int]] = {}
        for job in cluster.ordered(candidates):
            if job.phase is Phase.PENDING:
                usable = _usable(cluster, open_units)
                if job.spec.minimum <= len(usable):
                    placed[job.job_id] = usable[: job.spec.minimum]
                    open_units = [u for u in open_units if u not in placed[job.job_id]]
            elif job.units <= set(open_units) and job not in members:
                members.append(job)
                open_units = [u for u in open_units if u not in job.units]
        if placed:
            jobs = [cluster.jobs[i] for i in placed]
            spare = _usable(cluster, open_units)
            sizes = share_leftover(
                [len(placed[j.job_id]) for j in jobs], [j.spec.maximum for j in jobs], len(spare),
                [cluster.known_speedup(j) for j in jobs], cluster.processors_per_unit,
            )  # fmt: skip
            for job, size in zip(jobs, sizes, strict=True):
                extra = size - len(placed[job.job_id])
                placed[job.job_id] = placed[job.job_id] + spare[:extra]
                spare = spare[extra:]
        return members, placed
