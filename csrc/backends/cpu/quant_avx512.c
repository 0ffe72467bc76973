/*
 * quant_avx512.c - the AVX-512 VNNI row kernels of the block-type weights: out[m * ldo + r] = row r
 * of W . row m of the activations quantised by quant.c, for up to 16 rows m at once (the weights
 * unpacked once for all of them; instances for M = 1 .. 8 and 16, quant.c's group_rows). A batched
 * decode step of 16 sequences then unpacks each weight once, where groups of 4 unpacked it four
 * times: measured on an Intel Xeon (2 threads, Qwen3-0.6B, whole steps, old and new builds run
 * alternately), Q4_K_M 16 sequences 107 -> 131 tok/s, 8 sequences 106 -> 118; Q8_0 91 -> 119 and
 * 77 -> 99; one sequence within the noise. Only called where rlx_cpu_avx512_vnni() (quant.c).
 * Below them the K types' kernel for batches on AMX-INT8 tiles (rlx_cpu_qmv_amx; its section says
 * how), which unpacks the weights as the row kernels do (kunpack).
 *
 * 64 weights per vector, unpacked to unsigned bytes in the order the activations are kept in.
 * Zen 4 runs each 512-bit multiply (VPDPBUSD, VPDPWSSD, VPMADDUBSW, FMA, VCVTPH2PS) as two halves
 * on its two multiply pipes, one instruction per cycle, and one 512-bit load per cycle: measured
 * (cache-resident weights) the kernels are bound by those two, so they are written to spend as
 * few of each per weight as the formats allow.
 *   Q4_0 .. Q5_1: groups of 4 blocks (72 .. 96 bytes: two 64-byte loads, the second masked to the
 *     group), nibbles and fifth bits gathered by word permutes (every field of these blocks starts
 *     at an even byte), the activations arranged to match (rlx_cpu_quant_arrange); two VPDPBUSD
 *     (u8 x s8, 4 products per int32 lane, exact) from the blocks' -off * sum a (one lane each,
 *     so the lanes sum q a and the offset is taken in one of them: the f32 rounding of the
 *     lanes is then relative to |q| + off, not |q - off|); the 4 block
 *     scales converted as one xmm and multiplied by the activations' 4 d, then spread over the
 *     lanes: acc += cvt(lanes) * (dw * da); Q4_1 / Q5_1: + mw * s per block, in an xmm.
 *   Q8_0: pairs of blocks (two 32-byte runs of int8): VPDPBUSD of |w| with the activations negated
 *     where w < 0; the two scales converted as one xmm, times the activations' two d, spread over
 *     the two halves: acc += cvt(lanes) * (dw * da).
 *   K types: VPDPBUSD of two vectors of values (4 products per int32 lane, within one group),
 *     packed to words (exact: |lane| < 2^15) and VPDPWSSD with the group scales in each word
 *     (int32, exact; Q4_K / Q5_K: the low nibbles of two 32-byte chunks per vector, which act_rows
 *     matches by swapping groups). Q6_K / Q3_K one super-block at a time (kstep): the offset
 *     (-off * sum_g sc_g bsum_g) subtracted in int32, then acc += cvt(lanes) * (d * da) in f32;
 *     Q4_K / Q5_K / Q2_K two at a time (kpair: the two super-blocks' sums packed into one vector
 *     of words), then acc += cvt(lanes) * (d_s * da_s) - cvt(m_g bsum_g) * (dmin_s * da_s).
 * The per-block fields come out by vector shuffles, not scalar loads and shifts: Q4_K / Q5_K's
 * twelve bytes of six-bit scales and minimums by two dword shuffles, masks and one blend
 * (k4_scales), their minimums doubled per 16 by one word permute, d and dmin by one VCVTPH2PS;
 * Q4_0 .. Q5_1's four f16 scales (and minimums) by one word permute of the group's two loads.
 * Measured on an AMD EPYC Zen 5 (1 thread, min of 15 passes, random weights): cache-resident
 * 1024 x 1024, Q4_K 17.3 -> 13.9 us a call, Q4_0 18.3 -> 13.7; from DRAM (1024 x 3072, 600 MiB
 * of copies) both 31-33 -> 36.2 GB/s (the read probe 37-39); Qwen3-0.6B whole decode steps at 128
 * positions, old and new builds alternating, Q4_K_M 16.3-16.5 -> 15.8 ms, Q4_0 15.4-17.1 ->
 * 13.9-15.3 ms (2 threads: within the noise).
 * The row kernels (row4, row8, rowk) leave a row's sums in one vector per row of activations; the
 * instance (the dispatch section) adds the 16 lanes in one order (hsum4), four vectors at a time:
 * four weight rows' at M = 1, four activation rows' otherwise. A horizontal sum per output
 * (VEXTRACT and add, four times) had cost as much as a fifth of a row of K = 1024 (Qwen3-0.6B's
 * hidden size: 8 groups of Q4_0, 4 super-blocks). Zen 4, 1 thread, 256 x 1024 cache-resident, us a
 * call, M = 1: Q4_0 5.8 -> 5.4, Q8_0 7.2 -> 6.6, Q4_K 5.0 -> 4.6, Q6_K 5.9 -> 5.5 (from DRAM, 2 MiB
 * pages, GB/s: +2-4 %); M = 8 and 16 2-4 % faster, M = 2 and 3 within 2 %; the matmuls of whole
 * decode steps at 128 positions, 1 thread, builds alternating three times, ms: Qwen3-0.6B Q4_K_M
 * 16.1-16.8 -> 14.5-16.0, Q8_0 23.9-25.0 -> 23.1-25.2, Llama-3.2-1B Q4_K_M 30.3-32.7 -> 27.6-32.7.
 * Processing the four weight rows interleaved (sharing the activations' loads) was faster still
 * for Q4_0 from DRAM (+5 %) but slower for Q8_0 (-7 %) and Q6_K (-18 %): four streams instead of
 * one. Each output: a fixed sequence of operations whatever M, the row range or the thread count.
 * Must never read past a weight row (an odd last block is read alone; activations past it are
 * masked; the prefetches (rlx_cpu_qmv_prefetch) may reach past the weights) and never
 * allocate.
 */
#include "backends/cpu/cpu.h"

#include "core/quants.h"

#include <immintrin.h>
#include <string.h>

