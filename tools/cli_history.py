"""``storm history``: past and present jobs from storm-mm's store, as Slurm's ``sacct`` shows them.

Filters, times and field names are sacct's (``--format JobID,State,TotalCPU``); ``--json`` gives every
field of every job for scripts, ``--csv`` the chosen fields. What a job used (CPU time, time per FCS class)
is defined in mm/accounting.py; who may see which jobs too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeAlias

from storm.mm import protocol as p
from storm.tools.client import Client

DEFAULT_FORMAT = "JobID,JobName,User,State,NTasks,Elapsed,TotalCPU,ExitCode"

_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hr": 3600,
          "hour": 3600, "d": 86400, "day": 86400, "w": 604800, "week": 604800}  # fmt: skip
_NAMED = {"midnight": (0, 0), "today": (0, 0), "noon": (12, 0), "fika": (15, 0), "teatime": (16, 0)}


class HistoryUsageError(ValueError):
    """A bad option value; storm's main turns it into a usage error (exit status 2)."""


def parse_when(text: str, now: float) -> float:
    """A point in time as sacct takes it: ``YYYY-MM-DD[THH:MM[:SS]]``, ``MM/DD[/YY]``, ``MMDD[YY]``,
    ``HH:MM[:SS]`` (today), ``now[{+|-}N[seconds|minutes|hours|days|weeks]]``, ``midnight``, ``noon``,
    ``today``, ``tomorrow``, ``yesterday``; and storm's own durations (``30s``, ``5m``, ``2h``, ``1d``) as
    that long ago. Local time."""
    raw = text.strip()
    t = raw.lower()
    day = datetime.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    relative = re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", t)
    if relative:
        if relative[1] is None:
            return now
        unit = relative[3].rstrip("s") if len(relative[3]) > 1 else relative[3]
        if unit and unit not in _UNITS:
            raise HistoryUsageError(
                f"{raw!r}: unknown unit {relative[3]!r} (seconds, minutes, hours, days, weeks)"
            )
        step = int(relative[2]) * _UNITS[unit or "s"]
        return now + step if relative[1] == "+" else now - step
    ago = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", t)
    if ago:
        return now - float(ago[1]) * _UNITS[ago[2]]
    if t in _NAMED:
        hour, minute = _NAMED[t]
        return day.replace(hour=hour, minute=minute).timestamp()
    if t in ("tomorrow", "yesterday"):
        return (day + datetime.timedelta(days=1 if t == "tomorrow" else -1)).timestamp()
    try:
        return _calendar(t, day).timestamp()
    except ValueError:
        raise HistoryUsageError(
            f"invalid time {raw!r}: use YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], MMDD[YY], HH:MM[:SS], "
            "now-2hours, now-3days, midnight, noon, today, yesterday, or 30m/2h/1d ago"
        ) from None


def _calendar(t: str, day: datetime.datetime) -> datetime.datetime:
    full = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)(?:[t ](\d\d?):(\d\d)(?::(\d\d))?)?", t)
    if full:
        y, mo, d, h, mi, s = (int(v) if v else 0 for v in full.groups())
        return datetime.datetime(y, mo, d, h, mi, s)
    clock = re.fullmatch(r"(\d\d?):(\d\d)(?::(\d\d))?", t)
    if clock:
        h, mi, s = (int(v) if v else 0 for v in clock.groups())
        return day.replace(hour=h, minute=mi, second=s)
    short = re.fullmatch(r"(\d\d)/(\d\d)(?:/(\d\d))?", t) or re.fullmatch(r"(\d\d)(\d\d)(\d\d)?", t)
    if short:
        year = 2000 + int(short[3]) if short[3] else day.year
        return datetime.datetime(year, int(short[1]), int(short[2]))
    raise ValueError(t)


# ---------------------------------------------------------------------------------------------- fields


def _clock(stamp: float | None) -> str:
    if stamp is None:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))


