"""Metrics without a cluster: what the MM counts (mm/tally.py), what a scrape reads of its state
(mm/metrics.py) against what clients are told, the nodes' timings (nm/timings.py) on both sides of the link,
and the exporter's rendering and HTTP side (mm/exporter.py). End to end: tests/test_cluster_metrics.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from storm.mm import exporter
from storm.mm import protocol as p
from storm.mm.exporter import MetricsServer, registry_for
from storm.mm.metrics import reason_code, snapshot
from storm.mm.protocol import TIMING_BOUNDS, SwitchTimings
from storm.mm.store import Store
from storm.mm.tally import PASS_BOUNDS, Histogram, TimingTotals
from tests.test_core import T0, Core, done, launched, make, reg, status, submit, take, two_nodes
from tests.test_node import make as make_node
from tests.test_node import registered, start

BUCKETS = len(TIMING_BOUNDS) + 1


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "storm.db")
    yield s  # type: ignore[misc]
    s.close()


# ------------------------------------------------------------------------------------------- counting


def test_a_value_on_a_bound_is_in_that_bucket_and_a_negative_one_counts_as_zero() -> None:
    h = Histogram((0.1, 1.0))
    for value in (0.1, 0.10001, 1.0, 7.0, -3.0):
        h.observe(value)
    assert h.counts == [2, 2, 1] and h.count == 5
    assert h.cumulative() == [(0.1, 2), (1.0, 4), (float("inf"), 5)]
    assert h.total == pytest.approx(0.1 + 0.10001 + 1.0 + 7.0)
    with pytest.raises(ValueError, match="increasing"):
        Histogram((1.0, 0.5))


def dist(*pairs: tuple[int, int]) -> tuple[int, ...]:
    """Bucket counts with counts[i] = n for each (i, n)."""
    counts = [0] * BUCKETS
    for i, n in pairs:
        counts[i] = n
    return tuple(counts)


def test_the_mm_adds_what_each_node_counted_since_its_last_report_once() -> None:
    totals = TimingTotals()
    duration = dist((2, 1))
    first = SwitchTimings(delivery=dist((4, 3)), delivery_sum=0.003, duration=duration, late=1)
    totals.report("n1", "e1", first)
    totals.report("n1", "e1", first)  # the same again (nothing happened since): nothing added
    totals.report("n2", "e7", SwitchTimings(delivery=dist((4, 1)), delivery_sum=0.001))
    assert totals.delivery.counts[4] == 4 and totals.duration.count == 1 and totals.late == 1
    # n1's next report is lost on the way; the one after carries everything since, added once.
    totals.report(
        "n1",
        "e1",
        SwitchTimings(delivery=dist((4, 6), (9, 1)), delivery_sum=0.061, duration=duration, late=3),
    )
    assert totals.delivery.counts[4] == 7 and totals.delivery.counts[9] == 1 and totals.delivery.count == 8
    assert totals.delivery.total == pytest.approx(0.061 + 0.001) and totals.late == 3
    assert totals.duration.count == 1
    # Its node manager restarted (another epoch): it counts from zero, all of it new.
    totals.report("n1", "e2", SwitchTimings(delivery=dist((4, 2)), delivery_sum=0.002))
    assert totals.delivery.counts[4] == 9 and totals.delivery.count == 10 and totals.late == 3
    totals.report("n1", "e2", None)  # nothing measured: nothing changes
    # Counts that went down are not what this MM saw grow: taken as a fresh start rather than subtracted.
    totals.report("n1", "e2", SwitchTimings(delivery=dist((4, 1)), delivery_sum=0.001, skewed=1))
    assert totals.delivery.counts[4] == 10 and totals.skewed == 1 and totals.refused == 0


def test_a_distribution_in_other_buckets_is_left_out_and_counted() -> None:
    totals = TimingTotals()
    totals.report("n1", "e1", SwitchTimings(delivery=(1, 2, 3), delivery_sum=1.0, late=2))
    assert totals.delivery.count == 0 and totals.refused == 1 and totals.late == 2


def hb(seq: int, row: int, sent: float, at: float = 0.0) -> p.Heartbeat:
    return p.Heartbeat(epoch="mm-1", seq=seq, row=row, sent=sent, slice=0.1, at=at)


def test_a_node_counts_delivery_lateness_and_switches_from_its_registration_with_each_mm(
    tmp_path: Path,
) -> None:
    node, fake, _ = make_node(tmp_path, heartbeat_timeout=5.0)
    node.from_mm(registered("gang"), T0)
    (nothing,) = node.reports()
    assert isinstance(nothing, p.NodeStatus) and nothing.timings is None  # nothing measured yet
    start(node, fake, 7, row=0)
    start(node, fake, 8, row=1)
    # Sent at T0 naming T0 + 0.02, it arrives 3 ms later and the node waits for its instant.
    out = node.heartbeat(hb(1, 0, T0, at=T0 + 0.02), T0, T0 + 0.003)
    assert out.slot == (1, T0 + 0.02)
    out = node.begin_slot(1, T0 + 0.0204)  # 0.4 ms late
    assert out is not None and out.check is not None
    node.switch_checked(out.check, T0 + 0.0204 + 0.0007)
    # One that names no instant switches on arrival: its delivery counted (60 ms), no lateness.
    out = node.heartbeat(hb(2, 1, T0 + 0.1), T0 + 0.16, T0 + 0.16)
    assert out.check is not None
    node.switch_checked(out.check, T0 + 0.16 + 0.002)
    # One arriving 50 ms after its instant: late, switched at once (its switch not checked yet).
    node.heartbeat(hb(3, 0, T0 + 0.2, at=T0 + 0.22), T0 + 0.27, T0 + 0.27)
    (report,) = [m for m in node.reports() if isinstance(m, p.NodeStatus)]
    timings = report.timings
    assert timings is not None and (timings.late, timings.skewed) == (1, 0)
    bucket = TIMING_BOUNDS.index
    assert timings.delivery[bucket(5e-3)] == 1 and timings.delivery[bucket(0.1)] == 2
    assert timings.delivery_sum == pytest.approx(0.003 + 0.06 + 0.07)
    assert timings.lateness[bucket(5e-4)] == 1 and timings.lateness[bucket(0.05)] == 1
    assert sum(timings.lateness) == 2
    assert timings.duration[bucket(1e-3)] == 1 and timings.duration[bucket(2.5e-3)] == 1
    assert sum(timings.duration) == 2
    # Registering again with the same MM keeps counting; with a new MM, from zero.
    node.from_mm(registered("gang"), T0 + 1)
    kept = node.reports()[0]
    assert isinstance(kept, p.NodeStatus) and kept.timings == timings
    node.from_mm(registered("gang", epoch="mm-2"), T0 + 2)
    fresh = node.reports()[0]
    assert isinstance(fresh, p.NodeStatus) and fresh.timings is None and fresh.late_beats == 1


# ------------------------------------------------------------------------------------------- the core's state


def queue_from_listing(ctl: Core) -> Counter[tuple[str, str]]:
    """What `storm queue --json` shows, counted by state and reason as the metrics' labels say: the first
    word of a queued job's reason, capitalized (None without one); SUSPENDED for a held running job."""
    reply = ctl.ask(p.ListJobs(), T0)
    assert isinstance(reply, p.JobList)
    counted: Counter[tuple[str, str]] = Counter()
    for job in reply.jobs:
        state = "SUSPENDED" if job.suspended_by is not None else job.state
        word = job.reason.split(":")[0].split()[0] if job.state == "PENDING" and job.reason else "None"
        counted[state, word[0].upper() + word[1:]] += 1
    return counted


