/*
 * quant_gemm.c - prefill products of block-type weights with AVX-512 VNNI (AMX-INT8 tiles where
 * the machine has them, AVX2 where it has neither; sections below): out (M, N) = the rows of `a`
 * quantised exactly as quant.c states (rlx_cpu_quant_row) . W^T, as integer dot products of the
 * quantised values per group of the weights, scaled in f32: the same function as the decode
 * kernels up to f32 rounding and summation order. Only called where rlx_cpu_isa() >= AVX2.
 *
 * Roles swapped against the decode kernels, so that one VPDPBUSD does 64 multiply-adds for 16
 * rows of `a` at once: the activations are the unsigned operand (q + 128, 16 rows x 4 values of k
 * per 64-byte vector) and the weights the signed one (the int8 of 4 values of k of one weight row,
 * broadcast). sum (q + 128) v = sum q v + 128 sum v, so each weight group's accumulator starts at
 * -128 * (sum of the group's v), computed when the weights are unpacked; the int32 sums are exact.
 *   packed A (per chunk of rows): for each block of 16 rows (rows past M: q = 0, scales 0), for
 *     each 4 values of k, 16 x 4 bytes; with, per group, the 16 rows' d (per block of 32; K types:
 *     per super-block of 256) and their minimum term (32-element types: s = d * sum q; K types:
 *     the group's sum of q).
 *   weight panel (per thread): QG_NR = 8 rows of W as signed int8 (rlx_cpu_qunpack_avx2, natural
 *     order), and per group and row: the scale dw, the minimum mw (f32: the value is dw v + mw)
 *     and the accumulator's start -128 sum v.
 * Microkernel: 16 rows of `a` x 8 weight rows, full K: per group of G = 32 (16 for Q2_K, Q3_K,
 * Q6_K) values of k, G / 4 steps of one A load and 8 VPDPBUSD with the weights' 4 bytes broadcast,
 * then per weight row: 32-element types acc += cvt(sum) * (da * dw) [+ s * mw]; K types fsb +=
 * cvt(sum) * dw [+ bsum * mw] within the super-block and acc += fsb * da at its end.
 * Threads: the rows of `a` are quantised and packed by all threads (blocks of 16 rows), then the
 * pool's threads take blocks of 8 weight rows in turn (an atomic counter), each unpacking its
 * block into its own panel (the weights are read once per chunk of rows) and running the
 * microkernel over every block of rows. Each out element is one fixed sequence of operations:
 * the same bits at any thread count.
 *
 * Measured: see quant.c.
 *
 * Must never allocate, and never read past W, `a` or the scratch rlx_cpu_qgemm_scratch sized
 * (the thread count must not change between the two calls, as for gemm_bf16.c).
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"
#include "core/core.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#define QG_MB      16 /* rows of `a` per microkernel: the lanes of a zmm */
#define QG_NR      8  /* weight rows per panel */
#define QA_NR      16 /* weight rows per panel of the AMX path */
/* bytes of packed A per chunk of rows (at least 16 rows) */
#define QG_A_BYTES ((int64_t)4 << 20)

#define FN     __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"), always_inline)) static inline
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

static int64_t bs_of(int wt)
{
    return wt == RLX_Q8_0 || wt == RLX_Q4_0 || wt == RLX_Q4_1 || wt == RLX_Q5_0 || wt == RLX_Q5_1 ? 32 : 256;
}

static int64_t chunk_rows(int64_t M, int64_t K)
{
    int64_t r = QG_A_BYTES / K / QG_MB * QG_MB;
    r = r < QG_MB ? QG_MB : r;
    return r < M ? r : M;
}

/* byte offsets in scratch of the packing tasks' rows, of one chunk's packed arrays (mc rows,
 * rounded up to 16) and of the per-thread panels */
struct qg_layout {
    size_t qn, dn, sn, ap, as, am, panels, panel, end;
};

static struct qg_layout qg_layout(int64_t mc, int64_t K, int64_t threads)
{
    struct qg_layout l;
    const int64_t m16 = (mc + QG_MB - 1) / QG_MB * QG_MB;
    size_t at = 0;
#define ARR(f, bytes) (l.f = at, at = rlx_align_up(at + (size_t)(bytes)))
    ARR(qn, threads * QG_MB * K); /* qn, dn, sn: one block's rows per packing task */
    ARR(dn, threads * QG_MB * (K / 32) * 4);
    ARR(sn, threads * QG_MB * (K / 16) * 2);
    ARR(ap, m16 * K);
    ARR(as, m16 * (K / 16) * 4);
    ARR(am, m16 * (K / 16) * 4);
#undef ARR
    /* a panel: QA_NR (the most of any path) rows of K int8; per group x row dw, mw, start; per
     * group of one row the unpacked dw, mw, sums */
    l.panel = rlx_align_up((size_t)(QA_NR * K)) + 3 * rlx_align_up((size_t)((K / 16) * QA_NR * 4)) +
              3 * rlx_align_up((size_t)((K / 16) * 4));
    l.panels = at;
    l.end = at + (size_t)threads * l.panel;
    return l;
}

