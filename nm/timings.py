"""What a node manager measures of its heartbeats and context switches for storm-mm's metrics, counted in
buckets (protocol.TIMING_BOUNDS) and sent in every node_status (protocol.SwitchTimings).

Counted from the node's registration with the storm-mm it reports to, never reset after that: the MM adds
what grew since the report before, so a lost report loses nothing. A few hundred bytes per report and an
O(log buckets) increment per observation, whatever the node's uptime: the same at 1,024 nodes as at one.
Pure: the node core (nm/node.py) passes the times in.
"""

from __future__ import annotations

from storm.mm.protocol import TIMING_BOUNDS, SwitchTimings
from storm.mm.tally import Histogram

KEPT = 64  # heartbeats whose times are kept uncounted at most (a report every few seconds counts them)


class Timings:
    def __init__(self) -> None:
        self.restart(late=0, skewed=0)

    def restart(self, *, late: int, skewed: int) -> None:
        """Count from zero (a registration with a new storm-mm); ``late`` and ``skewed`` are the node's
        counts of such heartbeats so far (nm/gang.py's, since the NM started), counted from here on."""
        self.delivery = Histogram(TIMING_BOUNDS)
        self.lateness = Histogram(TIMING_BOUNDS)
        self.duration = Histogram(TIMING_BOUNDS)
        self.late_base, self.skewed_base = late, skewed
        self.delivered_in: list[float] = []  # delivery times not yet counted (see heard)
        self.late_by: list[float] = []  # lateness not yet counted (see began)

    def heard(self, sent: float, received: float) -> None:
        """A heartbeat sent at ``sent`` (the MM's clock) arrived at ``received`` (this node's); counted at
        the next report, as :meth:`began`'s."""
        self.delivered_in.append(received - sent)
        if len(self.delivered_in) >= KEPT:
            self._count()

    def began(self, at: float, begun: float) -> None:
        """A slot whose heartbeat named the instant ``at`` began at ``begun``. Kept as it is and counted at
        the next report: this runs as the slot begins, where an emulator switches its hundreds of nodes one
        after another, and a bucket search per node there widened their spread by a millisecond."""
        self.late_by.append(begun - at)
        if len(self.late_by) >= KEPT:
            self._count()

    def _count(self) -> None:
        for seconds in self.delivered_in:
            self.delivery.observe(seconds)
        for seconds in self.late_by:
            self.lateness.observe(seconds)
        self.delivered_in.clear()
        self.late_by.clear()

    def took(self, seconds: float) -> None:
        """A switch's signals took this long to show in /proc."""
        self.duration.observe(seconds)

    def report(self, *, late: int, skewed: int) -> SwitchTimings | None:
        """What node_status carries (None until something was measured); ``late`` and ``skewed`` as in
        :meth:`restart`, now."""
        self._count()
        late, skewed = late - self.late_base, skewed - self.skewed_base
        if not (self.delivery.count or self.duration.count or late or skewed):  # (lateness: delivery too)
            return None
        (delivery, delivery_sum), (lateness, lateness_sum), (duration, duration_sum) = (
            self.delivery.distribution(),
            self.lateness.distribution(),
            self.duration.distribution(),
        )
        return SwitchTimings(
            delivery=delivery, delivery_sum=delivery_sum, lateness=lateness, lateness_sum=lateness_sum,
            duration=duration, duration_sum=duration_sum, late=late, skewed=skewed,
        )  # fmt: skip
