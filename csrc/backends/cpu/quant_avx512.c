/*
 * quant_avx512.c - the AVX-512 VNNI row kernels of the block-type weights: out[m * ldo + r] = row r
 * of W . row m of the activations quantised by quant.c, for up to 16 rows m at once (the weights
 * unpacked once for all of them; instances for M = 1 .. 8 and 16, quant.c's group_rows). A batched
 * decode step of 16 sequences then unpacks each weight once, where groups of 4 unpacked it four
 * times: measured on an Intel Xeon (2 threads, Qwen3-0.6B, whole steps, old and new builds run
 * alternately), Q4_K_M 16 sequences 107 -> 131 tok/s, 8 sequences 106 -> 118; Q8_0 91 -> 119 and
 * 77 -> 99; one sequence within the noise. Only called where rlx_cpu_avx512_vnni() (quant.c).
 * quant_amx.c has the K types' kernel for batches on AMX-INT8 tiles (rlx_cpu_qmv_amx), which
 * unpacks the weights as the row kernels do (quant_unpack.h: kvalues, kunpack).
 *
 * 64 weights per vector, unpacked to unsigned bytes in the order the activations are kept in.
 * Zen 4 runs each 512-bit multiply (VPDPBUSD, VPDPWSSD, VPMADDUBSW, FMA, VCVTPH2PS) as two halves
 * on its two multiply pipes, one instruction per cycle, and one 512-bit load per cycle: measured
 * (cache-resident weights) the kernels are bound by those two, so they are written to spend as
 * few of each per weight as the formats allow.
 *   Q4_0 .. Q5_1: groups of 4 blocks (72 .. 96 bytes: two 64-byte loads, the second masked to the
 *     group), nibbles and fifth bits gathered by word permutes (every field of these blocks starts
 *     at an even byte; Q4_0 and Q4_1's scales all lie in the first load, so theirs is a one-source
 *     VPERMW), the activations arranged to match (rlx_cpu_quant_arrange); two VPDPBUSD (u8 x s8,
 *     4 products per int32 lane, exact: the lanes sum q a with q unsigned, so the f32 rounding
 *     is relative to |q| + off, not |q - off|); the 4 block scales converted as one xmm and
 *     multiplied by the activations' 4 d, then spread over the lanes: acc += cvt(lanes) * (dw *
 *     da); and per block, in an xmm, + mw * s (s = da * the sum of its q): Q4_1 / Q5_1 mw the
 *     minimum, Q4_0 / Q5_0 mw = -off * dw (off 8, 16). The offset had been VPDPBUSD's starting
 *     lanes (-off * sum a spread to one lane a block by a VPERMD); in the xmm it is cheaper: Zen
 *     4, 1 thread, 1024 x 2048 cache-resident, one row, TSC ticks per 256 weights, the minimum of
 *     four alternating runs of 2000 calls: Q4_0 16.36 -> 13.87, Q5_0 23.83 -> 21.46, Q4_1 (the
 *     VPERMW) 14.64 -> 14.04.
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
#include "backends/cpu/quant_unpack.h"

/* the largest M of an instance */
#define MAX_M 16

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
    const int tw = (int)rlx_cpu_qblock_bytes(wt) / 2, no = wt == RLX_Q4_0   ? 1
                                                           : wt == RLX_Q4_1 ? 2
                                                           : wt == RLX_Q5_0 ? 3
                                                                            : 4;
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
    const __m128i sm =
        _mm512_castsi512_si128(wt == RLX_Q4_0 || wt == RLX_Q4_1 ? _mm512_permutexvar_epi16(ix->sc, z0)
                                                                : _mm512_permutex2var_epi16(z0, ix->sc, z1));
    const __m128 dw = _mm_cvtph_ps(sm);
    const __m128 mw =
        mins ? _mm_cvtph_ps(_mm_srli_si128(sm, 8)) : _mm_mul_ps(dw, _mm_set1_ps(wt == RLX_Q4_0 ? -8.0f : -16.0f));
    const __m512i expand = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2);
    const __mmask8 live = (__mmask8)((1u << n) - 1);
    const int64_t nb = a->K / 32;
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++)
    {
        const int8_t *q = a->q + m * Q + 128 * g;
        const float *d = a->d + m * nb + 4 * g;
        const __m512i i =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, ld64(q)), hi, ld64(q + 64));
        const __m128 dd = _mm_mul_ps(dw, n == 4 ? _mm_loadu_ps(d) : _mm_maskz_loadu_ps(live, d));
        acc[m] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(dd)), acc[m]);
        const float *sp = a->s + m * nb + 4 * g; /* the minimums' (Q4_1, Q5_1) or offset's (Q4_0, Q5_0) term */
        macc[m] = _mm_fmadd_ps(mw, n == 4 ? _mm_loadu_ps(sp) : _mm_maskz_loadu_ps(live, sp), macc[m]);
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
    const int64_t nb = K / 32, tb = (int64_t)rlx_cpu_qblock_bytes(wt), gb = 4 * tb;
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
    _Pragma("GCC unroll 16") for (int m = 0; m < M; m++) acc[m] =
        _mm512_add_ps(acc[m], _mm512_zextps128_ps512(macc[m]));
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
 * K types: the row kernels (kstep, kpair); the super-blocks unpacked by quant_unpack.h
 * ------------------------------------------------------------------------------------------- */

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
    rlx_cpu_qmv_prefetch(p, rlx_cpu_qblock_bytes(wt));
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
    const size_t tb = rlx_cpu_qblock_bytes(wt);
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
    const size_t tb = rlx_cpu_qblock_bytes(wt);
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