#define FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline

/* the largest M of an instance */
#define MAX_M 16

FN float f16s(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

FN size_t tsize(const int wt)
{
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

/* ---------------------------------------------------------------------------------------------
 * 32-element types. Q4_0 .. Q5_1: groups of 4 blocks (72 .. 96 bytes: two 64-byte loads, the
 * second masked to the group) whose nibbles, scales and fifth bits are gathered by word permutes
 * (every field of these blocks starts at an even byte); the activations are arranged to match
 * (rlx_cpu_quant_arrange). Q8_0: pairs of blocks (the int8 are whole 32-byte runs).
 * ------------------------------------------------------------------------------------------- */

struct idx32 {
    __m512i nib, qh, sc; /* word indices into the 64 words of a group's two loads */
};

/* the permutes of 4 blocks of wt (tb bytes each): nib: block j's 8 words of nibbles at words 8j..;
 * qh: words j and 4 + j the low and high halves of block j's fifth bits; sc: word j block j's f16
 * scale, word 4 + j its f16 minimum (Q4_1, Q5_1: the word after the scale) */
FN void idx32_init(struct idx32 *ix, const int wt)
{
    const int tw = (int)tsize(wt) / 2, no = wt == RLX_Q4_0 ? 1 : wt == RLX_Q4_1 ? 2 : wt == RLX_Q5_0 ? 3 : 4;
    const int ho = wt == RLX_Q5_0 ? 1 : 2;
    uint16_t nib[32], qh[32], sc[32];
    for (int w = 0; w < 32; w++) {
        nib[w] = (uint16_t)((w / 8) * tw + no + w % 8);
        qh[w] = (uint16_t)(w < 8 ? (w % 4) * tw + ho + w / 4 : 0);
        sc[w] = (uint16_t)(w < 8 ? (w % 4) * tw + w / 4 : 0);
    }
    ix->nib = _mm512_loadu_si512(nib), ix->qh = _mm512_loadu_si512(qh), ix->sc = _mm512_loadu_si512(sc);
}

/* the group of n (1..4) blocks at p (bytes under masks k0 / k1 of the two loads), lanes 16 g .. */
FN void group4(__m512 *acc, __m128 *macc, const struct rlx_cpu_qact *a, const uint8_t *p, __mmask64 k0, __mmask64 k1,
               int64_t g, int n, const struct idx32 *ix, const int wt, const int M)
{
    const int five = wt == RLX_Q5_0 || wt == RLX_Q5_1, mins = wt == RLX_Q4_1 || wt == RLX_Q5_1;
    const int64_t Q = a->ldq;
    const __m512i z0 = _mm512_maskz_loadu_epi8(k0, p), z1 = _mm512_maskz_loadu_epi8(k1, p + 64);
    const __m512i nib = _mm512_permutex2var_epi16(z0, ix->nib, z1), m4 = _mm512_set1_epi8(0x0f);
    __m512i lo = _mm512_and_si512(nib, m4), hi = _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4);
    if (five) {
        const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi16(z0, ix->qh, z1));
        const __m512i s16 = _mm512_set1_epi8(16);
        lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(qh)), lo, s16);
        hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64((uint64_t)_mm_extract_epi64(qh, 1)), hi, s16);
    }
    /* the blocks' scales (words 0-3) and minimums (4-7); 0 past n, where the loads were masked */
    const __m128i sm = _mm512_castsi512_si128(_mm512_permutex2var_epi16(z0, ix->sc, z1));
    const __m128 dw = _mm_cvtph_ps(sm), mw = mins ? _mm_cvtph_ps(_mm_srli_si128(sm, 8)) : _mm_setzero_ps();
    const __m512i expand = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2);
    const __mmask8 live = (__mmask8)((1u << n) - 1);
    const int64_t nb = a->K / 32;
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++)
    {
        const int8_t *q = a->q + m * Q + 128 * g;
        const float *d = a->d + m * nb + 4 * g;
        __m512i bias = _mm512_setzero_si512();
        if (!mins) /* block j's -off * sum a into lane 4 j, the first of its four */
            bias = _mm512_maskz_permutexvar_epi32(
                0x1111, expand,
                _mm512_castsi128_si512(n == 4 ? _mm_loadu_si128((const __m128i *)(a->bias + m * nb + 4 * g))
                                              : _mm_maskz_loadu_epi32(live, a->bias + m * nb + 4 * g)));
        const __m512i i = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, lo, ld64(q)), hi, ld64(q + 64));
        const __m128 dd = _mm_mul_ps(dw, n == 4 ? _mm_loadu_ps(d) : _mm_maskz_loadu_ps(live, d));
        acc[m] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(dd)), acc[m]);
        if (mins) {
            const float *sp = a->s + m * nb + 4 * g;
            macc[m] = _mm_fmadd_ps(mw, n == 4 ? _mm_loadu_ps(sp) : _mm_maskz_loadu_ps(live, sp), macc[m]);
        }
    }
}

/* The sums of a, b, c and d's 16 lanes (lanes 0..3 of the result): each vector's 256-bit halves
 * added, then pairs (VHADDPS twice), then the 128-bit halves. Each sum depends on its own vector
 * alone: with zeros in the other places one vector's sum has the same bits. */
FN __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
#define HALVES(x)                                                                                                      \
    _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))
    const __m256 ab = _mm256_hadd_ps(HALVES(a), HALVES(b)), cd = _mm256_hadd_ps(HALVES(c), HALVES(d));
#undef HALVES
    const __m256 s = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* out[m * ldo] = the sum of acc[m]'s lanes (hsum4's order), m < M: four at a time */
FN void store_sums(float *out, int64_t ldo, const __m512 *acc, const int M)
{
    const __m512 z = _mm512_setzero_ps();
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m += 4)
    {
        const int n = M - m < 4 ? M - m : 4;
        const __m128 s = hsum4(acc[m], n > 1 ? acc[m + 1] : z, n > 2 ? acc[m + 2] : z, n > 3 ? acc[m + 3] : z);
        _mm_store_ss(out + m * ldo, s);
        if (n > 1) _mm_store_ss(out + (m + 1) * ldo, _mm_movehdup_ps(s));
        if (n > 2) _mm_store_ss(out + (m + 2) * ldo, _mm_movehl_ps(s, s));
        if (n > 3) _mm_store_ss(out + (m + 3) * ldo, _mm_shuffle_ps(s, s, 3));
    }
}

