/*
 * Blocking point-to-point calls and waits. Each is counted (hook.h: storm_enter/storm_leave) and, where
 * hook.h allows it (storm_rewrite: not under MPI_THREAD_MULTIPLE), becomes its nonblocking form (MPI_Isend,
 * MPI_Irecv, MPI_Improbe, ...) followed by the hook's own test loop (storm_wait), which polls or
 * spin-blocks as storm-nm asks, and can switch to spin-block during the call: a blocking and a nonblocking
 * point-to-point operation match each other, so ranks may wait in different modes. Statuses, indices,
 * counts and error codes are the tests', which MPI defines like the blocking calls' (tests/programs/edges.c
 * checks each against MPICH's blocking call). Otherwise the call stays MPICH's and spin-blocks in its wait
 * loop (hook.c, sched_yield).
 */
#define _GNU_SOURCE
#include "hook.h"

/* One test of what the call waits for; *done once it has completed. */
static int test_once(struct storm_wait *w, int *done)
{
    int rc = SM_SUCCESS, flag;
    switch (w->kind) {
    case WAIT_ONE:
        return NB(test_fn, Test)(w->requests, done, w->status);
    case WAIT_ALL:
        rc = NB(testall_fn, Testall)(w->count, w->requests, done, w->status);
        if (rc == SM_SUCCESS && *done && w->status != SM_STATUSES_IGNORE)
            for (int i = 0; i < w->count; i++) /* as MPICH's MPI_Waitall does (its MPI_Testall does not) */
                ((SM_Status *) w->status)[i].MPI_ERROR = SM_SUCCESS;
        return rc;
    case WAIT_ANY:
        return NB(testany_fn, Testany)(w->count, w->requests, w->index, done, w->status);
    case WAIT_SOME: /* Waitsome returns once at least one completed, or none is active (MPI_UNDEFINED) */
        rc = NB(testsome_fn, Testsome)(w->count, w->requests, w->index, w->indices, w->status);
        *done = rc != SM_SUCCESS || *w->index != 0;
        return rc;
    case WAIT_PAIR: /* MPI_Sendrecv: the receive (with the call's status), then the send */
        if (w->requests[0] != SM_REQUEST_NULL)
            rc = NB(test_fn, Test)(&w->requests[0], &flag, w->status);
        if (rc == SM_SUCCESS && w->requests[1] != SM_REQUEST_NULL)
            rc = NB(test_fn, Test)(&w->requests[1], &flag, SM_STATUS_IGNORE);
        *done = w->requests[0] == SM_REQUEST_NULL && w->requests[1] == SM_REQUEST_NULL;
        return rc;
    case WAIT_PROBE:
        return NB(iprobe_fn, Iprobe)(w->source, w->tag, w->comm, done, w->status);
    default:
        return NB(improbe_fn, Improbe)(w->source, w->tag, w->comm, done, w->message, w->status);
    }
}

/* The blocking form of the wait, for when storm-nm switches the rank back to polling during the call. */
static int wait_blocking(struct storm_wait *w)
{
    int rc = SM_SUCCESS;
    switch (w->kind) {
    case WAIT_ONE:
        return NB(wait_fn, Wait)(w->requests, w->status);
    case WAIT_ALL:
        return NB(waitall_fn, Waitall)(w->count, w->requests, w->status);
    case WAIT_ANY:
        return NB(waitany_fn, Waitany)(w->count, w->requests, w->index, w->status);
    case WAIT_SOME:
        return NB(waitsome_fn, Waitsome)(w->count, w->requests, w->index, w->indices, w->status);
    case WAIT_PAIR:
        if (w->requests[0] != SM_REQUEST_NULL)
            rc = NB(wait_fn, Wait)(&w->requests[0], w->status);
        if (rc == SM_SUCCESS && w->requests[1] != SM_REQUEST_NULL)
            rc = NB(wait_fn, Wait)(&w->requests[1], SM_STATUS_IGNORE);
        return rc;
    case WAIT_PROBE:
        return NB(probe_fn, Probe)(w->source, w->tag, w->comm, w->status);
    default:
        return NB(mprobe_fn, Mprobe)(w->source, w->tag, w->comm, w->message, w->status);
    }
}

/*
 * The hook's test loop. Polling: test busily, and every POLL_CHECK tests (~10 us) look whether storm-nm has
 * switched the rank to spin-block, which then applies to the rest of the call. Spin-block: test busily for
 * spin_ns, then sleep in between; back to MPICH's own wait if storm-nm switches the rank to polling.
 */
