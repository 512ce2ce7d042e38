"""MPI_Comm_spawn and MPI_Comm_spawn_multiple under storm: the PMI-1 side and the plan, pure (no I/O).

What MPICH 5's PMI-1 client sends (src/pmi/src/pmi_wire.c, PMIU_msg_set_query_spawn; checked by logging what
a spawning mpi4py rank writes): one ``mcmd=spawn`` block per command of the spawn, each field on a line of
its own, values raw (not escaped: an argument may hold spaces), the block closed by ``endcmd``::

    mcmd=spawn
    nprocs=2
    execname=/usr/bin/python3
    totspawns=2             # commands in the whole spawn (1 for MPI_Comm_spawn)
    spawnssofar=1           # this command's number, 1, 2, ...
    argcnt=2
    arg1=child.py           # arg1 .. arg<argcnt>
    arg2=a b
    preput_num=1            # first command only: keys for the children's KVS
    preput_key_0=PARENT_ROOT_PORT_NAME
    preput_val_0=tag#0$connentry#...$
    info_num=1              # the command's MPI_Info (Hydra honours wdir, path, host, hostfile)
    info_key_0=wdir
    info_val_0=/tmp
    endcmd
    mcmd=spawn              # the next command, same fields but no preput
    ...
    endcmd

The whole spawn ends with the ``endcmd`` whose block has ``spawnssofar == totspawns``; only then does the
client read the reply, ``cmd=spawn_result rc=0`` (optionally ``errcodes=0,0,...``, one per process; without
it MPICH takes every process as started). Any ``rc`` other than 0 makes the spawn fail at the root, which
broadcasts the failure: MPI_Comm_spawn returns MPI_ERR_OTHER on every rank of the spawning communicator, at
once (MPICH prints the server's ``msg`` only with PMI_DEBUG set, so storm also writes it to the job's
stderr). The root then waits in MPI_Comm_accept on the port it preput as ``PARENT_ROOT_PORT_NAME``; each
child reads that key from its own KVS at MPI_Init and connects. A child knows it was spawned from
``PMI_SPAWNED=1`` in its environment (PMI_Init reads it; it is not in any reply), and its command's
number from ``get_appnum``. It then wires up as any world does: init, get_maxes, get_appnum,
get_my_kvsname, get of PMI_process_mapping (all children are on one node: ``(vector,(0,1,N))``),
barrier_in, finalize.

Semantics storm gives (the job shell does the I/O, nm/shell.py and nm/spawner.py; the NM the accounting,
nm/local_jobs.py and nm/children.py):

* A spawn makes a new MPI world of the same storm job, numbered 1, 2, ... on the node (the job's own ranks
  are world 0); its kvsname is the job's followed by ``-<node index>-<world>``, so that MPICH's shared
  memory (named from the kvsname) is unique and known to the NM, which removes it when the job ends.
* Its processes are started by the job shell of the node where the spawning root runs, each in a process
  group of its own, pinned to one of the PEs the job holds on that node (the least loaded by spawned
  processes, in slot order), as the job's user, with the job's environment (not mpihook: it has no record
  for them), cwd (or the command's ``wdir`` info, relative to it) and output files. ``%t`` in the job's
  output and error names stands for the rank that called MPI_Comm_spawn (for a nested spawn, the job
  rank its spawner's output went to): a spawned process writes to its spawner's files, as under mpiexec
  it writes to mpiexec's. ``path`` info is a directory to look for the program in; other info keys
  (``host``...) are ignored, as MPI allows: the processes always start on the spawner's node.
* Their environment: PMI_FD, PMI_RANK and PMI_SIZE of their own world, PMI_SPAWNED=1, STORM_JOB_ID,
  STORM_NODE, STORM_RANK and STORM_SIZE (their rank and size in their world), STORM_SPAWN (the world's
  number on the node). Their appnum is their command's index in MPI_Comm_spawn_multiple (0, 1, ...),
  their universe size the job's size.
* Room: a job may have at most ``[nm] spawn_limit`` live spawned processes per PE it holds on the node
  (0: no spawning). A spawn that would pass it is refused whole (nothing starts), at once, with a message
  that names storm, the job, the node and the limit; so is one of a missing program, or while the job ends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_BLOCK_BYTES = 1 << 20  # a whole spawn request (every command's block)
MAX_PROCESSES = 4096  # in one spawn
MAX_ARGS = 4096  # per command
MAX_KEYS = 1024  # info or preput keys per command
_INT = re.compile(r"-?[0-9]{1,9}")


class SpawnError(ValueError):
    """A spawn request that cannot be served as sent."""


@dataclass(frozen=True)
class SpawnCommand:
    """One command of a spawn: ``nprocs`` processes of ``execname`` with ``args`` after it."""

    execname: str
    nprocs: int
    args: tuple[str, ...] = ()
    info: tuple[tuple[str, str], ...] = ()

    def info_value(self, key: str) -> str | None:
        return next((value for k, value in self.info if k == key), None)


@dataclass(frozen=True)
class SpawnRequest:
    """What MPI_Comm_spawn(_multiple) asked for: its commands in order, and the keys to preput in the new
    world's KVS."""

    commands: tuple[SpawnCommand, ...]
    preput: dict[str, str]

    @property
    def total(self) -> int:
        return sum(c.nprocs for c in self.commands)

    def appnums(self) -> list[int]:
        """The appnum of each rank of the new world: its command's index."""
        return [index for index, c in enumerate(self.commands) for _ in range(c.nprocs)]


