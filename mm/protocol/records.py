"""Shared records, nested inside messages and encoded as maps without an op (RankExit, JobInfo, RankStats,
FcsParameters, ...); the wire's vocabularies (Policy, Klass, the state names); and the checks that messages
of several links make, each written (and worded) once.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

from enum import StrEnum

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import check as _check
from storm.mm.states import JobState, NodeState

PROTOCOL_VERSION = 1

# The vocabularies of the wire are StrEnums: encoded as their strings; fields keep the type ``str`` and each
# message checks its value against the enum, so ``Policy(msg.policy)`` of a decoded message cannot fail.


class Policy(StrEnum):
    """How the cluster time-shares its PEs ([cluster] policy), which the MM hands to every node."""

    BATCH = "batch"  # one job per PE, run to its end
    GANG = "gang"  # gang scheduling: the MM cycles the matrix's rows, one heartbeat per time slice
    SB = "sb"  # spin-block (implicit coscheduling): every job always runs, blocked ranks spin, then block
    FCS = "fcs"  # flexible coscheduling: gang's heartbeats, and each node classifies its processes

    @property
    def cycles(self) -> bool:
        """The MM cycles the matrix's rows and sends a heartbeat per time slice."""
        return self in (Policy.GANG, Policy.FCS)

    @property
    def classifies(self) -> bool:
        """Nodes classify their processes (CS, F, DC) at the end of each slot and decide per PE."""
        return self is Policy.FCS

    @property
    def spin_block(self) -> bool:
        """Ranks may be told to spin-block (spin for FcsParameters.spin, then block) rather than poll."""
        return self in (Policy.SB, Policy.FCS)


class Klass(StrEnum):
    """FCS's process classes (the paper's section 3): coscheduled, frustrated, don't-care."""

    CS = "CS"
    F = "F"
    DC = "DC"


JOB_STATES = tuple(s.value for s in JobState)
POLICIES = tuple(p.value for p in Policy)
CLASSES = tuple(k.value for k in Klass)
NODE_STATES = tuple(s.value for s in NodeState)
RANK_STATES = ("active", "no-mpi", "foreign-mpi", "no-hook")


def _plain(*texts: str) -> bool:
    """No NUL character: the kernel would cut a path, argument or variable there (Python refuses it)."""
    return "\0" not in "".join(texts)  # one scan in C: every job's submission checks its whole environment


def _numbered(mapping: dict[str, int], least: int) -> bool:
    """Keys that are ids (maps on the wire have string keys), values >= ``least``."""
    return all(k.isascii() and k.isdigit() and len(k) <= 18 for k in mapping) and all(
        v >= least for v in mapping.values()
    )


def _token(text: str) -> bool:
    """A streamed job's token (SubmitJob.attach, AttachOutput.token): up to 64 letters, digits, '-', '_'."""
    return len(text) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)


# Checks that several messages make, each written (and worded) once.


def _check_pids(pids: dict[str, int]) -> None:
    _check(_numbered(pids, 1), "pids must map ranks to process ids >= 1")


def _check_class(klass: str) -> None:
    _check(klass in ("", *CLASSES), f"klass must be CS, F, DC or empty, not {klass!r}")


# --------------------------------------------------------------------------------------------------------
# Shared records (nested inside messages; encoded as maps without an op)


@dataclass(frozen=True, kw_only=True)
class RankExit:
    """How one rank ended: an exit code, or the signal that killed it, or why it never started."""

    rank: int
    exit_code: int | None = None
    signal: int | None = None
    error: str = ""
    # The CPU seconds the rank (and the children it waited for) used in user and system mode, from the
    # rusage the job shell's wait4 gave when it reaped it; None: not measured (never started, reaped by
    # someone else, or reported by an older storm-nm).
    cpu_user: float | None = None
    cpu_system: float | None = None

    def __post_init__(self) -> None:
        _check(self.rank >= 0, "rank must be >= 0")
        _check(self.exit_code is None or 0 <= self.exit_code <= 255, "exit_code must be 0..255")
        _check(self.signal is None or 0 < self.signal < 128, "signal must be 1..127")
        _check(all(t is None or t >= 0 for t in (self.cpu_user, self.cpu_system)), "CPU seconds must be >= 0")

    @property
    def status(self) -> int:
        """Shell-style status: 128 + signal, 127 if it never started, 1 for a clean exit that was an error
        (such as leaving MPI without MPI_Finalize), else the exit code."""
        if self.signal is not None:
            return 128 + self.signal
        if self.exit_code is None:
            return 127
        if self.exit_code == 0 and self.error:
            return 1
        return self.exit_code

    @property
    def failed(self) -> bool:
        return self.signal is not None or self.exit_code != 0 or self.error != ""  # status != 0, cheaper

    def describe(self) -> str:
        if self.signal is not None:
            text = f"rank {self.rank} killed by signal {self.signal}"
        elif self.exit_code is not None:
            text = f"rank {self.rank} exited with code {self.exit_code}"
        else:
            text = f"rank {self.rank} did not start"
        return f"{text}: {self.error}" if self.error else text


