/*
 * quant_avx2.c - the AVX2 (+ FMA, F16C) row kernels of the block-type weights: out[m * ldo + r] =
 * row r of W . row m of the activations quantised by quant.c, for up to 4 rows m at once (the
 * weights are unpacked once for all of them). Only called where rlx_cpu_isa() >= AVX2 (quant.c).
 *
 * Integer products with VPMADDUBSW (unsigned weights x signed activations, pairs summed in int16)
 * then VPMADDWD (pairs summed in int32: by 1, or by the K types' group scales), so each 32-bit lane
 * holds the exact sum of 4 consecutive products. No pair can saturate int16: the weights read as
 * unsigned are at most 63 (|q| <= 127 on the activation side: 2 * 63 * 127 < 2^15); Q8_0's signed
 * weights go through the sign trick (|w| <= 128 against sign(a, w): 2 * 128 * 127 < 2^15).
 *   32-element types: per block, 8 lanes of sum q a; per 8 blocks, their scales (F16C on 8
 *     gathered halves) times the activations' d as one vector dd; per 4 blocks, their lanes
 *     transpose-added into one vector (sum4x4: block k's in lanes k and 4 + k), acc += cvt(that) *
 *     dd's four lanes in both halves [+ mw * s: 8 blocks per FMA]. One conversion and FMA per 4
 *     blocks: with one per block (the block's lane of dd broadcast) the FMAs' chain on acc bound
 *     the row (RLX_CPU_ISA=avx2 on a Zen 4, one thread, 1024 x 2048 cache-resident, the minimum
 *     of 1500 calls: Q4_0 10.0 -> 8.0 ns per 256 weights, Q8_0 9.5 -> 8.1, 7.8 with scales8's two
 *     chains; Qwen3-0.6B Q4_0 decode step at 128 positions, the best of 6 blocks in each of 3
 *     alternating pairs of builds: 23.3-23.7 -> 20.1-20.3 ms). Q4_0 / Q5_0's offsets per 8 blocks in
 *     one FMA, acc += cvt(-off * sum a per block) * dd (it was an int32 add per block: Q4_0 1024 x
 *     1024 cache-resident, one thread, 32.5 -> 31.0-31.8 us a call, measured under
 *     RLX_CPU_ISA=avx2 on a Zen 5). Q4_K / Q5_K's d and dmin come from one F16C conversion (Q4_K
 *     22.5 -> 21.7-22.0 us there). Gathering the six-bit scales with vector shuffles (as the
 *     AVX-512 kernels do) cost 7 % here: these kernels are bound by the vector ports, which the
 *     scalar loads and shifts leave alone; the same for the eight f16 scales gathered in scalar
 *     registers instead of by word inserts (no gain).
 *   K types: per super-block, the group sums times the integer group scales (VPMADDWD with the
 *     scale in each word), offsets as -off * sum_g sc_g * bsum_g, in int32 lanes (exact: at most
 *     1.4e8 each); acc += cvt(lanes) * (d * da) [- cvt(m_g bsum_g lanes) * (dmin * da)].
 * Each output: its lanes summed in a fixed order (hsum4, four outputs at a time: the kernels leave
 * the sums, RANGE adds the lanes); nothing depends on M, the row range or threads. A horizontal
 * sum per output had cost 5-13 % of a K = 1024 row at M = 1 (RLX_CPU_ISA=avx2 on a Zen 4, 1
 * thread, 256 x 1024 cache-resident, us a call: Q4_0 9.8 -> 9.3, Q8_0 9.4 -> 8.9, Q4_K 7.0 ->
 * 6.4, Q6_K 8.3 -> 7.2; M = 4 within 1 %).
 * Must never read past a weight row (the unaligned loads stay inside their block; the prefetches,
 * rlx_cpu_qmv_prefetch, may reach past it) and never allocate.
 */
#include "backends/cpu/cpu.h"

#include "core/quants.h"

