"""storm-nm's two seams backed by the node model: what the node core does to processes reaches the model,
and what it measures comes from the model's counters (issue 15, item 2).

- :class:`SimProcesses` is nm/processes.py's ``Processes``: SIGSTOP and SIGCONT to a rank's process group
  stop and continue the process in :class:`CoschedModel`, ``set_nice`` changes its weight; the kernel's CPU
  time and schedstat are the model's; pids are handed out in order (a pid's start time is the pid, so a
  rank is younger than its job shell, which nm/checks.py insists on). Terminations change nothing: a
  simulated job ends when its program does.
- :class:`SimMonitor` is nm/monitor.py's ``Monitor`` itself, reading a :class:`ModelSegment` instead of
  mpihook's shared memory: each rank's record is built from the model's :class:`ProcessCounters` field for
  field (the hook's events, calls, wall time in calls with stops included, spin and block time, in-call
  flag, entry and exit times), and the monitor's own arithmetic (baselines, resets on a class change, stops
  inside a call taken out of T_comm) is storm-nm's, not a copy. Only its clock is the simulated one.

Both share one :class:`ProcessTable`: per process the :class:`Control` the node core has asked for so far
(stopped, nice, wait mode and T_spin), applied to the model at the simulated instant ``now_ns`` that the
driver sets before it hands the node core a stimulus. Pure: no system call, no wall clock.
"""

from __future__ import annotations

import signal
from collections.abc import Collection
from dataclasses import replace

from storm.mpihook.stats import ACTIVE, WAIT_SPINBLOCK, HookSegment, RankCounters
from storm.nm.monitor import JobMonitor, Monitor
from storm.tools.sim.cosched.node import Control, CoschedModel, ProcessKey, WaitMode

SENDRECV = 6  # record.h's storm_hook_call of MPI_Sendrecv, the BSP ring's call (mpihook/stats.py CALLS)
FIRST_PID = 1000


class ProcessTable:
    """The simulated processes of one cluster: pids, what the node cores decided for each, the clock."""

    def __init__(self, model: CoschedModel, wait: WaitMode | None = None) -> None:
        """``wait``: every rank waits so, whatever the node core asks (ClusterSchedSim's busy-waiting
        DCS and PB, which storm's cores run as sb: cluster.py)."""
        self.model = model
        self.wait = wait
        self.now_ns = 0  # the driver's simulated instant; every decision takes effect then
        self.next_pid = FIRST_PID
        self.keys: dict[int, ProcessKey] = {}  # pid -> (job id, rank), for ranks in the model
        self.controls: dict[ProcessKey, Control] = {}
        self.started_ns: dict[ProcessKey, int] = {}
        self.sessions: dict[int, list[int]] = {}  # job shell pid -> its session (itself and its ranks)
        # Wait modes set before the rank exists (the NM writes the control word when it makes the segment,
        # and may change it before the shell reports the ranks): the rank starts with them.
        self.pending_waits: dict[ProcessKey, tuple[WaitMode, int]] = {}
        self.changes: dict[ProcessKey, int] = {}  # per rank, how many times its control changed
        self.known: dict[tuple[bool, int, WaitMode, int], Control] = {}

    def spawn(self) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        return pid

    def add_rank(self, pid: int, key: ProcessKey, control: Control) -> Control:
        """A rank the driver is about to start in the model; returns its control (with any wait mode set
        for it before it existed), to start it with."""
        pending = self.pending_waits.pop(key, None)
        if pending is not None:
            control = replace(control, wait=pending[0], spin_ns=pending[1])
        if self.wait is not None:
            control = replace(control, wait=self.wait)
        self.keys[pid] = key
        self.controls[key] = control
        self.started_ns[key] = self.now_ns
        return control

    def change(self, pid: int, **changes: object) -> None:
        """Apply a change of one process's control (a signal, a nice value, a wait mode) to the model."""
        key = self.keys.get(pid)
        if key is not None:
            self.change_key(key, **changes)

    def change_key(self, key: ProcessKey, **changes: object) -> None:
        old = self.controls[key]
        fields = {"stopped": old.stopped, "nice": old.nice, "wait": old.wait, "spin_ns": old.spin_ns}
        fields.update(changes)
        if self.wait is not None:
            fields["wait"] = self.wait
        new = self._control(fields["stopped"], fields["nice"], fields["wait"], fields["spin_ns"])  # type: ignore[arg-type]
        if new != old:
            self.controls[key] = new
            self.changes[key] = self.changes.get(key, 0) + 1
            self.model.control(self.now_ns, key, new)

    def _control(self, stopped: bool, nice: int, wait: WaitMode, spin_ns: int) -> Control:
        """The one Control with these fields: a node core stops and continues every rank every slice, and
        a Control made (and checked) each time was a tenth of a gang run."""
        known = self.known.get((stopped, nice, wait, spin_ns))
        if known is None:
            known = self.known[stopped, nice, wait, spin_ns] = Control(stopped, nice, wait, spin_ns)
        return known


