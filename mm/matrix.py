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
from dataclasses import dataclass, field

from storm.mm.free_pes import FreePes

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


# At most this many known nodes left out of ``usable``: placements walk the free-count buckets and skip
# them. With more, walking only the usable nodes is cheaper (and gives the same placements).
MAX_SKIPPED = 64


@dataclass
class _Usable:
    """The known nodes that one ``usable`` argument leaves out, and the free PEs they hold per row.

    Subtracting the few unusable nodes from counts kept over all nodes answers "how many usable PEs are
    free" in O(1). ``key`` is the frozenset it was made for: the matrix keeps the last one (immutable, so
    it cannot change behind the cache) and updates its ``free`` as jobs come and go.
    """

    key: frozenset[str] | None
    excluded: frozenset[int]
    allowed: list[int]  # usable node indices in natural order, for the walk of the plain path
    free: list[int] = field(default_factory=list)  # per row: free PEs on excluded nodes
    total: int = 0  # PEs of usable nodes
    plain: bool = False  # too many excluded nodes to skip: walk ``allowed`` instead


class Matrix:
    """Rows are time slots (``mpl`` of them), columns the PEs of every known node.

    A row index below ``mpl`` that holds no job is simply an empty row; rows need not be created.

    Free PEs are counted incrementally (:class:`~storm.mm.free_pes.FreePes`): :meth:`assign`,
    :meth:`release` and :meth:`move` cost O(p log n) for a job of p PEs on a machine of n nodes; a search
    that cannot succeed costs O(1); one that does costs the buckets and nodes it visits, not a scan of all
    nodes.
    """

    def __init__(self, mpl: int = 1) -> None:
        if mpl < 1:
            raise ValueError(f"mpl must be >= 1, not {mpl}")
        self._mpl = mpl
        self._nodes: dict[str, int] = {}
        self._order: list[str] = []  # node names in natural order, kept so searches need not sort
        self._sort_keys: dict[str, tuple[tuple[str | int, ...], str]] = {}  # node_sort_key, made once
        # Per row, per node: PE index -> job id. Grouping by node lets a search count a node's free PEs
        # without visiting every column.
        self._rows: list[dict[str, dict[int, int]]] = [{} for _ in range(mpl)]
        self._jobs: dict[int, Placement] = {}
        self._index: dict[str, int] = {}  # node -> position in _order
        self._free = FreePes(mpl, [])
        self._all = _Usable(None, frozenset(), [], [0] * mpl)
        self._view: _Usable | None = None  # the last frozenset ``usable`` seen, with its counts
        self._recount()

    @property
    def mpl(self) -> int:
        return self._mpl

    # ---------------------------------------------------------------------------------------------------
    # Nodes

    def add_node(self, node: str, pes: int) -> None:
        """Add a node's columns, or re-add a node that came back.

        Re-adding with the same PE count changes nothing (O(1)). A different count (the node was
        reconfigured) is accepted only while no job occupies the node, since a running job may hold a PE
        that would vanish. A new node costs O(n + PEs) for n nodes (the free counts are rebuilt, as node
        indices shift): add many at once with :meth:`add_nodes`.
        """
        self.add_nodes({node: pes})

    def add_nodes(self, nodes: dict[str, int]) -> None:
        """:meth:`add_node` for each, all checked first (nothing changes if one is refused), the free counts
        rebuilt once: O(n log n + PEs) for all (a restarted MM's thousand nodes, not a thousand times n)."""
        changed = {}
        for node, pes in nodes.items():
            if not node:
                raise ValueError("a node needs a name")
            if pes < 1:
                raise ValueError(f"node {node} must have at least one PE, not {pes}")
            current = self._nodes.get(node)
            if current == pes:
                continue
            if current is not None and any(node in row for row in self._rows):
                raise ValueError(f"node {node} runs jobs: cannot change its PE count from {current} to {pes}")
            changed[node] = pes
        if not changed:
            return
        for node in changed:
            if node not in self._nodes:
                self._sort_keys[node] = node_sort_key(node)
        self._nodes.update(changed)
        self._order = sorted(self._nodes, key=self._sort_keys.__getitem__)
        self._recount()

    def nodes(self) -> dict[str, int]:
        """Node -> PE count, in natural node order."""
        return {node: self._nodes[node] for node in self._order}

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    def total_pes(self, usable: Collection[str] | None = None) -> int:
        """The number of columns, counting only the nodes in ``usable`` when it is given."""
        return self._usable(usable).total

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
        Pass the same frozenset to many calls: its unusable nodes are then worked out once, not per call.

        Packing within a row:

        * A job that fits on one node goes to the node with the fewest free PEs that still suffice (best
          fit; ties in natural node order), on its lowest free PEs. Best fit keeps whole nodes free for
          later wide jobs, and a single node keeps all the job's communication in shared memory.
        * A wider job takes nodes with the most free PEs first (ties in natural order) until it has
          enough, so it spans as few nodes as possible; the last node gives only what is still needed, on
          its lowest free PEs.

        The chosen PEs are then ordered by (natural node order, PE index): ranks are block-distributed.

        Cost per row tried: O(1) when the row's usable PEs are too few; otherwise the free-count buckets
        visited (at most the largest node's PE count), plus the unusable nodes skipped in them (at most
        MAX_SKIPPED; with more unusable nodes, a walk of the usable ones), plus O(p) for the p PEs chosen.
        A ``usable`` that is not the frozenset of the previous call first costs one pass over the nodes.
        """
        if ranks < 1:
            raise ValueError(f"a job needs at least one rank, not {ranks}")
        rows: Iterable[int] = range(self._mpl) if row is None else (self._check_row(row),)
        view = self._usable(usable)
        for r in rows:
            pes = self._pick(r, ranks, view)
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
        self._account(placement, -1)

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
        self._account(placement, 1)
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
        if self._mpl == 1:
            return moved  # no row below the only one: spares every job's end a sort of all placed jobs
        for job_id, placement in sorted(self._jobs.items(), key=lambda item: (item[1].row, item[0])):
            current = self._jobs[job_id].row
            for row in range(current):
                if self.all_free(row, placement.pes):
                    self.move(job_id, row)
                    moved[job_id] = row
                    break
        return moved

    def all_free(self, row: int, pes: Iterable[PE]) -> bool:
        """Whether every one of ``pes`` exists and is free in ``row``. O(len(pes))."""
        cells = self._rows[self._check_row(row)]
        nodes = self._nodes
        return all(index < nodes.get(node, 0) and index not in cells.get(node, {}) for node, index in pes)

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
        """Free PEs in ``row``, counting only the nodes in ``usable`` when it is given. O(1) for None or the
        frozenset of the previous call."""
        view = self._usable(usable)
        return self._free.total[self._check_row(row)] - view.free[row]

    def recount(self) -> list[dict[str, int]]:
        """Per row, node -> free PEs, counted from the cells: what the incremental counts must equal."""
        return [
            {node: pes - len(cells.get(node, ())) for node, pes in self.nodes().items()}
            for cells in self._rows
        ]

    def counted(self) -> list[dict[str, int]]:
        """Per row, node -> free PEs as kept incrementally (checked against :meth:`recount` by tests)."""
        return [dict(zip(self._order, free, strict=True)) for free in self._free.free]

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

    def _recount(self) -> None:
        """Rebuild the free counts after the node set changed (node indices shift): O(n log n + PEs)."""
        self._index = {node: i for i, node in enumerate(self._order)}
        self._free = FreePes(self._mpl, [self._nodes[node] for node in self._order])
        for row, cells in enumerate(self._rows):
            for node, used in cells.items():
                self._free.change(row, self._index[node], -len(used))
        self._all = _Usable(
            None, frozenset(), list(range(len(self._order))), [0] * self._mpl, sum(self._free.sizes)
        )
        self._view = None

    def _account(self, placement: Placement, sign: int) -> None:
        """Count a placement's PEs as taken (sign -1) or freed (+1)."""
        per_node: dict[str, int] = {}
        for node, _ in placement.pes:
            per_node[node] = per_node.get(node, 0) + 1
        view = self._view
        for node, count in per_node.items():
            index = self._index[node]
            self._free.change(placement.row, index, sign * count)
            if view is not None and index in view.excluded:
                view.free[placement.row] += sign * count

    def _usable(self, usable: Collection[str] | None) -> _Usable:
        """The nodes ``usable`` leaves out (unknown names in it are ignored); O(1) for None or the frozenset
        of the previous call, else O(n)."""
        if usable is None:
            return self._all
        view = self._view
        if view is not None and usable is view.key:
            return view
        allowed_names = usable if isinstance(usable, set | frozenset) else set(usable)
        allowed = [i for i, node in enumerate(self._order) if node in allowed_names]
        excluded = frozenset(range(len(self._order))) - frozenset(allowed)
        free = [sum(self._free.free[row][i] for i in excluded) for row in range(self._mpl)]
        total = sum(self._free.sizes[i] for i in allowed)
        made = _Usable(None, excluded, allowed, free, total, plain=len(excluded) > MAX_SKIPPED)
        if isinstance(usable, frozenset):
            made.key = usable
            self._view = made
        return made

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

    def _pick(self, row: int, ranks: int, view: _Usable) -> tuple[PE, ...] | None:
        """The packing policy of :meth:`find` for one row, from the free counts."""
        if self._free.total[row] - view.free[row] < ranks:
            return None  # every usable node together has too few: no need to look at any of them
        take: dict[int, int]
        if view.plain:
            take = self._pick_by_walking(row, ranks, view.allowed)
        else:
            node = self._free.best_fit(row, ranks, view.excluded)
            take = (
                {node: ranks} if node is not None else self._free.most_free_first(row, ranks, view.excluded)
            )
        pes: list[PE] = []
        for index in sorted(take):
            node_name = self._order[index]
            pes.extend((node_name, pe) for pe in self._free_indices(row, node_name, take[index]))
        return tuple(pes)

    def _pick_by_walking(self, row: int, ranks: int, allowed: list[int]) -> dict[int, int]:
        """The same choice as the buckets give, by walking every usable node: O(u log u) for u of them."""
        free = self._free.free[row]
        fitting = [index for index in allowed if free[index] >= ranks]
        if fitting:
            # min() keeps the first of equal values, and allowed is in natural order: ties go to the lower.
            return {min(fitting, key=lambda index: free[index]): ranks}
        take: dict[int, int] = {}
        need = ranks
        # sorted() is stable, so nodes with equally many free PEs stay in natural order.
        for index in sorted(allowed, key=lambda index: -free[index]):
            if need == 0:
                break
            share = min(free[index], need)
            take[index] = share
            need -= share
        return take
