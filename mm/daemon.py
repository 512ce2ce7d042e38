"""storm-mm's sockets: a thin asyncio shell around :class:`storm.mm.core.Controller`.

It decodes each message, says who sent it, hands it to the controller, and carries out the effects the
controller returns (mm/effects.py) in order; the clock and a restart go in the same way. It decides nothing
about jobs itself. Only rate limits (per uid, on submissions) stay here, as protection of the daemon.

Group commit: the messages already waiting on its sockets when the MM turns to them (up to BATCH from each)
are handled together in one store transaction, each in a savepoint of its own (one that fails changes
nothing), and
what the controller decided for all of them is carried out only once that transaction is committed: one
fsync for the batch, and still no client or node hears of a state the store does not hold.

It also chooses when the scheduling pass runs. Handling a message never runs one; when the controller says
one is due after a batch, the pass runs at its end, in the same transaction, if the last pass was short
(INLINE_PASS_MAX); otherwise a one-shot timer is armed (at most one at a time) and the pass runs when it
fires, after the messages handled meanwhile: a burst of submissions costs one pass, however long the queue.
The timer's delay is as long as the last pass took (see PASS_DELAY_MAX), so a burst spends at most about
half the MM's time in passes. Replies are carried out before the launches of the pass, so a client always
hears of its submission before any launch of its job is sent; the job is in the store (committed) by then.

Two ROUTER sockets: one for clients on a local ipc:// endpoint (the kernel's peer credentials say who calls),
one for node managers over TCP (each NM's routing id is its node name); under gang scheduling a PUB socket
carries one heartbeat per time slice; with ``[mm] client_tcp_endpoint`` a third ROUTER serves remote clients.
With ``[mm] key`` every TCP socket is a CURVE server and peers need allowed keys (mm/auth.py). Every
message is decoded and validated by storm.mm.protocol; anything wrong gets an ``error`` reply and a log line,
never a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, cast

import zmq
import zmq.asyncio

from storm.mm import protocol as p
from storm.mm.auth import CLIENTS, NODES, Gatekeeper, domain_keys
from storm.mm.config import StormConfig
from storm.mm.core import Controller, FromNode
from storm.mm.effects import Attach, Effect, JobEnded, Publish, ReadHistory, Relay, Reply, Send, Wait
from storm.mm.history_db import HistoryReader
from storm.mm.keys import KeyFileError, curve_server, read_keypair
from storm.mm.limits import LogThrottle, RateLimits
from storm.mm.lockfile import take_lock
from storm.mm.net import Caller, bind, peer_credentials, raise_open_files, watch_handshakes
from storm.mm.priority import request_realtime
from storm.mm.rights import key_user
from storm.mm.sd_notify import Notifier
from storm.mm.store import Store
from storm.mm.tally import PASS_BOUNDS, Histogram

if TYPE_CHECKING:
    from storm.mm.exporter import MetricsServer

log = logging.getLogger("storm.mm")

TICK_SECONDS = 0.2
DEADLINE_SLACK = 0.001  # a time limit is checked this long after it falls due at the earliest
# A pass is put off by as long as the last one took, but never longer than this: a long queue must not delay
# every start by much.
PASS_DELAY_MAX = 0.05
# Messages taken from each socket into one batch (one commit) before the event loop gets a turn: node reports
# and a due pass must not wait for a whole burst of requests.
BATCH = 100
# A pass that took at most this long last time runs at the end of a batch, in its commit.
INLINE_PASS_MAX = 0.002
# A client request up to this many times [mm] max_message_bytes is read and refused with a clear error; a
# larger one makes ZeroMQ drop the connection before buffering it (ZMQ_MAXMSGSIZE), so no peer can make the
# MM allocate more than this per message.
HARD_LIMIT_FACTOR = 4
# Subscriptions are the only thing a heartbeat subscriber sends (NMs subscribe to everything: one byte).
MAX_SUBSCRIPTION = 256
CURVE_HANDSHAKE = 1024

Handler = Callable[[list[zmq.Frame]], None]  # what handles one message's frames from a socket


def key_credentials(frame: zmq.Frame) -> Caller | str:
    """A remote client is the user its allowed key names (the ZAP handler's User-Id), or why it is none."""
    try:
        name = str(frame.get("User-Id"))
    except zmq.ZMQError:
        return "this client presented no key"
    try:
        user = pwd.getpwnam(key_user(name))
    except KeyError:
        return f"client key {name!r} names no user on storm-mm's host"
    return Caller(user.pw_uid, user.pw_gid, 0)


# Plain ints: arithmetic on pyzmq's enum constants goes through the enum machinery, on every message.
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def readable(socket: zmq.Socket[bytes]) -> bool:
    """Whether a message waits on ``socket`` (getsockopt, not pyzmq's slower ``.EVENTS`` attribute)."""
    return bool(cast(int, socket.getsockopt(EVENTS)) & POLLIN)


class MachineManager:
    def __init__(self, config: StormConfig) -> None:
        self.config = config
        self.state_dir = Path(config.mm.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = take_lock(
            self.state_dir / "mm.lock",
            busy=f"storm-mm: another storm-mm is running with state directory {self.state_dir}",
        )
        self.store = Store(self.state_dir / "storm.db", config.mm.sync)
        # History queries: one at a time, off the event loop, on a read-only connection (mm/history_db.py).
        self.history = HistoryReader(self.store.path)
        self.readers = ThreadPoolExecutor(max_workers=1, thread_name_prefix="storm-history")
        # The reader holds the GIL while it packs a page: the loop waits for it at most a switch interval
        # per turn (5 ms by default; p99 of a small request's round trip during whole-history reads went
        # from 19 ms to 10 ms, its max from 28 to 13, with 1 ms: tools/bench_history.py). Only that thread
        # competes for it.
        sys.setswitchinterval(0.001)
        self.epoch = uuid.uuid4().hex
        self.core = Controller(
            self.store, config.mm, self.epoch, nonce=lambda: secrets.token_hex(4),
            policy=config.cluster.policy, fcs=config.fcs_parameters(),
        )  # fmt: skip
        recovered = self.core.recover(time.time())
        self.priority = request_realtime() if config.mm.realtime else "ordinary priority"
        self.open_files = raise_open_files()  # two connections per node manager
        self.ctx = zmq.asyncio.Context()  # after the priority: its I/O thread inherits it
        self.clients = self.ctx.socket(zmq.ROUTER)
        self.nodes = self.ctx.socket(zmq.ROUTER)
        for s in (self.clients, self.nodes):
            s.setsockopt(zmq.LINGER, 0)
            # A peer that vanished must not make the MM block or grow without bound.
            s.setsockopt(zmq.ROUTER_MANDATORY, 0)
            s.setsockopt(zmq.SNDHWM, 100_000)
        self.max_message = config.mm.max_message_bytes
        self.clients.setsockopt(zmq.MAXMSGSIZE, HARD_LIMIT_FACTOR * self.max_message)
        self.nodes.setsockopt(zmq.MAXMSGSIZE, p.MAX_NODE_MESSAGE)
        self.nodes.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.heartbeats = self.ctx.socket(zmq.PUB)
        self.heartbeats.setsockopt(zmq.LINGER, 0)
        # Only the newest heartbeat matters: a slow subscriber loses old ones rather than queueing them.
        self.heartbeats.setsockopt(zmq.SNDHWM, 4)
        self.heartbeats.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION)
        self.remote: zmq.asyncio.Socket | None = None  # remote clients, over TCP with CURVE
        if config.mm.client_tcp_endpoint:
            self.remote = self.ctx.socket(zmq.ROUTER)
            for option, value in ((zmq.LINGER, 0), (zmq.ROUTER_MANDATORY, 0), (zmq.SNDHWM, 100_000)):
                self.remote.setsockopt(option, value)
            self.remote.setsockopt(zmq.MAXMSGSIZE, HARD_LIMIT_FACTOR * self.max_message)
        self.gate = self._authentication()
        self.submits = RateLimits(config.mm.submit_rate, config.mm.submit_burst)
        self.throttle = LogThrottle()  # warnings about bad input: a flood of garbage must not fill the disk
        self.waiters: dict[int, list[tuple[zmq.asyncio.Socket, bytes, int]]] = {}
        # Clients attached to streamed jobs' output: job id -> token -> where the client is (mm/streams.py).
        self.attached: dict[int, dict[str, tuple[zmq.asyncio.Socket, bytes]]] = {}
        self.pass_timer: asyncio.TimerHandle | None = None  # the armed pass, if any
        self.handled = self.batches = 0  # messages and batches of them (see _handle_batch)
        # Each served socket's shadow and handler: a batch takes from all of them (see _serve).
        self.waiting: dict[
            zmq.asyncio.Socket, tuple[zmq.Socket[bytes], Callable[[list[zmq.Frame]], None]]
        ] = {}
        self.drain_due = False  # a look at the sockets is queued on the event loop
        # While a batch is handled: what to carry out once its transaction is committed.
        self.batch: list[tuple[list[Effect], zmq.asyncio.Socket | None, bytes]] | None = None
        self.pass_seconds = 0.0  # how long the last pass took: the next one's delay
        self.pass_times = Histogram(PASS_BOUNDS)  # every pass's, for the metrics
        self.metrics: MetricsServer | None = None  # with [mm] metrics_endpoint (see _serve_metrics)
        self.recovered = recovered  # carried out once the sockets are bound
        self.stopping = asyncio.Event()
        self.notify = Notifier.from_environment()  # systemd's Type=notify; nothing without it

    def _authentication(self) -> Gatekeeper | None:
        """CURVE on every TCP socket, before any is bound; None (and a warning) without [mm] key."""
        mm = self.config.mm
        if not mm.key:
            log.warning(
                "no [mm] key: node managers connect to %s unauthenticated and unencrypted; anyone who"
                " reaches it can register a node and receive jobs (see the README's Security section)",
                mm.node_endpoint,
            )
            return None
        try:
            own = read_keypair(Path(mm.key))
        except KeyFileError as exc:
            raise SystemExit(f"storm-mm: [mm] key: {exc}") from None
        try:
            gate = Gatekeeper(self.ctx, domain_keys(mm.node_keys, mm.client_keys))
        except KeyFileError as exc:
            raise SystemExit(f"storm-mm: {exc}") from None
        curve_server(self.nodes, own, NODES)
        curve_server(self.heartbeats, own, NODES)
        # The limit on what subscribers send applies to handshake commands too, and a CURVE INITIATE is ~300
        # bytes (measured: 256 refuses every subscriber, 300 passes).
        self.heartbeats.setsockopt(zmq.MAXMSGSIZE, max(MAX_SUBSCRIPTION, CURVE_HANDSHAKE))
        if self.remote is not None:
            curve_server(self.remote, own, CLIENTS)
        log.info("CURVE: key %s..., node keys from %s", own.fingerprint, mm.node_keys)
        return gate

    async def _serve_metrics(self) -> str:
        """Serve GET /metrics with [mm] metrics_endpoint (mm/exporter.py); the address it got ("": off)."""
        endpoint = self.config.mm.metrics_endpoint
        if not endpoint:
            return ""
        # Imported here: prometheus_client takes 40 ms to import, which a storm-mm without metrics is spared.
        from storm.mm.exporter import MetricsServer, registry_for

        self.metrics = MetricsServer(registry_for(self.core, self.pass_times))
        try:
            address = await self.metrics.start(endpoint)
        except OSError as exc:
            raise SystemExit(f"storm-mm: cannot serve metrics on {endpoint}: {exc.strerror or exc}") from None
        log.info("metrics on http://%s/metrics", address)
        return address

    def _write_endpoints(
        self, client: str, node: str, heartbeat: str, remote: str = "", metrics: str = ""
    ) -> None:
        """Publish the real endpoints (ports may have been 0) for local tools; written atomically."""
        if client.startswith("ipc://"):
            # Every user may submit: the kernel tells the MM who each caller is.
            os.chmod(client[len("ipc://") :], 0o666)  # noqa: S103
        info = {
            "client": client,
            "node": node,
            "heartbeat": heartbeat,
            "client_tcp": remote,
            "metrics": metrics,
            "pid": os.getpid(),
            "epoch": self.epoch,
        }
        tmp = self.state_dir / "mm.json.tmp"
        tmp.write_text(json.dumps(info, indent=1) + "\n")
        tmp.replace(self.state_dir / "mm.json")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        client = bind(self.clients, self.config.mm.client_endpoint)
        node = bind(self.nodes, self.config.mm.node_endpoint)
        heartbeat = ""
        if self.core.runs.cycle is not None:
            heartbeat = bind(self.heartbeats, self.config.mm.heartbeat_endpoint)
            self.core.heartbeat_port = int(heartbeat.rsplit(":", 1)[1])
        remote = bind(self.remote, self.config.mm.client_tcp_endpoint) if self.remote is not None else ""
        self._write_endpoints(client, node, heartbeat, remote, await self._serve_metrics())
        self._serve(self.clients, self._client_message)
        self._serve(self.nodes, self._node_message)
        if self.remote is not None:
            remote_socket = self.remote
            self._serve(remote_socket, lambda f: self._client_message(f, remote_socket))
        self._carry_out(self.recovered)
        self.recovered = []
        beats = f", heartbeats on {heartbeat}" if heartbeat else ""
        beats += f", remote clients on {remote}" if remote else ""
        log.info(
            "storm-mm %s: policy %s, clients on %s, nodes on %s%s, state in %s, %s, %s",
            self.epoch[:8], self.core.policy, client, node, beats, self.state_dir, self.priority,
            self.open_files,
        )  # fmt: skip
        tasks = [
            asyncio.create_task(self._ticker()),
            asyncio.create_task(self.notify.watchdog()),
        ]
        if heartbeat:
            tasks.append(asyncio.create_task(self._heartbeats()))
        if self.gate is not None:
            tasks.append(asyncio.create_task(self.gate.serve()))
            for sock, endpoint in ((self.nodes, node), (self.heartbeats, heartbeat), (self.remote, remote)):
                if sock is not None and endpoint:  # handshakes that fail before the ZAP handler is asked
                    watch = watch_handshakes(sock, endpoint, server=True, logger=log)
                    tasks.append(asyncio.create_task(watch))
        # Ready: the store is open, every socket bound and served, mm.json written.
        self.notify.ready(f"policy {self.core.policy}; nodes on {node}; clients on {client}")
        await self.stopping.wait()
        log.info(
            "storm-mm stopping after %d scheduling passes; %d messages in %d batches, %d commits",
            self.core.runs.passes, self.handled, self.batches, self.store.commits,
        )  # fmt: skip
        await self._shut_down(tasks)

    async def _shut_down(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop serving, end the background tasks and close every socket, the readers and the store."""
        loop = asyncio.get_running_loop()
        self.notify.stopping()
        if self.pass_timer is not None:
            self.pass_timer.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for shadow, _ in self.waiting.values():
            loop.remove_reader(shadow.FD)
        (self.state_dir / "mm.json").unlink(missing_ok=True)
        if self.metrics is not None:
            await self.metrics.close()
        self.clients.close()
        self.nodes.close()
        self.heartbeats.close()
        if self.remote is not None:
            self.remote.close()
        if self.gate is not None:
            self.gate.close()
        self.readers.shutdown(wait=True, cancel_futures=True)
        self.history.close()
        self.ctx.term()
        self.store.close()
        os.close(self._lock)

    def _serve(self, socket: zmq.asyncio.Socket, handle: Handler) -> None:
        """Handle what comes on ``socket`` with ``handle``, in batches (see _drain).

        Its messages are read and its replies sent through a shadow (a plain socket on the same ZeroMQ
        socket) that never waits, when the loop sees its descriptor ready: pyzmq's awaitable receive made a
        future, a callback and several event-loop turns of every message, a good part of the MM's time."""
        shadow: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)
        self.waiting[socket] = (shadow, handle)
        asyncio.get_running_loop().add_reader(shadow.FD, self._drain)
        self._look_again()

    def _drain(self) -> None:
        """Handle every message waiting on any of the MM's sockets (up to BATCH from each) as one batch."""
        self.drain_due = False
        batch: list[tuple[Handler, list[zmq.Frame]]] = []
        for shadow, handler in self.waiting.values():
            for _ in range(BATCH):
                if not readable(shadow):  # (cheaper than a receive that fails)
                    break
                try:
                    batch.append((handler, shadow.recv_multipart(NOBLOCK, copy=False)))
                except zmq.Again:
                    break
        if batch:
            self._handle_batch(batch)
        self._look_again()

    def _look_again(self) -> None:
        """Drain again soon if any socket holds a message. A ZeroMQ socket's descriptor signals changes,
        not messages: those that came while a batch was handled, or that a send took note of, are there
        without a wake-up; what is left beyond BATCH waits for the loop's other work to get a turn."""
        if self.drain_due:
            return
        for shadow, _ in self.waiting.values():
            if readable(shadow):
                self.drain_due = True
                asyncio.get_running_loop().call_soon(self._drain)
                return

    def _handle_batch(self, batch: list[tuple[Handler, list[zmq.Frame]]]) -> None:
        """Handle the messages in one transaction (and the pass, if due and short), then carry out what was
        decided (see the module's docstring)."""
        self.batch = []
        self.batches += 1
        self.handled += len(batch)
        try:
            with self.store.transaction():
                for handle, frames in batch:
                    try:
                        handle(frames)  # each stimulus in a savepoint of its own
                    except Exception:
                        log.exception("unexpected error while handling a message; carrying on")
                if self.core.pass_due and self.pass_seconds <= INLINE_PASS_MAX:
                    self._run_pass()
        except Exception:
            log.exception("could not commit a batch of %d message(s): none of it carried out", len(batch))
            self.batch = None
            return
        done, self.batch = self.batch, None
        for effects, sock, identity in done:
            self._carry_out(effects, sock, identity, look=False)  # (_drain looks once, after the batch)
        self._arm_pass()

    async def _ticker(self) -> None:
        """The periodic check, every TICK_SECONDS, and sooner when a job's time limit comes sooner: a job
        ends TIMEOUT on time, not up to a tick late."""
        while True:
            deadline = self.core.next_deadline(time.time())
            wait = TICK_SECONDS if deadline is None else min(TICK_SECONDS, deadline - time.time())
            await asyncio.sleep(max(DEADLINE_SLACK, wait))
            try:
                self._carry_out(self.core.tick(time.time()))
            except Exception:
                log.exception("unexpected error in the periodic check; carrying on")

    async def _heartbeats(self) -> None:
        """One heartbeat per slice, on a fixed schedule: a late slice does not shift the ones after it."""
        loop = asyncio.get_running_loop()
        slice_ = self.config.mm.slice
        due = loop.time()
        while True:
            try:
                self._carry_out(self.core.heartbeat(time.time()))
            except Exception:
                log.exception("could not send a heartbeat; carrying on")
            due += slice_
            now = loop.time()
            if due < now - slice_:  # more than a slice behind (the host stalled): start afresh, no burst
                due = now
            await asyncio.sleep(max(0.0, due - now))

    def _arm_pass(self) -> None:
        """The controller wants a pass: run it soon (see the module's docstring), unless one is armed."""
        if self.pass_timer is None and self.core.pass_due:
            delay = min(self.pass_seconds, PASS_DELAY_MAX)
            self.pass_timer = asyncio.get_running_loop().call_later(delay, self._run_pass)

    def _run_pass(self) -> None:
        if self.pass_timer is not None:
            self.pass_timer.cancel()
            self.pass_timer = None
        started, passes = time.monotonic(), self.core.runs.passes
        try:
            self._carry_out(self.core.schedule(time.time()))
        except Exception:
            log.exception("unexpected error in a scheduling pass; carrying on")
        self.pass_seconds = time.monotonic() - started
        if self.core.runs.passes != passes:  # one ran (none while nodes come back after a restart)
            self.pass_times.observe(self.pass_seconds)

    def _carry_out(
        self,
        effects: list[Effect],
        sock: zmq.asyncio.Socket | None = None,
        identity: bytes = b"",
        *,
        look: bool = True,
    ) -> None:
        """Do what the controller decided, in order; ``sock`` and ``identity`` are the sender's, if any.
        Then arm a pass if the controller wants one. While a batch is handled, kept until it is committed.
        ``look``: then see whether a message came that the sends hid from the event loop (_look_again)."""
        if self.batch is not None:
            self.batch.append((effects, sock, identity))
            return
        self._arm_pass()
        for effect in effects:
            match effect:
                case Send():
                    self._send(self.nodes, effect.node.encode("utf-8", "surrogateescape"), effect.message)
                case Reply() if sock is not None:
                    self._send(sock, identity, effect.message)
                case Wait() if sock is not None:
                    self.waiters.setdefault(effect.job_id, []).append((sock, identity, effect.req))
                case JobEnded():
                    # effect.info is made per waiter: most jobs have none.
                    for waiter, who, req in self.waiters.pop(effect.job.id, []):
                        self._send(waiter, who, p.JobList(req=req, jobs=(effect.info,)))
                    self.attached.pop(effect.job.id, None)
                case Attach() if sock is not None:
                    self.attached.setdefault(effect.job_id, {})[effect.token] = (sock, identity)
                case Relay():
                    client = self.attached.get(effect.job_id, {}).get(effect.token)
                    if client is not None:
                        self._send(*client, effect.message)
                case Publish():
                    self.heartbeats.send(p.encode(effect.heartbeat), flags=zmq.NOBLOCK)
                case ReadHistory() if sock is not None:
                    self._read_history(effect, sock, identity)
                case _:
                    log.error("no sender to carry out %r for; dropped", effect)
        if effects and look:
            self._look_again()  # a send may have taken note of a message that then signals nothing

    def _read_history(self, effect: ReadHistory, sock: zmq.asyncio.Socket, identity: bytes) -> None:
        """Read and encode the page in the worker thread; send it from the loop once it is ready."""
        read = asyncio.get_running_loop().run_in_executor(
            self.readers, self.history.answer, effect.query, effect.req
        )

        def send(done: asyncio.Future[bytes]) -> None:
            if done.cancelled():
                return
            try:
                data = done.result()
            except Exception as exc:  # a bug in the reader: the caller hears of it, the MM carries on
                log.exception("history request failed")
                text = f"internal error: {exc.__class__.__name__}: {exc}"
                data = p.encode(p.Error(req=effect.req, code="internal", text=text))
            try:
                self.waiting[sock][0].send_multipart([identity, data], flags=NOBLOCK)
            except zmq.ZMQError as exc:
                log.warning("could not send a history page to %r: %s", identity, exc)

        read.add_done_callback(send)

    def _warn(self, kind: object, text: str, *args: object) -> None:
        self.throttle.warning(log, kind, time.monotonic(), text, *args)

    def _send(self, socket: zmq.asyncio.Socket, identity: bytes, msg: p.Message) -> None:
        try:
            # Through the shadow: the asyncio socket's send makes a future even when it cannot wait.
            self.waiting[socket][0].send_multipart([identity, p.encode(msg)], flags=NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("could not send %s to %r: %s", msg.op, identity, exc)

    # ---------------------------------------------------------------------------------------------- clients

    def _client_message(self, frames: list[zmq.Frame], remote: zmq.asyncio.Socket | None = None) -> None:
        """A request from a local client, or from a remote one (``remote``: its socket) if given."""
        sock = remote or self.clients
        if len(frames) != 2:
            self._warn("client frames", "client message with %d frames dropped", len(frames))
            return
        identity, body, limit = frames[0].bytes, frames[1], self.max_message
        if len(body) > limit:
            text = f"request of {len(body)} bytes is over the [mm] max_message_bytes limit of {limit}"
            self._warn("client too_large", "client message refused: %s", text)
            self._send(sock, identity, p.Error(code="too_large", text=text))
            return
        try:
            msg = p.decode(body.bytes, limit)
        except p.ProtocolError as exc:
            self._warn("client bad_request", "bad client message: %s", exc)
            error = p.Error(req=p.peek_req(body.bytes, limit), code="bad_request", text=str(exc))
            self._send(sock, identity, error)
            return
        caller = key_credentials(body) if remote is not None else peer_credentials(body)
        if not isinstance(caller, Caller):
            text = caller or "only local clients are served"
            self._send(sock, identity, p.error_for(msg, "unauthenticated", text))
            return
        if isinstance(msg, p.SubmitJob):
            wait = self.submits.allow(caller.uid, time.monotonic())
            if wait:
                limits = self.config.mm
                text = (
                    f"too many submissions from {caller.user}: at most {limits.submit_rate:g} per second"
                    f" after a burst of {limits.submit_burst}; try again in {wait:.2f} s"
                )
                self._warn(("rate", caller.uid), "%s", text)
                self._send(sock, identity, p.error_for(msg, "rate_limited", text))
                return
        try:
            with self.store.savepoint():
                effects = self.core.handle(msg, time.time(), caller)
        except Exception as exc:
            log.exception("client request %s failed", msg.op)
            error = p.error_for(msg, "internal", f"internal error: {exc.__class__.__name__}: {exc}")
            effects = [Reply(error)]
        self._carry_out(effects, sock, identity)

    # ---------------------------------------------------------------------------------------------- nodes

    def _node_message(self, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            self._warn("node frames", "node message with %d frames dropped", len(frames))
            return
        identity, body = frames[0].bytes, frames[1].bytes
        try:
            msg = p.decode(body, p.MAX_NODE_MESSAGE)
        except p.ProtocolError as exc:
            self._warn("node bad", "bad message from node %r: %s", identity, exc)
            self._send(self.nodes, identity, p.Error(code="bad_request", text=str(exc)))
            return
        # The routing id is checked against the node a message names, and the node against those registered,
        # inside the controller: a surrogate escape keeps any identity's bytes, so no other name can match.
        sender = FromNode(identity.decode("utf-8", "surrogateescape"))
        if isinstance(msg, p.JobOutput):  # relayed, never stored: no savepoint
            self._carry_out(self.core.output(msg, sender, time.time()), self.nodes, identity)
            return
        with self.store.savepoint():
            effects = self.core.handle(msg, time.time(), sender)
        self._carry_out(effects, self.nodes, identity)


def serve(config: StormConfig) -> None:
    async def main() -> None:
        await MachineManager(config).run()

    asyncio.run(main())
