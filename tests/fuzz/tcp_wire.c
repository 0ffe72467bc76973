/*
 * tcp_wire.c - fuzz target tcp_wire (libFuzzer, C): everything csrc/distributed/tcp*.c do with the
 * bytes a peer sends. The harness plays the peer on one end of a socketpair and runs the transport's
 * own handshake (acceptor or connector side) and then its frame code on the other end, through
 * tcp_internal.h. Built by tools/fuzz.mk: with clang -fsanitize=fuzzer,address,undefined for
 * tools/run_fuzz.sh, and with cc (ASan+UBSan, no libFuzzer) + tests/fuzz/replay_main.c for the
 * replay under pytest (tests/fuzz/test_fuzz_replay.py).
 *
 * One input is one connection. Everything the peer will send is written before the transport
 * reads a byte (then, unless the input says otherwise, the peer shuts its side down), so a run
 * never waits and never depends on timing. For that the peer must know the transport's HELLO in
 * advance: this build replaces the nonce generator (rlx_crypto_random, see tools/fuzz.mk) with a
 * counter, so nonces are predictable here and only here. The peer's own MACs come from OpenSSL's
 * HMAC() directly, from wire.h's description, not from rlx's auth.c.
 *
 * Input:
 *   byte 0    mode: bit 0 the transport's side (0 acceptor, 1 connector); bit 1 it has a token;
 *             bit 2 the peer's token differs (another token, or one where the transport has none);
 *             bit 3 allow_remote (a socketpair is not loopback: without it and without a token the
 *             transport refuses); bit 4 the peer keeps its side open (no EOF: reads run out and time
 *             out, timeout_ms 1); bit 5 the peer opens with a correct handshake; bits 6-7
 *             max_message_bytes 64, 4096, 65536, default (1 GiB)
 *   byte 1    world 2 + (b & 3); the transport's rank and the peer's from b >> 2 and b >> 5
 *   2..17     four operations of the transport once the handshake is over, 4 bytes each: kind, tag,
 *             u16 size. kind % 8: 0 none, or with an odd tag byte and the link open, a second
 *             connection whose correct HELLO claims the linked rank (the acceptor must refuse it
 *             as a duplicate, the connector must not take it); 1-2 recv(peer, tag, buffer of
 *             size); 3 send(peer, tag, size % 4096 bytes; size bit 15 with mode bit 4: the
 *             transport's send buffer is shrunk first, so the send can time out part-way);
 *             4 broadcast from the peer (size bytes); 5 broadcast to the peer (size % 4096);
 *             6 barrier; 7 recv from a rank chosen by the tag byte (self, out of range, unlinked)
 *   18..      the peer's script, op after op until the input ends; op byte % 7:
 *             0 RAW    n (u8), n bytes written as they are
 *             1 HELLO  flags; a set bit takes the field from the input, else the correct value:
 *                      0 magic (u32), 1 version (u16), 2 info (u16), 3 rank (u32), 4 world (u32);
 *                      5 nonce = the transport's own, 6 nonce from the input (32 bytes); 7 only a
 *                      prefix of u8 % 48 bytes is written
 *             2 PROOF  flags: 0 magic (u32), 4 version (u16), 5 rank (u32), 6 world (u32) from the
 *                      input; 1 the other direction's label, 2 MAC from the input (32 bytes), 3 the
 *                      transport's own proof reflected; 7 a prefix of u8 % 48 bytes
 *             3 FRAME  flags, tag byte, u16 payload length, payload (bit 0: generated, else taken
 *                      from the input); flags: 1 length field from the input (u64), 2 MAC from the
 *                      input, 3 MAC over the next sequence number, 4 MAC under the other
 *                      direction's key, 5 no MAC, 6 magic from the input (u32), 7 only a prefix of
 *                      u16 bytes of the frame
 *             4 SHUT   flags % 3: the peer stops writing (0), reading (1: the transport's sends fail),
 *                      both (2)
 *             5 AUTO   a correct handshake (HELLO, and PROOF with a token)
 *             6 REFUSE flags, u16 reason; flags: 0 version (u16), 1 rank (u32), 2 world (u32) from the
 *                      input
 *   Tag bytes: < 0xF0 tag b % 8; 0xF0.. broadcast, barrier arrive, barrier leave, 0xFFFFFF00,
 *   2^24, 0xFFFFFFFF; 0xF6.. a u32 from the input.
 *
 * A finding (printed, then abort(), so libFuzzer keeps the input): a crash, leak or undefined
 * behaviour (the sanitizers); a call that returns a status other than the ones its contract allows,
 * or fails without a message; a call that waits with nothing to wait for (the peer's bytes are all
 * there) or past its deadline; the socket left open; a frame accepted that the peer did not send
 * with a correct MAC at that sequence number, or one whose tag or bytes differ from it; a link
 * opened by a handshake that wire.h does not accept (checked from the peer's bytes: version, world,
 * ranks, token flag, reflected nonce, proof under the token); with a token, a link opened by a peer
 * that does not know it, or a proof sent before the peer proved it; bytes sent by the transport that
 * are not what wire.h says (its HELLO, proofs, REFUSE reasons, frames and their MACs); and, when the
 * peer's script is a correct handshake followed by correct frames, any outcome other than the one
 * the contract gives: the frame; RLX_ERR_RANGE for a recv buffer too small, RLX_ERR_IO for another
 * tag or for a broadcast or barrier message of another size than agreed, each keeping the link; a
 * frame above max_message_bytes closing it; the peer's EOF. tools/run_fuzz.sh adds
 * -malloc_limit_mb=64: no allocation may be that large (the transport allocates nothing per message).
 * The harness itself is compiled without coverage instrumentation (tools/fuzz.mk): the fuzzer is
 * guided by the coverage of tcp.c, tcp_handshake.c, tcp_sock.c,
 * auth.c and status.c alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "distributed/tcp_internal.h"
#include "distributed/wire.h"
#include "rlx/dist.h"
#include "rlx/rlx.h"

enum { MSG = RLX_WIRE_MSG_BYTES, HEADB = RLX_WIRE_HEAD_BYTES, MACB = RLX_WIRE_MAC_BYTES, NOPS = 4 };

static const char TOKEN[] = "fuzz-token";
static const char OTHER_TOKEN[] = "other-token";

/* ---------------------------------------------------------------------------------------------
 * Findings, reading the input, time
 * ------------------------------------------------------------------------------------------- */

