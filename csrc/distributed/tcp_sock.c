/*
 * tcp_sock.c - the sockets under the TCP transport (tcp.c, tcp_handshake.c): waiting with a
 * deadline, moving bytes with one deadline for the whole transfer, addresses and the loopback
 * policy's checks, listening and connecting. Every socket is non-blocking and every wait is a
 * poll() for the time left; EINTR restarts the wait with the remaining time; sends use
 * MSG_NOSIGNAL, so a vanished peer is an error, never a SIGPIPE. Never prints.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "distributed/auth.h"
#include "distributed/tcp_sock.h"

#define LISTEN_BACKLOG 128 /* the kernel caps it at net.core.somaxconn */

/* ---------------------------------------------------------------------------------------------
 * Time and waiting
 * ------------------------------------------------------------------------------------------- */

int64_t rlx_tcp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* poll()'s timeout for the time left until deadline (capped; > 0 when left > 0). */
int rlx_tcp_poll_ms(int64_t left) { return left > 1000000 ? 1000000 : (int)left; }

/* Waits until fd has `events` (or an error/hangup, which the next syscall reports), or until
 * deadline. Returns 1 ready, 0 deadline passed, -1 poll failed (errno set). EINTR-safe. */
int rlx_tcp_wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - rlx_tcp_now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, rlx_tcp_poll_ms(left));
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

static void sleep_ms(int64_t ms)
{
    if (ms > 0) poll(NULL, 0, (int)ms); /* an early wake-up by a signal only shortens one retry pause */
}

/* ---------------------------------------------------------------------------------------------
 * Moving bytes. `deadline` is absolute and fixed for the whole transfer: progress never extends
 * it. *done counts the bytes moved.
 * ------------------------------------------------------------------------------------------- */

enum io_result rlx_tcp_recv_all(int fd, void *buf, size_t n, int64_t deadline, size_t *done)
{
    *done = 0;
    while (*done < n) {
        ssize_t got = recv(fd, (char *)buf + *done, n - *done, 0);
        if (got > 0) {
            *done += (size_t)got;
            continue;
        }
        if (got == 0) return IO_CLOSED;
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return IO_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERRNO;
        int w = rlx_tcp_wait_fd(fd, POLLIN, deadline);
        if (w == 0) return IO_TIMEOUT;
        if (w < 0) return IO_ERRNO;
    }
    return IO_OK;
}

/* Sends iov[0..cnt) completely (the array is modified). */
enum io_result rlx_tcp_send_all(int fd, struct iovec *iov, int cnt, int64_t deadline, size_t *done)
{
    *done = 0;
    while (cnt > 0 && iov[0].iov_len == 0) {
        iov++;
        cnt--;
    }
    while (cnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (sent >= 0) {
            size_t s = (size_t)sent;
            *done += s;
            while (cnt > 0 && s >= iov[0].iov_len) {
                s -= iov[0].iov_len;
                iov++;
                cnt--;
            }
            if (cnt > 0) {
                iov[0].iov_base = (char *)iov[0].iov_base + s;
                iov[0].iov_len -= s;
            }
            continue;
        }
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) return IO_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERRNO;
        int w = rlx_tcp_wait_fd(fd, POLLOUT, deadline);
        if (w == 0) return IO_TIMEOUT;
        if (w < 0) return IO_ERRNO;
    }
    return IO_OK;
}

