"""Plain, slow versions of the matrix and the scheduler, to check the fast ones against (not used by storm).

``ReferenceMatrix`` and the EASY part of ``reference_schedule`` are the code of commit ad1375b, before free
PEs were counted incrementally: every search scans every node, every job behind the head searches every
row. Strict FCFS and conservative backfilling are written the obvious way: conservative keeps the
reservations as a list of intervals and sums them up at every instant it looks at.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from storm.mm.matrix import PE, Placement, node_sort_key
from storm.mm.scheduler import (
    PRIORITY,
    RESOURCES,
    Plan,
    QueuedJob,
    Reservation,
    RunningJob,
    Start,
    runtime_estimate,
)


class ReferenceMatrix:
    """storm.mm.matrix.Matrix as it was before it kept free counts (commit ad1375b): every search scans every
    node. Rows are time slots (``mpl`` of them), columns the PEs of every known node.

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


def reference_schedule(
    now: float,
    queue: Sequence[QueuedJob],
    running: Mapping[int, RunningJob],
    matrix: ReferenceMatrix,
    usable: Collection[str] | None = None,
    backfill: str = "easy",
) -> Plan:
    usable_set = None if usable is None else frozenset(usable)
    mpl = matrix.mpl
    total = matrix.total_pes(usable_set)
    ends = {job_id: _estimated_end(now, running.get(job_id), mpl) for job_id in matrix.jobs()}
    starts: list[Start] = []
    reasons: dict[int, str] = {}
    reservation: Reservation | None = None
    conservative: Conservative | None = None

    for job in queue:
        if job.ranks > total:
            reasons[job.job_id] = f"PartitionConfig: needs {job.ranks} PEs, the cluster has {total}"
            continue
        if reservation is None and conservative is None:
            placement = matrix.find(job.ranks, usable_set)
            if placement is None:
                reasons[job.job_id] = RESOURCES
                if backfill == "conservative":
                    conservative = Conservative(now, matrix, ends, usable_set)
                    conservative.reserve(job)
                else:
                    reservation = _reserve(job, matrix, ends, usable_set)
                continue
        elif conservative is not None:
            placement = conservative.start_now(job)
            if placement is None:
                conservative.reserve(job)
                reasons[job.job_id] = PRIORITY
                continue
        elif backfill == "none":
            reasons[job.job_id] = PRIORITY
            continue
        else:
            assert reservation is not None
            placement, extra = _backfill(now, job, matrix, reservation, usable_set)
            if placement is None:
                reasons[job.job_id] = PRIORITY
                continue
            reservation = Reservation(reservation.job_id, reservation.row, reservation.start, extra)
        matrix.assign(job.job_id, placement)
        ends[job.job_id] = now + runtime_estimate(job.time_limit, mpl)
        starts.append(
            Start(job.job_id, placement, backfilled=reservation is not None or conservative is not None)
        )
    if conservative is not None:
        reservations = conservative.reservations()
        return Plan(tuple(starts), next(iter(reservations.values())), reasons, reservations)
    return Plan(
        tuple(starts), reservation, reasons, {} if reservation is None else {reservation.job_id: reservation}
    )


def _estimated_end(now: float, job: RunningJob | None, mpl: int) -> float:
    if job is None:
        return math.inf
    return max(now, job.start_time + runtime_estimate(job.time_limit, mpl))


def _reserve(
    job: QueuedJob, matrix: ReferenceMatrix, ends: Mapping[int, float], usable: Collection[str] | None
) -> Reservation:
    per_row: list[list[tuple[float, int, int]]] = [[] for _ in range(matrix.mpl)]
    for job_id, placement in matrix.jobs().items():
        pes = sum(1 for node, _ in placement.pes if usable is None or node in usable)
        if pes:
            per_row[placement.row].append((ends[job_id], job_id, pes))

    best: Reservation | None = None
    for row, events in enumerate(per_row):
        events.sort()
        free = matrix.free_pes(row, usable)
        shadow = math.inf
        i = 0
        while i < len(events):
            end = events[i][0]
            while i < len(events) and events[i][0] == end:
                free += events[i][2]
                i += 1
            if free >= job.ranks:
                shadow = end
                break
        candidate = Reservation(job.job_id, row, shadow, max(0, free - job.ranks))
        if best is None or candidate.start < best.start:
            best = candidate
    assert best is not None
    return best