static void __attribute__((noreturn, format(printf, 1, 2))) finding(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout); /* the verbose lines before it, when replaying */
    fprintf(stderr, "tcp_wire finding: %s [rlx_last_error: %s]\n", msg, rlx_last_error());
    abort();
}

struct input {
    const uint8_t *p;
    size_t n, at;
};

static int more(const struct input *in) { return in->at < in->n; }
static uint8_t u8(struct input *in) { return in->at < in->n ? in->p[in->at++] : 0; }
/* Little-endian; each read a statement of its own (the order of a | operand's calls is unspecified). */
static uint16_t u16(struct input *in)
{
    uint16_t lo = u8(in);
    return (uint16_t)(lo | u8(in) << 8);
}
static uint32_t u32(struct input *in)
{
    uint32_t lo = u16(in);
    return lo | (uint32_t)u16(in) << 16;
}
static uint64_t u64(struct input *in)
{
    uint64_t lo = u32(in);
    return lo | (uint64_t)u32(in) << 32;
}

/* Up to `want` bytes of the input into out (the rest zero); returns how many there were. */
static size_t take(struct input *in, unsigned char *out, size_t want)
{
    size_t have = in->n - in->at < want ? in->n - in->at : want;
    memcpy(out, in->p + in->at, have);
    memset(out + have, 0, want - have);
    in->at += have;
    return have;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---------------------------------------------------------------------------------------------
 * Nonces: this build's rlx_crypto_random (auth.c's is renamed away by tools/fuzz.mk). Call k of
 * an input gives bytes derived from k, so the transport's HELLO is known in advance.
 * ------------------------------------------------------------------------------------------- */

static unsigned nonce_calls;

static void nonce_bytes(unsigned call, unsigned char *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)(0x5A ^ (call * 131u + (unsigned)i * 17u));
}

