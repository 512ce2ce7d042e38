"""Hosts in network namespaces for tests: one subnet, one bridge, links that can be cut and restored.

A :class:`Lab` makes one network namespace per host, each with an ``eth0`` on a private subnet (10.77.0.1,
.2, ...), and joins them to a bridge that lives in a namespace of its own (the "switch"), so nothing in the
root namespace changes. Cutting a host's link sets its switch port down: the host keeps its address and its
sockets, and its packets go nowhere, as when a cable is pulled at the switch. Processes started with
:meth:`Lab.exec_argv` run in a host's namespace (``ip netns exec`` switches namespace and then execs the
command, so the pid is the command's own). Filesystem, /dev/shm and Unix sockets stay shared: only the
network is separate, so a local client still reaches storm-mm over its ipc:// socket.

Every name carries this process's pid (``stormlab<pid>-<host>``); :func:`sweep` removes the namespaces of
test processes that are gone, and only those.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from storm.tools.local_cluster import Daemon, LocalCluster

PREFIX = "stormlab"


class LabError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {result.stderr.strip() or f'exit {result.returncode}'}")
    return result


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can): tried for real, then removed."""
    if shutil.which("ip") is None or shutil.which("ss") is None:
        return "the `ip` and `ss` commands (iproute2) are not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CI runs the suite as root)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        for what, step in (
            ("a veth pair", ("link", "add", "name", "x0", "type", "veth", "peer", "name", "x1")),
            ("a bridge", ("link", "add", "name", "x2", "type", "bridge")),
        ):
            tried = ip("-n", probe, *step, check=False)
            if tried.returncode != 0:
                return f"cannot create {what} in a network namespace: {tried.stderr.strip()}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


def sweep() -> None:
    """Delete namespaces a test process (now dead) left behind, e.g. after it was killed mid-test."""
    listed = ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\S+)", listed, re.MULTILINE):
        full, pid = name
        if not psutil.pid_exists(int(pid)):
            ip("netns", "del", full, check=False)


@dataclass
class Lab:
    hosts: list[str]
    subnet: str = "10.77.0"
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    made: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.tag}-switch"

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        return f"{self.subnet}.{self.hosts.index(host) + 1}"

    def port(self, host: str) -> str:
        return f"port{self.hosts.index(host)}"

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def up(self) -> None:
        """Create everything; on any failure, remove what was made and raise."""
        try:
            self._add_ns(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts:
                ns, port = self.ns(host), self.port(host)
                self._add_ns(ns)
                # One veth pair, created with each end already in its namespace: eth0 on the host, the port
                # on the switch, enslaved to the bridge.
                ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", port, "netns", self.switch)
                ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.down()
            raise

    def cut(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", self.port(host), "down")

    def restore(self, host: str) -> None:
        """Mend the link, and forget the neighbours (ARP) the hosts failed to reach meanwhile.

        Without that, the cut host's entries for its peers stay INCOMPLETE after the link is back, until
        their last ARP retries run out (up to 3 s), and a connection made then fails with "No route to host"
        (measured: an MPI job started on the host as soon as its node manager had rejoined failed in
        MPI_Init in 1 of 4 tries). A host whose cable is plugged back in is in the same state; the test is
        about storm, not about ARP timers.
        """
        ip("-n", self.switch, "link", "set", self.port(host), "up")
        ip("-n", self.ns(host), "neigh", "flush", "dev", "eth0")
        for other in self.hosts:
            if other != host:
                ip("-n", self.ns(other), "neigh", "flush", "to", self.address(host))

    def restore_all(self) -> None:
        if self.switch in self.made:
            for host in self.hosts:
                ip("-n", self.switch, "link", "set", self.port(host), "up", check=False)

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def run(self, host: str, *argv: str) -> str:
        """A command's output, run in the host's namespace."""
        result = subprocess.run(
            self.exec_argv(host, list(argv)), capture_output=True, text=True, timeout=30, check=False
        )
        if result.returncode != 0:
            raise LabError(f"{' '.join(argv)} in {host}: {result.stderr.strip()}")
        return result.stdout

    def down(self) -> None:
        """Delete the namespaces (their veths go with them); the processes in them must be stopped first."""
        for name in reversed(self.made):
            ip("netns", "del", name, check=False)
        self.made.clear()


@dataclass
class NetnsCluster(LocalCluster):
    """A local cluster whose MM runs in host ``mm`` and node managers in hosts ``node0``, ``node1``, ...

    LocalCluster starts every daemon through ``_spawn`` and names them ``storm-mm`` and ``storm-nm NODE``;
    this only prefixes the command with the host's namespace. The MM's node and heartbeat endpoints are
    bound on its own address, and node managers connect there (LocalCluster passes the MM's real endpoint).
    Each node manager names its namespace as its host ([nm] host): they share this machine's kernel and
    /dev/shm, and storm would otherwise tell MPI that their ranks share memory, which is not what a test of
    the network path wants.
    """

    lab: Lab | None = None

    def _spawn(self, name: str, argv: list[str], log: Path) -> Daemon:
        assert self.lab is not None
        host = "mm" if name == "storm-mm" else name.rsplit(maxsplit=1)[-1]
        if host != "mm":
            argv = [*argv, "--host", host]
        return super()._spawn(name, self.lab.exec_argv(host, argv), log)
