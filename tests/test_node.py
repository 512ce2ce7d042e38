"""The node manager's decisions (nm/node.py), driven directly: time passed in, the OS and the measurements
faked (tests/fakes.py), no sockets and no processes. Every message a node manager handles is here."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.nm.fcs import Klass, Measurement
from storm.nm.node import Node, Outcome
from tests.fakes import FakeMeasurements, FakeProcesses

T0 = 100.0
SHELL = b"shell-id"
CS_LIKE = Measurement(t_cpu=0.0005, t_comm=0.0005, c_comm=100)  # g = 10 us: fine-grained
COARSE = Measurement(t_cpu=5.0, t_comm=0.01, c_comm=10)  # g = 0.5 s: don't care


def make(tmp_path: Path, **config: object) -> tuple[Node, FakeProcesses, FakeMeasurements]:
    fake, measured = FakeProcesses(), FakeMeasurements()
    settings = NMConfig(kill_grace=1.0, **config)  # type: ignore[arg-type]
    node = Node(
        settings, "n0", [0, 1], tmp_path, epoch="nm-1", processes=fake, measurements=measured, cluster="c1"
    )
    return node, fake, measured


def registered(policy: str = "batch", epoch: str = "mm-1", **kw: object) -> p.NodeRegistered:
    fcs = p.FcsParameters(cslots_min=2, tslots_max=100)
    fields: dict[str, object] = dict(node="n0", mm_epoch=epoch, report_interval=1.0, policy=policy, fcs=fcs)
    fields.update(kw)
    return p.NodeRegistered(**fields)  # type: ignore[arg-type]


def launch(
    job_id: int, row: int = 0, ranks: tuple[int, ...] = (0, 1), tmp: Path = Path("/tmp")
) -> p.LaunchJob:
    return p.LaunchJob(
        job_id=job_id, name="t", kvsname=f"storm_{job_id}_abcd", size=len(ranks), row=row, node_index=0,
        ranks_per_node=(len(ranks),), slots=tuple(p.RankSlot(rank=r, pe=r % 2) for r in ranks),
        argv=("true",), cwd=str(tmp), env={}, uid=os.getuid(), gid=os.getgid(), user="u", output="o",
        error="",
    )  # fmt: skip


def beat(seq: int, row: int, epoch: str = "mm-1", resets: tuple[int, ...] = ()) -> p.Heartbeat:
    return p.Heartbeat(epoch=epoch, seq=seq, row=row, sent=T0, slice=0.1, resets=resets)


def ordered(node: Node, job_id: int, row: int = 0) -> p.ShellLaunch:
    """Launch the job: what its job shell is asked to do (a new job shell says it is ready first)."""
    out = node.from_mm(launch(job_id, row), T0)
    assert out.to_mm == []
    shell = node.jobs[job_id].shell_pid
    if out.watch_shells:
        assert [s.pid for s in out.watch_shells] == [shell]
    if not out.to_shells:  # a new job shell: the launch waits until it is ready
        out = node.from_shell(SHELL, p.ShellReady(pid=shell), (shell, os.getuid()), T0)
    (order,) = [m for peer, m in out.to_shells if isinstance(m, p.ShellLaunch) and m.launch.job_id == job_id]
    assert all(peer == SHELL for peer, _ in out.to_shells)
    return order


def start(node: Node, fake: FakeProcesses, job_id: int, row: int = 0) -> dict[int, int]:
    """Launch the job and let its shell report its two ranks started; returns rank -> pid."""
    ordered(node, job_id, row)
    shell = node.jobs[job_id].shell_pid
    pids = {0: fake.child(shell), 1: fake.child(shell)}
    started = shell_says(
        node, job_id, p.RanksStarted(job_id=job_id, pids={str(r): q for r, q in pids.items()})
    )
    assert started.to_mm == [
        p.JobLaunched(job_id=job_id, node="n0", pids={str(r): q for r, q in pids.items()})
    ]
    return pids


def shell_says(node: Node, job_id: int, msg: p.Message, pid: int | None = None) -> Outcome:
    shell = node.jobs[job_id].shell_pid if pid is None else pid
    return node.from_shell(SHELL, msg, (shell, os.getuid()), T0)


def test_it_registers_until_the_mm_answers_then_reports_and_registers_again_when_asked(
    tmp_path: Path,
) -> None:
    node, _, _ = make(tmp_path)
    assert [m.op for m in node.reports()] == ["register_node"]
    node.from_mm(registered(), T0)
    assert [m.op for m in node.reports()] == ["node_status"]
    out = node.from_mm(p.Reregister(reason="unknown epoch"), T0)
    assert out.report_now and [m.op for m in node.reports()] == ["register_node"]


def test_a_launch_goes_to_the_users_job_shell_with_a_segment_named_for_the_cluster_and_run(
    tmp_path: Path,
) -> None:
    node, fake, measured = make(tmp_path)
    order = ordered(node, 7)
    assert len(fake.shells) == 1 and fake.shells[0]["node"] == "n0"
    name = measured.segments[7]
    assert name.startswith("/storm-hook-c1-7-0-") and order.hook_segment == name
    assert order.jobdir == str(tmp_path / "jobs" / "7")
    assert node.from_mm(launch(7), T0) == Outcome()  # repeated: the first one is under way
    shell = node.jobs[7].shell_pid
    pids = {0: fake.child(shell), 1: fake.child(shell)}
    shell_says(node, 7, p.RanksStarted(job_id=7, pids={str(r): q for r, q in pids.items()}))
    assert measured.jobs[7].pids == {0: pids[0], 1: pids[1]}
    # The user's next job goes to the same job shell, at once.
    assert ordered(node, 8).launch.job_id == 8 and len(fake.shells) == 1
    assert node.jobs[8].shell_pid == shell
    # A second run of the job (another kvsname) gets another segment.
    other, _, measured2 = make(tmp_path / "b")
    other.from_mm(dataclasses.replace(launch(7), **{"kvsname": "storm_7_ffff"}), T0)
    assert measured2.segments[7] != name


def test_a_shell_message_from_another_process_changes_nothing(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    node.from_mm(launch(7), T0)
    impostor = fake.spawn()
    msg = p.RanksStarted(job_id=7, pids={"0": impostor, "1": fake.spawn()})
    assert shell_says(node, 7, msg, pid=impostor) == Outcome()
    assert not node.jobs[7].ranks_known
    assert node.from_shell(SHELL, p.ShellHello(job_id=8, pid=1), (1, 0), T0) == Outcome()  # unknown job
    # A job shell of the node that speaks of a job this NM does not know is told to stop it, and may
    # forget its report. Nothing else changes.
    shell = node.jobs[7].shell_pid
    unknown = node.from_shell(SHELL, p.ShellHello(job_id=8, pid=shell), (shell, 0), T0)
    assert unknown == Outcome(to_shells=[(SHELL, p.ShellStop(job_id=8))])
    done = node.from_shell(SHELL, p.ShellDone(job_id=8, exits=()), (shell, 0), T0)
    assert done == Outcome(to_shells=[(SHELL, p.Ack(job_id=8, what="shell_done"))])
    assert list(node.jobs) == [7]


def test_a_kill_freezes_the_ranks_before_listing_their_ucx_segments_and_sweeps_them(tmp_path: Path) -> None:
    """A rank still running while the list is taken could name a segment after it and leave it behind."""
    node, fake, _ = make(tmp_path)
    node.from_mm(registered(), T0)
    pids = start(node, fake, 7)
    fake.holds[pids[0]] = {"ucx_shm_posix_1a2b", "mpich_shm_other"}
    fake.shm |= {"ucx_shm_posix_1a2b", "ucx_shm_posix_ffff"}  # the second is no process of the job's
    node.from_mm(p.KillJob(job_id=7, reason="cancelled"), T0)
    assert fake.held_asked == [dict.fromkeys(pids.values(), True)]
    exits = (p.RankExit(rank=0, signal=15), p.RankExit(rank=1, signal=15))
    shell_says(node, 7, p.ShellDone(job_id=7, exits=exits))
    assert "ucx_shm_posix_1a2b" in fake.removed and fake.shm == {"ucx_shm_posix_ffff"}


def test_a_kill_terms_the_ranks_then_kills_after_the_grace_and_the_report_is_acked_away(
    tmp_path: Path,
) -> None:
    node, fake, measured = make(tmp_path)
    node.from_mm(registered(), T0)
    pids = start(node, fake, 7)
    job = node.jobs[7]
    out = node.from_mm(p.KillJob(job_id=7, reason="cancelled"), T0)
    assert out.escalate == [7]
    for pid in pids.values():
        assert (pid, signal.SIGCONT) in fake.signals and (pid, signal.SIGTERM) in fake.signals
    assert (SHELL, p.ShellStop(job_id=7)) in out.to_shells
    assert node.from_mm(p.KillJob(job_id=7, reason="again"), T0).escalate == []  # already under way
    node.escalate(7)
    assert all((pid, signal.SIGKILL) in fake.signals for pid in pids.values())
    exits = (p.RankExit(rank=0, signal=15), p.RankExit(rank=1, signal=15))
    fake.shm.add(f"mpich_shm_{job.launch.kvsname}")  # whatever the name: the sweep removes what it names
    done = shell_says(node, 7, p.ShellDone(job_id=7, exits=exits))
    assert done.to_shells == [(SHELL, p.Ack(job_id=7, what="shell_done"))]
    assert done.to_mm == [p.JobNodeDone(job_id=7, node="n0", exits=exits)]
    assert node.from_mm(p.KillJob(job_id=7, reason="late"), T0).to_mm == done.to_mm  # the report again
    assert done.to_mm[0] in node.reports()  # and until the MM acknowledges it
    node.from_mm(p.Ack(job_id=7, what="job_node_done"), T0)
    assert 7 not in node.jobs and not node.switcher.units and not measured.watches(7)
    assert not (tmp_path / "jobs" / "7").exists()
    assert node.from_mm(p.KillJob(job_id=7, reason="unknown"), T0).to_mm == [
        p.JobNodeDone(job_id=7, node="n0", exits=())
    ]


def test_a_failed_rank_fails_the_job_on_the_node_and_stops_the_others(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    pids = start(node, fake, 7)
    failed = p.RankExit(rank=1, exit_code=3)
    out = shell_says(node, 7, p.RankExited(job_id=7, exit=failed))
    assert out.to_mm == [p.RankFailed(job_id=7, node="n0", exit=failed)] and out.escalate == [7]
    assert (pids[0], signal.SIGTERM) in fake.signals and (pids[1], signal.SIGTERM) not in fake.signals


def test_pmi_barriers_go_to_the_mm_in_order_and_return_to_the_shell(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    start(node, fake, 7)
    barrier = p.PmiBarrierIn(job_id=7, node="n0", seq=0, kvs={"k": "v"})
    assert shell_says(node, 7, barrier).to_mm == [barrier]
    assert shell_says(node, 7, p.PmiBarrierIn(job_id=7, node="n0", seq=1, kvs={})) == Outcome()  # 0 pends
    # An MM that restarted meanwhile gets the pending barrier again.
    node.from_mm(registered(), T0)
    assert node.from_mm(registered(epoch="mm-2"), T0).to_mm == [barrier]
    answer = p.PmiBarrierOut(job_id=7, seq=0, kvs={"k": "v"})
    assert node.from_mm(answer, T0).to_shells == [(SHELL, answer)]
    assert node.from_mm(answer, T0) == Outcome()  # twice (an MM restart): the shell waits for one only
    assert shell_says(node, 7, p.PmiBarrierIn(job_id=7, node="n0", seq=5, kvs={})) == Outcome()  # not next


def test_a_job_shell_that_dies_ends_its_unreported_jobs_with_every_rank_failed(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    start(node, fake, 7)
    start(node, fake, 8)
    shell = node.jobs[7].shell_pid
    assert node.jobs[8].shell_pid == shell  # one job shell for the user's jobs
    shell_says(node, 8, p.ShellDone(job_id=8, exits=(p.RankExit(rank=0), p.RankExit(rank=1))))
    out = node.job_shell_ended(shell)
    (report,) = out.to_mm  # job 8 had reported already
    assert (
        isinstance(report, p.JobNodeDone) and report.job_id == 7 and [e.rank for e in report.exits] == [0, 1]
    )
    assert all("job shell ended" in e.error for e in report.exits)
    ordered(node, 9)  # the user's next job starts another job shell
    assert len(fake.shells) == 2 and node.jobs[9].shell_pid != shell


def test_the_shell_of_a_job_a_previous_nm_left_ends_that_job(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    start(node, fake, 7)
    (report,) = node.shell_exited(7).to_mm  # its pidfd, as a re-adopted job's is watched
    assert isinstance(report, p.JobNodeDone) and all("job shell ended" in e.error for e in report.exits)


def test_an_idle_job_shell_is_retired_and_the_next_job_starts_another(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path, shell_idle=1.0)
    start(node, fake, 7)
    assert node.tick(T0 + 5, T0 + 5).to_shells == []  # busy: never retired
    shell_says(node, 7, p.ShellDone(job_id=7, exits=(p.RankExit(rank=0), p.RankExit(rank=1))))
    assert node.tick(T0 + 5.1, T0 + 5.1).to_shells == []  # idle from now on
    assert node.tick(T0 + 6.2, T0 + 6.2).to_shells == [(SHELL, p.ShellRetire())]
    assert node.tick(T0 + 9, T0 + 9).to_shells == []  # once
    ordered(node, 8)
    assert len(fake.shells) == 2
    # The NM exits leaving its jobs: a job shell with a job serves it on for the next NM.
    assert node.retire_shells(T0 + 10, everyone=False).to_shells == []
    assert node.retire_shells(T0 + 10, everyone=True).to_shells == [(SHELL, p.ShellRetire())]


def test_a_launch_that_cannot_start_is_reported_failed_at_once(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    bad = dataclasses.replace(
        launch(7), **{"slots": (p.RankSlot(rank=0, pe=5),), "size": 1, "ranks_per_node": (1,)}
    )
    out = node.from_mm(bad, T0)
    (report,) = out.to_mm
    assert isinstance(report, p.JobNodeDone) and "PE(s) [5] do not exist" in report.exits[0].error
    assert fake.shells == [] and out.watch == []


def test_gang_heartbeats_stop_the_other_rows_and_a_silent_mm_lets_everything_run(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path, heartbeat_timeout=1.0)
    node.from_mm(registered("gang"), T0)
    first, second = start(node, fake, 7, row=0), start(node, fake, 8, row=1)
    out = node.heartbeat(beat(1, 0), T0, T0)
    assert out.check is not None and set(out.check.expected) == set(second.values())
    assert fake.stopped == set(second.values())
    node.heartbeat(beat(2, 1), T0 + 0.1, T0 + 0.1)
    assert fake.stopped == set(first.values())
    assert node.heartbeat(beat(2, 0), T0 + 0.2, T0 + 0.2) == Outcome()  # a replay changes nothing
    assert node.heartbeat(beat(9, 0, epoch="mm-0"), T0 + 0.2, T0 + 0.2) == Outcome()  # another MM's
    assert fake.stopped == set(first.values())
    assert node.tick(T0 + 0.5, T0 + 0.5).check is None  # silent for less than the timeout
    assert node.tick(T0 + 2.0, T0 + 2.0).check is not None and fake.stopped == set()


def test_heartbeats_are_ignored_under_batch(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    node.from_mm(registered("batch"), T0)
    start(node, fake, 7, row=0)
    start(node, fake, 8, row=1)
    assert node.heartbeat(beat(1, 0), T0, T0) == Outcome() and fake.stopped == set()


def test_fcs_classifies_at_the_end_of_a_slot_and_reports_the_change_at_once(tmp_path: Path) -> None:
    node, fake, measured = make(tmp_path)
    node.from_mm(registered("fcs"), T0)
    start(node, fake, 7, row=0)
    start(node, fake, 8, row=1)
    measured.measured[(7, 0)] = measured.measured[(7, 1)] = COARSE
    measured.measured[(8, 0)] = measured.measured[(8, 1)] = CS_LIKE
    node.heartbeat(beat(1, 0), T0, T0)  # row 0's first slot begins
    reports = []
    for seq in range(2, 7):  # rows alternate; each job gets its cslots_min = 2 slots and more
        reports += node.heartbeat(beat(seq, seq % 2), T0 + seq / 10, 1e9 + seq).to_mm
    (stats,) = reports  # one report, at the slot that changed job 7's class
    assert isinstance(stats, p.JobStats) and stats.job_id == 7
    assert {(c.rank, c.old, c.new, c.time) for c in stats.changes} == {
        (0, "CS", "DC", 1e9 + 3),
        (1, "CS", "DC", 1e9 + 3),
    }
    assert {r.klass for r in stats.ranks} == {"DC"}
    assert node.switcher.classes == {(7, 0): Klass.DC, (7, 1): Klass.DC}
    assert (7, 0) in measured.resets and (8, 0) not in measured.resets  # measurements restart on a change
    # Job 8 (CS) has the PEs to itself in its slot; in job 7's, job 7 (DC) runs, spin-blocking, and job 8
    # does not (a CS process never runs outside its own slot).
    node.heartbeat(beat(7, 1), T0 + 1, 1e9 + 7)
    assert fake.stopped == set(node.jobs[7].pids.values())
    node.heartbeat(beat(8, 0), T0 + 1.1, 1e9 + 8)
    assert fake.stopped == set(node.jobs[8].pids.values()) and measured.jobs[7].waits == {0: True, 1: True}


@pytest.mark.parametrize("policy", ["batch", "sb"])
def test_without_cycling_every_rank_runs_and_sb_spin_blocks(tmp_path: Path, policy: str) -> None:
    node, fake, measured = make(tmp_path)
    node.from_mm(registered(policy), T0)
    start(node, fake, 7)
    node.tick(T0, T0)
    assert measured.samples == 1  # a slice of the default length: measurements go on
    assert fake.stopped == set()
    assert measured.jobs[7].waits == ({0: True, 1: True} if policy == "sb" else {})


def test_the_mm_ending_a_job_the_node_still_runs_stops_it(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    pids = start(node, fake, 7)
    out = node.from_mm(registered(stale_jobs=(7,)), T0)
    assert out.escalate == [7] and (pids[0], signal.SIGTERM) in fake.signals


def test_name_answers_go_to_the_shell_that_asked(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    start(node, fake, 7)
    ask = p.PmiName(job_id=7, node="n0", seq=3, action="lookup", service="svc")
    assert shell_says(node, 7, ask).to_mm == [ask]
    answer = p.PmiNameResult(job_id=7, seq=3, ok=True, port="tcp://x")
    assert node.from_mm(answer, T0).to_shells == [(SHELL, answer)]


def test_rows_move_with_the_mm_and_a_moved_job_runs_in_its_new_row(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    node.from_mm(registered("gang"), T0)
    start(node, fake, 7, row=0)
    second = start(node, fake, 8, row=1)
    node.heartbeat(beat(1, 0), T0, T0)
    assert fake.stopped == set(second.values())
    node.from_mm(p.JobRows(rows={"8": 0}), T0)  # the MM packed job 8 into row 0
    node.heartbeat(beat(2, 0), T0 + 0.1, T0 + 0.1)
    assert fake.stopped == set() and node.switcher.units[(8, 0)].row == 0


def test_spawned_processes_follow_their_job_and_a_failed_one_fails_it(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    node.from_mm(registered("gang"), T0)
    start(node, fake, 7, row=1)
    shell = node.jobs[7].shell_pid
    child = fake.child(shell)
    spawned = p.Spawned(job_id=7, world=1, parent=0, pids={"0": child}, pes={"0": 0})
    assert shell_says(node, 7, spawned).to_mm == [p.JobSpawned(job_id=7, node="n0", world=1, processes=1)]
    node.heartbeat(beat(1, 0), T0, T0)  # row 0 runs: job 7's ranks and its child stop
    assert child in fake.stopped
    failed = p.RankExit(rank=0, exit_code=4)
    out = shell_says(node, 7, p.SpawnExited(job_id=7, world=1, exit=failed))
    (failure,) = out.to_mm
    assert isinstance(failure, p.SpawnFailed) and failure.exit == failed and out.escalate == [7]
    stranger = fake.spawn()  # not the shell's child: refused
    bogus = p.Spawned(job_id=7, world=2, parent=0, pids={"0": stranger}, pes={"0": 0})
    assert shell_says(node, 7, bogus) == Outcome()


def test_an_aborted_rank_fails_the_job_but_a_hello_changes_nothing(tmp_path: Path) -> None:
    node, fake, _ = make(tmp_path)
    start(node, fake, 7)
    assert shell_says(node, 7, p.ShellHello(job_id=7, pid=node.jobs[7].shell_pid)) == Outcome()
    aborted = p.RankExit(rank=0, exit_code=1)
    out = shell_says(node, 7, p.RankAborted(job_id=7, exit=aborted))
    assert out.to_mm == [p.RankFailed(job_id=7, node="n0", exit=aborted)] and node.jobs[7].killing
    assert node.from_mm(p.Error(code="x", text="y"), T0) == Outcome()  # logged only


def test_node_status_names_a_job_launched_only_once_its_ranks_have_started(tmp_path: Path) -> None:
    """The MM takes a launched listing for a lost job_launched: a shell still forking must not count."""
    node, fake, _ = make(tmp_path)
    node.from_mm(registered(), T0)
    node.from_mm(launch(7), T0)
    [status] = [m for m in node.reports() if isinstance(m, p.NodeStatus)]
    assert (status.jobs, status.launched) == ((7,), ())
    start(node, fake, 8)
    [status] = [m for m in node.reports() if isinstance(m, p.NodeStatus)]
    assert (status.jobs, status.launched) == ((7, 8), (8,))
