/*
 * ref_kernels.c - the "ref" kernel table: the in-C oracle the cpu table (and any other backend)
 * is checked against. Every kernel is the plainest loop that states its math, single threaded,
 * accumulating in double; attention tests each key against the visibility rules one by one.
 * It must never be clever: no threads, no BLAS, no vector code, no shortcuts that a reader has
 * to trust. Like every table it never allocates, prints or fails. TOPK is the one shared entry
 * (backends/topk.c): its definition is torch's algorithm, checked against torch itself.
 */
#include "backends/kernels.h"

#include "core/core.h"

#include <math.h>

/* out (M, N) = a (M, K) @ b, b (N, K) read transposed if trans_b else b (K, N) */
static void ref_matmul(float *out, const float *a, const float *b, int64_t M, int64_t K, int64_t N, int trans_b)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)a[m * K + k] * (double)(trans_b ? b[n * K + k] : b[k * N + n]);
            out[m * N + n] = (float)acc;
        }
}

/* out (n, d) = table (V, d) rows ids (n) */
static void ref_embedding(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < d; j++) out[r * d + j] = table[(int64_t)ids[r] * d + j];
}

/* One 16-bit weight of dtype RLX_BF16 / RLX_F16, widened exactly to f32. */
static float ref_widen(uint16_t h, int dtype) { return dtype == RLX_BF16 ? rlx_bf16_to_f32(h) : rlx_f16_to_f32(h); }

/* x rounded to the nearest bf16 (8 significant bits), ties to even, computed in double: u is the
 * bf16 spacing at |x| (2^(e-8) for |x| in [2^(e-1), 2^e), never below the subnormal spacing
 * 2^-133), rint rounds |x| / u to an integer, ties to even (the default rounding mode). A value
 * that rounds to 2^128 or more is inf; NaN and inf stay as they are. */
static float ref_round_bf16(float x)
{
    if (isnan(x) || isinf(x)) return x;
    int e;
    (void)frexp((double)x, &e);
    const double u = ldexp(1.0, e - 8 > -133 ? e - 8 : -133);
    const double y = rint(fabs((double)x) / u) * u;
    return copysignf(y >= 0x1p128 ? INFINITY : (float)y, x);
}

/* out (M, N) = a (M, K) @ b^T, b (N, K) bf16 / f16 widened exactly; for bf16 weights each value
 * of a is first rounded to bf16 (ref_round_bf16, into scratch); products and sums in double. */
static void ref_matmul_lowp(float *out, const float *a, const void *bv, int b_dtype, int64_t M, int64_t K, int64_t N,
                            float *scratch)
{
    const uint16_t *b = bv;
    if (b_dtype == RLX_BF16) {
        for (int64_t i = 0; i < M * K; i++) scratch[i] = ref_round_bf16(a[i]);
        a = scratch;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)a[m * K + k] * (double)ref_widen(b[n * K + k], b_dtype);
            out[m * N + n] = (float)acc;
        }
}

/* M * K floats: a rounded to bf16 */
static size_t ref_matmul_lowp_scratch(int64_t M, int64_t K, int64_t N)
{
    (void)N;
    return (size_t)(M * K);
}

/* out (n, d) f32 = table (V, d) bf16 / f16 rows ids (n), widened exactly */
static void ref_embedding_lowp(float *out, const void *tv, int dtype, const int32_t *ids, int64_t n, int64_t d)
{
    const uint16_t *table = tv;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < d; j++) out[r * d + j] = ref_widen(table[(int64_t)ids[r] * d + j], dtype);
}

/* x rounded to the nearest f16 (11 significant bits), ties to even, computed in double as
 * ref_round_bf16: spacing 2^(e-11), never below the subnormal spacing 2^-24; a value that rounds
 * to 2^16 or more (65520 and up) is inf. */
static float ref_round_f16(float x)
{
    if (isnan(x) || isinf(x)) return x;
    int e;
    (void)frexp((double)x, &e);
    const double u = ldexp(1.0, e - 11 > -24 ? e - 11 : -24);
    const double y = rint(fabs((double)x) / u) * u;
    return copysignf(y >= 65520.0 ? INFINITY : (float)y, x);
}

