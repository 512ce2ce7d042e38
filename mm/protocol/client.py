"""Client <-> MM: what the ``storm`` CLI and other clients ask storm-mm (Request) and what it answers
(Reply; ``error`` to anything), from ``submit_job`` to ``node_list``.

Part of storm.mm.protocol, whose docstring documents every link and message: import these from there.
"""

from __future__ import annotations

from storm.mm.cached_dataclass import dataclass  # its methods compiled once and kept
from storm.mm.codec import Message, ProtocolError, message
from storm.mm.codec import check as _check
from storm.mm.protocol.records import ClassChange, JobInfo, NodeInfo, ProfileEntry, RankStats, _plain, _token

# --------------------------------------------------------------------------------------------------------
# Client <-> MM


@dataclass(frozen=True, kw_only=True)
class Request(Message):
    req: int = 0


@dataclass(frozen=True, kw_only=True)
class Reply(Message):
    req: int = 0


@message("error")
@dataclass(frozen=True, kw_only=True)
class Error(Reply):
    """The answer to anything that could not be done; ``code`` is a stable machine-readable word."""

    code: str
    text: str


def error_for(request: Message | None, code: str, text: str) -> Error:
    """An error reply that echoes the request's ``req`` when there is one."""
    req = request.req if isinstance(request, Request) else 0
    return Error(req=req, code=code, text=text)


def _environment(env: dict[str, str]) -> bool:
    """What execve can take: names non-empty and without '=', nothing with a NUL."""
    names = "".join(env)
    return all(env) and "=" not in names and "\0" not in names and _plain(*env.values())


@message("submit_job")
@dataclass(frozen=True, kw_only=True)
class SubmitJob(Request):
    """Ask for ``ranks`` processes of ``argv``. The MM fills in who submitted it from the socket."""

    ranks: int
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    name: str = ""
    time_limit: float | None = None
    output: str = ""
    error: str = ""
    # Back to the queue, to run again, if a node under the job fails (else it ends NODE_FAIL).
    requeue: bool = False
    # Whom to run as (`storm submit --uid/--gid`): only the caller's own are accepted. They are here so that
    # asking for someone else gets a clear refusal instead of being ignored like an unknown field.
    uid: int | None = None
    gid: int | None = None
    user: str = ""
    # Preload mpihook into the ranks (False: `storm submit --no-hook`; see the README for what is lost).
    hook: bool = True
    # A moldable job (`storm submit -n 4-16`): ``ranks`` is the least it runs with, ``max_ranks`` the most,
    # and storm-mm picks the size when it starts it ([mm] moldable). 0: exactly ``ranks`` (an older storm-mm
    # ignores the field and runs the job at ``ranks``, which is within its range).
    max_ranks: int = 0
    # Its quality of service (`storm submit --qos`), whose priority orders the queue and, with [mm]
    # preemption, lets it suspend running jobs of a lower one; "" is "normal". [mm] qos_users says who may.
    qos: str = ""
    # `storm run`: the client's token for the job's output stream ("": not streamed; see output.py).
    attach: str = ""
    # Job arrays and dependencies, in Slurm's notation (mm/arrays.py, mm/dependency.py): one job per task
    # id of ``array`` ("0-99%10"), submitted together (one request, one commit); ``dependency``
    # ("afterok:12:13_4") holds the job (every task) until the jobs it names have started or ended as it
    # says. storm-mm refuses ids past [mm] max_array_size and dependencies on jobs it does not know.
    array: str = ""
    dependency: str = ""

    def __post_init__(self) -> None:
        _check(self.ranks >= 1, "ranks must be at least 1")
        _check(_token(self.attach), "attach: at most 64 letters, digits, '-' or '_'")
        _check(len(self.array) <= 4096 and len(self.dependency) <= 65536, "array or dependency too long")
        if self.array or self.dependency:
            # Imported here: most submissions have neither, and `storm submit` starts faster without them.
            from storm.mm.arrays import ArrayError, parse_array
            from storm.mm.dependency import DependencyError, parse_dependency

            try:
                if self.array:
                    parse_array(self.array)
                if self.dependency:
                    parse_dependency(self.dependency)
            except (ArrayError, DependencyError) as exc:
                raise ProtocolError(str(exc)) from None
        _check(
            self.max_ranks == 0 or self.ranks <= self.max_ranks < 2**31,
            f"max_ranks must be 0 (a fixed size) or at least ranks ({self.ranks}), not {self.max_ranks}",
        )
        _check(len(self.qos) <= 64 and _plain(self.qos), "qos: the name of a QOS, at most 64 characters")
        _check(all(0 <= x < 2**32 for x in (self.uid, self.gid) if x is not None), "uid and gid: 0 to 2^32-1")
        _check(len(self.user) <= 256 and _plain(self.user), "user: at most 256 characters, no NUL")
        _check(len(self.argv) >= 1 and self.argv[0] != "", "a command is required")
        _check(self.cwd.startswith("/"), "cwd must be an absolute path")
        _check(self.time_limit is None or self.time_limit > 0, "time_limit must be positive")
        _check(len(self.name) <= 256, "name longer than 256 characters")
        _check(
            _plain(*self.argv, self.cwd, self.name, self.output, self.error),
            "a NUL character in the command, a path or the name",
        )
        _check(_environment(self.env), "environment variable names must be non-empty, without '=' or NUL")


