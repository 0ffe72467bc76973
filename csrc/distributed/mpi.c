/*
 * mpi.c - the transport of rlx/dist.h over MPI, for runs launched by mpirun. Compiled only into
 * rlx._mpi (setup.py defines RLX_WITH_MPI and passes mpicc's flags there); every other build
 * (rlx._C, the C tests, which compile every csrc file) sees an empty file.
 *
 * Messages travel on a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so they never match
 * the caller's own MPI traffic and MPI failures come back as statuses. recv matches the next
 * message from src whatever its tag (MPI keeps a pair's messages in order), checks tag and size on
 * the matched probe and discards a wrong one by receiving it truncated to 0 bytes (no buffer the
 * size of the message is ever allocated).
 *
 * Every call is bounded by the timeout, like the TCP mesh's: each is a nonblocking MPI call
 * (MPI_Isend, MPI_Improbe then MPI_Imrecv, MPI_Ibcast, MPI_Ibarrier) whose request is tested,
 * spinning briefly and then napping, until it completes or the deadline passes. A blocking MPI call
 * would wait forever for a rank that is alive but never gets there (stalled, or gone through an
 * error of its own that did not end its process): the whole job would hang. Payloads go through
 * the transport's own staging buffer, never the caller's, so that a request still pending after a
 * timeout can never touch memory the caller has got back.
 *
 * A timeout with a request left pending, or an MPI error, breaks the transport: later calls fail at
 * once, and it never finalises MPI (MPI_Finalize waits for every rank, which a job in trouble may
 * never bring together). A recv that times out before any message from src matched leaves the
 * transport usable. A process whose transport broke, or that calls rlx_mpi_abandon(), leaves MPI
 * initialised and should exit non-zero: mpirun then ends the whole job. Its staging buffer stays
 * allocated if a request may still use it.
 *
 * Never prints, never exits, never aborts the MPI job.
 */
#if defined(RLX_WITH_MPI)

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "distributed/mpi.h"

#define DEFAULT_MAX_BYTES  ((size_t)1 << 30)
#define DEFAULT_TIMEOUT_MS 60000
#define USER_TAG_LIMIT     (1u << 24)

struct mpi_transport {
    struct rlx_transport base;
    MPI_Comm comm;        /* a duplicate of MPI_COMM_WORLD, MPI_ERRORS_RETURN */
    size_t max_bytes;     /* largest payload sent or accepted (<= INT_MAX) */
    int timeout_ms;       /* bound of every call */
    int tag_ub;           /* MPI_TAG_UB of this MPI */
    unsigned char *stage; /* (stage_cap) every payload's copy while MPI holds it */
    size_t stage_cap;
    int pending;      /* a request on stage was left behind by a timeout */
    char broken[256]; /* why the transport can no longer be used; "" while it can */
};

/* The process-wide MPI lifetime: live transports, whether this file initialised MPI, and whether
 * this process has given up on finalising it (a transport broke, or rlx_mpi_abandon). */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int mpi_users;
static int mpi_we_initialized;
static int mpi_abandoned;

