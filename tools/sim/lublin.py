"""The Lublin-Feitelson workload model (U. Lublin and D. G. Feitelson, "The workload on parallel
supercomputers: modeling the characteristics of rigid jobs", JPDC 63(11), 2003), as a generator of SWF traces.

Written from the paper's model and its published parameters (as the authors' reference program lists them),
for both job types, interactive and batch, each with its own parameters:

- size: serial with probability ``serial``; otherwise log2(size) is drawn from a two-stage uniform
  distribution (U(low, med) with probability ``uprob``, else U(med, hi)), rounded to an integer (a power of
  two) with probability ``pow2`` (of all jobs), and size = round(2^x).
- runtime: ln(runtime) follows a hyper-gamma distribution, gamma(a1, b1) with probability
  p = pa x size + pb (clipped to [0, 1]), else gamma(a2, b2); draws above ln(runtime) = 12 are redrawn.
- arrivals: ln(inter-arrival time at the daily peak) follows gamma(aarr x arar, barr) (redrawn above 13);
  the day has 48 half-hour buckets weighted by the gamma(anum, bnum) density over the hours of a day that
  starts at 11:00 (the model's cycle), and a job's time is paid for bucket by bucket with those weights,
  so fewer jobs arrive at night. The two types arrive independently; the earlier of the two is next.

The published parameters fit a 128-node machine (hi = log2(128) = 7). For P nodes, hi = log2(P) for batch
jobs and log2(P) - 1.5 for interactive ones, with med = hi - 2 and hi - 2.5 (which gives back the
published 5 and 3 at P = 128), as the model's authors advise (med between hi - 3.5 and hi - 1.5).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from storm.tools.sim.swf import SwfRecord, SwfTrace

BUCKETS = 48
BUCKET_SECONDS = 86400 / BUCKETS
DAY_START_HOUR = 11  # the model's day runs from 11:00 to 11:00
MAX_LOG_RUNTIME = 12.0  # ln(runtime) above this (about 45 h) is drawn again
MAX_LOG_INTERARRIVAL = 13.0
INTERACTIVE, BATCH = 0, 1


@dataclass(frozen=True)
class TypeParameters:
    serial: float
    pow2: float
    low: float
    med: float
    hi: float
    uprob: float
    a1: float
    b1: float
    a2: float
    b2: float
    pa: float
    pb: float
    aarr: float
    barr: float
    anum: float
    bnum: float
    arar: float


def published(nodes: int) -> dict[int, TypeParameters]:
    """The paper's parameters for both job types, sizes scaled to ``nodes`` (see the module's docstring)."""
    hi = math.log2(nodes)
    return {
        BATCH: TypeParameters(
            serial=0.2927, pow2=0.6686, low=1.2, med=hi - 2, hi=hi, uprob=0.875,
            a1=6.57, b1=0.823, a2=639.1, b2=0.0156, pa=-0.003, pb=0.6986,
            aarr=6.0415, barr=0.8531, anum=6.1271, bnum=5.2740, arar=1.0519,
        ),
        INTERACTIVE: TypeParameters(
            serial=0.1541, pow2=0.625, low=1.0, med=hi - 4, hi=hi - 1.5, uprob=0.705,
            a1=3.8351, b1=0.6605, a2=7.073, b2=0.6856, pa=-0.0118, pb=0.9156,
            aarr=6.5510, barr=0.6621, anum=8.9186, bnum=3.6680, arar=0.9797,
        ),
    }  # fmt: skip


def whole_sample(nodes: int) -> TypeParameters:
    """The paper's parameters fitted to all jobs together, types ignored (``--mix whole``): one arrival
    process, all jobs interactive. The reference program's INCLUDE_JOBS_TYPE = 0; med = hi - 2.5."""
    hi = math.log2(nodes)
    return TypeParameters(
        serial=0.244, pow2=0.576, low=0.8, med=hi - 2.5, hi=hi, uprob=0.86,
        a1=4.2, b1=0.94, a2=312.0, b2=0.03, pa=-0.0054, pb=0.78,
        aarr=10.2303, barr=0.4871, anum=8.1737, bnum=3.9631, arar=1.0225,
    )  # fmt: skip


MIXES = ("typed", "whole")


def gamma_cdf(x: float, alpha: float, beta: float) -> float:
    """P(X <= x) for X ~ gamma(shape alpha, scale beta): the regularized lower incomplete gamma function,
    by its power series (x / beta stays below 60 here, where the series converges in a few hundred terms)."""
    if x <= 0:
        return 0.0
    z = x / beta
    term = total = 1.0 / alpha
    n = 0
    while abs(term) > 1e-15 * abs(total) and n < 10_000:
        n += 1
        term *= z / (alpha + n)
        total += term
    return min(1.0, total * math.exp(-z + alpha * math.log(z) - math.lgamma(alpha)))


