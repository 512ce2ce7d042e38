"""The FCS paper's dynamic experiment (its section 5, first set; issue 15 item 4): the workload.

A workload is 1,000 jobs of the Lublin-Feitelson model (tools/sim/lublin.py, its typed mix of
interactive and batch jobs by default) for the paper's Crescendo, 16 nodes x 2 PEs, or the jobs of an SWF
trace (:func:`from_trace`). Every job is the paper's synthetic BSP program (tools/sim/cosched/program.py)
with, per job:

- its size from the model (or the trace, fitted to the machine: :data:`SIZE_RULES`);
- its isolated runtime: the model's runtime times one factor for the whole workload (below);
- drawn from one seeded RNG, in job order: a granularity, log-uniform between 1 ms and 1 s by default (the
  paper gives no distribution: this one is ours); a communication pattern, ring, all-reduce or none with
  equal chances (the paper says "chosen randomly"); and whether it is load-imbalanced, for half the jobs by
  default, then its odd ranks compute twice as much per iteration, as in the paper's scenario 3.2. The
  granularity is the even ranks' computation per iteration, as the paper's 1 ms building block is.
  A 1-rank job does not communicate (it has no partner) and is balanced (it has no odd rank).
- iterations = isolated runtime / the length of one iteration (measured on the program's recurrence), the
  granularity then stretched or shrunk a little so that :meth:`Program.dedicated_ns`, the runtime alone on
  dedicated PEs, is within an iteration of the target; a job shorter than its drawn granularity is one
  iteration of its runtime. That dedicated runtime is the job's isolated runtime everywhere after
  (offered load, slowdowns, the 500 shortest and longest jobs).
- a requested time: the isolated runtime rounded up to a whole second. storm-mm's EASY multiplies it by the
  MPL for the time-sharing policies (mm/scheduler.py runtime_estimate), as the paper's section 5.1 does.

Runtime scale (ours): the paper ran the workload live, so one run took hours, not the model's days. The
model's runtimes are multiplied by one factor chosen so that at 80% offered load the arrivals span
``span_s`` (2 hours by default) of simulated time. The scaled runtimes keep the model's spread (a median
near half a second, a few jobs of half an hour).

Offered load, as the paper defines it: sum(isolated runtime x size) / (PEs x last arrival time), arrivals
shifted so that the first is at 0. A load is reached by multiplying every arrival time by one constant
(the paper's section 5.1), which leaves every job itself unchanged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from storm.tools.sim.cosched.cluster import NS, SimJob
from storm.tools.sim.cosched.program import Pattern, Program
from storm.tools.sim.lublin import MIXES, generate
from storm.tools.sim.swf import SwfRecord, to_workload

PATTERNS = (Pattern.RING, Pattern.ALLREDUCE, Pattern.NONE)
SIZE_RULES = ("scale", "cap", "drop")
REFERENCE_LOAD = 0.8  # the load at which ``span_s`` is the arrivals' span


@dataclass(frozen=True)
class Draws:
    """How each job's program is drawn (module docstring)."""

    granularity_min_s: float = 0.001
    granularity_max_s: float = 1.0
    imbalanced_share: float = 0.5
    imbalance: float = 2.0  # the odd ranks' computation per iteration over the even ranks'
    latency_ns: int = 5_000  # one communication step's network time: the calibration's (scenarios.py)

    def __post_init__(self) -> None:
        if not 0 < self.granularity_min_s <= self.granularity_max_s:
            raise ValueError("granularity: 0 < min <= max")
        if not 0 <= self.imbalanced_share <= 1:
            raise ValueError("the share of imbalanced jobs is between 0 and 1")
        if self.imbalance < 1 or self.latency_ns < 0:
            raise ValueError("imbalance >= 1 and latency >= 0")


