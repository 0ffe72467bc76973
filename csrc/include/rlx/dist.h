/*
 * dist.h - transports for pipeline parallelism: point-to-point messages between ranks of a fixed
 * world, a broadcast from one root, a barrier. One interface, several implementations (TCP mesh in
 * the core; MPI in the optional rlx._mpi module).
 *
 * Every call blocks until it completes, fails, or the transport's timeout passes (RLX_ERR_IO
 * naming the peer and what was awaited). A peer that vanishes is reported as RLX_ERR_IO by the
 * next call that needs it; nothing hangs past the timeout. Messages between a pair of ranks
 * arrive in order. A transport is used by one thread at a time.
 */
#ifndef RLX_DIST_H
#define RLX_DIST_H

#include "rlx/rlx.h"

struct rlx_transport;

struct rlx_transport_ops {
    const char *name;
    /* Sends bytes to rank dst with a user tag (< 2^24). */
    rlx_status (*send)(struct rlx_transport *t, int dst, uint32_t tag, const void *data, size_t bytes);
    /* Receives the next message from rank src; its tag must equal tag (else RLX_ERR_IO) and its size
     * must be <= cap (else RLX_ERR_RANGE, the message is consumed). *got = its size. */
    rlx_status (*recv)(struct rlx_transport *t, int src, uint32_t tag, void *data, size_t cap, size_t *got);
    /* Every rank calls it with the same root and bytes; afterwards every rank's data equals root's. */
    rlx_status (*broadcast)(struct rlx_transport *t, int root, void *data, size_t bytes);
    rlx_status (*barrier)(struct rlx_transport *t);
    /* Closes connections and frees t. NULL is a no-op. */
    void (*close)(struct rlx_transport *t);
};

/* Every transport starts with this header. */
struct rlx_transport {
    const struct rlx_transport_ops *ops;
    int rank, world;
};

/* TCP mesh. addrs[i] = "host:port" of rank i (world entries). Rank r listens on addrs[r] (or on
 * listen_fd when >= 0: an already bound and listening socket, which the transport takes over),
 * connects to every lower rank and accepts every higher one. Each connection starts with a HELLO
 * both ways (magic, protocol version, rank, world, a hash of the shared token): a mismatch is
 * refused with RLX_ERR_IO stating what differed. Frames carry a header (magic, tag, length);
 * a frame above max_message_bytes or cut short is an error. TCP_NODELAY on every socket.
 * timeout_ms bounds every wait, the mesh set-up included. token may be NULL or "" (no secret). */
struct rlx_tcp_opts {
    size_t max_message_bytes;   /* 0 = 1 GiB */
    int timeout_ms;             /* <= 0 = 60000 */
    const char *token;
};
rlx_status rlx_tcp_transport_create(int rank, int world, const char *const *addrs, int listen_fd,
                                    const struct rlx_tcp_opts *opts, struct rlx_transport **out);

#define RLX_TCP_PROTOCOL_VERSION 1

#endif
