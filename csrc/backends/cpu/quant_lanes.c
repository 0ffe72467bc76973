/*
 * quant_lanes.c - the block types' products of 7 .. 128 rows (Q8_0 5 ..) on AVX-512 VNNI without AMX (batched
 * decode steps and short prompts; rlx_cpu_qmv_lanes, rlx_cpu_qact_lanes): the activation rows in the
 * lanes of a vector and the weights broadcast, where the row kernels (quant_avx512.c) keep 64 weights
 * in a vector and pay each group's scaling once per activation row, and where the VNNI GEMM
 * (quant_gemm.c) unpacks its panels at ~100 cycles a super-block. Only called where
 * rlx_cpu_avx512_vnni() and not rlx_cpu_amx_int8() (quant.c). Must never allocate.
 *
 * Blocks of NR = 16 weight rows, 256 values of k at a time (a K type's super-block, or 8 blocks of
 * a 32-element type). The rows' values are unpacked (K types: the row kernels' kunpack,
 * quant_unpack.h, except Q4_K's pairs, lbuf_pair_q4k; 32-element types: ublock below) into an L1
 * buffer as unsigned bytes, in pairs of rows: per 4 values, the two rows' 4 bytes side by side (one
 * dword permute per 64 values; Q4_K's per 128 packed nibbles, before they are split), with per
 * group each row's f32 scale dw and minimum mw (K types: d sc and -(dmin m) per natural group; the
 * 32-element types: the block's d and m). A zmm's 16 lanes are 8 activation rows x the 2 rows of a
 * pair (lane 2 i + h: activation row i, weight row 2 P + h), so one VPDPBUSD takes the pair's 8 bytes
 * broadcast as a qword (the unsigned operand) against 8 rows' 4 values each twice (rlx_cpu_qact_lanes'
 * copy, the signed operand: no + 128, no correction): 4 values x 16 outputs, 8 pairs (8 independent
 * chains: Zen 4 retires one such VPDPBUSD a cycle, where ymm with 8 chains and broadcast loads
 * reached 1.35 a cycle). The offset types (Q6_K 32, Q3_K 4, Q8_0 128 (its values stored as w + 128),
 * Q4_0 8, Q5_0 16) start each group's sum at -off * (the row's sum of q over the group), so the
 * exact int32 sum is that of q (u - off). Then per lane the VNNI GEMM's f32 steps in its order (K
 * types: per natural group fsb += cvt(sum) * dw [then + bsum * mw], per super-block acc += fsb * da;
 * 32-element types: per block acc += cvt(sum) * (da * dw) [then + s * mw]): the GEMM's integers and
 * operations, so the same bits as the GEMM for every row (test_quant_kernels), whatever the other
 * rows, their places, the row range or the thread count. Prompts of up to 128 rows in lane groups
 * of 8 against the same unpacked block; each weight read once per call.
 *
 * Q4_K's pairs unpacked together (lbuf_pair_q4k: the packed bytes interleaved before the nibbles are
 * split, both rows' scales from one k4_scales, 2026-12-07), against each row through kunpack and the
 * pair's values and scales permuted after, C harness (builds alternating, 5 rounds, min; cycles per
 * 256 values and activation row): 8 rows, 1 thread, L2-resident 8.59 -> 8.01, DRAM 8.65 -> 7.96, 2
 * threads DRAM 4.43 -> 4.16; 7 rows 9.68 -> 9.05, 2 threads 5.13 -> 4.70; 16 rows 7.46 -> 7.18, 2
 * threads 3.84 -> 3.68. (At 8 rows, L2-resident, the unpacking was 1.8 of 8.9 cycles and the
 * groups' f32 steps 1.0, skipping either in the harness; the VPDPBUSD chains, restarted each group,
 * run at ~1.5 cycles each, as in a microbenchmark of that loop alone; 1.0 when never restarted.)
 *
 * Measured on the AMD EPYC Zen 4 (2 vCPUs, a host whose speed moved during the runs: figures are
 * minimums of 3 alternating runs), cycles per 256 values and activation row at 3.64 GHz, weights
 * from DRAM (20-30 copies): 1 thread against the row kernels, 3072 x 1024, Q4_K M = 7 10.2 / 11.5, 8
 * 9.3 / 12.0, 12 10.1 / 11.3, 16 7.7 / 10.7; Q6_K 7 10.7 / 13.0, 8 9.3 / 12.8, 12 9.8 / 12.5, 16
 * 7.6 / 10.8; Q8_0 7 10.6 / 16.7, 8 9.3 / 16.4, 16 7.7 / 16.3; Q4_0 7 10.3 / 11.3, 8 9.2 / 11.1, 16
 * 7.6 / 10.4 (K types cache-resident, 1024 x 2048: 9 and 10 rows 12.0 / 10.5 and 10.7 / 10.4, 6
 * rows 10.5 / 10.0: those stay on the row kernels; but Q8_0's row kernel is the slowest, and
 * Q8_0 takes this kernel from 5 rows on, 2026-12-07, 4 rows 17.5 / 18.2 (left to the row kernels),
 * 5 14.1 / 17.3, 6 11.7 / 16.8, 9 13.2 / 17.4, 10 11.8 / 17.4; for the other 32-element types 6
 * and 10 rows are no faster here: Q4_1 15.0 / 11.7 and 13.1 / 12.2, Q5_0 13.0 / 13.7 and 12.4 /
 * 14.0, Q5_1 14.6 / 16.4 and 15.8 / 15.4). Against the VNNI GEMM: 2 threads, Q4_K 17 rows 4.9 / 8.3, 24 3.6 / 6.0, 32
 * 3.5 / 4.5, 64 3.3 / 3.9, 128 3.3 / 3.7; Q6_K 17 4.8 / 9.6, 32 3.4 / 5.5, 64 3.3 / 4.2, 128 3.3 /
 * 3.8; 1 thread, Q8_0 32 6.9 / 9.5, 64 6.5 / 7.5, 128 6.4 / 6.5; Q4_0 32 6.9 / 8.4, 128 6.4 / 6.3;
 * in chunks of 128 rows, Q4_K 256 3.7 / 3.5 and 512 3.7 / 3.3 (each chunk unpacks the weights
 * again, and the activations' copy is one thread's): the GEMM keeps those. Whole decode steps
 * (Qwen3-0.6B / Llama-3.2-1B files, ms a step, this kernel against the row kernels), 2 threads:
 * Qwen3 Q4_K_M 8 sequences 35.7-37.6 / 41.6-48.2, 16 59.7-72.8 / 78.8-95.8; Llama Q4_K_M 8
 * 65.8-67.6 / 69.0-83.7, 16 94.8-97.1 / 140.6-150.4; Qwen3 Q8_0 8 36.4-38.2 / 55.1-55.3, 16
 * 64.6-67.9 / 105.5-114.8; Qwen3 Q4_0 8 41.3-46.6 / 43.5-44.6 (even), 16 69.7-76.2 / 80.9-87.6; 1
 * thread, Llama Q4_K_M 8 95.7-98.4 / 128.3-130.2. Prefill, tok/s against the GEMM (and the row
 * kernels for 16 rows), 2 threads: Qwen3 Q4_K_M pp16 392-407 / 314-315, pp32 455-467 / 341-343,
 * pp128 484-494 / 399-476; Llama Q4_K_M pp16 200-204 / 145, pp32 241-247 / 172-175, pp128 249-255 /
 * 234-252; Qwen3 Q8_0 pp16 304-307 / 173-215, pp32 425-426 / 306-316, pp128 438-470 / 445-463
 * (even); Qwen3 Q4_0 pp16 388-393 / 269-278, pp128 484-486 / 475-482; 1 thread pp128 Qwen3 Q4_K_M
 * 264-272 / 264-268, Llama Q4_K_M 141 / 131-132. The first version (K types only, blocks of 8
 * rows, 8 activation rows x 2 groups in the lanes, its own f32 order) was as fast but, its bits
 * neither the row kernels' nor the GEMM's, it made one more of test_quant_models' 20 models cross a
 * step of its activations' grid between the cached and the naive path (qwen3 q6_k); with the GEMM's
 * bits on both paths that test's rows within 1e-4 went from 77 % to 98 %.
 */
