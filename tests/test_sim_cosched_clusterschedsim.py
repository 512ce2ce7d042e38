"""storm sim clusterschedsim (tools/sim/cosched/clusterschedsim.py): its workloads, its costs per scheme and
column, its PASS/DIFFERS judgements, and a tiny run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.tools.sim.cli import main as sim_main
from storm.tools.sim.cosched.clusterschedsim import (
    COLUMNS,
    NS,
    Setup,
    checks,
    costs,
    markdown,
    run,
    workload,
)
from storm.tools.sim.cosched.node import Reschedule

MS, US = 1_000_000, 1_000
A, B, C = COLUMNS
# Dense arrivals, so that jobs share PEs: what DCS's interrupts need.
TINY = Setup(
    nodes=4, mpl=2, jobs=5, load=3.0, seeds=(1, 2), runtime_s=(0.04, 0.08), granularity_ms=(2.0, 4.0)
)


def test_the_two_workloads_draw_the_same_jobs_and_the_io_one_adds_twice_the_computation_in_io() -> None:
    setup = Setup()
    comm, io = workload("communication", setup, 1), workload("io", setup, 1)
    assert len(comm) == len(io) == 32 and workload("io", setup, 1) == io  # deterministic
    assert workload("io", setup, 2) != io
    for c, i in zip(comm, io, strict=True):
        assert c.program.ranks == i.program.ranks in (2, 4, 8, 16)
        assert c.program.compute_ns == i.program.compute_ns and c.program.pattern is i.program.pattern
        assert c.program.io_ns == 0 and i.program.io_ns == 2 * i.program.compute_ns[0]
        assert 1 * MS <= c.program.compute_ns[0] <= 4 * MS and c.program.latency_ns == 20 * US
        assert 0.35 * NS < c.program.dedicated_ns() < 1.65 * NS  # Setup.runtime_s, to an iteration
    for jobs in (comm, io):
        work = sum(j.program.dedicated_ns() * j.program.ranks for j in jobs)
        span = max(j.submit_ns for j in jobs)
        assert jobs[0].submit_ns == 0 and 0.6 < work / (16 * span) < 1.0  # about the 0.8 asked for
    with pytest.raises(ValueError, match="unknown workload"):
        workload("cpu", setup, 1)


def test_each_scheme_gets_table_1s_costs_of_its_column() -> None:
    setup = Setup()
    gang, quantum = costs("gang", B, setup)
    assert gang.switch_ns == 1 * MS and gang.local is None and quantum == 0.1
    batch, _ = costs("batch", A, setup)
    assert batch.switch_ns == 0 and batch.local is None
    sb, _ = costs("sb", C, setup)
    assert sb.local is not None and sb.local.reschedule is Reschedule.NONE and sb.local.switch_ns == 100 * US
    dcs, _ = costs("dcs-sb", A, setup)
    assert dcs.local is not None and (dcs.local.reschedule, dcs.local.interrupt_ns) == (
        Reschedule.DCS,
        50 * US,
    )
    pb, _ = costs("pb", B, setup)
    assert pb.local is not None and pb.local.reschedule is Reschedule.PB
    assert (pb.local.period_ns, pb.local.daemon_ns, pb.slice_ns) == (10 * MS, 25 * US, 20 * MS)
    with pytest.raises(ValueError, match="unknown scheme"):
        costs("fcs", A, setup)


def _row(normalised: float, response: float, spin: float = 0.0, idle: float = 0.0) -> dict[str, object]:
    return {"normalised": normalised, "mean_response": response, "cpu": {"spinning": spin, "idle": idle}}


def test_the_judgements_read_the_figures_as_the_paper_states_them() -> None:
    def scheme(
        b: float, c: float, response: float, spin: float = 0.0, idle: float = 0.0
    ) -> dict[str, object]:
        return {"A": _row(1.0, response, spin, idle), "B": _row(b, response * b), "C": _row(c, response * c)}

    paper_like = {
        "gang": scheme(0.90, 0.98, 10.0, spin=0.01, idle=0.4), "sb": scheme(0.65, 0.64, 11.0),
        "dcs": scheme(0.90, 0.90, 12.0), "pb": scheme(0.89, 0.90, 11.0, spin=0.2, idle=0.1),
        "dcs-sb": scheme(0.71, 0.80, 11.0), "pb-sb": scheme(0.67, 0.69, 11.0),
    }  # fmt: skip
    io = {**paper_like, "gang": scheme(0.90, 0.98, 20.0, spin=0.01, idle=0.4)}
    lines = checks({"workloads": {"communication": {"schemes": paper_like}, "io": {"schemes": io}}})
    assert lines and all(line["verdict"] == "PASS" for line in lines), [
        x for x in lines if x["verdict"] != "PASS"
    ]
    # GS last on the communication-intensive workload, and SB insensitive to its switch cost: both differ.
    flipped = {**paper_like, "gang": scheme(0.90, 0.98, 13.0), "sb": scheme(1.0, 1.0, 11.0)}
    verdicts = {
        line["claim"]: line["verdict"]
        for line in checks({"workloads": {"communication": {"schemes": flipped}}})
    }
    assert verdicts["communication: GS has the lowest mean response (Fig. 8b), column A"] == "DIFFERS"
    assert verdicts["communication: Table 1 column B, SB 0.648 (within 0.1)"] == "DIFFERS"
    assert verdicts["communication: Table 1 column B, DCS-SB 0.710 (within 0.1)"] == "PASS"


def test_a_difference_within_the_seeds_spread_does_not_pass() -> None:
    def scheme(b: float, spread: float) -> dict[str, object]:
        return {
            "A": _row(1.0, 10.0), "B": {**_row(b, 10 * b), "normalised_spread": spread},
            "C": {**_row(b, 10 * b), "normalised_spread": spread},
        }  # fmt: skip

    def verdict(spread: float) -> str:
        rows = {"sb": scheme(0.95, spread), "dcs": scheme(0.97, spread)}
        (line,) = [
            x for x in checks({"workloads": {"io": {"schemes": rows}}}) if "column B (switch" in x["claim"]
        ]
        return str(line["verdict"])

    assert verdict(0.01) == "PASS" and verdict(0.03) == "DIFFERS"  # SB's cut exceeds DCS's by 0.02


def test_a_tiny_run_end_to_end(tmp_path: Path) -> None:
    result = run(TINY, ("batch", "gang", "sb", "dcs", "pb-sb"), (A, C))
    for kind in ("communication", "io"):
        rows = result["workloads"][kind]["schemes"]
        assert set(rows) == {"batch", "gang", "sb", "dcs", "pb-sb"}
        for scheme, columns in rows.items():
            assert columns["A"]["normalised"] == 1.0 and columns["C"]["mean_response"] > 0
            assert len(columns["C"]["seeds"]) == 2 and columns["C"]["normalised_spread"] >= 0
            cpu = columns["A"]["cpu"]
            assert sum(cpu.values()) == pytest.approx(1.0) and 0 <= columns["A"]["loss_of_capacity"] < 1
            if scheme in ("dcs", "pb-sb", "sb"):
                assert columns["A"]["switches_per_pe_s"] > 0
        assert rows["dcs"]["A"]["interrupts_per_pe_s"] > 0 and rows["sb"]["A"]["interrupts_per_pe_s"] == 0
    assert result["workloads"]["io"]["schemes"]["gang"]["A"]["cpu"]["idle"] > 0.5  # GS idles during I/O
    json.dumps(result)  # all of it serialisable
    text = markdown(result)
    assert "## Table 1" in text and ("- PASS: " in text or "- DIFFERS: " in text)


def test_the_command_line_judges_a_saved_run_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "run.json"
    result = run(TINY, ("gang", "sb"), (A, B))
    result["checks"] = []
    saved.write_text(json.dumps(result))
    assert sim_main(["clusterschedsim", "--report", str(saved), "--markdown", str(tmp_path / "run.md")]) == 0
    assert "## The paper's findings" in (tmp_path / "run.md").read_text()
    assert "- PASS: " in capsys.readouterr().out or "- DIFFERS: " in (tmp_path / "run.md").read_text()


def test_the_command_line_refuses_bad_columns_and_schemes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sim_main(["clusterschedsim", "--columns", "B,C"])
    with pytest.raises(SystemExit):
        sim_main(["clusterschedsim", "--schemes", "gang,fcs"])
    assert "unknown schemes fcs" in capsys.readouterr().err
