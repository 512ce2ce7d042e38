"""storm bench scale: its table beside the goals, its plug-in points and its check of the store, on
hand-made figures (the benchmark itself runs clusters: `storm bench scale --quick`); its soak part, the one
quick enough, on a short mix for real."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.jobs import JobSpec
from storm.mm.store import Store
from storm.tools import bench_scale as b
from storm.tools import soak


def summary(median: float, p99: float) -> dict[str, float]:
    return {"count": 100, "median": median, "p99": p99, "max": p99 + 1}


def run(p99: float, busy: int = 2) -> dict[str, object]:
    return {
        "busy_loops": busy, "spread_ms": summary(0.4, p99), "lateness_ms": summary(0.2, p99),
        "latency_ms": summary(1.0, 5.0), "late": 0,
    }  # fmt: skip


def test_each_goal_is_judged_where_the_issue_sets_it() -> None:
    result = {
        "spread": {"runs": [run(3.0, busy=0), run(0.8)]},  # idle is reported, the loaded run is judged
        "emulated": {"runs": [{**run(2.5, busy=0), "emulated": 1024}]},
        "storm": {
            "emulated": 1024,
            "jobs": 10,
            "jobs_per_second": 5.0,
            "mm_rss_mb_idle": 70.0,
            "restart": {"registered_seconds": 4.0, "mm_restart_seconds": 0.5, "down": []},
            "stored": {"rows": 10, "distinct_ids": 10, "states": {"COMPLETED": 10}},
        },
    }
    judged = {f.name: f.met for f in b.figures_of(result) if f.met is not None}
    assert judged == {
        "heartbeat to 8 real NMs, CPU load: spread p99": True,
        "heartbeat to 1,024 emulated NMs: spread p99": False,
        "1,024 emulated NMs registered after MM SIGKILL": True,
        "nodes seen DOWN meanwhile": True,
        "10-job workload: COMPLETED, each recorded once": True,
    }
    table = b.table(b.figures_of(result))
    assert "| spread | heartbeat to 8 real NMs, CPU load: spread p99 | 0.8 ms | < 1 ms | yes |" in table
    assert "| emulated | heartbeat to 1,024 emulated NMs: spread p99 | 2.5 ms | < 2 ms | NO |" in table


def test_a_plug_in_is_measured_through_its_contract_else_the_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = types.ModuleType("storm_test_plugin")
    module.scale_figures = lambda work, quick: [b.Figure("x", "ours", 1.0, "s", "< 2 s", True)]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "storm_test_plugin", module)
    fallback = lambda work, quick: [b.Figure("y", "theirs", None, "s")]  # noqa: E731
    plugins = {
        "here": ("storm_test_plugin", (("scale_figures", b.contract),), fallback),
        "missing": ("storm_test_no_such_module", (("scale_figures", b.contract),), fallback),
    }
    monkeypatch.setattr(b, "PLUGINS", plugins)
    figures, used = b.plugin_figures(tmp_path, quick=True)
    assert [(f.name, f.cell()) for f in figures] == [("ours", "1 s"), ("theirs", "not measured")]
    assert used["here"] == "storm_test_plugin.scale_figures" and used["missing"].startswith("fallback")


def test_the_workload_is_checked_in_the_store_file_itself(tmp_path: Path) -> None:
    path = tmp_path / "storm.db"
    b.fill_store(path, 5)
    spec = JobSpec(
        name="w", uid=0, gid=0, user="u", ranks=1, argv=("true",), cwd="/tmp", env={}, time_limit=None,
        output="", error="",
    )  # fmt: skip
    store = Store(path)
    try:
        store.add_job(spec, 1.0)  # job 6: a workload job still pending
    finally:
        store.close()
    assert b.stored(path, 3, 6) == {
        "rows": 4, "distinct_ids": 4, "states": {"COMPLETED": 3, "PENDING": 1}, "all_rows": 6,
    }  # fmt: skip


def test_the_soak_part_times_the_soak_s_mix_here_and_under_another_python(tmp_path: Path) -> None:
    result = soak.measure(tmp_path / "here", jobs=40)
    # This checkout's Python stands for another installation's: the file runs by its path all the same.
    result["against"] = {"other": soak.against(sys.executable, tmp_path, jobs=40)}
    assert result["as_their_kind"] == 40 and not result["unexpected_jobs"], result["wrong"]
    assert result["against"]["other"]["as_their_kind"] == 40, result["against"]
    rows = {f.name: f for f in b.figures_of({"soak": result})}
    mix = "soak's 40-job mix, 3 NMs x 2 PEs"
    assert rows[f"{mix}: jobs ended as their kind"].met is True
    speedup = rows[f"{mix}: speed-up over today (64 jobs/s)"]
    assert speedup.value == pytest.approx(result["jobs_per_second"] / 64) and speedup.goal == ">= 3x"
    other = result["against"]["other"]["jobs_per_second"]
    assert rows["the same mix under other"].value == other
    assert rows["  speed-up over it"].value == pytest.approx(result["jobs_per_second"] / other)
    # One job otherwise than its kind: the speed-up is not met, however fast.
    judged = {
        f.name: f.met for f in b.figures_of({"soak": {**result, "as_their_kind": 39, "jobs_per_second": 1e6}})
    }
    assert judged[f"{mix}: jobs ended as their kind"] is False and judged[speedup.name] is False
    # Several runs (as `storm bench scale` makes): the median run's figures, the checks of every run.
    runs = [{**soak._brief(result), "jobs_per_second": rate} for rate in (100.0, 300.0, 200.0)]
    several = {f.name: f for f in b.figures_of({"soak": {**result, "runs": runs}})}
    assert several[f"{mix}: throughput (median of 3 runs)"].value == result["jobs_per_second"]
    assert (several["  slowest run"].value, several["  fastest run"].value) == (100.0, 300.0)
    assert several[f"{mix}: jobs ended as their kind"].met is True
    runs[0]["as_their_kind"] = 39
    judged = {f.name: f.met for f in b.figures_of({"soak": {**result, "runs": runs}})}
    assert judged[f"{mix}: jobs ended as their kind"] is False
    assert judged[f"{mix}: speed-up over today (64 jobs/s) (median of 3 runs)"] is False


def test_the_command_is_recorded_as_given(tmp_path: Path) -> None:
    markdown = tmp_path / "scale.md"
    assert b.main(["--parts", "", "--markdown", str(markdown)]) == 0  # no part: nothing runs
    assert f"`storm bench scale --parts  --markdown {markdown}`" in markdown.read_text()


def test_the_soak_splits_idle_pe_time_by_whether_a_job_waited() -> None:
    """2 PEs, from the first submission (0 s) to the last end (6 s): job 1 (2 ranks) waits 0-1 and runs 1-3;
    job 2 (1 rank) waits 2-3 and runs 3-4 (the other PE idle while nothing waits); job 3 waits 5-6 and is
    cancelled before it starts."""

    def info(job_id: int, ranks: int, submit: float, start: float | None, end: float) -> p.JobInfo:
        return p.JobInfo(
            id=job_id, name="j", user="u", uid=0, state="COMPLETED", ranks=ranks, nodes=(),
            submit_time=submit, start_time=start, end_time=end, exit_code=0, reason="", time_limit=None,
            argv=("true",), cwd="/", output="", error="",
        )  # fmt: skip

    jobs = {1: info(1, 2, 0.0, 1.0, 3.0), 2: info(2, 1, 2.0, 3.0, 4.0), 3: info(3, 1, 5.0, None, 6.0)}
    ran = soak.Soak(kinds=dict.fromkeys(jobs, soak.KINDS[0]), seconds=10.0, jobs=jobs)
    # Waiting: 0-1 (job 1, 2 PEs idle), 2-3 (job 2, none idle), 5-6 (job 3, 2 idle); else 3-4 and 4-5.
    assert ran.idle(pes=2) == {"while_jobs_waited": 4.0, "while_none_waited": 3.0}
