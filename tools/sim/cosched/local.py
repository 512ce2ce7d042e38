"""ClusterSchedSim's local scheduler and dynamic coscheduling in the node model (``Costs.local``), on the
round-robin slices of slices.py, which give each PE the one process running now that these mechanisms need.

ClusterSchedSim (Zhang & Sivasubramaniam, SIMULATION 2004, sections 3-4) runs each node's CPU under
Solaris's time-sharing (TS) scheduler: 60 priority levels, a quantum of 20 ms at the top level to 200 ms at
the bottom, a task that uses up its quantum drops to the tail of the next lower level, a task that wakes
goes to the head of level 59, and preemption takes effect at the next clock tick. Here, per PE:

- one run queue with one slice length for all (``Costs.slice_ns``); a slice's end sends the runner to the
  tail (TS: the tail of the next lower level, with a longer quantum). Levels are not modelled;
- a process that becomes runnable (wakes from a block, ends its I/O, starts, is continued) goes to the head
  of the ready queue, right behind the running process, and takes the PE when that one's slice ends or it
  stops running (blocks, starts I/O, ends). TS puts it at the head of level 59 too, and would also preempt a
  runner of a lower level at its next tick: here only DCS's boosts preempt;
- a context switch is time with no progress (ClusterSchedSim: hold(overhead)): every change of the process
  running on the PE costs ``Local.switch_ns`` before the new one runs. A process that runs again after an
  idle spell with nobody else in between pays none: its context is still loaded;
- DCS (message-arrival rescheduling): when a process's message arrives (the model has one arrival per
  communication step: its last message) and the process is blocked, or runnable but not running, the PE
  takes an interrupt (``Local.interrupt_ns``, no progress), and the process goes to the head of the queue
  and preempts the runner, which stays next in line (TS keeps a preempted task at the head of its level).
  The boosted process then pays the switch and runs for a full slice; one that was blocked pays its wake-up
  (``Costs.wakeup_ns``) first, as any woken process does. A process in I/O or stopped is left alone; a
  running one finds its message by itself. ClusterSchedSim's ISR boosts to the head of the highest level;
  with one queue, the head is that;
- PB (periodic rescheduling): every ``Local.period_ns``, on a PE where some process waits for the CPU, if
  the runner busy-waits (polls, or spins before it blocks) for a message not yet in, the daemon scans the
  ready queue, which costs ``Local.daemon_ns`` of PE time, and hands the PE to the first process in line
  with useful work (computing, paying its wake-up, or with its message in) for a full slice; the
  busy-waiter goes to the tail. ClusterSchedSim charges each daemon run; here a daemon that finds nobody
  waiting for the CPU costs nothing (checking the running task is the paper's 2-3 ns, which it does not
  simulate either);
- each PE keeps its own time: PE i of P runs its daemon, and ends the slice of a runner that was alone when
  a second process joins (slices.py's grid), i/P of a period or slice after each multiple of it.
  ClusterSchedSim's daemons all start at 0 and hold(period), in step; on identical nodes in step, balanced
  jobs that share the same PEs would rotate together, gang scheduled by the timers. Real nodes' timers are
  not in step, and neither are these.

Interrupts and daemon runs are counted in the PE's switch time, and apart in its interrupt time.

A job alone on its PEs is walked by shortcut.py, which knows none of this: :func:`shortcut_safe` says when
the event path would give the same answer. PB's daemon and the preemptions need a second runnable process,
which a job alone does not have; DCS's interrupt fires for a lone blocked process, so DCS keeps jobs that
spin-block off the shortcut; and a switch is due (or at least counted) when a lone process first runs on a
PE another one held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storm.tools.sim.cosched.records import ON_CPU, Local, Phase, Reschedule, WaitMode

if TYPE_CHECKING:
    from storm.tools.sim.cosched.node import CoschedModel
    from storm.tools.sim.cosched.records import _Job, _Pe, _Process


def _overhead(pe: _Pe, now: int, ns: int) -> None:
    """Time the PE spends on the kernel's work (an interrupt, the daemon) after what it owes already."""
    pe.switch_until = max(pe.switch_until, now) + ns
    pe.interrupt += ns
    pe.interrupts += 1


def arrived(model: CoschedModel, p: _Process, now: int) -> None:
    """DCS: ``p``'s message is in at ``now`` (its PE synced and ``p`` moved through what that changes; the
    caller reschedules the PE next). O(n) for the n processes of the PE."""
    local = model.costs.local
    if local is None or local.reschedule is not Reschedule.DCS:
        return
    pe = model._pes[p.pe]
    if p.control.stopped or pe.running == p.index or p.phase not in ON_CPU:
        return
    _overhead(pe, now, local.interrupt_ns)
    if p.index in pe.queue:
        pe.queue.remove(p.index)
    pe.queue.insert(0, p.index)  # the preempted runner, if any, is now second
    pe.running = None


