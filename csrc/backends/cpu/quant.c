/*
 * quant.c - block-type (GGUF) weights on the cpu table: the function every path computes (the
 * activations' quantisation, which quant_act.c implements, and the outputs), the scalar kernels
 * (the portable path, and the definition the vector paths follow), the threading of the decode
 * matrix-vector product, the prefill paths, and embedding_quant.
 *
 * Activations. Each row of `a` is quantised once per call, in blocks of bs = 32 elements for the
 * 32-element weight types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and bs = 256 for the K types (Q2_K ..
 * Q6_K), exactly as follows, on every path and for every M (decode and prefill compute the same
 * function up to f32 rounding and summation order):
 *   A  = the largest |x| of the block (as the bits of |x|, so a NaN or an infinity is the largest);
 *   A non-finite: d = NaN, q = 0 (the outputs the block touches become NaN);
 *   A < 2^-96:    d = 0, q = 0 (such a block counts as zero; an absolute error below 2^-96 each);
 *   otherwise     id = 127 / A, d = A / 127 (f32, each correctly rounded), q = x * id (one f32
 *                 product) rounded to the nearest integer, ties to even (|q| <= 127).
 * The element's value is q * d. Unlike llama.cpp's Q8_0 / Q8_1 / Q8_K, d stays f32 (not f16: no
 * rounding of d, no f16 overflow above A = 8.3e6 and no loss of precision in f16 subnormals below
 * A = 7.8e-3) and the rule is the same for both block sizes (Q8_K maps the signed extreme to -127;
 * here the scale is symmetric). Bound: |x - q d| <= d/2 + |x| |1 - id d| + 127 u d <= A/254 (1 + 765 u)
 * with u = 2^-24, so each output differs from the exact product with the dequantised W by at most
 * sum over blocks of A_block * (1 + 2^-14) / 254 * sum |W_block|, plus f32 rounding (kernels.h).
 * Beside q and d each row keeps: per 16 elements the sum of q (bsums, the K types' minimum and
 * offset terms), and per 32-element block s = d * sum q (the Q4_1 / Q5_1 minimum term) and
 * -off * sum q (bias, the weights' offset: Q4_0 8, Q5_0 16; the AVX2 kernels convert it and add it
 * times the block's scale in f32, the AVX-512 ones take -off * dw * s beside the minimums). Per
 * element that is 1.4 bytes: the decode kernels stream the weights from DRAM, and every byte of
 * activations that falls out of L1 (per-lane arrays of 2 bytes per element did, at K = 8192)
 * takes a line fill from the weights' stream.
 *
 * Outputs. Per block of W: integer dot products of the quantised values (exact, int32), then f32:
 *   32-element types: sum over blocks of (dw * da) * (sum (qw - off) qa) [+ mw * s]
 *   K types:          sum over blocks of (d * da) * (sum over groups sc_g * sum qw qa)
 *                                      [- (dmin * da) * (sum over groups m_g * bsum_g)]
 * with each type's group scales sc_g / minimums m_g (quants.c). The vector paths (quant_avx2.c,
 * quant_avx512.c) compute the same integers and differ only in the order of the f32 sums, except
 * the AVX2 Q4_0 / Q5_0 offset: (dw * da) * (-off * sum qa) is its own f32 term there, not part of
 * the block's integer sum (one more f32 rounding per block, inside the bound of kernels.h).
 *
 * Paths (rlx_cpu_matmul_quant): which kernels run is chosen per call from rlx_cpu_isa() and
 * rlx_cpu_avx512_vnni(), never from -march:
 *   VNNI (AVX-512 with VPDPBUSD): M <= 16 the blocked passes with quant_avx512.c's row kernels,
 *     above the GEMM of quant_gemm.c (on AMX-INT8 tiles where the machine has them: 1.45-1.6x the
 *     VNNI GEMM's prefill on the Intel Xeon) (a batched decode step of up to 16 sequences, RLX_MAX_BATCH,
 *     stays on the passes: Qwen3-0.6B Q4_K_M, 16 sequences, 2 threads, 124-146 ms per step against
 *     146 through the GEMM, whose panel unpacking is not paid back at 16 rows (Zen 4, with the rows
 *     in groups of 4; one group of 16 since: Intel Xeon 150 -> 122 ms); and each sequence then
 *     gets the bits it gets alone); except, where the machine has AMX-INT8, the K types' products
 *     of RLX_CPU_QMV_AMX_MIN_M (5) .. 16 rows: quant_amx.c's AMX kernel (rlx_cpu_qmv_amx, tile
 *     products per group; Qwen3-0.6B Q4_K_M, 2 threads, Intel Xeon: 8 sequences 48-49 -> 37-40 ms
 *     a step, 16 91 -> 64), whose f32 sums of the same integers run in another order than the
 *     row kernels': a sequence in such a batch no longer gets its bits alone (and a difference in
 *     the last bit may carry an activation of the next product across a step of its 8-bit grid:
 *     test_batching); and prompts of up to
 *     RLX_CPU_QMV_AMX_MAX_M (128) rows, in one pass (each weight unpacked once for all of them),
 *     where the GEMM's fixed cost (its panels unpacked per call) was not paid back; and where it
 *     has VNNI without AMX, every block type's products of 7, 8 and 11 .. RLX_CPU_QMV_LANES_MAX_M
 *     (128) rows, Q8_0's from 5 (rlx_cpu_qmv_lanes_takes), batches and prompts: quant_lanes.c's kernel (the
 *     activation rows in the lanes of a vector, each weight unpacked once for all of them; measured
 *     there), which computes the VNNI GEMM's function bit for bit: a sequence in a batch of such a
 *     size no longer gets its bits alone, as on AMX, but a prompt gets the GEMM's;
 *   AVX2: M <= 12 the blocked passes with quant_avx2.c's row kernels, above quant_gemm.c's AVX2
 *     GEMM; both beat dequantising panels for sgemm at every M measured, 16 .. 512.
 *     (16 sequences of Qwen3-0.6B Q4_K_M under RLX_CPU_ISA=avx2 on the Zen 4, 2 threads, ran 161 ms
 *     per step on the passes against 224 through the GEMM; left at 12 because a 16-row prompt
 *     through the AVX2 passes agrees with the NumPy emulation of the activation rounding to 1e-4
 *     in 58 % of test_quant_models' rows, against the 75 % that test holds the vector paths to);
 *   scalar: M <= 4 the blocked passes with the scalar kernels below, above sgemm on `a`
 *     quantised and dequantised (q * d in f32) and W dequantised by the dtype's to_f32.
 * Blocked passes: the pool's threads take pieces of whole 16-row blocks of weight rows (~64 KiB of
 * weights; each thread its own contiguous range of them, then what is left of the others', as
 * matmul.c's matvec (rlx_pieces, pool.h), each thread streaming its rows front to back)
 * and run every group of rows of `a` over the piece (VNNI: up to 16 rows in one pass, so a batched
 * decode step of 16 sequences unpacks each weight once; AVX2 and scalar: up to 4), so the piece
 * comes from DRAM once and from L2 for the other groups; rows of `a` in chunks of ~8 MiB of
 * quantised activations. Every output is one row's fixed sequence of operations: bitwise identical
 * across thread counts and whatever M or grouping. Each path computes the function above (the GEMM
 * and sgemm up to f32 rounding and summation order); tests/c/test_quant_kernels.c holds each to the
 * ref table.
 *
 * The figures above are whole decode steps (Zen 4 EPYC VM, 2 vCPUs shared with other jobs, so best of
 * several passes); the per-model figures against llama.cpp are in benchmarks/README.md.
 *
 * Must never allocate or fail, never let a vector path run where cpuid lacks it, never read or
 * write past the weights, `a`, out or the scratch the caller sized with matmul_quant_scratch.
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"
#include "core/core.h"
#include "core/quants.h"

#include <cblas.h>
#include <string.h>

/* Rows of `a` per call of the AVX2 and scalar row kernels (VNNI: group_rows); up to which M the
 * VNNI / AVX2 paths run the blocked passes (above: quant_gemm.c); bytes of quantised rows of `a`
 * per chunk of the blocked passes. */
