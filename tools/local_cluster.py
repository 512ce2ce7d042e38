"""A whole storm cluster on this one machine: one storm-mm and N storm-nm processes.

Everything lives in one directory (``storm local up --dir``, default ``~/.local/state/storm/local``)::

    storm.toml          the generated configuration
    local.json          pids (with their kernel start times) of the daemons, for `storm local down`
    mm/                 storm-mm's state: storm.db, mm.json (real endpoints), mm.log, mm.sock
    nodes/nodeI/        storm-nm's run directory; nodes/nodeI.log its log. Its jobs/ is a link into
                        /dev/shm (memory, as /run is on a real node): a job's directory costs
                        milliseconds of journaling on a disk, microseconds there
    emulated/           emulated node managers (``emulated``: emuI, tools/emulator.py): emulatorK.log, and
                        each node's run directory
    keys/               CURVE keys (mode 0700): mm.key(_secret), nodeI.key(_secret), and the allowed
                        public keys in keys/nodes/ and keys/clients/ (see mm/auth.py)

Node managers bind nothing on the network; the MM's node port is chosen by the kernel (port 0) and read
back from mm/mm.json. As on a real cluster the node managers talk to the MM with CURVE: each has a key pair
of its own that the MM allows (``keys=False`` runs without keys, as storm-mm does when none is configured);
the keys are made at the first ``up`` and kept, like the store. Each node's PEs are pinned to distinct CPUs
of this machine while there are enough.
`storm local down` stops node managers with SIGUSR1, which stops their jobs too (SIGTERM would leave the jobs
running for a restarted node manager to re-adopt, as ``systemctl restart storm-nm`` does on a real node).
Emulated node managers (``storm local up --emulate N``) are storm-nm's core with simulated ranks, many to a
process (tools/emulator.py), beside the real ones; they share one key pair (keys/emulated.key_secret).
Tests use the same code (:class:`LocalCluster`) to start and tear down throwaway clusters.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from storm.mm.keys import curve_client, read_keypair, read_public_key, write_keypair
from storm.mm.protocol import NodeState, Policy
from storm.mpihook.stats import cluster_token
from storm.nm import procfs
from storm.nm.switcher import TraceLine
from storm.tools.client import Client, ClientError

MEMORY = Path("/dev/shm")  # where node managers' job directories go (see the module's docstring)
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
EMULATED_PER_PROCESS = 256  # emulated node managers an emulator process takes before another is started


CLUSTER_NAME = "local"


class LocalClusterError(RuntimeError):
    pass


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``condition`` until it holds; LocalClusterError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise LocalClusterError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Daemon:
    name: str
    pid: int
    start_time: int
    log: str
    stop_signal: int = signal.SIGTERM  # what stops it for good (a node manager: SIGUSR1, jobs and all)

    def alive(self) -> bool:
        """Still the process we started (a reused pid has another start time) and not a zombie."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)  # reap it if it is our own child that exited
        return procfs.start_time(self.pid) == self.start_time

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)