#include "backends/cpu/quant_unpack.h"

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

#define LN   8        /* activation rows per lane group: 16 int32 lanes of a zmm, two per row */
#define NR   16       /* weight rows per block */
#define NP   (NR / 2) /* pairs of weight rows: lane 2 i + h is activation row i x weight row 2 P + h */
#define MAXG (RLX_CPU_QMV_LANES_MAX_M / LN)

/* one block of NR weight rows: a super-block's values and scales, the outputs' sums */
struct lbuf {
    _Alignas(64) uint8_t v[NP][64][8];         /* per pair and 4 values t of kvalues' order: the two
                                                  rows' 4 unsigned bytes */
    _Alignas(64) float dw[NP][16][2];          /* per pair and group (K types: natural group; 32-element
                                                  types: block of the 8): the two rows' scales */
    _Alignas(64) float mw[NP][16][2];          /* their minimums (types with minimums) */
    _Alignas(64) float accm[MAXG][NP][2 * LN]; /* per lane group the sums over super-blocks */
};

/* the natural groups' scales (and minimums) of one super-block: 16 floats each, the order of kunpack's
 * sw / s16 (Q4_K / Q5_K: 8 of each) */
FN void kscales(__m512 *dw, __m512 *mw, const struct kblock *k, const int wt)
{
    *mw = _mm512_setzero_ps();
    if (wt == RLX_Q4_K || wt == RLX_Q5_K) { /* sw: 8 scales, then 8 minimums */
        const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(k->sw)));
        *dw = _mm512_mul_ps(f, _mm512_set1_ps(k->d));
        *mw = _mm512_mul_ps(_mm512_shuffle_f32x4(f, f, 0xee), _mm512_set1_ps(-k->dmin));
    } else {
        *dw = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(k->s16)), _mm512_set1_ps(k->d));
        if (wt == RLX_Q2_K)
            *mw = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(k->mdup)), _mm512_set1_ps(-k->dmin));
    }
}

