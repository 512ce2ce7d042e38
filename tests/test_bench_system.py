"""storm bench system: headline figures from each part's raw result, reuse of saved parts, a quick run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.tools import bench_system as b


def stats(median: float, p99: float) -> dict[str, float]:
    return {"count": 10, "median": median, "p99": p99, "max": p99}


def gang_result(spread_p99_at_8: float, gang_over_batch: float) -> dict[str, object]:
    cpu = {"mm": 0.5, "nm_mean": 0.7, "nm_max": 0.9, "by_daemon": {}}
    return {
        "heartbeats": [
            {"nms": n, "load": load, "lost": 0, "latency_ms": stats(0.5, 1.0), "cpu": cpu,
             "spread_ms": stats(0.1, spread_p99_at_8 if n == 8 else 0.4)}
            for n in (2, 8) for load in ("idle", "busy")
        ],
        "switching": {"nm_done_minus_received_ms": stats(2.5, 3.6), "mm_done_minus_sent_ms": stats(3.0, 5.6)},
        "overhead_cpu_percent": {"batch_idle": cpu, "gang_switching": cpu},
        "compute_alone": {"gang_over_batch": gang_over_batch},
    }  # fmt: skip


def test_gang_figures_judge_the_goals_of_the_gang_issue() -> None:
    figures = {f.name: f for f in b.gang_figures(gang_result(spread_p99_at_8=20.0, gang_over_batch=1.01))}
    spread = figures["heartbeat to 8 NMs: spread, p99"]
    assert (spread.value, spread.goal, spread.met) == (20.0, "< 1 ms at 8 NMs", False)
    assert figures["heartbeat to 2 NMs: spread, p99"].met is None  # the goal is set at 8 NMs only
    assert figures["compute-bound job alone, gang / batch"].met is True
    assert figures["switch enacted (NM view), p99"].value == 3.6
    assert figures["NM CPU, gang switching (mean of 2)"].value == 0.7
    # Only the idle rows are headlines: the busy ones stay in the raw figures.
    assert sum("heartbeat to 2 NMs: latency" in name for name in figures) == 1
    met = {f.name: f.met for f in b.gang_figures(gang_result(spread_p99_at_8=0.8, gang_over_batch=1.2))}
    assert (
        met["heartbeat to 8 NMs: spread, p99"] is True
        and met["compute-bound job alone, gang / batch"] is False
    )


def test_markdown_says_which_goals_are_missed_and_where_figures_came_from() -> None:
    figures = b.gang_figures(gang_result(spread_p99_at_8=20.0, gang_over_batch=1.01))
    text = b.markdown(figures, {"gang": "from results/gang.json"})
    assert "| gang | heartbeat to 8 NMs: spread, p99 | 20 ms | < 1 ms at 8 NMs: missed |" in text
    assert "| gang | compute-bound job alone, gang / batch | 1.010x | <= 1.05: met |" in text
    assert text.endswith("Sources: gang from results/gang.json.")


def test_unknown_parts_and_broken_saved_results_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        b.main(["--parts", "gang,mpi"])
    assert info.value.code == 2 and "unknown part(s) mpi" in capsys.readouterr().err
    (tmp_path / "gang.json").write_text("{not json")
    with pytest.raises(SystemExit):
        b.main(["--parts", "gang", "--reuse", str(tmp_path)])
    assert "gang.json: not JSON" in capsys.readouterr().err
    (tmp_path / "gang.json").write_text(json.dumps({"heartbeats": []}))
    with pytest.raises(SystemExit):
        b.main(["--parts", "gang", "--reuse", str(tmp_path)])
    assert "lacks a figure" in capsys.readouterr().err


@pytest.mark.slow
def test_a_quick_launch_run_and_a_reused_gang_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gang.json").write_text(json.dumps(gang_result(spread_p99_at_8=0.5, gang_over_batch=1.0)))
    out, md = tmp_path / "system.json", tmp_path / "system.md"
    argv = [
        "--quick",
        "--parts",
        "gang,launch",
        "--reuse",
        str(tmp_path),
        "--json",
        str(out),
        "--markdown",
        str(md),
    ]
    assert b.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["sources"] == {
        "gang": f"from {tmp_path / 'gang.json'}",
        "launch": "measured in this run (--quick)",
    }
    launch = {f["name"]: f["value"] for f in result["headline"] if f["part"] == "launch"}
    assert 0 < launch["2-rank hello, submit to done, median"] < 10
    assert 0 < launch["2-rank hello, mpiexec, median"] < 10
    assert launch["throughput, 50 one-rank jobs"] > 1
    assert len(result["raw"]["launch"]["hello_2_ranks_seconds"]["mpiexec"]) == 3
    assert "| launch | submit to done / mpiexec |" in md.read_text()
    assert "2-rank mpi4py hello" in capsys.readouterr().out  # the part's own table is printed too
