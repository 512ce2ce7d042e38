"""The node model's shortcut: a job alone on its PEs advanced by its leave-time recurrence, not by events.

A job is *alone* when each of its live ranks is runnable and is the only runnable process on its PE, and no
context switch is under way there (a whole gang slice of a coscheduled job). Then nothing outside the job
changes its progress until the outside acts (a control call or a launch on one of its PEs, which bring the
job back to the event path first), and each rank's CPU is all its own: a computation of c ns takes c ns,

    enter(r, k) = leave(r, k - 1) + compute(r)
    ready(r, k) = max(enter(p, k) for p in partners(r)) + latency     (enter(r, k) without partners)
    leave(r, k) = max(enter(r, k), ready(r, k))                        polling, or a spin that catches it
                = ready(r, k) + wakeup                                 spin-block past enter + T_spin

:func:`advance_alone` walks that recurrence rank by rank up to an instant ``t1`` and, when told to, writes
back exactly the state and counters the event path (node.py) would hold after every event up to ``t1``:
counters, the job's step bookkeeping, the PE's time split, and the carries and totals of its fluid share.
Cost: O(s x p) for s rank-steps and p partners per rank (ring 2; all-reduce counts arrivals, O(1) a step),
plain Python, no heap and no objects per step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from storm.tools.sim.cosched.program import Pattern

if TYPE_CHECKING:
    from storm.tools.sim.cosched.node import CoschedModel
    from storm.tools.sim.cosched.records import _Job

# Per-rank states of the walk; the event path's phases map onto them (BLOCKED is a call whose spin ran out).
_COMPUTE, _CALL, _WAKING, _DONE = 0, 1, 2, 3
# The periodic jump: periods of up to this many steps are found; a rank's last leaves are kept for that and
# for ranks a few steps ahead of the slowest; failed checks are spaced out up to this many pivot steps.
_MAX_PERIOD, _HISTORY, _MAX_BACKOFF = 4, 12, 16


# One long function on purpose: the walk's state lives in local lists of one frame, which is what makes a
# rank-step cost about a microsecond in plain Python; helpers taking the state as arguments cost twice that.
def advance_alone(  # noqa: PLR0915
    model: CoschedModel, job: _Job, t1: int, periodic: bool = True
) -> tuple[int | None, Callable[[], None]]:
    """Walk ``job`` (alone, its state at ``job.fast_ns``) to ``t1``, every change due at ``t1`` included.
    Return when its last rank finished if that is at or before ``t1`` (else None), and a function that
    writes the walk's outcome into the model: the walk is also the look-ahead for the job's next event,
    and is applied only if nothing outside acts before ``t1``."""
    from storm.tools.sim.cosched.records import Phase, WaitMode

    t0 = job.fast_ns
    program = job.program
    n = program.ranks
    iterations = program.iterations
    latency = program.latency_ns
    wakeup = model.costs.wakeup_ns
    communicates = program.communicates
    allreduce = program.pattern is Pattern.ALLREDUCE and n > 1
    partners = program.partner_table
    procs = [model._processes[i] for i in job.processes]
    compute = [p.compute_ns for p in procs]
    sb_of = [p.control.wait is WaitMode.SPIN_BLOCK for p in procs]
    spin_of = [p.control.spin_ns for p in procs]

    entered = list(job.entered)
    enter_at = [list(e) for e in job.enter_ns]
    arrived = list(job.arrived)
    last_arrival = list(job.last_arrival)
    ar_ready = [0, 0]  # all-reduce: when step k's result is in, by parity, once every rank arrived

    state = [_DONE] * n
    step = [p.step for p in procs]
    nxt = [0] * n  # COMPUTE: when it calls (or ends the iteration); WAKING: when it returns
    since = [t0] * n  # COMPUTE: when its computation began, or t0
    enter = [p.counters.enter_ns for p in procs]
    sb = [p.mode is WaitMode.SPIN_BLOCK for p in procs]
    deadline = [p.spin_deadline for p in procs]
    ready: list[int | None] = [p.ready_ns for p in procs]
    blocked_early = [False] * n  # the call was blocked or waking at t0 (its wake-up counted already)
    # Deltas of the counters, and the walk's outcome per rank.
    d_compute = [0] * n
    d_poll = [0] * n
    d_wake = [0] * n
    d_blocked = [0] * n
    d_events = [0] * n
    d_comm = [0] * n
    d_spin = [0] * n
    d_block = [0] * n
    d_wakeups = [0] * n
    d_iter = [0] * n
    exit_at = [p.counters.exit_ns for p in procs]
    gap = [False] * n  # a positive interval off the CPU (blocked or done) within (t0, t1)
    done_at: list[int | None] = [None] * n
    live = [p.phase is not Phase.DONE for p in procs]
    live_pes = {p.pe for p, alive in zip(procs, live, strict=True) if alive}  # accounted by their ranks
    for r, p in enumerate(procs):
        phase = p.phase
        if phase is Phase.COMPUTE:
            state[r], nxt[r] = _COMPUTE, t0 + p.remaining
        elif phase is Phase.WAIT:
            state[r] = _CALL
        elif phase is Phase.BLOCKED:
            state[r], deadline[r], blocked_early[r] = _CALL, p.block_from or 0, True
        elif phase is Phase.WAKING:
            state[r], nxt[r], deadline[r], blocked_early[r] = (
                _WAKING,
                t0 + p.remaining,
                p.block_from or 0,
                True,
            )
        else:
            gap[r] = t1 > t0
    if allreduce:
        for r in range(n):
            if state[r] in (_CALL, _WAKING) and ready[r] is not None:
                ar_ready[step[r] % 2] = ready[r] or 0

    def leave(r: int, at: int) -> None:
        """Rank r returns from its call at ``at`` <= t1: the hook's counters, then its next iteration."""
        d_events[r] += 1
        d_comm[r] += at - enter[r]
        if sb[r]:
            blocked = blocked_early[r] or (ready[r] or 0) > deadline[r]
            d_spin[r] += (deadline[r] if blocked else at) - enter[r]
            if blocked:
                d_block[r] += at - deadline[r]
        exit_at[r] = at
        next_iteration(r, at)
        if periodic:
            times[r].append(at)
            snaps[r].append(
                (
                    d_compute[r],
                    d_poll[r],
                    d_wake[r],
                    d_blocked[r],
                    d_events[r],
                    d_comm[r],
                    d_spin[r],
                    d_block[r],
                    d_wakeups[r],
                    d_iter[r],
                )
            )  # fmt: skip  (in the order of ``deltas``)
            if r == pivot:
                countdown[0] -= 1
                if countdown[0] <= 0:
                    jump()

    def next_iteration(r: int, at: int) -> None:
        d_iter[r] += 1
        step[r] += 1
        blocked_early[r] = False
        ready[r] = None
        if step[r] < iterations:
            state[r], nxt[r], since[r] = _COMPUTE, at + compute[r], at
        else:
            state[r] = _DONE
            done_at[r] = at
            if at < t1:
                gap[r] = True

    # The periodic jump. The walk is a function of the leave-time vector L_k (every rank's return from
    # step k) that commutes with a shift of time: what follows L_k + d is what follows L_k, d later. So
    # once L_K = L_{K-q} + lam for every rank, the job repeats itself every q steps and lam ns, counters
    # included, until its last iteration; the walk moves every rank m such periods at once, in O(n).
    pivot = 0
    times: list[deque[int]] = [deque(maxlen=_HISTORY) for _ in range(n)]
    snaps: list[deque[tuple[int, ...]]] = [deque(maxlen=_HISTORY) for _ in range(n)]
    countdown = [_MAX_PERIOD + 1]
    backoff = [1]
    jumped = [0]  # steps moved by jumps, for the model's count once the walk is applied
    deltas = (d_compute, d_poll, d_wake, d_blocked, d_events, d_comm, d_spin, d_block, d_wakeups, d_iter)

    def jump() -> None:
        """If the last steps every rank left repeat, move the whole job ahead by as many periods as fit
        before ``t1`` and before its last iteration. O(n x q) a check, checks spaced out while they fail."""
        countdown[0] = backoff[0]
        backoff[0] = min(2 * backoff[0], _MAX_BACKOFF)
        if _DONE in state:
            return
        k = min(step) - 1  # the last step every rank has left
        q, lam = _period(times, step, k)
        if not q:
            return
        last_event = max(enter[r] if state[r] == _CALL else since[r] for r in range(n))
        m = min((t1 - last_event) // lam, (iterations - 1 - max(step)) // q)
        if m < 1:
            return
        shift, steps = m * lam, m * q
        flip = steps % 2 == 1
        for r in range(n):
            back = step[r] - 1 - k
            now_d, then_d = snaps[r][-1 - back], snaps[r][-1 - back - q]
            for totals, now_v, then_v in zip(deltas, now_d, then_d, strict=True):
                totals[r] += m * (now_v - then_v)
            step[r] += steps
            entered[r] += steps
            nxt[r] += shift
            since[r] += shift
            enter[r] += shift
            exit_at[r] += shift
            if sb_of[r]:
                deadline[r] += shift  # a polling rank never set it in this walk: it stays as it was
            got = ready[r]
            if got is not None:
                ready[r] = got + shift
            even, odd = enter_at[r]
            enter_at[r] = [odd + shift, even + shift] if flip else [even + shift, odd + shift]
            times[r].clear()
            snaps[r].clear()
            if not queued[r]:
                queued[r] = True
                work.append(r)
        if allreduce:
            if flip:
                arrived.reverse()
                last_arrival.reverse()
                ar_ready.reverse()
            for slot in (0, 1):
                ar_ready[slot] += shift
                if arrived[slot]:
                    last_arrival[slot] += shift
        countdown[0] = _MAX_PERIOD + 1
        backoff[0] = 1
        jumped[0] += steps

    work = deque(range(n))
    queued = [True] * n
    while work:
        r = work.popleft()
        queued[r] = False
        while True:
            s = state[r]
            if s == _COMPUTE:
                at = nxt[r]
                if at > t1:
                    break
                if not communicates:
                    # No partners: the iterations that end before t1, but the last, end at once.
                    c = compute[r]
                    j = min((t1 - at) // c, iterations - 1 - step[r]) if c > 0 and periodic else 0
                    if j > 0:
                        d_compute[r] += at - since[r] + (j - 1) * c
                        d_iter[r] += j
                        step[r] += j
                        since[r], nxt[r] = at + (j - 1) * c, at + j * c
                        jumped[0] += j
                        continue
                    d_compute[r] += at - since[r]
                    next_iteration(r, at)
                    continue
                d_compute[r] += at - since[r]
                k = step[r]
                state[r], enter[r], sb[r], ready[r] = _CALL, at, sb_of[r], None
                if sb[r]:
                    deadline[r] = at + spin_of[r]
                entered[r] = k + 1
                enter_at[r][k % 2] = at
                if allreduce:
                    slot = k % 2
                    arrived[slot] += 1
                    last_arrival[slot] = max(last_arrival[slot], at)
                    if arrived[slot] == n:
                        ar_ready[slot] = last_arrival[slot] + latency
                        arrived[slot], last_arrival[slot] = 0, 0
                        for q in range(n):
                            if not queued[q] and q != r:
                                queued[q] = True
                                work.append(q)
                else:
                    for q in partners[r]:
                        if not queued[q] and q != r:
                            queued[q] = True
                            work.append(q)
            elif s == _CALL:
                k = step[r]
                e = enter[r]
                got = ready[r]
                if got is None:
                    if allreduce:
                        if arrived[k % 2] == 0 and entered[r] == k + 1:
                            got = ar_ready[k % 2]
                    elif not partners[r]:
                        got = e
                    else:
                        # Every partner entered step k: its message is in at the last entry + latency.
                        latest = -1
                        for q in partners[r]:
                            if entered[q] <= k:
                                latest = -1
                                break
                            latest = max(latest, enter_at[q][k % 2])
                        if latest >= 0:
                            got = latest + latency
                    ready[r] = got
                if got is None or got > t1:
                    break  # waiting at t1: the freeze below sorts out its phase
                if sb[r] and (blocked_early[r] or got > deadline[r]):
                    # Blocked at the deadline; woken when the message comes, back after the wake-up's CPU.
                    d_poll[r] += max(0, deadline[r] - max(e, t0))
                    d_blocked[r] += got - max(deadline[r], t0)
                    gap[r] = gap[r] or got > max(deadline[r], t0)
                    d_wakeups[r] += 1
                    blocked_early[r] = True
                    state[r], nxt[r], since[r] = _WAKING, got + wakeup, got
                    continue
                at = max(e, got)
                d_poll[r] += at - max(e, t0)
                leave(r, at)
            elif s == _WAKING:
                at = nxt[r]
                if at > t1:
                    break
                d_wake[r] += at - max(since[r], t0)
                leave(r, at)
            else:
                break

    finished = None
    if all(s == _DONE for s in state) and job.completion_ns is None:
        finished = max(t for t in done_at if t is not None)

    def write_back() -> None:  # noqa: PLR0915
        """Put into the model what the event path would hold after every event up to t1. O(n + m) for
        the m processes on the job's PEs."""
        span = t1 - t0
        for r, p in enumerate(procs):
            c = p.counters
            s = state[r]
            if s == _COMPUTE:
                d_compute[r] += t1 - since[r]
                p.phase, p.remaining, p.ready_ns = Phase.COMPUTE, nxt[r] - t1, None
            elif s == _WAKING:
                d_wake[r] += t1 - max(since[r], t0)
                p.phase, p.remaining, p.block_from, p.ready_ns = (
                    Phase.WAKING,
                    nxt[r] - t1,
                    deadline[r],
                    ready[r],
                )
            elif s == _CALL:
                p.ready_ns = ready[r]
                e = enter[r]
                if sb[r] and (blocked_early[r] or deadline[r] <= t1):
                    # Past its deadline with the message still out (it would have returned otherwise).
                    d_poll[r] += max(0, deadline[r] - max(e, t0))
                    d_blocked[r] += t1 - max(deadline[r], t0)
                    gap[r] = gap[r] or t1 > max(deadline[r], t0)
                    p.phase, p.block_from = Phase.BLOCKED, deadline[r]
                else:
                    d_poll[r] += t1 - max(e, t0)
                    p.phase, p.block_from = Phase.WAIT, None
            elif p.phase is not Phase.DONE:
                p.phase = Phase.DONE
                c.done = True
                job.finished += 1
            if d_events[r] or s in (_CALL, _WAKING):
                p.mode = WaitMode.SPIN_BLOCK if sb[r] else WaitMode.POLL
                p.spin_deadline = deadline[r]
            c.in_call = s in (_CALL, _WAKING)
            c.enter_ns = enter[r]
            c.exit_ns = exit_at[r]
            p.step = step[r]
            c.compute_ns += d_compute[r]
            c.poll_ns += d_poll[r]
            c.wakeup_cpu_ns += d_wake[r]
            c.blocked_ns += d_blocked[r]
            c.events += d_events[r]
            c.calls += d_events[r]
            c.comm_ns += d_comm[r]
            c.spin_ns += d_spin[r]
            c.block_ns += d_block[r]
            c.wakeups += d_wakeups[r]
            c.iterations += d_iter[r]
            if span <= 0:
                continue
            pe = model._pes[p.pe]
            if not live[r]:
                # Done before t0. While the job is alone its PE stays the job's (an outside act there
                # brings the job back to the event path first), so nothing runs on it: the PE idles, and
                # what is stopped there stays stopped. A PE the job no longer owns is the event path's.
                owned = pe.owner is not None and model._jobs[pe.owner] is job
                if owned and p.pe not in live_pes and pe.synced_ns < t1:
                    idle = t1 - max(pe.synced_ns, t0)
                    pe.idle += idle
                    for index in pe.processes:
                        other = model._processes[index]
                        if other is not p and other.phase is not Phase.DONE and other.control.stopped:
                            other.counters.stopped_ns += idle
                    pe.synced_ns = t1
                continue
            pe.busy += d_compute[r]
            pe.spin += d_poll[r]
            pe.switch += d_wake[r]
            pe.idle += span - d_compute[r] - d_poll[r] - d_wake[r]
            # Carries: a sync that sees a new total while the rank competes drops them; a rank that was off
            # the CPU for a while comes back to a new total. Its PE's total is that of the instant before t1.
            if gap[r] or pe.total != p.weight:
                p.carry = 0
            pe.total = p.weight if p.phase in (Phase.COMPUTE, Phase.WAIT, Phase.WAKING) else 0
            for index in pe.processes:
                other = model._processes[index]
                if other is not p and other.phase is not Phase.DONE and other.control.stopped:
                    other.counters.stopped_ns += span
            pe.synced_ns = t1
        job.entered = entered
        job.enter_ns = enter_at
        job.arrived = arrived
        job.last_arrival = last_arrival
        if finished is not None:
            job.completion_ns = finished
        job.fast_ns = t1
        model.steps_jumped += jumped[0]

    return finished, write_back


def _period(times: list[deque[int]], step: list[int], k: int) -> tuple[int, int]:
    """The shortest q <= _MAX_PERIOD with L_k - L_{k-q} the same lam > 0 for every rank, as (q, lam);
    (0, 0) if none. ``times[r]`` ends with rank r's leave of step ``step[r] - 1``. O(n x q)."""
    for q in range(1, _MAX_PERIOD + 1):
        lam = -1
        for r, hist in enumerate(times):
            back = step[r] - 1 - k
            if back + q >= len(hist):
                return 0, 0  # too little history for this q, so for longer ones too
            d = hist[-1 - back] - hist[-1 - back - q]
            if lam == -1:
                lam = d
            elif d != lam:
                break
        else:
            if lam > 0:
                return q, lam
    return 0, 0


def compute_left(model: CoschedModel, job: _Job) -> int:
    """The most CPU time any rank of ``job`` still needs for its computation: the job alone cannot end
    sooner than that after its walk's instant. O(n)."""
    from storm.tools.sim.cosched.records import Phase

    iterations = job.program.iterations
    most = 0
    for index in job.processes:
        p = model._processes[index]
        if p.phase is not Phase.DONE:
            left = (iterations - p.step - 1) * p.compute_ns + (p.remaining if p.phase is Phase.COMPUTE else 0)
            most = max(most, left)
    return most