#include <immintrin.h>
#include <string.h>

#define FN __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

FN float f16s(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The sums of a, b, c and d's 8 lanes (lanes 0..3 of the result): pairs (VHADDPS twice), then the
 * 128-bit halves. Each sum depends on its own vector alone: with zeros in the other places one
 * vector's sum has the same bits. */
FN __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

FN __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 32 nibbles of 16 bytes: low ones then high ones */
FN __m256i nib32(const uint8_t *qs)
{
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0f));
}

/* byte j = 0x10 where bit j of the little-endian 32-bit word at p is set */
FN __m256i bit5(const uint8_t *p)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

/* ---------------------------------------------------------------------------------------------
 * 32-element types
 * ------------------------------------------------------------------------------------------- */

/* the 32 values of a block as bytes: q (unsigned, before the offset); Q8_0: the int8 */
FN __m256i unpack32(const uint8_t *p, const int wt)
{
    switch (wt) {
    case RLX_Q8_0: return ld(p + 2);
    case RLX_Q4_0: return nib32(p + 2);
    case RLX_Q4_1: return nib32(p + 4);
    case RLX_Q5_0: return _mm256_or_si256(nib32(p + 6), bit5(p + 2));
    default: return _mm256_or_si256(nib32(p + 8), bit5(p + 4));
    }
}

/* the f16 at p + j tb for j < n (<= 8) as 8 floats (0 past n): word inserts in two chains of four */
FN __m256 scales8(const uint8_t *p, size_t tb, int64_t n)
{
    __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
#define LANE(h, j)                                                                                                     \
    if ((j) < n) {                                                                                                     \
        uint16_t v;                                                                                                    \
        memcpy(&v, p + (j)*tb, 2);                                                                                     \
        h = _mm_insert_epi16(h, v, (j) % 4);                                                                           \
    }
    LANE(h0, 0)
    LANE(h1, 4)
    LANE(h0, 1)
    LANE(h1, 5)
    LANE(h0, 2)
    LANE(h1, 6)
    LANE(h0, 3)
    LANE(h1, 7)
#undef LANE
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(h0, h1));
}

/* Lanes k and 4 + k of the result: v[k]'s lanes 0..3 and 4..7 summed (a 4 x 4 transpose-add in each
 * 128-bit half, in a fixed order), so four blocks take one conversion and one FMA */
FN __m256i sum4x4(const __m256i v[4])
{
    const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(v[0], v[1]), _mm256_unpackhi_epi32(v[0], v[1]));
    const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2], v[3]), _mm256_unpackhi_epi32(v[2], v[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
}

/* blocks b0 .. b0 + n (n <= 8) of the row at `row`: the 8 blocks' scales (and minimums) as one
 * vector each, times the activations' d (and s) of the same 8 blocks; each four blocks' sums then
 * take one conversion and one FMA. */
FN void chunk32(__m256 *acc, __m256 *macc, const struct rlx_cpu_qact *a, const uint8_t *row, int64_t K, int64_t b0,
                const int64_t n, const int wt, const int M)
{
    const int64_t nb = K / 32, Q = a->ldq;
    const size_t tb = rlx_cpu_qblock_bytes(wt);
    const int off = wt == RLX_Q4_0 ? 8 : wt == RLX_Q5_0 ? 16 : 0, mins = wt == RLX_Q4_1 || wt == RLX_Q5_1;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0));
    const __m256 dw = scales8(row + (size_t)b0 * tb, tb, n);
    __m256 dd[4];
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
    {
        dd[m] = _mm256_mul_ps(dw, _mm256_maskload_ps(a->d + m * nb + b0, mask));
        if (off) /* the blocks' -off * sum a, block j's in lane j */
            acc[m] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_maskload_epi32(a->bias + m * nb + b0, mask)), dd[m], acc[m]);
        if (mins)
            macc[m] = _mm256_fmadd_ps(scales8(row + (size_t)b0 * tb + 2, tb, n),
                                      _mm256_maskload_ps(a->s + m * nb + b0, mask), macc[m]);
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
    {
        if (4 * h >= n) break;
        __m256i i4[4][4]; /* [m][k]: block 4 h + k's 8 lanes of sum q a against row m (zero past n) */
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
        {
            const int64_t j = 4 * h + k, b = b0 + j;
            if (j >= n) {
                _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) i4[m][k] = _mm256_setzero_si256();
                continue;
            }
            const __m256i u = unpack32(row + (size_t)b * tb, wt);
            const __m256i ua = wt == RLX_Q8_0 ? _mm256_sign_epi8(u, u) : u;
            _Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
            {
                __m256i av = ld(a->q + m * Q + 32 * b);
                if (wt == RLX_Q8_0) av = _mm256_sign_epi8(av, u);
                i4[m][k] = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, av), ones);
            }
        }
        /* the four blocks' scales in both halves: [dd_4h .. dd_4h+3 | the same] */
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
        {
            const __m256 sd =
                h ? _mm256_permute2f128_ps(dd[m], dd[m], 0x11) : _mm256_permute2f128_ps(dd[m], dd[m], 0x00);
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum4x4(i4[m])), sd, acc[m]);
        }
    }
}