#define RLX_QMV_MAX_M 4
#ifndef RLX_QMV_VNNI_MAX_M
#define RLX_QMV_VNNI_MAX_M 16
#endif
#ifndef RLX_QMV_AVX2_MAX_M
#define RLX_QMV_AVX2_MAX_M 12
#endif
#define RLX_QMV_CHUNK_BYTES  ((int64_t)8 << 20)
/* Weight rows per pool item (16 floats of out = one cache line) and bytes of weights per piece:
 * one piece is what a region's last thread may still be reading when the others are done, so
 * pieces are small. Measured on an Intel Xeon (2 threads, decode steps at 128 positions, builds
 * alternating, medians of 15 x 8 steps) 64 -> 16 KiB: Qwen3-0.6B Q4_K_M 16.0-16.2 -> 15.5-15.8 ms,
 * Llama-3.2-1B Q4_K_M 29.6-29.7 -> 28.2-28.7, Qwen3-0.6B Q8_0 24.0-24.9 -> 23.4-24.6; 1 thread and
 * batches of 2 .. 16 within the noise. (The bf16 / f32 products' 256 KiB, matmul.c, showed no
 * difference: their regions are 2-4x the bytes.) */
#define RLX_QMV_BLOCK        16
#define RLX_QMV_GRAIN_BYTES  (16 * 1024)
/* Prefill through sgemm: floats of dequantised `a` per chunk of rows, and of dequantised W per
 * panel (at least 16 rows each). */