/* rows 2 P and 2 P + 1's super-blocks at p0 and p1 (NULL: past the matrix, zeros) into pair P */
FN void lbuf_pair(struct lbuf *lb, int P, const uint8_t *p0, const uint8_t *p1, const int wt)
{
    struct kblock k0, k1;
    kunpack(&k0, p0, wt);
    __m512 dw0, mw0, dw1 = _mm512_setzero_ps(), mw1 = _mm512_setzero_ps();
    kscales(&dw0, &mw0, &k0, wt);
    if (p1) {
        kunpack(&k1, p1, wt);
        kscales(&dw1, &mw1, &k1, wt);
    } else {
        for (int v = 0; v < 4; v++) k1.u[v] = _mm512_setzero_si512();
    }
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
    {
        _mm512_store_si512(lb->v[P][16 * v], _mm512_permutex2var_epi32(k0.u[v], lo, k1.u[v]));
        _mm512_store_si512(lb->v[P][16 * v + 8], _mm512_permutex2var_epi32(k0.u[v], hi, k1.u[v]));
    }
    _mm512_store_ps(lb->dw[P][0], _mm512_permutex2var_ps(dw0, lo, dw1));
    _mm512_store_ps(lb->dw[P][8], _mm512_permutex2var_ps(dw0, hi, dw1));
    if (wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K) {
        _mm512_store_ps(lb->mw[P][0], _mm512_permutex2var_ps(mw0, lo, mw1));
        _mm512_store_ps(lb->mw[P][8], _mm512_permutex2var_ps(mw0, hi, mw1));
    }
}

/* Q4_K: rows 2 P and 2 P + 1 (p1 NULL: zeros) into pair P together, the same values as lbuf_pair's:
 * the two rows' packed bytes interleaved per dword before the nibbles are split (nibble masks and
 * shifts act per byte), the scales and minimums of both from one k4_scales, interleaved per group
 * as bytes, converted (exact small integers) and multiplied by (d0, d1) / (-dmin0, -dmin1) */