/* MPI's text for the error code rc. */
static void mpi_error_text(int rc, char out[MPI_MAX_ERROR_STRING])
{
    int len = 0;
    if (MPI_Error_string(rc, out, &len) != MPI_SUCCESS || len <= 0)
        len = snprintf(out, MPI_MAX_ERROR_STRING, "unknown error %d", rc);
    out[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
}

static rlx_status mpi_error(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    mpi_error_text(rc, msg);
    return rlx_set_error(RLX_ERR_IO, "MPI: %s failed: %s", what, msg);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct mpi_transport *mpi_of(struct rlx_transport *base) { return (struct mpi_transport *)base; }

void rlx_mpi_abandon(void)
{
    pthread_mutex_lock(&mpi_lock);
    mpi_abandoned = 1;
    pthread_mutex_unlock(&mpi_lock);
}

/* Breaks t: the message (printf-style) becomes both the error returned (RLX_ERR_IO) and the reason
 * later calls give; this process will not finalise MPI. */
static rlx_status __attribute__((format(printf, 2, 3))) fail(struct mpi_transport *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->broken, sizeof t->broken, fmt, ap);
    va_end(ap);
    rlx_mpi_abandon();
    return rlx_set_error(RLX_ERR_IO, "%s", t->broken);
}

/* fail() for an MPI error code from the call `what`. */
static rlx_status fail_mpi(struct mpi_transport *t, int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    mpi_error_text(rc, msg);
    return fail(t, "MPI: %s failed: %s", what, msg);
}

/* RLX_OK while t is usable; otherwise the error that says why not. */
static rlx_status usable(const struct mpi_transport *t, const char *verb)
{
    if (t->broken[0] == '\0') return RLX_OK;
    return rlx_set_error(RLX_ERR_IO,
                         "%s: the MPI transport of rank %d failed earlier and cannot be used again (%s); "
                         "end this process: mpirun then ends the job",
                         verb, t->base.rank, t->broken);
}

/* The staging buffer, at least n bytes (its contents are not kept). Never called while a
 * request may use it: a pending request breaks the transport first. */
static rlx_status stage(struct mpi_transport *t, size_t n, unsigned char **out)
{
    if (n > t->stage_cap) {
        unsigned char *p = realloc(t->stage, n);
        if (p == NULL) return rlx_set_error(RLX_ERR_NOMEM, "MPI transport: out of memory for a %zu-byte message", n);
        t->stage = p;
        t->stage_cap = n;
    }
    *out = t->stage;
    return RLX_OK;
}

/* Pauses between tests of a request: spins first (latency), then yields the core in short naps. */
static void pause_after(int spins)
{
    if (spins > 1000) {
        struct timespec nap = {0, spins > 20000 ? 200000 : 20000};
        nanosleep(&nap, NULL);
    }
}

/* Waits for *req until deadline, driving MPI's progress. RLX_OK when it completed; otherwise the
 * transport is broken (the request may still be pending: t->pending) and the error says
 * "<verb>: timed out after N s <waiting>". */
static rlx_status wait_request(struct mpi_transport *t, MPI_Request *req, int64_t deadline, const char *verb,
                               const char *waiting)
{
    for (int spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char what[192];
            snprintf(what, sizeof what, "%s: MPI_Test (%s)", verb, waiting);
            t->pending = 1; /* the request's state is unknown */
            return fail_mpi(t, rc, what);
        }
        if (done) return RLX_OK;
        if (spins > 1000 && now_ms() >= deadline) {
            t->pending = 1;
            return fail(t, "%s: timed out after %.1f s %s", verb, t->timeout_ms / 1000.0, waiting);
        }
        pause_after(spins);
    }
}

static rlx_status check_peer(const struct mpi_transport *t, int peer, const char *verb)
{
    if (peer < 0 || peer >= t->base.world)
        return rlx_set_error(RLX_ERR_INVALID, "%s: rank %d is out of range (world %d)", verb, peer, t->base.world);
    if (peer == t->base.rank) return rlx_set_error(RLX_ERR_INVALID, "%s: rank %d cannot message itself", verb, peer);
    return RLX_OK;
}

static rlx_status check_tag(const struct mpi_transport *t, uint32_t tag, const char *verb)
{
    if (tag >= USER_TAG_LIMIT)
        return rlx_set_error(RLX_ERR_INVALID, "%s: tag %u is out of range (user tags are < 2^24)", verb, (unsigned)tag);
    if (tag > (uint32_t)t->tag_ub)
        return rlx_set_error(RLX_ERR_RANGE, "%s: tag %u is above this MPI's MPI_TAG_UB %d", verb, (unsigned)tag,
                             t->tag_ub);
    return RLX_OK;
}

static rlx_status mpi_send(struct rlx_transport *base, int dst, uint32_t tag, const void *data, size_t bytes)
{
    struct mpi_transport *t = mpi_of(base);
    RLX_TRY(check_peer(t, dst, "send"));
    RLX_TRY(check_tag(t, tag, "send"));
    if (bytes > t->max_bytes)
        return rlx_set_error(RLX_ERR_RANGE, "send: %zu bytes to rank %d is above max_message_bytes %zu", bytes, dst,
                             t->max_bytes);
    RLX_TRY(usable(t, "send"));
    int64_t deadline = now_ms() + t->timeout_ms;
    unsigned char *buf = NULL;
    RLX_TRY(stage(t, bytes, &buf));
    if (bytes > 0) memcpy(buf, data, bytes);
    MPI_Request req;
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, (int)tag, t->comm, &req);
    if (rc != MPI_SUCCESS) return fail_mpi(t, rc, "send: MPI_Isend");
    char waiting[96];
    snprintf(waiting, sizeof waiting, "waiting for rank %d to take a %zu-byte message with tag %u", dst, bytes,
             (unsigned)tag);
    return wait_request(t, &req, deadline, "send", waiting);
}

/* Receives a matched message truncated to nothing: consumes it without a buffer. */
static void discard(MPI_Message *msg)
{
    unsigned char none;
    MPI_Status st;
    /* MPI_ERR_TRUNCATE is the expected outcome; the message is consumed either way. */
    (void)MPI_Mrecv(&none, 0, MPI_BYTE, msg, &st);
}

