"""A multi-host test: storm-mm and three node managers, each in a network namespace of its own.

They talk over real TCP between distinct addresses (10.77.0.1 for the MM, .2-.4 for node0-node2, joined by a
bridge; see tests/netns.py): the MM binds its node endpoint and heartbeat PUB socket on its own address, the
node managers connect there, and an MPI job's ranks wire up through storm and then talk to each other over
TCP between the namespaces. Cutting one node's link makes it DOWN within the timeout and its job NODE_FAIL;
restoring the link lets it stop what the MM ended and rejoin. Needs root (CI runs as root); skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.helpers import JOB_TIMEOUT, poll, python_app
from tests.netns import Lab, NetnsCluster
from tests.test_cluster_hook import SHARED, rank_lines
from tests.test_cluster_nodes import node_states

pytestmark = pytest.mark.slow

NODES = ["node0", "node1", "node2"]
NODE_TIMEOUT = 2.0
# MPICH (ch4) reaches ranks on other nodes through UCX. Between namespaces of one machine UCX would take a
# shared-memory shortcut; here it must use TCP, on the namespace's own interface (which is the address it
# then advertises to its peers through the PMI key-value space).
MPI_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}


@pytest.fixture
def lab_cluster(tmp_path: Path) -> Iterator[tuple[NetnsCluster, Lab]]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")
    netns.sweep()
    lab = Lab(["mm", *NODES])
    lab.up()
    mm = f"tcp://{lab.address('mm')}:0"
    cluster = NetnsCluster(
        dir=tmp_path / "cluster", nodes=len(NODES), pes_per_node=1, policy="gang", trace=True,
        mm_settings={"node_endpoint": mm, "heartbeat_endpoint": mm, "node_timeout": NODE_TIMEOUT, "mpl": 2},
        nm_settings={"kill_grace": 1.0}, lab=lab,
    )  # fmt: skip
    try:
        cluster.up()
        yield cluster, lab
    finally:
        lab.restore_all()  # a node cut off when a test failed must still hear it is time to stop
        cluster.down()  # leaves first, by pid
        lab.down()


def peers(lab: Lab, host: str) -> set[str]:
    """Remote addresses of the host's established TCP connections."""
    table = lab.run(host, "ss", "-Htn", "state", "established")
    return {m for m in re.findall(r"\s(\d+\.\d+\.\d+\.\d+):\d+\s*$", table, re.MULTILINE)}


shared_program = [sys.executable, "-c", SHARED]


def bsp(*args: str) -> list[str]:
    return python_app("bsp", "--granularity", "1ms", "--pattern", "ring", *args)


def test_mpi_across_namespaces_and_a_cut_link(lab_cluster: tuple[NetnsCluster, Lab], tmp_path: Path) -> None:
    cluster, lab = lab_cluster
    env = {**os.environ, **MPI_ENV}
    addresses = {node: lab.address(node) for node in NODES}
    assert cluster.node_endpoint.startswith(f"tcp://{lab.address('mm')}:")
    # Every node manager reached the MM from its own address.
    assert set(addresses.values()) <= peers(lab, "mm")
    with cluster.client() as client:
        assert node_states(client) == dict.fromkeys(NODES, "UP")

        # Each node manager names its namespace as its host: MPI sees three nodes, sharing no memory.
        ended = client.wait(client.submit(shared_program, 3, cwd=str(tmp_path), env=env), timeout=JOB_TIMEOUT)
        assert ended.state == "COMPLETED", ended
        assert rank_lines(ended.id, tmp_path) == [f"rank {r}: shared 1 hook True" for r in range(3)]

        # An MPI job across the three hosts, its ranks talking TCP host to host.
        job = client.submit(bsp("--iterations", "300"), 3, cwd=str(tmp_path), env=env, time_limit=120.0)
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        output = (tmp_path / f"storm-{job}.out").read_text()
        assert (ended.state, set(ended.nodes)) == ("COMPLETED", set(NODES)), f"{ended.reason}\n{output}"
        assert "bsp: OK iterations=300 ranks=3" in output, output
        # Heartbeats crossed too: each node manager followed the MM's PUB socket over TCP.
        for node in NODES:
            assert cluster.trace_path(node).read_text().count("\n") > 0, f"{node} heard no heartbeat"

        # A long job; node1's rank keeps connections to its neighbours on node0 and node2.
        job = client.submit(bsp("--seconds", "600"), 3, cwd=str(tmp_path), env=env, time_limit=120.0)
        others = {addresses["node0"], addresses["node2"]}
        poll(lambda: others <= peers(lab, "node1"), 30, "node1's rank to connect to its neighbours")
        assert client.job(job).state == "RUNNING"

        # Cut node1 off: DOWN after the node timeout (not before), and its job ends NODE_FAIL.
        cut = time.monotonic()
        lab.cut("node1")
        poll(lambda: node_states(client)["node1"] == "DOWN", NODE_TIMEOUT + 10, "node1 to be DOWN")
        after = time.monotonic() - cut
        assert NODE_TIMEOUT / 2 < after < NODE_TIMEOUT + 1.5, f"DOWN {after:.2f} s after the cut"
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        assert ended.state == "NODE_FAIL"
        assert ended.reason.startswith("node node1 DOWN: no report for"), ended.reason
        assert node_states(client) == {"node0": "UP", "node1": "DOWN", "node2": "UP"}

        # Restored, node1 learns its job is over, stops its rank, rejoins, and runs MPI again.
        lab.restore("node1")
        cluster.wait_nodes_up(["node1"])
        job = client.submit(bsp("--iterations", "100"), 3, cwd=str(tmp_path), env=env, time_limit=120.0)
        ended = client.wait(job, timeout=JOB_TIMEOUT)
        output = (tmp_path / f"storm-{job}.out").read_text()
        assert (ended.state, set(ended.nodes)) == ("COMPLETED", set(NODES)), f"{ended.reason}\n{output}"
        assert "bsp: OK iterations=100 ranks=3" in output, output
