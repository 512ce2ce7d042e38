"""storm bench link runs both transports through the production code and reports each (its timings are
the benchmark's, not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.tools import bench_link, cli


def test_storm_bench_link_measures_both_transports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "link.json"
    assert cli.main(["bench", "link", "--loads", "0", "1", "--messages", "20", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    got = {(r["load"], r["transport"]) for r in result["results"]}
    assert got == {(0, "unix"), (0, "zmq"), (1, "unix"), (1, "zmq")}
    assert all(0 < r["median_us"] <= r["p90_us"] <= r["p99_us"] for r in result["results"])
    assert "| 1 | zmq / unix |" in capsys.readouterr().out


def test_bad_options_are_refused_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_link.main(["--messages", "0"])
    assert exit_.value.code == 2 and "--messages and --size at least 1" in capsys.readouterr().err