FN void lbuf_pair_q4k(struct lbuf *lb, int P, const uint8_t *p0, const uint8_t *p1)
{
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8)), m4 = _mm512_set1_epi8(0x0f);
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++)
    { /* kvalues' u[2 j] (low nibbles) and u[2 j + 1] (high) */
        const __m512i x0 = ld64(p0 + 16 + 64 * j), x1 = p1 ? ld64(p1 + 16 + 64 * j) : _mm512_setzero_si512();
        const __m512i a = _mm512_permutex2var_epi32(x0, lo, x1), b = _mm512_permutex2var_epi32(x0, hi, x1);
        _mm512_store_si512(lb->v[P][32 * j], _mm512_and_si512(a, m4));
        _mm512_store_si512(lb->v[P][32 * j + 8], _mm512_and_si512(b, m4));
        _mm512_store_si512(lb->v[P][32 * j + 16], _mm512_and_si512(_mm512_srli_epi16(a, 4), m4));
        _mm512_store_si512(lb->v[P][32 * j + 24], _mm512_and_si512(_mm512_srli_epi16(b, 4), m4));
    }
    const __m256i s = k4_scales(p0 + 4, (p1 ? p1 : p0) + 4); /* row 0's scales, minimums | row 1's */
    const __m128i s0 = _mm256_castsi256_si128(s), s1 = _mm256_extracti128_si256(s, 1);
    uint32_t dd[2] = {0, 0}; /* d, dmin of each row (f16; row 1 absent: zeros) */
    memcpy(&dd[0], p0, 4);
    if (p1) memcpy(&dd[1], p1, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dd)); /* d0 dmin0 d1 dmin1 */
    const __m512 d = _mm512_broadcast_f32x4(_mm_shuffle_ps(dm, dm, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m512 nm =
        _mm512_broadcast_f32x4(_mm_xor_ps(_mm_shuffle_ps(dm, dm, _MM_SHUFFLE(3, 1, 3, 1)), _mm_set1_ps(-0.0f)));
    _mm512_store_ps(lb->dw[P][0],
                    _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s0, s1))), d));
    _mm512_store_ps(lb->mw[P][0],
                    _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(s0, s1))), nm));
}

/* a block's start: the sums of nlg lane groups zeroed, and the pairs past nr rows (past the matrix,
 * never output) zero values and scales */
FN void lbuf_start(struct lbuf *lb, int64_t nr, int nlg)
{
    for (int l = 0; l < nlg; l++)
        for (int P = 0; P < NP; P++) _mm512_store_ps(lb->accm[l][P], _mm512_setzero_ps());
    if (nr < NR) {
        const int live = (int)(nr + 1) / 2;
        memset(lb->v[live], 0, (size_t)(NP - live) * sizeof lb->v[0]);
        memset(lb->dw[live], 0, (size_t)(NP - live) * sizeof lb->dw[0]);
        memset(lb->mw[live], 0, (size_t)(NP - live) * sizeof lb->mw[0]);
    }
}

/* the 8 bytes at p in every qword */
FN __m512i bcast8(const void *p)
{
    int64_t x;
    memcpy(&x, p, 8);
    return _mm512_set1_epi64(x);
}

/* the two floats at p in every pair of lanes */
FN __m512 pair2(const float *p)
{
    double x;
    memcpy(&x, p, 8);
    return _mm512_castpd_ps(_mm512_set1_pd(x));
}

/* out[m * ldo + r0 + n] for m < M, n < nr (<= NR): weight rows r0 .. r0 + nr against a->tq, td, tg.
 * Per lane, the VNNI GEMM's operations (quant_gemm.c, qg_tile): per natural group g, fsb +=
 * cvt(sum) * dw [then + bsum * mw]; per super-block acc += fsb * da. */