class SimProcesses:
    """nm/processes.py's ``Processes`` on the model (see the module's docstring)."""

    def __init__(self, table: ProcessTable) -> None:
        self.table = table
        self.shells: list[dict[str, object]] = []

    def prepare(self) -> None:
        pass

    def start_shell(self, shell: dict[str, object], *, uid: int, gid: int, log: int) -> tuple[int, int]:
        self.shells.append(shell)
        pid = self.table.spawn()
        self.table.sessions[pid] = [pid]
        return pid, -1  # no pidfd: the driver tells the node core when a shell ends

    def pidfd(self, pid: int) -> int | None:
        return None

    def signal_group(self, pgid: int, sig: int) -> bool:
        # SIGTERM and SIGKILL change nothing in the model: simulated jobs are not killed in these runs.
        if sig == signal.SIGSTOP:
            self.table.change(pgid, stopped=True)
        elif sig == signal.SIGCONT:
            self.table.change(pgid, stopped=False)
        return True

    def signal(self, pid: int, sig: int) -> bool:
        return True

    def close(self) -> None:
        pass

    def start_time(self, pid: int) -> int | None:
        return pid if pid < self.table.next_pid else None

    def session_members(self, sid: int) -> list[int]:
        return list(self.table.sessions.get(sid, []))

    def parent(self, pid: int) -> int | None:
        return None  # the simulated shells report no process the node must check

    def states(self, pids: list[int]) -> dict[int, str | None]:
        table = self.table
        return {
            pid: "T" if pid in table.keys and table.controls[table.keys[pid]].stopped else "R" for pid in pids
        }

    def cpu_ns(self, pid: int) -> int | None:
        stat = self.schedstat(pid)
        return None if stat is None else stat[0]

    def schedstat(self, pid: int) -> tuple[int, int] | None:
        """CPU time, and time runnable but without the CPU: the rest of its life that it was neither
        stopped, blocked nor in I/O. O(1)."""
        key = self.table.keys.get(pid)
        if key is None:
            return None
        c = self.table.model.reading(key)
        alive = self.table.now_ns - self.table.started_ns[key]
        return c.cpu_ns, max(0, alive - c.cpu_ns - c.stopped_ns - c.blocked_ns - c.io_ns)

    def set_nice(self, pgid: int, nice: int) -> None:
        self.table.change(pgid, nice=nice)

    def set_group_nice(self, pid: int, nice: int) -> None:
        # The model has no autogroups: a process's own nice is its weight on its PE (see the README).
        pass

    def remove_shm(self, names: Collection[str]) -> list[str]:
        return []

    def mapped_shm(self, pids: Collection[int]) -> set[str]:
        return set()


