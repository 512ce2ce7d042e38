"""Metrics: the timings of heartbeats and context switches that node managers report in ``node_status``
(SwitchTimings, TIMING_BOUNDS), for storm-mm's Prometheus endpoint.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import check as _check

# --------------------------------------------------------------------------------------------------------
# Metrics: what node managers measure of heartbeats and context switches, for storm-mm's Prometheus endpoint
# (mm/exporter.py). It rides in node_status, which every node sends anyway once per report interval.

# The upper bounds (seconds) of the buckets of every timing distribution, on both sides of the link: a node
# sends a count per bucket rather than its samples, so that a report stays small and the MM adds up a
# thousand nodes' distributions into one histogram by adding counts. From 50 us (a switch on an idle host)
# to 1 s (a heartbeat ten slices late).
TIMING_BOUNDS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)
TIMING_BUCKETS_MAX = 64  # what a report may carry per distribution (a newer node's finer buckets, ignored)


@dataclass(frozen=True, kw_only=True)
class SwitchTimings:
    """A node's heartbeats and context switches since it registered with this storm-mm (each count only grows
    until the node manager restarts or registers with another storm-mm; the MM adds what grew).

    Three distributions, each a count per bucket (``counts[i]``: observations at or under TIMING_BOUNDS[i]
    and above the bound before; the last count: above every bound; () when nothing was observed) and the
    sum of what was observed (seconds). ``delivery``: when a heartbeat arrived (the node's clock) minus when
    the MM sent it (the MM's): exact on one host, as good as the clocks' agreement between hosts.
    ``lateness``: when the switch began minus the instant the heartbeat named, for heartbeats that named one.
    ``duration``: from a switch's signals until /proc showed every one in effect (switches that signalled
    something). Negative times (clocks that disagree, a switch early for a skewed clock) count as 0.
    ``late`` and ``skewed``: heartbeats switched on arrival rather than at their instant (nm/gang.py).
    Flat rather than three nested records: a thousand nodes send one every report interval, and each record
    costs the MM's decoder a few microseconds.
    """

    delivery: tuple[int, ...] = ()
    delivery_sum: float = 0.0
    lateness: tuple[int, ...] = ()
    lateness_sum: float = 0.0
    duration: tuple[int, ...] = ()
    duration_sum: float = 0.0
    late: int = 0
    skewed: int = 0

    def __post_init__(self) -> None:
        for counts in (self.delivery, self.lateness, self.duration):
            _check(len(counts) <= TIMING_BUCKETS_MAX, f"at most {TIMING_BUCKETS_MAX} bucket counts")
            _check(not counts or min(counts) >= 0, "bucket counts must be >= 0")
        sums = (self.delivery_sum, self.lateness_sum, self.duration_sum)
        _check(min(sums) >= 0 and self.late >= 0 and self.skewed >= 0, "sums, late and skewed must be >= 0")

    def distributions(self) -> tuple[tuple[tuple[int, ...], float], ...]:
        """(counts, sum) of delivery, lateness and duration, in that order."""
        return (
            (self.delivery, self.delivery_sum),
            (self.lateness, self.lateness_sum),
            (self.duration, self.duration_sum),
        )
