/*
 * tcp.c - the TCP mesh transport of rlx/dist.h: one socket between every pair of ranks, framed
 * messages (wire.h), broadcast and barrier built from point-to-point frames.
 *
 * Files: tcp.c (this one) frames, the ops, creation, tcp_internal.h's entry points; tcp_handshake.c
 * the set-up handshakes of both sides; tcp_sock.c sockets with deadlines, addresses, listening and
 * connecting; tcp_state.h the transport's state the first two share.
 *
 * Timeouts: the set-up as a whole has one deadline (timeout_ms). After that every send and every
 * recv has its own deadline, now + timeout_ms, computed once (by a send, once its MAC is computed):
 * it bounds the whole message (header, payload, MAC), however the bytes trickle in, so a peer
 * sending a byte a second cannot stretch it. Every socket is non-blocking and every wait is a
 * poll() for the time left; EINTR restarts the wait with the remaining time; sends use
 * MSG_NOSIGNAL, so a vanished peer is an error, never a SIGPIPE (tcp_sock.c).
 *
 * Frames and errors: a frame above max_message_bytes is refused without reading its payload, and
 * the connection to that peer is closed (skipping gigabytes of payload would outlast any timeout).
 * A frame larger than the receive buffer but within max_message_bytes, a frame with an unexpected
 * tag, and a broadcast or barrier message of another size than every rank agreed (RLX_ERR_IO: the
 * peer's fault, not a small buffer) are read and discarded (their MAC still checked), so the stream
 * stays in step.
 * Every frame carries an HMAC under the direction's key over its sequence number, header and
 * payload; a frame whose MAC fails (altered, injected, repeated or reordered in transit, or one
 * lost before it) is an error and closes the connection; the receive buffer may then hold the
 * rejected payload. With a token the keys come from it, so the MAC also authenticates the sender;
 * without one they come from public bytes (wire.h), which still catches every such fault that is
 * not deliberate, so that no rank computes on a corrupted or out-of-order message. Any error that
 * leaves the stream in an unknown place (a frame cut short, bad magic, a timeout after part of a
 * frame) also closes that connection; later calls naming that peer fail at once with RLX_ERR_IO. A
 * timeout before the first byte of a frame leaves the connection usable.
 *
 * Never prints, never raises signals, never blocks past the timeout.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/core.h"
#include "distributed/auth.h"
#include "distributed/tcp_internal.h"
#include "distributed/tcp_sock.h"
#include "distributed/tcp_state.h"
#include "distributed/wire.h"
#include "rlx/dist.h"

#define DEFAULT_MAX_BYTES  ((size_t)1 << 30)
#define DEFAULT_TIMEOUT_MS 60000

/* ---------------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------------- */

static struct tcp_transport *tcp_of(struct rlx_transport *base) { return (struct tcp_transport *)base; }

/* Closes the connection to peer after an error that leaves its stream in an unknown place. */
static void drop(struct tcp_transport *t, int peer)
{
    if (t->links[peer].fd >= 0) close(t->links[peer].fd);
    t->links[peer].fd = -1;
}

/* The link to peer, or an error saying why there is none. `verb` names the call. */
static rlx_status peer_link(struct tcp_transport *t, int peer, const char *verb, struct link **out)
{
    if (peer < 0 || peer >= t->base.world)
        return rlx_set_error(RLX_ERR_INVALID, "%s: rank %d is out of range (world %d)", verb, peer, t->base.world);
    if (peer == t->base.rank) return rlx_set_error(RLX_ERR_INVALID, "%s: rank %d cannot message itself", verb, peer);
    if (t->links[peer].fd < 0)
        return rlx_set_error(RLX_ERR_IO, "%s: the connection from rank %d to rank %d was closed after an earlier error",
                             verb, t->base.rank, peer);
    *out = &t->links[peer];
    return RLX_OK;
}

static void tag_text(uint32_t tag, char *out, size_t cap)
{
    switch (tag) {
    case RLX_WIRE_TAG_BROADCAST: snprintf(out, cap, "broadcast"); break;
    case RLX_WIRE_TAG_BARRIER_ARRIVE: snprintf(out, cap, "barrier arrival"); break;
    case RLX_WIRE_TAG_BARRIER_LEAVE: snprintf(out, cap, "barrier release"); break;
    default: snprintf(out, cap, "tag %" PRIu32, tag); break;
    }
}

