/*
 * Blocking collectives, plain and large-count. Each stays the program's own blocking call (hook.h says
 * why it must): the hook counts it and times it, and where storm-nm asks for spin-block, the call
 * spin-blocks inside MPICH's wait loop (hook.c, sched_yield). That needs MPICH's shared-memory collective
 * algorithms, which never yield, to be off (the job shell sets MPIR_CVAR_<COLL>_POSIX_INTRA_ALGORITHM=mpir
 * where a node may ask for spin-block; record.h's STORM_HOOK_COLLECTIVES_POLL flags a rank where not).
 */
#define _GNU_SOURCE
#include "hook.h"

/* Both forms of a collective: counts are int or MPI_Count, displacements int or MPI_Aint. */
#define BOTH(macro, name) macro(name, name, int, int) macro(name, name##_c, SM_Count, SM_Aint)

/* MPI_Alltoallw's arrays of datatypes, passed on untouched whatever the size of a handle */
typedef const void *handle_array;

MEASURED(STORM_CALL_Barrier, Barrier, (hk_handle comm), (comm))

#define BCAST(call, name, count_t, disp_t)                                                                   \
    MEASURED(STORM_CALL_##call, name, (void *buf, count_t count, hk_handle type, int root, hk_handle comm),  \
             (buf, count, type, root, comm))
BOTH(BCAST, Bcast)

#define REDUCE(call, name, count_t, disp_t)                                                                  \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, void *recvbuf, count_t count, hk_handle type, hk_handle op, int root,     \
              hk_handle comm),                                                                               \
             (sendbuf, recvbuf, count, type, op, root, comm))
BOTH(REDUCE, Reduce)

/* Allreduce, Scan, Exscan, Reduce_scatter_block */
#define ALLREDUCE(call, name, count_t, disp_t)                                                               \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, void *recvbuf, count_t count, hk_handle type, hk_handle op,               \
              hk_handle comm),                                                                               \
             (sendbuf, recvbuf, count, type, op, comm))
BOTH(ALLREDUCE, Allreduce)
BOTH(ALLREDUCE, Scan)
BOTH(ALLREDUCE, Exscan)
BOTH(ALLREDUCE, Reduce_scatter_block)

#define REDUCE_SCATTER(call, name, count_t, disp_t)                                                          \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, void *recvbuf, const count_t *recvcounts, hk_handle type, hk_handle op,   \
              hk_handle comm),                                                                               \
             (sendbuf, recvbuf, recvcounts, type, op, comm))
BOTH(REDUCE_SCATTER, Reduce_scatter)

/* Gather, Scatter */
#define ROOTED(call, name, count_t, disp_t)                                                                  \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf, count_t recvcount,  \
              hk_handle recvtype, int root, hk_handle comm),                                                 \
             (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm))
BOTH(ROOTED, Gather)
BOTH(ROOTED, Scatter)

#define GATHERV(call, name, count_t, disp_t)                                                                 \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf,                     \
              const count_t *recvcounts, const disp_t *displs, hk_handle recvtype, int root,                 \
              hk_handle comm),                                                                               \
             (sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm))
BOTH(GATHERV, Gatherv)

#define SCATTERV(call, name, count_t, disp_t)                                                                \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, const count_t *sendcounts, const disp_t *displs, hk_handle sendtype,      \
              void *recvbuf, count_t recvcount, hk_handle recvtype, int root, hk_handle comm),               \
             (sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype, root, comm))
BOTH(SCATTERV, Scatterv)

/* Allgather, Alltoall */
#define ALLGATHER(call, name, count_t, disp_t)                                                               \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf, count_t recvcount,  \
              hk_handle recvtype, hk_handle comm),                                                           \
             (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
BOTH(ALLGATHER, Allgather)
BOTH(ALLGATHER, Alltoall)

#define ALLGATHERV(call, name, count_t, disp_t)                                                              \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf,                     \
              const count_t *recvcounts, const disp_t *displs, hk_handle recvtype, hk_handle comm),          \
             (sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm))
BOTH(ALLGATHERV, Allgatherv)

#define ALLTOALLV(call, name, count_t, disp_t)                                                               \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, const count_t *sendcounts, const disp_t *sdispls, hk_handle sendtype,     \
              void *recvbuf, const count_t *recvcounts, const disp_t *rdispls, hk_handle recvtype,           \
              hk_handle comm),                                                                               \
             (sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm))
BOTH(ALLTOALLV, Alltoallv)

#define ALLTOALLW(call, name, count_t, disp_t)                                                               \
    MEASURED(STORM_CALL_##call, name,                                                                        \
             (const void *sendbuf, const count_t *sendcounts, const disp_t *sdispls,                         \
              handle_array sendtypes, void *recvbuf, const count_t *recvcounts, const disp_t *rdispls,       \
              handle_array recvtypes, hk_handle comm),                                                       \
             (sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts, rdispls, recvtypes, comm))
BOTH(ALLTOALLW, Alltoallw)
