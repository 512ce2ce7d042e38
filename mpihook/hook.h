/*
 * mpihook's private header: the state shared by hook.c (set-up, statistics, spin-block) and the wrappers
 * (p2p.c, coll.c). The hook is a PMPI library: it defines MPI_X for every blocking communication call and
 * calls the real PMPI_X, found at run time (hook.c). See record.h for what it publishes.
 *
 * What a wrapper may change, and what never (issue 12: a monitor that changes what a program computes, or
 * hangs it, is worse than none):
 *   - A blocking point-to-point call or wait may become its nonblocking form and the hook's test loop: MPI
 *     matches blocking and nonblocking point-to-point operations with each other, whatever the communicator
 *     (intra, inter, topologies, MPI_COMM_SELF) or the peer (MPI_PROC_NULL), so nothing else can tell.
 *     Only in the thread that called MPI_Init(_thread) at a level below MPI_THREAD_MULTIPLE, though: with
 *     several threads in MPI at once, tight test loops compete with other threads' progress for MPICH's
 *     lock (a two-thread program hung that way).
 *   - A blocking collective stays the program's own blocking call, always. MPI never matches a blocking
 *     collective with a nonblocking one, and orders a communicator's nonblocking collectives among
 *     themselves: turning MPI_Barrier into MPI_Ibarrier made a Barrier issued while an MPI_Iallreduce was
 *     outstanding match that Iallreduce instead (20 wrong results in 20), and walked into MPICH bugs that
 *     the blocking path avoids (an intercommunicator MPI_Ibcast with MPI_PROC_NULL hangs in MPICH itself).
 * Where the call stays MPICH's, the hook spin-blocks inside MPICH's own wait loop, which yields the CPU at
 * every turn (hook.c, sched_yield); for collectives that needs MPICH's shared-memory collective algorithms
 * off, which never yield (the job shell sets that where a node may ask for spin-block; record.h's
 * STORM_HOOK_COLLECTIVES_POLL says when it is not so).
 *
 * Threads: nesting depth is per thread; with MPI_THREAD_MULTIPLE the calls of one thread at a time are
 * counted (the record has one writer), and every thread's waits follow the wait mode.
 */
#ifndef STORM_HOOK_H
#define STORM_HOOK_H

#include <stdint.h>
#include <time.h>

#include "mpich_abi.h"
#include "record.h"

/*
 * Handles as the wrappers receive them. In the MPICH ABI a handle is an int, but the same wrappers must also
 * pass the calls of another MPI (Open MPI, the MPI-5 standard ABI: pointer handles) through unchanged, since
 * an LD_PRELOAD library cannot know in advance which one the program uses. On x86-64 (System V ABI) every
 * integer or pointer argument travels in its own 64-bit register or 8-byte stack slot, whatever its C type:
 * reading a handle parameter as a 64-bit integer therefore gets the whole pointer of a pointer-handle ABI,
 * and forwarding it to a function declared the same way hands the callee exactly the bits the caller passed.
 * An MPICH callee reads only the low 32 bits, as it would have from the program. Only the MPICH path ever
 * looks at a handle's value (after narrowing it to int).
 */
typedef intptr_t hk_handle;

/* The real functions the hook calls, resolved once (hook.c): "PMPI_" + name. */
#define STORM_REAL_FUNCTIONS(X)                                                                              \
    X(Init) X(Init_thread) X(Finalize) X(Query_thread) X(Comm_rank) X(Cancel)                                \
    X(Send) X(Send_c) X(Ssend) X(Ssend_c) X(Bsend) X(Bsend_c) X(Rsend) X(Rsend_c) X(Recv) X(Recv_c)          \
    X(Sendrecv) X(Sendrecv_c) X(Sendrecv_replace) X(Sendrecv_replace_c) X(Probe) X(Mprobe) X(Mrecv)          \
    X(Mrecv_c) X(Wait) X(Waitall) X(Waitany) X(Waitsome)                                                     \
    X(Isend) X(Isend_c) X(Issend) X(Issend_c) X(Ibsend) X(Ibsend_c) X(Irsend) X(Irsend_c) X(Irecv)           \
    X(Irecv_c) X(Iprobe) X(Improbe) X(Imrecv) X(Imrecv_c) X(Test) X(Testall) X(Testany) X(Testsome)          \
    X(Barrier) X(Bcast) X(Bcast_c) X(Reduce) X(Reduce_c) X(Allreduce) X(Allreduce_c) X(Gather) X(Gather_c)   \
    X(Gatherv) X(Gatherv_c) X(Scatter) X(Scatter_c) X(Scatterv) X(Scatterv_c) X(Allgather) X(Allgather_c)    \
    X(Allgatherv) X(Allgatherv_c) X(Alltoall) X(Alltoall_c) X(Alltoallv) X(Alltoallv_c) X(Alltoallw)         \
    X(Alltoallw_c) X(Reduce_scatter) X(Reduce_scatter_c) X(Reduce_scatter_block) X(Reduce_scatter_block_c)   \
    X(Scan) X(Scan_c) X(Exscan) X(Exscan_c)