def nonzero(counts: dict[tuple[str, str], int]) -> Counter[tuple[str, str]]:
    return Counter({k: v for k, v in counts.items() if v})


def test_the_queue_and_nodes_of_a_snapshot_are_what_clients_are_told(store: Store) -> None:
    ctl = two_nodes(store)
    reg(ctl, "n3", pes=2)
    first = submit(ctl, 4)  # every PE
    launched(ctl, first, *ctl.runs.active[first].nodes)
    for ranks in (2, 1, 3):
        submit(ctl, ranks)
    snap = snapshot(ctl)
    assert nonzero(snap.queue) == queue_from_listing(ctl)
    assert snap.queue["PENDING", "Resources"] == 1 and snap.queue["PENDING", "Priority"] == 2
    assert snap.queue["STARTING", "None"] == 0 and snap.queue["RUNNING", "None"] == 1  # every state shown
    assert (snap.nodes, snap.pes, snap.pes_used) == ({"UP": 3, "DOWN": 0}, {"UP": 4, "DOWN": 0}, 4)
    nodes = ctl.node_infos()
    assert sum(n.pes_used for n in nodes) == snap.pes_used
    assert Counter(n.state for n in nodes) == Counter({k: v for k, v in snap.nodes.items() if v})
    # n3 goes silent: DOWN, the job on it ends NODE_FAIL (once its other nodes say its ranks are gone).
    status(ctl, "n1", T0 + 8, jobs=(first,))
    status(ctl, "n2", T0 + 8, jobs=(first,))
    ctl.tick(T0 + 12)
    snap = snapshot(ctl)
    assert snap.nodes == {"UP": 2, "DOWN": 1} and snap.pes == {"UP": 2, "DOWN": 2}
    assert nonzero(snap.queue) == queue_from_listing(ctl)


