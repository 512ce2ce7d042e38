"""A restarted node manager's side of a restart, with real processes and sockets but no cluster.

- LocalJobs.recover: a "shell" left by a previous NM (a real session of real processes) is re-adopted when it
  is the same process (pid and start time), its stopped ranks are continued, and its exit is seen through a
  pidfd (as for a shell that is not our child); a reused pid is never signalled; a shell that ended is
  finished from the exits it wrote; a job without the NM's own records is swept.
- The job shell (nm/shell.py, a real process) re-sends its state to each new NM it reconnects to: a PMI
  barrier nobody answered, and rank exits and its final report sent while no NM listened.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import NMConfig
from storm.mpihook.stats import WAIT_POLL, WAIT_SPINBLOCK, HookSegment, segment_name
from storm.nm.jobdir import JobDir
from storm.nm.local_jobs import LocalJob, LocalJobs
from storm.nm.monitor import Monitor
from storm.nm.processes import LinuxProcesses
from storm.nm.shell_link import Frames, frame
from storm.nm.switcher import ContextSwitcher
from tests.helpers import poll

# A stand-in job shell: a session leader whose two "ranks" each lead a session of their own, as a job
# shell's do; or (argv[1] == "group"), as a storm-nm from before shared job shells left them, each in a
# process group of its own in the shell's session.
FAKE_SHELL = """
import subprocess, sys
own = {"process_group": 0} if sys.argv[1:] == ["group"] else {"start_new_session": True}
ranks = [subprocess.Popen(["sleep", "60"], **own) for _ in range(2)]
print(" ".join(str(r.pid) for r in ranks), flush=True)
for r in ranks:
    r.wait()
"""


def launch_message(job_id: int, cwd: Path, argv: tuple[str, ...] = ("true",), **kw: object) -> p.LaunchJob:
    fields: dict[str, object] = dict(
        job_id=job_id, name="t", kvsname=f"storm_{job_id}_0000", size=2, row=0, node_index=0,
        ranks_per_node=(2,), slots=(p.RankSlot(rank=0, pe=0), p.RankSlot(rank=1, pe=0)), argv=argv,
        cwd=str(cwd), env={"PATH": os.environ["PATH"]}, uid=os.getuid(), gid=os.getgid(), user="u",
        output="out-%t", error="",
    )  # fmt: skip
    fields.update(kw)
    return p.LaunchJob(**fields)  # type: ignore[arg-type]


def local_jobs(run_dir: Path) -> LocalJobs:
    proc = LinuxProcesses()
    return LocalJobs(
        NMConfig(kill_grace=1.0), "n0", [0], run_dir, processes=proc, switcher=ContextSwitcher(proc),
        monitor=Monitor(proc, "n0"),
    )  # fmt: skip


def state(pid: int) -> str | None:
    return LinuxProcesses().states([pid])[pid]


@pytest.fixture
def fake_shell(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], dict[int, int]]]:
    style = getattr(request, "param", "session")
    shell = subprocess.Popen(
        [sys.executable, "-c", FAKE_SHELL, style], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert shell.stdout is not None
    ranks = dict(enumerate(int(pid) for pid in shell.stdout.readline().split()))
    yield shell, ranks
    for leader in [shell.pid, *ranks.values()]:
        for pid in LinuxProcesses().session_members(leader):
            os.kill(pid, signal.SIGKILL)
    shell.wait()
    shell.stdout.close()


def left_by_old_nm(
    run_dir: Path, launch: p.LaunchJob, shell_pid: int, ranks: dict[int, int], segment: str = ""
) -> JobDir:
    """The job directory and record a previous NM wrote for this job (through its own code)."""
    old = local_jobs(run_dir)
    jobdir = JobDir.of(run_dir, launch.job_id)
    jobdir.create(launch.uid, launch.gid, p.encode(launch))
    job = LocalJob(launch=launch, dir=jobdir, shell_pid=shell_pid, shell_start=old.os.start_time(shell_pid))
    job.hook_segment = segment
    job.pids = ranks
    job.starts = {rank: old.os.start_time(pid) or 0 for rank, pid in ranks.items()}
    old.save_record(job)
    return jobdir


def hook_segment(job_id: int) -> str:
    """The job's mpihook segment as the old NM made it, rank 1 told to spin-block."""
    segment = HookSegment.create(segment_name(job_id, 0), job_id, 2, os.getuid(), os.getgid())
    segment.set_wait(1, WAIT_SPINBLOCK, 120_000)
    segment.close()
    return segment.name