enum storm_fn_id {
#define STORM_ENUM(name) FN_##name,
    STORM_REAL_FUNCTIONS(STORM_ENUM)
#undef STORM_ENUM
    FN_COUNT
};

enum storm_abi { ABI_UNKNOWN, ABI_MPICH, ABI_FOREIGN };

/* The library exports the MPI_* wrappers and sched_yield only. */
#define STORM_INTERNAL __attribute__((visibility("hidden")))

struct storm_state {
    int ready;                        /* storm_setup() has run */
    int abi;                          /* enum storm_abi */
    int multiple;                     /* MPI_THREAD_MULTIPLE, or not known (no MPI_Init seen) */
    int counting;                     /* with `multiple`: a thread's call is being counted */
    struct storm_hook_record *record; /* NULL: no statistics (no or bad segment, or a foreign MPI) */
    uint64_t gap_ns;                  /* see hook.c, STORM_HOOK_GAP_NS */
    /* the hook's own copy of what it publishes, so that it never reads the shared cache line back */
    uint64_t seq, calls, events, comm_ns, spin_ns, block_ns, exit_ns;
    uint32_t flags;
    void *fn[FN_COUNT];
};

extern STORM_INTERNAL struct storm_state storm;

/* One outermost blocking call under way. */
struct storm_call {
    uint64_t t0;          /* entry */
    uint64_t spin_from;   /* when its spin phase began: entry, or when storm-nm switched it to spin-block */
    uint64_t spin_ns;     /* control.spin_ns at entry */
    uint64_t block_start; /* 0, or when the spin phase ended and the call started to give the CPU away */
    uint64_t block_end;   /* 0 until the block phase ended (the call returned, or storm-nm said poll) */
    uint64_t block_cpu;   /* this thread's CPU time at block_start, then the CPU its block phase used */
    uint64_t sleep_ns;    /* the next sleep of the block phase */
    uint64_t awake_until; /* sched_yield: MPICH polls until then after each sleep */
    /* MPICH's wait loop (hook.c, sched_yield): from its first yield on, the call's CPU time is measured, so
     * that what other processes ran meanwhile is not taken for polling. */
    uint64_t loop_from;   /* 0, or the wall time of the call's first sched_yield */
    uint64_t loop_cpu;    /* this thread's CPU time then */
    uint64_t last_yield;  /* when the last sched_yield returned */
    uint64_t stopped_ns;  /* gaps between yields long enough to be storm-nm's stops, while polling */
    int follow;           /* it waits as control.wait_mode says: the thread's outermost call, with a segment */
    int live;             /* counted and published: `follow`, and no other thread's call is counted */
    int spinblock;        /* it spin-blocks (from entry, or since storm-nm switched it) */
    int test_loop;        /* it waits in the hook's test loop, not in MPICH's (whose sched_yield may sleep) */
};

/* The followed call of this thread, whose sched_yield() calls may sleep (hook.c). */
extern STORM_INTERNAL __thread struct storm_call *storm_current;
/* Nesting of wrapped calls in this thread: only the outermost is followed. */
extern STORM_INTERNAL __thread int storm_depth;

