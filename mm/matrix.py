"""The Ousterhout matrix: which job runs on which processing element (PE) in which time slot.

Gang scheduling (Ousterhout, 1982) lays the cluster out as a matrix. Each column is one PE (a core of one
node), each row a time slot; a job takes one row and as many columns of it as it has ranks. The rows take
turns on the machine, so at most ``mpl`` (the multiprogramming level) jobs share a PE. With ``mpl == 1`` the
matrix is plain space sharing.

The matrix only decides and records placements. It knows nothing of time, queues or processes, so the
machine manager and the simulator drive the same code.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

PE = tuple[str, int]
"""A processing element: (node name, PE index on that node, 0-based)."""

_DIGITS = re.compile(r"(\d+)")


def node_sort_key(name: str) -> tuple[tuple[str | int, ...], str]:
    """Natural order for node names, so that ``node2`` sorts before ``node10``.

    ``re.split`` with a capturing group alternates text and digit runs, always starting with text, so
    position i of every key holds the same type and keys compare without mixing ``str`` and ``int``. The
    name itself breaks ties such as ``n01`` against ``n1``, which keeps the order total.
    """
    parts = _DIGITS.split(name)
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts)), name


@dataclass(frozen=True)
class Placement:
    """Where one job runs: its row and, for each rank i, the PE ``pes[i]``.

    Placements made by :meth:`Matrix.find` are block-distributed: the PEs of one node are consecutive,
    nodes come in natural order and PE indices ascend, so neighbouring ranks share a node.
    """

    row: int
    pes: tuple[PE, ...]

    def __post_init__(self) -> None:
        if self.row < 0:
            raise ValueError(f"row must be >= 0, not {self.row}")
        if not self.pes:
            raise ValueError("a placement needs at least one PE")
        if len(set(self.pes)) != len(self.pes):
            raise ValueError("a placement uses each PE at most once")
        if any(index < 0 for _, index in self.pes):
            raise ValueError("PE indices must be >= 0")

    @property
    def nodes(self) -> tuple[str, ...]:
        """The distinct nodes, in rank order."""
        return tuple(dict.fromkeys(node for node, _ in self.pes))

    @property
    def ranks(self) -> int:
        return len(self.pes)


class Matrix:
    """Rows are time slots (``mpl`` of them), columns the PEs of every known node.

    A row index below ``mpl`` that holds no job is simply an empty row; rows need not be created.
    """

    def __init__(self, mpl: int = 1) -> None:
        if mpl < 1:
            raise ValueError(f"mpl must be >= 1, not {mpl}")
        self._mpl = mpl
        self._nodes: dict[str, int] = {}
        self._order: list[str] = []  # node names in natural order, kept so searches need not sort
        # Per row, per node: PE index -> job id. Grouping by node lets a search count a node's free PEs
        # without visiting every column.
        self._rows: list[dict[str, dict[int, int]]] = [{} for _ in range(mpl)]
        self._jobs: dict[int, Placement] = {}

    @property
    def mpl(self) -> int:
        return self._mpl

    # ---------------------------------------------------------------------------------------------------
    # Nodes

    def add_node(self, node: str, pes: int) -> None:
        """Add a node's columns, or re-add a node that came back.

        Re-adding with the same PE count changes nothing. A different count (the node was reconfigured) is
        accepted only while no job occupies the node, since a running job may hold a PE that would vanish.
        """
        if not node:
            raise ValueError("a node needs a name")
        if pes < 1:
            raise ValueError(f"node {node} must have at least one PE, not {pes}")
        current = self._nodes.get(node)
        if current == pes:
            return
        if current is not None and any(node in row for row in self._rows):
            raise ValueError(f"node {node} runs jobs: cannot change its PE count from {current} to {pes}")
        self._nodes[node] = pes
        self._order = sorted(self._nodes, key=node_sort_key)

    def nodes(self) -> dict[str, int]:
        """Node -> PE count, in natural node order."""
        return {node: self._nodes[node] for node in self._order}

    def total_pes(self, usable: Collection[str] | None = None) -> int:
        """The number of columns, counting only the nodes in ``usable`` when it is given."""
        return sum(self._nodes[node] for node in self._usable(usable))

    def columns(self) -> list[PE]:
        """Every PE, in natural node order then PE index."""
        return [(node, index) for node in self._order for index in range(self._nodes[node])]

    # ---------------------------------------------------------------------------------------------------
    # Placing jobs

    def find(
        self, ranks: int, usable: Collection[str] | None = None, row: int | None = None
    ) -> Placement | None:
        """Choose where a job of ``ranks`` ranks would go, without committing it; None if it fits nowhere.

        Only PEs of nodes in ``usable`` (None: all nodes) are considered. Rows are tried in index order, or
        only ``row`` when given, and the first row with enough free PEs wins, so lower rows fill first.

        Packing within a row:

        * A job that fits on one node goes to the node with the fewest free PEs that still suffice (best
          fit; ties in natural node order), on its lowest free PEs. Best fit keeps whole nodes free for
          later wide jobs, and a single node keeps all the job's communication in shared memory.
        * A wider job takes nodes with the most free PEs first (ties in natural order) until it has
          enough, so it spans as few nodes as possible; the last node gives only what is still needed, on
          its lowest free PEs.

        The chosen PEs are then ordered by (natural node order, PE index): ranks are block-distributed.
        """
        if ranks < 1:
            raise ValueError(f"a job needs at least one rank, not {ranks}")
        rows: Iterable[int] = range(self._mpl) if row is None else (self._check_row(row),)
        names = self._usable(usable)
        for r in rows:
            pes = self._pick(r, ranks, names)
            if pes is not None:
                return Placement(r, pes)
        return None

    def assign(self, job_id: int, placement: Placement) -> None:
        """Commit a placement. Refused (ValueError, matrix unchanged) if the job is already placed, a PE is
        unknown, or a PE is taken in that row."""
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already placed")
        cells = self._rows[self._check_row(placement.row)]
        # Check every PE before writing any, so a refused assignment leaves no half-placed job behind.
        for node, index in placement.pes:
            count = self._nodes.get(node)
            if count is None or index >= count:
                raise ValueError(f"unknown PE {node}:{index}")
            holder = cells.get(node, {}).get(index)
            if holder is not None:
                raise ValueError(f"PE {node}:{index} in row {placement.row} is taken by job {holder}")
        for node, index in placement.pes:
            cells.setdefault(node, {})[index] = job_id
        self._jobs[job_id] = placement

    def release(self, job_id: int) -> Placement | None:
        """Free the job's cells and return its placement (None if it was not placed)."""
        placement = self._jobs.pop(job_id, None)
        if placement is None:
            return None
        cells = self._rows[placement.row]
        for node, index in placement.pes:
            used = cells[node]
            del used[index]
            if not used:
                del cells[node]
        return placement

    def placement_of(self, job_id: int) -> Placement | None:
        return self._jobs.get(job_id)

    def move(self, job_id: int, row: int) -> None:
        """Run a placed job in another row, on the same PEs (ValueError if one of them is taken there)."""
        placement = self._jobs.get(job_id)
        if placement is None:
            raise ValueError(f"job {job_id} is not placed")
        self._check_row(row)
        self.release(job_id)
        try:
            self.assign(job_id, Placement(row, placement.pes))
        except ValueError:
            self.assign(job_id, placement)
            raise

    def compact(self) -> dict[int, int]:
        """Move jobs down into lower rows where all their PEs are free; return {job id: new row}.

        Moving a job to another row keeps its PEs, so it costs nothing but a different time slot; fewer
        occupied rows means every job gets a larger share of the machine (Ousterhout's unification). Jobs
        are tried from the lowest row up, each into the lowest row that has room for it.
        """
        moved: dict[int, int] = {}
        for job_id, placement in sorted(self._jobs.items(), key=lambda item: (item[1].row, item[0])):
            current = self._jobs[job_id].row
            for row in range(current):
                cells = self._rows[row]
                if all(index not in cells.get(node, {}) for node, index in placement.pes):
                    self.move(job_id, row)
                    moved[job_id] = row
                    break
        return moved

    def occupied_rows(self) -> list[int]:
        """The rows holding at least one job, in index order: the time slots a gang cycle visits."""
        return [row for row, cells in enumerate(self._rows) if cells]

    def row_jobs(self, row: int) -> set[int]:
        """The jobs of one row."""
        return {job_id for node in self._rows[self._check_row(row)].values() for job_id in node.values()}

    def jobs(self) -> dict[int, Placement]:
        """Every placed job, in the order they were assigned."""
        return dict(self._jobs)

    def free_pes(self, row: int, usable: Collection[str] | None = None) -> int:
        """Free PEs in ``row``, counting only the nodes in ``usable`` when it is given."""
        cells = self._rows[self._check_row(row)]
        return sum(self._nodes[node] - len(cells.get(node, ())) for node in self._usable(usable))

    def cells(self) -> list[dict[PE, int]]:
        """One dict per row 0..mpl-1, PE -> job id, occupied PEs only, in column order (for display)."""
        result: list[dict[PE, int]] = []
        for cells in self._rows:
            row: dict[PE, int] = {}
            for node in self._order:
                used = cells.get(node, {})
                row.update(((node, index), used[index]) for index in sorted(used))
            result.append(row)
        return result

    # ---------------------------------------------------------------------------------------------------
    # Helpers

    def _check_row(self, row: int) -> int:
        if not 0 <= row < self._mpl:
            raise ValueError(f"row {row} is outside 0..{self._mpl - 1}")
        return row

    def _usable(self, usable: Collection[str] | None) -> list[str]:
        """Known nodes in natural order, limited to ``usable``; unknown names in ``usable`` are ignored."""
        if usable is None:
            return self._order
        allowed = usable if isinstance(usable, set | frozenset) else set(usable)
        return [node for node in self._order if node in allowed]

    def _free_indices(self, row: int, node: str, count: int) -> list[int]:
        """The ``count`` lowest free PE indices of ``node`` in ``row``."""
        used = self._rows[row].get(node, {})
        free: list[int] = []
        for index in range(self._nodes[node]):
            if len(free) == count:
                break
            if index not in used:
                free.append(index)
        return free

    def _pick(self, row: int, ranks: int, names: list[str]) -> tuple[PE, ...] | None:
        """The packing policy of :meth:`find` for one row; ``names`` must be in natural order."""
        cells = self._rows[row]
        free = {node: self._nodes[node] - len(cells.get(node, ())) for node in names}
        take: dict[str, int] = {}
        fitting = [node for node in names if free[node] >= ranks]
        if fitting:
            # min() keeps the first of equal values, and names are in natural order: ties go to the lower.
            take[min(fitting, key=lambda node: free[node])] = ranks
        else:
            if sum(free.values()) < ranks:
                return None
            need = ranks
            # sorted() is stable, so nodes with equally many free PEs stay in natural order.
            for node in sorted(names, key=lambda node: -free[node]):
                if need == 0:
                    break
                share = min(free[node], need)
                take[node] = share
                need -= share
        pes: list[PE] = []
        for node in names:
            if node in take:
                pes.extend((node, index) for index in self._free_indices(row, node, take[node]))
        return tuple(pes)
