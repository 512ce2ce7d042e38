"""The job shell's spawned worlds and name requests: what nm/shell.py does for MPI_Comm_spawn and for
MPI_Publish_name / MPI_Lookup_name / MPI_Unpublish_name.

Spawning (semantics in nm/spawn.py): :meth:`Spawner.spawn` checks the room and the programs, then starts
every process of the request through the shell (pinned, in a process group of its own, served PMI like a
rank), tells the NM (``spawned``) and only then answers the spawner, so the NM can stop and continue them
with the job from their first time slice on. A refusal starts nothing; it is answered at once, written to the
spawner's stderr file and the shell's log, and reported to the NM (``job_spawned`` with the reason). If a
process cannot be started after all (the program vanished between the check and the exec), the spawn fails:
the processes already started for it are killed and not reported, so they fail nothing.

Names: each request goes to the NM, which relays it to the MM, numbered; the answer is matched by number
and written to the rank that asked. A rank waits for at most :data:`NAME_TIMEOUT` seconds: then it gets an
error (MPI_ERR_NAME or MPI_ERR_SERVICE in the program), and a late answer is dropped. A request is not sent
again to a restarted NM (a publish or unpublish might then be done twice): it times out instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from storm.mm import protocol as p
from storm.nm.pmi import NameRequest, Wireup, name_reply, process_mapping, spawn_reply
from storm.nm.spawn import SpawnRequest, child_environment, choose_pes, room_problem, world_kvsname

NAME_TIMEOUT = 10.0


@dataclass
class Proc:
    """A process the shell started and serves: one of the job's ranks (world 0) or a spawned one."""

    rank: int
    pe: int
    world: int = 0  # 0: a rank of the job; 1, 2, ...: a process of that spawn on this node
    out_rank: int = -1  # the job rank whose output files it writes to (its own, for a rank)
    pid: int = 0
    pidfd: int = -1
    writer: asyncio.StreamWriter | None = None  # its PMI socket, while connected
    talked_pmi: bool = False
    finalized: bool = False
    abort: p.RankExit | None = None
    exit: p.RankExit | None = None

    def __post_init__(self) -> None:
        if self.out_rank < 0:
            self.out_rank = self.rank


@dataclass
class World:
    """One spawn's processes on this node."""

    number: int
    wireup: Wireup
    parent: int  # the job rank whose output files they write to
    procs: dict[int, Proc] = field(default_factory=dict)
    reported: p.Spawned | None = None  # sent to the NM (and again to a restarted one)


class Host(Protocol):
    """What the spawner needs of the job shell."""

    launch: p.LaunchJob
    node: str
    stopping: bool

    def open_outputs(self, rank: int) -> tuple[int, int]:
        """The stdout and stderr descriptors of job rank ``rank``'s files (OSError if they cannot open)."""
        ...

    def start_process(
        self, proc: Proc, argv: list[str], env: dict[str, str], cwd: str, outputs: tuple[int, int]
    ) -> str:
        """Start ``proc`` (pinned, own process group, PMI served; the shell sets PMI_FD in ``env``): "" or
        why it could not start."""
        ...

    def notice(self, proc: Proc, text: str) -> None:
        """Tell the job's user: a line in ``proc``'s stderr file and in the shell's log."""
        ...

    def kill(self, proc: Proc) -> None: ...


