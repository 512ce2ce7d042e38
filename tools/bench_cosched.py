"""Coscheduling simulator node model: the shortcut against the plain event path, measured in one run.

Each case runs twice in this process, with ``CoschedModel(shortcut=False)`` (every rank's every change an
event) and with the shortcut (a job alone on its PEs walked by its leave-time recurrence), driven the way a
simulator drives it: from event to event (``next_event_ns``), with the outside's control calls at the
slice boundaries. Both runs must end with the same counters; the table gives events, wall seconds and the
ratio. Cases: the FCS paper's building block (2 jobs x 4 ranks, ring, 1 ms granularity, gang-scheduled in
100 ms slices), and a 1,000-iteration job alone.

    python -m storm.tools.bench_cosched [--iterations 60000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from storm.tools.sim.cosched.node import Control, CoschedModel, Costs
from storm.tools.sim.cosched.program import Pattern, Program

MS = 1_000_000


def gang_block(iterations: int, shortcut: bool) -> CoschedModel:
    """Two 4-rank rings on 4 PEs, one stopped while the other runs, swapped every 100 ms."""
    model = CoschedModel(4, Costs(switch_ns=50_000), shortcut=shortcut)
    program = Program.balanced(4, MS, iterations, Pattern.RING, latency_ns=20_000)
    model.add_job(0, 1, program, [0, 1, 2, 3])
    model.add_job(0, 2, program, [0, 1, 2, 3], Control(stopped=True))
    slot, n = 100 * MS, 0
    while model.completion_ns(1) is None or model.completion_ns(2) is None:
        n += 1
        boundary = n * slot
        while (upcoming := model.next_event_ns()) is not None and upcoming < boundary:
            model.advance(upcoming)
        running, stopped = (1, 2) if n % 2 == 0 else (2, 1)
        for rank in range(4):
            model.control(boundary, (stopped, rank), Control(stopped=True))
            model.control(boundary, (running, rank), Control())
    return model


def alone(iterations: int, shortcut: bool) -> CoschedModel:
    """One 8-rank imbalanced ring alone on 8 PEs, spin-block with wake-ups, run to its end."""
    model = CoschedModel(8, Costs(wakeup_ns=30_000), shortcut=shortcut)
    program = Program(tuple(MS + 37_000 * r for r in range(8)), iterations, Pattern.RING, latency_ns=20_000)
    model.add_job(0, 1, program, list(range(8)), Control(spin_ns=120_000))
    model.run_until_done(10**15)
    return model


def snapshot(model: CoschedModel) -> list[object]:
    return [model.counters(k) for k in sorted(model.keys())] + [model.pe_counters(pe) for pe in range(4)]


def measure(name: str, build: Callable[[int, bool], CoschedModel], iterations: int) -> dict[str, object]:
    line: dict[str, object] = {"case": name, "iterations": iterations}
    results = []
    for shortcut in (False, True):
        began = time.perf_counter()
        model = build(iterations, shortcut)
        seconds = time.perf_counter() - began
        key = "shortcut" if shortcut else "events"
        line[f"{key}_events"] = model.events_run
        line[f"{key}_s"] = round(seconds, 3)
        results.append(snapshot(model))
    if results[0] != results[1]:
        raise SystemExit(f"{name}: the shortcut and the event path disagree")
    line["speedup"] = round(float(line["events_s"]) / max(float(line["shortcut_s"]), 1e-9), 1)  # type: ignore[arg-type]
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_cosched", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=60_000, help="of the gang building block")
    parser.add_argument("--alone-iterations", type=int, default=1_000)
    parser.add_argument("--json", help="write the lines here too")
    args = parser.parse_args(argv)
    print("| case | iterations | events (event path) | s | events (shortcut) | s | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    lines = []
    cases: list[tuple[str, Callable[[int, bool], CoschedModel], int]] = [
        ("gang 2x4 ring 1 ms, 100 ms slices", gang_block, args.iterations),
        ("alone 8-rank ring, spin-block", alone, args.alone_iterations),
        ("gang 2x4 ring 1 ms, 100 ms slices", gang_block, args.alone_iterations),
    ]
    for name, build, iterations in cases:
        line = measure(name, build, iterations)
        lines.append(line)
        print(
            f"| {name} | {iterations} | {line['events_events']} | {line['events_s']} | "
            f"{line['shortcut_events']} | {line['shortcut_s']} | {line['speedup']}x |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(lines, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
