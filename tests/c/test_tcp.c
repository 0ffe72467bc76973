/*
 * test_tcp.c - the TCP mesh transport of rlx/dist.h (csrc/distributed/tcp.c) on 127.0.0.1, one thread per
 * rank, on listeners this test creates itself (port 0, passed as listen_fd) so no port can race:
 * meshes of 2 and 3 ranks; tagged messages arrive in order; a too-small buffer is RLX_ERR_RANGE and
 * a wrong tag an error, both consuming the message and keeping the stream in step; broadcast from
 * every root; a barrier that really waits; a mismatched token fails set-up on both sides; a peer
 * that closes is reported at once, a silent one after the timeout (and the connection survives);
 * a hand-made peer sending a bad HELLO or an oversized frame; bad arguments; no socket leaks.
 * Runs under valgrind in `make test`.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "distributed/wire.h"
#include "rlx/dist.h"
#include "rlx/rlx.h"

#include "check.h"

enum { MAXW = 3 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A listening socket on 127.0.0.1 with a kernel-chosen port; its "host:port" goes to addr. */
static int make_listener(char addr[32])
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        perror("listener");
        exit(2);
    }
    snprintf(addr, 32, "127.0.0.1:%d", ntohs(sa.sin_port));
    return fd;
}

/* ---------------------------------------------------------------------------------------------
 * One thread per rank: create the transport on its listener, run a body, close.
 * ------------------------------------------------------------------------------------------- */

struct world;
typedef void (*body_fn)(struct world *w, int rank, struct rlx_transport *t);

struct world {
    int n;
    char addr_buf[MAXW][32];
    const char *addrs[MAXW];
    int lfd[MAXW];
    struct rlx_tcp_opts opts[MAXW];
    body_fn body;
    rlx_status created[MAXW];
    char create_err[MAXW][512];
    /* shared state for the bodies */
    atomic_int arrived[4];
    atomic_int flag;
};

struct rank_arg {
    struct world *w;
    int rank;
};

static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    struct world *w = a->w;
    struct rlx_transport *t = NULL;
    rlx_status s = rlx_tcp_transport_create(a->rank, w->n, w->addrs, w->lfd[a->rank], &w->opts[a->rank], &t);
    w->created[a->rank] = s;
    snprintf(w->create_err[a->rank], sizeof w->create_err[a->rank], "%s", s == RLX_OK ? "" : rlx_last_error());
    if (s == RLX_OK) {
        if (t == NULL || t->rank != a->rank || t->world != w->n || strcmp(t->ops->name, "tcp") != 0) {
            CHECK(0, "rank %d: transport header wrong", a->rank);
        } else if (w->body != NULL) {
            w->body(w, a->rank, t);
        }
        t->ops->close(t);
    }
    return NULL;
}