class Spawner:
    def __init__(self, host: Host, spawn_limit: int, send: Callable[[p.Message], Awaitable[None]]) -> None:
        self.host = host
        self.limit = spawn_limit
        self.send = send
        self.worlds: dict[int, World] = {}
        self.abandoned: set[int] = set()  # worlds whose start failed: their exits are nobody's business
        launch = host.launch
        self.pes = list(dict.fromkeys(s.pe for s in launch.slots))

    def procs(self) -> list[Proc]:
        return [proc for world in self.worlds.values() for proc in world.procs.values()]

    def live(self) -> list[Proc]:
        return [proc for proc in self.procs() if proc.exit is None and proc.world not in self.abandoned]

    def reportable(self, proc: Proc) -> bool:
        return proc.world not in self.abandoned

    async def spawn(self, parent: Proc, request: SpawnRequest) -> str:
        """Serve one spawn request of ``parent``; return the reply line for it."""
        launch, node = self.host.launch, self.host.node
        live = self.live()
        error = room_problem(
            job_id=launch.job_id,
            node=node,
            live=len(live),
            wanted=request.total,
            pes=len(self.pes),
            limit=self.limit,
        )
        if self.host.stopping:
            error = f"storm: job {launch.job_id} is ending on node {node}: no more processes are spawned"
        cwds = [os.path.join(launch.cwd, c.info_value("wdir") or ".") for c in request.commands]
        programs = []
        for command, cwd in zip(request.commands, cwds, strict=True):
            program = find_program(command.execname, command.info_value("path"), launch.env, cwd)
            if not error and program is None:
                error = (
                    f"storm: MPI_Comm_spawn of job {launch.job_id} on node {node}: cannot execute"
                    f" {command.execname}: no such executable (from {cwd})"
                )
            programs.append(program or command.execname)
        if not error:
            try:
                outputs = self.host.open_outputs(parent.out_rank)
            except OSError as exc:
                error = f"storm: job {launch.job_id} on node {node}: cannot open output file {exc.filename}"
        if error:
            return await self._refuse(parent, error)
        try:
            return await self._start(parent, request, programs, cwds, outputs)
        finally:
            for fd in set(outputs):
                os.close(fd)

    async def _start(
        self,
        parent: Proc,
        request: SpawnRequest,
        programs: list[str],
        cwds: list[str],
        outputs: tuple[int, int],
    ) -> str:
        launch, node = self.host.launch, self.host.node
        live = self.live()
        number = max(self.worlds, default=0) + 1
        kvsname = world_kvsname(launch.kvsname, launch.node_index, number)
        appnums = request.appnums()
        wireup = Wireup(
            kvsname=kvsname, size=request.total, local_ranks=range(request.total),
            process_mapping=process_mapping([request.total]), universe_size=launch.size,
            kvs=request.preput, appnums=dict(enumerate(appnums)),
        )  # fmt: skip
        world = self.worlds[number] = World(number=number, wireup=wireup, parent=parent.out_rank)
        load: dict[int, int] = {}
        for proc in live:
            load[proc.pe] = load.get(proc.pe, 0) + 1
        pes = choose_pes(load, self.pes, request.total)
        for rank, (appnum, pe) in enumerate(zip(appnums, pes, strict=True)):
            proc = world.procs[rank] = Proc(rank=rank, pe=pe, world=number, out_rank=parent.out_rank)
            command = request.commands[appnum]
            env = child_environment(
                launch.env, job_id=launch.job_id, node=node, world=number, rank=rank, size=request.total
            )
            argv = [programs[appnum], *command.args]
            problem = self.host.start_process(proc, argv, env, cwds[appnum], outputs)
            if problem:
                self.abandoned.add(number)
                for started in world.procs.values():
                    if started.pid and started.exit is None:
                        self.host.kill(started)
                text = f"storm: MPI_Comm_spawn of job {launch.job_id} on node {node}: {problem}"
                return await self._refuse(parent, text)
        pids = {str(r): proc.pid for r, proc in world.procs.items()}
        world.reported = p.Spawned(
            job_id=launch.job_id, world=number, parent=parent.out_rank, pids=pids,
            pes={str(r): proc.pe for r, proc in world.procs.items()},
        )  # fmt: skip
        await self.send(world.reported)
        return spawn_reply()

    async def _refuse(self, parent: Proc, error: str) -> str:
        self.host.notice(parent, error)
        launch = self.host.launch
        await self.send(
            p.JobSpawned(job_id=launch.job_id, node=self.host.node, world=0, processes=0, refused=error)
        )
        return spawn_reply(error)

    def state(self) -> list[p.Message]:
        """What a restarted NM must be told again: each world, and its processes' aborts and exits."""
        messages: list[p.Message] = []
        job_id = self.host.launch.job_id
        for world in self.worlds.values():
            if world.reported is None:
                continue
            messages.append(world.reported)
            for proc in world.procs.values():
                if proc.abort is not None and proc.exit is None:
                    messages.append(
                        p.SpawnExited(job_id=job_id, world=world.number, exit=proc.abort, aborted=True)
                    )
                if proc.exit is not None:
                    messages.append(p.SpawnExited(job_id=job_id, world=world.number, exit=proc.exit))
        return messages


def find_program(execname: str, path: str | None, env: dict[str, str], cwd: str) -> str | None:
    """The program a spawn command names, as exec would find it: in the ``path`` info directory if given,
    else through the job's PATH (a name with a slash is taken relative to ``cwd``); None if it cannot run."""
    if path:
        execname = os.path.join(path, execname)
    if "/" in execname:
        full = os.path.join(cwd, execname)
        return execname if os.path.isfile(full) and os.access(full, os.X_OK) else None
    return shutil.which(execname, path=env.get("PATH", os.defpath))


class PendingNames:
    """Name requests sent to the NM and not yet answered: who asked, and until when they wait."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Proc, str, float]] = {}  # seq -> (process, op, deadline)
        self.seq = 0

    def add(self, proc: Proc, request: NameRequest, now: float) -> int:
        self.seq += 1
        self.pending[self.seq] = (proc, request.op, now + NAME_TIMEOUT)
        return self.seq

    def answer(self, result: p.PmiNameResult) -> tuple[Proc, str] | None:
        """The process to answer and the reply line; None for an answer nobody waits for (any more)."""
        entry = self.pending.pop(result.seq, None)
        if entry is None:
            return None
        proc, op, _deadline = entry
        error = "" if result.ok else result.error or "storm-mm refused it"
        return proc, name_reply(op, port=result.port, error=error)

    def expire(self, now: float) -> list[tuple[Proc, str]]:
        """Requests past their deadline, each with its error reply."""
        late = [seq for seq, (_, _, deadline) in self.pending.items() if deadline <= now]
        replies = []
        for seq in late:
            proc, op, _deadline = self.pending.pop(seq)
            error = f"storm: no answer from storm-mm within {NAME_TIMEOUT:g} s (is it running?)"
            replies.append((proc, name_reply(op, error=error)))
        return replies
