"""End to end: ``storm run`` on a throwaway cluster, as a user runs it: the real command, its output on its
own stdout and stderr while the job runs, its exit code the job's, Ctrl-C in a real terminal (a pty of its
own, and tmux when it is installed), and a restart of storm-mm while it waits."""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, start_cluster

pytestmark = pytest.mark.slow

# A cancel's grace period longer than any test waits: a job ignoring SIGTERM is still there to detach from.
KILL_GRACE = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"), nodes=2, pes_per_node=1, nm_kill_grace=KILL_GRACE)
    yield c
    c.down()


def run_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "storm.tools.cli", "run", *args]


def environment(cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, "STORM_MM": cluster.endpoint}


def storm_run(cluster: LocalCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        run_argv(*args), env=environment(cluster), cwd=cwd, capture_output=True, timeout=JOB_TIMEOUT,
        check=False,
    )  # fmt: skip


def newest_job(cluster: LocalCluster) -> int:
    with cluster.client() as client:
        return max(job.id for job in client.jobs(everything=True))


class Output:
    """What a process writes to one descriptor (a pipe, or a pty's master), read with deadlines."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""

    def until(self, pattern: str, timeout: float = JOB_TIMEOUT) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.text)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout:g} s in output: {self.text!r}")
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: a pty whose other side is closed
                    data = b""
                if not data:
                    raise AssertionError(f"output ended without {pattern!r}: {self.text!r}")
                self.text += data.decode(errors="replace")
        return found


def test_hello_prints_both_ranks_and_ok_exits_0_and_the_file_has_it_too(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    done = storm_run(cluster, tmp_path, "-n", "2", "--", *python_app("hello"))
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert re.search(r"^rank 0/2 on node0 .*expected 3", out, re.MULTILINE), out
    assert re.search(r"^rank 1/2 on node1 .*expected 3", out, re.MULTILINE), out
    assert out.rstrip().endswith("hello: OK")
    job_id = newest_job(cluster)
    assert (tmp_path / f"storm-{job_id}.out").read_text() == out  # the job's own file, as ever


def test_label_prefixes_every_line_with_its_rank_and_stderr_goes_to_stderr(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    script = 'echo "out $STORM_RANK"; echo "err $STORM_RANK" >&2; printf "tail $STORM_RANK"'
    done = storm_run(
        cluster, tmp_path, "-n", "2", "--label", "-o", "o-%t", "-e", "e-%t", "--", "sh", "-c", script
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.decode().splitlines()) == ["0: out 0", "0: tail 0", "1: out 1", "1: tail 1"]
    assert sorted(done.stderr.decode().splitlines()) == ["0: err 0", "1: err 1"]
    for rank in (0, 1):  # the files have the ranks' own bytes, unlabelled
        assert (tmp_path / f"o-{rank}").read_text() == f"out {rank}\ntail {rank}"
        assert (tmp_path / f"e-{rank}").read_text() == f"err {rank}\n"


def test_a_failing_rank_gives_its_exit_code_and_a_signal_128_plus_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    failed = storm_run(cluster, tmp_path, "-n", "2", "--", *python_app("fail", "--rank", "1", "--code", "7"))
    assert failed.returncode == 7
    assert "fail: rank 1/2 exits with code 7" in failed.stderr.decode()  # the rank's own words, on stderr
    assert re.search(r"storm: job \d+ FAILED: rank 1 exited with code 7", failed.stderr.decode())
    killed = storm_run(cluster, tmp_path, "-n", "1", "--", "sh", "-c", "kill -9 $$")
    assert killed.returncode == 128 + 9, killed.stderr


def test_a_job_that_never_starts_exits_non_zero_with_a_clear_message(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    refused = storm_run(cluster, tmp_path, "-n", "64", "--", "true")
    assert refused.returncode == 1
    assert "64 ranks requested, but the cluster has only 2 PEs" in refused.stderr.decode()


def test_output_reaches_the_terminal_while_the_job_runs(cluster: LocalCluster, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.02; done; echo second"
    proc = subprocess.Popen(
        run_argv("-n", "1", "--", "sh", "-c", script), env=environment(cluster), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        out = Output(proc.stdout.fileno())
        out.until("first\n")  # before the job can end: it waits for the file created only now
        with cluster.client() as client:
            assert client.job(newest_job(cluster)).state == "RUNNING"
        go.touch()
        out.until("second\n")
        assert proc.wait(JOB_TIMEOUT) == 0
    finally:
        proc.kill()
        proc.communicate()


def test_a_job_waiting_in_the_queue_is_said_so_once_on_stderr(cluster: LocalCluster, tmp_path: Path) -> None:
    go = tmp_path / "go"
    with cluster.client() as client:
        blocker = client.submit(
            ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"], 2, cwd=str(tmp_path)
        )
        poll(lambda: client.job(blocker).state == "RUNNING", JOB_TIMEOUT, "the cluster to be full")
        proc = subprocess.Popen(
            run_argv("-n", "1", "--", "echo", "ran"), env=environment(cluster), cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            err = Output(proc.stderr.fileno())
            err.until(r"storm: job \d+ queued and waiting for resources \(Resources\)\n")
            go.touch()
            stdout, rest = proc.communicate(timeout=JOB_TIMEOUT)
        finally:
            proc.kill()
        assert proc.returncode == 0 and stdout == b"ran\n"
        assert (err.text + rest.decode()).count("queued and waiting") == 1
        assert client.wait(blocker, timeout=JOB_TIMEOUT).state == "COMPLETED"


def test_an_unstreamed_jobs_ranks_write_their_files_directly_and_a_streamed_jobs_into_pipes(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    """What jobs not run by storm run cost is what they always cost: no pipe, no copy."""
    script = "readlink /proc/$$/fd/1; readlink /proc/$$/fd/2"
    job_id = client.submit(["sh", "-c", script], 1, cwd=str(tmp_path), output=str(tmp_path / "plain.out"))
    assert client.wait(job_id, timeout=JOB_TIMEOUT).state == "COMPLETED"
    plain = tmp_path / "plain.out"
    assert plain.read_text().splitlines() == [str(plain), str(plain)]
    streamed = storm_run(cluster, tmp_path, "-n", "1", "-o", "streamed.out", "--", "sh", "-c", script)
    lines = streamed.stdout.decode().splitlines()
    assert len(lines) == 2 and all(line.startswith("pipe:[") for line in lines) and lines[0] != lines[1]
    assert (tmp_path / "streamed.out").read_text() == streamed.stdout.decode()


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with cluster.client() as c:
        yield c


# ---------------------------------------------------------------------------------------------- Ctrl-C

# Runs a command in a session of its own with the pty on its stdin as its controlling terminal: the kernel's
# line discipline then turns a ^C written to the master into SIGINT for the foreground process group.
IN_TERMINAL = (
    "import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


class Terminal:
    """``storm run`` on a pty of its own, as in a terminal."""

    def __init__(self, cluster: LocalCluster, cwd: Path, *args: str) -> None:
        master, slave = os.openpty()
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, "-c", IN_TERMINAL, *run_argv(*args)], env=environment(cluster), cwd=cwd,
            stdin=slave, stdout=slave, stderr=slave,
        )  # fmt: skip
        os.close(slave)
        self.out = Output(master)

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def rank_pid(text: str) -> int:
    return int(re.findall(r"started (\d+)", text)[-1])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_ctrl_c_in_a_terminal_cancels_the_job_and_leaves_nothing_behind(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    term = Terminal(cluster, tmp_path, "-n", "1", "--", "sh", "-c", "echo started $$; exec sleep 600")
    try:
        pid = rank_pid(term.out.until(r"started \d+").group(0))
        job_id = newest_job(cluster)
        term.ctrl_c()
        term.out.until(rf"storm: cancelling job {job_id}")
        assert term.proc.wait(JOB_TIMEOUT) == 130
        term.out.until(rf"storm: job {job_id} CANCELLED")
    finally:
        term.close()
    job = client.job(job_id)
    assert job.state == "CANCELLED" and job.reason.startswith("cancelled by")
    assert gone(pid)


def test_a_second_ctrl_c_detaches_and_says_how_to_follow_the_job(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    script = "trap '' TERM; echo started $$; while :; do sleep 0.05; done"  # outlives the cancel's SIGTERM
    term = Terminal(cluster, tmp_path, "-n", "1", "--", "sh", "-c", script)
    try:
        pid = rank_pid(term.out.until(r"started \d+").group(0))
        job_id = newest_job(cluster)
        term.ctrl_c()
        term.out.until(rf"storm: cancelling job {job_id}")
        term.ctrl_c()
        term.out.until(rf"storm: detached from job {job_id}; .*storm show {job_id}")
        assert term.proc.wait(JOB_TIMEOUT) == 130
        assert not gone(pid) and client.job(job_id).state == "RUNNING"  # left to its fate: being cancelled
    finally:
        term.close()
    os.killpg(pid, signal.SIGKILL)  # the cancel's grace period is long here: end it now
    assert client.wait(job_id, timeout=JOB_TIMEOUT).state == "CANCELLED"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (the pty tests stand in)")
def test_ctrl_c_in_tmux_cancels_the_job(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    sock = str(tmp_path / "tmux.sock")
    command = shlex.join(
        [
            "env",
            f"STORM_MM={cluster.endpoint}",
            *run_argv("-n", "1", "--", "sh", "-c", "echo started $$; exec sleep 600"),
        ]
    )

    def tmux(*args: str) -> str:
        return subprocess.run(
            ["tmux", "-S", sock, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    tmux(
        "new-session",
        "-d",
        "-x",
        "200",
        "-y",
        "50",
        "-c",
        str(tmp_path),
        f"{command}; echo EXIT=$?; sleep 600",
    )
    try:
        screen: Callable[[], str] = lambda: tmux("capture-pane", "-p", "-J")  # noqa: E731
        poll(lambda: "started" in screen(), JOB_TIMEOUT, "the job's first line in the pane")
        pid = rank_pid(screen())
        job_id = newest_job(cluster)
        tmux("send-keys", "C-c")
        poll(lambda: "EXIT=" in screen(), JOB_TIMEOUT, "storm run to exit")
        text = screen()
        assert f"storm: cancelling job {job_id}" in text and "EXIT=130" in text, text
    finally:
        tmux("kill-server")
    assert client.job(job_id).state == "CANCELLED"
    poll(lambda: gone(pid), JOB_TIMEOUT, "the rank to be gone")


# ---------------------------------------------------------------------------------------------- restarts


def test_a_restart_of_storm_mm_while_storm_run_waits_is_survived_and_said(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    own = make_cluster(nodes=1, pes_per_node=1)
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; echo after; exit 3"
    proc = subprocess.Popen(
        run_argv("-n", "1", "--", "sh", "-c", script), env=environment(own), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        Output(proc.stdout.fileno()).until("before\n")
        own.restart_mm()
        err = Output(proc.stderr.fileno())
        err.until("storm: storm-mm restarted: output the job wrote meanwhile may be missing here")
        go.touch()
        stdout, _ = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 3  # the job's end was heard from the new storm-mm
    assert b"after\n" in stdout  # output written after the reattachment reaches the terminal


def test_a_stopped_client_holds_up_neither_the_ranks_nor_storm_mm_and_is_told_what_it_missed(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    """A terminal that takes nothing (the client stopped, as by Ctrl-Z) costs a bounded window: the job
    writes far more than that and ends meanwhile; the client, continued, gets what fitted and the count of
    the rest, and the job's file has every byte."""
    go, size = tmp_path / "go", 8_000_000
    script = f"while [ ! -e {go} ]; do sleep 0.02; done; head -c {size} /dev/zero | tr '\\0' x"
    argv = run_argv("-n", "1", "-o", "big.out", "--", "sh", "-c", script)
    proc = subprocess.Popen(
        argv, env=environment(cluster), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        poll(lambda: client.jobs() and client.jobs()[0].state == "RUNNING", JOB_TIMEOUT, "the job to run")
        job_id = client.jobs()[0].id
        proc.send_signal(signal.SIGSTOP)
        go.touch()
        assert client.wait(job_id, timeout=JOB_TIMEOUT).state == "COMPLETED"  # while nobody reads
        proc.send_signal(signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 0, stderr
    missed = re.search(rb"storm: (\d+) bytes of the job's output did not reach this terminal", stderr)
    assert missed is not None, stderr
    assert 0 < len(stdout) < size and len(stdout) + int(missed[1]) == size
    assert set(stdout) == {ord("x")}
    assert (tmp_path / "big.out").stat().st_size == size


def test_a_job_cancelled_in_the_queue_exits_non_zero_saying_it_never_started(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    blocker = client.submit(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"], 2, cwd=str(tmp_path))
    poll(lambda: client.job(blocker).state == "RUNNING", JOB_TIMEOUT, "the cluster to be full")
    proc = subprocess.Popen(
        run_argv("-n", "1", "--", "echo", "never"), env=environment(cluster), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        queued = Output(proc.stderr.fileno()).until(r"storm: job (\d+) queued")
        assert client.cancel((int(queued[1]),)) == {queued[1]: "cancelled"}
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        proc.kill()
        proc.communicate()
        go.touch()
    assert proc.returncode == 130 and stdout == b""
    assert re.search(
        rf"storm: job {queued[1]} CANCELLED before it started: cancelled by \w+", stderr.decode()
    )
    assert client.wait(blocker, timeout=JOB_TIMEOUT).state == "COMPLETED"
