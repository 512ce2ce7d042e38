"""What keeps a requeued job's runs apart: it has one id, but nothing of its last run may count for the next.

A requeued job (``storm submit --requeue``, see mm/core.py) keeps its id, and node managers speak of jobs by
id. A node re-sends its final report on a job until the MM acknowledges it, so copies of the last run's
report (or a late launch report, or a failed rank) may still be on their way when the job is placed again;
landing on that node, they would be taken for the new run's. So a requeued job waits until every node of
its last run that is still UP has sent a status report that no longer lists it: the link from a node manager
is ordered, so everything it sent about the last run has arrived by then. That takes one report interval at
most. A node that goes DOWN or registers again is cleared too: a DOWN node takes no job until it has
registered, and everything it sent before registering has arrived. (A node that still runs the last run's
ranks is drained through ``stale`` in mm/nodes.py, as for any ended job.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class Echoes:
    """Requeued jobs and the nodes that may still send reports of their last run."""

    def __init__(self) -> None:
        self._nodes: dict[int, set[str]] = {}

    def add(self, job_id: int, nodes: Iterable[str]) -> None:
        waiting = set(nodes)
        if waiting:
            self._nodes[job_id] = waiting

    def heard(self, node: str, listed: Iterable[int]) -> bool:
        """A status report from ``node`` listing ``listed``; True when a job is free to run again."""
        keep = set(listed)
        return self._clear(node, lambda job_id: job_id not in keep)

    def forget_node(self, node: str) -> bool:
        """``node`` went DOWN or registered again: nothing more of a last run is expected from it."""
        return self._clear(node, lambda _job_id: True)

    def _clear(self, node: str, done: Callable[[int], bool]) -> bool:
        freed = False
        for job_id, nodes in list(self._nodes.items()):
            if node in nodes and done(job_id):
                nodes.discard(node)
                if not nodes:
                    del self._nodes[job_id]
                    freed = True
        return freed

    def expects(self, job_id: int, node: str) -> bool:
        """Whether reports of ``job_id``'s last run may still come from ``node``."""
        return node in self._nodes.get(job_id, ())

    def held(self, pending: Iterable[int]) -> dict[int, set[str]]:
        """The pending jobs that must wait, and for which nodes; entries of jobs no longer pending go."""
        if not self._nodes:
            return {}  # nothing requeued waits: spares each pass a set of the whole queue
        queued = set(pending)
        for job_id in set(self._nodes) - queued:
            del self._nodes[job_id]  # cancelled while it waited
        return {job_id: set(nodes) for job_id, nodes in self._nodes.items()}
