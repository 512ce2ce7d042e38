"""Switches at an instant (issue 18, item 1): the MM names in each heartbeat when its slot begins, and a node
switches then, not on arrival; one that cannot wait for it switches at once and counts why. The node core and
the MM core driven directly, time passed in (no sockets, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import ConfigError, MMConfig, load
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Publish
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.nm.node import Node
from storm.nm.switcher import TraceLine
from tests.fakes import FakeProcesses
from tests.test_node import make, registered, start

T0 = 1000.0
LEAD = 0.005


def beat(seq: int, row: int, sent: float, lead: float = LEAD) -> p.Heartbeat:
    return p.Heartbeat(epoch="mm-1", seq=seq, row=row, sent=sent, slice=0.1, at=sent + lead)


def gang_node(
    tmp_path: Path, **config: object
) -> tuple[Node, FakeProcesses, dict[int, int], list[TraceLine]]:
    """A gang node with job 7 in row 1, tracing into a list."""
    node, fake, _measured = make(tmp_path, **config)
    lines: list[TraceLine] = []
    node.switcher.trace = lines.append
    node.from_mm(registered("gang"), T0)
    pids = start(node, fake, 7, row=1)  # row 1: row 0's slot stops it
    return node, fake, pids, lines


def test_a_slot_begins_at_the_instant_its_heartbeat_names_not_on_arrival(tmp_path: Path) -> None:
    node, fake, pids, lines = gang_node(tmp_path)
    arrived = T0 + 0.001
    out = node.heartbeat(beat(1, 0, T0), arrived, arrived)
    assert out.slot == (1, T0 + LEAD) and out.check is None
    assert fake.stopped == set()  # nothing switched yet
    out = node.begin_slot(1, T0 + LEAD)
    assert out is not None and out.check is not None and fake.stopped == set(pids.values())
    node.switch_checked(out.check, T0 + LEAD + 0.0002)
    assert lines[-1] == TraceLine(1, 0, T0, arrived, T0 + LEAD + 0.0002, 2, T0 + LEAD, T0 + LEAD)
    assert node.begin_slot(1, T0 + LEAD) is None  # once only
    status = node.reports()[0]
    assert isinstance(status, p.NodeStatus) and (status.late_beats, status.skewed_beats) == (0, 0)


def test_an_idle_node_begins_its_slot_at_the_instant_and_leaves_its_driver_nothing(tmp_path: Path) -> None:
    node, _fake, _measured = make(tmp_path)
    lines: list[TraceLine] = []
    node.switcher.trace = lines.append
    node.from_mm(registered("gang"), T0)
    arrived = T0 + 0.001
    assert node.heartbeat(beat(1, 1, T0), arrived, arrived).slot == (1, T0 + LEAD)
    assert lines == []  # waiting for its instant
    assert node.begin_slot(1, T0 + LEAD + 0.0003) is None  # no rank: no Outcome for the driver
    assert lines == [TraceLine(1, 1, T0, arrived, T0 + LEAD + 0.0003, 0, T0 + LEAD, T0 + LEAD + 0.0003)]
    assert node.switcher.active == 1
    assert node.begin_slot(1, T0 + LEAD + 0.001) is None and len(lines) == 1  # once only
    status = node.reports()[0]
    assert isinstance(status, p.NodeStatus) and status.timings is not None
    assert status.timings.lateness_sum == pytest.approx(0.0003)


def test_a_heartbeat_after_its_instant_switches_at_once_and_is_counted_late(tmp_path: Path) -> None:
    node, fake, pids, _lines = gang_node(tmp_path)
    arrived = T0 + LEAD + 0.003
    out = node.heartbeat(beat(1, 0, T0), arrived, arrived)
    assert out.slot is None and out.check is not None and fake.stopped == set(pids.values())
    status = node.reports()[0]
    assert isinstance(status, p.NodeStatus) and (status.late_beats, status.skewed_beats) == (1, 0)


def test_an_instant_further_ahead_than_the_lead_allows_means_a_clock_behind_it_switches_on_arrival(
    tmp_path: Path,
) -> None:
    node, fake, pids, _ = gang_node(tmp_path, clock_tolerance=0.002)
    # Arrives (by this node's clock) 10 ms before the heartbeat was sent: the clock is 10 ms behind.
    out = node.heartbeat(beat(1, 0, T0), T0 - 0.010, T0 - 0.010)
    assert out.slot is None and fake.stopped == set(pids.values())
    # 1 ms behind is within the tolerance: it waits (1 ms longer than the others).
    out = node.heartbeat(beat(2, 1, T0 + 0.1), T0 + 0.099, T0 + 0.099)
    assert out.slot == (2, T0 + 0.1 + LEAD)
    status = node.reports()[0]
    assert isinstance(status, p.NodeStatus) and (status.late_beats, status.skewed_beats) == (0, 1)


def test_a_node_that_does_not_trust_its_clock_switches_on_arrival_and_counts_nothing(tmp_path: Path) -> None:
    node, fake, pids, lines = gang_node(tmp_path, synchronized_clock=False)
    out = node.heartbeat(beat(1, 0, T0), T0 + 0.001, T0 + 0.001)
    assert out.slot is None and fake.stopped == set(pids.values())
    assert out.check is not None
    node.switch_checked(out.check, T0 + 0.002)
    assert (lines[-1].at, lines[-1].begun, lines[-1].received) == (T0 + LEAD, T0 + 0.001, T0 + 0.001)
    status = node.reports()[0]
    assert isinstance(status, p.NodeStatus) and (status.late_beats, status.skewed_beats) == (0, 0)


def test_a_newer_heartbeat_begins_a_pending_slot_at_once_and_its_old_timer_then_does_nothing(
    tmp_path: Path,
) -> None:
    node, fake, pids, lines = gang_node(tmp_path)
    assert node.heartbeat(beat(1, 0, T0), T0, T0).slot == (1, T0 + LEAD)
    # The timer never fired (a stalled loop): heartbeat 2 arrives; slot 1 begins now, then 2 waits.
    out = node.heartbeat(beat(2, 1, T0 + 0.1), T0 + 0.1, T0 + 0.1)
    assert out.slot == (2, T0 + 0.1 + LEAD) and fake.stopped == set(pids.values())
    assert [line.seq for line in lines] == []  # slot 1's switch awaits its check
    assert node.begin_slot(1, T0 + 0.101) is None  # slot 1's timer, late: nothing
    out = node.begin_slot(2, T0 + 0.1 + LEAD)
    assert fake.stopped == set()  # row 1 runs


def test_the_mm_names_the_instant_a_lead_after_sending_at_most_half_a_slice(tmp_path: Path) -> None:
    def first_beat(**mm: object) -> p.Heartbeat:
        config = MMConfig(mpl=2, **mm)  # type: ignore[arg-type]
        ctl = Controller(MemoryStore(), config, "mm-1", nonce=seeded_nonces(0), policy="gang")
        ctl.recover(T0)
        (effect,) = ctl.heartbeat(T0)
        assert isinstance(effect, Publish)
        return effect.heartbeat

    assert first_beat().at == pytest.approx(T0 + 0.02)
    assert first_beat(switch_lead=0.005).at == pytest.approx(T0 + 0.005)
    assert first_beat(switch_lead=0.2, slice=0.1).at == pytest.approx(T0 + 0.05)
    assert first_beat(switch_lead=0.0).at == 0.0


def test_switch_lead_is_checked_and_a_heartbeat_instant_must_follow_its_sending(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="switch_lead"):
        load(None, {"mm": {"switch_lead": -1}})
    with pytest.raises(ConfigError, match="clock_tolerance"):
        load(None, {"nm": {"clock_tolerance": 5}})
    with pytest.raises(p.ProtocolError, match="at:"):
        p.Heartbeat(epoch="e", seq=1, row=0, sent=T0, slice=0.1, at=T0 - 1)


def test_late_and_skewed_counts_reach_storm_nodes(tmp_path: Path) -> None:
    ctl = Controller(MemoryStore(), MMConfig(), "mm-1", nonce=seeded_nonces(0))
    ctl.recover(T0)
    ctl.handle(p.RegisterNode(node="n0", pes=1, nm_epoch="nm-1"), T0, FromNode("n0"))
    status = p.NodeStatus(node="n0", nm_epoch="nm-1", mm_epoch="mm-1", late_beats=3, skewed_beats=1)
    ctl.handle(status, T0 + 1, FromNode("n0"))
    (reply,) = ctl.handle(p.ListNodes(), T0 + 1, Account(0, 0, "root"))
    assert isinstance(reply.message, p.NodeList)
    info = reply.message.nodes[0]
    assert (info.late_beats, info.skewed_beats) == (3, 1)


def test_trace_lines_of_an_older_node_manager_still_parse() -> None:
    old = TraceLine.parse("7 1 1.500000 1.500400 1.503000 2\n")
    assert old == TraceLine(7, 1, 1.5, 1.5004, 1.503, 2) and old.switched == 1.5004
    new = TraceLine(7, 1, 1.5, 1.5004, 1.503, 2, 1.505, 1.505)
    assert TraceLine.parse(new.format()) == new and new.switched == 1.505