size_t rlx_cpu_qgemm_scratch(int wt, int64_t M, int64_t K, int64_t N)
{
    (void)wt, (void)N;
    return (qg_layout(chunk_rows(M, K), K, rlx_pool_threads()).end + RLX_ALIGN + 3) / 4;
}

struct qg_ctx {
    float *out;
    const float *a;
    const uint8_t *w;
    char *base; /* scratch, 64-aligned */
    struct qg_layout l;
    int wt;
    uint32_t flip;           /* xor'd into 4 packed bytes: 0x80808080 (q + 128, VNNI) or 0 (q, AMX) */
    int64_t M, K, N, m0, mc; /* the chunk: rows m0 .. m0 + mc of a */
    int64_t parts;           /* packing tasks (<= the pool's threads): task t packs the blocks
                                [t * nblk / parts, (t + 1) * nblk / parts) of the chunk's nblk */
    int64_t nblocks;
    atomic_llong next;
};

/* ---------------------------------------------------------------------------------------------
 * Packing the activations: blocks of 16 rows
 * ------------------------------------------------------------------------------------------- */

/* Packing tasks [t0, t1) (one thread's range): their blocks one after another, each quantised
 * through task t0's rows of qn / dn / sn, so the chunk needs no row-major copy of its own. */
TARGET static void qg_pack_a(void *p, int64_t t0, int64_t t1)
{
    const struct qg_ctx *c = p;
    const int64_t K = c->K, bs = bs_of(c->wt), G = rlx_cpu_quant_group(c->wt), nb = K / bs, ng = K / G;
    const int64_t nblk = (c->mc + QG_MB - 1) / QG_MB;
    int8_t *qn = (int8_t *)(c->base + c->l.qn) + t0 * QG_MB * K;          /* (16, K) */
    float *dn = (float *)(c->base + c->l.dn) + t0 * QG_MB * (K / 32);     /* (16, nb) */
    int16_t *sn = (int16_t *)(c->base + c->l.sn) + t0 * QG_MB * (K / 16); /* (16, K / 16) */
    for (int64_t mb = t0 * nblk / c->parts; mb < t1 * nblk / c->parts; mb++) {
        const int64_t r0 = mb * QG_MB, rows = c->mc - r0 < QG_MB ? c->mc - r0 : QG_MB;
        for (int64_t i = 0; i < rows; i++)
            rlx_cpu_quant_row(qn + i * K, dn + i * nb, sn + i * (K / 16), c->a + (c->m0 + r0 + i) * K, K, bs);
        /* q + 128 (VNNI) or q (AMX), 16 rows x 4 bytes per step of k */
        uint8_t *ap = (uint8_t *)(c->base + c->l.ap) + mb * QG_MB * K;
        const __mmask16 valid = (__mmask16)((1u << rows) - 1);
        const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32((int)K));
        const __m512i flip = _mm512_set1_epi32((int)c->flip);
        for (int64_t t = 0; t < K / 4; t++) {
            const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, idx, qn + 4 * t, 1);
            _mm512_store_si512(ap + 64 * t, _mm512_xor_si512(v, flip));
        }
        /* per group: the rows' scales and minimum terms (0 for rows past M) */
        float *as = (float *)(c->base + c->l.as) + mb * QG_MB * (K / 32);
        float *am = (float *)(c->base + c->l.am) + mb * QG_MB * (K / 16);
        for (int64_t i = 0; i < QG_MB; i++) {
            for (int64_t b = 0; b < nb; b++) as[b * QG_MB + i] = i < rows ? dn[i * nb + b] : 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                const int16_t *s = sn + i * (K / 16);
                float v = 0.0f;
                if (i < rows) {
                    if (bs == 32) /* s = d * sum q of the block, as the decode kernels */
                        v = dn[i * nb + g] * (float)(s[2 * g] + s[2 * g + 1]);
                    else
                        v = (float)(G == 16 ? s[g] : s[2 * g] + s[2 * g + 1]);
                }
                am[g * QG_MB + i] = v;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Weight panels and the microkernel
 * ------------------------------------------------------------------------------------------- */

/* rows n0 .. n0 + nr (nr <= P) of W into the panel at pb, laid out for P rows (QG_NR; QA_NR for AMX;
 * rows past nr zero) */
static void qg_pack_b(char *pb, const struct qg_ctx *c, int64_t n0, int64_t nr, const int P)
{
    const int64_t K = c->K, bs = bs_of(c->wt), G = rlx_cpu_quant_group(c->wt), ng = K / G;
    const size_t tb = rlx_dtype_traits((enum rlx_dtype)c->wt)->type_size, rb = (size_t)(K / bs) * tb;
    const size_t gsz = rlx_align_up((size_t)(ng * P * 4)), rsz = rlx_align_up((size_t)(ng * 4));
    int8_t *v = (int8_t *)pb;
    float *dw = (float *)(pb + rlx_align_up((size_t)(P * K))), *mw = (float *)((char *)dw + gsz);
    int32_t *st = (int32_t *)((char *)mw + gsz);
    float *tdw = (float *)((char *)st + gsz), *tmw = (float *)((char *)tdw + rsz);
    int32_t *tws = (int32_t *)((char *)tmw + rsz);
    for (int64_t n = 0; n < P; n++) {
        if (n < nr) {
            rlx_cpu_qunpack_avx2(v + n * K, tdw, tmw, tws, c->w + (size_t)(n0 + n) * rb, c->wt, K / bs);
        } else {
            memset(v + n * K, 0, (size_t)K);
            for (int64_t g = 0; g < ng; g++) tdw[g] = 0.0f, tmw[g] = 0.0f, tws[g] = 0;
        }
        for (int64_t g = 0; g < ng; g++) dw[g * P + n] = tdw[g], mw[g * P + n] = tmw[g], st[g * P + n] = -128 * tws[g];
    }
}

/* out rows m0 .. m0 + mr (<= 16) x weight rows n0 .. n0 + nr (<= 8) */
FN void qg_tile(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *as, const float *am,
                const char *pb, int64_t K, const int G, const int ktype, const int mins)
{
    const int64_t ng = K / G, gpsb = 256 / G;
    const int8_t *v = (const int8_t *)pb;
    const size_t gsz = rlx_align_up((size_t)(ng * QG_NR * 4));
    const float *dw = (const float *)(pb + rlx_align_up((size_t)(QG_NR * K))),
                *mw = (const float *)((const char *)dw + gsz);
    const int32_t *st = (const int32_t *)((const char *)mw + gsz);
    __m512 acc[QG_NR], fsb[QG_NR];
    _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++) acc[n] = _mm512_setzero_ps(), fsb[n] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512i is[QG_NR];
        _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++) is[n] = _mm512_set1_epi32(st[g * QG_NR + n]);
        _Pragma("GCC unroll 8") for (int t = 0; t < G / 4; t++)
        {
            const __m512i A = _mm512_load_si512(ap + (g * (G / 4) + t) * 64);
            _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++)
            {
                int32_t w4;
                memcpy(&w4, v + n * K + g * G + 4 * t, 4);
                is[n] = _mm512_dpbusd_epi32(is[n], A, _mm512_set1_epi32(w4));
            }
        }
        if (ktype) {
            const __m512 bsum = mins ? _mm512_load_ps(am + g * QG_MB) : _mm512_setzero_ps();
            _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++)
            {
                fsb[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[n]), _mm512_set1_ps(dw[g * QG_NR + n]), fsb[n]);
                if (mins) fsb[n] = _mm512_fmadd_ps(bsum, _mm512_set1_ps(mw[g * QG_NR + n]), fsb[n]);
            }
            if (g % gpsb == gpsb - 1) {
                const __m512 da = _mm512_load_ps(as + (g / gpsb) * QG_MB);
                _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++)
                {
                    acc[n] = _mm512_fmadd_ps(fsb[n], da, acc[n]);
                    fsb[n] = _mm512_setzero_ps();
                }
            }
        } else {
            const __m512 da = _mm512_load_ps(as + g * QG_MB);
            const __m512 s = mins ? _mm512_load_ps(am + g * QG_MB) : _mm512_setzero_ps();
            _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++)
            {
                acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[n]),
                                         _mm512_mul_ps(da, _mm512_set1_ps(dw[g * QG_NR + n])), acc[n]);
                if (mins) acc[n] = _mm512_fmadd_ps(s, _mm512_set1_ps(mw[g * QG_NR + n]), acc[n]);
            }
        }
    }
    float tmp[QG_NR][QG_MB];
    _Pragma("GCC unroll 8") for (int n = 0; n < QG_NR; n++) _mm512_storeu_ps(tmp[n], acc[n]);
    for (int64_t m = 0; m < mr; m++)
        for (int64_t n = 0; n < nr; n++) out[m * ldo + n] = tmp[n][m];
}