static rlx_status mpi_recv(struct rlx_transport *base, int src, uint32_t tag, void *data, size_t cap, size_t *got)
{
    struct mpi_transport *t = mpi_of(base);
    RLX_TRY(check_peer(t, src, "recv"));
    RLX_TRY(check_tag(t, tag, "recv"));
    if (got == NULL || (data == NULL && cap > 0)) return rlx_set_error(RLX_ERR_INVALID, "recv: data or got is NULL");
    RLX_TRY(usable(t, "recv"));
    MPI_Message msg;
    MPI_Status st;
    int found = 0;
    int64_t deadline = now_ms() + t->timeout_ms;
    for (int spins = 0;; spins++) {
        int rc = MPI_Improbe(src, MPI_ANY_TAG, t->comm, &found, &msg, &st);
        if (rc != MPI_SUCCESS) return fail_mpi(t, rc, "recv: MPI_Improbe");
        if (found) break;
        if (spins > 1000 && now_ms() >= deadline) /* nothing matched: the transport stays usable */
            return rlx_set_error(RLX_ERR_IO, "recv: timed out after %.1f s waiting for rank %d (a message with tag %u)",
                                 t->timeout_ms / 1000.0, src, (unsigned)tag);
        pause_after(spins);
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (st.MPI_TAG != (int)tag) {
        discard(&msg);
        return rlx_set_error(
            RLX_ERR_IO, "recv: expected a message with tag %u from rank %d, got one with tag %d (%d bytes, discarded)",
            (unsigned)tag, src, st.MPI_TAG, count);
    }
    if ((size_t)count > t->max_bytes) {
        discard(&msg);
        return rlx_set_error(RLX_ERR_IO,
                             "recv: rank %d sent a %d-byte message, above max_message_bytes %zu (discarded)", src,
                             count, t->max_bytes);
    }
    if ((size_t)count > cap) {
        discard(&msg);
        return rlx_set_error(
            RLX_ERR_RANGE,
            "recv: the message from rank %d with tag %u has %d bytes, more than the %zu-byte buffer (discarded)", src,
            (unsigned)tag, count, cap);
    }
    unsigned char *buf = NULL;
    MPI_Request req;
    rlx_status s = stage(t, (size_t)count, &buf);
    if (s != RLX_OK) {
        discard(&msg);
        return s;
    }
    int rc = MPI_Imrecv(buf, count, MPI_BYTE, &msg, &req);
    if (rc != MPI_SUCCESS) return fail_mpi(t, rc, "recv: MPI_Imrecv");
    char waiting[96];
    snprintf(waiting, sizeof waiting, "waiting for rank %d (receiving its %d-byte message with tag %u)", src, count,
             (unsigned)tag);
    RLX_TRY(wait_request(t, &req, deadline, "recv", waiting));
    if (count > 0) memcpy(data, buf, (size_t)count);
    *got = (size_t)count;
    return RLX_OK;
}

static rlx_status mpi_broadcast(struct rlx_transport *base, int root, void *data, size_t bytes)
{
    struct mpi_transport *t = mpi_of(base);
    if (root < 0 || root >= base->world)
        return rlx_set_error(RLX_ERR_INVALID, "broadcast: root %d is out of range (world %d)", root, base->world);
    if (bytes > t->max_bytes)
        return rlx_set_error(RLX_ERR_RANGE, "broadcast: %zu bytes is above max_message_bytes %zu", bytes, t->max_bytes);
    RLX_TRY(usable(t, "broadcast"));
    int64_t deadline = now_ms() + t->timeout_ms;
    unsigned char *buf = NULL;
    RLX_TRY(stage(t, bytes, &buf));
    if (base->rank == root && bytes > 0) memcpy(buf, data, bytes);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, t->comm, &req);
    if (rc != MPI_SUCCESS) return fail_mpi(t, rc, "broadcast: MPI_Ibcast");
    char waiting[96];
    if (base->rank == root)
        snprintf(waiting, sizeof waiting, "waiting for every rank to take its %zu bytes", bytes);
    else
        snprintf(waiting, sizeof waiting, "waiting for rank %d (the root) to send %zu bytes", root, bytes);
    RLX_TRY(wait_request(t, &req, deadline, "broadcast", waiting));
    if (base->rank != root && bytes > 0) memcpy(data, buf, bytes);
    return RLX_OK;
}

static rlx_status mpi_barrier(struct rlx_transport *base)
{
    struct mpi_transport *t = mpi_of(base);
    RLX_TRY(usable(t, "barrier"));
    int64_t deadline = now_ms() + t->timeout_ms;
    MPI_Request req;
    int rc = MPI_Ibarrier(t->comm, &req);
    if (rc != MPI_SUCCESS) return fail_mpi(t, rc, "barrier: MPI_Ibarrier");
    return wait_request(t, &req, deadline, "barrier", "waiting for every rank to arrive");
}

