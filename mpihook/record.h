/*
 * The shared-memory contract between mpihook (inside every MPI rank) and storm-nm.
 *
 * One POSIX shared-memory segment per job per node, created by storm-nm before the ranks start and named
 * in each rank's environment (STORM_HOOK_SEGMENT, with STORM_HOOK_INDEX, the rank's record in it). The
 * segment is a header followed by one record per local rank.
 *
 * The segment belongs to the job's user (their hooks write it), so storm-nm never maps it: a user could
 * shrink it under the mapping and kill the root daemon with SIGBUS. It reads all of a job's records with one
 * pread() per time slice (no system call per rank) and writes a control word with pwrite().
 *
 * Each record has two parts on separate cache lines, so that the two writers never share a line:
 *   - statistics, written only by the rank's hook, with a sequence number at each end so that a reader
 *     can check one plain copy: an update first stores the next number in `seq_end`, then the fields,
 *     then the same number in `seq` last, each store a release store. A copy made in ascending address
 *     order (a memcpy, a pread) is consistent when its `seq` equals its `seq_end`; otherwise read again.
 *     (An update that began before the copy reached `seq_end` leaves `seq_end` ahead of `seq`.)
 *   - control, written only by storm-nm: how the rank must wait in blocking calls.
 *
 * All times are CLOCK_MONOTONIC nanoseconds. mpihook/stats.py mirrors this layout (a test checks the
 * offsets against this header). Any change to the layout must change STORM_HOOK_VERSION.
 */
#ifndef STORM_HOOK_RECORD_H
#define STORM_HOOK_RECORD_H

#include <stdint.h>

#define STORM_HOOK_MAGIC 0x314b484d524f5453ULL /* "STORMHK1", little-endian */
#define STORM_HOOK_VERSION 2u

/* flags */
#define STORM_HOOK_ACTIVE 1u     /* the rank entered MPI through the hook: statistics are live */
#define STORM_HOOK_FOREIGN_MPI 2u /* not an MPICH-ABI library: calls pass straight through, no statistics */
/* The program may call MPI from several threads at once (MPI_THREAD_MULTIPLE, or MPI used without
 * MPI_Init): every call stays the program's own blocking call, waits spin-block inside MPICH's wait loop,
 * and the statistics are those of one thread's calls at a time. */
#define STORM_HOOK_THREAD_MULTIPLE 4u
/* Blocking collectives over shared memory cannot spin-block: MPICH's shared-memory algorithms for them
 * wait in loops that never yield (MPIR_CVAR_<COLL>_POSIX_INTRA_ALGORITHM is not "mpir"; see hook.c). */
#define STORM_HOOK_COLLECTIVES_POLL 8u
/* MPI_Finalize returned: the rank communicates no more (it may run on a while, as Python's teardown does),
 * so there is nothing left to classify it by. */
#define STORM_HOOK_FINALIZED 16u

/* stats.call: the blocking call the rank is in (in_call) or was in last, 1 for the first listed here, ...;
 * the large-count forms (MPI_Send_c) are their plain form's. 0: none yet. */
#define STORM_HOOK_CALLS(X)                                                                                  \
    X(Send) X(Ssend) X(Bsend) X(Rsend) X(Recv) X(Sendrecv) X(Sendrecv_replace) X(Probe) X(Mprobe) X(Mrecv)   \
    X(Wait) X(Waitall) X(Waitany) X(Waitsome) X(Barrier) X(Bcast) X(Reduce) X(Allreduce) X(Gather)          \
    X(Gatherv) X(Scatter) X(Scatterv) X(Allgather) X(Allgatherv) X(Alltoall) X(Alltoallv) X(Alltoallw)      \
    X(Reduce_scatter) X(Reduce_scatter_block) X(Scan) X(Exscan)

enum storm_hook_call {
    STORM_CALL_NONE,
#define STORM_CALL_ENUM(name) STORM_CALL_##name,
    STORM_HOOK_CALLS(STORM_CALL_ENUM)
#undef STORM_CALL_ENUM
    STORM_CALL_COUNT
};

/* control.wait_mode */
#define STORM_WAIT_POLL 0u       /* busy-wait in blocking calls, as MPICH does (the default) */
#define STORM_WAIT_SPINBLOCK 1u  /* spin for spin_ns, then stop using the CPU until the call can complete */

struct storm_hook_header { /* 64 bytes */
    uint64_t magic;
    uint32_t version;
    uint32_t nranks;      /* records that follow the header */
    uint32_t record_size; /* sizeof(struct storm_hook_record) */
    uint32_t reserved0;
    uint64_t job_id;
    uint8_t reserved[32];
};

struct storm_hook_stats { /* 96 bytes: written by the hook only */
    uint64_t seq;         /* the number of the last completed update (stored last) */
    int32_t pid;          /* 0 until the rank entered MPI through the hook */
    int32_t rank;         /* rank in MPI_COMM_WORLD */
    uint32_t flags;       /* STORM_HOOK_* */
    uint32_t in_call;     /* 1 while inside a blocking call */
    uint64_t calls;       /* blocking calls */
    uint64_t events;      /* communication events: blocking calls with computation before them */
    uint64_t comm_ns;     /* wall time inside blocking calls, summed */
    uint64_t enter_ns;    /* entry into the current or last blocking call */
    uint64_t exit_ns;     /* exit from the last blocking call */
    uint64_t spin_ns;     /* of comm_ns, time spent spinning in spin-block mode */
    uint64_t block_ns;    /* of comm_ns, time spent not using the CPU in spin-block mode */
    uint32_t call;        /* enum storm_hook_call: the call entered last */
    uint32_t reserved;
    uint64_t seq_end;     /* the number of the update under way or last completed (stored first) */
};

struct storm_hook_control { /* 32 bytes: written by storm-nm only */
    uint32_t wait_mode;   /* STORM_WAIT_* */
    uint32_t spin_ns;     /* T_spin for spin-block, in nanoseconds (FCS paper: 120 us) */
    uint32_t reserved[6];
};

struct storm_hook_record { /* 256 bytes */
    struct storm_hook_stats stats;
    uint8_t pad0[128 - sizeof(struct storm_hook_stats)];
    struct storm_hook_control control; /* at offset 128: its own cache lines */
    uint8_t pad1[128 - sizeof(struct storm_hook_control)];
};

#endif
