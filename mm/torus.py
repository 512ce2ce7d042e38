"""A 3-D torus of nodes and its rectangular partitions: where a job may go when its nodes must form a box.

On a torus network (BlueGene/L, Cray XT, Tofu) a job's nodes must be a contiguous rectangular partition: a box
of a x b x c nodes at a base position, which may wrap around each dimension. Krevat, Castanos and Moreira
("Job Scheduling for the BlueGene/L System", section 2) place each job with one rule, kept here:

- **Sizes.** A job of p nodes needs a box of exactly p nodes, and some sizes have none (on 4 x 4 x 8, 11 has
  no a x b x c with a, b <= 4, c <= 8): such a size is raised to the next one that has
  (:meth:`Torus.round_size`; on 4 x 4 x 8 there are 38: 11 becomes 12, 17 becomes 18, 65 becomes 72).
- **Placement.** Try every shape of p nodes at every base where all its nodes are free, and keep the one that
  leaves the largest free partition (:meth:`Torus.place`). Ties go to the first in a fixed order: shapes
  (a, b, c) in lexicographic order, then bases by node index (x fastest, then y, then z).
- **Growth.** A job that has no free box of its size, when a larger free box exists, grows to the least size
  that has one (:meth:`Torus.grow`; the paper's 4 x 4 example: free 2 x 2, a request of 3 runs on 4).

How it is fast enough for a scheduler: a box is a bitmask over the nodes (a Python int, bit
``x + X (y + Y z)``), and every distinct box of the torus is built once, grouped by volume, largest first.
"Is this box free" is one AND with the mask of taken nodes; the largest free partition is the volume of the
first free box in that order; a size larger than it is refused at once. A box that spans a whole dimension
is built at base 0 there only (every base gives the same nodes), so the table holds prod(D (D - 1) + 1)
boxes: 9,633 on 4 x 4 x 8, 185,193 on 8 x 8 x 8. :data:`MAX_BOXES` bounds it (tori beyond it are refused
with a clear error: schedule supernodes, as BG/L did).

The paper's own algorithm for the largest free partition (POP, its Appendix A) and a plain brute force are
in mm/torus_pop.py; tests hold all three equal. Nothing here knows of jobs, time or queues
(mm/torus_scheduler.py).
"""

from __future__ import annotations

import math
import operator
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import compress

Coord = tuple[int, int, int]

MAX_BOXES = 250_000  # distinct boxes in a torus's table: 8 x 8 x 8 (185,193) fits, 8 x 8 x 16 does not
MEMO = 1 << 16  # states whose largest free partition a Torus remembers
_DIMS = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*")


def parse_dims(text: str) -> Coord:
    """``"4x4x8"`` as (4, 4, 8); ValueError saying what is wrong otherwise."""
    match = _DIMS.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a torus's dimensions: write XxYxZ, such as 4x4x8")
    x, y, z = (int(g) for g in match.groups())
    if min(x, y, z) < 1 or max(x, y, z) > 255:
        raise ValueError(f"torus {x}x{y}x{z}: each dimension must be 1 to 255 nodes")
    return x, y, z


def parse_topology(text: str) -> Coord | None:
    """``[mm] topology``: None for ``"flat"`` (or empty), the dimensions for ``"torus 4x4x8"`` (or
    ``"torus:4x4x8"``, as ``storm local up --topology`` writes it)."""
    words = text.strip().replace(":", " ", 1).split(None, 1)
    if not words or words == ["flat"]:
        return None
    if words[0] != "torus" or len(words) != 2:
        raise ValueError(f"{text!r} is neither 'flat' nor 'torus XxYxZ' (such as 'torus 4x4x8')")
    return parse_dims(words[1])


def box_count(dims: Coord) -> int:
    """How many distinct boxes a torus of ``dims`` has (its table's length)."""
    return math.prod(d * (d - 1) + 1 for d in dims)


@dataclass(frozen=True, slots=True)
class Box:
    """``shape`` = (a, b, c) nodes at ``base`` = (x, y, z): the nodes (x + i, y + j, z + k) modulo the torus's
    dimensions, for 0 <= i < a, 0 <= j < b, 0 <= k < c."""

    base: Coord
    shape: Coord

    @property
    def volume(self) -> int:
        a, b, c = self.shape
        return a * b * c

    def coords(self, dims: Coord) -> list[Coord]:
        """Its nodes, x fastest, then y, then z, from the base: the order ranks are laid out in."""
        (x0, y0, z0), (a, b, c), (dx, dy, dz) = self.base, self.shape, dims
        return [
            ((x0 + i) % dx, (y0 + j) % dy, (z0 + k) % dz)
            for k in range(c)
            for j in range(b)
            for i in range(a)
        ]

    def __str__(self) -> str:
        return "{}x{}x{} at ({},{},{})".format(*self.shape, *self.base)


def _code(base: Coord, shape: Coord) -> int:
    """A box packed into one small int (each coordinate < 256): the table keeps codes, not Box objects."""
    return base[0] | base[1] << 8 | base[2] << 16 | shape[0] << 24 | shape[1] << 32 | shape[2] << 40


