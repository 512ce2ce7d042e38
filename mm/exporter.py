"""storm-mm's Prometheus endpoint ([mm] metrics_endpoint): GET /metrics over HTTP, served by the MM's own
event loop.

Each scrape is rendered by prometheus_client (in the text format or OpenMetrics, as the scraper asks) from
a custom collector that takes a snapshot of the Controller's state (mm/metrics.py) while the loop runs
nothing else, so a scrape sees the state between two stimuli, as ``storm queue`` does, and never races with
the core: no thread reads it. The rendering is small (a few dozen series whatever the size of the
cluster: counts by state, reason and class, and histograms in fixed buckets, not a series per node or per
job) and the HTTP side is asyncio's, so a slow or stuck client costs a socket, not the loop: its request
must come within REQUEST_TIMEOUT, and at most MAX_CLIENTS are served at once.

Every metric is documented in the README ("Metrics"); tools/grafana/storm-dashboard.json draws them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from storm.mm.config import metrics_address
from storm.mm.core import Controller
from storm.mm.metrics import Snapshot, snapshot
from storm.mm.tally import Histogram

log = logging.getLogger("storm.mm")

MAX_REQUEST = 8192  # bytes of a request's line and headers: Prometheus sends a few hundred
REQUEST_TIMEOUT = 10.0  # seconds for a client to send its request, and to take the answer
MAX_CLIENTS = 16  # connections served at once; more are closed at once


def _version() -> str:
    try:
        return version("storm-fcs")
    except PackageNotFoundError:
        return "unknown"


def _histogram(name: str, text: str, histogram: Histogram) -> HistogramMetricFamily:
    buckets = [(_bound(bound), float(count)) for bound, count in histogram.cumulative()]
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=histogram.total)


def _bound(bound: float) -> str:
    """A bucket's ``le`` as Prometheus's own clients write it (floatToGoString)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def families(snap: Snapshot, pass_times: Histogram, version_: str = "") -> Iterator[Metric]:
    """The metric families of one scrape (their names and meanings: the README's "Metrics")."""
    info = GaugeMetricFamily(
        "storm_mm_info", "storm-mm's version and scheduling policy (always 1)", labels=["version", "policy"]
    )
    info.add_metric([version_ or _version(), snap.policy], 1)
    yield info
    queue = GaugeMetricFamily(
        "storm_queue_jobs",
        "Jobs storm queue lists, by state (SUSPENDED: held stopped by preemption) and, for PENDING ones, the"
        " first word of why they wait (None for the others)",
        labels=["state", "reason"],
    )
    for (state, reason), count in sorted(snap.queue.items()):
        queue.add_metric([state, reason], count)
    yield queue
    nodes = GaugeMetricFamily("storm_nodes", "Nodes by state, as storm nodes lists them", labels=["state"])
    pes = GaugeMetricFamily(
        "storm_node_pes", "Processing elements (PEs) of the nodes, by node state", labels=["state"]
    )
    for state, count in sorted(snap.nodes.items()):
        nodes.add_metric([state], count)
        pes.add_metric([state], snap.pes[state])
    yield nodes
    yield pes
    yield GaugeMetricFamily(
        "storm_node_pes_used", "Ranks of active jobs placed on PEs (up to mpl per PE)", value=snap.pes_used
    )
    processes = GaugeMetricFamily(
        "storm_processes",
        "Processes of running jobs by FCS class (CS, F, DC), as their nodes last classified them (fcs only)",
        labels=["class"],
    )
    for klass, count in snap.processes.items():
        processes.add_metric([klass], count)
    yield processes
    tally = snap.tally
    yield CounterMetricFamily(
        "storm_jobs_started", "Job runs started (a requeued job starts again)", tally.started
    )
    ended = CounterMetricFamily("storm_jobs_ended", "Jobs ended, by final state", labels=["state"])
    for state, count in tally.ended.items():
        ended.add_metric([state.value], count)
    yield ended
    yield CounterMetricFamily(
        "storm_jobs_requeued", "Jobs sent back to the queue after a node failure", tally.requeued
    )
    yield _histogram("storm_scheduling_pass_seconds", "Time storm-mm took per scheduling pass", pass_times)
    yield CounterMetricFamily(
        "storm_heartbeats_sent", "Heartbeats (time slices) storm-mm sent", snap.heartbeats
    )
    timings = snap.timings
    yield _histogram(
        "storm_heartbeat_delivery_seconds",
        "Heartbeat arrival on a node (its clock) minus sending (the MM's clock), over every node",
        timings.delivery,
    )
    yield _histogram(
        "storm_switch_lateness_seconds",
        "Context switch begun on a node minus the instant its heartbeat named, over every node",
        timings.lateness,
    )
    yield _histogram(
        "storm_switch_duration_seconds",
        "Context switch signals sent until /proc showed them in effect, over every node",
        timings.duration,
    )
    yield CounterMetricFamily(
        "storm_heartbeats_late",
        "Heartbeats nodes switched on arrival, after the instant they named (delivery took longer than"
        " [mm] switch_lead)",
        timings.late,
    )
    yield CounterMetricFamily(
        "storm_heartbeats_skewed",
        "Heartbeats nodes switched on arrival, their instant too far ahead (a node's clock behind the MM's)",
        timings.skewed,
    )


