/*
 * cpu.h - internals shared by the files of the "cpu" kernel table (the .c files of backends/cpu): the kernel
 * entry points that table.c collects, the work sizes below which a kernel stays on one thread,
 * and the vector type used by the hand-vectorized loops. Nothing here is visible outside
 * backends/cpu; nothing here may allocate, print or fail.
 */
#ifndef RLX_BACKENDS_CPU_CPU_H
#define RLX_BACKENDS_CPU_CPU_H

#include "backends/kernels.h"
#include "core/core.h"
#include "core/quants.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* bytes per block of the block type wt (Q8_0 .. Q6_K; a constant where wt is): the row kernels' */
static inline size_t rlx_cpu_qblock_bytes(int wt)
{
    switch (wt) {
    case RLX_Q8_0: return RLX_Q8_0_BYTES;
    case RLX_Q4_0: return RLX_Q4_0_BYTES;
    case RLX_Q4_1: return RLX_Q4_1_BYTES;
    case RLX_Q5_0: return RLX_Q5_0_BYTES;
    case RLX_Q5_1: return RLX_Q5_1_BYTES;
    case RLX_Q2_K: return RLX_Q2_K_BYTES;
    case RLX_Q3_K: return RLX_Q3_K_BYTES;
    case RLX_Q4_K: return RLX_Q4_K_BYTES;
    case RLX_Q5_K: return RLX_Q5_K_BYTES;
    default: return RLX_Q6_K_BYTES;
    }
}