FN __mmask64 bytes_mask(int64_t n) { return n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : ((__mmask64)1 << n) - 1; }

/* The sums of weight row r against the M rows of activations into acc[0 .. M) (row8, rowk too) */
FN void row4(__m512 *acc, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r, const struct idx32 *ix,
             const int wt, const int M)
{
    const int64_t nb = K / 32, tb = (int64_t)tsize(wt), gb = 4 * tb;
    const uint8_t *row = w + r * nb * tb;
    __m128 macc[MAX_M];
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps(), macc[m] = _mm_setzero_ps();
    const __mmask64 k1 = bytes_mask(gb - 64);
    int64_t g = 0;
    /* The group loops of row4 and row8, and rowk's for Q6_K, unrolled twice (the same operations in
     * the same order): at one activation row these kernels issue about as many instructions per
     * byte as the core retires while DRAM streams them (perf: Q4_0's loop ~33 instructions for 72
     * bytes; an 8 % slower build when its prefetch distance was read from a variable), so the loop
     * overhead showed. Qwen3-0.6B decode at 128 positions, 2 threads, Intel Xeon (AVX-512 VNNI),
     * ms a step, builds alternating, two rounds: Q4_0 16.8-17.1 -> 15.9-16.3, Q6_K 18.8-19.1 ->
     * 18.1, Q8_0 25.6-25.9 -> 25.0-25.1, Q4_K_M 16.1-16.2 -> 15.4-15.6; Llama-3.2-1B Q4_K_M
     * 29.6-30.0 -> 28.7-29.1. Unrolling rowk for the other K types too made Llama-3.2-1B Q4_K_M
     * 4 % slower (29.3-29.4 -> 30.6-30.8), and four times Q4_0 no faster than twice. */
    _Pragma("GCC unroll 2") for (; 4 * g + 4 <= nb; g++)
    {
        rlx_cpu_qmv_prefetch(row + g * gb, (size_t)gb);
        group4(acc, macc, a, row + g * gb, ~(__mmask64)0, k1, g, 4, ix, wt, M);
    }
    if (4 * g < nb) { /* the last 1 .. 3 blocks */
        const int64_t n = (nb - 4 * g) * tb;
        group4(acc, macc, a, row + g * gb, bytes_mask(n), bytes_mask(n - 64), g, (int)(nb - 4 * g), ix, wt, M);
    }
    if (wt == RLX_Q4_1 || wt == RLX_Q5_1)
        _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] =
            _mm512_add_ps(acc[m], _mm512_castps128_ps512(macc[m]));
}

/* Q8_0: the block at p (and the next one, at p + 34, when two): |w| from two 32-byte runs of int8
 * against the activations negated where w < 0 (exact int32 lanes, no offset); the two scales as
 * an xmm, times the activations' two d, spread over the halves */
FN void pair8(__m512 *acc, const struct rlx_cpu_qact *a, const uint8_t *p, int64_t b, const int two, const int M)
{
    const int64_t Q = a->ldq, nb = a->K / 32;
    const __m512i w = cat(ld32(p + 2), ld32(p + (two ? 36 : 2))), aw = _mm512_abs_epi8(w);
    const __mmask64 neg = _mm512_movepi8_mask(w);
    uint16_t h0, h1 = 0;
    memcpy(&h0, p, 2);
    if (two) memcpy(&h1, p + 34, 2);
    const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)h0 | (uint32_t)h1 << 16)));
    const __m512i halves = _mm512_mask_blend_epi32(0xff00, _mm512_setzero_si512(), _mm512_set1_epi32(1));
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++)
    {
        const float *d = a->d + m * nb + b;
        const __m128 da = two ? _mm_castpd_ps(_mm_load_sd((const double *)d)) : _mm_load_ss(d);
        __m512i av = two ? ld64(a->q + m * Q + 32 * b) : _mm512_maskz_loadu_epi8(0xffffffffull, a->q + m * Q + 32 * b);
        av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, av)),
                                 _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_mul_ps(dw, da))), acc[m]);
    }
}

FN void row8(__m512 *acc, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r, const struct idx32 *ix,
             const int wt, const int M)
{
    (void)ix, (void)wt;
    const int64_t nb = K / 32;
    const uint8_t *row = w + r * nb * RLX_Q8_0_BYTES;
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    int64_t b = 0;
    _Pragma("GCC unroll 2") for (; b + 2 <= nb; b += 2)
    {
        rlx_cpu_qmv_prefetch(row + b * RLX_Q8_0_BYTES, 2 * RLX_Q8_0_BYTES);
        pair8(acc, a, row + b * RLX_Q8_0_BYTES, b, 1, M);
    }
    if (b < nb) pair8(acc, a, row + b * RLX_Q8_0_BYTES, b, 0, M);
}

/* ---------------------------------------------------------------------------------------------
 * K types: the row kernels (kstep, kpair), then the AMX kernel
 * ------------------------------------------------------------------------------------------- */

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

