"""Which node managers exist, which are alive, and how to reach them.

A node is UP while its NM keeps reporting; after ``timeout`` seconds of silence it is DOWN. A node loaded
from the store after an MM restart keeps its last state but is not *confirmed* until its NM registers with
this MM: no new job is placed on an unconfirmed node, and one that never comes back times out as usual.
Nor is a new job placed on a node that is still stopping ranks of jobs that already ended (``stale``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from storm.mm.states import NodeState
from storm.mm.storage import NodeRecord

UP, DOWN = NodeState.UP, NodeState.DOWN  # short names for the MM's modules


@dataclass
class Node:
    name: str
    pes: int
    state: NodeState
    last_seen: float
    address: str = ""
    host: str = ""  # the machine it runs on (RegisterNode.host); "": a host of its own
    reason: str = ""
    nm_epoch: str = ""
    confirmed: bool = False
    stale: set[int] = field(default_factory=set)
    # The node's context switches, as its NM last reported them.
    switches: int = 0
    switch_p50_ms: float = 0.0
    switch_p99_ms: float = 0.0
    # Heartbeats it switched on arrival rather than at their instant, as its NM last reported them.
    late_beats: int = 0
    skewed_beats: int = 0
    # What the store holds of it (None: nothing yet), to write it only when that changes (see unsaved).
    saved: NodeRecord | None = None

    def record(self) -> NodeRecord:
        return NodeRecord(
            name=self.name,
            pes=self.pes,
            state=self.state,
            reason=self.reason,
            address=self.address,
            last_seen=self.last_seen,
        )

    def unsaved(self) -> NodeRecord | None:
        """Its record, if the store's differs in more than the time it was last seen (a restarted MM gives
        every node a fresh timeout, so that time is never read back); None if there is nothing to write.
        A thousand node managers registering again after an MM restart then cost no commit."""
        record = self.record()
        if self.saved is not None and dataclasses.replace(self.saved, last_seen=record.last_seen) == record:
            return None
        self.saved = record
        return record


class NodeRegistry:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._nodes: dict[str, Node] = {}
        self._usable: frozenset[str] = frozenset()  # see usable()

    def load(self, records: list[NodeRecord], now: float) -> None:
        """Nodes known before a restart: each gets a fresh timeout to come back."""
        for r in records:
            self._nodes[r.name] = Node(
                name=r.name,
                pes=r.pes,
                state=NodeState(r.state),
                last_seen=now,
                address=r.address,
                reason=r.reason,
                saved=r,
            )

    def register(
        self, name: str, pes: int, nm_epoch: str, address: str, now: float, *, host: str = ""
    ) -> Node:
        """A node manager (re)registered: UP and confirmed. O(1)."""
        node = self._nodes.get(name)
        if node is None:
            node = Node(name=name, pes=pes, state=UP, last_seen=now)
            self._nodes[name] = node
        node.pes = pes
        node.state = UP
        node.reason = ""
        node.address = address
        node.host = host
        node.nm_epoch = nm_epoch
        node.last_seen = now
        node.confirmed = True
        node.stale = set()  # the registration lists what the node still runs; the MM decides afresh
        return node

    def seen(self, name: str, nm_epoch: str, now: float) -> bool:
        """A status report arrived; False when the sender must register again first. O(1): a thousand nodes
        report every node_timeout / 5 seconds."""
        node = self._nodes.get(name)
        if node is None or not node.confirmed or node.state != UP or node.nm_epoch != nm_epoch:
            return False
        node.last_seen = now
        return True

    def expire(self, now: float) -> list[Node]:
        """Mark DOWN every UP node silent for longer than the timeout; return them. O(n) for n nodes, at
        every tick (0.2 s): 0.1-0.2 ms at 1,024 nodes (storm bench scale, in process)."""
        gone = []
        for node in self._nodes.values():
            if node.state == UP and now - node.last_seen > self.timeout:
                node.state = DOWN
                node.confirmed = False
                node.reason = f"no report for {now - node.last_seen:.1f} s"
                gone.append(node)
        return gone

    def get(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def all(self) -> list[Node]:
        return list(self._nodes.values())

    def hosts(self, names: tuple[str, ...]) -> tuple[int, ...]:
        """The host number of each node, numbered in order of first appearance: nodes that registered the
        same host share a number, a node without one has a number of its own."""
        numbers: dict[str, int] = {}
        result = []
        for name in names:
            node = self._nodes.get(name)
            key = f"host {node.host}" if node is not None and node.host else f"node {name}"
            result.append(numbers.setdefault(key, len(numbers)))
        return tuple(result)

    def usable(self) -> frozenset[str]:
        """The nodes a new job may go to. The same object as last time while the set is unchanged: the
        matrix then reuses what it worked out for it (Matrix.find), instead of a walk of every node's free
        counts in every pass. O(n) for n nodes, in one comprehension."""
        usable = frozenset(
            [n.name for n in self._nodes.values() if n.state == UP and n.confirmed and not n.stale]
        )
        if usable != self._usable:
            self._usable = usable
        return self._usable
