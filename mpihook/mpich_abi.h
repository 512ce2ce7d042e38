/*
 * The part of the MPICH ABI (libmpi.so.12: MPICH >= 3.1, Intel MPI, and the `mpich` wheel) that mpihook
 * needs, written out so that the hook builds without any MPI installed and never links against libmpi: it
 * finds the library at run time (hook.c). Every name carries the prefix SM_ instead of MPI_ so that a test
 * can include this header next to the real mpi.h and check each type and constant against it
 * (tests/test_mpihook.py, test_abi_header_matches_mpi_h).
 *
 * In this ABI every handle (communicator, datatype, op, request, message) is an int and MPI_Status is five
 * ints. The wrappers declare handle parameters wider than that on purpose: see hook.h.
 */
#ifndef STORM_MPICH_ABI_H
#define STORM_MPICH_ABI_H

typedef int SM_Comm;
typedef int SM_Datatype;
typedef int SM_Op;
typedef int SM_Request;
typedef int SM_Message;
typedef long SM_Aint;
typedef long long SM_Count;

typedef struct SM_Status {
    int count_lo;
    int count_hi_and_cancelled;
    int MPI_SOURCE;
    int MPI_TAG;
    int MPI_ERROR;
} SM_Status;

#define SM_SUCCESS 0
#define SM_ERR_COUNT 2
#define SM_ERR_OTHER 15
#define SM_ERR_INTERN 16
#define SM_ERR_IN_STATUS 17
#define SM_ERR_UNSUPPORTED_OPERATION 44
#define SM_UNDEFINED (-32766)
#define SM_ANY_SOURCE (-2)
#define SM_ANY_TAG (-1)
#define SM_PROC_NULL (-1)

#define SM_COMM_WORLD ((SM_Comm) 0x44000000)
#define SM_REQUEST_NULL ((SM_Request) 0x2c000000)
#define SM_MESSAGE_NULL ((SM_Message) 0x2c000000)
#define SM_MESSAGE_NO_PROC ((SM_Message) 0x6c000000)
#define SM_STATUS_IGNORE ((SM_Status *) 1)
#define SM_STATUSES_IGNORE ((SM_Status *) 1)

#define SM_THREAD_SINGLE 0
#define SM_THREAD_FUNNELED 1
#define SM_THREAD_SERIALIZED 2
#define SM_THREAD_MULTIPLE 3

#endif
