/*
 * tcp.c - the TCP mesh transport of rlx/dist.h: one socket between every pair of ranks, framed
 * messages (wire.h), broadcast and barrier built from point-to-point frames.
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
 * Timeouts: the set-up as a whole has one deadline (timeout_ms). After that every send and every
 * recv has its own deadline, now + timeout_ms, computed once (by a send, once its MAC is computed):
 * it bounds the whole message (header, payload, MAC), however the bytes trickle in, so a peer
 * sending a byte a second cannot stretch it. Every socket is non-blocking and every wait is a poll() for the time left; EINTR restarts
 * the wait with the remaining time; sends use MSG_NOSIGNAL, so a vanished peer is an error, never
 * a SIGPIPE.
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
 * not deliberate, so that no rank computes on a corrupted or out-of-order message. Any error that leaves the stream in an unknown place (a frame cut short, bad magic, a
 * timeout after part of a frame) also closes that connection; later calls naming that peer fail at
 * once with RLX_ERR_IO. A timeout before the first byte of a frame leaves the connection usable.
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "distributed/auth.h"
#include "distributed/tcp_internal.h"
#include "distributed/wire.h"
#include "rlx/dist.h"

#define DEFAULT_MAX_BYTES  ((size_t)1 << 30)
#define DEFAULT_TIMEOUT_MS 60000
#define LABEL_MAX          160
#define ADDR_NAME_MAX      64  /* "[v6 address]:port" fits */
#define LISTEN_BACKLOG     128 /* the kernel caps it at net.core.somaxconn */
#define MAX_PENDING        64  /* handshakes the acceptor runs at once */

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

static int has_token(const struct tcp_transport *t) { return t->token != NULL; }

/* ---------------------------------------------------------------------------------------------
 * Time and waiting
 * ------------------------------------------------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* poll()'s timeout for the time left until deadline (capped; > 0 when left > 0). */
static int poll_ms(int64_t left) { return left > 1000000 ? 1000000 : (int)left; }

/* Waits until fd has `events` (or an error/hangup, which the next syscall reports), or until
 * deadline. Returns 1 ready, 0 deadline passed, -1 poll failed (errno set). EINTR-safe. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, poll_ms(left));
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

enum io_result { IO_OK = 0, IO_TIMEOUT, IO_CLOSED, IO_ERRNO };

static enum io_result recv_all(int fd, void *buf, size_t n, int64_t deadline, size_t *done)
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
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) return IO_TIMEOUT;
        if (w < 0) return IO_ERRNO;
    }
    return IO_OK;
}

/* Sends iov[0..cnt) completely (the array is modified). */
static enum io_result send_all(int fd, struct iovec *iov, int cnt, int64_t deadline, size_t *done)
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
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w == 0) return IO_TIMEOUT;
        if (w < 0) return IO_ERRNO;
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
static int peer_is_loopback(int fd, char *name, size_t cap)
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

static const char remote_hint[] = "without a token (RLX_DIST_TOKEN) the TCP mesh stays on loopback: set the same "
                                  "token on every rank (recommended), or opt in with allow_remote "
                                  "(RLX_DIST_ALLOW_REMOTE=1)";

/* Without a token and allow_remote, every address a peer's name resolves to must be loopback. A
 * name that does not resolve now is left to connect_once to report. */
static rlx_status check_loopback_addr(const char *addr, int rank)
{
    char host[256], port[8];
    RLX_TRY(parse_addr(addr, rank, host, sizeof host, port));
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0) return RLX_OK;
    rlx_status s = RLX_OK;
    for (struct addrinfo *ai = res; ai != NULL && s == RLX_OK; ai = ai->ai_next) {
        if (!rlx_sockaddr_is_loopback(ai->ai_addr, ai->ai_addrlen))
            s = rlx_set_error(RLX_ERR_INVALID, "the address of rank %d, %s, is not a loopback address; %s", rank, addr,
                              remote_hint);
    }
    freeaddrinfo(res);
    return s;
}

static void set_nodelay(int fd)
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
static void set_reuseaddr(int fd)
{
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
}

