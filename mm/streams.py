"""storm-mm's relay of streamed output (``storm run``): which clients are attached to which job, and how much
each may still be sent. Pure: no sockets, no clock, no store (output is never stored: the job's files have
it, written on the nodes).

A client attaches with a token of its own choosing, in its submission and again with ``attach_output``,
which also acknowledges the bytes it has received. Each attachment may have at most ``window`` bytes sent and
not acknowledged; a chunk beyond that is dropped for that client (counted), so a slow client, or one that
vanished, costs storm-mm a bounded amount and never holds up the ranks, their node or another client. The
end of a rank's stream (``eof``) always goes: it carries the stream's length, from which the client learns
what it missed. An attachment is forgotten when its job ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storm.mm import protocol as p
from storm.mm.effects import Attach, Effect, Relay, Reply
from storm.mm.protocol import OUTPUT_WINDOW, JobOutput
from storm.mm.rights import Credentials, may_manage
from storm.mm.states import JobState
from storm.mm.submission import Rejected

if TYPE_CHECKING:
    from storm.mm.core import Controller

log = logging.getLogger("storm.mm")


@dataclass
class Attachment:
    """One client's attachment to a job's output: bytes sent, acknowledged and dropped."""

    token: str
    sent: int = 0
    acked: int = 0
    dropped: int = 0


class OutputRelay:
    """The attachments of every streamed job (see the module's docstring)."""

    def __init__(self, window: int = OUTPUT_WINDOW) -> None:
        self.window = window
        self.jobs: dict[int, dict[str, Attachment]] = {}

    def attach(self, job_id: int, token: str, received: int = 0) -> Attachment:
        """Attach ``token`` to the job, or (attached already) take note that it has received ``received``
        bytes; idempotent, so a client may say it as often as it likes."""
        attachments = self.jobs.setdefault(job_id, {})
        attachment = attachments.get(token)
        if attachment is None:
            attachment = attachments[token] = Attachment(token)
        # Never more than was sent: a client cannot open its window beyond what it really took.
        attachment.acked = max(attachment.acked, min(received, attachment.sent))
        return attachment

    def relay(self, msg: JobOutput) -> list[str]:
        """The tokens of the clients that get this chunk now (the others' windows are full: dropped)."""
        attachments = self.jobs.get(msg.job_id)
        if not attachments:
            return []
        size = len(msg.data)
        tokens = []
        for attachment in attachments.values():
            if msg.eof or attachment.sent - attachment.acked + size <= self.window:
                attachment.sent += size
                tokens.append(attachment.token)
            else:
                attachment.dropped += size
        return tokens

    def forget(self, job_id: int) -> None:
        """The job has ended: its clients have all they will get."""
        self.jobs.pop(job_id, None)


# What the Controller (mm/core.py) does with the messages of streamed output: kept here, with the relay.


def attach_output(
    ctl: Controller, msg: p.AttachOutput, caller: Credentials, now: float, out: list[Effect]
) -> p.OutputAttached:
    """attach_output: (again) attached to a streamed job that has not ended; its state in any case."""
    infos = ctl.job_infos((msg.job_id,), now=now)
    if not infos:
        raise Rejected("unknown_job", f"no job {msg.job_id}")
    job = infos[0]
    if not may_manage(caller.uid, caller.user, job.uid, ctl.config.operators):
        raise Rejected("permission_denied", f"job {job.id} belongs to {job.user}")
    if not JobState(job.state).terminal:
        ctl.runs.streams.attach(job.id, msg.token, msg.received)
        out.append(Attach(job.id, msg.token))
    return p.OutputAttached(
        req=msg.req, job_id=job.id, mm_epoch=ctl.mm_epoch, state=job.state, reason=job.reason
    )


def relay_output(ctl: Controller, msg: JobOutput, sender: str, now: float) -> list[Effect]:
    """A chunk from node ``sender``: for the job's attached clients (no transaction: a flood of output
    costs storm-mm no commit). Refused as any node report is when the sender is not the node it names or
    never registered."""
    if msg.node != sender:
        return [Reply(p.Error(code="bad_request", text="node name differs from routing id"))]
    if ctl.registry.get(msg.node) is None:
        ctl.throttle.warning(log, ("unknown", msg.node), now, "%s from unknown node %r", msg.op, msg.node)
        return [Reply(p.Reregister(reason=f"unknown node {msg.node!r}: register first"))]
    job = ctl.runs.active.get(msg.job_id)
    if job is None or msg.node not in job.nodes:
        return []  # output of a job that is no longer running there: nobody is attached to it
    return [Relay(msg.job_id, token, msg) for token in ctl.runs.streams.relay(msg)]
