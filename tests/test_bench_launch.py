"""storm bench launch's throughput measurement (what `storm bench scale` calls), run small: its figures
are there and add up, and the cluster it made leaves nothing behind (its job directories in memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storm.tools import bench_launch
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


def test_storm_bench_scale_judges_the_median_of_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aggregation alone (each run is the stream measured above): the median against the goal, the
    slowest and fastest run beside it, each run on a cluster directory of its own."""
    rates = iter([480.0, 530.0, 510.0, 460.0, 520.0])
    seen: list[Path] = []

    def stream(jobs: int, nodes: int, directory: Path) -> dict[str, object]:
        assert (jobs, nodes) == (1000, 2) and directory.is_dir() and directory not in seen
        seen.append(directory)
        return {"jobs_per_second": next(rates)}

    monkeypatch.setattr(bench_launch, "measure_throughput", stream)
    rows = {row.name: row for row in bench_launch.scale_figures(tmp_path, quick=False)}
    median = rows["1-rank `true` jobs end to end, 2 NMs (median of 5 runs)"]
    assert (median.value, median.goal, median.met) == (510.0, ">= 500", True)
    assert (rows["  slowest run"].value, rows["  fastest run"].value) == (460.0, 530.0)
    assert len(seen) == bench_launch.SCALE_RUNS == 5
