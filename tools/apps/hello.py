"""Hello, MPI: the first program to run on a storm cluster.

Every rank takes part in two small exchanges and rank 0 reports what each rank saw:

* an Allreduce that sums ``rank + 1`` over all ranks (expected ``n * (n + 1) / 2``), and
* a ring: each rank sends its rank number to its right neighbour and receives from its left one.

Run it as ``storm run -n 2 -- python -m storm.tools.apps.hello`` (or by path), which shows its output on the
terminal (``storm submit`` puts it in the job's file, ``storm-<id>.out``). Rank 0 prints one line per rank,
in rank order, naming the storm node it ran on (``$STORM_NODE``, or the host name outside storm), then
``hello: OK``; if anything is wrong it prints ``hello: WRONG`` and the job exits with code 1.
"""

from __future__ import annotations

import os
import sys

from mpi4py import MPI


def main() -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    size = comm.Get_size()

    # 1. Allreduce: the sum of (rank + 1) over every rank.
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    expected_total = size * (size + 1) // 2

    # 2. Ring: send my rank to the right, receive from the left.
    right = (rank + 1) % size
    left = (rank - 1) % size
    from_left = comm.sendrecv(rank, dest=right, source=left)

    node = os.environ.get("STORM_NODE") or MPI.Get_processor_name()
    line = (
        f"rank {rank}/{size} on {node} pid {os.getpid()}: "
        f"allreduce={total} (expected {expected_total}), from left={from_left} (expected {left})"
    )
    ok = total == expected_total and from_left == left

    # Rank 0 gathers every rank's line and verdict and prints them in rank order.
    reports = comm.gather((line, ok), root=0)
    all_ok = True
    if rank == 0:
        assert reports is not None
        for report_line, _ in reports:
            print(report_line)
        all_ok = all(report_ok for _, report_ok in reports)
        print("hello: OK" if all_ok else "hello: WRONG", flush=True)

    # Every rank leaves with the same verdict, so the job's exit code tells it too.
    all_ok = comm.bcast(all_ok, root=0)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