def test_a_live_shell_is_readopted_its_stopped_ranks_continue_and_its_exit_is_seen(
    tmp_path: Path, fake_shell: tuple[subprocess.Popen[str], dict[int, int]]
) -> None:
    shell, ranks = fake_shell
    left_by_old_nm(tmp_path, launch_message(7, tmp_path), shell.pid, ranks, hook_segment(7))
    os.killpg(ranks[1], signal.SIGSTOP)  # time slicing had stopped it when the old NM died
    poll(lambda: state(ranks[1]) == "T", 5, "rank 1 to stop")

    async def scenario() -> list[LocalJob]:
        new = local_jobs(tmp_path)
        exited: list[LocalJob] = []
        gone = asyncio.Event()

        def on_exit(job: LocalJob) -> None:
            asyncio.get_running_loop().remove_reader(job.shell_pidfd)
            os.close(job.shell_pidfd)
            exited.append(job)
            gone.set()

        adopted = new.recover()
        assert [j.launch.job_id for j in adopted] == [7]
        asyncio.get_running_loop().add_reader(adopted[0].shell_pidfd, on_exit, adopted[0])
        job = new.jobs[7]
        assert (job.shell_pid, job.pids, job.done) == (shell.pid, ranks, None)
        assert job.shell_pidfd >= 0 and job.ranks_known
        assert {u.rank: u.pid for u in new.switcher.units.values()} == ranks
        poll(lambda: state(ranks[1]) in ("S", "R"), 5, "rank 1 to be continued")
        segment = new.monitor.jobs[7].segment  # measured again, every rank polling as the new NM assumes
        assert [segment.wait_mode(i)[0] for i in (0, 1)] == [WAIT_POLL, WAIT_POLL]
        assert not new.started(job, {0: 1, 1: 2})  # the shell's repeated report changes nothing
        assert job.pids == ranks
        for pid in ranks.values():  # the ranks end: the shell, not our child, exits
            os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(gone.wait(), 10)
        new.monitor.remove(7)
        return exited

    exited = asyncio.run(scenario())
    assert [j.launch.job_id for j in exited] == [7]


def test_a_reused_shell_pid_is_left_alone_and_the_job_finished(
    tmp_path: Path, fake_shell: tuple[subprocess.Popen[str], dict[int, int]]
) -> None:
    shell, ranks = fake_shell
    jobdir = left_by_old_nm(tmp_path, launch_message(8, tmp_path), shell.pid, ranks)
    record = jobdir.load_record()
    assert record is not None
    jobdir.save_record({**record, "shell_start": int(record["shell_start"]) - 1})  # type: ignore[call-overload]

    async def scenario() -> LocalJob:
        new = local_jobs(tmp_path)
        new.recover()
        return new.jobs[8]

    job = asyncio.run(scenario())
    assert job.shell_pid == 0 and job.shell_pidfd == -1  # never to be signalled
    assert job.done is not None
    assert [e.rank for e in job.done.exits] == [0, 1] and all(e.error for e in job.done.exits)
    # The ranks, still the processes the record names, are stopped with the job; the "reused" shell pid is
    # not signalled: it exits by itself once they are gone.
    assert shell.wait(timeout=10) == 0


def test_a_shell_that_ended_meanwhile_is_finished_from_its_exits_file(tmp_path: Path) -> None:
    launch = launch_message(9, tmp_path)
    gone = subprocess.Popen(["sleep", "60"], start_new_session=True)
    start = LinuxProcesses().start_time(gone.pid)
    gone.kill()
    gone.wait()
    segment = hook_segment(9)
    jobdir = left_by_old_nm(tmp_path, launch, gone.pid, {}, segment)
    record = jobdir.load_record()
    assert record is not None and start is not None
    jobdir.save_record({**record, "shell_start": start})
    exits = (p.RankExit(rank=0, exit_code=0), p.RankExit(rank=1, exit_code=4))
    jobdir.exits.write_bytes(p.encode(p.ShellDone(job_id=9, exits=exits)))

    async def scenario() -> LocalJob:
        new = local_jobs(tmp_path)
        new.recover()
        return new.jobs[9]

    job = asyncio.run(scenario())
    assert job.done is not None and job.done.exits == exits and job.done.reason == ""
    assert not (Path("/dev/shm") / segment.lstrip("/")).exists()  # finished: its segment is gone