/* The sums of weight row r against the M rows of activations into acc[0 .. M) (rowk too) */
FN void row32(__m256 *acc, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r, const int wt,
              const int M)
{
    const int64_t nb = K / 32;
    const uint8_t *row = w + (size_t)r * (size_t)nb * rlx_cpu_qblock_bytes(wt);
    __m256 macc[4];
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps(), macc[m] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        rlx_cpu_qmv_prefetch(row + (size_t)b * rlx_cpu_qblock_bytes(wt), 8 * rlx_cpu_qblock_bytes(wt));
        chunk32(acc, macc, a, row, K, b, 8, wt, M);
    }
    if (b < nb) chunk32(acc, macc, a, row, K, b, nb - b, wt, M);
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[m] = _mm256_add_ps(acc[m], macc[m]);
}

/* ---------------------------------------------------------------------------------------------
 * K types
 * ------------------------------------------------------------------------------------------- */

/* word g of the 8 words of s (broadcast to both halves) in every word */
FN __m256i word_bcast(__m256i s, int g)
{
    return _mm256_shuffle_epi8(s, _mm256_set1_epi16((short)(0x0100 + 0x0202 * g)));
}

/* words 2j and 2j + 1 of the 8 words of s (broadcast to both halves): [s_2j x 8 | s_2j+1 x 8] */
FN __m256i pair_bcast(__m256i s, int j)
{
    return _mm256_shuffle_epi8(s, _mm256_set_m128i(_mm_set1_epi16((short)(0x0302 + 0x0404 * j)),
                                                   _mm_set1_epi16((short)(0x0100 + 0x0404 * j))));
}

/* Q4_K / Q5_K: the 8 six-bit scales and 8 minimums of the 12 bytes at s, as 16 bytes */
FN __m128i k4_scales(const uint8_t *s)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4), memcpy(&w1, s + 4, 4), memcpy(&w2, s + 8, 4);
    const uint32_t sc03 = w0 & 0x3f3f3f3f, mn03 = w1 & 0x3f3f3f3f;
    const uint32_t sc47 = (w2 & 0x0f0f0f0f) | ((w0 >> 2) & 0x30303030);
    const uint32_t mn47 = ((w2 >> 4) & 0x0f0f0f0f) | ((w1 >> 2) & 0x30303030);
    return _mm_set_epi32((int)mn47, (int)mn03, (int)sc47, (int)sc03);
}

/* bit `from` of each byte of x moved to bit `to` (other bits cleared) */
FN __m256i bit_to(__m256i x, int from, int to)
{
    const __m256i y = from >= to ? _mm256_srli_epi16(x, from - to) : _mm256_slli_epi16(x, to - from);
    return _mm256_and_si256(y, _mm256_set1_epi8((char)(1 << to)));
}

