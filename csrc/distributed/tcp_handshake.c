/*
 * tcp_handshake.c - the TCP transport's set-up (tcp.c): connecting down to every lower rank and
 * accepting every higher one, each connection through the handshake of wire.h.
 *
 * Set-up: rank r binds addrs[r] (or takes over listen_fd), connects to every lower rank (retrying
 * until the deadline: the peer may not listen yet), then accepts every higher rank. Each
 * connection opens with the handshake of wire.h: HELLOs both ways carrying fresh random nonces,
 * then, with a token, an HMAC-SHA-256 challenge-response in both directions (the connector proves
 * first; the acceptor checks that proof before it sends anything derived from the token) and two
 * per-direction frame keys. The listener is closed once the mesh is up, so no port stays open.
 * listen_fd is consumed: it is closed before create returns, on success or not.
 *
 * Strays: the acceptor runs every incoming handshake at once from one poll() loop, so a connection
 * that is silent, slow, garbage, from another protocol version or world, without the token, or a
 * replay cannot hold up the real peers. Each one is refused (answered with a REFUSE, or with our
 * HELLO when it speaks another protocol version, so that a misconfigured rank learns why; a peer
 * that does not start with rlx's magic gets nothing), closed, and logged through rlx_log
 * (RLX_LOG_WARN); set-up goes on until every expected rank has arrived or the set-up deadline
 * passes, and the timeout error names the missing ranks and the last refusal. At most MAX_PENDING
 * handshakes wait at once (the oldest is dropped for a newer one). The connecting side has no
 * strays: a refusal or a failed check of the acceptor's answer fails set-up with a message saying
 * what differed. Without a token, a valid HELLO is all a rank needs, so any local process can
 * still take a free rank's place: only the token makes the ranks who they say they are.
 *
 * Without a token the mesh stays on loopback unless opts->allow_remote: create refuses peer
 * addresses that are not loopback, the connector checks the address it reached, and the acceptor
 * refuses connections from non-loopback addresses (REFUSE_REMOTE).
 *
 * Never prints, never raises signals, never blocks past the timeout.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/core.h"
#include "distributed/auth.h"
#include "distributed/tcp_sock.h"
#include "distributed/tcp_state.h"
#include "distributed/wire.h"
#include "rlx/dist.h"

#define LABEL_MAX     160
#define ADDR_NAME_MAX 64 /* "[v6 address]:port" fits */
#define MAX_PENDING   64 /* handshakes the acceptor runs at once */

/* ---------------------------------------------------------------------------------------------
 * Handshake messages (wire.h)
 * ------------------------------------------------------------------------------------------- */

/* HELLO from this rank with a fresh random nonce. */
static rlx_status make_hello(const struct tcp_transport *t, unsigned char out[RLX_WIRE_MSG_BYTES])
{
    rlx_wire_head_encode(out, RLX_WIRE_HELLO_MAGIC, RLX_TCP_PROTOCOL_VERSION, has_token(t) ? RLX_WIRE_FLAG_TOKEN : 0,
                         (uint32_t)t->base.rank, (uint32_t)t->base.world);
    return rlx_crypto_random(out + RLX_WIRE_HEAD_BYTES, RLX_WIRE_NONCE_BYTES);
}

static void make_refuse(const struct tcp_transport *t, unsigned char out[RLX_WIRE_HEAD_BYTES], enum rlx_wire_refuse why)
{
    rlx_wire_head_encode(out, RLX_WIRE_REFUSE_MAGIC, RLX_TCP_PROTOCOL_VERSION, (uint16_t)why, (uint32_t)t->base.rank,
                         (uint32_t)t->base.world);
}

/* out = HMAC(key, label with its NUL || hello_c || hello_a) */
static rlx_status transcript_mac(struct tcp_transport *t, const void *key, size_t key_len, const char *label,
                                 const unsigned char *hello_c, const unsigned char *hello_a,
                                 unsigned char out[RLX_HMAC_BYTES])
{
    RLX_TRY(rlx_hmac_begin(t->hmac, key, key_len));
    RLX_TRY(rlx_hmac_update(t->hmac, label, strlen(label) + 1));
    RLX_TRY(rlx_hmac_update(t->hmac, hello_c, RLX_WIRE_MSG_BYTES));
    RLX_TRY(rlx_hmac_update(t->hmac, hello_a, RLX_WIRE_MSG_BYTES));
    return rlx_hmac_end(t->hmac, out);
}

