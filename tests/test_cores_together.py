"""storm-mm's core and three storm-nm cores in one process, exchanging the message objects the daemons
exchange (no sockets, no processes, the in-memory store): the shape the simulator and the emulated node
managers drive. Job shells are played by the test: a new one says it is ready, and each reports its ranks
started when it is given a launch, and their end when the job's time is up or they were told to stop."""

from __future__ import annotations

import signal
from collections import deque
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.config import MMConfig, NMConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Effect, JobEnded, Publish, Reply, Send, Wait
from storm.mm.memory_store import MemoryStore
from storm.mm.rights import Account
from storm.mm.runs import seeded_nonces
from storm.nm.fcs import Measurement
from storm.nm.node import Node, Outcome
from tests.fakes import FakeMeasurements, FakeProcesses

ALICE = Account(1000, 100, "alice")
T0 = 1000.0
SLICE = 0.5
COARSE = Measurement(t_cpu=5.0, t_comm=0.01, c_comm=10)  # g = 0.5 s: DC under FCS


class Cores:
    """The cluster: messages go through one FIFO, in the order the stimuli produced them; every message
    that crosses the wire is logged encoded, so that two runs can be compared byte for byte."""

    def __init__(self, tmp_path: Path, policy: str, seed: int) -> None:
        config = MMConfig(node_timeout=3.0, slice=SLICE, mpl=2, max_requeues=1)
        fcs = p.FcsParameters(cslots_min=2, tslots_max=40)
        self.mm = Controller(MemoryStore(), config, "mm-1", nonce=seeded_nonces(seed), policy=policy, fcs=fcs)
        self.nodes: dict[str, Node] = {}
        self.fakes: dict[str, tuple[FakeProcesses, FakeMeasurements]] = {}
        for i, name in enumerate(("n0", "n1", "n2")):
            fake, measured = FakeProcesses(first_pid=1000 * (i + 1)), FakeMeasurements()
            self.fakes[name] = (fake, measured)
            self.nodes[name] = Node(
                NMConfig(kill_grace=1.0), name, [0, 1], tmp_path / name, epoch=f"{name}-e1", processes=fake,
                measurements=measured, cluster="c",
            )  # fmt: skip
        self.wire: list[bytes] = []
        self.queue: deque[tuple[str, str, p.Message]] = deque()  # (from, to, message); "mm" or a node
        self.lost: set[str] = set()  # nodes cut off: nothing reaches them or comes from them
        self.ends: dict[tuple[str, int], float] = {}  # when a node's shell of a job ends it on its own
        self.runtime: dict[int, float] = {}
        self.ended: dict[int, str] = {}
        self.now = T0
        self.carry_out(self.mm.recover(T0), origin="")

    # -------------------------------------------------------------------------------------------- plumbing

    def carry_out(self, effects: list[Effect], origin: str) -> None:
        for effect in effects:
            match effect:
                case Send():
                    self.queue.append(("mm", effect.node, effect.message))
                case Reply():
                    if origin in self.nodes:
                        self.queue.append(("mm", origin, effect.message))
                    else:
                        self.wire.append(b"client " + p.encode(effect.message))
                case Publish():
                    for name in self.nodes:
                        self.queue.append(("mm", name, effect.heartbeat))
                case JobEnded():
                    self.ended[effect.info.id] = effect.info.state
                    self.wire.append(b"ended " + p.encode(p.JobList(jobs=(effect.info,))))
                case Wait():
                    pass

    def node_did(self, name: str, out: Outcome) -> None:
        for msg in out.to_mm:
            self.queue.append((name, "mm", msg))
        for job_id in out.escalate:  # the grace period passes at once: the shells are gone by then
            self.nodes[name].escalate(job_id)
        for shell in out.watch_shells:  # a user's job shell, started: ready at once
            ready = p.ShellReady(pid=shell.pid)
            self.node_did(name, self.nodes[name].from_shell(b"shell", ready, (shell.pid, 1000), self.now))
        for _, msg in out.to_shells:
            if isinstance(msg, p.ShellLaunch):
                self.shell_started(name, msg.launch.job_id)

    def run_queue(self) -> None:
        """Deliver until nothing is in flight; the MM's pass runs whenever the queue runs dry, as storm-mm
        runs it once the messages that arrived together are handled."""
        while self.queue or self.mm.pass_due:
            if not self.queue:
                self.carry_out(self.mm.schedule(self.now), origin="")
                continue
            source, target, msg = self.queue.popleft()
            if source in self.lost or target in self.lost:
                continue
            self.wire.append(f"{source}>{target} ".encode() + p.encode(msg))
            if target == "mm":
                self.carry_out(self.mm.handle(msg, self.now, FromNode(source)), origin=source)
            elif isinstance(msg, p.Heartbeat):
                self.node_did(target, self.nodes[target].heartbeat(msg, self.now, self.now))
            else:
                self.node_did(target, self.nodes[target].from_mm(msg, self.now))
            self.shells_act()

    # ---------------------------------------------------------------------------------------------- shells

    def shell_started(self, name: str, job_id: int) -> None:
        node = self.nodes[name]
        fake, measured = self.fakes[name]
        job = node.jobs[job_id]
        pids = {slot.rank: fake.child(job.shell_pid) for slot in job.launch.slots}
        for index in range(len(pids)):
            measured.measured[(job_id, index)] = COARSE
        started = p.RanksStarted(job_id=job_id, pids={str(r): q for r, q in pids.items()})
        self.node_did(name, node.from_shell(b"shell", started, (job.shell_pid, 1000), self.now))
        self.ends[(name, job_id)] = self.now + self.runtime[job_id]

    def shells_act(self) -> None:
        """Shells whose ranks were told to stop, or whose time is up, report their end."""
        for name, node in self.nodes.items():
            if name in self.lost:
                continue
            fake = self.fakes[name][0]
            for job in list(node.jobs.values()):
                if job.done is not None or not job.ranks_known:
                    continue
                killed = any((pid, signal.SIGTERM) in fake.signals for pid in job.pids.values())
                if killed or self.ends[(name, job.job_id)] <= self.now:
                    code = {"signal": 15} if killed else {"exit_code": 0}
                    exits = tuple(p.RankExit(rank=r, **code) for r in sorted(job.pids))  # type: ignore[arg-type]
                    done = p.ShellDone(job_id=job.job_id, exits=exits)
                    self.node_did(name, node.from_shell(b"shell", done, (job.shell_pid, 1000), self.now))

    # ---------------------------------------------------------------------------------------------- time

    def submit(self, ranks: int, runtime: float, requeue: bool = False) -> int:
        msg = p.SubmitJob(ranks=ranks, argv=("/bin/app",), cwd="/tmp", env={}, requeue=requeue)
        effects = self.mm.handle(msg, self.now, ALICE)
        reply = effects[0]
        assert isinstance(reply, Reply) and isinstance(reply.message, p.JobSubmitted)
        self.runtime[reply.message.job_id] = runtime
        self.carry_out(effects, origin="")
        self.run_queue()
        return reply.message.job_id

    def advance(self, until: float) -> None:
        """Time passes up to ``until``, one slice at a time: a heartbeat, reports and ticks each slice."""
        while self.now < until:
            self.now = round(self.now + SLICE, 6)
            self.carry_out(self.mm.heartbeat(self.now), origin="")
            for name, node in self.nodes.items():
                self.node_did(name, node.tick(self.now, self.now))
                for msg in node.reports():
                    self.queue.append((name, "mm", msg))
            self.carry_out(self.mm.tick(self.now), origin="")
            self.run_queue()


