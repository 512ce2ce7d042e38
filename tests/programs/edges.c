/*
 * What blocking MPI calls return, for mpihook's tests: statuses, indices, counts, error classes and
 * collective results of every wrapped call, written line by line to PREFIX.RANK. Run with 2 ranks, once
 * with the hook polling and once spin-blocking: the two outputs must be identical (tests/test_mpihook.py).
 * Rank 0 sleeps a few milliseconds before its part of each exchange, so that rank 1 waits long enough to
 * pass the spin phase and block.
 *
 * Usage: edges PREFIX
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DELAY_US 3000
#define N 4

static FILE *out;
static int rank;

static void line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    fputc('\n', out);
    va_end(ap);
}

static void late(void) /* rank 0 arrives late */
{
    if (rank == 0)
        usleep(DELAY_US);
}

/* A status with sentinels where a call may leave fields alone. */
static MPI_Status fresh(void)
{
    MPI_Status s;
    memset(&s, 0, sizeof s);
    s.MPI_SOURCE = s.MPI_TAG = s.MPI_ERROR = -7;
    return s;
}

static void show(const char *what, const MPI_Status *s)
{
    int count = -1, cancelled = -1;
    MPI_Get_count(s, MPI_INT, &count);
    MPI_Test_cancelled(s, &cancelled);
    line("%s: source=%d tag=%d error=%d count=%d cancelled=%d", what, s->MPI_SOURCE, s->MPI_TAG, s->MPI_ERROR,
         count, cancelled);
}

static void point_to_point(void)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int v[N] = {0}, w[N] = {0};
    MPI_Status s = fresh();

    late(); /* MPI_Recv from any source with any tag fills the status */
    if (rank == 0)
        MPI_Send((int[]){42, 43}, 2, MPI_INT, 1, 5, comm);
    else {
        MPI_Recv(v, N, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &s);
        show("recv any", &s);
        line("recv any: %d %d", v[0], v[1]);
    }
    late();
    if (rank == 0)
        MPI_Send_c((int[]){7}, (MPI_Count) 1, MPI_INT, 1, 6, comm);
    else {
        MPI_Count count = -1;
        s = fresh();
        MPI_Recv_c(v, (MPI_Count) N, MPI_INT, 0, 6, comm, &s);
        MPI_Get_count_c(&s, MPI_INT, &count);
        show("recv_c", &s);
        line("recv_c: %d count_c=%lld", v[0], (long long) count);
    }
    late();
    if (rank == 0)
        MPI_Send((int[]){9}, 1, MPI_INT, 1, 7, comm);
    else {
        MPI_Recv(v, N, MPI_INT, 0, 7, comm, MPI_STATUS_IGNORE);
        line("recv ignore: %d", v[0]);
    }
    s = fresh();
    MPI_Recv(v, N, MPI_INT, MPI_PROC_NULL, 3, comm, &s);
    show("recv proc_null", &s);

    late(); /* Sendrecv and Sendrecv_replace, both ways */
    s = fresh();
    int peer = 1 - rank, mine = 100 + rank;
    MPI_Sendrecv(&mine, 1, MPI_INT, peer, 10 + rank, v, N, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &s);
    show("sendrecv", &s);
    line("sendrecv: %d", v[0]);
    late();
    s = fresh();
    v[0] = 200 + rank;
    MPI_Sendrecv_replace(v, 1, MPI_INT, peer, 20, peer, 20, comm, &s);
    show("sendrecv_replace", &s);
    line("sendrecv_replace: %d", v[0]);
    late();
    s = fresh();
    MPI_Sendrecv_c(&mine, (MPI_Count) 1, MPI_INT, peer, 11, v, (MPI_Count) N, MPI_INT, peer, 11, comm, &s);
    show("sendrecv_c", &s);
    line("sendrecv_c: %d", v[0]);

    /* Ssend waits for the matching receive: here rank 0 is late, so rank 1 waits in Ssend */
    if (rank == 1)
        MPI_Ssend((int[]){11}, 1, MPI_INT, 0, 30, comm);
    else {
        late();
        MPI_Recv(v, 1, MPI_INT, 1, 30, comm, MPI_STATUS_IGNORE);
        line("ssend: %d", v[0]);
    }

    static char buffer[1 << 16];
    MPI_Buffer_attach(buffer, sizeof buffer);
    late();
    if (rank == 0)
        MPI_Bsend((int[]){12}, 1, MPI_INT, 1, 31, comm);
    else {
        MPI_Recv(v, 1, MPI_INT, 0, 31, comm, MPI_STATUS_IGNORE);
        line("bsend: %d", v[0]);
    }
    void *detached;
    int detached_size;
    MPI_Buffer_detach(&detached, &detached_size);

    MPI_Request r = MPI_REQUEST_NULL; /* Rsend needs the receive posted first */
    if (rank == 1)
        MPI_Irecv(v, 1, MPI_INT, 0, 32, comm, &r);
    MPI_Barrier(comm);
    late();
    s = fresh();
    if (rank == 0)
        MPI_Rsend((int[]){13}, 1, MPI_INT, 1, 32, comm);
    else {
        MPI_Wait(&r, &s);
        show("rsend wait", &s);
        line("rsend: %d null=%d", v[0], r == MPI_REQUEST_NULL);
    }

    late(); /* Probe, Mprobe and Mrecv */
    if (rank == 0) {
        MPI_Send((int[]){1, 2, 3}, 3, MPI_INT, 1, 40, comm);
        MPI_Send((int[]){4, 5}, 2, MPI_INT, 1, 41, comm);
    } else {
        s = fresh();
        MPI_Probe(MPI_ANY_SOURCE, 40, comm, &s);
        show("probe", &s);
        MPI_Recv(v, N, MPI_INT, 0, 40, comm, MPI_STATUS_IGNORE);
        MPI_Message m = MPI_MESSAGE_NULL;
        s = fresh();
        MPI_Mprobe(0, MPI_ANY_TAG, comm, &m, &s);
        show("mprobe", &s);
        MPI_Status s2 = fresh();
        MPI_Mrecv(w, N, MPI_INT, &m, &s2);
        show("mrecv", &s2);
        line("mrecv: %d %d null=%d", w[0], w[1], m == MPI_MESSAGE_NULL);
    }
    MPI_Message m = MPI_MESSAGE_NULL;
    s = fresh();
    MPI_Mprobe(MPI_PROC_NULL, 0, comm, &m, &s);
    show("mprobe proc_null", &s);
    line("mprobe proc_null: no_proc=%d", m == MPI_MESSAGE_NO_PROC);
    s = fresh();
    MPI_Mrecv_c(v, (MPI_Count) N, MPI_INT, &m, &s);
    show("mrecv_c proc_null", &s);
}