STORM_INTERNAL void storm_setup(void);
STORM_INTERNAL void storm_publish_enter(uint64_t t0, int event, uint32_t call);
STORM_INTERNAL void storm_publish_exit(void);
STORM_INTERNAL int storm_missing(enum storm_fn_id id);
STORM_INTERNAL int storm_block(struct storm_call *c, uint64_t now);
STORM_INTERNAL uint64_t storm_block_end(struct storm_call *c, uint64_t now);
STORM_INTERNAL uint64_t storm_loop_off_cpu(struct storm_call *c, uint64_t now);

static inline uint64_t storm_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* vDSO: no system call */
    return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

/* Entry into a wrapped blocking call (`call`: enum storm_hook_call); returns whether it is to spin-block. */
static inline int storm_enter(struct storm_call *c, uint32_t call)
{
    if (__builtin_expect(!storm.ready, 0))
        storm_setup();
    c->follow = c->live = c->spinblock = c->test_loop = 0;
    if (storm_depth++ != 0 || !storm.record)
        return 0;
    c->follow = 1;
    /* One writer of the record at a time: a second thread's concurrent call is followed, not counted. */
    c->live = !storm.multiple || !__atomic_exchange_n(&storm.counting, 1, __ATOMIC_ACQUIRE);
    struct storm_hook_control *control = &storm.record->control;
    uint32_t mode = __atomic_load_n(&control->wait_mode, __ATOMIC_RELAXED);
    c->spin_ns = __atomic_load_n(&control->spin_ns, __ATOMIC_RELAXED);
    c->block_start = c->block_end = c->awake_until = c->loop_from = c->stopped_ns = 0;
    c->t0 = c->spin_from = storm_now();
    /* A new event unless the previous call ended so recently that nothing was computed in between. */
    if (c->live)
        storm_publish_enter(c->t0, c->t0 - storm.exit_ns > storm.gap_ns, call);
    c->spinblock = mode == STORM_WAIT_SPINBLOCK;
    storm_current = c;
    return c->spinblock;
}

/* May the call become its nonblocking form and the hook's test loop (see the top of this file)? */
static inline int storm_rewrite(const struct storm_call *c)
{
    return c->follow && !storm.multiple;
}

/*
 * A call that started polling: has storm-nm switched the rank to spin-block since? Then the rest of the
 * call spin-blocks (FCS reclassified the process while it waited, or its slot ended: a long wait must not
 * keep burning the CPU that other processes of the PE now share), its spin phase starting now. Its polling
 * so far is accounted as spinning.
 */
static inline int storm_turn_spinblock(struct storm_call *c, uint64_t now)
{
    struct storm_hook_control *control = &storm.record->control;
    if (!c->follow || __atomic_load_n(&control->wait_mode, __ATOMIC_RELAXED) != STORM_WAIT_SPINBLOCK)
        return 0;
    c->spin_ns = __atomic_load_n(&control->spin_ns, __ATOMIC_RELAXED);
    c->spin_from = now;
    c->spinblock = 1;
    return 1;
}

static inline void storm_leave(struct storm_call *c)
{
    storm_depth--;
    if (!c->follow)
        return;
    storm_current = 0;
    uint64_t t1 = storm_now();
    uint64_t blocked = c->block_start ? storm_block_end(c, t1) : 0;
    if (c->loop_from)
        blocked = storm_loop_off_cpu(c, t1);
    if (!c->live)
        return;
    if (c->spinblock)
        storm.spin_ns += (c->block_start ? c->block_start : t1) - c->t0;
    if (c->spinblock || c->loop_from)
        storm.block_ns += blocked;
    storm.comm_ns += t1 - c->t0;
    storm.exit_ns = t1;
    storm_publish_exit();
    if (storm.multiple)
        __atomic_store_n(&storm.counting, 0, __ATOMIC_RELEASE);
}

/* How the hook's test loop completes a call (p2p.c). */
struct storm_wait {
    int kind; /* WAIT_ONE ... WAIT_MPROBE */
    int count;
    SM_Request *requests;
    int *index;   /* Waitany's index, Waitsome's outcount */
    int *indices; /* Waitsome */
    void *status; /* SM_Status * or an array of them, or SM_STATUS(ES)_IGNORE */
    int source, tag;
    hk_handle comm;
    SM_Message *message;
};
enum { WAIT_ONE, WAIT_ALL, WAIT_ANY, WAIT_SOME, WAIT_PAIR, WAIT_PROBE, WAIT_MPROBE };