def _backfill(
    now: float,
    job: QueuedJob,
    matrix: ReferenceMatrix,
    reservation: Reservation,
    usable: Collection[str] | None,
) -> tuple[Placement | None, int]:
    for row in range(matrix.mpl):
        if row != reservation.row:
            placement = matrix.find(job.ranks, usable, row=row)
            if placement is not None:
                return placement, reservation.extra
    placement = matrix.find(job.ranks, usable, row=reservation.row)
    if placement is None:
        return None, reservation.extra
    runtime = runtime_estimate(job.time_limit, matrix.mpl)
    if math.isfinite(runtime) and now + runtime <= reservation.start:
        return placement, reservation.extra
    if job.ranks <= reservation.extra:
        return placement, reservation.extra - job.ranks
    return None, reservation.extra


class Conservative:
    """Conservative backfilling by brute force: free PEs at an instant are recounted from scratch."""

    def __init__(
        self, now: float, matrix: ReferenceMatrix, ends: Mapping[int, float], usable: frozenset[str] | None
    ) -> None:
        self.now = now
        self.matrix = matrix
        self.ends = ends
        self.usable = usable
        self.free_now = [matrix.free_pes(row, usable) for row in range(matrix.mpl)]
        # Per row: (start, end, ranks) of every job in the matrix at the first reservation (they hold their
        # PEs from now to their estimated end), every later start and every reservation.
        self.taken: list[list[tuple[float, float, int]]] = [[] for _ in range(matrix.mpl)]
        for job_id, placement in matrix.jobs().items():
            pes = sum(1 for node, _ in placement.pes if usable is None or node in usable)
            self.taken[placement.row].append((now, ends[job_id], pes))
        self.made: list[tuple[int, int, float]] = []  # job id, row, start
        self.capacity = [
            self.free_now[row] + sum(p for _, _, p in self.taken[row]) for row in range(matrix.mpl)
        ]

    def free(self, row: int, t: float) -> int:
        return self.capacity[row] - sum(
            p for s, e, p in self.taken[row] if s <= t < e or (s <= t and e == math.inf)
        )

    def instants(self, row: int) -> list[float]:
        points = {self.now} | {e for _, e, _ in self.taken[row] if math.isfinite(e) and e > self.now}
        return sorted(points)

    def holds(self, row: int, start: float, duration: float, ranks: int) -> bool:
        end = start + duration
        return all(self.free(row, t) >= ranks for t in [start, *self.instants(row)] if start <= t < end)

    def start_now(self, job: QueuedJob) -> Placement | None:
        duration = runtime_estimate(job.time_limit, self.matrix.mpl)
        for row in range(self.matrix.mpl):
            placement = self.matrix.find(job.ranks, self.usable, row=row)
            if placement is not None and self.holds(row, self.now, duration, job.ranks):
                self.taken[row].append((self.now, self.now + duration, job.ranks))
                return placement
        return None

    def reserve(self, job: QueuedJob) -> None:
        duration = runtime_estimate(job.time_limit, self.matrix.mpl)
        best: tuple[float, int] = (math.inf, 0)
        for row in range(self.matrix.mpl):
            for t in self.instants(row):
                if self.holds(row, t, duration, job.ranks):
                    best = min(best, (t, row))
                    break
        start, row = best
        if math.isfinite(start):
            self.taken[row].append((start, start + duration, job.ranks))
        self.made.append((job.job_id, row, start))

    def reservations(self) -> dict[int, Reservation]:
        return {
            job_id: Reservation(job_id, row, start, self.free(row, start) if math.isfinite(start) else 0)
            for job_id, row, start in self.made
        }
