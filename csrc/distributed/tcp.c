/*
 * tcp.c - the TCP mesh transport of rlx/dist.h: one socket between every pair of ranks, framed
 * messages (wire.h), broadcast and barrier built from point-to-point frames.
 *
 * Set-up: rank r binds addrs[r] (or takes over listen_fd), connects to every lower rank (retrying
 * until the deadline: the peer may not listen yet), then accepts every higher rank. The connecting
 * side sends its HELLO first; the accepting side reads it, answers with its own (unless the magic
 * is not rlx's) and then checks it, so a mismatch is reported on both sides when both are ranks.
 * The first bad HELLO fails the whole set-up. The listener is closed once the mesh is up, so no
 * port stays open. listen_fd is consumed: it is closed before create returns, on success or not.
 *
 * Timeouts: the set-up as a whole has one deadline (timeout_ms). After that every call waits at
 * most timeout_ms for progress on a socket (an inactivity timeout: a large message that keeps
 * moving is not cut off; a peer that stops is reported). Every socket is non-blocking and every
 * wait is a poll(); EINTR restarts the wait with the remaining time; sends use MSG_NOSIGNAL, so a
 * vanished peer is an error, never a SIGPIPE.
 *
 * Frames and errors: a frame above max_message_bytes is refused without reading its payload, and
 * the connection to that peer is closed (skipping gigabytes of payload would outlast any timeout).
 * A frame larger than the receive buffer but within max_message_bytes, and a frame with an
 * unexpected tag, are read and discarded, so the stream stays in step. Any error that leaves the
 * stream in an unknown place (a frame cut short, bad magic, a timeout after part of a frame) also
 * closes that connection; later calls naming that peer fail at once with RLX_ERR_IO. A timeout
 * before the first byte of a frame leaves the connection usable.
 *
 * Never prints, never raises signals, never blocks past the timeout.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
#include "distributed/wire.h"
#include "rlx/dist.h"

#define DEFAULT_MAX_BYTES ((size_t)1 << 30)
#define DEFAULT_TIMEOUT_MS 60000
#define LABEL_MAX 160

struct tcp_transport {
    struct rlx_transport base;
    int *fds;            /* (world) socket to each peer; -1 for self and, after set-up, for a dropped one */
    size_t max_bytes;    /* largest payload accepted or sent */
    int timeout_ms;      /* inactivity bound of every wait after set-up */
    uint64_t token_hash; /* rlx_wire_token_hash(opts->token) */
};

/* ---------------------------------------------------------------------------------------------
 * Time and waiting
 * ------------------------------------------------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd has `events` (or an error/hangup, which the next syscall reports), or until
 * deadline. Returns 1 ready, 0 deadline passed, -1 poll failed (errno set). EINTR-safe. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

static void sleep_ms(int64_t ms)
{
    if (ms > 0)
        poll(NULL, 0, (int)ms); /* an early wake-up by a signal only shortens one retry pause */
}

/* ---------------------------------------------------------------------------------------------
 * Moving bytes. `deadline` bounds the wait; when extend_ms > 0 every bit of progress moves the
 * deadline to now + extend_ms (the inactivity timeout). *done counts the bytes moved.
 * ------------------------------------------------------------------------------------------- */

enum io_result { IO_OK = 0, IO_TIMEOUT, IO_CLOSED, IO_ERRNO };

static enum io_result recv_all(int fd, void *buf, size_t n, int64_t deadline, int extend_ms, size_t *done)
{
    *done = 0;
    while (*done < n) {
        ssize_t got = recv(fd, (char *)buf + *done, n - *done, 0);
        if (got > 0) {
            *done += (size_t)got;
            if (extend_ms > 0)
                deadline = now_ms() + extend_ms;
            continue;
        }
        if (got == 0)
            return IO_CLOSED;
        if (errno == EINTR)
            continue;
        if (errno == ECONNRESET)
            return IO_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return IO_ERRNO;
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0)
            return IO_TIMEOUT;
        if (w < 0)
            return IO_ERRNO;
    }
    return IO_OK;
}

