/*
 * quant_amx.c - the K types' matrix-vector kernel for batches on AMX-INT8 tiles (rlx_cpu_qmv_amx,
 * rlx_cpu_qact_tiles): the weights unpacked as quant_avx512.c's row kernels unpack them
 * (quant_unpack.h), the products on tiles. The section below says how, and what it measured.
 * Only called where rlx_cpu_amx_int8() (quant.c). Must never allocate.
 */
#include "backends/cpu/quant_unpack.h"

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
    const size_t tb = rlx_cpu_qblock_bytes(wt), rb = (size_t)nb * tb;
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
                    const int g = rlx_cpu_kgroup(o * P + j, wt);
                    const int16_t *s = a->bsums + (m0 + m) * (K / 16) + 16 * b;
                    tg[(b * nops + o) * 16 + l] = m >= mr ? 0.0f : (float)(G == 16 ? s[g] : s[2 * g] + s[2 * g + 1]);
                }
            }
    }
}