@dataclass(frozen=True)
class DynamicJob:
    """One job of the workload, before its arrival is scaled to a load."""

    name: str
    arrival_s: float  # at the reference span: 0 for the first job
    program: Program
    granularity_ns: int
    imbalanced: bool
    isolated_ns: int  # Program.dedicated_ns(): its runtime alone

    @property
    def size(self) -> int:
        return self.program.ranks

    @property
    def isolated_s(self) -> float:
        return self.isolated_ns / NS

    @property
    def time_limit(self) -> float:
        """The requested time: the isolated runtime rounded up to a whole second."""
        return float(max(1, math.ceil(self.isolated_ns / NS)))


@dataclass(frozen=True)
class DynamicWorkload:
    jobs: tuple[DynamicJob, ...]
    pes: int
    source: str  # what the jobs came from, for the report
    runtime_factor: float  # model (or trace) runtime -> target isolated runtime

    @property
    def work(self) -> float:
        """sum(isolated runtime x size), PE-seconds."""
        return sum(j.isolated_s * j.size for j in self.jobs)

    @property
    def last_arrival_s(self) -> float:
        return max((j.arrival_s for j in self.jobs), default=0.0)

    def offered_load(self, arrival_factor: float = 1.0) -> float:
        """The paper's offered load with every arrival multiplied by ``arrival_factor``."""
        span = self.last_arrival_s * arrival_factor
        return self.work / (self.pes * span) if span > 0 else math.inf

    def arrival_factor(self, load: float) -> float:
        """The constant the arrivals are multiplied by to offer ``load``."""
        if load <= 0:
            raise ValueError("an offered load is positive")
        return self.offered_load() / load

    def at_load(self, load: float) -> list[SimJob]:
        """The jobs to submit to offer ``load``. O(jobs)."""
        factor = self.arrival_factor(load)
        return [
            SimJob(j.name, j.program, round(j.arrival_s * factor * NS), time_limit=j.time_limit)
            for j in self.jobs
        ]


def program_for(
    size: int, runtime_ns: int, granularity_ns: int, *, pattern: Pattern, imbalanced: bool, draws: Draws
) -> Program:
    """A BSP program of ``size`` ranks whose dedicated runtime is close to ``runtime_ns``: as many
    iterations of ``granularity_ns`` as fit, then the granularity stretched or shrunk a little so that
    they fill it. O(size) (dedicated_ns extrapolates)."""
    if size == 1:
        pattern, imbalanced = Pattern.NONE, False
    factor = draws.imbalance if imbalanced else 1.0
    latency = draws.latency_ns if pattern is not Pattern.NONE else 0

    def build(even: int, iterations: int) -> Program:
        compute = tuple(round(even * factor) if rank % 2 else even for rank in range(size))
        return Program(compute, iterations, pattern, latency)

    # An iteration's length in the steady state (an imbalanced ring's slow ranks never wait for the
    # latency, for instance), measured on the recurrence rather than guessed.
    period = build(granularity_ns, 3).dedicated_ns() - build(granularity_ns, 2).dedicated_ns()
    iterations = max(1, round(runtime_ns / period))
    # Times scale with the computation (the latency, microseconds, is all that does not).
    even = max(1, round(granularity_ns * runtime_ns / build(granularity_ns, iterations).dedicated_ns()))
    return build(even, iterations)


def _jobs(
    shape: Sequence[tuple[float, int, float]], draws: Draws, seed: int, pes: int, span_s: float
) -> tuple[tuple[DynamicJob, ...], float]:
    """Jobs from (arrival s, size, runtime s) in arrival order: runtimes scaled so that the arrivals span
    ``span_s`` at the reference load, programs drawn from ``seed``. O(jobs x size)."""
    if not shape:
        raise ValueError("a workload needs at least one job")
    first = shape[0][0]
    span = shape[-1][0] - first
    if span <= 0:
        raise ValueError("the jobs must not all arrive at once: the offered load is undefined")
    work = sum(size * runtime for _, size, runtime in shape)
    factor = REFERENCE_LOAD * pes * span_s / work
    rng = random.Random(seed)
    low, high = math.log(draws.granularity_min_s), math.log(draws.granularity_max_s)
    jobs = []
    for number, (arrival, size, runtime) in enumerate(shape):
        granularity = round(math.exp(rng.uniform(low, high)) * NS)
        pattern = PATTERNS[rng.randrange(len(PATTERNS))]
        imbalanced = rng.random() < draws.imbalanced_share
        target = max(1, round(runtime * factor * NS))
        program = program_for(size, target, granularity, pattern=pattern, imbalanced=imbalanced, draws=draws)
        jobs.append(
            DynamicJob(
                name=f"j{number}", arrival_s=(arrival - first) * span_s / span, program=program,
                granularity_ns=min(program.compute_ns), imbalanced=len(set(program.compute_ns)) > 1,
                isolated_ns=program.dedicated_ns(),
            )
        )  # fmt: skip
    return tuple(jobs), factor


