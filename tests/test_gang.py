"""Heartbeat handling in the node manager: sequence numbers, epochs, timeouts."""

from __future__ import annotations

from storm.mm.protocol import Heartbeat
from storm.nm.gang import GangFollower


def beat(seq: int, row: int, epoch: str = "mm1") -> Heartbeat:
    return Heartbeat(epoch=epoch, seq=seq, row=row, sent=0.0, slice=0.1)


def test_only_newer_heartbeats_of_the_registered_mm_count() -> None:
    follower = GangFollower(timeout=1.0)
    follower.follow("mm1", 0.0)
    assert follower.row is None  # nothing heard yet: everything runs
    assert follower.accept(beat(5, 1), 0.1) and follower.row == 1
    assert not follower.accept(beat(5, 0), 0.2)  # a repeat
    assert not follower.accept(beat(3, 0), 0.2)  # out of order / replayed
    assert not follower.accept(beat(9, 0, epoch="old-mm"), 0.2)  # another MM's
    assert follower.row == 1 and follower.seq == 5
    assert follower.accept(beat(6, 0), 0.3) and follower.row == 0


def test_a_new_mm_restarts_the_sequence() -> None:
    follower = GangFollower(timeout=1.0)
    follower.follow("mm1", 0.0)
    follower.accept(beat(100, 1), 0.1)
    follower.follow("mm1", 0.2)  # registered again with the same MM: keep the sequence
    assert not follower.accept(beat(50, 0), 0.3)
    follower.follow("mm2", 0.4)  # the MM restarted
    assert follower.row is None
    assert follower.accept(beat(1, 0, epoch="mm2"), 0.5) and follower.row == 0


def test_silence_lets_every_job_run_once() -> None:
    follower = GangFollower(timeout=1.0)
    follower.follow("mm1", 0.0)
    follower.accept(beat(1, 1), 0.0)
    assert not follower.expired(0.9)
    assert follower.expired(1.1) and follower.row is None
    assert not follower.expired(5.0)  # reported once
    assert follower.accept(beat(2, 0), 5.1) and follower.row == 0  # heartbeats came back
