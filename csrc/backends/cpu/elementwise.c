/*
 * elementwise.c - the cpu table's pointwise and row-wise ops: silu, silu_mul, broadcast add and
 * mul, row softmax, embedding gather. Flat ops split [0, n) over the pool, row ops split rows,
 * each only past a grain so decode-sized tensors stay on the calling thread. Every loop is a
 * vector loop compiled per ISA; exp is rlx_cpu_exp16 (cpu.h), a polynomial within ~2 ulp. Kernels here must never
 * allocate; out may be the same buffer as an input of the same shape.
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <math.h>
#include <string.h>

struct ew_ctx {
    float *out;
    const float *a, *b;
    int64_t nb; /* add/mul: length of b; softmax/embedding: row length */
    const int32_t *ids;
};

/* ---------------------------------------------------------------------------------------------
 * silu, silu_mul
 * ------------------------------------------------------------------------------------------- */

/* out (n) = a * sigmoid(a), times b (n) when b is not NULL: 16 lanes through rlx_cpu_exp16, the
 * tail through a padded vector, so every element takes the same arithmetic (rlx_cpu_load16_part:
 * the op was ~10x its arithmetic with copies of a variable length). */
RLX_CLONES
static void silu_vec(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const int64_t len = n - i < 16 ? n - i : 16;
        rlx_cpu_v16 x = {0}, y = {0};
        rlx_cpu_load16_part(&x, a + i, len);
        if (b) rlx_cpu_load16_part(&y, b + i, len);
        rlx_cpu_v16 e = -x;
        rlx_cpu_exp16(&e);
        rlx_cpu_v16 s = x / (1.0f + e);
        if (b) s *= y;
        rlx_cpu_store16_part(out + i, &s, len);
    }
}

static void silu_range(void *p, int64_t begin, int64_t end)
{
    const struct ew_ctx *c = p;
    silu_vec(c->out + begin, c->a + begin, NULL, end - begin);
}

/* out (n) = x * sigmoid(x) */
void rlx_cpu_silu_f32(float *out, const float *x, int64_t n)
{
    struct ew_ctx c = {.out = out, .a = x};
    rlx_parallel_for(n, RLX_CPU_GRAIN_TRANSC, silu_range, &c);
}

static void silu_mul_range(void *p, int64_t begin, int64_t end)
{
    const struct ew_ctx *c = p;
    silu_vec(c->out + begin, c->a + begin, c->b + begin, end - begin);
}

/* out (n) = silu(a) * b */
void rlx_cpu_silu_mul_f32(float *out, const float *a, const float *b, int64_t n)
{
    struct ew_ctx c = {.out = out, .a = a, .b = b};
    rlx_parallel_for(n, RLX_CPU_GRAIN_TRANSC, silu_mul_range, &c);
}

/* ---------------------------------------------------------------------------------------------
 * add, mul with b broadcast: out[i] = a[i] op b[i % nb]
 * ------------------------------------------------------------------------------------------- */

/* out (n) = a (n) + b (n) when mul == 0, else a * b */
RLX_CLONES
static void binop(float *out, const float *a, const float *b, int64_t n, int mul)
{
    int64_t i = 0;
    if (mul) {
        for (; i + 16 <= n; i += 16) {
            rlx_cpu_v16 av, bv;
            memcpy(&av, a + i, sizeof av);
            memcpy(&bv, b + i, sizeof bv);
            av *= bv;
            memcpy(out + i, &av, sizeof av);
        }
        for (; i < n; i++) out[i] = a[i] * b[i];
    } else {
        for (; i + 16 <= n; i += 16) {
            rlx_cpu_v16 av, bv;
            memcpy(&av, a + i, sizeof av);
            memcpy(&bv, b + i, sizeof bv);
            av += bv;
            memcpy(out + i, &av, sizeof av);
        }
        for (; i < n; i++) out[i] = a[i] + b[i];
    }
}

/* [begin, end) of the flat index, walked one stretch of b at a time. */
static void broadcast_range(const struct ew_ctx *c, int64_t begin, int64_t end, int mul)
{
    const int64_t nb = c->nb;
    if (nb == 1) {
        const float s = c->b[0];
        for (int64_t i = begin; i < end; i++) c->out[i] = mul ? c->a[i] * s : c->a[i] + s;
        return;
    }
    int64_t i = begin, j = begin % nb;
    while (i < end) {
        const int64_t len = end - i < nb - j ? end - i : nb - j;
        binop(c->out + i, c->a + i, c->b + j, len, mul);
        i += len;
        j = 0;
    }
}