STORM_INTERNAL int storm_wait(struct storm_call *c, struct storm_wait *w);
STORM_INTERNAL int storm_complete(struct storm_call *c, int rc, SM_Request *request, void *status);

/* The real function `name`, with the type of the wrapper `MPI_<name>` (which has the same parameters). */
#define REAL(name) ((__typeof__(&MPI_##name)) storm.fn[FN_##name])

/* The real function, or the wrapper returns an error if this MPI does not have it. */
#define CHECK_REAL(name)                                                                                     \
    do {                                                                                                     \
        if (__builtin_expect(!storm.fn[FN_##name], 0))                                                       \
            return storm_missing(FN_##name);                                                                 \
    } while (0)

/* The real function of the wrapper, or an error if this MPI lacks it (a large-count form in an MPI-3 one). */
#define CALL_REAL(name, args) (storm.fn[FN_##name] ? REAL(name) args : storm_missing(FN_##name))

/* A real function called with the prototype `type` (the MPICH ABI's) */
#define NB(type, name) ((type *) storm.fn[FN_##name])

typedef int test_fn(SM_Request *, int *, void *);
typedef int testall_fn(int, SM_Request *, int *, void *);
typedef int testany_fn(int, SM_Request *, int *, int *, void *);
typedef int testsome_fn(int, SM_Request *, int *, int *, void *);
typedef int wait_fn(SM_Request *, void *);
typedef int waitall_fn(int, SM_Request *, void *);
typedef int waitany_fn(int, SM_Request *, int *, void *);
typedef int waitsome_fn(int, SM_Request *, int *, int *, void *);
typedef int iprobe_fn(int, int, hk_handle, int *, void *);
typedef int improbe_fn(int, int, hk_handle, int *, SM_Message *, void *);
typedef int probe_fn(int, int, hk_handle, void *);
typedef int mprobe_fn(int, int, hk_handle, SM_Message *, void *);
typedef int cancel_fn(SM_Request *);

/* A parameter list (a, b) as (a, b, SM_Request *request), an argument list (a, b) as (a, b, &request). */
#define WITH_REQUEST(...) (__VA_ARGS__, SM_Request *request)
#define AND_REQUEST(...) (__VA_ARGS__, &request)

/*
 * The wrapper MPI_<name>(params) of a point-to-point call, which calls PMPI_<name>(args) or, to wait its
 * own way, PMPI_<iname>(iargs, &request) of parameters (iparams, request): the same less the status, if
 * any, which goes to the completion as `status`. `call` is its enum storm_hook_call.
 */
#define WRAPPER(call, name, params, args, iname, iparams, iargs, status)                                     \
    typedef int iname##_fn WITH_REQUEST iparams;                                                             \
    int MPI_##name params                                                                                    \
    {                                                                                                        \
        struct storm_call c;                                                                                 \
        SM_Request request;                                                                                  \
        int rc;                                                                                              \
        storm_enter(&c, call);                                                                               \
        if (storm_rewrite(&c) && storm.fn[FN_##iname]) {                                                     \
            c.test_loop = 1;                                                                                 \
            rc = storm_complete(&c, ((iname##_fn *) storm.fn[FN_##iname]) AND_REQUEST iargs, &request,      \
                                status);                                                                     \
        } else                                                                                               \
            rc = CALL_REAL(name, args);                                                                      \
        storm_leave(&c);                                                                                     \
        return rc;                                                                                           \
    }

/* The wrapper of a call that stays the program's own (MPI_<name>(params) calls PMPI_<name>(args)). */
#define MEASURED(call, name, params, args)                                                                   \
    int MPI_##name params                                                                                    \
    {                                                                                                        \
        struct storm_call c;                                                                                 \
        storm_enter(&c, call);                                                                               \
        int rc = CALL_REAL(name, args);                                                                      \
        storm_leave(&c);                                                                                     \
        return rc;                                                                                           \
    }

#endif
