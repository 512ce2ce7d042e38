"""``storm history``'s reads: the store's jobs for a history query, from a read-only SQLite connection.

storm-mm answers history queries off its event loop: a worker thread runs them on a connection of its own,
opened read-only, and encodes the reply there too; the loop only sends the bytes. SQLite in WAL mode lets
that connection read a consistent snapshot while the loop's connection writes, and the sqlite3 module
releases the GIL while SQLite works, so a long query costs the MM's loop little (the figure is in the
README, from tools/bench_history.py).

What makes it fast is the index on ``end_time`` (mm/store.py, migration 7): the window's rule, ``end_time
>= since OR end_time IS NULL`` (a job that had not ended by --since), is answered from it, and only the
rows in the window are read. The ``+id`` in the query keeps SQLite from walking the whole table in order
of id (for ``ORDER BY id``) instead: it then sorts the rows of the window, which costs them alone.
:func:`query_plan` shows the plan, and a test checks that it names the index.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import msgpack

from storm.mm import protocol as p
from storm.mm.accounting import HistoryQuery

_COLUMNS = (
    "id, name, user, uid, state, ranks, placement, submit_time, start_time, end_time, exit_code, reason, "
    "suspended_time, requeues, cpu_user, cpu_system, time_cs, time_f, time_dc"
)


def _marks(values: tuple[object, ...]) -> str:
    return ", ".join("?" * len(values))


def history_sql(q: HistoryQuery) -> tuple[str, list[object]]:
    """The query for one page (one row more than the page: are there more?) and its parameters."""
    where: list[str] = []
    args: list[object] = []
    if q.job_ids:
        where.append(f"id IN ({_marks(q.job_ids)})")
        args += q.job_ids
    if q.since is not None:
        where.append("(end_time >= ? OR end_time IS NULL)")
        args.append(q.since)
    if q.until is not None:
        where.append("submit_time <= ?")
        args.append(q.until)
    who = []
    if q.uids:
        who.append(f"uid IN ({_marks(q.uids)})")
        args += q.uids
    if q.users:
        who.append(f"user IN ({_marks(q.users)})")
        args += q.users
    if who:
        where.append(f"({' OR '.join(who)})")
    for column, values in (("state", q.states), ("name", q.names)):
        if values:
            where.append(f"{column} IN ({_marks(values)})")
            args += values
    # By id if ids are given (the primary key finds them); else not (see the module's docstring).
    key = "id" if q.job_ids else "+id"
    where.append(f"{key} > ?")
    args.append(q.after)
    limit = q.limit or p.HISTORY_PAGE
    clause = " AND ".join(where)  # (placeholders only: every value is a parameter)
    sql = f"SELECT {_COLUMNS} FROM jobs WHERE {clause} ORDER BY {key} LIMIT {int(limit) + 1}"  # noqa: S608
    return sql, args


def _fields(row: tuple[Any, ...]) -> dict[str, Any]:
    """A row as HistoryEntry's fields: SQLite's values, of the column types in mm/store.py."""
    (job_id, name, user, uid, state, ranks, placement, submit, start, end, code, reason, suspended, requeues,
     cpu_user, cpu_system, cs, f, dc) = row  # fmt: skip
    placed = msgpack.unpackb(placement)
    return {
        "id": job_id, "name": name, "user": user, "uid": uid, "state": state, "ranks": len(placed) or ranks,
        "nodes": list(dict.fromkeys(str(n) for n, _pe in placed)), "submit_time": submit,
        "start_time": start, "end_time": end, "exit_code": code, "reason": reason,
        "suspended_time": suspended, "requeues": requeues, "cpu_user": cpu_user, "cpu_system": cpu_system,
        "class_times": {} if cs is None else {"CS": cs, "F": f, "DC": dc},
    }  # fmt: skip


class HistoryReader:
    """A read-only connection to the store at ``path`` (which must exist), for one thread at a time.

    Opened at once and kept: storm-mm's descriptors stay as they were when it started, whatever it is asked
    (a leak check of its tests counts them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
        self._db: sqlite3.Connection | None = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("SELECT 1 FROM jobs LIMIT 0").fetchall()  # a first read opens the WAL file now

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.ProgrammingError("the history reader is closed")
        return self._db

    def _rows(self, q: HistoryQuery) -> tuple[list[dict[str, Any]], int]:
        sql, args = history_sql(q)
        rows = self._connection().execute(sql, args).fetchall()
        limit = q.limit or p.HISTORY_PAGE
        found = [_fields(r) for r in rows[:limit]]
        return found, (found[-1]["id"] if len(rows) > limit else 0)

    def page(self, q: HistoryQuery) -> tuple[list[p.HistoryEntry], int]:
        """The jobs of one page, in order of id, and the id after which more match (0: none)."""
        found, more = self._rows(q)
        return [p.HistoryEntry(**{**f, "nodes": tuple(f["nodes"])}) for f in found], more

    def answer(self, q: HistoryQuery, req: int) -> bytes:
        """The encoded reply to a history request (``history``, or ``error`` if the store cannot be read).

        The page is packed from the rows as they are, not through HistoryEntry records and the codec's
        generic encoder: that halves what a page costs the MM (and the time its loop waits for the GIL).
        A test checks that it decodes to the records :meth:`page` makes."""
        try:
            found, more = self._rows(q)
        except sqlite3.Error as exc:
            error = p.Error(req=req, code="internal", text=f"cannot read the job history: {exc}")
            return p.encode(error)
        packed: bytes = msgpack.packb(
            {"op": p.HistoryPage.op, "req": req, "jobs": found, "more": more}, use_bin_type=True
        )
        return packed

    def query_plan(self, q: HistoryQuery) -> list[str]:
        """SQLite's plan for the query (EXPLAIN QUERY PLAN), one step a line."""
        sql, args = history_sql(q)
        return [str(row[3]) for row in self._connection().execute(f"EXPLAIN QUERY PLAN {sql}", args)]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
