"""``storm sim reproduce lsf | naik``: the claims' checks on figures made to pass and to fail, and both
commands end to end on tiny settings (the committed reports in results/ come from the full ones)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storm.tools.sim import cli
from storm.tools.sim.allocation.lsf_report import claims as lsf_claims
from storm.tools.sim.allocation.lsf_report import notes as lsf_notes
from storm.tools.sim.allocation.lsf_reproduce import KNOWLEDGE


def spread(mean: float, median: float | None = None) -> dict[str, float]:
    return {"mean": mean, "median": mean if median is None else median, "sd": 0.0, "min": mean, "max": mean,
            "ci95": 0.0}  # fmt: skip


def cell(
    mrt: float, makespan: float, over_bound: float = 1.05, peak: float = 60.0, over5: float = 0.0
) -> Any:
    return {
        "mrt": spread(mrt), "makespan": spread(makespan), "makespan_over_bound": spread(over_bound),
        "peak_queue": spread(peak), "queue_over_5_share": spread(over5),
    }  # fmt: skip


def table(**overrides: Any) -> dict[str, dict[str, Any]]:
    base = {
        "RTC": cell(6000, 140_000),
        "RTC-ADSUBSET": cell(8000, 75_000),
        "MIG": cell(700, 84_000, peak=5, over5=0.02),
        "MALL-AD": cell(650, 78_000, over_bound=1.15, peak=5, over5=0.01),
    }
    base.update(overrides)
    return {d: dict.fromkeys(KNOWLEDGE, c) for d, c in base.items()}


def runs_for(cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    slowest = {"job": 3, "response": 9e4, "work": 4e5, "minimum": 15, "desired": 15, "kind": "poor",
               "alone": 42e3, "preemptions": 61}  # fmt: skip
    return [
        {"discipline": d, "knowledge": "none", "seed": s, "makespan": 3e5 if s == 0 else 7e4,
         "makespan_bound": 65e3, "slowest": slowest}
        for d in cells for s in range(2)
    ]  # fmt: skip


def test_lsf_claims_agree_on_the_papers_own_figures() -> None:
    cells = table()
    rates = {"1/300": {d: cells[d]["none"] for d in cells}}
    out = lsf_claims(cells, rates, runs_for(cells))
    assert len(out) == 7
    assert [c["agrees"] for c in out] == [True] * 7
    assert all(c["why"] == "" for c in out)


def test_lsf_claims_differ_and_say_why() -> None:
    cells = table(MIG=cell(2000, 250_000, peak=20, over5=0.3), RTC=cell(6000, 80_000))
    rates = {
        "1/300": {d: cells[d]["none"] for d in cells},
        "1/400": {d: cell(c["mrt"]["mean"] / 3 if d == "MIG" else c["mrt"]["mean"], 80_000) for d, c in
                  ((d, cells[d]["none"]) for d in cells)},
    }  # fmt: skip
    out = {c["claim"]: c for c in lsf_claims(cells, rates, runs_for(cells))}
    mig = out["RTC's mean response at least 5x MIG's"]
    assert mig["agrees"] is False and "3.0" in mig["model"]
    assert "(note A)" in mig["why"] and "holds at 1/400" in mig["why"]
    assert "1 of 2 runs" in lsf_notes(cells, runs_for(cells))["A"]
    assert out["RTC's mean response at least 5x MALL-AD's"]["agrees"] is True
    assert out["MIG and MALL-AD mean responses in the paper's band"]["agrees"] is False
    half = out["RTC-ADSUBSET's makespan about half RTC's"]
    assert half["agrees"] is False and "0.94" in half["model"]
    assert out["Under MIG and MALL-AD the queue is rarely above 5"]["agrees"] is False


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Both commands once, on tiny settings, before the leak check counts open files (matplotlib keeps its
    fonts open once it has drawn: a cache, not a leak)."""
    lsf, naik = tmp_path_factory.mktemp("lsf"), tmp_path_factory.mktemp("naik")
    argv = ["reproduce", "lsf", "--seeds", "1", "--no-rates", "--disciplines", "RTC,RTC-ADSUBSET,MIG,MALL-AD"]
    assert cli.main([*argv, "-j", "1", "--dir", str(lsf)]) == 0
    # Steady runs long enough for the transient's steady-state value to be within its 10% (FPJP's U is heavy
    # tailed), at the transient's rate only.
    argv = [
        "reproduce",
        "naik",
        "--seeds",
        "2",
        "--departures",
        "10000",
        "--warmup",
        "1000",
        "--rates",
        "0.007",
    ]
    assert cli.main([*argv, "--transient-seeds", "1", "-j", "1", "--dir", str(naik)]) == 0
    return lsf, naik


def test_reproduce_lsf_end_to_end(reports: tuple[Path, Path]) -> None:
    directory = reports[0]
    data = json.loads((directory / "report.json").read_text())
    assert data["format"] == "storm-sim-reproduce-lsf/1" and len(data["runs"]) == 16
    assert len(data["claims"]) == 7 and all(c["agrees"] in (True, False) for c in data["claims"])
    text = (directory / "report.md").read_text()
    assert "### Against the paper" in text and data["command"] in text
    assert (directory / "report.png").stat().st_size > 10_000


def test_reproduce_naik_end_to_end(reports: tuple[Path, Path]) -> None:
    directory = reports[1]
    data = json.loads((directory / "report.json").read_text())
    assert data["format"] == "storm-sim-reproduce-naik/1"
    assert len(data["claims"]) == 5 and len(data["others"]) == 3
    assert set(data["best_fp"]) == {"0.007"}
    assert data["transient"]["DP"]["seeds"] == 1 and len(data["transient"]["DP"]["mean_curve"]) == 401
    assert "--rates 0.007" in (directory / "report.md").read_text()
