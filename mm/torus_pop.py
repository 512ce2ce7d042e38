"""The largest free partition of a torus two more ways: the paper's POP and a plain brute force.

Both take the torus's dimensions and which nodes are free (``free[x + X (y + Y z)]``), and return the volume
of the largest free box and one box of that volume (None when no node is free), wrapping around every
dimension. They share nothing with mm/torus.py's bitmask table, which the scheduler uses: the three are
held equal on random tori by tests/test_torus_pop.py, and ``python -m storm.tools.bench_torus`` times them.

**POP** (Projection Of Partitions, Krevat et al., Appendix A), O(M^5) on an M x M x M torus. First, for every
node, the run of consecutive free nodes from it along +y (wrapping, at most Y): O(M^3). Then, for each of
the M^3 bases (i, j, k), planes are projected onto each other: for the planes k .. k + dz it keeps, per x
offset, the least y-run over those planes, so a box rooted at the base with x extent a and z extent
dz + 1 can reach in y the least of those minima over its first a columns. Extending a and dz with running
minima enumerates every box rooted at the base that is as long in y as it can be: O(M) per projection, O(M)
projections per base. (The paper also extends along y with x-runs; that finds the same boxes again.)

**Brute force**, the oracle: every base, every shape, every node of the box checked, keeping the largest free
box (a box no larger than the best so far is not checked, which cannot change the answer). O(M^9) at worst.
"""

from __future__ import annotations

from collections.abc import Sequence

from storm.mm.torus import Box, Coord


def _check(dims: Coord, free: Sequence[bool]) -> None:
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"a torus needs three dimensions of at least 1, not {dims}")
    if len(free) != dims[0] * dims[1] * dims[2]:
        raise ValueError(f"{len(free)} node states for a torus of {dims[0] * dims[1] * dims[2]} nodes")


def y_runs(dims: Coord, free: Sequence[bool]) -> list[int]:
    """Per node, how many consecutive nodes from it along +y are free (itself first, wrapping; at most Y)."""
    x_size, y_size, z_size = dims
    runs = [0] * len(free)
    for z in range(z_size):
        for x in range(x_size):
            ring = [x + x_size * (y + y_size * z) for y in range(y_size)]
            if all(free[i] for i in ring):
                for i in ring:
                    runs[i] = y_size
                continue
            run = 0
            # Twice around backwards: by the second lap every run has met the occupied node that ends it.
            for step in range(2 * y_size - 1, -1, -1):
                i = ring[step % y_size]
                run = run + 1 if free[i] else 0
                if step < y_size:
                    runs[i] = run
    return runs


def largest_free_pop(dims: Coord, free: Sequence[bool]) -> tuple[int, Box | None]:
    """POP: the volume of the largest free box and one such box (the module's docstring). O(X^2 Y Z^2)."""
    _check(dims, free)
    x_size, y_size, z_size = dims
    runs = y_runs(dims, free)
    best, found = 0, None
    for k in range(z_size):
        for j in range(y_size):
            for i in range(x_size):
                least = [y_size] * x_size  # per x offset: the least y-run over the planes projected so far
                for dz in range(z_size):
                    plane = x_size * (j + y_size * ((k + dz) % z_size))
                    for dx in range(x_size):
                        run = runs[(i + dx) % x_size + plane]
                        least[dx] = min(least[dx], run)
                    if least[0] == 0:
                        break  # the base's own column is taken in this plane: no deeper box
                    reach = y_size
                    for dx in range(x_size):
                        reach = min(reach, least[dx])
                        if reach == 0:
                            break
                        volume = (dx + 1) * reach * (dz + 1)
                        if volume > best:
                            best, found = volume, Box((i, j, k), (dx + 1, reach, dz + 1))
    return best, found


def largest_free_brute(dims: Coord, free: Sequence[bool]) -> tuple[int, Box | None]:
    """Every base and shape, node by node: the volume of the largest free box and one such box."""
    _check(dims, free)
    x_size, y_size, z_size = dims
    best, found = 0, None
    shapes = [
        (a, b, c) for a in range(1, x_size + 1) for b in range(1, y_size + 1) for c in range(1, z_size + 1)
    ]
    for z0 in range(z_size):
        for y0 in range(y_size):
            for x0 in range(x_size):
                for a, b, c in shapes:
                    if a * b * c <= best:
                        continue
                    if all(
                        free[(x0 + i) % x_size + x_size * ((y0 + j) % y_size + y_size * ((z0 + k) % z_size))]
                        for k in range(c)
                        for j in range(b)
                        for i in range(a)
                    ):
                        best, found = a * b * c, Box((x0, y0, z0), (a, b, c))
    return best, found
