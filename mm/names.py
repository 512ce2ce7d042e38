"""MPI's name service, kept by storm-mm's RunTable (mm/runs.py), since a name lives as long as the run
that published it: MPI_Publish_name / MPI_Lookup_name / MPI_Unpublish_name from any process of a job (PMI-1
publish_name and friends, relayed by its job shell and node manager) act on the names of the job's user. A
name is owned by the job that published it until that job unpublishes it or ends; another job of the user
cannot publish the same name meanwhile, nor unpublish it, and a lookup of a name nobody published fails at
once (MPI never waits for a name here). The names are soft state, in memory only: a restarted storm-mm
knows none (a lookup fails until the owner publishes again; its port is still open), which costs a running
program at most a failed lookup, and keeps SQLite out of a rank's path.
"""

from __future__ import annotations

NAMES_PER_USER = 1024  # names one user may have published at once


class Names:
    """MPI's published names, per user: service -> (port, owning job). See the module's docstring."""

    def __init__(self) -> None:
        self.names: dict[tuple[int, str], tuple[str, int]] = {}  # (uid, service) -> (port, job id)
        self.owned: dict[int, set[tuple[int, str]]] = {}  # job id -> its names

    def request(
        self, op: str, *, uid: int, user: str, job_id: int, service: str, port: str
    ) -> tuple[str, str]:
        """Do ``op`` (publish, lookup, unpublish) for a job of user ``uid``: (port, "") or ("", why not)."""
        key = (uid, service)
        held = self.names.get(key)
        if op == "lookup":
            if held is None:
                return "", f"storm: no job of user {user} has published the name {service!r}"
            return held[0], ""
        if op == "unpublish":
            if held is None or held[1] != job_id:
                whose = "no job" if held is None else f"job {held[1]}, not job {job_id},"
                return "", f"storm: {whose} has published the name {service!r}"
            del self.names[key]
            self.owned[job_id].discard(key)
            return "", ""
        if held is not None:
            if held == (port, job_id):
                return "", ""  # the same request again (its answer was lost): already done
            return "", f"storm: the name {service!r} is already published by job {held[1]} of user {user}"
        if sum(1 for u, _ in self.names if u == uid) >= NAMES_PER_USER:
            return "", f"storm: user {user} has {NAMES_PER_USER} names published, the most storm keeps"
        self.names[key] = (port, job_id)
        self.owned.setdefault(job_id, set()).add(key)
        return "", ""

    def forget(self, job_id: int) -> int:
        """The job ended: its names go with it. Returns how many."""
        keys = self.owned.pop(job_id, set())
        for key in keys:
            self.names.pop(key, None)
        return len(keys)
