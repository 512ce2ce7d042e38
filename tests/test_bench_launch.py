"""storm bench launch's throughput measurement (what `storm bench scale` calls), run small: its figures
are there and add up, and the cluster it made leaves nothing behind (its job directories in memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storm.tools.bench_launch import measure_throughput

pytestmark = pytest.mark.slow


def test_a_small_stream_is_measured_and_broken_down(tmp_path: Path) -> None:
    result = measure_throughput(20, 2, window=8, warmup=4, directory=tmp_path)
    assert (result["jobs"], result["nodes"], result["pes_per_node"]) == (20, 2, 1)
    rate, seconds = result["jobs_per_second"], result["seconds"]
    assert isinstance(rate, float) and isinstance(seconds, float) and rate == pytest.approx(20 / seconds)
    cpu = result["cpu_ms_per_job"]
    assert isinstance(cpu, dict) and set(cpu) == {"mm", "nm", "nm_children", "client"}
    assert all(value >= 0 for value in cpu.values()) and cpu["mm"] > 0
    assert result["cpu_ms_per_job_total"] == pytest.approx(sum(cpu.values()))
    ran = result["ran_ms"]
    assert isinstance(ran, dict) and 0 < ran["median"] <= ran["p99"]
    # local down removed the node managers' job directories, which live in memory.
    for node in ("node0", "node1"):
        assert not (tmp_path / "cluster" / "nodes" / node / "jobs").is_symlink()
