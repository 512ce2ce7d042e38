/* Two threads in MPI at once (MPI_THREAD_MULTIPLE), as mpi4py's nxtval-threads demo: rank 0 runs a counter
 * server thread (MPI_Recv from any source, MPI_Ssend back) while every rank's main thread takes numbers from
 * it; every number must be handed out exactly once. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define TAKES 200
static MPI_Comm comm;

static void *server(void *arg)
{
    (void) arg;
    int next = 0, incr;
    MPI_Status status;
    for (;;) {
        MPI_Recv(&incr, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &status);
        if (status.MPI_TAG == 1)
            return NULL;
        MPI_Ssend(&next, 1, MPI_INT, status.MPI_SOURCE, 0, comm);
        next += incr;
    }
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "threads: MPI_THREAD_MULTIPLE not provided\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    pthread_t thread;
    if (rank == 0)
        pthread_create(&thread, NULL, server, NULL);
    int *mine = malloc(TAKES * sizeof *mine), one = 1;
    for (int i = 0; i < TAKES; i++) {
        MPI_Ssend(&one, 1, MPI_INT, 0, 0, comm);
        MPI_Recv(&mine[i], 1, MPI_INT, 0, 0, comm, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(comm);
    if (rank == 0) {
        MPI_Ssend(&one, 1, MPI_INT, 0, 1, comm);
        pthread_join(thread, NULL);
    }
    int *all = rank == 0 ? calloc((size_t) size * TAKES, sizeof *all) : NULL;
    MPI_Gather(mine, TAKES, MPI_INT, all, TAKES, MPI_INT, 0, comm);
    if (rank == 0) {
        char *seen = calloc((size_t) size * TAKES, 1);
        int bad = 0;
        for (int i = 0; i < size * TAKES; i++) {
            if (all[i] < 0 || all[i] >= size * TAKES || seen[all[i]]++)
                bad++;
        }
        printf("threads: %d of %d numbers handed out wrongly\n", bad, size * TAKES);
    }
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
