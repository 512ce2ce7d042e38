"""What mpi4py's blocking calls return, for mpihook's tests (the Python twin of edges.c).

``python edges_mpi4py.py PREFIX`` with 2 ranks writes PREFIX.RANK, one line per result: pickled messages
(MPI_Mprobe + MPI_Mrecv), buffer receives from any source (the large-count MPI_Recv_c), statuses, Waitany
and Waitsome with no active request, and collectives. Rank 0 sleeps before its part of each exchange so
that rank 1 waits past the spin phase. The test runs it polling and spin-blocking and compares.
"""

from __future__ import annotations

import sys
import time
from array import array

from mpi4py import MPI

DELAY = 0.003


class Edges:
    def __init__(self) -> None:
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.peer = 1 - self.rank
        self.lines: list[str] = []

    def late(self) -> None:
        """Rank 0 arrives late."""
        if self.rank == 0:
            time.sleep(DELAY)

    def show(self, what: str, status: MPI.Status) -> None:
        source, tag, count = status.Get_source(), status.Get_tag(), status.Get_count()
        self.lines.append(f"{what}: source={source} tag={tag} count={count}")

    def point_to_point(self) -> None:
        comm, rank, peer, out = self.comm, self.rank, self.peer, self.lines.append
        status = MPI.Status()
        self.late()
        if rank == 0:
            comm.send({"a": [1, 2, 3], "b": "x" * 100}, dest=1, tag=7)
        else:
            out(f"pickle recv: {comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)!r}")
            self.show("pickle recv", status)
        self.late()
        if rank == 0:
            comm.send(list(range(20000)), dest=1, tag=8)  # large enough for MPICH's rendezvous protocol
        else:
            big = comm.recv(source=0, tag=8, status=status)
            out(f"pickle recv big: {len(big)} {sum(big)}")
            self.show("pickle recv big", status)
        self.late()
        buf = array("i", [0] * 4)
        if rank == 0:
            comm.Send([array("i", [5, 6, 7]), MPI.INT], dest=1, tag=9)
        else:
            comm.Recv([buf, MPI.INT], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
            out(f"buffer recv: {list(buf)}")
            self.show("buffer recv", status)
        self.late()
        got = comm.sendrecv(f"from {rank}", dest=peer, source=MPI.ANY_SOURCE, status=status)
        out(f"pickle sendrecv: {got}")
        out(f"pickle sendrecv source: {status.Get_source()}")
        self.late()
        request = comm.irecv(source=peer, tag=11)
        comm.send(rank * 10, dest=peer, tag=11)
        out(f"irecv wait: {request.wait()}")

    def waits(self) -> None:
        comm, peer, out = self.comm, self.peer, self.lines.append
        out(f"waitany null: {MPI.Request.Waitany([MPI.REQUEST_NULL] * 3) == MPI.UNDEFINED}")
        out(f"waitsome null: {MPI.Request.Waitsome([MPI.REQUEST_NULL] * 2)}")
        self.late()
        requests = [comm.Irecv([array("i", [0]), MPI.INT], source=peer, tag=20 + i) for i in range(2)]
        for i in (1, 0):
            comm.Send([array("i", [i]), MPI.INT], dest=peer, tag=20 + i)
        statuses = [MPI.Status(), MPI.Status()]
        MPI.Request.Waitall(requests, statuses)
        out(f"waitall tags: {[s.Get_tag() for s in statuses]}")

    def collectives(self) -> None:
        comm, rank, out = self.comm, self.rank, self.lines.append
        self.late()
        comm.Barrier()
        self.late()
        out(f"allreduce: {comm.allreduce(rank + 1)}")
        self.late()
        total = array("d", [0.0, 0.0])
        comm.Allreduce([array("d", [rank, 2.0 * rank]), MPI.DOUBLE], [total, MPI.DOUBLE], op=MPI.SUM)
        out(f"Allreduce: {list(total)}")
        self.late()
        out(f"bcast: {comm.bcast({'root': rank} if rank == 0 else None, root=0)}")
        self.late()
        data = array("i", [rank * 100 + i for i in range(4)])
        comm.Bcast([data, MPI.INT], root=1)
        out(f"Bcast: {list(data)}")
        self.late()
        out(f"alltoall: {comm.alltoall([f'{rank}->{j}' for j in range(2)])}")
        self.late()
        received = array("i", [0] * 4)
        comm.Alltoall([array("i", [rank * 10 + i for i in range(4)]), MPI.INT], [received, MPI.INT])
        out(f"Alltoall: {list(received)}")
        self.late()
        out(f"gather: {comm.gather(rank, root=1)}")
        self.late()
        out(f"scatter: {comm.scatter(['a', 'b'] if rank == 0 else None, root=0)}")


def main(prefix: str) -> int:
    edges = Edges()
    edges.point_to_point()
    edges.waits()
    edges.collectives()
    with open(f"{prefix}.{edges.rank}", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in edges.lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
