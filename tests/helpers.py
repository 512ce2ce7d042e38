"""What tests share besides fixtures (those are in conftest.py): waiting with a deadline, what a test
process holds (descendants, fds, /dev/shm entries, for the leak checks), and throwaway clusters and jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster

SHM = Path("/dev/shm")
JOB_TIMEOUT = 60.0


def poll(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Wait for ``condition`` with a deadline (tests never sleep for a fixed time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def live_descendants() -> dict[int, str]:
    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = " ".join(proc.cmdline())[:200]
        except psutil.NoSuchProcess:
            continue
    return found


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def fd_count(pid: int) -> int:
    """How many files another process (a daemon) has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def describe_fd(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def shm_entries() -> set[str]:
    """The POSIX shared-memory segments (files) in /dev/shm. Directories are never segments: a simulation
    keeps its node cores' job directories in one there (tools/sim/cosched/cluster.py), and one running
    beside the tests is none of theirs."""
    if not SHM.is_dir():
        return set()
    with os.scandir(SHM) as entries:
        return {entry.name for entry in entries if not entry.is_dir(follow_symlinks=False)}


def start_cluster(
    directory: Path,
    nodes: int,
    pes_per_node: int,
    policy: str = "batch",
    trace: bool = False,
    topology: tuple[int, int, int] | None = None,
    emulated: int = 0,
    **settings: object,
) -> LocalCluster:
    """A local cluster (on a torus of ``nodes`` nodes with ``topology``; with ``emulated`` emulated node
    managers too); ``mm_x=``, ``nm_x=`` and ``fcs_x=`` keywords set [mm] x, [nm] x and [fcs] x."""
    mm = {k[3:]: v for k, v in settings.items() if k.startswith("mm_")}
    nm = {k[3:]: v for k, v in settings.items() if k.startswith("nm_")}
    fcs = {k[4:]: v for k, v in settings.items() if k.startswith("fcs_")}
    nm.setdefault("kill_grace", 1.0)
    cluster = LocalCluster(
        dir=directory, nodes=nodes, pes_per_node=pes_per_node, policy=policy, trace=trace, mm_settings=mm,
        nm_settings=nm, fcs_settings=fcs, topology=topology, emulated=emulated,
    )  # fmt: skip
    cluster.up()
    return cluster


def run_job(client: Client, argv: list[str], ranks: int, cwd: Path, **options: object) -> p.JobInfo:
    """Submit and wait for the end, with a deadline."""
    job_id = client.submit(argv, ranks, cwd=str(cwd), **options)
    return client.wait(job_id, timeout=JOB_TIMEOUT)


def python_app(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"storm.tools.apps.{name}", *args]


def storm_cli(cluster: LocalCluster, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `storm` command against a cluster."""
    env = {**os.environ, "STORM_MM": cluster.endpoint}
    return subprocess.run(
        [sys.executable, "-m", "storm.tools.cli", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip
