"""storm-nm: launches and stops the local ranks of jobs, and reports them to storm-mm.

Per job on this node the NM starts one job shell (nm/shell.py) as the job's user; the shell spawns the ranks
and serves PMI, and reports to the NM over an ipc:// ROUTER whose peers are authenticated by pid (the
kernel's SO_PEERCRED, not the routing id a peer picks, which any local user could pick first). The NM
relays to the MM (DEALER, routing id = node name): launches, rank failures, cross-node PMI barriers and the
final exits of the node's ranks, which it re-sends until the MM acknowledges them. It also learns the
processes the ranks spawn (MPI_Comm_spawn, nm/children.py), time-slices and kills them with the job, ends
the job when one fails, and relays spawn counts and MPI's name requests (MPI_Publish_name ...) to the MM,
and the MM's answers back to the shell.

What happens to a job's processes (start, stop, sweep) lives in nm/local_jobs.py; mpihook's measurements
are read every time slice by nm/monitor.py and reported with every status.

Stopping and restarting: SIGTERM (``systemctl stop`` or ``restart``, with KillMode=process) and SIGINT make
the NM exit and leave its jobs running: it continues any rank time slicing had stopped, and the next storm-nm
of this node re-adopts every job from its run directory (nm/local_jobs.py), as after a SIGKILL or a crash.
SIGUSR1 stops every job of the node first (NODE_FAIL, "storm-nm on NODE shut down"), reports them, then
exits: what ``storm local down`` sends.

Under gang scheduling the NM also subscribes to the MM's heartbeats and, on each, stops the ranks of jobs
outside the active row and continues the others (nm/switcher.py); under FCS it also classifies every process
at the end of its slot (nm/classes.py) and decides per PE; without heartbeats everything runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from storm.mm import protocol as p
from storm.mm.config import StormConfig
from storm.mm.keys import KeyFileError, curve_client, read_keypair, read_public_key
from storm.mm.limits import LogThrottle
from storm.mm.lockfile import take_lock
from storm.mm.net import Caller, bind, peer_credentials, watch_handshakes
from storm.mm.priority import request_realtime
from storm.mm.sd_notify import Notifier
from storm.nm.checks import shell_problem
from storm.nm.classes import Classifier
from storm.nm.fcs import Klass
from storm.nm.gang import GangFollower
from storm.nm.local_jobs import LocalJob, LocalJobs
from storm.nm.monitor import Monitor
from storm.nm.processes import LinuxProcesses, Processes
from storm.nm.profile import Profiler
from storm.nm.switcher import SPIN_BLOCKING_POLICIES, ContextSwitcher

log = logging.getLogger("storm.nm")


REGISTER_RETRY_SECONDS = 1.0
STOP_WAIT_SECONDS = 5.0


class NodeManager:
    def __init__(self, config: StormConfig, processes: Processes | None = None) -> None:
        self.config = config
        self.name = config.node_name()
        self.cpus = config.node_cpus()
        self.os: Processes = processes or LinuxProcesses()
        self.run_dir = Path(config.nm.run_dir)
        (self.run_dir / "jobs").mkdir(parents=True, exist_ok=True)
        self._lock = take_lock(
            self.run_dir / "nm.lock",
            busy=f"storm-nm: another storm-nm is running with run directory {self.run_dir}",
        )
        self.epoch = uuid.uuid4().hex
        self.mm_epoch = ""
        self.report_interval = 1.0
        self.registered = asyncio.Event()
        self.wake_reporter = asyncio.Event()
        self.stopping = asyncio.Event()
        self.stop_jobs = False  # SIGUSR1: stop every job before exiting (else they outlive this NM)
        self.notify = Notifier.from_environment()  # systemd's Type=notify; before anything is started
        self.priority = request_realtime() if config.nm.realtime else "ordinary priority"
        self.ctx = zmq.asyncio.Context()  # after the priority: its I/O thread inherits it
        self.mm = self.ctx.socket(zmq.DEALER)
        self.mm.setsockopt(zmq.ROUTING_ID, self.name.encode())
        self.mm.setsockopt(zmq.LINGER, 1000)
        self.mm.setsockopt(zmq.MAXMSGSIZE, p.MAX_NODE_MESSAGE)
        self.shells = self.ctx.socket(zmq.ROUTER)
        self.shells.setsockopt(zmq.LINGER, 0)
        self.shells.setsockopt(zmq.MAXMSGSIZE, p.MAX_NODE_MESSAGE)
        self.shells_endpoint = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self.policy = "batch"
        self.follower = GangFollower(timeout=config.nm.heartbeat_timeout or 1.0)
        self.heartbeats = self.ctx.socket(zmq.SUB)
        self.heartbeats.setsockopt(zmq.LINGER, 0)
        self.heartbeats.setsockopt(zmq.CONFLATE, 1)  # only the newest heartbeat matters
        self.heartbeats.setsockopt(zmq.SUBSCRIBE, b"")
        self.heartbeats.setsockopt(zmq.MAXMSGSIZE, p.MAX_CLIENT_MESSAGE)  # a heartbeat is ~100 bytes
        self._keys()
        self.throttle = LogThrottle()  # warnings about bad input: a flood of garbage must not fill the disk
        # The PMI barrier each job's shell may enter next (jobs launched here; re-adopted ones once known).
        self.next_barrier: dict[int, int] = {}
        self.heartbeat_endpoint = ""
        # Line-buffered: a reader sees each heartbeat as it happens (ten short writes a second).
        self.trace = open(config.nm.trace, "a", buffering=1) if config.nm.trace else None  # noqa: SIM115
        self.monitor = Monitor(self.os, self.name)
        self.switcher = ContextSwitcher(
            self.os, self.trace, on_switch=self.monitor.switched, set_wait=self.monitor.set_wait
        )
        self.classifier = Classifier(self.name, self.monitor, self.switcher)
        self.profiler = Profiler(self.name) if config.nm.profile else None
        self.local = LocalJobs(
            config.nm, self.name, self.cpus, self.run_dir, processes=self.os, switcher=self.switcher,
            monitor=self.monitor, profiler=self.profiler,
        )  # fmt: skip
        self.jobs = self.local.jobs

    def _keys(self) -> None:
        """CURVE on both links to the MM (requests and heartbeats), before they connect; see mm/auth.py."""
        nm = self.config.nm
        if bool(nm.key) != bool(nm.mm_key):
            raise SystemExit("storm-nm: give [nm] key (this node's key pair) and mm_key (the MM's) together")
        if not nm.key:
            log.warning("no [nm] key: talking to storm-mm at %s unauthenticated and unencrypted", nm.mm)
            return
        try:
            own, server = read_keypair(Path(nm.key)), read_public_key(Path(nm.mm_key))
        except KeyFileError as exc:
            raise SystemExit(f"storm-nm: {exc}") from None
        for sock in (self.mm, self.heartbeats):
            curve_client(sock, own, server)
        log.info("CURVE: key %s... (%s), storm-mm's public key from %s", own.fingerprint, nm.key, nm.mm_key)

    def _watch_links(self) -> list[Coroutine[Any, Any, None]]:
        """A refused key or a CURVE mismatch shows only on this side: the MM never hears from this node."""
        keys = f" ([nm] key {self.config.nm.key or 'not set'}, mm_key {self.config.nm.mm_key or 'not set'})"
        links = ((self.mm, f"storm-mm at {self.config.nm.mm}"), (self.heartbeats, "storm-mm's heartbeats"))
        watches = []
        for sock, what in links:
            again = functools.partial(self._reconnect, sock)
            watch = watch_handshakes(sock, what, server=False, logger=log, advice=keys, reconnect=again)
            watches.append(watch)
        return watches

    def _reconnect(self, sock: zmq.asyncio.Socket) -> None:
        """Try a link again after a refused handshake (libzmq does not), e.g. once the MM allows our key."""
        endpoint = self.config.nm.mm if sock is self.mm else self.heartbeat_endpoint
        if endpoint:
            with contextlib.suppress(zmq.ZMQError):
                sock.disconnect(endpoint)
            sock.connect(endpoint)

    # ---------------------------------------------------------------------------------------------- main

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGUSR1, self._stop_jobs_and_exit)
        # Before the shells' socket exists: a re-adopted shell's first words find its job known.
        adopted = self.local.recover(self._shell_exited)
        if adopted:
            log.info("re-adopted %d job(s) left by a previous storm-nm", len(adopted))
        self.os.prepare()  # the job shell launcher starts now, not in the middle of the first job
        self.local.shells_endpoint = bind(self.shells, f"ipc://{self.run_dir / 'shells.sock'}")
        # Job shells run as their job's user and must reach the NM; their pids authenticate them.
        os.chmod(self.run_dir / "shells.sock", 0o666)  # noqa: S103
        os.chmod(self.run_dir, 0o755)  # noqa: S103
        watches = self._watch_links()  # before connecting: the first handshake may be the one refused
        self.mm.connect(self.config.nm.mm)
        info = {"pid": os.getpid(), "node": self.name, "mm": self.config.nm.mm, "cpus": self.cpus}
        (self.run_dir / "nm.json").write_text(json.dumps(info) + "\n")
        log.info(
            "storm-nm %s: %d PEs on CPUs %s, MM at %s, %s",
            self.name, len(self.cpus), self.cpus, self.config.nm.mm, self.priority,
        )  # fmt: skip
        tasks = [
            asyncio.create_task(self._from_mm()),
            asyncio.create_task(self._from_shells()),
            asyncio.create_task(self._reporter()),
            asyncio.create_task(self._from_heartbeats()),
            asyncio.create_task(self._watchdog()),
            asyncio.create_task(self.notify.watchdog()),
        ]
        tasks.extend(asyncio.create_task(watch) for watch in watches)
        # Ready once job shells are served, without waiting for the MM: a node must come up (and keep its
        # jobs) while the MM is down. The status says whether it has registered.
        self.notify.ready(f"{len(self.cpus)} PEs; waiting for storm-mm at {self.config.nm.mm}")
        await self.stopping.wait()
        self.notify.stopping()
        await self._shutdown()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        (self.run_dir / "nm.json").unlink(missing_ok=True)
        self.shells.close()
        self.mm.close()
        self.heartbeats.close()
        self.ctx.term()
        self.os.close()
        if self.trace is not None:
            self.trace.close()
        os.close(self._lock)

    # ---------------------------------------------------------------------------------------------- slices

    def _follow(self, msg: p.NodeRegistered) -> None:
        """Follow the policy of the MM just registered with (heartbeats under gang and FCS)."""
        self.policy = self.switcher.policy = msg.policy
        self.local.spin_blocking = msg.policy in SPIN_BLOCKING_POLICIES
        self.classifier.constants = msg.fcs
        self.switcher.f_priority = msg.fcs.f_priority
        self.monitor.spin_ns = self.local.spin_ns = int(msg.fcs.spin * 1e9)
        if not self.config.nm.heartbeat_timeout:
            self.follower.timeout = max(1.0, 10 * msg.slice)
        self.follower.follow(msg.mm_epoch, time.monotonic())
        endpoint = ""
        if msg.policy in ("gang", "fcs"):
            host = self.config.nm.mm.split("://", 1)[-1].rsplit(":", 1)[0]
            endpoint = f"tcp://{host}:{msg.heartbeat_port}"
        if endpoint != self.heartbeat_endpoint:
            if self.heartbeat_endpoint:
                self.heartbeats.disconnect(self.heartbeat_endpoint)
            if endpoint:
                self.heartbeats.connect(endpoint)
            self.heartbeat_endpoint = endpoint
            log.info("policy %s%s", msg.policy, f": heartbeats from {endpoint}" if endpoint else "")
        if self.follower.row is None:
            self.switcher.switch(None)  # until a heartbeat says otherwise, everything runs

    def _job_stats(self, job_id: int) -> p.JobStats:
        """The job's ranks on this node: mpihook's measurements, and under FCS their classes."""
        ranks = []
        for stats in self.monitor.stats(job_id) or self._unmeasured(job_id):
            key = (job_id, stats.rank)
            unit = self.switcher.units.get(key)
            extra: dict[str, object] = {"job_id": job_id, "pe": unit.pe if unit else 0}
            if self.policy == "fcs":
                state = self.classifier.state(key)
                extra.update(klass=state.klass.value, cslots=state.cslots, tslots=state.tslots)
            ranks.append(dataclasses.replace(stats, **extra))  # type: ignore[arg-type]
        changes = self.classifier.take_changes(job_id)
        profile = self.profiler.entries(job_id) if self.profiler is not None else ()
        return p.JobStats(job_id=job_id, node=self.name, ranks=tuple(ranks), changes=changes, profile=profile)

    def _unmeasured(self, job_id: int) -> list[p.RankStats]:
        """The ranks of a job that runs without mpihook (storm submit --no-hook, [nm] hook = false)."""
        job = self.jobs.get(job_id)
        if job is None or job.hook_segment:
            return []
        unmeasured = []
        for s in job.launch.slots:
            pid = job.pids.get(s.rank, 0)
            unmeasured.append(
                p.RankStats(
                    rank=s.rank,
                    node=self.name,
                    pid=pid,
                    state="no-hook",
                    t_cpu=0.0,
                    t_comm=0.0,
                    c_comm=0,
                    granularity=None,
                    calls=0,
                    wait_mode="poll",
                )
            )
        return unmeasured

    def _sample(self) -> None:
        """Read every rank's record at the end of a slice; profile it too, under the class it had then."""
        self.monitor.sample()
        if self.profiler is not None:
            for key, unit in self.switcher.units.items():
                snapshot = self.monitor.snapshot(unit.job_id, unit.index) if unit.pid else None
                if snapshot is not None:
                    klass = self.switcher.classes.get(key, Klass.CS).value if self.policy == "fcs" else ""
                    self.profiler.update(key, snapshot, klass)

    async def _from_heartbeats(self) -> None:
        while True:
            data = await self.heartbeats.recv()
            try:
                beat = p.decode(data, p.MAX_CLIENT_MESSAGE)
            except p.ProtocolError as exc:
                self._warn("bad heartbeat", "bad heartbeat: %s", exc)
                continue
            if not isinstance(beat, p.Heartbeat):
                self._warn("bad heartbeat", "unexpected %s on the heartbeat socket", beat.op)
            elif self.policy in ("gang", "fcs") and not self.follower.accept(beat, time.monotonic()):
                if beat.epoch == self.follower.epoch:
                    self._warn("stale heartbeat", "ignored heartbeat %d: replayed or out of order", beat.seq)
                else:  # a restarted MM's, until this NM has registered with it
                    log.debug("ignored heartbeat %d of storm-mm %s", beat.seq, beat.epoch[:8])
            elif self.policy in ("gang", "fcs"):
                self._sample()  # first: who is inside a blocking call as the slice ends
                if self.policy == "fcs":
                    self.classifier.end_of_slot(self.switcher.active, beat.resets)
                self.switcher.switch(beat.row, seq=beat.seq, sent=beat.sent)

    async def _watchdog(self) -> None:
        """No heartbeat for too long: let every job run rather than leave some stopped for ever."""
        while True:
            await asyncio.sleep(0.1)
            if self.policy not in ("gang", "fcs"):
                self._sample()  # without heartbeats, a slice of the default length
            if self.follower.expired(time.monotonic()):
                log.warning("no heartbeat for %.1f s: letting every job run", self.follower.timeout)
                self.switcher.switch(None)

    def _stop_jobs_and_exit(self) -> None:
        self.stop_jobs = True
        self.stopping.set()

    async def _shutdown(self) -> None:
        """Leave the jobs to the next storm-nm of this node, or (SIGUSR1) stop them all and tell the MM."""
        if not self.stop_jobs:
            left = self.local.leave()
            if left:
                log.info("exiting; %d job(s) keep running for the next storm-nm to re-adopt", left)
            return
        active = [j for j in self.jobs.values() if j.done is None]
        if active:
            log.info("stopping %d job(s) before exiting", len(active))
        for job in active:
            job.stopped_by_nm = f"storm-nm on {self.name} shut down"
            with contextlib.suppress(OSError):
                self.local.save_record(job)  # a report the MM misses is re-sent by the next NM, with why
            self.local.kill(job, job.stopped_by_nm)
        deadline = time.monotonic() + self.config.nm.kill_grace + STOP_WAIT_SECONDS
        while any(j.done is None for j in self.jobs.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for job in self.jobs.values():
            if job.done is None:
                self.local.shell_gone(job, "storm-nm stopped before the job shell finished")
            assert job.done is not None
            await self._to_mm(job.done)

    def _warn(self, kind: object, text: str, *args: object) -> None:
        self.throttle.warning(log, kind, time.monotonic(), text, *args)

    async def _to_mm(self, msg: p.Message) -> None:
        await self.mm.send(p.encode(msg))

    async def _reporter(self) -> None:
        """Register until the MM answers, then report status and re-send unacknowledged exits."""
        while True:
            self.wake_reporter.clear()
            if not self.registered.is_set():
                await self._to_mm(
                    p.RegisterNode(
                        node=self.name,
                        pes=len(self.cpus),
                        nm_epoch=self.epoch,
                        address=socket.gethostname(),
                        host=self.config.node_host(),
                        jobs=tuple(self.jobs),
                    )
                )
                interval = REGISTER_RETRY_SECONDS
            else:
                switches, p50, p99 = self.switcher.stats()
                await self._to_mm(
                    p.NodeStatus(
                        node=self.name,
                        nm_epoch=self.epoch,
                        mm_epoch=self.mm_epoch,
                        jobs=tuple(self.jobs),
                        switches=switches,
                        switch_p50_ms=p50,
                        switch_p99_ms=p99,
                    )
                )
                for job in list(self.jobs.values()):
                    if job.done is not None:
                        if job.spawns.failure is not None:  # before the report: what the job ends with
                            await self._to_mm(job.spawns.failure)
                        await self._to_mm(job.done)
                    elif job.launch.job_id in self.monitor.jobs or (job.ranks_known and not job.hook_segment):
                        await self._to_mm(self._job_stats(job.launch.job_id))
                interval = self.report_interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake_reporter.wait(), interval)

    # ---------------------------------------------------------------------------------------------- MM

    async def _from_mm(self) -> None:
        while True:
            data = await self.mm.recv()
            try:
                msg = p.decode(data, p.MAX_NODE_MESSAGE)
            except p.ProtocolError as exc:
                log.warning("bad message from the MM: %s", exc)
                continue
            try:
                if isinstance(msg, p.PmiNameResult):
                    await self._name_result(msg)
                else:
                    await self._mm_message(msg)
            except Exception:
                log.exception("error while handling %s from the MM; carrying on", msg.op)

    async def _mm_message(self, msg: p.Message) -> None:
        match msg:
            case p.NodeRegistered():
                first = not self.mm_epoch
                new_mm = msg.mm_epoch != self.mm_epoch
                self.mm_epoch = msg.mm_epoch
                self.report_interval = msg.report_interval
                self.registered.set()
                log.info("registered with storm-mm %s%s", msg.mm_epoch[:8], "" if first else " (again)")
                self.notify.status(f"{len(self.cpus)} PEs; registered with storm-mm {msg.mm_epoch[:8]}")
                for job_id in msg.stale_jobs:
                    job = self.jobs.get(job_id)
                    if job is not None:
                        self.local.kill(job, "the MM has ended this job")
                for key, row in msg.rows.items():
                    self.switcher.set_row(int(key), row)
                self._follow(msg)
                if new_mm:  # barriers the old MM may have lost
                    for job in self.jobs.values():
                        if job.barrier is not None and job.done is None:
                            await self._to_mm(job.barrier)
            case p.JobRows():
                for key, row in msg.rows.items():
                    self.switcher.set_row(int(key), row)
            case p.Reregister():
                log.info("storm-mm asks to register again: %s", msg.reason)
                self.registered.clear()
                self.wake_reporter.set()
            case p.LaunchJob():
                if msg.job_id not in self.jobs:  # else a repeated launch: the first one is under way
                    self.next_barrier[msg.job_id] = 0
                    job = self.local.launch(msg, self._shell_exited)
                    if job.done is not None:
                        await self._to_mm(job.done)
            case p.KillJob():
                job = self.jobs.get(msg.job_id)
                if job is None:
                    await self._to_mm(p.JobNodeDone(job_id=msg.job_id, node=self.name, exits=()))
                elif job.done is not None:
                    await self._to_mm(job.done)
                else:
                    self.local.kill(job, msg.reason)
            case p.PmiBarrierOut():
                job = self.jobs.get(msg.job_id)
                # Only the answer the shell waits for: after an MM restart the same one may come twice.
                if (
                    job is not None
                    and job.done is None
                    and job.barrier is not None
                    and job.barrier.seq == msg.seq
                ):
                    log.debug("job %d: PMI barrier %d out (%d keys)", msg.job_id, msg.seq, len(msg.kvs))
                    job.barrier = None
                    self.next_barrier[msg.job_id] = msg.seq + 1
                    # job.peer is known: the barrier came from the shell (to this NM, or again after it).
                    await self.shells.send_multipart([job.peer, p.encode(msg)])
            case p.Ack():
                self._acked(msg)
            case p.Error():
                log.warning("storm-mm reported an error: %s: %s", msg.code, msg.text)
            case _:
                log.warning("unexpected %s from the MM", msg.op)

    async def _name_result(self, msg: p.PmiNameResult) -> None:
        """The MM's answer to a name request: to the job shell that asked (it matches it by number)."""
        job = self.jobs.get(msg.job_id)
        if job is not None and job.done is None and job.peer:
            await self.shells.send_multipart([job.peer, p.encode(msg)])

    def _acked(self, msg: p.Ack) -> None:
        """The MM has a job's final report: nothing of the job need remain on the node."""
        job = self.jobs.get(msg.job_id)
        if job is not None and job.done is not None and msg.what == p.JobNodeDone.op:
            self.local.forget(job)
            self.next_barrier.pop(msg.job_id, None)
            self.classifier.forget(msg.job_id)
            if self.profiler is not None:
                self.profiler.forget(msg.job_id)

    # ---------------------------------------------------------------------------------------------- launch

    # ---------------------------------------------------------------------------------------------- shells

    async def _from_shells(self) -> None:
        while True:
            frames = await self.shells.recv_multipart(copy=False)
            try:
                await self._shell_message(frames)
            except Exception:
                log.exception("error while handling a job shell message; carrying on")

    async def _shell_message(self, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            return
        identity = frames[0].bytes
        try:
            msg = p.decode(frames[1].bytes, p.MAX_NODE_MESSAGE)
        except p.ProtocolError as exc:
            self._warn("bad shell", "bad message from a job shell: %s", exc)
            return
        job = self.jobs.get(getattr(msg, "job_id", -1))
        caller = peer_credentials(frames[1])
        if job is None:
            self._warn("bad shell", "dropped %s about an unknown job (from %s)", msg.op, describe(caller))
            return
        if caller is None or caller.pid != job.shell_pid:
            self._warn(
                "bad shell", "dropped %s from %s: not job %d's shell (pid %d)",
                msg.op, describe(caller), job.launch.job_id, job.shell_pid,
            )  # fmt: skip
            return
        # The kernel vouches for the sender's pid (SO_PEERCRED), not the routing id it chose: replies go to
        # the connection the shell itself speaks on, whatever id another process may have taken. Any of its
        # messages will do, not only its hello: after an NM restart, what it queued while no NM listened
        # comes first.
        job.peer = identity
        job_id = job.launch.job_id
        problem = shell_problem(
            job, msg, self.name, self.next_barrier.get(job_id), self.os.start_time,
            session=lambda: self.os.session_members(job.shell_pid),
        )  # fmt: skip
        if problem is not None:
            self._warn("bad shell", "job %d: refused %s from its shell: %s", job_id, msg.op, problem)
            return
        match msg:
            case p.RanksStarted():
                if self.local.started(job, {int(rank): pid for rank, pid in msg.pids.items()}):
                    await self._to_mm(p.JobLaunched(job_id=job.launch.job_id, node=self.name, pids=msg.pids))
            case p.RankExited() | p.RankAborted():
                if isinstance(msg, p.RankExited):
                    job.exits[msg.exit.rank] = msg.exit
                    self.switcher.rank_gone(job.launch.job_id, msg.exit.rank)
                if msg.exit.failed and not job.killing:
                    log.info("job %d: %s", job.launch.job_id, msg.exit.describe())
                    await self._to_mm(p.RankFailed(job_id=job.launch.job_id, node=self.name, exit=msg.exit))
                    self.local.kill(job, msg.exit.describe())
            case p.PmiBarrierIn():
                log.debug("job %d: PMI barrier %d in (%d keys)", msg.job_id, msg.seq, len(msg.kvs))
                job.barrier = msg
                await self._to_mm(msg)
            case p.ShellDone():
                await self.shells.send_multipart([identity, p.encode(p.Ack(job_id=msg.job_id, what=msg.op))])
                if job.done is None:
                    self.local.finish(job, msg.exits)
                    await self._to_mm(job.done)  # type: ignore[arg-type]
            case p.ShellHello():
                pass
            case p.Spawned() | p.SpawnExited() | p.JobSpawned() | p.PmiName():
                for report in self.local.dynamic(job, msg):
                    await self._to_mm(report)

    def _shell_exited(self, job: LocalJob) -> None:
        asyncio.get_running_loop().remove_reader(job.shell_pidfd)
        os.close(job.shell_pidfd)
        job.shell_pidfd = -1
        if job.done is None:
            self.local.shell_gone(job, "the job shell ended before reporting (its log is in the node's log)")
            assert job.done is not None
            self._background(self._to_mm(job.done))

    def _background(self, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)


def describe(caller: Caller | None) -> str:
    """A job shell socket's peer, for log lines about what it sent."""
    return "an unknown process" if caller is None else f"pid {caller.pid} (uid {caller.uid})"


def serve(config: StormConfig) -> None:
    async def main() -> None:
        await NodeManager(config).run()

    asyncio.run(main())
