"""The execution profile: per-class totals from snapshots, and the monitor's snapshot of a real record."""

from __future__ import annotations

import pytest

from storm.mpihook.stats import HookSegment
from storm.nm.profile import Profiler, Snapshot
from tests.test_monitor import MS, hook_writes, monitor_of


def test_each_interval_goes_to_the_class_the_process_had_then() -> None:
    profiler = Profiler("n1")
    key = (5, 0)
    # 100 ms in CS: 60 ms on a CPU of which 20 polling, 40 stopped; then 100 ms in F: 30 on a CPU (10
    # spinning), 50 blocked, 20 waiting for the CPU.
    profiler.update(key, Snapshot(wall=100 * MS, cpu=60 * MS, poll=20 * MS, stopped=40 * MS), "CS")
    profiler.update(
        key,
        Snapshot(wall=200 * MS, cpu=90 * MS, poll=30 * MS, stopped=40 * MS, blocked=50 * MS, queued=20 * MS),
        "F",
    )
    cs, f = profiler.entries(5)
    assert (cs.rank, cs.node, cs.klass) == (0, "n1", "CS")
    assert (cs.wall, cs.compute, cs.poll, cs.stopped, cs.blocked) == pytest.approx((0.1, 0.04, 0.02, 0.04, 0))
    assert (f.klass, f.wall, f.compute, f.poll, f.blocked, f.queued, f.stopped) == pytest.approx(
        ("F", 0.1, 0.02, 0.01, 0.05, 0.02, 0)
    )
    assert profiler.entries(6) == ()
    profiler.forget(5)
    assert profiler.entries(5) == () and profiler.last == {}


def test_a_snapshot_takes_stops_out_of_the_waits_they_interrupted(segment: HookSegment) -> None:
    monitor, cpu = monitor_of(segment)
    cpu.cpu[100] = 0
    hook_writes(segment, 0, events=0, comm=0)
    monitor.sample()
    job = monitor.jobs[5]
    job.start_ns[0] = 0
    # In a polling call when stopped for 100 ms; the call lasted 130 ms of wall time in all.
    hook_writes(segment, 0, events=1, comm=0, in_call=True)
    monitor.sample()
    job.pause(0, 1_000 * MS)
    job.resume(0, 1_100 * MS)
    hook_writes(segment, 0, events=1, comm=130 * MS)
    monitor.sample()
    snap = job.snapshot(0, (80 * MS, 7 * MS), now_ns=1_200 * MS)
    assert snap == Snapshot(
        wall=1_200 * MS, cpu=80 * MS, queued=7 * MS, poll=30 * MS, blocked=0, stopped=100 * MS
    )
    job.pause(0, 1_150 * MS)  # stopped again, still now: counted up to the snapshot
    assert job.snapshot(0, (80 * MS, 7 * MS), now_ns=1_200 * MS).stopped == 150 * MS


def test_a_call_still_waiting_counts_from_its_start_in_the_ranks_wait_mode(segment: HookSegment) -> None:
    monitor, _ = monitor_of(segment)
    job = monitor.jobs[5]
    hook_writes(segment, 0, events=3, comm=10 * MS, in_call=True)  # entered at 0 (the record's enter_ns)
    monitor.sample()
    job.resumed_ns[0] = 400 * MS  # it was stopped until then, inside the call
    polling = job.snapshot(0, (0, 0), now_ns=1_000 * MS)
    assert (polling.poll, polling.blocked) == (10 * MS + 600 * MS, 0)
    monitor.set_wait(5, 0, spin_block=True)
    blocking = job.snapshot(0, (0, 0), now_ns=1_000 * MS)
    assert (blocking.poll, blocking.blocked) == (10 * MS, 600 * MS)


def test_blocked_time_never_counts_the_wait_for_a_cpu_twice() -> None:
    """mpihook's block phase ends when the call returns, after the wait for a CPU the kernel counts."""
    profiler = Profiler("n1")
    profiler.update((1, 0), Snapshot(wall=100 * MS, cpu=30 * MS, blocked=70 * MS, queued=20 * MS), "DC")
    (entry,) = profiler.entries(1)
    assert (entry.blocked, entry.queued, entry.compute) == pytest.approx((0.05, 0.02, 0.03))


def test_a_wait_for_a_cpu_the_kernel_reports_late_comes_off_the_blocked_time_counted_before() -> None:
    """The run delay grows only once a wait for a CPU ends: 60 ms of the first interval's block phase were
    such a wait, reported in the second interval (with 90 ms of its own). Every category stays within the
    wall time, and the blocked time is what is left."""
    profiler = Profiler("n1")
    profiler.update((1, 0), Snapshot(wall=100 * MS, blocked=100 * MS), "DC")
    profiler.update((1, 0), Snapshot(wall=200 * MS, cpu=10 * MS, blocked=200 * MS, queued=150 * MS), "DC")
    (entry,) = profiler.entries(1)
    assert (entry.wall, entry.compute, entry.blocked, entry.queued) == pytest.approx((0.2, 0.01, 0.04, 0.15))
    # Across a change of class, taken from the class the blocked time was counted in.
    profiler.update((2, 0), Snapshot(wall=100 * MS, blocked=100 * MS), "F")
    profiler.update((2, 0), Snapshot(wall=200 * MS, cpu=10 * MS, blocked=200 * MS, queued=150 * MS), "DC")
    dc, f = sorted(profiler.entries(2), key=lambda e: e.klass)
    assert (f.klass, f.blocked, dc.blocked, dc.queued) == pytest.approx(("F", 0.04, 0, 0.15))
    parts = sum(e.compute + e.poll + e.blocked + e.stopped + e.queued for e in (dc, f))
    assert parts == pytest.approx(dc.wall + f.wall)
    profiler.forget(2)
    assert profiler.entries(2) == () and (2, 0) not in profiler.classes
