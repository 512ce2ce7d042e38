"""End to end: storm-mm's Prometheus endpoint on a throwaway cluster, scraped over HTTP and read with
Prometheus's own parser, against what `storm queue --json`, `storm nodes --json`, `storm classes --json`
and the store say; and every metric the Grafana dashboard queries, in a real scrape."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import urllib.request
from collections import Counter
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll, python_app, storm_cli

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).parent.parent / "tools" / "grafana" / "storm-dashboard.json"
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(cluster: LocalCluster) -> Samples:
    """GET /metrics, parsed by prometheus_client's parser: sample name -> sorted labels -> value."""
    with urllib.request.urlopen(f"http://{cluster.metrics_endpoint}/metrics", timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def cli_json(cluster: LocalCluster, *args: str) -> Any:
    result = storm_cli(cluster, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def queue_counts(jobs: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """storm queue --json by (state, reason) as the README says the labels are: SUSPENDED for a running
    job preemption holds; a queued job's reason is the first word of its REASON, capitalized; None else."""
    counted: Counter[tuple[str, str]] = Counter()
    for job in jobs:
        state = "SUSPENDED" if job["state"] == "RUNNING" and job["suspended_by"] is not None else job["state"]
        word = re.match(r"\w+", job["reason"]) if job["state"] == "PENDING" else None
        counted[state, "None" if word is None else word[0][0].upper() + word[0][1:]] += 1
    return counted


def scraped_queue(samples: Samples) -> Counter[tuple[str, str]]:
    found = {(dict(k)["state"], dict(k)["reason"]): int(v) for k, v in samples["storm_queue_jobs"].items()}
    return Counter({k: v for k, v in found.items() if v})


def by_label(samples: Samples, name: str, label: str) -> dict[str, int]:
    return {dict(k)[label]: int(v) for k, v in samples[name].items()}


def at_one_moment(cluster: LocalCluster) -> tuple[Samples, list[dict[str, Any]], list[dict[str, Any]]]:
    """A scrape between two identical listings of the queue and the nodes: nothing changed meanwhile."""
    found: list[tuple[Samples, list[dict[str, Any]], list[dict[str, Any]]]] = []

    def listings() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        nodes = cli_json(cluster, "nodes")
        for node in nodes:
            del node["last_seen"]  # each node's report moves it, and only it
        return cli_json(cluster, "queue"), nodes

    def still() -> bool:
        before = listings()
        samples = scrape(cluster)
        after = listings()
        if before != after:
            return False
        found.append((samples, *after))
        return True

    poll(still, 30, "the queue and the nodes to hold still across a scrape")
    return found[-1]


def test_a_scrape_agrees_with_storm_queue_nodes_and_the_store(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=2, pes_per_node=1, mm_metrics_endpoint="127.0.0.1:0")
    assert re.fullmatch(r"127\.0\.0\.1:[1-9][0-9]*", cluster.metrics_endpoint), cluster.metrics_endpoint
    with cluster.client() as client:
        long = client.submit(["sleep", "600"], 2, cwd=str(tmp_path))
        queued = [
            client.submit(["true"], 2, cwd=str(tmp_path)),
            client.submit(["false"], 1, cwd=str(tmp_path)),
            client.submit(["true"], 1, cwd=str(tmp_path)),
            client.submit(["true"], 1, cwd=str(tmp_path)),
        ]
        # Held still: the long job holds every PE and the rest wait behind it, each with its reason.
        poll(
            lambda: client.job(long).state == "RUNNING" and all(client.job(j).reason for j in queued),
            30,
            "the long job to run and the queue to have its reasons",
        )
        samples, queue, nodes = at_one_moment(cluster)
        assert scraped_queue(samples) == queue_counts(queue)
        assert scraped_queue(samples)["PENDING", "Resources"] == 1
        assert scraped_queue(samples)["PENDING", "Priority"] == 3
        assert by_label(samples, "storm_nodes", "state") == {"UP": 2, "DOWN": 0}
        assert Counter(n["state"] for n in nodes) == Counter({"UP": 2})
        assert samples["storm_node_pes_used"][()] == sum(n["pes_used"] for n in nodes) == 2
        assert by_label(samples, "storm_node_pes", "state")["UP"] == sum(n["pes"] for n in nodes)
        assert samples["storm_jobs_started_total"][()] == 1
        assert samples["storm_scheduling_pass_seconds_count"][()] >= 1
        assert samples["storm_mm_info"] == {(("policy", "batch"), ("version", version("storm-fcs"))): 1}

        client.cancel([queued[3]])  # cancelled while it waits: ends without starting
        client.cancel([long])
        ended = [client.wait(j, timeout=JOB_TIMEOUT) for j in (long, *queued)]
    assert sorted(j.state for j in ended) == ["CANCELLED", "CANCELLED", "COMPLETED", "COMPLETED", "FAILED"]
    poll(lambda: not cli_json(cluster, "queue"), 30, "the queue to empty")
    samples = scrape(cluster)
    with contextlib.closing(
        sqlite3.connect(f"file:{cluster.dir / 'mm' / 'storm.db'}?mode=ro", uri=True)
    ) as db:
        stored = dict(db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
        started = db.execute("SELECT COUNT(*) FROM jobs WHERE start_time IS NOT NULL").fetchone()[0]
    ended_total = {k: v for k, v in by_label(samples, "storm_jobs_ended_total", "state").items() if v}
    assert ended_total == stored == {"CANCELLED": 2, "COMPLETED": 2, "FAILED": 1}
    assert samples["storm_jobs_started_total"][()] == started == 4
    assert scraped_queue(samples) == Counter()
    assert samples["storm_node_pes_used"][()] == 0


def test_fcs_classes_and_time_slice_timings_reach_the_scrape_and_the_dashboard_finds_its_metrics(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(
        nodes=2, pes_per_node=1, policy="fcs", mm_mpl=2, fcs_cslots_min=5, mm_metrics_endpoint="127.0.0.1:0"
    )
    env = {**os.environ, "STORM_TEST_DIR": str(tmp_path)}
    bsp = [python_app("bsp", "--granularity", g, "--seconds", "20") for g in ("1ms", "2s")]
    with cluster.client() as client:
        jobs = [client.submit(argv, 2, cwd=str(tmp_path), env=env) for argv in bsp]
        seen: list[object] = []

        def classes_agree() -> bool:
            listed = Counter(r["klass"] for r in cli_json(cluster, "classes"))
            samples = scrape(cluster)
            again = Counter(r["klass"] for r in cli_json(cluster, "classes"))
            scraped = {k: v for k, v in by_label(samples, "storm_processes", "class").items() if v}
            seen[:] = [listed, scraped]
            return (
                listed == again == Counter(scraped) and scraped.get("DC") == 2 and sum(scraped.values()) == 4
            )

        poll(classes_agree, 60, f"the coarse job's ranks to be DC in the scrape and storm classes ({seen})")

        def timed() -> bool:
            samples = scrape(cluster)
            counts = [
                samples[f"storm_{name}_seconds_count"][()]
                for name in ("heartbeat_delivery", "switch_lateness", "switch_duration")
            ]
            seen[:] = counts
            return all(c > 0 for c in counts)

        poll(timed, 30, f"the nodes' heartbeat and switch timings in a scrape ({seen})")
        samples = scrape(cluster)
        for job in jobs:
            client.cancel([job])
        for job in jobs:
            client.wait(job, timeout=JOB_TIMEOUT)
    delivered = samples["storm_heartbeat_delivery_seconds_count"][()]
    assert 0 < delivered <= 2 * samples["storm_heartbeats_sent_total"][()]  # two nodes, each heartbeat once
    assert (
        samples["storm_switch_lateness_seconds_bucket"][(("le", "+Inf"),)]
        == samples["storm_switch_lateness_seconds_count"][()]
    )
    # Every metric and label the dashboard asks for is in the scrape.
    names, labels = set(samples), {name for series in samples.values() for key in series for name, _ in key}
    for expr in dashboard_exprs():
        for metric in re.findall(r"\bstorm_[a-z0-9_]+", expr):
            assert metric in names, f"{metric} (in {expr}) is not in a scrape"
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                assert label in labels, f"label {label} (in {expr}) is in no series"


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", ())]
    variables = [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) >= 20 and variables
    return exprs + variables
