"""Benchmark: how many submissions per second storm-mm accepts from one client connection.

``storm bench submit`` starts a throwaway local cluster (2 nodes x 1 PE) with the submission rate limit
raised out of the way ([mm] submit_rate and submit_burst), and sends a burst of one-rank ``true`` jobs
(10,000 by default) over ONE client connection, in two ways:

- ``pipelined``: a raw DEALER socket with the client's framing (one encoded request per message, each with
  its own ``req``) keeps up to ``--window`` requests in flight: the MM's client socket is a ROUTER, which
  takes any number of requests from one peer and answers each, so this is as fast as the protocol allows;
- ``sequential``: storm.tools.client.Client, one request at a time (what ``storm submit`` and scripts do).

Accepted submissions per second is the number of ``job_submitted`` replies over the time from the first
request sent to the last reply received; every reply is counted, a refusal by its code. The jobs then run
(one PE each): the cluster is torn down, leaves first, after each mode, without waiting for them.

It prints a table and writes every raw figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from storm.mm import protocol as p
from storm.tools.client import Client
from storm.tools.local_cluster import LocalCluster

MODES = ("pipelined", "sequential")
# Far above the burst: the limit is there to protect the MM from a runaway script, not what is measured.
RAISED_LIMITS = {"submit_rate": 1_000_000.0, "submit_burst": 1_000_000}


def request(req: int, cwd: str) -> bytes:
    """A one-rank ``true`` job, encoded as Client.submit sends it (a small environment: the MM's work is
    measured, not the size of the caller's)."""
    msg = p.SubmitJob(req=req, ranks=1, argv=("true",), cwd=cwd, env={"PATH": os.environ.get("PATH", "")})
    return p.encode(msg)


def pipelined(endpoint: str, count: int, window: int, cwd: str, timeout: float) -> dict[str, object]:
    """``count`` submissions over one DEALER, at most ``window`` unanswered at a time."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    bodies = [request(i + 1, cwd) for i in range(count)]  # encoded beforehand: the client's cost is not in it
    codes: dict[str, int] = {}
    sent = answered = 0
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    started = time.perf_counter()
    deadline = started + timeout
    try:
        while answered < count:
            while sent < count and sent - answered < window:
                sock.send(bodies[sent])
                sent += 1
            if time.perf_counter() > deadline:
                break
            if not poller.poll(100):
                continue
            while True:
                try:
                    reply = p.decode(sock.recv(zmq.NOBLOCK), p.MAX_NODE_MESSAGE)
                except zmq.Again:
                    break
                answered += 1
                code = reply.code if isinstance(reply, p.Error) else reply.op
                codes[code] = codes.get(code, 0) + 1
        elapsed = time.perf_counter() - started
    finally:
        sock.close()
    return {"sent": sent, "answered": answered, "replies": codes, "seconds": elapsed}


def sequential(endpoint: str, count: int, cwd: str, timeout: float) -> dict[str, object]:
    """``count`` submissions through Client, each waiting for its reply before the next is sent."""
    codes: dict[str, int] = {}
    sent = 0
    with Client(endpoint, timeout=30.0) as client:
        started = time.perf_counter()
        deadline = started + timeout
        for i in range(count):
            if time.perf_counter() > deadline:
                break
            sent += 1
            client._sock.send(request(i + 1, cwd))  # the bodies Client.submit would send, minus os.environ
            reply = client.receive()
            code = reply.code if isinstance(reply, p.Error) else reply.op
            codes[code] = codes.get(code, 0) + 1
        elapsed = time.perf_counter() - started
    return {"sent": sent, "answered": sent, "replies": codes, "seconds": elapsed}


def measure(mode: str, count: int, window: int, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="storm-bench-submit-") as tmp:
        cluster = LocalCluster(Path(tmp), nodes=2, pes_per_node=1, mm_settings=dict(RAISED_LIMITS))
        cluster.up()
        try:
            if mode == "pipelined":
                result = pipelined(cluster.endpoint, count, window, tmp, timeout)
            else:
                result = sequential(cluster.endpoint, count, tmp, timeout)
        finally:
            cluster.down()
        passes = mm_passes(Path(cluster.mm.log) if cluster.mm else None)
    accepted = int(result["replies"].get("job_submitted", 0))  # type: ignore[attr-defined]
    seconds = float(result["seconds"])  # type: ignore[arg-type]
    per_second = accepted / seconds
    return {
        "mode": mode,
        "count": count,
        "accepted": accepted,
        "per_second": per_second,
        "passes": passes,
        **result,
    }


def mm_passes(log: Path | None) -> int | None:
    """Scheduling passes the MM ran from start to stop, as it logs when it stops (None: not logged, as by a
    storm-mm from before passes were coalesced, which ran one per submission)."""
    try:
        lines = log.read_text(errors="replace").splitlines() if log else []
    except OSError:
        return None
    found = [line.rsplit("after ", 1)[1].split()[0] for line in lines if "scheduling passes" in line]
    return int(found[-1]) if found else None


def code_version() -> str:
    try:
        here = Path(__file__).resolve().parent
        git = ["git", "-C", str(here), "describe", "--always", "--dirty"]
        out = subprocess.run(git, capture_output=True, check=False)
        return out.stdout.decode().strip() or "unknown"
    except OSError:
        return "unknown"


def run(modes: list[str], count: int, window: int, timeout: float, output: Path) -> dict[str, object]:
    result: dict[str, object] = {
        "host": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0))},
        "code": code_version(),
        "count": count,
        "window": window,
        "limits": RAISED_LIMITS,
        "runs": [measure(mode, count, window, timeout) for mode in modes],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storm bench submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="submissions per mode")
    parser.add_argument("--window", type=int, default=1000, help="pipelined: requests in flight at most")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mode before giving up")
    parser.add_argument("--json", type=Path, default=Path("results/submit.json"))
    args = parser.parse_args(argv)
    modes = list(MODES) if args.mode == "both" else [args.mode]
    result = run(modes, args.count, args.window, args.timeout, args.json)
    print(f"code {result['code']}, {args.count} submissions of `true` (1 rank) into 2 nodes x 1 PE")
    print(
        f"{'mode':>11} {'sent':>6} {'accepted':>9} {'seconds':>8} {'accepted/s':>11} {'passes':>7}  replies"
    )
    for r in result["runs"]:  # type: ignore[attr-defined]
        print(
            f"{r['mode']:>11} {r['sent']:>6} {r['accepted']:>9} {r['seconds']:>8.2f} {r['per_second']:>11.0f}"
            f" {r['passes'] if r['passes'] is not None else '-':>7}  {r['replies']}"
        )
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
