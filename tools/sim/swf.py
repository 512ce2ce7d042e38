"""The Standard Workload Format (SWF v2.2) of the Parallel Workloads Archive, read and written.

A trace is a header of ``;`` comment lines (``; MaxNodes: 128``) and one line per job of 18 numbers
separated by white space, -1 where unknown:

 1 job number, 2 submit time (s), 3 wait time, 4 run time, 5 allocated processors, 6 average CPU time,
 7 used memory (KB per processor), 8 requested processors, 9 requested time, 10 requested memory,
 11 status, 12 user id, 13 group id, 14 executable number, 15 queue, 16 partition, 17 preceding job,
 18 think time.

:func:`read_swf` keeps every field and the header verbatim, so :func:`write_swf` gives back what it read
(numbers normalised: ``5.0`` is written ``5``). Turning records into jobs to simulate is
:func:`to_workload`, whose rules (which fields, what is dropped, the runtime estimate when field 9 is
missing) are stated in its docstring and counted in the :class:`Workload` it returns.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

FIELDS = (
    "job", "submit", "wait", "runtime", "procs", "cpu", "memory", "req_procs", "req_time", "req_memory",
    "status", "user", "group", "executable", "queue", "partition", "preceding", "think",
)  # fmt: skip
_HEADER_LINE = re.compile(r";\s*([A-Za-z]+)\s*:\s*(.*?)\s*$")


class SwfError(ValueError):
    """A line that is not an SWF record, with its line number."""


@dataclass(frozen=True, slots=True)
class SwfRecord:
    """One job line, every field as the trace gives it (-1: unknown). Times in seconds."""

    job: int
    submit: float
    wait: float = -1
    runtime: float = -1
    procs: int = -1
    cpu: float = -1
    memory: float = -1
    req_procs: int = -1
    req_time: float = -1
    req_memory: float = -1
    status: int = -1
    user: int = -1
    group: int = -1
    executable: int = -1
    queue: int = -1
    partition: int = -1
    preceding: int = -1
    think: float = -1

    def values(self) -> tuple[float, ...]:
        return tuple(getattr(self, name) for name in FIELDS)


@dataclass
class SwfTrace:
    """A whole trace: the header's comment lines (without the newline) and the records in file order."""

    header: list[str] = field(default_factory=list)
    records: list[SwfRecord] = field(default_factory=list)

    def header_value(self, key: str) -> str | None:
        """The value of a ``; Key: value`` header line (case-insensitive key), or None."""
        for line in self.header:
            match = _HEADER_LINE.match(line)
            if match and match[1].lower() == key.lower():
                return match[2]
        return None

    def header_int(self, key: str) -> int | None:
        value = self.header_value(key)
        if value is None:
            return None
        try:
            number = int(float(value.split()[0]))
        except (ValueError, IndexError):
            return None
        return number if number > 0 else None


_INTS = frozenset(
    ("job", "procs", "req_procs", "status", "user", "group", "executable", "queue", "partition", "preceding")
)


