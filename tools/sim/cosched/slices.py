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
from storm.tools.sim.cosched.records import Phase, credit

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
    model._sync(pe_index, now)  # the rounds since its last sync first (sync)
    while True:
        if model.costs.local is not None and pe.running is not None:
            runner = model._processes[pe.running]
            if not runner.control.stopped:
                model._progress(runner, now)  # its switch may have just ended: what came meanwhile
        competing = model._competing(pe)
        was_alone = len(pe.queue) == 1 and pe.running is not None
        if not _same_members(pe.queue, competing):  # most events change nobody's place in the queue
            runnable = {p.index for p in competing}
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
            elif pe.slice_end < now or (pe.slice_end == now and model.costs.local is not None):
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


def _same_members(queue: list[int], competing: list[_Process]) -> bool:
    """Whether the queue holds exactly the competing processes (the runner, if any, is one of the queue's).
    O(n^2) for n of them, a handful, without building a set: compiled, a set of process indexes would box
    every index, and this runs at every rescheduling."""
    if len(queue) != len(competing):
        return False
    for p in competing:
        index = p.index
        found = False
        for queued in queue:
            if queued == index:
                found = True
                break
        if not found:
            return False
    return True


def sync(model: CoschedModel, pe: _Pe, start: int, now: int) -> int:
    """Give the PE's CPU from ``start`` to ``now`` (its time since its last sync, a switch's excluded) to
    the processes that run in it, and roll the queue past every slice end up to ``now``; return the CPU
    used. O(n) for the n processes in the queue, however many rounds the time holds.

    Between two of the PE's events nobody changes phase (next_change makes an event of every instant one
    would), so the runner's slice and then whole rounds of the queue, in order, are all that happens: a
    slice end needs no event of its own. A slice is (begin, end]: at the instant its slice ends the runner
    still runs, and sees whatever happens then (a message in), whatever order the instant's events run
    in; the next one runs from the next nanosecond. (A message that comes exactly as the slice ends is
    common where nodes run in step, and the runner catching it is what the live balanced runs show.)
    Under ``Costs.local`` every slice end is an event, update_queue's (local.py acts on them)."""
    if pe.running is None:
        return 0
    runner = model._processes[pe.running]
    end = pe.slice_end
    if len(pe.queue) < 2 or now <= end or model.costs.local is not None:
        return credit(pe, runner, now - start)
    used = credit(pe, runner, max(0, end - start))
    order, lengths, offsets, rounds = _rounds(model, pe)
    before, after = max(start, end) - end, now - end
    for j, index in enumerate(order):
        cpu = _cpu_within(lengths[j], offsets[j], rounds, after) - _cpu_within(
            lengths[j], offsets[j], rounds, before
        )
        if cpu:
            used += credit(pe, model._processes[index], cpu)
    whole, into = divmod(after - 1, rounds)
    into += 1
    j = next(j for j in range(len(order)) if offsets[j] + lengths[j] >= into)
    pe.queue = order[j:] + order[:j]
    pe.running = pe.queue[0]
    pe.slice_end = end + whole * rounds + offsets[j] + lengths[j]
    return used


def _rounds(model: CoschedModel, pe: _Pe) -> tuple[list[int], list[int], list[int], int]:
    """Who runs after the runner's slice, in order (the runner last), each one's slice, when each one's
    slice begins within a round, and a round's length. O(n)."""
    order = pe.queue[1:] + pe.queue[:1]
    lengths = [slice_of(model, model._processes[i]) for i in order]
    offsets = []
    total = 0
    for length in lengths:
        offsets.append(total)
        total += length
    return order, lengths, offsets, total


def _cpu_within(length: int, offset: int, rounds: int, elapsed: int) -> int:
    """The CPU a process with this slice and offset gets in the first ``elapsed`` ns of the rounds."""
    if elapsed <= 0:
        return 0
    whole, into = divmod(elapsed, rounds)
    return whole * length + min(max(into - offset, 0), length)


def next_change(model: CoschedModel, pe: _Pe, now: int) -> int | None:
    """The first instant the PE's state changes by itself: a computation or wake-up ends, a process whose
    message is in (or whose wake-up is paid) comes to run, or (stepped, under ``Costs.local`` or the
    model's ``step_slices``) the runner's slice ends while others wait. O(n).

    A switch the PE owes is left out (the caller adds its end as an event), so the instants are lower
    bounds until it ends: an early event changes nothing but when the next one is worked out."""
    if pe.running is None:
        return None
    start = max(now, pe.switch_until)
    p = model._processes[pe.running]
    end = max(pe.slice_end, now)
    stepped = model.costs.local is not None or model.step_slices
    if len(pe.queue) < 2 or stepped:
        soonest = start + p.remaining if p.phase is not Phase.WAIT else None
        if len(pe.queue) > 1:
            # The next runs from the nanosecond after (sync); under Costs.local, update_queue rotates at it.
            turn = end if model.costs.local is not None else max(pe.slice_end + 1, now)
            soonest = turn if soonest is None else min(soonest, turn)
        daemon = local.next_daemon(model, pe, now)
        if daemon is not None:
            soonest = daemon if soonest is None else min(soonest, daemon)
        return soonest
    first = min(end - now, p.remaining) if p.phase is not Phase.WAIT else 0
    if p.phase is not Phase.WAIT and p.remaining <= end - now:
        return now + p.remaining  # within its slice; the rest, if it runs on, are later
    # The rounds after the runner's slice, as _rounds lays them out, walked without building its lists:
    # this runs at every rescheduling of a shared PE.
    processes, queue = model._processes, pe.queue
    n = len(queue)
    rounds = 0
    for index in queue:
        rounds += slice_of(model, processes[index])
    earliest: int | None = None
    offset = 0
    for j in range(n):
        index = queue[(j + 1) % n]  # the runner, queue[0], comes last
        q = processes[index]
        length = slice_of(model, q)
        need = q.remaining - (first if index == p.index else 0)
        candidate: int | None = None
        if q.phase is Phase.WAIT or (q.phase is Phase.WAKING and need <= 0):
            if index != p.index and (
                q.phase is Phase.WAKING or (q.ready_ns is not None and q.ready_ns <= now)
            ):
                candidate = end + offset + 1  # it returns when it comes to run
        else:
            whole = (need - 1) // length
            candidate = end + whole * rounds + offset + need - whole * length
        if candidate is not None and (earliest is None or candidate < earliest):
            earliest = candidate
        offset += length
    return earliest