/* one instance per kind: (G, K type, minimums) */
#define TILE(name, G, KT, MINS)                                                                                        \
    TARGET static void name(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *as,       \
                            const float *am, const char *pb, int64_t K)                                                \
    {                                                                                                                  \
        qg_tile(out, ldo, mr, nr, ap, as, am, pb, K, G, KT, MINS);                                                     \
    }
TILE(tile32, 32, 0, 0)
TILE(tile32m, 32, 0, 1)
TILE(tilek32m, 32, 1, 1)
TILE(tilek16, 16, 1, 0)
TILE(tilek16m, 16, 1, 1)

/* A microkernel over one panel: out rows x weight rows of the chunk (TILE / QA_TILE instances). */
typedef void (*qg_tile_fn)(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *as,
                           const float *am, const char *pb, int64_t K);

/* The instance of a set {32, 32m, k32m, k16, k16m} (G, K type, minimums) for weight type wt. */
static qg_tile_fn tile_for(int wt, const qg_tile_fn set[5])
{
    return wt == RLX_Q4_1 || wt == RLX_Q5_1   ? set[1]
           : wt == RLX_Q4_K || wt == RLX_Q5_K ? set[2]
           : wt == RLX_Q3_K || wt == RLX_Q6_K ? set[3]
           : wt == RLX_Q2_K                   ? set[4]
                                              : set[0];
}