/* dst (n) of dtype f32 / f16 / bf16 = src (n) rounded to nearest even (the rounded value is exact
 * in the narrow format, so encoding it takes no further rounding) */
static void ref_convert(void *dst, int dtype, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dtype == RLX_F32)
            ((float *)dst)[i] = src[i];
        else if (dtype == RLX_BF16)
            ((uint16_t *)dst)[i] = rlx_f32_to_bf16(ref_round_bf16(src[i]));
        else
            ((uint16_t *)dst)[i] = rlx_f32_to_f16(ref_round_f16(src[i]));
    }
}

/* out (M, N) = a (M, K) @ W^T, W (N, K) of a block type: each row of W converted by the dtype's
 * to_f32 into scratch (K floats), products and sums in double (no rounding of a). */
static void ref_matmul_quant(float *out, const float *a, const void *b, int b_dtype, int64_t M, int64_t K, int64_t N,
                             float *scratch)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits((enum rlx_dtype)b_dtype);
    const size_t row_bytes = (size_t)(K / t->block_size) * t->type_size;
    for (int64_t n = 0; n < N; n++) {
        t->to_f32(scratch, (const char *)b + (size_t)n * row_bytes, K);
        for (int64_t m = 0; m < M; m++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)a[m * K + k] * (double)scratch[k];
            out[m * N + n] = (float)acc;
        }
    }
}

/* K floats: one converted row of W */
static size_t ref_matmul_quant_scratch(int b_dtype, int64_t M, int64_t K, int64_t N)
{
    (void)b_dtype, (void)M, (void)N;
    return (size_t)K;
}

/* out (n, d) = rows ids (n) of a block-type table (V, d), converted by the dtype's to_f32 */
static void ref_embedding_quant(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d)
{
    const struct rlx_dtype_traits *t = rlx_dtype_traits((enum rlx_dtype)dtype);
    const size_t row_bytes = (size_t)(d / t->block_size) * t->type_size;
    for (int64_t r = 0; r < n; r++) t->to_f32(out + r * d, (const char *)table + (size_t)ids[r] * row_bytes, d);
}

/* out (rows, d) = x / sqrt(mean(x^2) + eps) * w (d) */
static void ref_rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t d, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t j = 0; j < d; j++) ss += (double)x[r * d + j] * (double)x[r * d + j];
        const double inv = 1.0 / sqrt(ss / (double)d + (double)eps);
        for (int64_t j = 0; j < d; j++) out[r * d + j] = (float)((double)x[r * d + j] * inv * (double)w[j]);
    }
}

/* sum (rows, d) = a + b; out (rows, d) = rmsnorm(sum) * w (d) */
static void ref_add_rmsnorm(float *sum, float *out, const float *a, const float *b, const float *w, int64_t rows,
                            int64_t d, float eps)
{
    for (int64_t i = 0; i < rows * d; i++) sum[i] = a[i] + b[i];
    ref_rmsnorm(out, sum, w, rows, d, eps);
}

/* out (s, h, d) = RoPE of x (s, h, d) at positions pos (s) with inv_freq (d/2):
 * t = (float)pos * inv_freq[i] (in float, as PyTorch); pair (a, b) = (i, i + d/2), or (2i, 2i + 1)
 * when interleaved; out[a] = x[a] cos t - x[b] sin t, out[b] = x[b] cos t + x[a] sin t */
static void ref_rope(float *out, const float *x, const int32_t *pos, const float *inv_freq, int64_t s, int64_t h,
                     int64_t d, int interleaved)
{
    const int64_t half = d / 2;
    for (int64_t t = 0; t < s; t++)
        for (int64_t hh = 0; hh < h; hh++)
            for (int64_t i = 0; i < half; i++) {
                const float ang = (float)pos[t] * inv_freq[i];
                const double c = cosf(ang), sn = sinf(ang);
                const int64_t base = (t * h + hh) * d, a = interleaved ? 2 * i : i,
                              b = interleaved ? 2 * i + 1 : i + half;
                const double x0 = x[base + a], x1 = x[base + b];
                out[base + a] = (float)(x0 * c - x1 * sn);
                out[base + b] = (float)(x1 * c + x0 * sn);
            }
}