static void waits(void)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Request r[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    MPI_Status s = fresh(), ss[3] = {fresh(), fresh(), fresh()};
    int index = -5, outcount = -5, indices[3] = {-5, -5, -5}, v[3] = {0};

    MPI_Wait(&r[0], &s);
    show("wait null", &s);
    s = fresh();
    MPI_Waitany(3, r, &index, &s);
    line("waitany null: index_undefined=%d", index == MPI_UNDEFINED);
    show("waitany null", &s);
    MPI_Waitsome(3, r, &outcount, indices, ss);
    line("waitsome null: outcount_undefined=%d", outcount == MPI_UNDEFINED);
    MPI_Waitall(3, r, ss);
    show("waitall null", &ss[1]);
    MPI_Waitall(0, r, MPI_STATUSES_IGNORE);

    /* rank 0 sends tag 2, later 1 and 3: Waitany completes the second request first */
    if (rank == 1)
        for (int i = 0; i < 3; i++)
            MPI_Irecv(&v[i], 1, MPI_INT, 0, i + 1, comm, &r[i]);
    MPI_Barrier(comm);
    if (rank == 0) {
        late();
        MPI_Send((int[]){22}, 1, MPI_INT, 1, 2, comm);
        late();
        MPI_Send((int[]){11}, 1, MPI_INT, 1, 1, comm);
        MPI_Send((int[]){33}, 1, MPI_INT, 1, 3, comm);
    } else {
        s = fresh();
        MPI_Waitany(3, r, &index, &s);
        line("waitany: index=%d value=%d", index, v[index]);
        show("waitany", &s);
        for (int i = 0; i < 3; i++)
            ss[i] = fresh();
        MPI_Waitall(3, r, ss);
        for (int i = 0; i < 3; i++)
            show("waitall", &ss[i]);
        line("waitall: %d %d %d", v[0], v[1], v[2]);
    }

    /* Waitsome: two of three arrive together, the third later */
    if (rank == 1)
        for (int i = 0; i < 3; i++)
            MPI_Irecv(&v[i], 1, MPI_INT, 0, 50 + i, comm, &r[i]);
    MPI_Barrier(comm);
    if (rank == 0) {
        late();
        MPI_Send((int[]){51}, 1, MPI_INT, 1, 51, comm);
        MPI_Send((int[]){50}, 1, MPI_INT, 1, 50, comm);
        MPI_Barrier(comm);
        MPI_Send((int[]){52}, 1, MPI_INT, 1, 52, comm);
    } else {
        int done = 0;
        usleep(2 * DELAY_US); /* both have arrived: one Waitsome gets both */
        for (int i = 0; i < 3; i++)
            ss[i] = fresh();
        MPI_Waitsome(3, r, &outcount, indices, ss);
        for (int i = 0; i < outcount; i++) {
            line("waitsome: index=%d value=%d", indices[i], v[indices[i]]);
            show("waitsome", &ss[i]);
        }
        done += outcount;
        MPI_Barrier(comm);
        while (done < 3) {
            MPI_Waitsome(3, r, &outcount, indices, MPI_STATUSES_IGNORE);
            for (int i = 0; i < outcount; i++)
                line("waitsome later: index=%d value=%d", indices[i], v[indices[i]]);
            done += outcount;
        }
    }

    /* Isend and Irecv both ways, completed by one Waitall */
    int mine = 60 + rank, theirs = -1;
    late();
    MPI_Irecv(&theirs, 1, MPI_INT, 1 - rank, 60, comm, &r[0]);
    MPI_Isend(&mine, 1, MPI_INT, 1 - rank, 60, comm, &r[1]);
    MPI_Waitall(2, r, ss);
    show("waitall isend irecv", &ss[0]);
    line("waitall isend irecv: %d", theirs);
}

