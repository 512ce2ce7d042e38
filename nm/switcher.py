"""The context switch on one node: which ranks run, how they wait in MPI, and which one has priority.

Decided per rank, at every heartbeat (and when ranks start), by the policy (:func:`storm.nm.fcs.decide`,
beside Algorithm 1). Without heartbeats (``active`` None) every rank runs, except the ranks of jobs that
preemption suspended (:meth:`ContextSwitcher.set_suspended`): those are stopped whatever the policy, the
heartbeats or their absence say, and take no part in the decisions of the others (under FCS a suspended CS
process does not claim its PE). A rank is stopped or continued
through its process group (which holds whatever it forked); stops go out before continues, so that two ranks
never share a PE on purpose. A process the job spawned (MPI_Comm_spawn) follows the job's rank on its PE: it
runs when that rank runs and has its nice value (under gang scheduling, when the job's row runs); it is not
measured, and waits in MPI as MPICH does (busy polling), since mpihook has no record for it.

Signals are asynchronous: a switch has taken effect when /proc shows every stopped rank in state 'T' and no
continued one in it. :meth:`ContextSwitcher.switch` returns what to check (:class:`SwitchCheck`); the node
manager's daemon polls /proc (nm/switch_check.py) and reports back how long it took, which is recorded for
``storm nodes`` and the benchmarks, which can also ask for one trace line per heartbeat (:class:`TraceLine`).
"""

from __future__ import annotations

import logging
import signal
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from storm.mm.protocol import FcsParameters, Policy
from storm.nm.fcs import Decision, Klass, Process, decide
from storm.nm.processes import Processes

log = logging.getLogger("storm.nm")

SAMPLES = 1000

Key = tuple[int, int]  # (job id, rank)


@dataclass(frozen=True)
class SwitchCheck:
    """A switch whose signals went out at ``begun``: each signalled pid and whether it should now run; the
    heartbeat that asked for it (``seq`` -1: none) was received at ``received`` and named the instant ``at``
    (0: none)."""

    expected: dict[int, bool]
    seq: int
    row: int | None
    sent: float | None
    received: float
    at: float = 0.0
    begun: float = 0.0


class TraceLine(NamedTuple):
    """A line of the heartbeat trace (``[nm] trace``): seq row sent received done ranks at begun (row -1: all
    run). ``at`` is the instant the heartbeat named (0: none), ``begun`` when the switch's signals went out
    (at that instant, or on arrival); a line of an older storm-nm has neither (``switched`` is then its
    ``received``, when it switched). A tuple rather than a frozen dataclass: one is made per node per time
    slice, and a thousand emulated nodes make theirs at the same instant (tools/emulator.py)."""

    seq: int
    row: int
    sent: float
    received: float
    done: float
    ranks: int
    at: float = 0.0
    begun: float = 0.0

    @property
    def switched(self) -> float:
        """When the switch began on the node."""
        return self.begun or self.received

    def format(self) -> str:
        return (
            f"{self.seq} {self.row} {self.sent:.6f} {self.received:.6f} {self.done:.6f} {self.ranks}"
            f" {self.at:.6f} {self.begun:.6f}\n"
        )

    @classmethod
    def parse(cls, line: str) -> TraceLine | None:
        """A line as :meth:`format` (or an older storm-nm) wrote it; None for one still being written."""
        fields = line.split()
        if len(fields) not in (6, 8) or not line.endswith("\n"):
            return None
        seq, row, sent, received, done, ranks, *more = fields
        at, begun = (float(v) for v in more) if more else (0.0, 0.0)
        return cls(int(seq), int(row), float(sent), float(received), float(done), int(ranks), at, begun)


@dataclass
class Unit:
    """One rank of a job on this node."""

    job_id: int
    rank: int
    index: int  # its record in the job's mpihook segment
    pe: int
    row: int
    pid: int = 0  # 0 until the job shell has spawned it, and again once it has ended
    running: bool = True
    spin_block: bool = False
    nice: int = 0


@dataclass
class Follower:
    """A process a job spawned on this node: it follows the job's rank on its PE."""

    job_id: int
    pe: int
    running: bool = True
    nice: int = 0