/* One task's loop (VNNI and AMX): blocks of P weight rows taken in turn from the atomic counter,
 * each unpacked into the task's panel pb and run against every block of 16 rows of the chunk. */
static void qg_blocks(struct qg_ctx *c, char *pb, const int P, qg_tile_fn tile)
{
    const int64_t K = c->K, mblocks = (c->mc + QG_MB - 1) / QG_MB;
    for (;;) {
        const int64_t nb = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (nb >= c->nblocks) return;
        const int64_t n0 = nb * P, nr = c->N - n0 < P ? c->N - n0 : P;
        qg_pack_b(pb, c, n0, nr, P);
        for (int64_t mb = 0; mb < mblocks; mb++) {
            const int64_t r0 = mb * QG_MB, mr = c->mc - r0 < QG_MB ? c->mc - r0 : QG_MB;
            tile(c->out + (c->m0 + r0) * c->N + n0, c->N, mr, nr, (const uint8_t *)(c->base + c->l.ap) + r0 * K,
                 (const float *)(c->base + c->l.as) + r0 * (K / 32), (const float *)(c->base + c->l.am) + r0 * (K / 16),
                 pb, K);
        }
    }
}

static void qg_task(void *p, int64_t begin, int64_t end)
{
    struct qg_ctx *c = p;
    (void)end;
    static const qg_tile_fn set[5] = {tile32, tile32m, tilek32m, tilek16, tilek16m};
    qg_blocks(c, c->base + c->l.panels + (size_t)begin * c->l.panel, QG_NR, tile_for(c->wt, set));
}

/* ---------------------------------------------------------------------------------------------
 * The AVX2 variant (no VNNI): 8 rows of `a` per ymm; VPMADDUBSW (u8 x s8, pairs in int16) then
 * VPMADDWD by ones in place of VPDPBUSD. A pair is at most 2 * 255 * 64 < 2^15 for weights of
 * magnitude <= 64, so every type but Q8_0 fits without saturation; Q8_0 keeps the activations
 * signed (no + 128, no correction) and multiplies |w| by them negated where w < 0 (VPSIGNB),
 * pairs <= 2 * 128 * 127. The same panels; per group the activations' scale da and minimum term
 * da * sum q (K types too: their super-block's d), so every type takes
 * acc += cvt(sum) * (da * dw) [+ am * mw].
 * ------------------------------------------------------------------------------------------- */

#define QG_MB8      8
#define AVX2_FN     __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