static void errors(void)
{
    MPI_Comm comm;
    int v = 0, class = -1;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Status s = fresh();
    int rc = MPI_Recv(&v, 1, MPI_INT, 5, 0, comm, &s);
    MPI_Error_class(rc, &class);
    line("recv bad rank: rc_zero=%d class=%d", rc == MPI_SUCCESS, class);
    rc = MPI_Send(&v, 1, MPI_INT, 5, 0, comm);
    MPI_Error_class(rc, &class);
    line("send bad rank: rc_zero=%d class=%d", rc == MPI_SUCCESS, class);
    rc = MPI_Probe(5, 0, comm, &s);
    MPI_Error_class(rc, &class);
    line("probe bad rank: rc_zero=%d class=%d", rc == MPI_SUCCESS, class);
    MPI_Comm_free(&comm);
}

static void collectives(void)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int size = 2, a[N], b[N], counts[2] = {2, 2}, displs[2] = {0, 2};
    for (int i = 0; i < N; i++)
        a[i] = 10 * rank + i, b[i] = -1;
    late();
    MPI_Barrier(comm);
    line("barrier");
    late();
    MPI_Allreduce(a, b, N, MPI_INT, MPI_SUM, comm);
    line("allreduce: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    MPI_Allreduce_c(a, b, (MPI_Count) N, MPI_INT, MPI_MAX, comm);
    line("allreduce_c: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memcpy(b, a, sizeof b);
    MPI_Bcast(b, N, MPI_INT, 0, comm);
    line("bcast: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memcpy(b, a, sizeof b);
    MPI_Bcast_c(b, (MPI_Count) N, MPI_INT, 1, comm);
    line("bcast_c: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    MPI_Alltoall(a, N / size, MPI_INT, b, N / size, MPI_INT, comm);
    line("alltoall: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    MPI_Alltoallv(a, counts, displs, MPI_INT, b, counts, displs, MPI_INT, comm);
    line("alltoallv: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    int bytes[2] = {0, 2 * (int) sizeof(int)};
    MPI_Datatype types[2] = {MPI_INT, MPI_INT};
    MPI_Alltoallw(a, counts, bytes, types, b, counts, bytes, types, comm);
    line("alltoallw: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memset(b, -1, sizeof b);
    MPI_Reduce(a, b, N, MPI_INT, MPI_SUM, 1, comm);
    line("reduce: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memset(b, -1, sizeof b);
    MPI_Gather(a, 2, MPI_INT, b, 2, MPI_INT, 1, comm);
    line("gather: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memset(b, -1, sizeof b);
    MPI_Gatherv(a, 2, MPI_INT, b, counts, displs, MPI_INT, 1, comm);
    line("gatherv: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memset(b, -1, sizeof b);
    MPI_Scatter(a, 2, MPI_INT, b, 2, MPI_INT, 1, comm);
    line("scatter: %d %d", b[0], b[1]);
    late();
    MPI_Scatterv(a, counts, displs, MPI_INT, b, 2, MPI_INT, 1, comm);
    line("scatterv: %d %d", b[0], b[1]);
    late();
    MPI_Allgather(a, 2, MPI_INT, b, 2, MPI_INT, comm);
    line("allgather: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    MPI_Allgatherv(a, 2, MPI_INT, b, counts, displs, MPI_INT, comm);
    line("allgatherv: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memset(b, -1, sizeof b);
    MPI_Reduce_scatter(a, b, counts, MPI_INT, MPI_SUM, comm);
    line("reduce_scatter: %d %d", b[0], b[1]);
    late();
    MPI_Reduce_scatter_block(a, b, 2, MPI_INT, MPI_SUM, comm);
    line("reduce_scatter_block: %d %d", b[0], b[1]);
    late();
    MPI_Scan(a, b, N, MPI_INT, MPI_SUM, comm);
    line("scan: %d %d %d %d", b[0], b[1], b[2], b[3]);
    late();
    memset(b, -1, sizeof b);
    MPI_Exscan(a, b, N, MPI_INT, MPI_SUM, comm);
    if (rank == 1)
        line("exscan: %d %d %d %d", b[0], b[1], b[2], b[3]);
}

int main(int argc, char **argv)
{
    char name[4096];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc != 2 || snprintf(name, sizeof name, "%s.%d", argv[1], rank) >= (int) sizeof name ||
        !(out = fopen(name, "w"))) {
        fprintf(stderr, "usage: edges PREFIX (with 2 ranks)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    point_to_point();
    waits();
    errors();
    collectives();
    fclose(out);
    MPI_Finalize();
    return 0;
}
