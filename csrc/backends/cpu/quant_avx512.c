/*
 * quant_avx512.c - the AVX-512 VNNI row kernels of the block-type weights: out[m * ldo + r] = row r
 * of W . row m of the activations quantised by quant.c, for up to 4 rows m at once (the weights
 * unpacked once for all of them). Only called where rlx_cpu_avx512_vnni() (quant.c).
 *
 * 64 weights per vector: two blocks of a 32-element type, or four 16-element / two 32-element
 * groups of a K type, unpacked to unsigned bytes in the activations' order (natural; Q4_K / Q5_K:
 * the low nibbles of two 32-byte chunks, which act_rows in quant.c matches by swapping groups).
 *   32-element types: VPDPBUSD (u8 x s8, 4 products per int32 lane, exact) from the bias lanes
 *     (-off * sum a: the weights' offset; Q8_0's int8 read as w + 128); acc += cvt(lanes) *
 *     (dw * dl) [+ mw * sl] in f32, the two blocks' scales in the two halves.
 *   K types: VPMADDUBSW (pairs in int16: weights <= 63, so no saturation) then VPDPWSSD with the
 *     group scales in each word (int32, exact); the super-block's lanes summed as integers, the
 *     offset (-off sum_g sc_g bsum_g) and minimum (sum_g m_g bsum_g) terms likewise, then the f32
 *     operations of quant.c's scalar kernel in its order: the K types give the same bits on the
 *     scalar, AVX2 and VNNI paths.
 * Each output: a fixed sequence of operations whatever M, the row range or the thread count.
 * Must never read past a weight row (an odd last block is read alone; activations past it are
 * masked) and never allocate.
 */
#include "backends/cpu/cpu.h"

#include "core/quants.h"

#include <immintrin.h>
#include <string.h>

#define FN                                                                                                       \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

FN float f16s(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

FN size_t tsize(const int wt) {
    switch (wt) {
    case RLX_Q8_0: return RLX_Q8_0_BYTES;
    case RLX_Q4_0: return RLX_Q4_0_BYTES;
    case RLX_Q4_1: return RLX_Q4_1_BYTES;
    case RLX_Q5_0: return RLX_Q5_0_BYTES;
    case RLX_Q5_1: return RLX_Q5_1_BYTES;
    case RLX_Q2_K: return RLX_Q2_K_BYTES;
    case RLX_Q3_K: return RLX_Q3_K_BYTES;
    case RLX_Q4_K: return RLX_Q4_K_BYTES;
    case RLX_Q5_K: return RLX_Q5_K_BYTES;
    default: return RLX_Q6_K_BYTES;
    }
}

FN __m256i ld32(const void *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

FN __m512i ld64(const void *p) {
    return _mm512_loadu_si512(p);
}

/* [x | y] */
FN __m512i cat(__m256i x, __m256i y) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
}

/* 32 bytes: first half a, second half b */
FN __m512i halves8(int a, int b) {
    return _mm512_mask_blend_epi8(0xffffffff00000000ull, _mm512_set1_epi8((char)a), _mm512_set1_epi8((char)b));
}

/* 16 words: first half a, second half b */
FN __m512i halves16(int a, int b) {
    return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((short)a), _mm512_set1_epi16((short)b));
}

FN int hsum_i32_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* ---------------------------------------------------------------------------------------------
 * 32-element types: two blocks per vector
 * ------------------------------------------------------------------------------------------- */

/* nibbles of the 16 bytes at p0 and at p1: [p0 low | p0 high | p1 low | p1 high] */
FN __m512i nib64(const uint8_t *p0, const uint8_t *p1) {
    const __m256i x = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)p1), _mm_loadu_si128((const __m128i *)p0));
    const __m512i z = cat(x, _mm256_srli_epi16(x, 4));
    return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0f));
}

/* + 16 where the fifth bit is set: bit j of the words at h0 (bytes 0..31) and h1 (32..63) */
FN __m512i add5(__m512i z, const uint8_t *h0, const uint8_t *h1) {
    uint32_t a, b;
    memcpy(&a, h0, 4), memcpy(&b, h1, 4);
    return _mm512_mask_add_epi8(z, (__mmask64)a | (__mmask64)b << 32, z, _mm512_set1_epi8(16));
}

/* the 64 values of the blocks at p0 and p1 as bytes: q (unsigned, before the offset); Q8_0: the
 * int8 + 128 */
