"""Emulated ranks and job shells (tools/emulated.py) under storm-nm's own core: what an emulated node manager
reports for a job that runs its time, fails, or is killed, with no process forked; a user's job shell that
serves several jobs and is retired once idle, as storm-nm's are. The tests carry messages between the core
and the emulated shells as tools/emulator.py does (its sockets are tested end to end in
test_cluster_emulated.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.nm.node import Node, Outcome
from storm.tools.emulated import INIT_PID, EmulatedJob, EmulatedProcesses, NoMeasurements, run_time

T0 = 100.0
IDLE = 2.0  # [nm] shell_idle


def node(tmp_path: Path, processes: EmulatedProcesses, name: str = "emu0") -> Node:
    core = Node(
        NMConfig(kill_grace=1.0, shell_idle=IDLE), name, [0, 1], tmp_path / name, epoch="e",
        processes=processes, measurements=NoMeasurements(),
    )  # fmt: skip
    core.local.hook_library = None
    core.local.shells_endpoint = "emulated"
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


class Driver:
    """tools/emulator.py's part, without sockets or clocks: the core's messages for job shells go to them,
    and what they say goes to the core, until nothing is left; what the core sends storm-mm is kept."""

    def __init__(self, core: Node, processes: EmulatedProcesses) -> None:
        self.core = core
        self.processes = processes
        self.to_mm: list[p.Message] = []
        self.heard: list[str] = []  # what the shells said, in order ("exited": a shell's end)
        self.timers: list[tuple[float, EmulatedJob, int]] = []

    def carry_out(self, out: Outcome) -> list[p.Message]:
        before = len(self.to_mm)
        self.to_mm += out.to_mm
        for identity, msg in out.to_shells:
            self.processes.to_shell(identity, msg)
        while self.processes.said:
            shell, said = self.processes.said.popleft()
            self.heard.append("exited" if said is None else said.op)
            if said is None:
                reply = self.core.job_shell_ended(shell.pid)
            else:
                reply = self.core.from_shell(shell.identity, said, (shell.pid, shell.uid), T0)
            self.to_mm += reply.to_mm
            for identity, msg in reply.to_shells:
                self.processes.to_shell(identity, msg)
        self.timers += self.processes.timers
        self.processes.timers.clear()
        return self.to_mm[before:]

    def from_mm(self, msg: p.Message) -> list[p.Message]:
        return self.carry_out(self.core.from_mm(msg, T0))

    def time_up(self) -> list[p.Message]:
        """Every launched job's run time passes."""
        for _, job, code in self.timers:
            self.processes.time_up(job, code)
        self.timers.clear()
        return self.carry_out(Outcome())


def ops(messages: list[p.Message]) -> list[str]:
    return [m.op for m in messages]


def test_a_job_runs_its_time_and_ends_as_a_real_node_reports_it(tmp_path: Path) -> None:
    processes = EmulatedProcesses(default_run_time=0.0)
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    assert ops(drive.from_mm(launch(7))) == ["job_launched"]
    # The shell said it was ready, was given the launch, and its ranks exist, as the shell's children.
    assert drive.heard == ["shell_ready", "ranks_started"]
    (shell,) = processes.shells.values()
    ranks = core.jobs[7].pids
    assert {processes.parent(pid) for pid in ranks.values()} == {shell.pid}
    assert [seconds for seconds, _, _ in drive.timers] == [2.0]
    (done,) = drive.time_up()
    assert isinstance(done, p.JobNodeDone) and [e.exit_code for e in done.exits] == [0, 0]
    assert drive.heard[2:] == ["rank_exited", "shell_done"]
    drive.from_mm(p.Ack(job_id=7, what="job_node_done"))
    assert core.jobs == {} and shell.jobs == {}
    assert not (tmp_path / "emu0" / "jobs" / "7").exists()
    assert list(processes.procs) == [shell.pid]  # the job shell waits for the user's next job