/* Q3_K: the 16 scales (6 bits, minus 32) of the 12 bytes at s, as 16 signed bytes */
FN __m128i k3_scales(const uint8_t *s)
{
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4), memcpy(&a1, s + 4, 4), memcpy(&a2, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const __m128i v = _mm_set_epi32((int)(((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4)),
                                    (int)(((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4)),
                                    (int)((a1 & m4) | (((a2 >> 2) & m2) << 4)), (int)((a0 & m4) | ((a2 & m2) << 4)));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
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

/* One super-block unpacked (kstep, and the AMX kernel's kbuf_row): kvalues' u, the group scales
 * as words sw (16-element groups also as s16), the minimums as words one per 16 (mdup; only the
 * AMX kernel reads them), d, dmin and the values' offset (Q6_K 32, Q3_K 4). */
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
        k->s16 = _mm256_cvtepi8_epi16(k3_scales(p + 96));
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

/* The row kernel of the K types, two ways: the offset types (Q6_K 32, Q3_K 4) one super-block at a
 * time (kstep), the types with minimums (Q4_K, Q5_K, Q2_K) two at a time (kpair).
 *
 * kstep: per row of activations and pair k = (u[2k], u[2k + 1]), the group scales as words sv[k]:
 * two VPDPBUSD (4 products per int32 lane: |sum| <= 4 * 63 * 127 < 2^15, so the pack to words below
 * is exact), one VPACKSSDW (per 128-bit lane: 4 words of u[2k]'s lanes, then 4 of u[2k + 1]'s; both
 * words of a dword from one group), one VPDPWSSD with the scales: 3 multiplies per 128 weights
 * (VPMADDUBSW + VPDPWSSD per 64 took 4, and 4 scale permutes per super-block where this takes 2);
 * then offs * sum_g sc_g bsum_g subtracted in int32 and acc += cvt(i) * (d * da). */
static const uint16_t SCALE_IDX16[2][32] = {
    {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
    {8,  8,  8,  8,  12, 12, 12, 12, 9,  9,  9,  9,  13, 13, 13, 13,
     10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15}};

FN void kstep(__m512 *acc, const struct rlx_cpu_qact *a, const uint8_t *p, int64_t b, __m512i sidx0, __m512i sidx1,
              const int wt, const int M)
{
    const int64_t K = a->K, nb = K / 256;
    const __m512i zero = _mm512_setzero_si512();
    rlx_cpu_qmv_prefetch(p, tsize(wt));
    struct kblock k;
    kunpack(&k, p, wt);
    const __m512i sv0 = _mm512_permutexvar_epi16(sidx0, k.sw), sv1 = _mm512_permutexvar_epi16(sidx1, k.sw);
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++)
    {
        const int8_t *q = a->q + m * a->ldq + 256 * b;
        __m512i i = _mm512_dpwssd_epi32(zero,
                                        _mm512_packs_epi32(_mm512_dpbusd_epi32(zero, k.u[0], ld64(q)),
                                                           _mm512_dpbusd_epi32(zero, k.u[1], ld64(q + 64))),
                                        sv0);
        i = _mm512_dpwssd_epi32(i,
                                _mm512_packs_epi32(_mm512_dpbusd_epi32(zero, k.u[2], ld64(q + 128)),
                                                   _mm512_dpbusd_epi32(zero, k.u[3], ld64(q + 192))),
                                sv1);
        const float da = a->d[m * nb + b];
        const __m256i bs = ld32(a->bsums + m * (K / 16) + 16 * b);
        i = _mm512_sub_epi32(
            i, _mm512_zextsi256_si512(_mm256_slli_epi32(_mm256_madd_epi16(k.s16, bs), k.offs == 32 ? 5 : 2)));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(k.d * da), acc[m]);
    }
}

/* kpair: super-blocks s = 0, 1 at once. Per row of activations and position j < 4, the two VPDPBUSD
 * of u0[j] and u1[j] packed to words (VPACKSSDW: per 128-bit lane 4 words of super-block 0's, then 4
 * of super-block 1's), one VPDPWSSD with the group scales in each word (sv[j]), into int32 sums
 * whose dwords 0, 1 of each 128-bit lane are super-block 0's and 2, 3 super-block 1's (exact: each
 * dword sums 8 words times a scale, |.| <= 8 * 4 * 31 * 127 * 63 < 2^24, so the conversion is exact
 * too). Then per row and pair one conversion and one FMA, acc += cvt(i) * (d_s da_s spread as the
 * dwords), and one conversion and FNMADD of the minimums, sum_g m_g bsum_g (one VPMADDWD: words 16 s
 * .. super-block s's, the bsums' order) times dmin_s da_s. Per super-block that halves the
 * conversions, FMAs, broadcasts and the scale decoding (k4_scales takes both in one ymm) of kstep:
 * on an AMD EPYC Zen 4 (1 thread, 1024 x 2048 Q4_K cache-resident, one row of activations, best of
 * three) 19.3 -> 16.6 cycles a super-block; 2 / 4 / 8 rows 28.6 / 49.0 / 91.8 -> 24.8 / 42.6 /
 * 83.2; Llama-3.2-1B Q4_K_M decode at 128 positions (Q4_K 446 MiB, Q6_K 317), builds alternating,
 * 1 thread 32.6-32.9 -> 31.3-31.5 ms a step, 2 threads 24.1-24.3 -> 23.3-23.8. The offset types
 * stay on kstep: in this layout their offset needs the bsums permuted to the dwords' order once
 * per row and pair, and Q6_K measured 21.6 -> 22.9 cycles (Q3_K 27.6 -> 28.5) at one row. */
struct kscales {
    __m512i sv[4]; /* position j's group scales as words: per 128-bit lane 4 of super-block 0's, then
                      4 of super-block 1's (one per dword of the packed sums) */
    __m512i mins;  /* the minimums, one word per 16 values, words 16 s .. super-block s's */
    __m128 dm;     /* d0, dmin0, d1, dmin1 */
};

/* sv[j]'s words: per 128-bit lane l and word w, 16 (w >= 4) + the group of u[j] at lane l, an index
 * into the scales of both super-blocks as words (16 each; Q4_K / Q5_K: 8 scales, then 8 minimums) */
static const uint16_t PAIR_IDX32[4][32] = {
    {0, 0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16, 2, 2, 2, 2, 18, 18, 18, 18, 2, 2, 2, 2, 18, 18, 18, 18},
    {1, 1, 1, 1, 17, 17, 17, 17, 1, 1, 1, 1, 17, 17, 17, 17, 3, 3, 3, 3, 19, 19, 19, 19, 3, 3, 3, 3, 19, 19, 19, 19},
    {4, 4, 4, 4, 20, 20, 20, 20, 4, 4, 4, 4, 20, 20, 20, 20, 6, 6, 6, 6, 22, 22, 22, 22, 6, 6, 6, 6, 22, 22, 22, 22},
    {5, 5, 5, 5, 21, 21, 21, 21, 5, 5, 5, 5, 21, 21, 21, 21, 7, 7, 7, 7, 23, 23, 23, 23, 7, 7, 7, 7, 23, 23, 23, 23}};
static const uint16_t PAIR_IDX16[4][32] = {
    {0, 0, 0, 0, 16, 16, 16, 16, 1, 1, 1, 1, 17, 17, 17, 17, 2, 2, 2, 2, 18, 18, 18, 18, 3, 3, 3, 3, 19, 19, 19, 19},
    {4, 4, 4, 4, 20, 20, 20, 20, 5, 5, 5, 5, 21, 21, 21, 21, 6, 6, 6, 6, 22, 22, 22, 22, 7, 7, 7, 7, 23, 23, 23, 23},
    {8,  8,  8,  8,  24, 24, 24, 24, 9,  9,  9,  9,  25, 25, 25, 25,
     10, 10, 10, 10, 26, 26, 26, 26, 11, 11, 11, 11, 27, 27, 27, 27},
    {12, 12, 12, 12, 28, 28, 28, 28, 13, 13, 13, 13, 29, 29, 29, 29,
     14, 14, 14, 14, 30, 30, 30, 30, 15, 15, 15, 15, 31, 31, 31, 31}};
/* Q4_K / Q5_K's minimums one per 16 values: m0 m0 m1 m1 .. m7 m7 of each super-block */
static const uint16_t PAIR_MINS[32] = {8,  8,  9,  9,  10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,
                                       24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31, 31};

/* the scales of the super-blocks at p0 and p1 (Q4_K, Q5_K, Q2_K), sv by the permutes sidx
 * (PAIR_IDX32 / PAIR_IDX16) */
FN void kpair_scales(struct kscales *k, const uint8_t *p0, const uint8_t *p1, const __m512i sidx[4], const int wt)
{
    __m512i sw; /* words 16 s ..: super-block s's scales */
    uint32_t dm0, dm1;
    if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
        sw = _mm512_cvtepu8_epi16(k4_scales(p0 + 4, p1 + 4));
        k->mins = _mm512_permutexvar_epi16(_mm512_loadu_si512(PAIR_MINS), sw);
        memcpy(&dm0, p0, 4), memcpy(&dm1, p1, 4);
    } else { /* Q2_K: 16 scales and 16 minimums, a nibble each */
        const __m256i sb = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                                   _mm_loadu_si128((const __m128i *)p1), 1);
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        sw = _mm512_cvtepu8_epi16(_mm256_and_si256(sb, m4));
        k->mins = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(sb, 4), m4));
        memcpy(&dm0, p0 + 80, 4), memcpy(&dm1, p1 + 80, 4);
    }
    k->dm = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)((uint64_t)dm0 | (uint64_t)dm1 << 32)));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) k->sv[j] = _mm512_permutexvar_epi16(sidx[j], sw);
}