/* Runs body on n ranks; opts (may be NULL) applies to every rank unless tweak changes it. */
static void run_world(struct world *w, int n, int timeout_ms, body_fn body,
                      void (*tweak)(struct world *w))
{
    memset(w, 0, sizeof *w);
    w->n = n;
    w->body = body;
    for (int r = 0; r < n; r++) {
        w->lfd[r] = make_listener(w->addr_buf[r]);
        w->addrs[r] = w->addr_buf[r];
        w->opts[r] = (struct rlx_tcp_opts){.timeout_ms = timeout_ms, .token = "secret"};
    }
    if (tweak != NULL)
        tweak(w);
    pthread_t th[MAXW];
    struct rank_arg args[MAXW];
    for (int r = 0; r < n; r++) {
        args[r] = (struct rank_arg){w, r};
        if (pthread_create(&th[r], NULL, rank_main, &args[r]) != 0) {
            perror("pthread_create");
            exit(2);
        }
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
}

static void check_created(struct world *w, const char *what)
{
    for (int r = 0; r < w->n; r++)
        CHECK(w->created[r] == RLX_OK, "%s: rank %d create: %s (%s)", what, r, rlx_status_name(w->created[r]),
              w->create_err[r]);
}

/* ---------------------------------------------------------------------------------------------
 * Bodies
 * ------------------------------------------------------------------------------------------- */

enum { NMSG = 4 };

static size_t msg_len(int src, int dst, int k) { return k == 0 ? 0 : (size_t)(8 + 37 * k + 5 * src + dst); }
static uint32_t msg_tag(int src, int dst, int k) { return (uint32_t)(1000 * src + 10 * dst + k); }
static unsigned char msg_byte(int src, int dst, int k, size_t i) { return (unsigned char)(src * 31 + dst * 7 + k * 13 + i); }

/* Every rank sends NMSG tagged messages to every other rank, then receives every other rank's in
 * order; then a 256 KiB message 0 -> 1 -> 0; then argument errors. */
static void body_p2p(struct world *w, int me, struct rlx_transport *t)
{
    unsigned char buf[256];
    for (int dst = 0; dst < w->n; dst++) {
        for (int k = 0; k < NMSG && dst != me; k++) {
            size_t len = msg_len(me, dst, k);
            for (size_t i = 0; i < len; i++)
                buf[i] = msg_byte(me, dst, k, i);
            CHECK(t->ops->send(t, dst, msg_tag(me, dst, k), len ? buf : NULL, len) == RLX_OK, "send %d->%d #%d", me,
                  dst, k);
        }
    }
    for (int src = 0; src < w->n; src++) {
        for (int k = 0; k < NMSG && src != me; k++) {
            size_t len = msg_len(src, me, k), got = 12345;
            memset(buf, 0xEE, sizeof buf);
            CHECK(t->ops->recv(t, src, msg_tag(src, me, k), buf, sizeof buf, &got) == RLX_OK, "recv %d->%d #%d", src,
                  me, k);
            CHECK(got == len, "recv %d->%d #%d: got %zu bytes, expected %zu", src, me, k, got, len);
            int ok = 1;
            for (size_t i = 0; i < len && i < got; i++)
                ok &= buf[i] == msg_byte(src, me, k, i);
            CHECK(ok, "recv %d->%d #%d: payload differs", src, me, k);
        }
    }

    /* A message larger than the socket buffers (needs the receiver to drain it concurrently). */
    enum { BIG = 256 * 1024 };
    if (me <= 1) {
        unsigned char *big = malloc(BIG);
        int peer = 1 - me;
        size_t got = 0;
        if (me == 0) {
            for (size_t i = 0; i < BIG; i++)
                big[i] = (unsigned char)(i * 2654435761u >> 13);
            CHECK(t->ops->send(t, peer, 77, big, BIG) == RLX_OK, "big send");
            memset(big, 0, BIG);
            CHECK(t->ops->recv(t, peer, 78, big, BIG, &got) == RLX_OK && got == BIG, "big echo recv");
        } else {
            memset(big, 0, BIG);
            CHECK(t->ops->recv(t, peer, 77, big, BIG, &got) == RLX_OK && got == BIG, "big recv");
            CHECK(t->ops->send(t, peer, 78, big, BIG) == RLX_OK, "big echo send");
        }
        int ok = 1;
        for (size_t i = 0; i < BIG; i++)
            ok &= big[i] == (unsigned char)(i * 2654435761u >> 13);
        CHECK(ok, "rank %d: big payload differs", me);
        free(big);
    }

    /* Argument errors are local and leave the mesh usable. */
    size_t got;
    CHECK(t->ops->send(t, me, 1, buf, 1) == RLX_ERR_INVALID, "send to self");
    CHECK(t->ops->send(t, w->n, 1, buf, 1) == RLX_ERR_INVALID, "send to rank out of range");
    CHECK(t->ops->send(t, -1, 1, buf, 1) == RLX_ERR_INVALID, "send to rank -1");
    CHECK(t->ops->send(t, (me + 1) % w->n, 1u << 24, buf, 1) == RLX_ERR_INVALID, "send with tag 2^24");
    CHECK(t->ops->send(t, (me + 1) % w->n, 1, NULL, 4) == RLX_ERR_INVALID, "send NULL data");
    CHECK(t->ops->recv(t, me, 1, buf, 1, &got) == RLX_ERR_INVALID, "recv from self");
    CHECK(t->ops->recv(t, (me + 1) % w->n, RLX_WIRE_TAG_BROADCAST, buf, 1, &got) == RLX_ERR_INVALID,
          "recv with a reserved tag");
    CHECK(t->ops->recv(t, (me + 1) % w->n, 1, buf, 1, NULL) == RLX_ERR_INVALID, "recv got NULL");
    CHECK(t->ops->broadcast(t, w->n, buf, 1) == RLX_ERR_INVALID, "broadcast root out of range");
    CHECK(t->ops->barrier(t) == RLX_OK, "barrier after argument errors");
}

/* Rank 0 sends four messages; rank 1 receives the first with a small buffer (RANGE), the second
 * with the wrong tag (IO), and the last two correctly: the stream stayed in step. */
static void body_errors(struct world *w, int me, struct rlx_transport *t)
{
    (void)w;
    unsigned char buf[128];
    size_t got;
    if (me == 0) {
        for (int i = 0; i < 128; i++)
            buf[i] = (unsigned char)i;
        CHECK(t->ops->send(t, 1, 1, buf, 64) == RLX_OK, "send A");
        CHECK(t->ops->send(t, 1, 2, buf + 1, 8) == RLX_OK, "send B");
        CHECK(t->ops->send(t, 1, 3, buf + 2, 16) == RLX_OK, "send C");
        CHECK(t->ops->send(t, 1, 4, buf + 3, 4) == RLX_OK, "send D");
        CHECK(t->ops->recv(t, 1, 5, buf, sizeof buf, &got) == RLX_OK && got == 3 && memcmp(buf, "ok!", 3) == 0,
              "reply after errors");
        return;
    }
    rlx_status s = t->ops->recv(t, 0, 1, buf, 32, &got);
    CHECK(s == RLX_ERR_RANGE, "64-byte message into a 32-byte buffer: %s", rlx_status_name(s));
    CHECK(strstr(rlx_last_error(), "64") != NULL, "RANGE message names the size");
    s = t->ops->recv(t, 0, 9, buf, sizeof buf, &got);
    CHECK(s == RLX_ERR_IO, "tag 2 received as tag 9: %s", rlx_status_name(s));
    CHECK(strstr(rlx_last_error(), "tag 9") != NULL && strstr(rlx_last_error(), "tag 2") != NULL,
          "wrong-tag message names both tags");
    memset(buf, 0, sizeof buf);
    s = t->ops->recv(t, 0, 3, buf, sizeof buf, &got);
    CHECK(s == RLX_OK && got == 16, "message C after the errors: %s, %zu bytes", rlx_status_name(s), got);
    int ok = 1;
    for (int i = 0; i < 16; i++)
        ok &= buf[i] == (unsigned char)(i + 2);
    CHECK(ok, "message C payload");
    s = t->ops->recv(t, 0, 4, buf, 4, &got); /* cap exactly the size */
    CHECK(s == RLX_OK && got == 4 && buf[0] == 3 && buf[3] == 6, "message D with an exact buffer");
    CHECK(t->ops->send(t, 0, 5, "ok!", 3) == RLX_OK, "reply");
}

/* Broadcast from every root (and a 0-byte one), then barriers that must wait for every rank. */
static void body_collectives(struct world *w, int me, struct rlx_transport *t)
{
    for (int root = 0; root < w->n; root++) {
        int32_t v[25];
        for (int i = 0; i < 25; i++)
            v[i] = me == root ? root * 1000 + i : -1 - me;
        CHECK(t->ops->broadcast(t, root, v, sizeof v) == RLX_OK, "broadcast root %d on rank %d", root, me);
        int ok = 1;
        for (int i = 0; i < 25; i++)
            ok &= v[i] == root * 1000 + i;
        CHECK(ok, "broadcast root %d: rank %d has the root's data", root, me);
    }
    CHECK(t->ops->broadcast(t, w->n - 1, NULL, 0) == RLX_OK, "0-byte broadcast");
    for (int round = 0; round < 4; round++) {
        if (me == round % w->n)
            usleep(50000); /* one rank is late: the others must wait for it */
        w->arrived[round]++;
        CHECK(t->ops->barrier(t) == RLX_OK, "barrier %d on rank %d", round, me);
        CHECK(w->arrived[round] == w->n, "barrier %d released rank %d after %d of %d arrived", round, me,
              (int)w->arrived[round], w->n);
    }
    /* Point-to-point still works after the collectives. */
    int peer = (me + 1) % w->n, from = (me + w->n - 1) % w->n, x = me, y = -1;
    size_t got;
    CHECK(t->ops->send(t, peer, 42, &x, sizeof x) == RLX_OK, "ring send");
    CHECK(t->ops->recv(t, from, 42, &y, sizeof y, &got) == RLX_OK && got == sizeof y && y == from, "ring recv");
}

/* Rank 1 closes at once; rank 0's recv must fail promptly, and later calls at once. */
static void body_peer_closes(struct world *w, int me, struct rlx_transport *t)
{
    (void)w;
    if (me == 1)
        return; /* rank_main closes it */
    char buf[8];
    size_t got;
    double t0 = now_s();
    rlx_status s = t->ops->recv(t, 1, 7, buf, sizeof buf, &got);
    double dt = now_s() - t0;
    CHECK(s == RLX_ERR_IO, "recv from a closed peer: %s", rlx_status_name(s));
    CHECK(strstr(rlx_last_error(), "closed") != NULL, "message says the peer closed");
    CHECK(dt < 3.0, "recv from a closed peer took %.2f s (timeout 20 s)", dt);
    t0 = now_s();
    s = t->ops->recv(t, 1, 7, buf, sizeof buf, &got);
    CHECK(s == RLX_ERR_IO && now_s() - t0 < 1.0, "second recv from the closed peer: %s", rlx_status_name(s));
    s = t->ops->send(t, 1, 7, buf, sizeof buf);
    CHECK(s == RLX_ERR_IO, "send to the closed peer: %s", rlx_status_name(s));
    CHECK(t->ops->barrier(t) == RLX_ERR_IO, "barrier without the closed peer");
}

/* Rank 1 says nothing until rank 0's recv timed out (300 ms); then its message still arrives. */
static void body_silent(struct world *w, int me, struct rlx_transport *t)
{
    char buf[8];
    size_t got;
    if (me == 1) {
        while (w->flag == 0)
            usleep(5000);
        CHECK(t->ops->send(t, 0, 8, "late", 4) == RLX_OK, "late send");
        w->flag = 2;
        return;
    }
    double t0 = now_s();
    rlx_status s = t->ops->recv(t, 1, 8, buf, sizeof buf, &got);
    double dt = now_s() - t0;
    CHECK(s == RLX_ERR_IO, "recv from a silent peer: %s", rlx_status_name(s));
    CHECK(strstr(rlx_last_error(), "timed out") != NULL && strstr(rlx_last_error(), "rank 1") != NULL,
          "timeout message names the peer");
    CHECK(dt >= 0.25 && dt < 3.0, "recv from a silent peer took %.3f s, timeout 0.3 s", dt);
    w->flag = 1;
    while (w->flag != 2)
        usleep(5000);
    /* A timeout before the first byte of a frame leaves the connection usable. */
    s = t->ops->recv(t, 1, 8, buf, sizeof buf, &got);
    CHECK(s == RLX_OK && got == 4 && memcmp(buf, "late", 4) == 0, "message after a timeout: %s",
          rlx_status_name(s));
}

static void tweak_token_mismatch(struct world *w) { w->opts[1].token = "other-secret"; }
static void tweak_token_null_empty(struct world *w)
{
    w->opts[0].token = NULL;
    w->opts[1].token = "";
}

/* ---------------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------------- */

static void test_p2p(int n)
{
    struct world w;
    run_world(&w, n, 20000, body_p2p, NULL);
    check_created(&w, "p2p");
}

static void test_errors(void)
{
    struct world w;
    run_world(&w, 2, 20000, body_errors, NULL);
    check_created(&w, "errors");
}

static void test_collectives(int n)
{
    struct world w;
    run_world(&w, n, 20000, body_collectives, NULL);
    check_created(&w, "collectives");
}

static void test_token(void)
{
    struct world w;
    double t0 = now_s();
    run_world(&w, 2, 20000, NULL, tweak_token_mismatch);
    double dt = now_s() - t0;
    for (int r = 0; r < 2; r++) {
        CHECK(w.created[r] == RLX_ERR_IO, "token mismatch: rank %d create returned %s", r,
              rlx_status_name(w.created[r]));
        CHECK(strstr(w.create_err[r], "token") != NULL, "token mismatch: rank %d message \"%s\" mentions the token", r,
              w.create_err[r]);
    }
    CHECK(dt < 5.0, "token mismatch took %.2f s (timeout 20 s)", dt);

    run_world(&w, 2, 20000, NULL, tweak_token_null_empty);
    check_created(&w, "NULL token vs \"\"");
}

static void test_peer_closes(void)
{
    struct world w;
    run_world(&w, 2, 20000, body_peer_closes, NULL);
    check_created(&w, "peer closes");
}

static void test_silent(void)
{
    struct world w;
    run_world(&w, 2, 300, body_silent, NULL);
    check_created(&w, "silent peer");
}

/* Rank 0 of world 2 with nobody connecting: set-up fails after its timeout. */
static void test_setup_timeout(void)
{
    char a0[32], a1[32];
    int l0 = make_listener(a0), l1 = make_listener(a1);
    const char *addrs[2] = {a0, a1};
    struct rlx_tcp_opts o = {.timeout_ms = 300};
    struct rlx_transport *t = NULL;
    double t0 = now_s();
    rlx_status s = rlx_tcp_transport_create(0, 2, addrs, l0, &o, &t);
    double dt = now_s() - t0;
    CHECK(s == RLX_ERR_IO && t == NULL, "rank 0 alone: %s", rlx_status_name(s));
    CHECK(strstr(rlx_last_error(), "rank 1") != NULL, "set-up timeout names the missing rank");
    CHECK(dt >= 0.25 && dt < 3.0, "set-up timeout took %.3f s", dt);
    close(l1);
}

/* A hand-made rank 1: connects to rank 0's listener and speaks the wire format directly. */
static int fake_connect(const char *addr)
{
    int port = atoi(strrchr(addr, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("fake connect");
        exit(2);
    }
    return fd;
}

static int write_full(int fd, const void *p, size_t n) { return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n; }

static int read_full(int fd, void *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = recv(fd, (char *)p + done, n - done, 0);
        if (r <= 0)
            return 0;
        done += (size_t)r;
    }
    return 1;
}

static void test_fake_peer(void)
{
    /* A valid HELLO is accepted (connection already queued in the backlog: no thread needed), rank
     * 0 answers with its own; then an oversized frame is refused and the peer dropped. */
    char a0[32], a1[32];
    int l0 = make_listener(a0), l1 = make_listener(a1);
    close(l1);
    const char *addrs[2] = {a0, a1};
    int fd = fake_connect(a0);
    unsigned char hello[24];
    rlx_wire_hello_encode(hello, RLX_TCP_PROTOCOL_VERSION, 1, 2, rlx_wire_token_hash("tok"));
    CHECK(write_full(fd, hello, sizeof hello), "fake HELLO written");
    struct rlx_tcp_opts o = {.timeout_ms = 5000, .token = "tok", .max_message_bytes = 100};
    struct rlx_transport *t = NULL;
    rlx_status s = rlx_tcp_transport_create(0, 2, addrs, l0, &o, &t);
    CHECK(s == RLX_OK, "create against a hand-made rank 1: %s", rlx_status_name(s));
    unsigned char back[24];
    CHECK(read_full(fd, back, sizeof back), "rank 0 answered a HELLO");
    struct rlx_wire_hello h = rlx_wire_hello_decode(back);
    CHECK(h.magic == RLX_WIRE_HELLO_MAGIC && h.version == RLX_TCP_PROTOCOL_VERSION && h.rank == 0 && h.world == 2 &&
              h.token_hash == rlx_wire_token_hash("tok"),
          "rank 0's HELLO fields");
    if (s == RLX_OK) {
        unsigned char frame[16 + 5];
        size_t got;
        char buf[100];
        /* An ordinary frame, byte-exact. */
        rlx_wire_frame_encode(frame, 6, 5);
        memcpy(frame + 16, "hello", 5);
        CHECK(write_full(fd, frame, sizeof frame), "fake frame written");
        CHECK(t->ops->recv(t, 1, 6, buf, sizeof buf, &got) == RLX_OK && got == 5 && memcmp(buf, "hello", 5) == 0,
              "recv a hand-made frame");
        /* rank 0 -> fake: byte layout of a frame. */
        CHECK(t->ops->send(t, 1, 0x123456, "xy", 2) == RLX_OK, "send to the fake peer");
        unsigned char in[18];
        CHECK(read_full(fd, in, sizeof in), "read rank 0's frame");
        struct rlx_wire_frame f = rlx_wire_frame_decode(in);
        CHECK(f.magic == RLX_WIRE_FRAME_MAGIC && f.tag == 0x123456 && f.length == 2 && memcmp(in + 16, "xy", 2) == 0,
              "frame on the wire");
        CHECK(t->ops->send(t, 1, 6, buf, 101) == RLX_ERR_RANGE, "send above max_message_bytes");
        /* Oversized frame: refused without reading the payload, connection dropped. */
        rlx_wire_frame_encode(frame, 6, 1000);
        CHECK(write_full(fd, frame, 16), "oversized frame header written");
        double t0 = now_s();
        s = t->ops->recv(t, 1, 6, buf, sizeof buf, &got);
        CHECK(s == RLX_ERR_IO && strstr(rlx_last_error(), "max_message_bytes") != NULL,
              "oversized frame refused: %s", rlx_status_name(s));
        CHECK(now_s() - t0 < 2.0, "oversized frame refused at once");
        s = t->ops->recv(t, 1, 6, buf, sizeof buf, &got);
        CHECK(s == RLX_ERR_IO, "recv after the drop: %s", rlx_status_name(s));
        t->ops->close(t);
    }
    close(fd);

    /* A HELLO with a foreign magic, and one with the wrong world size. */
    for (int variant = 0; variant < 2; variant++) {
        l0 = make_listener(a0);
        fd = fake_connect(a0);
        if (variant == 0)
            memcpy(hello, "GET / HTTP/1.1\r\nHost: xx", 24);
        else
            rlx_wire_hello_encode(hello, RLX_TCP_PROTOCOL_VERSION, 1, 3, rlx_wire_token_hash(NULL));
        CHECK(write_full(fd, hello, sizeof hello), "bad HELLO written");
        struct rlx_tcp_opts o2 = {.timeout_ms = 5000};
        t = NULL;
        s = rlx_tcp_transport_create(0, 2, addrs, l0, &o2, &t);
        CHECK(s == RLX_ERR_IO && t == NULL, "bad HELLO %d refused: %s", variant, rlx_status_name(s));
        CHECK(strstr(rlx_last_error(), variant == 0 ? "not an rlx rank" : "world size") != NULL,
              "bad HELLO %d message", variant);
        close(fd);
    }
}

static void test_args_and_world1(void)
{
    /* world 1: no sockets; collectives are no-ops; messages to self are refused. */
    struct rlx_transport *t = NULL;
    CHECK(rlx_tcp_transport_create(0, 1, NULL, -1, NULL, &t) == RLX_OK && t != NULL, "world 1");
    if (t != NULL) {
        int v = 5;
        CHECK(t->ops->barrier(t) == RLX_OK, "world 1 barrier");
        CHECK(t->ops->broadcast(t, 0, &v, sizeof v) == RLX_OK && v == 5, "world 1 broadcast");
        CHECK(t->ops->send(t, 0, 1, &v, sizeof v) == RLX_ERR_INVALID, "world 1 send to self");
        t->ops->close(NULL); /* NULL is a no-op */
        CHECK(1, "close(NULL)");
        t->ops->close(t);
    }

    char a0[32], a1[32];
    int l0 = make_listener(a0), l1 = make_listener(a1);
    const char *addrs[2] = {a0, a1};
    t = NULL;
    CHECK(rlx_tcp_transport_create(2, 2, addrs, l0, NULL, &t) == RLX_ERR_INVALID && t == NULL, "rank >= world");
    errno = 0;
    CHECK(fcntl(l0, F_GETFD) == -1 && errno == EBADF, "listen_fd consumed on failure");
    CHECK(rlx_tcp_transport_create(0, 2, NULL, -1, NULL, &t) == RLX_ERR_INVALID, "addrs NULL");
    CHECK(rlx_tcp_transport_create(0, 0, addrs, -1, NULL, &t) == RLX_ERR_INVALID, "world 0");
    CHECK(rlx_tcp_transport_create(0, 2, addrs, -1, NULL, NULL) == RLX_ERR_INVALID, "out NULL");
    const char *bad[][2] = {{a0, "localhost"}, {a0, "127.0.0.1:0"}, {"127.0.0.1:99999", a1}, {":5000", a1}};
    for (int i = 0; i < 4; i++) {
        rlx_status s = rlx_tcp_transport_create(0, 2, bad[i], -1, NULL, &t);
        CHECK(s == RLX_ERR_INVALID && strstr(rlx_last_error(), "host:port") != NULL, "bad address %d: %s", i,
              rlx_status_name(s));
    }
    /* listen_fd that is not listening. */
    int plain = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(rlx_tcp_transport_create(0, 2, addrs, plain, NULL, &t) == RLX_ERR_INVALID, "listen_fd not listening");
    errno = 0;
    CHECK(fcntl(plain, F_GETFD) == -1 && errno == EBADF, "non-listening listen_fd consumed");
    close(l1);
}

int main(void)
{
    int fds0 = count_fds();
    double t0 = now_s();
    test_args_and_world1();
    test_p2p(2);
    test_p2p(3);
    test_errors();
    test_collectives(2);
    test_collectives(3);
    test_token();
    test_peer_closes();
    test_setup_timeout();
    test_fake_peer();
    test_silent();
    int fds1 = count_fds();
    CHECK(fds0 == fds1, "open file descriptors: %d before, %d after", fds0, fds1);
    fprintf(stderr, "test_tcp: %.2f s\n", now_s() - t0);
    return check_summary();
}