/* Sets the error for a failed transfer with `who` ("rank 2") while doing `what`. */
rlx_status rlx_tcp_io_error(enum io_result r, int timeout_ms, const char *who, const char *what, size_t done,
                            size_t total)
{
    switch (r) {
    case IO_TIMEOUT:
        if (done > 0)
            return rlx_set_error(RLX_ERR_IO,
                                 "timed out after %.1f s waiting for %s (%s; stalled after %zu of %zu bytes)",
                                 timeout_ms / 1000.0, who, what, done, total);
        return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s waiting for %s (%s)", timeout_ms / 1000.0, who, what);
    case IO_CLOSED:
        if (done > 0 && done < total)
            return rlx_set_error(RLX_ERR_IO, "%s closed the connection in the middle of %s (%zu of %zu bytes)", who,
                                 what, done, total);
        return rlx_set_error(RLX_ERR_IO, "%s closed the connection (%s)", who, what);
    default: return rlx_set_error(RLX_ERR_IO, "connection to %s failed (%s): %s", who, what, strerror(errno));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Addresses and sockets
 * ------------------------------------------------------------------------------------------- */

/* Splits "host:port" or "[v6]:port" into host and port strings. */
rlx_status rlx_tcp_parse_addr(const char *addr, int rank, char *host, size_t host_cap, char port[8])
{
    const char *colon = addr != NULL ? strrchr(addr, ':') : NULL;
    if (colon == NULL)
        return rlx_set_error(RLX_ERR_INVALID, "address of rank %d is %s%s%s, expected \"host:port\"", rank,
                             addr ? "\"" : "", addr ? addr : "missing", addr ? "\"" : "");
    const char *h = addr;
    size_t hlen = (size_t)(colon - addr);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (hlen == 0 || hlen >= host_cap || colon[1] == '\0' || *end != '\0' || errno != 0 || p < 1 || p > 65535)
        return rlx_set_error(RLX_ERR_INVALID, "address of rank %d is \"%s\", expected \"host:port\" (port 1..65535)",
                             rank, addr);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    snprintf(port, 8, "%ld", p);
    return RLX_OK;
}

/* "127.0.0.1:5000" for a socket address (or "an unknown address", or "a non-IP socket": glibc names
 * an AF_UNIX peer "localhost", which would read like loopback). */
static void addr_name(const struct sockaddr_storage *ss, socklen_t len, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN + 2] = "?";
    char port[8] = "?";
    if (ss->ss_family != AF_INET && ss->ss_family != AF_INET6)
        snprintf(out, cap, "a non-IP socket (address family %d)", (int)ss->ss_family);
    else if (getnameinfo((const struct sockaddr *)ss, len, host, sizeof host, port, sizeof port,
                         NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(out, cap, "%s%s%s:%s", ss->ss_family == AF_INET6 ? "[" : "", host,
                 ss->ss_family == AF_INET6 ? "]" : "", port);
    else
        snprintf(out, cap, "an unknown address");
}

/* Whether fd's peer is on loopback; its name goes to `name` (cap bytes). */
int rlx_tcp_peer_is_loopback(int fd, char *name, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(name, cap, "an unknown address");
        return 0;
    }
    addr_name(&ss, len, name, cap);
    return rlx_sockaddr_is_loopback((const struct sockaddr *)&ss, len);
}

const char rlx_tcp_remote_hint[] = "without a token (RLX_DIST_TOKEN) the TCP mesh stays on loopback: set the same "
                                   "token on every rank (recommended), or opt in with allow_remote "
                                   "(RLX_DIST_ALLOW_REMOTE=1)";

/* Without a token and allow_remote, every address a peer's name resolves to must be loopback. A
 * name that does not resolve now is left to rlx_tcp_connect_once to report. */
rlx_status rlx_tcp_check_loopback_addr(const char *addr, int rank)
{
    char host[256], port[8];
    RLX_TRY(rlx_tcp_parse_addr(addr, rank, host, sizeof host, port));
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0) return RLX_OK;
    rlx_status s = RLX_OK;
    for (struct addrinfo *ai = res; ai != NULL && s == RLX_OK; ai = ai->ai_next) {
        if (!rlx_sockaddr_is_loopback(ai->ai_addr, ai->ai_addrlen))
            s = rlx_set_error(RLX_ERR_INVALID, "the address of rank %d, %s, is not a loopback address; %s", rank, addr,
                              rlx_tcp_remote_hint);
    }
    freeaddrinfo(res);
    return s;
}

void rlx_tcp_set_nodelay(int fd)
{
    int one = 1;
    /* Best effort: a socket without it is slower, not wrong. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* An accepted connection has its listener's port; left in TIME_WAIT after the job, it would keep
 * that port from being bound again for a minute (a restarted job on the same addresses) unless it
 * carries SO_REUSEADDR itself. Setting it on the listener is not enough: a connection the kernel
 * completed before (a peer faster than this rank's start-up, with a listener made by someone else)
 * was cloned without it. Best effort; Linux never lets two sockets listen on one port with it. */
void rlx_tcp_set_reuseaddr(int fd)
{
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
}

rlx_status rlx_tcp_listen_on(const char *addr, int rank, int *out)
{
    char host[256], port[8];
    RLX_TRY(rlx_tcp_parse_addr(addr, rank, host, sizeof host, port));
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) return rlx_set_error(RLX_ERR_IO, "rank %d cannot listen on %s: %s", rank, addr, gai_strerror(gai));
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return rlx_set_error(RLX_ERR_IO, "rank %d cannot listen on %s: %s", rank, addr, strerror(err));
    *out = fd;
    return RLX_OK;
}

/* Makes an inherited listening socket usable here (non-blocking; checked to be listening; its
 * backlog raised so that strays cannot crowd the real peers out of it). */
rlx_status rlx_tcp_adopt_listener(int fd, int rank)
{
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
        return rlx_set_error(RLX_ERR_INVALID, "rank %d: listen_fd %d is not a listening socket", rank, fd);
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return rlx_set_error(RLX_ERR_IO, "rank %d: cannot configure listen_fd %d: %s", rank, fd, strerror(errno));
    (void)listen(fd, LISTEN_BACKLOG); /* best effort: a smaller backlog still works */
    return RLX_OK;
}

/* Connects to rank `peer` at addr, retrying refused/unreachable attempts until deadline. */
rlx_status rlx_tcp_connect_once(const char *addr, int peer, int64_t deadline, int timeout_ms, int *out)
{
    char host[256], port[8];
    RLX_TRY(rlx_tcp_parse_addr(addr, peer, host, sizeof host, port));
    int last_err = 0;
    int64_t pause = 20;
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res = NULL;
        int gai = getaddrinfo(host, port, &hints, &res);
        if (gai != 0 && gai != EAI_AGAIN)
            return rlx_set_error(RLX_ERR_IO, "cannot resolve the address %s of rank %d: %s", addr, peer,
                                 gai_strerror(gai));
        for (struct addrinfo *ai = gai == 0 ? res : NULL; ai != NULL; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                last_err = errno;
                continue;
            }
            int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
            if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
                int w = rlx_tcp_wait_fd(fd, POLLOUT, deadline);
                int soerr = 0;
                socklen_t len = sizeof soerr;
                if (w > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0)
                    rc = 0;
                else
                    errno = w == 0 ? ETIMEDOUT : (w < 0 ? errno : soerr);
            }
            if (rc == 0) {
                freeaddrinfo(res);
                *out = fd;
                return RLX_OK;
            }
            last_err = errno;
            close(fd);
        }
        if (res != NULL) freeaddrinfo(res);
        int64_t left = deadline - rlx_tcp_now_ms();
        if (left <= 0)
            return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s connecting to rank %d at %s (last error: %s)",
                                 timeout_ms / 1000.0, peer, addr,
                                 gai == EAI_AGAIN ? gai_strerror(gai) : strerror(last_err ? last_err : ETIMEDOUT));
        sleep_ms(pause < left ? pause : left);
        pause = pause * 2 > 500 ? 500 : pause * 2;
    }
}

rlx_status rlx_tcp_set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return rlx_set_error(RLX_ERR_IO, "cannot make fd %d non-blocking: %s", fd, strerror(errno));
    return RLX_OK;
}
