"""Dynamic processes (MPI_Comm_spawn) and names (MPI_Publish_name and friends): job shell -> NM -> MM
reports of spawns and the name service's requests and results (a client's ``get_spawns`` is client.py's).

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import Message, message
from storm.mm.codec import check as _check
from storm.mm.protocol.records import RankExit, _check_pids, _numbered, _plain

# --------------------------------------------------------------------------------------------------------
# Dynamic processes and names (see the docstring of storm.mm.protocol, mm/protocol/__init__.py)

NAME_OPS = ("publish", "lookup", "unpublish")
SERVICE_MAX = 256  # characters in a published name
PORT_MAX = 1024  # in a published port (MPICH's PMI_MAX_PORT_NAME)


@message("spawned")
@dataclass(frozen=True, kw_only=True)
class Spawned(Message):
    """The job shell started the processes of one MPI_Comm_spawn(_multiple): world ``world`` (1, 2, ...) of
    the job on this node. ``pids`` and ``pes`` map each process's rank in its world to its pid and PE;
    ``parent`` is the job rank whose output files they write to (the spawner's, or its own spawner's)."""

    job_id: int
    world: int
    parent: int
    pids: dict[str, int]
    pes: dict[str, int]

    def __post_init__(self) -> None:
        _check(self.world >= 1 and self.parent >= 0, "world must be >= 1 and parent >= 0")
        _check_pids(self.pids)
        _check(len(self.pids) >= 1, "a spawn starts at least one process")
        _check(set(self.pes) == set(self.pids) and _numbered(self.pes, 0), "pes must give each process a PE")


@message("spawn_exited")
@dataclass(frozen=True, kw_only=True)
class SpawnExited(Message):
    """A spawned process of world ``world`` ended (``exit.rank`` is its rank in that world), or, with
    ``aborted``, called MPI_Abort (MPICH does not exit after it: it must be stopped from outside)."""

    job_id: int
    world: int
    exit: RankExit
    aborted: bool = False

    def __post_init__(self) -> None:
        _check(self.world >= 1, "world must be >= 1")


@message("job_spawned")
@dataclass(frozen=True, kw_only=True)
class JobSpawned(Message):
    """A spawn of the job on ``node``: world ``world`` of ``processes`` processes, or (``refused`` set,
    world 0) one that storm refused, and why. From the NM to the MM (and from a shell to its NM, refusals
    only: the NM learns started ones from ``spawned``)."""

    job_id: int
    node: str
    world: int
    processes: int
    refused: str = ""

    def __post_init__(self) -> None:
        _check(self.world >= 0 and self.processes >= 0, "world and processes must be >= 0")
        _check((self.world == 0) == bool(self.refused), "a refused spawn has world 0, a started one >= 1")


@message("spawn_failed")
@dataclass(frozen=True, kw_only=True)
class SpawnFailed(Message):
    """A spawned process failed (a non-zero exit, a signal, MPI_Abort, leaving MPI without MPI_Finalize):
    the job is stopped everywhere and ends FAILED, as when a rank fails."""

    job_id: int
    node: str
    world: int
    parent: int
    exit: RankExit

    def __post_init__(self) -> None:
        _check(self.world >= 1 and self.parent >= 0, "world must be >= 1 and parent >= 0")

    def describe(self) -> str:
        """The reason the job ends with, as RankExit.describe() says it of a rank."""
        text = self.exit.describe().split(":", 1)
        what = text[0].replace(f"rank {self.exit.rank} ", "", 1)
        who = f"spawned process {self.exit.rank} of spawn {self.world} (from rank {self.parent})"
        return f"{who} {what} on {self.node}" + (f":{text[1]}" if len(text) > 1 else "")


@message("pmi_name")
@dataclass(frozen=True, kw_only=True)
class PmiName(Message):
    """A process of the job asks to ``publish`` ``service`` at ``port``, ``lookup`` its port, or
    ``unpublish`` it (``action``). ``seq`` is the job shell's number for the request, answered in
    pmi_name_result."""

    job_id: int
    node: str
    seq: int
    action: str
    service: str
    port: str = ""

    def __post_init__(self) -> None:
        _check(self.action in NAME_OPS, f"action must be one of {', '.join(NAME_OPS)}, not {self.action!r}")
        _check(self.seq >= 0, "seq must be >= 0")
        _check(1 <= len(self.service) <= SERVICE_MAX and _plain(self.service), "service: 1-256 characters")
        _check(len(self.port) <= PORT_MAX and _plain(self.port), f"port: at most {PORT_MAX} characters")
        _check((self.action == "publish") == bool(self.port), "a port is given to publish, and only then")


@message("pmi_name_result")
@dataclass(frozen=True, kw_only=True)
class PmiNameResult(Message):
    """The answer to pmi_name ``seq`` of the job: done (a lookup's ``port``), or ``error`` saying why not."""

    job_id: int
    seq: int
    ok: bool
    port: str = ""
    error: str = ""

    def __post_init__(self) -> None:
        _check(self.seq >= 0, "seq must be >= 0")
        _check(len(self.port) <= PORT_MAX, f"port: at most {PORT_MAX} characters")
