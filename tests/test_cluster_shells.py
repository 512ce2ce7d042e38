"""End to end: the NM's job shell socket (``shells.sock``, world-writable so that shells of any user reach
it) cannot be squatted.

Any local user can connect to it and claim to be job N's shell, even giving that shell's pid in its hello.
The NM knows its shells by the pid the kernel reports for each connection (SO_PEERCRED), not by what a peer
says, and replies to the connection the shell itself speaks on: such a process neither blocks the real shell
nor is taken for it, and gets no answer. (Over ZeroMQ, shells once connected with the routing id ``job-N``,
which a ROUTER refuses to a second peer: whoever took it first cut job N's shell off its NM.) The squatter
here runs as ``nobody`` where the test can act as another user (as in tests/test_cluster_users.py), else as
the test's own user.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storm.nm.jobdir import JobDir
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, start_cluster

pytestmark = pytest.mark.slow

# Connects to each node's shells.sock (nm/shell_link.py: a Unix stream socket carrying length-prefixed
# messages) and, every 50 ms until its stdin closes, says what job N's shell would: hello (claiming the real
# shell's pid once the test has written it to claim-NODE), ranks started, a rank failing, a PMI barrier, the
# final report. Prints what it sent and what it got back (a connection the NM closes counts as something got).
SQUATTER = """
import json, os, select, socket, sys
from storm.mm import protocol as p
from storm.nm.shell_link import Frames, frame

job_id, directory, nodes = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
socks = {}
for index, node in enumerate(nodes):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(f"{directory}/nodes/{node}/shells.sock")
    socks[sock] = (node, index, Frames(p.MAX_NODE_MESSAGE))
rounds, claimed, received = 0, 0, []
while True:
    ready, _, _ = select.select([sys.stdin, *socks], [], [], 0.05)
    if sys.stdin in ready:
        break
    for sock, (node, rank, frames) in list(socks.items()):
        if sock in ready:
            data = sock.recv(1 << 16)
            if not data:
                received.append(f"connection to {node} closed")
                del socks[sock]
                sock.close()
                continue
            received += [p.decode(m, p.MAX_NODE_MESSAGE).op for m in frames.feed(data)]
        try:
            pid = int(open(f"{directory}/claim-{node}").read())
            claimed += 1
        except (OSError, ValueError):
            pid = os.getpid()
        failed = p.RankExit(rank=rank, exit_code=3)
        sock.sendall(b"".join(frame(p.encode(msg)) for msg in (
            p.ShellHello(job_id=job_id, pid=pid),
            p.RanksStarted(job_id=job_id, pids={str(rank): 1}),
            p.PmiBarrierIn(job_id=job_id, node=node, seq=0, kvs={"squatted": "yes"}),
            p.RankExited(job_id=job_id, exit=failed),
            p.ShellDone(job_id=job_id, exits=(failed,)),
        )))
    rounds += 1
for sock in socks:
    sock.close()
print(json.dumps({"rounds": rounds, "claimed": claimed, "received": received}))
"""

# Each rank enters a PMI barrier (across both nodes: its answer comes back through the NM), says it passed,
# then waits for its go file, finalizes and exits 0.
RANK = """
import os, pathlib, socket, time
rank = os.environ["PMI_RANK"]
pmi = socket.socket(fileno=int(os.environ["PMI_FD"])).makefile("rwb")
pmi.write(b"cmd=barrier_in\\n")
pmi.flush()
assert pmi.readline().startswith(b"cmd=barrier_out rc=0"), "barrier failed"
pathlib.Path(f"passed{rank}").touch()
while not pathlib.Path(f"go{rank}").exists():
    time.sleep(0.01)
