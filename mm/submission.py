"""What storm-mm makes of a submission before it queues it: the job's spec, and whether it can ever run.

Pure rules, called by the Controller (mm/core.py) for every ``submit_job``; a refusal is :class:`Rejected`,
whose ``code`` the client hears, and nothing is stored.

- The job runs as its caller (mm/rights.py), with the configuration's defaults (a time limit, an output file).
- A moldable job (``storm submit -n MIN-MAX``) keeps its range; its size is chosen when it starts
  (mm/sizing.py). On a torus it is refused: a box is chosen for one size, and a size for the free PEs would
  seldom have one.
- Its QOS (``storm submit --qos``) must exist in ``[mm] qos`` and be open to the caller (``[mm] qos_users``;
  root and operators may use any); its priority is the QOS's at submission.
- A job wider than the cluster (at its least size) is refused at once, as is one whose nodes no torus holds.
"""

from __future__ import annotations

import posixpath

from storm.mm import protocol as p
from storm.mm.config import DEFAULT_QOS, MMConfig
from storm.mm.jobs import JobSpec
from storm.mm.matrix import Matrix
from storm.mm.rights import Credentials, is_operator, run_as_problem
from storm.mm.torus_state import TorusState


class Rejected(ValueError):
    """A request that cannot be accepted; ``code`` is the stable word sent to the client."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


def qos_problem(qos: str, caller: Credentials, config: MMConfig) -> str | None:
    """Why the caller may not submit with QOS ``qos`` ("" is the default), or None."""
    name = qos or DEFAULT_QOS
    if config.qos_priority(name) is None:
        known = ", ".join(sorted({DEFAULT_QOS, *config.qos}))
        return f"no QOS {name!r} on this cluster ([mm] qos has {known})"
    allowed = config.qos_users.get(name)
    if allowed is None or is_operator(caller.uid, caller.user, config.operators):
        return None
    if caller.user in allowed or str(caller.uid) in allowed:
        return None
    return (
        f"QOS {name!r} is not open to {caller.user} ([mm] qos_users allows {', '.join(allowed) or 'nobody'})"
    )


def job_spec(msg: p.SubmitJob, caller: Credentials, config: MMConfig) -> JobSpec:
    """What a submission asks for, run as its caller, with the defaults filled in; Rejected if it may not."""
    problem = run_as_problem(msg, uid=caller.uid, gid=caller.gid, user=caller.user)
    if problem is not None:
        raise Rejected("permission_denied", problem)
    problem = qos_problem(msg.qos, caller, config)
    if problem is not None:
        raise Rejected("bad_qos", problem)
    time_limit = msg.time_limit
    if time_limit is None and config.default_time_limit > 0:
        time_limit = config.default_time_limit
    return JobSpec(
        name=msg.name or posixpath.basename(msg.argv[0]),
        uid=caller.uid,
        gid=caller.gid,
        user=caller.user,
        ranks=msg.ranks,
        argv=msg.argv,
        cwd=msg.cwd,
        env=msg.env,
        time_limit=time_limit,
        output=msg.output or posixpath.join(msg.cwd, "storm-%j.out"),
        error=msg.error,
        requeue=msg.requeue,
        hook=msg.hook,
        max_ranks=msg.max_ranks if msg.max_ranks > msg.ranks else 0,
        qos=msg.qos if msg.qos != DEFAULT_QOS else "",
        priority=config.qos_priority(msg.qos) or 0,
        stream=bool(msg.attach),
    )


def check_fits(spec: JobSpec, matrix: Matrix, torus: TorusState | None) -> None:
    """Rejected if the job can never run here: no nodes, wider than the cluster at its least size, a torus too
    small for it, or moldable on a torus."""
    total = matrix.total_pes()
    if total == 0:
        raise Rejected("no_nodes", "the cluster has no nodes: start a node manager first")
    if spec.ranks > total:
        raise Rejected(
            "too_many_ranks", f"{spec.ranks} ranks requested, but the cluster has only {total} PEs"
        )
    if torus is None:
        return
    if spec.moldable:
        raise Rejected(
            "not_supported",
            f"a moldable job (-n {spec.ranks}-{spec.max_ranks}) cannot run on a torus ([mm] topology): storm "
            "chooses a box for one size; give -n a single number",
        )
    per_node = torus.pes_per_node(matrix)
    nodes = torus.torus.nodes
    if per_node and -(-spec.ranks // per_node) > nodes:
        raise Rejected(
            "too_many_ranks",
            f"{spec.ranks} ranks at {per_node} per node need {-(-spec.ranks // per_node)} nodes, but "
            f"the torus has {nodes}",
        )