/* super-blocks b and b + 1 (at p) of a weight row against the M activation rows, into acc; two =
 * 0: super-block b alone (the row's last, odd one), taken as a pair with itself whose second half
 * is scaled by 0 (the weights' values and scales and the activations are finite; nothing past b is
 * read) */
FN void kpair(__m512 *acc, const struct rlx_cpu_qact *a, const uint8_t *p, int64_t b, const __m512i sidx[4],
              const int wt, const int two, const int M)
{
    const int64_t K = a->K, nb = K / 256;
    const size_t tb = tsize(wt);
    const uint8_t *p1 = two ? p + tb : p;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i spread = _mm512_set_epi32(2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0, 0, 2, 2, 0, 0);
    const __m512i spread_min = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
    rlx_cpu_qmv_prefetch(p, two ? 2 * tb : tb);
    struct kscales k;
    kpair_scales(&k, p, p1, sidx, wt);
    __m512i u[2][4]; /* kvalues of super-block s */
    kvalues(u[0], p, wt), kvalues(u[1], p1, wt);
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++)
    {
        const int8_t *q0 = a->q + m * a->ldq + 256 * b, *q1 = two ? q0 + 256 : q0;
        __m512i ij[2] = {zero, zero}; /* two chains of VPDPWSSD, summed */
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) ij[j & 1] =
            _mm512_dpwssd_epi32(ij[j & 1],
                                _mm512_packs_epi32(_mm512_dpbusd_epi32(zero, u[0][j], ld64(q0 + 64 * j)),
                                                   _mm512_dpbusd_epi32(zero, u[1][j], ld64(q1 + 64 * j))),
                                k.sv[j]);
        const float *dp = a->d + m * nb + b;
        const __m128 da = two ? _mm_castpd_ps(_mm_load_sd((const double *)dp)) : _mm_load_ss(dp);
        /* d0 da0, dmin0 da0, d1 da1, dmin1 da1 (0, 0 for a lone super-block) */
        const __m512 f = _mm512_castps128_ps512(_mm_mul_ps(k.dm, _mm_unpacklo_ps(da, da)));
        const int16_t *bp = a->bsums + m * (K / 16) + 16 * b;
        const __m512i bs = two ? ld64(bp) : _mm512_zextsi256_si512(ld32(bp)); /* 16 per super-block */
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ij[0], ij[1])), _mm512_permutexvar_ps(spread, f),
                                 acc[m]);
        acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(bs, k.mins)),
                                  _mm512_permutexvar_ps(spread_min, f), acc[m]);
    }
}

