/*
 * quant_unpack.h - the AVX-512 VNNI unpacking of the block types shared by quant_avx512.c's row
 * kernels, quant_amx.c's AMX-INT8 kernel and quant_lanes.c's lanes kernel: loads, the block sizes,
 * the order of kvalues' groups (rlx_cpu_kgroup), and one K-type super-block's
 * values, scales and minimums as vectors (kvalues, kunpack; quant_avx512.c's header says how the
 * kernels use them). Functions of this header are inlined into their callers, which must be
 * compiled for (at least) the FN target and called only where rlx_cpu_avx512_vnni() (quant.c).
 */
#ifndef RLX_CPU_QUANT_UNPACK_H
#define RLX_CPU_QUANT_UNPACK_H

#include "backends/cpu/cpu.h"

#include "core/quants.h"

#include <immintrin.h>
#include <string.h>

#define FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

FN float f16s(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

FN __m256i ld32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

FN __m512i ld64(const void *p) { return _mm512_loadu_si512(p); }

/* the 32 bytes at p twice: a broadcast load (VBROADCASTI64X4), where an insert of a second load
 * takes a shuffle (Zen 4, 1 thread, cache-resident, one row: Q6_K 21.3 -> 20.5 cycles a
 * super-block, Q5_K 22.8 -> 22.1, Q3_K 27.4 -> 26.8) */
FN __m512i bcast32(const void *p) { return _mm512_broadcast_i64x4(ld32(p)); }

/* [x | y] */
FN __m512i cat(__m256i x, __m256i y) { return _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1); }

/* 32 bytes: first half a, second half b */
FN __m512i halves8(int a, int b)
{
    return _mm512_mask_blend_epi8(0xffffffff00000000ull, _mm512_set1_epi8((char)a), _mm512_set1_epi8((char)b));
}

/* 16 words: first half a, second half b */
FN __m512i halves16(int a, int b)
{
    return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((short)a), _mm512_set1_epi16((short)b));
}

/* Q4_K / Q5_K: the 8 six-bit scales and 8 minimums of the 12 bytes at s0 and at s1, as 16 bytes
 * each (scales, then minimums), s0's in the low 128-bit lane. Words w0, w1, w2 of s: scales 0-3 =
 * w0 & 0x3f.., minimums 0-3 = w1 & 0x3f..; scales 4-7 = (w2 & 0x0f..) | ((w0 >> 2) & 0x30..),
 * minimums 4-7 = ((w2 >> 4) & 0x0f..) | ((w1 >> 2) & 0x30..). Reads 16 bytes at each (the block
 * goes on past them). */
FN __m256i k4_scales(const uint8_t *s0, const uint8_t *s1)
{
    const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)s0)),
                                              _mm_loadu_si128((const __m128i *)s1), 1);
    const __m256i a = _mm256_shuffle_epi32(x, _MM_SHUFFLE(2, 1, 2, 0)); /* w0 w2 w1 w2 */
    const __m256i b = _mm256_shuffle_epi32(x, _MM_SHUFFLE(1, 1, 0, 0)); /* w0 w0 w1 w1 */
    const __m256i hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srlv_epi32(a, _mm256_set_epi32(4, 0, 0, 0, 4, 0, 0, 0)), _mm256_set1_epi8(0x0f)),
        _mm256_and_si256(_mm256_srli_epi32(b, 2), _mm256_set1_epi8(0x30)));
    return _mm256_blend_epi32(_mm256_and_si256(a, _mm256_set1_epi8(0x3f)), hi, 0xaa);
}

/* The 256 values of the super-block at p as 4 vectors of unsigned bytes u[v]: u[v] meets the
 * activations at 64 v of the super-block (natural order, except Q4_K / Q5_K, whose 32-element
 * groups are in the order 0, 2, 1, 3 of each 128, as act_rows arranges them). */
