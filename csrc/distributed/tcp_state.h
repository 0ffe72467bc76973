/*
 * tcp_state.h - the TCP transport's state, shared by tcp.c (frames, the ops, creation) and
 * tcp_handshake.c (the set-up handshakes); nothing outside csrc/distributed/tcp*.c includes it.
 */
#ifndef RLX_DIST_TCP_STATE_H
#define RLX_DIST_TCP_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "distributed/auth.h"
#include "rlx/dist.h"

/* The connection to one peer. */
struct link {
    int fd;                                 /* -1 for self, before set-up, and after a drop */
    unsigned char send_key[RLX_HMAC_BYTES]; /* frame MAC key of frames we send (token only) */
    unsigned char recv_key[RLX_HMAC_BYTES]; /* ... of frames we receive */
    uint64_t send_seq, recv_seq;            /* frames sent / received so far (the MAC's counter) */
};

struct tcp_transport {
    struct rlx_transport base;
    struct link *links;     /* (world) */
    size_t max_bytes;       /* largest payload accepted or sent */
    int timeout_ms;         /* the set-up deadline, then each message's */
    int allow_remote;       /* without a token, accept non-loopback peers too */
    unsigned char *token;   /* owned copy of the token (the HMAC key), NULL without one */
    size_t token_len;       /* > 0 when token != NULL */
    struct rlx_hmac *hmac;  /* the handshake's proofs and key derivation, and every frame MAC */
    int refused;            /* connections refused during set-up */
    char last_refusal[256]; /* why the last one was */
};

static inline int has_token(const struct tcp_transport *t) { return t->token != NULL; }

/* tcp_handshake.c: connecting to rank `peer` at addr and running the handshake (the socket is t's
 * from the connect on: tcp_close closes it on failure); accepting every rank above ours on lfd. */
rlx_status rlx_tcp_connect_peer(struct tcp_transport *t, int peer, const char *addr, int64_t deadline);
rlx_status rlx_tcp_accept_peers(struct tcp_transport *t, int lfd, int64_t deadline);
/* tcp_handshake.c, for tcp_internal.h's entry points: the accepting side of one handshake on fd
 * (non-blocking; consumed: the link to *peer, or closed); the connecting side with rank `peer` on
 * fd (connected to addr, a name for messages; fd already t->links[peer], closed by the caller on
 * failure). */
rlx_status rlx_tcp_accept_one(struct tcp_transport *t, int fd, int *peer);
rlx_status rlx_tcp_connector_handshake(struct tcp_transport *t, int peer, int fd, const char *addr, int64_t deadline);

#endif
