"""A job as a row of the store's ``jobs`` table (mm/store.py) and back: its spec packed with msgpack, its
torus box as text, the columns every query of whole jobs selects."""

from __future__ import annotations

import msgpack

from storm.mm.jobs import Job, JobSpec
from storm.mm.states import JobState
from storm.mm.torus import Box

JOB_COLUMNS = (
    "id, state, spec, submit_time, start_time, end_time, exit_code, reason, placement, row, ending, "
    "suspended_time, requeues, box, suspended_by, suspended_at, resumed_at, array_id, array_task"
)


def pack_box(box: Box | None) -> str:
    return "" if box is None else "{},{},{}/{},{},{}".format(*box.base, *box.shape)


def unpack_box(text: str) -> Box | None:
    if not text:
        return None
    base, shape = (tuple(int(v) for v in part.split(",")) for part in text.split("/"))
    return Box((base[0], base[1], base[2]), (shape[0], shape[1], shape[2]))


def pack_spec(spec: JobSpec) -> bytes:
    packed: bytes = msgpack.packb(
        {
            "name": spec.name,
            "uid": spec.uid,
            "gid": spec.gid,
            "user": spec.user,
            "ranks": spec.ranks,
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "env": spec.env,
            "time_limit": spec.time_limit,
            "output": spec.output,
            "error": spec.error,
            "requeue": spec.requeue,
            "hook": spec.hook,
            "max_ranks": spec.max_ranks,
            "qos": spec.qos,
            "priority": spec.priority,
            "stream": spec.stream,
            "array": spec.array,
            "dependency": spec.dependency,
        }
    )
    return packed


def spec_field(blob: bytes, name: str) -> int | str | None:
    """SQL's storm_spec(spec, name): a field of a stored spec (migration 7 copies some into columns)."""
    value = msgpack.unpackb(blob).get(name)
    return value if isinstance(value, int | str) else None


def unpack_spec(blob: bytes) -> JobSpec:
    d = msgpack.unpackb(
        blob
    )  # fields added later (requeue, hook, ...) are absent from older jobs: defaults hold
    d["argv"] = tuple(d["argv"])
    return JobSpec(**d)


def row_to_job(row: tuple[object, ...]) -> Job:
    (
        job_id,
        state,
        spec,
        submit,
        start,
        end,
        code,
        reason,
        placement,
        mrow,
        ending,
        suspended,
        requeues,
        box,
        suspended_by,
        suspended_at,
        resumed_at,
        array_id,
        array_task,
    ) = row
    assert isinstance(spec, bytes) and isinstance(placement, bytes)
    return Job(
        id=int(job_id),  # type: ignore[call-overload]
        spec=unpack_spec(spec),
        state=JobState(str(state)),
        submit_time=float(submit),  # type: ignore[arg-type]
        start_time=None if start is None else float(start),  # type: ignore[arg-type]
        end_time=None if end is None else float(end),  # type: ignore[arg-type]
        exit_code=None if code is None else int(code),  # type: ignore[call-overload]
        reason=str(reason),
        placement=tuple((str(n), int(p)) for n, p in msgpack.unpackb(placement)),
        row=None if mrow is None else int(mrow),  # type: ignore[call-overload]
        ending=None if ending is None else JobState(str(ending)),
        suspended_time=float(suspended),  # type: ignore[arg-type]
        requeues=int(requeues),  # type: ignore[call-overload]
        box=unpack_box(str(box)),
        suspended_by=None if suspended_by is None else int(suspended_by),  # type: ignore[call-overload]
        suspended_at=None if suspended_at is None else float(suspended_at),  # type: ignore[arg-type]
        resumed_at=None if resumed_at is None else float(resumed_at),  # type: ignore[arg-type]
        array_id=None if array_id is None else int(array_id),  # type: ignore[call-overload]
        array_task=None if array_task is None else int(array_task),  # type: ignore[call-overload]
    )
