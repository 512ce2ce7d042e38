"""FCS, table-driven: the phase diagram of Fig. 2, Algorithm 2's bookkeeping, Algorithm 1 per PE."""

from __future__ import annotations

import pytest

from storm.mm.protocol import FcsParameters
from storm.nm.fcs import (
    Decision,
    Klass,
    Measurement,
    Process,
    ProcessClass,
    classify,
    context_switch,
    end_of_slot,
)

C = FcsParameters()  # Table 2: CS_thresh 2 ms, F_thresh 1.7 ms, DC_thresh 1 s, cslots_min 20, tslots_max 32K
MS = 1e-3


def per_comm(cpu: float, wait: float, events: int = 1000) -> Measurement:
    """A process that computes ``cpu`` and waits ``wait`` seconds per communication."""
    return Measurement(t_cpu=cpu * events, t_comm=wait * events, c_comm=events)


@pytest.mark.parametrize(
    ("cpu", "wait", "expected", "where"),
    [
        (1.0 * MS, 0.05 * MS, Klass.CS, "fine-grained and coscheduled: the corner near the origin"),
        (1.9 * MS, 0.09 * MS, Klass.CS, "just under CS_thresh"),
        (1.0 * MS, 1.0 * MS, Klass.F, "g exactly CS_thresh is not below it"),
        (1.0 * MS, 1.05 * MS, Klass.F, "g just over CS_thresh, little CPU per communication: frustrated"),
        (1.0 * MS, 4.0 * MS, Klass.F, "the fast half of a 2:1 imbalanced 1 ms job waits a lot"),
        (1.69 * MS, 10 * MS, Klass.F, "CPU per communication just under F_thresh"),
        (1.71 * MS, 10 * MS, Klass.DC, "CPU per communication just over F_thresh"),
        (4.0 * MS, 1.0 * MS, Klass.DC, "the slow half of an imbalanced job: it computes, hardly waits"),
        (1.0 * MS, 998 * MS, Klass.F, "under DC_thresh, however long the wait"),
        (1.0 * MS, 1000 * MS, Klass.DC, "g = 1.001 s: coarse"),
        (2.0, 0.01, Klass.DC, "a 2 s granularity job"),
    ],
)
def test_phase_diagram(cpu: float, wait: float, expected: Klass, where: str) -> None:
    assert classify(per_comm(cpu, wait), C) is expected, where


def test_a_process_that_never_communicates_is_dc() -> None:
    assert classify(Measurement(t_cpu=5.0, t_comm=0.0, c_comm=0), C) is Klass.DC
    state = ProcessClass(cslots=C.cslots_min - 1, tslots=40)
    assert end_of_slot(state, None, C) == (ProcessClass(klass=Klass.DC, cslots=0, tslots=41), True)


def test_no_verdict_before_cslots_min_slots_in_a_class() -> None:
    coarse = per_comm(2.0, 0.0)
    state = ProcessClass()
    for slot in range(1, C.cslots_min):
        state, restart = end_of_slot(state, coarse, C)
        assert (state.klass, state.cslots, restart) == (Klass.CS, slot, False)
    state, restart = end_of_slot(state, coarse, C)  # the 20th slot in CS: now it is evaluated
    assert (state.klass, state.cslots, state.tslots, restart) == (Klass.DC, 0, C.cslots_min, True)


def test_staying_in_a_class_keeps_counting_and_keeps_measuring() -> None:
    fine = per_comm(1 * MS, 0.1 * MS)
    state = ProcessClass(cslots=C.cslots_min + 5, tslots=100)
    assert end_of_slot(state, fine, C) == (
        ProcessClass(klass=Klass.CS, cslots=C.cslots_min + 6, tslots=101),
        False,
    )


def test_the_job_wide_reset_forces_cs_whatever_the_measurement() -> None:
    state = ProcessClass(klass=Klass.DC, cslots=3, tslots=C.tslots_max - 1)
    new, restart = end_of_slot(state, per_comm(2.0, 0.0), C, job_reset=True)
    assert (new.klass, new.cslots, new.tslots, restart) == (Klass.CS, 0, C.tslots_max, True)


