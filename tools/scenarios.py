"""The synthetic workloads of the FCS paper's section 3 (Tables 3-6), sized to a local cluster.

Pure: which jobs each scenario submits, the paper's figures to compare with, and the summaries of a run.
``storm bench scenarios`` (tools/bench_scenarios.py) runs them on real clusters.

Every job is the BSP application (tools/apps/bsp.py) with a 1 ms granularity, the paper's "building block",
run for a fixed number of iterations so that a scheduler that slows it makes it finish later. ``length`` is
the building block's intended time alone (the paper's 60 s); the benchmark also measures it, as the unit that
normalises both our figures and the paper's.

"Alternating nodes" of the paper (every other node computes twice as much) are the ranks of odd-numbered
nodes here: with one PE per node, the odd ranks.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from storm.mm.protocol import POLICIES, ProfileEntry

GRANULARITY = 0.001

# The paper's completion time of each job and its turnaround and mean response, per algorithm, in seconds
# (FCFS is batch here, GS gang). Its building block ran 60 s alone.
PAPER_UNIT = 60.0
PAPER: dict[str, dict[str, tuple[float, ...]]] = {
    "balanced": {"batch": (60, 120), "gang": (124, 124), "sb": (126, 134), "fcs": (125, 126)},
    "imbalanced": {"batch": (120, 240), "gang": (244, 245), "sb": (193, 194), "fcs": (197, 197)},
    "complementing": {
        "batch": (60, 121, 301), "gang": (185, 186, 308), "sb": (144, 142, 244), "fcs": (192, 193, 197),
    },
    "mixed": {
        "batch": (120, 241, 302), "gang": (305, 305, 185), "sb": (213, 214, 276), "fcs": (252, 253, 155),
    },
}  # fmt: skip


@dataclass(frozen=True)
class JobPlan:
    name: str
    args: tuple[str, ...]  # options of the BSP application


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    jobs: tuple[JobPlan, ...]


def odd_node_ranks(nodes: int, pes_per_node: int) -> str:
    """The ranks on odd-numbered nodes (storm places a node's ranks together), as --slow takes them."""
    ranks = [n * pes_per_node + i for n in range(1, nodes, 2) for i in range(pes_per_node)]
    return ",".join(map(str, ranks))


def even_node_ranks(nodes: int, pes_per_node: int) -> str:
    ranks = [n * pes_per_node + i for n in range(0, nodes, 2) for i in range(pes_per_node)]
    return ",".join(map(str, ranks))


def build(name: str, length: float, nodes: int, pes_per_node: int) -> Scenario:
    """One scenario, its building block ``length`` seconds long (before communication costs)."""
    iterations = str(max(1, round(length / GRANULARITY)))
    base = ("--granularity", str(GRANULARITY), "--pattern", "ring", "--iterations", iterations)
    odd, even = odd_node_ranks(nodes, pes_per_node), even_node_ranks(nodes, pes_per_node)
    balanced = JobPlan("balanced", (*base, "--slow", "none"))
    # Section 3.2: every other node computes twice as much per iteration, the other way round in job 2.
    # Slightly over 2:1, as in the paper's footnote 4, so that the fast ranks' granularity is clearly
    # above CS_thresh (2 ms) rather than on it.
    imb1 = JobPlan("imbalanced-1", (*base, "--imbalance", "2.2", "--slow", odd))
    imb2 = JobPlan("imbalanced-2", (*base, "--imbalance", "2.2", "--slow", even))
    if name == "alone":
        return Scenario(name, "one balanced job alone (the cost of a policy to a CS job)", (balanced,))
    if name == "balanced":
        return Scenario(name, "two balanced fine-grained jobs (Table 3)", (balanced, balanced))
    if name == "imbalanced":
        return Scenario(name, "two complementary load-imbalanced jobs (Table 4)", (imb1, imb2))
    if name == "complementing":
        # Section 3.3: two non-communicating jobs of one length on the even nodes only (their ranks on odd
        # nodes have nothing to do), and a communicating job of three lengths whose odd nodes compute three
        # times as much per iteration as its even nodes: 3 lengths of work on every PE.
        quiet = ("--granularity", str(GRANULARITY), "--pattern", "none", "--iterations", iterations)
        idle = ("--imbalance", "0", "--slow", odd)
        job3 = ("--granularity", str(GRANULARITY), "--pattern", "ring", "--iterations", iterations)
        return Scenario(
            name,
            "two non-communicating jobs and an imbalanced one that complement each other (Table 5)",
            (
                JobPlan("quiet-1", (*quiet, *idle)),
                JobPlan("quiet-2", (*quiet, *idle)),
                JobPlan("imbalanced-3x", (*job3, "--imbalance", "3", "--slow", odd)),
            ),
        )
    if name == "mixed":
        return Scenario(name, "the two imbalanced jobs and a balanced one (Table 6)", (imb1, imb2, balanced))
    raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


SCENARIOS = ("alone", "balanced", "imbalanced", "complementing", "mixed")


def parse_policy(label: str) -> tuple[str, dict[str, str]]:
    """A policy as the benchmark names it: ``fcs``, or a variant with [fcs] settings such as
    ``fcs@f_priority=always`` or ``fcs@cslots_min=10;f_priority=always``; ValueError if it is none."""
    policy, _, settings = label.partition("@")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    pairs = [item.partition("=") for item in settings.split(";") if item]
    if any(not key or not sep for key, sep, _ in pairs):
        raise ValueError(f"{label!r}: settings are key=value, separated by ';'")
    return policy, {key: value for key, _, value in pairs}


def argv(plan: JobPlan) -> list[str]:
    return [sys.executable, "-m", "storm.tools.apps.bsp", *plan.args]


# ------------------------------------------------------------------------------------------- results


PROFILE_PARTS = ("compute", "poll", "blocked", "stopped", "queued")


@dataclass(frozen=True)
class RunResult:
    """One run of a scenario: each job's completion time (seconds from the first submission) and response
    time (seconds from its own submission), in the order of the scenario's jobs; and where its processes'
    time went, per class: class ("-" outside FCS) -> wall, the PROFILE_PARTS and other -> seconds, summed
    over every process of every job."""

    completion: tuple[float, ...]
    response: tuple[float, ...]
    profile: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def turnaround(self) -> float:
        return max(self.completion)

    @property
    def mean_response(self) -> float:
        return statistics.mean(self.response)


def run_result(
    submits: Sequence[float], ends: Sequence[float], profile: Iterable[ProfileEntry] = ()
) -> RunResult:
    first = min(submits)
    return RunResult(
        completion=tuple(e - first for e in ends),
        response=tuple(e - s for s, e in zip(submits, ends, strict=True)),
        profile=profile_totals(profile),
    )


def profile_totals(entries: Iterable[ProfileEntry]) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for e in entries:
        row = totals.setdefault(e.klass or "-", dict.fromkeys(("wall", *PROFILE_PARTS, "other"), 0.0))
        parts = [getattr(e, name) for name in PROFILE_PARTS]
        for name, value in zip(PROFILE_PARTS, parts, strict=True):
            row[name] += value
        row["wall"] += e.wall
        row["other"] += max(0.0, e.wall - sum(parts))
    return totals


def best_and_median(runs: Sequence[RunResult]) -> tuple[RunResult, RunResult]:
    """The run with the best turnaround (as the paper took the best of five), and the median run (of an
    even number, the worse of the middle two: the median should not flatter)."""
    ordered = sorted(runs, key=lambda r: r.turnaround)
    return ordered[0], ordered[len(ordered) // 2]


def paper_normalised(scenario: str, policy: str) -> tuple[tuple[float, ...], float, float] | None:
    """The paper's completion times, turnaround and mean response in units of its building block."""
    times = PAPER.get(scenario, {}).get(policy)
    if times is None:
        return None
    # The paper's mean response is the mean of the completion times: its jobs arrived together.
    norm = tuple(t / PAPER_UNIT for t in times)
    return norm, max(norm), statistics.mean(norm)