def phase(model: CoschedModel, pe: _Pe, length: int) -> int:
    """Where PE ``pe``'s timer of period ``length`` fires within each period (module docstring). O(1)."""
    return pe.index * length // len(model._pes)


def grid_end(model: CoschedModel, pe: _Pe, now: int, length: int) -> int:
    """The end of a slice of ``length`` on ``pe``'s grid, after ``now`` (slices.py). O(1)."""
    offset = phase(model, pe, length)
    return ((now - offset) // length + 1) * length + offset


def daemon_due(model: CoschedModel, pe: _Pe, now: int) -> bool:
    """PB: whether the daemon runs on ``pe`` at ``now``: a period's instant, with a runner and someone
    waiting for the CPU, and not run yet at this instant (which it then marks). O(1)."""
    local = model.costs.local
    if local is None or local.reschedule is not Reschedule.PB or pe.daemon_at == now:
        return False
    if (now - phase(model, pe, local.period_ns)) % local.period_ns:
        return False
    if pe.running is None or len(pe.queue) < 2:
        return False
    pe.daemon_at = now
    return True


def daemon(model: CoschedModel, pe: _Pe, now: int) -> None:
    """PB's daemon (``daemon_due`` said it runs): it looks at the PE's processes once every change due at
    ``now`` is made, whatever order the instant's events run in. O(n)."""
    local = model.costs.local
    assert local is not None and pe.running is not None
    for index in pe.processes:
        if not model._processes[index].control.stopped:  # nothing is due to a stopped one
            model._progress(model._processes[index], now)
    runner = model._processes[pe.running]
    if runner.phase is not Phase.WAIT or (runner.ready_ns is not None and runner.ready_ns <= now):
        return
    _overhead(pe, now, local.daemon_ns)
    for index in pe.queue[1:]:
        if _useful(model._processes[index], now):
            pe.queue.remove(index)
            pe.queue.remove(runner.index)
            pe.queue.insert(0, index)
            pe.queue.append(runner.index)
            pe.running = None
            return


def _useful(p: _Process, now: int) -> bool:
    if p.phase is Phase.WAIT:
        return p.ready_ns is not None and p.ready_ns <= now
    return p.phase is Phase.WAKING or (p.phase is Phase.COMPUTE and p.remaining > 0)


def next_daemon(model: CoschedModel, pe: _Pe, now: int) -> int | None:
    """PB: the daemon's next run that can matter on ``pe``, after ``now``. O(1)."""
    local = model.costs.local
    if local is None or local.reschedule is not Reschedule.PB or pe.running is None or len(pe.queue) < 2:
        return None
    return grid_end(model, pe, now, local.period_ns)


def dispatched(model: CoschedModel, pe: _Pe, head: _Process, now: int, slice_ns: int) -> None:
    """``head`` takes the PE at ``now``: it pays the switch if another process held the PE, and its slice
    runs from the end of what the PE owes. O(1)."""
    local = model.costs.local
    assert local is not None
    if pe.holder is not None and pe.holder != head.index:
        pe.switch_until = max(pe.switch_until, now) + local.switch_ns
        pe.switches += 1
        model._dirty.add(head.pe)  # its job may be alone now that its rank holds the PE (shortcut_safe)
    pe.holder = head.index
    pe.slice_end = max(now, pe.switch_until) + slice_ns


def newcomers_at(pe: _Pe) -> int:
    """Where processes that become runnable join the queue: right behind the runner. O(1)."""
    return 1 if pe.running is not None and pe.queue and pe.queue[0] == pe.running else 0


def shortcut_safe(model: CoschedModel, job: _Job) -> bool:
    """Whether the event path would run ``job``, alone on its PEs, as shortcut.py walks it (module
    docstring). O(r) for its r ranks."""
    local: Local | None = model.costs.local
    if local is None:
        return True
    for index in job.processes:
        p = model._processes[index]
        if p.phase is Phase.DONE:
            continue
        if model._pes[p.pe].holder not in (None, p.index):
            return False
        dcs = local.reschedule is Reschedule.DCS
        if dcs and (p.control.wait is WaitMode.SPIN_BLOCK or p.mode is WaitMode.SPIN_BLOCK):
            return False
    return True
