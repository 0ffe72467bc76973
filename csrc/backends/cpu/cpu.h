/*
 * cpu.h - internals shared by the files of the "cpu" kernel table (the .c files of backends/cpu): the kernel
 * entry points that table.c collects, the work sizes below which a kernel stays on one thread,
 * and the vector type used by the hand-vectorized loops. Nothing here is visible outside
 * backends/cpu; nothing here may allocate, print or fail.
 */
#ifndef RLX_BACKENDS_CPU_CPU_H
#define RLX_BACKENDS_CPU_CPU_H

#include "backends/kernels.h"

#include <stddef.h>
#include <stdint.h>

/* The ISAs each hot loop is compiled for; the loader picks one per machine (cpuid), so the build
 * never depends on -march. */
#define RLX_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

/* 16 floats: one zmm on avx512f, two ymm on avx2, four xmm on the baseline. Loaded and stored
 * with memcpy, so pointers need no alignment. */
typedef float rlx_cpu_v16 __attribute__((vector_size(64)));
typedef int32_t rlx_cpu_v16i __attribute__((vector_size(64)));
typedef uint32_t rlx_cpu_v16u __attribute__((vector_size(64)));

/* *v = expf(*v) on 16 lanes (through a pointer: 64-byte vectors by value would change the ABI), within ~2 ulp of the correctly rounded value (Cephes-style): x = n ln2 + r
 * with n = round(x / ln2) (by the 1.5 * 2^23 trick) and |r| <= ln2 / 2 (ln2 split in two so
 * n ln2 is exact), exp(r) = 1 + r + r^2 P(r) with a degree-5 minimax P, times 2^n built in the
 * exponent bits. x > 88.376 (2^n would overflow; exp(x) > 2^127.5) gives +inf, x < -87.337
 * (results below FLT_MIN) gives 0, -inf gives 0, NaN stays NaN. Inlined into the per-ISA
 * clones of its callers, so it compiles to that ISA's vectors. */
static inline __attribute__((always_inline)) void rlx_cpu_exp16(rlx_cpu_v16 *v) {
    rlx_cpu_v16 x = *v;
    const rlx_cpu_v16i over = x > 88.3762626647949f, under = x < -87.3365478515625f;
    x = (rlx_cpu_v16)((rlx_cpu_v16i)x & ~(over | under)); /* those lanes computed at 0 */
    const rlx_cpu_v16 t = x * 1.44269504088896341f + 12582912.0f;
    const rlx_cpu_v16 n = t - 12582912.0f;
    rlx_cpu_v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    rlx_cpu_v16 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* t's low mantissa bits hold n (two's complement): (n + 127) << 23 is 2^n */
    const rlx_cpu_v16u scale = ((rlx_cpu_v16u)t << 23) + (127u << 23);
    rlx_cpu_v16i y = (rlx_cpu_v16i)(p * (rlx_cpu_v16)scale);
    y = (y & ~(over | under)) | (over & 0x7f800000);
    *v = (rlx_cpu_v16)y;
}

/* Minimum items per chunk handed to rlx_parallel_for, in floats touched (cheap ops), in floats
 * through expf/sinf (transcendental ops), and in multiply-adds (attention). Below these a
 * kernel runs on the calling thread: a region costs about 10-15 us of wake-up and join when the
 * workers sleep (measured on a 2-vCPU EPYC VM), about what one thread needs for 100K floats of a
 * cheap op; 1-2 us when they are still spinning after a recent region (pool.c). */
#define RLX_CPU_GRAIN_CHEAP 131072
#define RLX_CPU_GRAIN_TRANSC 8192
#define RLX_CPU_GRAIN_FMA 65536

/* Rows per chunk so that each chunk holds at least `grain` items of `row` items each (>= 1). */
static inline int64_t rlx_cpu_row_grain(int64_t grain, int64_t row) {
    return row >= grain ? 1 : (grain + row - 1) / (row > 0 ? row : 1);
}

/* Vector ISA the hand-written intrinsics paths (lowp.c, matmul.c) may use on this machine, from
 * cpuid (AVX-512 needs F, BW, VL and F16C; AVX2 needs FMA and F16C). */
enum { RLX_CPU_ISA_SCALAR = 0, RLX_CPU_ISA_AVX2 = 1, RLX_CPU_ISA_AVX512 = 2 };
int rlx_cpu_isa(void);
/* dst (n) f32 = src (n) of dtype RLX_BF16 / RLX_F16, widened exactly */
void rlx_cpu_widen(float *dst, const uint16_t *src, int dtype, int64_t n);

void rlx_cpu_matmul_f32(float *out, const float *a, const float *b, int64_t M, int64_t K, int64_t N,
                        int trans_b);
void rlx_cpu_embedding_f32(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d);
void rlx_cpu_matmul_lowp(float *out, const float *a, const uint16_t *b, int b_dtype, int64_t M, int64_t K,
                         int64_t N, float *scratch);
size_t rlx_cpu_matmul_lowp_scratch(int64_t M, int64_t K, int64_t N);
void rlx_cpu_embedding_lowp(float *out, const uint16_t *table, int dtype, const int32_t *ids, int64_t n,
                            int64_t d);
void rlx_cpu_rmsnorm_f32(float *out, const float *x, const float *w, int64_t rows, int64_t d, float eps);
void rlx_cpu_add_rmsnorm_f32(float *sum, float *out, const float *a, const float *b, const float *w,
                             int64_t rows, int64_t d, float eps);
void rlx_cpu_rope_f32(float *out, const float *x, const int32_t *pos, const float *inv_freq, int64_t s,
                      int64_t h, int64_t d);
void rlx_cpu_softmax_f32(float *out, const float *x, int64_t rows, int64_t n);
void rlx_cpu_silu_f32(float *out, const float *x, int64_t n);
void rlx_cpu_silu_mul_f32(float *out, const float *a, const float *b, int64_t n);
void rlx_cpu_add_f32(float *out, const float *a, const float *b, int64_t n, int64_t nb);
void rlx_cpu_mul_f32(float *out, const float *a, const float *b, int64_t n, int64_t nb);
void rlx_cpu_attention_f32(const struct rlx_attn_args *a);
size_t rlx_cpu_attention_scratch(int64_t S, int64_t P);

#endif