/* Starts a frame MAC: HMAC(key, seq || header); the payload follows through rlx_hmac_update. */
static rlx_status frame_mac_begin(struct tcp_transport *t, const unsigned char *key, uint64_t seq,
                                  const unsigned char head[16])
{
    unsigned char seq_le[8];
    rlx_wire_u64_encode(seq_le, seq);
    RLX_TRY(rlx_hmac_begin(t->hmac, key, RLX_HMAC_BYTES));
    RLX_TRY(rlx_hmac_update(t->hmac, seq_le, sizeof seq_le));
    return rlx_hmac_update(t->hmac, head, sizeof(struct rlx_wire_frame));
}

static rlx_status send_frame(struct tcp_transport *t, int dst, uint32_t tag, const void *data, size_t bytes,
                             const char *verb)
{
    struct link *l;
    RLX_TRY(peer_link(t, dst, verb, &l));
    unsigned char head[sizeof(struct rlx_wire_frame)], mac[RLX_HMAC_BYTES];
    rlx_wire_frame_encode(head, tag, (uint64_t)bytes);
    RLX_TRY(frame_mac_begin(t, l->send_key, l->send_seq, head));
    RLX_TRY(rlx_hmac_update(t->hmac, data, bytes));
    RLX_TRY(rlx_hmac_end(t->hmac, mac));
    int64_t deadline = rlx_tcp_now_ms() + t->timeout_ms; /* once the frame is ready; it bounds the whole message */
    struct iovec iov[3] = {{.iov_base = head, .iov_len = sizeof head},
                           {.iov_base = (void *)data, .iov_len = bytes},
                           {.iov_base = mac, .iov_len = sizeof mac}};
    size_t done;
    enum io_result r = rlx_tcp_send_all(l->fd, iov, 3, deadline, &done);
    if (r == IO_OK) {
        l->send_seq++;
        return RLX_OK;
    }
    char tagt[32], who[32], what[96];
    tag_text(tag, tagt, sizeof tagt);
    snprintf(who, sizeof who, "rank %d", dst);
    snprintf(what, sizeof what, "%s: sending a %zu-byte message with %s", verb, bytes, tagt);
    rlx_status s = rlx_tcp_io_error(r, t->timeout_ms, who, what, done, sizeof head + bytes + sizeof mac);
    if (!(r == IO_TIMEOUT && done == 0)) /* nothing sent: the stream is still in step */
        drop(t, dst);
    return s;
}

/* Reads n payload bytes from fd into nothing (adding them to the frame MAC). */
static enum io_result discard(struct tcp_transport *t, int fd, uint64_t n, int64_t deadline, size_t *done_out,
                              rlx_status *mac_status)
{
    unsigned char sink[16384];
    uint64_t left = n;
    *done_out = 0;
    while (left > 0) {
        size_t chunk = left < sizeof sink ? (size_t)left : sizeof sink, done;
        enum io_result r = rlx_tcp_recv_all(fd, sink, chunk, deadline, &done);
        *done_out += done;
        if (r != IO_OK) return r;
        if (*mac_status == RLX_OK) *mac_status = rlx_hmac_update(t->hmac, sink, chunk);
        left -= chunk;
    }
    return IO_OK;
}

/* Reads the frame's MAC and compares it with the one computed so far. RLX_OK when it matches; an
 * error (the link dropped) otherwise. */