FN void rowk(__m512 *acc, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r, const struct idx32 *ix,
             const int wt, const int M)
{
    (void)ix;
    const int64_t nb = K / 256;
    const size_t tb = tsize(wt);
    const uint8_t *row = w + (size_t)r * (size_t)nb * tb;
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    if (wt == RLX_Q6_K || wt == RLX_Q3_K) {
        const __m512i sidx0 = _mm512_loadu_si512(SCALE_IDX16[0]), sidx1 = _mm512_loadu_si512(SCALE_IDX16[1]);
        if (wt == RLX_Q6_K) { /* unrolled: row4 says why, and why only Q6_K */
            _Pragma("GCC unroll 2") for (int64_t b = 0; b < nb; b++)
                kstep(acc, a, row + (size_t)b * tb, b, sidx0, sidx1, wt, M);
        } else {
            for (int64_t b = 0; b < nb; b++) kstep(acc, a, row + (size_t)b * tb, b, sidx0, sidx1, wt, M);
        }
    } else {
        __m512i sidx[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) sidx[j] =
            _mm512_loadu_si512(wt == RLX_Q2_K ? PAIR_IDX16[j] : PAIR_IDX32[j]);
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) kpair(acc, a, row + (size_t)b * tb, b, sidx, wt, 1, M);
        if (b < nb) kpair(acc, a, row + (size_t)b * tb, b, sidx, wt, 0, M);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The AMX-INT8 decode kernel of the K types (rlx_cpu_qmv_amx), for batches: blocks of 16 weight
 * rows, one super-block at a time. The 16 rows' super-blocks are unpacked (kunpack) into an L1
 * buffer as signed values (u - offs), in kunpack's order, with per G-value chunk of that order the
 * f32 scale dw = d sc and minimum mw = -(dmin m) of its group. Then tile products TDPBSSD of the 16
 * rows' values against the activations (a->tq) give each group's 16 x 16 integer sums, and AVX-512
 * scales them: one zmm per weight row over the tile's columns, acc += cvt(sum) * dw [+ bsum * mw]
 * per group and, per super-block, accm += acc * da. A tile's 16 columns hold P groups of 16 / P
 * activation rows (column m P + j: row m, group j of the product's P; rlx_cpu_qmv_amx_groups), so
 * a batch of up to 8 rows takes two groups per product: the tile products, their stores and the
 * scaling are the cost of the kernel (measured: Q4_K, 3072 x 1024, 8 rows, cache-resident, 2
 * threads, one group per product: 110 us, of which 38 the tiles, 33 the scaling, 14 the
 * unpacking; two: 88 us, the VNNI row kernels 159). The prefetch reaches the same super-block of
 * the next block's rows (a distance in bytes, as the row kernels', reached only part of the next
 * block: 117 -> 102 us from 354 MiB of copies, VNNI 162). Where a VPDPBUSD pass costs per
 * activation row, this costs about the same for 1 or 16 rows: quant.c sends it only batches
 * (RLX_CPU_QMV_AMX_MIN_M) and prompts of up to RLX_CPU_QMV_AMX_MAX_M rows, which take a copy of
 * the activations' tile rows per 16 rows, each unpacked super-block run against all of them. The
 * integers are the VNNI kernels'; the f32 sums run in another order, the same for a row whatever
 * the other rows, for one P.
 * ------------------------------------------------------------------------------------------- */

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define AMX_TARGET  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define AMX_FN      AMX_TARGET __attribute__((always_inline)) static inline

int rlx_cpu_qmv_amx_groups(int M) { return M <= 8 ? 2 : 1; }

/* the natural group of the G-value chunk at position c of kunpack's order */
static int kgroup(int c, int wt)
{
    return wt == RLX_Q4_K || wt == RLX_Q5_K ? (c & 4) | ((c & 1) << 1) | ((c >> 1) & 1) : c;
}

/* one block of 16 weight rows: a super-block's values and scales, the tile sums, the outputs */
struct kbuf {
    _Alignas(64) int8_t v[16][256];       /* signed values, in kunpack's order */
    _Alignas(64) float dw[16][16];        /* per row and chunk of G values of that order: d * sc */
    _Alignas(64) float mw[16][16];        /* -(dmin * m) (types with minimums) */
    _Alignas(64) int32_t sums[2][16][16]; /* a product's sums: weight row x column */
    _Alignas(64) float accm[RLX_CPU_QMV_AMX_MAX_M / 16][16][16]; /* per 16 rows of the activations
                                                                   the sums over super-blocks:
                                                                   weight row x column */
};

/* row n's super-block at p into the buffer */
FN void kbuf_row(struct kbuf *kb, int n, const uint8_t *p, const int wt)
{
    struct kblock k;
    kunpack(&k, p, wt);
    const __m512i offs = _mm512_set1_epi8((char)k.offs);
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
        _mm512_store_si512(kb->v[n] + 64 * v, _mm512_sub_epi8(k.u[v], offs));
    if (wt == RLX_Q4_K || wt == RLX_Q5_K) { /* sw: 8 scales, then 8 minimums; into chunk order */
        const __m512i order = _mm512_set_epi32(15, 13, 14, 12, 11, 9, 10, 8, 7, 5, 6, 4, 3, 1, 2, 0);
        const __m512 f =
            _mm512_permutexvar_ps(order, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(k.sw))));
        _mm512_store_ps(kb->dw[n], _mm512_mul_ps(f, _mm512_set1_ps(k.d)));
        _mm512_store_ps(kb->mw[n], _mm512_mul_ps(_mm512_shuffle_f32x4(f, f, 0xee), _mm512_set1_ps(-k.dmin)));
    } else {
        _mm512_store_ps(kb->dw[n],
                        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(k.s16)), _mm512_set1_ps(k.d)));
        if (wt == RLX_Q2_K)
            _mm512_store_ps(kb->mw[n],
                            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(k.mdup)), _mm512_set1_ps(-k.dmin)));
    }
}

/* P (1 or 2) consecutive floats at p repeated over the 16 lanes */
FN __m512 rep(const float *p, const int P)
{
    if (P == 1) return _mm512_set1_ps(*p);
    double d;
    memcpy(&d, p, 8);
    return _mm512_castpd_ps(_mm512_set1_pd(d));
}

/* Product o of super-block b (chunks P o .. P o + P - 1) into tile set 0 (sums 0, weights 1,
 * activations 2) or 1 (3, 4, 5): tile numbers are instruction immediates, hence two. */
#define AMX_ISSUE(C, W, A, o)                                                                                          \
    do {                                                                                                               \
        _tile_loadd(W, kb->v[0] + (o)*P * G, 256);                                                                     \
        _tile_loadd(A, tq + (b * 256 + (o)*P * G) / 4 * 64, 64);                                                       \
        _tile_zero(C);                                                                                                 \
        _tile_dpbssd(C, W, A);                                                                                         \
    } while (0)

/* product o's sums into regs */
AMX_FN void amx_scale(__m512 regs[16], const struct kbuf *kb, const int32_t sums[16][16], const float *gsum, int o,
                      const int P, const int mins)
{
    const __m512 bsum = mins ? _mm512_load_ps(gsum) : _mm512_setzero_ps();
    _Pragma("GCC unroll 16") for (int n = 0; n < 16; n++)
    {
        regs[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[n])), rep(kb->dw[n] + o * P, P), regs[n]);
        if (mins) regs[n] = _mm512_fmadd_ps(bsum, rep(kb->mw[n] + o * P, P), regs[n]);
    }
}

/* out[m * ldo + r0 + n] for m < M, n < nr (<= 16): weight rows r0 .. r0 + nr against a->tq, each
 * super-block unpacked once for every 16 rows of the activations (M up to RLX_CPU_QMV_AMX_MAX_M) */