class SpawnBlock:
    """Collects the lines of one spawn request (every command's ``mcmd=spawn`` ... ``endcmd``).

    :meth:`feed` never raises: a malformed request is swallowed to its end all the same (the client sends
    the whole of it before it reads a reply), and :meth:`request` then raises with what was wrong.
    """

    def __init__(self) -> None:
        self.segments: list[dict[str, str]] = []
        self.counts: dict[str, str] = {}  # this command's totspawns and spawnssofar, kept even when bad
        self.open = False  # inside a command, between its mcmd=spawn and its endcmd
        self.size = 0
        self.error = ""

    def feed(self, line: str) -> bool:
        """Take one line; True once the request is complete (its last command's endcmd)."""
        text = line[:-1] if line.endswith("\n") else line
        self.size += len(line)
        if self.size > MAX_BLOCK_BYTES:
            self._fail(f"spawn request longer than {MAX_BLOCK_BYTES} bytes")
        if text.startswith("mcmd="):
            if text != "mcmd=spawn":
                self._fail(f"unknown multi-line command {text[:40]!r}")
            self.open = True
            self.counts = {}
            if not self.error:
                self.segments.append({})
            return False
        if text == "endcmd":
            self.open = False
            return self.counts.get("spawnssofar", "1") == self.counts.get("totspawns", "1")
        key, eq, value = text.partition("=")
        if key in ("totspawns", "spawnssofar"):
            self.counts[key] = value
        if not self.open:
            self._fail(f"{text[:40]!r} outside a spawn command")
        elif not eq or not key:
            self._fail(f"line without key=value in a spawn command: {text[:40]!r}")
        elif not self.error:
            if key in self.segments[-1]:
                self._fail(f"{key[:40]} given twice in spawn command {len(self.segments)}")
            else:
                self.segments[-1][key] = value
        return False

    def _fail(self, text: str) -> None:
        """The first problem is the one reported; nothing more of the request is kept."""
        if not self.error:
            self.error = text
            self.segments.clear()

    def request(self) -> SpawnRequest:
        """The complete request; SpawnError if it was malformed."""
        if self.error:
            raise SpawnError(self.error)
        if not self.segments:
            raise SpawnError("empty spawn request")
        commands = []
        for number, fields in enumerate(self.segments, 1):
            where = f"spawn command {number}"
            if _int(fields, "totspawns", where, default=1) != len(self.segments):
                raise SpawnError(f"{where}: totspawns is not the {len(self.segments)} command(s) sent")
            if _int(fields, "spawnssofar", where, default=1) != number:
                raise SpawnError(f"{where}: spawnssofar is not {number}")
            execname = fields.get("execname", "")
            if not execname or "\0" in execname:
                raise SpawnError(f"{where}: no execname")
            nprocs = _int(fields, "nprocs", where)
            if not 0 <= nprocs <= MAX_PROCESSES:
                raise SpawnError(f"{where}: nprocs {nprocs} is not between 0 and {MAX_PROCESSES}")
            argcnt = _int(fields, "argcnt", where, default=0)
            if not 0 <= argcnt <= MAX_ARGS:
                raise SpawnError(f"{where}: argcnt {argcnt} is not between 0 and {MAX_ARGS}")
            args = tuple(_field(fields, f"arg{i}", where) for i in range(1, argcnt + 1))
            info = _pairs(fields, "info_num", "info_key_", "info_val_", where)
            commands.append(SpawnCommand(execname=execname, nprocs=nprocs, args=args, info=tuple(info)))
        preput = dict(_pairs(self.segments[0], "preput_num", "preput_key_", "preput_val_", "spawn command 1"))
        request = SpawnRequest(commands=tuple(commands), preput=preput)
        if not 1 <= request.total <= MAX_PROCESSES:
            raise SpawnError(f"a spawn of {request.total} processes (1 to {MAX_PROCESSES} at once)")
        return request


