"""What node managers report about running processes: mpihook's measurements, FCS classes and their changes,
and the execution profile; kept in memory while a job runs, the timeline and the final profile in the store.

The controller (mm/core.py) decides which reports to accept (a running job, from one of its nodes).
"""

from __future__ import annotations

from collections import Counter

from storm.mm.jobs import Job
from storm.mm.protocol import JobNodeDone, JobStats, ProfileEntry, RankStats, StatsView
from storm.mm.storage import Storage


class Reports:
    def __init__(self, store: Storage) -> None:
        self.store = store
        # Per running job, per node: when its latest report arrived, its ranks, and their profile.
        self.live: dict[int, dict[str, tuple[float, tuple[RankStats, ...], tuple[ProfileEntry, ...]]]] = {}

    def job_stats(self, msg: JobStats, now: float) -> None:
        self.live.setdefault(msg.job_id, {})[msg.node] = (now, msg.ranks, msg.profile)
        if msg.changes:
            self.store.add_class_changes(msg.changes)

    def node_done(self, msg: JobNodeDone) -> None:
        """A node's final word on a job: its profile outlives the job (durable)."""
        if msg.profile:
            self.store.add_profile(msg.job_id, msg.profile)

    def forget(self, job_id: int) -> None:
        self.live.pop(job_id, None)

    def processes(self, job_ids: tuple[int, ...]) -> list[RankStats]:
        """The latest measurements and classes of every process of the given (else every running) job."""
        wanted = job_ids or tuple(sorted(self.live))
        found = [r for j in wanted for _, ranks, _ in self.live.get(j, {}).values() for r in ranks]
        return sorted(found, key=lambda r: (r.job_id, r.rank))

    def hang(self, job: Job, now: float, after: float) -> str:
        """The watchdog's warning for a running job ("" if none): every rank of the job has been inside one
        blocking MPI call for at least ``after`` seconds (0: never), as its nodes last reported. A rank with
        no measurement (not in MPI yet, --no-hook, a foreign MPI) keeps the job from being suspected: the
        watchdog only says what mpihook knows; a job preemption suspended is stopped, not stuck. O(ranks)."""
        reports = self.live.get(job.id)
        if after <= 0 or not reports or job.suspended_at is not None:
            return ""
        ranks = [(when, r) for when, ranks, _ in reports.values() for r in ranks]
        if len(ranks) < job.ranks or not all(r.call for _, r in ranks):
            return ""
        stuck = min(r.call_time + (now - when) for when, r in ranks)
        if stuck < after:
            return ""
        calls = Counter(r.call for _, r in ranks)
        where = ", ".join(f"{call} ({n} of {len(ranks)})" for call, n in sorted(calls.items()))
        return f"possibly deadlocked: every rank in a blocking MPI call for over {int(stuck)} s: {where}"

    def view(self, job: Job, now: float, hang_after: float = 0.0) -> StatsView:
        """The job's ranks as last reported while it ran; its profile live, or as stored once it ended."""
        reports = self.live.get(job.id, {})
        ranks = sorted((r for _, ranks, _ in reports.values() for r in ranks), key=lambda r: r.rank)
        newest = max((when for when, _, _ in reports.values()), default=None)
        profile = [e for _, _, entries in reports.values() for e in entries]
        if not reports:
            profile = self.store.profile(job.id)
        return StatsView(
            job_id=job.id,
            state=job.state.value,
            age=-1.0 if newest is None else now - newest,
            ranks=tuple(ranks),
            profile=tuple(sorted(profile, key=lambda e: (e.rank, e.klass))),
            warning=self.hang(job, now, hang_after) if job.state.active else "",
        )
