"""Talking to storm-mm from Python: what the CLI, the tests and the benchmarks use.

Where the MM is, in order: an explicit endpoint, ``$STORM_MM``, a local cluster started by ``storm local up``
(in ``$STORM_LOCAL_DIR`` or the default local directory), ``/etc/storm/storm.toml``, and finally
``ipc:///run/storm/mm.sock``.

A ``tcp://`` endpoint is a remote MM's ``[mm] client_tcp_endpoint``, reached with CURVE (mm/auth.py): the
client's key pair comes from ``$STORM_KEY`` (default ``~/.config/storm/USER.key_secret``, what ``storm
keygen USER`` writes) and the MM's public key from ``$STORM_MM_KEY`` (default ``/etc/storm/keys/mm.key``).
A refused key or a handshake that fails is a ClientError at once, not a time-out.

The ``storm`` program sets ONE_SHOT for a command that asks one thing and exits: a local MM is then reached
through tools/zmtp.py's Dealer (the standard library: pyzmq takes longer to import than such a command
takes to run), which does not reconnect, so a lost connection is an error at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pwd
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from storm.mm import protocol as p

if TYPE_CHECKING:
    import zmq

    from storm.tools.zmtp import Dealer

DEFAULT_TIMEOUT = 30.0
DEFAULT_MM_KEY = "/etc/storm/keys/mm.key"
R = TypeVar("R", bound=p.Message)
# Set by tools/command.py for a command that asks storm-mm one thing and exits (see above).
ONE_SHOT = False


class ClientError(RuntimeError):
    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


def default_local_dir() -> Path:
    explicit = os.environ.get("STORM_LOCAL_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "storm" / "local"


def local_endpoint(local_dir: Path) -> str | None:
    """The client endpoint of a running local cluster in ``local_dir``, if there is one."""
    try:
        info = json.loads((local_dir / "mm" / "mm.json").read_text())
        os.kill(int(info["pid"]), 0)
    except PermissionError:
        pass  # it runs, as another user (a cluster started by root, used by everyone)
    except (OSError, ValueError, KeyError):
        return None
    endpoint = info.get("client")
    return endpoint if isinstance(endpoint, str) else None


def default_key() -> Path:
    """Where `storm keygen` (run by a user) puts the user's key pair."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "storm" / f"{pwd.getpwuid(os.getuid()).pw_name}.key_secret"


