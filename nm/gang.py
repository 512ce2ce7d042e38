"""What a node manager makes of heartbeats: which of its jobs may run now.

Under gang scheduling the MM publishes the active row of the matrix every time slice. A node manager follows
only heartbeats of the MM it registered with (its epoch) and only newer ones (a higher ``seq``), so a
replayed, reordered or stale heartbeat changes nothing. When heartbeats stop for longer than ``timeout`` it
falls back to letting every job run: no job may hang stopped forever because the MM or the network failed.

A heartbeat may name the instant its slot begins (``Heartbeat.at``, the MM's wall clock): a node whose
clock agrees with the MM's waits for it, so that every node switches together however long delivery took to
each (:meth:`GangFollower.wait`); one that cannot wait for it switches on arrival and counts why.

Pure: time is passed in; the NM daemon does the signalling and the waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

from storm.mm.protocol import Heartbeat


@dataclass
class GangFollower:
    timeout: float
    epoch: str = ""
    seq: int = -1
    # The row that runs now; None when every job runs (batch, no heartbeat yet, or heartbeats stopped).
    row: int | None = None
    last: float | None = None
    # Heartbeats that named an instant this node switched on arrival instead (see wait).
    late: int = 0
    skewed: int = 0

    def follow(self, epoch: str, now: float) -> None:
        """(Re)registered with an MM: follow its heartbeats from the first one on."""
        if epoch != self.epoch:
            self.epoch, self.seq, self.row = epoch, -1, None
        self.last = now

    def accept(self, beat: Heartbeat, now: float) -> bool:
        """Take a heartbeat if it is news; True when it is."""
        if beat.epoch != self.epoch or beat.seq <= self.seq:
            return False
        self.seq, self.row, self.last = beat.seq, beat.row, now
        return True

    def expired(self, now: float) -> bool:
        """True once, when heartbeats have been missing for longer than the timeout."""
        if self.row is None or self.last is None or now - self.last <= self.timeout:
            return False
        self.row = None
        return True

    def wait(self, beat: Heartbeat, wall: float, tolerance: float) -> float:
        """How long (seconds) this node waits before the slot ``beat`` names begins: 0 to begin it now.

        ``beat.at`` and ``beat.sent`` are the MM's clock, ``wall`` this node's, read as the heartbeat
        arrived. With clocks that agree, 0 < at - wall <= at - sent, since delivery takes no negative time.
        A heartbeat that arrives after its instant begins at once and counts as ``late`` (delivery took
        longer than the MM's lead, or this clock is ahead of the MM's). One whose instant lies further ahead
        than the lead plus ``tolerance`` says this clock is behind the MM's by more than that: waiting would
        put this node that far out of step with the others, so it too begins at once, counted ``skewed``.
        A heartbeat that names no instant (at 0: an older MM, or [mm] switch_lead 0) begins at once."""
        if not beat.at:
            return 0.0
        ahead = beat.at - wall
        if ahead <= 0:
            self.late += 1
            return 0.0
        if ahead > beat.at - beat.sent + tolerance:
            self.skewed += 1
            return 0.0
        return ahead