@dataclass
class LocalCluster:
    dir: Path
    nodes: int = 2
    pes_per_node: int = 1
    policy: str = Policy.BATCH
    # Each NM writes one line per heartbeat to nodes/<name>/trace (see nm/switcher.py): for tests, benchmarks.
    trace: bool = False
    mm_settings: dict[str, object] = field(default_factory=dict)
    nm_settings: dict[str, object] = field(default_factory=dict)
    fcs_settings: dict[str, object] = field(default_factory=dict)
    # CURVE between the MM and its node managers (and remote clients, with [mm] client_tcp_endpoint).
    keys: bool = True
    # A torus (X, Y, Z) of X Y Z nodes, nodeI at x + X (y + Y z) = I ([mm] topology and coordinates).
    topology: tuple[int, int, int] | None = None
    # Emulated node managers emu0, emu1, ... (tools/emulator.py), in `emulator_processes` processes (0: one
    # per CPU, and at most one per EMULATED_PER_PROCESS nodes), each with pes_per_node PEs.
    emulated: int = 0
    emulator_processes: int = 0
    mm: Daemon | None = None
    nms: list[Daemon] = field(default_factory=list)
    emulators: list[Daemon] = field(default_factory=list)
    endpoint: str = ""
    node_endpoint: str = ""
    heartbeat_endpoint: str = ""
    remote_endpoint: str = ""  # [mm] client_tcp_endpoint as bound, if set
    metrics_endpoint: str = ""  # [mm] metrics_endpoint as bound (HOST:PORT), if set: GET /metrics there

    @property
    def config_path(self) -> Path:
        return self.dir / "storm.toml"

    @property
    def key_dir(self) -> Path:
        return self.dir / "keys"

    def _keypair(self, name: str, allow: str = "") -> Path:
        """keys/NAME.key_secret, made if missing; its public key copied into keys/ALLOW/ if given."""
        secret = self.key_dir / f"{name}.key_secret"
        if not secret.exists():
            write_keypair(self.key_dir, name, force=True)
        if allow:
            shutil.copyfile(self.key_dir / f"{name}.key", self.key_dir / allow / f"{name}.key")
        return secret

    def _make_keys(self) -> None:
        self.key_dir.mkdir(mode=0o700, exist_ok=True)
        for allowed in ("nodes", "clients"):
            (self.key_dir / allowed).mkdir(exist_ok=True)
        self._keypair("mm")

    def node_key(self, name: str) -> Path:
        """A node manager's key pair (keys/NAME.key_secret), allowed on the MM; made if missing."""
        return self._keypair(name, allow="nodes")

    def client_key(self, name: str) -> Path:
        """A remote client's key pair, allowed on the MM (a name before any '@' is the user it acts as)."""
        return self._keypair(name, allow="clients")

    def curve(self, sock: zmq.Socket[bytes], key: str = "node0") -> None:
        """Make a socket (a test's) a CURVE client of the MM with keys/KEY.key_secret; call before connect."""
        own = read_keypair(self.key_dir / f"{key}.key_secret")
        curve_client(sock, own, read_public_key(self.key_dir / "mm.key"))

    def node_names(self) -> list[str]:
        """Every node's name: the real node managers', then the emulated ones'."""
        return [f"node{i}" for i in range(self.nodes)] + self.emulated_names()

    def emulated_names(self) -> list[str]:
        return [f"emu{i}" for i in range(self.emulated)]

    def emulator_groups(self) -> list[list[str]]:
        """The emulated nodes of each emulator process."""
        names = self.emulated_names()
        if not names:
            return []
        cpus = len(os.sched_getaffinity(0))
        count = self.emulator_processes or min(cpus, -(-len(names) // EMULATED_PER_PROCESS))
        count = max(1, min(count, len(names)))
        return [names[k::count] for k in range(count)]

    def torus_settings(self) -> dict[str, object]:
        """[mm] topology and coordinates for a torus cluster (none for a flat one)."""
        if self.topology is None:
            return {}
        x_size, y_size, z_size = self.topology
        if self.nodes != x_size * y_size * z_size:
            raise LocalClusterError(
                f"a {x_size}x{y_size}x{z_size} torus has {x_size * y_size * z_size} nodes"
            )
        places = {
            f"node{i}": [i % x_size, i // x_size % y_size, i // (x_size * y_size)] for i in range(self.nodes)
        }
        return {"topology": f"torus {x_size}x{y_size}x{z_size}", "coordinates": places}

    def node_dir(self, name: str) -> Path:
        return self.dir / "nodes" / name

    def trace_path(self, name: str) -> Path:
        return self.node_dir(name) / "trace"

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.endpoint, timeout=timeout)

    # ------------------------------------------------------------------------------------------- up

    def write_config(self) -> None:
        """storm.toml, and the MM's keys it names (made here, so callers that start daemons one by one get
        them too; a node's key is made when it starts)."""
        if self.keys:
            self._make_keys()
        keys = self.key_dir
        mm_keys = {"key": f"{keys / 'mm.key_secret'}", "node_keys": f"{keys / 'nodes'}"}
        mm_keys["client_keys"] = f"{keys / 'clients'}"  # empty unless a test allows a client (client_key)
        settings = {
            "mm": {
                "state_dir": str(self.dir / "mm"),
                "client_endpoint": f"ipc://{self.dir / 'mm' / 'mm.sock'}",
                "node_endpoint": "tcp://127.0.0.1:0",
                "heartbeat_endpoint": "tcp://127.0.0.1:0",
                **(mm_keys if self.keys else {}),
                **self.torus_settings(),
                **self.mm_settings,
            },
            "nm": {
                "kill_grace": 2.0,
                **({"mm_key": f"{keys / 'mm.key'}"} if self.keys else {}),
                **self.nm_settings,
            },
            "fcs": self.fcs_settings,
        }
        lines = [f'[cluster]\nname = "{CLUSTER_NAME}"\npolicy = "{self.policy}"\n']
        for section, values in settings.items():
            if not values:
                continue
            lines.append(f"\n[{section}]\n")
            lines.extend(f"{key} = {toml_value(value)}\n" for key, value in values.items())
        self.config_path.write_text("".join(lines))

    def _spawn(self, name: str, argv: list[str], log: Path) -> Daemon:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True
            )
        proc.returncode = 0  # it outlives this Popen object; `down` stops it by pid and start time
        start = procfs.start_time(proc.pid)
        if start is None:
            raise LocalClusterError(f"{name} exited at once; see {log}")
        return Daemon(name=name, pid=proc.pid, start_time=start, log=str(log))

    def start_mm(self) -> None:
        """Start storm-mm; a restart keeps the first start's node port, so node managers find it again."""
        (self.dir / "mm").mkdir(parents=True, exist_ok=True)
        info_path = self.dir / "mm" / "mm.json"
        info_path.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "storm.mm.main", "--config", str(self.config_path)]
        if self.node_endpoint:
            argv += ["--node-endpoint", self.node_endpoint]
        if self.heartbeat_endpoint:
            argv += ["--heartbeat-endpoint", self.heartbeat_endpoint]
        self.mm = self._spawn("storm-mm", argv, self.dir / "mm" / "mm.log")
        mm = self.mm

        def ready() -> bool:
            if not mm.alive():
                raise LocalClusterError(f"storm-mm exited during start-up:\n{tail(mm.log)}")
            try:
                info = json.loads(info_path.read_text())
            except (OSError, ValueError):
                return False
            return bool(info.get("pid") == mm.pid)

        wait_for(ready, START_TIMEOUT, "storm-mm to listen")
        info = json.loads(info_path.read_text())
        self.endpoint, self.node_endpoint = info["client"], info["node"]
        self.heartbeat_endpoint = info.get("heartbeat", "")
        self.remote_endpoint = info.get("client_tcp", "")
        self.metrics_endpoint = info.get("metrics", "")

    def start_nm(self, index: int) -> Daemon:
        cpus = sorted(os.sched_getaffinity(0))
        name = f"node{index}"
        pes = [cpus[(index * self.pes_per_node + j) % len(cpus)] for j in range(self.pes_per_node)]
        run_dir = self.node_dir(name)
        run_dir.mkdir(parents=True, exist_ok=True)
        jobs = run_dir / "jobs"
        if jobs.is_symlink() and not jobs.exists():
            jobs.unlink()  # its memory is gone (a reboot)
        if not jobs.exists() and MEMORY.is_dir() and os.access(MEMORY, os.W_OK):
            target = Path(tempfile.mkdtemp(prefix=f"storm-local-{name}-", dir=MEMORY))
            target.chmod(0o755)  # job shells, as their users, reach their jobs' directories
            jobs.symlink_to(target)
        argv = [
            sys.executable, "-m", "storm.nm.main", "--config", str(self.config_path),
            "--name", name, "--mm", self.node_endpoint, "--run-dir", str(run_dir),
            "--cpus", ",".join(map(str, pes)),
        ]  # fmt: skip
        if self.trace:
            argv += ["--trace", str(self.trace_path(name))]
        if self.keys:
            argv += ["--key", str(self.node_key(name))]
        daemon = self._spawn(f"storm-nm {name}", argv, self.dir / "nodes" / f"{name}.log")
        daemon.stop_signal = signal.SIGUSR1
        return daemon

    def start_emulator(self, index: int, names: list[str]) -> Daemon:
        """Emulator process ``index``, running emulated node managers ``names`` (tools/emulator.py)."""
        run_dir = self.dir / "emulated"
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "storm.tools.emulator", "--config", str(self.config_path),
            "--mm", self.node_endpoint, "--run-dir", str(run_dir), "--names", ",".join(names),
            "--pes", str(self.pes_per_node),
        ]  # fmt: skip
        if self.trace:
            argv += ["--emulator-trace", str(self.emulator_trace(index))]
        if self.keys:
            argv += ["--key", str(self.node_key("emulated"))]
        return self._spawn(f"storm emulator{index}", argv, run_dir / f"emulator{index}.log")

    def emulator_trace(self, index: int) -> Path:
        """Emulator ``index``'s heartbeat trace: ``NODE`` and a trace line (nm/switcher.py) per line."""
        return self.dir / "emulated" / f"trace{index}"

    def trace_lines(self) -> dict[str, list[TraceLine]]:
        """Every node's heartbeat trace so far (with ``trace``), real and emulated: name -> its whole lines
        (one still being written is left out)."""
        traces: dict[str, list[TraceLine]] = {}
        for index in range(self.nodes):
            path = self.trace_path(f"node{index}")
            text = path.read_text() if path.exists() else ""
            found = (TraceLine.parse(line) for line in text.splitlines(keepends=True))
            traces[f"node{index}"] = [line for line in found if line is not None]
        for name in self.emulated_names():
            traces[name] = []
        for index in range(len(self.emulators)):
            path = self.emulator_trace(index)
            for line in path.read_text().splitlines(keepends=True) if path.exists() else ():
                name, _, rest = line.partition(" ")
                parsed = TraceLine.parse(rest)
                if parsed is not None and name in traces:
                    traces[name].append(parsed)
        return traces

    def hook_segments(self, job_id: int) -> set[str]:
        """The job's mpihook segments in /dev/shm (this cluster's only: their names carry its token)."""
        prefix = f"storm-hook-{cluster_token(CLUSTER_NAME, self.node_endpoint)}-{job_id}-"
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}

    def restart_mm(self, sig: int = signal.SIGKILL) -> None:
        """Kill storm-mm (SIGKILL by default: no chance to clean up) and start it again."""
        assert self.mm is not None
        mm = self.mm
        mm.signal(sig)
        wait_for(lambda: not mm.alive(), STOP_TIMEOUT, "storm-mm to die")
        self.start_mm()
        self.save()

    def kill_nm(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Stop node manager ``index`` with ``sig`` and wait until it is gone.

        SIGKILL (no chance to clean up) and SIGTERM leave its jobs running for the next one to re-adopt;
        SIGUSR1 stops them first.
        """
        old = self.nms[index]
        old.signal(sig)
        wait_for(lambda: not old.alive(), STOP_TIMEOUT, f"{old.name} to die")

    def revive_nm(self, index: int, *, wait: bool = True) -> None:
        """Start node manager ``index`` again (after kill_nm); with ``wait``, until it has registered."""
        log = self.dir / "nodes" / f"node{index}.log"
        offset = log.stat().st_size if log.exists() else 0
        self.nms[index] = new = self.start_nm(index)
        self.save()

        def registered() -> bool:
            if not new.alive():
                raise LocalClusterError(f"{new.name} exited during start-up:\n{tail(new.log)}")
            with open(log, "rb") as f:
                f.seek(offset)
                return b"registered with storm-mm" in f.read()

        if wait:
            wait_for(registered, START_TIMEOUT, f"{new.name} to register", interval=0.02)

    def wait_nodes_up(self, names: list[str], timeout: float = START_TIMEOUT) -> None:
        with self.client(timeout=5) as client:

            def registered() -> bool:
                for d in [*self.nms, *self.emulators]:
                    if not d.alive():
                        raise LocalClusterError(f"{d.name} exited during start-up:\n{tail(d.log)}")
                up = {n.name for n in client.nodes() if n.state == NodeState.UP and not n.reason}
                return set(names) <= up

            wait_for(registered, timeout, f"nodes {', '.join(names)} to register", interval=0.05)

    def up(self) -> None:
        if self.running():
            raise LocalClusterError(
                f"a local cluster is already running in {self.dir}; `storm local down` first"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "nodes").mkdir(exist_ok=True)
        self.write_config()
        try:
            self.start_mm()
            self.nms = [self.start_nm(i) for i in range(self.nodes)]
            self.emulators = [self.start_emulator(k, g) for k, g in enumerate(self.emulator_groups())]
            self.save()
            self.wait_nodes_up(self.node_names(), START_TIMEOUT + self.emulated / 50)
        except BaseException:
            self.down()
            raise

    # ------------------------------------------------------------------------------------------- state

    def save(self) -> None:
        state = {
            "endpoint": self.endpoint,
            "node_endpoint": self.node_endpoint,
            "heartbeat_endpoint": self.heartbeat_endpoint,
            "metrics_endpoint": self.metrics_endpoint,
            "nodes": self.nodes,
            "pes_per_node": self.pes_per_node,
            "policy": self.policy,
            "topology": self.topology,
            "emulated": self.emulated,
            "mm": self.mm.__dict__ if self.mm else None,
            "nms": [d.__dict__ for d in self.nms],
            "emulators": [d.__dict__ for d in self.emulators],
        }
        tmp = self.dir / "local.json.tmp"
        tmp.write_text(json.dumps(state, indent=1) + "\n")
        tmp.replace(self.dir / "local.json")

    @classmethod
    def load(cls, directory: Path) -> LocalCluster:
        try:
            state = json.loads((directory / "local.json").read_text())
        except FileNotFoundError:
            raise LocalClusterError(f"no local cluster in {directory}") from None
        topology = state.get("topology")
        cluster = cls(
            dir=directory, nodes=state["nodes"], pes_per_node=state["pes_per_node"], policy=state["policy"],
            topology=None if topology is None else (topology[0], topology[1], topology[2]),
            emulated=state.get("emulated", 0),
        )  # fmt: skip
        cluster.endpoint, cluster.node_endpoint = state["endpoint"], state["node_endpoint"]
        cluster.heartbeat_endpoint = state.get("heartbeat_endpoint", "")
        cluster.metrics_endpoint = state.get("metrics_endpoint", "")
        cluster.mm = Daemon(**state["mm"]) if state["mm"] else None
        cluster.nms = [Daemon(**d) for d in state["nms"]]
        cluster.emulators = [Daemon(**d) for d in state.get("emulators", [])]
        return cluster

    def running(self) -> bool:
        try:
            other = LocalCluster.load(self.dir)
        except (LocalClusterError, ValueError, KeyError, TypeError):
            return False
        return any(d.alive() for d in [*other.nms, *other.emulators, *([other.mm] if other.mm else [])])

    # ------------------------------------------------------------------------------------------- down

    @staticmethod
    def stop(daemons: list[Daemon], timeout: float = STOP_TIMEOUT) -> None:
        """Each one's stop signal, wait, then SIGKILL: only the processes we started (pid and start time
        both match)."""
        for d in daemons:
            d.signal(d.stop_signal)
        try:
            wait_for(lambda: not any(d.alive() for d in daemons), timeout, "daemons to stop", interval=0.05)
        except LocalClusterError:
            for d in daemons:
                d.signal(signal.SIGKILL)
            wait_for(lambda: not any(d.alive() for d in daemons), 5.0, "daemons to die", interval=0.05)

    def down(self) -> None:
        """Leaves first: node managers (real and emulated) stop their jobs and report, then the MM stops."""
        self.stop([*self.nms, *self.emulators])
        if self.mm is not None:
            self.stop([self.mm])
        (self.dir / "local.json").unlink(missing_ok=True)
        for name in self.node_names():
            jobs = self.node_dir(name) / "jobs"
            if jobs.is_symlink():
                shutil.rmtree(jobs.resolve(), ignore_errors=True)
                jobs.unlink()


def toml_value(value: object) -> str:
    """A setting as TOML: JSON's strings, numbers, booleans and arrays are TOML's; a table is written
    inline, its keys quoted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def status(directory: Path) -> str:
    cluster = LocalCluster.load(directory)
    try:
        with cluster.client(timeout=5) as client:
            nodes = client.nodes()
    except ClientError as exc:
        return f"local cluster in {directory}: storm-mm not answering ({exc})"
    up = sum(1 for n in nodes if n.state == NodeState.UP)
    return f"local cluster in {directory}: {up}/{len(nodes)} nodes up, endpoint {cluster.endpoint}"
