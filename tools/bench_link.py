"""Benchmark: a message's round trip between two processes over the NM's link to its job shells
(nm/shell_link.py, a Unix stream socket) and over what it replaced (a ZeroMQ ROUTER and DEALER on ipc://,
served by nm/link.py), idle and while processes load the CPUs.

``storm bench link`` runs, for each transport and each load (``--loads``, default 0 2 4 processes that
each spin 2 ms and sleep 2 ms), a responder process that answers every message with itself and a client in
this process that sends ``--messages`` messages of ``--size`` bytes one at a time, each after the answer
to the one before and a pause of 0.5 ms. Both ends run the production code on an asyncio loop: the
shell link's ShellListener and NmLink, or nm/link.py's Link on pyzmq sockets. The transports alternate
under each load, in the same run.

It prints the median, 90th and 99th percentile of the round trip per transport and load, with the ratio
ZeroMQ / Unix socket, and writes every figure as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from storm.nm.link import Frames, Link
from storm.nm.shell_link import NmLink, ShellListener, Who

TRANSPORTS = ("unix", "zmq")
PAUSE = 0.0005  # seconds between an answer and the next message
LIMIT = 1 << 20
READY_TIMEOUT = 10.0
HOG = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.002:\n        pass\n    time.sleep(0.002)\n"  # noqa: E501


# ------------------------------------------------------------------------------------------- responders


async def serve_unix(path: Path) -> None:
    """The NM's end: answer each message on the connection it came on, until the client closes."""
    done = asyncio.Event()
    listener: ShellListener

    def answer(identity: bytes, message: bytes, who: Who) -> None:
        if message == b"bye":
            done.set()
        else:
            listener.send(identity, message)

    listener = ShellListener(path, LIMIT, answer)
    listener.start()
    print("ready", flush=True)
    await done.wait()
    listener.stop()


async def serve_zmq(endpoint: str) -> None:
    done = asyncio.Event()
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    link: Link

    def answer(frames: Frames) -> None:
        if frames[1].bytes == b"bye":
            done.set()
        else:
            link.send([frames[0].bytes, frames[1].bytes])

    link = Link(router, answer)
    link.start()
    print("ready", flush=True)
    await done.wait()
    link.stop()
    router.close()
    ctx.term()


# ------------------------------------------------------------------------------------------- clients


async def round_trips_unix(path: Path, messages: int, size: int) -> list[float]:
    replies: asyncio.Queue[bytes] = asyncio.Queue()
    link = NmLink(str(path), LIMIT, replies.put_nowait, lambda n: None, lambda: None)
    link.start()
    try:
        return await _time(link.send, replies, messages, size)
    finally:
        link.send(b"bye")
        await link.drained(READY_TIMEOUT)
        link.stop()


async def round_trips_zmq(endpoint: str, messages: int, size: int) -> list[float]:
    replies: asyncio.Queue[bytes] = asyncio.Queue()
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 1000)
    dealer.connect(endpoint)
    link = Link(dealer, lambda frames: replies.put_nowait(frames[0].bytes))
    link.start()
    try:
        return await _time(lambda m: link.send([m]), replies, messages, size)
    finally:
        link.send([b"bye"])
        await link.drained(READY_TIMEOUT)
        link.stop()
        dealer.close()
        ctx.term()


async def _time(send: Any, replies: asyncio.Queue[bytes], messages: int, size: int) -> list[float]:
    payload = os.urandom(size)
    times: list[float] = []
    for i in range(messages + 10):  # the first ten warm up
        started = time.perf_counter()
        send(payload)
        reply = await asyncio.wait_for(replies.get(), READY_TIMEOUT)
        if i >= 10:
            times.append(time.perf_counter() - started)
        if reply != payload:
            raise RuntimeError("the responder answered something else")
        await asyncio.sleep(PAUSE)
    return times


# ------------------------------------------------------------------------------------------- runs


@contextlib.contextmanager
def load(processes: int) -> Iterator[None]:
    """``processes`` processes that each spin 2 ms and sleep 2 ms, stopped (by pid) on leaving."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def measure(transport: str, directory: Path, messages: int, size: int) -> list[float]:
    """One transport's round trips, with a responder process of its own."""
    path = directory / f"{transport}.sock"
    where = str(path) if transport == "unix" else f"ipc://{path}"
    responder = subprocess.Popen(
        [sys.executable, "-m", "storm.tools.bench_link", "--serve", transport, where],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert responder.stdout is not None
        if responder.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {transport} responder did not start")
        if transport == "unix":
            return asyncio.run(round_trips_unix(path, messages, size))
        return asyncio.run(round_trips_zmq(where, messages, size))
    finally:
        try:
            responder.wait(timeout=READY_TIMEOUT)
        except subprocess.TimeoutExpired:
            responder.kill()
            responder.wait()
        if responder.stdout is not None:
            responder.stdout.close()


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)

    def at(q: float) -> float:
        return 1e6 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"median_us": 1e6 * statistics.median(ordered), "p90_us": at(0.9), "p99_us": at(0.99)}


def run(loads: list[int], messages: int, size: int) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="storm-bench-link-") as tmp:
        for processes in loads:
            with load(processes):
                for transport in TRANSPORTS:
                    figures = summary(measure(transport, Path(tmp), messages, size))
                    results.append({"load": processes, "transport": transport, **figures})
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "parameters": {"loads": loads, "messages": messages, "size": size, "pause_s": PAUSE},
        "results": results,
    }


def table(result: dict[str, Any]) -> str:
    rows = ["| load (processes) | transport | median | p90 | p99 |", "| --- | --- | --- | --- | --- |"]
    by = {(r["load"], r["transport"]): r for r in result["results"]}
    for processes in result["parameters"]["loads"]:
        for transport in TRANSPORTS:
            r = by[(processes, transport)]
            rows.append(
                f"| {processes} | {transport} | {r['median_us']:.0f} us | {r['p90_us']:.0f} us "
                f"| {r['p99_us']:.0f} us |"
            )
        unix, zmq_ = by[(processes, "unix")], by[(processes, "zmq")]
        rows.append(
            f"| {processes} | zmq / unix | {zmq_['median_us'] / unix['median_us']:.1f}x "
            f"| {zmq_['p90_us'] / unix['p90_us']:.1f}x | {zmq_['p99_us'] / unix['p99_us']:.1f}x |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench link", description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 2, 4], help="CPU-loading processes")
    parser.add_argument("--messages", type=int, default=2000, help="round trips per transport and load")
    parser.add_argument("--size", type=int, default=200, help="bytes per message")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--serve", nargs=2, metavar=("TRANSPORT", "WHERE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        transport, where = args.serve
        asyncio.run(serve_unix(Path(where)) if transport == "unix" else serve_zmq(where))
        return 0
    if min(args.loads) < 0 or args.messages < 1 or args.size < 1:
        parser.error("--loads must not be negative, --messages and --size at least 1")
    result = run(args.loads, args.messages, args.size)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
