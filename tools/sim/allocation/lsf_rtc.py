"""Parsons and Sevcik's run-to-completion disciplines (section 5.1): LSF-RTC, LSF-RTC-AD, LSF-RTC-ADSUBSET.

At every arrival and departure the scheduler scans the pending jobs in order (arrival order, or shortest
service demand first when demand is known: lsf_cluster.py's ``priority``):

- RTC (rigid): start every job whose desired size fits in the free units, skipping those that do not;
- RTC-AD: select every job whose minimum fits, then share the leftover units among the selected jobs,
  equally or, when speedup is known, each to the job most efficient after taking it;
- RTC-ADSUBSET: commit to the first N' of the first-fit jobs and fill the rest by a subset sum that leaves
  the fewest surplus units (delta = 5).

The adaptive sizes are storm-mm's: :func:`storm.mm.moldable.choose_sizes`, the function the machine manager
uses for moldable jobs. A started job keeps its units until it ends. Jobs take the lowest free units.
"""

from __future__ import annotations

from storm.mm.moldable import MoldableRequest, choose_sizes
from storm.tools.sim.allocation.lsf_cluster import LsfCluster, Phase


class RunToCompletion:
    """RTC (``adaptive`` False), RTC-AD, or RTC-ADSUBSET (``subset``)."""

    preemptive = False

    def __init__(self, *, adaptive: bool = False, subset: bool = False) -> None:
        if subset and not adaptive:
            raise ValueError("SUBSET is a variant of the adaptive discipline")
        self.adaptive = adaptive
        self.subset = subset
        self.name = "RTC-ADSUBSET" if subset else "RTC-AD" if adaptive else "RTC"

    def decide(self, cluster: LsfCluster) -> None:
        queue = cluster.ordered(cluster.in_phase(Phase.PENDING))
        free = cluster.free_units()
        if not self.adaptive:
            for job in queue:
                if job.spec.desired <= len(free):
                    cluster.start(job, free[: job.spec.desired])
                    free = free[job.spec.desired :]
            return
        requests = [
            MoldableRequest(j.job_id, j.spec.minimum, j.spec.maximum, cluster.known_speedup(j)) for j in queue
        ]
        sizes = choose_sizes(
            requests, len(free), jobs_in_system=len(cluster.jobs), subset=self.subset,
            processors_per_unit=cluster.processors_per_unit,
        )  # fmt: skip
        for job_id, size in sizes:
            cluster.start(cluster.jobs[job_id], free[:size])
            free = free[size:]