@pytest.mark.parametrize(
    ("damage", "fake_shell"), [("no launch copy", "session"), ("bad ranks", "group")], indirect=["fake_shell"]
)
def test_a_job_whose_records_are_unusable_is_swept(
    tmp_path: Path, fake_shell: tuple[subprocess.Popen[str], dict[int, int]], damage: str
) -> None:
    """Swept by its ranks' sessions; a job of an older storm-nm, whose ranks were in its shell's session,
    by that session (its ranks need not be known)."""
    shell, ranks = fake_shell
    jobdir = left_by_old_nm(tmp_path, launch_message(10, tmp_path), shell.pid, ranks)
    if damage == "no launch copy":
        jobdir.nm_launch.unlink()  # the launch the ranks were started from is gone: nothing to follow
    else:
        record = jobdir.load_record()
        assert record is not None
        del record["own_shell"]  # written before job shells were shared
        jobdir.save_record({**record, "ranks": {"0": "garbage"}})

    async def scenario() -> LocalJobs:
        new = local_jobs(tmp_path)
        new.recover()
        return new

    new = asyncio.run(scenario())
    assert new.jobs == {} and new.switcher.units == {} and not jobdir.path.exists()
    shell.wait(timeout=10)
    poll(lambda: all(state(pid) in (None, "Z") for pid in ranks.values()), 10, "the ranks to be killed")


# ---------------------------------------------------------------------------------------------- job shell

# Each rank enters one PMI barrier, then waits for its go file and exits with 2 + its rank.
RANK = """
import os, pathlib, socket, sys, time
rank = int(os.environ["PMI_RANK"])
pmi = socket.socket(fileno=int(os.environ["PMI_FD"])).makefile("rwb")
pmi.write(b"cmd=barrier_in\\n")
pmi.flush()
assert pmi.readline().startswith(b"cmd=barrier_out rc=0"), "barrier failed"
go = pathlib.Path(f"go{rank}")
while not go.exists():
    time.sleep(0.01)
sys.exit(2 + rank)
"""