#define POLL_CHECK 64u
int storm_wait(struct storm_call *c, struct storm_wait *w)
{
    for (unsigned turn = 1;; turn++) {
        int done = 0, rc = test_once(w, &done);
        if (rc != SM_SUCCESS || done)
            return rc;
        if (!c->spinblock) {
            if (turn % POLL_CHECK == 0)
                storm_turn_spinblock(c, storm_now());
            continue;
        }
        uint64_t now = storm_now();
        if (now - c->spin_from >= c->spin_ns && !storm_block(c, now))
            return wait_blocking(w);
    }
}

/* Complete the request that a nonblocking start (which returned rc) made, as the blocking call would. */
int storm_complete(struct storm_call *c, int rc, SM_Request *request, void *status)
{
    if (rc != SM_SUCCESS)
        return rc;
    struct storm_wait w = {.kind = WAIT_ONE, .count = 1, .requests = request, .status = status};
    return storm_wait(c, &w);
}

#define SEND(call, name, iname, count_t)                                                                     \
    WRAPPER(STORM_CALL_##call, name, SEND_PARAMS(count_t), SEND_ARGS, iname, SEND_PARAMS(count_t), SEND_ARGS, \
            SM_STATUS_IGNORE)
#define SEND_PARAMS(count_t)                                                                                 \
    (const void *buf, count_t count, hk_handle type, int dest, int tag, hk_handle comm)
#define SEND_ARGS (buf, count, type, dest, tag, comm)
SEND(Send, Send, Isend, int)
SEND(Send, Send_c, Isend_c, SM_Count)
SEND(Ssend, Ssend, Issend, int)
SEND(Ssend, Ssend_c, Issend_c, SM_Count)
SEND(Bsend, Bsend, Ibsend, int)
SEND(Bsend, Bsend_c, Ibsend_c, SM_Count)
SEND(Rsend, Rsend, Irsend, int)
SEND(Rsend, Rsend_c, Irsend_c, SM_Count)

#define RECV(name, iname, count_t)                                                                           \
    WRAPPER(STORM_CALL_Recv, name,                                                                           \
            (void *buf, count_t count, hk_handle type, int source, int tag, hk_handle comm, void *status),   \
            (buf, count, type, source, tag, comm, status), iname,                                            \
            (void *buf, count_t count, hk_handle type, int source, int tag, hk_handle comm),                 \
            (buf, count, type, source, tag, comm), status)
RECV(Recv, Irecv, int)
RECV(Recv_c, Irecv_c, SM_Count)

#define MRECV(name, iname, count_t)                                                                          \
    WRAPPER(STORM_CALL_Mrecv, name,                                                                          \
            (void *buf, count_t count, hk_handle type, SM_Message *message, void *status),                   \
            (buf, count, type, message, status), iname,                                                      \
            (void *buf, count_t count, hk_handle type, SM_Message *message), (buf, count, type, message),    \
            status)
MRECV(Mrecv, Imrecv, int)
MRECV(Mrecv_c, Imrecv_c, SM_Count)

/*
 * MPI_Sendrecv spin-blocks as MPI_Irecv + MPI_Isend, the way MPICH implements the blocking call: MPICH
 * 5.0.2's own MPI_Isendrecv reports a stale MPI_TAG (that of an earlier message) when receiving with
 * MPI_ANY_TAG.
 */
