"""The storm.toml configuration file, shared by storm-mm ([cluster], [mm]) and storm-nm ([cluster], [nm]).

Every field can also be set on the daemon's command line: ``--node-timeout 5`` overrides
``[mm] node_timeout``.
Unknown keys and values of the wrong type are errors that name the key, so a typo never goes unnoticed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import socket
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storm.mm.preemption import PreemptionRules
from storm.mm.protocol import (
    MAX_NODE_MESSAGE,
    POLICIES,
    FcsParameters,
    Policy,
    ProtocolError,
    default_f_thresh,
)
from storm.mm.scheduler import BACKFILL_MODES
from storm.mm.sizing import MOLDABLE_RULES
from storm.mm.torus import parse_topology
from storm.mm.torus_scheduler import TORUS_BACKFILL
from storm.mm.torus_state import TorusLayout, torus_of

DEFAULT_CONFIG = Path("/etc/storm/storm.toml")
PREEMPTION_MODES = ("off", "suspend")
# Every job's QOS unless storm submit --qos names another: priority 0 unless [mm] qos says otherwise.
DEFAULT_QOS = "normal"
# [mm] metrics_endpoint: a host name or IPv4 address, "*", or an IPv6 address in brackets; then a port.
_HOST_PORT = re.compile(
    r"(?:(?P<host>\*|[A-Za-z0-9][A-Za-z0-9.-]*)|\[(?P<v6>[0-9A-Fa-f:.]+)\]):(?P<port>[0-9]{1,5})"
)


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    name: str = "storm"
    policy: str = Policy.BATCH.value  # one of POLICIES (checked on loading); a plain str for --help


@dataclass(frozen=True, kw_only=True)
class MMConfig:
    state_dir: str = "/var/lib/storm"
    # The CLI's endpoint: a local socket, so the kernel tells the MM who is calling.
    client_endpoint: str = "ipc:///run/storm/mm.sock"
    node_endpoint: str = "tcp://*:6817"
    # Gang scheduling's heartbeats go out here, one per time slice.
    heartbeat_endpoint: str = "tcp://*:6818"
    slice: float = 0.1
    # Each heartbeat names the instant its slot begins, this long after it is sent (seconds): every node
    # whose clock agrees with the MM's switches then, not when the heartbeat arrives, so that nodes switch
    # together whatever the delivery took. It must cover delivery to the last node (a late one switches on
    # arrival and counts it); at most half a slice is used. 0: heartbeats name no instant, and nodes switch
    # on arrival (clocks not trusted). 20 ms: delivery to 8 NMs on a busy 2-CPU host took up to 18 ms at
    # the 99th percentile (storm bench scale); on a LAN it takes well under a millisecond.
    switch_lead: float = 0.02
    node_timeout: float = 10.0
    mpl: int = 1
    # What may start ahead of the first job that does not fit: easy (EASY backfilling, without delaying that
    # job), conservative (without delaying any waiting job) or none (nothing: strict FCFS).
    backfill: str = "easy"
    default_time_limit: float = 0.0
    sync: str = "FULL"
    log_level: str = "info"
    # Jobs stuck this long after their ranks were told to stop are ended anyway (their node is suspect).
    kill_timeout: float = 60.0
    # Run at real-time priority (SCHED_FIFO) where allowed: heartbeats go out on time under load.
    realtime: bool = True
    # A job submitted with --requeue goes back to the queue after a node failure at most this many times
    # (Slurm's MaxBatchRequeue, also 5); after that it ends NODE_FAIL. 0: never requeue.
    max_requeues: int = 5
    # Job arrays (storm submit --array): task ids go from 0 to max_array_size - 1 (Slurm's MaxArraySize,
    # 1001 by default; at most 4000001, Slurm's bound too). A bigger array is refused when submitted.
    max_array_size: int = 1001
    # Per-client limits (a client is a uid). A request larger than this gets a `too_large` error; one over
    # four times this is cut off by ZeroMQ before it is read at all (the peer is disconnected).
    max_message_bytes: int = 1 << 20
    # Submissions per second per user, refilling a bucket of submit_burst (a token bucket); 0: no limit.
    submit_rate: float = 100.0
    submit_burst: int = 1000
    # CURVE (see mm/auth.py): the MM's key pair (a `storm keygen` NAME.key_secret file). Empty: no keys,
    # node managers connect unauthenticated and in the clear (the MM warns at start-up).
    key: str = ""
    # Directories of allowed public keys (NAME.key files): node managers, and remote clients (a client key
    # named alice.key or alice@laptop.key acts as user alice). Read again whenever they change.
    node_keys: str = ""
    client_keys: str = ""
    # Remote `storm` clients over TCP with CURVE (e.g. tcp://*:6819); empty: local clients only.
    client_tcp_endpoint: str = ""
    # Users (names or uids) who may cancel anyone's jobs, as root may.
    operators: list[str] = field(default_factory=list)
    # The hang watchdog: a running job whose every rank has been inside one blocking MPI call for this many
    # seconds is shown as possibly deadlocked (storm show, storm stats, storm queue). 0: off.
    hang_warning: float = 0.0
    # The network: "flat" (any nodes may run a job together) or "torus XxYxZ" (a job's nodes must form a
    # box on a 3-D torus, mm/torus_scheduler.py), with each node's place in `coordinates`: name -> [x, y, z].
    topology: str = "flat"
    coordinates: dict[str, list[int]] = field(default_factory=dict)
    # Moldable jobs (storm submit -n MIN-MAX) get their size when they start, by Parsons and Sevcik's adaptive
    # rule (mm/sizing.py): "rtc-ad" (first fit at the minima, the PEs left shared out equally) or "subset"
    # (RTC-ADSUBSET: as the system fills, fewer first-fit jobs and a subset sum that packs the free PEs best).
    moldable: str = "rtc-ad"
    # Qualities of service: name -> priority (storm submit --qos NAME). A higher priority goes first in the
    # queue and, with preemption on, may suspend running jobs of a lower one. "normal" (0) is the default.
    qos: dict[str, int] = field(default_factory=dict)
    # Who may submit with a QOS: name -> users (names or uids). A QOS not listed is open to everyone; root and
    # operators may use any.
    qos_users: dict[str, list[str]] = field(default_factory=dict)
    # "suspend" (Slurm's PreemptMode=SUSPEND): a job that cannot start may suspend running jobs of a lower
    # QOS priority that have run preempt_min_run seconds since they started or resumed (their ranks stop, and
    # continue on the same PEs when it ends, the suspension not counted against their limit); "off": never.
    preemption: str = "off"
    preempt_min_run: float = 60.0
    # At most this many jobs' processes on any PE, running or suspended (suspended jobs keep their memory).
    preempt_max_jobs: int = 5
    # Prometheus metrics (mm/exporter.py): HOST:PORT where storm-mm serves GET /metrics over HTTP, e.g.
    # "127.0.0.1:9464" ("*:9464": every interface; port 0: one the kernel picks, written to mm.json). Empty:
    # off. Counts only (no job names, users or commands), and no authentication: bind it where only the
    # monitoring can reach it.
    metrics_endpoint: str = ""

    def qos_priority(self, name: str) -> int | None:
        """The priority of a QOS ("" is the default one), None for a QOS the configuration does not have."""
        name = name or DEFAULT_QOS
        if name in self.qos:
            return self.qos[name]
        return 0 if name == DEFAULT_QOS else None

    def preemption_rules(self) -> PreemptionRules | None:
        """PREEMPT's rules for mm/preemption.py, or None when preemption is off."""
        if self.preemption != "suspend":
            return None
        return PreemptionRules(min_run_s=self.preempt_min_run, max_processes=self.preempt_max_jobs)

    def torus_layout(self) -> TorusLayout | None:
        """The torus and its nodes, or None for a flat network (a loaded config has been checked)."""
        dims = parse_topology(self.topology)
        if dims is None:
            return None
        return TorusLayout.from_coordinates(dims, self.coordinates)


