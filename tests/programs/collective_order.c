/*
 * A blocking collective issued while a nonblocking one is outstanding, in a different order on different
 * ranks: rank 0 starts an MPI_Iallreduce and then enters MPI_Barrier, the others enter MPI_Barrier first.
 * MPICH matches blocking and nonblocking collectives separately, so each rank's Iallreduce still gets the
 * sum; an MPI_Barrier turned into an MPI_Ibarrier would match rank 0's Iallreduce instead (issue 12).
 * Prints, per rank, how many of its ROUNDS sums were wrong.
 */
#include <mpi.h>
#include <stdio.h>

#define ROUNDS 20

int main(int argc, char **argv)
{
    int rank, size, wrong = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < ROUNDS; i++) {
        int in = rank + i, out = -1;
        MPI_Request request;
        if (rank == 0) {
            MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &request);
            MPI_Barrier(MPI_COMM_WORLD);
        } else {
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &request);
        }
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        wrong += out != size * i + size * (size - 1) / 2;
    }
    printf("rank %d: %d of %d sums wrong\n", rank, wrong, ROUNDS);
    MPI_Finalize();
    return 0;
}