def workload(tmp_path: Path, policy: str, seed: int = 1) -> Cores:
    """Five jobs on three nodes of 2 PEs at MPL 2; node n2 is lost while it runs a requeueable job."""
    cores = Cores(tmp_path, policy, seed)
    cores.advance(T0 + 1)  # the nodes register
    cores.submit(4, runtime=6.0)  # 1: n0, n1
    cores.submit(4, runtime=6.0)  # 2: the second row
    cores.submit(2, runtime=3.0, requeue=True)  # 3: n2
    cores.submit(2, runtime=2.0)  # 4
    cores.advance(T0 + 3)
    cores.lost.add("n2")  # n2 falls silent: job 3 ends NODE_FAIL there and is requeued elsewhere
    cores.advance(T0 + 30)
    cores.submit(6, runtime=2.0)  # 5: all of the nodes that are left, and more: it waits for ever
    cores.advance(T0 + 34)
    return cores


@pytest.mark.parametrize("policy", ["gang", "fcs"])
def test_an_mm_core_and_three_nm_cores_run_a_workload_and_repeat_it_byte_for_byte(
    tmp_path: Path, policy: str
) -> None:
    first = workload(tmp_path / "a", policy)
    second = workload(tmp_path / "b", policy)
    assert first.wire == second.wire
    assert first.ended == {1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED", 4: "COMPLETED"}
    wire = b"\n".join(first.wire)
    assert wire.count(b"heartbeat") > 100
    assert {j.id: j.requeues for j in first.mm.store.jobs()} == {1: 0, 2: 0, 3: 1, 4: 0, 5: 0}
    assert {n.name: n.state for n in first.mm.runs.registry.all()} == {"n0": "UP", "n1": "UP", "n2": "DOWN"}
    launched_3 = [line for line in first.wire if b"launch_job" in line and b"storm_3_" in line]
    assert len({line.split(b" ")[0] for line in launched_3}) >= 2  # placed again, on another node
    everyone = {name: fake for name, (fake, _) in first.fakes.items()}
    stops = sum(1 for fake in everyone.values() for _, sig in fake.signals if sig == signal.SIGSTOP)
    assert stops > 10  # rows took turns
    if policy == "fcs":  # the coarse jobs became DC, and said so at once
        assert b"\xa3new\xa2DC" in wire
    # Every job the nodes ran was acknowledged and forgotten.
    assert all(not node.jobs for name, node in first.nodes.items() if name != "n2")
    # Another seed: other kvsnames, other segment names, other bytes.
    assert workload(tmp_path / "c", policy, seed=2).wire != first.wire
