"""The node model compiled with mypyc (setup.py, storm.tools.sim.cosched): in use where it is built from the
sources here, and giving exactly what the sources give."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from storm.tools import bench_compiled
from storm.tools.sim import cosched
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.cosched.records import (
    Control,
    Costs,
    Local,
    PeCounters,
    ProcessCounters,
    Reschedule,
    WaitMode,
)

# A run that goes through every part of the model: slices with rounds, spin-block and polling, a wake-up
# cost, stops and continues, nice, the shortcut, ClusterSchedSim's DCS, I/O. Prints every counter as JSON.
SCRIPT = """
import dataclasses, json
from storm.tools.sim.cosched import COMPILED
from storm.tools.sim.cosched.node import Control, CoschedModel, Costs, Local, Reschedule, WaitMode
from storm.tools.sim.cosched.program import Pattern, Program
MS = 1_000_000
out = {"compiled": COMPILED}
block = Control(wait=WaitMode.SPIN_BLOCK, spin_ns=120_000)
local = Local(Reschedule.DCS, switch_ns=100_000, interrupt_ns=30_000)
for name, costs in (
    ("slices", Costs(switch_ns=2 * MS, wakeup_ns=500_000, slice_ns=1_500_000)),
    ("dcs", Costs(switch_ns=2 * MS, wakeup_ns=500_000, slice_ns=1_500_000, local=local)),
):
    model = CoschedModel(4, costs)
    ring = Program.balanced(4, 3 * MS + 55_000, 300, Pattern.RING, latency_ns=5_000)
    model.add_job(0, 1, ring, [0, 1, 2, 3], block)
    model.add_job(0, 2, Program((7 * MS, 14 * MS), 200, Pattern.ALLREDUCE, latency_ns=5_000), [0, 2])
    model.add_job(MS, 3, Program((2 * MS, 4 * MS), 250, Pattern.RING, 5_000, io_ns=MS), [1, 3], block)
    model.control(100 * MS, (1, 0), Control(stopped=True))
    model.control(150 * MS, (1, 0), dataclasses.replace(block, nice=5))
    model.run_until_done(10**13)
    out[name] = {
        "ends": [model.completion_ns(j) for j in (1, 2, 3)],
        "processes": [dataclasses.asdict(model.counters(k)) for k in sorted(model.keys())],
        "pes": [dataclasses.asdict(model.pe_counters(pe)) for pe in range(4)],
        "events": model.events_run,
    }
print(json.dumps(out))
"""


def run(pure: bool) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("STORM_SIM_PURE", None)
    if pure:
        env["STORM_SIM_PURE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_compiled_model_is_in_use() -> None:
    # pip install -e . builds it; a stale or missing build falls back to the sources, six times slower.
    assert cosched.COMPILED, "the node model runs from its sources: `pip install -e .` compiles it again"


def test_the_compiled_model_gives_exactly_what_its_sources_give() -> None:
    compiled, pure = run(pure=False), run(pure=True)
    assert (compiled.pop("compiled"), pure.pop("compiled")) == (True, False)
    assert compiled == pure
    assert all(ends is not None for ends in compiled["slices"]["ends"])  # type: ignore[index]


def test_a_changed_source_is_not_run_compiled() -> None:
    build = json.loads((cosched._HERE / "compiled.json").read_text())
    assert cosched._stale_or_missing(build) is None
    build["sha256"]["node"] = "0" * 64
    assert cosched._stale_or_missing(build) == "node.py changed since it was compiled"
    assert cosched._stale_or_missing({"sha256": {"stepped": "0" * 64}}) == "stepped was not compiled"


def test_the_benchmark_compares_the_two_on_one_case(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert bench_compiled.main(["--iterations", "200", "--json", str(out)]) == 0
    lines = json.loads(out.read_text())["lines"]
    assert [line["model"] for line in lines] == ["sources", "compiled"]
    assert lines[0]["events"] == lines[1]["events"] > 1000


def test_the_frozen_records_survive_pickling() -> None:
    # A sweep's workers get the workload's programs (and costs) by pickle.
    records = [
        Program((1, 2), 3, Pattern.ALLREDUCE, 4, 5),
        Control(True, 3, WaitMode.SPIN_BLOCK, 7),
        Costs(1, 2, 3, Local(Reschedule.DCS, 1, 2)),
        PeCounters(1, 2, 3, 4, 5, 6, 7),
        ProcessCounters(compute_ns=5, in_call=True),
    ]
    for record in records:
        assert pickle.loads(pickle.dumps(record)) == record  # noqa: S301 (our own bytes)