FN __m512i unpack64(const uint8_t *p0, const uint8_t *p1, const int wt) {
    switch (wt) {
    case RLX_Q8_0: return _mm512_xor_si512(cat(ld32(p0 + 2), ld32(p1 + 2)), _mm512_set1_epi8((char)0x80));
    case RLX_Q4_0: return nib64(p0 + 2, p1 + 2);
    case RLX_Q4_1: return nib64(p0 + 4, p1 + 4);
    case RLX_Q5_0: return add5(nib64(p0 + 6, p1 + 6), p0 + 2, p1 + 2);
    default: return add5(nib64(p0 + 8, p1 + 8), p0 + 4, p1 + 4);
    }
}

/* the f16 at p0 + o in lanes 0..7, at p1 + o in lanes 8..15 (0 there when !two) */
FN __m512 lanes2(const uint8_t *p0, const uint8_t *p1, int o, int two) {
    uint16_t h0, h1 = 0;
    memcpy(&h0, p0 + o, 2);
    if (two)
        memcpy(&h1, p1 + o, 2);
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16((short)h1), _mm_set1_epi16((short)h0)));
}

FN void row32(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r,
              const int wt, const int M) {
    const int64_t nb = K / 32, L = K / 4;
    const size_t tb = tsize(wt);
    const uint8_t *row = w + (size_t)r * (size_t)nb * tb;
    const int off = wt == RLX_Q8_0 ? 128 : wt == RLX_Q4_0 ? 8 : wt == RLX_Q5_0 ? 16 : 0;
    const int mins = wt == RLX_Q4_1 || wt == RLX_Q5_1;
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *p0 = row + (size_t)b * tb, *p1 = p0 + tb;
        const __m512i u = unpack64(p0, p1, wt);
        const __m512 dw = lanes2(p0, p1, 0, 1);
        const __m512 mw = mins ? lanes2(p0, p1, 2, 1) : _mm512_setzero_ps();
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
            const __m512i i = _mm512_dpbusd_epi32(off ? ld64(a->bias + m * L + 8 * b) : _mm512_setzero_si512(), u,
                                                  ld64(a->q + m * K + 32 * b));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_loadu_ps(a->dl + m * L + 8 * b)),
                                     acc[m]);
            if (mins)
                acc[m] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a->sl + m * L + 8 * b), acc[m]);
        }
    }
    if (b < nb) { /* the last block alone: lanes 8..15 see zero activations and zero scales */
        const uint8_t *p0 = row + (size_t)b * tb;
        const __m512i u = unpack64(p0, p0, wt);
        const __m512 dw = lanes2(p0, p0, 0, 0);
        const __m512 mw = mins ? lanes2(p0, p0, 2, 0) : _mm512_setzero_ps();
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
            const __m512i bias = off ? _mm512_maskz_loadu_epi32(0xff, a->bias + m * L + 8 * b) : _mm512_setzero_si512();
            const __m512i i = _mm512_dpbusd_epi32(bias, u, _mm512_maskz_loadu_epi8(0xffffffffull, a->q + m * K + 32 * b));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i),
                                     _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(0xff, a->dl + m * L + 8 * b)), acc[m]);
            if (mins)
                acc[m] = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(0xff, a->sl + m * L + 8 * b), acc[m]);
        }
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) out[m * ldo + r] = _mm512_reduce_add_ps(acc[m]);
}

/* ---------------------------------------------------------------------------------------------
 * K types: one super-block at a time
 * ------------------------------------------------------------------------------------------- */

/* Q4_K / Q5_K: the 8 six-bit scales and 8 minimums of the 12 bytes at s, as 16 bytes */
FN __m128i k4_scales(const uint8_t *s) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4), memcpy(&w1, s + 4, 4), memcpy(&w2, s + 8, 4);
    const uint32_t sc03 = w0 & 0x3f3f3f3f, mn03 = w1 & 0x3f3f3f3f;
    const uint32_t sc47 = (w2 & 0x0f0f0f0f) | ((w0 >> 2) & 0x30303030);
    const uint32_t mn47 = ((w2 >> 4) & 0x0f0f0f0f) | ((w1 >> 2) & 0x30303030);
    return _mm_set_epi32((int)mn47, (int)mn03, (int)sc47, (int)sc03);
}