/* as qg_pack_a, blocks of 8 rows */
AVX2_TARGET static void qg_pack_a8(void *p, int64_t t0, int64_t t1)
{
    const struct qg_ctx *c = p;
    const int64_t K = c->K, bs = bs_of(c->wt), G = rlx_cpu_quant_group(c->wt), nb = K / bs, ng = K / G;
    const int64_t nblk = (c->mc + QG_MB8 - 1) / QG_MB8;
    int8_t *qn = (int8_t *)(c->base + c->l.qn) + t0 * QG_MB * K;
    float *dn = (float *)(c->base + c->l.dn) + t0 * QG_MB * (K / 32);
    int16_t *sn = (int16_t *)(c->base + c->l.sn) + t0 * QG_MB * (K / 16);
    for (int64_t mb = t0 * nblk / c->parts; mb < t1 * nblk / c->parts; mb++) {
        const int64_t r0 = mb * QG_MB8, rows = c->mc - r0 < QG_MB8 ? c->mc - r0 : QG_MB8;
        for (int64_t i = 0; i < rows; i++)
            rlx_cpu_quant_row(qn + i * K, dn + i * nb, sn + i * (K / 16), c->a + (c->m0 + r0 + i) * K, K, bs);
        uint8_t *ap = (uint8_t *)(c->base + c->l.ap) + mb * QG_MB8 * K;
        for (int64_t i = 0; i < QG_MB8; i++) {
            const int8_t *q = qn + i * K;
            for (int64_t t = 0; t < K / 4; t++)
                for (int j = 0; j < 4; j++)
                    ap[(t * QG_MB8 + i) * 4 + j] =
                        (uint8_t)(c->wt == RLX_Q8_0 ? (i < rows ? q[4 * t + j] : 0)
                                                    : (i < rows ? q[4 * t + j] ^ 0x80 : 0x80));
        }
        float *ga = (float *)(c->base + c->l.as) + mb * QG_MB8 * (K / 16);
        float *gm = (float *)(c->base + c->l.am) + mb * QG_MB8 * (K / 16);
        for (int64_t i = 0; i < QG_MB8; i++) {
            for (int64_t g = 0; g < ng; g++) {
                float da = 0.0f, sum = 0.0f;
                if (i < rows) {
                    const int16_t *s = sn + i * (K / 16);
                    da = dn[i * nb + g * G / bs];
                    sum = (float)(G == 16 ? s[g] : s[2 * g] + s[2 * g + 1]);
                }
                ga[g * QG_MB8 + i] = da;
                gm[g * QG_MB8 + i] = da * sum; /* 32-element types: s, as the decode kernels */
            }
        }
    }
}

/* out rows (<= 8) x weight rows nsub .. nsub + nr (nr <= 4) of the panel */
AVX2_FN void qg_tile8(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *ga,
                      const float *gm, const char *pb, int nsub, int64_t K, const int G, const int mins, const int q8)
{
    const int64_t ng = K / G;
    const int8_t *v = (const int8_t *)pb + nsub * K;
    const size_t gsz = rlx_align_up((size_t)(ng * QG_NR * 4));
    const float *dw = (const float *)(pb + rlx_align_up((size_t)(QG_NR * K)));
    const float *mw = (const float *)((const char *)dw + gsz);
    const int32_t *st = (const int32_t *)((const char *)mw + gsz);
    dw += nsub, mw += nsub, st += nsub;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++) acc[n] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256i is[4];
        _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++) is[n] =
            q8 ? _mm256_setzero_si256() : _mm256_set1_epi32(st[g * QG_NR + n]);
        if (q8) { /* a loop, not unrolled: VPSIGNB unrolled 32 times overflows valgrind's translation */
            for (int t = 0; t < G / 4; t++) {
                const __m256i A = _mm256_load_si256((const __m256i *)(ap + (g * (G / 4) + t) * 32));
                _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++)
                {
                    int32_t w4;
                    memcpy(&w4, v + n * K + g * G + 4 * t, 4);
                    const __m256i wb = _mm256_set1_epi32(w4);
                    /* |w| against the signed activations negated where w < 0 (pairs <= 2 * 128 * 127) */
                    is[n] = _mm256_add_epi32(
                        is[n],
                        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wb), _mm256_sign_epi8(A, wb)), ones));
                }
            }
        } else {
            _Pragma("GCC unroll 8") for (int t = 0; t < G / 4; t++)
            {
                const __m256i A = _mm256_load_si256((const __m256i *)(ap + (g * (G / 4) + t) * 32));
                _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++)
                {
                    int32_t w4;
                    memcpy(&w4, v + n * K + g * G + 4 * t, 4);
                    is[n] = _mm256_add_epi32(is[n],
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(A, _mm256_set1_epi32(w4)), ones));
                }
            }
        }
        const __m256 da = _mm256_load_ps(ga + g * QG_MB8);
        const __m256 am = mins ? _mm256_load_ps(gm + g * QG_MB8) : _mm256_setzero_ps();
        _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++)
        {
            acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[n]), _mm256_mul_ps(da, _mm256_set1_ps(dw[g * QG_NR + n])),
                                     acc[n]);
            if (mins) acc[n] = _mm256_fmadd_ps(am, _mm256_set1_ps(mw[g * QG_NR + n]), acc[n]);
        }
    }
    float tmp[4][QG_MB8];
    _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++) _mm256_storeu_ps(tmp[n], acc[n]);
    for (int64_t m = 0; m < mr; m++)
        for (int64_t n = 0; n < nr; n++) out[m * ldo + n] = tmp[n][m];
}