class StormCollector(Collector):
    """The Controller's metrics, counted when a scrape asks for them (on the event loop: see the module's
    docstring); ``pass_times`` is the daemon's, which times the passes."""

    def __init__(self, core: Controller, pass_times: Histogram) -> None:
        self.core = core
        self.pass_times = pass_times
        self.version = _version()

    def collect(self) -> Iterable[Metric]:
        return list(families(snapshot(self.core), self.pass_times, self.version))

    def describe(self) -> Iterable[Metric]:
        return []  # no snapshot at registration: the core may not have recovered yet


def registry_for(core: Controller, pass_times: Histogram) -> CollectorRegistry:
    """storm's metrics, and storm-mm's process (CPU seconds, resident memory, open files: process_*)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StormCollector(core, pass_times))
    ProcessCollector(registry=registry)
    return registry


class MetricsServer:
    """GET /metrics (and HEAD) over HTTP/1.1, one request per connection, on the running event loop."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.server: asyncio.Server | None = None
        self.clients: set[asyncio.StreamWriter] = set()  # connections being served
        self.scrapes = 0

    async def start(self, endpoint: str) -> str:
        """Listen on ``endpoint`` ([mm] metrics_endpoint, checked already); the address it got, as HOST:PORT
        (a port 0 becomes the kernel's choice). OSError if it cannot listen there."""
        host, port = metrics_address(endpoint)
        self.server = await asyncio.start_server(
            self._serve, host or None, port, limit=MAX_REQUEST, reuse_address=True
        )
        bound = self.server.sockets[0].getsockname()
        shown = host or "*"
        return f"[{shown}]:{bound[1]}" if ":" in shown else f"{shown}:{bound[1]}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in self.clients:
                writer.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.clients) >= MAX_CLIENTS:
            writer.close()
            return
        self.clients.add(writer)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            writer.write(self.answer(head))
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that went away, or never said what it wanted: nothing to answer
        finally:
            self.clients.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), REQUEST_TIMEOUT)

    def answer(self, head: bytes) -> bytes:
        """The whole HTTP response to a request's line and headers."""
        line, *headers = head.split(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response(400, b"storm-mm: not an HTTP request\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if target not in (b"/metrics", b"/"):
            return _response(404, b"storm-mm: the metrics are at /metrics\n")
        if method not in (b"GET", b"HEAD"):
            return _response(405, b"storm-mm: only GET and HEAD\n", extra=b"Allow: GET, HEAD\r\n")
        if target == b"/":
            return _response(200, b"storm-mm: the metrics are at /metrics\n", head_only=method == b"HEAD")
        # The format the scraper asks for, as prometheus_client decides it: Prometheus's text format by
        # default, OpenMetrics when Prometheus offers it.
        accept = b",".join(
            v for k, _, v in (h.partition(b":") for h in headers) if k.strip().lower() == b"accept"
        )
        encode, content_type = choose_encoder(accept.decode("latin-1"))
        try:
            body = encode(self.registry)
        except Exception:  # a bug in a collector must cost a scrape, not the daemon
            log.exception("could not render the metrics")
            return _response(500, b"storm-mm: could not render the metrics (see its log)\n")
        self.scrapes += 1
        return _response(200, body, content_type.encode(), head_only=method == b"HEAD")


_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 500: b"Error"}


def _response(
    status: int,
    body: bytes,
    content_type: bytes = b"text/plain; charset=utf-8",
    *,
    extra: bytes = b"",
    head_only: bool = False,
) -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n" % (
        status,
        _REASONS[status],
        content_type,
        len(body),
        extra,
    )
    return head if head_only else head + body