#define RLX_QSG_A_FLOATS     (1 << 19)
#define RLX_QSG_PANEL_FLOATS (1 << 19)

/* PATH_AMX: the VNNI path with the K types' batches on AMX-INT8 tiles (rlx_cpu_qmv_amx); PATH_LANES:
 * with the batches and short prompts in the lanes kernel (rlx_cpu_qmv_lanes) */
enum { PATH_SCALAR, PATH_AVX2, PATH_VNNI, PATH_AMX, PATH_LANES };

static int64_t block_of(int wt)
{
    return wt == RLX_Q8_0 || wt == RLX_Q4_0 || wt == RLX_Q4_1 || wt == RLX_Q5_0 || wt == RLX_Q5_1 ? 32 : 256;
}

static int64_t row_bytes(int wt, int64_t K)
{
    return K / block_of(wt) * (int64_t)rlx_dtype_traits((enum rlx_dtype)wt)->type_size;
}

int rlx_cpu_quant_off(int wt) { return wt == RLX_Q4_0 ? 8 : wt == RLX_Q5_0 ? 16 : 0; }

static int path_now(void)
{
    return rlx_cpu_avx512_vnni() ? PATH_VNNI : rlx_cpu_isa() >= RLX_CPU_ISA_AVX2 ? PATH_AVX2 : PATH_SCALAR;
}

/* ---------------------------------------------------------------------------------------------
 * The quantised rows in scratch (struct rlx_cpu_qact): offsets in bytes, each array 64-aligned
 * ------------------------------------------------------------------------------------------- */

struct act_layout {
    size_t q, d, s, bsums, bias, tq, td, tg, end;
};

/* K rounded up to whole groups of 4 blocks of 32 (the arranged rows' length) */
static int64_t padded(int64_t K) { return (K + 127) / 128 * 128; }

static struct act_layout act_layout(int64_t M, int64_t K)
{
    struct act_layout l;
    const int64_t Kp = padded(K);
    size_t at = 0;
#define ARR(f, bytes) (l.f = at, at = rlx_align_up(at + (size_t)(bytes)))
    ARR(q, M * Kp);
    ARR(d, M * (K / 32) * 4);
    ARR(s, M * (K / 32) * 4);
    ARR(bsums, M * (K / 16) * 2);
    ARR(bias, M * (K / 32) * 4);
    /* the AMX kernel's copies, one per 16 rows (up to RLX_CPU_QMV_AMX_MAX_M), or the lanes kernel's,
     * one as large per 8 rows (up to RLX_CPU_QMV_LANES_MAX_M) */
    const int64_t cg = (M < RLX_CPU_QMV_AMX_MAX_M ? M + 15 : RLX_CPU_QMV_AMX_MAX_M) / 16;
    const int64_t lg = M <= RLX_CPU_QMV_LANES_MAX_M ? (M + 7) / 8 : 0, copies = cg > lg ? cg : lg;
    ARR(tq, copies * Kp * 16);
    ARR(td, copies * (K / 32) * 16 * 4);
    ARR(tg, copies * (K / 16) * 16 * 4);
#undef ARR
    l.end = at;
    return l;
}

int rlx_cpu_quant_arrange(int wt, int vnni)
{
    return vnni && (wt == RLX_Q4_0 || wt == RLX_Q4_1 || wt == RLX_Q5_0 || wt == RLX_Q5_1);
}

/* The arrays of rows of M x K in scratch, with their strides for weight dtype wt on `path`. */
static struct rlx_cpu_qact act_at(void *scratch, int64_t M, int64_t K, int wt, int path)
{
    const struct act_layout l = act_layout(M, K);
    const int arr = rlx_cpu_quant_arrange(wt, path == PATH_VNNI);
    char *p = (char *)(((uintptr_t)scratch + RLX_ALIGN - 1) & ~(uintptr_t)(RLX_ALIGN - 1)); /* whole lines */
    return (struct rlx_cpu_qact){.q = (const int8_t *)(p + l.q),
                                 .d = (const float *)(p + l.d),
                                 .s = (const float *)(p + l.s),
                                 .bsums = (const int16_t *)(p + l.bsums),
                                 .bias = (const int32_t *)(p + l.bias),
                                 .tq = (const int8_t *)(p + l.tq),
                                 .td = (const float *)(p + l.td),
                                 .tg = (const float *)(p + l.tg),
                                 .K = K,
                                 .ldq = arr ? padded(K) : K};
}

