"""Free PE counts of the Ousterhout matrix, kept up to date as jobs come and go.

Placing a job needs, per row, how many PEs each node has free, and which node is the tightest that still
fits (best fit) or which nodes have the most free PEs (wide jobs). Recounting that from the cells costs a
scan of every node for every job; :class:`FreePes` keeps the answers instead, changed by a constant amount of
work per node a job touches. Nodes are known here by their index in natural node order, so that sorting
indices sorts names.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Container


class FreePes:
    """Per row: each node's free PEs, their total, and the nodes grouped by how many PEs they have free.

    ``buckets[row][k]`` lists, in ascending (natural) order, the nodes with exactly ``k`` free PEs. Moving a
    node between two buckets costs a binary search and a shift of the two lists (C memmoves of at most one
    entry per node); every query below visits only buckets and the nodes it returns or must skip.
    """

    def __init__(self, rows: int, sizes: list[int]) -> None:
        self.sizes = sizes  # PEs per node index
        self.free: list[list[int]] = [list(sizes) for _ in range(rows)]
        self.total: list[int] = [sum(sizes)] * rows
        top = max(sizes, default=0)
        self.buckets: list[list[list[int]]] = []
        for _ in range(rows):
            buckets: list[list[int]] = [[] for _ in range(top + 1)]
            for node, size in enumerate(sizes):  # ascending node order: each bucket comes out sorted
                buckets[size].append(node)
            self.buckets.append(buckets)

    def change(self, row: int, node: int, delta: int) -> None:
        """Node ``node`` has ``delta`` more free PEs in ``row`` (negative: a job took some). O(log n)."""
        free = self.free[row]
        old = free[node]
        new = old + delta
        if not 0 <= new <= self.sizes[node]:
            raise AssertionError(f"node index {node} would have {new} free PEs of {self.sizes[node]}")
        buckets = self.buckets[row]
        bucket = buckets[old]
        del bucket[bisect_left(bucket, node)]
        insort(buckets[new], node)
        free[node] = new
        self.total[row] += delta

    def best_fit(self, row: int, ranks: int, excluded: Container[int]) -> int | None:
        """The node with the fewest free PEs that are still >= ``ranks`` (ties: lowest index), skipping
        ``excluded``; None if no node has that many.

        O(b + s): b the buckets from ``ranks`` up to the largest node's size, s the excluded nodes passed
        over in them.
        """
        buckets = self.buckets[row]
        for k in range(ranks, len(buckets)):
            for node in buckets[k]:
                if node not in excluded:
                    return node
        return None

    def most_free_first(self, row: int, ranks: int, excluded: Container[int]) -> dict[int, int]:
        """Node -> PEs to take, nodes with the most free PEs first (ties: lowest index), the last giving
        only what is still needed; skips ``excluded``. The caller has checked that enough PEs are free.

        O(b + t + s): b buckets, t nodes taken, s excluded nodes passed over.
        """
        take: dict[int, int] = {}
        need = ranks
        buckets = self.buckets[row]
        for k in range(len(buckets) - 1, 0, -1):
            for node in buckets[k]:
                if node in excluded:
                    continue
                share = min(k, need)
                take[node] = share
                need -= share
                if need == 0:
                    return take
        raise AssertionError(f"{ranks} PEs asked for, {ranks - need} free")