def _decode(code: int) -> Box:
    return Box(
        (code & 255, code >> 8 & 255, code >> 16 & 255),
        (code >> 24 & 255, code >> 32 & 255, code >> 40 & 255),
    )


def _keep_all(mask: int) -> bool:
    """Torus.place's ``keep`` when none is given (a name, so the memo knows it from a caller's)."""
    return True


def _segments(size: int) -> list[tuple[int, int]]:
    """(start, length) of every distinct cyclic segment of a ring of ``size``: a whole ring once, at 0."""
    return [(start, length) for length in range(1, size) for start in range(size)] + [(0, size)]


class Torus:
    """A torus of X x Y x Z nodes, node ``x + X (y + Y z)`` at (x, y, z), with its table of boxes.

    Building the table costs O(B) for B boxes (about 10 ms on 4 x 4 x 8, 0.5 s on 8 x 8 x 8); ValueError if
    B > MAX_BOXES. Occupancy is a bitmask argument of every query, so one Torus serves any number of states.
    """

    def __init__(self, dims: Coord) -> None:
        if len(dims) != 3 or min(dims) < 1 or max(dims) > 255:
            raise ValueError(f"a torus needs three dimensions of 1 to 255 nodes, not {dims}")
        count = box_count(dims)
        if count > MAX_BOXES:
            raise ValueError(
                "torus {}x{}x{} has {:,} distinct boxes, more than storm's torus allocator keeps ({:,}): "
                "schedule groups of nodes as one (BG/L's 512-node supernodes made its 65,536 nodes a "
                "4x4x8 torus)".format(*dims, count, MAX_BOXES)
            )
        self.dims: Coord = (dims[0], dims[1], dims[2])
        x_size, y_size, z_size = self.dims
        self.nodes = x_size * y_size * z_size
        self.all = (1 << self.nodes) - 1
        by_volume: dict[int, list[tuple[Coord, Coord, int]]] = {}
        rows = {seg: sum(1 << ((seg[0] + i) % x_size) for i in range(seg[1])) for seg in _segments(x_size)}
        for z0, c in _segments(z_size):
            for y0, b in _segments(y_size):
                for x0, a in _segments(x_size):
                    row = rows[(x0, a)]
                    plane = 0
                    for j in range(b):
                        plane |= row << (x_size * ((y0 + j) % y_size))
                    mask = 0
                    for k in range(c):
                        mask |= plane << (x_size * y_size * ((z0 + k) % z_size))
                    by_volume.setdefault(a * b * c, []).append(((a, b, c), (x0, y0, z0), mask))
        self.sizes: tuple[int, ...] = tuple(sorted(by_volume))  # every size that has a box, ascending
        self._masks: dict[int, list[int]] = {}
        self._codes: dict[int, list[int]] = {}
        for volume, boxes in by_volume.items():
            # The stated tie order: shapes lexicographic, then bases by node index.
            boxes.sort(key=lambda item: (item[0], self.index(item[1])))
            self._masks[volume] = [mask for _, _, mask in boxes]
            self._codes[volume] = [_code(base, shape) for shape, base, _ in boxes]
        self._descending = sorted(self.sizes, reverse=True)
        self._memo: dict[int, int] = {}  # taken -> largest_free(taken)
        self._placed: dict[tuple[int, int], Box | None] = {}  # (taken, size) -> place(taken, size)

    # ------------------------------------------------------------------------------------------ geometry

    def index(self, coord: Coord) -> int:
        x, y, z = coord
        return x + self.dims[0] * (y + self.dims[1] * z)

    def coord(self, index: int) -> Coord:
        x_size, y_size, _ = self.dims
        return index % x_size, index // x_size % y_size, index // (x_size * y_size)

    def mask(self, box: Box) -> int:
        """The nodes of ``box`` as a bitmask; ValueError if it does not fit the torus."""
        if any(not 1 <= s <= d for s, d in zip(box.shape, self.dims, strict=True)) or any(
            not 0 <= b < d for b, d in zip(box.base, self.dims, strict=True)
        ):
            raise ValueError(f"box {box} does not fit the torus {'x'.join(map(str, self.dims))}")
        mask = 0
        for coord in box.coords(self.dims):
            mask |= 1 << self.index(coord)
        return mask

    def mask_of(self, indices: Iterable[int]) -> int:
        mask = 0
        for index in indices:
            mask |= 1 << index
        return mask

    def round_size(self, nodes: int) -> int | None:
        """The least size >= ``nodes`` that has a box; None when ``nodes`` exceeds the torus."""
        if nodes < 1:
            raise ValueError(f"a job needs at least one node, not {nodes}")
        at = bisect_left(self.sizes, nodes)
        return self.sizes[at] if at < len(self.sizes) else None

    def boxes(self, size: int) -> list[Box]:
        """Every box of ``size`` nodes, in the tie order (empty if the size has none)."""
        return [_decode(code) for code in self._codes.get(size, ())]

    # ------------------------------------------------------------------------------------------ queries

    def largest_free(self, taken: int) -> int:
        """The volume of the largest box with no node in ``taken`` (0 if every node is taken).

        O(B) ANDs at worst for B boxes, in C (``0 in map(...)``): the scan starts at the free node count and
        stops at the first free box, so a torus with a large free box answers after a few. Answers are
        remembered (up to MEMO entries, then forgotten all at once): a scheduler asks about the same few
        states again and again, pass after pass, while nothing ends."""
        known = self._memo.get(taken)
        if known is not None:
            return known
        free = self.nodes - taken.bit_count()
        probe = taken.__and__
        found = 0
        for volume in self._descending:
            if volume <= free and 0 in map(probe, self._masks[volume]):
                found = volume
                break
        if len(self._memo) >= MEMO:
            self._memo.clear()
        self._memo[taken] = found
        return found

    def has_free(self, taken: int, size: int) -> bool:
        """Some box of at least ``size`` nodes has no node in ``taken``: largest_free(taken) >= size, without
        looking at smaller boxes when no state is remembered. O(boxes of ``size`` nodes or more) at worst."""
        known = self._memo.get(taken)
        if known is not None:
            return known >= size
        free = self.nodes - taken.bit_count()
        probe = taken.__and__
        for volume in self._descending:
            if volume < size:
                return False
            if volume <= free and 0 in map(probe, self._masks[volume]):
                return True
        return False

    def largest_free_box(self, taken: int) -> Box | None:
        """One largest free box (the first in the tie order), or None."""
        volume = self.largest_free(taken)
        if volume == 0:
            return None
        masks = self._masks[volume]
        return _decode(self._codes[volume][list(map(taken.__and__, masks)).index(0)])

    def fits(self, taken: int, size: int) -> bool:
        """Some box of exactly ``size`` nodes is free. O(boxes of that size)."""
        masks = self._masks.get(size)
        return masks is not None and 0 in map(taken.__and__, masks)

    def place(self, taken: int, size: int, keep: Callable[[int], bool] | None = None) -> Box | None:
        """The paper's placement of a job of ``size`` nodes: of the free boxes of that size (those ``keep``
        accepts, given each one's mask, when it is given), the one that leaves the largest free partition;
        the first in the tie order among equals. None if no box of that size is free (and kept).

        What a candidate leaves is the largest box free now that misses it. So the free boxes are taken
        level by level, largest first, from min(largest free now, free nodes - size), which no candidate can
        beat: at the first level where some free box misses some candidate, the first such candidate in the
        tie order is the answer. Cost: for each level above the answer, its free boxes times the candidates
        (the ANDs in C), so O(B x C) at worst for B boxes and C candidates; most placements end at the
        first level or two. Without ``keep``, answers are remembered as largest_free's are (migration places
        the largest running jobs on the same few states again and again).
        """
        if keep is None:
            key = (taken, size)
            if key in self._placed:
                return self._placed[key]
            if len(self._placed) >= MEMO:
                self._placed.clear()
            box = self._placed[key] = self.place(taken, size, _keep_all)
            return box
        masks = self._masks.get(size)
        if masks is None:
            return None
        free = self.nodes - taken.bit_count()
        if size > free:
            return None
        codes = self._codes[size]
        # Indices of the free boxes of this size, in the tie order (ANDs and tests in C).
        candidates = list(compress(range(len(masks)), map(operator.not_, map(taken.__and__, masks))))
        if keep is not _keep_all:
            candidates = [i for i in candidates if keep(masks[i])]
        if len(candidates) <= 1:
            return _decode(codes[candidates[0]]) if candidates else None
        bound = min(self.largest_free(taken), free - size)
        chosen = [masks[i] for i in candidates]
        for volume in self._descending:
            if volume > bound:
                continue
            level = self._masks[volume]
            first = len(chosen)
            for spare in compress(level, map(operator.not_, map(taken.__and__, level))):
                # The first candidate this free box misses, among those before the best so far.
                found = next(compress(range(first), map(operator.not_, map(spare.__and__, chosen))), None)
                if found is not None:
                    first = found
                    if first == 0:
                        break
            if first < len(chosen):
                return _decode(codes[candidates[first]])
        return _decode(codes[candidates[0]])  # nothing is left free beside any of them

    def grow(
        self, taken: int, size: int, most: int | None = None, keep: Callable[[int], bool] | None = None
    ) -> Box | None:
        """Place a job of ``size`` nodes (a size that has boxes) at the least size from ``size`` to ``most``
        (None: any) that has a free box (``keep``: as :meth:`place`); None if none has.

        Sizes above the largest free partition are never tried, so a job that cannot run costs one
        :meth:`largest_free`."""
        largest = self.largest_free(taken)
        top = largest if most is None else min(largest, most)
        for volume in self.sizes[bisect_left(self.sizes, size) :]:
            if volume > top:
                break
            box = self.place(taken, volume, keep)
            if box is not None:
                return box
        return None
