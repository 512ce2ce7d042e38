"""The I/O phase of the node model (Program.io_ns: ClusterSchedSim's compute -> I/O -> communicate), against
timelines worked out by hand. Times in ms."""

from __future__ import annotations

import pytest

from storm.tools.sim.cosched.node import Control, CoschedModel, PeCounters
from storm.tools.sim.cosched.program import Pattern, Program

MS = 1_000_000
LONG = 10**12


def hog(ms: float) -> Program:
    return Program((round(ms * MS),), 1, Pattern.NONE)


def test_io_releases_the_cpu_to_the_other_process() -> None:
    # A computes 2 ms and does 3 ms of I/O, twice; B is a 6 ms hog; fluid sharing. 0-4: both at half, A's
    # computation ends at 4 (B has 2 ms done); 4-7: A in I/O, B alone (5 ms done); 7-9: both at half, B
    # ends at 9; A computes its last 1 ms alone 9-10, then I/O 10-13. Idle only during A's last I/O.
    for shortcut in (True, False):
        model = CoschedModel(1, shortcut=shortcut)
        model.add_job(0, 1, Program((2 * MS,), 2, Pattern.NONE, io_ns=3 * MS), [0])
        model.add_job(0, 2, hog(6), [0])
        model.run_until_done(LONG)
        assert (model.completion_ns(1), model.completion_ns(2)) == (13 * MS, 9 * MS)
        assert model.pe_counters(0) == PeCounters(busy_ns=10 * MS, idle_ns=3 * MS)
        c = model.counters((1, 0))
        assert (c.compute_ns, c.io_ns, c.cpu_ns, c.iterations) == (4 * MS, 6 * MS, 4 * MS, 2)


def test_io_comes_between_the_computation_and_the_communication() -> None:
    # A ring of 2 alone on its PEs: each iteration is 1 ms of computation, 2 ms of I/O, then the exchange
    # (latency 0.1 ms), so 3 iterations take 3 x 3.1 ms, which is also the program's dedicated time.
    program = Program.balanced(2, MS, 3, Pattern.RING, latency_ns=100_000, io_ns=2 * MS)
    assert program.dedicated_ns() == 3 * 3_100_000
    model = CoschedModel(2)
    model.add_job(0, 1, program, [0, 1])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == 3 * 3_100_000
    c = model.counters((1, 0))
    assert (c.compute_ns, c.io_ns, c.comm_ns, c.events) == (3 * MS, 6 * MS, 300_000, 3)
    assert model.pe_counters(0) == PeCounters(busy_ns=3 * MS, spin_ns=300_000, idle_ns=6 * MS)


def test_a_job_with_io_never_takes_the_shortcut() -> None:
    # shortcut.py knows no I/O: alone on its PEs, such a job still runs event by event (an event per I/O).
    program = Program.balanced(2, MS, 50, Pattern.RING, io_ns=MS)
    model = CoschedModel(2)
    model.add_job(0, 1, program, [0, 1])
    model.run_until_done(LONG)
    assert model.completion_ns(1) == 50 * 2 * MS
    assert not model._jobs[1].alone and model.events_run >= 2 * 50


def test_io_ends_while_stopped_and_the_process_goes_on_once_continued() -> None:
    # A computes 1 ms then does 2 ms of I/O (1-3); stopped at 2, continued at 5: the I/O ended at 3, and
    # A computes its second iteration 5-6, then I/O 6-8. Stopped time counts as stopped, not as I/O.
    model = CoschedModel(1)
    model.add_job(0, 1, Program((MS,), 2, Pattern.NONE, io_ns=2 * MS), [0])
    model.control(2 * MS, (1, 0), Control(stopped=True))
    model.control(5 * MS, (1, 0), Control())
    model.run_until_done(LONG)
    assert model.completion_ns(1) == 8 * MS
    c = model.counters((1, 0))
    assert (c.io_ns, c.stopped_ns) == (MS + 2 * MS, 3 * MS)


def test_negative_io_is_refused() -> None:
    with pytest.raises(ValueError, match="I/O"):
        Program((MS,), 1, io_ns=-1)
