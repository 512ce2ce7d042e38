"""A streamed job's output in its job shell (``storm run``): each rank writes its stdout and its stderr into
a pipe of its own, which the job shell reads as the rank writes. Every chunk read is written to the job's
file at once (the file the rank would have written itself: ``--output``/``--error`` as for any job) and
forwarded to the NM as ``job_output`` (mm/protocol/output.py), which drops it if its link is
backed up: a slow terminal never holds a rank up, and the files keep everything.

A job that is not streamed has none of this: its ranks write their files directly, as they always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from storm.mm import protocol as p

READ_SIZE = p.OUTPUT_CHUNK
# What the job shell reads of a pipe once every rank has exited before it closes it: a process the rank left
# behind may hold the pipe open and keep writing; it then gets EPIPE, as when its terminal goes away.
DRAIN_LIMIT = 4 << 20


@dataclass
class Pipe:
    """One rank's stdout or stderr: the pipe's read end and the file what it reads is copied to."""

    rank: int
    stream: str  # "out" or "err"
    read_fd: int
    file_fd: int
    seq: int = 0
    offset: int = 0


class StreamedOutput:
    """The pipes of one streamed job on this node. ``forward`` puts a ``job_output`` on the job shell's link
    to the NM (without waiting; it may drop it)."""

    def __init__(self, job_id: int, node: str, forward: Callable[[p.JobOutput], None]) -> None:
        self.job_id = job_id
        self.node = node
        self.forward = forward
        self.pipes: list[Pipe] = []

    def open(self, rank: int, out: int, err: int) -> tuple[int, int]:
        """Pipes for a rank whose files are ``out`` and ``err`` (possibly one): the write ends, for its
        stdout and stderr. The caller closes them once the rank is started (or could not be)."""
        ends = []
        for stream, file_fd in (("out", out), ("err", err)):
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            # The rank's end blocks, as a terminal or a file would (O_NONBLOCK is per open file: fcntl).
            os.set_blocking(write_fd, True)
            pipe = Pipe(rank=rank, stream=stream, read_fd=read_fd, file_fd=os.dup(file_fd))
            self.pipes.append(pipe)
            ends.append(write_fd)
        return ends[0], ends[1]

    def watch(self, rank: int) -> None:
        """The rank started: read its pipes as it writes."""
        loop = asyncio.get_running_loop()
        for pipe in self.pipes:
            if pipe.rank == rank and pipe.read_fd >= 0:
                loop.add_reader(pipe.read_fd, self._readable, pipe)

    def _readable(self, pipe: Pipe) -> None:
        self._read(pipe, once=True)

    def _read(self, pipe: Pipe, *, once: bool, limit: int = DRAIN_LIMIT) -> None:
        """Copy what the pipe holds (one read if ``once``, else until it is empty, up to ``limit`` bytes) to
        the file and the NM; close the pipe at its end."""
        taken = 0
        while pipe.read_fd >= 0 and taken < limit:
            try:
                data = os.read(pipe.read_fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(pipe)
                return
            taken += len(data)
            self._copy(pipe, data)
            if once:
                return

    def _copy(self, pipe: Pipe, data: bytes) -> None:
        view = memoryview(data)
        with contextlib.suppress(OSError):  # a full disk loses the file's copy, not the terminal's
            while view:
                view = view[os.write(pipe.file_fd, view) :]
        chunk = p.JobOutput(
            job_id=self.job_id, node=self.node, rank=pipe.rank, stream=pipe.stream, seq=pipe.seq,
            offset=pipe.offset, data=data,
        )  # fmt: skip
        pipe.seq += 1
        pipe.offset += len(data)
        self.forward(chunk)

    def _close(self, pipe: Pipe) -> None:
        """The stream ended (or is given up): its end goes to the NM, which never drops it."""
        if pipe.read_fd < 0:
            return
        with contextlib.suppress(ValueError, RuntimeError):  # not watched, or the loop is gone
            asyncio.get_running_loop().remove_reader(pipe.read_fd)
        os.close(pipe.read_fd)
        os.close(pipe.file_fd)
        pipe.read_fd = pipe.file_fd = -1
        end = p.JobOutput(
            job_id=self.job_id, node=self.node, rank=pipe.rank, stream=pipe.stream, seq=pipe.seq,
            offset=pipe.offset, eof=True,
        )  # fmt: skip
        self.forward(end)

    def drain(self) -> None:
        """Every rank has exited: read what is left in every pipe, then close them all (before the job
        shell's final report, so that a client has all the output by the time it hears the job ended)."""
        for pipe in self.pipes:
            self._read(pipe, once=False)
            self._close(pipe)

    def close(self) -> None:
        """The job shell is done with the job: no pipe stays open (their ends are still forwarded)."""
        for pipe in self.pipes:
            self._close(pipe)
