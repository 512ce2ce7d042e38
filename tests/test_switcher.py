"""The context switch per policy, the OS seam faked: what is signalled, how ranks wait, who has priority."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from storm.mm.protocol import FcsParameters, Policy
from storm.nm.fcs import Klass
from storm.nm.processes import LinuxProcesses
from storm.nm.switcher import ContextSwitcher
from tests.fakes import FakeProcesses

BACKGROUND_NICE = FcsParameters.background_nice


def node(policy: str) -> tuple[ContextSwitcher, FakeProcesses, list[tuple[int, int, bool]]]:
    """Two jobs sharing PE 0 of this node: job 1 (pid 100) in row 0, job 2 (pid 200) in row 1."""
    fake, waits = FakeProcesses(), []
    switcher = ContextSwitcher(fake, set_wait=lambda job, index, spin: waits.append((job, index, spin)))
    switcher.policy = Policy(policy)
    switcher.add(1, [(0, 0)], row=0)
    switcher.add(2, [(0, 0)], row=1)
    return switcher, fake, waits


def run(switcher: ContextSwitcher, fake: FakeProcesses, active: int | None) -> list[tuple[int, int]]:
    fake.signals.clear()
    switcher.switch(active, now=0.0)
    return list(fake.signals)


def test_gang_stops_before_it_continues_and_each_job_in_its_row() -> None:
    switcher, fake, waits = node("gang")
    switcher.started(1, {0: 100})
    switcher.started(2, {0: 200})
    assert run(switcher, fake, 0) == [(200, signal.SIGSTOP)]
    assert run(switcher, fake, 1) == [(100, signal.SIGSTOP), (200, signal.SIGCONT)]
    assert run(switcher, fake, 1) == []  # nothing to change
    assert run(switcher, fake, None) == [(100, signal.SIGCONT)]  # no heartbeats: everything runs
    assert waits == [] and fake.nice == {}  # gang never touches waits or priorities
    assert switcher.switches == 3


def test_a_rank_that_starts_in_another_rows_slice_starts_stopped() -> None:
    switcher, fake, _ = node("gang")
    run(switcher, fake, 0)
    switcher.started(2, {0: 200})
    assert fake.signals == [(200, signal.SIGSTOP)]
    switcher.rank_gone(2, 0)
    assert run(switcher, fake, 1) == []  # its process group may be someone else's now


def test_spin_block_policy_lets_everything_run_and_spin_block() -> None:
    switcher, fake, waits = node("sb")
    switcher.started(1, {0: 100})
    switcher.started(2, {0: 200})
    assert run(switcher, fake, None) == []
    assert waits == [(1, 0, True), (2, 0, True)]


def test_fcs_gives_a_cs_process_its_slot_alone_and_lets_dc_fill_the_others() -> None:
    switcher, fake, waits = node("fcs")
    switcher.started(1, {0: 100})
    switcher.started(2, {0: 200})
    switcher.set_class((2, 0), Klass.DC)  # job 1 stays CS (the default)
    assert run(switcher, fake, 0) == [(200, signal.SIGSTOP)]  # CS alone, polling
    assert run(switcher, fake, 1) == [(100, signal.SIGSTOP), (200, signal.SIGCONT)]
    assert (2, 0, True) in waits and (1, 0, True) not in waits


def test_fcs_prioritizes_the_f_process_of_the_slot_over_the_dc_sharing_its_pe() -> None:
    """The paper's rule, [fcs] f_priority = "slot" (storm's default is "always": test_fcs.py)."""
    switcher, fake, _ = node("fcs")
    switcher.f_priority = "slot"
    switcher.started(1, {0: 100})
    switcher.started(2, {0: 200})
    switcher.set_class((1, 0), Klass.F)
    switcher.set_class((2, 0), Klass.DC)
    run(switcher, fake, 0)
    assert fake.nice == {200: BACKGROUND_NICE}  # job 1 is F in its own slot; DC job 2 yields to it
    assert fake.group_nice == {200: BACKGROUND_NICE}  # and so does job 2's session on this node
    run(switcher, fake, 1)
    assert fake.nice == {200: 0} and fake.group_nice == {200: 0}  # job 2's slot: nobody is favoured
    assert 100 not in fake.stopped and 200 not in fake.stopped


def test_each_ranks_session_yields_as_the_rank_does() -> None:
    """Job 2 has a DC rank on PE 0 beside job 1's F rank, and an F rank of its own slot on PE 1: each rank
    leads a session (an autogroup) of its own, which yields only if its rank does."""
    fake = FakeProcesses()
    switcher = ContextSwitcher(fake)
    switcher.policy = Policy.FCS
    switcher.add(1, [(0, 0)], row=0)
    switcher.add(2, [(0, 0), (1, 1)], row=0)
    switcher.started(1, {0: 100})
    switcher.started(2, {0: 200, 1: 201})
    for key, klass in {(1, 0): Klass.F, (2, 0): Klass.DC, (2, 1): Klass.F}.items():
        switcher.set_class(key, klass)
    run(switcher, fake, 0)
    assert fake.nice == {200: BACKGROUND_NICE}
    assert fake.group_nice == {200: BACKGROUND_NICE}  # rank 1 of job 2 (pid 201) keeps priority on PE 1


def test_the_kernel_takes_a_sessions_nice() -> None:
    """The real seam: a process in a session of its own gets the autogroup nice asked for."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroups (CONFIG_SCHED_AUTOGROUP)")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             start_new_session=True)  # fmt: skip
    try:
        LinuxProcesses().set_group_nice(child.pid, 7)
        with open(f"/proc/{child.pid}/autogroup") as f:
            assert f.read().split()[-1] == "7"
    finally:
        child.communicate(b"")


def test_a_job_starting_beside_an_f_process_with_priority_yields_at_once() -> None:
    """Job 2's rank starts on PE 0 during job 1's slot, where job 1's F process has priority: it must get the
    background nice when it starts, not at the next heartbeat."""
    switcher, fake, _ = node("fcs")
    switcher.started(1, {0: 100})
    switcher.set_class((1, 0), Klass.F)
    switcher.set_class((2, 0), Klass.DC)
    run(switcher, fake, 0)
    switcher.started(2, {0: 200})
    assert fake.nice == {200: BACKGROUND_NICE} and fake.group_nice == {200: BACKGROUND_NICE}
    assert 200 not in fake.stopped


def test_the_background_nice_is_the_one_the_mm_sets() -> None:
    """[fcs] background_nice: what a process sharing a PE with a prioritized F process gets."""
    switcher, fake, _ = node("fcs")
    switcher.background_nice = 5
    switcher.started(1, {0: 100})
    switcher.started(2, {0: 200})
    switcher.set_class((1, 0), Klass.F)
    switcher.set_class((2, 0), Klass.DC)
    run(switcher, fake, 0)
    assert fake.nice == {200: 5} and fake.group_nice == {200: 5}
