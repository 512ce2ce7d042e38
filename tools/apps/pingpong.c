/*
 * Round trips between two ranks, timed by rank 0: a small message there and back (MPI_Send, MPI_Recv), an
 * MPI_Allreduce, an MPI_Bcast from rank 0, or an MPI_Barrier followed by that MPI_Bcast. mpihook's tests and
 * benchmark (tools/bench_hook.py) run it to compare wait modes within one run, switching them while it
 * runs, and to make a rank wait while the other is stopped. --threads 1 initializes MPI with
 * MPI_THREAD_MULTIPLE (the hook then leaves every call blocking).
 *
 *   pingpong [--seconds S] [--bytes N] [--op sendrecv|allreduce|bcast|barrier] [--window MS] [--threads 0|1]
 *
 * Rank 0 prints one line per window of MS milliseconds (default 10) of round trips:
 *   window START_NS END_NS COUNT MEDIAN_NS MIN_NS
 * with CLOCK_MONOTONIC times (those of time.monotonic_ns() in any other process), then
 *   pingpong: OK round_trips=N
 * Rank 0 decides when to stop (after S seconds, default 2, or at a SIGUSR1) and the decision travels in its
 * message (or in the allreduce), so both ranks make the same number of calls and end cleanly. Exactly 2
 * ranks; bad options exit with code 2.
 *
 * Build: mpicc -O2 -o pingpong pingpong.c
 */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop_now;

static void on_usr1(int sig)
{
    (void) sig;
    stop_now = 1;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

static int compare(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
    return (x > y) - (x < y);
}

static void usage(const char *what)
{
    fprintf(stderr, "pingpong: %s\nusage: pingpong [--seconds S] [--bytes N] "
                    "[--op sendrecv|allreduce|bcast|barrier] [--window MS] [--threads 0|1]\n", what);
    exit(2);
}

struct window {
    uint64_t start, *samples;
    size_t count, capacity;
};

static void flush(struct window *w, uint64_t end)
{
    if (w->count) {
        qsort(w->samples, w->count, sizeof *w->samples, compare);
        printf("window %llu %llu %zu %llu %llu\n", (unsigned long long) w->start, (unsigned long long) end,
               w->count, (unsigned long long) w->samples[w->count / 2], (unsigned long long) w->samples[0]);
    }
    w->start = end;
    w->count = 0;
}

static void note(struct window *w, uint64_t sample)
{
    if (w->count == w->capacity) {
        w->capacity = w->capacity ? 2 * w->capacity : 4096;
        if (!(w->samples = realloc(w->samples, w->capacity * sizeof *w->samples))) {
            fprintf(stderr, "pingpong: out of memory\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    w->samples[w->count++] = sample;
}

int main(int argc, char **argv)
{
    double seconds = 2.0, window_ms = 10.0;
    long bytes = 8;
    enum { SENDRECV, ALLREDUCE, BCAST, BARRIER } op = SENDRECV;
    static const char *const ops[] = {"sendrecv", "allreduce", "bcast", "barrier"};
    int threads = 0, found;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage("every option takes a value");
        const char *opt = argv[i], *value = argv[++i];
        char *end;
        if (!strcmp(opt, "--seconds") && (seconds = strtod(value, &end)) > 0 && !*end)
            continue;
        if (!strcmp(opt, "--window") && (window_ms = strtod(value, &end)) > 0 && !*end)
            continue;
        if (!strcmp(opt, "--bytes") && (bytes = strtol(value, &end, 10)) >= 1 && bytes < (1L << 30) && !*end)
            continue;
        if (!strcmp(opt, "--threads") && (!strcmp(value, "0") || !strcmp(value, "1"))) {
            threads = value[0] == '1';
            continue;
        }
        found = 0;
        for (int k = 0; k < (int) (sizeof ops / sizeof *ops); k++)
            if (!strcmp(opt, "--op") && !strcmp(value, ops[k]))
                op = k, found = 1;
        if (found)
            continue;
        usage("bad option or value");
    }
    int rank, size, provided;
    MPI_Init_thread(&argc, &argv, threads ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    signal(SIGUSR1, on_usr1);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "pingpong: needs exactly 2 ranks, not %d\n", size);
        MPI_Finalize();
        return 2;
    }
    unsigned char *buf = calloc(1, (size_t) bytes);
    struct window w = {0};
    long trips = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    uint64_t start = now_ns(), window_ns = (uint64_t) (window_ms * 1e6);
    w.start = start;
    for (int stop = 0; !stop; trips++) {
        uint64_t t0 = now_ns();
        if (rank == 0)
            stop = stop_now || t0 - start >= (uint64_t) (seconds * 1e9);
        if (op == ALLREDUCE) {
            int mine = stop;
            MPI_Allreduce(&mine, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        } else if (op == BCAST || op == BARRIER) {
            if (op == BARRIER)
                MPI_Barrier(MPI_COMM_WORLD);
            MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
        } else if (rank == 0) {
            buf[0] = (unsigned char) stop;
            MPI_Send(buf, (int) bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, (int) bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int) bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            stop = buf[0];
            MPI_Send(buf, (int) bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        if (rank == 0) {
            uint64_t t1 = now_ns();
            note(&w, t1 - t0);
            if (t1 - w.start >= window_ns)
                flush(&w, t1);
        }
    }
    if (rank == 0) {
        flush(&w, now_ns());
        printf("pingpong: OK round_trips=%ld\n", trips);
        fflush(stdout);
    }
    free(w.samples);
    free(buf);
    MPI_Finalize();
    return 0;
}