def from_lublin(
    count: int = 1000,
    nodes: int = 16,
    pes_per_node: int = 2,
    seed: int = 0,
    *,
    span_s: float = 7200.0,
    mix: str = "typed",
    draws: Draws | None = None,
) -> DynamicWorkload:
    """``count`` jobs of the Lublin-Feitelson model, sized for the machine's PEs, and their programs; the
    same for the same arguments. O(count x size)."""
    if mix not in MIXES:
        raise ValueError(f"mix {mix!r}: one of {', '.join(MIXES)}")
    if count < 2:
        raise ValueError("a dynamic workload needs at least 2 jobs")
    pes = nodes * pes_per_node
    trace = generate(count, pes, seed, mix)
    records = sorted(trace.records, key=lambda r: (r.submit, r.job))
    shape = [(float(r.submit), r.procs, float(r.runtime)) for r in records]
    jobs, factor = _jobs(shape, draws or Draws(), seed, pes, span_s)
    source = f"Lublin-Feitelson ({mix}), {count} jobs, seed {seed}"
    return DynamicWorkload(jobs, pes, source, factor)


def fit_size(procs: int, pes: int, trace_pes: int, rule: str) -> int | None:
    """A trace job's size on ``pes`` PEs: ``scale`` (times pes / trace_pes, at least 1), ``cap`` (at most
    pes) or ``drop`` (None when wider than the machine)."""
    if rule == "scale":
        return max(1, min(pes, round(procs * pes / trace_pes)))
    if rule == "cap":
        return min(procs, pes)
    if rule == "drop":
        return procs if procs <= pes else None
    raise ValueError(f"size rule {rule!r}: one of {', '.join(SIZE_RULES)}")


def from_trace(
    records: Sequence[SwfRecord],
    trace_pes: int,
    name: str,
    *,
    count: int | None = 1000,
    nodes: int = 16,
    pes_per_node: int = 2,
    seed: int = 0,
    span_s: float = 7200.0,
    sizes: str = "scale",
    draws: Draws | None = None,
) -> DynamicWorkload:
    """The first ``count`` usable jobs of an SWF trace made for ``trace_pes`` PEs (swf.to_workload's rules,
    wider jobs fitted by ``sizes``), with drawn programs; runtimes and arrivals scaled as for the model's."""
    pes = nodes * pes_per_node
    if trace_pes < 1:
        raise ValueError("the trace's machine size must be at least 1")
    usable = to_workload(records, max(trace_pes, max((r.procs for r in records), default=1)))
    shape = []
    for job in usable.jobs:
        size = fit_size(job.procs, pes, trace_pes, sizes)
        if size is not None:
            shape.append((job.submit, size, job.runtime))
    if count is not None:
        shape = shape[:count]
    if len(shape) < 2:
        raise ValueError(f"{name}: fewer than 2 usable jobs")
    jobs, factor = _jobs(shape, draws or Draws(), seed, pes, span_s)
    how = {
        "scale": f"sizes scaled from {trace_pes} PEs to {pes}",
        "cap": f"sizes capped at {pes} PEs",
        "drop": f"jobs wider than {pes} PEs left out",
    }[sizes]
    source = f"{name}: {len(jobs)} jobs, {how}, seed {seed}"
    return DynamicWorkload(jobs, pes, source, factor)
