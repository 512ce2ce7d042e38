"""storm sim's decisions, pinned: per-job starts, ends and states of small generated workloads under every
policy, compared with tests/sim_golden.json, which the code before the simulator's speed-up wrote.

Making the simulator (or the core it drives) faster must not change a single decision. If a change of the
core's *policy* is meant to change them, regenerate the file and review the diff:

    python tests/test_sim_golden.py    # rewrites tests/sim_golden.json
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from storm.tools.sim.engine import CORES, POLICIES, Machine, simulate
from storm.tools.sim.lublin import generate
from storm.tools.sim.swf import Workload, scale_load, to_workload

GOLDEN = Path(__file__).with_name("sim_golden.json")

# (name, Lublin seed, jobs, machine, arrival compression, estimate rule)
CASES = (
    ("lublin-32x1", 11, 400, Machine(32, 1), 5.0, "x3"),
    ("lublin-8x4", 12, 400, Machine(8, 4), 2.0, "runtime"),
    ("lublin-4x16", 13, 300, Machine(4, 16), 3.0, "x2"),
)


def workload(seed: int, jobs: int, machine: Machine, compress: float, estimate: str) -> Workload:
    """A Lublin workload under load, every fifth job with a limit under its runtime (it ends TIMEOUT)."""
    base = to_workload(generate(jobs, machine.pes, seed).records, machine.pes, estimate)
    loaded = scale_load(base, compress, 1.0)
    loaded.jobs = [
        dataclasses.replace(j, limit=max(1.0, j.runtime / 2)) if j.index % 5 == 4 else j for j in loaded.jobs
    ]
    return loaded


def results() -> dict[str, Any]:
    """case -> policy -> [[mm id, start, end, state] per job in workload order]."""
    out: dict[str, Any] = {}
    for name, seed, jobs, machine, compress, estimate in CASES:
        load = workload(seed, jobs, machine, compress, estimate)
        out[name] = {
            policy: [
                [o.mm_id, o.start, o.end, o.state]
                for o in simulate(load, machine, policy, merge_nodes=False, core="mm").outcomes
            ]
            for policy in POLICIES
        }
    return out


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("merge_nodes", [False, True], ids=["nodes-as-given", "nodes-merged"])
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_decisions_are_those_recorded(case: str, merge_nodes: bool, core: str) -> None:
    """The file was written by the whole MM core with the nodes as given (the engine could not merge them
    then, and the scheduler-only engine did not exist)."""
    golden = json.loads(GOLDEN.read_text())
    name, seed, jobs, machine, compress, estimate = next(c for c in CASES if c[0] == case)
    load = workload(seed, jobs, machine, compress, estimate)
    for policy in POLICIES:
        outcomes = simulate(load, machine, policy, merge_nodes=merge_nodes, core=core).outcomes
        got = [[o.mm_id, o.start, o.end, o.state] for o in outcomes]
        assert got == golden[name][policy], f"{name} under {policy} decides differently"


def test_the_golden_workloads_wait_and_time_out() -> None:
    """The recorded runs exercise queueing, backfilling and time limits, not only an idle machine."""
    golden = json.loads(GOLDEN.read_text())
    for name, *_ in CASES:
        for policy, jobs in golden[name].items():
            load = workload(*next(c[1:] for c in CASES if c[0] == name))
            waited = sum(
                1 for (_, start, _, _), job in zip(jobs, load.jobs, strict=True) if start > job.submit
            )
            assert waited > len(jobs) // 10, f"{name} {policy}: too few jobs waited"
            assert any(state == "TIMEOUT" for *_, state in jobs)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(results(), sort_keys=True) + "\n")
    sys.exit(0)