FN void rowk(__m256 *acc, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r, const int wt,
             const int M)
{
    const int64_t nb = K / 256;
    const size_t tb = rlx_cpu_qblock_bytes(wt);
    const uint8_t *row = w + (size_t)r * (size_t)nb * tb;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = row + (size_t)b * tb;
        rlx_cpu_qmv_prefetch(p, tb);
        __m256i is[4];
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) is[m] = _mm256_setzero_si256();
        /* dot of 32 unsigned values u (elements 32 j ..) with each row, times the scale words sv */
#define DOT32(u, j, sv)                                                                                                \
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) is[m] = _mm256_add_epi32(                                      \
        is[m], _mm256_madd_epi16(_mm256_maddubs_epi16((u), ld(a->q + m * a->ldq + 256 * b + 32 * (j))), (sv)));
        float d, dmin = 0.0f;
        __m256i mdup = _mm256_setzero_si256(); /* minimums as words [m0 m0 m1 m1 ..] (one per pair of 16) */
        __m256i s16 = _mm256_setzero_si256();  /* 16-element groups: the 16 scales as words */
        int offs = 0;                          /* the values' offset (Q6_K 32, Q3_K 4) */
        if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
            const __m128i scm = k4_scales(p + 4);
            const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
            const __m128i mn = _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8));
            mdup = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
            uint32_t dd;
            memcpy(&dd, p, 4);
            const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
            d = _mm_cvtss_f32(dm), dmin = _mm_cvtss_f32(_mm_movehdup_ps(dm));
            const uint8_t *qs = p + (wt == RLX_Q5_K ? 48 : 16);
            const __m256i qh = wt == RLX_Q5_K ? ld(p + 16) : _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
            {
                const __m256i x = ld(qs + 32 * c);
                __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
                if (wt == RLX_Q5_K) {
                    lo = _mm256_or_si256(lo, bit_to(qh, 2 * c, 4));
                    hi = _mm256_or_si256(hi, bit_to(qh, 2 * c + 1, 4));
                }
                DOT32(lo, 2 * c, word_bcast(sc, 2 * c))
                DOT32(hi, 2 * c + 1, word_bcast(sc, 2 * c + 1))
            }
        } else if (wt == RLX_Q6_K) {
            s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
            d = f16s(p + 208), offs = 32;
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
            {
                const __m256i sh =
                    (h ? _mm256_permute2x128_si256(s16, s16, 0x11) : _mm256_permute2x128_si256(s16, s16, 0x00));
                const __m256i l0 = ld(p + 64 * h), l1 = ld(p + 64 * h + 32), qh = ld(p + 128 + 32 * h);
                const __m256i m30 = _mm256_set1_epi8(0x30);
                const __m256i k0 =
                    _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                const __m256i k1 =
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                const __m256i k2 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
                const __m256i k3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                DOT32(k0, 4 * h + 0, pair_bcast(sh, 0))
                DOT32(k1, 4 * h + 1, pair_bcast(sh, 1))
                DOT32(k2, 4 * h + 2, pair_bcast(sh, 2))
                DOT32(k3, 4 * h + 3, pair_bcast(sh, 3))
            }
        } else if (wt == RLX_Q3_K) {
            s16 = _mm256_cvtepi8_epi16(rlx_cpu_k3_scales(p + 96));
            d = f16s(p + 108), offs = 4;
            const __m256i hm = ld(p);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
            {
                const __m256i sh =
                    (h ? _mm256_permute2x128_si256(s16, s16, 0x11) : _mm256_permute2x128_si256(s16, s16, 0x00));
                const __m256i x = ld(p + 32 + 32 * h);
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
                {
                    const __m256i u =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 2 * k), m3), bit_to(hm, 4 * h + k, 2));
                    DOT32(u, 4 * h + k, pair_bcast(sh, k))
                }
            }
        } else { /* Q2_K */
            const __m128i sb = _mm_loadu_si128((const __m128i *)p);
            s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(0x0f)));
            mdup = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0f)));
            d = f16s(p + 80), dmin = f16s(p + 82);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
            {
                const __m256i sh =
                    (h ? _mm256_permute2x128_si256(s16, s16, 0x11) : _mm256_permute2x128_si256(s16, s16, 0x00));
                const __m256i x = ld(p + 16 + 32 * h);
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
                {
                    const __m256i u = _mm256_and_si256(_mm256_srli_epi16(x, 2 * k), m3);
                    DOT32(u, 4 * h + k, pair_bcast(sh, k))
                }
            }
        }
