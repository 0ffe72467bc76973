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
 * connects to every lower rank and accepts every higher one. The wire protocol is in
 * csrc/distributed/wire.h.
 *
 * Each connection opens with HELLOs both ways (protocol version, rank, world, fresh nonces); a
 * mismatch is refused and the connecting rank fails with RLX_ERR_IO stating what differed. With a
 * token (the same non-empty string on every rank) both sides prove they know it by an
 * HMAC-SHA-256 challenge-response bound to both nonces, the ranks, the world and the direction
 * (nothing secret or replayable crosses the wire). Every frame carries an HMAC over its sequence
 * number under a per-connection, per-direction key: a frame altered, injected, repeated or
 * reordered in transit, or one after a lost frame, is RLX_ERR_IO and closes that connection.
 * Payloads are authenticated, not encrypted. Use a long random token: a recorded handshake lets an
 * eavesdropper test guesses offline.
 * Without a token nothing is authenticated (the frame keys come from public bytes: the MAC still
 * catches frames corrupted, lost, repeated or reordered by accident, not forged ones), so the mesh
 * keeps to loopback: create refuses peer addresses that are not loopback (RLX_ERR_INVALID) and the
 * acceptor refuses connections from non-loopback addresses, unless allow_remote is set.
 *
 * A connection during set-up that is not a rank of this job (garbage, silence, another version or
 * world size, a wrong token, a replay, a duplicate rank) is refused, closed and logged through the
 * log callback (rlx_set_log_callback, RLX_LOG_WARN); set-up goes on until every rank has connected
 * or timeout_ms passes (RLX_ERR_IO naming the missing ranks and the last refusal).
 *
 * Frames carry a header (magic, tag, length); a frame above max_message_bytes or cut short is an
 * error. TCP_NODELAY on every socket. timeout_ms bounds the whole set-up, and then each send and
 * each recv as a whole (a deadline computed once per message, however slowly its bytes arrive).
 * token may be NULL or "" (no token). */
struct rlx_tcp_opts {
    size_t max_message_bytes; /* 0 = 1 GiB */
    int timeout_ms;           /* <= 0 = 60000 */
    const char *token;        /* NULL or "" = none; copied, so it may be freed after create */
    int allow_remote;         /* without a token: also talk to non-loopback peers (0 = loopback only) */
};
rlx_status rlx_tcp_transport_create(int rank, int world, const char *const *addrs, int listen_fd,
                                    const struct rlx_tcp_opts *opts, struct rlx_transport **out);

/* 3: frame MACs without a token too (keys from public bytes: integrity, not authenticity); 2 was
 * the HMAC challenge-response handshake with frame MACs only with a token; 1 sent a hash of the
 * token in clear (csrc/distributed/wire.h). */
#define RLX_TCP_PROTOCOL_VERSION 3

#endif
