/*
 * tcp_internal.h - entry points of the TCP transport (tcp.c, tcp_handshake.c) for its tests and
 * its fuzz harness (tests/c/test_tcp.c, tests/fuzz/tcp_wire.c), not part of the public API
 * (rlx/dist.h) and not exported by the Python extension. They run the transport's own handshake
 * and frame code on one socket the caller made (a socketpair, say), so that a test can play the
 * peer byte by byte: no listening, no address resolution, no connect retries, no poll over several
 * incoming connections.
 *
 * The address policy still applies: without a token and without allow_remote, a socket whose peer
 * is not on loopback (an AF_UNIX socketpair, for one) is refused (the acceptor answers
 * REFUSE_REMOTE; the connector fails before sending anything).
 */
#ifndef RLX_DIST_TCP_INTERNAL_H
#define RLX_DIST_TCP_INTERNAL_H

#include <stdint.h>

#include "rlx/dist.h"

/* A TCP transport of `rank` in `world` (>= 2) with no connection yet: every send or recv fails
 * with RLX_ERR_IO until a link is opened below. opts as for rlx_tcp_transport_create; timeout_ms
 * bounds each handshake below and then each message. Free it with its ops->close. */
rlx_status rlx_tcp_transport_unconnected(int rank, int world, const struct rlx_tcp_opts *opts,
                                         struct rlx_transport **out);

/* The accepting side of one handshake on fd, a connected stream socket (made non-blocking here).
 * fd is consumed: on RLX_OK it is the link to *peer (the rank the connector proved it is);
 * otherwise it is closed and the error says why: RLX_ERR_IO for a refused, dropped or timed-out
 * handshake (the same refusal the mesh logs: answered with REFUSE, or with our HELLO for another
 * protocol version, or with nothing), RLX_ERR_INTERNAL when the crypto library failed. */
rlx_status rlx_tcp_accept_fd(struct rlx_transport *t, int fd, int *peer);

/* The connecting side of one handshake with rank `peer` (< this rank, not yet linked) on fd.
 * fd is consumed: on RLX_OK it is the link to peer; otherwise it is closed and the error says what
 * the acceptor's answer got wrong (RLX_ERR_IO), or RLX_ERR_INVALID for bad arguments or a
 * non-loopback peer without a token or allow_remote. */
rlx_status rlx_tcp_connect_fd(struct rlx_transport *t, int peer, int fd);

/* 1 when the link to peer is open, 0 when it is not (never opened, or closed after an error), -1
 * when t is not a TCP transport or peer is out of range. *received and *sent (either may be NULL)
 * get the frames received and sent on the link so far: the sequence numbers of its frame MACs. */
int rlx_tcp_link_info(struct rlx_transport *t, int peer, uint64_t *received, uint64_t *sent);

#endif
