"""The soak: 1,000 short jobs with random failures and cancels over three node managers.

The workload and its check that every job ended in the state its kind implies are tools/soak.py's (`storm
bench scale --parts soak` times the same mix). Here, besides: afterwards there must be no process left but
the daemons' own, no shared-memory segment, no job directory, no more descriptors in any daemon than before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storm.tools import soak
from storm.tools.local_cluster import LocalCluster
from tests.helpers import fd_count, live_descendants, poll, shm_entries

pytestmark = pytest.mark.slow


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
    cluster = make_cluster(nodes=soak.NODES, pes_per_node=soak.PES)
    with cluster.client() as client:
        warm = soak.warm_up(client, tmp_path)
        poll(lambda: not snapshot(cluster)["job dirs"], 15.0, "the warm-up job to be forgotten")
        before = snapshot(cluster)
        ran = soak.run(client, tmp_path, soak.plan(soak.JOBS, soak.SEED))
        # Nothing left behind: processes, shared memory, the daemons' descriptors, job directories.
        try:
            poll(lambda: not left_behind(before, snapshot(cluster)), 15.0, "everything the soak made to go")
        except AssertionError:
            raise AssertionError(f"left behind: {left_behind(before, snapshot(cluster))}") from None
        after = snapshot(cluster)

    # The store matches what ran: every job of the soak, in the state and with the exit code of its kind.
    assert sorted(ran.jobs) == sorted([warm.id, *ran.kinds])
    wrong = ran.wrong()
    assert not wrong, f"{len(wrong)} job(s) ended otherwise than their kind: {wrong[:10]}"

    with capsys.disabled():
        nms, seconds = len(cluster.nms), ran.seconds
        print(f"\nsoak: {len(ran.kinds)} jobs over {nms} NMs in {seconds:.1f} s ({ran.rate:.0f} jobs/s)")
        print(f"  final states: {ran.states()}")
        print(f"  kinds: {ran.by_kind()}")
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