def _number(text: str, name: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SwfError(f"{where}: field {name} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise SwfError(f"{where}: field {name} is not finite: {text!r}")
    return value


def parse_swf(lines: Iterable[str], source: str = "<swf>") -> SwfTrace:
    """Parse SWF text. Comment lines anywhere go to the header; blank lines are skipped. A record may have
    fewer than 18 fields (the rest are -1) but not more."""
    trace = SwfTrace()
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip("\n").rstrip("\r")
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(";"):
            trace.header.append(line)
            continue
        parts = stripped.split()
        where = f"{source}:{number}"
        if len(parts) > len(FIELDS):
            raise SwfError(f"{where}: {len(parts)} fields, SWF has {len(FIELDS)}")
        if len(parts) < 2:
            raise SwfError(f"{where}: a record needs at least a job number and a submit time")
        values: dict[str, float | int] = {}
        for name, text in zip(FIELDS, parts, strict=False):
            value = _number(text, name, where)
            values[name] = int(value) if name in _INTS else value
        trace.records.append(SwfRecord(**values))  # type: ignore[arg-type]
    return trace


def read_swf(path: str | Path) -> SwfTrace:
    with open(path, encoding="utf-8", errors="replace") as stream:
        return parse_swf(stream, str(path))


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def format_record(record: SwfRecord) -> str:
    return " ".join(_format(v) for v in record.values())


def write_swf(trace: SwfTrace, stream: TextIO) -> None:
    """The header lines, then one line of 18 fields per record."""
    for line in trace.header:
        stream.write(line + "\n")
    for record in trace.records:
        stream.write(format_record(record) + "\n")


def save_swf(trace: SwfTrace, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        write_swf(trace, stream)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------- workloads


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job as the simulator submits it. ``limit`` is its time limit (requested time or the estimate)."""

    index: int  # position in the workload, 0-based: the simulator's id for it
    number: int  # the trace's job number (field 1)
    submit: float
    runtime: float
    procs: int
    limit: float
    user: int
    estimated: bool = False  # the limit came from the estimate rule (the trace gives no requested time)


ESTIMATE_RULES = ("runtime", "x2", "x3", "x5", "x10")


def estimate_factor(rule: str) -> float:
    """``runtime`` (exact estimates) is 1; ``xK`` is K times the runtime."""
    if rule == "runtime":
        return 1.0
    match = re.fullmatch(r"x(\d+(?:\.\d+)?)", rule)
    if not match or float(match[1]) < 1:
        raise ValueError(
            f"estimate rule {rule!r}: use 'runtime' (exact) or xK with K >= 1 (x2: twice the runtime)"
        )
    return float(match[1])


@dataclass
class Workload:
    """Jobs to simulate, sorted by (submit time, trace order), and how they were obtained from a trace."""

    jobs: list[SimJob]
    estimate: str  # the rule used where the trace gives no requested time
    dropped: dict[str, int]  # why -> how many records were left out
    arrival_factor: float = 1.0
    runtime_factor: float = 1.0

    @property
    def estimated(self) -> int:
        """Jobs whose limit came from the estimate rule."""
        return sum(1 for j in self.jobs if j.estimated)

    @property
    def over_limit(self) -> int:
        """Jobs whose runtime exceeds their limit: the core ends them TIMEOUT at the limit."""
        return sum(1 for j in self.jobs if j.runtime > j.limit)

    def offered_load(self, pes: int) -> float:
        """sum(runtime x procs) / (P x (last arrival - first arrival)); inf with fewer than two instants."""
        if not self.jobs:
            return 0.0
        span = self.jobs[-1].submit - self.jobs[0].submit
        work = sum(j.runtime * j.procs for j in self.jobs)
        return work / (pes * span) if span > 0 else math.inf


def to_workload(records: Sequence[SwfRecord], pes: int, estimate: str = "runtime") -> Workload:
    """The records that can run on ``pes`` PEs, as jobs. The rules, in the order they are applied:

    - processors: field 5 (allocated), or field 8 (requested) when 5 is missing; neither > 0: dropped
      (``procs<=0``).
    - runtime: field 4; -1 or 0 (a job that never ran, or ran for under a second and was logged as 0):
      dropped (``runtime<=0``), since a time limit must be positive and such a job holds no PE.
    - wider than the machine (procs > ``pes``): dropped (``wider than machine``), as storm refuses it.
    - time limit: field 9 when > 0; else ``estimate`` (``runtime``: exactly the runtime; ``xK``: K times).
      A job that runs longer than its limit is killed at the limit by storm (TIMEOUT), as on a cluster.
    - submit times are taken as given and shifted so that the first job arrives at 0 s.
    """
    factor = estimate_factor(estimate)
    dropped = {"procs<=0": 0, "runtime<=0": 0, "wider than machine": 0}
    kept: list[tuple[float, int, SwfRecord, int]] = []
    for order, record in enumerate(records):
        procs = record.procs if record.procs > 0 else record.req_procs
        if procs <= 0:
            dropped["procs<=0"] += 1
        elif record.runtime <= 0:
            dropped["runtime<=0"] += 1
        elif procs > pes:
            dropped["wider than machine"] += 1
        else:
            kept.append((record.submit, order, record, procs))
    kept.sort(key=lambda item: (item[0], item[1]))
    first = kept[0][0] if kept else 0.0
    jobs: list[SimJob] = []
    for index, (submit, _, record, procs) in enumerate(kept):
        estimated = record.req_time <= 0
        limit = record.runtime * factor if estimated else record.req_time
        user = record.user if record.user >= 0 else -1
        runtime = float(record.runtime)
        jobs.append(SimJob(index, record.job, submit - first, runtime, procs, float(limit), user, estimated))
    return Workload(jobs, estimate, dropped)


def scale_load(workload: Workload, arrival_factor: float = 1.0, runtime_factor: float = 1.0) -> Workload:
    """A heavier (or lighter) copy: arrival times divided by ``arrival_factor`` (compressed: more jobs per
    second, as the FCS paper's section 5.1) and runtimes and limits multiplied by ``runtime_factor``
    (stretched, as the BlueGene/L paper's c). Each factor multiplies the offered load by itself."""
    if not (arrival_factor > 0 and runtime_factor > 0):
        raise ValueError("load factors must be positive")
    jobs = [
        replace(
            job,
            submit=job.submit / arrival_factor,
            runtime=job.runtime * runtime_factor,
            limit=job.limit * runtime_factor,
        )
        for job in workload.jobs
    ]
    return replace(
        workload,
        jobs=jobs,
        arrival_factor=workload.arrival_factor * arrival_factor,
        runtime_factor=workload.runtime_factor * runtime_factor,
    )


def machine_from_header(trace: SwfTrace) -> tuple[int, int] | None:
    """(nodes, PEs per node) from ``MaxNodes`` and ``MaxProcs`` (either alone: one PE per node)."""
    nodes, procs = trace.header_int("MaxNodes"), trace.header_int("MaxProcs")
    if nodes and procs and procs % nodes == 0:
        return nodes, procs // nodes
    if procs:
        return procs, 1
    if nodes:
        return nodes, 1
    return None
