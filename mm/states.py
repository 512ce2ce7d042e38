"""The states a job and a node can be in, as every program names them (on the wire, in the store, on screen).

Only the standard library here, so that any module, pure or not, can name a state without pulling in more:
mm/jobs.py checks a job's moves between them, mm/nodes.py a node's, mm/protocol/ validates them on decode
(and re-exports them: the wire is where they are defined for peers), mm/store.py keeps them.
StrEnum members are their strings: msgpack and SQLite store them as such, and ``"RUNNING" ==
JobState.RUNNING``, so a state decoded as ``str`` compares with a member directly.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """PENDING -> STARTING -> RUNNING -> one terminal state (mm/jobs.py allows the moves)."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"

    @property
    def terminal(self) -> bool:
        """Ended for good: no transition leaves it."""
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """Holds PEs: its ranks exist or are being started."""
        return self in ACTIVE_STATES


TERMINAL_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL}
)
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING})


class NodeState(StrEnum):
    """UP while its node manager keeps reporting, DOWN after the MM's node timeout (mm/nodes.py)."""

    UP = "UP"
    DOWN = "DOWN"
