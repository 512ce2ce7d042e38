"""Job shell <-> storm-nm: the job shell says who it is and what became of the ranks it spawned; the NM
hands it jobs to start (``shell_launch``), stops them and retires it.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

import dataclasses

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import Message, message
from storm.mm.codec import check as _check
from storm.mm.protocol.node import LaunchJob
from storm.mm.protocol.records import RankExit, _check_pids

# --------------------------------------------------------------------------------------------------------
# Job shell <-> NM


@message("shell_hello")
@dataclass(frozen=True, kw_only=True)
class ShellHello(Message):
    job_id: int
    pid: int

    def __post_init__(self) -> None:
        _check(self.pid >= 1, "pid must be >= 1")


@message("ranks_started")
@dataclass(frozen=True, kw_only=True)
class RanksStarted(Message):
    job_id: int
    pids: dict[str, int]

    def __post_init__(self) -> None:
        _check_pids(self.pids)


@message("rank_aborted")
@dataclass(frozen=True, kw_only=True)
class RankAborted(Message):
    """A rank called MPI_Abort. MPICH does not exit after it: the job must be stopped from outside."""

    job_id: int
    exit: RankExit


@message("rank_exited")
@dataclass(frozen=True, kw_only=True)
class RankExited(Message):
    job_id: int
    exit: RankExit


@message("shell_done")
@dataclass(frozen=True, kw_only=True)
class ShellDone(Message):
    job_id: int
    exits: tuple[RankExit, ...]


@message("shell_ready")
@dataclass(frozen=True, kw_only=True)
class ShellReady(Message):
    """A job shell is connected (sent first on every connection): the NM may send it launches."""

    pid: int

    def __post_init__(self) -> None:
        _check(self.pid >= 1, "pid must be >= 1")


@message("shell_launch")
@dataclass(frozen=True, kw_only=True)
class ShellLaunch(Message):
    """Start the node's ranks of ``launch`` (NM -> job shell). ``jobdir`` is the job's directory on the
    node; ``hook_library`` is mpihook's library to preload ("": none), ``hook_segment`` its statistics
    segment ("": the hook only passes calls through) and ``hook_environment`` MPICH settings for its waits
    (a variable the job set itself wins)."""

    launch: LaunchJob
    jobdir: str
    hook_library: str = ""
    hook_segment: str = ""
    hook_environment: dict[str, str] = dataclasses.field(default_factory=dict)


@message("shell_stop")
@dataclass(frozen=True, kw_only=True)
class ShellStop(Message):
    """Stop every process of the job (NM -> job shell): its ranks end, and it spawns nothing more."""

    job_id: int


@message("shell_retire")
@dataclass(frozen=True, kw_only=True)
class ShellRetire(Message):
    """Exit once no job's processes run any more (NM -> job shell): the NM gives it no more jobs."""