#define TILE8(name, G, MINS, Q8)                                                                                       \
    AVX2_TARGET static void name(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *ga,  \
                                 const float *gm, const char *pb, int nsub, int64_t K)                                 \
    {                                                                                                                  \
        qg_tile8(out, ldo, mr, nr, ap, ga, gm, pb, nsub, K, G, MINS, Q8);                                              \
    }
TILE8(tile8_32, 32, 0, 0)
TILE8(tile8_32m, 32, 1, 0)
TILE8(tile8_16, 16, 0, 0)
TILE8(tile8_16m, 16, 1, 0)
TILE8(tile8_q8, 32, 0, 1)

static void qg_task8(void *p, int64_t begin, int64_t end)
{
    struct qg_ctx *c = p;
    (void)end;
    char *pb = c->base + c->l.panels + (size_t)begin * c->l.panel;
    const int wt = c->wt, G = rlx_cpu_quant_group(wt);
    const int mins = wt == RLX_Q4_1 || wt == RLX_Q5_1 || wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K;
    void (*tile)(float *, int64_t, int64_t, int64_t, const uint8_t *, const float *, const float *, const char *, int,
                 int64_t) = wt == RLX_Q8_0 ? tile8_q8
                            : G == 16      ? (mins ? tile8_16m : tile8_16)
                                           : (mins ? tile8_32m : tile8_32);
    const int64_t K = c->K, mblocks = (c->mc + QG_MB8 - 1) / QG_MB8;
    for (;;) {
        const int64_t nb = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (nb >= c->nblocks) return;
        const int64_t n0 = nb * QG_NR, nr = c->N - n0 < QG_NR ? c->N - n0 : QG_NR;
        qg_pack_b(pb, c, n0, nr, QG_NR);
        for (int64_t mb = 0; mb < mblocks; mb++) {
            const int64_t r0 = mb * QG_MB8, mr = c->mc - r0 < QG_MB8 ? c->mc - r0 : QG_MB8;
            const uint8_t *ap = (const uint8_t *)(c->base + c->l.ap) + r0 * K;
            const float *ga = (const float *)(c->base + c->l.as) + r0 * (K / 16);
            const float *gm = (const float *)(c->base + c->l.am) + r0 * (K / 16);
            float *o = c->out + (c->m0 + r0) * c->N + n0;
            tile(o, c->N, mr, nr < 4 ? nr : 4, ap, ga, gm, pb, 0, K);
            if (nr > 4) tile(o + 4, c->N, mr, nr - 4, ap, ga, gm, pb, 4, K);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * The AMX variant (AMX-INT8: TDPBSSD, signed x signed bytes into int32). Roles as in the bf16 AMX
 * GEMM (gemm_bf16.c): the unpacked weights are the first operand (16 weight rows x G bytes of one
 * group, the rows K bytes apart in a panel of QA_NR rows), the activations the second (G / 4 steps
 * x 16 rows of a x 4 bytes: the VNNI packing without the + 128, so no correction term), and a tile
 * of sums, one group's integer dot products, is out^T (16 weight rows x 16 rows of a). Each group's
 * sums leave the tile (one store) and are scaled in f32 with AVX-512, one zmm per weight row over the 16
 * rows of a (qa_scale: the VNNI kernel's f32 steps on the VNNI kernel's integers, so the same bits
 * as the VNNI GEMM, tested; only the tile holds one group of 16 rows of a x 16 weight rows where
 * the VPDPBUSD accumulators held 16 x 8).
 * Measured on the Intel Xeon, Qwen3-0.6B Q4_K_M, 2 threads, whole prefills, best of 5: pp128
 * 400 -> 575-583 tok/s (the products 257 -> 159-162 ms), pp512 400 -> 637-662 tok/s (966 -> 488-501
 * ms). Where the time went in the first version (pp512, the products' 625 ms; parts switched off
 * one at a time): unpacking and packing 83 ms, the tiles alone 310, the scaling alone 250 (they did
 * not overlap); two groups in flight (the next group's product issued before this group's sums
 * are scaled) took 4 % off, the K types' scaling by super-block (two vector instructions a row and
 * group, not three) 20 %.
 * ------------------------------------------------------------------------------------------- */

#define QA_FN                                                                                                          \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"),                     \
                   always_inline)) static inline