@dataclass(frozen=True, kw_only=True)
class NMConfig:
    name: str = ""
    mm: str = "tcp://localhost:6817"
    run_dir: str = "/run/storm-nm"
    pes: int = 0
    cpus: list[int] = field(default_factory=list)
    kill_grace: float = 3.0
    log_level: str = "info"
    # Real-time priority (SCHED_FIFO, not inherited by jobs) so context switches happen on time under load.
    realtime: bool = True
    # Without a heartbeat for this long (seconds; 0: ten time slices, at least one second) every rank runs.
    heartbeat_timeout: float = 0.0
    # This node's clock agrees with the MM's (chrony, PTP): switch at the instant a heartbeat names. False:
    # switch when a heartbeat arrives, as the MM's clock is not to be trusted here.
    synchronized_clock: bool = True
    # How far behind the MM's this node's clock may be (seconds): a heartbeat whose instant lies further
    # ahead than the MM's lead plus this is switched on arrival and counted (skewed_beats in storm nodes).
    clock_tolerance: float = 0.002
    # Append one line per heartbeat (seq, sent, received, switched) to this file, for benchmarks.
    trace: str = ""
    # Profile where each rank's time goes, per class (a /proc read per rank per slice): storm stats --profile.
    profile: bool = False
    # Preload mpihook into ranks (false: no job on this node gets it, as with storm submit --no-hook).
    hook: bool = True
    # The machine this NM runs on: node managers of one host give a job's ranks shared memory between them
    # (MPI sees one node). Empty: this kernel's boot id and host name. Give NMs of one machine different
    # values to make their ranks talk over the network instead (as a test of the network path would).
    host: str = ""
    # CURVE: this node's key pair (NAME.key_secret) and the MM's public key (mm.key); both or neither.
    key: str = ""
    mm_key: str = ""
    # MPI_Comm_spawn: live spawned processes a job may have per PE it holds on this node (0: no spawning).
    spawn_limit: int = 16
    # A user's job shell (one per user on the node, serving all their jobs there) exits after this many
    # seconds without a job; the next job starts another (a few ms of CPU).
    shell_idle: float = 2.0