/* PROOF from this rank: HEAD + HMAC(token, label || transcript). */
static rlx_status make_proof(struct tcp_transport *t, const char *label, const unsigned char *hello_c,
                             const unsigned char *hello_a, unsigned char out[RLX_WIRE_MSG_BYTES])
{
    rlx_wire_head_encode(out, RLX_WIRE_PROOF_MAGIC, RLX_TCP_PROTOCOL_VERSION, 0, (uint32_t)t->base.rank,
                         (uint32_t)t->base.world);
    return transcript_mac(t, t->token, t->token_len, label, hello_c, hello_a, out + RLX_WIRE_HEAD_BYTES);
}

/* Whether a received PROOF's MAC is the one `label` gives for this transcript (constant time). */
static rlx_status proof_ok(struct tcp_transport *t, const char *label, const unsigned char *hello_c,
                           const unsigned char *hello_a, const unsigned char *proof, int *ok)
{
    unsigned char want[RLX_HMAC_BYTES];
    RLX_TRY(transcript_mac(t, t->token, t->token_len, label, hello_c, hello_a, want));
    *ok = rlx_crypto_equal(want, proof + RLX_WIRE_HEAD_BYTES, RLX_HMAC_BYTES);
    rlx_crypto_wipe(want, sizeof want);
    return RLX_OK;
}

/* Opens link `peer` on fd after a complete handshake and derives its frame keys: from the token,
 * or without one from the public key RLX_WIRE_KEY_NO_TOKEN (wire.h: integrity, not authenticity). */
static rlx_status link_open(struct tcp_transport *t, int peer, int fd, int connector, const unsigned char *hello_c,
                            const unsigned char *hello_a)
{
    struct link *l = &t->links[peer];
    const void *key = has_token(t) ? (const void *)t->token : RLX_WIRE_KEY_NO_TOKEN;
    size_t key_len = has_token(t) ? t->token_len : strlen(RLX_WIRE_KEY_NO_TOKEN);
    RLX_TRY(transcript_mac(t, key, key_len, connector ? RLX_WIRE_LABEL_KEY_C2A : RLX_WIRE_LABEL_KEY_A2C, hello_c,
                           hello_a, l->send_key));
    RLX_TRY(transcript_mac(t, key, key_len, connector ? RLX_WIRE_LABEL_KEY_A2C : RLX_WIRE_LABEL_KEY_C2A, hello_c,
                           hello_a, l->recv_key));
    l->send_seq = l->recv_seq = 0;
    l->fd = fd; /* last: on failure fd stays with the caller */
    return RLX_OK;
}

static const char *token_state(int flag) { return flag ? "has a token" : "has no token (RLX_DIST_TOKEN)"; }

/* ---------------------------------------------------------------------------------------------
 * Set-up, connecting side: connect down
 * ------------------------------------------------------------------------------------------- */