static rlx_status check_frame_mac(struct tcp_transport *t, int src, int64_t deadline, const char *verb,
                                  const char *tagt)
{
    struct link *l = &t->links[src];
    unsigned char want[RLX_HMAC_BYTES], got[RLX_HMAC_BYTES];
    rlx_status s = rlx_hmac_end(t->hmac, want);
    if (s != RLX_OK) {
        drop(t, src);
        return s;
    }
    size_t done;
    enum io_result r = rlx_tcp_recv_all(l->fd, got, sizeof got, deadline, &done);
    if (r != IO_OK) {
        char who[32], what[128];
        snprintf(who, sizeof who, "rank %d", src);
        snprintf(what, sizeof what, "%s: receiving the MAC of a message with %s", verb, tagt);
        drop(t, src);
        return rlx_tcp_io_error(r, t->timeout_ms, who, what, done, sizeof got);
    }
    if (!rlx_crypto_equal(want, got, sizeof want)) {
        drop(t, src);
        return rlx_set_error(RLX_ERR_IO,
                             "%s: the message with %s from rank %d failed its integrity check (frame "
                             "MAC): it was altered, injected, repeated or reordered in transit, or one before it was "
                             "lost; connection to rank %d closed",
                             verb, tagt, src, src);
    }
    l->recv_seq++;
    return RLX_OK;
}

/* Receives the next frame from src into data (cap bytes); see the file comment for the errors. With
 * `exact` (broadcast, barrier: every rank agreed on the size) a frame of any other size is the peer's
 * fault, RLX_ERR_IO, and is discarded without touching data. */