@dataclass(frozen=True, kw_only=True)
class FcsConfig:
    """Flexible CoScheduling's constants (Table 2 of the paper), read by the MM and handed to every NM."""

    # Table 2's values are FcsParameters' (the wire form); here in the units an operator writes.
    spin_us: float = FcsParameters.spin * 1e6  # T_spin, also the spin of the sb policy
    cslots_min: int = FcsParameters.cslots_min
    dc_thresh: float = FcsParameters.dc_thresh
    cs_thresh: float = FcsParameters.cs_thresh
    f_thresh: float = 0.0  # 0: Table 2's, derived from cs_thresh (protocol.default_f_thresh)
    tslots_max: int = FcsParameters.tslots_max
    f_priority: str = FcsParameters.f_priority
    background_nice: int = FcsParameters.background_nice


@dataclass(frozen=True, kw_only=True)
class StormConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    mm: MMConfig = field(default_factory=MMConfig)
    nm: NMConfig = field(default_factory=NMConfig)
    fcs: FcsConfig = field(default_factory=FcsConfig)

    def node_name(self) -> str:
        return self.nm.name or socket.gethostname().split(".")[0]

    def node_host(self) -> str:
        """[nm] host, or what tells this machine from others: processes that share a kernel (its boot id)
        and a host name share /dev/shm, which MPICH's shared memory needs (containers get their own)."""
        if self.nm.host:
            return self.nm.host
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot_id = ""
        return f"{socket.gethostname()}/{boot_id}"

    def fcs_parameters(self) -> FcsParameters:
        fcs = self.fcs
        return FcsParameters(
            spin=fcs.spin_us / 1e6,
            cslots_min=fcs.cslots_min,
            dc_thresh=fcs.dc_thresh,
            cs_thresh=fcs.cs_thresh,
            f_thresh=fcs.f_thresh or default_f_thresh(fcs.cs_thresh),
            tslots_max=fcs.tslots_max,
            f_priority=fcs.f_priority,
            background_nice=fcs.background_nice,
        )

    def node_cpus(self) -> list[int]:
        """The CPUs the NM's PEs are pinned to, PE i on cpus[i]."""
        if self.nm.cpus:
            return list(self.nm.cpus)
        allowed = sorted(os.sched_getaffinity(0))
        count = self.nm.pes or len(allowed)
        return [allowed[i % len(allowed)] for i in range(count)]