/* The error for a REFUSE from rank `peer` at addr (h is its HEAD). */
static rlx_status refused_error(const struct tcp_transport *t, const struct rlx_wire_head *h, int peer,
                                const char *addr)
{
    int me = t->base.rank;
    switch (h->info) {
    case RLX_WIRE_REFUSE_WORLD:
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d runs with world size %" PRIu32 ", expected %d (it refused rank %d's "
                             "connection to %s)",
                             peer, h->world, t->base.world, me, addr);
    case RLX_WIRE_REFUSE_RANK:
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d at %s refused rank %d: it accepts only ranks %d..%" PRIu32
                             " (are the ranks numbered the same on every process?)",
                             peer, addr, me, peer + 1, h->world - 1);
    case RLX_WIRE_REFUSE_TOKEN:
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d %s and rank %d %s: set the same RLX_DIST_TOKEN on every rank "
                             "(refused by rank %d at %s)",
                             peer, token_state(!has_token(t)), me, token_state(has_token(t)), peer, addr);
    case RLX_WIRE_REFUSE_REMOTE:
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d at %s refused rank %d's connection because it does not come from "
                             "loopback; %s",
                             peer, addr, me, rlx_tcp_remote_hint);
    case RLX_WIRE_REFUSE_PROOF:
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d at %s refused rank %d's proof of the token: the ranks use "
                             "different tokens (RLX_DIST_TOKEN differs)",
                             peer, addr, me);
    case RLX_WIRE_REFUSE_DUPLICATE:
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d at %s refused rank %d: a rank %d is already connected to it "
                             "(two processes started as rank %d?)",
                             peer, addr, me, me, me);
    default:
        return rlx_set_error(RLX_ERR_IO, "rank %d at %s refused rank %d's connection (reason %u)", peer, addr, me,
                             (unsigned)h->info);
    }
}

/* Receives the HEAD of the acceptor's next message and checks it is `magic` from protocol
 * version 2 (a REFUSE becomes its error). */
static rlx_status recv_answer(struct tcp_transport *t, int fd, int peer, const char *addr, const char *who,
                              uint32_t magic, const char *what, int64_t deadline, unsigned char *buf,
                              struct rlx_wire_head *h)
{
    size_t done;
    enum io_result r = rlx_tcp_recv_all(fd, buf, RLX_WIRE_HEAD_BYTES, deadline, &done);
    if (r != IO_OK) return rlx_tcp_io_error(r, t->timeout_ms, who, what, done, RLX_WIRE_HEAD_BYTES);
    *h = rlx_wire_head_decode(buf);
    if (h->magic == RLX_WIRE_REFUSE_MAGIC && h->version == RLX_TCP_PROTOCOL_VERSION)
        return refused_error(t, h, peer, addr);
    if (h->magic != magic && h->magic != RLX_WIRE_HELLO_MAGIC && h->magic != RLX_WIRE_REFUSE_MAGIC)
        return rlx_set_error(RLX_ERR_IO, "%s is not an rlx rank: its answer starts with 0x%08" PRIx32 " (%s)", who,
                             h->magic, what);
    if (h->version != RLX_TCP_PROTOCOL_VERSION)
        return rlx_set_error(RLX_ERR_IO,
                             "rank %d at %s sent protocol version %u, expected %d (every rank must run "
                             "the same rlx)",
                             peer, addr, (unsigned)h->version, RLX_TCP_PROTOCOL_VERSION);
    if (h->magic != magic)
        return rlx_set_error(RLX_ERR_IO, "%s answered out of turn: 0x%08" PRIx32 " (%s)", who, h->magic, what);
    if (h->world != (uint32_t)t->base.world)
        return rlx_set_error(RLX_ERR_IO,
                             "rank %" PRIu32 " runs with world size %" PRIu32 ", expected %d (answer "
                             "from %s to rank %d)",
                             h->rank, h->world, t->base.world, addr, t->base.rank);
    if (h->rank != (uint32_t)peer)
        return rlx_set_error(RLX_ERR_IO, "the listener of rank %d at %s answered as rank %" PRIu32, peer, addr,
                             h->rank);
    return RLX_OK;
}

static rlx_status send_msg(struct tcp_transport *t, int fd, const unsigned char *buf, size_t n, const char *who,
                           const char *what, int64_t deadline)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
    size_t done;
    enum io_result r = rlx_tcp_send_all(fd, &iov, 1, deadline, &done);
    return r == IO_OK ? RLX_OK : rlx_tcp_io_error(r, t->timeout_ms, who, what, done, n);
}

static rlx_status recv_msg(struct tcp_transport *t, int fd, unsigned char *buf, size_t n, const char *who,
                           const char *what, int64_t deadline)
{
    size_t done;
    enum io_result r = rlx_tcp_recv_all(fd, buf, n, deadline, &done);
    return r == IO_OK ? RLX_OK : rlx_tcp_io_error(r, t->timeout_ms, who, what, done, n);
}