static void mpi_close(struct rlx_transport *base)
{
    if (base == NULL) return;
    struct mpi_transport *t = mpi_of(base);
    pthread_mutex_lock(&mpi_lock);
    /* Freeing the communicator and finalising are collective in effect: after a failure the other
     * ranks may never get there, so both are skipped and the process is left to exit. */
    if (t->comm != MPI_COMM_NULL && !mpi_abandoned) MPI_Comm_free(&t->comm);
    if (--mpi_users == 0 && mpi_we_initialized && !mpi_abandoned) {
        MPI_Finalize();
        mpi_we_initialized = 0;
    }
    pthread_mutex_unlock(&mpi_lock);
    if (!t->pending) /* else MPI may still use it: left allocated */
        free(t->stage);
    free(t);
}

static const struct rlx_transport_ops mpi_ops = {
    .name = "mpi",
    .send = mpi_send,
    .recv = mpi_recv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .close = mpi_close,
};

/* Makes sure MPI is initialised with at least MPI_THREAD_SERIALIZED; called with mpi_lock held. */
static rlx_status ensure_mpi(void)
{
    int finalized = 0, initialized = 0, provided = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return rlx_set_error(RLX_ERR_STATE, "MPI was already finalised in this process (keep one MPI transport "
                                            "open for the whole run)");
    MPI_Initialized(&initialized);
    if (!initialized) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Init_thread");
        mpi_we_initialized = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return rlx_set_error(RLX_ERR_UNSUPPORTED,
                             "MPI provides thread level %d; rlx needs MPI_THREAD_SERIALIZED "
                             "(initialise MPI with it, e.g. mpi4py.rc.thread_level = \"serialized\")",
                             provided);
    return RLX_OK;
}

rlx_status rlx_mpi_transport_create(const struct rlx_mpi_opts *opts, struct rlx_transport **out)
{
    if (out == NULL) return rlx_set_error(RLX_ERR_INVALID, "mpi transport: out is NULL");
    size_t max_bytes = opts != NULL && opts->max_message_bytes > 0 ? opts->max_message_bytes : DEFAULT_MAX_BYTES;
    if (max_bytes > INT_MAX)
        return rlx_set_error(RLX_ERR_RANGE, "mpi transport: max_message_bytes %zu is above %d (MPI counts are int)",
                             max_bytes, INT_MAX);
    struct mpi_transport *t = calloc(1, sizeof *t);
    if (t == NULL) return rlx_set_error(RLX_ERR_NOMEM, "mpi transport: out of memory");
    t->base.ops = &mpi_ops;
    t->comm = MPI_COMM_NULL;
    t->max_bytes = max_bytes;
    t->timeout_ms = opts != NULL && opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;

    pthread_mutex_lock(&mpi_lock);
    rlx_status s = ensure_mpi();
    if (s != RLX_OK) {
        int last = mpi_users == 0 && mpi_we_initialized;
        if (last) {
            MPI_Finalize();
            mpi_we_initialized = 0;
        }
        pthread_mutex_unlock(&mpi_lock);
        free(t);
        return s;
    }
    mpi_users++; /* from here mpi_close undoes everything */
    pthread_mutex_unlock(&mpi_lock);

    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &t->comm);
    if (rc != MPI_SUCCESS) {
        t->comm = MPI_COMM_NULL;
        s = mpi_error(rc, "MPI_Comm_dup");
    }
    int *ub = NULL, flag = 0;
    if (s == RLX_OK && (rc = MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS)
        s = mpi_error(rc, "MPI_Comm_set_errhandler");
    if (s == RLX_OK && ((rc = MPI_Comm_rank(t->comm, &t->base.rank)) != MPI_SUCCESS ||
                        (rc = MPI_Comm_size(t->comm, &t->base.world)) != MPI_SUCCESS))
        s = mpi_error(rc, "MPI_Comm_rank/size");
    if (s == RLX_OK && ((rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag)) != MPI_SUCCESS || !flag))
        s = rc != MPI_SUCCESS ? mpi_error(rc, "MPI_Comm_get_attr(MPI_TAG_UB)")
                              : rlx_set_error(RLX_ERR_INTERNAL, "MPI: MPI_TAG_UB is not set");
    if (s != RLX_OK) {
        mpi_close(&t->base);
        return s;
    }
    t->tag_ub = *ub;
    *out = &t->base;
    return RLX_OK;
}

#endif
