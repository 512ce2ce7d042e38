"""Preemption on a node (nm/node.py, nm/switcher.py): suspend_job and resume_job stop and continue a job's
ranks through the context switch, and nothing else continues them: not a heartbeat, not the fallback when
heartbeats stop, not the NM leaving or a new one re-adopting the job. Driven directly, the OS faked."""

from __future__ import annotations

import signal
from pathlib import Path

from storm.mm import protocol as p
from storm.nm.node import Node
from tests.fakes import FakeMeasurements, FakeProcesses
from tests.test_node import CS_LIKE, T0, beat, make, registered, start


def signalled(fake: FakeProcesses, pids: dict[int, int], sig: int) -> bool:
    """Every one of the job's ranks got ``sig`` through its process group."""
    return {pid for pid, s in fake.signals if s == sig} >= set(pids.values())


def test_a_suspended_job_stays_stopped_through_heartbeats_and_their_absence_until_resumed(
    tmp_path: Path,
) -> None:
    node, fake, _ = make(tmp_path, heartbeat_timeout=1.0)
    node.from_mm(registered("gang"), T0)
    low, other = start(node, fake, 7, row=0), start(node, fake, 8, row=1)
    node.heartbeat(beat(1, 0), T0, T0)
    assert fake.stopped == set(other.values())
    out = node.from_mm(p.SuspendJob(job_id=7, by=9), T0 + 0.05, 1e9)
    assert out.check is not None and set(out.check.expected) == set(low.values())
    assert fake.stopped == set(low.values()) | set(other.values())
    node.heartbeat(beat(2, 1), T0 + 0.1, T0 + 0.1)  # the other row runs
    node.heartbeat(beat(3, 0), T0 + 0.2, T0 + 0.2)  # its own row's slot: it stays stopped
    assert fake.stopped >= set(low.values())
    node.tick(T0 + 2.0, T0 + 2.0)  # heartbeats stopped: every job runs, but not a suspended one
    assert fake.stopped == set(low.values())
    (status, *_) = node.reports()
    assert isinstance(status, p.NodeStatus) and (status.jobs, status.suspended) == ((7, 8), (7,))
    assert node.from_mm(p.SuspendJob(job_id=7, by=9), T0 + 2.1).check is None  # said again: nothing to do
    out = node.from_mm(p.ResumeJob(job_id=7, row=1), T0 + 2.2, 1e9 + 1)
    assert out.check is not None and fake.stopped == set()  # no heartbeat now: everything runs
    assert node.switcher.units[(7, 0)].row == 1 and node.switcher.suspended == frozenset()
    node.heartbeat(beat(4, 0), T0 + 2.3, T0 + 2.3)
    assert fake.stopped == set(low.values()) | set(other.values())  # row 1 now holds both jobs
    node.heartbeat(beat(5, 1), T0 + 2.4, T0 + 2.4)
    assert fake.stopped == set()


def test_registration_names_the_suspended_jobs_and_a_kill_continues_one_to_end_it(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    node.from_mm(registered("batch"), T0)
    low, other = start(node, fake, 7), start(node, fake, 8)
    node.from_mm(registered("batch", suspended=(7, 8)), T0 + 1)
    assert fake.stopped == set(low.values()) | set(other.values())
    node.from_mm(registered("batch", suspended=(8,)), T0 + 2)  # a new MM: 7 was resumed meanwhile
    assert fake.stopped == set(other.values())
    node.from_mm(p.KillJob(job_id=8, reason="cancelled"), T0 + 3)
    assert fake.stopped == set() and node.switcher.suspended == frozenset()
    assert {pid for pid, s in fake.signals if s == signal.SIGTERM} >= set(other.values())


def test_fcs_gives_a_suspended_job_no_slot_and_it_claims_no_pe(tmp_path: Path) -> None:
    node, fake, measured = make(tmp_path)
    node.from_mm(registered("fcs"), T0)
    low, other = start(node, fake, 7, row=0), start(node, fake, 8, row=0)
    measured.measured.update(dict.fromkeys([(7, 0), (7, 1), (8, 0), (8, 1)], CS_LIKE))
    node.from_mm(p.SuspendJob(job_id=7, by=9), T0)
    for seq in range(1, 6):
        node.heartbeat(beat(seq, 0), T0 + seq / 10, 1e9 + seq)
    assert node.classifier.state((7, 0)).tslots == 0 and node.classifier.state((8, 0)).tslots == 4
    assert fake.stopped == set(low.values())  # job 8 (CS, its row active) runs; job 7 holds nothing back
    assert not set(other.values()) & fake.stopped


def test_a_leaving_nm_does_not_continue_a_suspended_job_nor_does_the_next_one_that_readopts_it(
    tmp_path: Path,
) -> None:
    node, fake, _ = make(tmp_path)
    node.from_mm(registered("batch"), T0)
    low, other = start(node, fake, 7), start(node, fake, 8)
    node.from_mm(p.SuspendJob(job_id=7, by=9), T0)
    fake.signals.clear()
    assert node.local.leave() == 2
    assert signalled(fake, other, signal.SIGCONT) and not {pid for pid, _ in fake.signals} & set(low.values())
    again = Node(
        node.config, "n0", [0, 1], tmp_path, epoch="nm-2", processes=fake, measurements=FakeMeasurements(),
        cluster="c1",
    )  # fmt: skip
    fake.signals.clear()
    assert {job.job_id for job in again.recover().watch} == {7, 8}
    assert again.jobs[7].suspended and again.switcher.suspended == frozenset({7})
    assert not any(s == signal.SIGCONT and pid in low.values() for pid, s in fake.signals)
    assert fake.stopped == set(low.values())
    again.from_mm(registered("batch"), T0 + 1)  # the MM resumed it meanwhile
    assert fake.stopped == set() and not again.jobs[7].suspended