FN void kvalues(__m512i u[4], const uint8_t *p, const int wt)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3), m30 = _mm512_set1_epi8(0x30);
    if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
        const uint8_t *qs = p + (wt == RLX_Q5_K ? 48 : 16);
        const __m512i qh = wt == RLX_Q5_K ? bcast32(p + 16) : _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++)
        {
            /* groups [4j | 4j + 2] (low nibbles) and [4j + 1 | 4j + 3] (high) */
            const __m512i x = ld64(qs + 64 * j);
            __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
            if (wt == RLX_Q5_K) {
                const __m512i s16b = _mm512_set1_epi8(16);
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, halves8(1 << (4 * j), 1 << (4 * j + 2))), lo,
                                          s16b);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, halves8(1 << (4 * j + 1), 1 << (4 * j + 3))),
                                          hi, s16b);
            }
            u[2 * j] = lo, u[2 * j + 1] = hi;
        }
    } else if (wt == RLX_Q6_K) {
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            const __m512i l = ld64(p + 64 * h), hh = bcast32(p + 128 + 32 * h);
            u[2 * h] =
                _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hh, halves16(4, 2)), m30));
            u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_and_si512(_mm512_srlv_epi16(hh, halves16(0, 2)), m30));
        }
    } else if (wt == RLX_Q3_K) {
        const __m512i hm = bcast32(p), four = _mm512_set1_epi8(4);
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            const __m512i x = bcast32(p + 32 + 32 * h);
            __m512i w0 = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(0, 2)), m3);
            __m512i w1 = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(4, 6)), m3);
            w0 = _mm512_mask_add_epi8(w0, _mm512_test_epi8_mask(hm, halves8(1 << (4 * h), 1 << (4 * h + 1))), w0, four);
            w1 = _mm512_mask_add_epi8(w1, _mm512_test_epi8_mask(hm, halves8(1 << (4 * h + 2), 1 << (4 * h + 3))), w1,
                                      four);
            u[2 * h] = w0, u[2 * h + 1] = w1;
        }
    } else { /* Q2_K */
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            const __m512i x = bcast32(p + 16 + 32 * h);
            u[2 * h] = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(0, 2)), m3);
            u[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi16(x, halves16(4, 6)), m3);
        }
    }
}

/* The natural group of the G-value chunk at position c of kvalues' order (Q4_K / Q5_K: 0, 2, 1, 3 of
 * each 128; the other types their own order) */
static inline int rlx_cpu_kgroup(int c, int wt)
{
    return wt == RLX_Q4_K || wt == RLX_Q5_K ? (c & 4) | ((c & 1) << 1) | ((c >> 1) & 1) : c;
}

/* One super-block unpacked (kstep, the AMX kernel's kbuf_row, quant_lanes.c's lbuf_pair): kvalues'
 * u, the group scales as words sw (16-element groups also as s16), the minimums as words one per
 * 16 (mdup; the AMX and lanes kernels read them, for Q2_K), d, dmin and the values' offset (Q6_K
 * 32, Q3_K 4). */
struct kblock {
    __m512i u[4], sw;
    __m256i mdup, s16;
    float d, dmin;
    int offs;
};

FN void kunpack(struct kblock *k, const uint8_t *p, const int wt)
{
    const __m256i mins_idx = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    k->dmin = 0.0f, k->offs = 0;
    k->mdup = _mm256_setzero_si256(), k->s16 = _mm256_setzero_si256();
    if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
        const __m128i scm = _mm256_castsi256_si128(k4_scales(p + 4, p + 4));
        k->sw = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(scm));
        k->mdup = _mm256_permutexvar_epi16(mins_idx, _mm512_castsi512_si256(k->sw)); /* m0 m0 m1 m1 .. m7 m7 */
        uint32_t dd;
        memcpy(&dd, p, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
        k->d = _mm_cvtss_f32(dm), k->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dm));
    } else if (wt == RLX_Q6_K) {
        k->s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
        k->sw = _mm512_zextsi256_si512(k->s16);
        k->d = f16s(p + 208), k->offs = 32;
    } else if (wt == RLX_Q3_K) {
        k->s16 = _mm256_cvtepi8_epi16(rlx_cpu_k3_scales(p + 96));
        k->sw = _mm512_zextsi256_si512(k->s16);
        k->d = f16s(p + 108), k->offs = 4;
    } else { /* Q2_K */
        const __m128i sb = _mm_loadu_si128((const __m128i *)p);
        k->s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(0x0f)));
        k->mdup = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0f)));
        k->sw = _mm512_zextsi256_si512(k->s16);
        k->d = f16s(p + 80), k->dmin = f16s(p + 82);
    }
    kvalues(k->u, p, wt);
}

#endif