@message("job_submitted")
@dataclass(frozen=True, kw_only=True)
class JobSubmitted(Reply):
    job_id: int
    # An array's tasks' job ids, in task order (``job_id``, the array's id, is the first); () for one job.
    job_ids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TaskRef:
    """One task of a job array as users name it: ``123_7`` is task 7 of array 123 (mm/arrays.py)."""

    array_id: int
    task: int

    def __post_init__(self) -> None:
        _check(self.array_id >= 1 and self.task >= 0, "a task reference needs an array id >= 1, a task >= 0")

    @classmethod
    def parse(cls, text: str) -> tuple[int | None, tuple[TaskRef, ...]]:
        """``123`` -> (123, ()); ``123_7`` or ``123_[1-3]`` -> (None, its tasks); ProtocolError if neither."""
        if text.isascii() and text.isdigit() and len(text) <= 18:  # a plain job id, the most common case
            return int(text), ()
        from storm.mm.arrays import ArrayError, parse_job_ref  # (see SubmitJob)

        try:
            job_id, tasks = parse_job_ref(text)
        except ArrayError as exc:
            raise ProtocolError(str(exc)) from None
        if tasks is None:
            return job_id, ()
        return None, tuple(cls(array_id=job_id, task=t) for t in tasks)

    def __str__(self) -> str:
        return f"{self.array_id}_{self.task}"


@message("list_jobs")
@dataclass(frozen=True, kw_only=True)
class ListJobs(Request):
    """Jobs by id, or else the active ones (and the finished ones too with ``all``).

    With ``all`` the store's jobs come a page at a time, newest first: at most ``limit`` of them (0: the
    MM's page, LIST_PAGE), those of ids below ``before`` if given (the next page: the reply's oldest id);
    the active jobs come with the first page (``before`` 0). ``JobList.older`` says where the next begins.
    """

    job_ids: tuple[int, ...] = ()
    all: bool = False
    limit: int = 0
    before: int = 0
    # Arrays and tasks (`storm show 123`, `storm show 123_7`): every task of each array named by its id (an
    # id that names a job outside arrays lists that job), and single tasks; listed after ``job_ids``.
    arrays: tuple[int, ...] = ()
    tasks: tuple[TaskRef, ...] = ()

    def __post_init__(self) -> None:
        _check(self.limit >= 0 and self.before >= 0, "limit and before must be >= 0")


LIST_PAGE = 10_000  # finished jobs in one job_list at most: a million-job history is read page by page


@message("job_list")
@dataclass(frozen=True, kw_only=True)
class JobList(Reply):
    jobs: tuple[JobInfo, ...]
    # list_jobs with all: the store holds jobs older than this page, below this id (ask with before=older);
    # 0: none.
    older: int = 0