def test_a_queued_jobs_reason_is_its_first_word() -> None:
    assert reason_code("Resources") == "Resources"
    assert reason_code("Resources: 3 nodes are free but not as a box of 4 on the torus") == "Resources"
    assert reason_code("PartitionConfig: needs 9 PEs, the cluster has 4") == "PartitionConfig"
    assert reason_code("requeued 1/5 after node n1 DOWN: no report for 10.2 s") == "Requeued"
    assert reason_code("Priority (requeued 1/5 after ...); may suspend job(s) 3 in 20 s") == "Priority"
    assert reason_code("") == "None"


def test_jobs_started_and_ended_agree_with_the_store(store: Store) -> None:
    ctl = two_nodes(store)
    ids = [submit(ctl, 1) for _ in range(4)]
    for job_id in ids[:2]:
        launched(ctl, job_id, *ctl.runs.active[job_id].nodes)
    done(ctl, ids[0], ctl.runs.active[ids[0]].nodes[0], T0 + 2)
    ctl.rank_failed(p.RankFailed(job_id=ids[1], node="n2", exit=p.RankExit(rank=0, exit_code=3)), T0 + 2)
    done(ctl, ids[1], "n2", T0 + 3, p.RankExit(rank=0, exit_code=3))
    ctl.cancel((ids[3],), 1000, "alice", T0 + 3)  # it had started on a freed PE
    done(ctl, ids[3], ctl.runs.active[ids[3]].nodes[0], T0 + 4, p.RankExit(rank=0, signal=15))
    take(ctl)
    tally = snapshot(ctl).tally
    stored = Counter(job.state for job in store.jobs())
    assert {s: n for s, n in tally.ended.items() if n} == {s: n for s, n in stored.items() if s.terminal}
    assert tally.started == 4 and tally.ended["COMPLETED"] == 1 and tally.ended["FAILED"] == 1
    assert tally.ended["CANCELLED"] == 1 and tally.requeued == 0


def test_processes_by_class_are_what_storm_classes_lists(store: Store) -> None:
    ctl = make(store, mpl=2)
    reg(ctl, "n1", pes=2)
    first = submit(ctl, 2)
    launched(ctl, first, "n1")

    def ranks(job_id: int, *classes: str) -> p.JobStats:
        found = (dataclasses.replace(_rank(job_id, rank), klass=klass) for rank, klass in enumerate(classes))
        return p.JobStats(job_id=job_id, node="n1", ranks=tuple(found))

    ctl.job_stats(ranks(first, "CS", "CS"), T0 + 1)
    ctl.job_stats(ranks(first, "F", "DC"), T0 + 2)  # the node's newest report replaces its last
    snap = snapshot(ctl)
    listed = ctl.ask(p.GetClasses(), T0 + 2)
    assert isinstance(listed, p.ClassesView)
    assert (
        snap.processes
        == {"CS": 0, "F": 1, "DC": 1}
        == {k: sum(r.klass == k for r in listed.processes) for k in p.CLASSES}
    )
    done(ctl, first, "n1", T0 + 3)
    assert snapshot(ctl).processes == {"CS": 0, "F": 0, "DC": 0}