/* Sends iov[0..cnt) completely (the array is modified). */
static enum io_result send_all(int fd, struct iovec *iov, int cnt, int64_t deadline, int extend_ms, size_t *done)
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
            if (extend_ms > 0 && s > 0)
                deadline = now_ms() + extend_ms;
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
        if (errno == EINTR)
            continue;
        if (errno == EPIPE || errno == ECONNRESET)
            return IO_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return IO_ERRNO;
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w == 0)
            return IO_TIMEOUT;
        if (w < 0)
            return IO_ERRNO;
    }
    return IO_OK;
}

/* Sets the error for a failed transfer with `who` ("rank 2") while doing `what`. */
static rlx_status io_error(enum io_result r, int timeout_ms, const char *who, const char *what, size_t done,
                           size_t total)
{
    switch (r) {
    case IO_TIMEOUT:
        if (done > 0)
            return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s waiting for %s (%s; stalled after %zu of %zu bytes)",
                                 timeout_ms / 1000.0, who, what, done, total);
        return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s waiting for %s (%s)", timeout_ms / 1000.0, who, what);
    case IO_CLOSED:
        if (done > 0 && done < total)
            return rlx_set_error(RLX_ERR_IO, "%s closed the connection in the middle of %s (%zu of %zu bytes)", who,
                                 what, done, total);
        return rlx_set_error(RLX_ERR_IO, "%s closed the connection (%s)", who, what);
    default:
        return rlx_set_error(RLX_ERR_IO, "connection to %s failed (%s): %s", who, what, strerror(errno));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Addresses and sockets
 * ------------------------------------------------------------------------------------------- */

/* Splits "host:port" or "[v6]:port" into host and port strings. */
static rlx_status parse_addr(const char *addr, int rank, char *host, size_t host_cap, char port[8])
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

/* "127.0.0.1:5000" for a socket's peer (or "an unknown address"). */
static void peer_name(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[INET6_ADDRSTRLEN + 2] = "?";
    char port[8] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0 &&
        getnameinfo((struct sockaddr *)&ss, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(out, cap, "%s%s%s:%s", ss.ss_family == AF_INET6 ? "[" : "", host, ss.ss_family == AF_INET6 ? "]" : "",
                 port);
    else
        snprintf(out, cap, "an unknown address");
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* Best effort: a socket without it is slower, not wrong. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static rlx_status listen_on(const char *addr, int rank, int world, int *out)
{
    char host[256], port[8];
    RLX_TRY(parse_addr(addr, rank, host, sizeof host, port));
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0)
        return rlx_set_error(RLX_ERR_IO, "rank %d cannot listen on %s: %s", rank, addr, gai_strerror(gai));
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
            listen(fd, world) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return rlx_set_error(RLX_ERR_IO, "rank %d cannot listen on %s: %s", rank, addr, strerror(err));
    *out = fd;
    return RLX_OK;
}

/* Makes an inherited listening socket usable here (non-blocking; checked to be listening). */
static rlx_status adopt_listener(int fd, int rank)
{
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
        return rlx_set_error(RLX_ERR_INVALID, "rank %d: listen_fd %d is not a listening socket", rank, fd);
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return rlx_set_error(RLX_ERR_IO, "rank %d: cannot configure listen_fd %d: %s", rank, fd, strerror(errno));
    return RLX_OK;
}

/* ---------------------------------------------------------------------------------------------
 * HELLO
 * ------------------------------------------------------------------------------------------- */

static rlx_status send_hello(struct tcp_transport *t, int fd, const char *who, int64_t deadline)
{
    unsigned char buf[sizeof(struct rlx_wire_hello)];
    rlx_wire_hello_encode(buf, RLX_TCP_PROTOCOL_VERSION, (uint32_t)t->base.rank, (uint32_t)t->base.world,
                          t->token_hash);
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    size_t done;
    enum io_result r = send_all(fd, &iov, 1, deadline, 0, &done);
    return r == IO_OK ? RLX_OK : io_error(r, t->timeout_ms, who, "sending HELLO", done, sizeof buf);
}

static rlx_status recv_hello(struct tcp_transport *t, int fd, const char *who, int64_t deadline,
                             struct rlx_wire_hello *out)
{
    unsigned char buf[sizeof(struct rlx_wire_hello)];
    size_t done;
    enum io_result r = recv_all(fd, buf, sizeof buf, deadline, 0, &done);
    if (r != IO_OK)
        return io_error(r, t->timeout_ms, who, "receiving HELLO", done, sizeof buf);
    *out = rlx_wire_hello_decode(buf);
    return RLX_OK;
}

static rlx_status check_magic(const struct rlx_wire_hello *h, const char *who)
{
    if (h->magic != RLX_WIRE_HELLO_MAGIC)
        return rlx_set_error(RLX_ERR_IO, "%s is not an rlx rank: its HELLO starts with 0x%08" PRIx32
                             ", expected 0x%08x (\"RLXH\")", who, h->magic, RLX_WIRE_HELLO_MAGIC);
    return RLX_OK;
}

/* Checks a HELLO (magic already checked). expect_rank >= 0: it must be that rank; else any rank
 * above ours. `from` says where it came from. */
static rlx_status check_hello(const struct tcp_transport *t, const struct rlx_wire_hello *h, int expect_rank,
                              const char *from)
{
    int me = t->base.rank, world = t->base.world;
    if (h->version != RLX_TCP_PROTOCOL_VERSION)
        return rlx_set_error(RLX_ERR_IO, "rank %" PRIu32 " sent protocol version %u, expected %d (HELLO from %s to rank %d)",
                             h->rank, (unsigned)h->version, RLX_TCP_PROTOCOL_VERSION, from, me);
    if (h->world != (uint32_t)world)
        return rlx_set_error(RLX_ERR_IO, "rank %" PRIu32 " runs with world size %" PRIu32 ", expected %d (HELLO from %s to rank %d)",
                             h->rank, h->world, world, from, me);
    if (expect_rank >= 0 && h->rank != (uint32_t)expect_rank)
        return rlx_set_error(RLX_ERR_IO, "the listener of rank %d at %s answered as rank %" PRIu32, expect_rank, from,
                             h->rank);
    if (expect_rank < 0 && (h->rank <= (uint32_t)me || h->rank >= (uint32_t)world))
        return rlx_set_error(RLX_ERR_IO, "a peer at %s says it is rank %" PRIu32 "; rank %d accepts only ranks %d..%d",
                             from, h->rank, me, me + 1, world - 1);
    if (h->token_hash != t->token_hash)
        return rlx_set_error(RLX_ERR_IO, "rank %" PRIu32 " uses a different token than rank %d (RLX_DIST_TOKEN differs; HELLO from %s)",
                             h->rank, me, from);
    return RLX_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Set-up: connect down, accept up
 * ------------------------------------------------------------------------------------------- */

/* Connects to rank `peer` at addr, retrying refused/unreachable attempts until deadline. */
static rlx_status connect_once(const char *addr, int peer, int64_t deadline, int timeout_ms, int *out)
{
    char host[256], port[8];
    RLX_TRY(parse_addr(addr, peer, host, sizeof host, port));
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
                int w = wait_fd(fd, POLLOUT, deadline);
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
        if (res != NULL)
            freeaddrinfo(res);
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s connecting to rank %d at %s (last error: %s)",
                                 timeout_ms / 1000.0, peer, addr,
                                 gai == EAI_AGAIN ? gai_strerror(gai) : strerror(last_err ? last_err : ETIMEDOUT));
        sleep_ms(pause < left ? pause : left);
        pause = pause * 2 > 500 ? 500 : pause * 2;
    }
}

static rlx_status connect_peer(struct tcp_transport *t, int peer, const char *addr, int64_t deadline)
{
    int fd = -1;
    RLX_TRY(connect_once(addr, peer, deadline, t->timeout_ms, &fd));
    set_nodelay(fd);
    t->fds[peer] = fd; /* owned by t from here: freed by close on any failure */
    char who[LABEL_MAX];
    snprintf(who, sizeof who, "rank %d at %s", peer, addr);
    RLX_TRY(send_hello(t, fd, who, deadline));
    struct rlx_wire_hello h;
    RLX_TRY(recv_hello(t, fd, who, deadline, &h));
    RLX_TRY(check_magic(&h, who));
    return check_hello(t, &h, peer, addr);
}

/* Accepts every rank above ours on lfd. */
static rlx_status accept_peers(struct tcp_transport *t, int lfd, int64_t deadline)
{
    int me = t->base.rank, world = t->base.world;
    for (int pending = world - 1 - me; pending > 0;) {
        int w = wait_fd(lfd, POLLIN, deadline);
        if (w < 0)
            return rlx_set_error(RLX_ERR_IO, "rank %d: waiting for connections failed: %s", me, strerror(errno));
        if (w == 0) {
            char missing[LABEL_MAX] = "";
            size_t used = 0;
            for (int r = me + 1; r < world && used + 12 < sizeof missing; r++) {
                if (t->fds[r] < 0)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", r);
            }
            return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s: rank %d is still waiting for rank%s %s to connect",
                                 t->timeout_ms / 1000.0, me, pending > 1 ? "s" : "", missing);
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
                continue;
            return rlx_set_error(RLX_ERR_IO, "rank %d: accept failed: %s", me, strerror(errno));
        }
        set_nodelay(fd);
        char from[LABEL_MAX], who[LABEL_MAX + 32];
        peer_name(fd, from, sizeof from);
        snprintf(who, sizeof who, "the peer at %s", from);
        struct rlx_wire_hello h;
        rlx_status s = recv_hello(t, fd, who, deadline, &h);
        if (s == RLX_OK)
            s = check_magic(&h, who);
        if (s == RLX_OK) /* answer before judging, so that a mismatched rank reports it too */
            s = send_hello(t, fd, who, deadline);
        if (s == RLX_OK)
            s = check_hello(t, &h, -1, from);
        if (s == RLX_OK && t->fds[h.rank] >= 0)
            s = rlx_set_error(RLX_ERR_IO, "rank %" PRIu32 " connected twice to rank %d (second time from %s)", h.rank,
                              me, from);
        if (s != RLX_OK) {
            close(fd);
            return s;
        }
        t->fds[h.rank] = fd;
        pending--;
    }
    return RLX_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------------- */

static struct tcp_transport *tcp_of(struct rlx_transport *base) { return (struct tcp_transport *)base; }

/* Closes the connection to peer after an error that leaves its stream in an unknown place. */
static void drop(struct tcp_transport *t, int peer)
{
    if (t->fds[peer] >= 0)
        close(t->fds[peer]);
    t->fds[peer] = -1;
}

/* The socket to peer, or an error saying why there is none. `verb` names the call. */
static rlx_status peer_fd(struct tcp_transport *t, int peer, const char *verb, int *fd)
{
    if (peer < 0 || peer >= t->base.world)
        return rlx_set_error(RLX_ERR_INVALID, "%s: rank %d is out of range (world %d)", verb, peer, t->base.world);
    if (peer == t->base.rank)
        return rlx_set_error(RLX_ERR_INVALID, "%s: rank %d cannot message itself", verb, peer);
    if (t->fds[peer] < 0)
        return rlx_set_error(RLX_ERR_IO, "%s: the connection from rank %d to rank %d was closed after an earlier error",
                             verb, t->base.rank, peer);
    *fd = t->fds[peer];
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

static rlx_status send_frame(struct tcp_transport *t, int dst, uint32_t tag, const void *data, size_t bytes,
                             const char *verb)
{
    int fd;
    RLX_TRY(peer_fd(t, dst, verb, &fd));
    unsigned char head[sizeof(struct rlx_wire_frame)];
    rlx_wire_frame_encode(head, tag, (uint64_t)bytes);
    struct iovec iov[2] = {{.iov_base = head, .iov_len = sizeof head}, {.iov_base = (void *)data, .iov_len = bytes}};
    size_t done;
    enum io_result r = send_all(fd, iov, 2, now_ms() + t->timeout_ms, t->timeout_ms, &done);
    if (r == IO_OK)
        return RLX_OK;
    char tagt[32], who[32], what[96];
    tag_text(tag, tagt, sizeof tagt);
    snprintf(who, sizeof who, "rank %d", dst);
    snprintf(what, sizeof what, "%s: sending a %zu-byte message with %s", verb, bytes, tagt);
    rlx_status s = io_error(r, t->timeout_ms, who, what, done, sizeof head + bytes);
    if (!(r == IO_TIMEOUT && done == 0))
        drop(t, dst);
    return s;
}

/* Reads and throws away n payload bytes from src. */
static enum io_result discard(struct tcp_transport *t, int fd, uint64_t n, size_t *done_out)
{
    unsigned char sink[16384];
    uint64_t left = n;
    *done_out = 0;
    while (left > 0) {
        size_t chunk = left < sizeof sink ? (size_t)left : sizeof sink, done;
        enum io_result r = recv_all(fd, sink, chunk, now_ms() + t->timeout_ms, t->timeout_ms, &done);
        *done_out += done;
        if (r != IO_OK)
            return r;
        left -= chunk;
    }
    return IO_OK;
}

/* Receives the next frame from src into data (cap bytes); see the file comment for the errors. */
static rlx_status recv_frame(struct tcp_transport *t, int src, uint32_t tag, void *data, size_t cap, size_t *got,
                             const char *verb)
{
    int fd;
    RLX_TRY(peer_fd(t, src, verb, &fd));
    char tagt[32], who[32], what[128];
    tag_text(tag, tagt, sizeof tagt);
    snprintf(who, sizeof who, "rank %d", src);
    unsigned char head[sizeof(struct rlx_wire_frame)];
    size_t done;
    enum io_result r = recv_all(fd, head, sizeof head, now_ms() + t->timeout_ms, t->timeout_ms, &done);
    if (r != IO_OK) {
        snprintf(what, sizeof what, "%s: receiving a message with %s", verb, tagt);
        rlx_status s = io_error(r, t->timeout_ms, who, what, done, sizeof head);
        if (!(r == IO_TIMEOUT && done == 0))
            drop(t, src);
        return s;
    }
    struct rlx_wire_frame f = rlx_wire_frame_decode(head);
    if (f.magic != RLX_WIRE_FRAME_MAGIC) {
        drop(t, src);
        return rlx_set_error(RLX_ERR_IO, "%s: rank %d sent a frame with bad magic 0x%08" PRIx32
                             " (the stream is out of step); connection closed", verb, src, f.magic);
    }
    if (f.length > t->max_bytes) {
        drop(t, src);
        return rlx_set_error(RLX_ERR_IO, "%s: rank %d sent a %" PRIu64 "-byte frame, above max_message_bytes %zu; "
                             "connection to rank %d closed", verb, src, f.length, t->max_bytes, src);
    }
    rlx_status s = RLX_OK;
    char gott[32];
    tag_text(f.tag, gott, sizeof gott);
    if (f.tag != tag)
        s = rlx_set_error(RLX_ERR_IO, "%s: expected a message with %s from rank %d, got one with %s (%" PRIu64
                          " bytes, discarded)", verb, tagt, src, gott, f.length);
    else if (f.length > cap)
        s = rlx_set_error(RLX_ERR_RANGE, "%s: the message from rank %d with %s has %" PRIu64
                          " bytes, more than the %zu-byte buffer (discarded)", verb, src, tagt, f.length, cap);
    if (s != RLX_OK) {
        r = discard(t, fd, f.length, &done);
        if (r != IO_OK) {
            drop(t, src);
            snprintf(what, sizeof what, "%s: discarding a message with %s", verb, gott);
            return io_error(r, t->timeout_ms, who, what, done, (size_t)f.length);
        }
        return s;
    }
    r = recv_all(fd, data, (size_t)f.length, now_ms() + t->timeout_ms, t->timeout_ms, &done);
    if (r != IO_OK) {
        drop(t, src);
        snprintf(what, sizeof what, "%s: receiving the payload of a message with %s", verb, tagt);
        return io_error(r, t->timeout_ms, who, what, done, (size_t)f.length);
    }
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
    if (data == NULL && bytes > 0)
        return rlx_set_error(RLX_ERR_INVALID, "send: data is NULL");
    return send_frame(t, dst, tag, data, bytes, "send");
}

static rlx_status tcp_recv(struct rlx_transport *base, int src, uint32_t tag, void *data, size_t cap, size_t *got)
{
    struct tcp_transport *t = tcp_of(base);
    if (tag >= RLX_WIRE_USER_TAG_LIMIT)
        return rlx_set_error(RLX_ERR_INVALID, "recv: tag %" PRIu32 " is out of range (user tags are < 2^24)", tag);
    if ((data == NULL && cap > 0) || got == NULL)
        return rlx_set_error(RLX_ERR_INVALID, "recv: data or got is NULL");
    return recv_frame(t, src, tag, data, cap, got, "recv");
}

static rlx_status tcp_broadcast(struct rlx_transport *base, int root, void *data, size_t bytes)
{
    struct tcp_transport *t = tcp_of(base);
    if (root < 0 || root >= base->world)
        return rlx_set_error(RLX_ERR_INVALID, "broadcast: root %d is out of range (world %d)", root, base->world);
    if (bytes > t->max_bytes)
        return rlx_set_error(RLX_ERR_RANGE, "broadcast: %zu bytes is above max_message_bytes %zu", bytes, t->max_bytes);
    if (data == NULL && bytes > 0)
        return rlx_set_error(RLX_ERR_INVALID, "broadcast: data is NULL");
    if (base->rank == root) {
        for (int r = 0; r < base->world; r++) {
            if (r != root)
                RLX_TRY(send_frame(t, r, RLX_WIRE_TAG_BROADCAST, data, bytes, "broadcast"));
        }
        return RLX_OK;
    }
    size_t got = 0;
    RLX_TRY(recv_frame(t, root, RLX_WIRE_TAG_BROADCAST, data, bytes, &got, "broadcast"));
    if (got != bytes)
        return rlx_set_error(RLX_ERR_IO, "broadcast: root %d sent %zu bytes, rank %d expected %zu", root, got,
                             base->rank, bytes);
    return RLX_OK;
}

/* Every rank > 0 reports to rank 0, which releases them all once each has arrived. */
static rlx_status tcp_barrier(struct rlx_transport *base)
{
    struct tcp_transport *t = tcp_of(base);
    size_t got;
    if (base->rank != 0) {
        RLX_TRY(send_frame(t, 0, RLX_WIRE_TAG_BARRIER_ARRIVE, NULL, 0, "barrier"));
        return recv_frame(t, 0, RLX_WIRE_TAG_BARRIER_LEAVE, NULL, 0, &got, "barrier");
    }
    for (int r = 1; r < base->world; r++)
        RLX_TRY(recv_frame(t, r, RLX_WIRE_TAG_BARRIER_ARRIVE, NULL, 0, &got, "barrier"));
    for (int r = 1; r < base->world; r++)
        RLX_TRY(send_frame(t, r, RLX_WIRE_TAG_BARRIER_LEAVE, NULL, 0, "barrier"));
    return RLX_OK;
}

static void tcp_close(struct rlx_transport *base)
{
    if (base == NULL)
        return;
    struct tcp_transport *t = tcp_of(base);
    for (int r = 0; t->fds != NULL && r < base->world; r++) {
        if (t->fds[r] >= 0)
            close(t->fds[r]);
    }
    free(t->fds);
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
    int64_t deadline = now_ms() + t->timeout_ms;
    if (rank < world - 1 && *lfd < 0)
        RLX_TRY(listen_on(addrs[rank], rank, world, lfd));
    else if (*lfd >= 0)
        RLX_TRY(adopt_listener(*lfd, rank));
    for (int peer = 0; peer < rank; peer++)
        RLX_TRY(connect_peer(t, peer, addrs[peer], deadline));
    if (rank < world - 1)
        RLX_TRY(accept_peers(t, *lfd, deadline));
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
        if ((s = parse_addr(addrs[r], r, host, sizeof host, port)) != RLX_OK)
            goto done;
    }
    t = rlx_calloc(1, sizeof *t);
    if (t == NULL) {
        s = RLX_ERR_NOMEM;
        goto done;
    }
    t->base.ops = &tcp_ops;
    t->base.rank = rank;
    t->base.world = world;
    t->max_bytes = opts != NULL && opts->max_message_bytes > 0 ? opts->max_message_bytes : DEFAULT_MAX_BYTES;
    t->timeout_ms = opts != NULL && opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    t->token_hash = rlx_wire_token_hash(opts != NULL ? opts->token : NULL);
    t->fds = rlx_calloc((size_t)world, sizeof *t->fds);
    if (t->fds == NULL) {
        s = RLX_ERR_NOMEM;
        goto done;
    }
    for (int r = 0; r < world; r++)
        t->fds[r] = -1;
    if (world > 1)
        s = tcp_setup(t, addrs, &listen_fd);
done:
    if (listen_fd >= 0)
        close(listen_fd);
    if (s != RLX_OK) {
        tcp_close(t != NULL ? &t->base : NULL);
        return s;
    }
    *out = &t->base;
    return RLX_OK;
}
