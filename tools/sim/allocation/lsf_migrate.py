"""Parsons and Sevcik's migratable and malleable disciplines (section 5.1): LSF-MIG, LSF-MIG-AD(SUBSET),
LSF-MALL-AD(SUBSET). Simulator only: they checkpoint running jobs and restart them elsewhere (MIG) or on
another number of processors (MALL), which needs the application's cooperation that storm cannot give a
running MPI program.

At every arrival, departure and quantum expiry: jobs running for less than the minimum time (10 minutes:
migration is expensive) since they started keep their units, as do jobs being dispatched. Every other job,
running, stopped or pending, competes for the rest in priority order (least acquired processor time, or
least remaining demand when it is known):

- MIG: first fit at each job's desired size; a restart uses the same size;
- MIG-AD: first fit at the minimum for a job never started and at its first size for one that has run
  (that size stays), the leftover units shared among the jobs starting for the first time;
- MALL-AD: first fit at every job's minimum, the leftovers shared among all the chosen jobs; a running job
  given another size is checkpointed and restarted at it;
- the SUBSET variants choose as RTC-ADSUBSET does (mm/moldable.py ``choose_sizes``, the same function).

Running jobs not chosen are checkpointed: their units stay unavailable for a minute, then they join the
stopped jobs. Chosen jobs start on the free units in priority order; one that does not fit yet (its units are
still being released) waits for the decision that the release brings.
"""

from __future__ import annotations

from storm.mm.moldable import MoldableRequest, choose_sizes
from storm.mm.preemption import PreemptionRules, ran_long_enough
from storm.tools.sim.allocation.lsf_cluster import Job, LsfCluster, Phase

MODES = ("rigid", "adaptive", "malleable")


class Migrate:
    """MIG (``mode`` rigid), MIG-AD (adaptive) or MALL-AD (malleable); ``subset`` for the SUBSET variants."""

    preemptive = True

    def __init__(self, mode: str = "rigid", *, subset: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}")
        if subset and mode == "rigid":
            raise ValueError("SUBSET is a variant of the adaptive disciplines")
        self.mode = mode
        self.subset = subset
        base = {"rigid": "MIG", "adaptive": "MIG-AD", "malleable": "MALL-AD"}[mode]
        self.name = base + ("SUBSET" if subset else "")

    def _request(self, cluster: LsfCluster, job: Job) -> MoldableRequest:
        spec = job.spec
        speedup = cluster.known_speedup(job)
        if self.mode == "rigid":
            return MoldableRequest(job.job_id, spec.desired, spec.desired)
        if self.mode == "adaptive" and job.size:
            return MoldableRequest(job.job_id, job.size, job.size)
        return MoldableRequest(job.job_id, spec.minimum, spec.maximum, speedup)

    def decide(self, cluster: LsfCluster) -> None:
        rules = PreemptionRules(min_run_s=cluster.costs.migrate_min_run_s)
        held = [
            j for j in cluster.in_phase(Phase.DISPATCHING, Phase.RUNNING)
            if j.phase is Phase.DISPATCHING or not ran_long_enough(j.since, cluster.now, rules)
        ]  # fmt: skip
        capacity = cluster.units - sum(j.size for j in held)
        held_ids = {j.job_id for j in held}
        competing = cluster.ordered(
            j
            for j in cluster.in_phase(Phase.RUNNING, Phase.STOPPED, Phase.PENDING)
            if j.job_id not in held_ids
        )
        requests = [self._request(cluster, j) for j in competing]
        chosen = dict(
            choose_sizes(
                requests,
                capacity,
                jobs_in_system=len(cluster.jobs),
                subset=self.subset,
                processors_per_unit=cluster.processors_per_unit,
            )
        )
        for job in competing:
            if job.phase is not Phase.RUNNING:
                continue
            if job.job_id not in chosen or chosen[job.job_id] != job.size:
                cluster.checkpoint(job)
        for job in competing:
            if job.phase not in (Phase.PENDING, Phase.STOPPED) or job.job_id not in chosen:
                continue
            free = cluster.free_units()
            size = chosen[job.job_id]
            if size <= len(free):
                cluster.start(job, free[:size])