#undef DOT32
        const int mins = wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K;
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
        {
            const float da = a->d[m * nb + b];
            const __m256i bs = ld(a->bsums + m * (K / 16) + 16 * b);
            __m256i i = is[m];
            if (offs) /* - offs * sum_g sc_g bsum_g */
                i = _mm256_sub_epi32(i, _mm256_slli_epi32(_mm256_madd_epi16(s16, bs), offs == 32 ? 5 : 2));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * da), acc[m]);
            if (mins)
                acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mdup)), _mm256_set1_ps(dmin * da),
                                          acc[m]);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Unpacking to signed integers and group scales (the VNNI GEMM's weight panels)
 * ------------------------------------------------------------------------------------------- */

int rlx_cpu_quant_group(int wt) { return wt == RLX_Q2_K || wt == RLX_Q3_K || wt == RLX_Q6_K ? 16 : 32; }

/* the sums of the two 16-byte halves of v (signed bytes) */
FN void sums16(__m256i v, int32_t *s0, int32_t *s1)
{
    const __m256i t = _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i lo = _mm256_castsi256_si128(t), hi = _mm256_extracti128_si256(t, 1);
    *s0 = (int32_t)(_mm_cvtsi128_si32(lo) + _mm_extract_epi32(lo, 2)) - 2048;
    *s1 = (int32_t)(_mm_cvtsi128_si32(hi) + _mm_extract_epi32(hi, 2)) - 2048;
}

/* 32 signed values v at dst (elements g16 * 16 .. of the unit), their group sums into ws */
FN void put32(int8_t *dst, int32_t *ws, __m256i v, int g16)
{
    _mm256_storeu_si256((__m256i *)dst, v);
    int32_t s0, s1;
    sums16(v, &s0, &s1);
    if (g16)
        ws[0] = s0, ws[1] = s1;
    else
        ws[0] = s0 + s1;
}

FN void unpack_units(int8_t *v, float *dw, float *mw, int32_t *ws, const uint8_t *src, int64_t n, const int wt)
{
    const size_t tb = rlx_cpu_qblock_bytes(wt);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    for (int64_t u = 0; u < n; u++) {
        const uint8_t *p = src + (size_t)u * tb;
        if (wt == RLX_Q8_0 || wt == RLX_Q4_0 || wt == RLX_Q4_1 || wt == RLX_Q5_0 || wt == RLX_Q5_1) {
            const int off = wt == RLX_Q4_0 ? 8 : wt == RLX_Q5_0 ? 16 : 0;
            put32(v + 32 * u, ws + u, _mm256_sub_epi8(unpack32(p, wt), _mm256_set1_epi8((char)off)), 0);
            dw[u] = f16s(p);
            mw[u] = wt == RLX_Q4_1 || wt == RLX_Q5_1 ? f16s(p + 2) : 0.0f;
            continue;
        }
        int8_t *o = v + 256 * u;
        uint8_t sm[16];
        if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
            _mm_storeu_si128((__m128i *)sm, k4_scales(p + 4));
            const float d = f16s(p), dmin = f16s(p + 2);
            for (int g = 0; g < 8; g++) dw[8 * u + g] = d * (float)sm[g], mw[8 * u + g] = -(dmin * (float)sm[8 + g]);
            const uint8_t *qs = p + (wt == RLX_Q5_K ? 48 : 16);
            const __m256i qh = wt == RLX_Q5_K ? ld(p + 16) : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                const __m256i x = ld(qs + 32 * c);
                __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
                if (wt == RLX_Q5_K) {
                    lo = _mm256_or_si256(
                        lo,
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << (2 * c)))),
                                                           _mm256_set1_epi8((char)(1 << (2 * c)))),
                                         _mm256_set1_epi8(16)));
                    hi = _mm256_or_si256(
                        hi,
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, _mm256_set1_epi8((char)(2 << (2 * c)))),
                                                           _mm256_set1_epi8((char)(2 << (2 * c)))),
                                         _mm256_set1_epi8(16)));
                }
                put32(o + 64 * c, ws + 8 * u + 2 * c, lo, 0);
                put32(o + 64 * c + 32, ws + 8 * u + 2 * c + 1, hi, 0);
            }
        } else if (wt == RLX_Q6_K) {
            const float d = f16s(p + 208);
            for (int g = 0; g < 16; g++) dw[16 * u + g] = d * (float)(int8_t)p[192 + g], mw[16 * u + g] = 0.0f;
            const __m256i m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = ld(p + 64 * h), l1 = ld(p + 64 * h + 32), qh = ld(p + 128 + 32 * h);
                const __m256i k[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                    _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
                for (int j = 0; j < 4; j++)
                    put32(o + 128 * h + 32 * j, ws + 16 * u + 8 * h + 2 * j, _mm256_sub_epi8(k[j], k32), 1);
            }
        } else if (wt == RLX_Q3_K) {
            _mm_storeu_si128((__m128i *)sm, rlx_cpu_k3_scales(p + 96));
            const float d = f16s(p + 108);
            for (int g = 0; g < 16; g++) dw[16 * u + g] = d * (float)(int8_t)sm[g], mw[16 * u + g] = 0.0f;
            const __m256i hm = ld(p), k4 = _mm256_set1_epi8(4);
            for (int h = 0; h < 2; h++) {
                const __m256i x = ld(p + 32 + 32 * h);
                for (int k = 0; k < 4; k++) {
                    const __m256i uu =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 2 * k), m3), bit_to(hm, 4 * h + k, 2));
                    put32(o + 128 * h + 32 * k, ws + 16 * u + 8 * h + 2 * k, _mm256_sub_epi8(uu, k4), 1);
                }
            }
        } else { /* Q2_K */
            const float d = f16s(p + 80), dmin = f16s(p + 82);
            for (int g = 0; g < 16; g++)
                dw[16 * u + g] = d * (float)(p[g] & 0x0f), mw[16 * u + g] = -(dmin * (float)(p[g] >> 4));
            for (int h = 0; h < 2; h++) {
                const __m256i x = ld(p + 16 + 32 * h);
                for (int k = 0; k < 4; k++)
                    put32(o + 128 * h + 32 * k, ws + 16 * u + 8 * h + 2 * k,
                          _mm256_and_si256(_mm256_srli_epi16(x, 2 * k), m3), 1);
            }
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) void rlx_cpu_qunpack_avx2(int8_t *v, float *dw, float *mw, int32_t *wsum,
                                                                   const void *src, int wt, int64_t n)
{
    switch (wt) {
    case RLX_Q8_0: unpack_units(v, dw, mw, wsum, src, n, RLX_Q8_0); break;
    case RLX_Q4_0: unpack_units(v, dw, mw, wsum, src, n, RLX_Q4_0); break;
    case RLX_Q4_1: unpack_units(v, dw, mw, wsum, src, n, RLX_Q4_1); break;
    case RLX_Q5_0: unpack_units(v, dw, mw, wsum, src, n, RLX_Q5_0); break;
    case RLX_Q5_1: unpack_units(v, dw, mw, wsum, src, n, RLX_Q5_1); break;
    case RLX_Q2_K: unpack_units(v, dw, mw, wsum, src, n, RLX_Q2_K); break;
    case RLX_Q3_K: unpack_units(v, dw, mw, wsum, src, n, RLX_Q3_K); break;
    case RLX_Q4_K: unpack_units(v, dw, mw, wsum, src, n, RLX_Q4_K); break;
    case RLX_Q5_K: unpack_units(v, dw, mw, wsum, src, n, RLX_Q5_K); break;
    default: unpack_units(v, dw, mw, wsum, src, n, RLX_Q6_K); break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Dispatch: one instance per (dtype, M)
 * ------------------------------------------------------------------------------------------- */

/* Rows [r0, r1): the kernel's sums, their lanes added by hsum4, four vectors at a time (four
 * weight rows' at M = 1, the M activation rows' otherwise): one order whatever the grouping. */
#define RANGE(name, kernel)                                                                                            \
    FN void name(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r0,       \
                 int64_t r1, const int wt, const int M)                                                                \
    {                                                                                                                  \
        const __m256 z = _mm256_setzero_ps();                                                                          \
        __m256 acc[4];                                                                                                 \
        int64_t r = r0;                                                                                                \
        for (; M == 1 && r + 4 <= r1; r += 4) {                                                                        \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) kernel(acc + i, a, w, K, r + i, wt, 1);                \
            _mm_storeu_ps(out + r, hsum4(acc[0], acc[1], acc[2], acc[3]));                                             \
        }                                                                                                              \
        for (; r < r1; r++) {                                                                                          \
            kernel(acc, a, w, K, r, wt, M);                                                                            \
            const __m128 s = hsum4(acc[0], M > 1 ? acc[1] : z, M > 2 ? acc[2] : z, M > 3 ? acc[3] : z);                \
            out[r] = _mm_cvtss_f32(s);                                                                                 \
            if (M > 1) out[ldo + r] = _mm_cvtss_f32(_mm_movehdup_ps(s));                                               \
            if (M > 2) out[2 * ldo + r] = _mm_cvtss_f32(_mm_movehl_ps(s, s));                                          \
            if (M > 3) out[3 * ldo + r] = _mm_cvtss_f32(_mm_shuffle_ps(s, s, 3));                                      \
        }                                                                                                              \
    }
RANGE(range32, row32)
RANGE(rangek, rowk)

__attribute__((target("avx2,fma,f16c"))) void rlx_cpu_qmv_avx2(float *out, int64_t ldo, const struct rlx_cpu_qact *a,
                                                               int M, const void *w, int wt, int64_t K, int64_t r0,
                                                               int64_t r1)
{
#define CASE(WT, MM, RANGE_FN)                                                                                         \
    case (WT)*8 + (MM):                                                                                                \
        RANGE_FN(out, ldo, a, w, K, r0, r1, WT, MM);                                                                   \
        break;
#define CASES(WT, RANGE_FN) CASE(WT, 1, RANGE_FN) CASE(WT, 2, RANGE_FN) CASE(WT, 3, RANGE_FN) CASE(WT, 4, RANGE_FN)
    switch (wt * 8 + M) {
        CASES(RLX_Q8_0, range32)
        CASES(RLX_Q4_0, range32)
        CASES(RLX_Q4_1, range32)
        CASES(RLX_Q5_0, range32)
        CASES(RLX_Q5_1, range32)
        CASES(RLX_Q2_K, rangek)
        CASES(RLX_Q3_K, rangek)
        CASES(RLX_Q4_K, rangek)
        CASES(RLX_Q5_K, rangek)
        CASES(RLX_Q6_K, rangek)
    default: break;
    }
#undef CASES
#undef CASE
}