def find_endpoint(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if os.environ.get("STORM_MM"):
        return os.environ["STORM_MM"]
    local = local_endpoint(default_local_dir())
    if local:
        return local
    from storm.mm.config import DEFAULT_CONFIG, MMConfig, load  # only here: parsing TOML costs start-up time

    if DEFAULT_CONFIG.exists():
        return load(DEFAULT_CONFIG).mm.client_endpoint
    return MMConfig().client_endpoint


class Client:
    """A synchronous request/reply connection to storm-mm."""

    _sock: zmq.Socket[bytes]  # pyzmq's DEALER, unless a Dealer of tools/zmtp.py is used (ONE_SHOT)

    def __init__(self, endpoint: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = find_endpoint(endpoint)
        if self.endpoint.startswith("ipc://") and not os.path.exists(self.endpoint[len("ipc://") :]):
            raise self._unreachable()
        self.timeout = timeout
        self._monitor: zmq.Socket[bytes] | None = None
        self._dealer: Dealer | None = None
        self._key = ""
        self._reqs = itertools.count(1)
        if ONE_SHOT and self.endpoint.startswith("ipc://"):
            self._dealer = self._local(self.endpoint[len("ipc://") :])
            return
        import zmq  # not at the top: a ONE_SHOT command to a local MM does without it

        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if self.endpoint.startswith("tcp://"):
            self._curve()
        try:
            self._sock.connect(self.endpoint)
        except zmq.ZMQError as exc:  # a malformed endpoint (--mm, $STORM_MM): said, not a traceback
            self._sock.close()
            raise ClientError(
                "unreachable",
                f"cannot connect to {self.endpoint!r}: {exc} (an endpoint is ipc://PATH or tcp://HOST:PORT)",
            ) from None

    def _unreachable(self) -> ClientError:
        return ClientError(
            "unreachable",
            f"no storm-mm listens at {self.endpoint} (start one with `storm local up`, or set STORM_MM)",
        )

    def _local(self, path: str) -> Dealer:
        from storm.tools.zmtp import Dealer, ZmtpError

        try:
            return Dealer(path, self.timeout, p.MAX_NODE_MESSAGE)
        except (FileNotFoundError, ConnectionRefusedError):  # no socket, or nobody behind it (a stale one)
            raise self._unreachable() from None
        except TimeoutError:
            raise self._timeout(self.timeout) from None
        except ZmtpError as exc:
            raise ClientError("unreachable", f"storm-mm at {self.endpoint}: {exc}") from None
        except OSError as exc:  # pyzmq would retry in silence until the timeout
            raise ClientError("unreachable", f"cannot connect to {self.endpoint}: {exc.strerror}") from None

    def _timeout(self, wait: float) -> ClientError:
        return ClientError("timeout", f"storm-mm at {self.endpoint} did not answer within {wait:g} s")

    def _lost(self, exc: OSError) -> ClientError:
        text = exc.strerror or str(exc)
        return ClientError("unreachable", f"storm-mm at {self.endpoint}: {text} (did it stop or restart?)")

    def _curve(self) -> None:
        """A remote MM: CURVE with the user's key, and a monitor that reports a refused handshake."""
        # Here, not at the top: a local client needs no keys, and a command's start-up is most of its time.
        import zmq

        from storm.mm import keys

        self._key = os.environ.get("STORM_KEY") or str(default_key())
        mm_key = os.environ.get("STORM_MM_KEY") or DEFAULT_MM_KEY
        try:
            own, server = keys.read_keypair(Path(self._key)), keys.read_public_key(Path(mm_key))
        except keys.KeyFileError as exc:
            self._sock.close()
            raise ClientError(
                "no_key",
                f"{exc}; storm-mm at {self.endpoint} takes remote clients with CURVE keys only: your key pair"
                f" ($STORM_KEY, default {default_key()}, made by `storm keygen`) and its public key"
                f" ($STORM_MM_KEY, default {DEFAULT_MM_KEY})",
            ) from None
        keys.curve_client(self._sock, own, server)
        self._monitor = self._sock.get_monitor_socket(keys.HANDSHAKE_FAILURES)
        self._monitor.setsockopt(zmq.LINGER, 0)

    def _refused(self) -> ClientError:
        # zmq.utils.monitor imports asyncio (about 20 ms): only a refused CURVE handshake needs it.
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        from storm.mm.keys import handshake_problem

        assert self._monitor is not None
        event = parse_monitor_message(self._monitor.recv_multipart())
        text = handshake_problem(
            event["event"], event["value"], server=False, peer=f"storm-mm at {self.endpoint}"
        )
        public = self._key.removesuffix("_secret")
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            text += f"; ask its operator to allow {public} (copy it into the MM's [mm] client_keys directory)"
        return ClientError("unauthenticated", text)

    def close(self) -> None:
        if self._dealer is not None:
            self._dealer.close()
            return
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close()
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def receive(self, timeout: float | None = None) -> p.Message:
        wait = self.timeout if timeout is None else timeout
        if self._dealer is not None:
            try:
                data = self._dealer.recv(None if wait <= 0 else wait)
            except ConnectionError as exc:
                raise self._lost(exc) from None
            if data is None:
                raise self._timeout(wait)
            return p.decode(data, p.MAX_NODE_MESSAGE)
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        ready = dict(poller.poll(None if wait <= 0 else int(wait * 1000)))
        if self._sock not in ready:
            if self._monitor in ready:
                raise self._refused()
            raise self._timeout(wait)
        return p.decode(self._sock.recv(), p.MAX_NODE_MESSAGE)

    def send(self, request: p.Request) -> int:
        """Send a request without waiting for its answer (see :meth:`next_message`); its ``req``."""
        req = next(self._reqs)
        data = p.encode(dataclasses.replace(request, req=req))
        if self._dealer is not None:
            try:
                self._dealer.send(data)
            except ConnectionError as exc:
                raise self._lost(exc) from None
        else:
            self._sock.send(data)
        return req

    def next_message(self, timeout: float, wake_fd: int = -1) -> p.Message | None:
        """Whatever storm-mm sends next (a reply, a job's streamed output) within ``timeout`` seconds; None
        if nothing came, or if ``wake_fd`` became readable first (a signal's wake-up; pyzmq only)."""
        if self._dealer is not None:
            data = self._dealer.recv(timeout)
            return None if data is None else p.decode(data, p.MAX_NODE_MESSAGE)
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        if wake_fd >= 0:
            poller.register(wake_fd, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout * 1000)))
        if self._sock not in ready:
            return None
        return p.decode(self._sock.recv(), p.MAX_NODE_MESSAGE)

    def call(self, request: p.Request, expect: type[R], timeout: float | None = None) -> R:
        req = next(self._reqs)
        request = dataclasses.replace(request, req=req)
        if self._dealer is not None:
            try:
                self._dealer.send(p.encode(request))
            except ConnectionError as exc:
                raise self._lost(exc) from None
        else:
            self._sock.send(p.encode(request))
        while True:
            reply = self.receive(timeout)
            if isinstance(reply, p.Reply) and reply.req not in (req, 0):
                continue  # an answer to an earlier request that timed out
            if isinstance(reply, p.Error):
                raise ClientError(reply.code, reply.text)
            if not isinstance(reply, expect):
                raise ClientError("protocol", f"expected {expect.op}, got {reply.op}")
            return reply

    # -- conveniences

    def submit(self, argv: list[str], ranks: int, **options: object) -> int:
        """Submit a job; its id (an array's: see submit_job for its tasks')."""
        return self.submit_job(argv, ranks, **options).job_id

    def submit_job(self, argv: list[str], ranks: int, **options: object) -> p.JobSubmitted:
        """Submit a job, or an array (``array="0-9%2"``): the reply, which names an array's tasks."""
        request = p.SubmitJob(
            ranks=ranks,
            argv=tuple(argv),
            cwd=str(options.pop("cwd", os.getcwd())),
            env=dict(options.pop("env", os.environ)),  # type: ignore[call-overload]
            **options,  # type: ignore[arg-type]
        )
        return self.call(request, p.JobSubmitted)

    def jobs(self, job_ids: tuple[int, ...] = (), everything: bool = False, last: int = 0) -> list[p.JobInfo]:
        """Jobs by id, else the active ones; with ``everything`` the finished ones too: the newest ``last``
        of them (0: every one), read a page at a time (storm-mm sends at most ListJobs' page at once)."""
        if not everything or job_ids:
            return list(self.call(p.ListJobs(job_ids=job_ids, all=everything), p.JobList).jobs)
        found: dict[int, p.JobInfo] = {}
        before = 0
        while True:
            limit = min(p.LIST_PAGE, max(1, last - len(found))) if last else 0
            page = self.call(p.ListJobs(all=True, limit=limit, before=before), p.JobList)
            found.update((job.id, job) for job in page.jobs)
            if not page.older or (last and len(found) >= last):
                return [found[i] for i in sorted(found)]
            before = page.older

    def job(self, job_id: int) -> p.JobInfo:
        found = self.jobs((job_id,))
        if not found:
            raise ClientError("unknown_job", f"no job {job_id}")
        return found[0]

    def wait(self, job_id: int, timeout: float = 0) -> p.JobInfo:
        """Block until the job ends (timeout 0: forever)."""
        return self.call(p.WaitJob(job_id=job_id), p.JobList, timeout=timeout).jobs[0]

    def cancel(self, job_ids: tuple[int, ...], tasks: tuple[p.TaskRef, ...] = ()) -> dict[str, str]:
        """Cancel jobs (an array's id: every task of it) and tasks; the result for each, keyed as given
        ("123", "123_7")."""
        return dict(self.call(p.CancelJobs(job_ids=job_ids, tasks=tasks), p.CancelResult).results)

    def named(self, job_ids: tuple[int, ...], tasks: tuple[p.TaskRef, ...] = ()) -> list[p.JobInfo]:
        """Jobs as users name them: an array's id lists every task of it, a task its one job."""
        return list(self.call(p.ListJobs(arrays=job_ids, tasks=tasks), p.JobList).jobs)

    def nodes(self) -> list[p.NodeInfo]:
        return list(self.call(p.ListNodes(), p.NodeList).nodes)
