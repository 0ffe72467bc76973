/*
 * attention_vec.c - the vector paths of the cpu table's attention (attention.c's header says what
 * they compute, when they are taken and what they measured): the kernels of attention_simd.inc,
 * compiled once for AVX-512 and once for AVX2, their tables, and the tiled flash attention that
 * runs prefill and extension (S >= RLX_ATTN_FLASH_MIN_S) on the pool. The split-key decode driver
 * that calls the decode kernels is attention.c's. Must never allocate.
 */
#include "backends/cpu/attention.h"
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* The vector paths (attention_simd.inc), once per ISA. */
#define ATT_SUF        avx512
#define ATT_TARGET     "avx512f,avx512bw,avx512vl,f16c,fma"
#define ATT_W          16
#define ATT_MR         8
#define att_vf         __m512
#define V_LOAD(p)      _mm512_loadu_ps(p)
#define V_STORE(p, x)  _mm512_storeu_ps((p), (x))
#define V_SET1(x)      _mm512_set1_ps(x)
#define V_ZERO()       _mm512_setzero_ps()
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MUL(a, b)    _mm512_mul_ps((a), (b))
#define V_MAX(a, b)    _mm512_max_ps((a), (b))
#define V_NEGINF_TO_ZERO(x)                                                                                            \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask((x), _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), (x), _mm512_setzero_ps())
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_BF16(p)                                                                                                 \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_HALF(x)                                                                                                      \
    _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))
#include "backends/cpu/attention_simd.inc"

