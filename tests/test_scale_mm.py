"""storm-mm at scale (issue 18, item 3), in its core with time passed in: a registration storm that costs no
commit, nodes added at once, and the job history read a page at a time. (Timings: storm bench scale.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.matrix import Matrix
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.mm.storage import NodeRecord, Storage
from storm.mm.store import Store

ROOT = Account(0, 0, "root")


class CountingStore(MemoryStore):
    """The in-memory store, counting node records written."""

    def __init__(self) -> None:
        super().__init__()
        self.node_writes = 0

    def save_node(self, node: NodeRecord) -> None:
        self.node_writes += 1
        super().save_node(node)


def controller(store: Storage, **config: object) -> Controller:
    ctl = Controller(store, MMConfig(**config), "mm-1", nonce=seeded_nonces(0))  # type: ignore[arg-type]
    ctl.recover(0.0)
    return ctl


def register(ctl: Controller, name: str, epoch: str = "nm-1", pes: int = 1) -> p.Message:
    effects = ctl.handle(p.RegisterNode(node=name, pes=pes, nm_epoch=epoch), 1.0, FromNode(name))
    return effects[0].message  # type: ignore[union-attr]


def test_a_restarted_mm_takes_a_registration_storm_without_writing_a_node_record() -> None:
    store = CountingStore()
    ctl = controller(store)
    for i in range(50):
        register(ctl, f"emu{i}")
    assert store.node_writes == 50  # each new node once
    again = controller(store)  # storm-mm restarted on the same store
    for i in range(50):
        assert isinstance(register(again, f"emu{i}", epoch="nm-2"), p.NodeRegistered)
    assert store.node_writes == 50  # the same nodes again: nothing changed that the store keeps
    register(again, "emu0", epoch="nm-3", pes=2)
    assert store.node_writes == 51  # a node with more PEs is written
    (node,) = [n for n in store.nodes() if n.name == "emu0"]
    assert node.pes == 2


def test_nodes_added_at_once_are_in_natural_order_and_one_refused_adds_none() -> None:
    matrix = Matrix(mpl=2)
    matrix.add_nodes({f"n{i}": 1 for i in (10, 2, 1)})
    matrix.add_node("n3", 2)
    assert list(matrix.nodes()) == ["n1", "n2", "n3", "n10"] and matrix.total_pes() == 5
    with pytest.raises(ValueError, match="at least one PE"):
        matrix.add_nodes({"n4": 1, "n5": 0})
    assert "n4" not in matrix.nodes()


def history(store: Storage, finished: int, queued: int) -> Controller:
    """``finished`` jobs ended (cancelled), then ``queued`` waiting (no pass is run)."""
    ctl = controller(store)
    register(ctl, "n0")
    submit = p.SubmitJob(ranks=1, argv=("true",), cwd="/tmp", env={})
    for _ in range(finished):
        reply = ctl.handle(submit, 2.0, ROOT)[0].message
        assert isinstance(reply, p.JobSubmitted)
        ctl.handle(p.CancelJobs(job_ids=(reply.job_id,)), 2.0, ROOT)
    for _ in range(queued):
        ctl.handle(submit, 3.0, ROOT)
    return ctl


def pages(ctl: Controller, limit: int) -> list[p.JobList]:
    found, before = [], 0
    while True:
        (effect,) = ctl.handle(p.ListJobs(all=True, limit=limit, before=before), 4.0, ROOT)
        assert isinstance(effect.message, p.JobList)
        found.append(effect.message)
        if not effect.message.older:
            return found
        before = effect.message.older


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_history_comes_a_page_at_a_time_newest_first_with_the_active_jobs_first(
    kind: str, tmp_path: Path
) -> None:
    store = MemoryStore() if kind == "memory" else Store(tmp_path / "storm.db")
    try:
        check_pages(history(store, finished=25, queued=3))
    finally:
        if isinstance(store, Store):
            store.close()


def check_pages(ctl: Controller) -> None:
    read = pages(ctl, limit=10)
    assert [len(page.jobs) for page in read] == [10, 10, 8]
    assert [j.id for j in read[0].jobs] == list(range(19, 29))  # the newest: the queued jobs among them
    assert read[0].older == 19 and read[1].older == 9 and read[2].older == 0
    every = [j.id for page in read for j in page.jobs]
    assert sorted(every) == list(range(1, 29)) and len(set(every)) == 28
    # The MM's own page bounds any request, however old the client.
    (effect,) = ctl.handle(p.ListJobs(all=True), 4.0, ROOT)
    assert isinstance(effect.message, p.JobList) and len(effect.message.jobs) == 28


def test_an_active_job_older_than_the_first_page_comes_with_it(tmp_path: Path) -> None:
    ctl = controller(MemoryStore())
    register(ctl, "n0")
    submit = p.SubmitJob(ranks=1, argv=("true",), cwd="/tmp", env={})
    ctl.handle(submit, 1.0, ROOT)  # job 1 waits (no pass is run)
    for _ in range(12):
        reply = ctl.handle(submit, 2.0, ROOT)[0].message
        assert isinstance(reply, p.JobSubmitted)
        ctl.handle(p.CancelJobs(job_ids=(reply.job_id,)), 2.0, ROOT)
    first = pages(ctl, limit=5)[0]
    assert [j.id for j in first.jobs] == [1, 9, 10, 11, 12, 13] and first.older == 9


def test_the_client_reads_the_newest_last_jobs_or_every_page(tmp_path: Path) -> None:
    """storm queue --all --last N, as Client.jobs pages it (the MM's side faked by the core itself)."""
    from storm.tools.client import Client

    ctl = history(MemoryStore(), finished=30, queued=0)

    class Direct(Client):
        def __init__(self) -> None:  # no socket: each request goes to the core
            pass

        def call(self, request: p.Request, expect: type, timeout: float | None = None):  # type: ignore[no-untyped-def,override]
            return ctl.handle(request, 5.0, ROOT)[0].message

    client = Direct()
    assert [j.id for j in client.jobs(everything=True, last=7)] == list(range(24, 31))
    assert len(client.jobs(everything=True, last=0)) == 30
    assert os.getuid() >= 0  # (the fake needs no credentials)


def test_a_restarted_mm_starts_nothing_until_its_nodes_are_back_or_two_report_intervals_passed() -> None:
    store = MemoryStore()
    ctl = controller(store, node_timeout=5.0)  # a report every second
    for name in ("n0", "n1", "n2"):
        register(ctl, name)
    again = controller(store, node_timeout=5.0)  # restarted at 0.0, knowing the three nodes
    for _ in range(3):
        again.handle(p.SubmitJob(ranks=1, argv=("true",), cwd="/tmp", env={}), 0.5, ROOT)
    register(again, "n0", epoch="nm-2")
    assert again.schedule(1.0) == [] and not again.pass_due  # n1 and n2 are not back yet
    register(again, "n1", epoch="nm-2")
    assert again.schedule(1.5) == []
    register(again, "n2", epoch="nm-2")  # the last one: the pass runs at once
    assert len(again.schedule(1.6)) == 3
    fresh = MemoryStore()
    first = controller(fresh, node_timeout=5.0)
    for name in ("n0", "n1", "n2"):
        register(first, name)
    late = controller(fresh, node_timeout=5.0)  # restarted: n2 never comes back this time
    for _ in range(2):
        late.handle(p.SubmitJob(ranks=1, argv=("true",), cwd="/tmp", env={}), 0.5, ROOT)
    register(late, "n0", epoch="nm-3")
    register(late, "n1", epoch="nm-3")
    assert late.schedule(1.9) == []
    late.tick(2.1)  # two report intervals after the restart
    assert len(late.schedule(2.1)) == 2
