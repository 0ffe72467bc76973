/*
 * wire.h - the byte layout of the TCP transport (tcp.c): the handshake that opens each connection
 * and the header and MAC around every message. Everything on the wire is
 * little-endian and packed; the structs below mirror it exactly (sizes static_assert'ed) and are
 * only ever filled and read through the encode/decode helpers, never sent as host structs.
 *
 * Protocol version 3. Every handshake message starts with the same 16-byte HEAD:
 *   HEAD   (16 bytes)  magic, u16 version, u16 info, u32 sender's rank, u32 sender's world size.
 *   HELLO  (48 bytes)  HEAD "RLXH" (info = flags: bit 0 = "I have a token") + 32-byte random nonce.
 *   PROOF  (48 bytes)  HEAD "RLXP" (info = 0) + 32-byte HMAC-SHA-256 (see below).
 *   REFUSE (16 bytes)  HEAD "RLXR" (info = an RLX_WIRE_REFUSE_* reason); the connection then closes.
 *   FRAME  (16 bytes)  magic "RLXF", u32 tag, u64 length; then `length` payload bytes; then a
 *                      32-byte HMAC-SHA-256 (the frame MAC).
 * A connection from rank c (the connector, c > a) to rank a (the acceptor):
 *   c -> a  HELLO_C                        (48)
 *   a -> c  HELLO_A or REFUSE              (48 / 16)   REFUSE when HELLO_C cannot be accepted
 *   with a token only:
 *   c -> a  PROOF_C = HMAC(token, "rlx-dist-v3 connector proof\0" || HELLO_C || HELLO_A)     (48)
 *   a -> c  PROOF_A = HMAC(token, "rlx-dist-v3 acceptor proof\0"  || HELLO_C || HELLO_A)     (48)
 *           or REFUSE (16) when PROOF_C is wrong: the acceptor checks the connector's proof before
 *           it sends anything derived from the token.
 * The transcript HELLO_C || HELLO_A binds the protocol version, both ranks, the world size, both
 * sides' token flags and both fresh nonces; the label binds the direction. Frame keys, one per
 * direction, come from the same transcript, keyed by the token or, without one, by the public
 * string K0 = "rlx-dist-v3 no token" (no NUL):
 *   K_c2a = HMAC(token or K0, "rlx-dist-v3 frames connector to acceptor\0" || HELLO_C || HELLO_A)
 *   K_a2c = HMAC(token or K0, "rlx-dist-v3 frames acceptor to connector\0" || HELLO_C || HELLO_A)
 *   frame MAC = HMAC(K_dir, u64 sequence number || FRAME header || payload), the sequence counting
 *   frames sent in that direction from 0.
 * Without a token the handshake is HELLO_C, HELLO_A (or REFUSE). Its frame keys are derived from
 * public bytes, so anyone who saw the HELLOs can forge a MAC: it authenticates nothing, but a frame
 * corrupted, lost, repeated or reordered on the way (a bit flip TCP's 16-bit checksum missed, a
 * broken middlebox) still fails the check instead of reaching the model. Version 2 sent no MAC
 * without a token, so such a fault could make every rank compute wrong tokens with no error.
 *
 * User tags are < 2^24; tags from RLX_WIRE_TAG_RESERVED up are the transport's own (broadcast,
 * barrier). Changing any of this means bumping RLX_TCP_PROTOCOL_VERSION (rlx/dist.h). Versions 1
 * (a 24-byte HELLO with an FNV hash of the token in clear) and 2 share the first 16 bytes of HEAD,
 * so each side can name the other's version.
 *
 * Nothing here is secret or replayable: nonces are fresh random bytes, proofs are bound to both
 * nonces. Nothing is encrypted: payloads travel in clear (authenticated with a token, not hidden).
 * The frame MAC costs one HMAC-SHA-256 pass over every payload on each side.
 */
#ifndef RLX_DIST_WIRE_H
#define RLX_DIST_WIRE_H

#include <assert.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>

/* The magics as u32 read little-endian from their four ASCII bytes. */
#define RLX_WIRE_HELLO_MAGIC  0x48584C52u /* "RLXH" */
#define RLX_WIRE_PROOF_MAGIC  0x50584C52u /* "RLXP" */
#define RLX_WIRE_REFUSE_MAGIC 0x52584C52u /* "RLXR" */
#define RLX_WIRE_FRAME_MAGIC  0x46584C52u /* "RLXF" */

#define RLX_WIRE_FLAG_TOKEN 1u /* HELLO info bit: the sender has a token (and will prove it) */

/* REFUSE reasons (HEAD.info). Append only. */
enum rlx_wire_refuse {
    RLX_WIRE_REFUSE_WORLD = 1,     /* the HELLO's world size differs from the acceptor's */
    RLX_WIRE_REFUSE_RANK = 2,      /* the HELLO's rank is not one the acceptor accepts */
    RLX_WIRE_REFUSE_TOKEN = 3,     /* one side has a token and the other has none */
    RLX_WIRE_REFUSE_REMOTE = 4,    /* no token and the connector is not on loopback */
    RLX_WIRE_REFUSE_PROOF = 5,     /* PROOF_C is wrong (a different token, or a replay) */
    RLX_WIRE_REFUSE_DUPLICATE = 6, /* that rank is already connected */
};