#define ATT_SUF        avx2
#define ATT_TARGET     "avx2,fma,f16c"
#define ATT_W          8
#define ATT_MR         4
#define att_vf         __m256
#define V_LOAD(p)      _mm256_loadu_ps(p)
#define V_STORE(p, x)  _mm256_storeu_ps((p), (x))
#define V_SET1(x)      _mm256_set1_ps(x)
#define V_ZERO()       _mm256_setzero_ps()
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_MUL(a, b)    _mm256_mul_ps((a), (b))
#define V_MAX(a, b)    _mm256_max_ps((a), (b))
#define V_NEGINF_TO_ZERO(x)                                                                                            \
    _mm256_blendv_ps((x), _mm256_setzero_ps(), _mm256_cmp_ps((x), _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_LOAD_BF16(p)                                                                                                 \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_HALF(x) (x)
#include "backends/cpu/attention_simd.inc"

static const struct attn_simd simd_avx512 = {
    .scores = dec_scores_avx512,
    .values = dec_values_avx512,
    .widen_rows = widen_rows_avx512,
    .flash_scores = flash_scores_avx512,
    .flash_softmax = flash_softmax_avx512,
    .flash_rescale = flash_rescale_avx512,
    .flash_values = flash_values_avx512,
    .max_of = max_of_avx512,
    .scale_row = scale_row_avx512,
    .mr = 8,
};
static const struct attn_simd simd_avx2 = {
    .scores = dec_scores_avx2,
    .values = dec_values_avx2,
    .widen_rows = widen_rows_avx2,
    .flash_scores = flash_scores_avx2,
    .flash_softmax = flash_softmax_avx2,
    .flash_rescale = flash_rescale_avx2,
    .flash_values = flash_values_avx2,
    .max_of = max_of_avx2,
    .scale_row = scale_row_avx2,
    .mr = 4,
};

/* The vector kernels this call may use: AVX-512 or AVX2 (rlx_cpu_isa), head size a multiple of
 * 16; NULL means attention.c's portable loops. */
const struct attn_simd *rlx_cpu_attn_simd(const struct rlx_attn_args *a)
{
    if (a->D <= 0 || a->D % 16) return NULL;
    const int isa = rlx_cpu_isa();
    return isa >= RLX_CPU_ISA_AVX512 ? &simd_avx512 : isa == RLX_CPU_ISA_AVX2 ? &simd_avx2 : NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Prefill / extension on the vector paths: tiled flash attention on the pool
 * ------------------------------------------------------------------------------------------- */

/* The query columns one work item aims at (the rows of a block of query positions times the G
 * query heads of one kv head). */
#define RLX_ATTN_FLASH_M 128

/* Query positions per work item: G of them make about RLX_ATTN_FLASH_M columns. */
static int64_t flash_rows(const struct rlx_attn_args *a)
{
    const int64_t G = a->Hq / a->Hkv;
    int64_t br = (RLX_ATTN_FLASH_M + G - 1) / G;
    return br < a->S ? br : a->S;
}

/* Columns of a work item with R query positions: R * G rounded up to a multiple of 32 (the
 * microkernels' tile width on both ISAs). */
static int64_t flash_cols(const struct rlx_attn_args *a, int64_t R) { return (R * (a->Hq / a->Hkv) + 31) / 32 * 32; }

/* Floats of one task's scratch: Qt, Ot (D x M), Kw, Vw (Bc x D), St (Bc x M), m, l, al (M); or the
 * AMX item's (attention_amx.c), whichever is larger (the ISA may be capped between this and the
 * call). */
int64_t rlx_cpu_attn_flash_task_floats(const struct rlx_attn_args *a)
{
    const int64_t M = flash_cols(a, flash_rows(a)), D = a->D, bc = RLX_ATTN_FLASH_BC;
    const int64_t f32 = 2 * D * M + 2 * bc * D + bc * M + 3 * M, amx = rlx_cpu_attn_amx_task_floats(M, D);
    return f32 > amx ? f32 : amx;
}

struct flash_ctx {
    const struct rlx_attn_args *a;
    const struct attn_simd *simd;
    int64_t br, nqb, items; /* rows per item, query blocks, items = Hkv * nqb */
    atomic_llong next;      /* the next item to take */
};

/* The block's scores St (np rows from key k0; n of them real) for the item's columns (query
 * positions i0 .., G heads each, mr of them real): keys a query may not see (causal, window,
 * the u8 mask) and the padding rows become -inf, the f32 mask is added. A value row that none of
 * the item's queries may see is zeroed in Vw (D floats a row): its weights are 0, and 0 times the
 * NaN / inf a u8-masked row may hold would still reach the output through Ot += Vw^T P. */
static void flash_mask(const struct rlx_attn_args *a, float *St, float *Vw, int64_t k0, int64_t n, int64_t np,
                       int64_t i0, int64_t mr, int64_t M)
{
    const int64_t G = a->Hq / a->Hkv, R = mr / G;
    for (int64_t c = 0; c < np; c++) {
        float *row = St + c * M;
        if (c >= n) {
            for (int64_t r = 0; r < M; r++) row[r] = -INFINITY;
            continue;
        }
        const int64_t kpos = k0 + c;
        int seen = 0;
        for (int64_t ii = 0; ii < R; ii++) {
            const int64_t i = i0 + ii, qpos = a->T - a->S + i;
            int ok = (!a->causal || kpos <= qpos) && (a->window <= 0 || kpos > qpos - a->window) &&
                     (!a->mask_u8 || a->mask_u8[i * a->T + kpos]);
            const float add = a->mask_f32 ? a->mask_f32[i * a->T + kpos] : 0.0f;
            seen |= ok;
            for (int64_t hh = 0; hh < G; hh++) row[ii * G + hh] = ok ? row[ii * G + hh] + add : -INFINITY;
        }
        if (!seen) memset(Vw + c * a->D, 0, (size_t)a->D * sizeof(float));
    }
}

/* Work item idx: kv head g and query block qb (the last blocks first: under a causal mask they
 * see the most keys, so the pool's threads finish together). */
static void flash_item(struct flash_ctx *c, int64_t idx, float *w)
{
    const struct rlx_attn_args *a = c->a;
    const struct attn_simd *sd = c->simd;
    const int64_t D = a->D, G = a->Hq / a->Hkv, Hq = a->Hq, bc = RLX_ATTN_FLASH_BC;
    const int64_t qb = c->nqb - 1 - idx / a->Hkv, g = idx % a->Hkv;
    const int64_t i0 = qb * c->br, R = a->S - i0 < c->br ? a->S - i0 : c->br, mr = R * G, M = flash_cols(a, R);
    const int64_t Mmax = flash_cols(a, c->br);
    float *Qt = w, *Ot = Qt + D * Mmax, *Kw = Ot + D * Mmax, *Vw = Kw + bc * D, *St = Vw + bc * D;
    float *m = St + bc * Mmax, *l = m + Mmax, *al = l + Mmax;
    for (int64_t r = 0; r < M; r++) { /* Qt (D, M): column r = (query i0 + r / G, head g G + r % G), scaled */
        const float *qr = r < mr ? a->q + ((i0 + r / G) * Hq + g * G + r % G) * D : NULL;
        for (int64_t e = 0; e < D; e++) Qt[e * M + r] = qr ? a->scale * qr[e] : 0.0f;
        m[r] = -INFINITY, l[r] = 0.0f;
    }
    memset(Ot, 0, (size_t)(D * M) * sizeof(float));
    int64_t lo, hi, lo_last, hi_last;
    attn_visible(a, i0, &lo, &hi);
    attn_visible(a, i0 + R - 1, &lo_last, &hi_last);
    hi = hi_last; /* from the first row's first key to the last row's last */
    const int64_t qfirst = a->T - a->S + i0, qlast = qfirst + R - 1;
    for (int64_t k0 = lo; k0 < hi; k0 += bc) {
        const int64_t n = hi - k0 < bc ? hi - k0 : bc, np = (n + sd->mr - 1) / sd->mr * sd->mr;
        rlx_cpu_attn_prefetch_block(a, k0 + bc, hi - k0 - bc < bc ? hi - k0 - bc : bc, g);
        sd->widen_rows(a, a->k, k0, n, np, g, Kw);
        sd->widen_rows(a, a->v, k0, n, np, g, Vw);
        sd->flash_scores(St, Kw, Qt, np, D, M);
        const int whole = n == np && !a->mask_f32 && !a->mask_u8 && (!a->causal || k0 + n - 1 <= qfirst) &&
                          (a->window <= 0 || k0 > qlast - a->window);
        if (!whole) flash_mask(a, St, Vw, k0, n, np, i0, mr, M);
        sd->flash_softmax(St, np, M, m, l, al);
        sd->flash_rescale(Ot, al, D, M);
        sd->flash_values(Ot, Vw, St, np, D, M);
    }
    for (int64_t r = 0; r < mr; r++) { /* out row (query, head) = Ot column / l; zeros when nothing was visible */
        float *o = a->out + ((i0 + r / G) * Hq + g * G + r % G) * D;
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        for (int64_t e = 0; e < D; e++) o[e] = l[r] == 0.0f ? 0.0f : Ot[e * M + r] * inv;
    }
}

static void flash_tasks(void *p, int64_t begin, int64_t end)
{
    struct flash_ctx *c = p;
    for (int64_t t = begin; t < end; t++) {
        float *w = c->a->scratch + t * rlx_cpu_attn_flash_task_floats(c->a);
        for (int64_t i; (i = atomic_fetch_add(&c->next, 1)) < c->items;) flash_item(c, i, w);
    }
}

/* The flash path: items (kv head, query block) taken by the pool's threads from a shared counter. */
void rlx_cpu_attn_flash(const struct rlx_attn_args *a, const struct attn_simd *sd)
{
    struct flash_ctx c = {.a = a, .simd = sd, .br = flash_rows(a)};
    if (rlx_cpu_attn_amx(a)) {
        rlx_cpu_attn_flash_amx(a, c.br, flash_cols(a, c.br), rlx_cpu_attn_flash_task_floats(a));
        return;
    }
    c.nqb = (a->S + c.br - 1) / c.br;
    c.items = a->Hkv * c.nqb;
    atomic_init(&c.next, 0);
    int64_t ntasks = rlx_pool_threads();
    ntasks = ntasks > c.items ? c.items : ntasks;
    rlx_parallel_for(ntasks, 1, flash_tasks, &c);
}