FN void lanes_block(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r0,
                    int64_t nr, struct lbuf *lb, const int wt, const int M)
{
    const int G = wt == RLX_Q4_K || wt == RLX_Q5_K ? 32 : 16, ng = 256 / G;
    const int mins = wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K, offs = wt == RLX_Q6_K || wt == RLX_Q3_K;
    const int64_t nb = K / 256;
    const size_t tb = rlx_cpu_qblock_bytes(wt), rb = (size_t)nb * tb;
    const int nlg = (M + LN - 1) / LN;
    lbuf_start(lb, nr, nlg);
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t n = 0; n < nr; n += 2) {
            const uint8_t *p = w + (size_t)(r0 + n) * rb + (size_t)b * tb;
            /* the same super-block of the next block's rows (quant_amx.c says why not a distance) */
            for (size_t o = 0; o < tb; o += 64) {
                _mm_prefetch((const char *)p + NR * rb + o, _MM_HINT_T1);
                _mm_prefetch((const char *)p + (NR + 1) * rb + o, _MM_HINT_T1);
            }
            if (wt == RLX_Q4_K)
                lbuf_pair_q4k(lb, (int)n / 2, p, n + 1 < nr ? p + rb : NULL);
            else
                lbuf_pair(lb, (int)n / 2, p, n + 1 < nr ? p + rb : NULL, wt);
        }
        for (int l = 0; l < nlg; l++) {
            const int8_t *q = a->tq + (l * nb + b) * 256 * 2 * LN; /* (64, 2 LN, 4) */
            const float *gs = a->tg + (l * nb + b) * ng * 2 * LN;  /* (ng, 2 LN) */
            __m512 fsb[NP];
            _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) fsb[P] = _mm512_setzero_ps();
            for (int g = 0; g < ng; g++) {
                const int t0 = rlx_cpu_kgroup(g, wt) * (G / 4); /* the group's place in kvalues' order */
                /* offset types: -offs * the rows' group sums (int32) */
                const __m512i start = offs ? _mm512_load_si512(gs + g * 2 * LN) : _mm512_setzero_si512();
                __m512i is[NP];
                _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) is[P] = start;
                _Pragma("GCC unroll 8") for (int t = 0; t < G / 4; t++)
                {
                    const __m512i A = _mm512_load_si512(q + (t0 + t) * 8 * LN);
                    _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) is[P] =
                        _mm512_dpbusd_epi32(is[P], bcast8(lb->v[P][t0 + t]), A);
                }
                const __m512 bsum = mins ? _mm512_load_ps(gs + g * 2 * LN) : _mm512_setzero_ps();
                _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++)
                {
                    fsb[P] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[P]), pair2(lb->dw[P][g]), fsb[P]);
                    if (mins) fsb[P] = _mm512_fmadd_ps(bsum, pair2(lb->mw[P][g]), fsb[P]);
                }
            }
            const __m512 da = _mm512_load_ps(a->td + (l * nb + b) * 2 * LN);
            _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++)
                _mm512_store_ps(lb->accm[l][P], _mm512_fmadd_ps(fsb[P], da, _mm512_load_ps(lb->accm[l][P])));
        }
    }
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < nr; n++) out[m * ldo + r0 + n] = lb->accm[m / LN][n / 2][2 * (m % LN) + n % 2];
}

/* ---------------------------------------------------------------------------------------------
 * 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): chunks of up to 8 blocks (the buffer's 256
 * values) at a time, each block a group of the GEMM's (tile32 / tile32m: acc += cvt(sum) * (da *
 * dw) [then + s * mw] per block)
 * ------------------------------------------------------------------------------------------- */

/* the 32 values of the block at p as unsigned bytes (natural order): Q8_0 w + 128, Q4_0 / Q4_1 the
 * nibbles, Q5_0 / Q5_1 the nibbles and fifth bits; the offset the kernel takes back (off32) */
FN __m256i ublock(const uint8_t *p, const int wt)
{
    if (wt == RLX_Q8_0) return _mm256_xor_si256(ld32(p + 2), _mm256_set1_epi8((char)0x80));
    const int qs = wt == RLX_Q4_0 ? 2 : wt == RLX_Q4_1 ? 4 : wt == RLX_Q5_0 ? 6 : 8;
    const __m128i x = _mm_loadu_si128((const __m128i *)(p + qs)), m4 = _mm_set1_epi8(0x0f);
    __m256i u = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(x, m4)),
                                        _mm_and_si128(_mm_srli_epi16(x, 4), m4), 1);
    if (wt == RLX_Q5_0 || wt == RLX_Q5_1) {
        uint32_t qh;
        memcpy(&qh, p + qs - 4, 4);
        u = _mm256_mask_add_epi8(u, (__mmask32)qh, u, _mm256_set1_epi8(16));
    }
    return u;
}

FN int off32(const int wt) { return wt == RLX_Q8_0 ? 128 : wt == RLX_Q4_0 ? 8 : wt == RLX_Q5_0 ? 16 : 0; }

/* whether wt is a 32-element type (Q8_0 .. Q5_1), not a K type */
FN int is32(const int wt)
{
    return wt == RLX_Q8_0 || wt == RLX_Q4_0 || wt == RLX_Q4_1 || wt == RLX_Q5_0 || wt == RLX_Q5_1;
}

