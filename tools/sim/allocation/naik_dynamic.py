"""Naik, Setia and Squillante's dynamic partitioning (DP, SC'93 section 3.4). Simulator only: a running job
changes its number of processors, which the application itself must do (it redistributes its data at the
end of an iteration); storm cannot do that to a running MPI program.

DP is AP (naik_cluster.py) plus reconfigurable medium and large jobs. N is the number of jobs in the
system, the arriving one included, and P/N = 128 / N units (of 4 processors), rounded down. The
*interruptible list* holds the running medium and large jobs that are not being reconfigured, were last
reconfigured at least T ago, and have more than one iteration left (a job in its last iteration would
end before it reconfigured).

- Arrival of a job wanting Req units: it gets Req if that many are free and nobody waits. Else, if at
  least Min_sys units are free and no interruptible job holds more than P/N, it gets all the free units.
  Else it waits in the FCFS queue, and if P/N >= Min_sys the interruptible jobs holding more than P/N,
  largest first, are asked to shrink to P/N, just enough of them that the free units (with what shrinks
  already under way will free) reach min(Req, P/N). If P/N < Min_sys nobody shrinks and the queue is
  served as AP serves it.
- Release (a departure, or a shrink giving units back): the free units are split equally among the
  waiting jobs, each between Min_sys and its Req (AP's rule, storm-mm's ``equal_split``). Then, if more
  than M processors are free and an interruptible job holds fewer than P/N units, the smallest such job is
  asked to grow to min(P/N, S + M/2, Req) (the paper's OCR reads "S + kf/2": M/2 here, so that a job never
  takes more than half the free processors, as the paper says).
- Reconfiguration (the paper's two phases): the job finishes its current iteration (each job has
  :attr:`DpParameters.iterations` of equal work), then phase 1 moves its whole data set from its old
  partition onto Min_sys processors, and phase 2 spreads it over the new partition. Each phase takes
  data / (Min_sys x bandwidth) + one message latency per processor involved (100 MB/s and 5 us, the paper's
  network). A growing job takes its new units when it is asked (they wait for it, idle, until its iteration
  ends) and uses them from phase 1 on; a shrinking job gives its excess back at the end of phase 1. It
  computes again after phase 2 and stays off the interruptible list for T.

The paper tuned M and T and does not report them; the data sets' sizes and the iteration counts are not
in it either. :class:`DpParameters` holds our values, which every report states.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from storm.mm.moldable import equal_split
from storm.tools.sim.allocation.naik_cluster import BOUNDARY, PHASE1, PHASE2, Live, NaikCluster
from storm.tools.sim.allocation.naik_workload import MIN_SYS, UNIT, UNITS


@dataclass(frozen=True)
class DpParameters:
    """DP's tuning (M, T) and our model of reconfiguration; all ours, the paper reports none."""

    grow_threshold: int = 64  # M, processors
    quiet_s: float = 300.0  # T
    iterations: int = 100  # per job, of equal work
    data_bytes: dict[str, float] = field(default_factory=lambda: {"medium": 1e9, "large": 4e9})
    bandwidth: float = 100e6  # bytes/s per processor
    latency_s: float = 5e-6

    def phase_s(self, kind: str, old_units: int, new_units: int) -> float:
        """One phase's duration for a job of ``kind`` going from ``old_units`` to ``new_units``."""
        data = self.data_bytes.get(kind, 0.0)
        return data / (MIN_SYS * self.bandwidth) + self.latency_s * max(old_units, new_units) * UNIT