def test_one_job_shell_serves_the_users_jobs_and_is_retired_once_idle(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    drive.from_mm(launch(1, ("true",)))
    drive.from_mm(launch(2, ("sleep", "1")))
    (shell,) = processes.shells.values()
    assert set(shell.jobs) == {1, 2} and core.jobs[1].shell_pid == core.jobs[2].shell_pid == shell.pid
    assert ops(drive.time_up()) == ["job_node_done", "job_node_done"]
    for job_id in (1, 2):
        drive.from_mm(p.Ack(job_id=job_id, what="job_node_done"))
    assert drive.carry_out(core.tick(T0 + 1, T0)) == [] and shell.alive  # seen idle from now on
    assert drive.carry_out(core.tick(T0 + IDLE, T0)) == [] and shell.alive  # not for long enough
    drive.carry_out(core.tick(T0 + 1 + IDLE, T0))
    assert drive.heard[-1] == "exited" and not shell.alive
    assert processes.procs == {} and processes.shells == {} and core.local.shells.all() == []
    drive.from_mm(launch(3, ("true",)))  # a new job: a new job shell
    (again,) = processes.shells.values()
    assert again.pid != shell.pid and set(again.jobs) == {3}


def test_a_failing_command_reports_its_failed_ranks_at_once(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    drive.from_mm(launch(8, ("false",)))
    assert run_time(core.jobs[8].launch, 5.0) == (0.0, 1)
    sent = drive.time_up()
    assert ops(sent) == ["rank_failed", "job_node_done"]
    assert isinstance(sent[-1], p.JobNodeDone) and [e.exit_code for e in sent[-1].exits] == [1, 1]


def test_a_kill_ends_the_ranks_by_its_signal_and_stops_with_them(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    drive.from_mm(launch(9))
    pids = list(core.jobs[9].pids.values())
    assert processes.states(pids) == {pid: "S" for pid in pids}
    out = core.from_mm(p.KillJob(job_id=9, reason="cancelled"), T0)
    assert out.escalate == [9]
    (done,) = drive.carry_out(out)
    assert isinstance(done, p.JobNodeDone)
    assert [e.signal for e in done.exits] == [signal.SIGTERM, signal.SIGTERM]
    assert processes.states(pids) == {pid: None for pid in pids}
    assert drive.time_up() == []  # its time, up later: nothing is left of it


def test_a_job_killed_before_its_shell_is_ready_ends_by_its_stop(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    out = core.from_mm(launch(10), T0)
    assert out.to_shells == [] and len(out.watch_shells) == 1  # held until the shell is ready
    out = core.from_mm(p.KillJob(job_id=10, reason="cancelled"), T0)
    sent = drive.carry_out(out)  # the shell says it is ready: the launch, then the stop
    assert isinstance(sent[-1], p.JobNodeDone) and all(e.signal == signal.SIGTERM for e in sent[-1].exits)
    (shell,) = processes.shells.values()
    assert list(processes.procs) == [shell.pid]  # no rank of it is left


def test_a_stopped_rank_dies_of_a_terminating_signal_only_once_continued(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    drive.from_mm(launch(11))
    rank = core.jobs[11].pids[0]
    assert processes.signal_group(rank, signal.SIGSTOP) and processes.states([rank]) == {rank: "T"}
    assert processes.signal_group(rank, signal.SIGTERM) and processes.states([rank]) == {rank: "T"}
    assert processes.signal_group(rank, signal.SIGCONT) and processes.states([rank]) == {rank: None}
    assert processes.signal_group(rank, 0) is False and processes.session_members(rank) == []
    sent = drive.carry_out(Outcome())  # the shell reports it; the node reports the failure, stops the rest
    assert ops(sent) == ["rank_failed", "job_node_done"]
    assert isinstance(sent[-1], p.JobNodeDone)
    assert [e.signal for e in sent[-1].exits] == [signal.SIGTERM, signal.SIGTERM]


def test_a_job_shell_killed_outright_fails_its_jobs_and_the_node_kills_its_orphans(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    drive.from_mm(launch(12))
    (shell,) = processes.shells.values()
    ranks = list(core.jobs[12].pids.values())
    assert processes.signal(shell.pid, signal.SIGKILL)
    assert {processes.parent(pid) for pid in ranks} == {INIT_PID}  # orphans run on
    (done,) = drive.carry_out(Outcome())  # the shell's end reaches the core
    assert isinstance(done, p.JobNodeDone) and all(e.failed for e in done.exits)
    assert processes.procs == {}  # the core killed the orphans through their sessions
    assert drive.time_up() == []


def test_a_retired_job_shell_finishes_its_jobs_before_it_exits(tmp_path: Path) -> None:
    processes = EmulatedProcesses()
    core = node(tmp_path, processes)
    drive = Driver(core, processes)
    drive.from_mm(launch(13))
    (shell,) = processes.shells.values()
    processes.to_shell(shell.identity, p.ShellRetire())
    assert shell.alive
    (done,) = drive.time_up()
    assert isinstance(done, p.JobNodeDone) and [e.exit_code for e in done.exits] == [0, 0]
    assert drive.heard[-2:] == ["shell_done", "exited"] and not shell.alive
    processes.to_shell(shell.identity, p.ShellLaunch(launch=launch(14), jobdir="/x"))  # nobody to take it
    assert not processes.said and not processes.timers and processes.procs == {}


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
