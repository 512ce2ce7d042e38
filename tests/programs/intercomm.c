/*
 * Intercommunicator MPI_Bcast and MPI_Gather as mpi4py's test_cco_buf_inter makes them: the world splits
 * into two groups joined by an intercommunicator; every rank of a group is the root in turn (MPI_ROOT),
 * the others of its group pass MPI_PROC_NULL and no buffer, counts going from 0 up. Run as its nonblocking
 * form (MPI_Ibcast), this hangs in MPICH 5.0.2 (issue 12). Prints, per rank, how many values were wrong.
 * Needs an even number of ranks, 2 to 16.
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int color = rank % 2;
    MPI_Comm local, inter;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &local);
    MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - color, 7, &inter);
    int lrank, lsize, rsize;
    MPI_Comm_rank(inter, &lrank);
    MPI_Comm_size(inter, &lsize);
    MPI_Comm_remote_size(inter, &rsize);
    int bad = 0, buf[16], all[256];
    for (int rep = 0; rep < 20; rep++) {
        for (int c = 0; c < 2; c++) {
            if (color == c) {
                for (int root = 0; root < lsize; root++) {
                    if (root == lrank) {
                        for (int i = 0; i < root + c; i++) buf[i] = root;
                        MPI_Bcast(buf, root + c, MPI_INT, MPI_ROOT, inter);
                        for (int i = 0; i < rsize * (root + c); i++) all[i] = -1;
                        MPI_Gather(NULL, 0, MPI_INT, all, root + c, MPI_INT, MPI_ROOT, inter);
                        for (int i = 0; i < rsize * (root + c); i++) bad += all[i] != root;
                    } else {
                        MPI_Bcast(NULL, 0, MPI_INT, MPI_PROC_NULL, inter);
                        MPI_Gather(NULL, 0, MPI_INT, NULL, 0, MPI_INT, MPI_PROC_NULL, inter);
                    }
                }
            } else {
                for (int root = 0; root < rsize; root++) {
                    for (int i = 0; i < root + c; i++) buf[i] = -1;
                    MPI_Bcast(buf, root + c, MPI_INT, root, inter);
                    for (int i = 0; i < root + c; i++) bad += buf[i] != root;
                    for (int i = 0; i < root + c; i++) buf[i] = root;
                    MPI_Gather(buf, root + c, MPI_INT, NULL, 0, MPI_INT, root, inter);
                }
            }
        }
    }
    printf("rank %d: %d wrong\n", rank, bad);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&local);
    MPI_Finalize();
    return 0;
}