/* The connecting side of the handshake with rank `peer` on fd (connected to addr, a name for
 * messages; fd already belongs to t->links[peer], which the caller closes on failure): HELLO_C,
 * HELLO_A; with a token PROOF_C, PROOF_A. */
rlx_status rlx_tcp_connector_handshake(struct tcp_transport *t, int peer, int fd, const char *addr, int64_t deadline)
{
    char who[LABEL_MAX], reached[ADDR_NAME_MAX];
    snprintf(who, sizeof who, "rank %d at %s", peer, addr);
    if (!has_token(t) && !t->allow_remote && !rlx_tcp_peer_is_loopback(fd, reached, sizeof reached))
        return rlx_set_error(RLX_ERR_INVALID, "rank %d's address %s led to %s, not a loopback address; %s", peer, addr,
                             reached, rlx_tcp_remote_hint);

    unsigned char hello_c[RLX_WIRE_MSG_BYTES], hello_a[RLX_WIRE_MSG_BYTES];
    struct rlx_wire_head h;
    RLX_TRY(make_hello(t, hello_c));
    RLX_TRY(send_msg(t, fd, hello_c, sizeof hello_c, who, "sending HELLO", deadline));
    RLX_TRY(recv_answer(t, fd, peer, addr, who, RLX_WIRE_HELLO_MAGIC, "receiving HELLO", deadline, hello_a, &h));
    RLX_TRY(recv_msg(t, fd, hello_a + RLX_WIRE_HEAD_BYTES, RLX_WIRE_NONCE_BYTES, who, "receiving HELLO", deadline));
    if ((h.info & RLX_WIRE_FLAG_TOKEN) != (has_token(t) ? RLX_WIRE_FLAG_TOKEN : 0))
        return rlx_set_error(RLX_ERR_IO, "rank %d %s and rank %d %s: set the same RLX_DIST_TOKEN on every rank", peer,
                             token_state(h.info & RLX_WIRE_FLAG_TOKEN), t->base.rank, token_state(has_token(t)));
    if (rlx_crypto_equal(hello_a + RLX_WIRE_HEAD_BYTES, hello_c + RLX_WIRE_HEAD_BYTES, RLX_WIRE_NONCE_BYTES))
        return rlx_set_error(RLX_ERR_IO, "%s answered with rank %d's own nonce (a reflected HELLO)", who, t->base.rank);
    if (!has_token(t)) return link_open(t, peer, fd, 1, hello_c, hello_a);

    unsigned char proof[RLX_WIRE_MSG_BYTES];
    RLX_TRY(make_proof(t, RLX_WIRE_LABEL_PROOF_C, hello_c, hello_a, proof));
    RLX_TRY(send_msg(t, fd, proof, sizeof proof, who, "sending the proof of the token", deadline));
    RLX_TRY(recv_answer(t, fd, peer, addr, who, RLX_WIRE_PROOF_MAGIC, "receiving the proof of the token", deadline,
                        proof, &h));
    RLX_TRY(recv_msg(t, fd, proof + RLX_WIRE_HEAD_BYTES, RLX_HMAC_BYTES, who, "receiving the proof of the token",
                     deadline));
    int ok = 0;
    RLX_TRY(proof_ok(t, RLX_WIRE_LABEL_PROOF_A, hello_c, hello_a, proof, &ok));
    if (!ok)
        return rlx_set_error(RLX_ERR_IO,
                             "%s failed to prove that it knows the token: it is not rank %d of this job "
                             "(a different RLX_DIST_TOKEN, or an impostor on that address)",
                             who, peer);
    return link_open(t, peer, fd, 1, hello_c, hello_a);
}

/* Connects to rank `peer` at addr and runs the handshake. */
rlx_status rlx_tcp_connect_peer(struct tcp_transport *t, int peer, const char *addr, int64_t deadline)
{
    int fd = -1;
    RLX_TRY(rlx_tcp_connect_once(addr, peer, deadline, t->timeout_ms, &fd));
    rlx_tcp_set_nodelay(fd);
    t->links[peer].fd = fd; /* owned by t from here: closed by tcp_close on any failure */
    return rlx_tcp_connector_handshake(t, peer, fd, addr, deadline);
}