@message("cancel_jobs")
@dataclass(frozen=True, kw_only=True)
class CancelJobs(Request):
    """Cancel jobs by id. As scancel does, the id of an array (its first task's) cancels every task of it
    that has not ended; ``tasks`` cancel single tasks (`storm cancel 123_7`). Results are keyed "123" and
    "123_7"."""

    job_ids: tuple[int, ...]
    tasks: tuple[TaskRef, ...] = ()

    def __post_init__(self) -> None:
        _check(len(self.job_ids) + len(self.tasks) >= 1, "no job ids given")


@message("cancel_result")
@dataclass(frozen=True, kw_only=True)
class CancelResult(Reply):
    """Per job id: ``cancelled``, ``cancelling`` (its ranks are being stopped), or why not."""

    results: dict[str, str]


@message("wait_job")
@dataclass(frozen=True, kw_only=True)
class WaitJob(Request):
    """Answered with ``job_list`` (one job) once the job has ended."""

    job_id: int


@message("list_nodes")
@dataclass(frozen=True, kw_only=True)
class ListNodes(Request):
    pass


@message("get_matrix")
@dataclass(frozen=True, kw_only=True)
class GetMatrix(Request):
    pass


@message("matrix")
@dataclass(frozen=True, kw_only=True)
class MatrixView(Reply):
    """The Ousterhout matrix: ``cells[row][c]`` is the job on PE ``columns[c]`` in that row (0: none)."""

    policy: str
    mpl: int
    slice: float
    active_row: int | None
    seq: int
    columns: tuple[str, ...]
    cells: tuple[tuple[int, ...], ...]
    torus: TorusView | None = None  # on a torus: which job holds each node, drawn layer by layer


@dataclass(frozen=True, kw_only=True)
class TorusView:
    """The torus (``dims`` X, Y, Z): per position x + X (y + Y z), its node ("" where none is) and the job
    holding it (0: none)."""

    dims: tuple[int, ...]
    nodes: tuple[str, ...]
    jobs: tuple[int, ...]

    def __post_init__(self) -> None:
        _check(len(self.dims) == 3 and min(self.dims) >= 1, "dims: three sizes >= 1")
        count = self.dims[0] * self.dims[1] * self.dims[2]
        _check(len(self.nodes) == count == len(self.jobs), "nodes and jobs: one per position of the torus")


@message("get_stats")
@dataclass(frozen=True, kw_only=True)
class GetStats(Request):
    job_id: int


@message("stats")
@dataclass(frozen=True, kw_only=True)
class StatsView(Reply):
    """A job's ranks as their node managers last reported them while it ran (``age``: seconds since then)."""

    job_id: int
    state: str
    age: float
    ranks: tuple[RankStats, ...]
    # Where each process's time went, per class: live, and kept after the job ends (with [nm] profile on).
    profile: tuple[ProfileEntry, ...] = ()
    warning: str = ""  # as JobInfo.warning


@message("get_classes")
@dataclass(frozen=True, kw_only=True)
class GetClasses(Request):
    """The processes of these jobs (all running jobs if none), or with ``history`` their class changes."""

    job_ids: tuple[int, ...] = ()
    history: bool = False


@message("classes")
@dataclass(frozen=True, kw_only=True)
class ClassesView(Reply):
    processes: tuple[RankStats, ...] = ()
    changes: tuple[ClassChange, ...] = ()


@message("node_list")
@dataclass(frozen=True, kw_only=True)
class NodeList(Reply):
    nodes: tuple[NodeInfo, ...]


@message("get_spawns")
@dataclass(frozen=True, kw_only=True)
class GetSpawns(Request):
    job_id: int


@message("spawns")
@dataclass(frozen=True, kw_only=True)
class SpawnsView(Reply):
    """What a job spawned: MPI_Comm_spawn calls served and the processes they started (counted when their
    node reported them), and spawns refused, with the last refusal's reason."""

    job_id: int
    spawns: int = 0
    processes: int = 0
    refused: int = 0
    last_refusal: str = ""