def _duration(seconds: float | None) -> str:
    """sacct's Elapsed: [D-]HH:MM:SS."""
    if seconds is None:
        return ""
    s = max(0, round(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def _cpu(seconds: float | None) -> str:
    """sacct's TotalCPU: MM:SS.mmm under an hour, else [D-]HH:MM:SS; "" when not measured."""
    if seconds is None:
        return ""
    if seconds < 3600:
        return f"{int(seconds // 60):02d}:{seconds % 60:06.3f}"
    return _duration(seconds)


def elapsed(job: p.HistoryEntry, now: float) -> float | None:
    """Run time less the time its ranks were stopped (gang scheduling, preemption), as sacct's."""
    if job.start_time is None:
        return None
    return max(0.0, (job.end_time or now) - job.start_time - job.suspended_time)


def total_cpu(job: p.HistoryEntry) -> float | None:
    if job.cpu_user is None and job.cpu_system is None:
        return None
    return (job.cpu_user or 0.0) + (job.cpu_system or 0.0)


def exit_code(job: p.HistoryEntry) -> str:
    """sacct's code:signal; storm keeps a shell-style status, in which 128 + N is signal N."""
    if job.exit_code is None:
        return ""
    code = job.exit_code
    return f"0:{code - 128}" if code > 128 else f"{code}:0"


def _class(klass: str) -> Callable[[p.HistoryEntry, float], str]:
    return lambda j, now: _cpu(j.class_times.get(klass)) if j.class_times else ""


def _cpu_time(j: p.HistoryEntry, now: float) -> float | None:
    run = elapsed(j, now)
    return None if run is None else run * j.ranks


Field: TypeAlias = "Callable[[p.HistoryEntry, float], str]"  # a string: the history module loads on use
FIELDS: dict[str, tuple[str, Field]] = {
    # lower-case name -> (header, value)
    "jobid": ("JobID", lambda j, now: str(j.id)),
    "jobname": ("JobName", lambda j, now: j.name),
    "user": ("User", lambda j, now: j.user),
    "uid": ("UID", lambda j, now: str(j.uid)),
    "state": ("State", lambda j, now: j.state),
    "exitcode": ("ExitCode", lambda j, now: exit_code(j)),
    "reason": ("Reason", lambda j, now: j.reason),
    "submit": ("Submit", lambda j, now: _clock(j.submit_time)),
    "start": ("Start", lambda j, now: _clock(j.start_time)),
    "end": ("End", lambda j, now: _clock(j.end_time)),
    "elapsed": ("Elapsed", lambda j, now: _duration(elapsed(j, now))),
    "elapsedraw": ("ElapsedRaw", lambda j, now: str(round(elapsed(j, now) or 0))),
    "ntasks": ("NTasks", lambda j, now: str(j.ranks)),
    "ranks": ("Ranks", lambda j, now: str(j.ranks)),
    "alloccpus": ("AllocCPUS", lambda j, now: str(j.ranks)),
    "nnodes": ("NNodes", lambda j, now: str(len(j.nodes))),
    "nodelist": ("NodeList", lambda j, now: ",".join(j.nodes)),
    "totalcpu": ("TotalCPU", lambda j, now: _cpu(total_cpu(j))),
    "usercpu": ("UserCPU", lambda j, now: _cpu(j.cpu_user)),
    "systemcpu": ("SystemCPU", lambda j, now: _cpu(j.cpu_system)),
    "cputime": ("CPUTime", lambda j, now: _duration(_cpu_time(j, now))),
    "cputimeraw": ("CPUTimeRAW", lambda j, now: str(round(_cpu_time(j, now) or 0))),
    "suspended": ("Suspended", lambda j, now: _duration(j.suspended_time)),
    "requeues": ("Requeues", lambda j, now: str(j.requeues)),
    "timecs": ("TimeCS", _class("CS")),
    "timef": ("TimeF", _class("F")),
    "timedc": ("TimeDC", _class("DC")),
}
FIELD_NAMES = ", ".join(header for header, _ in FIELDS.values())


def parse_format(text: str) -> list[tuple[str, Field, int]]:
    """``--format``: sacct's comma-separated field names, case-insensitive, each with an optional ``%N``
    width (a negative one left-aligns, as sacct's; else the column fits its widest value)."""
    chosen = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, width = item.partition("%")
        found = FIELDS.get(name.lower())
        if found is None or not re.fullmatch(r"-?\d*", width):
            raise HistoryUsageError(f"--format: unknown field {item!r}; the fields are: {FIELD_NAMES}")
        chosen.append((found[0], found[1], int(width) if width.strip("-") else 0))
    if not chosen:
        raise HistoryUsageError(f"--format: no field given; the fields are: {FIELD_NAMES}")
    return chosen


def render(jobs: list[p.HistoryEntry], fields: list[tuple[str, Field, int]], now: float, args: Any) -> str:
    rows = [[value(j, now) for _, value, _ in fields] for j in jobs]
    headers = [header for header, _, _ in fields]
    if args.csv:
        out = _Lines()
        import csv  # (only --csv needs it)

        writer = csv.writer(out, lineterminator="\n")
        if not args.noheader:
            writer.writerow(headers)
        writer.writerows(rows)
        return "".join(out.lines).rstrip("\n")
    if args.parsable2:
        lines = ([] if args.noheader else ["|".join(headers)]) + ["|".join(r) for r in rows]
        return "\n".join(lines)
    cells = rows if args.noheader else [headers, *rows]
    widths = []
    for i, (_, _, width) in enumerate(fields):
        widths.append(abs(width) if width else max((len(r[i]) for r in cells), default=0))
    lines = []
    for row in cells:
        line = "  ".join((c[: widths[i]] if fields[i][2] else c).ljust(widths[i]) for i, c in enumerate(row))
        lines.append(line.rstrip())
    return "\n".join(lines)


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)


# ---------------------------------------------------------------------------------------------- command


def request(args: argparse.Namespace, now: float) -> p.JobHistory:
    """The history request for the options; raises HistoryUsageError for a bad value."""

    def listed(values: list[str] | None) -> tuple[str, ...]:
        return tuple(v.strip() for text in values or () for v in text.split(",") if v.strip())

    states = tuple(s.upper() for s in listed(args.state))
    unknown = [s for s in states if s not in p.JOB_STATES]
    if unknown:
        raise HistoryUsageError(
            f"--state: unknown state(s) {', '.join(unknown)}; use {', '.join(p.JOB_STATES)}"
        )
    try:
        job_ids = tuple(int(j) for j in listed(args.jobs))
    except ValueError:
        raise HistoryUsageError(f"--jobs: job ids are numbers, not {args.jobs!r}") from None
    if args.limit is not None and args.limit < 1:
        raise HistoryUsageError("--limit: at least 1")
    until = parse_when(args.until, now) if args.until else None
    if args.since:
        since: float | None = parse_when(args.since, now)
    elif job_ids:
        since = None  # jobs named: whenever they ran
    else:
        # sacct's default window: since midnight, of the day --until names if that is earlier (just after
        # midnight, `--until now-1hour` asks about yesterday evening, not about a window that ends before
        # it begins).
        since = parse_when("midnight", now if until is None else min(now, until))
    if since is not None and until is not None and until < since:
        raise HistoryUsageError(f"--until ({_clock(until)}) is before --since ({_clock(since)})")
    return p.JobHistory(
        users=listed(args.user), all_users=args.allusers, states=states, since=since, until=until,
        names=listed(args.name), job_ids=job_ids,
    )  # fmt: skip


def fetch(client: Client, asked: p.JobHistory, limit: int | None) -> list[p.HistoryEntry]:
    """Every page of the answer (or the first ``limit`` jobs)."""
    found: list[p.HistoryEntry] = []
    after = 0
    while True:
        page_size = min(p.HISTORY_PAGE, limit - len(found)) if limit else 0
        page = client.call(dataclasses.replace(asked, limit=page_size, after=after), p.HistoryPage)
        found.extend(page.jobs)
        if not page.more or (limit and len(found) >= limit):
            return found[:limit] if limit else found
        after = page.more


def cmd_history(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        asked = request(args, now)
        fields = parse_format(args.format)
    except HistoryUsageError as exc:
        print(f"storm history: {exc}", file=sys.stderr)
        return 2
    with Client(args.mm) as client:
        jobs = fetch(client, asked, args.limit)
    if args.json:
        shown = [
            {**dataclasses.asdict(j), "elapsed": elapsed(j, now), "total_cpu": total_cpu(j)} for j in jobs
        ]
        print(json.dumps(shown, indent=1))
        return 0
    text = render(jobs, fields, now, args)
    if text:
        print(text)
    return 0


def add_history_command(sub: Any) -> None:
    h = sub.add_parser(
        "history",
        help="past and present jobs, with what they used (as sacct)",
        description="Jobs from storm-mm's store that match every filter given, in order of id. Without "
        "--since or --jobs, the jobs since midnight (sacct's default). A job is in the window if it was "
        "submitted by --until and had not ended before --since. Users other than root and [mm] operators "
        "see only their own jobs; root sees everyone's, an operator with --allusers or --user. TotalCPU: the "
        "ranks' user+system CPU seconds (measured by each node when it reaped them); TimeCS, TimeF, TimeDC: "
        "under FCS, the seconds its ranks spent in each class, summed over its ranks.",
        epilog=f"Fields for --format: {FIELD_NAMES}. Times: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], "
        "MMDD[YY], HH:MM[:SS], now-2hours, now-3days, midnight, noon, today, yesterday, 30m/2h/1d (ago).",
    )
    h.add_argument(
        "--user", "-u", action="append", metavar="USER[,USER]", help="these users' jobs (names or uids)"
    )
    h.add_argument("--allusers", "-a", action="store_true", help="every user's jobs (root and operators)")
    h.add_argument(
        "--state",
        "-s",
        action="append",
        metavar="STATE[,STATE]",
        help="in these states (e.g. FAILED,TIMEOUT)",
    )
    h.add_argument(
        "--since", "--starttime", "-S", metavar="TIME",
        help="not ended before TIME (default midnight, of --until's day if that is earlier)",
    )  # fmt: skip
    h.add_argument("--until", "--endtime", "-E", metavar="TIME", help="submitted by TIME (default now)")
    h.add_argument("--name", action="append", metavar="NAME[,NAME]", help="with these job names")
    h.add_argument(
        "--jobs", "-j", action="append", metavar="ID[,ID]", help="these jobs (then no default --since)"
    )
    h.add_argument("--limit", type=int, metavar="N", help="at most N jobs (the oldest first)")
    h.add_argument(
        "--format",
        "-o",
        default=DEFAULT_FORMAT,
        metavar="FIELDS",
        help=f"fields to show, comma-separated, each with an optional %%WIDTH (default {DEFAULT_FORMAT})",
    )
    h.add_argument("--noheader", "-n", action="store_true", help="no header line")
    h.add_argument("--parsable2", "-P", action="store_true", help="fields separated by '|' (sacct -P)")
    out = h.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="every field of every job, as JSON (ignores --format)"
    )
    out.add_argument("--csv", action="store_true", help="the --format fields as CSV")
    h.set_defaults(func=cmd_history)
