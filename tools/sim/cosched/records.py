"""The node model's records: what the outside tells a process (Control), the costs, the counters it reports,
and the model's own per-process, per-job and per-PE state (node.py advances them), with :func:`credit`, what a
process spends the CPU it gets on (fluid sharing's and slices.py's alike)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from storm.tools.sim.cosched.program import Program

ProcessKey = tuple[int, int]  # (job id, rank)

# Linux's sched_prio_to_weight (kernel/sched/core.c), nice -20 .. 19: each step of nice is about 1.25x.
NICE_WEIGHTS = (
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip


def nice_weight(nice: int) -> int:
    if not -20 <= nice <= 19:
        raise ValueError(f"nice {nice} outside -20..19")
    return NICE_WEIGHTS[nice + 20]


def by_fields(record: Any) -> tuple[type[Any], tuple[Any, ...]]:
    """How a frozen record pickles: by its fields, passed to its class. A sweep hands records to worker
    processes, and pickle's default way sets fields one by one, which a frozen class compiled by mypyc
    refuses (the package's __init__ says what is compiled)."""
    return type(record), tuple(getattr(record, f.name) for f in fields(record))


class WaitMode(Enum):
    POLL = "poll"
    SPIN_BLOCK = "spin-block"


class Reschedule(Enum):
    """ClusterSchedSim's rescheduling of a PE's processes (local.py says how each is modelled)."""

    NONE = "none"
    DCS = "dcs"  # on message arrival: interrupt, and the destination runs next
    PB = "pb"  # periodically: a daemon takes the PE from a busy-waiting process for one with work


@dataclass(frozen=True)
class Local:
    """The local scheduler of ClusterSchedSim's dynamic coscheduling on top of the round-robin slices
    (local.py): what a change of the running process costs, and how the PE reschedules."""

    reschedule: Reschedule = Reschedule.NONE
    switch_ns: int = 0  # every change of the process running on a PE
    interrupt_ns: int = 0  # DCS: the interrupt a message raises for a process that is not running
    period_ns: int = 0  # PB: the daemon's period
    daemon_ns: int = 0  # PB: CPU each daemon run takes when it finds the running process busy-waiting

    def __post_init__(self) -> None:
        if min(self.switch_ns, self.interrupt_ns, self.period_ns, self.daemon_ns) < 0:
            raise ValueError("local scheduler costs cannot be negative")
        if self.interrupt_ns and self.reschedule is not Reschedule.DCS:
            raise ValueError("interrupt_ns is the cost of DCS's interrupts: it needs reschedule=DCS")
        if self.reschedule is Reschedule.PB and self.period_ns <= 0:
            raise ValueError("periodic rescheduling (PB) needs a period: period_ns > 0")
        if (self.period_ns or self.daemon_ns) and self.reschedule is not Reschedule.PB:
            raise ValueError("period_ns and daemon_ns are PB's daemon: they need reschedule=PB")

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return by_fields(self)


@dataclass(frozen=True)
class Control:
    """What the node manager decides for one process."""

    stopped: bool = False
    nice: int = 0
    wait: WaitMode = WaitMode.POLL
    spin_ns: int = 120_000  # T_spin, FCS paper Table 2

    def __post_init__(self) -> None:
        nice_weight(self.nice)
        if self.spin_ns < 0:
            raise ValueError("spin_ns cannot be negative")

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return by_fields(self)


@dataclass(frozen=True)
class Costs:
    switch_ns: int = 0  # a PE's context switch, when the outside changes which of its processes may run
    wakeup_ns: int = 0  # CPU a blocked process needs after its message arrives, before its call returns
    # Round-robin slices among a PE's runnable processes (slices.py); 0 shares the PE fluidly.
    slice_ns: int = 0
    # ClusterSchedSim's local scheduler and dynamic coscheduling (local.py); None: slices.py's plain one.
    local: Local | None = None

    def __post_init__(self) -> None:
        if min(self.switch_ns, self.wakeup_ns, self.slice_ns) < 0:
            raise ValueError("costs cannot be negative")
        if self.local is not None and not self.slice_ns:
            raise ValueError(
                "a local scheduler (Costs.local) needs round-robin slices (slice_ns > 0): its switches "
                "and boosts act on the one process running on a PE, which fluid sharing does not have"
            )

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return by_fields(self)


NO_COSTS = Costs()
RUNNABLE = Control()  # what a launched process is told until the node manager says otherwise


@dataclass(slots=True)
class ProcessCounters:
    """A process's cumulative counters since it was added (:meth:`CoschedModel.counters` hands out copies)."""

    compute_ns: int = 0  # CPU time computing
    poll_ns: int = 0  # CPU time waiting in calls: polling, or spinning in spin-block
    wakeup_cpu_ns: int = 0  # CPU time paying wake-ups
    blocked_ns: int = 0  # wall time blocked in a call and not stopped
    stopped_ns: int = 0  # wall time stopped
    events: int = 0  # blocking calls that returned (one per communication step)
    calls: int = 0
    comm_ns: int = 0  # wall time inside returned calls, stops included (the hook reads a wall clock)
    spin_ns: int = 0  # of comm_ns, spin phases of spin-block calls
    block_ns: int = 0  # of comm_ns, from blocking to return, the wake-up included
    wakeups: int = 0  # calls that blocked and were woken by their message
    io_ns: int = 0  # wall time in I/O (Program.io_ns) and not stopped
    iterations: int = 0
    in_call: bool = False
    enter_ns: int = 0  # when the last call began
    exit_ns: int = 0  # when the last call returned
    done: bool = False

    @property
    def cpu_ns(self) -> int:
        """What the kernel would report as the process's CPU time."""
        return self.compute_ns + self.poll_ns + self.wakeup_cpu_ns


@dataclass(frozen=True)
class PeCounters:
    """Where a PE's time went since the model began; the four add up to the time elapsed."""

    busy_ns: int = 0  # computing
    spin_ns: int = 0  # polling or spinning
    switch_ns: int = 0  # context switches and wake-ups; under Costs.local, interrupts and daemon runs too
    idle_ns: int = 0
    # Under Costs.local (local.py): of switch_ns, DCS's interrupts and PB's daemon runs, counted whole when
    # taken; and how many changes of the running process and interrupts or daemon scans there were.
    interrupt_ns: int = 0
    switches: int = 0
    interrupts: int = 0

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return by_fields(self)


class Phase(Enum):
    COMPUTE = "compute"
    WAIT = "wait"  # in a call, on the CPU (polling or spinning)
    BLOCKED = "blocked"
    WAKING = "waking"
    IO = "io"  # in the iteration's I/O (Program.io_ns): no CPU, not runnable, until ``io_until``
    DONE = "done"


ON_CPU = (Phase.COMPUTE, Phase.WAIT, Phase.WAKING)  # the phases that need (or use) the CPU


@dataclass
class _Process:
    index: int
    job: int
    rank: int
    pe: int
    compute_ns: int
    control: Control
    weight: int
    phase: Phase = Phase.COMPUTE
    remaining: int = 0  # ns of CPU still needed: computation, or the wake-up
    carry: int = 0  # CPU owed but not yet given, in 1/total ns of the PE's current total weight
    step: int = 0  # the iteration it is in; its call is that iteration's communication step
    mode: WaitMode = WaitMode.POLL  # of the current call, latched when it began
    spin_deadline: int = 0
    block_from: int | None = None
    ready_ns: int | None = None  # when the current step's messages are all in, once known
    io_until: int = 0
    counters: ProcessCounters = field(default_factory=ProcessCounters)


@dataclass
class _Job:
    program: Program
    processes: list[int]  # process index per rank
    entered: list[int]  # communication steps each rank has begun
    enter_ns: list[
        list[int]
    ]  # per rank, when it began its steps, by step parity (a rank is at most one ahead)
    arrived: list[int]  # all-reduce: ranks in each step, by parity
    last_arrival: list[int]
    finished: int = 0
    completion_ns: int | None = None
    # The shortcut (shortcut.py): while ``alone``, the job's state is as of ``fast_ns`` and its own events
    # are not in the heap; one checkpoint event (``epoch``) stands for them, its walk kept in ``pending``.
    alone: bool = False
    fast_ns: int = 0
    epoch: int = 0
    chunk_ns: int = 0
    pending: tuple[int, Callable[[], None]] | None = None


@dataclass
class _Pe:
    index: int = 0
    processes: list[int] = field(default_factory=list)
    synced_ns: int = 0
    switch_until: int = 0
    version: int = 0
    total: int = 0  # the weight the carries of its processes are counted in
    owner: int | None = None  # the job alone on this PE, advanced by the shortcut
    busy: int = 0
    spin: int = 0
    switch: int = 0
    idle: int = 0
    # Under slices (slices.py): the run queue, its head running until ``slice_end``.
    queue: list[int] = field(default_factory=list)
    running: int | None = None
    slice_end: int = 0
    # Under Costs.local (local.py): the process whose context the PE holds (the last to run, through idle
    # spells), the last instant PB's daemon ran, and the counters PeCounters reports.
    holder: int | None = None
    daemon_at: int = -1
    interrupt: int = 0
    switches: int = 0
    interrupts: int = 0


def credit(pe: _Pe, p: _Process, cpu: int) -> int:
    """``p`` had ``cpu`` ns of its PE: what it spent them on, as its phase says; returns the ns used (a
    computation or a wake-up uses no more than it still needs). Shared by fluid sharing and slices.py."""
    c = p.counters
    if p.phase is Phase.COMPUTE:
        cpu = min(cpu, p.remaining)
        p.remaining -= cpu
        c.compute_ns += cpu
        pe.busy += cpu
    elif p.phase is Phase.WAKING:
        cpu = min(cpu, p.remaining)
        p.remaining -= cpu
        c.wakeup_cpu_ns += cpu
        pe.switch += cpu
    else:
        c.poll_ns += cpu
        pe.spin += cpu
    return cpu