/* out[m * ldo + r0 + n] for m < M, n < nr (<= NR), 32-element types: a->tq as for the K types, a->td
 * the lanes' d per block, a->tg per block the lanes' -off * sum q (int32) or s = d * sum q (Q4_1,
 * Q5_1) */
FN void lanes_block32(float *out, int64_t ldo, const struct rlx_cpu_qact *a, const uint8_t *w, int64_t K, int64_t r0,
                      int64_t nr, struct lbuf *lb, const int wt, const int M)
{
    const int mins = wt == RLX_Q4_1 || wt == RLX_Q5_1, offs = off32(wt) != 0;
    const int64_t nb = K / 32;
    const size_t tb = rlx_cpu_qblock_bytes(wt), rb = (size_t)nb * tb;
    const int nlg = (M + LN - 1) / LN;
    const __m512i inter = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
    lbuf_start(lb, nr, nlg);
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        const int nblk = nb - b0 < 8 ? (int)(nb - b0) : 8;
        for (int64_t n = 0; n < nr; n += 2) {
            const uint8_t *p = w + (size_t)(r0 + n) * rb + (size_t)b0 * tb;
            const int two = n + 1 < nr;
            for (size_t o = 0; o < (size_t)nblk * tb; o += 64) {
                _mm_prefetch((const char *)p + NR * rb + o, _MM_HINT_T1);
                _mm_prefetch((const char *)p + (NR + 1) * rb + o, _MM_HINT_T1);
            }
            const int P = (int)n / 2;
            for (int g = 0; g < nblk; g++) {
                const uint8_t *p0 = p + (size_t)g * tb, *p1 = p0 + rb;
                const __m256i u0 = ublock(p0, wt), u1 = two ? ublock(p1, wt) : _mm256_setzero_si256();
                _mm512_store_si512(lb->v[P][8 * g], _mm512_permutexvar_epi32(inter, cat(u0, u1)));
                lb->dw[P][g][0] = f16s(p0), lb->dw[P][g][1] = two ? f16s(p1) : 0.0f;
                if (mins) lb->mw[P][g][0] = f16s(p0 + 2), lb->mw[P][g][1] = two ? f16s(p1 + 2) : 0.0f;
            }
        }
        for (int l = 0; l < nlg; l++) {
            const int8_t *q = a->tq + (l * K / 4 + b0 * 8) * 64; /* (K / 4, 2 LN, 4) */
            const float *gs = a->tg + (l * nb + b0) * 2 * LN;    /* (nb, 2 LN) */
            const float *ds = a->td + (l * nb + b0) * 2 * LN;
            __m512 acc[NP];
            _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) acc[P] = _mm512_load_ps(lb->accm[l][P]);
            for (int g = 0; g < nblk; g++) {
                const __m512i start = offs ? _mm512_load_si512(gs + g * 2 * LN) : _mm512_setzero_si512();
                __m512i is[NP];
                _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) is[P] = start;
                _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++)
                {
                    const __m512i A = _mm512_load_si512(q + (8 * g + t) * 8 * LN);
                    _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) is[P] =
                        _mm512_dpbusd_epi32(is[P], bcast8(lb->v[P][8 * g + t]), A);
                }
                const __m512 da = _mm512_load_ps(ds + g * 2 * LN);
                const __m512 sm = mins ? _mm512_load_ps(gs + g * 2 * LN) : _mm512_setzero_ps();
                _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++)
                {
                    acc[P] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[P]), _mm512_mul_ps(da, pair2(lb->dw[P][g])), acc[P]);
                    if (mins) acc[P] = _mm512_fmadd_ps(sm, pair2(lb->mw[P][g]), acc[P]);
                }
            }
            _Pragma("GCC unroll 8") for (int P = 0; P < NP; P++) _mm512_store_ps(lb->accm[l][P], acc[P]);
        }
    }
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < nr; n++) out[m * ldo + r0 + n] = lb->accm[m / LN][n / 2][2 * (m % LN) + n % 2];
}