/* Q3_K: the 16 scales (6 bits, minus 32) of the 12 bytes at s, as 16 signed bytes */
FN __m128i k3_scales(const uint8_t *s) {
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4), memcpy(&a1, s + 4, 4), memcpy(&a2, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const __m128i v = _mm_set_epi32((int)(((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4)),
                                    (int)(((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4)),
                                    (int)((a1 & m4) | (((a2 >> 2) & m2) << 4)), (int)((a0 & m4) | ((a2 & m2) << 4)));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

static const uint16_t RAMP16[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

FN void rowk(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r,
             const int wt, const int M) {
    const int64_t nb = K / 256;
    const size_t tb = tsize(wt);
    const uint8_t *row = w + (size_t)r * (size_t)nb * tb;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3), m30 = _mm512_set1_epi8(0x30);
    /* word ramps for the scale permutes: 32-element groups [0 x16 | 2 x16], 16-element groups
     * [0 x8 | 1 x8 | 2 x8 | 3 x8] */
    const __m512i ramp32 = halves16(0, 2);
    const __m512i ramp16 = _mm512_loadu_si512(RAMP16);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = row + (size_t)b * tb;
        __m512i is[4];
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) is[m] = _mm512_setzero_si512();
        /* dot of the 64 unsigned values u (activations from element j of the super-block) with
         * each row, times the scale words sv */
#define DOT64(u, j, sv)                                                                                          \
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) is[m] = _mm512_dpwssd_epi32(                           \
        is[m], _mm512_maddubs_epi16((u), ld64(a->q + m * K + 256 * b + (j))), (sv));
        float d, dmin = 0.0f;
        __m256i mdup = _mm256_setzero_si256(); /* minimums as words, one per 16 (bsums) */
        __m256i s16 = _mm256_setzero_si256();  /* 16-element groups: the scales as words */
        int offs = 0;                          /* the values' offset (Q6_K 32, Q3_K 4) */
        if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
            const __m128i scm = k4_scales(p + 4);
            const __m512i sw = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(scm));
            const __m128i mn = _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8));
            mdup = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
            d = f16s(p), dmin = f16s(p + 2);
            const uint8_t *qs = p + (wt == RLX_Q5_K ? 48 : 16);
            const __m512i qh = wt == RLX_Q5_K ? cat(ld32(p + 16), ld32(p + 16)) : _mm512_setzero_si512();
            _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) {
                /* groups [4j | 4j + 2] (low nibbles) and [4j + 1 | 4j + 3] (high) */
                const __m512i x = ld64(qs + 64 * j);
                __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
                if (wt == RLX_Q5_K) {
                    const __m512i s16b = _mm512_set1_epi8(16);
                    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, halves8(1 << (4 * j), 1 << (4 * j + 2))),
                                              lo, s16b);
                    hi = _mm512_mask_add_epi8(hi,
                                              _mm512_test_epi8_mask(qh, halves8(1 << (4 * j + 1), 1 << (4 * j + 3))),
                                              hi, s16b);
                }
                DOT64(lo, 128 * j, _mm512_permutexvar_epi16(_mm512_add_epi16(ramp32, _mm512_set1_epi16((short)(4 * j))), sw))
                DOT64(hi, 128 * j + 64,
                      _mm512_permutexvar_epi16(_mm512_add_epi16(ramp32, _mm512_set1_epi16((short)(4 * j + 1))), sw))
            }
        } else if (wt == RLX_Q6_K) {
            s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
            const __m512i sw = _mm512_zextsi256_si512(s16);
            d = f16s(p + 208), offs = 32;
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m512i l = ld64(p + 64 * h), hh = cat(ld32(p + 128 + 32 * h), ld32(p + 128 + 32 * h));
                const __m512i w0 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                   _mm512_and_si512(_mm512_sllv_epi16(hh, halves16(4, 2)), m30));
                const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                   _mm512_and_si512(_mm512_srlv_epi16(hh, halves16(0, 2)), m30));
                DOT64(w0, 128 * h, _mm512_permutexvar_epi16(_mm512_add_epi16(ramp16, _mm512_set1_epi16((short)(8 * h))), sw))
                DOT64(w1, 128 * h + 64,
                      _mm512_permutexvar_epi16(_mm512_add_epi16(ramp16, _mm512_set1_epi16((short)(8 * h + 4))), sw))
            }
        } else if (wt == RLX_Q3_K) {
            s16 = _mm256_cvtepi8_epi16(k3_scales(p + 96));
            const __m512i sw = _mm512_zextsi256_si512(s16);
            d = f16s(p + 108), offs = 4;
            const __m512i hm = cat(ld32(p), ld32(p));
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m512i x = cat(ld32(p + 32 + 32 * h), ld32(p + 32 + 32 * h)), four = _mm512_set1_epi8(4);
                __m512i w0 = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(0, 2)), m3);
                __m512i w1 = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(4, 6)), m3);
                w0 = _mm512_mask_add_epi8(w0, _mm512_test_epi8_mask(hm, halves8(1 << (4 * h), 1 << (4 * h + 1))), w0,
                                          four);
                w1 = _mm512_mask_add_epi8(w1, _mm512_test_epi8_mask(hm, halves8(1 << (4 * h + 2), 1 << (4 * h + 3))),
                                          w1, four);
                DOT64(w0, 128 * h, _mm512_permutexvar_epi16(_mm512_add_epi16(ramp16, _mm512_set1_epi16((short)(8 * h))), sw))
                DOT64(w1, 128 * h + 64,
                      _mm512_permutexvar_epi16(_mm512_add_epi16(ramp16, _mm512_set1_epi16((short)(8 * h + 4))), sw))
            }
        } else { /* Q2_K */
            const __m128i sb = _mm_loadu_si128((const __m128i *)p);
            s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(0x0f)));
            mdup = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0f)));
            const __m512i sw = _mm512_zextsi256_si512(s16);
            d = f16s(p + 80), dmin = f16s(p + 82);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m512i x = cat(ld32(p + 16 + 32 * h), ld32(p + 16 + 32 * h));
                const __m512i w0 = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(0, 2)), m3);
                const __m512i w1 = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(4, 6)), m3);
                DOT64(w0, 128 * h, _mm512_permutexvar_epi16(_mm512_add_epi16(ramp16, _mm512_set1_epi16((short)(8 * h))), sw))
                DOT64(w1, 128 * h + 64,
                      _mm512_permutexvar_epi16(_mm512_add_epi16(ramp16, _mm512_set1_epi16((short)(8 * h + 4))), sw))
            }
        }