def _coerce(value: Any, hint: Any, where: str) -> Any:
    if hint is bool:
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif hint is float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None and math.isfinite(number):
            return number
    elif hint is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if isinstance(value, list):
            return [_coerce(v, item, where) for v in value]
    elif typing.get_origin(hint) is dict:
        _, item = typing.get_args(hint)
        if isinstance(value, str):  # the command line's form: "node0=0,0,0 node1=1,0,0"
            pairs = [entry.partition("=") for entry in value.replace(";", " ").split()]
            if all(name and sep for name, sep, _ in pairs):
                value = {name: text for name, _, text in pairs}
        if isinstance(value, dict):
            return {str(k): _coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    raise ConfigError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")


def _section(cls: type[Any], values: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
        )
    return cls(**{k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()})


def _validate(config: StormConfig) -> None:
    if config.cluster.policy not in POLICIES:
        raise ConfigError(f"cluster.policy: {config.cluster.policy!r} is not one of {', '.join(POLICIES)}")
    if config.mm.mpl < 1:
        raise ConfigError("mm.mpl must be at least 1")
    if config.cluster.policy == Policy.BATCH and config.mm.mpl != 1:
        raise ConfigError(
            "cluster.policy batch runs one job per PE: mm.mpl must be 1 (use gang to time-share)"
        )
    if config.mm.backfill not in BACKFILL_MODES:
        raise ConfigError(f"mm.backfill: {config.mm.backfill!r} is not one of {', '.join(BACKFILL_MODES)}")
    if not 0.001 <= config.mm.slice <= 60:
        raise ConfigError("mm.slice must be between 0.001 and 60 seconds")
    if config.nm.heartbeat_timeout < 0:
        raise ConfigError("nm.heartbeat_timeout must not be negative")
    if not 0 <= config.mm.switch_lead <= 1.0:
        raise ConfigError("mm.switch_lead must be between 0 (switch on arrival) and 1 second")
    if not 0 <= config.nm.clock_tolerance <= 1.0:
        raise ConfigError("nm.clock_tolerance must be between 0 and 1 second")
    try:  # FCS's constants are checked where they are defined, as the nodes will check them
        config.fcs_parameters()
    except ProtocolError as exc:
        raise ConfigError(f"fcs: {exc}") from None
    if config.mm.node_timeout <= 0 or config.mm.kill_timeout <= 0:
        raise ConfigError("mm.node_timeout and mm.kill_timeout must be positive")
    if not 0 <= config.mm.hang_warning < float("inf"):
        raise ConfigError("mm.hang_warning must be 0 (off) or a number of seconds")
    if not 1 <= config.mm.max_array_size <= 4_000_001:
        raise ConfigError("mm.max_array_size must be 1 to 4000001 (task ids 0 to max_array_size - 1)")
    if config.mm.max_requeues < 0:
        raise ConfigError("mm.max_requeues must not be negative (0: never requeue)")
    if not 4096 <= config.mm.max_message_bytes <= MAX_NODE_MESSAGE:
        raise ConfigError(f"mm.max_message_bytes must be between 4096 and {MAX_NODE_MESSAGE}")
    if config.mm.submit_rate < 0 or config.mm.submit_burst < 1:
        raise ConfigError("mm.submit_rate must not be negative (0: no limit), mm.submit_burst must be >= 1")
    if config.mm.default_time_limit < 0:
        raise ConfigError("mm.default_time_limit must not be negative (0: no limit)")
    if config.mm.sync.upper() not in ("FULL", "NORMAL", "EXTRA"):
        raise ConfigError(f"mm.sync: {config.mm.sync!r} is not one of FULL, NORMAL, EXTRA")
    for where, level in (("mm.log_level", config.mm.log_level), ("nm.log_level", config.nm.log_level)):
        if level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"{where}: {level!r} is not one of debug, info, warning, error")
    _validate_topology(config.mm)
    _validate_jobs(config.mm)
    if config.mm.metrics_endpoint:
        try:
            metrics_address(config.mm.metrics_endpoint)
        except ValueError as exc:
            raise ConfigError(f"mm.metrics_endpoint: {exc}") from None
    if config.nm.pes < 0 or config.nm.kill_grace < 0 or config.nm.shell_idle < 0:
        raise ConfigError("nm.pes, nm.kill_grace and nm.shell_idle must not be negative")
    if not 0 <= config.nm.spawn_limit <= 4096:
        raise ConfigError("nm.spawn_limit must be between 0 (no spawning) and 4096")
    _validate_keys(config)


def metrics_address(endpoint: str) -> tuple[str, int]:
    """[mm] metrics_endpoint as (host, port): host "" for "*" (every interface), an IPv6 address without its
    brackets. ValueError saying what is wrong otherwise."""
    found = _HOST_PORT.fullmatch(endpoint)
    if found is None:
        raise ValueError(
            f"{endpoint!r} is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464, or *:9464 for every interface;"
            " empty: off)"
        )
    host, port = found["v6"] or found["host"], int(found["port"])
    if port > 65535:
        raise ValueError(f"{endpoint!r}: port {port} is not in 0-65535")
    return ("" if host == "*" else host), port


def _validate_topology(mm: MMConfig) -> None:
    """A torus that can be built, every node on it once, and the scheduling a torus takes."""
    try:
        dims = parse_topology(mm.topology)
    except ValueError as exc:
        raise ConfigError(f"mm.topology: {exc}") from None
    if dims is None:
        if mm.coordinates:
            raise ConfigError(
                "mm.coordinates: nodes have places only on a torus (mm.topology = 'torus XxYxZ')"
            )
        return
    try:
        torus_of(dims)
    except ValueError as exc:
        raise ConfigError(f"mm.topology: {exc}") from None
    try:
        mm.torus_layout()
    except ValueError as exc:
        raise ConfigError(f"mm.coordinates: {exc}") from None
    if mm.mpl != 1:
        raise ConfigError("mm.topology: a torus runs one job per node (its box): mm.mpl must be 1")
    if mm.backfill not in TORUS_BACKFILL:
        raise ConfigError(
            f"mm.backfill: {mm.backfill!r} is not for a torus: 'none' (FCFS) or 'easy' (backfilling), the "
            "BlueGene/L paper's two without migration"
        )