@dataclass(frozen=True, kw_only=True)
class RankSlot:
    """One rank of a job and the processing element (PE) it is pinned to on its node."""

    rank: int
    pe: int

    def __post_init__(self) -> None:
        _check(self.rank >= 0 and self.pe >= 0, "rank and pe must be >= 0")


@dataclass(frozen=True, kw_only=True)
class BoxInfo:
    """A job's partition on a torus: ``shape`` (a, b, c) nodes from ``base`` (x, y, z), wrapping around."""

    base: tuple[int, ...]
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        _check(len(self.base) == 3 and len(self.shape) == 3, "a box has a base and a shape of three numbers")
        _check(min(self.base) >= 0 and min(self.shape) >= 1, "a box's base is >= 0 and its shape >= 1")

    def __str__(self) -> str:
        return "{}x{}x{} at ({},{},{})".format(*self.shape, *self.base)


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """A job as clients see it (``storm queue --json``, ``storm show --json``)."""

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
    time_limit: float | None
    argv: tuple[str, ...]
    cwd: str
    output: str
    error: str
    # The job's row of the matrix (its time slot) while it holds PEs.
    row: int | None = None
    # Seconds its ranks spent stopped by gang scheduling; they do not count against the time limit.
    suspended_time: float = 0.0
    # Submitted with --requeue, and how many times a node failure sent it back to the queue.
    requeue: bool = False
    requeues: int = 0
    # Its ranks run mpihook (storm submit --no-hook: they do not, and FCS cannot measure them).
    hook: bool = True
    # Set while it runs if every rank has sat in one blocking MPI call for [mm] hang_warning seconds.
    warning: str = ""
    # On a torus ([mm] topology): the box of nodes it holds (or last held), its ranks on them in box order.
    box: BoxInfo | None = None
    # A moldable job's range (storm submit -n MIN-MAX; both 0 for a job of a fixed size): ``ranks`` is the
    # least it asked for until it starts, then the size storm-mm gave it.
    min_ranks: int = 0
    max_ranks: int = 0
    # Its quality of service ("normal" unless storm submit --qos) and that QOS's priority at its submission.
    qos: str = ""
    priority: int = 0
    # While preemption holds its ranks stopped: the job that suspended it. Its state stays RUNNING (its ranks
    # exist; suspended time does not count against its limit); `storm queue` shows SUSPENDED.
    suspended_by: int | None = None
    # Job arrays and dependencies (storm submit --array, --dependency): a task's array id and task id (None
    # outside arrays), the array's task ids and %N limit ("0-99%10"), and what the job waits for
    # ("afterok:12"; "" for nothing). `storm queue` folds an array's pending tasks into one line; --json
    # keeps one record per task.
    array_id: int | None = None
    array_task: int | None = None
    array: str = ""
    dependency: str = ""

    def __post_init__(self) -> None:
        _check(self.state in JOB_STATES, f"unknown job state {self.state!r}")
        _check(self.requeues >= 0, "requeues must be >= 0")
        _check(0 <= self.min_ranks <= self.max_ranks, "min_ranks and max_ranks: 0 <= min_ranks <= max_ranks")


@dataclass(frozen=True, kw_only=True)
class NodeInfo:
    name: str
    state: str
    pes: int
    pes_used: int
    address: str
    last_seen: float
    reason: str
    jobs: tuple[int, ...]
    # Context switches: how many, and how long they took to take effect on the node's ranks (ms).
    switches: int = 0
    switch_p50_ms: float = 0.0
    switch_p99_ms: float = 0.0
    # On a torus: its place (x, y, z); empty on a flat network or for a node that has none.
    coords: tuple[int, ...] = ()
    # Heartbeats that named an instant (Heartbeat.at) the node could not wait for: arrived after it (slow
    # delivery, or the node's clock ahead), or too far before it (its clock behind): switched on arrival.
    late_beats: int = 0
    skewed_beats: int = 0

    def __post_init__(self) -> None:
        _check(self.state in NODE_STATES, f"unknown node state {self.state!r}")
        _check(len(self.coords) in (0, 3), "coords: x, y and z, or none")


