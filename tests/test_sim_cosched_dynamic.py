"""``storm sim dynamic``: the FCS paper's dynamic workload (tools/sim/cosched/dynamic*.py), the driver's
kept heartbeats (cluster.py), and the fast Program.dedicated_ns. Small workloads only: fast, no traces."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from storm.mm.protocol import FcsParameters
from storm.tools.sim import cli
from storm.tools.sim.cosched import dynamic_cli, dynamic_report, dynamic_seeds, dynamic_sweep
from storm.tools.sim.cosched.cluster import NS, CoschedCluster, SimJob
from storm.tools.sim.cosched.dynamic import Draws, fit_size, from_lublin, from_trace, program_for
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.cosched.scenarios import Calibration
from storm.tools.sim.metrics import bounded_slowdown
from storm.tools.sim.swf import SwfRecord

MS = 1_000_000
TINY = dynamic_sweep.Setup(count=12, seed=5, span_s=40.0, nodes=2, pes_per_node=2)


def naive_dedicated(program: Program) -> int:
    """The leave-time recurrence, every iteration (what dedicated_ns extrapolates)."""
    leave = [0] * program.ranks
    for _ in range(program.iterations):
        enter = [leave[r] + program.compute_ns[r] for r in range(program.ranks)]
        if not program.communicates:
            leave = enter
            continue
        leave = [
            max([enter[r]] + [enter[p] + program.latency_ns for p in program.partners(r)])
            for r in range(program.ranks)
        ]
    return max(leave)


def test_dedicated_ns_extrapolates_exactly() -> None:
    rng = random.Random(7)
    for _ in range(600):
        ranks = rng.randint(1, 7)
        compute = tuple(rng.choice((0, rng.randint(0, 90))) for _ in range(ranks))
        program = Program(compute, rng.randint(1, 30), rng.choice(list(Pattern)), rng.randint(0, 60))
        assert program.dedicated_ns() == naive_dedicated(program), program


def test_lublin_workload_fits_the_machine_and_offers_what_it_says() -> None:
    w = from_lublin(300, 16, 2, seed=4)
    assert len(w.jobs) == 300 and w.pes == 32
    assert all(1 <= j.size <= 32 for j in w.jobs)
    assert min(j.arrival_s for j in w.jobs) == 0.0
    # The paper's definition, by hand: sum(isolated runtime x size) / (PEs x last arrival).
    work = sum(j.program.dedicated_ns() / NS * j.program.ranks for j in w.jobs)
    assert w.offered_load() == pytest.approx(work / (32 * max(j.arrival_s for j in w.jobs)))
    # The runtimes are scaled for 80% load over the reference span (up to the programs' rounding).
    assert w.last_arrival_s == pytest.approx(7200.0, rel=1e-9)
    assert w.offered_load() == pytest.approx(0.8, rel=0.01)
    for load in (0.5, 0.9):
        jobs = w.at_load(load)
        span = max(j.submit_ns for j in jobs) / NS
        assert work / (32 * span) == pytest.approx(load, rel=1e-6)
        # Only the arrivals move: the programs and the limits stay.
        assert [j.program for j in jobs] == [j.program for j in w.jobs]
    for job, sim in zip(w.jobs, w.at_load(0.7), strict=True):
        assert sim.time_limit == math.ceil(job.isolated_s) >= job.isolated_s
        assert job.isolated_ns == job.program.dedicated_ns()


def test_the_draws_are_per_seed_and_look_as_asked() -> None:
    a, b, c = from_lublin(400, seed=2), from_lublin(400, seed=2), from_lublin(400, seed=3)
    assert a == b and a != c
    multi = [j for j in a.jobs if j.size > 1]
    patterns = {j.program.pattern for j in multi}
    assert patterns == {Pattern.RING, Pattern.ALLREDUCE, Pattern.NONE}
    assert all(j.program.pattern is Pattern.NONE and not j.imbalanced for j in a.jobs if j.size == 1)
    share = sum(j.imbalanced for j in multi) / len(multi)
    assert 0.4 < share < 0.6
    for job in a.jobs:
        compute = job.program.compute_ns
        if job.imbalanced:  # the odd ranks compute twice the even ones'
            assert all(c == round(2 * compute[0]) for c in compute[1::2])
            assert set(compute[::2]) == {compute[0]}
        else:
            assert len(set(compute)) == 1
    # Log-uniform over 1 ms .. 1 s: a median near the geometric middle, 32 ms. Jobs shorter than their
    # draw have fewer, shorter iterations, so look at the long jobs only.
    long = [j.granularity_ns / MS for j in a.jobs if j.isolated_s > 10]
    assert min(long) >= 1 and max(long) <= 1000 and 8 < statistics.median(long) < 120


def test_a_program_runs_as_long_as_its_target() -> None:
    draws = Draws()
    for pattern in Pattern:
        for imbalanced in (False, True):
            for target, granularity in ((60 * NS, MS), (5 * NS, 300 * MS), (40 * MS, 900 * MS)):
                program = program_for(
                    8, target, granularity, pattern=pattern, imbalanced=imbalanced, draws=draws
                )
                slowest = max(program.compute_ns) + program.latency_ns
                assert abs(program.dedicated_ns() - target) <= slowest, (pattern, imbalanced, target)


def test_a_trace_is_fitted_to_the_machine() -> None:
    assert [fit_size(p, 32, 128, "scale") for p in (1, 4, 64, 128)] == [1, 1, 16, 32]
    assert [fit_size(p, 32, 128, "cap") for p in (1, 33, 128)] == [1, 32, 32]
    assert [fit_size(p, 32, 128, "drop") for p in (32, 33)] == [32, None]
    records = [SwfRecord(i + 1, 100.0 * i, runtime=50.0 + i, procs=[1, 64, 128, 8][i % 4]) for i in range(10)]
    records.append(SwfRecord(11, 5000.0, runtime=0, procs=4))  # never ran: left out, as storm sim does
    w = from_trace(records, 128, "t.swf", count=None, nodes=16, pes_per_node=2, sizes="drop")
    assert len(w.jobs) == 5 and all(j.size <= 32 for j in w.jobs)  # 1 and 8 only
    w = from_trace(records, 128, "t.swf", count=6, nodes=16, pes_per_node=2)
    assert [j.size for j in w.jobs] == [1, 16, 32, 2, 1, 16]
    assert w.offered_load() == pytest.approx(0.8, rel=0.01)


def as_before(cluster: CoschedCluster) -> CoschedCluster:
    """The driver as it was before it was made faster: every heartbeat to every node core, the model run
    one event instant at a time, and after each every running job caught up by ``completion_ns`` to see
    whether it ended."""
    cluster.defer_idle = False
    cluster.step_events = True

    def ended() -> list[int]:
        return [j for j in cluster.running if cluster.model.completion_ns(j) is not None]

    cluster._ended = ended  # type: ignore[method-assign]
    return cluster


def same_as_before(policy: str, jobs: list[SimJob], nodes: int = 3) -> None:
    results = []
    for before in (True, False):
        cluster = CoschedCluster(nodes, 1, policy, mpl=3, costs=Calibration().costs)
        if before:
            as_before(cluster)
        result = cluster.run(jobs)
        assert (cluster.kept > 0) == (not before and policy in ("gang", "fcs"))
        results.append(dataclasses.replace(result, wall_seconds=0.0))
    assert results[0] == results[1]


@pytest.mark.parametrize("policy", ["gang", "sb", "fcs"])
def test_the_faster_driver_runs_as_before(policy: str) -> None:
    # Nodes fall idle and get jobs again, in several rows; jobs alone on their PEs (the model's shortcut)
    # and jobs sharing them; classes under FCS, stops under gang.
    imbalanced = Program((MS, 2_200_000), 400, latency_ns=5_000)
    jobs = [
        SimJob("a", Program.balanced(1, 3 * MS, 300), 0),
        SimJob("b", imbalanced, 200 * MS, time_limit=2.0),
        SimJob("c", Program.balanced(3, MS, 700, latency_ns=5_000), 450 * MS),
        SimJob("d", Program.balanced(2, 20 * MS, 40, Pattern.ALLREDUCE), 2_350 * MS),
        SimJob("e", Program.balanced(1, 5 * MS, 100), 4_000 * MS),
    ]
    same_as_before(policy, jobs)


@pytest.mark.parametrize("policy", ["gang", "fcs"])
def test_a_job_ends_the_instant_its_program_does(policy: str) -> None:
    # Among them, jobs whose ranks all wait, stopped, for a message already in: the continue at the
    # next heartbeat ends such a job then, with no event of the model at that instant.
    w = from_lublin(40, 3, 1, seed=6, span_s=20.0)
    cluster = CoschedCluster(3, 1, policy, mpl=3, costs=Calibration().costs)
    result = cluster.run(w.at_load(1.2))
    assert all(round(j.end * NS) == cluster.model.completion_ns(j.mm_id) for j in result.jobs)


@pytest.mark.parametrize("policy", ["batch", "gang", "sb", "fcs"])
def test_the_horizon_never_passes_a_jobs_end(policy: str) -> None:
    w = from_lublin(24, 3, 1, seed=6, span_s=20.0)
    cluster = CoschedCluster(3, 1, policy, mpl=3, costs=Calibration().costs)
    seen: list[tuple[int, int, list[int]]] = []
    horizon = cluster._horizon

    def spy() -> int:
        seen.append((cluster.now_ns, horizon(), list(cluster.running)))
        return seen[-1][1]

    cluster._horizon = spy  # type: ignore[method-assign]
    result = cluster.run(w.at_load(1.2))
    ends = {j.mm_id: round(j.end * NS) for j in result.jobs}
    assert seen and all(ends[j] >= bound for _, bound, running in seen for j in running)
    # ... and it is of use: while jobs run it mostly lies ahead, so the model is run in longer steps.
    assert sum(bound > now for now, bound, running in seen if running) > len(seen) / 2


@pytest.mark.parametrize("policy", ["sb", "fcs"])
def test_the_faster_driver_runs_a_drawn_workload_as_before(policy: str) -> None:
    # Tens of thousands of model events: jobs sharing PEs in 1.5 ms slices, others alone on theirs.
    w = from_lublin(24, 3, 1, seed=5, span_s=20.0)
    same_as_before(policy, w.at_load(0.9))


def test_a_tiny_sweep_reports_what_the_cluster_measured(tmp_path: Path) -> None:
    policies, loads = list(dynamic_sweep.POLICIES), [0.6, 1.5]
    said: list[str] = []
    points = dynamic_sweep.run_sweep(TINY, policies, loads, tmp_path, say=said.append)
    assert [(p["policy"], p["target_load"]) for p in points] == [(p, x) for p in policies for x in loads]
    workload = TINY.workload()
    for point in points:
        # The same run again, straight through the cluster: the point's figures are its figures.
        cluster = CoschedCluster(
            2, 2, point["policy"], mpl=6, costs=Calibration().costs, seed=TINY.seed, profile=False
        )
        result = cluster.run(workload.at_load(point["target_load"]), limit_ns=10**6 * NS)
        isolated = {j.name: j.isolated_s for j in workload.jobs}
        responses = [j.response for j in result.jobs]
        summary = point["summary"]
        assert summary["jobs"] == 12
        assert summary["mean_response"] == pytest.approx(statistics.fmean(responses))
        assert summary["median_response"] == pytest.approx(statistics.median(responses))
        slowdowns = [bounded_slowdown(j.response, isolated[j.name]) for j in result.jobs]
        assert summary["mean_bsld"] == pytest.approx(statistics.fmean(slowdowns))
        busy = sum(c.busy_ns for c in result.pes)
        total = sum(c.busy_ns + c.spin_ns + c.switch_ns + c.idle_ns for c in result.pes)
        assert summary["cpu"]["computing"] == pytest.approx(busy / total)
        assert sum(summary["cpu"].values()) == pytest.approx(1.0)
        assert point["offered_load"] == pytest.approx(point["target_load"])
    # Contention at the higher load: time sharing shows in the CPU breakdown.
    gang = next(p for p in points if p["policy"] == "gang" and p["target_load"] == 1.5)
    assert gang["summary"]["cpu"]["switching"] > 0
    # Every point was written as it ended; run again, they are read back, not run.
    assert len(list((tmp_path / "points").glob("*.json"))) == 8
    again = dynamic_sweep.run_sweep(TINY, policies, loads, tmp_path, say=said.append)
    assert again == points and sum("read from" in line for line in said) == 8
    # Another setup does not reuse them.
    other = dataclasses.replace(TINY, seed=2)
    assert dynamic_sweep.read_point(dynamic_sweep.point_path(tmp_path, "fcs", 0.6), other, "fcs", 0.6) is None
    granularity = {j.name: j.granularity_ns for j in workload.jobs}
    report = dynamic_report.report(points, granularity)
    assert report["fig8"]["size"] == 6 and set(report["fig8"]["halves"]["shortest"]) == set(policies)
    # Per granularity band, at the highest load: each band's jobs' mean bounded slowdown, from the rows.
    bands = report["granularity"]["loads"]["1.5"]
    assert sum(bands["counts"]) == 12 and set(bands) == {"counts", *policies}
    fcs = next(p for p in points if p["policy"] == "fcs" and p["target_load"] == 1.5)
    coarse = [
        bounded_slowdown(end - submit, iso)
        for name, _, iso, submit, _, end in fcs["jobs"]
        if granularity[name] >= 100 * MS
    ]
    assert bands["counts"][2] == len(coarse)
    assert bands["fcs"]["mean_bsld"][2] == (pytest.approx(statistics.fmean(coarse)) if coarse else None)
    assert bands["fcs"]["class_changes"] == fcs["run"]["class_changes"]
    text = dynamic_report.markdown(report, "setup")
    assert "| FCS | 0.600 |" in text and "### Fig. 8" in text and "Against the paper" in text
    assert "### Mean bounded slowdown by granularity" in text and "At load 1.5:" in text


def line(pairs: list[tuple[float, float]], bsld: float = 1.0) -> list[dict[str, float]]:
    return [{"offered_load": o, "accepted_load": a, "mean_bsld": bsld} for o, a in pairs]


def test_saturation_is_where_the_accepted_load_stays_flat() -> None:
    tracking = [(0.5, 0.49), (0.6, 0.58), (0.7, 0.68), (0.8, 0.77), (0.9, 0.86)]
    assert dynamic_report.saturation(line(tracking)) is None
    assert dynamic_report.plateau(line(tracking)) is None
    flat = [(0.5, 0.49), (0.6, 0.58), (0.7, 0.68), (0.74, 0.71), (0.8, 0.715), (0.9, 0.72)]
    assert dynamic_report.saturation(line(flat)) == 0.74  # 0.71 to 0.72 from there on
    assert dynamic_report.plateau(line(flat)) == pytest.approx((0.71 + 0.715 + 0.72) / 3)
    # A flat step by chance, then climbing again: not saturated there, but where it stays flat.
    chance = [(0.5, 0.5), (0.6, 0.6), (0.7, 0.61), (0.8, 0.75), (0.9, 0.76), (1.0, 0.765)]
    assert dynamic_report.saturation(line(chance)) == 0.8
    # Flat only at the highest load swept: nothing after it shows it stays so.
    assert dynamic_report.saturation(line([(0.5, 0.5), (0.6, 0.6), (0.7, 0.6)])) == 0.6
    assert dynamic_report.saturation(line([(0.5, 0.5), (0.6, 0.6)])) is None
    # Exactly half the offered growth still tracks; a hair under does not.
    assert dynamic_report.saturation(line([(0.5, 0.5), (0.7, 0.6)])) is None
    assert dynamic_report.saturation(line([(0.5, 0.5), (0.7, 0.5999)])) == 0.5
    assert dynamic_report.bsld_saturation(line(tracking, 150.0)) == 0.5
    assert dynamic_report.bsld_saturation(line(tracking, 99.0)) is None


def test_the_mean_queue_counts_jobs_waiting_while_jobs_arrive() -> None:
    # name, size, isolated, submit, start, end: b waits 0-5, c waits 2-20 (past the last arrival, 10).
    rows = [("a", 1, 1.0, 0.0, 0.0, 1.0), ("b", 1, 1.0, 0.0, 5.0, 6.0), ("c", 1, 1.0, 2.0, 20.0, 21.0),
            ("d", 1, 1.0, 10.0, 10.0, 11.0)]  # fmt: skip
    assert dynamic_report.mean_queue(rows) == pytest.approx((2 * 1 + 3 * 2 + 5 * 1) / 10)
    # Placed as they come: no queue, even when one arrives as another leaves.
    placed = [("a", 1, 1.0, 0.0, 0.0, 3.0), ("b", 1, 1.0, 3.0, 3.0, 4.0), ("c", 1, 1.0, 4.0, 4.0, 5.0)]
    assert dynamic_report.mean_queue(placed) == 0
    # All submitted at once: no span to average over.
    assert dynamic_report.mean_queue([("a", 1, 1.0, 0.0, 1.0, 3.0), ("b", 1, 1.0, 0.0, 2.0, 4.0)]) == 0


def test_the_papers_claims_are_checked_where_they_fail() -> None:
    def curve(points: list[tuple[float, float, float]]) -> list[dict[str, float]]:
        return [
            {"target_load": o, "offered_load": o, "accepted_load": a, "mean_response": r, "mean_bsld": r,
             "median_bsld": r}
            for o, a, r in points
        ]  # fmt: skip

    batch = curve([(0.5, 0.5, 10.0), (0.7, 0.7, 20.0), (0.8, 0.71, 90.0)])  # saturates at 0.7
    fcs = curve([(0.5, 0.5, 12.0), (0.7, 0.7, 15.0), (0.8, 0.8, 30.0)])  # never; worse than batch at 0.5
    found = {c["claim"]: c for c in dynamic_report.claims({"batch": batch, "fcs": fcs}, None)}
    later = found["FCS saturates later than FCFS+EASY"]
    assert later["agrees"] is True and later["model"] == "FCFS+EASY 0.700, FCS above the loads swept"
    lowest = found["FCS has the lowest mean response"]
    assert lowest["agrees"] is False and lowest["model"] == "not at load 0.5"
    median = found["FCFS+EASY has the lowest median bounded slowdown"]
    assert median["agrees"] is False and median["model"] == "not at load 0.7, 0.8"


def test_fcs_against_gang_and_sb_at_high_load() -> None:
    def curve(bslds: list[float]) -> list[dict[str, float]]:
        return [
            {"target_load": o, "offered_load": o, "accepted_load": o, "mean_response": b, "mean_bsld": b,
             "median_bsld": 1.0}
            for o, b in zip((0.5, 0.8, 0.9), bslds, strict=True)
        ]  # fmt: skip

    def verdict(fcs: list[float]) -> tuple[bool | None, str]:
        drawn = {"fcs": curve(fcs), "gang": curve([1.0, 2.0, 3.0]), "sb": curve([1.0, 1.5, 2.5])}
        found = {c["claim"]: c for c in dynamic_report.claims(drawn, None)}
        claim = found["FCS at or below gang and SB in mean bounded slowdown at high load"]
        return claim["agrees"], claim["model"]

    assert verdict([9.0, 1.5, 2.5]) == (True, "at every load")  # worse at 0.5 is not high load
    assert verdict([1.0, 1.6, 2.0]) == (False, "not at load 0.8")


def test_quantiles_interpolate() -> None:
    assert dynamic_report.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert dynamic_report.quantile([1.0, 2.0], 0.0) == 1.0 and dynamic_report.quantile([1.0, 2.0], 1.0) == 2.0


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["dynamic", *argv])


def test_the_cli_defaults_are_the_setups() -> None:
    setup = dynamic_cli.setup_from(parse())
    assert setup == dynamic_sweep.Setup()
    given = dynamic_cli.setup_from(parse("--count", "50", "--granularity", "2,500", "--imbalanced", "0"))
    assert given.count == 50 and given.draws == Draws(0.002, 0.5, 0.0)
    assert tuple(float(x) for x in dynamic_cli.LOADS.split(",")) == dynamic_sweep.LOADS
    slower = dynamic_cli.setup_from(parse("--wakeup-us", "2000"))
    assert slower.calibration == dataclasses.replace(Calibration(), wakeup_ns=2_000_000)
    assert slower.key() != setup.key()  # its points are not another wake-up cost's


def test_an_fcs_variant_runs_with_its_settings(tmp_path: Path) -> None:
    # Every process is reclassified after its first assigned slot instead of its 20th: on this workload the
    # first class changes come sooner, and the shipped constants are kept otherwise (f_priority "always").
    label = "fcs@cslots_min=1"
    plain, variant = dynamic_sweep.run_sweep(TINY, ["fcs", label], [1.5], tmp_path)
    assert variant["policy"] == label and (tmp_path / "points" / f"{label}-1.500.json").exists()
    workload = TINY.workload()
    for point, cslots_min in ((plain, 20), (variant, 1)):
        fcs = dataclasses.replace(FcsParameters(), cslots_min=cslots_min)
        cluster = CoschedCluster(
            2, 2, "fcs", mpl=6, costs=Calibration().costs, fcs=fcs, seed=TINY.seed, profile=False
        )
        result = cluster.run(workload.at_load(1.5), limit_ns=10**6 * NS)
        assert [[j.name, j.start, j.end] for j in result.jobs] == [[r[0], r[4], r[5]] for r in point["jobs"]]
    assert variant["jobs"] != plain["jobs"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loads", "0.5,x"], "--loads: comma-separated numbers"),
        (["--loads", "0.5,-1"], "--loads: positive numbers"),
        (["--granularity", "5,1"], "--granularity: MIN,MAX"),
        (["--imbalanced", "1.5"], "--imbalanced: a share between 0 and 1"),
        (["--count", "1"], "--count: at least 2 jobs"),
        (["--policies", "gang,rr"], "unknown policy 'rr'"),
        (["--jobs", "0"], "--jobs: at least 1"),
        (["--policies", "fcs@cslots=5"], "unknown FCS setting 'cslots'"),
        (["--policies", "gang@cslots_min=5"], "only fcs takes settings"),
        (["--policies", "fcs@cslots_min"], "settings are key=value"),
        (["--wakeup-us", "-1"], "--wakeup-us: a number of microseconds"),
    ],
)
def test_a_bad_option_is_a_clear_error(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["dynamic", "--dir", str(tmp_path), "--count", "12", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("storm sim dynamic: ") and message in err
    assert not (tmp_path / "points").exists()


COMMAND = ["dynamic", "--count", "12", "--seed", "1", "--span", "40", "--nodes", "2", "--pes-per-node", "2"]


@pytest.fixture(scope="module")
def matplotlib_warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """matplotlib keeps its font files open once it has drawn (a cache, not a leak), one per font and size:
    draw the same chart once before the leak check counts the open files."""
    directory = tmp_path_factory.mktemp("warm")
    argv = [*COMMAND, "--policies", "batch", "--loads", "0.6", "-j", "1", "--dir", str(directory)]
    assert cli.main(argv) == 0


@pytest.mark.usefixtures("matplotlib_warm")
def test_the_command_writes_its_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*COMMAND, "--policies", "batch,fcs", "--loads", "0.6", "-j", "1", "--dir", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("## storm sim dynamic") and "ours" in out.lower()
    data = json.loads((tmp_path / "report.json").read_text())
    assert set(data["curves"]) == {"batch", "fcs"} and (tmp_path / "report.md").read_text() == out
    assert (tmp_path / "report.png").stat().st_size > 0


def test_points_run_in_worker_processes_as_in_this_one(tmp_path: Path) -> None:
    # The workload's programs are pickled to the workers: a compiled model's records must survive it.
    policies, loads = ["sb", "fcs"], [1.5]
    here = dynamic_sweep.run_sweep(TINY, policies, loads, tmp_path / "here")
    there = dynamic_sweep.run_sweep(TINY, policies, loads, tmp_path / "there", workers=2)
    for a, b in zip(here, there, strict=True):
        assert a["jobs"] == b["jobs"] and a["summary"] == b["summary"]


@pytest.mark.usefixtures("matplotlib_warm")
def test_seeds_each_get_a_sweep_and_the_claim_is_checked_on_their_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*COMMAND, "--seeds", "1,2", "--policies", "gang,sb,fcs", "--loads", "1.5", "-j", "1"]
    assert cli.main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["seeds"] == [1, 2] and (tmp_path / "report.md").read_text() == out
    for seed in (1, 2):
        # Each seed is a sweep of its own, with its own report, equal to the same sweep run alone.
        alone = dynamic_cli.setup_from(parse(*COMMAND[1:], "--seed", str(seed)))
        points = dynamic_sweep.run_sweep(alone, ["gang", "sb", "fcs"], [1.5], tmp_path / f"seed-{seed}")
        assert (tmp_path / f"seed-{seed}" / "report.md").exists()
        for point in points:
            at = data["table"][point["policy"]]["1.5"]
            assert at["mean_bsld"][str(seed)] == pytest.approx(point["summary"]["mean_bsld"])
    for loads in data["table"].values():
        at = loads["1.5"]
        assert at["mean_bsld_mean"] == pytest.approx(statistics.fmean(at["mean_bsld"].values()))
    # The claim is read off the means; a hand-made table where FCS is above SB on average fails it.
    table = {
        p: {"1": {"mean_bsld": {"0": v0, "1": v1}, "mean_bsld_mean": (v0 + v1) / 2}}
        for p, (v0, v1) in {"fcs": (1.0, 3.0), "sb": (1.5, 2.0), "gang": (4.0, 4.0)}.items()
    }
    checked = {c["claim"].split(" in ")[0]: c for c in dynamic_seeds.claims(table)}
    assert checked["FCS at or below gang"]["agrees"] is True
    assert checked["FCS at or below SB"]["agrees"] is False
    assert checked["FCS at or below SB"]["cells"] == "1 of 2 (seed, load) cells at or below"
    assert "Issue 15's claim, across the seeds" in out


def test_bad_seeds_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("1,x", "2,2", ","):
        assert cli.main(["dynamic", "--dir", str(tmp_path), "--count", "12", "--seeds", bad]) == 2
        assert "--seeds:" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