static rlx_status listen_on(const char *addr, int rank, int *out)
{
    char host[256], port[8];
    RLX_TRY(parse_addr(addr, rank, host, sizeof host, port));
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
static rlx_status adopt_listener(int fd, int rank)
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
        if (res != NULL) freeaddrinfo(res);
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return rlx_set_error(RLX_ERR_IO, "timed out after %.1f s connecting to rank %d at %s (last error: %s)",
                                 timeout_ms / 1000.0, peer, addr,
                                 gai == EAI_AGAIN ? gai_strerror(gai) : strerror(last_err ? last_err : ETIMEDOUT));
        sleep_ms(pause < left ? pause : left);
        pause = pause * 2 > 500 ? 500 : pause * 2;
    }
}

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
                             peer, addr, me, remote_hint);
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
    enum io_result r = recv_all(fd, buf, RLX_WIRE_HEAD_BYTES, deadline, &done);
    if (r != IO_OK) return io_error(r, t->timeout_ms, who, what, done, RLX_WIRE_HEAD_BYTES);
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
    enum io_result r = send_all(fd, &iov, 1, deadline, &done);
    return r == IO_OK ? RLX_OK : io_error(r, t->timeout_ms, who, what, done, n);
}

static rlx_status recv_msg(struct tcp_transport *t, int fd, unsigned char *buf, size_t n, const char *who,
                           const char *what, int64_t deadline)
{
    size_t done;
    enum io_result r = recv_all(fd, buf, n, deadline, &done);
    return r == IO_OK ? RLX_OK : io_error(r, t->timeout_ms, who, what, done, n);
}

/* The connecting side of the handshake with rank `peer` on fd (connected to addr, a name for
 * messages; fd already belongs to t->links[peer], which the caller closes on failure): HELLO_C,
 * HELLO_A; with a token PROOF_C, PROOF_A. */
