"""storm bench metrics, on a small core: it runs, reads what it built, and writes every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.tools import bench_metrics


def test_it_times_a_scrape_of_a_busy_core_and_the_nodes_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "metrics.json"
    assert bench_metrics.main(["--nodes", "8", "--queued", "50", "--repeats", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["nodes"], result["pes"], result["queued"], result["running"]) == (8, 32, 50, 32)
    assert result["node_status_with_timings_bytes"] > result["node_status_bytes"] > 0
    assert result["scrape_bytes"] > 1000
    for key in ("snapshot_ms", "scrape_ms", "report_us", "report_with_timings_us", "node_heartbeat_us"):
        assert result[key] > 0, key
    printed = capsys.readouterr().out
    assert "32 running, 50 queued" in printed and f"raw figures: {out}" in printed


def test_the_busy_core_is_what_it_says() -> None:
    core = bench_metrics.busy_core(nodes=2, queued=3)
    assert len(core.runs.active) == 8 and len(core.runs.pending) == 3
    assert all(job.state == "RUNNING" for job in core.runs.active.values())
    assert (
        sum(len(ranks) for reports in core.runs.reports.live.values() for _, ranks, _ in reports.values())
        == 8
    )
