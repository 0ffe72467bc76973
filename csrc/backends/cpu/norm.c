/*
 * norm.c - the cpu table's RMS norms: rmsnorm and the fused residual add + rmsnorm. Rows are
 * split over the pool once a chunk holds enough floats; within a row the sum of squares and the
 * scaling are vector loops compiled per ISA. The arithmetic follows Hugging Face's float32
 * order, (x * (1 / sqrt(mean(x^2) + eps))) * w. Kernels here must never allocate; `sum` may be
 * the same buffer as `a` or `b` (an in-place residual).
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <math.h>
#include <string.h>

/* sum of x[i]^2 over x (n) */
RLX_CLONES
static float sumsq(const float *x, int64_t n)
{
    rlx_cpu_v16 acc0 = {0}, acc1 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        rlx_cpu_v16 x0, x1;
        memcpy(&x0, x + i, sizeof x0);
        memcpy(&x1, x + i + 16, sizeof x1);
        acc0 += x0 * x0;
        acc1 += x1 * x1;
    }
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 x0;
        memcpy(&x0, x + i, sizeof x0);
        acc0 += x0 * x0;
    }
    acc0 += acc1;
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += acc0[l];
    for (; i < n; i++) s += x[i] * x[i];
    return s;
}

/* out (n) = (x (n) * s) * w (n) */
RLX_CLONES
static void scale_mul(float *out, const float *x, float s, const float *w, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 xv, wv;
        memcpy(&xv, x + i, sizeof xv);
        memcpy(&wv, w + i, sizeof wv);
        xv = xv * s * wv;
        memcpy(out + i, &xv, sizeof xv);
    }
    for (; i < n; i++) out[i] = x[i] * s * w[i];
}

/* out (n) = a (n) + b (n) */
RLX_CLONES
static void add_row(float *out, const float *a, const float *b, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        rlx_cpu_v16 av, bv;
        memcpy(&av, a + i, sizeof av);
        memcpy(&bv, b + i, sizeof bv);
        av += bv;
        memcpy(out + i, &av, sizeof av);
    }
    for (; i < n; i++) out[i] = a[i] + b[i];
}

static float rms_inv(const float *x, int64_t d, float eps) { return 1.0f / sqrtf(sumsq(x, d) / (float)d + eps); }

struct norm_ctx {
    float *sum, *out;
    const float *a, *b, *w;
    int64_t d;
    float eps;
};

static void rmsnorm_rows(void *p, int64_t begin, int64_t end)
{
    const struct norm_ctx *c = p;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->a + r * c->d;
        scale_mul(c->out + r * c->d, x, rms_inv(x, c->d, c->eps), c->w, c->d);
    }
}

/* out (rows, d) = x (rows, d) / sqrt(mean(x^2) + eps) * w (d) */
void rlx_cpu_rmsnorm_f32(float *out, const float *x, const float *w, int64_t rows, int64_t d, float eps)
{
    struct norm_ctx c = {.out = out, .a = x, .w = w, .d = d, .eps = eps};
    rlx_parallel_for(rows, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP, d), rmsnorm_rows, &c);
}

static void add_rmsnorm_rows(void *p, int64_t begin, int64_t end)
{
    const struct norm_ctx *c = p;
    for (int64_t r = begin; r < end; r++) {
        float *s = c->sum + r * c->d;
        add_row(s, c->a + r * c->d, c->b + r * c->d, c->d);
        scale_mul(c->out + r * c->d, s, rms_inv(s, c->d, c->eps), c->w, c->d);
    }
}

/* sum (rows, d) = a + b; out (rows, d) = sum / sqrt(mean(sum^2) + eps) * w (d) */
void rlx_cpu_add_rmsnorm_f32(float *sum, float *out, const float *a, const float *b, const float *w, int64_t rows,
                             int64_t d, float eps)
{
    struct norm_ctx c = {.sum = sum, .out = out, .a = a, .b = b, .w = w, .d = d, .eps = eps};
    rlx_parallel_for(rows, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP, d), add_rmsnorm_rows, &c);
}
