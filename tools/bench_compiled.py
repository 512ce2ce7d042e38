"""The node model compiled with mypyc against its Python sources, measured in one run.

The case is the event path at its busiest: three spin-block jobs of fine granularity sharing 8 PEs in the
calibrated costs' 1.5 ms round-robin slices, where no job is ever alone (so the shortcut never walks) and
every iteration is several events. It runs in two fresh interpreters, one with the compiled modules and one
with ``STORM_SIM_PURE=1``; both must end with the same completions and counters. The table gives events,
wall seconds, microseconds per event and the ratio.

    python -m storm.tools.bench_compiled [--iterations 4000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASE = """
import dataclasses, json, sys, time
from storm.tools.sim.cosched import COMPILED
from storm.tools.sim.cosched.node import Control, CoschedModel, Costs, WaitMode
from storm.tools.sim.cosched.program import Pattern, Program
MS, n = 1_000_000, int(sys.argv[1])
start = time.perf_counter()
model = CoschedModel(8, Costs(switch_ns=2 * MS, wakeup_ns=500_000, slice_ns=1_500_000))
block = Control(wait=WaitMode.SPIN_BLOCK, spin_ns=120_000)
ring = Program.balanced(8, 3 * MS + 55_000, n, Pattern.RING, latency_ns=5_000)
reduce = Program.balanced(4, 7 * MS + 55_000, n // 2, Pattern.ALLREDUCE, latency_ns=5_000)
uneven = Program((2 * MS, 4 * MS) * 2, 3 * n // 4, Pattern.RING, latency_ns=5_000)
model.add_job(0, 1, ring, list(range(8)), block)
model.add_job(0, 2, reduce, [0, 2, 4, 6], block)
model.add_job(0, 3, uneven, [1, 3, 5, 7], block)
model.run_until_done(10**15)
wall = time.perf_counter() - start
ends = [model.completion_ns(j) for j in (1, 2, 3)]
state = [ends, [dataclasses.asdict(model.counters(k)) for k in sorted(model.keys())]]
print(json.dumps({"compiled": COMPILED, "events": model.events_run, "wall": wall, "state": state}))
"""


def run(iterations: int, pure: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "STORM_SIM_PURE"}
    if pure:
        env["STORM_SIM_PURE"] = "1"
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", CASE, str(iterations)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_compiled", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=4000, help="of the 8-rank ring (default 4000)")
    parser.add_argument("--json", help="write the lines here too")
    args = parser.parse_args(argv)
    compiled, pure = run(args.iterations, pure=False), run(args.iterations, pure=True)
    if not compiled["compiled"]:
        print("the compiled model is not in use here (`pip install -e .` builds it)", file=sys.stderr)
        return 1
    if compiled["state"] != pure["state"]:
        print("the compiled model and its sources disagree", file=sys.stderr)
        return 1
    lines = []
    print(f"{'model':<10} {'events':>10} {'wall s':>8} {'us/event':>9}")
    for name, r in (("sources", pure), ("compiled", compiled)):
        events, wall = int(r["events"]), float(r["wall"])  # type: ignore[call-overload, arg-type]
        lines.append({"model": name, "events": events, "wall": wall, "us_per_event": wall / events * 1e6})
        print(f"{name:<10} {events:>10} {wall:>8.2f} {wall / events * 1e6:>9.2f}")
    ratio = float(pure["wall"]) / float(compiled["wall"])  # type: ignore[arg-type]
    print(f"compiled is {ratio:.1f}x faster, with the same completions and counters")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"iterations": args.iterations, "lines": lines, "ratio": ratio}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