/* ---------------------------------------------------------------------------------------------
 * Set-up, accepting side: every incoming handshake at once, from one poll() loop
 * ------------------------------------------------------------------------------------------- */

/* One incoming connection in its handshake. */
struct pending {
    int fd;
    int loopback;                              /* the peer's address is loopback */
    int want_proof;                            /* 0: HELLO_C expected; 1: PROOF_C */
    size_t got;                                /* bytes of in[] received */
    unsigned char in[RLX_WIRE_MSG_BYTES];      /* the message being received */
    unsigned char hello_c[RLX_WIRE_MSG_BYTES]; /* once received */
    unsigned char hello_a[RLX_WIRE_MSG_BYTES]; /* once sent */
    uint32_t rank;                             /* the rank HELLO_C claims */
    char from[ADDR_NAME_MAX];                  /* the peer's address */
};

enum step { STEP_MORE, STEP_DONE, STEP_DROPPED, STEP_FATAL };

/* Records and logs why a connection was refused (the set-up timeout error repeats the last). */
static void __attribute__((format(printf, 2, 3))) note_refusal(struct tcp_transport *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->last_refusal, sizeof t->last_refusal, fmt, ap);
    va_end(ap);
    t->refused++;
    rlx_log(RLX_LOG_WARN, "tcp: rank %d refused a connection during set-up: %s", t->base.rank, t->last_refusal);
}

/* Sends a handshake message from the poll loop without waiting: it is at most 48 bytes on a
 * socket that has sent at most 48 before, so it fits the send buffer or the peer is gone. */
static int send_now(int fd, const unsigned char *buf, size_t n)
{
    ssize_t s;
    do s = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (s < 0 && errno == EINTR);
    return s == (ssize_t)n;
}

/* Closes a refused connection after reading what its peer has already sent (a close with unread
 * data resets the connection, which could destroy our answer before the peer reads it). */
static void close_drained(int fd)
{
    unsigned char sink[256];
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
        ;
    close(fd);
}

/* Refuses p with a REFUSE message (reason why), closes it and records `text`. */
static enum step refuse(struct tcp_transport *t, struct pending *p, enum rlx_wire_refuse why, const char *text)
{
    unsigned char msg[RLX_WIRE_HEAD_BYTES];
    make_refuse(t, msg, why);
    (void)send_now(p->fd, msg, sizeof msg); /* best effort: the peer may be gone */
    close_drained(p->fd);
    note_refusal(t, "%s", text);
    return STEP_DROPPED;
}

static enum step drop_pending(struct tcp_transport *t, struct pending *p, const char *text)
{
    close_drained(p->fd);
    note_refusal(t, "%s", text);
    return STEP_DROPPED;
}

