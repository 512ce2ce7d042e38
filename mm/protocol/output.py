"""Streamed output (``storm run``): ``job_output`` chunks from the job shell through the NM and storm-mm to
the attached clients, and ``attach_output`` -> ``output_attached`` between a client and storm-mm.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import Message, message
from storm.mm.codec import check as _check
from storm.mm.protocol.client import Reply, Request
from storm.mm.protocol.records import JOB_STATES, _token

# --------------------------------------------------------------------------------------------------------
# Streamed output (`storm run`)
#
# A job submitted with ``attach`` (a token the client chose) is streamed: its launches say ``stream``, and
# the job shell gives each rank a pipe for stdout and one for stderr instead of the files. It copies what it
# reads to the job's files, as the ranks would have written them, and forwards each chunk as ``job_output``
# to its NM, which relays it to storm-mm over its link, which relays it to the clients attached to the job.
# Every hop drops a chunk rather than wait or queue without bound (the shell's and the NM's when their link
# to the next one is backed up, storm-mm when a client has more than OUTPUT_WINDOW bytes unacknowledged): the
# ranks, the NM and storm-mm never wait for a terminal, and the files keep everything. A chunk's ``offset``
# says where it lies in its rank's stream, so a client sees a gap for what was dropped; the last message of
# each stream (``eof``, no data) is never dropped and gives the stream's length.
#
# The client attaches in its submission (so it misses nothing), and again with ``attach_output``, which also
# acknowledges what it received (``received``: bytes since it attached to this storm-mm) and so opens the
# window; a client that sends it every few seconds finds out that storm-mm restarted (``mm_epoch``) and is
# attached again. A job's attachments end with it.

STREAMS = ("out", "err")
OUTPUT_CHUNK = 16 << 10  # bytes of one job_output at most: the queues on the way hold messages, not bytes
OUTPUT_WINDOW = 1 << 20  # bytes storm-mm sends one client beyond what it acknowledged


@message("job_output")
@dataclass(frozen=True, kw_only=True)
class JobOutput(Message):
    """A chunk of what a rank of a streamed job wrote (job shell -> NM -> MM -> attached clients).

    ``stream`` "out" or "err"; ``seq`` numbers the chunks of the rank's stream from 0; ``offset`` is where
    ``data`` begins in it. ``eof``: the stream is closed, ``offset`` is its length and ``data`` empty."""

    job_id: int
    node: str
    rank: int
    stream: str
    seq: int
    offset: int
    data: bytes = b""
    eof: bool = False

    def __post_init__(self) -> None:
        _check(self.stream in STREAMS, f"stream must be one of {STREAMS}, not {self.stream!r}")
        _check(self.rank >= 0 and self.seq >= 0 and self.offset >= 0, "rank, seq and offset must be >= 0")
        _check(len(self.data) <= OUTPUT_CHUNK, f"a chunk holds at most {OUTPUT_CHUNK} bytes")
        _check(not (self.eof and self.data), "an eof chunk carries no data")


@message("attach_output")
@dataclass(frozen=True, kw_only=True)
class AttachOutput(Request):
    """Attach (again) to a job's output as ``token``, having received ``received`` bytes of it since this
    storm-mm attached it (0 after a restart). Answered with ``output_attached``."""

    job_id: int
    token: str
    received: int = 0

    def __post_init__(self) -> None:
        _check(bool(self.token) and _token(self.token), "token: 1 to 64 letters, digits, '-' or '_'")
        _check(self.received >= 0, "received must be >= 0")


@message("output_attached")
@dataclass(frozen=True, kw_only=True)
class OutputAttached(Reply):
    """The job's state now, and which storm-mm (``mm_epoch``) relays its output: a new epoch means a restart,
    and output written meanwhile did not reach the client."""

    job_id: int
    mm_epoch: str
    state: str
    reason: str = ""

    def __post_init__(self) -> None:
        _check(self.state in JOB_STATES, f"unknown job state {self.state!r}")
