"""Shared test fixtures: throwaway clusters and a check that no test leaks processes, segments or fds.

The functions tests call themselves (poll, start_cluster, run_job, ...) are in tests/helpers.py.

pytest makes itself a child subreaper, so any process a test's jobs orphan (a rank whose job shell died, a
child a rank forked) is re-parented to pytest instead of init and shows up as a leak here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from storm.mm.store import Store
from storm.mpihook.stats import HookSegment, segment_name
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster
from tests.helpers import SHM, describe_fd, live_descendants, open_fds, poll, shm_entries, start_cluster

PR_SET_CHILD_SUBREAPER = 36
LEAK_DEADLINE = 15.0


def pytest_configure(config: pytest.Config) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # A suite started in the background by a shell without job control (`nohup ... &`, as some CI runners
    # do) has SIGINT ignored, and every program a test starts would inherit that: the tests of Ctrl-C
    # could interrupt nothing. A handler, unlike "ignore", does not survive exec: children get the default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """After each test: no new process, /dev/shm entry or file descriptor may remain."""
    # The global zmq context starts its threads (and their fds) with its first socket, once per session.
    zmq.Context.instance().socket(zmq.DEALER).close()
    procs, shm, fds = live_descendants(), shm_entries(), open_fds()
    yield
    problems = []
    try:
        poll(lambda: set(live_descendants()) <= set(procs), LEAK_DEADLINE, "processes to exit")
    except AssertionError:
        extra = {pid: cmd for pid, cmd in live_descendants().items() if pid not in procs}
        problems.append(f"processes left running: {extra}")
        for pid in extra:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    try:
        poll(lambda: shm_entries() <= shm, LEAK_DEADLINE, "shared memory to be removed")
    except AssertionError:
        extra_shm = shm_entries() - shm
        problems.append(f"/dev/shm entries left: {sorted(extra_shm)}")
        for name in extra_shm:
            (SHM / name).unlink(missing_ok=True)
    try:
        poll(lambda: open_fds() <= fds, 5.0, "file descriptors to close")
    except AssertionError:
        left = {fd: describe_fd(fd) for fd in sorted(open_fds() - fds)}
        problems.append(f"file descriptors left open: {left}")
    assert not problems, "; ".join(problems)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A real job store in a fresh SQLite file."""
    s = Store(tmp_path / "storm.db")
    yield s
    s.close()


# ---------------------------------------------------------------------------------------------- clusters


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One MM and two node managers with one PE each, shared by a test module."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"), nodes=2, pes_per_node=1)
    yield c
    c.down()


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalCluster]]:
    """Clusters of a test's own (for tests that kill daemons); torn down leaves first."""
    made: list[LocalCluster] = []

    def make(nodes: int = 2, pes_per_node: int = 1, **settings: object) -> LocalCluster:
        c = start_cluster(tmp_path_factory.mktemp("cluster"), nodes, pes_per_node, **settings)
        made.append(c)
        return c

    yield make
    for c in reversed(made):
        c.down()


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with cluster.client() as c:
        yield c


@pytest.fixture(scope="session")
def hello_c(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C hello program, compiled with the environment's own mpicc."""
    from storm.tools import apps

    source = Path(apps.__file__).parent / "hello_mpi.c"
    binary = tmp_path_factory.mktemp("c") / "hello_mpi"
    mpicc = Path(sys.executable).parent / "mpicc"
    subprocess.run([str(mpicc), "-O1", "-o", str(binary), str(source)], check=True, timeout=120)
    return binary


@pytest.fixture
def segment() -> Iterator[HookSegment]:
    """A real hook segment of two ranks for job 5, as the NM creates it (unit tests of the NM's readers)."""
    seg = HookSegment.create(segment_name(5, 0), 5, 2, os.getuid(), os.getgid())
    yield seg
    seg.close()
    seg.unlink()
