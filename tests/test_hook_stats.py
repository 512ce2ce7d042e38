"""The node manager's reader of mpihook records: consistency checks and a segment its owner damages."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest

from storm.mpihook.stats import (
    CONTROL_OFFSET,
    HEADER,
    RECORD_SIZE,
    STATS,
    WAIT_POLL,
    WAIT_SPINBLOCK,
    HookSegment,
    segment_name,
)


@pytest.fixture
def segment() -> Iterator[HookSegment]:
    seg = HookSegment.create(segment_name(7, 0), 7, 3, os.getuid(), os.getgid())
    yield seg
    seg.close()
    seg.unlink()


def write_record(seg: HookSegment, index: int, seq: int, seq_end: int, events: int) -> None:
    """Write a record as a hook would (or a torn one)."""
    fields = (seq, 4242, index, 1, 0, events * 2, events, events * 1000, 5, 6, 0, 0, 15, 0, seq_end)
    write_fields(seg, index, fields)


def write_fields(seg: HookSegment, index: int, fields: tuple[int, ...]) -> None:
    """Write rank ``index``'s record, field by field, through the segment's name (as another process)."""
    fd = os.open(f"/dev/shm{seg.name}", os.O_RDWR)
    try:
        os.pwrite(fd, STATS.pack(*fields), HEADER.size + index * RECORD_SIZE)
    finally:
        os.close(fd)


def test_a_new_segment_reads_as_inactive_records(segment: HookSegment) -> None:
    records = segment.read_all()
    assert len(records) == 3 and all(r is not None and not r.active and r.pid == 0 for r in records)
    assert os.stat(f"/dev/shm{segment.name}").st_mode & 0o777 == 0o600


def test_a_consistent_record_is_read_and_a_torn_one_is_not(segment: HookSegment) -> None:
    write_record(segment, 1, seq=6, seq_end=6, events=10)
    record = segment.read(1)
    assert record is not None and record.active and record.events == 10 and record.comm_ns == 10_000
    assert record.pid == 4242 and record.rank == 1 and record.call_name == "MPI_Barrier"  # call 15
    write_record(segment, 2, seq=6, seq_end=7, events=11)  # an update under way
    assert segment.read(2) is None
    assert segment.read_all()[1] == record


def test_the_control_word_is_written_where_the_hook_reads_it(segment: HookSegment) -> None:
    assert segment.wait_mode(2) == (WAIT_POLL, 0)
    segment.set_wait(2, WAIT_SPINBLOCK, 120_000)
    assert segment.wait_mode(2) == (WAIT_SPINBLOCK, 120_000)
    raw = open(f"/dev/shm{segment.name}", "rb").read()  # noqa: SIM115 (a one-off read)
    assert struct.unpack_from("<II", raw, HEADER.size + 2 * RECORD_SIZE + CONTROL_OFFSET) == (1, 120_000)
    with pytest.raises(IndexError):
        segment.set_wait(3, WAIT_POLL, 0)


def test_a_segment_shrunk_by_its_owner_gives_no_statistics_and_no_crash(segment: HookSegment) -> None:
    os.truncate(f"/dev/shm{segment.name}", 10)
    assert segment.read_all() == [None, None, None]
    assert segment.wait_mode(0) == (WAIT_POLL, 0)


def test_attach_checks_what_it_opens(segment: HookSegment) -> None:
    other = HookSegment.attach(segment.name)
    try:
        assert other.nranks == 3
    finally:
        other.close()
    bogus = segment_name(8, 0)
    fd = os.open(f"/dev/shm{bogus}", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 100)
        with pytest.raises(ValueError, match="not a storm hook segment"):
            HookSegment.attach(bogus)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{bogus}")
