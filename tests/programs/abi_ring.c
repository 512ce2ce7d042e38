/*
 * An MPI program of another ABI than MPICH's, for mpihook's test of a foreign MPI: built with
 * `mpicc -mpi-abi` it links libmpi_abi.so (the MPI-5 standard ABI), whose handles are pointers. It dups
 * MPI_COMM_WORLD and builds a datatype (real heap pointers, which an int-typed wrapper would truncate), then
 * uses them in blocking calls that mpihook wraps. Prints "abi: OK" from rank 0, or exits with 1.
 *
 * Built with -DAS_LIBRARY it is a shared library whose abi_main() a Python test loads with ctypes, that
 * is, with RTLD_LOCAL, as mpi4py loads its MPI.
 */
#include <mpi.h>
#include <stdio.h>

int abi_main(void)
{
    int rank, size, errors = 0;
    MPI_Comm comm;
    MPI_Datatype pair;
    MPI_Init(NULL, NULL);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Type_contiguous(2, MPI_INT, &pair);
    MPI_Type_commit(&pair);

    int mine[2] = {rank, 1}, total[2] = {0, 0}, left[2] = {-1, -1};
    MPI_Allreduce(mine, total, 2, MPI_INT, MPI_SUM, comm);
    errors += total[0] != size * (size - 1) / 2 || total[1] != size;
    MPI_Sendrecv(mine, 1, pair, (rank + 1) % size, 0, left, 1, pair, (rank + size - 1) % size, 0, comm,
                 MPI_STATUS_IGNORE);
    errors += left[0] != (rank + size - 1) % size;
    int root = rank == 0 ? 42 : 0;
    MPI_Bcast(&root, 1, MPI_INT, 0, comm);
    errors += root != 42;
    MPI_Request requests[2];
    MPI_Irecv(left, 1, pair, (rank + size - 1) % size, 1, comm, &requests[0]);
    MPI_Isend(mine, 1, pair, (rank + 1) % size, 1, comm, &requests[1]);
    MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
    errors += left[0] != (rank + size - 1) % size;
    MPI_Barrier(comm);
    int all_errors = 0;
    MPI_Reduce(&errors, &all_errors, 1, MPI_INT, MPI_SUM, 0, comm);
    if (rank == 0)
        printf("abi: %s\n", all_errors ? "WRONG" : "OK");
    MPI_Type_free(&pair);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return all_errors ? 1 : 0;
}

#ifndef AS_LIBRARY
int main(void)
{
    return abi_main();
}
#endif
