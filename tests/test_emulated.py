"""Emulated ranks (tools/emulated.py) under storm-nm's own core: what an emulated node manager reports for a
job that runs its time, fails, or is killed, with no process forked (the sockets are tools/emulator.py's,
tested end to end in test_cluster_emulated.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.nm.node import Node
from storm.tools.emulated import EmulatedProcesses, NoMeasurements, ranks_started, run_time, shell_done

T0 = 100.0


def node(tmp_path: Path, processes: EmulatedProcesses, name: str = "emu0") -> Node:
    core = Node(
        NMConfig(kill_grace=1.0), name, [0, 1], tmp_path / name, epoch="e", processes=processes,
        measurements=NoMeasurements(),
    )  # fmt: skip
    core.local.hook_library = None
    core.from_mm(p.NodeRegistered(node=name, mm_epoch="mm", report_interval=1.0), T0)
    return core


def launch(
    job_id: int, argv: tuple[str, ...] = ("sleep", "2"), env: dict[str, str] | None = None
) -> p.LaunchJob:
    return p.LaunchJob(
        job_id=job_id, name="t", kvsname=f"storm_{job_id}_0", size=2, row=0, node_index=0,
        ranks_per_node=(2,),
        slots=(p.RankSlot(rank=0, pe=0), p.RankSlot(rank=1, pe=1)), argv=argv, cwd="/tmp", env=env or {},
        uid=os.getuid(), gid=os.getgid(), user="u", output="o", error="",
    )  # fmt: skip


def started(core: Node, processes: EmulatedProcesses, job_id: int) -> None:
    """The emulator's part when a shell starts: its ranks exist at once."""
    assert processes.starting == [(core.name, job_id)]
    processes.starting.clear()
    job = core.jobs[job_id]
    pids = processes.spawn_ranks(core.name, job_id, [0, 1])
    assert pids is not None
    out = core.from_shell(b"s", ranks_started(job, pids), (job.shell_pid, os.getuid()), T0)
    assert [m.op for m in out.to_mm] == ["job_launched"]


def ends(core: Node, processes: EmulatedProcesses, job_id: int) -> list[p.Message]:
    """The emulator's part when the ranks have ended: the shell's reports; what the node sends the MM."""
    job = core.jobs[job_id]
    ended = processes.jobs[(core.name, job_id)]
    sent: list[p.Message] = []
    for msg in shell_done(job, ended):
        sent += core.from_shell(b"s", msg, (job.shell_pid, os.getuid()), T0).to_mm
    processes.reap(core.name, job_id)
    sent += core.shell_exited(job_id).to_mm
    return sent


def test_a_job_runs_its_time_and_ends_as_a_real_node_reports_it(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    assert core.from_mm(launch(7), T0).to_mm == []
    started(core, processes, 7)
    assert run_time(core.jobs[7].launch, 0.0) == (2.0, 0)
    processes.end("emu0", 7, 0)
    (done,) = ends(core, processes, 7)
    assert isinstance(done, p.JobNodeDone) and [e.exit_code for e in done.exits] == [0, 0]
    core.from_mm(p.Ack(job_id=7, what="job_node_done"), T0)
    assert core.jobs == {} and processes.procs == {}
    assert not (tmp_path / "emu0" / "jobs" / "7").exists()


def test_a_failing_command_reports_its_failed_ranks_at_once(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    core.from_mm(launch(8, ("false",)), T0)
    started(core, processes, 8)
    seconds, code = run_time(core.jobs[8].launch, 5.0)
    assert (seconds, code) == (0.0, 1)
    processes.end("emu0", 8, code)
    sent = ends(core, processes, 8)
    assert [m.op for m in sent] == ["rank_failed", "job_node_done"]


def test_a_kill_ends_the_ranks_by_its_signal_and_stops_with_them(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    core.from_mm(launch(9), T0)
    started(core, processes, 9)
    pids = processes.jobs[("emu0", 9)].ranks
    assert processes.states(list(pids.values())) == {pid: "S" for pid in pids.values()}
    out = core.from_mm(p.KillJob(job_id=9, reason="cancelled"), T0)
    assert out.escalate == [9] and [j.job_id for j in processes.killed] == [9]
    (done,) = ends(core, processes, 9)
    assert isinstance(done, p.JobNodeDone)
    assert [e.signal for e in done.exits] == [signal.SIGTERM, signal.SIGTERM]
    assert processes.end("emu0", 9, 0) is None  # its time, up later: nothing is left of it


def test_a_job_killed_before_its_ranks_exist_never_spawns_them(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    core.from_mm(launch(10), T0)
    core.from_mm(p.KillJob(job_id=10, reason="cancelled"), T0)
    assert processes.spawn_ranks("emu0", 10, [0, 1]) is None
    (done,) = ends(core, processes, 10)
    assert isinstance(done, p.JobNodeDone) and all(e.signal == signal.SIGTERM for e in done.exits)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (("/bin/true",), {}, (0.0, 0)),
        (("sleep", "0.25"), {}, (0.25, 0)),
        (("sleep", "1m"), {}, (3.0, 0)),  # not a number of seconds: the default
        (("python", "app.py"), {"STORM_EMULATED_SECONDS": "4.5"}, (4.5, 0)),
        (("python", "app.py"), {}, (3.0, 0)),
    ],
)
def test_the_run_time_comes_from_the_command(
    argv: tuple[str, ...], env: dict[str, str], expected: tuple[float, int]
) -> None:
    assert run_time(launch(1, argv, env), 3.0) == expected
