"""Every message storm's programs exchange, in one place.

Transport: ZeroMQ frames (a length-prefixed stream between a node's NM and its job shells), each message one
msgpack map ``{"op": <name>, <field>: <value>, ...}``.

Links and who speaks on them:

- client (``storm`` CLI, benchmarks) -> storm-mm: DEALER -> ROUTER on a local ``ipc://`` endpoint, where the
  MM learns the client's uid from the kernel (SO_PEERCRED), or over TCP with CURVE (``[mm]
  client_tcp_endpoint``), where the client's key names its user (mm/auth.py); never from the message.
  Requests carry ``req``, which the reply echoes. Any request may be answered with ``error``.
- storm-nm <-> storm-mm: DEALER -> ROUTER over TCP. A node's final report on a job (``job_node_done``) is
  re-sent until the MM acknowledges it, and a lost ``job_launched`` is made up for by the next
  ``node_status``, so every handler is idempotent. Preemption: ``suspend_job`` and ``resume_job`` stop and
  continue a job's ranks; ``node_registered`` names the node's suspended jobs and ``node_status`` the ones it
  holds stopped, so the MM says again what a node missed.
- storm-mm -> every storm-nm: ``heartbeat`` on a PUB socket (TCP), one single-frame message per time slice
  under gang scheduling and FCS, naming the row of the Ousterhout matrix that runs now. NMs act only on a
  newer ``seq`` of the same ``epoch`` and fall back to running everything (but suspended jobs) when
  heartbeats stop.
- job shell <-> storm-nm: a Unix stream socket in the NM's run directory, each message after its 4-byte
  length (nm/shell_link.py; the kernel names each connection's pid and uid to the NM). A job shell
  runs as one user on one node and serves that user's jobs there: it spawns their ranks and serves their PMI
  wire-up (see nm/shell.py). It says ``shell_ready`` on each connection; the NM sends it ``shell_launch``
  (a job to start), ``shell_stop`` (stop a job's processes) and ``shell_retire`` (exit once idle).

Dynamic processes (MPI_Comm_spawn, see nm/spawn.py) and names (MPI_Publish_name and friends):

- shell -> NM: ``spawned`` (the processes of one spawn, a "world" numbered 1, 2, ... on the node: pids and
  PEs), ``spawn_exited`` (one of them ended, or called MPI_Abort), ``job_spawned`` (only a refused spawn:
  its reason). The NM checks them (nm/checks.py), stops, continues and kills spawned processes with the
  job, and relays to the MM: ``job_spawned`` for every spawn (counted for ``storm show``) and
  ``spawn_failed`` when a spawned process fails (the job ends FAILED, as when a rank fails).
- shell -> NM -> MM: ``pmi_name`` (publish, lookup or unpublish a service name, numbered by the shell);
  MM -> NM -> shell: ``pmi_name_result`` with the same number. Names live in the MM (mm/runs.py): seen by
  the jobs of one user, owned by the publishing job until it unpublishes them or ends. The shell answers
  the rank with an error if no result comes within its timeout.
- client -> MM: ``get_spawns`` -> ``spawns`` (what a job spawned; any user may read it, as stats).

Streamed output (``storm run``): shell -> NM -> MM -> client ``job_output``; client -> MM ``attach_output``
-> ``output_attached`` (see output.py).

Decoding validates everything: the op must be known, each field must have its declared type (``bool`` is not
an ``int``, lists become tuples), the size must be under the link's limit, and each message's own
``__post_init__`` rejects impossible values. Fields a message does not declare are ignored, so that a newer
peer can add fields without breaking an older one. Any failure raises :class:`ProtocolError`, never anything
else, so a daemon can answer with ``error`` and carry on.

Where the classes are: each link's messages in a module of this package, as below. Import every name from
here (``storm.mm.protocol``): this module re-exports them all. records.py and client.py are imported with
it; the others when first needed: a name asked for imports them in order up to the one that has it, and a
message of an op not registered yet imports them all before it is decoded (importing a module registers its
messages with the codec). A short ``storm`` command needs only the client's messages, and building the
other forty-odd classes cost it about 4 ms, a tenth of its life (issue 18).

- records.py: the records nested in messages (RankExit, JobInfo, RankStats, FcsParameters, ...), the wire's
  vocabularies (Policy, Klass, the state names), PROTOCOL_VERSION and the checks several links share.
- client.py: client <-> MM requests and replies (``error``, ``submit_job`` ... ``node_list``, ``get_spawns``),
  error_for.
- node.py: storm-nm <-> storm-mm, ``heartbeat`` included (``register_node`` ... ``pmi_barrier_out``).
- shell.py: job shell <-> storm-nm (``shell_hello`` ... ``shell_retire``).
- spawn.py: dynamic processes and names (``spawned`` ... ``pmi_name_result``).
- output.py: streamed output (``job_output``, ``attach_output``, ``output_attached``).
- history.py: accounting (``job_history`` -> ``history``).
- timings.py: the heartbeat and switch timings a node reports in ``node_status`` (SwitchTimings).

The machinery (msgpack, the validating decoder, the registry of ops) is mm/codec.py's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from storm.mm.codec import MAX_CLIENT_MESSAGE as MAX_CLIENT_MESSAGE
from storm.mm.codec import MAX_NODE_MESSAGE as MAX_NODE_MESSAGE
from storm.mm.codec import Message as Message
from storm.mm.codec import ProtocolError as ProtocolError
from storm.mm.codec import add_loader
from storm.mm.codec import decode as decode
from storm.mm.codec import encode as encode
from storm.mm.codec import peek_req as peek_req
from storm.mm.codec import prepare_decoding as prepare_decoding
from storm.mm.codec import registered_ops as registered_ops
from storm.mm.states import ACTIVE_STATES as ACTIVE_STATES
from storm.mm.states import TERMINAL_STATES as TERMINAL_STATES
from storm.mm.states import JobState as JobState
from storm.mm.states import NodeState as NodeState

# Every message and record, from the module that declares it. Importing a module registers its messages with
# the codec (@message), so importing this package registers them all. The modules come in the order of the
# sections of the single module they were split from, which keeps the order registered_ops() lists the ops
# in; "isort: split" keeps ruff from sorting them by name.
# isort: split
from storm.mm.protocol.records import CLASSES as CLASSES
from storm.mm.protocol.records import CS_THRESH as CS_THRESH
from storm.mm.protocol.records import JOB_STATES as JOB_STATES
from storm.mm.protocol.records import NODE_STATES as NODE_STATES
from storm.mm.protocol.records import POLICIES as POLICIES
from storm.mm.protocol.records import PROTOCOL_VERSION as PROTOCOL_VERSION
from storm.mm.protocol.records import RANK_STATES as RANK_STATES
from storm.mm.protocol.records import BoxInfo as BoxInfo
from storm.mm.protocol.records import ClassChange as ClassChange
from storm.mm.protocol.records import FcsParameters as FcsParameters
from storm.mm.protocol.records import JobInfo as JobInfo
from storm.mm.protocol.records import Klass as Klass
from storm.mm.protocol.records import NodeInfo as NodeInfo
from storm.mm.protocol.records import Policy as Policy
from storm.mm.protocol.records import ProfileEntry as ProfileEntry
from storm.mm.protocol.records import RankExit as RankExit
from storm.mm.protocol.records import RankSlot as RankSlot
from storm.mm.protocol.records import RankStats as RankStats
from storm.mm.protocol.records import default_f_thresh as default_f_thresh

# isort: split
from storm.mm.protocol.client import LIST_PAGE as LIST_PAGE
from storm.mm.protocol.client import CancelJobs as CancelJobs
from storm.mm.protocol.client import CancelResult as CancelResult
from storm.mm.protocol.client import ClassesView as ClassesView
from storm.mm.protocol.client import Error as Error
from storm.mm.protocol.client import GetClasses as GetClasses
from storm.mm.protocol.client import GetMatrix as GetMatrix
from storm.mm.protocol.client import GetSpawns as GetSpawns
from storm.mm.protocol.client import GetStats as GetStats
from storm.mm.protocol.client import JobList as JobList
from storm.mm.protocol.client import JobSubmitted as JobSubmitted
from storm.mm.protocol.client import ListJobs as ListJobs
from storm.mm.protocol.client import ListNodes as ListNodes
from storm.mm.protocol.client import MatrixView as MatrixView
from storm.mm.protocol.client import NodeList as NodeList
from storm.mm.protocol.client import Reply as Reply
from storm.mm.protocol.client import Request as Request
from storm.mm.protocol.client import SpawnsView as SpawnsView
from storm.mm.protocol.client import StatsView as StatsView
from storm.mm.protocol.client import SubmitJob as SubmitJob
from storm.mm.protocol.client import TaskRef as TaskRef
from storm.mm.protocol.client import TorusView as TorusView
from storm.mm.protocol.client import WaitJob as WaitJob
from storm.mm.protocol.client import error_for as error_for

# The modules imported on demand, in this order (the order they register their ops in).
LATER = ("node", "shell", "spawn", "output", "history", "timings")

if TYPE_CHECKING:  # what mypy sees; at run time, __getattr__ below finds these names
    # isort: split
    from storm.mm.protocol.node import Ack as Ack
    from storm.mm.protocol.node import Heartbeat as Heartbeat
    from storm.mm.protocol.node import JobLaunched as JobLaunched
    from storm.mm.protocol.node import JobNodeDone as JobNodeDone
    from storm.mm.protocol.node import JobRows as JobRows
    from storm.mm.protocol.node import JobStats as JobStats
    from storm.mm.protocol.node import KillJob as KillJob
    from storm.mm.protocol.node import LaunchJob as LaunchJob
    from storm.mm.protocol.node import NodeRegistered as NodeRegistered
    from storm.mm.protocol.node import NodeStatus as NodeStatus
    from storm.mm.protocol.node import PmiBarrierIn as PmiBarrierIn
    from storm.mm.protocol.node import PmiBarrierOut as PmiBarrierOut
    from storm.mm.protocol.node import RankFailed as RankFailed
    from storm.mm.protocol.node import RegisterNode as RegisterNode
    from storm.mm.protocol.node import Reregister as Reregister
    from storm.mm.protocol.node import ResumeJob as ResumeJob
    from storm.mm.protocol.node import SuspendJob as SuspendJob

    # isort: split
    from storm.mm.protocol.shell import RankAborted as RankAborted
    from storm.mm.protocol.shell import RankExited as RankExited
    from storm.mm.protocol.shell import RanksStarted as RanksStarted
    from storm.mm.protocol.shell import ShellDone as ShellDone
    from storm.mm.protocol.shell import ShellHello as ShellHello
    from storm.mm.protocol.shell import ShellLaunch as ShellLaunch
    from storm.mm.protocol.shell import ShellReady as ShellReady
    from storm.mm.protocol.shell import ShellRetire as ShellRetire
    from storm.mm.protocol.shell import ShellStop as ShellStop

    # isort: split
    from storm.mm.protocol.spawn import NAME_OPS as NAME_OPS
    from storm.mm.protocol.spawn import PORT_MAX as PORT_MAX
    from storm.mm.protocol.spawn import SERVICE_MAX as SERVICE_MAX
    from storm.mm.protocol.spawn import JobSpawned as JobSpawned
    from storm.mm.protocol.spawn import PmiName as PmiName
    from storm.mm.protocol.spawn import PmiNameResult as PmiNameResult
    from storm.mm.protocol.spawn import Spawned as Spawned
    from storm.mm.protocol.spawn import SpawnExited as SpawnExited
    from storm.mm.protocol.spawn import SpawnFailed as SpawnFailed

    # isort: split
    from storm.mm.protocol.output import OUTPUT_CHUNK as OUTPUT_CHUNK
    from storm.mm.protocol.output import OUTPUT_WINDOW as OUTPUT_WINDOW
    from storm.mm.protocol.output import STREAMS as STREAMS
    from storm.mm.protocol.output import AttachOutput as AttachOutput
    from storm.mm.protocol.output import JobOutput as JobOutput
    from storm.mm.protocol.output import OutputAttached as OutputAttached

    # isort: split
    from storm.mm.protocol.history import HISTORY_PAGE as HISTORY_PAGE
    from storm.mm.protocol.history import HistoryEntry as HistoryEntry
    from storm.mm.protocol.history import HistoryPage as HistoryPage
    from storm.mm.protocol.history import JobHistory as JobHistory

    # isort: split
    from storm.mm.protocol.timings import TIMING_BOUNDS as TIMING_BOUNDS
    from storm.mm.protocol.timings import TIMING_BUCKETS_MAX as TIMING_BUCKETS_MAX
    from storm.mm.protocol.timings import SwitchTimings as SwitchTimings
else:

    def __getattr__(name: str) -> object:
        """A name of a module not imported yet (PEP 562: called only for names this module lacks). The
        modules are imported in order until one has it: `storm show` needs spawn.py's, not the rest."""
        if not name.startswith("_"):
            for later in LATER:
                module = importlib.import_module(f"{__name__}.{later}")  # (once: importlib keeps it)
                value = module.__dict__.get(name)
                # The module's own classes and constants, not what it imported (its dataclass, check, ...).
                own = name.isupper() or getattr(value, "__module__", "") == module.__name__
                if value is not None and own:
                    globals()[name] = value  # found here directly from now on
                    return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_later() -> None:
    """Import every module of LATER, registering their messages (the codec asks, see add_loader)."""
    for later in LATER:
        importlib.import_module(f"{__name__}.{later}")


add_loader(_load_later)