rlx_status rlx_crypto_random(void *out, size_t n)
{
    nonce_bytes(nonce_calls++, out, n);
    return RLX_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The wire, computed from wire.h's description with OpenSSL's HMAC()
 * ------------------------------------------------------------------------------------------- */

/* out = HMAC-SHA-256(key, a || b || c || d) */
static void hmac4(const void *key, size_t key_len, const void *a, size_t an, const void *b, size_t bn, const void *c,
                  size_t cn, const void *d, size_t dn, unsigned char out[MACB])
{
    static unsigned char buf[8 + 16 + 65536 + 256]; /* the largest: a frame's seq, header, payload */
    if (an + bn + cn + dn > sizeof buf) finding("harness: %zu bytes to MAC", an + bn + cn + dn);
    memcpy(buf, a, an);
    memcpy(buf + an, b, bn);
    memcpy(buf + an + bn, c, cn);
    memcpy(buf + an + bn + cn, d, dn);
    unsigned int len = MACB;
    if (HMAC(EVP_sha256(), key, (int)key_len, buf, an + bn + cn + dn, out, &len) == NULL || len != MACB)
        finding("harness: HMAC failed");
}

/* HMAC(token or the public K0, label with its NUL || hello_c || hello_a) */
static void transcript_mac(const char *token, const char *label, const unsigned char *hc, const unsigned char *ha,
                           unsigned char out[MACB])
{
    const char *key = token != NULL ? token : RLX_WIRE_KEY_NO_TOKEN;
    hmac4(key, strlen(key), label, strlen(label) + 1, hc, MSG, ha, MSG, "", 0, out);
}

/* HMAC(key, u64 seq || header || payload) */
static void frame_mac(const unsigned char key[MACB], uint64_t seq, const unsigned char head[16],
                      const unsigned char *payload, size_t n, unsigned char out[MACB])
{
    unsigned char seq_le[8];
    rlx_wire_u64_encode(seq_le, seq);
    hmac4(key, MACB, seq_le, 8, head, 16, payload, n, "", 0, out);
}

static unsigned char tag_byte_value(uint8_t b, struct input *in, uint32_t *tag)
{
    static const uint32_t special[] = {RLX_WIRE_TAG_BROADCAST, RLX_WIRE_TAG_BARRIER_ARRIVE, RLX_WIRE_TAG_BARRIER_LEAVE,
                                       RLX_WIRE_TAG_RESERVED,  RLX_WIRE_USER_TAG_LIMIT,     0xFFFFFFFFu};
    if (b < 0xF0)
        *tag = b % 8;
    else if (b < 0xF6)
        *tag = special[b - 0xF0];
    else
        *tag = in != NULL ? u32(in) : 0xFFFFFFFEu;
    return b;
}

/* ---------------------------------------------------------------------------------------------
 * The peer: writes its whole script into its end of the socketpair, keeping a model of it
 * ------------------------------------------------------------------------------------------- */

struct sent_frame {
    uint32_t tag;
    size_t len;
    const unsigned char *payload; /* in `arena` */
    int authentic; /* whole, honest length, MAC right for its place in the stream under the peer's keys */
};

/* Every frame the peer writes, as written (header, payload, MAC), one input at a time. A script that
 * outgrows either is cut there, as if the socket were full. */
enum { MAX_FRAMES = 1024, ARENA_BYTES = 1 << 21 };
static struct sent_frame frame_log[MAX_FRAMES];
static unsigned char arena[ARENA_BYTES];
static size_t arena_used;

struct peer {
    int fd;                       /* the peer's end */
    int rlx_accepts;              /* the transport is the acceptor */
    int rlx_rank, rank, world;    /* the transport's rank, the peer's (as a correct peer claims it) */
    int rlx_token;                /* the transport has TOKEN */
    const char *token;            /* the peer's: TOKEN, OTHER_TOKEN or NULL */
    unsigned char rlx_hello[MSG]; /* the transport's HELLO (predicted) */
    unsigned char hello[MSG];     /* the peer's last whole HELLO */
    unsigned char send_key[MACB]; /* frame keys under the peer's view of the transcript */
    unsigned char recv_key[MACB];
    struct sent_frame *frames; /* every FRAME op, in order (index = its sequence number): frame_log */
    size_t nframes;
    unsigned char stream[2 * MSG]; /* the first 96 bytes written */
    size_t written;
    int shut, full;      /* shut down; a write would have blocked (the rest dropped) */
    int deaf;            /* stopped reading: the transport's sends fail */
    int clean;           /* everything so far is a correct handshake + correct frames */
    size_t clean_frames; /* frames in that clean stretch */
};

static void peer_write(struct peer *p, const void *data, size_t n)
{
    if (n == 0) return;
    if (p->shut || p->full) {
        p->clean = 0;
        return;
    }
    const unsigned char *b = data;
    for (size_t i = 0; i < n && p->written + i < sizeof p->stream; i++) p->stream[p->written + i] = b[i];
    size_t done = 0;
    while (done < n) {
        ssize_t s = send(p->fd, b + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (s > 0) {
            done += (size_t)s;
            continue;
        }
        if (s < 0 && errno == EINTR) continue;
        p->full = 1; /* the socket buffer is full: the rest of the script is dropped */
        p->clean = 0;
        break;
    }
    p->written += done;
}

/* The connector's and the acceptor's HELLO of the transcript under the peer's view. */
static const unsigned char *hello_c(const struct peer *p) { return p->rlx_accepts ? p->hello : p->rlx_hello; }
static const unsigned char *hello_a(const struct peer *p) { return p->rlx_accepts ? p->rlx_hello : p->hello; }

static void derive_keys(struct peer *p)
{
    const char *to_rlx = p->rlx_accepts ? RLX_WIRE_LABEL_KEY_C2A : RLX_WIRE_LABEL_KEY_A2C;
    const char *from_rlx = p->rlx_accepts ? RLX_WIRE_LABEL_KEY_A2C : RLX_WIRE_LABEL_KEY_C2A;
    transcript_mac(p->token, to_rlx, hello_c(p), hello_a(p), p->send_key);
    transcript_mac(p->token, from_rlx, hello_c(p), hello_a(p), p->recv_key);
}

static void op_hello(struct peer *p, struct input *in, uint8_t flags)
{
    unsigned char m[MSG];
    uint32_t magic = flags & 1 ? u32(in) : RLX_WIRE_HELLO_MAGIC;
    uint16_t version = flags & 2 ? u16(in) : RLX_TCP_PROTOCOL_VERSION;
    uint16_t info = flags & 4 ? u16(in) : (p->token != NULL ? RLX_WIRE_FLAG_TOKEN : 0);
    uint32_t rank = flags & 8 ? u32(in) : (uint32_t)p->rank;
    uint32_t world = flags & 16 ? u32(in) : (uint32_t)p->world;
    rlx_wire_head_encode(m, magic, version, info, rank, world);
    if (flags & 32)
        memcpy(m + HEADB, p->rlx_hello + HEADB, RLX_WIRE_NONCE_BYTES);
    else if (flags & 64)
        take(in, m + HEADB, RLX_WIRE_NONCE_BYTES);
    else
        nonce_bytes(1000, m + HEADB, RLX_WIRE_NONCE_BYTES); /* never one of the transport's */
    if (flags & 128) {
        peer_write(p, m, u8(in) % MSG);
        return;
    }
    peer_write(p, m, MSG);
    memcpy(p->hello, m, MSG);
    derive_keys(p);
}

static void op_proof(struct peer *p, struct input *in, uint8_t flags)
{
    unsigned char m[MSG];
    int peer_connects = p->rlx_accepts;
    const char *mine = peer_connects ? RLX_WIRE_LABEL_PROOF_C : RLX_WIRE_LABEL_PROOF_A;
    const char *theirs = peer_connects ? RLX_WIRE_LABEL_PROOF_A : RLX_WIRE_LABEL_PROOF_C;
    uint32_t magic = flags & 1 ? u32(in) : RLX_WIRE_PROOF_MAGIC;
    uint16_t version = flags & 16 ? u16(in) : RLX_TCP_PROTOCOL_VERSION;
    uint32_t rank = flags & 32 ? u32(in) : (uint32_t)p->rank;
    uint32_t world = flags & 64 ? u32(in) : (uint32_t)p->world;
    rlx_wire_head_encode(m, magic, version, 0, rank, world);
    if (flags & 4)
        take(in, m + HEADB, MACB);
    else if (flags & 8) /* the transport's own proof, reflected */
        transcript_mac(TOKEN, theirs, hello_c(p), hello_a(p), m + HEADB);
    else
        transcript_mac(p->token != NULL ? p->token : TOKEN, flags & 2 ? theirs : mine, hello_c(p), hello_a(p),
                       m + HEADB);
    if (flags & 128) {
        peer_write(p, m, u8(in) % MSG);
        return;
    }
    peer_write(p, m, MSG);
}

static void op_refuse(struct peer *p, struct input *in, uint8_t flags)
{
    unsigned char m[HEADB];
    uint16_t version = flags & 1 ? u16(in) : RLX_TCP_PROTOCOL_VERSION;
    uint32_t rank = flags & 2 ? u32(in) : (uint32_t)p->rank;
    uint32_t world = flags & 4 ? u32(in) : (uint32_t)p->world;
    rlx_wire_head_encode(m, RLX_WIRE_REFUSE_MAGIC, version, u16(in), rank, world);
    peer_write(p, m, HEADB);
}

static void op_auto(struct peer *p)
{
    op_hello(p, NULL, 0);
    if (p->token != NULL) op_proof(p, NULL, 0);
}

static void op_frame(struct peer *p, struct input *in, uint8_t flags)
{
    uint32_t tag;
    tag_byte_value(u8(in), in, &tag);
    size_t want = u16(in), len;
    if (p->nframes == MAX_FRAMES || ARENA_BYTES - arena_used < 16 + want + MACB) {
        p->full = 1; /* the script is cut here */
        p->clean = 0;
        return;
    }
    unsigned char *wire = arena + arena_used, *payload = wire + 16;
    uint64_t seq = p->nframes;
    if (flags & 1) {
        for (size_t j = 0; j < want; j++) payload[j] = (unsigned char)(seq * 31 + j * 7 + 1);
        len = want;
    } else {
        len = take(in, payload, want);
    }
    uint64_t length = flags & 2 ? u64(in) : len;
    uint32_t magic = flags & 64 ? u32(in) : RLX_WIRE_FRAME_MAGIC;
    unsigned char head[16], mac[MACB], right[MACB];
    rlx_wire_frame_encode(head, tag, length);
    uint32_t magic_le = htole32(magic);
    memcpy(head, &magic_le, 4);
    frame_mac(p->send_key, seq, head, payload, len, right);
    if (flags & 4)
        take(in, mac, MACB);
    else if (flags & 8)
        frame_mac(p->send_key, seq + 1, head, payload, len, mac);
    else if (flags & 16)
        frame_mac(p->recv_key, seq, head, payload, len, mac);
    else
        memcpy(mac, right, MACB);
    size_t total = 16 + len + (flags & 32 ? 0 : MACB);
    size_t cut = flags & 128 ? u16(in) % (total + 1) : total;
    struct sent_frame f = {.tag = tag, .len = len, .payload = payload};
    f.authentic = cut == total && !(flags & 32) && magic == RLX_WIRE_FRAME_MAGIC && length == len &&
                  memcmp(mac, right, MACB) == 0;
    p->frames[p->nframes++] = f;
    memcpy(wire, head, 16);
    if (!(flags & 32)) memcpy(wire + 16 + len, mac, MACB);
    arena_used += total;
    peer_write(p, wire, cut);
    if (flags & ~1 || !f.authentic) p->clean = 0;
    if (p->clean) p->clean_frames = p->nframes;
}

/* ---------------------------------------------------------------------------------------------
 * Checking what the transport does
 * ------------------------------------------------------------------------------------------- */

enum { A_OK = 1, A_INVALID = 2, A_RANGE = 4, A_IO = 8 };

static void check_status(rlx_status s, int allowed, const char *what)
{
    int bit = s == RLX_OK            ? A_OK
              : s == RLX_ERR_INVALID ? A_INVALID
              : s == RLX_ERR_RANGE   ? A_RANGE
              : s == RLX_ERR_IO      ? A_IO
                                     : 0;
    if (!(bit & allowed))
        finding("%s returned %s (%d), which its contract does not allow here", what, rlx_status_name(s), s);
    if (s != RLX_OK && rlx_last_error()[0] == '\0')
        finding("%s returned %s without a message", what, rlx_status_name(s));
}

static double deadline_slack_ms; /* how long a call may take: nothing to wait for, or its deadline */

static void check_time(double t0, const char *what)
{
    double took = now_ms() - t0;
    if (took > deadline_slack_ms)
        finding("%s took %.0f ms (limit %.0f ms: the peer's bytes were all there)", what, took, deadline_slack_ms);
}

static int log_count;

static void log_cb(enum rlx_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level != RLX_LOG_WARN || msg == NULL || msg[0] == '\0' || strnlen(msg, 600) >= 512)
        finding("a log message of level %d that is empty or unterminated", (int)level);
    log_count++;
}

/* The transport's frames sent, for checking its output. */
struct rlx_sent {
    uint32_t tag;
    size_t len;
    uint64_t seed;
};

static unsigned char pattern(uint64_t seed, size_t j) { return (unsigned char)(seed * 13 + j * 5 + 3); }

/* Checks a handshake that succeeded against the peer's own bytes: the first HELLO (and proof) the
 * transport read is what wire.h accepts. */
static void check_opened(const struct peer *p, int linked_rank, rlx_status s)
{
    if (s != RLX_OK) return;
    if (p->written < MSG) finding("a link opened after %zu bytes from the peer", p->written);
    struct rlx_wire_head h = rlx_wire_head_decode(p->stream);
    if (h.magic != RLX_WIRE_HELLO_MAGIC || h.version != RLX_TCP_PROTOCOL_VERSION || h.world != (uint32_t)p->world)
        finding("a link opened on a HELLO with magic 0x%08" PRIx32 ", version %u, world %" PRIu32, h.magic,
                (unsigned)h.version, h.world);
    if (((h.info & RLX_WIRE_FLAG_TOKEN) != 0) != p->rlx_token)
        finding("a link opened with a peer whose token flag (info 0x%x) differs", (unsigned)h.info);
    if (p->rlx_accepts && (h.rank != (uint32_t)linked_rank || linked_rank <= p->rlx_rank || linked_rank >= p->world))
        finding("the acceptor (rank %d) linked rank %d for a HELLO from rank %" PRIu32, p->rlx_rank, linked_rank,
                h.rank);
    if (!p->rlx_accepts && h.rank != (uint32_t)p->rank)
        finding("the connector linked rank %d for a HELLO from rank %" PRIu32, p->rank, h.rank);
    if (!p->rlx_accepts && memcmp(p->stream + HEADB, p->rlx_hello + HEADB, RLX_WIRE_NONCE_BYTES) == 0)
        finding("the connector linked after its own nonce came back");
    if (!p->rlx_token) return;
    const unsigned char *hc = p->rlx_accepts ? p->stream : p->rlx_hello,
                        *ha = p->rlx_accepts ? p->rlx_hello : p->stream;
    unsigned char right[MACB];
    transcript_mac(TOKEN, p->rlx_accepts ? RLX_WIRE_LABEL_PROOF_C : RLX_WIRE_LABEL_PROOF_A, hc, ha, right);
    if (p->written < 2 * MSG || memcmp(p->stream + MSG + HEADB, right, MACB) != 0)
        finding("with a token, a link opened although the peer's second message is not a right proof of it");
}

/* Checks every byte the transport sent to the peer (read once the transport is closed). */
static void check_output(const struct peer *p, const unsigned char *out, size_t n, int opened,
                         const struct rlx_sent *sent, size_t nsent, int send_failed)
{
    size_t at = 0;
    int refused = 0, proofs = 0;
    while (at < n && !(opened && at >= (size_t)(p->rlx_token ? 2 * MSG : MSG))) {
        if (n - at < HEADB) finding("the transport's handshake output ends with %zu stray bytes", n - at);
        struct rlx_wire_head h = rlx_wire_head_decode(out + at);
        if (h.version != RLX_TCP_PROTOCOL_VERSION || h.rank != (uint32_t)p->rlx_rank || h.world != (uint32_t)p->world)
            finding("the transport sent a HEAD of version %u, rank %" PRIu32 ", world %" PRIu32, (unsigned)h.version,
                    h.rank, h.world);
        if (p->rlx_accepts && (p->written < HEADB || memcmp(p->stream, "RLXH", 4) != 0))
            finding("the acceptor answered a peer that does not start with a HEAD with rlx's magic");
        if (refused) finding("the transport sent more after its REFUSE");
        if (h.magic == RLX_WIRE_REFUSE_MAGIC) {
            if (!p->rlx_accepts || h.info < RLX_WIRE_REFUSE_WORLD || h.info > RLX_WIRE_REFUSE_DUPLICATE)
                finding("a REFUSE with reason %u from the %s", (unsigned)h.info,
                        p->rlx_accepts ? "acceptor" : "connector");
            refused = 1;
            at += HEADB;
            continue;
        }
        if (n - at < MSG) finding("the transport's handshake output ends inside a message");
        if (h.magic == RLX_WIRE_HELLO_MAGIC) {
            /* Its first message; or, from an acceptor with a token, the answer to a proof of another
             * protocol version (our HELLO tells the peer our version): a second HELLO, fresh nonce. */
            struct rlx_wire_head second = rlx_wire_head_decode(p->stream + MSG);
            unsigned char want[MSG];
            memcpy(want, p->rlx_hello, MSG);
            if (at == MSG) nonce_bytes(1, want + HEADB, RLX_WIRE_NONCE_BYTES);
            if (!(at == 0 || (at == MSG && p->rlx_accepts && p->rlx_token && p->written >= MSG + HEADB &&
                              second.magic == RLX_WIRE_PROOF_MAGIC && second.version != RLX_TCP_PROTOCOL_VERSION)))
                finding("the transport sent a HELLO at byte %zu of its output", at);
            if (memcmp(out + at, want, MSG) != 0)
                finding("the transport's HELLO at byte %zu is not the one the harness predicted", at);
        } else if (h.magic == RLX_WIRE_PROOF_MAGIC) {
            if (!p->rlx_token || proofs++ > 0 || at != MSG) finding("a proof where none belongs");
            const unsigned char *peer_hello = p->stream;
            const unsigned char *hc = p->rlx_accepts ? peer_hello : p->rlx_hello;
            const unsigned char *ha = p->rlx_accepts ? p->rlx_hello : peer_hello;
            unsigned char right[MACB];
            if (p->rlx_accepts) { /* only after the peer's proof was right */
                transcript_mac(TOKEN, RLX_WIRE_LABEL_PROOF_C, hc, ha, right);
                if (p->written < 2 * MSG || memcmp(p->stream + MSG + HEADB, right, MACB) != 0)
                    finding("the acceptor sent its proof before the peer proved it knows the token");
            }
            transcript_mac(TOKEN, p->rlx_accepts ? RLX_WIRE_LABEL_PROOF_A : RLX_WIRE_LABEL_PROOF_C, hc, ha, right);
            if (memcmp(out + at + HEADB, right, MACB) != 0)
                finding("the transport's proof is not HMAC(token, label || transcript)");
        } else {
            finding("the transport sent a handshake message with magic 0x%08" PRIx32, h.magic);
        }
        at += MSG;
    }
    if (opened && at != (size_t)(p->rlx_token ? 2 * MSG : MSG))
        finding("a link opened after %zu bytes of handshake from the transport", at);
    if (!opened) {
        if (at != n) finding("%zu bytes after a failed handshake", n - at);
        return;
    }
    /* Frames, under the key of the direction transport -> peer for the transcript it used. */
    const unsigned char *hc = p->rlx_accepts ? p->stream : p->rlx_hello,
                        *ha = p->rlx_accepts ? p->rlx_hello : p->stream;
    const char *rlx_token = p->rlx_token ? TOKEN : NULL;
    unsigned char key[MACB];
    transcript_mac(rlx_token, p->rlx_accepts ? RLX_WIRE_LABEL_KEY_A2C : RLX_WIRE_LABEL_KEY_C2A, hc, ha, key);
    for (size_t i = 0; i < nsent; i++) {
        if (n - at < 16 + MACB) finding("the transport's frame %zu is cut short", i);
        struct rlx_wire_frame f = rlx_wire_frame_decode(out + at);
        if (f.magic != RLX_WIRE_FRAME_MAGIC || f.tag != sent[i].tag || f.length != sent[i].len ||
            n - at < 16 + f.length + MACB)
            finding("the transport's frame %zu has magic 0x%08" PRIx32 ", tag %" PRIu32 ", %" PRIu64 " bytes "
                    "(sent: tag %" PRIu32 ", %zu bytes)",
                    i, f.magic, f.tag, f.length, sent[i].tag, sent[i].len);
        for (size_t j = 0; j < sent[i].len; j++)
            if (out[at + 16 + j] != pattern(sent[i].seed, j))
                finding("the transport's frame %zu differs from what it was given at byte %zu", i, j);
        unsigned char right[MACB];
        frame_mac(key, i, out + at, out + at + 16, sent[i].len, right);
        if (memcmp(right, out + at + 16 + sent[i].len, MACB) != 0)
            finding("the transport's frame %zu has a wrong MAC", i);
        at += 16 + sent[i].len + MACB;
    }
    if (at != n && !send_failed) finding("%zu stray bytes after the transport's frames", n - at);
}

/* A second connection to the transport whose correct HELLO claims `linked`, which is linked already:
 * the acceptor must answer exactly REFUSE(DUPLICATE), the connector must refuse the socket as an
 * argument (a rank it has a link to); either way the socket is closed and the link untouched. */
static rlx_status second_connection(const struct peer *p, struct rlx_transport *t, int linked)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        finding("harness: socketpair: %s", strerror(errno));
    unsigned char hello[MSG], answer[64];
    rlx_wire_head_encode(hello, RLX_WIRE_HELLO_MAGIC, RLX_TCP_PROTOCOL_VERSION, p->rlx_token ? RLX_WIRE_FLAG_TOKEN : 0,
                         (uint32_t)linked, (uint32_t)p->world);
    nonce_bytes(2000, hello + HEADB, RLX_WIRE_NONCE_BYTES);
    if (send(sv[1], hello, MSG, MSG_NOSIGNAL | MSG_DONTWAIT) != MSG)
        finding("harness: writing the second HELLO: %s", strerror(errno));
    shutdown(sv[1], SHUT_WR);
    int other = -1;
    rlx_status s = p->rlx_accepts ? rlx_tcp_accept_fd(t, sv[0], &other) : rlx_tcp_connect_fd(t, linked, sv[0]);
    if (fcntl(sv[0], F_GETFD) != -1 || errno != EBADF)
        finding("the second connection's socket (fd %d) is still open", sv[0]);
    ssize_t n = recv(sv[1], answer, sizeof answer, MSG_DONTWAIT);
    struct rlx_wire_head h = rlx_wire_head_decode(answer);
    if (p->rlx_accepts && (n != HEADB || h.magic != RLX_WIRE_REFUSE_MAGIC || h.info != RLX_WIRE_REFUSE_DUPLICATE ||
                           h.version != RLX_TCP_PROTOCOL_VERSION || h.rank != (uint32_t)p->rlx_rank))
        finding("the acceptor answered a second connection from rank %d with %zd bytes, not REFUSE(duplicate)", linked,
                n);
    if (!p->rlx_accepts && n > 0) finding("the connector wrote %zd bytes on a socket it should not have taken", n);
    close(sv[1]);
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * One input
 * ------------------------------------------------------------------------------------------- */

static unsigned char out_buf[1 << 20];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int started;
    if (!started) {
        rlx_set_log_callback(log_cb, NULL);
        started = 1;
    }
    int verbose = getenv("RLX_FUZZ_VERBOSE") != NULL;
    struct input in = {.p = data, .n = size};
    uint8_t mode = u8(&in), sizes = u8(&in);
    uint8_t ops[NOPS][4];
    for (int i = 0; i < NOPS; i++)
        for (int j = 0; j < 4; j++) ops[i][j] = u8(&in);

    struct peer p = {.rlx_accepts = !(mode & 1), .rlx_token = (mode & 2) != 0, .frames = frame_log};
    arena_used = 0;
    int differ = (mode & 4) != 0, allow_remote = (mode & 8) != 0, keep_open = (mode & 16) != 0;
    p.token = p.rlx_token ? (differ ? OTHER_TOKEN : TOKEN) : (differ ? TOKEN : NULL);
    p.world = 2 + (sizes & 3);
    if (p.rlx_accepts) {
        p.rlx_rank = (sizes >> 2) % (p.world - 1);
        p.rank = p.rlx_rank + 1 + (sizes >> 5) % (p.world - 1 - p.rlx_rank);
    } else {
        p.rlx_rank = 1 + (sizes >> 2) % (p.world - 1);
        p.rank = (sizes >> 5) % p.rlx_rank;
    }
    static const size_t max_bytes[4] = {64, 4096, 65536, 0};
    struct rlx_tcp_opts opts = {.max_message_bytes = max_bytes[mode >> 6],
                                .timeout_ms = keep_open ? 1 : 5000,
                                .token = p.rlx_token ? TOKEN : NULL,
                                .allow_remote = allow_remote};
    size_t max = opts.max_message_bytes ? opts.max_message_bytes : (size_t)1 << 30;
    deadline_slack_ms = keep_open ? 1 + 2000 : 2000;
    int expect_open = p.rlx_token ? p.token == TOKEN : p.token == NULL && allow_remote;

    nonce_calls = 0;
    rlx_wire_head_encode(p.rlx_hello, RLX_WIRE_HELLO_MAGIC, RLX_TCP_PROTOCOL_VERSION,
                         p.rlx_token ? RLX_WIRE_FLAG_TOKEN : 0, (uint32_t)p.rlx_rank, (uint32_t)p.world);
    nonce_bytes(0, p.rlx_hello + HEADB, RLX_WIRE_NONCE_BYTES);
    memcpy(p.hello, p.rlx_hello, MSG); /* no HELLO from the peer yet: keys under a transcript that cannot be */
    derive_keys(&p);

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        finding("harness: socketpair: %s", strerror(errno));
    int big = 1 << 20;
    (void)setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    p.fd = sv[1];
    p.clean = (mode & 32) != 0 && expect_open && !keep_open;
    int clean_start = p.clean;
    if (mode & 32) op_auto(&p);
    while (more(&in)) {
        uint8_t op = u8(&in);
        if (op % 7 != 3) p.clean = 0; /* only correct frames may follow the opening handshake in a clean script */
        switch (op % 7) {
        case 0: {
            unsigned char raw[256];
            size_t n = take(&in, raw, u8(&in));
            peer_write(&p, raw, n);
            break;
        }
        case 1: op_hello(&p, &in, u8(&in)); break;
        case 2: op_proof(&p, &in, u8(&in)); break;
        case 3: op_frame(&p, &in, u8(&in)); break;
        case 4: {
            int how = u8(&in) % 3;
            shutdown(p.fd, how == 0 ? SHUT_WR : how == 1 ? SHUT_RD : SHUT_RDWR);
            p.shut |= how != 1;
            p.deaf |= how != 0;
            break;
        }
        case 5: op_auto(&p); break;
        default: op_refuse(&p, &in, u8(&in)); break;
        }
    }
    if (!keep_open && !p.shut) {
        shutdown(p.fd, SHUT_WR);
        p.shut = 1;
    }

    /* The transport's side. */
    struct rlx_transport *t = NULL;
    rlx_status s = rlx_tcp_transport_unconnected(p.rlx_rank, p.world, &opts, &t);
    check_status(s, A_OK, "rlx_tcp_transport_unconnected");
    int rlx_fd = sv[0], linked = p.rank;
    double t0 = now_ms();
    if (p.rlx_accepts) {
        s = rlx_tcp_accept_fd(t, rlx_fd, &linked);
        check_status(s, A_OK | A_IO, "rlx_tcp_accept_fd");
        if (s != RLX_OK) linked = p.rank;
    } else {
        s = rlx_tcp_connect_fd(t, p.rank, rlx_fd);
        check_status(s, A_OK | A_IO | (!p.rlx_token && !allow_remote ? A_INVALID : 0), "rlx_tcp_connect_fd");
    }
    if (verbose)
        printf("tcp_wire:   handshake: %s%s%s\n", rlx_status_name(s), s != RLX_OK ? ": " : "",
               s != RLX_OK ? rlx_last_error() : "");
    check_time(t0, "the handshake");
    int opened = s == RLX_OK;
    check_opened(&p, linked, s);
    if (opened && !p.rlx_token && !allow_remote)
        finding("without a token or allow_remote, a link opened to a peer that is not on loopback");
    /* The correct handshake written first decides, unless the peer stopped reading (the transport's answer
     * fails) or the deadline is 1 ms (the transport may pass it computing, with every byte there). */
    if ((mode & 32) && !p.deaf && !keep_open && opened != expect_open)
        finding("a correct handshake %s (token %s, peer's %s, allow_remote %d)", opened ? "opened" : "failed",
                p.rlx_token ? "yes" : "no", p.token ? p.token : "none", allow_remote);

    /* The operations, checked against the peer's frames. */
    struct rlx_sent sent[NOPS];
    size_t nsent = 0;
    int send_failed = 0, was_open = opened;
    uint64_t received = 0;
    static unsigned char buf[65536];
    for (int i = 0; i < NOPS; i++) {
        int kind = ops[i][0] % 8;
        uint32_t tag;
        tag_byte_value(ops[i][1], NULL, &tag);
        size_t size = (size_t)(ops[i][2] | ops[i][3] << 8);
        int user_tag = tag < RLX_WIRE_USER_TAG_LIMIT;
        uint64_t m0 = 0, m1 = 0, out0 = 0, out1 = 0;
        int open0 = rlx_tcp_link_info(t, linked, &m0, &out0);
        if (open0 != was_open) finding("the link's state changed between calls (%d, was %d)", open0, was_open);
        size_t got = (size_t)-1;
        uint64_t seed = nsent;                         /* the payload pattern of a frame this op sends */
        int allowed = A_IO, exact = 0, exact_size = 0; /* exact: the contract's outcome is known (below) */
        char what[64];
        t0 = now_ms();
        switch (kind) {
        case 0:
            if (!(ops[i][1] & 1) || !open0) continue;
            snprintf(what, sizeof what, "a second connection claiming rank %d", linked);
            s = second_connection(&p, t, linked);
            allowed = p.rlx_accepts ? A_IO : A_INVALID;
            break;
        case 1:
        case 2:
            snprintf(what, sizeof what, "recv(tag %" PRIu32 ", %zu bytes)", tag, size);
            s = t->ops->recv(t, linked, tag, buf, size, &got);
            allowed = user_tag ? A_OK | A_RANGE | A_IO : A_INVALID;
            exact = user_tag;
            break;
        case 3:
            snprintf(what, sizeof what, "send(tag %" PRIu32 ", %zu bytes)", tag, size % 4096);
            for (size_t j = 0; j < size % 4096; j++) buf[j] = pattern(seed, j);
            if (keep_open && (size & 0x8000) && open0) { /* the smallest send buffer the kernel allows */
                int one = 1;
                (void)setsockopt(rlx_fd, SOL_SOCKET, SO_SNDBUF, &one, sizeof one);
            }
            s = t->ops->send(t, linked, tag, buf, size % 4096);
            allowed = !user_tag ? A_INVALID : size % 4096 > max ? A_RANGE : A_OK | A_IO;
            break;
        case 4:
            snprintf(what, sizeof what, "broadcast from rank %d (%zu bytes)", linked, size);
            s = t->ops->broadcast(t, linked, buf, size);
            allowed = size > max ? A_RANGE : A_OK | A_IO; /* a size the root got wrong is its fault: IO */
            tag = RLX_WIRE_TAG_BROADCAST;
            got = size; /* what a broadcast that succeeds has received */
            exact = size <= max;
            exact_size = 1;
            break;
        case 5:
            snprintf(what, sizeof what, "broadcast to the others (%zu bytes)", size % 4096);
            for (size_t j = 0; j < size % 4096; j++) buf[j] = pattern(seed, j);
            s = t->ops->broadcast(t, p.rlx_rank, buf, size % 4096);
            allowed = size % 4096 > max ? A_RANGE : A_OK | A_IO;
            break;
        case 6:
            snprintf(what, sizeof what, "barrier");
            s = t->ops->barrier(t);
            allowed = A_OK | A_IO;
            tag = p.rlx_rank == 0 ? RLX_WIRE_TAG_BARRIER_ARRIVE : RLX_WIRE_TAG_BARRIER_LEAVE; /* what it receives */
            got = size = 0;
            exact = p.world == 2; /* with more ranks it also needs links this input has not got */
            exact_size = 1;
            break;
        default: {
            int src = (int)(ops[i][1] % (unsigned)(p.world + 2)) - 1; /* -1 .. world */
            snprintf(what, sizeof what, "recv from rank %d", src);
            s = t->ops->recv(t, src, 0, buf, size, &got);
            allowed = src < 0 || src >= p.world || src == p.rlx_rank ? A_INVALID
                      : src == linked                                ? A_OK | A_RANGE | A_IO
                                                                     : A_IO;
            tag = 0;
            exact = src == linked;
            break;
        }
        }
        if (verbose)
            printf("tcp_wire:   %s: %s%s%s\n", what, rlx_status_name(s), s != RLX_OK ? ": " : "",
                   s != RLX_OK ? rlx_last_error() : "");
        check_status(s, allowed, what);
        check_time(t0, what);
        int open1 = rlx_tcp_link_info(t, linked, &m1, &out1);
        if (open1 < 0 || (open1 && !open0)) finding("after %s the link is %d (was %d)", what, open1, open0);
        if (!open0 && (m1 != m0 || s == RLX_OK))
            finding("%s on a closed link returned %s and moved the frame count", what, rlx_status_name(s));
        if (m1 > m0 + 1 || m1 < m0) finding("%s moved the frames received from %" PRIu64 " to %" PRIu64, what, m0, m1);
        /* Each op sends at most one frame to the peer (the other ranks have no links); which one. */
        int receives = kind == 1 || kind == 2 || kind == 4 || kind == 6 || kind == 7;
        if (out1 > out0 + 1 || (out1 == out0 + 1 && receives && kind != 6))
            finding("%s moved the frames sent from %" PRIu64 " to %" PRIu64, what, out0, out1);
        if (out1 == out0 + 1) {
            struct rlx_sent f = {.tag = tag, .len = size % 4096, .seed = seed};
            if (kind == 5) f.tag = RLX_WIRE_TAG_BROADCAST;
            if (kind == 6)
                f = (struct rlx_sent){.tag =
                                          p.rlx_rank == 0 ? RLX_WIRE_TAG_BARRIER_LEAVE : RLX_WIRE_TAG_BARRIER_ARRIVE};
            sent[nsent++] = f;
        }
        if ((kind == 3 || kind == 5 || kind == 6) && s == RLX_ERR_IO && open1 == 0 && open0 == 1)
            send_failed = 1; /* a send cut short may have left part of a frame */
        received = m1;

        /* A frame consumed must be the peer's frame m0, whole and with a right MAC. */
        if (m1 == m0 + 1) {
            if (m0 >= p.nframes || !p.frames[m0].authentic)
                finding("%s consumed frame %" PRIu64 ", which the peer did not send with a right MAC (%zu frames)",
                        what, m0, p.nframes);
            const struct sent_frame *f = &p.frames[m0];
            if (s == RLX_OK && receives &&
                (f->tag != tag || got != f->len || (f->len > 0 && memcmp(buf, f->payload, f->len) != 0)))
                finding("%s returned %zu bytes; the peer's frame %" PRIu64 " has tag %" PRIu32 " and %zu bytes", what,
                        got, m0, f->tag, f->len);
        } else if (s == RLX_OK && receives) {
            finding("%s succeeded without consuming a frame", what);
        }
        if (s == RLX_OK && (kind == 1 || kind == 2 || kind == 7) && got > size)
            finding("%s returned %zu bytes into a %zu-byte buffer", what, got, size);

        /* After a correct handshake and correct frames: exactly the contract's outcome. */
        if (exact && open0 && clean_start && (m0 < p.clean_frames || (m0 == p.clean_frames && p.clean))) {
            if (m0 == p.clean_frames) {
                if (s != RLX_ERR_IO || open1)
                    finding("%s after the peer's last frame and EOF: %s, link %d", what, rlx_status_name(s), open1);
            } else {
                const struct sent_frame *f = &p.frames[m0];
                if (f->len > max) {
                    if (s != RLX_ERR_IO || open1 || m1 != m0)
                        finding("%s of a %zu-byte frame above max %zu: %s, link %d", what, f->len, max,
                                rlx_status_name(s), open1);
                } else {
                    rlx_status want = f->tag != tag                  ? RLX_ERR_IO
                                      : exact_size && f->len != size ? RLX_ERR_IO
                                      : f->len > size                ? RLX_ERR_RANGE
                                                                     : RLX_OK;
                    if (s != want || !open1 || m1 != m0 + 1)
                        finding("%s of the peer's frame %" PRIu64 " (tag %" PRIu32 ", %zu bytes): %s, link %d; "
                                "expected %s with the link open",
                                what, m0, f->tag, f->len, rlx_status_name(s), open1, rlx_status_name(want));
                }
            }
        }
        was_open = open1;
        /* Kept open, the peer sends nothing more: after a recv that timed out before the first byte of a
         * frame (no frame consumed, the link kept), every later one would only wait its 1 ms again. */
        if (keep_open && receives && s == RLX_ERR_IO && open1 && m1 == m0) break;
    }
    t->ops->close(t);
    if (fcntl(rlx_fd, F_GETFD) != -1 || errno != EBADF)
        finding("the transport's socket (fd %d) is still open after close", rlx_fd);

    /* What the transport sent. */
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(p.fd, out_buf + n, sizeof out_buf - n, MSG_DONTWAIT);
        if (r > 0 && (n += (size_t)r) < sizeof out_buf) continue;
        if (r < 0 && errno == EINTR) continue;
        break;
    }
    if (!p.deaf) check_output(&p, out_buf, n, opened, sent, nsent, send_failed);
    close(p.fd);
    if (verbose)
        printf("tcp_wire: %s %s: handshake %s, %zu peer frames, %" PRIu64 " received, %zu sent\n",
               p.rlx_accepts ? "acceptor" : "connector", p.rlx_token ? "token" : "no-token",
               opened ? "opened" : "failed", p.nframes, received, nsent);
    return 0;
}