/* out (rows, n) = softmax over each row of x (rows, n) */
static void ref_softmax(float *out, const float *x, int64_t rows, int64_t n)
{
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY;
        for (int64_t j = 0; j < n; j++)
            if (x[r * n + j] > m) m = x[r * n + j];
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += exp((double)x[r * n + j] - m);
        for (int64_t j = 0; j < n; j++) out[r * n + j] = (float)(exp((double)x[r * n + j] - m) / sum);
    }
}

/* out (n) = x * sigmoid(x) */
static void ref_silu(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = (float)((double)x[i] / (1.0 + exp(-(double)x[i])));
}

/* out (n) = silu(a) * b */
static void ref_silu_mul(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = (float)((double)a[i] / (1.0 + exp(-(double)a[i])) * (double)b[i]);
}

/* out (n) = a (n) + b[i % nb] */
static void ref_add(float *out, const float *a, const float *b, int64_t n, int64_t nb)
{
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i % nb];
}

/* out (n) = a (n) * b[i % nb] */
static void ref_mul(float *out, const float *a, const float *b, int64_t n, int64_t nb)
{
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i % nb];
}

/* Whether key j is visible to query i (at position T - S + i) under causal, window and mask_u8. */
static int ref_visible(const struct rlx_attn_args *a, int64_t i, int64_t j)
{
    const int64_t qpos = a->T - a->S + i;
    if (a->causal && !(j <= qpos)) return 0;
    if (a->window > 0 && !(j > qpos - a->window)) return 0;
    if (a->mask_u8 && a->mask_u8[i * a->T + j] == 0) return 0;
    return 1;
}

/* Element e of key / value row j for kv head g, widened exactly from the K/V dtype. */
static double ref_kv(const struct rlx_attn_args *a, const void *base, int64_t j, int64_t g, int64_t e)
{
    const int64_t at = (j * a->Hkv + g) * a->D + e;
    if (a->kv_dtype == RLX_F32) return ((const float *)base)[at];
    return ref_widen(((const uint16_t *)base)[at], a->kv_dtype);
}

/* out (S, Hq, D): for each query i and head h (kv head h / (Hq/Hkv)):
 * score_j = scale * q[i,h] . k_j + mask_f32[i,j] for visible j, softmax over them, out = sum p_j v_j;
 * no visible key (or all scores -inf) gives zeros. scratch: T floats of scores, then weights. */
static void ref_attention(const struct rlx_attn_args *a)
{
    const int64_t T = a->T, D = a->D;
    float *score = a->scratch;
    for (int64_t i = 0; i < a->S; i++)
        for (int64_t h = 0; h < a->Hq; h++) {
            const int64_t g = h / (a->Hq / a->Hkv);
            const float *q = a->q + (i * a->Hq + h) * D;
            float *o = a->out + (i * a->Hq + h) * D;
            double m = -INFINITY;
            for (int64_t j = 0; j < T; j++) {
                score[j] = -INFINITY;
                if (!ref_visible(a, i, j)) continue;
                double s = 0.0;
                for (int64_t e = 0; e < D; e++) s += (double)q[e] * ref_kv(a, a->k, j, g, e);
                s *= a->scale;
                if (a->mask_f32) s += a->mask_f32[i * T + j];
                score[j] = (float)s;
                if (s > m) m = s;
            }
            for (int64_t e = 0; e < D; e++) o[e] = 0.0f;
            if (m == -INFINITY) continue;
            double sum = 0.0;
            for (int64_t j = 0; j < T; j++) {
                score[j] = score[j] == -INFINITY ? 0.0f : (float)exp((double)score[j] - m);
                sum += score[j];
            }
            for (int64_t e = 0; e < D; e++) {
                double acc = 0.0;
                for (int64_t j = 0; j < T; j++)
                    if (score[j] != 0.0f) acc += (double)score[j] * ref_kv(a, a->v, j, g, e);
                o[e] = (float)(acc / sum);
            }
        }
}