AMX_FN void amx_block(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r0,
                      int64_t nr, struct kbuf *kb, const int wt, const int P, const int M)
{
    const int G = wt == RLX_Q4_K || wt == RLX_Q5_K ? 32 : 16, nops = 256 / (P * G);
    const int mins = wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K;
    const int64_t nb = K / 256;
    const size_t tb = tsize(wt), rb = (size_t)nb * tb;
    const int ncg = (M + 15) / 16; /* column groups: copies of tq, td, tg */
    const int64_t tq_cs = K * 16, td_cs = nb * 16, tg_cs = nb * nops * 16;
    for (int cg = 0; cg < ncg; cg++)
        for (int n = 0; n < 16; n++) _mm512_store_ps(kb->accm[cg][n], _mm512_setzero_ps());
    if (nr < 16) { /* rows past the matrix: zeros, never output */
        memset(kb->v[nr], 0, (size_t)(16 - nr) * 256);
        memset(kb->dw[nr], 0, (size_t)(16 - nr) * sizeof kb->dw[0]);
        memset(kb->mw[nr], 0, (size_t)(16 - nr) * sizeof kb->mw[0]);
    }
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t n = 0; n < nr; n++) {
            const uint8_t *p = w + (size_t)(r0 + n) * rb + (size_t)b * tb;
            /* the same super-block of the next block's row: the rows go one super-block at a time, so
             * a distance in bytes (rlx_cpu_qmv_prefetch) would reach only part of the next block */
            for (size_t o = 0; o < tb; o += 64) _mm_prefetch((const char *)p + 16 * rb + o, _MM_HINT_T1);
            kbuf_row(kb, (int)n, p, wt);
        }
        for (int cg = 0; cg < ncg; cg++) {
            const int8_t *tq = a->tq + cg * tq_cs;
            __m512 regs[16];
            _Pragma("GCC unroll 16") for (int n = 0; n < 16; n++) regs[n] = _mm512_setzero_ps();
            const float *gsum = a->tg + cg * tg_cs + b * nops * 16;
            AMX_ISSUE(0, 1, 2, 0);
            /* two products in flight: the next one runs while one is scaled */
            _Pragma("GCC unroll 8") for (int o = 0; o < nops; o += 2)
            {
                AMX_ISSUE(3, 4, 5, o + 1);
                _tile_stored(0, kb->sums[0], 64);
                amx_scale(regs, kb, kb->sums[0], gsum + o * 16, o, P, mins);
                if (o + 2 < nops) AMX_ISSUE(0, 1, 2, o + 2);
                _tile_stored(3, kb->sums[1], 64);
                amx_scale(regs, kb, kb->sums[1], gsum + (o + 1) * 16, o + 1, P, mins);
            }
            const __m512 da = _mm512_load_ps(a->td + cg * td_cs + b * 16);
            _Pragma("GCC unroll 16") for (int n = 0; n < 16; n++)
                _mm512_store_ps(kb->accm[cg][n], _mm512_fmadd_ps(regs[n], da, _mm512_load_ps(kb->accm[cg][n])));
        }
    }
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < nr; n++) {
            const float *acc = kb->accm[m / 16][n] + (m % 16) * P;
            float s = acc[0];
            for (int j = 1; j < P; j++) s += acc[j];
            out[m * ldo + r0 + n] = s;
        }
}
#undef AMX_ISSUE

#define AMX_INSTANCE(WT, P)                                                                                            \
    AMX_TARGET static void amx_##WT##_##P(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M,                \
                                          const uint8_t *w, int64_t K, int64_t r0, int64_t r1)                         \
    {                                                                                                                  \
        struct kbuf kb;                                                                                                \
        for (int64_t r = r0; r < r1; r += 16)                                                                          \
            amx_block(out, ldo, a, w, K, r, r1 - r < 16 ? r1 - r : 16, &kb, WT, P, M);                                 \
    }
AMX_INSTANCE(RLX_Q2_K, 1)
AMX_INSTANCE(RLX_Q2_K, 2)
AMX_INSTANCE(RLX_Q3_K, 1)
AMX_INSTANCE(RLX_Q3_K, 2)
AMX_INSTANCE(RLX_Q4_K, 1)
AMX_INSTANCE(RLX_Q4_K, 2)
AMX_INSTANCE(RLX_Q5_K, 1)
AMX_INSTANCE(RLX_Q5_K, 2)
AMX_INSTANCE(RLX_Q6_K, 1)
AMX_INSTANCE(RLX_Q6_K, 2)
#undef AMX_INSTANCE