static void add_range(void *p, int64_t begin, int64_t end) { broadcast_range(p, begin, end, 0); }

static void mul_range(void *p, int64_t begin, int64_t end) { broadcast_range(p, begin, end, 1); }

/* out (n) = a (n) + b (nb) broadcast: out[i] = a[i] + b[i % nb]; nb divides n */
void rlx_cpu_add_f32(float *out, const float *a, const float *b, int64_t n, int64_t nb)
{
    struct ew_ctx c = {.out = out, .a = a, .b = b, .nb = nb};
    rlx_parallel_for(n, RLX_CPU_GRAIN_CHEAP, add_range, &c);
}

/* out (n) = a (n) * b (nb) broadcast: out[i] = a[i] * b[i % nb]; nb divides n */
void rlx_cpu_mul_f32(float *out, const float *a, const float *b, int64_t n, int64_t nb)
{
    struct ew_ctx c = {.out = out, .a = a, .b = b, .nb = nb};
    rlx_parallel_for(n, RLX_CPU_GRAIN_CHEAP, mul_range, &c);
}

/* ---------------------------------------------------------------------------------------------
 * softmax
 * ------------------------------------------------------------------------------------------- */

RLX_CLONES
void rlx_cpu_scale_inplace(float *x, float w, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 v;
        memcpy(&v, x + i, sizeof v);
        v *= w;
        memcpy(x + i, &v, sizeof v);
    }
    for (; i < n; i++) x[i] *= w;
}

/* o (n) = softmax of x (n): the max, then exp(x - max) into o with a 16-lane running sum, then
 * o *= 1 / sum. Tails go through padded vectors (pad lanes: x = -inf, so exp gives 0). */
RLX_CLONES
static void softmax_row(float *o, const float *x, int64_t n)
{
    rlx_cpu_v16 mv = {0};
    mv -= INFINITY;
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t len = n - j < 16 ? n - j : 16;
        rlx_cpu_v16 v = mv;
        rlx_cpu_load16_part(&v, x + j, len);
        mv = (rlx_cpu_v16)(((rlx_cpu_v16i)v & (v > mv)) | ((rlx_cpu_v16i)mv & ~(v > mv)));
    }
    float m = mv[0];
    for (int l = 1; l < 16; l++) m = mv[l] > m ? mv[l] : m;
    rlx_cpu_v16 sv = {0};
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t len = n - j < 16 ? n - j : 16;
        rlx_cpu_v16 v = {0};
        v -= INFINITY;
        rlx_cpu_load16_part(&v, x + j, len);
        v -= m;
        rlx_cpu_exp16(&v);
        sv += v;
        rlx_cpu_store16_part(o + j, &v, len);
    }
    float sum = 0.0f;
    for (int l = 0; l < 16; l++) sum += sv[l];
    rlx_cpu_scale_inplace(o, 1.0f / sum, n);
}

static void softmax_rows(void *p, int64_t begin, int64_t end)
{
    const struct ew_ctx *c = p;
    for (int64_t r = begin; r < end; r++) softmax_row(c->out + r * c->nb, c->a + r * c->nb, c->nb);
}

/* out (rows, n) = softmax over each row of x (rows, n), max-subtracted */
void rlx_cpu_softmax_f32(float *out, const float *x, int64_t rows, int64_t n)
{
    struct ew_ctx c = {.out = out, .a = x, .nb = n};
    rlx_parallel_for(rows, rlx_cpu_row_grain(RLX_CPU_GRAIN_TRANSC, n), softmax_rows, &c);
}

/* ---------------------------------------------------------------------------------------------
 * embedding
 * ------------------------------------------------------------------------------------------- */

static void embedding_rows(void *p, int64_t begin, int64_t end)
{
    const struct ew_ctx *c = p;
    const int64_t d = c->nb;
    for (int64_t r = begin; r < end; r++)
        memcpy(c->out + r * d, c->a + (int64_t)c->ids[r] * d, (size_t)d * sizeof(float));
}

/* out (n, d) = table (V, d) rows ids (n) */
void rlx_cpu_embedding_f32(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d)
{
    struct ew_ctx c = {.out = out, .a = table, .ids = ids, .nb = d};
    rlx_parallel_for(n, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP, d), embedding_rows, &c);
}
