/*
 * kernels.h - the kernel table a host-memory backend provides. Two tables exist: "cpu" (fast:
 * OpenBLAS, threads through backends/cpu/pool.h, vector code) and "ref" (plain scalar loops,
 * single threaded: the in-C oracle). The dispatcher (backends/host.c) turns a plan step into one
 * call here; kernels never allocate, never fail, and trust their arguments (the dispatcher has
 * checked shapes, dtypes and id ranges).
 *
 * All tensors are contiguous row-major f32 unless stated. Weights (`b` of a matmul, an embedding
 * table) come as `const void *` with their enum rlx_dtype.
 */
#ifndef RLX_BACKENDS_KERNELS_H
#define RLX_BACKENDS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/rlx.h"

struct rlx_attn_args {
    float *out;               /* (S, Hq, D) */
    const float *q;           /* (S, Hq, D) */
    const void *k, *v;        /* (T, Hkv, D) of kv_dtype: keys / values of positions 0..T-1 */
    int kv_dtype;             /* RLX_F32, RLX_F16 or RLX_BF16 */
    const float *mask_f32;    /* (S, T) additive, or NULL */
    const uint8_t *mask_u8;   /* (S, T) nonzero = may attend, or NULL */
    int64_t S, T, Hq, Hkv, D; /* T >= S; query i sits at position T - S + i; query head h uses kv
                                 head h / (Hq / Hkv) */
    float scale;              /* scores = scale * q.k */
    int causal;               /* key j visible to query i only if j <= T - S + i */
    int64_t window;           /* > 0: key j also needs j > T - S + i - window */
    float *scratch;           /* at least attention_scratch(this) floats */
};
/* A query row whose keys are all masked produces zeros. */

/* A product with weights chosen per row from stacked experts (RLX_OP_MATMUL_ID). */
struct rlx_matmul_id_args {
    float *out;           /* (S, n, N) */
    const float *a;       /* (S, A, K): row j of token s reads a[s, A == 1 ? 0 : j] */
    const int32_t *ids;   /* (S, n), each in [0, E) (the dispatcher has checked) */
    const void *const *w; /* (E) expert e's weight (N, K), rows of w_dtype (whole blocks of K) */
    int w_dtype;          /* any real-valued dtype; each row's product is the one the table's matmul
                                 entry for that dtype computes (matmul_f32 with trans_b, matmul_lowp,
                                 matmul_quant), up to summation order */
    int64_t S, A, n, K, N, E;
    int64_t rows_alone; /* > 0: an expert's rows, when at most RLX_INVARIANT_ROWS, multiplied in groups of at
                           most this many (a batch-invariant plan: matmul_rows_alone); 0: all at once */
    float *scratch;     /* at least matmul_id_scratch(this) floats */
};

