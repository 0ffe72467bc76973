/*
 * quants.c - the GGUF block types' layouts and their conversion to f32 (the dtype table's to_f32
 * for each), as ggml stores them: 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and 256-element
 * "K" super-blocks (Q2_K .. Q6_K) with their packed scales. Each value is computed with the same
 * float32 operations, in the same order, as gguf-py's dequantize (the reference the tests hold
 * these to, bit for bit): the f16 scales widened exactly, one product per scale, then one product
 * (and one subtraction of the block minimum where the type has one) per element. Reads bytes with
 * memcpy, so blocks need no alignment (a 34-byte Q8_0 block is 2-byte aligned at best). Never
 * allocates, never fails: the caller passes whole blocks.
 */
#include <string.h>

#include "core/core.h"
#include "core/quants.h"

static float half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return rlx_f16_to_f32(h);
}

/* Q4_0 (18 bytes): f16 d, 16 bytes of nibbles (low: elements 0..15, high: 16..31); d * (q - 8). */
void rlx_q4_0_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += RLX_Q4_0_BYTES, y += 32) {
        const float d = half(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0x0F) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

/* Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; d * q + m. */
void rlx_q4_1_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += RLX_Q4_1_BYTES, y += 32) {
        const float d = half(b), m = half(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0x0F) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

/* The fifth bits of a Q5 block: bit j of the little-endian word qh is element j's. */
static uint32_t high_bits(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q5_0 (22 bytes): f16 d, 4 bytes of fifth bits, 16 bytes of nibbles; d * (q - 16). */
void rlx_q5_0_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += RLX_Q5_0_BYTES, y += 32) {
        const float d = half(b);
        const uint32_t qh = high_bits(b + 2);
        for (int j = 0; j < 16; j++) {
            const int lo = (b[6 + j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int hi = (b[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q5_1 (24 bytes): f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles; d * q + m. */
void rlx_q5_1_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += RLX_Q5_1_BYTES, y += 32) {
        const float d = half(b), m = half(b + 2);
        const uint32_t qh = high_bits(b + 4);
        for (int j = 0; j < 16; j++) {
            const int lo = (b[8 + j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int hi = (b[8 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
    }
}

/* Q8_0 (34 bytes): f16 d, 32 int8; d * q. */
void rlx_q8_0_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 32; blk++, b += RLX_Q8_0_BYTES, y += 32) {
        const float d = half(b);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
    }
}

/* Q2_K (84 bytes): 16 bytes of (4-bit scale | 4-bit min << 4) for 16 groups of 16, 64 bytes of
 * 2-bit values, f16 d, f16 dmin. Group g of element e: e / 16; the 2-bit value of element
 * 128 h + 32 k + l (h < 2, k < 4, l < 32) is bits 2k of byte 32 h + l. (d * sc) * q - dmin * m. */
void rlx_q2_k_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += RLX_Q2_K_BYTES, y += 256) {
        const uint8_t *sc = b, *qs = b + 16;
        const float d = half(b + 80), dmin = half(b + 82);
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32, g = e / 16;
            const float dl = d * (float)(sc[g] & 0x0F), ml = dmin * (float)(sc[g] >> 4);
            y[e] = dl * (float)((qs[32 * h + l] >> (2 * k)) & 3) - ml;
        }
    }
}

/* The 16 six-bit scales of a Q3_K block from its 12 packed bytes (as ggml packs them): scale g's
 * low 4 bits are the low nibble of byte g (g < 8) or the high nibble of byte g - 8, its high 2 bits
 * are bits 2 (g / 4) of byte 8 + g % 4; stored plus 32. */
static void q3_k_scales(const uint8_t *p, int *sc)
{
    for (int g = 0; g < 16; g++) {
        const int lo = g < 8 ? p[g] & 0x0F : p[g - 8] >> 4;
        const int hi = (p[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = (lo | hi << 4) - 32;
    }
}

/* Q3_K (110 bytes): 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of packed
 * 6-bit scales, f16 d. Element 128 h + 32 k + l: low bits 2k of byte 32 h + l, high bit (h * 4 + k)
 * of hmask byte l; value = low - (high bit set ? 0 : 4); (d * scale) * value. */
void rlx_q3_k_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += RLX_Q3_K_BYTES, y += 256) {
        const uint8_t *hm = b, *qs = b + 32;
        int sc[16];
        q3_k_scales(b + 96, sc);
        const float d = half(b + 108);
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const int q = ((qs[32 * h + l] >> (2 * k)) & 3) - ((hm[l] >> (4 * h + k)) & 1 ? 0 : 4);
            y[e] = (d * (float)sc[e / 16]) * (float)q;
        }
    }
}

/* Scale and minimum of group j (of 8) from the 12 packed bytes of a Q4_K / Q5_K block. */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of packed 6-bit scales and minimums for 8 groups of
 * 32, 128 bytes of nibbles (64-element chunk c: low nibbles are elements 64 c .. +31, high ones
 * 64 c + 32 .. +63 of bytes 32 c .. +31). (d * sc) * q - (dmin * m). */
void rlx_q4_k_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += RLX_Q4_K_BYTES, y += 256) {
        const float d = half(b), dmin = half(b + 2);
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int g = 0; g < 8; g++) {
            int sc, m;
            k4_scale_min(g, scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = qs + 32 * (g / 2);
            for (int l = 0; l < 32; l++) y[32 * g + l] = dl * (float)((g % 2 ? q[l] >> 4 : q[l] & 0x0F)) - ml;
        }
    }
}

/* Q5_K (176 bytes): f16 d, f16 dmin, 12 bytes of scales and minimums, 32 bytes of fifth bits
 * (bit g of byte l is element 32 g + l's), 128 bytes of nibbles as Q4_K. (d * sc) * q - (dmin * m). */
void rlx_q5_k_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += RLX_Q5_K_BYTES, y += 256) {
        const float d = half(b), dmin = half(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
        for (int g = 0; g < 8; g++) {
            int sc, m;
            k4_scale_min(g, scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = qs + 32 * (g / 2);
            for (int l = 0; l < 32; l++) {
                const int v = (g % 2 ? q[l] >> 4 : q[l] & 0x0F) | ((qh[l] >> g) & 1) << 4;
                y[32 * g + l] = dl * (float)v - ml;
            }
        }
    }
}

/* Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one
 * per group of 16), f16 d. Element 128 h + 32 k + l: low nibble of byte 64 h + 32 (k % 2) + l
 * (the high nibble when k >= 2), high bits 2k of byte 32 h + l; value - 32; (d * scale) * value. */
void rlx_q6_k_to_f32(float *y, const void *src, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / 256; blk++, b += RLX_Q6_K_BYTES, y += 256) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = half(b + 208);
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t lo = ql[64 * h + 32 * (k % 2) + l];
            const int q = ((k >= 2 ? lo >> 4 : lo & 0x0F) | ((qh[32 * h + l] >> (2 * k)) & 3) << 4) - 32;
            y[e] = (d * (float)sc[e / 16]) * (float)q;
        }
    }
}