int rlx_cpu_qmv_lanes_takes(int64_t M, int wt)
{
    if (M > RLX_CPU_QMV_LANES_MAX_M) return 0;
    if (wt == RLX_Q8_0) return M >= 5; /* its row kernel is the slowest from 4 rows on */
    return M >= 7 && M != 9 && M != 10;
}

#define LANES_INSTANCE(WT)                                                                                             \
    VNNI_TARGET static void lanes_##WT(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const uint8_t *w, \
                                       int64_t K, int64_t r0, int64_t r1)                                              \
    {                                                                                                                  \
        struct lbuf lb;                                                                                                \
        for (int64_t r = r0; r < r1; r += NR) {                                                                        \
            const int64_t nr = r1 - r < NR ? r1 - r : NR;                                                              \
            if (is32(WT))                                                                                              \
                lanes_block32(out, ldo, a, w, K, r, nr, &lb, WT, M);                                                   \
            else                                                                                                       \
                lanes_block(out, ldo, a, w, K, r, nr, &lb, WT, M);                                                     \
        }                                                                                                              \
    }
LANES_INSTANCE(RLX_Q8_0)
LANES_INSTANCE(RLX_Q4_0)
LANES_INSTANCE(RLX_Q4_1)
LANES_INSTANCE(RLX_Q5_0)
LANES_INSTANCE(RLX_Q5_1)
LANES_INSTANCE(RLX_Q2_K)
LANES_INSTANCE(RLX_Q3_K)
LANES_INSTANCE(RLX_Q4_K)
LANES_INSTANCE(RLX_Q5_K)
LANES_INSTANCE(RLX_Q6_K)
#undef LANES_INSTANCE

