"""storm sim's workloads: SWF read and written, the rules that turn records into jobs, load scaling, the
Lublin-Feitelson model (loosely, statistically) and the command line end to end."""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

import pytest

from storm.tools.sim import cli
from storm.tools.sim.lublin import gamma_cdf, generate
from storm.tools.sim.swf import (
    SwfError,
    SwfRecord,
    SwfTrace,
    machine_from_header,
    parse_swf,
    scale_load,
    to_workload,
    write_swf,
)

TEXT = """; Version: 2.2
; Computer: test
; MaxNodes: 8
; MaxProcs: 16
;
    1        0     3   100   4  90.5 -1   4   200  -1  1  7  2  3  1  1 -1 -1
    2       10     0    50   2  -1   -1   2    -1  -1  1  8  2  3  1  1  1  5
    3       20    -1    -1   2  -1   -1   2   100  -1  5  7  2  3  1  1 -1 -1
    4       30    -1    10  -1  -1   -1  -1   100  -1  1  7  2  3  1  1 -1 -1
    5       35    -1    10  -1  -1   -1   4   100  -1  1  7  2  3  1  1 -1 -1
    6       40    -1    10  32  -1   -1  32   100  -1  1  7  2  3  1  1 -1 -1
"""


def dump(trace: SwfTrace) -> str:
    stream = io.StringIO()
    write_swf(trace, stream)
    return stream.getvalue()


def test_round_trip_keeps_every_field_and_the_header() -> None:
    trace = parse_swf(TEXT.splitlines())
    assert trace.records[0].cpu == 90.5 and trace.records[1].think == 5 and trace.records[1].preceding == 1
    assert trace.header[:2] == ["; Version: 2.2", "; Computer: test"]
    once = dump(trace)
    again = parse_swf(once.splitlines())
    assert again == trace
    assert dump(again) == once
    assert len(once.splitlines()[-1].split()) == 18


def test_bad_records_are_refused_with_their_line() -> None:
    with pytest.raises(SwfError, match=":2:"):
        parse_swf(["; x", "1 0 x"])
    with pytest.raises(SwfError, match="19 fields"):
        parse_swf([" ".join(["1"] * 19)])


def test_the_rules_from_records_to_jobs() -> None:
    trace = parse_swf(TEXT.splitlines())
    assert machine_from_header(trace) == (8, 2)
    workload = to_workload(trace.records, 16, "x2")
    assert workload.dropped == {"procs<=0": 1, "runtime<=0": 1, "wider than machine": 1}
    assert [j.number for j in workload.jobs] == [1, 2, 5]
    first, second, fifth = workload.jobs
    assert first.limit == 200 and not first.estimated
    assert second.limit == 100 and second.estimated  # no requested time: 2 x its runtime of 50
    assert fifth.procs == 4  # requested processors stand in for the allocated ones
    assert workload.estimated == 1 and workload.over_limit == 0
    assert [j.submit for j in workload.jobs] == [0, 10, 35]


def test_load_scaling_both_ways() -> None:
    records = [SwfRecord(job=i, submit=100 * i, runtime=50, procs=2) for i in range(1, 11)]
    base = to_workload(records, 4)
    assert base.offered_load(4) == pytest.approx(10 * 50 * 2 / (4 * 900))
    compressed = scale_load(base, arrival_factor=2)
    assert [j.submit for j in compressed.jobs] == [j.submit / 2 for j in base.jobs]
    assert compressed.offered_load(4) == pytest.approx(2 * base.offered_load(4))
    stretched = scale_load(base, runtime_factor=1.5)
    assert all(s.runtime == 75 and s.limit == 75 for s in stretched.jobs)
    assert stretched.offered_load(4) == pytest.approx(1.5 * base.offered_load(4))
    both = scale_load(compressed, runtime_factor=1.5)
    assert (both.arrival_factor, both.runtime_factor) == (2, 1.5)
    with pytest.raises(ValueError):
        scale_load(base, arrival_factor=0)


# ---------------------------------------------------------------------------------------------- the model


def test_gamma_cdf_against_known_values() -> None:
    assert gamma_cdf(1.0, 1.0, 1.0) == pytest.approx(1 - math.exp(-1))  # exponential
    assert gamma_cdf(2.0, 2.0, 1.0) == pytest.approx(1 - 3 * math.exp(-2))  # Erlang 2
    assert gamma_cdf(0.0, 3.0, 2.0) == 0.0


