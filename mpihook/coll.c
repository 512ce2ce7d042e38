/*
 * Blocking collectives, plain and large-count. In MPICH each one runs as its nonblocking form (MPI_Ibarrier,
 * MPI_Iallreduce, ...) and a completion in every wait mode, polling too: MPICH never matches a blocking
 * collective with a nonblocking one (MPI forbids mixing them: a rank in MPI_Barrier and one in MPI_Ibarrier
 * deadlock), and storm-nm sets each rank's mode on its own. Nor can they spin-block inside MPICH: after a
 * few calls on a communicator, MPICH's shared-memory collectives (Barrier, Bcast, Reduce, Allreduce) wait
 * in loops that never yield. The price, measured on 2 local ranks: +2-7 us per small collective (an 8-byte
 * MPI_Allreduce took 0.3-1.5 us blocking), none for large ones (a 1 MB MPI_Bcast took 0.15 ms instead of
 * 1 ms). All ranks of a job must therefore run the hook (with or without a segment) or none.
 */
#define _GNU_SOURCE
#include "hook.h"

/* A collective: its parameters and arguments are those of its nonblocking form less the request. */
#define COLLECTIVE(name, iname, params, args)                                                                \
    WRAPPER(ALWAYS, name, params, args, iname, params, args, SM_STATUS_IGNORE)

/* Both forms of a collective: counts are int or MPI_Count, displacements int or MPI_Aint. */
#define BOTH(macro, name, iname) macro(name, iname, int, int) macro(name##_c, iname##_c, SM_Count, SM_Aint)

/* MPI_Alltoallw's arrays of datatypes, passed on untouched whatever the size of a handle */
typedef const void *handle_array;

COLLECTIVE(Barrier, Ibarrier, (hk_handle comm), (comm))

#define BCAST(name, iname, count_t, disp_t)                                                                  \
    COLLECTIVE(name, iname, (void *buf, count_t count, hk_handle type, int root, hk_handle comm),            \
               (buf, count, type, root, comm))
BOTH(BCAST, Bcast, Ibcast)

#define REDUCE(name, iname, count_t, disp_t)                                                                 \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, void *recvbuf, count_t count, hk_handle type, hk_handle op, int root,   \
                hk_handle comm),                                                                             \
               (sendbuf, recvbuf, count, type, op, root, comm))
BOTH(REDUCE, Reduce, Ireduce)

/* Allreduce, Scan, Exscan, Reduce_scatter_block */
#define ALLREDUCE(name, iname, count_t, disp_t)                                                              \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, void *recvbuf, count_t count, hk_handle type, hk_handle op,             \
                hk_handle comm),                                                                             \
               (sendbuf, recvbuf, count, type, op, comm))
BOTH(ALLREDUCE, Allreduce, Iallreduce)
BOTH(ALLREDUCE, Scan, Iscan)
BOTH(ALLREDUCE, Exscan, Iexscan)
BOTH(ALLREDUCE, Reduce_scatter_block, Ireduce_scatter_block)

#define REDUCE_SCATTER(name, iname, count_t, disp_t)                                                         \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, void *recvbuf, const count_t *recvcounts, hk_handle type, hk_handle op, \
                hk_handle comm),                                                                             \
               (sendbuf, recvbuf, recvcounts, type, op, comm))
BOTH(REDUCE_SCATTER, Reduce_scatter, Ireduce_scatter)

/* Gather, Scatter */
#define ROOTED(name, iname, count_t, disp_t)                                                                 \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf,                   \
                count_t recvcount, hk_handle recvtype, int root, hk_handle comm),                            \
               (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm))
BOTH(ROOTED, Gather, Igather)
BOTH(ROOTED, Scatter, Iscatter)

#define GATHERV(name, iname, count_t, disp_t)                                                                \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf,                   \
                const count_t *recvcounts, const disp_t *displs, hk_handle recvtype, int root,               \
                hk_handle comm),                                                                             \
               (sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm))
BOTH(GATHERV, Gatherv, Igatherv)

#define SCATTERV(name, iname, count_t, disp_t)                                                               \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, const count_t *sendcounts, const disp_t *displs, hk_handle sendtype,    \
                void *recvbuf, count_t recvcount, hk_handle recvtype, int root, hk_handle comm),             \
               (sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype, root, comm))
BOTH(SCATTERV, Scatterv, Iscatterv)

/* Allgather, Alltoall */
#define ALLGATHER(name, iname, count_t, disp_t)                                                              \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf,                   \
                count_t recvcount, hk_handle recvtype, hk_handle comm),                                      \
               (sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm))
BOTH(ALLGATHER, Allgather, Iallgather)
BOTH(ALLGATHER, Alltoall, Ialltoall)

#define ALLGATHERV(name, iname, count_t, disp_t)                                                             \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, count_t sendcount, hk_handle sendtype, void *recvbuf,                   \
                const count_t *recvcounts, const disp_t *displs, hk_handle recvtype, hk_handle comm),        \
               (sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm))
BOTH(ALLGATHERV, Allgatherv, Iallgatherv)

#define ALLTOALLV(name, iname, count_t, disp_t)                                                              \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, const count_t *sendcounts, const disp_t *sdispls, hk_handle sendtype,   \
                void *recvbuf, const count_t *recvcounts, const disp_t *rdispls, hk_handle recvtype,         \
                hk_handle comm),                                                                             \
               (sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm))
BOTH(ALLTOALLV, Alltoallv, Ialltoallv)

#define ALLTOALLW(name, iname, count_t, disp_t)                                                              \
    COLLECTIVE(name, iname,                                                                                  \
               (const void *sendbuf, const count_t *sendcounts, const disp_t *sdispls,                       \
                handle_array sendtypes, void *recvbuf, const count_t *recvcounts, const disp_t *rdispls,     \
                handle_array recvtypes, hk_handle comm),                                                     \
               (sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts, rdispls, recvtypes, comm))
BOTH(ALLTOALLW, Alltoallw, Ialltoallw)
