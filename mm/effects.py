"""What the MM core asks of its driver: each stimulus returns one list of these, to be carried out in order.

The core (mm/core.py) decides; the driver (the daemon in mm/daemon.py, a test, a simulator) only moves
bytes, as dask's worker carries out the instructions its state machine returns. By the time a list is
returned, everything it depends on is already in the store: a client or node manager may act on any effect
at once. Each effect names its recipient by what the core knows: a node by name, a job's waiting clients by
the job, the caller of the request being handled by nothing at all (the driver knows who that is).
"""

from __future__ import annotations

from dataclasses import dataclass

from storm.mm.jobs import Job
from storm.mm.protocol import Heartbeat, JobInfo, Message


@dataclass(frozen=True, slots=True)
class Send:
    """A message for the node manager of ``node`` (its routing id)."""

    node: str
    message: Message


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to the message being handled, to whoever sent it (a client, or a node manager)."""

    message: Message


@dataclass(frozen=True, slots=True)
class Wait:
    """The client of this ``wait_job`` (request ``req``) is answered when the job ends (see JobEnded)."""

    job_id: int
    req: int


@dataclass(frozen=True, slots=True)
class JobEnded:
    """A job reached its terminal state: every client waiting for it gets ``job_list`` with ``info``.

    It carries the job's record and makes ``info`` when asked: most jobs have no client waiting, and a
    simulator, which ends thousands a second, reads the record's times directly."""

    job: Job

    @property
    def info(self) -> JobInfo:
        return self.job.info()


@dataclass(frozen=True, slots=True)
class Attach:
    """The client of the request being handled is attached to the job's output as ``token``: what a Relay
    names it by, until the job ends (JobEnded)."""

    job_id: int
    token: str


@dataclass(frozen=True, slots=True)
class Relay:
    """A chunk of a streamed job's output for the client attached to it as ``token``."""

    job_id: int
    token: str
    message: Message


@dataclass(frozen=True, slots=True)
class Publish:
    """A heartbeat for every node manager (a time slice under gang scheduling)."""

    heartbeat: Heartbeat


Effect = Send | Reply | Wait | JobEnded | Publish | Attach | Relay
