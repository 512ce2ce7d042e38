"""storm-nm <-> storm-mm: a node's registration and reports, the heartbeat, and the MM's orders to start,
stop, suspend and resume jobs, from ``register_node`` to ``pmi_barrier_out``.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

import dataclasses
import functools

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import Message, message
from storm.mm.codec import check as _check
from storm.mm.protocol.records import (
    POLICIES,
    PROTOCOL_VERSION,
    ClassChange,
    FcsParameters,
    Policy,
    ProfileEntry,
    RankExit,
    RankSlot,
    RankStats,
    _check_pids,
    _numbered,
    _plain,
)
from storm.mm.protocol.timings import SwitchTimings

# --------------------------------------------------------------------------------------------------------
# NM <-> MM


@functools.lru_cache(maxsize=256)
def _numbered_in_order(ids: tuple[int, ...]) -> bool:
    """0, 1, 2, ... each new id one more than the largest before it (repeats allowed).

    Cached: every node's launch of a job carries the same ``hosts``, so a job on k nodes would check them
    k times (k^2 steps; a simulator launches thousands of wide jobs a second)."""
    top = -1
    for i in ids:
        if not 0 <= i <= top + 1:
            return False
        top = max(top, i)
    return True


# Checks that several messages make, each written (and worded) once.


def _check_rows(rows: dict[str, int]) -> None:
    _check(_numbered(rows, 0), "rows must map job ids to rows >= 0")


@message("register_node")
@dataclass(frozen=True, kw_only=True)
class RegisterNode(Message):
    """Sent when an NM starts and whenever the MM it talks to has changed (a restart).

    ``jobs`` lists the jobs with ranks alive on this node, so that a restarted MM keeps tracking them.
    ``host`` names the machine the NM runs on ([nm] host): the ranks of a job on nodes of one host share
    memory, so MPI is told they are on one node ("" counts as a host of its own).
    """

    node: str
    pes: int
    nm_epoch: str
    address: str = ""
    version: int = PROTOCOL_VERSION
    jobs: tuple[int, ...] = ()
    host: str = ""

    def __post_init__(self) -> None:
        _check(1 <= len(self.node) <= 64, "node name must be 1..64 characters")
        _check(len(self.host) <= 256 and _plain(self.host), "host: at most 256 characters, no NUL")
        _check(1 <= self.pes <= 4096, "pes must be 1..4096")


@message("node_registered")
@dataclass(frozen=True, kw_only=True)
class NodeRegistered(Message):
    node: str
    mm_epoch: str
    # How often the NM must send node_status; the MM derives it from its node timeout.
    report_interval: float
    # Jobs the node listed that the MM has already ended or never knew: the NM must stop their ranks.
    stale_jobs: tuple[int, ...] = ()
    policy: str = Policy.BATCH
    # Gang scheduling: the port of the MM's heartbeat PUB socket (on the MM's host) and the time slice.
    heartbeat_port: int = 0
    slice: float = 0.1
    # The row of each of the node's jobs (the rest of the matrix is none of its business).
    rows: dict[str, int] = dataclasses.field(default_factory=dict)
    fcs: FcsParameters = dataclasses.field(default_factory=FcsParameters)
    # The node's jobs that preemption holds suspended: their ranks stay stopped, whatever the heartbeats say,
    # until resume_job (every other job of the node is not suspended).
    suspended: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check(self.policy in POLICIES, f"unknown policy {self.policy!r}")
        _check(self.report_interval > 0, "report_interval must be positive")
        _check_rows(self.rows)
        _check(0 < self.slice <= 60, "slice must be in (0, 60] seconds")
        _check(0 <= self.heartbeat_port < 65536, "heartbeat_port must be a port number")


@message("node_status")
@dataclass(frozen=True, kw_only=True)
class NodeStatus(Message):
    """The NM's periodic report; its arrival is what keeps the node UP."""

    node: str
    nm_epoch: str
    mm_epoch: str
    jobs: tuple[int, ...] = ()  # every job the node holds, its shell starting or its report not yet acked
    # Those of them whose ranks have all started: the MM takes this as a job_launched it may have missed. Not
    # ``jobs``, whose shells may still be starting (a job was shown RUNNING before its output file existed).
    launched: tuple[int, ...] = ()
    switches: int = 0
    switch_p50_ms: float = 0.0
    switch_p99_ms: float = 0.0
    # Those of them it holds suspended (suspend_job): the MM sends suspend_job or resume_job again where it
    # disagrees (one of them was lost, or the NM restarted).
    suspended: tuple[int, ...] = ()
    # Heartbeats it switched on arrival instead of at their instant (NodeInfo.late_beats, skewed_beats).
    late_beats: int = 0
    skewed_beats: int = 0
    # Its heartbeat and switch timings for storm-mm's metrics (see SwitchTimings); None: none measured.
    timings: SwitchTimings | None = None


