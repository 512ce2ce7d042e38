"""The soak: 1,000 short jobs with random failures and cancels over three node managers.

Jobs are the fastest there are (`true`, `false`, a shell that kills itself, `sleep` to be cancelled or to run
out of time) on one or two ranks, kept ~60 outstanding so the queue stays realistic. Afterwards there must be
no process left but the daemons' own, no shared-memory segment, no job directory, no more descriptors in any
daemon than before, and every job must have ended in the state its kind implies: the store matches what ran.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, fd_count, live_descendants, poll, shm_entries

pytestmark = pytest.mark.slow

JOBS = 1000
SEED = 1000
WINDOW = 60  # jobs outstanding (queued or running) at once


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    weight: int
    argv: tuple[str, ...]
    state: str  # the final state the job must reach
    exit_code: int | None  # and its exit code (None: not checked)
    ranks: tuple[int, ...] = (1, 2)
    time_limit: float | None = None
    cancel: str = ""  # "now": right after submitting it; "running": once it runs


KINDS = [
    Kind("true", 40, ("true",), "COMPLETED", 0),
    Kind("false", 12, ("false",), "FAILED", 1),
    Kind("exit 3", 5, ("sh", "-c", "exit 3"), "FAILED", 3),
    Kind("kill -9", 10, ("sh", "-c", "kill -9 $$"), "FAILED", 128 + 9),
    Kind("kill -TERM", 5, ("sh", "-c", "kill -TERM $$"), "FAILED", 128 + 15),
    # One rank killed by a signal while the other would sleep: the NM stops the survivor.
    Kind(
        "rank 1 killed",
        8,
        ("sh", "-c", '[ "$PMI_RANK" = 1 ] && kill -9 $$; exec sleep 30'),
        "FAILED",
        137,
        (2,),
    ),
    Kind("cancel now", 10, ("sleep", "30"), "CANCELLED", None, cancel="now"),
    Kind("cancel running", 8, ("sleep", "30"), "CANCELLED", None, cancel="running"),
    Kind("timeout", 2, ("sleep", "30"), "TIMEOUT", None, time_limit=0.5),
]


Snapshot = dict[str, Any]


def mapped_shm() -> set[str]:
    """/dev/shm entries some live process has mapped: in use (by this cluster, or by another one that runs
    on this machine at the same time), so not leaked."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            found.update(line.split("/dev/shm/", 1)[1].strip() for line in maps if "/dev/shm/" in line)
    return found


def snapshot(cluster: LocalCluster) -> Snapshot:
    """What the soak must not leave more of: processes, unmapped segments, the daemons' fds, job dirs."""
    assert cluster.mm is not None
    daemons = [cluster.mm.pid, *(nm.pid for nm in cluster.nms)]
    return {
        "processes": sorted(live_descendants()),
        "shm": sorted(shm_entries() - mapped_shm()),
        "fds": {pid: fd_count(pid) for pid in daemons},
        "job dirs": sorted(
            str(d) for name in cluster.node_names() for d in (cluster.node_dir(name) / "jobs").iterdir()
        ),
    }


