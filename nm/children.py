"""What a node manager knows of the processes a job spawned on its node (MPI_Comm_spawn; see nm/spawn.py).

The job shell reports each spawn (``spawned``: one world of processes, their pids and PEs) and each exit
(``spawn_exited``). The NM keeps, per job, every world (for the shared memory MPICH names after the world's
kvsname, removed when the job ends) and every spawned process with its kernel start time: a process is
signalled (stopped and continued with the job's rank on its PE, killed with the job) only while it is the
process that was reported, never a later process that reuses its pid; one already gone when reported is
never signalled at all. Both go into the job's record (nm.json), so that a restarted NM re-adopts the
running ones (and continues any that time slicing had stopped) and sweeps the worlds' memory.

The first failure of a spawned process is kept too: it is what the job ends with (``spawn_failed``), sent
again to the MM before the node's final report on the job, in case the first copy was lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from storm.mm import protocol as p
from storm.nm.pmi import mpich_shm_names
from storm.nm.spawn import world_kvsname

# MPICH numbers the nodes of a world from 0; a spawned world is on one node.
SPAWNED_MPI_NODE = 0


@dataclass
class Child:
    world: int
    rank: int  # in its world
    pid: int
    pe: int
    start: int | None  # the kernel's start time; None: gone when reported, never signalled
    exit: p.RankExit | None = None

    @property
    def live(self) -> bool:
        return self.start is not None and self.exit is None


@dataclass
class Spawns:
    """A job's spawned worlds and processes on this node."""

    worlds: dict[int, int] = field(default_factory=dict)  # world -> the job rank it writes its output as
    children: dict[tuple[int, int], Child] = field(default_factory=dict)  # (world, rank) -> process
    failure: p.SpawnFailed | None = None

    def add(self, msg: p.Spawned, start_time: Callable[[int], int | None]) -> list[Child]:
        """A new world's processes (live ones with their start times); [] for a world already known."""
        if msg.world in self.worlds:
            return []
        self.worlds[msg.world] = msg.parent
        added = []
        for rank, pid in msg.pids.items():
            child = Child(world=msg.world, rank=int(rank), pid=pid, pe=msg.pes[rank], start=start_time(pid))
            self.children[(msg.world, child.rank)] = child
            added.append(child)
        return added

    def live(self) -> list[Child]:
        return [c for c in self.children.values() if c.live]

    def shm_names(self, launch: p.LaunchJob) -> list[str]:
        """The /dev/shm names MPICH may leave for the job's spawned worlds on this node."""
        return [
            name
            for world in self.worlds
            for name in mpich_shm_names(
                world_kvsname(launch.kvsname, launch.node_index, world), SPAWNED_MPI_NODE
            )
        ]

    def record(self) -> dict[str, object]:
        return {
            "worlds": {str(world): parent for world, parent in self.worlds.items()},
            "children": {f"{c.world}:{c.rank}": [c.pid, c.start, c.pe] for c in self.live()},
        }

    @classmethod
    def from_record(cls, record: object, start_time: Callable[[int], int | None]) -> Spawns:
        """What a previous NM recorded, keeping only the processes that still run as the same process.
        Raises TypeError or ValueError for a record that does not hang together."""
        spawns = cls()
        if record is None:
            return spawns
        if not isinstance(record, dict):
            raise TypeError("spawns is not a map")
        worlds, children = record.get("worlds", {}), record.get("children", {})
        if not isinstance(worlds, dict) or not isinstance(children, dict):
            raise TypeError("spawns.worlds and spawns.children must be maps")
        spawns.worlds = {int(world): _int(parent) for world, parent in worlds.items()}
        for key, (raw_pid, start, raw_pe) in children.items():
            world, rank = (int(part) for part in str(key).split(":"))
            if world not in spawns.worlds:
                raise ValueError(f"spawned process {key} of no world")
            pid, pe = _int(raw_pid), _int(raw_pe)
            if start is not None and start_time(pid) == _int(start):
                spawns.children[(world, rank)] = Child(world=world, rank=rank, pid=pid, pe=pe, start=start)
        return spawns


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value
