"""The NM's measurements from mpihook records: FCS's T_cpu, T_comm, C_comm, with real segments."""

from __future__ import annotations

import os

import pytest

from storm.mpihook.stats import ACTIVE, WAIT_SPINBLOCK, HookSegment
from storm.nm.monitor import Monitor
from tests.test_hook_stats import write_fields

MS = 1_000_000  # nanoseconds


class FakeCpu:
    """Only what the monitor asks of the OS here: a rank's CPU time."""

    def __init__(self) -> None:
        self.cpu: dict[int, int] = {}

    def cpu_ns(self, pid: int) -> int | None:
        return self.cpu.get(pid)


def hook_writes(
    seg: HookSegment,
    index: int,
    *,
    events: int,
    comm: int,
    block: int = 0,
    in_call: bool = False,
    flags: int = ACTIVE,
) -> None:
    """Write a record as the rank's hook would (consistent: seq == seq_end)."""
    fields = (
        events,
        100 + index,
        index,
        flags,
        int(in_call),
        events,
        events,
        comm,
        0,
        0,
        0,
        block,
        18,
        0,
        events,
    )
    write_fields(seg, index, fields)


def monitor_of(seg: HookSegment) -> tuple[Monitor, FakeCpu]:
    cpu = FakeCpu()
    monitor = Monitor(cpu, "n1")  # type: ignore[arg-type]
    monitor.add(5, seg, [0, 1])
    monitor.started(5, {0: 100, 1: 101})
    return monitor, cpu


def entered_mpi(seg: HookSegment, index: int) -> tuple[Monitor, FakeCpu]:
    """A monitor whose rank ``index`` entered MPI with no CPU time used: its baseline is taken."""
    monitor, cpu = monitor_of(seg)
    cpu.cpu[100 + index] = 0
    hook_writes(seg, index, events=0, comm=0)
    monitor.sample()
    return monitor, cpu


def test_measurements_start_when_a_rank_enters_mpi(segment: HookSegment) -> None:
    monitor, cpu = monitor_of(segment)
    cpu.cpu[100] = 300 * MS  # start-up before MPI: not the job's computation
    monitor.sample()
    (before,) = [s for s in monitor.stats(5) if s.rank == 0]
    assert before.state == "no-mpi" and before.c_comm == 0
    hook_writes(segment, 0, events=0, comm=0)
    monitor.sample()  # the rank is now active: its baseline is taken here
    cpu.cpu[100] = 300 * MS + 100 * (5 * MS) + 100 * MS  # 100 steps of 5 ms work, 1 ms polling each
    hook_writes(segment, 0, events=100, comm=100 * MS)
    monitor.sample()
    (rank0,) = [s for s in monitor.stats(5) if s.rank == 0]
    assert rank0.state == "active" and rank0.c_comm == 100
    assert rank0.t_cpu == pytest.approx(0.5)  # polling in MPI is waiting, not computation
    assert rank0.t_comm == pytest.approx(0.1)
    assert rank0.granularity == pytest.approx(0.006)


def test_spin_blocked_time_was_not_on_the_cpu(segment: HookSegment) -> None:
    monitor, cpu = entered_mpi(segment, 1)
    monitor.set_wait(5, 1, spin_block=True)
    assert segment.wait_mode(1) == (WAIT_SPINBLOCK, monitor.spin_ns)
    cpu.cpu[101] = 50 * 2 * MS + 50 * 100_000  # 2 ms of work and 0.1 ms of spinning per step
    hook_writes(segment, 1, events=50, comm=50 * 3 * MS, block=50 * (3 * MS - 100_000))
    monitor.sample()
    (rank1,) = [s for s in monitor.stats(5) if s.rank == 1]
    assert rank1.wait_mode == "spin-block"
    assert rank1.t_cpu == pytest.approx(0.1)
    assert rank1.t_comm == pytest.approx(0.15)


def test_a_stop_inside_a_blocking_call_is_not_waiting(segment: HookSegment) -> None:
    monitor, cpu = entered_mpi(segment, 0)
    hook_writes(segment, 0, events=10, comm=10 * MS, in_call=True)  # waiting when its slice ends
    monitor.sample()
    job = monitor.jobs[5]
    job.pause(0, 1_000 * MS)
    job.resume(0, 1_100 * MS)  # 100 ms stopped by gang scheduling, inside the call
    cpu.cpu[100] = 10 * 4 * MS + 11 * MS  # what it really polled: 11 ms
    hook_writes(segment, 0, events=10, comm=10 * MS + 101 * MS)  # the call returned: 101 ms of wall time
    monitor.sample()
    (rank0,) = [s for s in monitor.stats(5) if s.rank == 0]
    assert rank0.t_comm == pytest.approx(0.011)
    assert rank0.t_cpu == pytest.approx(0.040)


def test_removing_a_job_removes_its_segment(segment: HookSegment) -> None:
    monitor, _ = monitor_of(segment)
    monitor.remove(5)
    assert not os.path.exists(f"/dev/shm{segment.name}")
    assert monitor.stats(5) == []


@pytest.mark.parametrize("in_call_at_stop", [True, False])
def test_whether_a_stop_fell_inside_a_call_is_read_while_the_rank_is_stopped(
    segment: HookSegment, in_call_at_stop: bool
) -> None:
    """The sample before a stop may predate a call entered (or left) just before the signal."""
    monitor, _ = entered_mpi(segment, 0)
    hook_writes(segment, 0, events=10, comm=10 * MS, in_call=not in_call_at_stop)  # the slot's last sample
    monitor.sample()
    monitor.switched(5, 0, running=False)
    hook_writes(segment, 0, events=10, comm=10 * MS, in_call=in_call_at_stop)  # what it really did
    # No heartbeat sampled the records during the stop: the resume reads them itself.
    monitor.switched(5, 0, running=True)
    assert (monitor.jobs[5].stopped_ns[0] > 0) is in_call_at_stop
