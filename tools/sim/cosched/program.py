"""The parallel program a simulated job runs: iterations of computation, I/O, then a communication step.

Each rank computes ``compute_ns[rank]`` nanoseconds of CPU time per iteration (so granularity and load
imbalance are parameters), then spends ``io_ns`` of wall time in I/O, using no CPU and not runnable
(ClusterSchedSim's job model: compute, I/O, communicate; 0 by default, which is the FCS paper's BSP loop),
then makes one blocking communication call. It can return from that call only
once every partner has reached the same step and the message has crossed the network:

    leave(r, k) >= max(enter(r, k), max(enter(p, k) for p in partners(r)) + latency_ns)

with the nearest neighbours on a ring, or every rank (itself included) for an all-reduce (ClusterSchedSim's
and the FCS paper's synthetic programs: a BSP loop with a ring exchange). How long after that instant the
rank really returns depends on whether it was polling or blocked and on its CPU: that is the node model's
business (tools/sim/cosched/node.py). A rank whose pattern is ``NONE`` never communicates: its iterations
are one long computation, and mpihook would count no blocking call.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Pattern(Enum):
    NONE = "none"
    RING = "ring"
    ALLREDUCE = "allreduce"


# Program.partner_table's tables by (pattern, ranks): they depend on nothing else.
_PARTNER_TABLES: dict[tuple[Pattern, int], tuple[tuple[int, ...], ...]] = {}


@dataclass(frozen=True)
class Program:
    """One job's program: ``len(compute_ns)`` ranks, each iterating ``iterations`` times."""

    compute_ns: tuple[int, ...]
    iterations: int
    pattern: Pattern = Pattern.RING
    latency_ns: int = 0
    io_ns: int = 0  # per iteration, after the computation: the CPU is released (the node model's IO phase)

    def __post_init__(self) -> None:
        if not self.compute_ns:
            raise ValueError("a program needs at least one rank")
        if self.iterations < 1:
            raise ValueError("a program needs at least one iteration")
        if min(self.compute_ns) < 0 or self.latency_ns < 0 or self.io_ns < 0:
            raise ValueError("computation, latency and I/O cannot be negative")

    def __reduce__(self) -> tuple[type[Program], tuple[tuple[int, ...], int, Pattern, int, int]]:
        """Pickled by its fields (a sweep hands programs to worker processes): the default way sets them
        one by one, which a frozen class compiled by mypyc refuses."""
        return Program, (self.compute_ns, self.iterations, self.pattern, self.latency_ns, self.io_ns)

    @classmethod
    def balanced(
        cls,
        ranks: int,
        compute_ns: int,
        iterations: int,
        pattern: Pattern = Pattern.RING,
        latency_ns: int = 0,
        *,
        io_ns: int = 0,
    ) -> Program:
        return cls((compute_ns,) * ranks, iterations, pattern, latency_ns, io_ns)

    @property
    def ranks(self) -> int:
        return len(self.compute_ns)

    @property
    def communicates(self) -> bool:
        return self.pattern is not Pattern.NONE

    def partners(self, rank: int) -> tuple[int, ...]:
        """The ranks whose arrival, plus the latency, ``rank`` waits for in every step, in rank order: its
        neighbours on a ring (whose messages may be in before it calls); every rank, itself included, in an
        all-reduce (the result needs the last contribution to travel, whoever made it)."""
        n = self.ranks
        if self.pattern is Pattern.NONE:
            return ()
        if self.pattern is Pattern.ALLREDUCE:
            return tuple(range(n))
        if n == 1:
            return ()
        return tuple(sorted({(rank - 1) % n, (rank + 1) % n}))

    @property
    def partner_table(self) -> tuple[tuple[int, ...], ...]:
        """:meth:`partners` of every rank. The node model reads it at every arrival and every walk of the
        shortcut, and an all-reduce's table is O(ranks^2): it is made once per pattern and size, for all
        programs (a cached_property would be computed at every read once mypyc compiles the class)."""
        key = (self.pattern, self.ranks)
        table = _PARTNER_TABLES.get(key)
        if table is None:
            table = _PARTNER_TABLES[key] = tuple(self.partners(r) for r in range(self.ranks))
        return table

    def dedicated_ns(self) -> int:
        """The runtime with every rank alone on its own PE, polling, at no cost (the recurrence above with
        every rank returning the instant it may). The yardstick for slowdowns.

        The step from one iteration's leave times to the next commutes with adding a constant to all of
        them (it is linear in the (max, +) algebra): once one iteration moves every rank's leave time by the
        same amount, every later one does too, so the rest is extrapolated, exactly. Cost: O(k x n)
        for the k iterations until then (a handful for the programs here) and n ranks; O(n) without
        communication. An all-reduce's step is O(n), a ring's O(n) too."""
        n = self.ranks
        if not self.communicates:
            return self.iterations * (max(self.compute_ns) + self.io_ns)
        leave = [0] * n
        for done in range(1, self.iterations + 1):
            enter = [leave[r] + self.compute_ns[r] + self.io_ns for r in range(n)]
            if self.pattern is Pattern.ALLREDUCE:
                # Every rank waits for the last to arrive, itself included: max(enter) + latency >= enter[r].
                step = max(enter) + self.latency_ns
                new = [step] * n
            else:
                new = [
                    max([enter[r]] + [enter[p] + self.latency_ns for p in self.partners(r)]) for r in range(n)
                ]
            moves = {b - a for a, b in zip(leave, new, strict=True)}
            leave = new
            if len(moves) == 1:
                return max(leave) + (self.iterations - done) * moves.pop()
        return max(leave)
