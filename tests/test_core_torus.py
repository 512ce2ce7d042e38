"""storm-mm's core on a torus ([mm] topology): boxes in the job records, what clients see, restarts, and a job
that a flat cluster would start but a torus cannot, since its free nodes are not a box."""

from __future__ import annotations

import dataclasses

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Rejected
from storm.mm.storage import Storage
from storm.mm.torus import Box
from tests.test_core import T0, Core, done, launched, reg, spec, submit, take

# node0 (0,0), node1 (1,0), node2 (0,1), node3 (1,1): a 2 x 2 torus, one plane.
PLACES = {f"node{i}": [i % 2, i // 2, 0] for i in range(4)}


def torus_core(store: Storage, nodes: int = 4, **config: object) -> Core:
    settings = MMConfig(node_timeout=10.0, topology="torus 2x2x1", coordinates=PLACES)
    ctl = Core(store, dataclasses.replace(settings, **config), T0, "mm-1")  # type: ignore[arg-type]
    for i in range(nodes):
        reg(ctl, f"node{i}")
    return ctl


def start(ctl: Core, ranks: int) -> int:
    job_id = submit(ctl, ranks)
    job = ctl.runs.active[job_id]
    launched(ctl, job_id, *job.nodes)
    take(ctl)
    return job_id


def diagonal(ctl: Core) -> tuple[int, int, int]:
    """Three one-rank jobs on node0, node1, node2; the first ends: node0 and node3 are free, diagonally."""
    a, b, c = start(ctl, 1), start(ctl, 1), start(ctl, 1)
    assert [ctl.runs.active[j].nodes for j in (a, b, c)] == [("node0",), ("node1",), ("node2",)]
    done(ctl, a, "node0", T0 + 5)
    return a, b, c


def test_a_job_whose_free_nodes_are_no_box_waits_where_a_flat_cluster_starts_it(store: Storage) -> None:
    ctl = torus_core(store)
    _, b, _ = diagonal(ctl)
    d = submit(ctl, 2, now=T0 + 6)
    (info,) = ctl.job_infos((d,))
    assert info.state == "PENDING" and info.box is None
    assert info.reason == (
        "Resources: 2 nodes are free but not as a box of 2 on the torus (the largest free box holds 1)"
    )
    assert take(ctl) == []
    # When node1 frees too, node1 and node3 are a 1x2 box (the first shape of the two that tie).
    done(ctl, b, "node1", T0 + 7)
    (info,) = ctl.job_infos((d,))
    assert info.state == "STARTING" and info.nodes == ("node1", "node3")
    assert info.box == p.BoxInfo(base=(1, 0, 0), shape=(1, 2, 1)) and str(info.box) == "1x2x1 at (1,0,0)"
    assert ctl.store.get_job(d).box == Box((1, 0, 0), (1, 2, 1))  # type: ignore[union-attr]


def test_the_same_jobs_on_a_flat_cluster_start_at_once(store: Storage) -> None:
    ctl = Core(store, MMConfig(node_timeout=10.0), T0, "mm-1")
    for i in range(4):
        reg(ctl, f"node{i}")
    a, _, _ = start(ctl, 1), start(ctl, 1), start(ctl, 1)
    done(ctl, a, ctl.runs.active[a].nodes[0], T0 + 5)
    d = submit(ctl, 2, now=T0 + 6)
    assert ctl.job_infos((d,))[0].state == "STARTING"


def test_clients_see_each_nodes_place_and_the_torus_layer_by_layer(store: Storage) -> None:
    ctl = torus_core(store)
    job_id = start(ctl, 2)
    nodes = {n.name: n for n in ctl.node_infos()}
    assert nodes["node3"].coords == (1, 1, 0) and nodes["node0"].jobs == (job_id,)
    view = ctl.matrix_view()
    assert view.torus == p.TorusView(
        dims=(2, 2, 1), nodes=("node0", "node1", "node2", "node3"), jobs=(job_id, 0, job_id, 0)
    )
    assert p.decode(p.encode(view)) == view


def test_a_node_not_on_the_torus_takes_no_job(store: Storage) -> None:
    ctl = torus_core(store, nodes=0)
    reg(ctl, "stray")
    job_id = submit(ctl, 1)
    assert ctl.job_infos((job_id,))[0].state == "PENDING"
    (stray,) = ctl.node_infos()
    assert stray.reason == "not on the torus ([mm] coordinates): takes no job" and stray.coords == ()
    reg(ctl, "node2")
    assert ctl.job_infos((job_id,))[0].nodes == ("node2",)


def test_more_nodes_than_the_torus_has_is_refused_at_submission(store: Storage) -> None:
    ctl = torus_core(store)
    with pytest.raises(Rejected, match="5 ranks requested, but the cluster has only 4 PEs") as refused:
        ctl.submit(spec(5), T0)
    assert refused.value.code == "too_many_ranks"
    reg(ctl, "stray", pes=8)  # PEs enough for 12 ranks, but the torus has four nodes of one
    with pytest.raises(Rejected, match="5 ranks at 1 per node need 5 nodes, but the torus has 4"):
        ctl.submit(spec(5), T0)


def test_a_restarted_mm_keeps_every_jobs_box(store: Storage) -> None:
    ctl = torus_core(store)
    first, second = start(ctl, 2), start(ctl, 1)
    boxes = dict(ctl.runs.torus.boxes)  # type: ignore[union-attr]
    again = Core(store, ctl.config, T0 + 10, "mm-2")
    assert again.runs.torus is not None and again.runs.torus.boxes == boxes
    for i in range(4):
        reg(
            again,
            f"node{i}",
            now=T0 + 10,
            jobs=tuple(j for j in (first, second) if f"node{i}" in again.runs.active[j].nodes),
        )
    waiting = submit(again, 2, now=T0 + 11)
    assert again.job_infos((waiting,))[0].state == "PENDING"  # node3 alone is free