AMX_TARGET void rlx_cpu_qmv_amx(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt,
                                int64_t K, int64_t r0, int64_t r1)
{
    const int G = rlx_cpu_quant_group(wt), P = rlx_cpu_qmv_amx_groups(M);
    /* two sets (0-2, 3-5) of: sums, 16 weight rows x 16 int32; weights, 16 rows x P G bytes;
     * activations, P G / 4 steps x 16 columns x 4 bytes */
    struct rlx_cpu_tilecfg cfg = {.palette = 1};
    for (int t = 0; t < 6; t += 3) {
        cfg.rows[t] = 16, cfg.colsb[t] = 64;
        cfg.rows[t + 1] = 16, cfg.colsb[t + 1] = (uint16_t)(P * G);
        cfg.rows[t + 2] = (uint8_t)(P * G / 4), cfg.colsb[t + 2] = 64;
    }
    _tile_loadconfig(&cfg);
    switch (wt) {
    case RLX_Q2_K: (P == 1 ? amx_RLX_Q2_K_1 : amx_RLX_Q2_K_2)(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q3_K: (P == 1 ? amx_RLX_Q3_K_1 : amx_RLX_Q3_K_2)(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q4_K: (P == 1 ? amx_RLX_Q4_K_1 : amx_RLX_Q4_K_2)(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q5_K: (P == 1 ? amx_RLX_Q5_K_1 : amx_RLX_Q5_K_2)(out, ldo, a, M, w, K, r0, r1); break;
    default: (P == 1 ? amx_RLX_Q6_K_1 : amx_RLX_Q6_K_2)(out, ldo, a, M, w, K, r0, r1); break;
    }
    _tile_release();
}

/* The activations' copies for the AMX kernel: per 4 values of k a row of 16 columns x 4 bytes
 * (column m P + j: row m's 4 values where they fall in group j of their product, else 0), and per
 * product and per super-block the columns' group sums and scales */
VNNI_TARGET void rlx_cpu_qact_tiles(const struct rlx_cpu_qact *a, int wt, int M)
{
    const int64_t K = a->K, nb = K / 256;
    const int G = rlx_cpu_quant_group(wt), P = rlx_cpu_qmv_amx_groups(M), nops = 256 / (P * G);
    for (int m0 = 0; m0 < M; m0 += 16) { /* a copy per 16 rows */
        const int mr = M - m0 < 16 ? M - m0 : 16, cg = m0 / 16;
        int8_t *tq = (int8_t *)a->tq + cg * K * 16;
        float *td = (float *)a->td + cg * nb * 16, *tg = (float *)a->tg + cg * nb * nops * 16;
        const int8_t *q = a->q + m0 * a->ldq;
        __m512i idx[2];
        __mmask16 live[2];
        for (int j = 0; j < P; j++) {
            int32_t ix[16];
            unsigned mk = 0;
            for (int l = 0; l < 16; l++) {
                const int m = l / P, on = l % P == j && m < mr;
                ix[l] = on ? (int32_t)(m * a->ldq) : 0;
                mk |= (unsigned)on << l;
            }
            idx[j] = _mm512_loadu_si512(ix), live[j] = (__mmask16)mk;
        }
        for (int64_t t = 0; t < K / 4; t++) {
            const int j = (int)(t % (P * G / 4)) / (G / 4);
            _mm512_store_si512(tq + 64 * t,
                               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live[j], idx[j], q + 4 * t, 1));
        }
        for (int64_t b = 0; b < nb; b++)
            for (int l = 0; l < 16; l++) {
                const int m = l / P, j = l % P;
                td[b * 16 + l] = m < mr ? a->d[(m0 + m) * nb + b] : 0.0f;
                for (int o = 0; o < nops; o++) {
                    const int g = kgroup(o * P + j, wt);
                    const int16_t *s = a->bsums + (m0 + m) * (K / 16) + 16 * b;
                    tg[(b * nops + o) * 16 + l] = m >= mr ? 0.0f : (float)(G == 16 ? s[g] : s[2 * g] + s[2 * g + 1]);
                }
            }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Dispatch: one instance per (dtype, M)
 * ------------------------------------------------------------------------------------------- */

/* One function per (dtype, M), each compiled on its own: a one-row decode loop gets its registers
 * without the 16-row loops of one big function around it. clang-format is off for these macros
 * (it lays them out differently on every run). */
/* clang-format off */
#define INSTANCE(WT, MM, KERNEL)                                                                                       \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), noinline)) static void               \
    KERNEL##_##WT##_##MM(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K,          \
                         int64_t r0, int64_t r1)                                                                       \
    {                                                                                                                  \
        struct idx32 ix;                                                                                               \
        if (WT == RLX_Q4_0 || WT == RLX_Q4_1 || WT == RLX_Q5_0 || WT == RLX_Q5_1) idx32_init(&ix, WT);                 \
        __m512 acc[MM == 1 ? 4 : MM]; /* the rows' sums, four rows at a time at MM = 1 */                                \
        int64_t r = r0;                                                                                                \
        for (; MM == 1 && r + 4 <= r1; r += 4) {                                                                       \
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) KERNEL(acc + i, a, w, K, r + i, &ix, WT, 1);            \
            _mm_storeu_ps(out + r, hsum4(acc[0], acc[1], acc[2], acc[3]));                                             \
        }                                                                                                              \
        for (; r < r1; r++) {                                                                                          \
            KERNEL(acc, a, w, K, r, &ix, WT, MM);                                                                      \
            store_sums(out + r, ldo, acc, MM);                                                                         \
        }                                                                                                              \
    }
#define INSTANCES(WT, KERNEL)                                                                                          \
    INSTANCE(WT, 1, KERNEL) INSTANCE(WT, 2, KERNEL) INSTANCE(WT, 3, KERNEL) INSTANCE(WT, 4, KERNEL)                    \
    INSTANCE(WT, 5, KERNEL) INSTANCE(WT, 6, KERNEL) INSTANCE(WT, 7, KERNEL) INSTANCE(WT, 8, KERNEL)                    \
    INSTANCE(WT, 16, KERNEL)
INSTANCES(RLX_Q8_0, row8)
INSTANCES(RLX_Q4_0, row4)
INSTANCES(RLX_Q4_1, row4)
INSTANCES(RLX_Q5_0, row4)
INSTANCES(RLX_Q5_1, row4)
INSTANCES(RLX_Q2_K, rowk)
INSTANCES(RLX_Q3_K, rowk)
INSTANCES(RLX_Q4_K, rowk)
INSTANCES(RLX_Q5_K, rowk)
INSTANCES(RLX_Q6_K, rowk)
#undef INSTANCES
#undef INSTANCE

void rlx_cpu_qmv_avx512(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                        int64_t r0, int64_t r1)
{
#define CASE(WT, MM, KERNEL)                                                                                           \
    case (WT)*32 + (MM):                                                                                               \
        KERNEL##_##WT##_##MM(out, ldo, a, w, K, r0, r1);                                                               \
        break;
#define CASES(WT, KERNEL)                                                                                              \
    CASE(WT, 1, KERNEL) CASE(WT, 2, KERNEL) CASE(WT, 3, KERNEL) CASE(WT, 4, KERNEL) CASE(WT, 5, KERNEL)                \
    CASE(WT, 6, KERNEL) CASE(WT, 7, KERNEL) CASE(WT, 8, KERNEL) CASE(WT, 16, KERNEL)
    switch (wt * 32 + M) {
        CASES(RLX_Q8_0, row8)
        CASES(RLX_Q4_0, row4)
        CASES(RLX_Q4_1, row4)
        CASES(RLX_Q5_0, row4)
        CASES(RLX_Q5_1, row4)
        CASES(RLX_Q2_K, rowk)
        CASES(RLX_Q3_K, rowk)
        CASES(RLX_Q4_K, rowk)
        CASES(RLX_Q5_K, rowk)
        CASES(RLX_Q6_K, rowk)
    default: break;
    }
#undef CASES
#undef CASE
}
/* clang-format on */
