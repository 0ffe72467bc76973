/*
 * mpi.h - the MPI transport (mpi.c) and the glue of the separate extension module rlx._mpi
 * (mpi_module.c), which is built only where mpicc works. This header does not include <mpi.h>:
 * rlx._C (python/transport_type.c) includes it for the capsule contract at the end only.
 */
#ifndef RLX_DIST_MPI_H
#define RLX_DIST_MPI_H

#include "rlx/dist.h"

/* MPI transport over a duplicate of MPI_COMM_WORLD (rank and world from it). Initialises MPI
 * (MPI_THREAD_SERIALIZED) when nothing has; the last close finalises it only if this code
 * initialised it, after which no MPI transport can be created again in this process.
 * Collective: every rank of MPI_COMM_WORLD must call it.
 * timeout_ms bounds every send, recv, broadcast and barrier (RLX_ERR_IO naming what was awaited).
 * A timeout that leaves an MPI request behind, or an MPI error, breaks the transport: later calls
 * fail at once and this process will not finalise MPI (see rlx_mpi_abandon). An MPI job whose
 * rank dies is ended by mpirun. */
struct rlx_mpi_opts {
    size_t max_message_bytes; /* 0 = 1 GiB; at most INT_MAX (MPI counts are int) */
    int timeout_ms;           /* <= 0 = 60000 */
};
rlx_status rlx_mpi_transport_create(const struct rlx_mpi_opts *opts, struct rlx_transport **out);

/* This process will not finalise MPI: closing the last transport leaves MPI initialised. For a
 * rank that is ending with an error: MPI_Finalize waits for every other rank to finalise too, which
 * ranks stuck waiting for this one would never do, so the job would hang. A process that exits
 * without finalising makes mpirun end the whole job. Thread-safe; cannot be undone. */
void rlx_mpi_abandon(void);

/* ---------------------------------------------------------------------------------------------
 * Capsules between rlx._mpi and rlx._C
 *
 * rlx._C exports RLX_CORE_API_CAPSULE: a struct rlx_core_api, so that rlx._mpi (a separate shared
 * object holding no copy of the core) sets errors in rlx._C's thread-local message, the one that
 * rlx._C reads when it turns a status into an exception, and raises them the same way.
 *
 * rlx._mpi.create() returns a capsule named RLX_TRANSPORT_CAPSULE holding a struct rlx_transport *.
 * Its context is NULL while the capsule owns the transport (its destructor closes it);
 * _C.Transport.from_capsule sets a non-NULL context when it adopts the transport, after which the
 * capsule's destructor leaves it alone and the capsule may not be adopted again.
 * ------------------------------------------------------------------------------------------- */

#define RLX_CORE_API_CAPSULE  "rlx._C._core_api"
#define RLX_CORE_API_VERSION  1u
#define RLX_TRANSPORT_CAPSULE "rlx.transport"

struct rlx_core_api {
    unsigned version; /* RLX_CORE_API_VERSION */
    rlx_status (*set_error)(rlx_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    int (*raise_status)(rlx_status s); /* rlx_py_raise: needs the GIL; 0 for RLX_OK, else -1 and raised */
};

#endif
