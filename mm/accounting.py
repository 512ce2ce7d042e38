"""Accounting (``storm history``, sacct's job): what a job used, and who may see which jobs. Pure rules.

- **CPU time**: the sum over a job's ranks of the user and system CPU seconds each used, as the job shell's
  ``wait4`` measured it when it reaped the rank (nm/shell.py; the rank's own and that of the children it
  waited for, as sacct's TotalCPU). Ranks with no measurement (never started, written off with a lost node,
  reported by an older storm-nm) count for nothing; a job with none at all has no CPU time (None).
- **Time per FCS class**: each rank is CS from the job's start (storm-nm's classifier starts every process
  there) and then in the class of its latest change (mm/store.py ``class_changes``, on its node's clock),
  until the job's end; the seconds are summed over the job's ranks, each rank's clamped to [start, end]. So
  the three together are at most the job's elapsed time times its ranks. A requeued job's earlier runs and
  processes spawned with MPI_Comm_spawn are not counted.
- **Visibility**, as sacct: a user sees only their own jobs; root sees everyone's by default; an operator
  ([mm] operators, mm/rights.py) sees everyone's with ``--allusers`` or by naming the users.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from storm.mm.protocol import ClassChange, JobHistory, Klass, RankExit
from storm.mm.rights import Credentials, is_operator


@dataclass(frozen=True)
class Usage:
    """What a job used, as stored with it when it ends."""

    cpu_user: float | None = None
    cpu_system: float | None = None
    class_times: dict[str, float] | None = None  # None: not run under FCS


def cpu_seconds(exits: Iterable[RankExit]) -> tuple[float | None, float | None]:
    """(user, system) CPU seconds summed over the ranks that have them; (None, None) if none has."""
    user = system = 0.0
    measured = False
    for e in exits:
        if e.cpu_user is not None or e.cpu_system is not None:
            measured = True
            user += e.cpu_user or 0.0
            system += e.cpu_system or 0.0
    return (user, system) if measured else (None, None)


def class_seconds(changes: Iterable[ClassChange], ranks: int, start: float, end: float) -> dict[str, float]:
    """Seconds in each FCS class summed over ranks 0..ranks-1, between ``start`` and ``end`` (see the
    module's docstring). O(c log c) for c changes."""
    totals = {k.value: 0.0 for k in Klass}
    if end <= start:
        return totals
    per_rank: dict[int, list[ClassChange]] = {}
    for c in changes:
        if 0 <= c.rank < ranks:
            per_rank.setdefault(c.rank, []).append(c)
    for rank in range(ranks):
        klass, since = Klass.CS.value, start
        for c in sorted(per_rank.get(rank, ()), key=lambda c: c.time):
            at = min(max(c.time, start), end)
            totals[klass] += at - since
            klass, since = c.new, at
        totals[klass] += end - since
    return totals


def usage(
    exits: Iterable[RankExit],
    changes: Sequence[ClassChange] | None,
    ranks: int,
    start: float | None,
    end: float,
) -> Usage:
    """A job's usage at its end; ``changes`` None: not run under FCS (no class times)."""
    user, system = cpu_seconds(exits)
    times = None
    if changes is not None:
        times = class_seconds(changes, ranks, start, end) if start is not None else {}
    return Usage(cpu_user=user, cpu_system=system, class_times=times)


class NotAllowed(ValueError):
    """A history request for jobs the caller may not see."""


@dataclass(frozen=True)
class HistoryQuery:
    """A history request as the store answers it: who may be seen is settled (``uids`` and ``users``
    both empty: anyone's jobs; else those of any uid or user name listed)."""

    uids: tuple[int, ...] = ()
    users: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    names: tuple[str, ...] = ()
    job_ids: tuple[int, ...] = ()
    limit: int = 0
    after: int = 0


def history_query(msg: JobHistory, caller: Credentials, operators: Sequence[str], page: int) -> HistoryQuery:
    """The query ``caller`` may have answered for ``msg``; NotAllowed (with the reason) for other users'
    jobs asked by someone who may see only their own."""
    uids = tuple(int(u) for u in msg.users if u.isdigit())
    names = tuple(u for u in msg.users if not u.isdigit())
    everyone = is_operator(caller.uid, caller.user, operators)
    if not everyone:
        others = [u for u in names if u != caller.user] + [str(u) for u in uids if u != caller.uid]
        if msg.all_users or others:
            asked = "every user's jobs" if msg.all_users else f"the jobs of {', '.join(others)}"
            raise NotAllowed(
                f"you ({caller.user}) asked for {asked}, but only root and [mm] operators see other users'"
                " jobs: everyone else sees their own"
            )
        uids, names = (caller.uid,), ()
    elif not msg.users and not msg.all_users and caller.uid != 0:
        uids = (caller.uid,)  # an operator sees their own unless asking for more, as sacct (root: all)
    limit = min(msg.limit or page, page)
    return HistoryQuery(
        uids=uids, users=names, states=msg.states, since=msg.since, until=msg.until, names=msg.names,
        job_ids=msg.job_ids, limit=limit, after=msg.after,
    )  # fmt: skip
