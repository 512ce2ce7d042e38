"""The gang cycle: which row of the Ousterhout matrix runs now, and how long each job has been stopped.

Under gang scheduling the MM publishes a heartbeat every time slice naming the row that runs next. Rows take
turns in index order, and rows that hold no job are skipped, so a job alone in the matrix runs all the
time. Each job's suspended time (the periods when another row ran) is accounted here, because suspended time
does not count against a job's time limit.

Pure code: time is passed in; the machine manager and the simulator drive it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class GangCycle:
    slice: float
    # FCS: every tslots_max slots of a job, all its processes return to CS together (None: never).
    tslots_max: int | None = None
    seq: int = 0
    active: int | None = None
    # When the active row took over; accounting is closed up to here for every job.
    since: float = 0.0
    # Per job: suspended seconds accounted so far, and the time its accounting has reached.
    suspended: dict[int, float] = field(default_factory=dict)
    # Per job: the time slots its row has had (tslots); and the jobs due for FCS's reset at this beat.
    slots: dict[int, int] = field(default_factory=dict)
    resets: tuple[int, ...] = ()
    _upto: dict[int, float] = field(default_factory=dict)
    _present: set[int] = field(default_factory=set)  # jobs in the matrix when the current slot began

    def add(self, job_id: int, now: float, suspended: float = 0.0) -> None:
        """A job joins the matrix (started, or recovered after a restart with what it had accrued)."""
        self.suspended[job_id] = suspended
        self._upto[job_id] = now

    def pause(self, job_id: int, row: int, now: float) -> float:
        """A job leaves the matrix for a while (preemption suspended it): its suspended time up to ``now``.
        Its count of slots stays, so that the MM and its nodes (which count no slot for it meanwhile) still
        agree on when FCS resets it after it comes back with :meth:`add`."""
        total = self.suspended_time(job_id, row, now)
        self._upto.pop(job_id, None)
        self.suspended.pop(job_id, None)
        return total

    def forget(self, job_id: int) -> float:
        """A job leaves the matrix; returns its suspended time (account before calling)."""
        self._upto.pop(job_id, None)
        self.slots.pop(job_id, None)
        return self.suspended.pop(job_id, 0.0)

    def account(self, now: float, rows: Mapping[int, int]) -> None:
        """Close the books up to ``now``: every job not in the active row was suspended since last time.

        Call it before the rows of jobs change, so that time is charged to the row a job was really in.
        """
        if self.active is not None:
            for job_id, row in rows.items():
                start = self._upto.get(job_id, self.since)
                if row != self.active and now > start:
                    self.suspended[job_id] = self.suspended.get(job_id, 0.0) + (now - start)
        for job_id in rows:
            self._upto[job_id] = now
        self.since = now

    def advance(self, now: float, occupied: Sequence[int], rows: Mapping[int, int]) -> int | None:
        """End the current slice: account for it, pick the next occupied row (None: the matrix is empty)."""
        self.account(now, rows)
        # The jobs of the row the last heartbeat named (row 0 while the matrix was empty: a job placed then
        # runs at once) have just had a slot, if they were there for all of it, which is how their nodes
        # count too; FCS resets those that reached a multiple of tslots_max, in the next heartbeat.
        announced = 0 if self.active is None else self.active
        ended = [job_id for job_id, row in rows.items() if job_id in self._present and row == announced]
        self._present = set(rows)
        self.seq += 1
        for job_id in ended:
            self.slots[job_id] = self.slots.get(job_id, 0) + 1
        limit = self.tslots_max
        self.resets = tuple(sorted(j for j in ended if limit and self.slots[j] % limit == 0))
        if not occupied:
            self.active = None
            return None
        later = [row for row in occupied if self.active is None or row > self.active]
        self.active = later[0] if later else occupied[0]
        return self.active

    def suspended_time(self, job_id: int, row: int, now: float) -> float:
        """Suspended seconds so far, counting the current slice when the job's row is not the active one."""
        closed = self.suspended.get(job_id, 0.0)
        if self.active is None or row == self.active:
            return closed
        return closed + max(0.0, now - self._upto.get(job_id, self.since))
