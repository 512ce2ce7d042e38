"""Coalesced scheduling passes (mm/core.py): stimuli only make a pass due, ``Controller.schedule`` runs it.

A burst of submissions then one pass must start what one pass per submission started; a pass that is not
due does not run; and every stimulus that may let a queued job start makes one due.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from storm.mm import protocol as p
from storm.mm import schedule_state as state_module
from storm.mm.config import MMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Effect, Send
from storm.mm.memory_store import MemoryStore
from storm.mm.runs import seeded_nonces
from storm.mm.scheduler import Plan
from tests.test_core_effects import ALICE, T0, exits, job, node

# (ranks, time limit): heads that do not fit, jobs that backfill before the shadow time, ones that may not,
# and unlimited ones, so that every branch of the scheduler decides something.
BURST = [(2, 100.0), (4, None), (3, 50.0), (1, 10.0), (6, 20.0), (2, 5.0), (1, None), (6, 1.0), (1, 30.0)]
BURST += [(ranks % 4 + 1, float(10 * (i % 7 + 1))) for i, ranks in enumerate(range(40))]


def controller(policy: str = p.Policy.BATCH, **config: object) -> Controller:
    settings: dict[str, object] = {"node_timeout": 10.0, "mpl": 1, **config}
    config = MMConfig(**settings)  # type: ignore[arg-type]
    ctl = Controller(MemoryStore(), config, "mm-1", nonce=seeded_nonces(0), policy=policy)
    ctl.recover(T0)
    for name in ("n1", "n2", "n3"):
        ctl.handle(node(name), T0, FromNode(name))
    ctl.schedule(T0)
    return ctl


def from_node(ctl: Controller, msg: p.Message, now: float) -> list[Effect]:
    return ctl.handle(msg, now, FromNode(getattr(msg, "node", "")))


def submit(
    ctl: Controller, ranks: int, now: float, time_limit: float | None = None, requeue: bool = False
) -> int:
    [reply] = ctl.handle(job(ranks, requeue=requeue, time_limit=time_limit), now, ALICE)
    assert isinstance(reply.message, p.JobSubmitted), reply  # type: ignore[union-attr]
    return reply.message.job_id  # type: ignore[union-attr]


def decisions(
    ctl: Controller,
) -> tuple[dict[int, tuple[int | None, tuple[tuple[str, int], ...]]], dict[int, str]]:
    """Where every placed job went (row, PEs) and why every queued job waits."""
    placed = {j.id: (j.row, j.placement) for j in ctl.runs.active.values()}
    waiting = {i.id: i.reason for i in ctl.job_infos() if i.state == "PENDING"}
    return placed, waiting


def launches(effects: list[Effect]) -> set[tuple[str, int, bytes]]:
    sent = [e for e in effects if isinstance(e, Send)]
    return {(e.node, getattr(e.message, "job_id", 0), p.encode(e.message)) for e in sent}


@pytest.mark.parametrize("policy", [p.Policy.BATCH, p.Policy.GANG])
def test_a_burst_of_submissions_then_one_pass_starts_what_a_pass_each_started(policy: str) -> None:
    one_each, burst = controller(policy, mpl=2), controller(policy, mpl=2)
    sent_each: list[Effect] = []
    for ranks, limit in BURST:
        submit(one_each, ranks, T0 + 1, limit)
        sent_each += one_each.schedule(T0 + 1)  # what storm-mm did before passes were coalesced
    for ranks, limit in BURST:
        submit(burst, ranks, T0 + 1, limit)
    passes = burst.runs.passes
    sent_burst = burst.schedule(T0 + 1)
    assert burst.runs.passes == passes + 1
    assert decisions(burst) == decisions(one_each)
    # The same launches, kvsnames included: every run draws its nonce in the same order either way.
    assert launches(sent_burst) == launches(sent_each) and len(sent_burst) == len(sent_each)
    placed, waiting = decisions(burst)
    assert len(placed) >= 4 and "Priority" in waiting.values() and "Resources" in waiting.values()


def test_a_pass_that_is_not_due_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[float] = []
    real = state_module.schedule

    def counted(now: float, *args: object, **kw: object) -> Plan:
        ran.append(now)
        return real(now, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(state_module, "schedule", counted)
    ctl = controller()
    assert not ctl.pass_due and ctl.schedule(T0) == [] and ran == []  # nothing queued yet: nothing to place
    for _ in range(5):
        submit(ctl, 2, T0 + 1)
    assert ctl.pass_due and ran == []  # submitting runs no pass
    sent = ctl.schedule(T0 + 1)
    assert ran == [T0 + 1] and len(launches(sent)) == 3 and not ctl.pass_due
    assert ctl.schedule(T0 + 2) == [] and ran == [T0 + 1]
    # What cannot let a queued job start leaves it so.
    ctl.handle(p.ListJobs(req=2), T0 + 2, ALICE)
    ctl.handle(p.WaitJob(req=3, job_id=4), T0 + 2, ALICE)
    from_node(ctl, p.JobLaunched(job_id=1, node="n1", pids={"0": 10, "1": 11}), T0 + 2)
    assert not ctl.pass_due and ctl.schedule(T0 + 3) == [] and ran == [T0 + 1]


def settled(ctl: Controller, now: float) -> Controller:
    ctl.schedule(now)
    assert not ctl.pass_due
    return ctl


def status(ctl: Controller, name: str, now: float, jobs: tuple[int, ...] = ()) -> list[Effect]:
    msg = p.NodeStatus(node=name, nm_epoch=f"{name}-e1", mm_epoch="mm-1", jobs=jobs)
    return from_node(ctl, msg, now)


def job_end() -> Controller:
    ctl = controller()
    submit(ctl, 2, T0 + 1)
    settled(ctl, T0 + 1)
    from_node(ctl, p.JobNodeDone(job_id=1, node="n1", exits=exits(0, 1)), T0 + 2)
    return ctl


def requeue() -> Controller:
    """A requeueable job on n1 and n2 loses n2; it goes back to the queue once n1 confirms its ranks gone."""
    ctl = controller()
    submit(ctl, 4, T0 + 1, requeue=True)
    settled(ctl, T0 + 1)
    for name in ("n1", "n2"):
        from_node(ctl, p.JobLaunched(job_id=1, node=name, pids={"0": 10, "1": 11}), T0 + 1)
    for name in ("n1", "n3"):
        status(ctl, name, T0 + 8, tuple(j.id for j in ctl.runs.active.values() if name in j.nodes))
    ctl.tick(T0 + 11)  # n2 DOWN
    settled(ctl, T0 + 11)
    from_node(ctl, p.JobNodeDone(job_id=1, node="n1", exits=exits(0, 1, signal=15)), T0 + 12)
    assert ctl.runs.pending.keys() == {1}
    return ctl


def echoes_over() -> Controller:
    """The requeued job waits until n1 no longer reports its last run."""
    ctl = settled(requeue(), T0 + 12)
    assert "reports still due from n1" in ctl.job_infos((1,))[0].reason
    status(ctl, "n1", T0 + 13)
    return ctl


def stale_cleared_by_status() -> Controller:
    ctl = controller()
    from_node(ctl, node("n1", jobs=(99,)), T0 + 1)  # a restarted n1 still runs a job the MM forgot
    settled(ctl, T0 + 1)
    assert ctl.registry.get("n1").stale == {99}  # type: ignore[union-attr]
    status(ctl, "n1", T0 + 2)
    return ctl


def stale_cleared_by_final_report() -> Controller:
    ctl = controller()
    from_node(ctl, node("n1", jobs=(99,)), T0 + 1)
    settled(ctl, T0 + 1)
    from_node(ctl, p.JobNodeDone(job_id=99, node="n1", exits=exits(0)), T0 + 2)
    return ctl


def cancel_pending() -> Controller:
    ctl = controller()
    for _ in range(4):
        submit(ctl, 2, T0 + 1)
    settled(ctl, T0 + 1)
    assert ctl.runs.pending.keys() == {4}
    ctl.handle(p.CancelJobs(job_ids=(4,)), T0 + 2, ALICE)
    return ctl


def node_up_again() -> Controller:
    """n3 went DOWN and registers again."""
    ctl = controller()
    for name in ("n1", "n2"):
        status(ctl, name, T0 + 8)
    ctl.tick(T0 + 11)
    settled(ctl, T0 + 11)
    assert ctl.registry.get("n3").state == "DOWN"  # type: ignore[union-attr]
    from_node(ctl, node("n3"), T0 + 12)
    return ctl


def recovered() -> Controller:
    store = MemoryStore()
    first = Controller(store, MMConfig(), "mm-1", nonce=seeded_nonces(0))
    first.recover(T0)
    first.handle(node("n1"), T0, FromNode("n1"))
    submit(first, 2, T0)
    again = Controller(store, MMConfig(), "mm-2", nonce=seeded_nonces(0))
    again.recover(T0 + 1)
    return again


def submitted() -> Controller:
    ctl = controller()
    submit(ctl, 1, T0 + 1)
    return ctl


def node_registers() -> Controller:
    ctl = controller()
    from_node(ctl, node("n4"), T0 + 1)
    return ctl


def ticked() -> Controller:
    ctl = controller()
    ctl.tick(T0 + 1)
    return ctl


STIMULI: dict[str, Callable[[], Controller]] = {
    "submit": submitted,
    "job end": job_end,
    "requeue": requeue,
    "last run's reports over": echoes_over,
    "stale jobs gone from a status": stale_cleared_by_status,
    "stale job's final report": stale_cleared_by_final_report,
    "cancel of a queued job": cancel_pending,
    "node registers": node_registers,
    "node up again": node_up_again,
    "tick": ticked,
    "recovery": recovered,
}


@pytest.mark.parametrize("stimulus", STIMULI)
def test_every_stimulus_that_may_let_a_job_start_makes_a_pass_due(stimulus: str) -> None:
    ctl = STIMULI[stimulus]()
    assert ctl.pass_due
    passes = ctl.runs.passes
    ctl.schedule(T0 + 20)
    assert ctl.runs.passes == passes + 1 and not ctl.pass_due
