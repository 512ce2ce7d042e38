"""storm bench gang: its analysis of NM traces on hand-written data, and one tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.tools import bench_gang as b


def line(seq: int, sent: float, delay: float, switch: float = 0.0, ranks: int = 0) -> str:
    """A trace line as nm/switcher.py writes it: received ``delay`` after sent, done ``switch`` later."""
    return f"{seq} {seq % 2} {sent:.6f} {sent + delay:.6f} {sent + delay + switch:.6f} {ranks}"


def three_nodes() -> dict[str, list[b.TraceLine]]:
    """Heartbeats 1-4 at 10.0, 10.1, ...; node1 misses 3; node2 gets 2 late; one line before the window."""
    sent = {s: 10.0 + (s - 1) / 10 for s in range(0, 5)}
    node0 = [line(s, sent[s], 0.001) for s in range(0, 5)]
    node1 = [line(s, sent[s], 0.002) for s in (1, 2, 4)]
    node2 = [line(s, sent[s], 0.010 if s == 2 else 0.004) for s in range(1, 5)]
    node2.append("5 1 10.400000 10.40")  # being written when read: ignored
    texts = {"node0": node0, "node1": node1, "node2": node2}
    return b.in_window({n: b.parse_trace("\n".join(t) + "\n") for n, t in texts.items()}, 10.0, 10.35)


def test_parse_trace_reads_whole_lines_only() -> None:
    lines = b.parse_trace("7 1 1.500000 1.500400 1.503000 2\n8 0 1.6")
    assert lines == [b.TraceLine(7, 1, 1.5, 1.5004, 1.503, 2)]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert b.percentile(values, 99) == 99.0
    assert b.percentile(values, 50) == 50.0
    assert b.percentile(values, 100) == 100.0
    assert b.percentile([3.0], 99) == 3.0
    assert b.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 99) == 10.0


def test_delivery_latency_spread_and_losses_of_three_nodes() -> None:
    result = b.delivery(three_nodes())
    assert (result["heartbeats"], result["complete"], result["lost"]) == (4, 3, 1)
    assert result["lost_deliveries"] == 1
    assert result["lost_by_node"] == {"node1": 1}
    # Heartbeats 1, 2 and 4 reached all three: latencies 1, 2, 4 ms (10 ms at node2 for heartbeat 2).
    latency = result["latency_ms"]
    assert latency["count"] == 9
    assert latency["median"] == pytest.approx(2.0, abs=1e-3)
    assert latency["p99"] == pytest.approx(10.0, abs=1e-3)
    assert latency["max"] == pytest.approx(10.0, abs=1e-3)
    spread = result["spread_ms"]  # 3, 9 and 3 ms
    assert spread["count"] == 3
    assert spread["median"] == pytest.approx(3.0, abs=1e-3)
    assert spread["p99"] == pytest.approx(9.0, abs=1e-3)
    assert spread["max"] == pytest.approx(9.0, abs=1e-3)


def test_delivery_counts_a_heartbeat_no_node_traced_as_lost() -> None:
    traces = {n: b.parse_trace("".join(line(s, s / 10, 0.001) + "\n" for s in (1, 3))) for n in ("a", "b")}
    result = b.delivery(traces)
    assert (result["heartbeats"], result["complete"], result["lost"], result["lost_deliveries"]) == (
        3,
        2,
        1,
        2,
    )
    assert b.delivery({})["latency_ms"] == {"count": 0, "median": 0.0, "p99": 0.0, "max": 0.0}


def test_switching_takes_only_the_lines_that_changed_ranks() -> None:
    node0 = [line(1, 1.0, 0.001, 0.003, 2), line(2, 1.1, 0.002, 0.0, 0), line(3, 1.2, 0.001, 0.005, 2)]
    node1 = [line(1, 1.0, 0.002, 0.001, 2)]
    result = b.switching(
        {"node0": b.parse_trace("\n".join(node0) + "\n"), "node1": b.parse_trace("\n".join(node1) + "\n")}
    )
    assert result["heartbeats_by_node"] == {"node0": 3, "node1": 1}
    assert result["switches_by_node"] == {"node0": 2, "node1": 1}
    nm, mm = result["nm_done_minus_received_ms"], result["mm_done_minus_sent_ms"]
    assert nm["count"] == mm["count"] == 3
    assert nm["median"] == pytest.approx(3.0, abs=1e-3)
    assert nm["max"] == pytest.approx(5.0, abs=1e-3)
    assert mm["median"] == pytest.approx(4.0, abs=1e-3)  # 4, 3 and 6 ms
    assert mm["max"] == pytest.approx(6.0, abs=1e-3)


def test_cpu_percent_of_one_cpu() -> None:
    result = b.cpu_percent(
        {"mm": 1.0, "node0": 2.0, "node1": 3.0}, {"mm": 1.1, "node0": 2.2, "node1": 3.1}, 2.0
    )
    assert result["mm"] == pytest.approx(5.0)
    assert result["nm_mean"] == pytest.approx(7.5)
    assert result["nm_max"] == pytest.approx(10.0)


@pytest.mark.slow
def test_a_tiny_run_writes_sane_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gang.json"
    argv = ["--sizes", "2", "--window", "1", "--repeats", "1", "--compute-seconds", "0.3", "--json", str(out)]
    assert b.main(argv) == 0
    result = json.loads(out.read_text())
    assert set(result) == {
        "machine", "parameters", "heartbeats", "switching", "overhead_cpu_percent", "compute_alone", "goals",
        "host_floor",
    }  # fmt: skip
    assert [(r["nms"], r["load"]) for r in result["heartbeats"]] == [(2, "idle"), (2, "loaded")]
    for run in result["heartbeats"]:
        assert run["heartbeats"] > 0
        assert run["complete"] > 0
        assert 0 < run["latency_ms"]["median"] <= run["latency_ms"]["max"] < 1000
        assert 0 <= run["spread_ms"]["median"] <= run["spread_ms"]["max"] < 1000
        assert run["cpu"]["mm"] >= 0
    switches = result["switching"]
    for key in ("nm_done_minus_received_ms", "mm_done_minus_sent_ms"):
        assert switches[key]["count"] > 0
        assert 0 < switches[key]["median"] <= switches[key]["max"] < 1000
    assert set(result["overhead_cpu_percent"]) == {"batch_idle", "gang_idle", "gang_switching"}
    compute = result["compute_alone"]
    assert (
        len(compute["submit_to_end_seconds"]["batch"]) == len(compute["submit_to_end_seconds"]["gang"]) == 1
    )
    assert 0.5 < compute["gang_over_batch"] < 3
    (floor,) = result["host_floor"]
    assert floor["nms"] == 2 and floor["heartbeats"] > 0
    assert 0 < floor["latency_ms"]["median"] <= floor["latency_ms"]["max"] < 1000
    assert "gang/batch" in capsys.readouterr().out