/* Q3_K: the 16 scales (6 bits, minus 32) of the 12 bytes at s, as 16 signed bytes (SSE2) */
static inline __m128i rlx_cpu_k3_scales(const uint8_t *s)
{
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4), memcpy(&a1, s + 4, 4), memcpy(&a2, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const __m128i v = _mm_set_epi32((int)(((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4)),
                                    (int)(((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4)),
                                    (int)((a1 & m4) | (((a2 >> 2) & m2) << 4)), (int)((a0 & m4) | ((a2 & m2) << 4)));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

/* 16 floats: one zmm on avx512f, two ymm on avx2, four xmm on the baseline. Loaded and stored
 * with memcpy, so pointers need no alignment. */
typedef float rlx_cpu_v16 __attribute__((vector_size(64)));
typedef int32_t rlx_cpu_v16i __attribute__((vector_size(64)));
typedef uint32_t rlx_cpu_v16u __attribute__((vector_size(64)));

/* The first len (<= 16) floats of src into *v, the other lanes left as they are; and the first len
 * lanes of *v into dst. A whole vector is one fixed-size copy (a vector load / store): a copy of a
 * variable length compiles to `rep movs` through the stack, ~10x the arithmetic of a cheap loop. */
static inline __attribute__((always_inline)) void rlx_cpu_load16_part(rlx_cpu_v16 *v, const float *src, int64_t len)
{
    if (len == 16)
        memcpy(v, src, sizeof *v);
    else
        for (int64_t l = 0; l < len; l++) (*v)[l] = src[l];
}

static inline __attribute__((always_inline)) void rlx_cpu_store16_part(float *dst, const rlx_cpu_v16 *v, int64_t len)
{
    if (len == 16)
        memcpy(dst, v, sizeof *v);
    else
        for (int64_t l = 0; l < len; l++) dst[l] = (*v)[l];
}

/* *v = expf(*v) on 16 lanes (through a pointer: 64-byte vectors by value would change the ABI), within ~2 ulp of the correctly rounded value (Cephes-style): x = n ln2 + r
 * with n = round(x / ln2) (by the 1.5 * 2^23 trick) and |r| <= ln2 / 2 (ln2 split in two so
 * n ln2 is exact), exp(r) = 1 + r + r^2 P(r) with a degree-5 minimax P, times 2^n built in the
 * exponent bits. x > 88.376 (2^n would overflow; exp(x) > 2^127.5) gives +inf, x < -87.337
 * (results below FLT_MIN) gives 0, -inf gives 0, NaN stays NaN. Inlined into the per-ISA
 * clones of its callers, so it compiles to that ISA's vectors. */
static inline __attribute__((always_inline)) void rlx_cpu_exp16(rlx_cpu_v16 *v)
{
    rlx_cpu_v16 x = *v;
    /* Lane masks from sign bits (arithmetic shifts), not vector comparisons: GCC 12 lowers a
     * comparison of these generic vectors to one scalar compare per lane in the avx512f clone
     * (no AVX512DQ to turn a mask register into a vector), ~3 ns a lane. x > hi <=> hi - x < 0
     * and x < lo <=> x - lo < 0 (exact in sign; +-inf included); NaN lanes (|bits| above inf's)
     * are in neither and stay NaN through the arithmetic. */
    const rlx_cpu_v16i nan = (0x7f800000 - ((rlx_cpu_v16i)x & 0x7fffffff)) >> 31;
    const rlx_cpu_v16i over = ((rlx_cpu_v16i)(88.3762626647949f - x) >> 31) & ~nan;
    const rlx_cpu_v16i under = ((rlx_cpu_v16i)(x + 87.3365478515625f) >> 31) & ~nan;
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

/* r[i] lane j -> r[j] lane i: a 16 x 16 transpose of 32-bit values (gemm_bf16.c, attention_amx.c) */
static inline __attribute__((target("avx512f"), always_inline)) void rlx_cpu_transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4g + s] holds, in each 128-bit lane L, rows 4g..4g+3 of column 4L + s' (s' = 0, 2, 1, 3 order
     * from the unpacks: r[4g+0] col 4L+0, r[4g+1] col 4L+1, r[4g+2] col 4L+2, r[4g+3] col 4L+3) */
    for (int s = 0; s < 4; s++) {
        const __m512i a0 = _mm512_shuffle_i32x4(r[s], r[4 + s], 0x88); /* lanes 0,2 of each */
        const __m512i a1 = _mm512_shuffle_i32x4(r[s], r[4 + s], 0xdd); /* lanes 1,3 */
        const __m512i b0 = _mm512_shuffle_i32x4(r[8 + s], r[12 + s], 0x88);
        const __m512i b1 = _mm512_shuffle_i32x4(r[8 + s], r[12 + s], 0xdd);
        t[s] = _mm512_shuffle_i32x4(a0, b0, 0x88);      /* lane 0: column s */
        t[8 + s] = _mm512_shuffle_i32x4(a0, b0, 0xdd);  /* lane 2: column 8 + s */
        t[4 + s] = _mm512_shuffle_i32x4(a1, b1, 0x88);  /* lane 1: column 4 + s */
        t[12 + s] = _mm512_shuffle_i32x4(a1, b1, 0xdd); /* lane 3: column 12 + s */
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Minimum items per chunk handed to rlx_parallel_for, in floats touched (cheap ops), in floats
 * through expf/sinf (transcendental ops), and in multiply-adds (attention). Below these a
 * kernel runs on the calling thread: a region costs about 10-15 us of wake-up and join when the
 * workers sleep (measured on a 2-vCPU EPYC VM), about what one thread needs for 100K floats of a
 * cheap op; 1-2 us when they are still spinning after a recent region (pool.c). */
#define RLX_CPU_GRAIN_CHEAP  131072
#define RLX_CPU_GRAIN_TRANSC 8192
#define RLX_CPU_GRAIN_FMA    65536

/* Rows per chunk so that each chunk holds at least `grain` items of `row` items each (>= 1). */
static inline int64_t rlx_cpu_row_grain(int64_t grain, int64_t row)
{
    return row >= grain ? 1 : (grain + row - 1) / (row > 0 ? row : 1);
}

/* Vector ISA the hand-written intrinsics paths (lowp.c, matmul.c, gemm_bf16.c) may use on this
 * machine, from cpuid (AVX-512 needs F, BW, VL and F16C; AVX2 needs FMA and F16C; AVX512_BF16 is
 * AVX-512 plus the BF16 dot products; AMX is AVX512_BF16 plus the AMX-TILE and AMX-BF16 tile
 * multiplies, their state enabled by the OS and this process allowed to use it (Linux:
 * arch_prctl ARCH_REQ_XCOMP_PERM, asked once)). The environment variable RLX_CPU_ISA ("scalar",
 * "avx2", "avx512", "avx512bf16") caps it; so does rlx_cpu_isa_cap. Each kernel reads it once per
 * call. RLX_CPU_ISA_TOP is the highest level (the cap that caps nothing). */
enum {
    RLX_CPU_ISA_SCALAR = 0,
    RLX_CPU_ISA_AVX2 = 1,
    RLX_CPU_ISA_AVX512 = 2,
    RLX_CPU_ISA_AVX512_BF16 = 3,
    RLX_CPU_ISA_AMX = 4,
    RLX_CPU_ISA_TOP = RLX_CPU_ISA_AMX
};
int rlx_cpu_isa(void);
/* For tests: caps rlx_cpu_isa() at `cap` from now on (it never rises above what cpuid and
 * RLX_CPU_ISA allow); returns the previous cap. Not for use while kernels run on other threads. */
int rlx_cpu_isa_cap(int cap);
/* rlx_cpu_isa() without rlx_cpu_isa_cap's cap (RLX_CPU_ISA's still applies): what a scratch size
 * must allow for when a test may lift the cap before the call. */
int rlx_cpu_isa_native(void);
/* Whether the AVX-512 VNNI integer dot products (VPDPBUSD) may be used: cpuid has AVX512_VNNI and
 * rlx_cpu_isa() allows AVX-512 (lowp.c). */
int rlx_cpu_avx512_vnni(void);
/* Whether the AMX-INT8 tile products (TDPBSSD) may be used: rlx_cpu_isa() is RLX_CPU_ISA_AMX and
 * cpuid has AMX-INT8 (leaf 7 subleaf 0, EDX bit 25) (lowp.c). */
int rlx_cpu_amx_int8(void);
/* The 64-byte AMX tile configuration (palette 1) that _tile_loadconfig reads: per tile its rows
 * and bytes per row. Each thread loads its own before its first tile instruction. */
struct rlx_cpu_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
/* Bytes ahead of its loads that the bf16 VDPBF16PS matvec prefetches on this machine (lowp.c). */
int64_t rlx_cpu_bf16_prefetch(void);
/* dst (n) f32 = src (n) of dtype RLX_BF16 / RLX_F16, widened exactly */
void rlx_cpu_widen(float *dst, const uint16_t *src, int dtype, int64_t n);

/* x rounded to the nearest bf16 (ties to even; a NaN stays NaN, quieted; a finite value past the
 * largest bf16 rounds to inf), as the f32 of that bf16 value. */
static inline float rlx_cpu_round_bf16_1(float x)
{
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u |= 0x00400000u;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    __builtin_memcpy(&x, &u, 4);
    return x;
}
/* 16 floats' bits (x) rounded as rlx_cpu_round_bf16_1: the top 16 bits of each lane are the bf16
 * (the low halves are garbage). For the AVX-512 paths (lowp.c, gemm_bf16.c) only. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m512i
rlx_cpu_round_bf16_512(__m512i x)
{
    const __m512i r =
        _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1))));
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(x, _mm512_set1_epi32(0x00400000)));
}
/* dst (n) = src (n) each rounded as rlx_cpu_round_bf16_1 (the same bits on every ISA path);
 * dst may equal src. */
void rlx_cpu_round_bf16(float *dst, const float *src, int64_t n);
/* dst (n bf16 halves) = src (n) rounded as rlx_cpu_round_bf16_1 (its top 16 bits). */
void rlx_cpu_pack_bf16(uint16_t *dst, const float *src, int64_t n);

/* The AVX-512 BF16 GEMM (gemm_bf16.c): out (M, N) = bf16(a) (M, K) @ b^T, b (N, K) bf16; only
 * when rlx_cpu_isa() >= RLX_CPU_ISA_AVX512_BF16 (with AMX tiles where rlx_cpu_isa() is
 * RLX_CPU_ISA_AMX, N >= 32 and K >= 32), rows of `a` packed in chunks of at most RLX_GB_A_UNITS
 * 32-bit units (whole row blocks). */
#define RLX_GB_A_UNITS (512 * 1024)
size_t rlx_cpu_gemm_bf16_scratch(int64_t M, int64_t K, int64_t N);
void rlx_cpu_gemm_bf16(float *out, const float *a, const uint16_t *b, int64_t M, int64_t K, int64_t N, float *scratch);

/* The AVX2 GEMM of 16-bit weights (gemm16_avx2.c): out (M, N) = a (M, K) @ widen(b)^T, b (N, K) of
 * dtype wt, on the pool; for bf16 `a` as rlx_cpu_gemm16_prep wrote it (rounded to bf16, each whole
 * group of 16 values of k as its 8 even then 8 odd ones), for f16 `a` as it is. Only when
 * rlx_cpu_isa() >= RLX_CPU_ISA_AVX2. */
void rlx_cpu_gemm16_prep(float *dst, const float *a, int64_t M, int64_t K);
void rlx_cpu_gemm16_avx2(float *out, const float *a, const uint16_t *b, int wt, int64_t M, int64_t K, int64_t N);

/* Block-type (GGUF) weights (quant.c: the function computed, dispatch, threads; quant_act.c: the
 * activations quantised; quant_avx2.c and quant_avx512.c: the per-ISA row kernels; quant_gemm.c:
 * the VNNI GEMM; quant_amx.c: the AMX-INT8 kernel). Rows of `a` quantised
 * once per call as quant.c describes; row m of each array below starts at m times its row length.
 * Natural element order unless stated. */
struct rlx_cpu_qact {
    const int8_t *q;      /* (M, ldq) quantised values: natural order, except on the VNNI path for
                              Q4_K / Q5_K (the 32-element groups of each 128 in the order 0, 2, 1, 3;
                              the AMX and lanes paths too) and Q4_0 .. Q5_1 (the row kernels only:
                              rlx_cpu_quant_arrange, each 128 in 4 blocks' halves) */
    const float *d;       /* (M, K / bs) the scale of each block of bs = 32 or 256: value = q * d */
    const float *s;       /* (M, K / 32) d * (sum of the block's q): 32-element blocks */
    const int16_t *bsums; /* (M, K / 16) sums of each 16 q (natural order): 256-element blocks */
    const int32_t *bias;  /* (M, K / 32) -off * (sum of the block's q), off = rlx_cpu_quant_off(wt):
                              the weights' offset (the AVX2 kernels') */
    /* The AMX kernel's copies (rlx_cpu_qmv_amx), filled by rlx_cpu_qact_tiles only where it runs, or
     * the lanes kernel's (rlx_cpu_qmv_lanes, rlx_cpu_qact_lanes: per 8 rows, in 16 lanes, the same
     * sizes but td for the 32-element types, one scale per block of 32). Columns past M's rows are
     * zeros. */
    const int8_t *tq; /* per 16 rows (K / 4, 16, 4): per 4 values of q (the order of q) a row of columns */
    const float *td;  /* per 16 rows (K / 256, 16): per super-block the columns' d */
    const float *tg;  /* per 16 rows (K / (P G), 16): per product of P groups the columns' group sums */
    int64_t K, ldq;
};
/* The offset the vector kernels of weight dtype wt subtract through `bias`: Q4_0 8, Q5_0 16, else 0. */
int rlx_cpu_quant_off(int wt);
/* Whether the VNNI path reads the activations of wt (Q4_0 .. Q5_1) in groups of 4 blocks: each 128
 * elements as [b0 0..15, b1 0..15, b2 0..15, b3 0..15, b0 16..31, .., b3 16..31], rows padded with
 * zeros to a multiple of 128 (ldq). */
int rlx_cpu_quant_arrange(int wt, int vnni);
/* Software prefetch for the row kernels: the n bytes at p + RLX_QMV_PF (the blocks a few KiB ahead of
 * the one being computed) into L2, one hint per line; a prefetch never faults, so it may reach past
 * the weights. A thread's piece of rows is one sequential stream, but the hardware prefetchers
 * alone left the kernels (busier per byte than the 16-bit matvec) alternating between computing
 * and waiting: one 151936 x 1024 matrix from DRAM, 2 threads, VNNI, GB/s of weights without ->
 * with (the bf16 matvec of the same rows, untouched, in the same runs: 31-35): Q6_K 26.7 -> 34-35,
 * Q4_K 30 -> 32-35, Q8_0 29 -> 33-37; Qwen3-0.6B decode steps at 128 positions, best of 30, Q4_K_M
 * 22.8-25.1 -> 21.3-21.7 ms, Q8_0 29.0-29.1 -> 26.4-27.3 ms. 4 KiB ahead gained less, 12-24 KiB
 * ahead lost (past the 64 KiB pieces of the other thread). AVX2 kernels (RLX_CPU_ISA=avx2 on the
 * Zen 4, shapes of Qwen3-0.6B and Llama-3.2-1B from DRAM, 2 threads, two alternating runs, GB/s of
 * weights / the read probe beside it): Q4_K 0.81, 0.73 -> 0.97, 0.89; Q6_K 0.82, 0.84 -> 1.02,
 * 1.01; Q8_0 0.94, 0.94 -> 1.04, 1.08; cache-resident (1 thread) the hints cost 1-3 %. Not yet
 * measured on a machine whose best ISA is AVX2. 6 -> 9 KiB ahead, AMD EPYC Zen 4, weights through
 * 2 MiB pages, decode steps at 128 positions (ms, builds alternating): 1 thread Llama-3.2-1B
 * Q4_K_M 29.4-29.7 -> 27.5-28.1, Qwen3-0.6B Q4_K_M 16.2-16.5 -> 15.5-16.0, Q8_0 24.1-24.6 ->
 * 21.8-23.0, Q6_K 19.1-19.5 -> 17.7-17.8, Q4_0 17.1-17.2 -> 16.3-16.5, Llama under AVX2 37.6-38.0
 * -> 37.0-37.1; 2 threads, Llama (while the host's bandwidth held at its higher level) 16.8-16.9 ->
 * 15.7-16.5; 12 and 16 KiB no better at 1 thread (a 1-thread Q4_K / Q6_K matvec from DRAM, GB/s:
 * 6 KiB 28 / 31, 9 KiB 30 / 34, 12 KiB 30 / 35, 16 KiB 29-30 / 34). rlx_parallel_pieces deals
 * each thread a contiguous range of pieces first, so the hints run past a thread's own rows only
 * at its range's end. */
#define RLX_QMV_PF 9216
static inline __attribute__((always_inline)) void rlx_cpu_qmv_prefetch(const uint8_t *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + RLX_QMV_PF + o, _MM_HINT_T1);
}
/* out[m * ldo + r] = row r of W (N rows of K of dtype wt, whole blocks) . row m of the quantised
 * activations, for m < M (AVX2: 1 .. 4; AVX-512 VNNI: 1 .. 8 or 16; another M writes nothing) and r
 * in [r0, r1); each the same operations whatever M or the range. */
void rlx_cpu_qmv_avx2(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                      int64_t r0, int64_t r1);
void rlx_cpu_qmv_avx512(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                        int64_t r0, int64_t r1);
/* Fills a->tq, td, tg from rows [0, M) (M <= RLX_CPU_QMV_AMX_MAX_M) of *a for weight dtype wt (a K
 * type); AVX-512. */
void rlx_cpu_qact_tiles(const struct rlx_cpu_qact *a, int wt, int M);
/* The groups P per tile product of the AMX kernel for M rows: 2 up to 8 rows, else 1 (a tile's 16
 * columns are 16 / P rows x P groups). */
int rlx_cpu_qmv_amx_groups(int M);
/* From how many rows of `a` quant.c multiplies K types on AMX-INT8 (rlx_cpu_qmv_amx) rather than
 * with the VNNI row kernels: Qwen3-0.6B Q4_K_M, whole batched decode steps, 2 threads, Intel Xeon
 * (AMX against VNNI, alternating runs): 2 sequences 26.8 against 19.8 ms, 4 31.9 / 30.7, 8 37.0-39.9
 * / 48.4-49.0, 16 64.1 / 91.2. */
#define RLX_CPU_QMV_AMX_MIN_M 5
/* Up to how many rows (a prompt) quant.c runs the K types through that kernel, in one pass (each
 * super-block unpacked once for every 16 rows), rather than through the AMX GEMM (quant_gemm.c),
 * whose panels are unpacked per call: whole prefills, best of 5, 2 threads, Intel Xeon, GEMM ->
 * this kernel: Qwen3-0.6B Q4_K_M pp32 346 -> 543 tok/s, pp64 449 -> 565, pp96 519 -> 596, pp128
 * 552-613 -> 609-642, pp256 606 -> 632, pp512 627 -> 523 (the activations' 16-row copies, 16 KiB
 * each at K = 1024, no longer fit beside a block of weights); Llama-3.2-1B Q4_K_M pp64 242 -> 397,
 * pp128 303 -> 408, pp256 347 -> 387, pp512 369 -> 345. */
#define RLX_CPU_QMV_AMX_MAX_M 128
/* rlx_cpu_qmv_avx512's product for the K types (Q2_K .. Q6_K) on AMX-INT8 tiles, any M <=
 * RLX_CPU_QMV_AMX_MAX_M in one pass, from a->tq, td, tg (quant_amx.c); only where
 * rlx_cpu_amx_int8(). */
void rlx_cpu_qmv_amx(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                     int64_t r0, int64_t r1);
/* The most rows of `a` the lanes kernel takes (rlx_cpu_qmv_lanes, in one pass), and whether quant.c
 * multiplies M rows of block type wt through it on AVX-512 VNNI without AMX, rather than through the
 * row kernels (up to 16 rows) or the VNNI GEMM (above): 7, 8 and 11 .. 128 rows, Q8_0 5 .. 128
 * (measured: quant_lanes.c). */
#define RLX_CPU_QMV_LANES_MAX_M 128
int rlx_cpu_qmv_lanes_takes(int64_t M, int wt);
/* Fills a->tq, td, tg from rows [0, M) (M <= RLX_CPU_QMV_LANES_MAX_M) of *a for weight dtype wt (a
 * block type) for the lanes kernel: per 8 rows, each row's twice (lanes 2 i and 2 i + 1), (K / 4,
 * 16, 4) values, (K / bs, 16) scales, (K / G, 16) group terms (quant_lanes.c); AVX-512 VNNI. The
 * 32-element types' rows of q must be in natural order (not rlx_cpu_quant_arrange's). */
void rlx_cpu_qact_lanes(const struct rlx_cpu_qact *a, int wt, int M);
/* rlx_cpu_qmv_avx512's product for every block type with the activation rows in the lanes of a
 * vector, any M <= RLX_CPU_QMV_LANES_MAX_M in one pass, from a->tq, td, tg (quant_lanes.c): the VNNI
 * GEMM's function (quant_gemm.c) bit for bit; only where rlx_cpu_avx512_vnni(). */
void rlx_cpu_qmv_lanes(float *out, int64_t ldo, const struct rlx_cpu_qact *a, int M, const void *w, int wt, int64_t K,
                       int64_t r0, int64_t r1);
/* The weights of n whole blocks at src (n * bs elements, bs = 32 or 256) as signed integers v
 * (natural order) and per group of G elements (G = rlx_cpu_quant_group(wt)): the value of element
 * k is dw[k / G] * v[k] + mw[k / G] (each product exact in f32), and wsum[k / G] = sum of the
 * group's v. AVX2 code (quant_avx2.c): only where rlx_cpu_isa() >= AVX2. */
void rlx_cpu_qunpack_avx2(int8_t *v, float *dw, float *mw, int32_t *wsum, const void *src, int wt, int64_t n);
/* 16 for Q2_K, Q3_K, Q6_K (their groups of 16), else 32 */
int rlx_cpu_quant_group(int wt);
/* The activation quantisation quant.c defines, one row (quant_act.c): q (K), d (K / bs), sums of
 * each 16 q (K / 16) */
void rlx_cpu_quant_row(int8_t *q, float *d, int16_t *sums, const float *x, int64_t K, int64_t bs);
/* The AVX-512 VNNI GEMM (quant_gemm.c): out (M, N) = the rows of `a` quantised as quant.c states .
 * W^T; scratch rlx_cpu_qgemm_scratch(wt, M, K, N) floats (for the pool's thread count then). */
size_t rlx_cpu_qgemm_scratch(int wt, int64_t M, int64_t K, int64_t N);
void rlx_cpu_qgemm(float *out, const float *a, const void *w, int wt, int64_t M, int64_t K, int64_t N, float *scratch);
/* kernels.h's matmul_rows_alone (matmul.c), and its block types' (quant.c) */
int64_t rlx_cpu_matmul_rows_alone(int b_dtype, int trans_b);
int64_t rlx_cpu_matmul_quant_rows_alone(int wt);
void rlx_cpu_matmul_quant(float *out, const float *a, const void *b, int b_dtype, int64_t M, int64_t K, int64_t N,
                          float *scratch);
size_t rlx_cpu_matmul_quant_scratch(int b_dtype, int64_t M, int64_t K, int64_t N);
void rlx_cpu_embedding_quant(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d);

void rlx_cpu_matmul_f32(float *out, const float *a, const float *b, int64_t M, int64_t K, int64_t N, int trans_b);
void rlx_cpu_embedding_f32(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d);
void rlx_cpu_matmul_lowp(float *out, const float *a, const void *b, int b_dtype, int64_t M, int64_t K, int64_t N,
                         float *scratch);
size_t rlx_cpu_matmul_lowp_scratch(int64_t M, int64_t K, int64_t N);
void rlx_cpu_embedding_lowp(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d);
void rlx_cpu_convert_f32(void *dst, int dtype, const float *src, int64_t n);
void rlx_cpu_rmsnorm_f32(float *out, const float *x, const float *w, int64_t rows, int64_t d, float eps);
void rlx_cpu_add_rmsnorm_f32(float *sum, float *out, const float *a, const float *b, const float *w, int64_t rows,
                             int64_t d, float eps);
void rlx_cpu_rope_f32(float *out, const float *x, const int32_t *pos, const float *inv_freq, int64_t s, int64_t h,
                      int64_t d, int interleaved);
void rlx_cpu_softmax_f32(float *out, const float *x, int64_t rows, int64_t n);
void rlx_cpu_silu_f32(float *out, const float *x, int64_t n);
void rlx_cpu_silu_mul_f32(float *out, const float *a, const float *b, int64_t n);
void rlx_cpu_add_f32(float *out, const float *a, const float *b, int64_t n, int64_t nb);
void rlx_cpu_mul_f32(float *out, const float *a, const float *b, int64_t n, int64_t nb);
/* x (n) *= w on the calling thread, 16 lanes at a time (elementwise.c; softmax rows, attention's merge) */
void rlx_cpu_scale_inplace(float *x, float w, int64_t n);
void rlx_cpu_attention(const struct rlx_attn_args *a);
size_t rlx_cpu_attention_scratch(const struct rlx_attn_args *a);
/* moe.c */
void rlx_cpu_matmul_id(const struct rlx_matmul_id_args *a);
size_t rlx_cpu_matmul_id_scratch(const struct rlx_matmul_id_args *a);
void rlx_cpu_moe_combine_f32(float *out, const float *y, const float *probs, const int32_t *ids, int64_t S, int64_t n,
                             int64_t H, int64_t E, int norm);

#endif
