"""`storm local`: a throwaway cluster on this host (tools/local_cluster.py), started, stopped or shown."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from storm.mm import protocol as p
from storm.tools.cli import UsageError
from storm.tools.client import default_local_dir


def local(args: argparse.Namespace) -> int:
    """`storm local up | down | status`."""
    from storm.tools.local_cluster import LocalCluster, LocalClusterError, status

    directory = Path(args.dir).absolute() if args.dir else default_local_dir()
    try:
        if args.action == "up":
            return local_up(args, directory)
        if args.action == "down":
            LocalCluster.load(directory).down()
            print(f"storm local cluster in {directory} stopped")
        else:
            print(status(directory))
    except LocalClusterError as exc:
        print(f"storm local: {exc}", file=sys.stderr)
        return 1
    return 0


def local_topology(args: argparse.Namespace) -> tuple[int, tuple[int, int, int] | None]:
    """--nodes and --topology: the node count and the torus, if any (a torus decides the count)."""
    from storm.mm.torus import parse_topology

    try:
        dims = parse_topology(args.topology or "flat")
    except ValueError as exc:
        raise UsageError(f"--topology: {exc}") from None
    if dims is None:
        nodes = (0 if args.emulate else 2) if args.nodes is None else args.nodes
    else:
        nodes = dims[0] * dims[1] * dims[2]
        if args.nodes is not None and args.nodes != nodes:
            raise UsageError(f"--topology {args.topology} has {nodes} nodes, not --nodes {args.nodes}")
    if nodes < 0 or args.emulate < 0 or nodes + args.emulate < 1:
        raise UsageError("--nodes and --emulate must not be negative, and one of them at least 1")
    return nodes, dims


def mm_settings(
    pairs: list[str], policy: str = "batch", base: dict[str, object] | None = None
) -> dict[str, object]:
    """``storm local up --set KEY=VALUE``: [mm] settings, each VALUE in TOML (a bare word is a string),
    checked as storm-mm will check them."""
    import tomllib

    from storm.mm.config import ConfigError, load

    settings: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {pair}: give KEY=VALUE, an [mm] setting (storm-mm --help lists them)")
        try:
            settings[key.strip()] = tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError:
            settings[key.strip()] = text
    try:
        load(None, {"cluster": {"policy": policy}, "mm": {**(base or {}), **settings}})
    except ConfigError as exc:
        raise UsageError(f"--set: {exc}") from None
    return settings


def local_up(args: argparse.Namespace, directory: Path) -> int:
    from storm.tools.local_cluster import LocalCluster

    nodes, dims = local_topology(args)
    pes = args.pes_per_node or (max(1, len(os.sched_getaffinity(0)) // nodes) if nodes else 1)
    policy = p.Policy(args.policy)
    mpl = args.mpl if args.mpl is not None else (1 if policy is p.Policy.BATCH or dims is not None else 2)
    if policy is p.Policy.BATCH and mpl != 1:
        raise UsageError("batch runs one job per PE: --mpl needs --policy gang")
    if mpl < 1 or args.slice_ms <= 0:
        raise UsageError("--mpl must be at least 1 and --slice-ms positive")
    settings: dict[str, object] = {"mpl": mpl, "slice": args.slice_ms / 1000}
    settings.update(mm_settings(args.set or [], policy, settings))
    if dims is not None and mpl != 1:
        raise UsageError("a torus runs one job per node: --mpl must be 1")
    cluster = LocalCluster(
        dir=directory, nodes=nodes, pes_per_node=pes, policy=policy, mm_settings=settings, topology=dims,
        emulated=args.emulate,
    )  # fmt: skip
    cluster.up()
    scheduling = {
        p.Policy.BATCH: "batch",
        p.Policy.SB: f"spin-block, MPL {mpl}",
    }.get(policy, f"{policy}, MPL {mpl}, {args.slice_ms:g} ms slices")
    shape = "" if dims is None else " on a {}x{}x{} torus (jobs get boxes of whole nodes)".format(*dims)
    emulated = f" and {args.emulate} emulated (emu0...)" if args.emulate else ""
    print(
        f"storm local cluster up: {nodes} node(s){emulated} x {pes} PE(s){shape}, {scheduling}, state in"
        f" {directory}"
    )
    if directory != default_local_dir():
        print(f"  point the CLI at it with: export STORM_LOCAL_DIR={directory}")
    if cluster.metrics_endpoint:
        print(f"  Prometheus metrics: http://{cluster.metrics_endpoint}/metrics")
    print("  try: storm run -n 2 -- python -m storm.tools.apps.hello")
    if args.detach:
        return 0
    print("  (Ctrl-C stops it)", flush=True)
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # taken by sigtimedwait below, not by a handler
    while cluster.running() and signal.sigtimedwait(stop_signals, 1.0) is None:
        pass
    cluster.down()
    print("storm local cluster stopped")
    return 0
