"""storm sim's engine on small workloads with known answers: storm-mm's own core decides, simulated node
managers answer, and the engine checks its invariants on every run (tools/sim/nodes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.tools.sim.engine import Machine, RunResult, simulate
from storm.tools.sim.lublin import generate
from storm.tools.sim.nodes import InvariantError, SimNodes
from storm.tools.sim.report import dump_json, manifest, result_json
from storm.tools.sim.swf import read_swf, save_swf, to_workload


def swf(tmp_path: Path, *jobs: tuple[float, float, int, float]) -> Path:
    """An SWF file of (submit, runtime, procs, requested time or -1) jobs, numbered from 1."""
    lines = ["; Version: 2.2", "; MaxNodes: 4", "; MaxProcs: 4"]
    for number, (submit, runtime, procs, requested) in enumerate(jobs, 1):
        fields = [number, submit, -1, runtime, procs, -1, -1, procs, requested] + [-1] * 9
        lines.append(" ".join(str(f) for f in fields))
    path = tmp_path / "jobs.swf"
    path.write_text("\n".join(lines) + "\n")
    return path


FOUR = Machine(4, 1)


def run(path: Path, policy: str = "easy", machine: Machine = FOUR, estimate: str = "runtime") -> RunResult:
    workload = to_workload(read_swf(path).records, machine.pes, estimate)
    return simulate(workload, machine, policy)


def starts(result: RunResult) -> dict[int, float]:
    return {o.job.number: o.start for o in result.outcomes}


# ------------------------------------------------------------------------------------------ golden workloads


def test_a_wide_job_blocks_the_queue_behind_it(tmp_path: Path) -> None:
    """FCFS order: job 3 (1 PE, long) fits beside job 1 but would delay wide job 2, so it waits for it."""
    path = swf(tmp_path, (0, 100, 2, -1), (1, 100, 4, -1), (2, 1000, 1, -1))
    result = run(path)
    assert starts(result) == {1: 0, 2: 100, 3: 200}


def test_fcfs_does_not_backfill(tmp_path: Path) -> None:
    """A short job that EASY starts at once waits under plain FCFS behind the wide head."""
    path = swf(tmp_path, (0, 100, 2, -1), (1, 100, 4, -1), (2, 10, 1, -1))
    assert starts(run(path, "easy"))[3] == 2
    assert starts(run(path, "fcfs"))[3] == 200


def backfill_case(tmp_path: Path) -> Path:
    """4 PEs. 1: 3 PEs until 100. 2 (the head): 2 PEs, reserved at 100 with 2 PEs to spare. 3: all 4 PEs,
    behind 2. 4: 1 PE for 500 s: it cannot delay 2 (it fits in the spare PEs), but it would delay 3."""
    return swf(tmp_path, (0, 100, 3, -1), (1, 100, 2, -1), (2, 100, 4, -1), (3, 500, 1, -1))


def test_easy_backfills_into_the_heads_spare_pes(tmp_path: Path) -> None:
    result = run(backfill_case(tmp_path))
    assert starts(result) == {1: 0, 2: 100, 3: 503, 4: 3}


def test_conservative_does_not_backfill_what_delays_a_later_job(tmp_path: Path) -> None:
    result = run(backfill_case(tmp_path), "conservative")
    assert starts(result)[3] == 200
    assert starts(result)[4] > 3


def test_a_job_past_its_limit_is_killed_there(tmp_path: Path) -> None:
    """Requested 50 s, ran 100 s in the trace: storm-mm ends it TIMEOUT at start + 50 s."""
    path = swf(tmp_path, (0, 100, 4, -1), (10, 100, 2, 50))
    result = run(path)
    late = result.outcomes[1]
    assert late.state == "TIMEOUT"
    assert late.start == 100
    assert late.end == pytest.approx(late.job.submit + late.wait + 50, abs=1e-9)
    assert result.outcomes[0].state == "COMPLETED"


def test_a_job_that_ends_early_moves_the_reservation_up(tmp_path: Path) -> None:
    """Job 1 asked for 100 s but ends at 10 s: job 2, reserved for 100, starts at 10; job 3 (1 PE, 30 s)
    could backfill before 100 but not before 10, so it runs after job 2."""
    path = swf(tmp_path, (0, 10, 4, 100), (1, 10, 4, 100), (2, 30, 1, 30))
    result = run(path)
    assert starts(result) == {1: 0, 2: 10, 3: 20}


def test_exact_estimates_make_no_timeouts(tmp_path: Path) -> None:
    path = swf(tmp_path, (0, 7, 3, -1), (0, 5, 2, -1), (1, 3, 1, -1))
    result = run(path)
    assert {o.state for o in result.outcomes} == {"COMPLETED"}
    assert all(o.end - o.start == o.job.runtime for o in result.outcomes)


# ---------------------------------------------------------------------------------------------- invariants


def test_the_nodes_refuse_a_pe_used_twice() -> None:
    nodes = SimNodes(1, 2)
    nodes.submit_times.update({1: 0.0, 2: 0.0})

    def launch(job_id: int) -> p.LaunchJob:
        return p.LaunchJob(
            job_id=job_id, name="j", kvsname="k", size=1, row=0, node_index=0, ranks_per_node=(1,),
            slots=(p.RankSlot(rank=0, pe=1),), argv=("x",), cwd="/", env={}, uid=1, gid=1, user="u",
            output="", error="",
        )  # fmt: skip

    nodes.receive("n0", launch(1), 0.0)
    with pytest.raises(InvariantError, match="still runs"):
        nodes.receive("n0", launch(2), 0.0)


def test_the_nodes_refuse_a_start_before_submission() -> None:
    nodes = SimNodes(1, 1)
    nodes.submit_times[1] = 5.0
    launch = p.LaunchJob(
        job_id=1, name="j", kvsname="k", size=1, row=0, node_index=0, ranks_per_node=(1,),
        slots=(p.RankSlot(rank=0, pe=0),), argv=("x",), cwd="/", env={}, uid=1, gid=1, user="u",
        output="", error="",
    )  # fmt: skip
    with pytest.raises(InvariantError, match="before its submission"):
        nodes.receive("n0", launch, 4.0)


def test_every_run_keeps_the_invariants_on_a_busy_machine(tmp_path: Path) -> None:
    """A model workload far over capacity on 2 nodes x 4 PEs: the engine's checks run at every launch and
    end; here also from the outcomes: PE usage never exceeds the machine and every job ended."""
    trace = generate(400, 8, seed=3)
    save_swf(trace, tmp_path / "m.swf")
    machine = Machine(2, 4)
    result = run(tmp_path / "m.swf", machine=machine, estimate="x3")
    assert len(result.outcomes) == 400
    changes = sorted(
        [(o.start, o.job.procs) for o in result.outcomes] + [(o.end, -o.job.procs) for o in result.outcomes]
    )
    used = 0
    for _, delta in sorted(changes, key=lambda c: (c[0], c[1])):
        used += delta
        assert used <= machine.pes
    assert all(o.start >= o.job.submit and o.end >= o.start for o in result.outcomes)


# ---------------------------------------------------------------------------------------------- determinism


def test_two_runs_are_byte_identical_but_for_the_wall_clock(tmp_path: Path) -> None:
    save_swf(generate(300, 16, seed=7), tmp_path / "m.swf")
    outputs = []
    for _ in range(2):
        result = run(tmp_path / "m.swf", machine=Machine(4, 4))
        workload = to_workload(read_swf(tmp_path / "m.swf").records, 16)
        data = result_json(
            result, manifest(workload, source="m.swf", sha256="x", seed=0, machine=(4, 4), extra={})
        )
        assert data["wall"]["seconds"] > 0
        del data["wall"]
        path = tmp_path / f"out{len(outputs)}.json"
        with open(path, "w") as stream:
            dump_json(data, stream)
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["summary"]["jobs"] == 300