def _field(fields: Mapping[str, str], key: str, where: str) -> str:
    value = fields.get(key)
    if value is None:
        raise SpawnError(f"{where}: {key} is missing")
    if "\0" in value:
        raise SpawnError(f"{where}: {key} holds a NUL character")
    return value


def _int(fields: Mapping[str, str], key: str, where: str, default: int | None = None) -> int:
    value = fields.get(key)
    if value is None and default is not None:
        return default
    if value is None or not _INT.fullmatch(value):
        raise SpawnError(f"{where}: {key} must be an integer, not {(value or '(missing)')[:20]!r}")
    return int(value)


def _pairs(
    fields: Mapping[str, str], count: str, keys: str, values: str, where: str
) -> list[tuple[str, str]]:
    number = _int(fields, count, where, default=0)
    if not 0 <= number <= MAX_KEYS:
        raise SpawnError(f"{where}: {count} {number} is not between 0 and {MAX_KEYS}")
    return [
        (_field(fields, f"{keys}{i}", where), _field(fields, f"{values}{i}", where)) for i in range(number)
    ]


# ---------------------------------------------------------------------------------------------- the plan


def world_kvsname(job_kvsname: str, node_index: int, world: int) -> str:
    """The kvsname of spawned world ``world`` (1, 2, ...) of a job on its node ``node_index``: derived, so
    that the NM knows which shared memory to remove without taking the job shell's word for a name."""
    if world < 1 or node_index < 0:
        raise ValueError(f"no spawned world {world} on node {node_index}")
    return f"{job_kvsname}-{node_index}-{world}"


def choose_pes(load: Mapping[int, int], pes: Sequence[int], count: int) -> list[int]:
    """PEs for ``count`` new processes: each goes to the PE with the fewest spawned processes (``load``),
    the first of ``pes`` (the job's slot order) among equals."""
    if not pes:
        raise ValueError("no PEs to place spawned processes on")
    counts = {pe: load.get(pe, 0) for pe in pes}
    chosen = []
    for _ in range(count):
        pe = min(pes, key=lambda q: counts[q])
        counts[pe] += 1
        chosen.append(pe)
    return chosen


def room_problem(*, job_id: int, node: str, live: int, wanted: int, pes: int, limit: int) -> str | None:
    """Why a spawn of ``wanted`` processes must be refused when the job has ``live`` spawned processes on
    a node where it holds ``pes`` PEs, or None if there is room."""
    if wanted <= (limit * pes) - live:
        return None
    if limit == 0:
        return f"storm: job {job_id} may not spawn processes on node {node}: [nm] spawn_limit is 0 there"
    return (
        f"storm: MPI_Comm_spawn of {wanted} process(es) refused for job {job_id} on node {node}: it already"
        f" has {live} spawned process(es) there, and a job may have at most {limit} per PE it holds on the"
        f" node ([nm] spawn_limit = {limit}, {pes} PE(s): at most {limit * pes})"
    )


def child_environment(
    env: Mapping[str, str], *, job_id: int, node: str, world: int, rank: int, size: int
) -> dict[str, str]:
    """A spawned process's environment: the job's (less what PMI and mpihook set for ranks), and its own
    PMI world (see the module's docstring; the shell adds PMI_FD)."""
    child = {k: v for k, v in env.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "STORM_HOOK_"))}
    child.update(
        PMI_RANK=str(rank),
        PMI_SIZE=str(size),
        PMI_SPAWNED="1",
        STORM_JOB_ID=str(job_id),
        STORM_NODE=node,
        STORM_RANK=str(rank),
        STORM_SIZE=str(size),
        STORM_SPAWN=str(world),
    )
    return child


def describe_spawned(world: int, rank: int, parent: int) -> str:
    """How a spawned process is named in reasons and logs."""
    return f"spawned process {rank} of spawn {world} (by rank {parent})"