#define QA_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* The products of group g into tile set 0 (sums 0, weights 1, activations 2) or 1 (3, 4, 5): the
 * tile numbers are instruction immediates, hence two. */
#define QA_ISSUE(C, W, A, g)                                                                                           \
    do {                                                                                                               \
        _tile_loadd(W, v + (g)*G, K);                                                                                  \
        _tile_loadd(A, ap + (g) * (G / 4) * 64, 64);                                                                   \
        _tile_zero(C);                                                                                                 \
        _tile_dpbssd(C, W, A);                                                                                         \
    } while (0)

/* Group g's sums into the accumulators, one zmm per weight row n over the 16 rows of a (regs).
 * 32-element types: regs[n] += cvt(sum[n]) * (da * dw[n]) [+ s * mw[n]], da the rows' scale of the
 * group's block. K types, as the VNNI kernel: regs[n] += cvt(sum[n]) * dw[n] [+ bsum * mw[n]] over
 * the super-block's groups, then accm[n] += regs[n] * da at its end; those sums live in memory
 * (both sets would take all 32 registers), touched once a super-block. */
QA_FN void qa_scale(__m512 regs[QA_NR], float accm[QA_NR][QG_MB], const int32_t sums[QA_NR][QG_MB], const float *as,
                    const float *am, const float *dw, const float *mw, int64_t g, const int64_t gpsb, const int ktype,
                    const int mins)
{
    if (ktype) {
        const __m512 bsum = mins ? _mm512_load_ps(am + g * QG_MB) : _mm512_setzero_ps();
        _Pragma("GCC unroll 16") for (int n = 0; n < QA_NR; n++)
        {
            regs[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[n])), _mm512_set1_ps(dw[g * QA_NR + n]),
                                      regs[n]);
            if (mins) regs[n] = _mm512_fmadd_ps(bsum, _mm512_set1_ps(mw[g * QA_NR + n]), regs[n]);
        }
        if (g % gpsb == gpsb - 1) {
            const __m512 da = _mm512_load_ps(as + (g / gpsb) * QG_MB);
            _Pragma("GCC unroll 16") for (int n = 0; n < QA_NR; n++)
            {
                _mm512_store_ps(accm[n], _mm512_fmadd_ps(regs[n], da, _mm512_load_ps(accm[n])));
                regs[n] = _mm512_setzero_ps();
            }
        }
        return;
    }
    const __m512 da = _mm512_load_ps(as + g * QG_MB), s = mins ? _mm512_load_ps(am + g * QG_MB) : _mm512_setzero_ps();
    _Pragma("GCC unroll 16") for (int n = 0; n < QA_NR; n++)
    {
        regs[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[n])),
                                  _mm512_mul_ps(da, _mm512_set1_ps(dw[g * QA_NR + n])), regs[n]);
        if (mins) regs[n] = _mm512_fmadd_ps(s, _mm512_set1_ps(mw[g * QA_NR + n]), regs[n]);
    }
}

/* out rows m0 .. m0 + mr (<= 16) x weight rows n0 .. n0 + nr (<= 16): the panel at pb against one
 * block of 16 packed rows of a (ap, as, am as qg_tile reads them). Two groups in flight: the next
 * group's tile product runs while this group's sums are scaled. */
QA_FN void qa_tile(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *as, const float *am,
                   const char *pb, int64_t K, const int G, const int ktype, const int mins)
{
    const int64_t ng = K / G, gpsb = 256 / G;
    const int8_t *v = (const int8_t *)pb;
    const size_t gsz = rlx_align_up((size_t)(ng * QA_NR * 4));
    const float *dw = (const float *)(pb + rlx_align_up((size_t)(QA_NR * K))),
                *mw = (const float *)((const char *)dw + gsz);
    _Alignas(64) int32_t sums[QA_NR][QG_MB];
    _Alignas(64) float accm[QA_NR][QG_MB]; /* K types: the sums over super-blocks */
    __m512 acc[QA_NR];                     /* 32-element types: the sums; K types: a super-block's */
    _Pragma("GCC unroll 16") for (int n = 0; n < QA_NR; n++) acc[n] = _mm512_setzero_ps();
    if (ktype) memset(accm, 0, sizeof accm);
    QA_ISSUE(0, 1, 2, 0);
    for (int64_t g = 0; g < ng; g += 2) {
        if (g + 1 < ng) QA_ISSUE(3, 4, 5, g + 1);
        _tile_stored(0, sums, 64);
        qa_scale(acc, accm, sums, as, am, dw, mw, g, gpsb, ktype, mins);
        if (g + 1 < ng) {
            if (g + 2 < ng) QA_ISSUE(0, 1, 2, g + 2);
            _tile_stored(3, sums, 64);
            qa_scale(acc, accm, sums, as, am, dw, mw, g + 1, gpsb, ktype, mins);
        }
    }
    float tmp[QA_NR][QG_MB];
    _Pragma("GCC unroll 16") for (int n = 0; n < QA_NR; n++)
        _mm512_storeu_ps(tmp[n], ktype ? _mm512_load_ps(accm[n]) : acc[n]);
    for (int64_t m = 0; m < mr; m++)
        for (int64_t n = 0; n < nr; n++) out[m * ldo + n] = tmp[n][m];
}

