"""End to end under FCS and spin-block: real BSP ranks classified live; switches checked on /proc."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import pyte
import pytest

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, storm_cli
from tests.test_cluster_gang import rank_pids, stopped

pytestmark = pytest.mark.slow

CSLOTS_MIN = 20  # Table 2's default, which these tests keep


def bsp(granularity: str, *extra: str, seconds: float = 12) -> list[str]:
    return python_app("bsp", "--granularity", granularity, "--seconds", str(seconds), *extra)


def classes(client: Client, job_id: int) -> dict[int, str]:
    """rank -> class, as the nodes last reported it."""
    return {r.rank: r.klass for r in client.call(p.GetClasses(job_ids=(job_id,)), p.ClassesView).processes}


def timeline(client: Client, job_id: int) -> list[p.ClassChange]:
    return list(client.call(p.GetClasses(job_ids=(job_id,), history=True), p.ClassesView).changes)


def final_classes(changes: list[p.ClassChange], ranks: int) -> dict[int, str]:
    """Every process starts CS; its last change says where it ended."""
    final = dict.fromkeys(range(ranks), "CS")
    for change in changes:
        final[change.rank] = change.new
    return final


class Terminal:
    """A program on a real pseudo-terminal, its output rendered by a terminal emulator (pyte), as a user
    at a terminal of this size would see it."""

    def __init__(self, argv: list[str], env: dict[str, str], columns: int = 100, lines: int = 30) -> None:
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True
        )
        os.close(slave)

    def pump(self) -> None:
        while self.master >= 0 and select.select([self.master], [], [], 0.05)[0]:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the program closed the terminal
                return
            if not data:
                return
            self.raw += data
            self.stream.feed(data)

    def text(self) -> str:
        self.pump()
        return "\n".join(self.screen.display)

    def background(self, needle: str) -> str:
        """The background colour of the first cell showing ``needle``."""
        for y, line in enumerate(self.screen.display):
            x = line.find(needle)
            if x >= 0:
                return str(self.screen.buffer[y][x].bg)
        raise AssertionError(f"{needle!r} is not on the screen:\n{self.text()}")

    def interrupt(self) -> int:
        """Ctrl-C, as the terminal would send it to the foreground program; its exit code."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=10)
        finally:
            self.pump()
            os.close(self.master)
            self.master = -1
        return code