/* A complete HELLO_C: refuse it, or answer with HELLO_A (and, without a token, open the link). */
static enum step on_hello(struct tcp_transport *t, struct pending *p)
{
    int me = t->base.rank, world = t->base.world;
    struct rlx_wire_head h = rlx_wire_head_decode(p->in);
    int token = (h.info & RLX_WIRE_FLAG_TOKEN) != 0;
    char text[sizeof t->last_refusal];
    p->rank = h.rank;
    if (!has_token(t) && !t->allow_remote && !p->loopback) {
        snprintf(text, sizeof text,
                 "the peer at %s (claiming rank %" PRIu32 ") is not on loopback and rank %d has "
                 "no token (allow_remote is off)",
                 p->from, h.rank, me);
        return refuse(t, p, RLX_WIRE_REFUSE_REMOTE, text);
    }
    if (h.world != (uint32_t)world) {
        snprintf(text, sizeof text, "rank %" PRIu32 " runs with world size %" PRIu32 ", expected %d (HELLO from %s)",
                 h.rank, h.world, world, p->from);
        return refuse(t, p, RLX_WIRE_REFUSE_WORLD, text);
    }
    if (h.rank <= (uint32_t)me || h.rank >= (uint32_t)world) {
        snprintf(text, sizeof text, "a peer at %s says it is rank %" PRIu32 "; rank %d accepts only ranks %d..%d",
                 p->from, h.rank, me, me + 1, world - 1);
        return refuse(t, p, RLX_WIRE_REFUSE_RANK, text);
    }
    if (token != has_token(t)) {
        snprintf(text, sizeof text, "rank %" PRIu32 " (at %s) %s and rank %d %s", h.rank, p->from, token_state(token),
                 me, token_state(has_token(t)));
        return refuse(t, p, RLX_WIRE_REFUSE_TOKEN, text);
    }
    if (t->links[h.rank].fd >= 0) {
        snprintf(text, sizeof text, "rank %" PRIu32 " connected twice to rank %d (second time from %s)", h.rank, me,
                 p->from);
        return refuse(t, p, RLX_WIRE_REFUSE_DUPLICATE, text);
    }
    memcpy(p->hello_c, p->in, sizeof p->hello_c);
    if (make_hello(t, p->hello_a) != RLX_OK) return STEP_FATAL;
    if (!send_now(p->fd, p->hello_a, sizeof p->hello_a)) {
        snprintf(text, sizeof text, "could not answer the HELLO of rank %" PRIu32 " at %s: %s", h.rank, p->from,
                 strerror(errno));
        return drop_pending(t, p, text);
    }
    if (!has_token(t))
        return link_open(t, (int)h.rank, p->fd, 0, p->hello_c, p->hello_a) == RLX_OK ? STEP_DONE : STEP_FATAL;
    p->want_proof = 1;
    p->got = 0;
    return STEP_MORE;
}

/* A complete PROOF_C: check it, then answer with PROOF_A and open the link, or refuse. */
static enum step on_proof(struct tcp_transport *t, struct pending *p)
{
    char text[sizeof t->last_refusal];
    int ok = 0;
    if (proof_ok(t, RLX_WIRE_LABEL_PROOF_C, p->hello_c, p->hello_a, p->in, &ok) != RLX_OK) return STEP_FATAL;
    if (!ok) {
        snprintf(text, sizeof text,
                 "the peer at %s claiming rank %" PRIu32 " sent a wrong proof of the token (a "
                 "different RLX_DIST_TOKEN, or a replayed handshake)",
                 p->from, p->rank);
        return refuse(t, p, RLX_WIRE_REFUSE_PROOF, text);
    }
    if (t->links[p->rank].fd >= 0) {
        snprintf(text, sizeof text, "rank %" PRIu32 " connected twice to rank %d (second time from %s)", p->rank,
                 t->base.rank, p->from);
        return refuse(t, p, RLX_WIRE_REFUSE_DUPLICATE, text);
    }
    unsigned char proof[RLX_WIRE_MSG_BYTES];
    if (make_proof(t, RLX_WIRE_LABEL_PROOF_A, p->hello_c, p->hello_a, proof) != RLX_OK) return STEP_FATAL;
    if (!send_now(p->fd, proof, sizeof proof)) {
        snprintf(text, sizeof text, "could not send the proof to rank %" PRIu32 " at %s: %s", p->rank, p->from,
                 strerror(errno));
        return drop_pending(t, p, text);
    }
    return link_open(t, (int)p->rank, p->fd, 0, p->hello_c, p->hello_a) == RLX_OK ? STEP_DONE : STEP_FATAL;
}

