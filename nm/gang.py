"""What a node manager makes of heartbeats: which of its jobs may run now.

Under gang scheduling the MM publishes the active row of the matrix every time slice. A node manager follows
only heartbeats of the MM it registered with (its epoch) and only newer ones (a higher ``seq``), so a
replayed, reordered or stale heartbeat changes nothing. When heartbeats stop for longer than ``timeout`` it
falls back to letting every job run: no job may hang stopped forever because the MM or the network failed.

Pure: time is passed in; the NM daemon does the signalling.
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