#define SENDRECV(name, irecv, isend, count_t)                                                                \
    int MPI_##name(const void *sendbuf, count_t sendcount, hk_handle sendtype, int dest, int sendtag,        \
                   void *recvbuf, count_t recvcount, hk_handle recvtype, int source, int recvtag,            \
                   hk_handle comm, void *status)                                                             \
    {                                                                                                        \
        struct storm_call c;                                                                                 \
        int rc;                                                                                              \
        storm_enter(&c, STORM_CALL_Sendrecv);                                                                \
        if (storm_rewrite(&c) && storm.fn[FN_##irecv] && storm.fn[FN_##isend] && storm.fn[FN_Cancel]) {     \
            SM_Request r[2] = {SM_REQUEST_NULL, SM_REQUEST_NULL};                                            \
            c.test_loop = 1;                                                                                 \
            rc = NB(irecv##_fn, irecv)(recvbuf, recvcount, recvtype, source, recvtag, comm, &r[0]);          \
            if (rc == SM_SUCCESS) {                                                                          \
                rc = NB(isend##_fn, isend)(sendbuf, sendcount, sendtype, dest, sendtag, comm, &r[1]);        \
                if (rc == SM_SUCCESS) {                                                                      \
                    struct storm_wait w = {.kind = WAIT_PAIR, .count = 2, .requests = r, .status = status};  \
                    rc = storm_wait(&c, &w);                                                                 \
                } else if (NB(cancel_fn, Cancel)(&r[0]) == SM_SUCCESS) /* no receive may stay posted */      \
                    NB(wait_fn, Wait)(&r[0], SM_STATUS_IGNORE);                                              \
            }                                                                                                \
        } else                                                                                               \
            rc = CALL_REAL(name, (sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, \
                                  source, recvtag, comm, status));                                           \
        storm_leave(&c);                                                                                     \
        return rc;                                                                                           \
    }
SENDRECV(Sendrecv, Irecv, Isend, int)
SENDRECV(Sendrecv_c, Irecv_c, Isend_c, SM_Count)

/*
 * MPI_Sendrecv_replace stays blocking and spin-blocks inside MPICH's wait loop (hook.c, sched_yield), which
 * yields at every turn in point-to-point waits: MPICH 5.0.2's MPI_Isendrecv_replace has the stale MPI_TAG
 * of MPI_Isendrecv, and leaves MPI_ERROR alone where the blocking call sets it.
 */
#define SENDRECV_REPLACE(name, count_t)                                                                      \
    int MPI_##name(void *buf, count_t count, hk_handle type, int dest, int sendtag, int source,              \
                   int recvtag, hk_handle comm, void *status)                                                \
    {                                                                                                        \
        struct storm_call c;                                                                                 \
        storm_enter(&c, STORM_CALL_Sendrecv_replace);                                                        \
        int rc = CALL_REAL(name, (buf, count, type, dest, sendtag, source, recvtag, comm, status));         \
        storm_leave(&c);                                                                                     \
        return rc;                                                                                           \
    }
SENDRECV_REPLACE(Sendrecv_replace, int)
SENDRECV_REPLACE(Sendrecv_replace_c, SM_Count)

/* The calls that wait in a test loop of their own kind rather than on one request they start. */
#define WAITING(call, nonblocking, wait_init, real_call)                                                     \
    struct storm_call c;                                                                                     \
    int rc;                                                                                                  \
    storm_enter(&c, STORM_CALL_##call);                                                                      \
    if (storm_rewrite(&c) && storm.fn[FN_##nonblocking]) {                                                   \
        struct storm_wait w = wait_init;                                                                     \
        c.test_loop = 1;                                                                                     \
        rc = storm_wait(&c, &w);                                                                             \
    } else                                                                                                   \
        rc = real_call;                                                                                      \
    storm_leave(&c);                                                                                         \
    return rc;

/* Designated initializers as one macro argument (the preprocessor would split them at their commas). */
#define INIT(...) {__VA_ARGS__}

int MPI_Probe(int source, int tag, hk_handle comm, void *status)
{
    WAITING(Probe, Iprobe, INIT(.kind = WAIT_PROBE, .source = source, .tag = tag, .comm = comm, .status = status),
            CALL_REAL(Probe, (source, tag, comm, status)))
}

int MPI_Mprobe(int source, int tag, hk_handle comm, SM_Message *message, void *status)
{
    WAITING(Mprobe, Improbe,
            INIT(.kind = WAIT_MPROBE, .source = source, .tag = tag, .comm = comm, .message = message,
                 .status = status),
            CALL_REAL(Mprobe, (source, tag, comm, message, status)))
}

int MPI_Wait(SM_Request *request, void *status)
{
    WAITING(Wait, Test, INIT(.kind = WAIT_ONE, .count = 1, .requests = request, .status = status),
            CALL_REAL(Wait, (request, status)))
}

int MPI_Waitall(int count, SM_Request *requests, void *statuses)
{
    WAITING(Waitall, Testall, INIT(.kind = WAIT_ALL, .count = count, .requests = requests, .status = statuses),
            CALL_REAL(Waitall, (count, requests, statuses)))
}

int MPI_Waitany(int count, SM_Request *requests, int *index, void *status)
{
    WAITING(Waitany, Testany,
            INIT(.kind = WAIT_ANY, .count = count, .requests = requests, .index = index, .status = status),
            CALL_REAL(Waitany, (count, requests, index, status)))
}

int MPI_Waitsome(int incount, SM_Request *requests, int *outcount, int *indices, void *statuses)
{
    WAITING(Waitsome, Testsome,
            INIT(.kind = WAIT_SOME, .count = incount, .requests = requests, .index = outcount,
                 .indices = indices, .status = statuses),
            CALL_REAL(Waitsome, (incount, requests, outcount, indices, statuses)))
}
