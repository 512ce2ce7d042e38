"""FCS on one node: each process evaluated at the end of its own slot, from real mpihook records."""

from __future__ import annotations

from storm.mm.protocol import FcsParameters, Policy
from storm.mpihook.stats import ACTIVE, FINALIZED, HookSegment
from storm.nm.classes import Classifier
from storm.nm.fcs import Klass, ProcessClass
from storm.nm.switcher import ContextSwitcher
from tests.fakes import FakeProcesses
from tests.test_monitor import MS, hook_writes, monitor_of


def classifier_of(seg: HookSegment) -> tuple[Classifier, dict[int, int]]:
    """Job 5's ranks 0 and 1 on PEs 0 and 1, in row 0; cslots_min 2."""
    monitor, cpu = monitor_of(seg)
    switcher = ContextSwitcher(FakeProcesses())
    switcher.policy = Policy.FCS
    switcher.add(5, [(0, 0), (1, 1)], row=0)
    switcher.started(5, {0: 100, 1: 101})
    classifier = Classifier("n1", monitor, switcher)
    classifier.constants = FcsParameters(cslots_min=2)
    classifier.end_of_slot(None, now=0.0)  # the heartbeat that begins their first slot (no row ran before it)
    return classifier, cpu.cpu


def test_each_process_is_classified_after_cslots_min_of_its_slots(segment: HookSegment) -> None:
    classifier, cpu = classifier_of(segment)
    # Rank 0: 1000 steps of 0.8 ms computing + 0.2 ms polling (g = 1 ms: CS); rank 1: one step of 2 s (DC).
    hook_writes(segment, 0, events=1000, comm=200 * MS)
    hook_writes(segment, 1, events=1, comm=0)
    classifier.monitor.sample()
    cpu[100], cpu[101] = 1000 * MS, 2000 * MS
    classifier.end_of_slot(0, now=0.0)
    assert classifier.changes == []  # one slot is not enough to judge
    classifier.end_of_slot(1, now=0.0)  # another row's slot: not theirs, not counted
    assert classifier.state((5, 1)).tslots == 1
    classifier.end_of_slot(0, now=0.0)
    (change,) = classifier.take_changes(5)
    assert (change.rank, change.old, change.new, change.tslots) == (1, "CS", "DC", 2)
    assert classifier.take_changes(5) == ()  # reported once
    assert classifier.switcher.classes == {(5, 1): Klass.DC}
    assert classifier.state((5, 0)).klass is Klass.CS and classifier.state((5, 0)).cslots == 2
    # The class change restarted rank 1's measurements, not rank 0's.
    assert classifier.monitor.measure_rank(5, 1).c_comm == 0  # type: ignore[union-attr]
    assert classifier.monitor.measure_rank(5, 0).c_comm == 1000  # type: ignore[union-attr]


def test_the_job_wide_reset_returns_every_process_to_cs_in_the_same_slot(segment: HookSegment) -> None:
    classifier, cpu = classifier_of(segment)
    hook_writes(segment, 0, events=1, comm=0)
    hook_writes(segment, 1, events=1, comm=0)
    classifier.monitor.sample()
    cpu[100] = cpu[101] = 3000 * MS
    for _ in range(2):
        classifier.end_of_slot(0, now=0.0)
    assert set(classifier.switcher.classes.values()) == {Klass.DC}
    classifier.take_changes(5)
    classifier.end_of_slot(0, resets=(5,), now=0.0)
    assert set(classifier.switcher.classes.values()) == {Klass.CS}
    assert [(c.rank, c.old, c.new) for c in classifier.take_changes(5)] == [(0, "DC", "CS"), (1, "DC", "CS")]
    assert classifier.state((5, 0)) == classifier.state((5, 1))  # same class, cslots 0, same tslots


def test_a_process_that_never_enters_mpi_is_dc_once_it_has_had_its_slots(segment: HookSegment) -> None:
    classifier, cpu = classifier_of(segment)
    cpu[100] = cpu[101] = 500 * MS  # no record: not an MPI program, or MPI not under the hook
    classifier.end_of_slot(0, now=0.0)
    classifier.end_of_slot(0, now=0.0)
    assert classifier.switcher.classes == {(5, 0): Klass.DC, (5, 1): Klass.DC}
    classifier.forget(5)
    assert classifier.state((5, 0)).tslots == 0


def test_a_process_that_ended_before_its_exit_was_reported_keeps_its_class(segment: HookSegment) -> None:
    """A rank's process is gone (no CPU time to read) while the node still counts it: its last slots are not
    taken for a process that never entered MPI, which would make a fine-grained job's rank DC at its end."""
    classifier, cpu = classifier_of(segment)
    hook_writes(segment, 0, events=1000, comm=200 * MS)
    hook_writes(segment, 1, events=1000, comm=200 * MS)
    classifier.monitor.sample()
    cpu[100] = 1000 * MS  # rank 1 (pid 101) has ended: /proc has no CPU time for it
    for _ in range(3):
        classifier.end_of_slot(0, now=0.0)
    assert classifier.take_changes(5) == ()  # both stay CS
    assert classifier.state((5, 1)).klass is Klass.CS and classifier.state((5, 1)).tslots == 3
    assert classifier.state((5, 0)).tslots == 3


def test_a_process_past_mpi_finalize_keeps_its_class_while_it_runs_on(segment: HookSegment) -> None:
    """After MPI_Finalize a rank may run on (Python's teardown takes tens of milliseconds) and communicates no
    more: a job-wide reset just before would otherwise make its next judgement DC."""
    classifier, cpu = classifier_of(segment)
    hook_writes(segment, 0, events=1000, comm=200 * MS)
    hook_writes(segment, 1, events=1000, comm=200 * MS)
    classifier.monitor.sample()
    cpu[100] = cpu[101] = 1000 * MS
    classifier.end_of_slot(0, resets=(5,), now=0.0)  # measurements restart for both
    hook_writes(segment, 1, events=1000, comm=200 * MS, flags=ACTIVE | FINALIZED)  # no call since
    hook_writes(segment, 0, events=1000, comm=200 * MS)  # rank 0: no call since either, not finalized
    classifier.monitor.sample()
    cpu[100] = cpu[101] = 1500 * MS
    for _ in range(2):
        classifier.end_of_slot(0, now=0.0)
    assert [(c.rank, c.new) for c in classifier.take_changes(5)] == [(0, "DC")]  # rank 1 stays CS
    assert classifier.state((5, 1)).klass is Klass.CS


def test_a_slot_before_the_process_exists_counts_but_is_not_judged(segment: HookSegment) -> None:
    classifier, _ = classifier_of(segment)
    classifier.switcher.rank_gone(5, 0)
    classifier.switcher.rank_gone(5, 1)
    for _ in range(3):
        classifier.end_of_slot(0, now=0.0)
    assert classifier.state((5, 0)) == ProcessClass(klass=Klass.CS, cslots=0, tslots=3)
    assert classifier.changes == []


def test_a_process_that_arrives_mid_slot_counts_from_its_first_whole_slot(segment: HookSegment) -> None:
    monitor, _ = monitor_of(segment)
    switcher = ContextSwitcher(FakeProcesses())
    classifier = Classifier("n1", monitor, switcher)
    classifier.end_of_slot(0, now=0.0)
    switcher.add(5, [(0, 0)], row=0)  # launched during row 0's slot: that slot is not one of its own
    classifier.end_of_slot(0, now=0.0)
    assert classifier.state((5, 0)).tslots == 0
    classifier.end_of_slot(0, now=0.0)
    assert classifier.state((5, 0)).tslots == 1