/* Reads what p's peer has sent and acts on each complete message. */
static enum step pending_step(struct tcp_transport *t, struct pending *p)
{
    char text[sizeof t->last_refusal];
    for (;;) {
        size_t need = p->got < RLX_WIRE_HEAD_BYTES ? RLX_WIRE_HEAD_BYTES : RLX_WIRE_MSG_BYTES;
        ssize_t n = recv(p->fd, p->in + p->got, need - p->got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return STEP_MORE;
        if (n <= 0) {
            snprintf(text, sizeof text, "the peer at %s %s during its handshake (after %zu bytes of its %s)", p->from,
                     n == 0 || errno == ECONNRESET ? "closed the connection" : strerror(errno), p->got,
                     p->want_proof ? "proof" : "HELLO");
            return drop_pending(t, p, text);
        }
        p->got += (size_t)n;
        if (p->got == RLX_WIRE_HEAD_BYTES) {
            struct rlx_wire_head h = rlx_wire_head_decode(p->in);
            uint32_t want = p->want_proof ? RLX_WIRE_PROOF_MAGIC : RLX_WIRE_HELLO_MAGIC;
            if (h.magic != want) {
                snprintf(text, sizeof text,
                         p->want_proof ? "the peer at %s sent 0x%08" PRIx32 " where its proof of "
                                         "the token belonged"
                                       : "the peer at %s is not an rlx rank: it starts with 0x%08" PRIx32,
                         p->from, h.magic);
                return drop_pending(t, p, text);
            }
            if (h.version != RLX_TCP_PROTOCOL_VERSION) {
                /* Our HELLO tells it our version (a nonce reveals nothing); then it is dropped. */
                unsigned char hello[RLX_WIRE_MSG_BYTES];
                if (make_hello(t, hello) != RLX_OK) return STEP_FATAL;
                (void)send_now(p->fd, hello, sizeof hello);
                snprintf(text, sizeof text, "rank %" PRIu32 " (at %s) sent protocol version %u, expected %d", h.rank,
                         p->from, (unsigned)h.version, RLX_TCP_PROTOCOL_VERSION);
                return drop_pending(t, p, text);
            }
            if (p->want_proof && (h.rank != p->rank || h.world != (uint32_t)t->base.world)) {
                snprintf(text, sizeof text,
                         "the peer at %s claimed rank %" PRIu32 " (world %d) in its HELLO and rank %" PRIu32
                         " (world %" PRIu32 ") in its proof",
                         p->from, p->rank, t->base.world, h.rank, h.world);
                return drop_pending(t, p, text);
            }
        }
        if (p->got == RLX_WIRE_MSG_BYTES) return p->want_proof ? on_proof(t, p) : on_hello(t, p);
    }
}

/* The set-up timeout error: the ranks still missing, the last refusal, handshakes in progress. */
static rlx_status accept_timeout(const struct tcp_transport *t, int missing, int npend)
{
    int me = t->base.rank;
    char ranks[LABEL_MAX] = "", more[sizeof t->last_refusal + 96] = "";
    size_t used = 0;
    for (int r = me + 1; r < t->base.world && used + 12 < sizeof ranks; r++) {
        if (t->links[r].fd < 0)
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? ", " : "", r);
    }
    if (t->refused > 0)
        snprintf(more, sizeof more, " (it refused %d connection%s; the last: %s)", t->refused,
                 t->refused > 1 ? "s" : "", t->last_refusal);
    return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s: rank %d is still waiting for rank%s %s to connect%s%s",
                         t->timeout_ms / 1000.0, me, missing > 1 ? "s" : "", ranks, more,
                         npend > 0 ? "; a connection was still in its handshake" : "");
}

