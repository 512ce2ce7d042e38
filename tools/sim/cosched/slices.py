"""Round-robin time slices for the node model (``Costs.slice_ns > 0``), instead of fluid sharing.

The fluid model gives every runnable process of a PE its share continuously, so a polling rank notices its
message the instant it comes and a rank that wakes runs at once. Under CFS/EEVDF one process runs at a time
for a slice of a few milliseconds; here, per PE:

- the runnable processes (computing, waiting on the CPU or paying a wake-up; not stopped, blocked or done)
  form a run queue; its head runs and gets the whole PE, the others get nothing;
- the head runs until its slice ends, ``slice_ns x weight / 1024`` (nice weights honoured by scaling the
  slice, so each process's share over a round is its weight's share, as in the fluid model), then goes to
  the end of the queue; a slice end is an event only when more than one process is runnable;
- a process that becomes runnable (wakes from a block, is continued, starts) joins the end of the queue;
  one that blocks, is stopped or finishes leaves it and gives up the rest of its slice;
- a polling or spinning waiter notices its message only while it runs, and a woken process returns from its
  call only once it runs and has paid its wake-up;
- a process alone on its PE is never sliced. When a second one joins, the lone one's slice ends at the next
  multiple of its slice length in absolute time: EEVDF renews a lone task's deadline every slice, at a phase
  that depends on its whole history; a fixed grid gives the same mean wait (half a slice) without that
  history, which keeps a process alone on its PE exactly what the shortcut (shortcut.py) computes.

Rotations cost nothing: ``Costs.switch_ns`` stays the price of the outside's changes only. ``Costs.local``
(local.py) changes that, where newcomers queue, and adds ClusterSchedSim's rescheduling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storm.tools.sim.cosched import local
from storm.tools.sim.cosched.records import credit

if TYPE_CHECKING:
    from storm.tools.sim.cosched.node import CoschedModel
    from storm.tools.sim.cosched.records import _Pe, _Process

NICE_0_WEIGHT = 1024


def slice_of(model: CoschedModel, p: _Process) -> int:
    return max(1, model.costs.slice_ns * p.weight // NICE_0_WEIGHT)


def on_cpu(model: CoschedModel, p: _Process, now: int) -> bool:
    """Whether ``p`` runs at ``now``: it is the PE's runner and, under ``Costs.local``, the PE has paid its
    switch or interrupt. O(1)."""
    pe = model._pes[p.pe]
    return pe.running == p.index and (model.costs.local is None or pe.switch_until <= now)


def update_queue(model: CoschedModel, pe_index: int, now: int) -> None:
    """Bring the PE's run queue to ``now`` (its processes' phases already moved to ``now``): drop those no
    longer runnable, append newcomers, rotate on a slice end; each process that comes to run is moved
    through what it was waiting for (a message in, a wake-up paid), which may change the queue again.
    O(n) per change of runner."""
    pe = model._pes[pe_index]
    while True:
        if model.costs.local is not None and pe.running is not None:
            runner = model._processes[pe.running]
            if not runner.control.stopped:
                model._progress(runner, now)  # its switch may have just ended: what came meanwhile
        competing = model._competing(pe)
        runnable = {p.index for p in competing}
        was_alone = len(pe.queue) == 1 and pe.running is not None
        pe.queue = [i for i in pe.queue if i in runnable]
        queued = set(pe.queue)
        fresh = [p.index for p in competing if p.index not in queued]
        if pe.running is not None and pe.running not in runnable:
            pe.running = None  # it blocked, was stopped or finished: the rest of its slice is lost
        at = local.newcomers_at(pe) if model.costs.local is not None else len(pe.queue)
        pe.queue[at:at] = fresh
        if local.daemon_due(model, pe, now):
            local.daemon(model, pe, now)
            continue  # it may have changed who runs, and moved processes on
        if pe.running is not None and len(pe.queue) > 1:
            if was_alone:
                # Contention begins: the lone runner's current slice ends on the grid (module docstring).
                length = slice_of(model, model._processes[pe.running])
                if model.costs.local is None:
                    pe.slice_end = (now // length + 1) * length
                else:
                    pe.slice_end = local.grid_end(model, pe, now, length)
            elif pe.slice_end <= now:
                pe.queue.append(pe.queue.pop(0))
                pe.running = None
        if pe.running is not None or not pe.queue:
            return
        head = model._processes[pe.queue[0]]
        pe.running = head.index
        if model.costs.local is None:
            pe.slice_end = now + slice_of(model, head)
        else:
            local.dispatched(model, pe, head, now, slice_of(model, head))
        model._progress(head, now)


def sync(model: CoschedModel, pe: _Pe, eff: int) -> int:
    """Give the running process ``eff`` ns of CPU (the PE's time since its last sync, switches excluded);
    return the CPU used. O(1)."""
    if pe.running is None:
        return 0
    return credit(pe, model._processes[pe.running], eff)


def next_change(model: CoschedModel, pe: _Pe, now: int) -> int | None:
    """The first instant the PE's state changes by itself: the runner's computation or wake-up ends, or
    its slice does while others wait. O(1)."""
    if pe.running is None:
        return None
    start = max(now, pe.switch_until)
    p = model._processes[pe.running]
    from storm.tools.sim.cosched.records import Phase

    soonest = start + p.remaining if p.phase is not Phase.WAIT else None
    if len(pe.queue) > 1:
        end = max(pe.slice_end, now)
        soonest = end if soonest is None else min(soonest, end)
    daemon = local.next_daemon(model, pe, now)
    if daemon is not None:
        soonest = daemon if soonest is None else min(soonest, daemon)
    return soonest