def _rank(job_id: int, rank: int) -> p.RankStats:
    return p.RankStats(
        job_id=job_id, rank=rank, node="n1", pid=100 + rank, state="active", t_cpu=1.0, t_comm=0.5,
        c_comm=10, granularity=0.15, calls=10, wait_mode="poll",
    )  # fmt: skip


def test_node_timings_count_only_from_nodes_the_mm_takes_reports_from(store: Store) -> None:
    ctl = two_nodes(store)
    timings = SwitchTimings(delivery=dist((3, 5)), delivery_sum=0.001, late=2)
    refused = p.NodeStatus(node="n9", nm_epoch="x", mm_epoch=ctl.mm_epoch, timings=timings)
    assert isinstance(ctl.node_status(refused, T0 + 1), p.Reregister)
    taken = p.NodeStatus(node="n1", nm_epoch="n1-e1", mm_epoch=ctl.mm_epoch, timings=timings)
    assert ctl.node_status(taken, T0 + 1) is None
    assert snapshot(ctl).timings.delivery.count == 5 and snapshot(ctl).timings.late == 2


# ------------------------------------------------------------------------------------------- the exporter


def scrape(
    ctl: Core, pass_times: Histogram | None = None
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The exposition as Prometheus's own parser reads it: sample name -> labels -> value."""
    from prometheus_client import generate_latest

    text = generate_latest(registry_for(ctl, pass_times or Histogram(PASS_BOUNDS))).decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def test_a_scrape_renders_the_snapshot_with_prometheus_names(store: Store) -> None:
    ctl = two_nodes(store)
    job = submit(ctl, 2)
    submit(ctl, 2)
    launched(ctl, job, "n1", "n2")
    ctl.node_status(
        p.NodeStatus(
            node="n1", nm_epoch="n1-e1", mm_epoch=ctl.mm_epoch,
            timings=SwitchTimings(lateness=dist((0, 3), (14, 1)), lateness_sum=2.5, skewed=1),
        ),
        T0 + 1,
    )  # fmt: skip
    passes = Histogram(PASS_BOUNDS)
    passes.observe(0.0003)
    got = scrape(ctl, passes)
    assert (("reason", "Priority"), ("state", "PENDING")) not in got["storm_queue_jobs"]  # no such job
    assert got["storm_queue_jobs"][("reason", "Resources"), ("state", "PENDING")] == 1
    assert got["storm_queue_jobs"][("reason", "None"), ("state", "RUNNING")] == 1
    assert got["storm_nodes"] == {(("state", "DOWN"),): 0, (("state", "UP"),): 2}
    assert got["storm_jobs_started_total"] == {(): 1}
    assert got["storm_jobs_ended_total"][(("state", "COMPLETED"),)] == 0
    assert got["storm_switch_lateness_seconds_bucket"][(("le", "5e-05"),)] == 3
    assert got["storm_switch_lateness_seconds_bucket"][(("le", "1.0"),)] == 3
    assert got["storm_switch_lateness_seconds_bucket"][(("le", "+Inf"),)] == 4
    assert got["storm_switch_lateness_seconds_count"] == {(): 4}
    assert got["storm_switch_lateness_seconds_sum"] == {(): 2.5}
    assert got["storm_heartbeats_skewed_total"] == {(): 1}
    assert got["storm_scheduling_pass_seconds_bucket"][(("le", "0.0005"),)] == 1
    assert got["storm_scheduling_pass_seconds_bucket"][(("le", "0.00025"),)] == 0
    assert list(got["storm_mm_info"]) == [(("policy", "batch"), ("version", exporter._version()))]
    assert "process_cpu_seconds_total" in got  # storm-mm's own process, from prometheus_client


async def fetch(address: str, request: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    try:
        answer = await reader.read()
    except ConnectionResetError:  # closed with the request unread
        answer = b""
    writer.close()
    with contextlib.suppress(ConnectionResetError):
        await writer.wait_closed()
    return answer


def test_the_server_answers_metrics_and_refuses_the_rest_without_stalling(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = two_nodes(store)
    monkeypatch.setattr(exporter, "REQUEST_TIMEOUT", 3600.0)  # the silent client below stays silent

    async def main() -> None:
        server = MetricsServer(registry_for(ctl, Histogram(PASS_BOUNDS)))
        address = await server.start("127.0.0.1:0")
        host, port = address.rsplit(":", 1)
        try:
            assert host == "127.0.0.1" and port != "0"
            # A client that connects and says nothing holds a connection, not the loop.
            _, silent = await asyncio.open_connection(host, int(port))
            ok = await fetch(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
            head, _, body = ok.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
            assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in head
            assert f"Content-Length: {len(body)}".encode() in head
            names = {f.name for f in text_string_to_metric_families(body.decode())}
            assert {"storm_nodes", "storm_queue_jobs", "storm_switch_duration_seconds"} <= names
            # What Prometheus asks for: OpenMetrics if the client library can, which it can.
            accept = b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            om = await fetch(address, b"GET /metrics HTTP/1.1\r\n" + accept + b"\r\n\r\n")
            head, _, body = om.partition(b"\r\n\r\n")
            assert b"Content-Type: application/openmetrics-text; version=1.0.0" in head and body.endswith(
                b"# EOF\n"
            )
            parsed = {f.name: f for f in openmetrics_families(body.decode())}
            assert parsed["storm_jobs_ended"].type == "counter"
            head_only = await fetch(address, b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n")
            assert head_only.startswith(b"HTTP/1.1 200 OK") and head_only.endswith(b"\r\n\r\n")
            assert (await fetch(address, b"GET /nope HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
            refused = await fetch(address, b"POST /metrics HTTP/1.1\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in refused
            assert (await fetch(address, b"hello there\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            assert await fetch(address, b"GET /" + b"x" * 10_000 + b" HTTP/1.1\r\n\r\n") == b""  # too long
            assert server.scrapes == 3 and len(server.clients) == 1  # the silent one
            # Past MAX_CLIENTS a connection is closed at once.
            monkeypatch.setattr(exporter, "MAX_CLIENTS", 1)
            assert await fetch(address, b"GET /metrics HTTP/1.1\r\n\r\n") == b""
            silent.close()
            while server.clients:  # (its end reaches the server's loop)
                await asyncio.sleep(0.01)
            # A client that says nothing is dropped after REQUEST_TIMEOUT.
            monkeypatch.setattr(exporter, "REQUEST_TIMEOUT", 0.05)
            mute, _ = await asyncio.open_connection(host, int(port))
            assert await asyncio.wait_for(mute.read(), 30) == b""
        finally:
            await server.close()

    asyncio.run(main())


# ------------------------------------------------------------------------------------------- the dashboard

DASHBOARD = Path(__file__).parent.parent / "tools" / "grafana" / "storm-dashboard.json"


def test_the_dashboard_is_a_grafana_model_on_a_prometheus_datasource_variable_and_draws_every_metric(
    store: Store,
) -> None:
    """What Grafana's import needs (a real scrape has every metric it queries: test_cluster_metrics.py)."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"] == "storm"
    assert dashboard["id"] is None  # Grafana gives an imported dashboard its own
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    source = {"type": "prometheus", "uid": "${datasource}"}
    assert variables["instance"]["datasource"] == source
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    exprs = []
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] >= 0 and box["x"] + box["w"] <= 24 and box["h"] > 0
        mine = {
            (x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert (
            panel["type"] in ("timeseries", "stat") and panel["datasource"] == source and panel["description"]
        )
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]) > 0
        for t in panel["targets"]:
            assert t["datasource"] == source and 'instance=~"$instance"' in t["expr"]
            exprs.append(t["expr"])
    drawn = {name for expr in exprs for name in re.findall(r"\bstorm_[a-z0-9_]+", expr)}
    drawn = {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in drawn}
    exported = {f.name for f in exporter.families(snapshot(two_nodes(store)), Histogram(PASS_BOUNDS), "0")}
    assert exported - drawn == {"storm_mm_info"}  # the instance variable's query uses it
    assert "storm_mm_info" in variables["instance"]["query"]["query"]