class Dynamic:
    """DP (module docstring)."""

    name = "DP"

    def __init__(self, parameters: DpParameters = DpParameters()) -> None:
        self.parameters = parameters
        self.queue: deque[Live] = deque()
        self.freeing = 0  # units that shrinks under way will give back
        self.running_large: dict[int, Live] = {}  # the running medium and large jobs, by id

    def waiting(self) -> int:
        return len(self.queue)

    @staticmethod
    def share(cluster: NaikCluster) -> int:
        return UNITS // max(cluster.in_system, 1)

    def interruptible(self, cluster: NaikCluster) -> list[Live]:
        """The interruptible list, by job id."""
        out = []
        for job in self.running_large.values():
            if job.reconf is not None or cluster.now < job.eligible_at:
                continue
            computed = (cluster.now - job.updated) * job.progress.rate(job.units * UNIT)
            if (job.progress.remaining - computed) * self.parameters.iterations <= 1 + 1e-9:
                continue
            out.append(job)
        return sorted(out, key=lambda j: j.job_id)

    def _start(self, cluster: NaikCluster, job: Live, units: int) -> None:
        cluster.start(job, units)
        if job.spec.kind != "small":
            self.running_large[job.job_id] = job

    def arrive(self, cluster: NaikCluster, job: Live) -> None:
        minimum = MIN_SYS // UNIT
        req = job.spec.desired
        share = self.share(cluster)
        if not self.queue and req <= cluster.free:
            self._start(cluster, job, req)
            return
        bigger = [j for j in self.interruptible(cluster) if j.units > share]
        if not self.queue and cluster.free >= minimum and not bigger:
            self._start(cluster, job, cluster.free)
            return
        self.queue.append(job)
        if bigger and share >= minimum:
            need = min(req, share) - cluster.free - self.freeing
            for victim in sorted(bigger, key=lambda j: (-j.units, j.job_id)):
                if need <= 0:
                    break
                need -= victim.units - share
                self._notify(cluster, victim, share)
        else:
            self._serve_queue(cluster)

    def release(self, cluster: NaikCluster, freed_by: Live | None) -> None:
        if freed_by is not None:
            self.running_large.pop(freed_by.job_id, None)
        self._serve_queue(cluster)
        share = self.share(cluster)
        if cluster.free * UNIT <= self.parameters.grow_threshold:
            return
        small = [j for j in self.interruptible(cluster) if j.units < share]
        if not small:
            return
        job = min(small, key=lambda j: (j.units, j.job_id))
        target = min(share, job.units + self.parameters.grow_threshold // UNIT // 2, job.spec.desired)
        if target > job.units:
            self._notify(cluster, job, target)

    def _serve_queue(self, cluster: NaikCluster) -> None:
        sizes = equal_split([j.spec.desired for j in self.queue], cluster.free, MIN_SYS // UNIT)
        for size in sizes:
            self._start(cluster, self.queue.popleft(), size)

    def _notify(self, cluster: NaikCluster, job: Live, target: int) -> None:
        """Ask ``job`` to move to ``target`` units at the end of its current iteration."""
        if target > job.units:
            cluster.take(target - job.units)  # reserved now, used from phase 1 on
            cluster.counts["grow"] += 1
        else:
            self.freeing += job.units - target
            cluster.counts["shrink"] += 1
        job.reconf = ("boundary", target)
        # Up to date without cancelling its end: the rate does not change until the boundary.
        job.progress.run(cluster.now - job.updated, job.units * UNIT)
        job.updated = cluster.now
        iterations = self.parameters.iterations
        done = (1 - job.progress.remaining) * iterations
        boundary = math.floor(done + 1e-9)
        if done - boundary > 1e-9:
            boundary += 1
        delay = (boundary - done) / iterations / job.progress.rate(job.units * UNIT)
        cluster.schedule(delay, BOUNDARY, job)

    def step(self, cluster: NaikCluster, kind: int, job: Live) -> None:
        assert job.reconf is not None
        _, target = job.reconf
        old = job.units
        if kind == BOUNDARY:
            cluster.stop_computing(job)
            if target > old:
                job.units = target
            job.reconf = ("phase 1", target)
            cluster.schedule(self.parameters.phase_s(job.spec.kind, old, target), PHASE1, job)
        elif kind == PHASE1:
            job.reconf = ("phase 2", target)
            cluster.schedule(self.parameters.phase_s(job.spec.kind, old, target), PHASE2, job)
            if target < old:
                job.units = target
                self.freeing -= old - target
                cluster.give_back(old - target)
                self.release(cluster, None)
        elif kind == PHASE2:
            job.reconf = None
            job.eligible_at = cluster.now + self.parameters.quiet_s
            cluster.begin_computing(job)