#define RLX_WIRE_NONCE_BYTES 32
#define RLX_WIRE_MAC_BYTES   32 /* HMAC-SHA-256 */

#define RLX_WIRE_USER_TAG_LIMIT     (1u << 24)  /* user tags are < this */
#define RLX_WIRE_TAG_RESERVED       0xFFFFFF00u /* tags >= this belong to the transport */
#define RLX_WIRE_TAG_BROADCAST      0xFFFFFF01u /* root -> every other rank */
#define RLX_WIRE_TAG_BARRIER_ARRIVE 0xFFFFFF02u /* rank > 0 -> rank 0 */
#define RLX_WIRE_TAG_BARRIER_LEAVE  0xFFFFFF03u /* rank 0 -> rank > 0 */

/* The labels of the HMACs above (each used with its terminating NUL). */
#define RLX_WIRE_LABEL_PROOF_C "rlx-dist-v3 connector proof"
#define RLX_WIRE_LABEL_PROOF_A "rlx-dist-v3 acceptor proof"
#define RLX_WIRE_LABEL_KEY_C2A "rlx-dist-v3 frames connector to acceptor"
#define RLX_WIRE_LABEL_KEY_A2C "rlx-dist-v3 frames acceptor to connector"
/* The HMAC key of the frame-key derivation without a token (without its NUL): public. */
#define RLX_WIRE_KEY_NO_TOKEN  "rlx-dist-v3 no token"

struct __attribute__((packed)) rlx_wire_head {
    uint32_t magic;   /* RLX_WIRE_{HELLO,PROOF,REFUSE}_MAGIC */
    uint16_t version; /* RLX_TCP_PROTOCOL_VERSION */
    uint16_t info;    /* HELLO: flags; REFUSE: reason; PROOF: 0 */
    uint32_t rank;    /* the sender's rank */
    uint32_t world;   /* the sender's world size */
};
static_assert(sizeof(struct rlx_wire_head) == 16, "a handshake HEAD is 16 bytes on the wire");

/* HELLO and PROOF: HEAD then 32 bytes (nonce or MAC). */
#define RLX_WIRE_HEAD_BYTES 16
#define RLX_WIRE_MSG_BYTES  (RLX_WIRE_HEAD_BYTES + 32)
static_assert(RLX_WIRE_NONCE_BYTES == 32 && RLX_WIRE_MAC_BYTES == 32, "HELLO and PROOF bodies are 32 bytes");

struct __attribute__((packed)) rlx_wire_frame {
    uint32_t magic;  /* RLX_WIRE_FRAME_MAGIC */
    uint32_t tag;    /* user tag (< 2^24) or a reserved RLX_WIRE_TAG_* */
    uint64_t length; /* payload bytes that follow */
};
static_assert(sizeof(struct rlx_wire_frame) == 16, "a frame header is 16 bytes on the wire");

/* Host values <-> wire bytes (the struct is a byte image; memcpy keeps every access aligned). */
static inline void rlx_wire_head_encode(unsigned char out[16], uint32_t magic, uint16_t version, uint16_t info,
                                        uint32_t rank, uint32_t world)
{
    struct rlx_wire_head h = {
        .magic = htole32(magic),
        .version = htole16(version),
        .info = htole16(info),
        .rank = htole32(rank),
        .world = htole32(world),
    };
    memcpy(out, &h, sizeof h);
}

static inline struct rlx_wire_head rlx_wire_head_decode(const unsigned char in[16])
{
    struct rlx_wire_head h;
    memcpy(&h, in, sizeof h);
    h.magic = le32toh(h.magic);
    h.version = le16toh(h.version);
    h.info = le16toh(h.info);
    h.rank = le32toh(h.rank);
    h.world = le32toh(h.world);
    return h;
}

static inline void rlx_wire_frame_encode(unsigned char out[16], uint32_t tag, uint64_t length)
{
    struct rlx_wire_frame f = {
        .magic = htole32(RLX_WIRE_FRAME_MAGIC),
        .tag = htole32(tag),
        .length = htole64(length),
    };
    memcpy(out, &f, sizeof f);
}

static inline struct rlx_wire_frame rlx_wire_frame_decode(const unsigned char in[16])
{
    struct rlx_wire_frame f;
    memcpy(&f, in, sizeof f);
    f.magic = le32toh(f.magic);
    f.tag = le32toh(f.tag);
    f.length = le64toh(f.length);
    return f;
}

static inline void rlx_wire_u64_encode(unsigned char out[8], uint64_t v)
{
    uint64_t le = htole64(v);
    memcpy(out, &le, sizeof le);
}

#endif
