"""Where each process's time went, per FCS class: the execution profile of the paper's section 3 (and of
ClusterSchedSim), to see why a policy is slow on a workload.

With ``[nm] profile = true`` the node manager snapshots every rank at every time slice (one read of
/proc/<pid>/schedstat per rank, besides the mpihook records it reads anyway) and adds what happened since the
last snapshot to the rank's totals for the class it had meanwhile ("" outside FCS). Categories, in seconds:

- compute: on a CPU outside MPI's waits (the kernel's CPU time, less polling);
- poll: on a CPU waiting inside a blocking MPI call (busy polling, or the spin phase of spin-block);
- blocked: inside a blocking call without using a CPU (spin-block's block phase);
- stopped: stopped by the context switch (SIGSTOP);
- queued: runnable but waiting for a CPU another process had (the kernel's run delay).

They add up to the wall time but for "other": start-up before MPI_Init, sleeps outside MPI, and the part
of the last slice after the final snapshot. Pure: the node manager takes the snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from storm.mm.protocol import ProfileEntry

Key = tuple[int, int]  # (job id, rank)


@dataclass(frozen=True)
class Snapshot:
    """A process's cumulative nanoseconds since the node manager saw it start."""

    wall: int = 0
    cpu: int = 0
    queued: int = 0
    poll: int = 0
    blocked: int = 0
    stopped: int = 0


ZERO = Snapshot()


@dataclass
class Totals:
    wall: int = 0
    compute: int = 0
    poll: int = 0
    blocked: int = 0
    stopped: int = 0
    queued: int = 0

    def add(self, new: Snapshot, old: Snapshot) -> int:
        """Add the interval from ``old`` to ``new``; returns the nanoseconds by which its CPU, stopped and
        queued time exceed its wall time (0 if they do not): see Profiler.update."""
        wall, cpu, poll = new.wall - old.wall, new.cpu - old.cpu, new.poll - old.poll
        stopped, queued = new.stopped - old.stopped, new.queued - old.queued
        self.wall += wall
        self.compute += max(0, cpu - poll)
        self.poll += poll
        # mpihook's block phase lasts until the call returns, so it includes the wait for a CPU after the
        # wake-up, which the kernel counts as queued: blocked is what is left of the wall time.
        left = wall - cpu - stopped - queued
        self.blocked += max(0, min(new.blocked - old.blocked, left))
        self.stopped += stopped
        self.queued += queued
        return max(0, -left)


class Profiler:
    def __init__(self, node: str) -> None:
        self.node = node
        self.last: dict[Key, Snapshot] = {}
        self.totals: dict[tuple[Key, str], Totals] = {}
        self.classes: dict[Key, list[Totals]] = {}  # each process's totals, one per class it had

    def update(self, key: Key, snapshot: Snapshot, label: str) -> None:
        """What happened to the process since its last snapshot (or its start) happened in class ``label``.

        The kernel adds a wait for a CPU to the run delay only once the wait ends, so an interval may get
        the queued time of an earlier one, which counted that time as blocked (the block phase lasts until
        the call returns): what an interval's times exceed its wall time by comes off the blocked time
        counted before (in its class then), so that no time counts as both.
        """
        old = self.last.get(key, ZERO)
        self.last[key] = snapshot
        totals = self.totals.get((key, label))
        if totals is None:
            totals = self.totals[key, label] = Totals()
            self.classes.setdefault(key, []).append(totals)
        excess = totals.add(snapshot, old)
        for earlier in (totals, *self.classes[key]) if excess else ():  # (a process has a class or three)
            taken = min(excess, earlier.blocked)
            earlier.blocked -= taken
            excess -= taken

    def entries(self, job_id: int) -> tuple[ProfileEntry, ...]:
        """The job's processes on this node, one entry per rank and class, in seconds."""
        found = []
        for ((job, rank), label), totals in sorted(self.totals.items()):
            if job == job_id:
                seconds = {f.name: getattr(totals, f.name) / 1e9 for f in fields(totals)}
                found.append(ProfileEntry(rank=rank, node=self.node, klass=label, **seconds))
        return tuple(found)

    def forget(self, job_id: int) -> None:
        for key in [k for k in self.last if k[0] == job_id]:
            del self.last[key]
            self.classes.pop(key, None)
        for key2 in [k for k in self.totals if k[0][0] == job_id]:
            del self.totals[key2]
