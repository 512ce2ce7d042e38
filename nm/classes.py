"""FCS on one node: each process's class, reclassified at the end of each of its assigned time slots.

At every heartbeat the processes of the row that just ran have finished an assigned slot: each is evaluated
(Algorithm 2, nm/fcs.py) from what the monitor measured since its last reset, the monitor is reset when the
class changes (or when the MM announces the job's periodic reset), and the switcher learns the new class.
Class changes are kept until the job's next report, which the node core sends at once (nm/node.py) to the
MM's durable timeline.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace

from storm.mm.protocol import ClassChange, FcsParameters
from storm.nm.fcs import ProcessClass, end_of_slot, judged
from storm.nm.monitor import Gone, Measurements
from storm.nm.switcher import ContextSwitcher, Key

log = logging.getLogger("storm.nm")


class Classifier:
    def __init__(self, node: str, monitor: Measurements, switcher: ContextSwitcher) -> None:
        self.node = node
        self.monitor = monitor
        self.switcher = switcher
        self.constants = FcsParameters()  # Table 2, until the MM says otherwise
        self.states: dict[Key, ProcessClass] = {}
        self.changes: list[ClassChange] = []
        self._present: set[Key] = set()  # the processes known when the current slot began

    def state(self, key: Key) -> ProcessClass:
        return self.states.get(key, ProcessClass())

    def end_of_slot(self, row: int | None, resets: Collection[int] = (), *, now: float) -> set[int]:
        """The processes of ``row`` have just finished an assigned slot (at ``now``, wall-clock seconds):
        evaluate each of them. Returns the jobs with a process whose class changed."""
        present, self._present = self._present, set(self.switcher.units)
        changed: set[int] = set()
        if row is None:
            return changed
        for key, unit in list(self.switcher.units.items()):
            if unit.row != row or key not in present or unit.job_id in self.switcher.suspended:
                # Not its slot, or it was not here when the slot began, or preemption holds it stopped and out
                # of the matrix: the MM counts no slot for it either.
                continue
            if not unit.pid:
                # Not started yet (or gone): the slot counts, as the MM counts it, but there is nothing to
                # judge, and its class-time starts when it runs.
                old = self.state(key)
                self.states[key] = replace(old, tslots=old.tslots + 1)
                continue
            old = self.state(key)
            reset = unit.job_id in resets
            # None for a process that has not entered MPI through the hook: it does not communicate.
            measured = (
                self.monitor.measure_rank(unit.job_id, unit.index)
                if judged(old, self.constants, job_reset=reset)
                else None
            )
            if isinstance(measured, Gone):
                # Left MPI (nm/monitor.py's Gone): nothing to judge. The slot counts; the class stays.
                self.states[key] = replace(old, tslots=old.tslots + 1)
                continue
            new, restart = end_of_slot(old, measured, self.constants, job_reset=reset)
            self.states[key] = new
            if restart:
                self.monitor.reset_rank(unit.job_id, unit.index)
            if new.klass is not old.klass:
                self.switcher.set_class(key, new.klass)
                change = ClassChange(
                    job_id=unit.job_id,
                    rank=unit.rank,
                    node=self.node,
                    time=now,
                    old=old.klass.value,
                    new=new.klass.value,
                    tslots=new.tslots,
                )
                self.changes.append(change)
                changed.add(unit.job_id)
                log.debug("job %d rank %d: %s -> %s", unit.job_id, unit.rank, old.klass, new.klass)
        return changed

    def forget(self, job_id: int) -> None:
        for key in [k for k in self.states if k[0] == job_id]:
            del self.states[key]

    def take_changes(self, job_id: int) -> tuple[ClassChange, ...]:
        mine = tuple(c for c in self.changes if c.job_id == job_id)
        self.changes = [c for c in self.changes if c.job_id != job_id]
        return mine
