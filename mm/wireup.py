"""What the MM does for a running job's MPI wire-up across nodes: PMI barriers, the outcome of an
MPI_Comm_spawn, and MPI's names (MPI_Publish_name ...). Part of the controller (mm/core.py), which has
already checked that the reporting node holds ranks of the job; pure, like it.
"""

from __future__ import annotations

from storm.mm import protocol as p
from storm.mm.effects import Effect, Send
from storm.mm.runs import RunTable
from storm.mm.states import JobState
from storm.mm.storage import Storage

WireupReport = p.PmiBarrierIn | p.JobSpawned | p.SpawnFailed | p.PmiName


def handle(runs: RunTable, store: Storage, msg: WireupReport, now: float, out: list[Effect]) -> str | None:
    """Take a node's report; None, or why it is refused (it then changes nothing)."""
    match msg:
        case p.PmiBarrierIn():
            return barrier_in(runs, store, msg, out)
        case p.JobSpawned():
            job = runs.active.get(msg.job_id)
            if job is not None and msg.node in job.nodes:
                runs.count_spawn(msg)  # a node started an MPI_Comm_spawn's processes, or refused to
        case p.SpawnFailed():
            # A spawned process failed: the job ends FAILED, as when one of its ranks fails.
            job = runs.active.get(msg.job_id)
            if job is not None and msg.node in job.nodes and msg.node not in runs.tracking[job.id].done:
                runs.end(job, JobState.FAILED, msg.describe(), now, out, exit_code=msg.exit.status)
        case p.PmiName():
            out.append(Send(msg.node, name_result(runs, msg)))
    return None


def barrier_in(runs: RunTable, store: Storage, msg: p.PmiBarrierIn, out: list[Effect]) -> str | None:
    """Collect one node's arrival at a cross-node PMI barrier; answer all nodes when the last arrives.

    The answer is stored before it is sent: a node whose copy was lost (the MM restarted) asks again and
    gets it again, rather than waiting for nodes that have long passed the barrier. A node waits for the
    answer to each barrier before it enters the next, so one more than a barrier ahead of the job's current
    one is refused.
    """
    job = runs.active.get(msg.job_id)
    if job is None or msg.node not in job.nodes:
        return None
    track = runs.tracking[job.id]
    if track.last_barrier is not None and msg.seq <= track.last_barrier[0]:
        seq, kvs = track.last_barrier
        if msg.seq == seq:
            out.append(Send(msg.node, p.PmiBarrierOut(job_id=job.id, seq=seq, kvs=kvs)))
        return None
    current = 0 if track.last_barrier is None else track.last_barrier[0] + 1
    if msg.seq > current + 1:
        return f"PMI barrier {msg.seq} of job {job.id}, but the job is at barrier {current}"
    arrived = track.barriers.setdefault(msg.seq, {})
    arrived[msg.node] = msg.kvs
    if set(arrived) >= set(job.nodes):
        merged: dict[str, str] = {}
        for kvs in arrived.values():
            merged.update(kvs)
        del track.barriers[msg.seq]
        store.save_barrier(job.id, msg.seq, merged)
        track.last_barrier = (msg.seq, merged)
        for node in job.nodes:
            out.append(Send(node, p.PmiBarrierOut(job_id=job.id, seq=msg.seq, kvs=merged)))
    return None


def name_result(runs: RunTable, msg: p.PmiName) -> p.PmiNameResult:
    """A process's MPI_Publish_name, MPI_Lookup_name or MPI_Unpublish_name, answered at once to its node
    (names: see mm/runs.py)."""
    job = runs.active.get(msg.job_id)
    port, error = "", f"storm: job {msg.job_id} has ended"
    if job is not None and job.ending is None and msg.node in job.nodes:
        spec = job.spec
        port, error = runs.names.request(
            msg.action, uid=spec.uid, user=spec.user, job_id=job.id, service=msg.service, port=msg.port
        )
    elif job is not None and job.ending is not None:
        error = f"storm: job {msg.job_id} is ending ({job.reason})"
    return p.PmiNameResult(job_id=msg.job_id, seq=msg.seq, ok=not error, port=port, error=error)
