"""storm-nm: launches and stops the local ranks of jobs, and reports them to storm-mm.

Each job runs in the job shell of its user on this node (nm/shell_server.py, one per user, started by the NM
as that user when it has none and retired once idle); the shell spawns the ranks and serves PMI, and reports
to the NM over a Unix socket in its run directory, each connection authenticated by the pid and uid the
kernel reports for it (SO_PEERCRED; nm/shell_link.py). The NM
relays to the MM (DEALER, routing id = node name): launches, rank failures, cross-node PMI barriers and the
final exits of the node's ranks, which it re-sends until the MM acknowledges them. It also learns the
processes the ranks spawn (MPI_Comm_spawn, nm/children.py), time-slices and kills them with the job, ends
the job when one fails, and relays spawn counts and MPI's name requests (MPI_Publish_name ...) to the MM,
and the MM's answers back to the shell.

Every decision is the node core's (nm/node.py): what a message, a heartbeat or the clock does, which ranks
run, how each process is classified, a job's life on the node. This module moves bytes: the sockets to the
MM, the heartbeats and the job shells, CURVE, the reporter's timer, the watches of the shells' ends, the
checks that a context switch took effect, and shutdown.

Stopping and restarting: SIGTERM (``systemctl stop`` or ``restart``, with KillMode=process) and SIGINT make
the NM exit and leave its jobs running: it continues any rank time slicing had stopped, and the next storm-nm
of this node re-adopts every job from its run directory (nm/local_jobs.py), as after a SIGKILL or a crash.
SIGUSR1 stops every job of the node first (NODE_FAIL, "storm-nm on NODE shut down"), reports them, then
exits: what ``storm local down`` sends.

Under gang scheduling and FCS the NM also subscribes to the MM's heartbeats; without them everything runs.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from storm.mm.net import watch_handshakes
from storm.mm.priority import request_realtime
from storm.mm.sd_notify import Notifier
from storm.mpihook.stats import cluster_token
from storm.nm.link import Frames, Link
from storm.nm.local_jobs import LocalJob
from storm.nm.monitor import Monitor
from storm.nm.node import Node, Outcome
from storm.nm.processes import LinuxProcesses, Processes
from storm.nm.shell_link import ShellListener, Who
from storm.nm.shells import JobShell
from storm.nm.switch_check import verify
from storm.nm.switcher import SwitchCheck, TraceLine

log = logging.getLogger("storm.nm")


REGISTER_RETRY_SECONDS = 1.0
STOP_WAIT_SECONDS = 5.0
SHELLS_EXIT_SECONDS = 2.0  # how long an exiting NM waits for the job shells it retired
SEND_WAIT_SECONDS = 1.0  # how long an exiting NM waits for sends to the MM ZeroMQ could not take yet
TICK_SECONDS = 0.1
# The event loop's timers wake up to a millisecond late (epoll's timeout is in whole milliseconds): a slot's
# timer fires this long before its instant, and the rest is slept (see _arm_slot).
SLOT_EARLY = 0.0015
TRACE_DELAY = 0.02  # seconds from a trace line to its write (see _write_trace)


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
        # Served without pyzmq's futures (nm/link.py): a send never waits, so carrying out is not a coroutine;
        # nor does one to a job shell (nm/shell_link.py).
        self.to_mm = Link(self.mm, self._mm_message)
        self.to_shells = ShellListener(self.run_dir / "shells.sock", p.MAX_NODE_MESSAGE, self._shell_message)
        self.heartbeats = self.ctx.socket(zmq.SUB)
        self.heartbeats.setsockopt(zmq.LINGER, 0)
        self.heartbeats.setsockopt(zmq.CONFLATE, 1)  # only the newest heartbeat matters
        self.heartbeats.setsockopt(zmq.SUBSCRIBE, b"")
        self.heartbeats.setsockopt(zmq.MAXMSGSIZE, p.MAX_CLIENT_MESSAGE)  # a heartbeat is ~100 bytes
        self._keys()
        self.throttle = LogThrottle()  # warnings about bad input: a flood of garbage must not fill the disk
        self.heartbeat_endpoint = ""
        # Line-buffered: a reader sees each heartbeat soon after it happens (ten short writes a second). Lines
        # are written TRACE_DELAY after they are made, not at a slot's instant (see _write_trace).
        self.trace = open(config.nm.trace, "a", buffering=1) if config.nm.trace else None  # noqa: SIM115
        self.trace_lines: list[TraceLine] = []
        self.node = Node(
            config.nm, self.name, self.cpus, self.run_dir, epoch=uuid.uuid4().hex, processes=self.os,
            measurements=Monitor(self.os, self.name), address=socket.gethostname(), host=config.node_host(),
            cluster=cluster_token(config.cluster.name, config.nm.mm),
            trace=self._write_trace if self.trace is not None else None,
        )  # fmt: skip
        self.jobs = self.node.jobs
        self._verifying: asyncio.Task[None] | None = None

    def _write_trace(self, line: TraceLine) -> None:
        """Keep a trace line, to be written a little later: at an instant, every node manager of a host
        wakes at once, and a write before going back to sleep is that much longer before the next one gets
        a CPU (the spread of 8 NMs on 2 CPUs grows with each one's work between wake-up and sleep)."""
        if not self.trace_lines:
            asyncio.get_running_loop().call_later(TRACE_DELAY, self._flush_trace)
        self.trace_lines.append(line)

    def _flush_trace(self) -> None:
        if self.trace is not None:
            self.trace.writelines(line.format() for line in self.trace_lines)
        self.trace_lines.clear()

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
        self._carry_out(self.node.recover())
        self.os.prepare()  # the job shell launcher starts now, not in the middle of the first job
        self.to_shells.start()
        self.node.local.shells_endpoint = str(self.to_shells.path)
        # Job shells run as their job's user and must reach the NM; their pids authenticate them.
        os.chmod(self.to_shells.path, 0o666)  # noqa: S103
        os.chmod(self.run_dir, 0o755)  # noqa: S103
        watches = self._watch_links()  # before connecting: the first handshake may be the one refused
        self.mm.connect(self.config.nm.mm)
        self.to_mm.start()
        info = {"pid": os.getpid(), "node": self.name, "mm": self.config.nm.mm, "cpus": self.cpus}
        (self.run_dir / "nm.json").write_text(json.dumps(info) + "\n")
        log.info(
            "storm-nm %s: %d PEs on CPUs %s, MM at %s, %s",
            self.name, len(self.cpus), self.cpus, self.config.nm.mm, self.priority,
        )  # fmt: skip
        tasks = [
            asyncio.create_task(self._reporter()),
            asyncio.create_task(self._from_heartbeats()),
            asyncio.create_task(self._clock()),
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
        await self.to_mm.drained(SEND_WAIT_SECONDS)
        self.to_mm.stop()
        self.to_shells.stop()
        (self.run_dir / "nm.json").unlink(missing_ok=True)
        self.mm.close()
        self.heartbeats.close()
        self.ctx.term()
        self.os.close()
        if self.trace is not None:
            self._flush_trace()
            self.trace.close()
        os.close(self._lock)

    def _carry_out(self, out: Outcome) -> None:
        """Do what the core decided: send, watch, time, check."""
        for msg in out.to_mm:
            self._to_mm(msg)
        for identity, reply in out.to_shells:
            self.to_shells.send(identity, p.encode(reply))
        loop = asyncio.get_running_loop()
        for job in out.watch:
            loop.add_reader(job.shell_pidfd, self._shell_exited, job)
        for shell in out.watch_shells:
            loop.add_reader(shell.pidfd, self._job_shell_ended, shell)
        for job_id in out.escalate:
            loop.call_later(self.config.nm.kill_grace, self.node.escalate, job_id)
        if out.check is not None:
            if self._verifying is not None and not self._verifying.done():
                self._verifying.cancel()  # a newer switch supersedes the check of the last one
            self._verifying = loop.create_task(self._verify(out.check))
        if out.report_now:
            self.wake_reporter.set()
        if out.slot is not None:
            self._arm_slot(*out.slot)

    def _arm_slot(self, seq: int, at: float) -> None:
        """Begin the slot of heartbeat ``seq`` at the wall-clock instant ``at``. The loop's timer fires
        SLOT_EARLY before it (converted to the loop's monotonic clock now: the instant is the MM's wall
        clock), and the callback sleeps what is left, which the kernel times to tens of microseconds at
        SCHED_FIFO (no timer slack): the loop is blocked for about a millisecond per slice, the price of
        switching on time."""
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + (at - time.time()) - SLOT_EARLY, self._slot_due, seq, at)

    def _slot_due(self, seq: int, at: float) -> None:
        left = at - time.time()
        if left > 0:
            time.sleep(left)
        try:
            out = self.node.begin_slot(seq, time.time())
        except Exception:
            log.exception("error while beginning the slot of heartbeat %d; carrying on", seq)
            return
        if out is not None:  # (most slots of an idle node: nothing more to do)
            self._carry_out(out)

    async def _verify(self, check: SwitchCheck) -> None:
        self.node.switch_checked(check, await verify(self.os, check))

    # ---------------------------------------------------------------------------------------------- slices

    def _heartbeats_from(self, msg: p.NodeRegistered) -> None:
        """Subscribe to the heartbeats of the MM just registered with, under gang and FCS."""
        endpoint = ""
        if self.node.following.cycles:
            host = self.config.nm.mm.split("://", 1)[-1].rsplit(":", 1)[0]
            endpoint = f"tcp://{host}:{msg.heartbeat_port}"
        if endpoint != self.heartbeat_endpoint:
            if self.heartbeat_endpoint:
                self.heartbeats.disconnect(self.heartbeat_endpoint)
            if endpoint:
                self.heartbeats.connect(endpoint)
            self.heartbeat_endpoint = endpoint
            log.info("policy %s%s", msg.policy, f": heartbeats from {endpoint}" if endpoint else "")

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
                continue
            self._carry_out(self.node.heartbeat(beat, time.monotonic(), time.time()))

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self._carry_out(self.node.tick(time.monotonic(), time.time()))

    def _stop_jobs_and_exit(self) -> None:
        self.stop_jobs = True
        self.stopping.set()

    async def _shutdown(self) -> None:
        """Leave the jobs to the next storm-nm of this node, or (SIGUSR1) stop them all and tell the MM; job
        shells without a job exit either way."""
        loop = asyncio.get_running_loop()
        if not self.stop_jobs:
            for job in self.jobs.values():
                self._unwatch(job)
            left = self.node.local.leave()
            if left:
                log.info("exiting; %d job(s) keep running for the next storm-nm to re-adopt", left)
            await self._retire_shells(everyone=False)
            return
        active = sum(1 for j in self.jobs.values() if j.done is None)
        if active:
            log.info("stopping %d job(s) before exiting", active)
        out = self.node.stop_all(f"storm-nm on {self.name} shut down")
        for job_id in out.escalate:
            loop.call_later(self.config.nm.kill_grace, self.node.escalate, job_id)
        for identity, msg in out.to_shells:
            self.to_shells.send(identity, p.encode(msg))
        deadline = time.monotonic() + self.config.nm.kill_grace + STOP_WAIT_SECONDS
        while any(j.done is None for j in self.jobs.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for msg in self.node.abandon("storm-nm stopped before the job shell finished"):
            self._to_mm(msg)
        await self._retire_shells(everyone=True)

    async def _retire_shells(self, *, everyone: bool) -> None:
        """Retire the job shells (those without a job, unless ``everyone``) and give them a moment to exit:
        one left waiting would see this NM go and exit too, but a test or ``storm local down`` expects them
        gone with it."""
        out = self.node.retire_shells(time.monotonic(), everyone=everyone)
        for identity, msg in out.to_shells:
            self.to_shells.send(identity, p.encode(msg))
        retired = [s for s in self.node.local.shells.all() if not s.jobs or everyone]
        deadline = time.monotonic() + SHELLS_EXIT_SECONDS
        while any(s.pidfd >= 0 for s in retired) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # their pidfds' readers run meanwhile
        for shell in self.node.local.shells.all():
            self._unwatch_shell(shell)

    def _warn(self, kind: object, text: str, *args: object) -> None:
        self.throttle.warning(log, kind, time.monotonic(), text, *args)

    def _to_mm(self, msg: p.Message) -> None:
        if isinstance(msg, p.JobOutput) and not msg.eof and self.to_mm.kept:
            return  # streamed output never queues behind a backed-up link: the job's files have it
        self.to_mm.send([p.encode(msg)])

    async def _reporter(self) -> None:
        """Register until the MM answers, then report status and re-send unacknowledged exits."""
        while True:
            self.wake_reporter.clear()
            if not self.to_mm.kept:  # (else repeats would pile up behind what ZeroMQ could not take yet)
                for msg in self.node.reports():
                    self._to_mm(msg)
            following = self.node.following
            interval = following.report_interval if following.registered else REGISTER_RETRY_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake_reporter.wait(), interval)

    # ---------------------------------------------------------------------------------------------- MM

    def _mm_message(self, frames: Frames) -> None:
        if len(frames) != 1:
            log.warning("message of %d frames from the MM dropped", len(frames))
            return
        try:
            msg = p.decode(frames[0].bytes, p.MAX_NODE_MESSAGE)
        except p.ProtocolError as exc:
            log.warning("bad message from the MM: %s", exc)
            return
        try:
            self._carry_out(self.node.from_mm(msg, time.monotonic(), time.time()))
            if isinstance(msg, p.NodeRegistered):
                self._heartbeats_from(msg)
                self.notify.status(f"{len(self.cpus)} PEs; registered with storm-mm {msg.mm_epoch[:8]}")
        except Exception:
            log.exception("error while handling %s from the MM; carrying on", msg.op)

    # ---------------------------------------------------------------------------------------------- shells

    def _shell_message(self, identity: bytes, message: bytes, who: Who) -> None:
        try:
            msg = p.decode(message, p.MAX_NODE_MESSAGE)
        except p.ProtocolError as exc:
            self._warn("bad shell", "bad message from a job shell: %s", exc)
            return
        self._carry_out(self.node.from_shell(identity, msg, who, time.monotonic()))

    def _shell_exited(self, job: LocalJob) -> None:
        self._unwatch(job)
        self._carry_out(self.node.shell_exited(job.job_id))

    def _job_shell_ended(self, shell: JobShell) -> None:
        self._unwatch_shell(shell)
        self._carry_out(self.node.job_shell_ended(shell.pid))

    def _unwatch_shell(self, shell: JobShell) -> None:
        if shell.pidfd >= 0:
            asyncio.get_running_loop().remove_reader(shell.pidfd)
            os.close(shell.pidfd)
            shell.pidfd = -1

    def _unwatch(self, job: LocalJob) -> None:
        if job.shell_pidfd >= 0:
            asyncio.get_running_loop().remove_reader(job.shell_pidfd)
            os.close(job.shell_pidfd)
            job.shell_pidfd = -1


def serve(config: StormConfig) -> None:
    async def main() -> None:
        await NodeManager(config).run()

    asyncio.run(main())
