"""Emulated node managers: many storm-nm cores in one process, each a node of its own to storm-mm.

``python -m storm.tools.emulator --config storm.toml --mm tcp://HOST:PORT --names emu0,emu1,... --run-dir D``
(what ``storm local up --emulate N`` starts, a process per batch of nodes) runs one
:class:`storm.nm.node.Node` per name, the very core storm-nm runs, each with a ZeroMQ connection of its own to
storm-mm (a DEALER whose routing id is its name, as storm-nm's) and its own heartbeat subscription (SUB,
CONFLATE), with CURVE when ``[nm] key`` is given (one key pair may serve every emulated node, as any node
key may act as any node). To storm-mm they are node managers like any other, so real and emulated ones mix
in one cluster. Their job shells and ranks are simulated (tools/emulated.py): a user's job shell starts, says
it is ready and takes each launch the core gives it, the job "runs" for the time its command says (``sleep
N``, ``true``) and its end is reported through the same messages a real job shell sends; an idle shell
is retired and exits as storm-nm's do. It is a driver of the node core, as DESIGN.md section 6 has it: the
real clock, real sockets to storm-mm, the daemon's own rules for heartbeat instants and reports; only fork,
signals, /proc and the job shells' side of their ipc:// connection are emulated.

This module is the shell: sockets, timers, the job shells' timing. It differs from nm/daemon.py where a
thousand nodes in one process would otherwise cost a thousand times as much, each time saying so:

- sockets are plain (not zmq.asyncio); their fds sit in one epoll of the emulator's, which is the event
  loop's only reader: a heartbeat costs a node a few microseconds, not an asyncio callback of its own;
- identical heartbeat bytes are decoded once (every node gets the same bytes; decoding is per node and in
  parallel on real nodes);
- nodes whose heartbeats name the same instant share one timer, which fires SLOT_EARLY before it and
  sleeps the rest (nm/daemon.py's rule), reading their cores' state into the CPU's cache (:func:`warm`)
  WARM_AHEAD before the instant; then it begins each node's slot in turn: each node's trace says when its
  own switch began, so the serial cost of a thousand cores on one CPU shows in the spread;
- trace lines (``--emulator-trace``, one file per emulator: ``NODE seq row sent received done ranks at
  begun``) are kept in memory, each node's in a list of its own, and written after a slot's switches, at
  most once a second;
- each node reports at its own phase of the report interval, not all of them in the same millisecond
  (real node managers start at different times), and the objects of a thousand cores are frozen out of the
  garbage collector's sweeps once they are built (a full sweep of them took milliseconds at an instant).

Like storm-nm it runs at SCHED_FIFO where allowed ([nm] realtime), so that it wakes for an instant
whatever else runs on the host, but below storm-mm and real node managers (EMULATOR_PRIORITY): a process
busy with five hundred nodes' heartbeats must not hold up storm-mm's sending of the same heartbeat to the
other five hundred, which at the same priority it did (the last one arrived 29 ms after sending instead of
15 ms, with 1,024 emulated nodes on two CPUs).

SIGTERM and SIGINT stop it: every emulated job is stopped and reported (NODE_FAIL, as ``storm local
down``'s SIGUSR1 does to storm-nm), acknowledgements are awaited a moment, and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import select
import signal
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import cast

import zmq

from storm.mm import protocol as p
from storm.mm.config import ConfigError, StormConfig, add_arguments, from_arguments
from storm.mm.keys import KeyFileError, Keypair, curve_client, read_keypair, read_public_key
from storm.mm.logs import configure_logging
from storm.mm.net import OPEN_FILES, raise_open_files
from storm.mm.priority import PRIORITY, request_realtime
from storm.mpihook.stats import cluster_token
from storm.nm.node import Node, Outcome
from storm.nm.switcher import TraceLine
from storm.tools.emulated import EmulatedJob, EmulatedProcesses, NoMeasurements

log = logging.getLogger("storm.emulator")

REGISTER_RETRY_SECONDS = 1.0  # as storm-nm
TICK_SECONDS = 0.2  # the core's clock: heartbeats that stopped (storm-nm ticks every 0.1 s)
# The timer of an instant fires this early (nm/daemon.py's rule, but earlier: this loop serves hundreds of
# nodes and fired 0.2-1.0 ms after a timer's time, and the warm pass takes half a millisecond).
SLOT_EARLY = 0.003
# The nodes' state is read into the cache this long before an instant (the warm pass takes about half of it):
# as late as that, so that what runs on the CPU meanwhile has little time to evict it again.
WARM_AHEAD = 0.0008
STOP_WAIT_SECONDS = 3.0
EMULATOR_PRIORITY = PRIORITY - 5  # SCHED_FIFO, below storm-mm's and storm-nm's (see the docstring)
TRACE_FLUSH_SECONDS = 1.0


class EmulatedNode:
    """One emulated node manager: its core and its two sockets to storm-mm."""

    def __init__(self, emulator: Emulator, name: str) -> None:
        self.emulator = emulator
        self.name = name
        config = emulator.config
        run_dir = emulator.run_dir / name
        (run_dir / "jobs").mkdir(parents=True, exist_ok=True)
        self.trace_lines: list[TraceLine] = []  # written by the emulator's _flush_trace
        self.core = Node(
            config.nm, name, list(range(emulator.pes)), run_dir, epoch=uuid.uuid4().hex,
            processes=emulator.processes, measurements=emulator.measurements,
            address=f"emulated:{os.getpid()}", cluster=emulator.cluster,
            trace=self.trace_lines.append if emulator.tracing else None,
        )  # fmt: skip
        self.begin_slot = self.core.begin_slot  # bound once: called for every node at every instant
        self.core.local.hook_library = None  # simulated ranks load nothing: they run as --no-hook ones do
        self.core.local.shells_endpoint = "emulated"
        self.mm = emulator.socket(zmq.DEALER)
        self.mm.setsockopt(zmq.ROUTING_ID, name.encode())
        self.mm.setsockopt(zmq.MAXMSGSIZE, p.MAX_NODE_MESSAGE)
        self.beats = emulator.socket(zmq.SUB)
        self.beats.setsockopt(zmq.CONFLATE, 1)  # only the newest heartbeat matters
        self.beats.setsockopt(zmq.SUBSCRIBE, b"")
        self.beats.setsockopt(zmq.MAXMSGSIZE, p.MAX_CLIENT_MESSAGE)
        self.heartbeat_endpoint = ""
        self.report: asyncio.Handle | None = None
        self.phase = zlib.crc32(name.encode()) / 2**32  # of the report interval, in [0, 1); -1: taken

    def start(self) -> None:
        self.mm.connect(self.emulator.mm_endpoint)
        self.emulator.add_reader(self.mm, self._from_mm)
        self.emulator.add_reader(self.beats, self._from_beats)
        self.report = asyncio.get_running_loop().call_soon(self._reporter)

    def close(self) -> None:
        for sock in (self.mm, self.beats):
            sock.close(linger=0)
        if self.report is not None:
            self.report.cancel()

    # ------------------------------------------------------------------------------------------ messages

    def send(self, msg: p.Message) -> None:
        try:
            self.mm.send(p.encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # storm-mm unreachable and the queue full: reports are re-sent anyway
            self.emulator.dropped += 1
        # A send may take in what arrived meanwhile without the socket's fd saying so again.
        if readable(self.mm):
            asyncio.get_running_loop().call_soon(self._from_mm)

    def _reporter(self) -> None:
        """Register until storm-mm answers, then report every report interval (nm/daemon.py's reporter), the
        first report after registering at this node's own phase of the interval."""
        for msg in self.core.reports():
            self.send(msg)
        following = self.core.following
        interval = following.report_interval if following.registered else REGISTER_RETRY_SECONDS
        if following.registered and self.phase >= 0:
            interval, self.phase = interval * (1 + self.phase), -1.0
        self.report = asyncio.get_running_loop().call_later(interval, self._reporter)

    def _from_mm(self) -> None:
        while readable(self.mm):
            data = self.mm.recv(zmq.NOBLOCK)
            try:
                msg = p.decode(data, p.MAX_NODE_MESSAGE)
            except p.ProtocolError as exc:
                log.warning("%s: bad message from storm-mm: %s", self.name, exc)
                continue
            try:
                self.emulator.carry_out(self, self.core.from_mm(msg, time.monotonic(), time.time()))
                if isinstance(msg, p.NodeRegistered):
                    self._heartbeats_from(msg)
            except Exception:
                log.exception("%s: error while handling %s from storm-mm; carrying on", self.name, msg.op)

    def _heartbeats_from(self, msg: p.NodeRegistered) -> None:
        endpoint = ""
        if self.core.following.cycles:
            host = self.emulator.mm_endpoint.split("://", 1)[-1].rsplit(":", 1)[0]
            endpoint = f"tcp://{host}:{msg.heartbeat_port}"
        if endpoint != self.heartbeat_endpoint:
            if self.heartbeat_endpoint:
                self.beats.disconnect(self.heartbeat_endpoint)
            if endpoint:
                self.beats.connect(endpoint)
            self.heartbeat_endpoint = endpoint

    def _from_beats(self) -> None:
        beats = self.beats
        while readable(beats):  # rather than recv to EAGAIN: its exception costs more than a heartbeat
            data = beats.recv(zmq.NOBLOCK)
            now, wall = time.monotonic(), time.time()
            beat = self.emulator.decode_heartbeat(data)
            if beat is not None:
                self.emulator.carry_out(self, self.core.heartbeat(beat, now, wall))


class Emulator:
    """The emulated node managers of one process (see the module's docstring)."""

    def __init__(
        self,
        config: StormConfig,
        names: list[str],
        run_dir: Path,
        *,
        pes: int = 1,
        default_run_time: float = 0.0,
        trace: Path | None = None,
    ) -> None:
        self.config = config
        self.mm_endpoint = config.nm.mm
        self.run_dir = run_dir
        self.pes = pes
        self.processes = EmulatedProcesses(default_run_time)
        self.shells_due = False  # what the job shells said is to be delivered (_shells_speak is scheduled)
        self.measurements = NoMeasurements()  # stateless: one for every node
        self.cluster = cluster_token(config.cluster.name, self.mm_endpoint)
        self.trace_path = trace
        self.tracing = trace is not None
        self.flushed = time.monotonic()
        self.dropped = 0  # sends refused because storm-mm's queue was full
        self.last_beat: tuple[bytes, p.Heartbeat | None] = (b"", None)
        self.slots: dict[float, list[tuple[EmulatedNode, int]]] = {}  # instant -> nodes and their seq
        # Before the context: its I/O thread inherits the priority (mm/priority.py).
        self.priority = request_realtime(EMULATOR_PRIORITY) if config.nm.realtime else "ordinary priority"
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max(1024, 2 * len(names) + 64))  # two sockets per node
        self.poller = select.epoll()
        self.readers: dict[int, Callable[[], None]] = {}  # fd -> what reads its socket
        self.keys = self._keys()
        self.names = names
        self.nodes: dict[str, EmulatedNode] = {}
        self.stopping = asyncio.Event()

    def _keys(self) -> tuple[Keypair, bytes] | None:
        nm = self.config.nm
        if bool(nm.key) != bool(nm.mm_key):
            raise SystemExit("storm emulator: give [nm] key and mm_key together")
        if not nm.key:
            return None
        try:
            return read_keypair(Path(nm.key)), read_public_key(Path(nm.mm_key))
        except KeyFileError as exc:
            raise SystemExit(f"storm emulator: {exc}") from None

    def add_reader(self, sock: zmq.Socket[bytes], read: Callable[[], None]) -> None:
        """Call ``read`` whenever ``sock`` may have messages (it reads until none is left)."""
        fd = cast(int, sock.getsockopt(zmq.FD))
        self.readers[fd] = read
        self.poller.register(fd, select.EPOLLIN)

    def _ready(self) -> None:
        """The event loop's one reader: every socket whose fd is ready is read, each in one call."""
        for fd, _ in self.poller.poll(0):
            read = self.readers.get(fd)
            if read is None:
                continue
            try:
                read()
            except Exception:
                log.exception("error while reading a socket; carrying on")

    def socket(self, kind: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:
            own, server = self.keys
            curve_client(sock, own, server)
        return sock

    # ------------------------------------------------------------------------------------------ running

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_reader(self.poller.fileno(), self._ready)
        for name in self.names:
            self.nodes[name] = EmulatedNode(self, name)
        gc.freeze()  # the cores' own objects live as long as the process: no sweep need look at them
        for node in self.nodes.values():
            node.start()
        log.info(
            "%d emulated node managers, storm-mm at %s, %s", len(self.nodes), self.mm_endpoint, self.priority
        )
        tasks = [asyncio.create_task(self._clock())]
        if self.tracing:
            tasks.append(asyncio.create_task(self._trace_writer()))
        await self.stopping.wait()
        await self._stop_jobs()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flush_trace()
        loop.remove_reader(self.poller.fileno())
        self.poller.close()
        for node in self.nodes.values():
            node.close()
        self.ctx.term()

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now, wall = time.monotonic(), time.time()
            for node in self.nodes.values():
                self.carry_out(node, node.core.tick(now, wall))

    async def _stop_jobs(self) -> None:
        """Stop every emulated job and report it, then wait a moment for storm-mm's acknowledgements; then
        every job shell is retired, as storm-nm's are when it exits (their logs in the run directory go)."""
        for node in self.nodes.values():
            self.carry_out(node, node.core.stop_all(f"emulated storm-nm on {node.name} shut down"))
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        while any(n.core.jobs for n in self.nodes.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        now = time.monotonic()
        for node in self.nodes.values():
            self.carry_out(node, node.core.retire_shells(now, everyone=True))
        self._shells_speak()  # their exits reach the cores now, not after the sockets have closed

    def decode_heartbeat(self, data: bytes) -> p.Heartbeat | None:
        """A heartbeat's bytes decoded, once for every node that gets the same bytes."""
        if data == self.last_beat[0]:
            return self.last_beat[1]
        beat: p.Heartbeat | None = None
        try:
            msg = p.decode(data, p.MAX_CLIENT_MESSAGE)
            beat = msg if isinstance(msg, p.Heartbeat) else None
        except p.ProtocolError as exc:
            log.warning("bad heartbeat: %s", exc)
        self.last_beat = (data, beat)
        return beat

    # ------------------------------------------------------------------------------------------ outcomes

    def carry_out(self, node: EmulatedNode, out: Outcome) -> None:
        """Do what a node core decided: messages to storm-mm go out, those to its job shells are taken by
        them at once; what the shells say in answer is delivered once this stimulus is done (_shells_speak),
        as a real job shell's answer comes after the NM's handling of what it answers."""
        processes = self.processes
        if out.slot is not None and not (out.to_mm or out.to_shells or out.check or processes.said):
            self._arm_slot(node, *out.slot)  # most heartbeats: nothing else to do, a thousand times over
            return
        acts = out.to_mm or out.to_shells or out.check or out.escalate or out.report_now or out.slot
        if not (acts or processes.said):
            return
        loop = asyncio.get_running_loop()
        for msg in out.to_mm:
            node.send(msg)
        for identity, msg in out.to_shells:
            processes.to_shell(identity, msg)
        for job_id in out.escalate:
            loop.call_later(self.config.nm.kill_grace, self._escalate, node, job_id)
        if out.check is not None:  # simulated ranks are in their new state as soon as they are signalled
            node.core.switch_checked(out.check, time.time())
        if out.report_now:
            for msg in node.core.reports():
                node.send(msg)
        if out.slot is not None:
            self._arm_slot(node, *out.slot)
        if processes.said and not self.shells_due:
            self.shells_due = True
            loop.call_soon(self._shells_speak)

    def _escalate(self, node: EmulatedNode, job_id: int) -> None:
        node.core.escalate(job_id)
        self.carry_out(node, Outcome())

    def _arm_slot(self, node: EmulatedNode, seq: int, at: float) -> None:
        waiting = self.slots.get(at)
        if waiting is None:
            self.slots[at] = waiting = []
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + (at - time.time()) - SLOT_EARLY, self._slots_due, at)
        waiting.append((node, seq))

    def _slots_due(self, at: float) -> None:
        waiting = self.slots.pop(at, [])
        left = at - WARM_AHEAD - time.time()
        if left > 0:
            time.sleep(left)
            warm(waiting)
        left = at - time.time()
        if left > 0:
            time.sleep(left)
        gc.disable()  # a sweep among a thousand switches would make the last ones late
        # The loop is the spread's floor (every node of this process switches in turn): names bound once.
        clock, carry_out = time.time, self.carry_out
        try:
            for node, seq in waiting:
                out = node.begin_slot(seq, clock())
                if out is not None:  # (an idle node's slot: nothing more to do)
                    carry_out(node, out)
        finally:
            gc.enable()
        if self.processes.said and not self.shells_due:
            self._shells_speak()  # a rank a continue let die of the signal it had pending
        if self.tracing and time.monotonic() - self.flushed >= TRACE_FLUSH_SECONDS:
            self._flush_trace()  # now, the furthest from the next instant

    # ------------------------------------------------------------------------------------------ shells

    def _shells_speak(self) -> None:
        """Deliver what the job shells said to their node cores, in order, and what that makes the shells
        say in turn (a job's whole start, say: ready, launch, ranks started), and time the jobs launched."""
        said = self.processes.said
        self.shells_due = True  # what the deliveries make them say is delivered by this loop too
        try:
            while said:
                shell, msg = said.popleft()
                node = self.nodes[shell.node]
                try:
                    if msg is None:
                        out = node.core.job_shell_ended(shell.pid)
                    else:
                        caller = (shell.pid, shell.uid)  # what SO_PEERCRED would give
                        out = node.core.from_shell(shell.identity, msg, caller, time.monotonic())
                    self.carry_out(node, out)
                except Exception:
                    what = "its exit" if msg is None else msg.op
                    log.exception("%s: error while handling %s of a job shell; carrying on", node.name, what)
        finally:
            self.shells_due = False
            self._arm_timers()

    def _arm_timers(self) -> None:
        loop = asyncio.get_running_loop()
        timers = self.processes.timers
        for seconds, job, code in timers:
            loop.call_later(seconds, self._time_up, job, code)
        timers.clear()

    def _time_up(self, job: EmulatedJob, code: int) -> None:
        """A job's run time is over: its ranks end, and their shell says so."""
        self.processes.time_up(job, code)
        if self.processes.said and not self.shells_due:
            self._shells_speak()

    # ------------------------------------------------------------------------------------------ traces

    async def _trace_writer(self) -> None:
        """Without heartbeats (batch) or instants, trace lines are written every few seconds anyway."""
        while True:
            await asyncio.sleep(TRACE_FLUSH_SECONDS)
            if time.monotonic() - self.flushed >= 3 * TRACE_FLUSH_SECONDS:
                self._flush_trace()

    def _flush_trace(self) -> None:
        self.flushed = time.monotonic()
        if self.trace_path is None:
            return
        text: list[str] = []
        for name, node in self.nodes.items():
            text += (f"{name} {line.format()}" for line in node.trace_lines)
            node.trace_lines.clear()
        if text:
            with open(self.trace_path, "a") as f:
                f.writelines(text)


def warm(waiting: list[tuple[EmulatedNode, int]]) -> None:
    """Read what each node's core reads as its slot begins, so that it is in this CPU's cache at the instant.
    Read only, changing nothing: a real node's core is a few kilobytes, in its own CPU's cache; five hundred
    of them here were not, and their misses slowed the serial switch at the instant (in process, 1.3
    microseconds a node cold against 0.8 warm; here, 1.2-1.6 ms for 512 nodes without this pass, 0.8-1.0
    with it)."""
    for node, _ in waiting:
        core = node.core
        switcher = core.switcher
        _ = (core.pending, switcher.units, switcher.followers, switcher.trace, core.timings.late_by)


def readable(sock: zmq.Socket[bytes]) -> bool:
    """A message waits on ``sock`` (asking also takes in what its fd signalled)."""
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m storm.tools.emulator", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--names", required=True, help="the emulated nodes' names, comma-separated")
    parser.add_argument(
        "--default-seconds", type=float, default=0.0,
        help="run time of a job whose command says none (not sleep N, true or false; default 0)",
    )  # fmt: skip
    parser.add_argument("--emulator-trace", type=Path, help="append every node's heartbeat trace lines here")
    add_arguments(parser, ("cluster", "nm"))
    args = parser.parse_args(argv)
    try:
        config = from_arguments(args)
    except ConfigError as exc:
        parser.error(str(exc))
    names = [n for n in args.names.split(",") if n]
    if not names:
        parser.error("give at least one name")
    configure_logging(config.nm.log_level, f"storm-emulator[{names[0]}..{names[-1]}]")
    logging.getLogger("storm.nm").setLevel(max(logging.WARNING, logging.getLogger().level))
    raise_open_files(max(OPEN_FILES, 8 * len(names) + 256))
    emulator = Emulator(
        config, names, Path(config.nm.run_dir), pes=config.nm.pes or 1, default_run_time=args.default_seconds,
        trace=args.emulator_trace,
    )  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(emulator.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
