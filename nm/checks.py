"""What a node manager accepts from a job shell, beyond what decoding checks: pure, so it is unit tested.

A job shell runs as the job's user, so the NM (root) does not take its word for anything that would make it
signal processes or end the job differently: a message must be about the shell's own job and ranks, must
not contradict a report already taken, and PMI barriers must come in order (0, 1, 2, ...), one at a time.
Anything else is refused with the reason, which the NM logs; nothing of the job changes.

Ranks and spawned processes (MPI_Comm_spawn) the NM will signal as root, so it takes them only if they are
the shell's own: its children (a job shell runs as its user and serves only that user's jobs), not the
shell itself; spawned processes must also not be one of the ranks, must each be on a PE the job holds
here, and in a world not reported otherwise before. Their exits must be of processes of a known world; a
refused spawn and name requests must name this node.

A shell re-sends its whole state when it reconnects (to a restarted NM): an exact repeat of a report, or of
the barrier just passed, is therefore accepted, and the NM's handling of it changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from storm.mm import protocol as p
from storm.nm.local_jobs import LocalJob


def shell_problem(
    job: LocalJob,
    msg: p.Message,
    node: str,
    next_barrier: int | None,
    parent: Callable[[int], int | None],
) -> str | None:
    """Why ``msg`` from ``job``'s shell must be refused, or None to accept it.

    ``next_barrier`` is the PMI barrier the NM expects next from the job (None: not known, any is taken);
    ``parent`` gives a process's parent pid (Processes.parent), None once it is gone.
    """
    ranks = {slot.rank for slot in job.launch.slots}
    match msg:
        case p.ShellHello():
            if msg.pid != job.shell_pid:
                return f"hello from pid {msg.pid}, but the job shell is pid {job.shell_pid}"
        case p.RanksStarted():
            foreign = sorted(int(rank) for rank in msg.pids if int(rank) not in ranks)
            if foreign:
                return f"rank(s) {foreign} are not this node's ranks of the job"
            if len(set(msg.pids.values())) != len(msg.pids) or job.shell_pid in msg.pids.values():
                return "a process id given twice, or the shell's own"
            strangers = foreign_pids(msg.pids, job.shell_pid, parent)
            if strangers:
                return f"process(es) {strangers} are not the job shell's children: they are not its ranks"
        case p.RankExited() | p.RankAborted():
            if msg.exit.rank not in ranks:
                return f"rank {msg.exit.rank} is not one of this node's ranks of the job"
            earlier = job.exits.get(msg.exit.rank)
            if isinstance(msg, p.RankExited) and earlier is not None and earlier != msg.exit:
                return f"rank {msg.exit.rank} already ended otherwise ({earlier.describe()})"
        case p.ShellDone():
            seen = [e.rank for e in msg.exits]
            if len(set(seen)) != len(seen) or not set(seen) <= ranks:
                return f"exits for ranks {seen}, but this node runs ranks {sorted(ranks)}, once each"
        case p.PmiBarrierIn():
            if msg.node != node:
                return f"a barrier for node {msg.node!r} sent to node {node!r}"
            if job.barrier is not None and msg.seq != job.barrier.seq:
                return f"barrier {msg.seq} while barrier {job.barrier.seq} is still pending"
            # The one just passed may come again: its answer was lost to a reconnection, and the MM has it.
            expected = (next_barrier - 1, next_barrier) if next_barrier is not None else ()
            if job.barrier is None and expected and msg.seq not in expected:
                return f"barrier {msg.seq} out of order: the next one is {next_barrier}"
        case p.Spawned() | p.SpawnExited() | p.JobSpawned() | p.PmiName():
            return _dynamic_problem(job, msg, node, parent)
        case p.JobOutput():
            if not job.launch.stream:
                return "output of a job that is not streamed"
            if msg.node != node or msg.rank not in ranks:
                return f"output of rank {msg.rank} on node {msg.node!r}, not one of this node's ranks"
        case _:
            return f"{msg.op} is not a job shell message"
    return None


def _dynamic_problem(
    job: LocalJob,
    msg: p.Spawned | p.SpawnExited | p.JobSpawned | p.PmiName,
    node: str,
    parent: Callable[[int], int | None],
) -> str | None:
    """shell_problem for what the shell says of spawned processes and names."""
    match msg:
        case p.Spawned():
            known = job.spawns.worlds.get(msg.world)
            if known is not None:
                before = {f"{r}": c.pid for (w, r), c in job.spawns.children.items() if w == msg.world}
                return None if before == msg.pids else f"spawn {msg.world} was reported otherwise before"
            pes = {slot.pe for slot in job.launch.slots}
            if not set(msg.pes.values()) <= pes:
                return f"PE(s) {sorted(set(msg.pes.values()) - pes)} are not the job's on this node"
            pids = set(msg.pids.values())
            running = {pid for rank, pid in job.pids.items() if rank not in job.exits}
            if len(pids) != len(msg.pids) or pids & {job.shell_pid, *running}:
                return "a process id given twice, or the shell's or a rank's"
            strangers = foreign_pids(msg.pids, job.shell_pid, parent)
            if strangers:
                return f"process(es) {strangers} are not the job shell's children: it did not spawn them"
        case p.SpawnExited():
            if msg.world not in job.spawns.worlds:
                return f"spawn {msg.world} was never reported"
            child = job.spawns.children.get((msg.world, msg.exit.rank))
            if child is None:
                return f"spawn {msg.world} has no process {msg.exit.rank}"
            if not msg.aborted and child.exit is not None and child.exit != msg.exit:
                return f"spawned process {msg.exit.rank} of spawn {msg.world} already ended otherwise"
        case p.JobSpawned():
            if msg.node != node or not msg.refused:
                return "a job shell reports only the spawns it refused, on its own node"
        case p.PmiName():
            if msg.node != node:
                return f"a name request for node {msg.node!r} sent to node {node!r}"
    return None


def foreign_pids(pids: dict[str, int], shell_pid: int, parent: Callable[[int], int | None]) -> list[int]:
    """The claimed pids of live processes that are not the shell's children.

    The NM signals ranks' process groups as root, so a shell must not make it signal, say, init's, or
    another user's process. A pid already gone is no danger (a rank that ended, reaped by its shell).
    """
    return sorted(pid for pid in pids.values() if (ppid := parent(pid)) is not None and ppid != shell_pid)