#undef DOT64
        const int mins = wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K;
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
            const float da = a->d[m * nb + b];
            const __m256i bs = ld32(a->bsums + m * (K / 16) + 16 * b);
            int isum = _mm512_reduce_add_epi32(is[m]);
            if (offs)
                isum -= offs * hsum_i32_256(_mm256_madd_epi16(s16, bs));
            acc[m] += (d * da) * (float)isum;
            if (mins)
                acc[m] -= (dmin * da) * (float)hsum_i32_256(_mm256_madd_epi16(bs, mdup));
        }
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) out[m * ldo + r] = acc[m];
}

/* ---------------------------------------------------------------------------------------------
 * Dispatch: one instance per (dtype, M)
 * ------------------------------------------------------------------------------------------- */

#define RANGE(name, kernel)                                                                                      \
    FN void name(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r0, \
                 int64_t r1, const int wt, const int M) {                                                       \
        for (int64_t r = r0; r < r1; r++)                                                                        \
            kernel(out, ldo, a, w, K, r, wt, M);                                                                 \
    }
RANGE(range32, row32)
RANGE(rangek, rowk)

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) void
rlx_cpu_qmv_avx512(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                   int64_t r0, int64_t r1) {
#define CASE(WT, MM, RANGE_FN)                                                                                   \
    case (WT) * 8 + (MM):                                                                                        \
        RANGE_FN(out, ldo, a, w, K, r0, r1, WT, MM);                                                             \
        break;
#define CASES(WT, RANGE_FN) CASE(WT, 1, RANGE_FN) CASE(WT, 2, RANGE_FN) CASE(WT, 3, RANGE_FN) CASE(WT, 4, RANGE_FN)
    switch (wt * 8 + M) {
        CASES(RLX_Q8_0, range32) CASES(RLX_Q4_0, range32) CASES(RLX_Q4_1, range32) CASES(RLX_Q5_0, range32)
        CASES(RLX_Q5_1, range32) CASES(RLX_Q2_K, rangek) CASES(RLX_Q3_K, rangek) CASES(RLX_Q4_K, rangek)
        CASES(RLX_Q5_K, rangek) CASES(RLX_Q6_K, rangek)
    default:
        break;
    }
#undef CASES
#undef CASE
}