@message("heartbeat")
@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Gang scheduling's time slice: from now on, row ``row`` of the matrix runs.

    ``epoch`` is the MM's (it changes when the MM restarts); ``seq`` grows by one per heartbeat. ``sent`` is
    the MM's clock when it sent it (delivery latency, on one host), ``slice`` the time until the next one.
    ``at`` is the instant (the MM's wall clock, ``[mm] switch_lead`` after ``sent``) at which the slot begins
    on every node whose clock agrees with the MM's; 0 (an older MM, or ``switch_lead = 0``): on arrival.
    """

    epoch: str
    seq: int
    row: int
    sent: float
    slice: float
    # FCS: jobs whose processes return to CS at the end of the slot that just ended (every tslots_max of
    # their slots), announced here so that every node resets them in the same slot.
    resets: tuple[int, ...] = ()
    at: float = 0.0

    def __post_init__(self) -> None:
        _check(self.seq >= 0 and self.row >= 0, "seq and row must be >= 0")
        _check(0 < self.slice <= 60, "slice must be in (0, 60] seconds")
        _check(self.at == 0 or 0 <= self.at - self.sent <= self.slice, "at: within a slice after sent, or 0")


@message("job_stats")
@dataclass(frozen=True, kw_only=True)
class JobStats(Message):
    """This node's ranks of a job, measured by mpihook, and their class changes since the last report."""

    job_id: int
    node: str
    ranks: tuple[RankStats, ...]
    changes: tuple[ClassChange, ...] = ()
    # With [nm] profile on: where each process's time went so far, per class.
    profile: tuple[ProfileEntry, ...] = ()


@message("job_rows")
@dataclass(frozen=True, kw_only=True)
class JobRows(Message):
    """Jobs of this node that moved to another row of the matrix (compaction after a job ended)."""

    rows: dict[str, int]

    def __post_init__(self) -> None:
        _check_rows(self.rows)


@message("reregister")
@dataclass(frozen=True, kw_only=True)
class Reregister(Message):
    """The MM does not know this NM (it restarted, or declared the node DOWN): register again."""

    reason: str


@message("launch_job")
@dataclass(frozen=True, kw_only=True)
class LaunchJob(Message):
    """Start this node's ranks of a job.

    Ranks are block-distributed: node i of the job holds ``ranks_per_node[i]`` consecutive ranks, and this
    node is number ``node_index``. Node i runs on host ``hosts[i]`` (hosts numbered 0, 1, ... in order of
    first appearance; empty: every node a host of its own). That is what MPI's wire-up needs to know which
    ranks share memory: MPICH's "node" is the host, so node managers that share a machine (a local
    cluster) give a job shared memory between their ranks, as mpiexec would.
    """

    job_id: int
    name: str
    kvsname: str
    size: int
    row: int
    node_index: int
    ranks_per_node: tuple[int, ...]
    slots: tuple[RankSlot, ...]
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    uid: int
    gid: int
    user: str
    output: str
    error: str
    hosts: tuple[int, ...] = ()
    hook: bool = True  # preload mpihook (storm submit --no-hook: not)
    # `storm run`: the ranks write into pipes that the job shell copies to the files and forwards (job_output)
    stream: bool = False

    def __post_init__(self) -> None:
        _check(self.size >= 1 and len(self.slots) >= 1, "a launch needs at least one rank")
        _check(all(0 <= s.rank < self.size for s in self.slots), "rank outside the job")
        _check(len(self.argv) >= 1, "a command is required")
        _check(0 <= self.node_index < len(self.ranks_per_node), "node_index outside the job")
        _check(sum(self.ranks_per_node) == self.size, "ranks_per_node does not add up to size")
        _check(self.ranks_per_node[self.node_index] == len(self.slots), "slots do not match ranks_per_node")
        _check(len({s.rank for s in self.slots}) == len(self.slots), "a rank appears twice in slots")
        _check(self.uid >= 0 and self.gid >= 0, "uid and gid must be >= 0")
        hosts_fit = len(self.hosts) == len(self.ranks_per_node) and _numbered_in_order(self.hosts)
        _check(not self.hosts or hosts_fit, "hosts must number each node's host 0, 1, ... in order")

    @property
    def mpi_node(self) -> int:
        """This node's number in MPI's view (PMI_process_mapping): its host's."""
        return self.hosts[self.node_index] if self.hosts else self.node_index


@message("kill_job")
@dataclass(frozen=True, kw_only=True)
class KillJob(Message):
    job_id: int
    reason: str


@message("suspend_job")
@dataclass(frozen=True, kw_only=True)
class SuspendJob(Message):
    """Preemption: stop this node's ranks of a job (SIGSTOP, through the context switch) and keep them
    stopped, whatever the heartbeats say, until resume_job; job ``by`` runs on their PEs meanwhile."""

    job_id: int
    by: int


@message("resume_job")
@dataclass(frozen=True, kw_only=True)
class ResumeJob(Message):
    """The end of a suspension: the job's ranks run again on their PEs, in row ``row`` of the matrix (under
    gang scheduling: when that row's slot comes)."""

    job_id: int
    row: int

    def __post_init__(self) -> None:
        _check(self.row >= 0, "row must be >= 0")


@message("job_launched")
@dataclass(frozen=True, kw_only=True)
class JobLaunched(Message):
    """All of this node's ranks of the job exist (processes spawned; MPI wire-up may still be under way)."""

    job_id: int
    node: str
    pids: dict[str, int]

    def __post_init__(self) -> None:
        _check_pids(self.pids)


@message("job_node_done")
@dataclass(frozen=True, kw_only=True)
class JobNodeDone(Message):
    """Every rank of the job on this node has ended. Re-sent until acknowledged.

    ``reason`` is set when the NM stopped the ranks on its own account (it is shutting down): the job
    then ends NODE_FAIL with that reason rather than FAILED by the signal its ranks died of.
    """

    job_id: int
    node: str
    exits: tuple[RankExit, ...]
    reason: str = ""
    profile: tuple[ProfileEntry, ...] = ()  # the final profile of the node's ranks (with [nm] profile on)


@message("rank_failed")
@dataclass(frozen=True, kw_only=True)
class RankFailed(Message):
    """Sent as soon as one rank fails, so the MM can stop the job everywhere without waiting for the rest."""

    job_id: int
    node: str
    exit: RankExit


@message("ack")
@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    """The MM has durably recorded a node report; ``what`` is the acknowledged op."""

    job_id: int
    what: str


@message("pmi_barrier_in")
@dataclass(frozen=True, kw_only=True)
class PmiBarrierIn(Message):
    """Every local rank of a job entered PMI barrier ``seq``; ``kvs`` is what they put since the last one."""

    job_id: int
    node: str
    seq: int
    kvs: dict[str, str]

    def __post_init__(self) -> None:
        _check(self.seq >= 0, "seq must be >= 0")


@message("pmi_barrier_out")
@dataclass(frozen=True, kw_only=True)
class PmiBarrierOut(Message):
    """All nodes reached barrier ``seq``; ``kvs`` is everything any node put since the previous barrier."""

    job_id: int
    seq: int
    kvs: dict[str, str]

    def __post_init__(self) -> None:
        _check(self.seq >= 0, "seq must be >= 0")