def test_constants_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        FcsParameters(cs_thresh=0.002, f_thresh=0.003)
    with pytest.raises(ValueError):
        FcsParameters(cs_thresh=2.0, dc_thresh=1.0)


# ---------------------------------------------------------------------------------------------- Algorithm 1


def procs(*specs: tuple[int, int, Klass]) -> list[Process]:
    """(job, row, class) of processes sharing PE 0, each job's rank 0."""
    return [Process(key=(job, 0), pe=0, row=row, klass=klass) for job, row, klass in specs]


def test_a_cs_process_runs_alone_in_its_slot_and_polls() -> None:
    decisions = context_switch(procs((1, 0, Klass.CS), (2, 1, Klass.DC), (3, 2, Klass.F)), active_row=0)
    # The stopped ones keep their spin-block wait mode, so that it does not flip at every slot.
    stopped = Decision(run=False, spin_block=True)
    assert decisions == {(1, 0): Decision(run=True), (2, 0): stopped, (3, 0): stopped}


def test_outside_cs_slots_dc_and_f_share_the_pe_and_the_f_of_the_slot_has_priority() -> None:
    decisions = context_switch(procs((1, 0, Klass.CS), (2, 1, Klass.F), (3, 2, Klass.DC), (4, 3, Klass.F)), 1)
    assert decisions[(1, 0)] == Decision(run=False)  # CS never runs outside its slot
    assert decisions[(2, 0)] == Decision(run=True, spin_block=True, prioritized=True)
    assert decisions[(3, 0)] == Decision(run=True, spin_block=True)
    assert decisions[(4, 0)] == Decision(run=True, spin_block=True)  # an F, but not its slot


def test_an_empty_cell_is_filled_by_dc_and_f_processes() -> None:
    decisions = context_switch(procs((1, 0, Klass.CS), (2, 1, Klass.DC)), active_row=5)
    assert decisions == {(1, 0): Decision(run=False), (2, 0): Decision(run=True, spin_block=True)}


def test_pes_are_decided_independently() -> None:
    both = [
        Process(key=(1, 0), pe=0, row=0, klass=Klass.CS),
        Process(key=(2, 0), pe=0, row=1, klass=Klass.DC),
        Process(key=(1, 1), pe=1, row=0, klass=Klass.DC),  # the same job, classified apart on another PE
        Process(key=(2, 1), pe=1, row=1, klass=Klass.DC),
    ]
    decisions = context_switch(both, active_row=0)
    assert [decisions[k].run for k in [(1, 0), (2, 0), (1, 1), (2, 1)]] == [True, False, True, True]


def test_without_heartbeats_everything_runs_cs_polling_others_spin_blocking() -> None:
    decisions = context_switch(procs((1, 0, Klass.CS), (2, 1, Klass.DC)), active_row=None)
    assert decisions == {(1, 0): Decision(run=True), (2, 0): Decision(run=True, spin_block=True)}


@pytest.mark.parametrize(("before", "after"), [(10, 12), (11, 12), (12, 12), (22, 24), (0, 12)])
def test_at_a_reset_a_process_takes_the_mms_count_of_the_jobs_slots(before: int, after: int) -> None:
    """The node may have counted one slot more or less than the MM (a launch across a heartbeat)."""
    small = FcsParameters(tslots_max=12)
    state = ProcessClass(klass=Klass.F, cslots=5, tslots=before)
    new, _ = end_of_slot(state, None, small, job_reset=True)
    assert (new.klass, new.tslots) == (Klass.CS, after)


def test_with_f_priority_always_every_f_outranks_the_dc_processes_of_its_pe() -> None:
    specs = procs((1, 0, Klass.CS), (2, 1, Klass.F), (3, 2, Klass.DC), (4, 3, Klass.F))
    decisions = context_switch(specs, 2, f_always=True)  # the DC process's own slot
    assert decisions[(2, 0)].prioritized and decisions[(4, 0)].prioritized
    assert not decisions[(3, 0)].prioritized and decisions[(3, 0)].run
    assert context_switch(specs, 0, f_always=True)[(2, 0)] == Decision(run=False, spin_block=True)  # CS slot