static rlx_status connector_handshake(struct tcp_transport *t, int peer, int fd, const char *addr, int64_t deadline)
{
    char who[LABEL_MAX], reached[ADDR_NAME_MAX];
    snprintf(who, sizeof who, "rank %d at %s", peer, addr);
    if (!has_token(t) && !t->allow_remote && !peer_is_loopback(fd, reached, sizeof reached))
        return rlx_set_error(RLX_ERR_INVALID, "rank %d's address %s led to %s, not a loopback address; %s", peer, addr,
                             reached, remote_hint);

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
static rlx_status connect_peer(struct tcp_transport *t, int peer, const char *addr, int64_t deadline)
{
    int fd = -1;
    RLX_TRY(connect_once(addr, peer, deadline, t->timeout_ms, &fd));
    set_nodelay(fd);
    t->links[peer].fd = fd; /* owned by t from here: closed by tcp_close on any failure */
    return connector_handshake(t, peer, fd, addr, deadline);
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
static rlx_status accept_peers(struct tcp_transport *t, int lfd, int64_t deadline)
{
    int me = t->base.rank, missing = t->base.world - 1 - me, npend = 0;
    struct pending *pend = rlx_calloc(MAX_PENDING, sizeof *pend);
    struct pollfd *pfd = rlx_calloc(MAX_PENDING + 1, sizeof *pfd);
    rlx_status s = pend != NULL && pfd != NULL ? RLX_OK : RLX_ERR_NOMEM;
    while (s == RLX_OK && missing > 0) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            s = accept_timeout(t, missing, npend);
            break;
        }
        pfd[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < npend; i++) pfd[1 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int rc = poll(pfd, (nfds_t)(1 + npend), poll_ms(left));
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
            set_nodelay(fd);
            set_reuseaddr(fd);
            struct pending *p = &pend[npend++];
            memset(p, 0, sizeof *p);
            p->fd = fd;
            p->loopback = peer_is_loopback(fd, p->from, sizeof p->from);
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
    int64_t deadline = now_ms() + t->timeout_ms; /* once the frame is ready; it bounds the whole message */
    struct iovec iov[3] = {{.iov_base = head, .iov_len = sizeof head},
                           {.iov_base = (void *)data, .iov_len = bytes},
                           {.iov_base = mac, .iov_len = sizeof mac}};
    size_t done;
    enum io_result r = send_all(l->fd, iov, 3, deadline, &done);
    if (r == IO_OK) {
        l->send_seq++;
        return RLX_OK;
    }
    char tagt[32], who[32], what[96];
    tag_text(tag, tagt, sizeof tagt);
    snprintf(who, sizeof who, "rank %d", dst);
    snprintf(what, sizeof what, "%s: sending a %zu-byte message with %s", verb, bytes, tagt);
    rlx_status s = io_error(r, t->timeout_ms, who, what, done, sizeof head + bytes + sizeof mac);
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
        enum io_result r = recv_all(fd, sink, chunk, deadline, &done);
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
    enum io_result r = recv_all(l->fd, got, sizeof got, deadline, &done);
    if (r != IO_OK) {
        char who[32], what[128];
        snprintf(who, sizeof who, "rank %d", src);
        snprintf(what, sizeof what, "%s: receiving the MAC of a message with %s", verb, tagt);
        drop(t, src);
        return io_error(r, t->timeout_ms, who, what, done, sizeof got);
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
    int64_t deadline = now_ms() + t->timeout_ms; /* once: it bounds the whole message */
    char tagt[32], who[32], what[128];
    tag_text(tag, tagt, sizeof tagt);
    snprintf(who, sizeof who, "rank %d", src);
    unsigned char head[sizeof(struct rlx_wire_frame)];
    size_t done;
    enum io_result r = recv_all(l->fd, head, sizeof head, deadline, &done);
    if (r != IO_OK) {
        snprintf(what, sizeof what, "%s: receiving a message with %s", verb, tagt);
        rlx_status s = io_error(r, t->timeout_ms, who, what, done, sizeof head);
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
            return io_error(r, t->timeout_ms, who, what, done, (size_t)f.length);
        }
        if (mac_s != RLX_OK) {
            drop(t, src);
            return mac_s;
        }
        RLX_TRY(check_frame_mac(t, src, deadline, verb, gott));
        return s;
    }
    r = recv_all(l->fd, data, (size_t)f.length, deadline, &done);
    if (r != IO_OK) {
        drop(t, src);
        snprintf(what, sizeof what, "%s: receiving the payload of a message with %s", verb, tagt);
        return io_error(r, t->timeout_ms, who, what, done, (size_t)f.length);
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
    int64_t deadline = now_ms() + t->timeout_ms;
    if (rank < world - 1 && *lfd < 0)
        RLX_TRY(listen_on(addrs[rank], rank, lfd));
    else if (*lfd >= 0)
        RLX_TRY(adopt_listener(*lfd, rank));
    for (int peer = 0; peer < rank; peer++) RLX_TRY(connect_peer(t, peer, addrs[peer], deadline));
    if (rank < world - 1) RLX_TRY(accept_peers(t, *lfd, deadline));
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
        if ((s = parse_addr(addrs[r], r, host, sizeof host, port)) != RLX_OK) goto done;
    }
    if ((s = tcp_new(rank, world, opts, &t)) != RLX_OK) goto done;
    for (int r = 0; r < world && world > 1 && !has_token(t) && !t->allow_remote; r++) {
        if (r != rank && (s = check_loopback_addr(addrs[r], r)) != RLX_OK) goto done;
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
 * One connection on a socket the caller made (tcp_internal.h): the handshake and frame code above,
 * without listening, resolving, connecting, or the poll over many incoming connections.
 * ------------------------------------------------------------------------------------------- */

static struct tcp_transport *tcp_checked(struct rlx_transport *base)
{
    return base != NULL && base->ops == &tcp_ops ? tcp_of(base) : NULL;
}

static rlx_status set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return rlx_set_error(RLX_ERR_IO, "cannot make fd %d non-blocking: %s", fd, strerror(errno));
    return RLX_OK;
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
    rlx_status s = set_nonblocking(fd);
    if (s != RLX_OK) {
        close(fd);
        return s;
    }
    struct pending p = {.fd = fd};
    p.loopback = peer_is_loopback(fd, p.from, sizeof p.from);
    int64_t deadline = now_ms() + t->timeout_ms;
    for (;;) {
        switch (pending_step(t, &p)) { /* reads what has arrived; waits below only when that is not enough */
        case STEP_MORE: break;
        case STEP_DONE: *peer = (int)p.rank; return RLX_OK;
        case STEP_DROPPED:
            return rlx_set_error(RLX_ERR_IO, "rank %d refused a connection: %s", t->base.rank, t->last_refusal);
        case STEP_FATAL: close(fd); return RLX_ERR_INTERNAL; /* the message is set by the failed crypto call */
        }
        int w = wait_fd(fd, POLLIN, deadline);
        if (w <= 0) {
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
    rlx_status s = set_nonblocking(fd);
    if (s != RLX_OK) {
        close(fd);
        return s;
    }
    t->links[peer].fd = fd;
    char addr[32];
    snprintf(addr, sizeof addr, "fd %d", fd);
    s = connector_handshake(t, peer, fd, addr, now_ms() + t->timeout_ms);
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
