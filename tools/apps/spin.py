"""Burn CPU for a while and print nothing: the workload of time-limit, cancel and scheduling tests.

``python -m storm.tools.apps.spin [--seconds S] [--mpi]``

Without ``--seconds`` it runs until it is killed. The work is done in short loops so that the
program notices its deadline promptly. With ``--mpi`` it initializes MPI first (and finalizes it
when the time is up), so it can stand in for an MPI job that computes without communicating.
"""

from __future__ import annotations

import argparse
import sys
import time


def burn(seconds: float | None) -> int:
    """Spin until ``seconds`` have passed (forever if None); return the number of loops run."""
    deadline = None if seconds is None else time.monotonic() + seconds
    loops = 0
    while deadline is None or time.monotonic() < deadline:
        x = 0
        for i in range(20_000):  # roughly a millisecond of pure-Python work
            x += i * i
        loops += 1
    return loops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="how long to run (default: forever)")
    parser.add_argument("--mpi", action="store_true", help="initialize MPI before spinning")
    args = parser.parse_args(argv)
    if args.seconds is not None and args.seconds < 0:
        parser.error("--seconds must not be negative")
    if args.mpi:
        from mpi4py import MPI  # importing initializes MPI; it is finalized at exit

        MPI.COMM_WORLD.Barrier()
    burn(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
