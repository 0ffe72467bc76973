/*
 * wire.h - the byte layout of the TCP transport (tcp.c): the HELLO each side of a connection sends
 * once, and the header in front of every message. Everything on the wire is little-endian and
 * packed; the structs below mirror it exactly (sizes static_assert'ed) and are only ever filled and
 * read through the encode/decode helpers, never sent as host structs.
 *
 * Protocol version 1:
 *   HELLO (24 bytes)  magic "RLXH", u16 version, u16 flags (0; ignored by version 1 readers),
 *                     u32 rank, u32 world, u64 token hash (rlx_wire_token_hash).
 *   FRAME (16 bytes)  magic "RLXF", u32 tag, u64 length; followed by `length` payload bytes.
 * User tags are < 2^24; tags from RLX_WIRE_TAG_RESERVED up are the transport's own (broadcast,
 * barrier). Changing any of this means bumping RLX_TCP_PROTOCOL_VERSION (rlx/dist.h).
 *
 * The token hash is FNV-1a (64-bit) over a fixed domain prefix and the token. It catches ranks
 * started with different secrets (a misconfigured or foreign job); it is not authentication: it is
 * sent in clear, can be replayed, and FNV is not a cryptographic hash. Nothing here encrypts.
 */
#ifndef RLX_DIST_WIRE_H
#define RLX_DIST_WIRE_H

#include <assert.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>

/* The magics as u32 read little-endian from their four ASCII bytes. */
#define RLX_WIRE_HELLO_MAGIC 0x48584C52u /* "RLXH" */
#define RLX_WIRE_FRAME_MAGIC 0x46584C52u /* "RLXF" */

#define RLX_WIRE_USER_TAG_LIMIT (1u << 24)      /* user tags are < this */
#define RLX_WIRE_TAG_RESERVED 0xFFFFFF00u       /* tags >= this belong to the transport */
#define RLX_WIRE_TAG_BROADCAST 0xFFFFFF01u      /* root -> every other rank */
#define RLX_WIRE_TAG_BARRIER_ARRIVE 0xFFFFFF02u /* rank > 0 -> rank 0 */
#define RLX_WIRE_TAG_BARRIER_LEAVE 0xFFFFFF03u  /* rank 0 -> rank > 0 */

struct __attribute__((packed)) rlx_wire_hello {
    uint32_t magic;      /* RLX_WIRE_HELLO_MAGIC */
    uint16_t version;    /* RLX_TCP_PROTOCOL_VERSION */
    uint16_t flags;      /* 0 */
    uint32_t rank;       /* the sender's rank */
    uint32_t world;      /* the sender's world size */
    uint64_t token_hash; /* rlx_wire_token_hash(token) */
};
static_assert(sizeof(struct rlx_wire_hello) == 24, "HELLO is 24 bytes on the wire");

struct __attribute__((packed)) rlx_wire_frame {
    uint32_t magic;  /* RLX_WIRE_FRAME_MAGIC */
    uint32_t tag;    /* user tag (< 2^24) or a reserved RLX_WIRE_TAG_* */
    uint64_t length; /* payload bytes that follow */
};
static_assert(sizeof(struct rlx_wire_frame) == 16, "a frame header is 16 bytes on the wire");

/* Host values <-> wire bytes (the struct is a byte image; memcpy keeps every access aligned). */
static inline void rlx_wire_hello_encode(unsigned char out[24], uint16_t version, uint32_t rank, uint32_t world,
                                         uint64_t token_hash)
{
    struct rlx_wire_hello h = {
        .magic = htole32(RLX_WIRE_HELLO_MAGIC),
        .version = htole16(version),
        .flags = 0,
        .rank = htole32(rank),
        .world = htole32(world),
        .token_hash = htole64(token_hash),
    };
    memcpy(out, &h, sizeof h);
}

static inline struct rlx_wire_hello rlx_wire_hello_decode(const unsigned char in[24])
{
    struct rlx_wire_hello h;
    memcpy(&h, in, sizeof h);
    h.magic = le32toh(h.magic);
    h.version = le16toh(h.version);
    h.flags = le16toh(h.flags);
    h.rank = le32toh(h.rank);
    h.world = le32toh(h.world);
    h.token_hash = le64toh(h.token_hash);
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

/* FNV-1a 64 over "rlx-dist-token-v1" (with its NUL) then the token's bytes; NULL hashes as "". */
static inline uint64_t rlx_wire_token_hash(const char *token)
{
    static const char domain[] = "rlx-dist-token-v1";
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof domain; i++) {
        h ^= (unsigned char)domain[i];
        h *= 0x100000001b3ull;
    }
    for (const char *p = token != NULL ? token : ""; *p != '\0'; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ull;
    }
    return h;
}

#endif
