"""The BlueGene/L paper's schedulers on small tori (mm/torus_scheduler.py), driven directly."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storm.mm.matrix import Matrix, Placement
from storm.mm.schedule_state import ScheduleState
from storm.mm.scheduler import PRIORITY, Plan, QueuedJob, RunningJob
from storm.mm.torus import Box
from storm.mm.torus_scheduler import Migration, schedule_torus
from storm.mm.torus_state import TorusLayout, TorusState

NOW = 1000.0


class Cluster:
    """A torus of nodes n0, n1, ... (x fastest), ``pes`` each, and the jobs running on it."""

    def __init__(self, dims: tuple[int, int, int], pes: int = 1) -> None:
        self.state = TorusState(TorusLayout.numbered(dims))
        self.torus = self.state.torus
        self.matrix = Matrix(1)
        for name in self.state.layout.names:
            assert name is not None
            self.matrix.add_node(name, pes)
        self.running: dict[int, RunningJob] = {}

    def run(self, job_id: int, box: Box, end: float | None = None, ranks: int | None = None) -> None:
        """Job ``job_id`` holds ``box`` since NOW - 1, its estimate ending at ``end`` (None: no limit)."""
        names = self.state.names_of(box)
        self.state.assign(job_id, box)
        count = len(names) if ranks is None else ranks
        self.matrix.assign(job_id, Placement(0, tuple((n, 0) for n in names[:count])))
        self.running[job_id] = RunningJob(job_id, NOW - 1, None if end is None else end - (NOW - 1))

    def schedule(self, queue: list[QueuedJob], **options: object) -> Plan:
        return schedule_torus(NOW, queue, self.running, self.state, self.matrix, **options)  # type: ignore[arg-type]

    def boxes(self, plan: Plan) -> dict[int, Box | None]:
        return {start.job_id: start.box for start in plan.starts}


def job(job_id: int, ranks: int, limit: float | None = 3600.0) -> QueuedJob:
    return QueuedJob(job_id, ranks, limit)


def node(x: int) -> Box:
    return Box((x, 0, 0), (1, 1, 1))


def test_fcfs_stops_at_the_first_job_that_fits_no_free_box() -> None:
    ring = Cluster((4, 1, 1))
    ring.run(1, node(1))
    ring.run(2, node(3))
    # Two nodes are free, 0 and 2, but they are not neighbours: a 2-node job waits, and so does the
    # 1-node job behind it under strict FCFS.
    plan = ring.schedule([job(10, 2), job(11, 1)], backfill="none")
    assert plan.starts == ()
    assert plan.reasons[10] == (
        "Resources: 2 nodes are free but not as a box of 2 on the torus (the largest free box holds 1)"
    )
    assert plan.reasons[11] == PRIORITY
    # Backfilling starts the 1-node job: it ends long before anything frees a box for the head.
    plan = ring.schedule([job(10, 2), job(11, 1, limit=60)], backfill="easy")
    assert ring.boxes(plan) == {11: node(0)}
    assert plan.reservation is not None and math.isinf(plan.reservation.start)


def test_the_head_grows_to_the_least_size_with_a_free_box() -> None:
    plane = Cluster((4, 4, 1))
    free = Box((1, 1, 0), (2, 2, 1))
    for i, coord in enumerate(
        c for c in Box((0, 0, 0), (4, 4, 1)).coords((4, 4, 1)) if c not in free.coords((4, 4, 1))
    ):
        plane.run(100 + i, Box(coord, (1, 1, 1)))
    plan = plane.schedule([job(1, 3)], backfill="none")
    (start,) = plan.starts
    assert start.box == free and start.placement.ranks == 3  # 4 nodes held, ranks on 3 of them
    assert plane.state.masks[1] == plane.torus.mask(free)


def test_sizes_round_up_and_ranks_fill_each_nodes_pes() -> None:
    big = Cluster((4, 4, 8))
    plan = big.schedule([job(1, 11)], backfill="none")
    assert plan.starts[0].box is not None and plan.starts[0].box.volume == 12
    two = Cluster((2, 2, 1), pes=2)
    plan = two.schedule([job(1, 3)], backfill="none")  # 3 ranks at 2 a node: 2 nodes
    (start,) = plan.starts
    assert start.box == Box((0, 0, 0), (1, 2, 1))  # shapes tie in lexicographic order: 1x2x1 first
    assert start.placement.pes == (("n0", 0), ("n0", 1), ("n2", 0))
    plan = two.schedule([job(2, 9)], backfill="none")
    assert (
        plan.reasons[2]
        == "PartitionConfig: needs 5 nodes of 2 PEs, the largest box of usable nodes on the torus has 4"
    )


def test_backfilling_keeps_a_box_for_the_head_at_the_shadow_time() -> None:
    ring = Cluster((6, 1, 1))
    ring.run(1, Box((0, 0, 0), (2, 1, 1)), end=NOW + 100)  # nodes 0, 1
    ring.run(2, node(2), end=NOW + 1000)
    # The head needs 4: at NOW + 100 nodes 3, 4, 5, 0, 1 are free, a ring segment of 5. Free now: 3, 4, 5.
    queue = [job(10, 4), job(11, 1, limit=5000), job(12, 1, limit=5000), job(13, 2, limit=50)]
    plan = ring.schedule(queue, backfill="easy")
    assert plan.reservation is not None and plan.reservation.start == NOW + 100
    # Job 11 runs past the shadow time: only node 3 leaves the head 4 in a row (4, 5, 0, 1) then.
    # Job 12 would take one of those four: it waits. Job 13 ends before the shadow time: it may use them.
    assert ring.boxes(plan) == {11: node(3), 13: Box((4, 0, 0), (2, 1, 1))}
    assert plan.reasons[12] == PRIORITY


def test_a_backfilled_job_grows_by_one_node_at_most() -> None:
    big = Cluster((4, 4, 8))
    region = Box((0, 0, 0), (3, 3, 1))  # only a 3 x 3 square is free
    others = [c for c in range(big.torus.nodes) if big.torus.coord(c) not in region.coords(big.torus.dims)]
    for i, index in enumerate(others):
        big.run(100 + i, Box(big.torus.coord(index), (1, 1, 1)), end=NOW + 10_000)
    # 7 nodes fit the square only as 9 (no 1x1x7 there): FCFS grows the head that much; backfilling does
    # not, so behind a head it waits, while 5 (as 6) starts.
    plan = big.schedule([job(1, 7)], backfill="none")
    assert big.boxes(plan) == {1: region}
    big.state.release(1)
    big.matrix.release(1)
    plan = big.schedule([job(2, 16), job(3, 7, limit=60), job(4, 5, limit=60)], backfill="easy")
    assert set(big.boxes(plan)) == {4}
    box = big.boxes(plan)[4]
    assert box is not None and box.volume == 6
    assert plan.reasons[3] == PRIORITY


def fragmented_ring() -> Cluster:
    ring = Cluster((4, 1, 1))
    ring.run(1, node(1), end=NOW + 500)
    ring.run(2, node(3), end=NOW + 500)
    return ring


def test_migration_compacts_the_running_jobs_and_the_head_starts() -> None:
    ring = fragmented_ring()
    plan = ring.schedule([job(10, 2)], backfill="none", migration=Migration())
    # Re-placed largest first (ties in job order) on an empty ring: job 1 at 0, job 2 beside it at 1.
    assert [(m.job_id, m.box) for m in plan.moves] == [(1, node(0)), (2, node(1))]
    assert [m.placement.pes for m in plan.moves] == [(("n0", 0),), (("n1", 0),)]
    assert ring.boxes(plan) == {10: Box((2, 0, 0), (2, 1, 1))}
    assert (ring.state.migrations, ring.state.migrated, ring.state.jobs_moved) == (1, 1, 2)
    assert ring.matrix.placement_of(1) == Placement(0, (("n0", 0),))


def test_migration_is_gated_and_cancelled_when_the_largest_box_would_not_grow() -> None:
    # FN_max: five of six free nodes in one box (more than 0.7): no attempt.
    ring = Cluster((8, 1, 1))
    ring.run(1, node(5))
    ring.run(2, node(7))
    plan = ring.schedule([job(10, 6)], backfill="none", migration=Migration())
    assert plan.moves == () and ring.state.migrations == 0
    # FN_tor: one free node of twenty (under 0.1): no attempt.
    long = Cluster((20, 1, 1))
    long.run(1, Box((0, 0, 0), (19, 1, 1)))
    long.schedule([job(10, 2)], backfill="none", migration=Migration())
    assert long.state.migrations == 0
    # Always attempted (the paper's "full migration"), but a lone job is where it would go again.
    lone = Cluster((4, 1, 1))
    lone.run(1, node(0))
    plan = lone.schedule([job(10, 4)], backfill="none", migration=Migration(0, 1))
    assert plan.moves == () and (lone.state.migrations, lone.state.migrated) == (1, 0)


def test_a_job_placed_without_a_box_is_never_moved() -> None:
    ring = fragmented_ring()
    ring.state.release(1)
    ring.state.assign_nodes(1, ["n1"])  # placed before the torus was configured
    plan = ring.schedule([job(10, 2)], backfill="none", migration=Migration())
    assert [m.job_id for m in plan.moves] == [2]
    assert ring.state.masks[1] == 1 << 1


def test_schedule_state_keeps_the_torus_in_step() -> None:
    ring = Cluster((4, 1, 1))
    state = ScheduleState(ring.matrix, "easy", ring.state)
    state.place(1, Placement(0, (("n2", 0),)), NOW - 10, 100.0, node(2))
    state.place(2, Placement(0, (("n0", 0),)), NOW - 10, None)  # no box: holds its node
    assert ring.state.boxes == {1: node(2)} and ring.state.masks == {1: 4, 2: 1}
    state.enqueue(3, 2, 60.0)
    plan = state.run_pass(NOW)
    assert plan.reasons[3].startswith("Resources: 2 nodes are free but not as a box")
    assert state.end(1) == Placement(0, (("n2", 0),))
    assert ring.state.taken == 1
    assert [s.box for s in state.run_pass(NOW).starts] == [Box((1, 0, 0), (2, 1, 1))]
    with pytest.raises(ValueError, match="backfill on a torus"):
        ScheduleState(ring.matrix, "conservative", ring.state)
    with pytest.raises(ValueError, match="needs one"):
        ScheduleState(Matrix(1), "easy", None, Migration())


def test_unusable_nodes_take_no_job_and_a_job_too_big_for_the_rest_is_skipped() -> None:
    ring = Cluster((4, 1, 1))
    plan = schedule_torus(
        NOW, [job(1, 4), job(2, 2)], {}, ring.state, ring.matrix, usable={"n0", "n1", "n3"}, backfill="none"
    )
    assert plan.reasons[1].startswith("PartitionConfig") and ring.boxes(plan) == {
        2: Box((0, 0, 0), (2, 1, 1))  # as good as 3, 0: both leave one node, and 0 comes first
    }


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[int, int, int], list[tuple[int, float, float]], str, bool]:
    dims = draw(st.sampled_from([(2, 2, 2), (4, 1, 1), (3, 2, 2), (4, 4, 1)]))
    nodes = dims[0] * dims[1] * dims[2]
    jobs = draw(st.lists(st.tuples(st.integers(1, nodes), st.floats(1, 50), st.floats(1, 100)), max_size=25))
    return dims, jobs, draw(st.sampled_from(["none", "easy"])), draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_random_passes_keep_the_torus_consistent(
    case: tuple[tuple[int, int, int], list[tuple[int, float, float]], str, bool],
) -> None:
    """Jobs arrive and end at random; after every pass the torus, the matrix and the plan agree: disjoint
    boxes of legal sizes holding each job's ranks, FCFS starts a prefix of the queue, moves only jobs that
    ran before the pass."""
    dims, jobs, backfill, migrate = case
    cluster = Cluster(dims)
    state = ScheduleState(cluster.matrix, backfill, cluster.state, Migration() if migrate else None)
    torus = cluster.torus
    ends: dict[int, float] = {}
    wanted: dict[int, int] = {}
    now = 0.0
    rng = random.Random(len(jobs))
    for job_id, (ranks, gap, runtime) in enumerate(jobs, 1):
        now += gap
        for done in [j for j, end in ends.items() if end <= now]:
            state.end(done)
            del ends[done]
        state.enqueue(job_id, ranks, runtime * rng.choice([1, 2]))
        wanted[job_id] = ranks
        before = set(state.running)
        queue = list(state.queued)
        plan = state.run_pass(now)
        for start in plan.starts:
            ends[start.job_id] = now + runtime
        assert {m.job_id for m in plan.moves} <= before
        if backfill == "none":
            started = [s.job_id for s in plan.starts]
            assert started == queue[: len(started)]
        masks = list(cluster.state.masks.values())
        assert sum(m.bit_count() for m in masks) == cluster.state.taken.bit_count()
        for held, box in cluster.state.boxes.items():
            assert cluster.state.masks[held] == torus.mask(box) and box.volume in torus.sizes
            placement = cluster.matrix.placement_of(held)
            assert placement is not None and set(placement.nodes) <= set(cluster.state.names_of(box))
            assert placement.ranks == wanted[held] <= box.volume