@pytest.mark.parametrize(
    ("mix", "serial", "log_runtime"),
    [("typed", (0.13, 0.23), (3.3, 4.4)), ("whole", (0.21, 0.28), (5.3, 6.0))],
)
def test_lublin_looks_like_its_parameters(
    mix: str, serial: tuple[float, float], log_runtime: tuple[float, float]
) -> None:
    """Loose bounds around what the published parameters give (typed: about 3/4 interactive jobs, short;
    whole: the fit to all jobs, as shared/traces/lublin-256.swf)."""
    records = generate(4000, 128, seed=11, mix=mix).records
    sizes = [r.procs for r in records]
    assert serial[0] < sum(s == 1 for s in sizes) / len(sizes) < serial[1]
    parallel = [s for s in sizes if s > 1]
    assert 0.55 < sum(s & (s - 1) == 0 for s in parallel) / len(sizes) < 0.75
    assert max(sizes) <= 128
    assert log_runtime[0] < statistics.fmean(math.log(r.runtime) for r in records) < log_runtime[1]
    assert all(r.runtime <= math.exp(12) for r in records)
    submits = [r.submit for r in records]
    assert submits == sorted(submits)
    assert generate(50, 128, seed=11, mix=mix) == generate(50, 128, seed=11, mix=mix)
    assert generate(50, 128, seed=11, mix=mix) != generate(50, 128, seed=12, mix=mix)


# ---------------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def matplotlib_loaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """matplotlib keeps its font files open for the life of the process once it has drawn a chart (a cache,
    not a leak): draw one before the leak check starts counting."""
    from storm.tools.sim import sweep
    from storm.tools.sim.report import plot_run

    warm = tmp_path_factory.mktemp("warm")
    plot_run([], warm / "run.png", "warm")
    summary = {"mean_bsld": 200.0, "mean_wait": 1.0, "utilization": 0.5, "loss_of_capacity": 0.1}
    point = {"policy": "easy", "target_load": 1.0, "offered_load": 1.0, "summary": summary}
    sweep.plot([point], warm / "sweep.png", "warm")


@pytest.mark.usefixtures("matplotlib_loaded")
def test_generate_then_run_with_every_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "l.swf"
    assert cli.main(["generate", "--jobs", "200", "--nodes", "32", "--seed", "2", "-o", str(trace)]) == 0
    out = tmp_path / "r"
    args = ["run", str(trace), "--nodes", "4", "--pes-per-node", "8", "--compress", "3", "--estimate", "x2"]
    args += ["--json", f"{out}.json", "--csv", f"{out}.csv", "--png", f"{out}.png"]
    assert cli.main(args) == 0
    table = capsys.readouterr().out
    assert "| easy |" in table and "bounded slowdown threshold 10 s" in table
    data = json.loads(Path(f"{out}.json").read_text())
    m = data["manifest"]
    assert m["seed"] == 0 and len(m["trace_sha256"]) == 64 and m["load_factors"]["arrival_compression"] == 3
    assert m["estimate_rule"].startswith("x2") and m["bsld_threshold_s"] == 10
    assert data["summary"]["jobs"] == len(data["jobs"]) == 200 - sum(m["dropped"].values())
    assert 0 <= data["summary"]["loss_of_capacity"] <= 1 and 0 < data["summary"]["utilization"] <= 1
    assert len(Path(f"{out}.csv").read_text().splitlines()) == 201
    assert Path(f"{out}.png").stat().st_size > 0


@pytest.mark.usefixtures("matplotlib_loaded")
def test_sweep_draws_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "l.swf"
    cli.main(["generate", "--jobs", "150", "--nodes", "16", "--seed", "4", "-o", str(trace)])
    args = ["sweep", str(trace), "--policies", "easy", "--loads", "0.5,2", "--workers", "1"]
    args += ["--json", str(tmp_path / "s.json"), "--png", str(tmp_path / "s.png")]
    assert cli.main(args) == 0
    assert "easy saturates" in capsys.readouterr().out
    data = json.loads((tmp_path / "s.json").read_text())
    loads = [pt["offered_load"] for pt in data["curves"]["easy"]]
    assert loads == pytest.approx([0.5, 2])
    assert data["curves"]["easy"][0]["mean_wait"] < data["curves"]["easy"][1]["mean_wait"]


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.swf").write_text("1 0 -1 10 1\n")
    assert cli.main(["run", str(tmp_path / "t.swf")]) == 2
    assert "MaxNodes" in capsys.readouterr().err
    assert cli.main(["run", str(tmp_path / "t.swf"), "--nodes", "1", "--estimate", "x0.5"]) == 2


def test_the_trace_may_be_named_with_trace_and_must_be_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text("1 0 -1 10 1\n2 5 -1 10 2\n")
    assert cli.main(["run", "--trace", str(trace), "--nodes", "2", "--policy", "fcfs"]) == 0
    assert "| fcfs |" in capsys.readouterr().out
    assert cli.main(["run", "--nodes", "2"]) == 2
    assert "no trace" in capsys.readouterr().err
    assert cli.main(["run", str(trace), "--trace", str(tmp_path / "other.swf"), "--nodes", "2"]) == 2
    assert "two traces given" in capsys.readouterr().err
