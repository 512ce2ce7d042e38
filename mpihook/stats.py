"""The node manager's side of mpihook's shared memory: create a job's segment, read records, steer waits.

The layout is mpihook/record.h's (a test compiles that header and compares every offset with the ones
here). One segment per job per node: a 64-byte header, then one 256-byte record per local rank.

The segment belongs to the job's user, whose hooks write it, so the node manager does not map it (a user
could shrink it under the mapping and kill the root daemon with SIGBUS): it reads all of a job's records with
one ``pread`` (no system call per rank) and checks each copy with the sequence numbers at both ends of the
record's statistics.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import struct
from typing import NamedTuple

import posix_ipc

MAGIC = 0x314B484D524F5453  # "STORMHK1"
VERSION = 2
HEADER = struct.Struct("<QIIII Q 32x")  # magic, version, nranks, record_size, reserved, job_id
# seq pid rank flags in_call | calls events comm_ns enter_ns exit_ns spin_ns block_ns | call _ | seq_end
STATS = struct.Struct("<Q ii II QQQQQQQ II Q")
CONTROL = struct.Struct("<II 24x")  # wait_mode, spin_ns
RECORD_SIZE = 256
CONTROL_OFFSET = 128

ACTIVE = 1
FOREIGN_MPI = 2
THREAD_MULTIPLE = 4  # every call stays blocking; one thread's calls counted at a time
COLLECTIVES_POLL = 8  # blocking collectives on shared memory cannot spin-block
FINALIZED = 16  # MPI_Finalize returned: the rank communicates no more
WAIT_POLL = 0
WAIT_SPINBLOCK = 1
READ_TRIES = 20
# record.h's STORM_HOOK_CALLS: the call a rank is in is CALLS[call - 1] (0: none yet).
CALLS = (
    "MPI_Send", "MPI_Ssend", "MPI_Bsend", "MPI_Rsend", "MPI_Recv", "MPI_Sendrecv", "MPI_Sendrecv_replace",
    "MPI_Probe", "MPI_Mprobe", "MPI_Mrecv", "MPI_Wait", "MPI_Waitall", "MPI_Waitany", "MPI_Waitsome",
    "MPI_Barrier", "MPI_Bcast", "MPI_Reduce", "MPI_Allreduce", "MPI_Gather", "MPI_Gatherv", "MPI_Scatter",
    "MPI_Scatterv", "MPI_Allgather", "MPI_Allgatherv", "MPI_Alltoall", "MPI_Alltoallv", "MPI_Alltoallw",
    "MPI_Reduce_scatter", "MPI_Reduce_scatter_block", "MPI_Scan", "MPI_Exscan",
)  # fmt: skip


class RankCounters(NamedTuple):
    """One consistent snapshot of a rank's record. A named tuple: the node manager makes one per rank at
    every time slice, about a fifth of what a frozen dataclass costs."""

    pid: int
    rank: int
    flags: int
    in_call: bool
    calls: int
    events: int
    comm_ns: int
    enter_ns: int
    exit_ns: int
    spin_ns: int
    block_ns: int
    call: int = 0  # record.h's enum storm_hook_call

    @property
    def active(self) -> bool:
        return bool(self.flags & ACTIVE)

    @property
    def call_name(self) -> str:
        """The blocking call the rank is in (or was in last), e.g. "MPI_Allreduce"; "" if none."""
        return CALLS[self.call - 1] if 0 < self.call <= len(CALLS) else ""


def segment_name(job_id: int, node_index: int, *, cluster: str = "", run: str = "") -> str:
    """A name no other job can have: ``cluster`` (:func:`cluster_token`) tells clusters on one host apart,
    and ``run`` (a run's kvsname, drawn at random by storm-mm) a job from one whose id a store reset handed
    out again, and a run of a requeued job from the one before. Without ``run``, a random token."""
    nonce = hashlib.sha256(run.encode()).hexdigest()[:8] if run else secrets.token_hex(4)
    return f"/storm-hook-{cluster or 'x'}-{job_id}-{node_index}-{nonce}"


def cluster_token(name: str, mm_endpoint: str) -> str:
    """8 hex digits that name a cluster on this host in its shared-memory segments: its name and the
    endpoint of its storm-mm, which no two running clusters share."""
    return hashlib.sha256(f"{name}\0{mm_endpoint}".encode()).hexdigest()[:8]


def _parse(data: bytes, offset: int) -> RankCounters | None:
    fields = STATS.unpack_from(data, offset)
    seq, pid, rank, flags, in_call, calls, events, comm, enter, exit_, spin, block, call, _, seq_end = fields
    if seq != seq_end:
        return None  # copied while the hook was writing
    return RankCounters(
        pid=pid, rank=rank, flags=flags, in_call=bool(in_call), calls=calls, events=events, comm_ns=comm,
        enter_ns=enter, exit_ns=exit_, spin_ns=spin, block_ns=block, call=call,
    )  # fmt: skip


class HookSegment:
    """A job's statistics segment on this node, held open by the NM (never mapped by it)."""

    def __init__(self, name: str, fd: int, nranks: int) -> None:
        self.name = name
        self.nranks = nranks
        self._fd = fd
        self._size = HEADER.size + nranks * RECORD_SIZE

    @classmethod
    def create(cls, name: str, job_id: int, nranks: int, uid: int, gid: int) -> HookSegment:
        """Create the segment for ``nranks`` local ranks, owned by the job's user (their hooks write it)."""
        size = HEADER.size + nranks * RECORD_SIZE
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        fd = memory.fd
        try:
            os.pwrite(fd, HEADER.pack(MAGIC, VERSION, nranks, RECORD_SIZE, 0, job_id), 0)
            os.fchown(fd, uid, gid)
        except BaseException:
            os.close(fd)
            memory.unlink()
            raise
        return cls(name, fd, nranks)

    @classmethod
    def attach(cls, name: str) -> HookSegment:
        """Open an existing segment (a restarted NM, or a test)."""
        fd = posix_ipc.SharedMemory(name).fd
        head = os.pread(fd, HEADER.size, 0)
        if len(head) < HEADER.size:
            os.close(fd)
            raise ValueError(f"{name} is too short to be a storm hook segment")
        magic, version, nranks, record_size, _, _ = HEADER.unpack(head)
        if magic != MAGIC or version != VERSION or record_size != RECORD_SIZE:
            os.close(fd)
            raise ValueError(f"{name} is not a storm hook segment of version {VERSION}")
        return cls(name, fd, nranks)

    def read_all(self) -> list[RankCounters | None]:
        """Every record, from one read; None for a record its hook kept busy for every try."""
        result: list[RankCounters | None] = [None] * self.nranks
        missing = list(range(self.nranks))
        for _ in range(READ_TRIES):
            data = os.pread(self._fd, self._size, 0)
            if len(data) < self._size:
                return result  # shrunk by its owner: no statistics, and no harm to the reader
            for index in missing:
                result[index] = _parse(data, HEADER.size + index * RECORD_SIZE)
            missing = [i for i in missing if result[i] is None]
            if not missing:
                break
        return result

    def read(self, index: int) -> RankCounters | None:
        self._check(index)
        return self.read_all()[index]

    def set_wait(self, index: int, mode: int, spin_ns: int) -> None:
        """Tell rank ``index`` how to wait in blocking calls; it takes effect at its next call."""
        self._check(index)
        os.pwrite(self._fd, CONTROL.pack(mode, spin_ns), HEADER.size + index * RECORD_SIZE + CONTROL_OFFSET)

    def wait_mode(self, index: int) -> tuple[int, int]:
        self._check(index)
        data = os.pread(self._fd, CONTROL.size, HEADER.size + index * RECORD_SIZE + CONTROL_OFFSET)
        mode, spin_ns = CONTROL.unpack(data) if len(data) == CONTROL.size else (WAIT_POLL, 0)
        return mode, spin_ns

    def _check(self, index: int) -> None:
        if not 0 <= index < self.nranks:
            raise IndexError(f"record {index} outside 0..{self.nranks - 1}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def unlink(self) -> None:
        """Remove the name (the memory goes once every rank has unmapped it)."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self.name)