/* Accepts every rank above ours on lfd, running all handshakes at once; strays are refused. */
rlx_status rlx_tcp_accept_peers(struct tcp_transport *t, int lfd, int64_t deadline)
{
    int me = t->base.rank, missing = t->base.world - 1 - me, npend = 0;
    struct pending *pend = rlx_calloc(MAX_PENDING, sizeof *pend);
    struct pollfd *pfd = rlx_calloc(MAX_PENDING + 1, sizeof *pfd);
    rlx_status s = pend != NULL && pfd != NULL ? RLX_OK : RLX_ERR_NOMEM;
    while (s == RLX_OK && missing > 0) {
        int64_t left = deadline - rlx_tcp_now_ms();
        if (left <= 0) {
            s = accept_timeout(t, missing, npend);
            break;
        }
        pfd[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < npend; i++) pfd[1 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int rc = poll(pfd, (nfds_t)(1 + npend), rlx_tcp_poll_ms(left));
        if (rc < 0) {
            if (errno != EINTR)
                s = rlx_set_error(RLX_ERR_IO, "rank %d: waiting for connections failed: %s", me, strerror(errno));
            continue;
        }
        /* Handshakes in progress first, then compact away those that ended. */
        int kept = 0;
        for (int i = 0; i < npend; i++) {
            enum step st = STEP_MORE;
            if (s == RLX_OK && pfd[1 + i].revents != 0) st = pending_step(t, &pend[i]);
            if (st == STEP_FATAL) s = RLX_ERR_INTERNAL; /* the message is set by the failed crypto call */
            if (st == STEP_DONE) missing--;
            if (st == STEP_MORE || st == STEP_FATAL) pend[kept++] = pend[i];
        }
        npend = kept;
        if (s != RLX_OK || missing == 0 || (pfd[0].revents & POLLIN) == 0) continue;
        for (;;) {
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                /* A connection that failed before we took it (accept(2): treat like EAGAIN). */
                if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == ENETDOWN ||
                    errno == ENOPROTOOPT || errno == EHOSTDOWN || errno == ENONET || errno == EHOSTUNREACH ||
                    errno == EOPNOTSUPP || errno == ENETUNREACH)
                    continue;
                s = rlx_set_error(RLX_ERR_IO, "rank %d: accept failed: %s", me, strerror(errno));
                break;
            }
            if (npend == MAX_PENDING) {
                char text[sizeof t->last_refusal];
                snprintf(text, sizeof text,
                         "%d connections were in their handshake at once; dropped the oldest, "
                         "from %s",
                         MAX_PENDING, pend[0].from);
                (void)drop_pending(t, &pend[0], text);
                memmove(pend, pend + 1, sizeof *pend * (MAX_PENDING - 1));
                npend--;
            }
            rlx_tcp_set_nodelay(fd);
            rlx_tcp_set_reuseaddr(fd);
            struct pending *p = &pend[npend++];
            memset(p, 0, sizeof *p);
            p->fd = fd;
            p->loopback = rlx_tcp_peer_is_loopback(fd, p->from, sizeof p->from);
        }
    }
    for (int i = 0; i < npend; i++) {
        if (s == RLX_OK)
            rlx_log(RLX_LOG_WARN,
                    "tcp: rank %d closed a connection from %s still in its handshake once the mesh was "
                    "up",
                    me, pend[i].from);
        close(pend[i].fd);
    }
    free(pend);
    free(pfd);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * One incoming handshake on a socket the caller made (rlx_tcp_accept_fd, tcp_internal.h): the code
 * above without listening or the poll over many incoming connections
 * ------------------------------------------------------------------------------------------- */

rlx_status rlx_tcp_accept_one(struct tcp_transport *t, int fd, int *peer)
{
    struct pending p = {.fd = fd};
    p.loopback = rlx_tcp_peer_is_loopback(fd, p.from, sizeof p.from);
    int64_t deadline = rlx_tcp_now_ms() + t->timeout_ms;
    for (;;) {
        switch (pending_step(t, &p)) { /* reads what has arrived; waits below only when that is not enough */
        case STEP_MORE: break;
        case STEP_DONE: *peer = (int)p.rank; return RLX_OK;
        case STEP_DROPPED:
            return rlx_set_error(RLX_ERR_IO, "rank %d refused a connection: %s", t->base.rank, t->last_refusal);
        case STEP_FATAL: close(fd); return RLX_ERR_INTERNAL; /* the message is set by the failed crypto call */
        }
        int w = rlx_tcp_wait_fd(fd, POLLIN, deadline);
        if (w <= 0) {
            rlx_status s;
            if (w == 0)
                s = rlx_set_error(RLX_ERR_IO,
                                  "timed out after %.1f s: the peer at %s did not complete its handshake "
                                  "(%zu bytes of its %s)",
                                  t->timeout_ms / 1000.0, p.from, p.got, p.want_proof ? "proof" : "HELLO");
            else
                s = rlx_set_error(RLX_ERR_IO, "waiting for the handshake of the peer at %s failed: %s", p.from,
                                  strerror(errno));
            close(fd);
            return s;
        }
    }
}
