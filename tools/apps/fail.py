"""An MPI program in which one rank dies before MPI_Finalize: the workload of failure tests.

``python -m storm.tools.apps.fail --rank R --code C [--after SECONDS]``

Every rank initializes MPI and passes a barrier. Then rank R waits ``--after`` seconds (default 0)
and exits with code C at once, through ``os._exit``: no MPI_Finalize, no PMI finalize, no atexit
handlers. The other ranks block forever in a receive that no one will match, spinning in MPI's
progress loop as real peers of a dead rank do. The resource manager has to notice the early exit,
kill the spinning peers and report code C.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from mpi4py import MPI

NEVER_SENT_TAG = 4242


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rank", type=int, required=True, help="the rank that exits early")
    parser.add_argument("--code", type=int, required=True, help="its exit code (0-255)")
    parser.add_argument("--after", type=float, default=0.0, help="seconds to wait before exiting")
    args = parser.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if not 0 <= args.rank < size:
        parser.error(f"--rank must be between 0 and {size - 1}")
    if not 0 <= args.code <= 255:
        parser.error("--code must be between 0 and 255")

    comm.Barrier()
    if rank == args.rank:
        time.sleep(args.after)
        print(f"fail: rank {rank}/{size} exits with code {args.code} before MPI_Finalize", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(args.code)

    # Nobody ever sends this message: block (and spin in the MPI progress engine) until killed.
    comm.recv(source=args.rank, tag=NEVER_SENT_TAG)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
