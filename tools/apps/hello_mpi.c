/*
 * Hello, MPI in C: the same checks and output as hello.py.
 *
 * Every rank takes part in an MPI_Allreduce that sums (rank + 1) over all ranks and in a ring
 * MPI_Sendrecv that passes each rank's number to its right neighbour. Rank 0 gathers one line per
 * rank (naming the storm node it ran on, or the host outside storm), prints them in rank order,
 * then "hello: OK" (exit code 0) or "hello: WRONG" (exit code 1).
 *
 * Build: mpicc -O1 -o hello_mpi hello_mpi.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define LINE_LEN 512

int main(int argc, char **argv)
{
    int rank, size, name_len;
    char name[MPI_MAX_PROCESSOR_NAME];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &name_len);
    const char *node = getenv("STORM_NODE"); /* the storm node manager that started this rank */

    /* 1. Allreduce: the sum of (rank + 1) over every rank. */
    int mine = rank + 1, total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int expected_total = size * (size + 1) / 2;

    /* 2. Ring: send my rank to the right, receive from the left. */
    int right = (rank + 1) % size, left = (rank - 1 + size) % size, from_left = -1;
    MPI_Sendrecv(&rank, 1, MPI_INT, right, 0, &from_left, 1, MPI_INT, left, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);

    char line[LINE_LEN];
    snprintf(line, sizeof line,
             "rank %d/%d on %s pid %ld: allreduce=%d (expected %d), from left=%d (expected %d)",
             rank, size, node ? node : name, (long) getpid(), total, expected_total, from_left, left);
    int ok = total == expected_total && from_left == left;

    /* Rank 0 gathers every rank's line and verdict and prints them in rank order. */
    char *lines = NULL;
    int *oks = NULL;
    if (rank == 0) {
        lines = malloc((size_t) size * LINE_LEN);
        oks = malloc((size_t) size * sizeof(int));
        if (lines == NULL || oks == NULL) {
            fprintf(stderr, "hello_mpi: out of memory\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Gather(line, LINE_LEN, MPI_CHAR, lines, LINE_LEN, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Gather(&ok, 1, MPI_INT, oks, 1, MPI_INT, 0, MPI_COMM_WORLD);

    int all_ok = 1;
    if (rank == 0) {
        for (int r = 0; r < size; r++) {
            printf("%s\n", lines + (size_t) r * LINE_LEN);
            all_ok = all_ok && oks[r];
        }
        printf("hello: %s\n", all_ok ? "OK" : "WRONG");
        fflush(stdout);
        free(lines);
        free(oks);
    }

    /* Every rank leaves with the same verdict, so the job's exit code tells it too. */
    MPI_Bcast(&all_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