/* one instance per kind: (G, K type, minimums) */
#define QA_TILE(name, G, KT, MINS)                                                                                     \
    QA_TARGET static void name(float *out, int64_t ldo, int64_t mr, int64_t nr, const uint8_t *ap, const float *as,    \
                               const float *am, const char *pb, int64_t K)                                             \
    {                                                                                                                  \
        qa_tile(out, ldo, mr, nr, ap, as, am, pb, K, G, KT, MINS);                                                     \
    }
QA_TILE(qa32, 32, 0, 0)
QA_TILE(qa32m, 32, 0, 1)
QA_TILE(qak32m, 32, 1, 1)
QA_TILE(qak16, 16, 1, 0)
QA_TILE(qak16m, 16, 1, 1)

/* One task: loads the tile configuration for the type's group size, takes blocks of QA_NR weight
 * rows in turn (unpacked into its own panel) and runs every block of rows of a over each; the
 * tiles released at the end. */
QA_TARGET static void qa_task(void *p, int64_t begin, int64_t end)
{
    struct qg_ctx *c = p;
    (void)end;
    static const qg_tile_fn set[5] = {qa32, qa32m, qak32m, qak16, qak16m};
    const int G = rlx_cpu_quant_group(c->wt);
    /* two sets (0-2, 3-5) of: sums, 16 weight rows x 16 int32; weights, 16 rows x G bytes;
     * activations, G / 4 steps x 16 rows x 4 bytes */
    struct rlx_cpu_tilecfg cfg = {.palette = 1};
    for (int t = 0; t < 6; t += 3) {
        cfg.rows[t] = QA_NR, cfg.colsb[t] = QG_MB * 4;
        cfg.rows[t + 1] = QA_NR, cfg.colsb[t + 1] = (uint16_t)G;
        cfg.rows[t + 2] = (uint8_t)(G / 4), cfg.colsb[t + 2] = QG_MB * 4;
    }
    _tile_loadconfig(&cfg);
    qg_blocks(c, c->base + c->l.panels + (size_t)begin * c->l.panel, QA_NR, tile_for(c->wt, set));
    _tile_release();
}

void rlx_cpu_qgemm(float *out, const float *a, const void *w, int wt, int64_t M, int64_t K, int64_t N, float *scratch)
{
    const int amx = rlx_cpu_amx_int8(), vnni = amx || rlx_cpu_avx512_vnni(), mb = vnni ? QG_MB : QG_MB8;
    const int64_t nr = amx ? QA_NR : QG_NR;
    const int64_t threads = rlx_pool_threads(), mc = chunk_rows(M, K), nblocks = (N + nr - 1) / nr;
    char *base = (char *)(((uintptr_t)scratch + RLX_ALIGN - 1) & ~(uintptr_t)(RLX_ALIGN - 1));
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        struct qg_ctx c = {.out = out,
                           .a = a,
                           .w = w,
                           .base = base,
                           .l = qg_layout(mc, K, threads),
                           .wt = wt,
                           .flip = amx ? 0u : 0x80808080u,
                           .M = M,
                           .K = K,
                           .N = N,
                           .m0 = m0,
                           .mc = M - m0 < mc ? M - m0 : mc,
                           .nblocks = nblocks};
        atomic_init(&c.next, 0);
        const int64_t nblk = (c.mc + mb - 1) / mb;
        c.parts = nblk < threads ? nblk : threads;
        rlx_parallel_for(c.parts, 1, vnni ? qg_pack_a : qg_pack_a8, &c);
        const int64_t ntasks = nblocks < threads ? nblocks : threads;
        rlx_parallel_for(ntasks, 1, amx ? qa_task : vnni ? qg_task : qg_task8, &c);
    }
}