def test_a_thousand_short_jobs_with_failures_and_cancels(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = make_cluster(nodes=3, pes_per_node=2)
    rng = random.Random(SEED)
    plan = rng.choices(KINDS, weights=[k.weight for k in KINDS], k=JOBS)
    kinds: dict[int, Kind] = {}
    with cluster.client() as client:
        # One job on every PE: each daemon has run a job, so caches and connections are warm.
        warm = client.wait(client.submit(["true"], 6, cwd=str(tmp_path), output="/dev/null"), JOB_TIMEOUT)
        assert warm.state == "COMPLETED" and len(warm.nodes) == 3
        poll(lambda: not snapshot(cluster)["job dirs"], 15.0, "the warm-up job to be forgotten")
        before = snapshot(cluster)
        started = time.monotonic()
        to_cancel: set[int] = set()  # "cancel running" jobs not yet cancelled
        outstanding = 0

        def room() -> bool:
            nonlocal outstanding
            outstanding = refresh(client, to_cancel)
            return outstanding < WINDOW

        for kind in plan:
            if outstanding >= WINDOW:
                poll(room, JOB_TIMEOUT, "a job of the window to end", interval=0.01)
            job_id = client.submit(
                list(kind.argv), rng.choice(kind.ranks), cwd=str(tmp_path), output="/dev/null",
                time_limit=kind.time_limit,
            )  # fmt: skip
            kinds[job_id] = kind
            outstanding += 1
            if kind.cancel == "now":
                client.cancel((job_id,))
            elif kind.cancel == "running":
                to_cancel.add(job_id)
        poll(lambda: refresh(client, to_cancel) == 0, JOB_TIMEOUT, "every job to end", interval=0.01)
        seconds = time.monotonic() - started
        jobs = {j.id: j for j in client.jobs(everything=True)}
        # Nothing left behind: processes, shared memory, the daemons' descriptors, job directories.
        try:
            poll(lambda: not left_behind(before, snapshot(cluster)), 15.0, "everything the soak made to go")
        except AssertionError:
            raise AssertionError(f"left behind: {left_behind(before, snapshot(cluster))}") from None
        after = snapshot(cluster)

    # The store matches what ran: every job of the soak, in the state and with the exit code of its kind.
    assert sorted(jobs) == sorted([warm.id, *kinds])
    wrong = [
        (j, kinds[j].name, jobs[j].state, jobs[j].exit_code, jobs[j].reason)
        for j in kinds
        if not ended_as(jobs[j], kinds[j])
    ]
    assert not wrong, f"{len(wrong)} job(s) ended otherwise than their kind: {wrong[:10]}"

    states = collections.Counter(j.state for j in jobs.values() if j.id != warm.id)
    by_kind = collections.Counter(k.name for k in kinds.values())
    rate = JOBS / seconds
    with capsys.disabled():
        print(f"\nsoak: {JOBS} jobs over {len(cluster.nms)} NMs in {seconds:.1f} s ({rate:.0f} jobs/s)")
        print(f"  final states: {dict(sorted(states.items()))}")
        print(f"  kinds: {dict(sorted(by_kind.items()))}")
        print("  left behind: 0 processes, 0 shared-memory segments, 0 job directories")
        fds = (list(snap["fds"].values()) for snap in (before, after))
        print("  daemons' open fds (MM, NMs): {} before, {} after".format(*fds))


def left_behind(before: Snapshot, after: Snapshot) -> list[str]:
    """What is there now that was not before: processes (with their command lines), segments, job
    directories, and descriptors each daemon holds beyond its count before."""
    new = [f"{key}: {sorted(set(after[key]) - set(before[key]))}" for key in ("processes", "shm", "job dirs")]
    commands = live_descendants()
    new += [
        f"process {pid}: {commands.get(pid)}" for pid in set(after["processes"]) - set(before["processes"])
    ]
    new += [
        f"daemon {pid}: {n} fds, {before['fds'][pid]} before"
        for pid, n in after["fds"].items()
        if n > before["fds"][pid]
    ]
    return [line for line in new if not line.endswith(": []")]


def refresh(client: Client, to_cancel: set[int]) -> int:
    """The number of jobs still queued or running; cancels the ones waiting to be cancelled once they run."""
    active = client.jobs()
    running = {j.id for j in active if j.state == "RUNNING"} & to_cancel
    if running:
        client.cancel(tuple(sorted(running)))
        to_cancel -= running
    ended = to_cancel - {j.id for j in active}
    assert not ended, f"jobs {ended} ended before they could be cancelled"
    return len(active)


def ended_as(job: p.JobInfo, kind: Kind) -> bool:
    if job.state != kind.state or (kind.exit_code is not None and job.exit_code != kind.exit_code):
        return False
    if job.end_time is None or (
        job.start_time is not None and not job.submit_time <= job.start_time <= job.end_time
    ):
        return False
    if kind.state == "CANCELLED":
        return job.reason.startswith("cancelled by")
    return True
