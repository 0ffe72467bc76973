/*
 * tcp_sock.h - the sockets under the TCP transport (tcp_sock.c), for tcp.c and tcp_handshake.c
 * only: times in milliseconds of CLOCK_MONOTONIC, deadlines absolute. Errors are set with
 * rlx_set_error; `rank` arguments only name the address in messages.
 */
#ifndef RLX_DIST_TCP_SOCK_H
#define RLX_DIST_TCP_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "core/core.h"

/* How a transfer ended (errno holds the cause of IO_ERRNO). */
enum io_result { IO_OK = 0, IO_TIMEOUT, IO_CLOSED, IO_ERRNO };

int64_t rlx_tcp_now_ms(void);
/* poll()'s timeout for the time left until a deadline (capped; > 0 when left > 0). */
int rlx_tcp_poll_ms(int64_t left);
/* 1 when fd has `events` (or an error or hang-up), 0 once the deadline passed, -1 when poll failed. */
int rlx_tcp_wait_fd(int fd, short events, int64_t deadline);

/* The n bytes (recv) or iov[0..cnt) (send; the array is modified) moved completely by the deadline,
 * fixed for the whole transfer; *done counts the bytes moved. */
enum io_result rlx_tcp_recv_all(int fd, void *buf, size_t n, int64_t deadline, size_t *done);
enum io_result rlx_tcp_send_all(int fd, struct iovec *iov, int cnt, int64_t deadline, size_t *done);
/* Sets the error of a failed transfer with `who` ("rank 2") while doing `what`. */
rlx_status rlx_tcp_io_error(enum io_result r, int timeout_ms, const char *who, const char *what, size_t done,
                            size_t total);

/* "host:port" or "[v6]:port" split into host (host_cap bytes) and port. */
rlx_status rlx_tcp_parse_addr(const char *addr, int rank, char *host, size_t host_cap, char port[8]);
/* Whether fd's peer is on loopback; its name goes to `name` (cap bytes). */
int rlx_tcp_peer_is_loopback(int fd, char *name, size_t cap);
/* The advice every "not on loopback" error ends with. */
extern const char rlx_tcp_remote_hint[];
/* Without a token and allow_remote: every address rank's name resolves to must be loopback. */
rlx_status rlx_tcp_check_loopback_addr(const char *addr, int rank);

/* Best effort: TCP_NODELAY; SO_REUSEADDR on an accepted connection. */
void rlx_tcp_set_nodelay(int fd);
void rlx_tcp_set_reuseaddr(int fd);
rlx_status rlx_tcp_set_nonblocking(int fd);
/* A non-blocking listening socket on addr, or an inherited one made usable here. */
rlx_status rlx_tcp_listen_on(const char *addr, int rank, int *out);
rlx_status rlx_tcp_adopt_listener(int fd, int rank);
/* A connected non-blocking socket to rank `peer` at addr, retrying refused or unreachable attempts
 * until the deadline (timeout_ms names it in the error). */
rlx_status rlx_tcp_connect_once(const char *addr, int peer, int64_t deadline, int timeout_ms, int *out);

#endif
