"""Talking to storm-mm from Python: what the CLI, the tests and the benchmarks use.

Where the MM is, in order: an explicit endpoint, ``$STORM_MM``, a local cluster started by ``storm local up``
(in ``$STORM_LOCAL_DIR`` or the default local directory), ``/etc/storm/storm.toml``, and finally
``ipc:///run/storm/mm.sock``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from pathlib import Path
from typing import TypeVar

import zmq

from storm.mm import protocol as p

DEFAULT_TIMEOUT = 30.0
R = TypeVar("R", bound=p.Message)


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

    def __init__(self, endpoint: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = find_endpoint(endpoint)
        if self.endpoint.startswith("ipc://") and not os.path.exists(self.endpoint[len("ipc://") :]):
            raise ClientError(
                "unreachable",
                f"no storm-mm listens at {self.endpoint} (start one with `storm local up`, or set STORM_MM)",
            )
        self.timeout = timeout
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.endpoint)
        self._reqs = itertools.count(1)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        """For tests: send bytes that need not be a valid message."""
        self._sock.send(data)

    def receive(self, timeout: float | None = None) -> p.Message:
        wait = self.timeout if timeout is None else timeout
        if not self._sock.poll(None if wait <= 0 else int(wait * 1000)):
            raise ClientError("timeout", f"storm-mm at {self.endpoint} did not answer within {wait:g} s")
        return p.decode(self._sock.recv(), p.MAX_NODE_MESSAGE)

    def call(self, request: p.Request, expect: type[R], timeout: float | None = None) -> R:
        req = next(self._reqs)
        request = dataclasses.replace(request, req=req)
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
        request = p.SubmitJob(
            ranks=ranks,
            argv=tuple(argv),
            cwd=str(options.pop("cwd", os.getcwd())),
            env=dict(options.pop("env", os.environ)),  # type: ignore[call-overload]
            **options,  # type: ignore[arg-type]
        )
        return self.call(request, p.JobSubmitted).job_id

    def jobs(self, job_ids: tuple[int, ...] = (), everything: bool = False) -> list[p.JobInfo]:
        return list(self.call(p.ListJobs(job_ids=job_ids, all=everything), p.JobList).jobs)

    def job(self, job_id: int) -> p.JobInfo:
        found = self.jobs((job_id,))
        if not found:
            raise ClientError("unknown_job", f"no job {job_id}")
        return found[0]

    def wait(self, job_id: int, timeout: float = 0) -> p.JobInfo:
        """Block until the job ends (timeout 0: forever)."""
        return self.call(p.WaitJob(job_id=job_id), p.JobList, timeout=timeout).jobs[0]

    def cancel(self, job_ids: tuple[int, ...]) -> dict[str, str]:
        return dict(self.call(p.CancelJobs(job_ids=job_ids), p.CancelResult).results)

    def nodes(self) -> list[p.NodeInfo]:
        return list(self.call(p.ListNodes(), p.NodeList).nodes)