class _Arrivals:
    """One job type's arrival process (see the module's docstring)."""

    def __init__(self, params: TypeParameters, rng: random.Random) -> None:
        self.rng = rng
        self.alpha = params.aarr * params.arar
        self.beta = params.barr
        weights = [0.0] * BUCKETS
        for i in range(DAY_START_HOUR, BUCKETS + DAY_START_HOUR):
            # Bucket i of the model's day, folded back onto the clock's 48 half hours.
            weights[(i - 1) % BUCKETS] = gamma_cdf(i + 0.5, params.anum, params.bnum) - gamma_cdf(
                i - 0.5, params.anum, params.bnum
            )
        mean = sum(weights) / BUCKETS
        self.weights = [w / mean for w in weights]
        self.bucket = 0  # the run starts at midnight
        self.points = 0.0
        self.remainder = 0.0
        self.time = 0.0
        self.advance()

    def advance(self) -> None:
        """Move ``time`` to this type's next arrival."""
        while True:
            draw = self.rng.gammavariate(self.alpha, self.beta)
            if draw <= MAX_LOG_INTERARRIVAL:
                break
        self.points += math.exp(draw) / BUCKET_SECONDS
        elapsed = 0.0
        while self.points > self.weights[self.bucket]:
            self.points -= self.weights[self.bucket]
            self.bucket = (self.bucket + 1) % BUCKETS
            elapsed += BUCKET_SECONDS
        remainder = self.points / self.weights[self.bucket]
        elapsed += BUCKET_SECONDS * (remainder - self.remainder)
        self.remainder = remainder
        self.time += elapsed


def _size(params: TypeParameters, rng: random.Random, nodes: int) -> int:
    u = rng.random()
    if u <= params.serial:
        return 1
    if rng.random() <= params.uprob:
        exponent = rng.uniform(params.low, params.med)
    else:
        exponent = rng.uniform(params.med, params.hi)
    if u <= params.serial + params.pow2:
        exponent = float(round(exponent))
    return max(1, min(nodes, round(2**exponent)))


def _runtime(params: TypeParameters, rng: random.Random, size: int) -> int:
    p = min(1.0, max(0.0, params.pa * size + params.pb))
    while True:
        if rng.random() <= p:
            draw = rng.gammavariate(params.a1, params.b1)
        else:
            draw = rng.gammavariate(params.a2, params.b2)
        if draw <= MAX_LOG_RUNTIME:
            return max(1, int(math.exp(draw)))


def generate(jobs: int, nodes: int, seed: int, mix: str = "typed") -> SwfTrace:
    """``jobs`` jobs of the model for a machine of ``nodes`` nodes, the same for the same seed.

    ``mix``: ``typed`` (interactive and batch jobs, each type with its parameters) or ``whole`` (the
    parameters fitted to all jobs at once; shared/traces/lublin-256.swf was made so). Field 15 (queue)
    holds the job's type, 0 interactive and 1 batch, as the model's reference output does; there are no
    requested times (-1)."""
    if jobs < 0 or nodes < 2:
        raise ValueError("the model needs at least 2 nodes and a non-negative number of jobs")
    if mix not in MIXES:
        raise ValueError(f"mix {mix!r}: one of {', '.join(MIXES)}")
    rng = random.Random(seed)
    params = published(nodes) if mix == "typed" else {INTERACTIVE: whole_sample(nodes)}
    arrivals = {kind: _Arrivals(params[kind], rng) for kind in params}
    header = [
        "; Version: 2.2",
        "; Computer: a model machine",
        "; Acknowledge: Uri Lublin, Hebrew University (the Lublin-Feitelson model, JPDC 2003)",
        (
            f"; Note: storm sim generate --model lublin --mix {mix} --jobs {jobs} --nodes {nodes}"
            f" --seed {seed}"
        ),
        f"; MaxJobs: {jobs}",
        f"; MaxRecords: {jobs}",
        f"; MaxNodes: {nodes}",
        f"; MaxProcs: {nodes}",
        "; Note: field 15 (queue) is the job type: 0 interactive, 1 batch",
    ]
    records = []
    for number in range(1, jobs + 1):
        kind = min(arrivals, key=lambda k: (arrivals[k].time, k))
        submit = int(arrivals[kind].time)
        arrivals[kind].advance()
        size = _size(params[kind], rng, nodes)
        runtime = _runtime(params[kind], rng, size)
        records.append(
            SwfRecord(
                job=number, submit=submit, runtime=runtime, procs=size, req_procs=size, status=1, queue=kind
            )
        )
    return SwfTrace(header, records)