void rlx_cpu_qmv_lanes(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                       int64_t r0, int64_t r1)
{
    switch (wt) {
    case RLX_Q8_0: lanes_RLX_Q8_0(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q4_0: lanes_RLX_Q4_0(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q4_1: lanes_RLX_Q4_1(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q5_0: lanes_RLX_Q5_0(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q5_1: lanes_RLX_Q5_1(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q2_K: lanes_RLX_Q2_K(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q3_K: lanes_RLX_Q3_K(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q4_K: lanes_RLX_Q4_K(out, ldo, a, M, w, K, r0, r1); break;
    case RLX_Q5_K: lanes_RLX_Q5_K(out, ldo, a, M, w, K, r0, r1); break;
    default: lanes_RLX_Q6_K(out, ldo, a, M, w, K, r0, r1); break;
    }
}

/* rows q .. q + mr (<= LN; ldq apart) of K quantised values into tq: per 4 values 16 lanes x 4 bytes,
 * lanes 2 i and 2 i + 1 row i's (rows past mr: zeros). 16 dwords of the 8 rows at a time: a 4 x 4
 * dword transpose inside each 128-bit lane of rows 0-3 and of rows 4-7 (unpacks), then per dword t
 * one two-source permute takes its 4 + 4 rows from their lanes, each twice (a gather per dword
 * before: Zen 4, Qwen3-0.6B Q4_K_M, 8 sequences, 0.8 % of a step's samples, 2026-12-07) */
VNNI_TARGET static void lanes_q(int8_t *tq, const int8_t *q, int64_t ldq, int64_t K, int mr)
{
    /* lanes 2 i, 2 i + 1: dword 0 of lane 0 of the first source's (i < 4) or the second's */
    const __m512i dup = _mm512_set_epi32(19, 19, 18, 18, 17, 17, 16, 16, 3, 3, 2, 2, 1, 1, 0, 0);
    for (int64_t t0 = 0; t0 < K / 4; t0 += 16) {
        const int nt = K / 4 - t0 < 16 ? (int)(K / 4 - t0) : 16; /* K / 4: a multiple of 8 */
        const __mmask16 cols = (__mmask16)((1u << nt) - 1);
        __m512i r[LN], u[LN];
        for (int i = 0; i < LN; i++)
            r[i] = i < mr ? _mm512_maskz_loadu_epi32(cols, q + i * ldq + 4 * t0) : _mm512_setzero_si512();
        for (int g = 0; g < 2; g++) { /* rows 4 g .. 4 g + 3: u[4 g + j] lane l = their dword 4 l + j */
            const __m512i a = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]),
                          b = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
            const __m512i c = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]),
                          d = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
            u[4 * g] = _mm512_unpacklo_epi64(a, c), u[4 * g + 1] = _mm512_unpackhi_epi64(a, c);
            u[4 * g + 2] = _mm512_unpacklo_epi64(b, d), u[4 * g + 3] = _mm512_unpackhi_epi64(b, d);
        }
        for (int l = 0; l < nt / 4; l++) { /* dwords 4 l .. 4 l + 3 */
            const __m512i idx = _mm512_add_epi32(dup, _mm512_set1_epi32(4 * l));
            for (int j = 0; j < 4; j++)
                _mm512_store_si512(tq + 64 * (t0 + 4 * l + j), _mm512_permutex2var_epi32(u[j], idx, u[4 + j]));
        }
    }
}

/* the values as rlx_cpu_qact_lanes copies them, for the 32-element types: per block the lanes' d,
 * and -off * sum q (int32; Q8_0, Q4_0, Q5_0) or s = d * sum q (Q4_1, Q5_1: as quant_gemm.c's) */
VNNI_TARGET static void qact_lanes32(const struct rlx_cpu_qact *a, int wt, int M)
{
    const int64_t K = a->K, nb = K / 32;
    const int off = off32(wt);
    for (int m0 = 0; m0 < M; m0 += LN) {
        const int mr = M - m0 < LN ? M - m0 : LN, l = m0 / LN;
        int8_t *tq = (int8_t *)a->tq + l * K * 2 * LN;
        float *td = (float *)a->td + l * nb * 2 * LN, *tg = (float *)a->tg + l * nb * 2 * LN;
        lanes_q(tq, a->q + m0 * a->ldq, a->ldq, K, mr);
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < 2 * LN; j++) {
                const int i = j / 2;
                const int16_t *s = a->bsums + (m0 + i) * (K / 16) + 2 * b;
                const int sum = i >= mr ? 0 : s[0] + s[1];
                const float d = i < mr ? a->d[(m0 + i) * nb + b] : 0.0f;
                td[b * 2 * LN + j] = d;
                if (off) {
                    const int32_t v = -off * sum;
                    memcpy(tg + b * 2 * LN + j, &v, 4);
                } else {
                    tg[b * 2 * LN + j] = d * (float)sum;
                }
            }
    }
}

/* The activations' copies for the lanes kernel, per group of LN rows (rows past M: zeros), lanes 2 i
 * and 2 i + 1 row i's: per 4 values of q (the order of q) 16 lanes x 4 bytes; per super-block the
 * lanes' d; per super-block and natural group the lanes' group sums (f32; offset types: -offs * the
 * sum, int32) */
VNNI_TARGET void rlx_cpu_qact_lanes(const struct rlx_cpu_qact *a, int wt, int M)
{
    if (is32(wt)) {
        qact_lanes32(a, wt, M);
        return;
    }
    const int64_t K = a->K, nb = K / 256;
    const int G = rlx_cpu_quant_group(wt), ng = 256 / G;
    const int offs = wt == RLX_Q6_K ? 32 : wt == RLX_Q3_K ? 4 : 0;
    for (int m0 = 0; m0 < M; m0 += LN) {
        const int mr = M - m0 < LN ? M - m0 : LN, l = m0 / LN;
        int8_t *tq = (int8_t *)a->tq + l * nb * 256 * 2 * LN;
        float *td = (float *)a->td + l * nb * 2 * LN, *tg = (float *)a->tg + l * nb * ng * 2 * LN;
        lanes_q(tq, a->q + m0 * a->ldq, a->ldq, K, mr);
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < 2 * LN; j++) {
                const int i = j / 2;
                td[b * 2 * LN + j] = i < mr ? a->d[(m0 + i) * nb + b] : 0.0f;
                const int16_t *s = a->bsums + (m0 + i) * (K / 16) + 16 * b;
                for (int g = 0; g < ng; g++) {
                    const int sum = i >= mr ? 0 : G == 16 ? s[g] : s[2 * g] + s[2 * g + 1];
                    float *slot = tg + (b * ng + g) * 2 * LN + j;
                    if (offs) {
                        const int32_t v = -offs * sum;
                        memcpy(slot, &v, 4);
                    } else {
                        *slot = (float)sum;
                    }
                }
            }
    }
}
