"""The PMI-1 "simple" wire protocol, as MPICH's ranks speak it over the PMI_FD socket.

Pure and synchronous: no sockets, no I/O. The job shell reads lines from each rank's socket, feeds
them to :meth:`Wireup.handle` and writes the replies back; it forwards :class:`BarrierIn` to the MM
and calls :meth:`Wireup.barrier_done` when the whole job has passed the barrier (a single-node job
calls it itself, with ``BarrierIn.puts``).

Wire format: one command a line, ``cmd=NAME key=value ...\\n``; a backslash escapes the next
character of a value (MPICH's parser unescapes, so :func:`format_line` escapes spaces and
backslashes). ``message=``/``msg=`` are free text: words after them that have no ``=`` belong to them
(MPICH writes ``abort``'s message unescaped). PMI-1 cannot carry an empty value.

Semantics of :class:`Wireup` (one job, one node):

* KVS: a get sees everything merged by ``barrier_done`` plus every put made on this node (at once,
  without waiting for a barrier); a later put or merge of a key overwrites it. ``PMI_process_mapping``
  is served from the constructor. A missing key is ``cmd=get_result rc=-1``; MPICH takes that as
  "absent" for its optional keys (``PMI_hwloc_xmlfile``, ``PMI_mpi_memory_alloc_kinds``).
* Barriers are numbered 0, 1, 2, ... per job. Barrier ``seq`` is complete on this node when every local
  rank that has not sent ``finalize`` is in it; ``handle`` then returns ``BarrierIn(seq, puts since
  the previous barrier)`` once, and the ranks stay blocked until ``barrier_done(seq, kvs)``. A
  ``barrier_in`` from a rank already in a barrier (or finalized) gets ``barrier_out rc=-1``.
* ``finalize`` takes a rank out of later barriers. ``abort`` and a closed connection (``rank_gone``)
  do not: a barrier keeps waiting for a rank that died, so its peers never get a partial KVS; the job
  shell must end the job when a rank exits before finalize (its MPI peers would hang anyway).
  Note that MPICH 5 does not exit after ``cmd=abort`` (it relies on the process manager to kill the
  job), and sends ``cmd=finalize`` from an atexit hook, after MPI_Finalize's barrier.
* Spawn (``mcmd=spawn`` ... ``endcmd``, one block per command of MPI_Comm_spawn_multiple; see
  nm/spawn.py for the wire and storm's semantics): the whole request is collected, then returned once as
  ``Outcome.spawn`` with no reply; the caller answers with :func:`spawn_reply` when it has started the
  processes (or refused). A malformed request gets ``spawn_result rc=-1`` at once. A ``cmd=`` line in the
  middle of a request (which MPICH never sends) ends it with that reply and is then handled as usual.
* Names (``publish_name service= port=``, ``lookup_name service=``, ``unpublish_name service=``; MPI's
  Publish/Lookup/Unpublish_name): returned as ``Outcome.name`` with no reply; the caller answers with
  :func:`name_reply` (``publish_result``/``unpublish_result rc=0``, ``lookup_result rc=0 port=...``, or
  ``rc=1 msg=...``, as Hydra does; MPICH turns any rc other than 0 into MPI_ERR_NAME or
  MPI_ERR_SERVICE). MPICH does not escape the service name, so one with a space cannot be carried: it is
  an unparsable line, refused with a message that says so.
* A world of spawned processes is a Wireup of its own: its kvsname, size and mapping, the keys the
  spawner preput (``kvs``), and each rank's appnum (``appnums``, its command in spawn_multiple).
* Unsupported commands and bad lines get an ``rc=-1`` reply with ``msg=``; client input never raises.
  Caller errors (a rank that is not local, a barrier that is not pending) raise ``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from storm.mm.protocol import PORT_MAX, SERVICE_MAX
from storm.nm.spawn import SpawnBlock, SpawnError, SpawnRequest

MAX_LINE = 65536
KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024
NAME_OPS = {"publish_name": "publish", "lookup_name": "lookup", "unpublish_name": "unpublish"}

_KEY_RE = re.compile(r"[A-Za-z0-9_./:-]+")
_TOKEN_RE = re.compile(r"(?:\\.|[^ \\]|\\$)+")
_UNESCAPE_RE = re.compile(r"\\(.)")
_FREE_TEXT = frozenset({"message", "msg"})
_RESPONSES = {  # query -> reply (PMI-1.1: see src/pmi/maint/pmi-1.1.txt in MPICH)
    "init": "response_to_init",
    "get_maxes": "maxes",
    "get_appnum": "appnum",
    "get_my_kvsname": "my_kvsname",
    "get_universe_size": "universe_size",
    "put": "put_result",
    "get": "get_result",
    "barrier_in": "barrier_out",
    "finalize": "finalize_ack",
    "publish_name": "publish_result",
    "unpublish_name": "unpublish_result",
    "lookup_name": "lookup_result",
    "spawn": "spawn_result",
    "initack": "initack",
    "singinit": "singinit_info",
}


class PmiError(ValueError):
    """A line that is not valid PMI-1."""


def parse_line(line: str) -> dict[str, str]:
    """Parse one ``cmd=...`` (or ``mcmd=...``) line into its fields, in order; values unescaped."""
    if len(line) > MAX_LINE:
        raise PmiError(f"line longer than {MAX_LINE} characters")
    text = line[:-1] if line.endswith("\n") else line
    if "\n" in text or "\0" in text:
        raise PmiError("newline or NUL inside a line")
    if not text.startswith(("cmd=", "mcmd=")):
        raise PmiError("line does not start with cmd= or mcmd=")
    fields: dict[str, str] = {}
    last = ""
    for token in _TOKEN_RE.findall(text):
        key, eq, raw = token.partition("=")
        if not eq:
            if last in _FREE_TEXT:
                fields[last] += " " + _UNESCAPE_RE.sub(r"\1", token)
                continue
            raise PmiError(f"token without '=': {token[:40]!r}")
        if not _KEY_RE.fullmatch(key):
            raise PmiError(f"bad key {key[:40]!r}")
        if not raw:
            raise PmiError(f"empty value for {key!r}")
        if key in fields:
            raise PmiError(f"duplicate key {key!r}")
        fields[key] = _UNESCAPE_RE.sub(r"\1", raw)
        last = key
    return fields


def format_line(fields: Mapping[str, str | int]) -> str:
    """Build one line; the first field must be ``cmd`` (or ``mcmd``). Raises ValueError if invalid."""
    parts = []
    for i, (key, value) in enumerate(fields.items()):
        if i == 0 and key not in ("cmd", "mcmd"):
            raise ValueError("the first field must be cmd or mcmd")
        if not _KEY_RE.fullmatch(key):
            raise ValueError(f"bad key {key!r}")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"value of {key!r} must be str or int")
        text = str(value)
        if not text or "\n" in text or "\0" in text:
            raise ValueError(f"value of {key!r} is empty or has a newline or NUL")
        parts.append(key + "=" + text.replace("\\", "\\\\").replace(" ", "\\ "))
    if not parts:
        raise ValueError("no fields")
    line = " ".join(parts) + "\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"line longer than {MAX_LINE} characters")
    return line


def process_mapping(ranks_per_node: Sequence[int], hosts: Sequence[int] = ()) -> str:
    """MPICH's ``PMI_process_mapping`` for a block distribution: node i holds ranks_per_node[i] ranks, on
    host ``hosts[i]`` (default: host i). MPI's "node" is the host: ranks there share memory.

    One ``(first_node,node_count,ranks_per_node)`` tuple per run of consecutive hosts with equal counts,
    e.g. ``[2, 2, 1]`` -> ``(vector,(0,2,2),(2,1,1))``; a host may come back (Slurm writes a cyclic
    distribution so), and consecutive nodes of one host are one run: ``[1, 1]`` on hosts ``[0, 0]`` ->
    ``(vector,(0,1,2))``.
    """
    if not ranks_per_node:
        raise ValueError("no nodes")
    if hosts and len(hosts) != len(ranks_per_node):
        raise ValueError(f"{len(hosts)} hosts for {len(ranks_per_node)} nodes")
    blocks: list[list[int]] = []  # [host, ranks], consecutive nodes of one host merged
    for node, count in enumerate(ranks_per_node):
        if count < 1:
            raise ValueError(f"node {node} has {count} ranks")
        host = hosts[node] if hosts else node
        if blocks and blocks[-1][0] == host:
            blocks[-1][1] += count
        else:
            blocks.append([host, count])
    runs: list[list[int]] = []  # [first host, hosts, ranks each]
    for host, count in blocks:
        last = runs[-1] if runs else None
        if last is not None and last[2] == count and last[0] + last[1] == host:
            last[1] += 1
        else:
            runs.append([host, 1, count])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in runs) + ")"


def mpich_shm_prefixes(kvsname: str) -> tuple[str, ...]:
    """File name prefixes of the POSIX shm segments (under /dev/shm) that MPICH 5 makes for a job.

    MPICH names them ``mpich_shm_%x_%d`` and ``mpich_vci_%x_%d`` (world id, node id), the world id
    being the 32-bit FNV-1a hash of the kvsname. They outlive ranks that are killed (verified with
    MPICH 5.0.2 by SIGKILLing jobs of known kvsnames; tests/test_pmi.py keeps checking it).
    """
    world_id = 0x811C9DC5
    for byte in kvsname.encode():
        world_id = ((world_id ^ byte) * 0x01000193) & 0xFFFFFFFF
    return (f"mpich_shm_{world_id:x}_", f"mpich_vci_{world_id:x}_")


def mpich_shm_names(kvsname: str, node_index: int) -> tuple[str, ...]:
    """The exact /dev/shm names MPICH 5 may leave for the ranks of one node of a job.

    Exact rather than prefixes: on a local cluster several nodes share one /dev/shm, and each node
    manager must remove only its own node's segments (``_1`` is a prefix of ``_10``).
    """
    return tuple(f"{prefix}{node_index}" for prefix in mpich_shm_prefixes(kvsname))


@dataclass(frozen=True)
class BarrierIn:
    """Every local rank entered barrier number ``seq`` (0, 1, 2, ...)."""

    seq: int
    puts: dict[str, str]  # what local ranks put since the previous barrier


@dataclass(frozen=True)
class Finished:
    """The rank ended its PMI session (finalize or abort)."""

    rank: int
    aborted: bool
    exit_code: int  # from abort (0 for finalize)
    message: str


@dataclass(frozen=True)
class NameRequest:
    """MPI_Publish_name (``publish``), MPI_Lookup_name (``lookup``) or MPI_Unpublish_name (``unpublish``)."""

    op: str
    service: str
    port: str = ""


@dataclass
class Outcome:
    """The result of feeding one line."""

    replies: list[tuple[int, str]]  # (rank, line) to write back
    barrier: BarrierIn | None = None
    finished: Finished | None = None
    spawn: SpawnRequest | None = None  # answer with spawn_reply
    name: NameRequest | None = None  # answer with name_reply


def spawn_reply(error: str = "") -> str:
    """The answer to a spawn request: started (``error`` empty), or refused and why."""
    if not error:
        return _reply("spawn_result")
    return format_line({"cmd": "spawn_result", "rc": -1, "msg": " ".join(error.split())[:1000] or "refused"})


def name_reply(op: str, *, port: str = "", error: str = "") -> str:
    """The answer to a NameRequest of ``op``: done (a lookup with its ``port``), or not and why."""
    cmd = {"publish": "publish_result", "lookup": "lookup_result", "unpublish": "unpublish_result"}[op]
    if error:
        return format_line({"cmd": cmd, "rc": 1, "msg": " ".join(error.split())[:1000] or "failed"})
    return _reply(cmd, port=port) if op == "lookup" else _reply(cmd)


def _reply(cmd: str, **fields: str | int) -> str:
    return format_line({"cmd": cmd, "rc": 0, **fields})


def _fail(rank: int, query: str, msg: str) -> Outcome:
    """Reply ``rc=-1`` to ``query`` (a reply named ``error`` if the query is unknown)."""
    text = " ".join(msg.split())[:200] or "error"
    return Outcome([(rank, format_line({"cmd": _RESPONSES.get(query, "error"), "rc": -1, "msg": text}))])


class Wireup:
    """PMI-1 state of one job on one node (see the module docstring for the semantics)."""

    def __init__(
        self,
        *,
        kvsname: str,
        size: int,
        local_ranks: Collection[int],
        process_mapping: str,
        appnum: int = 0,
        universe_size: int | None = None,
        kvs: Mapping[str, str] | None = None,
        appnums: Mapping[int, int] | None = None,
    ) -> None:
        if not _KEY_RE.fullmatch(kvsname) or len(kvsname) > KVSNAME_MAX:
            raise ValueError(f"bad kvsname {kvsname!r}")
        if size < 1 or not local_ranks or not all(0 <= r < size for r in local_ranks):
            raise ValueError(f"local ranks {sorted(local_ranks)} do not fit a job of {size}")
        if not process_mapping or any(c in process_mapping for c in " \n\0"):
            raise ValueError(f"bad process mapping {process_mapping!r}")
        self.kvsname = kvsname
        self.size = size
        self.local_ranks = frozenset(local_ranks)
        self.process_mapping = process_mapping
        self.appnum = appnum
        self.universe_size = size if universe_size is None else universe_size
        self._kvs: dict[str, str] = dict(kvs or {})  # preput + merged by barrier_done + every local put
        self._appnums = dict(appnums or {})
        self._puts: dict[str, str] = {}  # local puts since the last BarrierIn
        self._seq = 0  # the barrier being collected, or awaiting barrier_done
        self._entered: set[int] = set()  # local ranks inside barrier _seq
        self._awaiting = False  # BarrierIn(_seq) was returned; waiting for barrier_done
        self._finalized: set[int] = set()
        self._gone: set[int] = set()
        self._spawning: dict[int, SpawnBlock] = {}  # ranks in the middle of an mcmd=spawn request
        self._info: dict[str, dict[str, str | int]] = {
            "get_maxes": {"kvsname_max": KVSNAME_MAX, "keylen_max": KEYLEN_MAX, "vallen_max": VALLEN_MAX},
            "get_my_kvsname": {"kvsname": kvsname},
            "get_universe_size": {"size": self.universe_size},
        }
        self._commands: dict[str, Callable[[int, dict[str, str]], Outcome]] = {
            **dict.fromkeys(self._info, self._answer),
            "init": self._init,
            "get_appnum": self._appnum,
            **dict.fromkeys(NAME_OPS, self._name),
            "put": self._put,
            "get": self._get,
            "barrier_in": self._barrier_in,
            "finalize": self._finalize,
            "abort": self._abort,
        }

    def handle(self, rank: int, line: str) -> Outcome:
        """Feed one line from ``rank``; never raises for bad client input."""
        if rank not in self.local_ranks:
            raise ValueError(f"rank {rank} is not local to this node")
        if rank in self._spawning:
            if not line.startswith("cmd="):
                return self._spawn_line(rank, line)
            del self._spawning[rank]  # MPICH never does this: end the request, then serve the line
            interrupted = _fail(rank, "spawn", "spawn request interrupted by a cmd= line")
            outcome = self.handle(rank, line)
            outcome.replies[:0] = interrupted.replies
            return outcome
        if line.startswith("mcmd="):
            self._spawning[rank] = SpawnBlock()
            return self._spawn_line(rank, line)
        try:
            fields = parse_line(line)
        except PmiError as e:
            if line.startswith("cmd=abort"):  # never lose an abort, even a garbled one
                return Outcome([], finished=Finished(rank, True, 1, f"unparsable abort: {e}"))
            match = re.match(r"cmd=([A-Za-z_]*)", line)
            name = match.group(1) if match else ""
            hint = " (PMI-1 cannot carry a service name with a space)" if name in NAME_OPS else ""
            return _fail(rank, name, f"bad PMI line: {e}{hint}")
        cmd = fields["cmd"]
        handler = self._commands.get(cmd)
        if cmd == "spawn":
            return _fail(rank, cmd, "spawn is a multi-line command: mcmd=spawn ... endcmd")
        if handler is None:
            return _fail(rank, cmd, f"{cmd} is {'not supported' if cmd in _RESPONSES else 'unknown'}")
        return handler(rank, fields)

    def barrier_done(self, seq: int, kvs: Mapping[str, str]) -> list[tuple[int, str]]:
        """The whole job passed barrier ``seq``: merge ``kvs`` (what any node put) and release our ranks."""
        if not self._awaiting or seq != self._seq:
            state = f"barrier {self._seq} is {'pending' if self._awaiting else 'not complete here'}"
            raise ValueError(f"barrier_done({seq}) but {state}")
        self._kvs.update(kvs)
        released = sorted(self._entered - self._gone)
        self._entered.clear()
        self._awaiting = False
        self._seq += 1
        return [(rank, _reply("barrier_out")) for rank in released]

    def rank_gone(self, rank: int) -> None:
        """The rank's connection closed. If it had not finalized, barriers keep waiting for it."""
        self._gone.add(rank)
        self._spawning.pop(rank, None)

    def _answer(self, rank: int, fields: dict[str, str]) -> Outcome:
        return Outcome([(rank, _reply(_RESPONSES[fields["cmd"]], **self._info[fields["cmd"]]))])

    def _appnum(self, rank: int, fields: dict[str, str]) -> Outcome:
        return Outcome([(rank, _reply("appnum", appnum=self._appnums.get(rank, self.appnum)))])

    def _name(self, rank: int, fields: dict[str, str]) -> Outcome:
        cmd = fields["cmd"]
        service, port = fields.get("service"), fields.get("port")
        if service is None or (cmd == "publish_name" and port is None):
            return _fail(rank, cmd, f"{cmd} needs service={' and port=' if cmd == 'publish_name' else ''}")
        if len(service) > SERVICE_MAX or len(port or "") > PORT_MAX:
            return _fail(rank, cmd, f"service name over {SERVICE_MAX} or port over {PORT_MAX} characters")
        request = NameRequest(NAME_OPS[cmd], service, (port or "") if cmd == "publish_name" else "")
        return Outcome([], name=request)

    def _init(self, rank: int, fields: dict[str, str]) -> Outcome:
        if fields.get("pmi_version") != "1":
            return _fail(rank, "init", f"PMI version {fields.get('pmi_version')} is not supported")
        return Outcome([(rank, _reply("response_to_init", pmi_version=1, pmi_subversion=1))])

    def _barrier_in(self, rank: int, fields: dict[str, str]) -> Outcome:
        if rank in self._finalized:
            return _fail(rank, "barrier_in", f"rank {rank} already finalized")
        if rank in self._entered:
            return _fail(rank, "barrier_in", f"rank {rank} is already in barrier {self._seq}")
        self._entered.add(rank)
        return Outcome([], barrier=self._check_barrier())

    def _finalize(self, rank: int, fields: dict[str, str]) -> Outcome:
        self._finalized.add(rank)
        return Outcome([(rank, _reply("finalize_ack"))], self._check_barrier(), Finished(rank, False, 0, ""))

    def _abort(self, rank: int, fields: dict[str, str]) -> Outcome:
        try:
            code = int(fields.get("exitcode", "1"))
        except ValueError:
            code = 1
        return Outcome([], finished=Finished(rank, True, code, fields.get("message", "")))

    def _put(self, rank: int, fields: dict[str, str]) -> Outcome:
        key, value = fields.get("key"), fields.get("value")
        if fields.get("kvsname", self.kvsname) != self.kvsname:
            return _fail(rank, "put", f"unknown kvsname {fields['kvsname']}")
        if key is None or value is None:
            return _fail(rank, "put", "put needs key= and value=")
        if len(key) > KEYLEN_MAX or len(value) > VALLEN_MAX:
            return _fail(rank, "put", f"key or value of {key[:KEYLEN_MAX]} too long")
        self._kvs[key] = self._puts[key] = value
        return Outcome([(rank, _reply("put_result"))])

    def _get(self, rank: int, fields: dict[str, str]) -> Outcome:
        key = fields.get("key")
        if fields.get("kvsname", self.kvsname) != self.kvsname:
            return _fail(rank, "get", f"unknown kvsname {fields['kvsname']}")
        if key is None:
            return _fail(rank, "get", "get needs key=")
        value = self.process_mapping if key == "PMI_process_mapping" else self._kvs.get(key)
        if value is None:
            return _fail(rank, "get", f"key {key[:KEYLEN_MAX]} not found")
        return Outcome([(rank, _reply("get_result", value=value))])

    def _check_barrier(self) -> BarrierIn | None:
        participants = self.local_ranks - self._finalized
        if self._awaiting or not self._entered or not participants <= self._entered:
            return None
        self._awaiting = True
        puts, self._puts = self._puts, {}
        return BarrierIn(self._seq, puts)

    def _spawn_line(self, rank: int, line: str) -> Outcome:
        """One line of a spawn request; the complete request is returned, or refused if malformed."""
        block = self._spawning[rank]
        if not block.feed(line):
            return Outcome([])
        del self._spawning[rank]
        try:
            request = block.request()
        except SpawnError as exc:
            return _fail(rank, "spawn", f"bad spawn request: {exc}")
        return Outcome([], spawn=request)