def _validate_jobs(mm: MMConfig) -> None:
    """Moldable sizing, qualities of service and preemption."""
    if mm.moldable not in MOLDABLE_RULES:
        raise ConfigError(f"mm.moldable: {mm.moldable!r} is not one of {', '.join(MOLDABLE_RULES)}")
    for name in mm.qos:
        if not (1 <= len(name) <= 64 and name.replace("-", "").replace("_", "").isalnum()):
            raise ConfigError(f"mm.qos: {name!r} is not a QOS name (letters, digits, - and _)")
    unknown = sorted(name for name in mm.qos_users if mm.qos_priority(name) is None)
    if unknown:
        raise ConfigError(f"mm.qos_users: no QOS {', '.join(unknown)} in mm.qos")
    if mm.preemption not in PREEMPTION_MODES:
        raise ConfigError(f"mm.preemption: {mm.preemption!r} is not one of {', '.join(PREEMPTION_MODES)}")
    if not 0 <= mm.preempt_min_run < float("inf") or mm.preempt_max_jobs < 1:
        raise ConfigError("mm.preempt_min_run must be >= 0 seconds and mm.preempt_max_jobs >= 1")
    if mm.preemption == "suspend" and parse_topology(mm.topology) is not None:
        raise ConfigError(
            "mm.preemption: not on a torus (mm.topology): a preempting job would need a box of the suspended "
            "jobs' nodes, which storm does not choose; use preemption = 'off'"
        )


def _validate_keys(config: StormConfig) -> None:
    """Key settings that cannot work together; whether the files exist is checked by the daemons."""
    mm = config.mm  # [nm] key and mm_key go together, which storm-nm checks (the MM reads the file too)
    if mm.key and not mm.node_keys:
        raise ConfigError("mm.node_keys: with mm.key, name the directory of allowed node manager keys")
    if (mm.node_keys or mm.client_keys) and not mm.key:
        raise ConfigError("mm.key: allowed keys (mm.node_keys, mm.client_keys) need the MM's own key pair")
    if mm.client_tcp_endpoint and not (mm.key and mm.client_keys):
        raise ConfigError(
            "mm.client_tcp_endpoint: remote clients are served only with CURVE: set mm.key and mm.client_keys"
        )
    if mm.client_tcp_endpoint and not mm.client_tcp_endpoint.startswith("tcp://"):
        raise ConfigError("mm.client_tcp_endpoint must be tcp:// (local clients use mm.client_endpoint)")


def load(path: Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> StormConfig:
    """Read ``path`` (None: the defaults), then apply ``{section: {key: value}}`` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such configuration file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    sections = {f.name: f.type for f in dataclasses.fields(StormConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(StormConfig)
    built = {}
    for name in sections:
        section = raw.get(name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
        values = {**section, **(overrides or {}).get(name, {})}
        built[name] = _section(hints[name], values, name)
    config = StormConfig(**built)
    _validate(config)
    return config


def add_arguments(parser: argparse.ArgumentParser, sections: tuple[str, ...]) -> None:
    """One ``--flag`` per setting of the given sections, all defaulting to "not given".

    [cluster] name is ``--cluster-name``, so that ``--name`` always means the node's (storm-nm) name.
    """
    parser.add_argument(
        "--config", type=Path, help=f"configuration file (default {DEFAULT_CONFIG} if present)"
    )
    hints = typing.get_type_hints(StormConfig)
    for section in sections:
        group = parser.add_argument_group(f"[{section}] settings")
        for f in dataclasses.fields(hints[section]):
            flag = "cluster_name" if (section, f.name) == ("cluster", "name") else f.name
            default = f.default if f.default is not dataclasses.MISSING else []
            group.add_argument(
                "--" + flag.replace("_", "-"),
                dest=f"{section}__{f.name}",
                default=None,
                metavar=str(f.type).split("[")[0].upper(),
                help=f"[{section}] {f.name}, default {default!r}",
            )


def from_arguments(args: argparse.Namespace) -> StormConfig:
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in vars(args).items():
        if "__" in key and value is not None:
            section, name = key.split("__", 1)
            overrides.setdefault(section, {})[name] = value
    path: Path | None = args.config
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    return load(path, overrides)