pmi.write(b"cmd=finalize\\n")
pmi.flush()
assert pmi.readline().startswith(b"cmd=finalize_ack"), "finalize failed"
"""


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A cluster outside pytest's private tmp directory, so that another user reaches its sockets."""
    path = Path(tempfile.mkdtemp(prefix="storm-shells-"))
    path.chmod(0o755)
    c = start_cluster(path, nodes=2, pes_per_node=1)
    yield c
    c.down()
    shutil.rmtree(path)


def squatter_user() -> dict[str, Any]:
    """Popen arguments that run the squatter as nobody, where this test can."""
    if os.geteuid() != 0:
        return {}
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        return {}
    probe = subprocess.run(
        [sys.executable, "-c", "import storm.mm.protocol, storm.nm.shell_link"], user=user.pw_uid,
        group=user.pw_gid, extra_groups=[], cwd="/", capture_output=True, check=False, timeout=JOB_TIMEOUT,
    )  # fmt: skip
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if probe.returncode == 0 else {}


def log_of(cluster: LocalCluster, node: str) -> str:
    return (cluster.dir / "nodes" / f"{node}.log").read_text()


def test_a_process_claiming_a_jobs_shell_on_its_socket_neither_blocks_nor_impersonates_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A local process connected to each node's shells.sock says it is the next job's shell, its hello
    giving the real shell's pid once it runs: the NMs drop all it says, the job runs as if it were not
    there, and it receives nothing."""
    nodes = cluster.node_names()
    (tmp_path / "rank.py").write_text(RANK)
    with cluster.client() as client:
        # The next job's id: one more than this one's.
        first = client.submit(["true"], 1, cwd=str(tmp_path))
        assert client.wait(first, timeout=JOB_TIMEOUT).state == "COMPLETED"
        job_id = first + 1

        as_user = squatter_user()
        squatter = subprocess.Popen(
            [sys.executable, "-c", SQUATTER, str(job_id), str(cluster.dir), *nodes],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/", **as_user,
        )  # fmt: skip
        try:
            # Before the job exists: the squatter is connected, and heard.
            heard = f"about an unknown job (from pid {squatter.pid} "
            poll(lambda: all(heard in log_of(cluster, n) for n in nodes), 10, "the squatter to be heard")

            assert client.submit([sys.executable, "rank.py"], 2, cwd=str(tmp_path)) == job_id
            records = [JobDir.of(cluster.node_dir(n), job_id).nm_record for n in nodes]
            poll(lambda: all(r.exists() for r in records), JOB_TIMEOUT, "both job shells to start")
            for node, record in zip(nodes, records, strict=True):
                shell = json.loads(record.read_text())["shell_pid"]
                claim = cluster.dir / f"claim-{node}"
                (cluster.dir / "claim.tmp").write_text(str(shell))
                (cluster.dir / "claim.tmp").chmod(0o644)
                (cluster.dir / "claim.tmp").rename(claim)  # whole, for the squatter's next round

            # While the job runs: every message is refused, the hello claiming the shell's pid included.
            refused = f"from pid {squatter.pid} (uid {os.geteuid() if not as_user else as_user['user']}): "
            refused += f"not job {job_id}'s shell"
            poll(lambda: all(refused in log_of(cluster, n) for n in nodes), 10, "the squatter to be refused")
            passed = [tmp_path / f"passed{rank}" for rank in (0, 1)]
            poll(lambda: all(f.exists() for f in passed), JOB_TIMEOUT, "the ranks to pass their barrier")
            assert client.job(job_id).state == "RUNNING"

            for rank in (0, 1):
                (tmp_path / f"go{rank}").touch()
            job = client.wait(job_id, timeout=JOB_TIMEOUT)
        finally:
            out, _ = squatter.communicate(input="", timeout=JOB_TIMEOUT)  # its stdin closes: it stops
    assert (job.state, job.exit_code, job.reason) == ("COMPLETED", 0, ""), job
    said = json.loads(out)
    assert said["rounds"] > 0 and said["claimed"] > 0, said
    assert said["received"] == [], said  # no barrier answer, no acknowledgement went to the squatter
