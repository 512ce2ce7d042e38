"""The wire protocol: every message round-trips, and anything else is a ProtocolError with a useful text."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storm.mm import protocol as p
from storm.mm.protocol import ProtocolError, RankExit, RankSlot

JOB_INFO = p.JobInfo(
    id=12, name="hello é", user="alice", uid=1000, state="RUNNING", ranks=3, nodes=("n1", "n2"),
    submit_time=100.5, start_time=101.0, end_time=None, exit_code=None, reason="", time_limit=60.0,
    argv=("/bin/echo", "hi"), cwd="/home/alice", output="/home/alice/storm-12.out", error="", requeue=True,
    requeues=2, min_ranks=2, max_ranks=8, qos="high", priority=10, suspended_by=11,
)  # fmt: skip
NODE_INFO = p.NodeInfo(
    name="n1", state="UP", pes=4, pes_used=2, address="10.0.0.1", last_seen=5.25, reason="", jobs=(12, 13)
)
RANK_STATS = p.RankStats(
    rank=1,
    node="n1",
    pid=99,
    state="active",
    t_cpu=1.5,
    t_comm=0.25,
    c_comm=1000,
    granularity=0.00175,
    calls=2000,
    wait_mode="spin-block",
    job_id=3,
    pe=1,
    klass="F",
    cslots=4,
    tslots=9,
)
PROFILE = (
    p.ProfileEntry(rank=1, node="n1", klass="F", wall=10.0, compute=4.0, poll=0.5, blocked=3.0, stopped=1.0,
                   queued=1.25),
    p.ProfileEntry(rank=1, node="n1", wall=2.0, compute=2.0, poll=0.0, blocked=0.0, stopped=0.0, queued=0.0),
)  # fmt: skip
CHANGE = p.ClassChange(job_id=3, rank=1, node="n1", time=1700000000.5, old="CS", new="F", tslots=20)
EXITS = (
    RankExit(rank=0, exit_code=0, cpu_user=0.25, cpu_system=0.0),
    RankExit(rank=1, signal=9),
    RankExit(rank=2, error="no such file"),
)
SLOTS = (RankSlot(rank=2, pe=0), RankSlot(rank=3, pe=5))

LAUNCH = p.LaunchJob(
    job_id=1,
    name="j",
    kvsname="kvs",
    size=4,
    row=1,
    node_index=1,
    ranks_per_node=(2, 2),
    slots=SLOTS,
    argv=("/bin/true",),
    cwd="/",
    env={"A": "b"},
    uid=1000,
    gid=100,
    user="alice",
    output="o",
    error="e",
    hosts=(0, 0),
    hook=False,
)

# One valid example of every registered message, with non-default values wherever there is a default.
EXAMPLES: dict[str, p.Message] = {
    "error": p.Error(req=3, code="bad_request", text="nope"),
    "submit_job": p.SubmitJob(
        req=1,
        ranks=4,
        argv=("/bin/true", "-x"),
        cwd="/tmp",
        env={"PATH": "/bin", "É": "ü"},
        name="j",
        time_limit=90.5,
        output="/tmp/out-%j.txt",
        error="/tmp/err",
        requeue=True,
        max_ranks=16,
        qos="high",
        array="0-99%10",
        dependency="afterok:12:13_4",
    ),
    "job_submitted": p.JobSubmitted(req=1, job_id=77, job_ids=(77, 78, 79)),
    "list_jobs": p.ListJobs(
        req=2, job_ids=(1, 2, 2**63 - 1), all=True, arrays=(77,), tasks=(p.TaskRef(array_id=77, task=2),)
    ),
    "job_list": p.JobList(req=2, jobs=(JOB_INFO, dataclasses.replace(JOB_INFO, id=13, state="FAILED"))),
    "cancel_jobs": p.CancelJobs(req=4, job_ids=(5, 6), tasks=(p.TaskRef(array_id=77, task=0),)),
    "cancel_result": p.CancelResult(req=4, results={"5": "cancelled", "6": "unknown job"}),
    "wait_job": p.WaitJob(req=5, job_id=9),
    "list_nodes": p.ListNodes(req=6),
    "node_list": p.NodeList(
        req=6, nodes=(NODE_INFO, dataclasses.replace(NODE_INFO, name="n2", state="DOWN"))
    ),
    "register_node": p.RegisterNode(
        node="n1", pes=8, nm_epoch="e1", address="h:1", version=7, jobs=(3, 4), host="h/4f2a"
    ),
    "node_registered": p.NodeRegistered(
        node="n1",
        mm_epoch="m",
        report_interval=0.5,
        stale_jobs=(9,),
        policy="gang",
        heartbeat_port=6818,
        slice=0.05,
        rows={"3": 1},
        fcs=p.FcsParameters(
            spin=0.0002, cslots_min=5, dc_thresh=2.0, cs_thresh=0.004, f_thresh=0.003, tslots_max=100
        ),
        suspended=(4,),
    ),
    "node_status": p.NodeStatus(
        node="n1",
        nm_epoch="e1",
        mm_epoch="m",
        jobs=(1,),
        switches=7,
        switch_p50_ms=0.5,
        switch_p99_ms=2.5,
        suspended=(1,),
        timings=p.SwitchTimings(
            delivery=(0, 0, 3, 9) + (0,) * 10 + (1,),
            delivery_sum=0.0125,
            lateness=(12,) + (0,) * 14,
            lateness_sum=0.0001,
            late=1,
            skewed=2,
        ),
    ),
    "heartbeat": p.Heartbeat(epoch="m", seq=41, row=1, sent=1700000000.25, slice=0.1, resets=(3, 4)),
    "job_rows": p.JobRows(rows={"3": 0, "4": 1}),
    "job_stats": p.JobStats(job_id=3, node="n1", ranks=(RANK_STATS,), changes=(CHANGE,), profile=PROFILE),
    "get_classes": p.GetClasses(req=10, job_ids=(3,), history=True),
    "classes": p.ClassesView(req=10, processes=(RANK_STATS,), changes=(CHANGE, CHANGE)),
    "get_stats": p.GetStats(req=9, job_id=3),
    "stats": p.StatsView(
        req=9, job_id=3, state="RUNNING", age=0.5, ranks=(RANK_STATS, RANK_STATS), profile=PROFILE
    ),
    "get_matrix": p.GetMatrix(req=8),
    "matrix": p.MatrixView(
        req=8,
        policy="gang",
        mpl=2,
        slice=0.1,
        active_row=1,
        seq=41,
        columns=("n1:0", "n2:0"),
        cells=((3, 3), (4, 0)),
    ),
    "reregister": p.Reregister(reason="who are you"),
    "launch_job": LAUNCH,
    "kill_job": p.KillJob(job_id=1, reason="time limit"),
    "suspend_job": p.SuspendJob(job_id=1, by=2),
    "resume_job": p.ResumeJob(job_id=1, row=1),
    "job_launched": p.JobLaunched(job_id=1, node="n1", pids={"0": 100, "1": 101}),
    "job_node_done": p.JobNodeDone(job_id=1, node="n1", exits=EXITS, reason="shutting down", profile=PROFILE),
    "rank_failed": p.RankFailed(job_id=1, node="n2", exit=RankExit(rank=3, exit_code=4, error="boom")),
    "ack": p.Ack(job_id=1, what="job_node_done"),
    "pmi_barrier_in": p.PmiBarrierIn(job_id=1, node="n1", seq=2, kvs={"k": "v"}),
    "pmi_barrier_out": p.PmiBarrierOut(job_id=1, seq=2, kvs={"k": "v", "k2": ""}),
    "shell_hello": p.ShellHello(job_id=1, pid=4242),
    "shell_ready": p.ShellReady(pid=4242),
    "shell_launch": p.ShellLaunch(
        launch=LAUNCH,
        jobdir="/run/storm/jobs/1",
        hook_library="/lib/hook.so",
        hook_segment="/seg",
        hook_environment={"MPIR_CVAR_X": "1"},
    ),
    "shell_stop": p.ShellStop(job_id=1),
    "shell_retire": p.ShellRetire(),
    "ranks_started": p.RanksStarted(job_id=1, pids={"0": 1}),
    "rank_aborted": p.RankAborted(job_id=1, exit=RankExit(rank=0, exit_code=3)),
    "rank_exited": p.RankExited(job_id=1, exit=RankExit(rank=0, signal=15)),
    "shell_done": p.ShellDone(job_id=1, exits=EXITS),
    "spawned": p.Spawned(job_id=1, world=2, parent=1, pids={"0": 500, "1": 501}, pes={"0": 3, "1": 0}),
    "spawn_exited": p.SpawnExited(
        job_id=1, world=2, exit=RankExit(rank=1, exit_code=0, error="x"), aborted=True
    ),
    "job_spawned": p.JobSpawned(job_id=1, node="n1", world=0, processes=0, refused="storm: no room"),
    "spawn_failed": p.SpawnFailed(job_id=1, node="n1", world=2, parent=1, exit=RankExit(rank=0, signal=9)),
    "pmi_name": p.PmiName(job_id=1, node="n1", seq=3, action="publish", service="svc é", port="tag#0$x$"),
    "pmi_name_result": p.PmiNameResult(job_id=1, seq=3, ok=False, port="p", error="storm: taken"),
    "get_spawns": p.GetSpawns(req=11, job_id=1),
    "spawns": p.SpawnsView(req=11, job_id=1, spawns=2, processes=5, refused=1, last_refusal="storm: no room"),
    "job_output": p.JobOutput(
        job_id=1, node="n0", rank=1, stream="err", seq=2, offset=10, data=b"\xffpartial"
    ),
    "attach_output": p.AttachOutput(req=12, job_id=1, token="a1b2", received=4096),  # noqa: S106
    "output_attached": p.OutputAttached(req=12, job_id=1, mm_epoch="m", state="PENDING", reason="Resources"),
    "job_history": p.JobHistory(
        req=12,
        users=("alice", "1002"),
        all_users=True,
        states=("FAILED", "TIMEOUT"),
        since=1.5,
        until=9.0,
        names=("x",),
        job_ids=(3, 4),
        limit=100,
        after=2,
    ),
    "history": p.HistoryPage(
        req=12,
        jobs=(
            p.HistoryEntry(
                id=3,
                name="x",
                user="alice",
                uid=1001,
                state="COMPLETED",
                ranks=2,
                nodes=("n1",),
                submit_time=1.0,
                start_time=2.0,
                end_time=3.5,
                exit_code=0,
                reason="",
                suspended_time=0.5,
                requeues=1,
                cpu_user=0.75,
                cpu_system=0.125,
                class_times={"CS": 1.0, "F": 0.5, "DC": 1.5},
            ),
            p.HistoryEntry(
                id=4,
                name="",
                user="bob",
                uid=1002,
                state="PENDING",
                ranks=1,
                nodes=(),
                submit_time=2.0,
                start_time=None,
                end_time=None,
                exit_code=None,
                reason="",
            ),
        ),
        more=4,
    ),
}

SUBMIT = {"op": "submit_job", "ranks": 2, "argv": ["/bin/true"], "cwd": "/tmp", "env": {}}


def pack(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return data


def rejected(body: Any, **kwargs: Any) -> str:
    """Decode ``body`` (packed unless bytes) expecting a ProtocolError; return its text."""
    data = body if isinstance(body, bytes) else pack(body)
    with pytest.raises(ProtocolError) as info:
        p.decode(data, **kwargs)
    return str(info.value)


def test_every_registered_op_has_an_example() -> None:
    assert set(EXAMPLES) == set(p.registered_ops())
    for op, msg in EXAMPLES.items():
        assert type(msg).op == op


@pytest.mark.parametrize("op", sorted(EXAMPLES))
def test_round_trip(op: str) -> None:
    msg = EXAMPLES[op]
    data = p.encode(msg)
    body = msgpack.unpackb(data, raw=False)
    assert body["op"] == op
    decoded = p.decode(data)
    assert decoded == msg
    assert type(decoded) is type(msg)


def test_nested_records_come_back_as_records_and_tuples() -> None:
    done = p.decode(p.encode(EXAMPLES["job_node_done"]))
    assert isinstance(done, p.JobNodeDone)
    assert all(isinstance(e, RankExit) for e in done.exits)
    assert [e.status for e in done.exits] == [0, 137, 127]
    launch = p.decode(p.encode(EXAMPLES["launch_job"]))
    assert isinstance(launch, p.LaunchJob)
    assert isinstance(launch.slots, tuple) and launch.slots[1] == RankSlot(rank=3, pe=5)
    jobs = p.decode(p.encode(EXAMPLES["job_list"]))
    assert isinstance(jobs, p.JobList)
    assert isinstance(jobs.jobs[0].nodes, tuple) and jobs.jobs[1].state == "FAILED"


def test_defaults_fill_in_for_omitted_optional_fields() -> None:
    msg = p.decode(pack(SUBMIT))
    assert msg == p.SubmitJob(ranks=2, argv=("/bin/true",), cwd="/tmp", env={})
    assert isinstance(msg, p.SubmitJob) and msg.req == 0 and msg.time_limit is None


def test_integer_accepted_where_a_float_is_declared() -> None:
    msg = p.decode(pack({**SUBMIT, "time_limit": 30}))
    assert isinstance(msg, p.SubmitJob)
    assert msg.time_limit == 30.0 and type(msg.time_limit) is float


def test_unknown_fields_are_ignored_even_in_nested_records() -> None:
    body = msgpack.unpackb(p.encode(EXAMPLES["job_node_done"]), raw=False)
    body["added_in_v2"] = {"x": [1, 2]}
    body["exits"][0]["core_dumped"] = True
    assert p.decode(pack(body)) == EXAMPLES["job_node_done"]


# ---------------------------------------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "not a msgpack message"),
        (b"\xc1", "not a msgpack message"),  # 0xc1 is never used in msgpack
        (b"\x85\xa2op", "not a msgpack message"),  # a map of 5 entries, cut short
        (pack(SUBMIT)[:-3], "not a msgpack message"),
        (pack(SUBMIT) + b"\x00", "not a msgpack message"),  # trailing bytes
        (pack([1, 2, 3]), "must be a msgpack map"),
        (pack("submit_job"), "must be a msgpack map"),
        (pack(None), "must be a msgpack map"),
        (pack({"ranks": 1}), "needs a string 'op'"),
        (pack({"op": 7}), "needs a string 'op'"),
        (pack({"op": b"submit_job"}), "needs a string 'op'"),
        (pack({"op": "launch_missiles"}), "unknown op 'launch_missiles'"),
        (pack({"op": "submit_job", 1: 2}), "not a msgpack message"),  # non-string map key
    ],
)
def test_malformed_input(data: bytes, expected: str) -> None:
    assert expected in rejected(data)


def test_missing_required_field_is_named() -> None:
    body = dict(SUBMIT)
    del body["cwd"]
    assert rejected(body) == "submit_job: missing field 'cwd'"
    nested = {"op": "rank_failed", "job_id": 1, "node": "n", "exit": {"exit_code": 1}}
    assert rejected(nested) == "rank_failed.exit: missing field 'rank'"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ranks", True, "submit_job.ranks: expected an integer, got bool"),
        ("ranks", "2", "submit_job.ranks: expected an integer, got str"),
        ("ranks", 2.0, "submit_job.ranks: expected an integer, got float"),
        ("ranks", None, "submit_job.ranks: expected an integer, got NoneType"),
        ("ranks", 2**63, "submit_job.ranks: integer out of range"),
        ("argv", "/bin/true", "submit_job.argv: expected a list, got str"),
        ("argv", ["/bin/true", 5], "submit_job.argv[1]: expected a string, got int"),
        ("env", ["A=b"], "submit_job.env: expected a map, got list"),
        ("env", {"A": 1}, "submit_job.env['A']: expected a string, got int"),
        ("env", {b"A": "b"}, "submit_job.env key: expected a string, got bytes"),
        ("cwd", b"/tmp", "submit_job.cwd: expected a string, got bytes"),
        ("time_limit", False, "submit_job.time_limit: expected a number, got bool"),
        ("time_limit", "60", "submit_job.time_limit: expected a number, got str"),
        ("time_limit", math.nan, "submit_job.time_limit: not a finite number"),
        ("time_limit", math.inf, "submit_job.time_limit: not a finite number"),
        ("time_limit", -math.inf, "submit_job.time_limit: not a finite number"),
        ("req", True, "submit_job.req: expected an integer, got bool"),
        ("requeue", 1, "submit_job.requeue: expected true or false, got int"),
        ("requeue", "yes", "submit_job.requeue: expected true or false, got str"),
    ],
)
def test_wrong_field_types(field: str, value: Any, expected: str) -> None:
    assert rejected({**SUBMIT, field: value}) == expected


def test_wrong_types_in_other_messages() -> None:
    assert "list_jobs.all: expected true or false, got int" in rejected({"op": "list_jobs", "all": 1})
    text = rejected({"op": "job_node_done", "job_id": 1, "node": "n", "exits": [[0, 1]]})
    assert text == "job_node_done.exits[0]: expected a map, got list"
    text = rejected({"op": "job_launched", "job_id": 1, "node": "n", "pids": {"0": 1.5}})
    assert text == "job_launched.pids['0']: expected an integer, got float"
    # Negative int64 bounds are fine; the lowest int64 is still in range.
    msg = p.decode(pack({"op": "kill_job", "job_id": -(2**63), "reason": ""}))
    assert isinstance(msg, p.KillJob) and msg.job_id == -(2**63)
    assert "kill_job.job_id: integer out of range" in rejected(
        {"op": "kill_job", "job_id": 2**64 - 1, "reason": ""}
    )


@pytest.mark.parametrize(
    ("timings", "expected"),
    [
        ({"delivery": [1, -1]}, "bucket counts must be >= 0"),
        ({"duration": [1] * 65}, "at most 64 bucket counts"),
        ({"lateness": [1], "lateness_sum": -0.5}, "sums, late and skewed must be >= 0"),
        ({"duration_sum": math.inf}, "timings.duration_sum: not a finite number"),
        ({"late": -1}, "sums, late and skewed must be >= 0"),
        ({"delivery": [1, True]}, "timings.delivery[1]: expected an integer, got bool"),
        ({"delivery": [1, 2**63]}, "timings.delivery[1]: integer out of range"),  # past the C-level scan
        ({"delivery": {"counts": [1]}}, "timings.delivery: expected a list, got dict"),
        ([1, 2], "timings: expected a map, got list"),
    ],
)
def test_a_nodes_timings_are_checked_like_the_rest_of_its_report(timings: Any, expected: str) -> None:
    body = msgpack.unpackb(p.encode(EXAMPLES["node_status"]), raw=False)
    assert expected in rejected({**body, "timings": timings})
    assert p.decode(pack({**body, "timings": None})) == dataclasses.replace(
        EXAMPLES["node_status"], timings=None
    )


def launch_body(**changes: Any) -> dict[str, Any]:
    body = msgpack.unpackb(p.encode(EXAMPLES["launch_job"]), raw=False)
    body.update(changes)
    return dict(body)


def dynamic(op: str, **changes: Any) -> dict[str, Any]:
    """The example of a spawn or name message as a body on the wire, with ``changes``."""
    body = msgpack.unpackb(p.encode(EXAMPLES[op]), raw=False)
    body.update(changes)
    return dict(body)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({**SUBMIT, "ranks": 0}, "submit_job: ranks must be at least 1"),
        ({**SUBMIT, "argv": []}, "submit_job: a command is required"),
        ({**SUBMIT, "argv": [""]}, "submit_job: a command is required"),
        ({**SUBMIT, "cwd": "tmp"}, "submit_job: cwd must be an absolute path"),
        ({**SUBMIT, "time_limit": -1.0}, "submit_job: time_limit must be positive"),
        ({**SUBMIT, "time_limit": 0}, "submit_job: time_limit must be positive"),
        ({**SUBMIT, "name": "x" * 257}, "submit_job: name longer than 256 characters"),
        ({"op": "cancel_jobs", "job_ids": []}, "cancel_jobs: no job ids given"),
        ({"op": "register_node", "node": "", "pes": 1, "nm_epoch": "e"}, "register_node: node name must be"),
        (
            {"op": "register_node", "node": "n", "pes": 1, "nm_epoch": "e", "host": "a\0b"},
            "register_node: host: at most 256 characters, no NUL",
        ),
        (
            {"op": "register_node", "node": "n", "pes": 0, "nm_epoch": "e"},
            "register_node: pes must be 1..4096",
        ),
        (
            {"op": "rank_exited", "job_id": 1, "exit": {"rank": 0, "exit_code": 256}},
            "exit_code must be 0..255",
        ),
        (
            {"op": "rank_exited", "job_id": 1, "exit": {"rank": 0, "exit_code": -1}},
            "exit_code must be 0..255",
        ),
        (
            {"op": "rank_exited", "job_id": 1, "exit": {"rank": 0, "signal": 0}},
            "rank_exited.exit: signal must",
        ),
        ({"op": "rank_exited", "job_id": 1, "exit": {"rank": 0, "signal": 128}}, "signal must be 1..127"),
        ({"op": "rank_exited", "job_id": 1, "exit": {"rank": -1}}, "rank must be >= 0"),
        (launch_body(slots=[{"rank": 0, "pe": -1}]), "launch_job.slots[0]: rank and pe must be >= 0"),
        (launch_body(ranks_per_node=[2, 1]), "launch_job: ranks_per_node does not add up to size"),
        (launch_body(ranks_per_node=[1, 3]), "launch_job: slots do not match ranks_per_node"),
        (launch_body(node_index=2), "launch_job: node_index outside the job"),
        (launch_body(node_index=-1), "launch_job: node_index outside the job"),
        (launch_body(ranks_per_node=[]), "launch_job: node_index outside the job"),
        (launch_body(slots=[{"rank": 0, "pe": 0}, {"rank": 4, "pe": 1}]), "launch_job: rank outside the job"),
        (launch_body(slots=[]), "launch_job: a launch needs at least one rank"),
        (launch_body(argv=[]), "launch_job: a command is required"),
        (launch_body(hosts=[0]), "launch_job: hosts must number each node's host 0, 1, ... in order"),
        (launch_body(hosts=[1, 0]), "launch_job: hosts must number each node's host 0, 1, ... in order"),
        (launch_body(hosts=[0, 2]), "launch_job: hosts must number each node's host 0, 1, ... in order"),
        (
            {"op": "job_list", "jobs": [{**dataclasses.asdict(JOB_INFO), "state": "LOST"}]},
            "unknown job state",
        ),
        (
            {"op": "node_list", "nodes": [{**dataclasses.asdict(NODE_INFO), "state": "up"}]},
            "unknown node state",
        ),
        (
            {"op": "node_registered", "node": "n", "mm_epoch": "m", "report_interval": 1.0, "policy": "fair"},
            "unknown policy 'fair'",
        ),
        (
            {
                "op": "node_registered",
                "node": "n",
                "mm_epoch": "m",
                "report_interval": 1.0,
                "fcs": {"cs_thresh": 2.0, "dc_thresh": 1.0},
            },
            "node_registered.fcs: need 0 < f_thresh <= cs_thresh < dc_thresh",
        ),
        (
            {
                "op": "job_stats",
                "job_id": 1,
                "node": "n",
                "ranks": [],
                "changes": [{"job_id": 1, "rank": 0, "node": "n", "time": 1.0, "old": "CS", "new": "XX"}],
            },
            "job_stats.changes[0]: classes are CS, F or DC",
        ),
        (
            {
                "op": "job_stats",
                "job_id": 1,
                "node": "n",
                "ranks": [],
                "profile": [{**dataclasses.asdict(PROFILE[0]), "klass": "X"}],
            },
            "job_stats.profile[0]: klass must be CS, F, DC or empty",
        ),
        *(
            (dynamic(op, **changes), expected)
            for op, changes, expected in [
                ("spawned", {"world": 0}, "spawned: world must be >= 1"),
                ("spawned", {"pids": {}, "pes": {}}, "spawned: a spawn starts at least one process"),
                ("spawned", {"pes": {"0": 3}}, "spawned: pes must give each process a PE"),
                ("spawned", {"pids": {"0": 0, "1": 1}}, "spawned: pids must map ranks to process ids >= 1"),
                ("spawn_exited", {"world": -1}, "spawn_exited: world must be >= 1"),
                ("job_spawned", {"world": 1}, "job_spawned: a refused spawn has world 0"),
                ("job_spawned", {"refused": ""}, "job_spawned: a refused spawn has world 0"),
                ("spawn_failed", {"parent": -1}, "spawn_failed: world must be >= 1 and parent >= 0"),
                (
                    "pmi_name",
                    {"action": "delete"},
                    "pmi_name: action must be one of publish, lookup, unpublish",
                ),
                ("pmi_name", {"service": ""}, "pmi_name: service: 1-256 characters"),
                ("pmi_name", {"service": "s" * 257}, "pmi_name: service: 1-256 characters"),
                ("pmi_name", {"port": "p" * 1025}, "pmi_name: port: at most 1024 characters"),
                ("pmi_name", {"port": ""}, "pmi_name: a port is given to publish, and only then"),
                ("pmi_name", {"action": "lookup"}, "pmi_name: a port is given to publish, and only then"),
                ("pmi_name_result", {"seq": -1}, "pmi_name_result: seq must be >= 0"),
            ]
        ),
    ],
)
def test_impossible_values(body: dict[str, Any], expected: str) -> None:
    assert expected in rejected(body)


REGISTERED = {"op": "node_registered", "node": "n", "mm_epoch": "m", "report_interval": 1.0}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # Each would otherwise reach a daemon and hurt it or a job there: the text says what is wrong.
        (
            {**SUBMIT, "argv": ["/bin/tr\0ue"]},
            "submit_job: a NUL character in the command, a path or the name",
        ),
        ({**SUBMIT, "cwd": "/tmp\0"}, "a NUL character"),
        ({**SUBMIT, "output": "/tmp/o\0"}, "a NUL character"),
        ({**SUBMIT, "name": "a\0"}, "a NUL character"),
        ({**SUBMIT, "env": {"": "x"}}, "submit_job: environment variable names must be non-empty"),
        (
            {**SUBMIT, "max_ranks": 1},
            "submit_job: max_ranks must be 0 (a fixed size) or at least ranks (2), not 1",
        ),
        ({**SUBMIT, "max_ranks": -3}, "max_ranks must be 0"),
        ({**SUBMIT, "qos": "hi\0gh"}, "submit_job: qos: the name of a QOS"),
        ({"op": "resume_job", "job_id": 1, "row": -1}, "resume_job: row must be >= 0"),
        ({**SUBMIT, "env": {"A=B": "x"}}, "without '=' or NUL"),
        ({**SUBMIT, "env": {"A": "x\0y"}}, "without '=' or NUL"),
        ({**REGISTERED, "report_interval": 0}, "node_registered: report_interval must be positive"),
        ({**REGISTERED, "rows": {"x": 1}}, "node_registered: rows must map job ids to rows >= 0"),
        ({**REGISTERED, "rows": {"3": -1}}, "rows must map job ids to rows >= 0"),
        ({"op": "job_rows", "rows": {"-3": 0}}, "job_rows: rows must map job ids to rows >= 0"),
        ({"op": "job_rows", "rows": {"\u0663": 0}}, "rows must map job ids"),  # an Arabic-Indic 3
        ({"op": "ranks_started", "job_id": 1, "pids": {"0": 0}}, "ranks_started: pids must map ranks to"),
        ({"op": "ranks_started", "job_id": 1, "pids": {"0": -1}}, "process ids >= 1"),
        ({"op": "ranks_started", "job_id": 1, "pids": {"r0": 5}}, "process ids >= 1"),
        ({"op": "job_launched", "job_id": 1, "node": "n", "pids": {"0": -5}}, "job_launched: pids must"),
        ({"op": "shell_hello", "job_id": 1, "pid": 0}, "shell_hello: pid must be >= 1"),
        ({"op": "pmi_barrier_in", "job_id": 1, "node": "n", "seq": -1, "kvs": {}}, "seq must be >= 0"),
        ({"op": "pmi_barrier_out", "job_id": 1, "seq": -1, "kvs": {}}, "pmi_barrier_out: seq must be >= 0"),
        (launch_body(uid=-1), "launch_job: uid and gid must be >= 0"),
        (launch_body(slots=[{"rank": 2, "pe": 0}, {"rank": 2, "pe": 1}]), "a rank appears twice in slots"),
    ],
)
def test_values_that_would_harm_a_daemon(body: dict[str, Any], expected: str) -> None:
    assert expected in rejected(body)


def test_size_limit() -> None:
    data = p.encode(EXAMPLES["submit_job"])
    assert p.decode(data, max_bytes=len(data)) == EXAMPLES["submit_job"]
    text = rejected(data, max_bytes=len(data) - 1)
    assert text == f"message of {len(data)} bytes exceeds the limit of {len(data) - 1}"
    big = p.encode(p.SubmitJob(ranks=1, argv=("/x",), cwd="/", env={"BIG": "x" * p.MAX_CLIENT_MESSAGE}))
    assert "exceeds the limit" in rejected(big)
    assert isinstance(p.decode(big, max_bytes=p.MAX_NODE_MESSAGE), p.SubmitJob)


@pytest.mark.parametrize("opener", [b"\x91", b"\x81\xa1k"])  # fixarray of 1; fixmap of 1 with key "k"
def test_deep_nesting_is_a_protocol_error(opener: bytes) -> None:
    data = opener * 100_000 + b"\xc0"
    assert "not a msgpack message" in rejected(data, max_bytes=len(data))
    assert p.peek_req(data) == 0


def test_deep_nesting_inside_a_valid_envelope() -> None:
    inner = b"\x91" * 100_000 + b"\xc0"
    data = b"\x82\xa2op\xaasubmit_job\xa3env" + inner
    assert "not a msgpack message" in rejected(data, max_bytes=len(data))


# ---------------------------------------------------------------------------------------------- helpers


def test_peek_req() -> None:
    assert p.peek_req(pack({"op": "no_such_op", "req": 42})) == 42
    assert p.peek_req(pack({**SUBMIT, "ranks": 0, "req": 9})) == 9
    assert p.peek_req(pack({"op": "list_jobs"})) == 0
    assert p.peek_req(pack({"op": "list_jobs", "req": True})) == 0
    assert p.peek_req(pack({"op": "list_jobs", "req": -1})) == 0
    assert p.peek_req(pack({"op": "list_jobs", "req": 2**63})) == 0
    assert p.peek_req(pack({"op": "list_jobs", "req": "5"})) == 0
    assert p.peek_req(pack([1, 2])) == 0
    assert p.peek_req(b"") == 0
    assert p.peek_req(b"\xc1garbage") == 0


def test_peek_req_finds_req_despite_a_non_string_key() -> None:
    data = pack({**SUBMIT, "req": 11, "env": {1: "x"}})
    assert "not a msgpack message" in rejected(data)
    assert p.peek_req(data) == 11


def test_error_for() -> None:
    request = p.decode(pack({"op": "wait_job", "job_id": 3, "req": 77}))
    assert p.error_for(request, "no_job", "no job 3") == p.Error(req=77, code="no_job", text="no job 3")
    assert p.error_for(None, "bad_request", "x").req == 0
    assert p.error_for(EXAMPLES["register_node"], "c", "t").req == 0  # not a client request


@pytest.mark.parametrize(
    ("exit_", "status", "text"),
    [
        (RankExit(rank=3, exit_code=0), 0, "rank 3 exited with code 0"),
        (RankExit(rank=3, exit_code=42), 42, "rank 3 exited with code 42"),
        (RankExit(rank=1, signal=9), 137, "rank 1 killed by signal 9"),
        (RankExit(rank=1, exit_code=0, signal=15), 143, "rank 1 killed by signal 15"),
        (RankExit(rank=2, error="no such file"), 127, "rank 2 did not start: no such file"),
        (RankExit(rank=2), 127, "rank 2 did not start"),
        (
            RankExit(rank=0, exit_code=0, error="no MPI_Finalize"),
            1,
            "rank 0 exited with code 0: no MPI_Finalize",
        ),
        (RankExit(rank=0, exit_code=5, error="aborted"), 5, "rank 0 exited with code 5: aborted"),
    ],
)
def test_rank_exit_status(exit_: RankExit, status: int, text: str) -> None:
    assert exit_.status == status
    assert exit_.failed is (status != 0)
    assert exit_.describe() == text


# ---------------------------------------------------------------------------------------------- properties

names = st.text(min_size=1, max_size=12)
# What execve can take: no NUL anywhere, no '=' in a variable's name (a submit with anything else is refused).
texts = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=20)
words = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)
variables = st.text(st.characters(codec="utf-8", exclude_characters="\0="), min_size=1, max_size=8)
rank_exits = st.builds(
    RankExit,
    rank=st.integers(0, 2**63 - 1),
    exit_code=st.none() | st.integers(0, 255),
    signal=st.none() | st.integers(1, 127),
    error=st.text(max_size=20),
)


@settings(deadline=None)
@given(
    job_id=st.integers(-(2**63), 2**63 - 1),
    node=names,
    exits=st.lists(rank_exits, max_size=5).map(tuple),
)
def test_job_node_done_round_trips(job_id: int, node: str, exits: tuple[RankExit, ...]) -> None:
    msg = p.JobNodeDone(job_id=job_id, node=node, exits=exits)
    assert p.decode(p.encode(msg)) == msg


@settings(deadline=None)
@given(
    ranks=st.integers(1, 2**31),
    argv=st.lists(words, min_size=1, max_size=4).map(tuple),
    cwd=texts.map(lambda s: "/" + s),
    env=st.dictionaries(variables, texts, max_size=4),
    time_limit=st.none() | st.floats(min_value=1e-3, max_value=1e9),
    req=st.integers(0, 2**63 - 1),
)
def test_submit_round_trips(
    ranks: int, argv: tuple[str, ...], cwd: str, env: dict[str, str], time_limit: float | None, req: int
) -> None:
    msg = p.SubmitJob(req=req, ranks=ranks, argv=argv, cwd=cwd, env=env, time_limit=time_limit)
    assert p.decode(p.encode(msg)) == msg


def decodes_or_protocol_error(data: bytes) -> None:
    try:
        msg = p.decode(data, max_bytes=p.MAX_NODE_MESSAGE)
    except ProtocolError as exc:
        assert str(exc)
    else:
        assert isinstance(msg, p.Message) and msg.op in p.registered_ops()


@settings(deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    decodes_or_protocol_error(data)
    assert isinstance(p.peek_req(data), int)


scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=10)
    | st.binary(max_size=10)
)  # fmt: skip
keys = st.text(max_size=10) | st.integers(-5, 5) | st.binary(max_size=3)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)
FIELDS = {op: [f.name for f in dataclasses.fields(cls)] for op, cls in p.registered_ops().items()}


@st.composite
def near_messages(draw: st.DrawFn) -> dict[Any, Any]:
    """A map with a real op and some of its real field names, holding arbitrary values."""
    op = draw(st.sampled_from(sorted(FIELDS)))
    chosen = draw(st.lists(st.sampled_from(FIELDS[op]), unique=True)) if FIELDS[op] else []
    body: dict[Any, Any] = {name: draw(values) for name in chosen}
    body.update(draw(st.dictionaries(keys, values, max_size=2)))
    body["op"] = op
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values | near_messages())
def test_arbitrary_msgpack_objects(obj: Any) -> None:
    decodes_or_protocol_error(pack(obj))


@settings(deadline=None)
@given(st.sampled_from(sorted(EXAMPLES)), st.data())
def test_valid_messages_with_one_field_replaced(op: str, data: st.DataObject) -> None:
    body = msgpack.unpackb(p.encode(EXAMPLES[op]), raw=False)
    if FIELDS[op]:
        body[data.draw(st.sampled_from(FIELDS[op]))] = data.draw(values)
    decodes_or_protocol_error(pack(body))


# ------------------------------------------------------------------------------------------ streamed output


def chunk(**changes: Any) -> dict[str, Any]:
    return {
        "op": "job_output", "job_id": 1, "node": "n", "rank": 0, "stream": "out", "seq": 0, "offset": 0,
        **changes,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chunk(stream="tty"), "job_output: stream must be one of ('out', 'err'), not 'tty'"),
        (chunk(rank=-1), "job_output: rank, seq and offset must be >= 0"),
        (chunk(offset=-1), "job_output: rank, seq and offset must be >= 0"),
        (
            chunk(data=b"x" * (p.OUTPUT_CHUNK + 1)),
            f"job_output: a chunk holds at most {p.OUTPUT_CHUNK} bytes",
        ),
        (chunk(data=b"x", eof=True), "job_output: an eof chunk carries no data"),
        (chunk(data="text"), "job_output.data: expected bytes, got str"),
        ({"op": "attach_output", "job_id": 1, "token": ""}, "attach_output: token: 1 to 64 letters"),
        ({"op": "attach_output", "job_id": 1, "token": "a/b"}, "attach_output: token: 1 to 64 letters"),
        ({"op": "attach_output", "job_id": 1, "token": "t", "received": -1}, "received must be >= 0"),
        ({"op": "output_attached", "job_id": 1, "mm_epoch": "m", "state": "GONE"}, "unknown job state"),
        ({**SUBMIT, "attach": "x" * 65}, "submit_job: attach: at most 64 letters"),
    ],
)
def test_streamed_output_messages_refuse_impossible_values(body: dict[str, Any], expected: str) -> None:
    with pytest.raises(p.ProtocolError, match=re.escape(expected)):
        p.decode(pack(body))


def test_streamed_output_fields_default_so_that_older_peers_still_decode() -> None:
    """An older client's submission and an older MM's launch lack the new fields: nothing is streamed."""
    assert p.decode(pack(SUBMIT)).attach == ""  # type: ignore[attr-defined]
    launch = msgpack.unpackb(p.encode(EXAMPLES["launch_job"]), raw=False)
    del launch["stream"]
    assert p.decode(pack(launch)).stream is False  # type: ignore[attr-defined]
    assert p.decode(p.encode(EXAMPLES["job_output"])) == EXAMPLES["job_output"]


def test_an_exit_from_an_older_node_has_no_cpu_time_and_a_bad_one_is_refused() -> None:
    old = p.decode(pack({"op": "rank_exited", "job_id": 1, "exit": {"rank": 0, "exit_code": 0}}))
    assert isinstance(old, p.RankExited) and old.exit.cpu_user is None and old.exit.cpu_system is None
    bad = {"op": "rank_exited", "job_id": 1, "exit": {"rank": 0, "exit_code": 0, "cpu_user": -1.0}}
    assert "CPU seconds must be >= 0" in rejected(bad)


def test_a_history_request_with_an_unknown_state_is_refused_clearly() -> None:
    assert "states: each one of PENDING" in rejected({"op": "job_history", "states": ["DONE"]})
    job = {
        "id": 1, "name": "", "user": "u", "uid": 1, "state": "PENDING", "ranks": 1, "nodes": [],
        "submit_time": 1.0, "start_time": None, "end_time": None, "exit_code": None, "reason": "",
    }  # fmt: skip
    page = p.decode(pack({"op": "history", "jobs": [job]}))
    assert (
        isinstance(page, p.HistoryPage) and page.jobs[0].class_times == {} and page.jobs[0].cpu_user is None
    )
    assert "class_times" in rejected({"op": "history", "jobs": [{**job, "class_times": {"XX": 1.0}}]})