/* Where each block type keeps its f16 scale (and minimum, or -1): the layouts above. */
static bool scale_offsets(enum rlx_dtype dt, int *d, int *m)
{
    switch (dt) {
    case RLX_Q4_0: *d = 0, *m = -1; return true;
    case RLX_Q4_1: *d = 0, *m = 2; return true;
    case RLX_Q5_0: *d = 0, *m = -1; return true;
    case RLX_Q5_1: *d = 0, *m = 2; return true;
    case RLX_Q8_0: *d = 0, *m = -1; return true;
    case RLX_Q2_K: *d = 80, *m = 82; return true;
    case RLX_Q3_K: *d = 108, *m = -1; return true;
    case RLX_Q4_K: *d = 0, *m = 2; return true;
    case RLX_Q5_K: *d = 0, *m = 2; return true;
    case RLX_Q6_K: *d = 208, *m = -1; return true;
    default: return false;
    }
}

/* An f16 whose exponent bits are all ones: infinite or NaN. */
static bool half_nonfinite(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7C00) == 0x7C00;
}

int64_t rlx_blocks_nonfinite(enum rlx_dtype dt, const void *src, int64_t n)
{
    int d, m;
    const struct rlx_dtype_traits *t = rlx_dtype_traits(dt);
    if (!t || !scale_offsets(dt, &d, &m)) return -1;
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / t->block_size; blk++, b += t->type_size)
        if (half_nonfinite(b + d) || (m >= 0 && half_nonfinite(b + m))) return blk;
    return -1;
}