@dataclass(frozen=True, kw_only=True)
class RankStats:
    """One rank's communication as mpihook measured it, since its last reset (FCS paper, Table 1).

    ``state``: ``active`` (measured), ``no-mpi`` (the rank has not entered MPI through the hook: not an MPI
    program, or not started yet), ``foreign-mpi`` (an MPI other than MPICH's ABI: calls pass through),
    ``no-hook`` (the job runs without mpihook: nothing is measured and its waits poll).
    """

    rank: int
    node: str
    pid: int
    state: str
    t_cpu: float
    t_comm: float
    c_comm: int
    granularity: float | None
    calls: int
    wait_mode: str
    job_id: int = 0
    # Under FCS: the PE the rank is pinned to, its class, and its slots in that class and in all.
    pe: int = 0
    klass: str = ""
    cslots: int = 0
    tslots: int = 0
    # The blocking MPI call the rank is in ("MPI_Recv"; "" when it is in none) and for how long (seconds, as
    # of the report): what the hang watchdog looks at (mm/reports.py).
    call: str = ""
    call_time: float = 0.0
    # How mpihook can make it wait: under MPI_THREAD_MULTIPLE every call stays MPICH's own (it spin-blocks
    # in MPICH's loop); with ``collectives_poll`` its collectives over shared memory cannot spin-block.
    thread_multiple: bool = False
    collectives_poll: bool = False

    def __post_init__(self) -> None:
        _check(self.state in RANK_STATES, f"unknown rank state {self.state!r}")
        _check(self.wait_mode in ("poll", "spin-block"), f"unknown wait mode {self.wait_mode!r}")
        _check_class(self.klass)
        _check(len(self.call) <= 64 and _plain(self.call), "call: the name of an MPI call")
        _check(self.call_time >= 0 and (self.call_time == 0 or bool(self.call)), "call_time: >= 0, in a call")


@dataclass(frozen=True, kw_only=True)
class ClassChange:
    """One process changed class (FCS), at ``time`` on its node's clock, after ``tslots`` assigned slots."""

    job_id: int
    rank: int
    node: str
    time: float
    old: str
    new: str
    tslots: int = 0

    def __post_init__(self) -> None:
        _check(self.old in CLASSES and self.new in CLASSES, "classes are CS, F or DC")


@dataclass(frozen=True, kw_only=True)
class ProfileEntry:
    """Where one process's time went (seconds) while it was in class ``klass`` ("" outside FCS); see
    nm/profile.py for what each category holds."""

    rank: int
    node: str
    klass: str = ""
    wall: float
    compute: float
    poll: float
    blocked: float
    stopped: float
    queued: float

    def __post_init__(self) -> None:
        _check_class(self.klass)
        _check(self.rank >= 0, "rank must be >= 0")


CS_THRESH = 0.002  # Table 2's CS_thresh (seconds)


def default_f_thresh(cs_thresh: float) -> float:
    """Table 2's F_thresh, 0.85 x CS_thresh: what FCS uses unless F_thresh is set."""
    return 0.85 * cs_thresh


@dataclass(frozen=True, kw_only=True)
class FcsParameters:
    """Table 2 of the FCS paper (times in seconds), set once on the MM and handed to every node, where the
    classification (nm/fcs.py) uses it as it is."""

    spin: float = 120e-6
    cslots_min: int = 20
    dc_thresh: float = 1.0
    cs_thresh: float = CS_THRESH
    f_thresh: float = default_f_thresh(CS_THRESH)
    tslots_max: int = 32768
    # Which F processes have priority over the DC processes of their PE: the one whose slot it is (the
    # paper's Algorithm 1), or every F process in every slot without a CS process ("always").
    # "always" rather than the paper's "slot": live and simulated, it cuts FCS's turnaround on the
    # complementing workload from about 0.84 to 0.76 of gang's, and costs at most 0.008 elsewhere
    # (results/scenarios-f-priority.md, results/sim-scenarios.md).
    f_priority: str = "always"
    # The nice value of the processes that share a PE with a prioritized F process while it runs: how
    # strongly F comes first (the paper says only "prioritise"; nice 10 leaves the others about a tenth).
    background_nice: int = 10

    def __post_init__(self) -> None:
        _check(self.f_priority in ("slot", "always"), "f_priority must be 'slot' or 'always'")
        _check(0 <= self.background_nice <= 19, "background_nice must be in [0, 19]")
        _check(
            0 < self.f_thresh <= self.cs_thresh < self.dc_thresh, "need 0 < f_thresh <= cs_thresh < dc_thresh"
        )
        _check(self.cslots_min >= 1 and self.tslots_max >= 1, "cslots_min and tslots_max must be >= 1")
        _check(0 <= self.spin <= 1.0, "spin must be in [0, 1] second")
