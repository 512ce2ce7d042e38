"""Accounting: ``job_history`` -> ``history`` (``storm history``, sacct's job), past and present jobs from
storm-mm's store a page at a time.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

import dataclasses

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import check as _check
from storm.mm.codec import message
from storm.mm.protocol.client import Reply, Request
from storm.mm.protocol.records import CLASSES, JOB_STATES

# --------------------------------------------------------------------------------------------------------
# Accounting: `storm history` (sacct's job). storm-mm answers from a read-only connection to its store, off
# its event loop (mm/history_db.py); who may see what is mm/accounting.py's.


@message("job_history")
@dataclass(frozen=True, kw_only=True)
class JobHistory(Request):
    """Past and present jobs from the store, matching every filter given (empty: any), in order of id.

    A job matches the window [``since``, ``until``] if it was submitted by ``until`` and had not ended
    before ``since`` (sacct's rule: it was queued or ran in the window). ``users`` are names or uids in
    decimal; a caller who is neither root nor an operator sees only their own jobs whatever is asked (with
    ``all_users`` an operator sees everyone's; without it and without ``users``, their own). One page of at
    most ``limit`` jobs (0 or over HISTORY_PAGE: HISTORY_PAGE) of ids above ``after`` comes at a time;
    ``HistoryPage.more`` says where the next one begins.
    """

    users: tuple[str, ...] = ()
    all_users: bool = False
    states: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    names: tuple[str, ...] = ()
    job_ids: tuple[int, ...] = ()
    limit: int = 0
    after: int = 0

    def __post_init__(self) -> None:
        _check(all(s in JOB_STATES for s in self.states), f"states: each one of {', '.join(JOB_STATES)}")
        _check(self.limit >= 0 and self.after >= 0, "limit and after must be >= 0")
        _check(len(self.users) + len(self.names) + len(self.job_ids) <= 10_000, "at most 10,000 values")


HISTORY_PAGE = 10_000  # jobs in one history page at most


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    """One job as `storm history` shows it. ``cpu_user``/``cpu_system``: its ranks' CPU seconds, summed
    (None: none measured, as for a job that never started or ran under an older storm); ``class_times``:
    under FCS, the seconds its ranks spent in each class (CS, F, DC), summed over its ranks ({}: not run
    under FCS)."""

    id: int
    name: str
    user: str
    uid: int
    state: str
    ranks: int
    nodes: tuple[str, ...]
    submit_time: float
    start_time: float | None
    end_time: float | None
    exit_code: int | None
    reason: str
    suspended_time: float = 0.0
    requeues: int = 0
    cpu_user: float | None = None
    cpu_system: float | None = None
    class_times: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.state in JOB_STATES, f"unknown job state {self.state!r}")
        _check(all(k in CLASSES for k in self.class_times), "class_times: CS, F and DC only")


@message("history")
@dataclass(frozen=True, kw_only=True)
class HistoryPage(Reply):
    jobs: tuple[HistoryEntry, ...]
    # More jobs match, of ids above this one (ask again with after=more); 0: this was the last page.
    more: int = 0