static rlx_status recv_frame(struct tcp_transport *t, int src, uint32_t tag, void *data, size_t cap, int exact,
                             size_t *got, const char *verb)
{
    struct link *l;
    RLX_TRY(peer_link(t, src, verb, &l));
    int64_t deadline = rlx_tcp_now_ms() + t->timeout_ms; /* once: it bounds the whole message */
    char tagt[32], who[32], what[128];
    tag_text(tag, tagt, sizeof tagt);
    snprintf(who, sizeof who, "rank %d", src);
    unsigned char head[sizeof(struct rlx_wire_frame)];
    size_t done;
    enum io_result r = rlx_tcp_recv_all(l->fd, head, sizeof head, deadline, &done);
    if (r != IO_OK) {
        snprintf(what, sizeof what, "%s: receiving a message with %s", verb, tagt);
        rlx_status s = rlx_tcp_io_error(r, t->timeout_ms, who, what, done, sizeof head);
        if (!(r == IO_TIMEOUT && done == 0)) drop(t, src);
        return s;
    }
    struct rlx_wire_frame f = rlx_wire_frame_decode(head);
    if (f.magic != RLX_WIRE_FRAME_MAGIC) {
        drop(t, src);
        return rlx_set_error(RLX_ERR_IO,
                             "%s: rank %d sent a frame with bad magic 0x%08" PRIx32
                             " (the stream is out of step); connection closed",
                             verb, src, f.magic);
    }
    if (f.length > t->max_bytes) {
        drop(t, src);
        return rlx_set_error(RLX_ERR_IO,
                             "%s: rank %d sent a %" PRIu64 "-byte frame, above max_message_bytes %zu; "
                             "connection to rank %d closed",
                             verb, src, f.length, t->max_bytes, src);
    }
    rlx_status s = frame_mac_begin(t, l->recv_key, l->recv_seq, head);
    if (s != RLX_OK) {
        drop(t, src);
        return s;
    }
    char gott[32];
    tag_text(f.tag, gott, sizeof gott);
    if (f.tag != tag)
        s = rlx_set_error(RLX_ERR_IO,
                          "%s: expected a message with %s from rank %d, got one with %s (%" PRIu64 " bytes, discarded)",
                          verb, tagt, src, gott, f.length);
    else if (exact && f.length != cap)
        s = rlx_set_error(RLX_ERR_IO, "%s: rank %d sent %" PRIu64 " bytes with %s, rank %d expected %zu (discarded)",
                          verb, src, f.length, tagt, t->base.rank, cap);
    else if (f.length > cap)
        s = rlx_set_error(RLX_ERR_RANGE,
                          "%s: the message from rank %d with %s has %" PRIu64
                          " bytes, more than the %zu-byte buffer (discarded)",
                          verb, src, tagt, f.length, cap);
    if (s != RLX_OK) { /* the message stays set unless discarding the frame fails too */
        rlx_status mac_s = RLX_OK;
        r = discard(t, l->fd, f.length, deadline, &done, &mac_s);
        if (r != IO_OK) {
            drop(t, src);
            snprintf(what, sizeof what, "%s: discarding a message with %s", verb, gott);
            return rlx_tcp_io_error(r, t->timeout_ms, who, what, done, (size_t)f.length);
        }
        if (mac_s != RLX_OK) {
            drop(t, src);
            return mac_s;
        }
        RLX_TRY(check_frame_mac(t, src, deadline, verb, gott));
        return s;
    }
    r = rlx_tcp_recv_all(l->fd, data, (size_t)f.length, deadline, &done);
    if (r != IO_OK) {
        drop(t, src);
        snprintf(what, sizeof what, "%s: receiving the payload of a message with %s", verb, tagt);
        return rlx_tcp_io_error(r, t->timeout_ms, who, what, done, (size_t)f.length);
    }
    s = rlx_hmac_update(t->hmac, data, (size_t)f.length);
    if (s != RLX_OK) {
        drop(t, src);
        return s;
    }
    RLX_TRY(check_frame_mac(t, src, deadline, verb, tagt));
    *got = (size_t)f.length;
    return RLX_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The ops
 * ------------------------------------------------------------------------------------------- */

static rlx_status tcp_send(struct rlx_transport *base, int dst, uint32_t tag, const void *data, size_t bytes)
{
    struct tcp_transport *t = tcp_of(base);
    if (tag >= RLX_WIRE_USER_TAG_LIMIT)
        return rlx_set_error(RLX_ERR_INVALID, "send: tag %" PRIu32 " is out of range (user tags are < 2^24)", tag);
    if (bytes > t->max_bytes)
        return rlx_set_error(RLX_ERR_RANGE, "send: %zu bytes to rank %d is above max_message_bytes %zu", bytes, dst,
                             t->max_bytes);
    if (data == NULL && bytes > 0) return rlx_set_error(RLX_ERR_INVALID, "send: data is NULL");
    return send_frame(t, dst, tag, data, bytes, "send");
}

static rlx_status tcp_recv(struct rlx_transport *base, int src, uint32_t tag, void *data, size_t cap, size_t *got)
{
    struct tcp_transport *t = tcp_of(base);
    if (tag >= RLX_WIRE_USER_TAG_LIMIT)
        return rlx_set_error(RLX_ERR_INVALID, "recv: tag %" PRIu32 " is out of range (user tags are < 2^24)", tag);
    if ((data == NULL && cap > 0) || got == NULL) return rlx_set_error(RLX_ERR_INVALID, "recv: data or got is NULL");
    return recv_frame(t, src, tag, data, cap, 0, got, "recv");
}

static rlx_status tcp_broadcast(struct rlx_transport *base, int root, void *data, size_t bytes)
{
    struct tcp_transport *t = tcp_of(base);
    if (root < 0 || root >= base->world)
        return rlx_set_error(RLX_ERR_INVALID, "broadcast: root %d is out of range (world %d)", root, base->world);
    if (bytes > t->max_bytes)
        return rlx_set_error(RLX_ERR_RANGE, "broadcast: %zu bytes is above max_message_bytes %zu", bytes, t->max_bytes);
    if (data == NULL && bytes > 0) return rlx_set_error(RLX_ERR_INVALID, "broadcast: data is NULL");
    if (base->rank == root) {
        for (int r = 0; r < base->world; r++) {
            if (r != root) RLX_TRY(send_frame(t, r, RLX_WIRE_TAG_BROADCAST, data, bytes, "broadcast"));
        }
        return RLX_OK;
    }
    size_t got;
    return recv_frame(t, root, RLX_WIRE_TAG_BROADCAST, data, bytes, 1, &got, "broadcast");
}

/* Every rank > 0 reports to rank 0, which releases them all once each has arrived. */
static rlx_status tcp_barrier(struct rlx_transport *base)
{
    struct tcp_transport *t = tcp_of(base);
    size_t got;
    if (base->rank != 0) {
        RLX_TRY(send_frame(t, 0, RLX_WIRE_TAG_BARRIER_ARRIVE, NULL, 0, "barrier"));
        return recv_frame(t, 0, RLX_WIRE_TAG_BARRIER_LEAVE, NULL, 0, 1, &got, "barrier");
    }
    for (int r = 1; r < base->world; r++)
        RLX_TRY(recv_frame(t, r, RLX_WIRE_TAG_BARRIER_ARRIVE, NULL, 0, 1, &got, "barrier"));
    for (int r = 1; r < base->world; r++) RLX_TRY(send_frame(t, r, RLX_WIRE_TAG_BARRIER_LEAVE, NULL, 0, "barrier"));
    return RLX_OK;
}

static void tcp_close(struct rlx_transport *base)
{
    if (base == NULL) return;
    struct tcp_transport *t = tcp_of(base);
    for (int r = 0; t->links != NULL && r < base->world; r++) {
        if (t->links[r].fd >= 0) close(t->links[r].fd);
    }
    if (t->links != NULL) rlx_crypto_wipe(t->links, sizeof *t->links * (size_t)base->world);
    free(t->links);
    rlx_crypto_wipe(t->token, t->token_len);
    free(t->token);
    rlx_hmac_free(t->hmac);
    free(t);
}

static const struct rlx_transport_ops tcp_ops = {
    .name = "tcp",
    .send = tcp_send,
    .recv = tcp_recv,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    .close = tcp_close,
};

/* ---------------------------------------------------------------------------------------------
 * Creation
 * ------------------------------------------------------------------------------------------- */

static rlx_status tcp_setup(struct tcp_transport *t, const char *const *addrs, int *lfd)
{
    int rank = t->base.rank, world = t->base.world;
    int64_t deadline = rlx_tcp_now_ms() + t->timeout_ms;
    if (rank < world - 1 && *lfd < 0)
        RLX_TRY(rlx_tcp_listen_on(addrs[rank], rank, lfd));
    else if (*lfd >= 0)
        RLX_TRY(rlx_tcp_adopt_listener(*lfd, rank));
    for (int peer = 0; peer < rank; peer++) RLX_TRY(rlx_tcp_connect_peer(t, peer, addrs[peer], deadline));
    if (rank < world - 1) RLX_TRY(rlx_tcp_accept_peers(t, *lfd, deadline));
    return RLX_OK;
}

/* Fills t from opts (defaults for what is unset). */
static rlx_status tcp_configure(struct tcp_transport *t, const struct rlx_tcp_opts *opts)
{
    t->max_bytes = opts != NULL && opts->max_message_bytes > 0 ? opts->max_message_bytes : DEFAULT_MAX_BYTES;
    t->timeout_ms = opts != NULL && opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    t->allow_remote = opts != NULL && opts->allow_remote;
    const char *token = opts != NULL ? opts->token : NULL;
    if (token == NULL || token[0] == '\0') return rlx_hmac_create(&t->hmac);
    t->token_len = strlen(token);
    t->token = rlx_calloc(1, t->token_len);
    if (t->token == NULL) return RLX_ERR_NOMEM;
    memcpy(t->token, token, t->token_len);
    return rlx_hmac_create(&t->hmac);
}

/* A transport with every link closed (rank and world already checked). */
static rlx_status tcp_new(int rank, int world, const struct rlx_tcp_opts *opts, struct tcp_transport **out)
{
    struct tcp_transport *t = rlx_calloc(1, sizeof *t);
    if (t == NULL) return RLX_ERR_NOMEM;
    t->base.ops = &tcp_ops;
    t->base.rank = rank;
    t->base.world = world;
    rlx_status s = tcp_configure(t, opts);
    if (s == RLX_OK && (t->links = rlx_calloc((size_t)world, sizeof *t->links)) == NULL) s = RLX_ERR_NOMEM;
    for (int r = 0; s == RLX_OK && r < world; r++) t->links[r].fd = -1;
    if (s != RLX_OK) {
        tcp_close(&t->base);
        return s;
    }
    *out = t;
    return RLX_OK;
}

rlx_status rlx_tcp_transport_create(int rank, int world, const char *const *addrs, int listen_fd,
                                    const struct rlx_tcp_opts *opts, struct rlx_transport **out)
{
    rlx_status s = RLX_OK;
    struct tcp_transport *t = NULL;
    if (out == NULL || world < 1 || rank < 0 || rank >= world || (world > 1 && addrs == NULL)) {
        s = rlx_set_error(RLX_ERR_INVALID, "tcp transport: bad arguments (rank %d, world %d%s)", rank, world,
                          out == NULL ? ", out is NULL" : (world > 1 && addrs == NULL ? ", addrs is NULL" : ""));
        goto done;
    }
    for (int r = 0; r < world && world > 1; r++) {
        char host[256], port[8];
        if ((s = rlx_tcp_parse_addr(addrs[r], r, host, sizeof host, port)) != RLX_OK) goto done;
    }
    if ((s = tcp_new(rank, world, opts, &t)) != RLX_OK) goto done;
    for (int r = 0; r < world && world > 1 && !has_token(t) && !t->allow_remote; r++) {
        if (r != rank && (s = rlx_tcp_check_loopback_addr(addrs[r], r)) != RLX_OK) goto done;
    }
    if (world > 1) s = tcp_setup(t, addrs, &listen_fd);
done:
    if (listen_fd >= 0) close(listen_fd);
    if (s != RLX_OK) {
        tcp_close(t != NULL ? &t->base : NULL);
        return s;
    }
    *out = &t->base;
    return RLX_OK;
}

/* ---------------------------------------------------------------------------------------------
 * tcp_internal.h: a transport with no connection yet, one handshake on a socket the caller made
 * (the handshakes themselves are tcp_handshake.c's), and the state of its links
 * ------------------------------------------------------------------------------------------- */

static struct tcp_transport *tcp_checked(struct rlx_transport *base)
{
    return base != NULL && base->ops == &tcp_ops ? tcp_of(base) : NULL;
}

rlx_status rlx_tcp_transport_unconnected(int rank, int world, const struct rlx_tcp_opts *opts,
                                         struct rlx_transport **out)
{
    if (out == NULL || world < 2 || rank < 0 || rank >= world)
        return rlx_set_error(RLX_ERR_INVALID, "tcp transport: bad arguments (rank %d, world %d%s)", rank, world,
                             out == NULL ? ", out is NULL" : "");
    struct tcp_transport *t;
    RLX_TRY(tcp_new(rank, world, opts, &t));
    *out = &t->base;
    return RLX_OK;
}

rlx_status rlx_tcp_accept_fd(struct rlx_transport *base, int fd, int *peer)
{
    struct tcp_transport *t = tcp_checked(base);
    if (t == NULL || fd < 0 || peer == NULL) {
        if (fd >= 0) close(fd);
        return rlx_set_error(RLX_ERR_INVALID, "accept_fd: bad arguments (fd %d)", fd);
    }
    rlx_status s = rlx_tcp_set_nonblocking(fd);
    if (s != RLX_OK) {
        close(fd);
        return s;
    }
    return rlx_tcp_accept_one(t, fd, peer);
}

rlx_status rlx_tcp_connect_fd(struct rlx_transport *base, int peer, int fd)
{
    struct tcp_transport *t = tcp_checked(base);
    if (t == NULL || fd < 0 || peer < 0 || peer >= t->base.rank || t->links[peer].fd >= 0) {
        if (fd >= 0) close(fd);
        return rlx_set_error(RLX_ERR_INVALID,
                             "connect_fd: bad arguments (peer %d, fd %d): a rank connects to a lower "
                             "rank it has no link to",
                             peer, fd);
    }
    rlx_status s = rlx_tcp_set_nonblocking(fd);
    if (s != RLX_OK) {
        close(fd);
        return s;
    }
    t->links[peer].fd = fd;
    char addr[32];
    snprintf(addr, sizeof addr, "fd %d", fd);
    s = rlx_tcp_connector_handshake(t, peer, fd, addr, rlx_tcp_now_ms() + t->timeout_ms);
    if (s != RLX_OK) drop(t, peer);
    return s;
}

int rlx_tcp_link_info(struct rlx_transport *base, int peer, uint64_t *received, uint64_t *sent)
{
    struct tcp_transport *t = tcp_checked(base);
    if (t == NULL || peer < 0 || peer >= t->base.world) return -1;
    if (received != NULL) *received = t->links[peer].recv_seq;
    if (sent != NULL) *sent = t->links[peer].send_seq;
    return t->links[peer].fd >= 0;
}