class ModelSegment(HookSegment):
    """A job's mpihook segment whose records are the model's counters, and whose control word is the
    process's wait mode in the model. Never opened: no shared memory exists."""

    def __init__(self, name: str, job_id: int, ranks: list[int], table: ProcessTable) -> None:
        super().__init__(name, -1, len(ranks))
        self.job_id = job_id
        self.ranks = ranks
        self.keys = [(job_id, rank) for rank in ranks]  # each record's process in the model
        self.table = table
        self.pids: dict[int, int] = {}  # record index -> pid, once started
        # Per record, the last one read and what it was read from: a rank that entered or left no call
        # since (a stopped one, most of a slice's) gets the same record, not a new one built field by field.
        self._last: dict[int, tuple[tuple[int, int, bool, int, int, bool], RankCounters]] = {}

    def read_all(self) -> list[RankCounters | None]:
        """Every record, as the hook would have written it by now. O(ranks)."""
        out: list[RankCounters | None] = []
        table = self.table
        controls, changed, pids, kept = table.controls, table.changes, self.pids, self._last
        for index, key in enumerate(self.keys):
            control = controls.get(key)
            if control is None:
                out.append(None)  # not started: the hook has not written its record yet
                continue
            pid = pids.get(index, 0)
            last = kept.get(index)
            changes = changed.get(key, 0)
            if last is not None:
                seen = last[0]
                # A rank stopped when last read, and not continued since, has entered and left no call.
                if seen[0] == pid and seen[1] == changes and seen[2]:
                    out.append(last[1])
                    continue
            c = table.model.reading(key)
            # Every field changes only when a call begins (enter_ns, in_call) or returns (calls).
            source = (pid, changes, control.stopped, c.calls, c.enter_ns, c.in_call)
            if last is not None and last[0][3:] == source[3:] and last[0][0] == pid:
                kept[index] = (source, last[1])
                out.append(last[1])
                continue
            record = RankCounters(
                pid, key[1], ACTIVE, c.in_call, c.calls, c.events, c.comm_ns, c.enter_ns, c.exit_ns,
                c.spin_ns, c.block_ns, SENDRECV if c.calls else 0,
            )  # fmt: skip
            kept[index] = (source, record)
            out.append(record)
        return out

    def set_wait(self, index: int, mode: int, spin_ns: int) -> None:
        self._check(index)
        wait = WaitMode.SPIN_BLOCK if mode == WAIT_SPINBLOCK else WaitMode.POLL
        key = (self.job_id, self.ranks[index])
        if key in self.table.controls:
            self.table.change_key(key, wait=wait, spin_ns=spin_ns)
        else:  # the rank starts with it (the hook reads the word at its first call)
            self.table.pending_waits[key] = (wait, spin_ns)

    def wait_mode(self, index: int) -> tuple[int, int]:
        control = self.table.controls.get((self.job_id, self.ranks[index]))
        if control is None:
            return 0, 0
        return (WAIT_SPINBLOCK if control.wait is WaitMode.SPIN_BLOCK else 0), control.spin_ns

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


class SimMonitor(Monitor):
    """nm/monitor.py's ``Monitor`` on :class:`ModelSegment` records and the simulated clock. The methods
    overridden are those that open shared memory or read the kernel's boot clock; the rest is storm-nm's."""

    def __init__(self, processes: SimProcesses, node: str) -> None:
        self.table = processes.table
        super().__init__(processes, node, clock=self._clock)

    def _clock(self) -> int:
        return self.table.now_ns

    def create(self, job_id: int, name: str, ranks: list[int], uid: int, gid: int) -> bool:
        self.jobs[job_id] = JobMonitor(ModelSegment(name, job_id, ranks, self.table), ranks, self._clock)
        for index in range(len(ranks)):
            self.jobs[job_id].segment.set_wait(index, 0, self.spin_ns)
        return True

    def attach(self, job_id: int, name: str, ranks: list[int]) -> bool:
        return False  # simulated node managers never restart

    def backdate(self, job_id: int, starts: dict[int, int]) -> None:
        pass

    def started(self, job_id: int, pids: dict[int, int]) -> None:
        super().started(job_id, pids)
        job = self.jobs.get(job_id)
        if job is not None:
            segment = job.segment
            assert isinstance(segment, ModelSegment)
            segment.pids = dict(job.pids)
