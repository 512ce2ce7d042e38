"""The coscheduling simulator's driver made faster, and Program.dedicated_ns extrapolated: each shown to
give what it gave before. Small workloads only: fast."""

from __future__ import annotations

import random

from storm.tools.sim.cosched.program import Pattern, Program


def naive_dedicated(program: Program) -> int:
    """The leave-time recurrence, every iteration (what dedicated_ns extrapolates)."""
    leave = [0] * program.ranks
    for _ in range(program.iterations):
        enter = [leave[r] + program.compute_ns[r] for r in range(program.ranks)]
        if not program.communicates:
            leave = enter
            continue
        leave = [
            max([enter[r]] + [enter[p] + program.latency_ns for p in program.partners(r)])
            for r in range(program.ranks)
        ]
    return max(leave)


def test_dedicated_ns_extrapolates_exactly() -> None:
    rng = random.Random(7)
    for _ in range(600):
        ranks = rng.randint(1, 7)
        compute = tuple(rng.choice((0, rng.randint(0, 90))) for _ in range(ranks))
        program = Program(compute, rng.randint(1, 30), rng.choice(list(Pattern)), rng.randint(0, 60))
        assert program.dedicated_ns() == naive_dedicated(program), program
