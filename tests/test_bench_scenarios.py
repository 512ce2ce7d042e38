"""storm bench scenarios: the paper's workloads as jobs, the summaries, and one tiny real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.tools import bench_scenarios as b
from storm.tools import scenario_chart as chart
from storm.tools import scenarios as s


def options(plan: s.JobPlan) -> dict[str, str]:
    args = list(plan.args)
    return dict(zip(args[::2], args[1::2], strict=True))


def test_alternating_nodes_are_the_ranks_of_odd_nodes() -> None:
    assert s.odd_node_ranks(2, 1) == "1"
    assert s.even_node_ranks(2, 1) == "0"
    assert s.odd_node_ranks(4, 2) == "2,3,6,7"
    assert s.even_node_ranks(4, 2) == "0,1,4,5"


def test_imbalanced_jobs_complement_each_other() -> None:
    job1, job2 = (options(j) for j in s.build("imbalanced", 10, 4, 1).jobs)
    assert (job1["--slow"], job2["--slow"]) == ("1,3", "0,2")
    assert job1["--imbalance"] == job2["--imbalance"] == "2.2"
    assert job1["--iterations"] == "10000" and job1["--granularity"] == "0.001"


def test_complementing_packs_three_lengths_of_work_on_every_pe() -> None:
    """Per PE, the sum over the jobs of (iterations x granularity x that PE's factor) is 3 lengths."""
    jobs = [options(j) for j in s.build("complementing", 5, 2, 1).jobs]
    assert [j["--pattern"] for j in jobs] == ["none", "none", "ring"]
    for rank in (0, 1):
        work = 0.0
        for job in jobs:
            slow = str(rank) in job["--slow"].split(",")
            factor = float(job["--imbalance"]) if slow else 1.0
            work += int(job["--iterations"]) * float(job["--granularity"]) * factor
        assert work == pytest.approx(15.0)


def test_mixed_is_the_imbalanced_pair_and_a_balanced_job() -> None:
    mixed = s.build("mixed", 10, 2, 1).jobs
    assert mixed[:2] == s.build("imbalanced", 10, 2, 1).jobs
    assert mixed[2] == s.build("balanced", 10, 2, 1).jobs[0]
    with pytest.raises(ValueError, match="unknown scenario 'x'"):
        s.build("x", 10, 2, 1)


def test_run_results_turnaround_response_best_and_median() -> None:
    run = s.run_result(submits=[100.0, 100.5], ends=[110.0, 130.0])
    assert run.completion == (10.0, 30.0) and run.response == (10.0, 29.5)
    assert (run.turnaround, run.mean_response) == (30.0, 19.75)
    runs = [s.RunResult((t,), (t,)) for t in (5.0, 3.0, 9.0, 4.0)]
    best, median = s.best_and_median(runs)
    assert (best.turnaround, median.turnaround) == (3.0, 5.0)  # of 3, 4, 5, 9: the worse middle one


def test_the_papers_figures_in_units_of_its_building_block() -> None:
    completion, turnaround, response = s.paper_normalised("imbalanced", "fcs")  # type: ignore[misc]
    assert completion == pytest.approx((197 / 60, 197 / 60))
    assert turnaround == pytest.approx(197 / 60) and response == pytest.approx(197 / 60)
    assert s.paper_normalised("alone", "fcs") is None


def test_summary_ratios_against_gang_and_the_best() -> None:
    runs = {
        "imbalanced": {
            "gang": [s.RunResult((40.0, 40.0), (40.0, 40.0))],
            "fcs": [s.RunResult((30.0, 32.0), (30.0, 32.0)), s.RunResult((35.0, 36.0), (35.0, 36.0))],
        }
    }
    rows = b.summarise(runs, unit=10.0)["imbalanced"]
    assert rows["fcs"]["turnaround_over_gang"] == pytest.approx(32 / 40)
    assert rows["fcs"]["turnaround_over_best"] == 1.0 and rows["gang"]["turnaround_over_best"] == 1.25
    assert rows["fcs"]["best_in_units"]["completion"] == [3.0, 3.2]
    assert rows["fcs"]["paper_in_units"]["turnaround"] == pytest.approx(197 / 60)
    text = b.markdown({"parameters": {"length": 1, "nodes": 2, "pes_per_node": 1, "slice_ms": 100,
                                      "repeats": 2}, "unit": 10.0, "summary": {"imbalanced": rows},
                       "jobs": {"imbalanced": [{}, {}]}})  # fmt: skip
    assert "| fcs | 30.0 (35.0) | 32.0 (36.0) | 32.0 (36.0) | 31.0 (35.5) | 0.800 |" in text


def chart_summary() -> dict[str, object]:
    runs = {
        "imbalanced": {
            "gang": [s.RunResult((40.0, 40.0), (40.0, 40.0))],
            "fcs@f_priority=always": [s.RunResult((30.0, 32.0), (30.0, 32.0))],
        },
        "alone": {"gang": [s.RunResult((10.0,), (10.0,))], "fcs": [s.RunResult((11.0,), (11.0,))]},
        "balanced": {"fcs": [s.RunResult((20.0, 20.0), (20.0, 20.0))]},  # no gang run: no bars
    }
    return b.summarise(runs, unit=10.0)


def test_chart_bars_are_ratios_to_gang_beside_the_papers() -> None:
    turnaround = {(bar.scenario, bar.policy): bar for bar in chart.bars(chart_summary(), "turnaround")}
    assert set(turnaround) == {("imbalanced", "gang"), ("imbalanced", "fcs@f_priority=always"),
                               ("alone", "gang"), ("alone", "fcs")}  # fmt: skip
    variant = turnaround["imbalanced", "fcs@f_priority=always"]
    assert variant.ours == pytest.approx(32 / 40) and variant.paper == pytest.approx(197 / 245)
    assert turnaround["alone", "fcs"] == chart.Bar("alone", "fcs", pytest.approx(1.1), None)  # type: ignore[arg-type]
    (response,) = [
        bar for bar in chart.bars(chart_summary(), "mean_response") if bar.policy.startswith("fcs@")
    ]
    assert response.ours == pytest.approx(31 / 40) and response.paper == pytest.approx(197 / 244.5)


@pytest.fixture(scope="module")
def matplotlib_loaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """matplotlib keeps its font files open for the life of the process once it has drawn a chart: a cache
    (drawing again opens nothing), which the per-test leak check would otherwise count against the test."""
    chart.draw(chart_summary(), tmp_path_factory.mktemp("warm") / "warm.png", "warm")


@pytest.mark.usefixtures("matplotlib_loaded")
def test_the_chart_is_a_png(tmp_path: Path) -> None:
    png = tmp_path / "charts" / "scenarios.png"
    chart.draw(chart_summary(), png, "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_bad_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        b.main(["--scenarios", "balanced,lottery"])
    assert info.value.code == 2 and "unknown lottery" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("matplotlib_loaded")
def test_a_tiny_run_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, md, png = tmp_path / "scenarios.json", tmp_path / "scenarios.md", tmp_path / "scenarios.png"
    argv = ["--scenarios", "alone,imbalanced", "--policies", "gang,fcs", "--repeats", "1", "--length", "0.3"]
    assert b.main([*argv, "--json", str(out), "--markdown", str(md), "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    result = json.loads(out.read_text())
    assert 0.2 < result["unit"] < 5
    for scenario, jobs in (("alone", 1), ("imbalanced", 2)):
        for policy in ("gang", "fcs"):
            (run,) = result["runs"][scenario][policy]
            assert len(run["completion"]) == jobs and all(0 < c < 30 for c in run["completion"])
    assert result["summary"]["imbalanced"]["gang"]["turnaround_over_gang"] == 1.0
    assert "### imbalanced" in md.read_text() and "| fcs |" in capsys.readouterr().out