struct rlx_kernels {
    const char *name;
    /* out (M, N) = a (M, K) @ b, b (N, K) read transposed if trans_b else b (K, N) */
    void (*matmul_f32)(float *out, const float *a, const float *b, int64_t M, int64_t K, int64_t N, int trans_b);
    /* out (n, d) = table (V, d) rows ids (n) */
    void (*embedding_f32)(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d);
    /* Low-precision weights: b_dtype is RLX_BF16 or RLX_F16, raw 16-bit values, widened exactly.
     * RLX_BF16: every element of `a` is first rounded to bf16 (round to nearest even; NaN stays NaN,
     * a finite value past the largest bf16 becomes inf), then the products of the two bf16 values
     * (exact in f32) are accumulated in f32; on every path and every M, so decode and prefill
     * compute the same function up to summation order (bf16 subnormals may count as zero on the
     * AVX-512 BF16 path). RLX_F16: products of the exact f32 `a` and the widened weights,
     * accumulated in f32 (no rounding of `a`).
     * out (M, N) = a (M, K) @ b^T, b (N, K); scratch: matmul_lowp_scratch(M, K, N) floats. */
    void (*matmul_lowp)(float *out, const float *a, const void *b, int b_dtype, int64_t M, int64_t K, int64_t N,
                        float *scratch);
    size_t (*matmul_lowp_scratch)(int64_t M, int64_t K, int64_t N);
    /* out (n, d) f32 = table (V, d) of dtype RLX_BF16 / RLX_F16, rows ids (n), widened exactly */
    void (*embedding_lowp)(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d);
    /* Block-type weights (a GGUF type: RLX_Q8_0, RLX_Q4_K, ...): out (M, N) = a (M, K) @ W^T, W (N, K)
     * in rows of whole blocks (K a multiple of the block size), W's values those of the dtype's to_f32.
     * The cpu table quantises each row of `a` first, as llama.cpp does (Q8_0 blocks of 32 for the
     * 32-element types, Q8_K blocks of 256 for the K types: per block d = max|a| / 127, q = a / d
     * rounded to nearest), on every path (decode and prefill compute the same function up to
     * summation order), and sums the products of the integer values per block, scaled in f32; the
     * ref table multiplies the exact `a` by the dequantised W in double. The two differ by at most
     * sum over blocks of (max|a_block| / 254) * sum |W_block| per output, plus f32 rounding.
     * scratch: matmul_quant_scratch(b_dtype, M, K, N) floats. */
    void (*matmul_quant)(float *out, const float *a, const void *b, int b_dtype, int64_t M, int64_t K, int64_t N,
                         float *scratch);
    size_t (*matmul_quant_scratch)(int b_dtype, int64_t M, int64_t K, int64_t N);
    /* The most rows (>= 1) a product of weights of b_dtype (f32: read transposed if trans_b) may
     * have for every row of it, whatever the number of rows up to that, to get the bits of the same
     * row multiplied alone (M = 1): what a batch-invariant plan groups its products' rows by. */
    int64_t (*matmul_rows_alone)(int b_dtype, int trans_b);
    /* out (n, d) f32 = rows ids (n) of table (V, d) of a block type, converted by the dtype's to_f32 */
    void (*embedding_quant)(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d);
    /* dst (n) of dtype RLX_F32 / RLX_F16 / RLX_BF16 = src (n) rounded to nearest even (NaN stays
     * NaN, a finite value past the largest finite one becomes inf) */
    void (*convert_f32)(void *dst, int dtype, const float *src, int64_t n);
    /* out (rows, d) = x / sqrt(mean(x^2) + eps) * w (d) */
    void (*rmsnorm_f32)(float *out, const float *x, const float *w, int64_t rows, int64_t d, float eps);
    /* sum (rows, d) = a + b; out (rows, d) = rmsnorm(sum) * w */
    void (*add_rmsnorm_f32)(float *sum, float *out, const float *a, const float *b, const float *w, int64_t rows,
                            int64_t d, float eps);
    /* out (s, h, d) = RoPE of x (s, h, d) at positions pos (s) with inv_freq (d/2): for i < d/2,
     * t = pos * inv_freq[i], and the pair (a, b) = (i, i + d/2), or (2i, 2i + 1) when interleaved:
     * out[a] = x[a] cos t - x[b] sin t, out[b] = x[b] cos t + x[a] sin t */
    void (*rope_f32)(float *out, const float *x, const int32_t *pos, const float *inv_freq, int64_t s, int64_t h,
                     int64_t d, int interleaved);
    /* out (rows, n) = softmax over each row of x */
    void (*softmax_f32)(float *out, const float *x, int64_t rows, int64_t n);
    /* out (n) = x * sigmoid(x) */
    void (*silu_f32)(float *out, const float *x, int64_t n);
    /* out (n) = silu(a) * b */
    void (*silu_mul_f32)(float *out, const float *a, const float *b, int64_t n);
    /* out (n) = a (n) + b (nb) broadcast: out[i] = a[i] + b[i % nb]; nb divides n */
    void (*add_f32)(float *out, const float *a, const float *b, int64_t n, int64_t nb);
    /* out (n) = a * b broadcast as add_f32 */
    void (*mul_f32)(float *out, const float *a, const float *b, int64_t n, int64_t nb);
    /* grouped-query attention, see rlx_attn_args */
    void (*attention)(const struct rlx_attn_args *a);
    /* floats of scratch attention needs for these arguments (scratch itself unused) */
    size_t (*attention_scratch)(const struct rlx_attn_args *a);
    /* out (rows, k) i32 = per row of x (rows, n) the indices torch.topk returns (rlx_topk_f32 in
     * core/topk.c: both tables use that one definition, whose oracle is torch itself); scratch:
     * topk_scratch(n) floats */
    void (*topk_f32)(int32_t *out, const float *x, int64_t rows, int64_t n, int64_t k, float *scratch);
    size_t (*topk_scratch)(int64_t n);
    /* see rlx_matmul_id_args */
    void (*matmul_id)(const struct rlx_matmul_id_args *a);
    size_t (*matmul_id_scratch)(const struct rlx_matmul_id_args *a);
    /* out (S, H) = sum over j < n, in order, of w[s, j] * y (S, n, H)[s, j], w[s, j] = probs (S, E)[s, ids[s, j]],
     * divided by the sum of the row's n values (in order) when norm; ids (S, n) in [0, E) */
    void (*moe_combine_f32)(float *out, const float *y, const float *probs, const int32_t *ids, int64_t S, int64_t n,
                            int64_t H, int64_t E, int norm);
};

/* The shared TOPK (backends/topk.c): scratch of rlx_topk_scratch(n) floats. */
void rlx_topk_f32(int32_t *out, const float *x, int64_t rows, int64_t n, int64_t k, float *scratch);
size_t rlx_topk_scratch(int64_t n);

extern const struct rlx_kernels rlx_cpu_kernels;
extern const struct rlx_kernels rlx_ref_kernels;

#endif
