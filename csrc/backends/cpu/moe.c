/*
 * moe.c - the cpu table's mixture-of-experts kernels: matmul_id (every row's product with the expert
 * its id names) and moe_combine (a token's expert outputs summed with its router weights).
 *
 * matmul_id groups the rows by expert (a counting sort of the row indices, stable, so an expert's
 * rows stay in token order) and runs one product per expert that has rows, with the table's own
 * kernel for the experts' dtype (matmul.c: the threaded matvec for a few rows, gemm_bf16 or OpenBLAS
 * beyond; the block types through the table's matmul_quant), so only the experts some row names are
 * read, each once per call: a decode step (one token, n rows) reads the n experts' weights and no
 * others; a prefill of S tokens reads each expert once for all of its rows. An expert with one row
 * is multiplied in place (no copy); one with more has its rows of `a` gathered into scratch and its
 * results scattered back. Each product threads itself (one pool region per expert and call).
 *
 * Must never allocate or fail; every id is in range (the dispatcher checked).
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <string.h>

/* out (M, N) = a (M, K) @ w^T, w (N, K) of dtype dt, by the table's product for that dtype */
static void product(float *out, const float *a, const void *w, int dt, int64_t M, int64_t K, int64_t N, float *scratch)
{
    if (dt == RLX_F32)
        rlx_cpu_matmul_f32(out, a, w, M, K, N, 1);
    else if (dt == RLX_F16 || dt == RLX_BF16)
        rlx_cpu_matmul_lowp(out, a, w, dt, M, K, N, scratch);
    else
        rlx_cpu_kernels.matmul_quant(out, a, w, dt, M, K, N, scratch);
}

/* Floats of the inner product's scratch for up to M rows. */
static size_t product_scratch(int dt, int64_t M, int64_t K, int64_t N)
{
    if (dt == RLX_F32) return 0;
    if (dt == RLX_F16 || dt == RLX_BF16) return rlx_cpu_matmul_lowp_scratch(M, K, N);
    return rlx_cpu_kernels.matmul_quant_scratch ? rlx_cpu_kernels.matmul_quant_scratch(dt, M, K, N) : 0;
}

/* Scratch layout, in floats: start (E + 1) and order (R) as int32, the gathered rows of a (R, K),
 * their results (R, N), then the inner product's scratch; R = S * n rows. */
size_t rlx_cpu_matmul_id_scratch(const struct rlx_matmul_id_args *a)
{
    const int64_t R = a->S * a->n;
    size_t inner = 0;
    for (int64_t m = 1; m <= R; m = m < 8 ? m + 1 : m * 2) { /* the inner scratch is not monotone in M */
        const size_t s = product_scratch(a->w_dtype, m, a->K, a->N);
        inner = s > inner ? s : inner;
    }
    const size_t s = product_scratch(a->w_dtype, R, a->K, a->N);
    inner = s > inner ? s : inner;
    return (size_t)(a->E + 1 + R) + (size_t)(R * a->K) + (size_t)(R * a->N) + inner;
}

void rlx_cpu_matmul_id(const struct rlx_matmul_id_args *a)
{
    const int64_t R = a->S * a->n, K = a->K, N = a->N, E = a->E;
    if (R == 0 || N == 0) return;
    int32_t *start = (int32_t *)a->scratch; /* (E + 1): expert e's rows are order[start[e] .. start[e + 1]) */
    int32_t *order = start + E + 1;         /* (R) row indices s * n + j, grouped by expert */
    float *rows = a->scratch + E + 1 + R;   /* (R, K) gathered rows of a */
    float *res = rows + R * K;              /* (R, N) their results */
    float *inner = res + R * N;
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (int64_t r = 0; r < R; r++) start[a->ids[r] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    for (int64_t r = 0; r < R; r++) /* stable: start[e] runs ahead as rows are placed, then is restored */
        order[start[a->ids[r]]++] = (int32_t)r;
    for (int64_t e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t first = start[e], count = start[e + 1] - first;
        if (count == 0) continue;
        for (int64_t i = 0; i < count; i++) {
            const int64_t r = order[first + i], s = r / a->n, j = r % a->n;
            const float *x = a->a + (s * a->A + (a->A == 1 ? 0 : j)) * K;
            if (count == 1) {
                product(a->out + r * N, x, a->w[e], a->w_dtype, 1, K, N, inner);
                break;
            }
            memcpy(rows + i * K, x, (size_t)K * sizeof(float));
        }
        if (count == 1) continue;
        const int64_t group = a->rows_alone > 0 && count <= RLX_INVARIANT_ROWS ? a->rows_alone : count;
        for (int64_t i = 0; i < count; i += group)
            product(res + i * N, rows + i * K, a->w[e], a->w_dtype, count - i < group ? count - i : group, K, N, inner);
        for (int64_t i = 0; i < count; i++)
            memcpy(a->out + (int64_t)order[first + i] * N, res + i * N, (size_t)N * sizeof(float));
    }
}

struct combine_ctx {
    float *out;
    const float *y, *probs;
    const int32_t *ids;
    int64_t n, H, E;
    int norm;
};

/* Tokens [begin, end): the weights in f32 (each divided by their sum, summed in slot order, when
 * norm: as transformers divides the top-k probabilities before it scales the experts' outputs),
 * then out = w_0 y_0 + w_1 y_1 + ... in slot order. */
RLX_CLONES
static void combine_range(void *p, int64_t begin, int64_t end)
{
    const struct combine_ctx *c = p;
    for (int64_t s = begin; s < end; s++) {
        const float *pr = c->probs + s * c->E;
        const int32_t *id = c->ids + s * c->n;
        float total = 0.0f;
        if (c->norm)
            for (int64_t j = 0; j < c->n; j++) total += pr[id[j]];
        float *o = c->out + s * c->H;
        for (int64_t j = 0; j < c->n; j++) {
            const float w = c->norm ? pr[id[j]] / total : pr[id[j]];
            const float *y = c->y + (s * c->n + j) * c->H;
            if (j == 0)
                for (int64_t h = 0; h < c->H; h++) o[h] = w * y[h];
            else
                for (int64_t h = 0; h < c->H; h++) o[h] += w * y[h];
        }
    }
}

void rlx_cpu_moe_combine_f32(float *out, const float *y, const float *probs, const int32_t *ids, int64_t S, int64_t n,
                             int64_t H, int64_t E, int norm)
{
    struct combine_ctx c = {.out = out, .y = y, .probs = probs, .ids = ids, .n = n, .H = H, .E = E, .norm = norm};
    if (n == 0) {
        memset(out, 0, (size_t)(S * H) * sizeof(float));
        return;
    }
    rlx_parallel_for(S, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP, n * H), combine_range, &c);
}