/* T floats: the scores of one query row */
static size_t ref_attention_scratch(const struct rlx_attn_args *a) { return (size_t)a->T; }

/* out (S, n, N): row j of token s = a[s, A == 1 ? 0 : j] (K) @ w[ids[s, j]]^T, each row one call of
 * the plain product for the expert's dtype (ref_matmul, ref_matmul_lowp, ref_matmul_quant with
 * M = 1). scratch: K floats (the rounded row of a, or one converted weight row). */
static void ref_matmul_id(const struct rlx_matmul_id_args *a)
{
    for (int64_t s = 0; s < a->S; s++)
        for (int64_t j = 0; j < a->n; j++) {
            const float *x = a->a + (s * a->A + (a->A == 1 ? 0 : j)) * a->K;
            float *o = a->out + (s * a->n + j) * a->N;
            const void *w = a->w[a->ids[s * a->n + j]];
            if (a->w_dtype == RLX_F32)
                ref_matmul(o, x, w, 1, a->K, a->N, 1);
            else if (a->w_dtype == RLX_F16 || a->w_dtype == RLX_BF16)
                ref_matmul_lowp(o, x, w, a->w_dtype, 1, a->K, a->N, a->scratch);
            else
                ref_matmul_quant(o, x, w, a->w_dtype, 1, a->K, a->N, a->scratch);
        }
}

/* K floats */
static size_t ref_matmul_id_scratch(const struct rlx_matmul_id_args *a) { return (size_t)a->K; }

/* out (S, H) = sum over j of w_j * y[s, j] (double), w_j = probs[s, ids[s, j]] / (norm ? their sum : 1) */
static void ref_moe_combine(float *out, const float *y, const float *probs, const int32_t *ids, int64_t S, int64_t n,
                            int64_t H, int64_t E, int norm)
{
    for (int64_t s = 0; s < S; s++) {
        double total = 0.0;
        for (int64_t j = 0; j < n; j++) total += probs[s * E + ids[s * n + j]];
        for (int64_t h = 0; h < H; h++) {
            double acc = 0.0;
            for (int64_t j = 0; j < n; j++) {
                const double w = probs[s * E + ids[s * n + j]];
                acc += (norm ? w / total : w) * (double)y[(s * n + j) * H + h];
            }
            out[s * H + h] = (float)acc;
        }
    }
}

/* Every product here is row by row, each row's loop the same whatever M: any number of rows. */
static int64_t ref_matmul_rows_alone(int b_dtype, int trans_b)
{
    (void)b_dtype, (void)trans_b;
    return INT64_MAX;
}

const struct rlx_kernels rlx_ref_kernels = {
    .name = "ref",
    .matmul_f32 = ref_matmul,
    .embedding_f32 = ref_embedding,
    .matmul_lowp = ref_matmul_lowp,
    .matmul_lowp_scratch = ref_matmul_lowp_scratch,
    .embedding_lowp = ref_embedding_lowp,
    .convert_f32 = ref_convert,
    .matmul_quant = ref_matmul_quant,
    .matmul_quant_scratch = ref_matmul_quant_scratch,
    .matmul_rows_alone = ref_matmul_rows_alone,
    .embedding_quant = ref_embedding_quant,
    .rmsnorm_f32 = ref_rmsnorm,
    .add_rmsnorm_f32 = ref_add_rmsnorm,
    .rope_f32 = ref_rope,
    .softmax_f32 = ref_softmax,
    .silu_f32 = ref_silu,
    .silu_mul_f32 = ref_silu_mul,
    .add_f32 = ref_add,
    .mul_f32 = ref_mul,
    .attention = ref_attention,
    .attention_scratch = ref_attention_scratch,
    .topk_f32 = rlx_topk_f32,
    .topk_scratch = rlx_topk_scratch,
    .matmul_id = ref_matmul_id,
    .matmul_id_scratch = ref_matmul_id_scratch,
    .moe_combine_f32 = ref_moe_combine,
};