/* Quantises rows [m0, m1) of a (M, K) into the arrays of *c for weight dtype wt on `path`: q, d,
 * bsums, then what that path reads (s, bias; the VNNI order of q). */
static void act_rows(const struct rlx_cpu_qact *c, const float *a, int wt, int path, int64_t m0, int64_t m1)
{
    const int64_t K = c->K, bs = block_of(wt), nb = K / bs;
    const int vnni = path >= PATH_VNNI, off = rlx_cpu_quant_off(wt);
    for (int64_t m = m0; m < m1; m++) {
        int8_t *q = (int8_t *)c->q + m * c->ldq;
        float *d = (float *)c->d + m * nb;
        int16_t *bsums = (int16_t *)c->bsums + m * (K / 16);
        rlx_cpu_quant_row(q, d, bsums, a + m * K, K, bs);
        if (bs == 256) {
            if (vnni && (wt == RLX_Q4_K || wt == RLX_Q5_K))
                /* groups 1 and 2 of each 128 trade places: a 64-byte load then meets the low (or
                 * high) nibbles of two 32-byte chunks of weights */
                for (int64_t i = 0; i < K; i += 128) {
                    int8_t t[32];
                    memcpy(t, q + i + 32, 32);
                    memcpy(q + i + 32, q + i + 64, 32);
                    memcpy(q + i + 64, t, 32);
                }
            continue;
        }
        float *s = (float *)c->s + m * nb;
        int32_t *bias = (int32_t *)c->bias + m * nb;
        for (int64_t b = 0; b < nb; b++) {
            const int sum = bsums[2 * b] + bsums[2 * b + 1];
            s[b] = d[b] * (float)sum;
            bias[b] = -off * sum;
        }
        if (!rlx_cpu_quant_arrange(wt, path == PATH_VNNI)) continue;
        /* groups of 4 blocks as [b0 0..15, b1 0..15, b2 0..15, b3 0..15, b0 16..31, ..], zeros past K */
        for (int64_t g = 0; g < padded(K) / 128; g++) {
            int8_t t[128];
            for (int j = 0; j < 4; j++) {
                const int64_t b = 4 * g + j;
                for (int i = 0; i < 16; i++) {
                    t[16 * j + i] = b < nb ? q[32 * b + i] : 0;
                    t[64 + 16 * j + i] = b < nb ? q[32 * b + 16 + i] : 0;
                }
            }
            memcpy(q + 128 * g, t, 128);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Scalar kernels: each block unpacked to signed integer values, one integer dot product per
 * block (32-element types) or per group (K types), then f32 as the header states
 * ------------------------------------------------------------------------------------------- */

static float half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return rlx_f16_to_f32(h);
}

/* A 32-element block: v = value - offset (signed), the scale dw, the minimum mw (0 if none). */
static void unpack32(int8_t *v, float *dw, float *mw, const uint8_t *p, int wt)
{
    *dw = half(p);
    *mw = wt == RLX_Q4_1 || wt == RLX_Q5_1 ? half(p + 2) : 0.0f;
    if (wt == RLX_Q8_0) {
        memcpy(v, p + 2, 32);
        return;
    }
    const int five = wt == RLX_Q5_0 || wt == RLX_Q5_1, off = wt == RLX_Q4_0 ? 8 : wt == RLX_Q5_0 ? 16 : 0;
    const uint8_t *qs = p + (wt == RLX_Q4_0 ? 2 : wt == RLX_Q4_1 || wt == RLX_Q5_0 ? 4 + 2 * five : 8);
    uint32_t qh = 0;
    if (five) memcpy(&qh, p + (wt == RLX_Q5_0 ? 2 : 4), 4);
    for (int j = 0; j < 16; j++) {
        v[j] = (int8_t)((qs[j] & 0x0f) + (five ? (int)((qh >> j) & 1) << 4 : 0) - off);
        v[j + 16] = (int8_t)((qs[j] >> 4) + (five ? (int)((qh >> (j + 16)) & 1) << 4 : 0) - off);
    }
}

/* A K-type super-block: v (256) signed values, g16 = 1 for groups of 16 (else 32), sc / mn the
 * integer group scales / minimums, d and dmin (dmin unused where the type has no minimum). */
static void unpack256(int8_t *v, int *g16, int *sc, int *mn, float *d, float *dmin, const uint8_t *p, int wt)
{
    if (wt == RLX_Q4_K || wt == RLX_Q5_K) {
        const uint8_t *s = p + 4, *qh = p + 16, *qs = p + (wt == RLX_Q5_K ? 48 : 16);
        *g16 = 0, *d = half(p), *dmin = half(p + 2);
        for (int g = 0; g < 8; g++) {
            sc[g] = g < 4 ? s[g] & 63 : (s[g + 4] & 0x0f) | (s[g - 4] >> 6) << 4;
            mn[g] = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
            for (int l = 0; l < 32; l++) {
                const uint8_t b = qs[32 * (g / 2) + l];
                v[32 * g + l] = (int8_t)((g % 2 ? b >> 4 : b & 0x0f) + (wt == RLX_Q5_K ? ((qh[l] >> g) & 1) << 4 : 0));
            }
        }
        return;
    }
    *g16 = 1;
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        if (wt == RLX_Q6_K) {
            const uint8_t lo = p[64 * h + 32 * (k % 2) + l];
            v[e] = (int8_t)(((k >= 2 ? lo >> 4 : lo & 0x0f) | ((p[128 + 32 * h + l] >> (2 * k)) & 3) << 4) - 32);
        } else if (wt == RLX_Q3_K) {
            v[e] = (int8_t)(((p[32 + 32 * h + l] >> (2 * k)) & 3) - ((p[l] >> (4 * h + k)) & 1 ? 0 : 4));
        } else {
            v[e] = (int8_t)((p[16 + 32 * h + l] >> (2 * k)) & 3);
        }
    }
    if (wt == RLX_Q6_K) {
        for (int g = 0; g < 16; g++) sc[g] = (int8_t)p[192 + g];
        *d = half(p + 208), *dmin = 0.0f;
    } else if (wt == RLX_Q3_K) {
        const uint8_t *s = p + 96;
        for (int g = 0; g < 16; g++)
            sc[g] = ((g < 8 ? s[g] & 0x0f : s[g - 8] >> 4) | ((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
        *d = half(p + 108), *dmin = 0.0f;
    } else {
        for (int g = 0; g < 16; g++) sc[g] = p[g] & 0x0f, mn[g] = p[g] >> 4;
        *d = half(p + 80), *dmin = half(p + 82);
    }
}

/* Row w of K weights . row m of the quantised activations, the scalar way. */
static float dot_scalar(const uint8_t *w, const struct rlx_cpu_qact *a, int64_t m, int wt)
{
    const int64_t K = a->K, bs = block_of(wt), nb = K / bs;
    const size_t tb = rlx_dtype_traits((enum rlx_dtype)wt)->type_size;
    const int8_t *q = a->q + m * a->ldq;
    const float *d = a->d + m * nb;
    float acc = 0.0f;
    int8_t v[256];
    if (bs == 32) {
        const float *s = a->s + m * nb;
        for (int64_t b = 0; b < nb; b++) {
            float dw, mw;
            unpack32(v, &dw, &mw, w + (size_t)b * tb, wt);
            int isum = 0;
            for (int j = 0; j < 32; j++) isum += v[j] * q[32 * b + j];
            acc += (dw * d[b]) * (float)isum;
            if (wt == RLX_Q4_1 || wt == RLX_Q5_1) acc += mw * s[b];
        }
        return acc;
    }
    const int16_t *bsums = a->bsums + m * (K / 16);
    const int mins = wt == RLX_Q2_K || wt == RLX_Q4_K || wt == RLX_Q5_K;
    for (int64_t b = 0; b < nb; b++) {
        int g16, sc[16], mn[16];
        float dd, dmin;
        unpack256(v, &g16, sc, mn, &dd, &dmin, w + (size_t)b * tb, wt);
        const int gs = g16 ? 16 : 32;
        int isum = 0, msum = 0;
        for (int g = 0; g < 256 / gs; g++) {
            int gi = 0;
            for (int j = g * gs; j < (g + 1) * gs; j++) gi += v[j] * q[256 * b + j];
            isum += sc[g] * gi;
            if (mins) msum += mn[g] * (g16 ? bsums[16 * b + g] : bsums[16 * b + 2 * g] + bsums[16 * b + 2 * g + 1]);
        }
        acc += (dd * d[b]) * (float)isum;
        if (mins) acc -= (dmin * d[b]) * (float)msum;
    }
    return acc;
}

/* ---------------------------------------------------------------------------------------------
 * Decode (and the AVX2 prefill): pieces of weight rows dealt to the threads; within a piece, the
 * rows of `a` in groups (group_rows), so a piece (~64 KiB) is read from DRAM once and
 * then from L2 for the other groups
 * ------------------------------------------------------------------------------------------- */

/* *a with its rows starting at row m0 */
static struct rlx_cpu_qact act_part(const struct rlx_cpu_qact *a, int64_t m0, int wt)
{
    struct rlx_cpu_qact p = *a;
    p.q += m0 * a->ldq, p.d += m0 * (a->K / block_of(wt)), p.s += m0 * (a->K / 32);
    p.bsums += m0 * (a->K / 16), p.bias += m0 * (a->K / 32);
    return p;
}

struct qmv_ctx {
    float *out;
    const struct rlx_cpu_qact *a; /* the M quantised rows */
    const void *w;
    int wt, path;
    int64_t M, K, N;
};

/* Rows of `a` the next pass over a piece takes when `left` rows remain: VNNI 16, 8 or all that
 * are left (its kernels' instances: 1 .. 8 and 16), else up to RLX_QMV_MAX_M */
static int group_rows(int path, int64_t left)
{
    if (path != PATH_VNNI) return (int)(left < RLX_QMV_MAX_M ? left : RLX_QMV_MAX_M);
    return left >= 16 ? 16 : left >= 8 ? 8 : (int)left;
}

/* Weight rows [r0, r1): one piece (rlx_parallel_pieces) */
static void qmv_rows(void *p, int64_t r0, int64_t r1)
{
    const struct qmv_ctx *c = p;
    if (c->path == PATH_AMX) {
        rlx_cpu_qmv_amx(c->out, c->N, c->a, (int)c->M, c->w, c->wt, c->K, r0, r1);
        return;
    }
    if (c->path == PATH_LANES) {
        rlx_cpu_qmv_lanes(c->out, c->N, c->a, (int)c->M, c->w, c->wt, c->K, r0, r1);
        return;
    }
    for (int64_t m0 = 0, mm; m0 < c->M; m0 += mm) {
        mm = group_rows(c->path, c->M - m0);
        const struct rlx_cpu_qact a = act_part(c->a, m0, c->wt);
        float *out = c->out + m0 * c->N;
        if (c->path == PATH_VNNI) {
            rlx_cpu_qmv_avx512(out, c->N, &a, (int)mm, c->w, c->wt, c->K, r0, r1);
        } else if (c->path == PATH_AVX2) {
            rlx_cpu_qmv_avx2(out, c->N, &a, (int)mm, c->w, c->wt, c->K, r0, r1);
        } else {
            const int64_t rb = row_bytes(c->wt, c->K);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t m = 0; m < mm; m++)
                    out[m * c->N + r] = dot_scalar((const uint8_t *)c->w + r * rb, &a, m, c->wt);
        }
    }
}

/* out (M, N) = the quantised rows a . W^T, W (N, K) of dtype wt */
static void qmatvec(float *out, const struct rlx_cpu_qact *a, const void *w, int wt, int path, int64_t M, int64_t K,
                    int64_t N)
{
    const int64_t block_bytes = RLX_QMV_BLOCK * row_bytes(wt, K);
    const int64_t piece = (RLX_QMV_GRAIN_BYTES + block_bytes - 1) / block_bytes * RLX_QMV_BLOCK;
    struct qmv_ctx c = {.out = out, .a = a, .w = w, .wt = wt, .path = path, .M = M, .K = K, .N = N};
    rlx_parallel_pieces(N, piece, qmv_rows, &c);
}

/* ---------------------------------------------------------------------------------------------
 * Prefill through sgemm: chunks of rows of `a` quantised and dequantised (q * d, f32), panels of
 * W dequantised by the dtype's to_f32; the same function as the decode up to f32 rounding (the
 * dequantised values) and summation order
 * ------------------------------------------------------------------------------------------- */

static int64_t sg_rows_a(int64_t M, int64_t K)
{
    int64_t r = RLX_QSG_A_FLOATS / K;
    r = r < 16 ? 16 : r;
    return r < M ? r : M;
}

static int64_t sg_rows_w(int64_t K, int64_t N)
{
    int64_t r = RLX_QSG_PANEL_FLOATS / K;
    r = r < 16 ? 16 : r / 16 * 16;
    return r < N ? r : N;
}

/* floats: a chunk of dequantised rows, its q / d / sums, a panel */
static size_t sg_scratch(int64_t M, int64_t K, int64_t N)
{
    const int64_t mc = sg_rows_a(M, K);
    return (size_t)(mc * K + (mc * K + mc * (K / 32) * 4 + mc * (K / 16) * 2) / 4 + 16 + sg_rows_w(K, N) * K);
}

struct sg_ctx {
    float *af;
    int8_t *q;
    float *d;
    int16_t *sums;
    const float *a;
    const uint8_t *w;
    int wt;
    int64_t K;
};

static void sg_quant_rows(void *p, int64_t m0, int64_t m1)
{
    const struct sg_ctx *c = p;
    const int64_t K = c->K, bs = block_of(c->wt);
    for (int64_t m = m0; m < m1; m++) {
        int8_t *q = c->q + m * K;
        float *d = c->d + m * (K / bs), *y = c->af + m * K;
        rlx_cpu_quant_row(q, d, c->sums + m * (K / 16), c->a + m * K, K, bs);
        for (int64_t k = 0; k < K; k++) y[k] = (float)q[k] * d[k / bs];
    }
}

static void sg_dequant_rows(void *p, int64_t r0, int64_t r1)
{
    const struct sg_ctx *c = p;
    const int64_t rb = row_bytes(c->wt, c->K);
    const struct rlx_dtype_traits *t = rlx_dtype_traits((enum rlx_dtype)c->wt);
    for (int64_t r = r0; r < r1; r++) t->to_f32(c->af + r * c->K, c->w + r * rb, c->K);
}

static void matmul_sgemm(float *out, const float *a, const void *w, int wt, int64_t M, int64_t K, int64_t N,
                         float *scratch)
{
    const int64_t mc = sg_rows_a(M, K), nr = sg_rows_w(K, N), rb = row_bytes(wt, K);
    float *af = scratch, *panel = scratch + (size_t)(sg_scratch(M, K, N) - (size_t)(nr * K));
    int8_t *q = (int8_t *)(scratch + mc * K);
    float *d = (float *)(q + mc * K);
    int16_t *sums = (int16_t *)(d + mc * (K / 32));
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t mr = M - m0 < mc ? M - m0 : mc;
        struct sg_ctx c = {.af = af, .q = q, .d = d, .sums = sums, .a = a + m0 * K, .wt = wt, .K = K};
        rlx_parallel_for(mr, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP, K), sg_quant_rows, &c);
        for (int64_t n0 = 0; n0 < N; n0 += nr) {
            const int64_t rows = N - n0 < nr ? N - n0 : nr;
            struct sg_ctx pc = {.af = panel, .w = (const uint8_t *)w + n0 * rb, .wt = wt, .K = K};
            rlx_parallel_for(rows, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP / 4, K), sg_dequant_rows, &pc);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)mr, (blasint)rows, (blasint)K, 1.0f, af,
                        (blasint)K, panel, (blasint)K, 0.0f, out + m0 * N + n0, (blasint)N);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------------------------- */

/* Rows of `a` per chunk of the blocked passes (their quantised rows about 5 bytes per element; a
 * multiple of 16, so a chunk splits into whole groups of every path) */
static int64_t mv_chunk(int64_t M, int64_t K)
{
    int64_t r = RLX_QMV_CHUNK_BYTES / (5 * K) / 16 * 16;
    r = r < 16 ? 16 : r;
    return r < M ? r : M;
}

/* the path a product takes: the blocked passes (decode; every M on AVX2), the VNNI GEMM, sgemm */
enum { VIA_PASSES, VIA_QGEMM, VIA_SGEMM };

static int via(int path, int64_t M)
{
    if (path == PATH_VNNI) return M <= RLX_QMV_VNNI_MAX_M ? VIA_PASSES : VIA_QGEMM;
    if (path == PATH_AVX2) return M <= RLX_QMV_AVX2_MAX_M ? VIA_PASSES : VIA_QGEMM;
    return M <= RLX_QMV_MAX_M ? VIA_PASSES : VIA_SGEMM;
}

/* K types on AMX-INT8, RLX_CPU_QMV_AMX_MIN_M .. RLX_CPU_QMV_AMX_MAX_M rows: the AMX kernel, all the
 * rows in one pass */
static int takes_amx(int path, int64_t M, int wt)
{
    return path == PATH_VNNI && block_of(wt) == 256 && M >= RLX_CPU_QMV_AMX_MIN_M && M <= RLX_CPU_QMV_AMX_MAX_M &&
           rlx_cpu_amx_int8();
}

/* every block type on VNNI without AMX, the rows rlx_cpu_qmv_lanes_takes: the lanes kernel, in one
 * pass */
static int takes_lanes(int path, int64_t M, int wt)
{
    return path == PATH_VNNI && rlx_cpu_qmv_lanes_takes(M, wt) && !rlx_cpu_amx_int8();
}

/* The blocked passes compute each row as alone (the same operations whatever the rows beside it);
 * the AMX, lanes and GEMM kernels do not: the most rows up to which every M takes the passes. */
int64_t rlx_cpu_matmul_quant_rows_alone(int wt)
{
    const int path = path_now();
    int64_t M = 1;
    while (!takes_amx(path, M + 1, wt) && !takes_lanes(path, M + 1, wt) && via(path, M + 1) == VIA_PASSES) M++;
    return M;
}

size_t rlx_cpu_matmul_quant_scratch(int wt, int64_t M, int64_t K, int64_t N)
{
    if (M <= 0 || K <= 0 || N <= 0) return 0;
    /* the largest of the paths this M may take (the ISA a test may cap to is not an argument): the
     * passes' chunks, the AMX or lanes kernel's one pass (K types up to RLX_CPU_QMV_AMX_MAX_M /
     * RLX_CPU_QMV_LANES_MAX_M rows) */
    const int64_t one =
        RLX_CPU_QMV_AMX_MAX_M > RLX_CPU_QMV_LANES_MAX_M ? RLX_CPU_QMV_AMX_MAX_M : RLX_CPU_QMV_LANES_MAX_M;
    const int64_t mc = mv_chunk(M, K), rows = M <= one && M > mc ? M : mc;
    size_t need = (act_layout(rows, K).end + RLX_ALIGN + 3) / 4;
    if (M > RLX_QMV_MAX_M) {
        const size_t sg = sg_scratch(M, K, N), qg = rlx_cpu_qgemm_scratch(wt, M, K, N);
        need = sg > need ? sg : need;
        need = qg > need ? qg : need;
    }
    return need;
}

void rlx_cpu_matmul_quant(float *out, const float *a, const void *w, int wt, int64_t M, int64_t K, int64_t N,
                          float *scratch)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
    const int path = path_now(), amx = takes_amx(path, M, wt), lanes = takes_lanes(path, M, wt);
    const int v = amx || lanes ? VIA_PASSES : via(path, M);
    if (v == VIA_QGEMM) {
        rlx_cpu_qgemm(out, a, w, wt, M, K, N, scratch);
        return;
    }
    if (v == VIA_SGEMM) {
        matmul_sgemm(out, a, w, wt, M, K, N, scratch);
        return;
    }
    const int64_t mc = amx || lanes ? M : mv_chunk(M, K);
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t rows = M - m0 < mc ? M - m0 : mc;
        const int p = amx ? PATH_AMX : lanes ? PATH_LANES : path;
        const struct rlx_cpu_qact act = act_at(scratch, rows, K, wt, p);
        act_rows(&act, a + m0 * K, wt, p, 0, rows);
        if (p == PATH_AMX) rlx_cpu_qact_tiles(&act, wt, (int)rows);
        if (p == PATH_LANES) rlx_cpu_qact_lanes(&act, wt, (int)rows);
        qmatvec(out + m0 * N, &act, w, wt, p, rows, K, N);
    }
}

/* ---------------------------------------------------------------------------------------------
 * embedding_quant: rows converted by the dtype's to_f32 (bit-exact with the ref table)
 * ------------------------------------------------------------------------------------------- */

struct qemb_ctx {
    float *out;
    const uint8_t *table;
    const int32_t *ids;
    int64_t d, rb;
    void (*to_f32)(float *, const void *, int64_t);
};

static void qemb_rows(void *p, int64_t begin, int64_t end)
{
    const struct qemb_ctx *c = p;
    for (int64_t r = begin; r < end; r++) c->to_f32(c->out + r * c->d, c->table + (int64_t)c->ids[r] * c->rb, c->d);
}

/* out (n, d) f32 = rows ids (n) of table (V, d) of a block type, converted by its to_f32 */
void rlx_cpu_embedding_quant(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d)
{
    struct qemb_ctx c = {.out = out,
                         .table = table,
                         .ids = ids,
                         .d = d,
                         .rb = row_bytes(dtype, d),
                         .to_f32 = rlx_dtype_traits((enum rlx_dtype)dtype)->to_f32};
    rlx_parallel_for(n, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP / 8, d), qemb_rows, &c);
}