class FakeNM:
    """The NM's end of the shells' socket (nm/shell_link.py): a Unix stream socket listening on the path, as
    each new storm-nm does; it accepts the shell's connection and answers the connection that spoke last."""

    def __init__(self, path: Path) -> None:
        path.unlink(missing_ok=True)  # the socket file a previous NM left is replaced
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(str(path))
            self.listener.listen()
        except BaseException:
            self.listener.close()
            raise
        self.peers: dict[socket.socket, Frames] = {}
        self.peer: socket.socket | None = None
        self.got: list[p.Message] = []
        self.taken: set[int] = set()

    def until(self, wanted: type[p.Message], check: object = None, timeout: float = 15.0) -> p.Message:
        """The first message of type ``wanted`` (passing ``check``) not returned before, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for msg in self.got:  # each is returned once
                if isinstance(msg, wanted) and (check is None or check(msg)) and id(msg) not in self.taken:  # type: ignore[operator]
                    self.taken.add(id(msg))
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {wanted.op} within {timeout} s; got {[m.op for m in self.got]}")
            readable, _, _ = select.select([self.listener, *self.peers], [], [], left)
            for sock in readable:
                if sock is self.listener:
                    conn, _ = self.listener.accept()
                    self.peers[conn] = Frames(p.MAX_NODE_MESSAGE)
                else:
                    self._receive(sock)

    def _receive(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:  # the shell went
            del self.peers[sock]
            sock.close()
            if self.peer is sock:
                self.peer = None
            return
        for body in self.peers[sock].feed(data):
            self.got.append(p.decode(body, p.MAX_NODE_MESSAGE))
            self.peer = sock

    def send(self, msg: p.Message) -> None:
        assert self.peer is not None, "no job shell has spoken on a connection still open"
        self.peer.sendall(frame(p.encode(msg)))

    def close(self) -> None:
        """The NM goes: its socket and connections close (the shell sees it go, and connects again)."""
        self.listener.close()
        for sock in self.peers:
            sock.close()
        self.peers.clear()
        self.peer = None


def test_the_job_shell_tells_each_new_nm_what_it_missed(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(RANK)
    # Two ranks here, a third on another node: barriers go through the NM.
    launch = launch_message(
        11, tmp_path, argv=(sys.executable, str(tmp_path / "rank.py")), size=3, ranks_per_node=(2, 1)
    )
    jobdir = JobDir.of(tmp_path / "run", 11)
    jobdir.create(os.getuid(), os.getgid(), p.encode(launch))
    endpoint = tmp_path / "shells.sock"
    nm = FakeNM(endpoint)
    shell = subprocess.Popen(
        [sys.executable, "-m", "storm.nm.shell_server", "--endpoint", str(endpoint), "--node", "n0",
         "--cpus", "0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert nm.until(p.ShellReady) == p.ShellReady(pid=shell.pid)
        nm.send(p.ShellLaunch(launch=launch, jobdir=str(jobdir.path)))
        started = nm.until(p.RanksStarted)
        assert isinstance(started, p.RanksStarted) and len(started.pids) == 2
        nm.until(p.PmiBarrierIn, lambda m: m.seq == 0)
        nm.close()  # the NM dies before the MM's answer came

        nm = FakeNM(endpoint)  # the next NM: the shell asks again, and gets its answer
        assert nm.until(p.RanksStarted) == started
        assert p.ShellReady(pid=shell.pid) in nm.got
        nm.until(p.PmiBarrierIn, lambda m: m.seq == 0)
        nm.send(p.PmiBarrierOut(job_id=11, seq=0, kvs={}))
        poll(lambda: all(state(pid) in ("S", "R") for pid in started.pids.values()), 5, "ranks to run")
        nm.close()  # and that NM dies too

        for rank in (0, 1):  # both ranks end while no NM listens
            (tmp_path / f"go{rank}").touch()
        poll(jobdir.exits.exists, 10, "the shell to record the exits")
        nm = FakeNM(endpoint)
        done = nm.until(p.ShellDone)
        assert isinstance(done, p.ShellDone)
        assert [(e.rank, e.exit_code) for e in done.exits] == [(0, 2), (1, 3)]
        assert nm.until(p.ShellDone) == done  # again with the whole state, each exit first
        exited = {m.exit.rank: m.exit.exit_code for m in nm.got if isinstance(m, p.RankExited)}
        assert exited == {0: 2, 1: 3}
        nm.send(p.Ack(job_id=11, what=p.ShellDone.op))
        # Acknowledged, and an NM that did not start it gives it no new job: it exits.
        assert shell.wait(timeout=10) == 0
    finally:
        nm.close()
        if shell.poll() is None:
            shell.kill()
            shell.wait()
        assert shell.stderr is not None
        log = shell.stderr.read()
        shell.stderr.close()
    assert log.count("reconnected to storm-nm") == 2, log


def test_a_job_shell_serves_its_users_jobs_until_retired(tmp_path: Path) -> None:
    """Two jobs in one job shell, each rank in a session of its own; a stopped job ends by SIGTERM; retired,
    the shell exits once its jobs are over."""
    endpoint = tmp_path / "shells.sock"
    nm = FakeNM(endpoint)
    shell = subprocess.Popen(
        [sys.executable, "-m", "storm.nm.shell_server", "--endpoint", str(endpoint), "--node", "n0",
         "--cpus", "0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        nm.until(p.ShellReady)
        for job_id, argv in ((12, ("true",)), (13, ("sleep", "60"))):
            launch = launch_message(job_id, tmp_path, argv=argv)
            jobdir = JobDir.of(tmp_path / "run", job_id)
            jobdir.create(os.getuid(), os.getgid(), p.encode(launch))
            nm.send(p.ShellLaunch(launch=launch, jobdir=str(jobdir.path)))
        done = nm.until(p.ShellDone, lambda m: m.job_id == 12)
        assert [(e.rank, e.exit_code, e.error) for e in done.exits] == [(0, 0, ""), (1, 0, "")]
        started = nm.until(p.RanksStarted, lambda m: m.job_id == 13)
        assert isinstance(started, p.RanksStarted)
        for pid in started.pids.values():
            assert os.getsid(pid) == pid and os.getsid(pid) != os.getsid(shell.pid)
        nm.send(p.ShellRetire())  # job 13 still runs: the shell stays
        nm.send(p.ShellStop(job_id=13))
        stopped = nm.until(p.ShellDone, lambda m: m.job_id == 13)
        assert {e.signal for e in stopped.exits} == {signal.SIGTERM}
        assert shell.wait(timeout=10) == 0  # retired: no acknowledgement awaited
    finally:
        nm.close()
        if shell.poll() is None:
            shell.kill()
            shell.wait()
        assert shell.stderr is not None
        shell.stderr.close()
