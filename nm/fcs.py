"""Flexible CoScheduling: classify each process (Algorithm 2), decide each PE's context switch (Algorithm 1).

Frachtenberg, Feitelson, Petrini and Fernandez, IEEE TPDS 2005, section 2. Every process is classified on
its own, at the end of each of its assigned time slots, from what mpihook measured since its last reset:

- CS (coscheduling): fine-grained, it needs its peers running when it runs: g < CS_thresh;
- F (frustrated): it should be CS, but load imbalance makes it wait for communication: g < DC_thresh and
  the average CPU time per communication T_cpu < F_thresh;
- DC (don't care): coarse-grained, it can run whenever.

A process is evaluated only after ``cslots_min`` slots in its current class, so that a class has time to
show; every ``tslots_max`` assigned slots it is forced back to CS, with the whole job in the same slot (the
MM announces that reset in the heartbeat, so every node does it in the same slot), so a job whose behaviour
changed gets a fresh look. Measurements restart on every class change and on that reset. New jobs start as
CS, which under FCS means plain gang scheduling until they have shown otherwise.

Scheduling, per PE and time slot: a CS process in the active row runs alone, busy-polling in its blocking
calls. Otherwise every DC and F process of the PE may run (the OS shares the CPU among them) with spin-block
waits, and an F process whose slot it is gets priority. CS processes never run outside their own slot.

Pure: no I/O; the node manager measures and signals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from storm.mm.protocol import FcsParameters, Klass, Policy

__all__ = ["Klass"]  # defined with the wire (mm/protocol/records.py); the node's modules import it from here


@dataclass(frozen=True)
class Measurement:
    """What mpihook measured since the last reset (Table 1): T_cpu, T_comm in seconds, C_comm events."""

    t_cpu: float
    t_comm: float
    c_comm: int

    @property
    def cpu_per_comm(self) -> float:
        return self.t_cpu / self.c_comm if self.c_comm else float("inf")

    @property
    def granularity(self) -> float:
        """g = T_cpu/C_comm + T_comm/C_comm: the average length of one compute-and-communicate step."""
        return (self.t_cpu + self.t_comm) / self.c_comm if self.c_comm else float("inf")


@dataclass(frozen=True)
class ProcessClass:
    klass: Klass = Klass.CS
    cslots: int = 0  # assigned slots in the current class
    tslots: int = 0  # assigned slots since the process started


def classify(measured: Measurement, constants: FcsParameters) -> Klass:
    """The class a measurement calls for (Algorithm 2 without its bookkeeping): Fig. 2's phase diagram."""
    g = measured.granularity
    if g < constants.cs_thresh:
        return Klass.CS
    if g < constants.dc_thresh and measured.cpu_per_comm < constants.f_thresh:
        return Klass.F
    return Klass.DC


def judged(state: ProcessClass, constants: FcsParameters, *, job_reset: bool = False) -> bool:
    """Whether :func:`end_of_slot` will look at this slot's measurement: not before the process has had
    its ``cslots_min`` slots in its class, nor at a job reset. A node skips measuring the others (a
    measurement costs a read of the kernel's CPU time)."""
    return not job_reset and state.cslots + 1 >= constants.cslots_min


def end_of_slot(
    state: ProcessClass, measured: Measurement | None, constants: FcsParameters, *, job_reset: bool = False
) -> tuple[ProcessClass, bool]:
    """Algorithm 2, run for a process that just finished its assigned time slot.

    ``job_reset`` is the forced return to CS of the whole job (tslots reached a multiple of tslots_max; the
    MM says so in the heartbeat so that all of the job's processes do it together). ``measured`` is None for
    a process that never entered MPI through the hook: it does not communicate, so it is DC once it has had
    its ``cslots_min`` slots. Returns the new state and whether measurements must restart.

    The MM's count of the job's slots decides the reset; a node's count of a process's slots can be one off
    it (a launch that reached the node just across a heartbeat from the MM's placement), so at a reset the
    process takes the MM's count, the nearest multiple of tslots_max.
    """
    # Built directly rather than with dataclasses.replace: this runs for every process at every slot end.
    state = ProcessClass(state.klass, state.cslots + 1, state.tslots + 1)
    if job_reset:
        tslots = max(1, round(state.tslots / constants.tslots_max)) * constants.tslots_max
        return ProcessClass(Klass.CS, 0, tslots), True
    if state.cslots < constants.cslots_min:
        return state, False
    new = Klass.DC if measured is None else classify(measured, constants)
    if new is state.klass:
        return state, False
    return ProcessClass(new, 0, state.tslots), True


# ---------------------------------------------------------------------------------------------------
# Algorithm 1: the context switch, per processing element


@dataclass(frozen=True)
class Process:
    """One rank as the switch sees it: which PE it is pinned to, which row it was assigned, its class."""

    key: tuple[int, int]  # (job id, rank)
    pe: int
    row: int
    klass: Klass


@dataclass(frozen=True)
class Decision:
    run: bool
    spin_block: bool = False  # its wait mode: spin-block, or busy polling
    prioritized: bool = False


# The eight decisions there are, made once: a switch decides for every process of the node every slice.
_DECISIONS = {
    (run, spin, prioritized): Decision(run, spin, prioritized)
    for run in (False, True) for spin in (False, True) for prioritized in (False, True)
}  # fmt: skip


def _decision(run: bool, spin_block: bool = False, prioritized: bool = False) -> Decision:
    return _DECISIONS[run, spin_block, prioritized]


def context_switch(
    processes: Iterable[Process], active_row: int | None, *, f_always: bool = False
) -> dict[tuple[int, int], Decision]:
    """Algorithm 1 for every PE of a node; ``active_row`` None lets every process run (no heartbeats).

    ``f_always``: every F process has priority over the PE's DC processes, not only in its own slot.
    """
    by_pe: dict[int, list[Process]] = {}
    for proc in processes:
        by_pe.setdefault(proc.pe, []).append(proc)
    decisions: dict[tuple[int, int], Decision] = {}
    for procs in by_pe.values():
        if active_row is None:
            for proc in procs:
                decisions[proc.key] = _decision(True, proc.klass is not Klass.CS)
            continue
        if any(p.klass is Klass.CS and p.row == active_row for p in procs):
            # A CS process gets the PE to itself for its whole slot, polling: nothing else may disturb it.
            # The others keep their class's wait mode while stopped, rather than flip it every slot.
            for proc in procs:
                decisions[proc.key] = _decision(proc.row == active_row, proc.klass is not Klass.CS)
            continue
        for proc in procs:
            flexible = proc.klass is not Klass.CS  # DC and F fill the PE; CS only ever runs in its own slot
            decisions[proc.key] = _decision(
                flexible, flexible, proc.klass is Klass.F and (f_always or proc.row == active_row)
            )
    return decisions


def decide(
    policy: Policy, processes: Iterable[Process], active_row: int | None, *, f_always: bool = False
) -> dict[tuple[int, int], Decision]:
    """The context switch of a node under every policy, for ``active_row`` (None: no heartbeats, all run).

    - batch: every rank runs and busy-polls (MPICH's own way);
    - gang: only the active row's ranks run, the others are stopped; all poll;
    - sb (spin-block, implicit coscheduling): every rank runs and spin-blocks in blocking calls;
    - fcs: Algorithm 1 (:func:`context_switch`), from each process's class.
    """
    if policy.classifies:
        return context_switch(processes, active_row, f_always=f_always)
    spin = policy.spin_block
    gang = policy.cycles and active_row is not None
    return {proc.key: _decision(not gang or proc.row == active_row, spin) for proc in processes}
