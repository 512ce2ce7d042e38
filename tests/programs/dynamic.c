/* Dynamic processes and names under a process manager: the end-to-end tests' MPI program
 * (tests/test_cluster_spawn.py), compiled with the environment's mpicc.
 *
 *   dynamic exchange N SECONDS [single|multiple] [fail]
 *       COMM_WORLD spawns N copies of itself (MPI_Comm_spawn, or MPI_Comm_spawn_multiple of two commands);
 *       parents and children check an MPI_Allreduce over the intercommunicator, each parent sends its rank
 *       to child (rank % N), which checks it; children then sleep SECONDS (in short steps) before the last
 *       barrier. With "fail", child 0 exits with code 4 without MPI_Finalize after the exchange.
 *   dynamic toomany N [PROGRAM]
 *       rank 0 spawns N processes (of PROGRAM, default itself) from COMM_SELF expecting a refusal: prints
 *       the error class and how long MPI_Comm_spawn took to fail; exits 0 if it failed.
 *   dynamic names SERVICE
 *       two ranks: 0 publishes SERVICE at an open port and accepts, 1 looks it up and connects, they
 *       exchange a number; 1's publishing of the same name fails; then a lookup of a name nobody
 *       published must fail at once with MPI_ERR_NAME.
 *   dynamic server SERVICE / dynamic client SERVICE
 *       the same across two jobs: the client looks the name up until it is published (30 s at most).
 *
 * Every line a check prints ends in OK or FAILED; a failed check exits with code 3.
 *
 * The names modes need the MPI standard ABI (mpicc_abi, MPI_MAX_PORT_NAME 1024): with MPICH's own ABI
 * (mpicc, 256) MPI_Open_port of this MPICH (ch4:ucx, whose addresses are longer) returns a truncated port,
 * under mpiexec as under storm. Spawning works with both.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(int ok, const char *what, int rank)
{
    printf("%s: %s (rank %d, pid %d)\n", what, ok ? "OK" : "FAILED", rank, (int) getpid());
    fflush(stdout);
    if (!ok)
        exit(3);
}

static void errors_return(void)
{
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
}

static int child(MPI_Comm parent, int argc, char **argv)
{
    int rank, size, psize, appnum = -1, flag = 0, *attr;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_remote_size(parent, &psize);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &attr, &flag);
    if (flag)
        appnum = *attr;
    const char *node = getenv("STORM_NODE");
    printf("child %d/%d pid %d appnum %d on %s argv[2] %s\n", rank, size, (int) getpid(), appnum,
           node ? node : "-", argc > 2 ? argv[2] : "-");
    fflush(stdout);
    int mine = rank + 1, theirs = 0;
    MPI_Allreduce(&mine, &theirs, 1, MPI_INT, MPI_SUM, parent);
    check(theirs == 10 * psize * (psize + 1) / 2, "child allreduce over the intercommunicator", rank);
    for (int from = 0; from < psize; from++) {
        if (from % size == rank) {
            int got = -1;
            MPI_Recv(&got, 1, MPI_INT, from, 7, parent, MPI_STATUS_IGNORE);
            check(got == from, "child receives its parent's rank", rank);
        }
    }
    if (argc > 4 && strcmp(argv[4], "fail") == 0 && rank == 0) {
        printf("child 0 fails on purpose\n");
        fflush(stdout);
        _exit(4);
    }
    double end = now() + atof(argc > 3 ? argv[3] : "0");
    while (now() < end)
        usleep(10000);
    MPI_Barrier(parent);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
}

static int exchange(const char *self, int n, const char *seconds, int multiple, const char *fail)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("parent %d/%d pid %d on %s\n", rank, size, (int) getpid(), getenv("STORM_NODE"));
    fflush(stdout);
    MPI_Comm inter;
    int errcodes[64];
    char *args[] = { "child", "", (char *) seconds, (char *) fail, NULL };
    if (!multiple) {
        args[1] = "single";
        MPI_Comm_spawn(self, args, n, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, errcodes);
    } else {
        char *first[] = { "child", "first", (char *) seconds, (char *) fail, NULL };
        char *second[] = { "child", "second", (char *) seconds, (char *) fail, NULL };
        char *commands[] = { (char *) self, (char *) self };
        char **argvs[] = { first, second };
        int counts[] = { n - n / 2, n / 2 };
        MPI_Info infos[] = { MPI_INFO_NULL, MPI_INFO_NULL };
        MPI_Comm_spawn_multiple(2, commands, argvs, counts, infos, 0, MPI_COMM_WORLD, &inter, errcodes);
    }
    int all_ok = 1;
    for (int i = 0; i < n; i++)
        all_ok = all_ok && errcodes[i] == MPI_SUCCESS;
    check(all_ok, "parent errcodes", rank);
    int remote;
    MPI_Comm_remote_size(inter, &remote);
    check(remote == n, "parent sees every child", rank);
    int mine = (rank + 1) * 10, theirs = 0;
    MPI_Allreduce(&mine, &theirs, 1, MPI_INT, MPI_SUM, inter);
    check(theirs == n * (n + 1) / 2, "parent allreduce over the intercommunicator", rank);
    MPI_Send(&rank, 1, MPI_INT, rank % n, 7, inter);
    MPI_Barrier(inter);
    MPI_Comm_disconnect(&inter);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("spawn: OK\n");
    MPI_Finalize();
    return 0;
}

static int toomany(const char *program, int n)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    errors_return();
    if (rank == 0) {
        char *args[] = { "child", "refused", "0", NULL };
        MPI_Comm inter;
        double start = now();
        int rc = MPI_Comm_spawn(program, args, n, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter,
                                MPI_ERRCODES_IGNORE);
        double took = now() - start;
        int cls = -1, len = 0;
        char text[MPI_MAX_ERROR_STRING] = "";
        if (rc != MPI_SUCCESS) {
            MPI_Error_class(rc, &cls);
            MPI_Error_string(rc, text, &len);
        }
        printf("spawn of %d refused after %.3f s with class %d (MPI_ERR_OTHER %d, MPI_ERR_SPAWN %d): %s\n",
               n, took, cls, MPI_ERR_OTHER, MPI_ERR_SPAWN, text);
        check(rc != MPI_SUCCESS, "the spawn failed", rank);
    }
    MPI_Finalize();
    return 0;
}

static void lookup_missing(const char *service, int rank)
{
    char port[MPI_MAX_PORT_NAME], missing[256];
    snprintf(missing, sizeof missing, "%s-nobody-%d", service, (int) getpid());
    double start = now();
    int rc = MPI_Lookup_name(missing, MPI_INFO_NULL, port);
    double took = now() - start;
    int cls = -1;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    printf("lookup of a missing name failed after %.3f s with class %d (MPI_ERR_NAME %d)\n", took, cls,
           MPI_ERR_NAME);
    check(rc != MPI_SUCCESS && cls == MPI_ERR_NAME && took < 5.0, "a missing name fails at once", rank);
}

static void serve(const char *service, MPI_Comm comm, int rank)
{
    char port[MPI_MAX_PORT_NAME];
    MPI_Open_port(MPI_INFO_NULL, port);
    check(MPI_Publish_name(service, MPI_INFO_NULL, port) == MPI_SUCCESS, "publish", rank);
    MPI_Barrier(comm);
    MPI_Comm inter;
    MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
    int got = 0, back;
    MPI_Recv(&got, 1, MPI_INT, 0, 1, inter, MPI_STATUS_IGNORE);
    back = got + 1;
    MPI_Send(&back, 1, MPI_INT, 0, 2, inter);
    MPI_Comm_disconnect(&inter);
    check(MPI_Unpublish_name(service, MPI_INFO_NULL, port) == MPI_SUCCESS, "unpublish", rank);
    MPI_Close_port(port);
}

static void connect_to(const char *service, MPI_Comm comm, int rank, double patience)
{
    char port[MPI_MAX_PORT_NAME];
    MPI_Barrier(comm);
    double deadline = now() + patience;
    int rc;
    while ((rc = MPI_Lookup_name(service, MPI_INFO_NULL, port)) != MPI_SUCCESS && now() < deadline)
        usleep(50000);
    check(rc == MPI_SUCCESS, "lookup", rank);
    if (comm == MPI_COMM_WORLD) {
        char mine[] = "tag#0$not-a-port$";
        check(MPI_Publish_name(service, MPI_INFO_NULL, mine) != MPI_SUCCESS, "a name taken is refused", rank);
    }
    MPI_Comm inter;
    check(MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter) == MPI_SUCCESS, "connect", rank);
    int send = 41, got = 0;
    MPI_Send(&send, 1, MPI_INT, 0, 1, inter);
    MPI_Recv(&got, 1, MPI_INT, 0, 2, inter, MPI_STATUS_IGNORE);
    check(got == 42, "connect, send and receive through a looked-up port", rank);
    MPI_Comm_disconnect(&inter);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL)
        return child(parent, argc, argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "exchange") == 0 && argc > 3)
        return exchange(argv[0], atoi(argv[2]), argv[3], argc > 4 && strcmp(argv[4], "multiple") == 0,
                        argc > 5 ? argv[5] : "ok");
    if (strcmp(mode, "toomany") == 0 && argc > 2)
        return toomany(argc > 3 ? argv[3] : argv[0], atoi(argv[2]));
    if (argc > 2 && (strcmp(mode, "names") == 0 || strcmp(mode, "server") == 0 || strcmp(mode, "client") == 0)) {
        errors_return();
        int world = strcmp(mode, "names") == 0;
        MPI_Comm comm = world ? MPI_COMM_WORLD : MPI_COMM_SELF;
        if (strcmp(mode, "server") == 0 || (world && rank == 0))
            serve(argv[2], comm, rank);
        else
            connect_to(argv[2], comm, rank, world ? 5.0 : 30.0);
        lookup_missing(argv[2], rank);
        MPI_Finalize();
        return 0;
    }
    fprintf(stderr, "usage: see the comment at the top of dynamic.c\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
}