class ContextSwitcher:
    def __init__(
        self,
        processes: Processes,
        trace: Callable[[TraceLine], object] | None = None,  # takes each trace line
        *,
        on_switch: Callable[[int, int, bool], None] | None = None,
        set_wait: Callable[[int, int, bool], None] | None = None,
    ) -> None:
        self.os = processes
        self.trace = trace
        self.on_switch = on_switch  # told (job id, record index, running) when a rank is stopped or continued
        self.set_wait = set_wait  # asked (job id, record index, spin-block?) to change how a rank waits
        self.units: dict[Key, Unit] = {}
        self.followers: dict[int, Follower] = {}  # pid -> a spawned process
        self._classes: dict[Key, Klass] = {}  # FCS: each process's class (CS until it shows otherwise)
        self._policy = Policy.BATCH
        self._f_priority = FcsParameters.f_priority  # FCS: which F processes have priority (the MM says)
        # FCS: the nice of the processes sharing a PE with a prioritized F process (the MM says)
        self._background_nice = FcsParameters.background_nice
        self.group_nice: dict[int, int] = {}  # pid of a rank or spawned process -> its autogroup's nice
        self.active: int | None = None
        self.durations: deque[float] = deque(maxlen=SAMPLES)  # seconds from arrival to effect
        self.switches = 0
        # A node decides for every rank at every heartbeat, and mostly decides what it decided for that row
        # the last time: the decisions per row are kept until something they depend on changes (the
        # ranks, their rows and classes, the policy), and a switch to the decisions already in force (the
        # same object, with nothing changed in the ranks' state since) signals nothing, so it does nothing.
        self._decided: dict[int | None, dict[Key, Decision]] = {}
        self._applied: dict[Key, Decision] | None = None
        self._suspended: set[int] = set()  # jobs preemption holds stopped

    # ------------------------------------------------------------------------------------------- settings

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self._policy = policy
        self._decisions_changed()

    @property
    def f_priority(self) -> str:
        return self._f_priority

    @f_priority.setter
    def f_priority(self, f_priority: str) -> None:
        self._f_priority = f_priority
        self._decisions_changed()

    @property
    def background_nice(self) -> int:
        return self._background_nice

    @background_nice.setter
    def background_nice(self, nice: int) -> None:
        self._background_nice = nice
        self._applied = None

    @property
    def classes(self) -> Mapping[Key, Klass]:
        """FCS: each process's class (absent: CS, until it shows otherwise). Changed by :meth:`set_class`."""
        return MappingProxyType(self._classes)

    def set_class(self, key: Key, klass: Klass) -> None:
        self._classes[key] = klass
        self._decisions_changed()

    def _decisions_changed(self) -> None:
        self._decided.clear()
        self._applied = None

    @property
    def suspended(self) -> frozenset[int]:
        """The jobs whose ranks preemption holds stopped (changed by :meth:`set_suspended`)."""
        return frozenset(self._suspended)

    def set_suspended(self, job_id: int, suspended: bool) -> bool:
        """Hold the job's ranks stopped (or no longer) from the next switch on; True if that changed."""
        if (job_id in self._suspended) == suspended:
            return False
        if suspended:
            self._suspended.add(job_id)
        else:
            self._suspended.discard(job_id)
        self._decisions_changed()
        return True

    # ------------------------------------------------------------------------------------------- jobs

    def add(self, job_id: int, slots: list[tuple[int, int]], row: int) -> None:
        """A job's local ranks, as (rank, PE) in the order of its slots (= its records in the segment)."""
        for index, (rank, pe) in enumerate(slots):
            self.units[(job_id, rank)] = Unit(job_id=job_id, rank=rank, index=index, pe=pe, row=row)
        self._decisions_changed()

    def set_row(self, job_id: int, row: int) -> None:
        for unit in self._of(job_id):
            unit.row = row
        self._decisions_changed()

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        """The job's ranks exist: put them in the state the current slice wants at once."""
        for unit in self._of(job_id):
            unit.pid = pids.get(unit.rank, 0)
            unit.running = True  # a new process runs, whatever was decided for it before it existed
        self._applied = None
        # All decisions, not only the job's: whether its ranks yield on a PE depends on whether another
        # job's F process has priority there. The other ranks' decisions are unchanged: no signals.
        self._apply(self.decide(self.active))

    def rank_gone(self, job_id: int, rank: int) -> None:
        """A rank ended: never signal its process group again (its number may be reused)."""
        unit = self.units.get((job_id, rank))
        if unit is not None:
            unit.pid = 0
            self._applied = None

    def remove(self, job_id: int) -> None:
        """The job is over or being killed: it is no longer switched (the kill continues it first)."""
        for key in [k for k in self.units if k[0] == job_id]:
            del self.units[key]
            self._classes.pop(key, None)
        for pid in [pid for pid, f in self.followers.items() if f.job_id == job_id]:
            del self.followers[pid]
            self.group_nice.pop(pid, None)
        for pid in [pid for pid in self.group_nice if pid not in self._pids()]:
            del self.group_nice[pid]
        self._suspended.discard(job_id)
        self._decisions_changed()

    def follow(self, job_id: int, pid: int, pe: int) -> None:
        """A process the job spawned on PE ``pe``: from now on it runs when the job's rank there runs (it is
        put in that rank's state at once)."""
        self.followers[pid] = Follower(job_id=job_id, pe=pe)
        self._applied = None
        self._apply(self.decide(self.active))

    def unfollow(self, pid: int) -> None:
        """A spawned process ended: never signal its process group again."""
        self.followers.pop(pid, None)
        self._applied = None

    def _of(self, job_id: int) -> list[Unit]:
        return [u for u in self.units.values() if u.job_id == job_id]

    # ------------------------------------------------------------------------------------------- deciding

    def decide(self, active: int | None) -> dict[Key, Decision]:
        """Every rank's decision for row ``active`` (kept until what it depends on changes: __init__).
        A row whose decisions are those of another row kept already gets that one's object. O(1) when
        kept; O(n) to decide for n ranks, and O(n) per row kept to compare."""
        decided = self._decided.get(active)
        if decided is not None:
            return decided
        classes, held = self._classes, self._suspended
        processes = (
            Process(key=key, pe=u.pe, row=u.row, klass=classes.get(key, Klass.CS))
            for key, u in self.units.items()
            if u.job_id not in held
        )
        decided = decide(self._policy, processes, active, f_always=self._f_priority == "always")
        if held:  # stopped, their wait mode left as it is
            decided.update(
                (key, Decision(run=False, spin_block=u.spin_block))
                for key, u in self.units.items()
                if u.job_id in held
            )
        decided = next((kept for kept in self._decided.values() if kept == decided), decided)
        self._decided[active] = decided
        return decided

    # ------------------------------------------------------------------------------------------- switching

    def switch(
        self,
        active: int | None,
        *,
        now: float,
        seq: int = -1,
        sent: float | None = None,
        received: float | None = None,
        at: float = 0.0,
    ) -> SwitchCheck | None:
        """Make ``active`` the running row (None: every rank runs) at time ``now``; returns the signals to
        check, None if nothing was signalled. A heartbeat's switch says when it was ``received`` (default
        ``now``) and the instant ``at`` it named, for the trace."""
        self.active = active
        arrived = now if received is None else received
        if not (self.units or self.followers):
            # Nothing to decide or signal: a thousand idle nodes' switch at one instant is this and the trace
            # line (storm bench scale's emulated part), hence the calls inlined.
            if self.trace is not None and seq >= 0:
                row = -1 if active is None else active
                self.trace(TraceLine(seq, row, sent or 0.0, arrived, now, 0, at, now))
            return None
        expected = self._apply(self.decide(active))
        if not expected:
            if self.trace is not None and seq >= 0:
                self._record(TraceLine(seq, _row(active), sent or 0.0, arrived, now, 0, at, now))
            return None
        self.switches += 1
        return SwitchCheck(
            expected=expected, seq=seq, row=active, sent=sent, received=arrived, at=at, begun=now
        )

    def checked(self, check: SwitchCheck, done: float) -> None:
        """The switch took effect at ``done`` (or its check gave up then)."""
        begun = check.begun or check.received
        self.durations.append(done - begun)
        if self.trace is not None and check.seq >= 0:
            line = TraceLine(
                check.seq, _row(check.row), check.sent or 0.0, check.received, done, len(check.expected),
                check.at, begun,
            )  # fmt: skip
            self._record(line)

    def _apply(self, decisions: dict[Key, Decision]) -> dict[int, bool]:
        """Signal what must change; return pid -> whether it should now run, for the check. Nothing
        changes when ``decisions`` are those in force (__init__)."""
        if decisions is self._applied:
            return {}
        stop = [k for k, d in decisions.items() if not d.run and self.units[k].running]
        cont = [k for k, d in decisions.items() if d.run and not self.units[k].running]
        expected: dict[int, bool] = {}
        for keys, running in ((stop, False), (cont, True)):
            for key in keys:
                self.units[key].running = running
        leaders = {(u.job_id, u.pe): u for u in self.units.values()}
        followed = self._follow_leaders(leaders)
        for keys, sig, running in ((stop, signal.SIGSTOP, False), (cont, signal.SIGCONT, True)):
            for key in keys:
                unit = self.units[key]
                if unit.pid:
                    self.os.signal_group(unit.pid, sig)
                    expected[unit.pid] = running
                if self.on_switch is not None:
                    self.on_switch(unit.job_id, unit.index, running)
            for pid in (pid for pid, run in followed.items() if run == running):
                self.os.signal_group(pid, sig)
                expected[pid] = running
        favoured = {self.units[k].pe for k, d in decisions.items() if d.prioritized}
        for key, decision in decisions.items():
            unit = self.units[key]
            if decision.spin_block != unit.spin_block and self.set_wait is not None:
                self.set_wait(unit.job_id, unit.index, decision.spin_block)
                unit.spin_block = decision.spin_block
            yields = unit.pe in favoured and decision.run and not decision.prioritized
            nice = self.background_nice if yields else 0
            if nice != unit.nice and unit.pid:
                self.os.set_nice(unit.pid, nice)
                unit.nice = nice
        for pid, follower in self.followers.items():
            leader = leaders.get((follower.job_id, follower.pe))
            nice = 0 if leader is None else leader.nice
            if nice != follower.nice:
                self.os.set_nice(pid, nice)
                follower.nice = nice
        self._set_group_nice()
        self._applied = decisions
        return expected

    def _follow_leaders(self, leaders: dict[tuple[int, int], Unit]) -> dict[int, bool]:
        """Spawned processes whose rank changed state: pid -> whether it now runs."""
        changed = {}
        for pid, follower in self.followers.items():
            leader = leaders.get((follower.job_id, follower.pe))
            running = leader is None or leader.running
            if running != follower.running:
                follower.running = running
                changed[pid] = running
        return changed

    def _pids(self) -> set[int]:
        return {unit.pid for unit in self.units.values() if unit.pid} | set(self.followers)

    def _set_group_nice(self) -> None:
        """Each rank and spawned process leads a session of its own, so an autogroup of its own (the kernel
        shares a CPU between autogroups first, by nice only within one): it gets the process's nice."""
        wanted = {unit.pid: unit.nice for unit in self.units.values() if unit.pid}
        wanted.update((pid, follower.nice) for pid, follower in self.followers.items())
        for pid, nice in wanted.items():
            if self.group_nice.get(pid, 0) != nice:
                self.os.set_group_nice(pid, nice)
                self.group_nice[pid] = nice

    def _record(self, line: TraceLine) -> None:
        """One trace line (the caller checked that there is a trace)."""
        assert self.trace is not None
        self.trace(line)

    def stats(self) -> tuple[int, float, float]:
        """Switches so far, and the median and 99th percentile of their duration in milliseconds."""
        if not self.durations:
            return self.switches, 0.0, 0.0
        ms = sorted(d * 1000 for d in self.durations)
        return self.switches, statistics.median(ms), ms[min(len(ms) - 1, int(0.99 * len(ms)))]


def _row(active: int | None) -> int:
    """A trace line's row: -1 when every job runs."""
    return -1 if active is None else active