def check_views(cluster: LocalCluster, env: dict[str, str], fine: int, coarse: int, imbalanced: int) -> None:
    """storm classes (table and JSON) and storm watch (once, and live on a terminal) while the jobs run."""
    jobs = (fine, coarse, imbalanced)
    listing = storm_cli(cluster, "classes", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert {(r["job_id"], r["rank"]) for r in rows} == {(j, r) for j in jobs for r in (0, 1)}
    assert {r["node"] for r in rows} == {"node0", "node1"}
    imb = {r["rank"]: r for r in rows if r["job_id"] == imbalanced}
    assert imb[0]["wait_mode"] == "spin-block" and imb[0]["tslots"] >= CSLOTS_MIN
    text = storm_cli(cluster, "classes", str(imbalanced)).stdout
    assert text.splitlines()[0].split()[:6] == ["JOB", "RANK", "NODE", "PE", "CLASS", "T_CPU(s)"]
    assert [line.split()[4] for line in text.splitlines()[1:]] == ["F", "DC"]
    frame = storm_cli(cluster, "watch", "--once", "--color", "never").stdout
    assert "policy fcs, MPL 3" in frame and f"{imbalanced} F" in frame and f"{imbalanced} DC" in frame
    # storm watch live, on a terminal: cells coloured by class, and the screen given back on Ctrl-C.
    term = Terminal(
        [sys.executable, "-m", "storm.tools.cli", "watch", "--interval", "0.2"],
        {**env, "STORM_MM": cluster.endpoint, "TERM": "xterm"},
    )
    try:
        poll(
            lambda: f"{imbalanced} F" in term.text() and "Ctrl-C" in term.text(),
            20,
            "storm watch to draw",
        )
        assert term.background(f"{imbalanced} F") == "brown"  # yellow
        assert term.background(f"{imbalanced} DC") == "blue"
        assert term.background(f"{coarse} DC") == "blue"
        screen = term.text()
        assert "policy fcs, MPL 3, 100 ms slices, active row" in screen
        assert all(f"{j} " in screen and "RUNNING" in screen for j in jobs)
    finally:
        code = term.interrupt()
    assert code == 0
    # It drew in the alternate screen and gave the user's screen back (pyte renders no alternate screen).
    assert term.raw.startswith(b"\033[?1049h") and term.raw.endswith(b"\033[?1049l"), term.raw[-40:]


def test_fcs_classifies_fine_coarse_and_imbalanced_jobs_as_the_paper_does(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """Section 3.2's classes: balanced 1 ms -> CS; 2 s granularity -> DC; 2:1 imbalanced -> fast F, slow DC.

    The three jobs share the two PEs in three rows. The imbalance is slightly over 2:1, as in the paper's
    footnote 4: at exactly 2:1 a fast rank's granularity sits on CS_thresh (2 ms).
    """
    cluster = make_cluster(policy="fcs", mm_mpl=3, nm_profile=True)
    env = {**os.environ, "STORM_TEST_DIR": str(tmp_path)}
    with cluster.client() as client:
        fine = client.submit(bsp("1ms"), 2, cwd=str(tmp_path), name="fine", env=env)
        coarse = client.submit(bsp("2s"), 2, cwd=str(tmp_path), name="coarse", env=env)
        imbalanced = client.submit(
            bsp("1ms", "--imbalance", "2.2", "--slow", "odd"), 2, cwd=str(tmp_path), name="imb", env=env
        )
        jobs = (fine, coarse, imbalanced)

        # Live: the nodes report the classes as they form; the CLI and the watch view show them.
        seen: list[object] = []

        def settled() -> bool:
            seen[:] = [client.call(p.GetClasses(), p.ClassesView).processes]
            return classes(client, imbalanced) == {0: "F", 1: "DC"}

        try:
            poll(settled, 30, "the imbalanced job's F and DC")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {seen}; changes {timeline(client, imbalanced)}") from None
        check_views(cluster, env, fine, coarse, imbalanced)

        ended = [client.wait(j, timeout=JOB_TIMEOUT) for j in jobs]
        assert [j.state for j in ended] == ["COMPLETED"] * 3, [j.reason for j in ended]
        histories = {j: timeline(client, j) for j in jobs}
        check_profile(client, ended[2])
    profile = storm_cli(cluster, "stats", "--profile", str(imbalanced)).stdout.splitlines()
    assert profile[1].split()[:4] == ["RANK", "NODE", "CLASS", "WALL(s)"]
    assert sorted(line.split()[2] for line in profile[2:]) == ["CS", "CS", "DC", "F"]

    # (The changes in the message: a rank judged after it left MPI ended DC here once, nm/monitor.py's Gone.)
    assert final_classes(histories[fine], 2) == {0: "CS", 1: "CS"}, histories[fine]
    assert final_classes(histories[coarse], 2) == {0: "DC", 1: "DC"}, histories[coarse]
    assert final_classes(histories[imbalanced], 2) == {0: "F", 1: "DC"}, histories[imbalanced]
    # Settled within about cslots_MIN of each process's slots: the first evaluation decided, and it held.
    for job in (coarse, imbalanced):
        changes = histories[job]
        assert len(changes) == 2, changes
        assert all(c.old == "CS" and CSLOTS_MIN <= c.tslots <= CSLOTS_MIN + 2 for c in changes), changes
    assert (tmp_path / f"storm-{fine}.out").read_text().startswith("bsp: OK")
    history = storm_cli(cluster, "classes", "--history", str(imbalanced)).stdout.splitlines()
    assert history[0].split() == ["TIME", "JOB", "RANK", "NODE", "SLOT", "CHANGE"]
    assert sorted(line.split()[-3:] for line in history[1:]) == [["CS", "->", "DC"], ["CS", "->", "F"]]


def check_profile(client: Client, job: p.JobInfo) -> None:
    """The imbalanced job's profile: each rank's time split by class, adding up to its run time, and the fast
    rank (F) waiting for the slow one (DC) far more than the slow one waits."""
    entries = client.call(p.GetStats(job_id=job.id), p.StatsView).profile
    assert sorted((e.rank, e.klass) for e in entries) == [(0, "CS"), (0, "F"), (1, "CS"), (1, "DC")]
    assert job.start_time is not None and job.end_time is not None
    run = job.end_time - job.start_time
    for rank in (0, 1):
        assert 0.8 * run < sum(e.wall for e in entries if e.rank == rank) < 1.05 * run, entries
    for e in entries:
        parts = (e.compute, e.poll, e.blocked, e.stopped, e.queued)
        assert all(v >= 0 for v in parts) and sum(parts) <= 1.02 * e.wall + 0.05, e
    waiting = {e.klass: (e.poll + e.blocked) / e.wall for e in entries if e.klass in ("F", "DC")}
    assert waiting["F"] > 0.3 and waiting["F"] > 2 * waiting["DC"], entries


def test_a_job_wide_reset_returns_every_process_to_cs_in_the_same_slot(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """tslots_max small: an imbalanced job is reset to CS (all ranks in one slot) and reclassified."""
    cluster = make_cluster(policy="fcs", mm_mpl=2, fcs_cslots_min=5, fcs_tslots_max=12)
    with cluster.client() as client:
        job = client.submit(bsp("1ms", "--imbalance", "2.5", seconds=5), 2, cwd=str(tmp_path))
        assert client.wait(job, timeout=JOB_TIMEOUT).state == "COMPLETED"
        changes = timeline(client, job)
    resets = [c for c in changes if c.new == "CS"]
    by_slot: dict[int, set[int]] = {}
    for change in resets:
        by_slot.setdefault(change.tslots, set()).add(change.rank)
    log = "\n".join(map(str, changes))
    # 5 s at 100 ms slices in a row of its own: about 50 slots, so 3 or 4 resets of the whole job, each
    # in one slot for both ranks, every tslots_max slots. Nodes and MM count whole slots from the launch,
    # so they agree unless the launch reached a node just across a heartbeat from the MM's placement.
    slots = sorted(by_slot)
    assert len(slots) >= 3 and all(ranks == {0, 1} for ranks in by_slot.values()), log
    assert [b - a for a, b in itertools.pairwise(slots)] == [12] * (len(slots) - 1), log
    assert slots[0] == 12, log
    for slot in slots:  # and each time reclassified cslots_min slots later
        after = sorted(c.new for c in changes if c.tslots == slot + 5 and c.old == "CS")
        assert after in (["DC", "F"], []), log  # [] if the job ended first
        assert after or slot == slots[-1], log


def test_spin_block_runs_every_job_all_the_time_with_spin_block_waits(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(policy="sb", mm_mpl=2)
    env = {**os.environ, "STORM_TEST_DIR": str(tmp_path)}
    with cluster.client() as client:
        jobs = [client.submit(bsp("1ms", seconds=4), 2, cwd=str(tmp_path), env=env) for _ in range(2)]
        poll(lambda: all(len(rank_pids(j, tmp_path)) == 2 for j in jobs), 30, "both jobs' ranks to exist")
        assert sorted(client.job(j).row for j in jobs) == [0, 1]  # two rows, yet both run
        poll(
            lambda: (
                [r.wait_mode for r in client.call(p.GetClasses(), p.ClassesView).processes]
                == ["spin-block"] * 4
            ),
            10,
            "every rank to spin-block",
        )
        pids = [pid for j in jobs for pid in rank_pids(j, tmp_path)]
        samples = 0
        while client.job(jobs[0]).state == "RUNNING" and samples < 200:
            assert not any(stopped(pid) for pid in pids)  # nobody is ever stopped
            samples += 1
        assert samples >= 20
        view = client.call(p.GetMatrix(), p.MatrixView)
        assert (view.policy, view.active_row) == ("sb", None)
        assert [client.wait(j, timeout=JOB_TIMEOUT).state for j in jobs] == ["COMPLETED"] * 2
    assert "spin-block scheduling" in storm_cli(cluster, "matrix").stdout
