"""Which node sits where on the torus, and which nodes each placed job holds: the torus's side of storm-mm's
scheduling state (mm/schedule_state.py keeps one beside the matrix when ``[mm] topology`` is a torus).

A :class:`TorusLayout` comes from the configuration (``[mm] coordinates``: node name -> x, y, z) or is
numbered (``n0`` at (0, 0, 0), ``n1`` at (1, 0, 0), ... x fastest, as the simulator and ``storm local up``
name their nodes). A position without a node, or whose node has not registered, is down or is still
stopping an ended job's ranks, can be in no job's box: the pass sees it as taken (:meth:`TorusState.view`).

A job holds whole nodes: its box's, also those its ranks do not fill (a box is a partition, its network
links are the job's). A job placed before the MM had a torus (a store from a flat configuration) holds the
nodes its ranks are on, with no box; it is never moved.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from storm.mm.matrix import Matrix
from storm.mm.torus import Box, Coord, Torus

_TORI: dict[Coord, Torus] = {}


def torus_of(dims: Coord) -> Torus:
    """One Torus (its table of boxes) per shape in a process: a simulator's many runs build it once."""
    torus = _TORI.get(dims)
    if torus is None:
        torus = _TORI[dims] = Torus(dims)
    return torus


@dataclass(frozen=True)
class TorusLayout:
    """The torus and the node at each of its positions (None: no node there)."""

    torus: Torus
    names: tuple[str | None, ...]  # by node index x + X (y + Y z)
    index: dict[str, int]  # node name -> its index

    @classmethod
    def from_coordinates(cls, dims: Coord, coordinates: Mapping[str, Sequence[int]]) -> TorusLayout:
        """ValueError naming the node for a place outside the torus, two nodes at one place, or none."""
        torus = torus_of(dims)
        if not coordinates:
            raise ValueError("a torus needs each node's place (x, y, z): none is given")
        names: list[str | None] = [None] * torus.nodes
        index: dict[str, int] = {}
        for name, place in coordinates.items():
            if len(place) != 3 or any(not 0 <= v < d for v, d in zip(place, dims, strict=False)):
                raise ValueError(
                    f"node {name} at {list(place)}: a place is [x, y, z] with 0 <= x < {dims[0]}, "
                    f"0 <= y < {dims[1]}, 0 <= z < {dims[2]}"
                )
            at = torus.index((place[0], place[1], place[2]))
            other = names[at]
            if other is not None:
                raise ValueError(f"nodes {other} and {name} are both at {list(place)}")
            names[at] = name
            index[name] = at
        return cls(torus, tuple(names), index)

    @classmethod
    def numbered(cls, dims: Coord, prefix: str = "n") -> TorusLayout:
        """Node ``{prefix}{i}`` at the position of index i (x fastest)."""
        torus = torus_of(dims)
        names = tuple(f"{prefix}{i}" for i in range(torus.nodes))
        return cls(torus, names, {name: i for i, name in enumerate(names)})

    def coordinates(self) -> dict[str, Coord]:
        """Node name -> (x, y, z)."""
        return {name: self.torus.coord(i) for name, i in self.index.items()}


class TorusState:
    """The nodes each placed job holds (a bitmask per job), and their union, kept as jobs come and go.

    Also the migration counters of the simulator's schedulers (mm/torus_scheduler.py counts them here,
    so they outlive a pass): ``migrations`` attempted, ``migrated`` (those that made the largest free
    partition grow), ``jobs_moved``.
    """

    def __init__(self, layout: TorusLayout) -> None:
        self.layout = layout
        self.torus = layout.torus
        self.masks: dict[int, int] = {}
        self.boxes: dict[int, Box] = {}
        self.taken = 0
        self.migrations = 0
        self.migrated = 0
        self.jobs_moved = 0
        self._view_key: tuple[frozenset[str] | None, tuple[int, int]] | None = None
        self._view: tuple[int, int] = (self.torus.all, 0)
        self._pes: tuple[tuple[int, int], int] = ((-1, -1), 0)

    def assign(self, job_id: int, box: Box) -> int:
        """The job holds ``box``'s nodes (ValueError, nothing changed, if one is held already); its mask."""
        mask = self.torus.mask(box)
        self._take(job_id, mask)
        self.boxes[job_id] = box
        return mask

    def assign_nodes(self, job_id: int, nodes: Collection[str]) -> None:
        """The job holds these nodes without a box: it was placed before the torus was configured (a restarted
        MM), when jobs may have shared a node, so this never refuses. Nodes not on the torus are ignored."""
        if job_id in self.masks:
            raise ValueError(f"job {job_id} holds nodes of the torus already")
        index = self.layout.index
        mask = self.torus.mask_of(index[name] for name in nodes if name in index)
        self.masks[job_id] = mask
        self.taken |= mask

    def release(self, job_id: int) -> Box | None:
        """The job's nodes are free again; its box (None if it held none, or nothing). O(jobs held): the
        union is taken again, since jobs placed without a box may share nodes."""
        if self.masks.pop(job_id, None) is None:
            return None
        taken = 0
        for mask in self.masks.values():
            taken |= mask
        self.taken = taken
        return self.boxes.pop(job_id, None)

    def names_of(self, box: Box) -> list[str]:
        """The nodes of ``box`` in its rank order (x fastest from the base); ValueError at a position with
        no node."""
        names, torus = self.layout.names, self.torus
        found = []
        for coord in box.coords(torus.dims):
            name = names[torus.index(coord)]
            if name is None:
                raise ValueError(f"box {box} covers {coord}, where no node is")
            found.append(name)
        return found

    def view(self, matrix: Matrix, usable: frozenset[str] | None) -> tuple[int, int]:
        """(the positions no job may use now, the PEs per node a job's ranks fill) for a pass.

        Blocked: no node there, or its node is not in ``matrix`` (not registered) or, when given, not in
        ``usable``. PEs per node: :meth:`pes_per_node`. O(N) when the matrix's nodes or PEs or ``usable``
        changed since the last call, else O(1): the MM hands the same frozenset while the usable set stays.
        """
        nodes_now = (matrix.node_count, matrix.total_pes())
        key = self._view_key
        if key is None or key[0] is not usable or key[1] != nodes_now:
            nodes = matrix.nodes()
            blocked = 0
            for at, name in enumerate(self.layout.names):
                if name is None or name not in nodes or (usable is not None and name not in usable):
                    blocked |= 1 << at
            self._view_key, self._view = (usable, nodes_now), (blocked, self.pes_per_node(matrix))
        return self._view

    def pes_per_node(self, matrix: Matrix) -> int:
        """The ranks a job puts on each node of its box: the fewest PEs any registered torus node has, so
        every box has room for its share (0 while none has registered). O(N) when the matrix's nodes or PEs
        changed since the last call, else O(1)."""
        nodes_now = (matrix.node_count, matrix.total_pes())
        if self._pes[0] != nodes_now:
            nodes = matrix.nodes()
            counts = [nodes[name] for name in self.layout.index if name in nodes]
            self._pes = (nodes_now, min(counts, default=0))
        return self._pes[1]

    def _take(self, job_id: int, mask: int) -> None:
        if job_id in self.masks:
            raise ValueError(f"job {job_id} holds nodes of the torus already")
        clash = mask & self.taken
        if clash:
            holder = next(j for j, m in self.masks.items() if m & clash)
            at = self.torus.coord((clash & -clash).bit_length() - 1)
            raise ValueError(f"job {job_id}: node at {at} of the torus is held by job {holder}")
        self.masks[job_id] = mask
        self.taken |= mask
