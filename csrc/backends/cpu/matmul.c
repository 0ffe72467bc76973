/*
 * matmul.c - the cpu table's matrix products, f32 and 16-bit (bf16 / f16) weights.
 *
 * Decode (f32 weights: M <= RLX_MV_MAX_M rows of `a`; 16-bit: M <= RLX_MV_PASSES_MAX_M; weights b
 * (N, K) row-contiguous) is a matrix-vector product bound by how fast the weights stream from
 * DRAM: the rows are cut into pieces of ~256 KiB (whole blocks of 16 rows, so no two threads write
 * one cache line of out), each thread takes the pieces of its own contiguous range, then what is
 * left of the others' (rlx_pieces, pool.h), and each thread walks its rows one
 * at a time, front to back, so its weights are one sequential stream (reading four rows at once,
 * four streams 4 KiB apart, measured 2-4x slower from DRAM here; software prefetch a row ahead
 * measured 10-20% slower too); a group's x rows (at most 4 x K floats) stay in L1. For bf16 weights the contract rounds `a`
 * to bf16 first, once per call into scratch. Where the machine has AVX512_BF16, `a` is packed to
 * bf16 halves and VDPBF16PS multiplies 32 weights per instruction (exact products of two bf16
 * values, f32 sums; subnormals count as zero, as in the GEMM): measured in the Llama-3.2-1B bf16
 * decode beside llama.cpp, 2 threads, one process, alternating blocks of 6 steps, the step went
 * from 0.92x llama.cpp's speed (widen + FMA) to 1.04x (53.5 vs 56 ms, ~46 GB/s of weights): the
 * widening instructions kept a core from issuing its share of DRAM reads. Elsewhere 16-bit
 * weights are widened in registers (bf16: bits << 16; f16: vcvtph2ps), products accumulate in
 * f32 with FMA (bf16: `a` rounded as floats, so the products are the same exact ones).
 * Products of up to RLX_MV_PASSES_MAX_M = 16 rows (a batched decode step of up to RLX_MAX_BATCH
 * sequences) run as the matvec, each block of 16 weight rows read from DRAM once for every group
 * of up to 4 rows of `a`: measured faster than both the GEMM below (which then packed the weights)
 * and widen + sgemm there (Qwen3-0.6B bf16, 2 threads, a step of 8 / 12 / 16 sequences: 96 / 120 /
 * 169 ms, against 100 / - / 195 ms through the GEMM above 8 rows and 162 ms (49.4 tok/s, the
 * bench_batch record) for 8 rows as separate passes of 4 that read the weights twice). A row's
 * result is the same sequence of operations whatever M, so a sequence decoded in a batch gets the
 * bits it gets alone. Where the machine has AMX, bf16 products of more than RLX_MV_AMX_MAX_M = 6
 * rows take the AMX GEMM instead (2x the passes' speed at 16 rows; a row then differs from its
 * product alone by f32 summation order); where it has AVX512_BF16 without AMX, more than
 * RLX_MV_BF16_MAX_M = 3 rows take the VDPBF16PS GEMM (since it reads the weights where they lie,
 * 2026-12-06: 1.1-1.5x the passes' speed at 12 rows, 1.5-1.8x at 16; 4 .. 8 rows with 8 rows x 2
 * pairs of k in its lanes, 2026-12-07: 1.2-1.7x at 4 and 8; the same summation-order difference).
 *
 * Prefill (more rows), bf16 weights on a machine with AVX512_BF16: gemm_bf16.c (`a` rounded to
 * bf16 and packed, weights read where they lie, VDPBF16PS, our pool's threads; on a
 * machine with AMX, tiles multiply the weights where they lie: 4-8x the VDPBF16PS kernel there).
 * 16-bit weights where AVX2 is the best ISA: gemm16_avx2.c on our pool (`a` rounded to bf16 and
 * arranged in chunks of rows for bf16 weights; weights widened in registers, not packed). Measured
 * on the Zen 4 under RLX_CPU_ISA=avx2 with OPENBLAS_CORETYPE=Haswell (what a Zen 3 runs), against
 * widen + sgemm below: the product alone (weights in L3, Qwen3-0.6B shapes, M = 128 / 512) 81-93 /
 * 152-169 GFLOP/s at 1 / 2 threads against 90-100 / 132-182; whole prefills, builds alternated over
 * 3 runs, tok/s: Llama-3.2-1B bf16 pp128 67-68 (once 35) -> 76-82, pp512 66-73 (once 36) -> 76-82;
 * Qwen3-0.6B bf16 pp128 151-169 -> 148-169, pp512 129-155 -> 144-170: about the same kernel speed,
 * without OpenBLAS's threads spinning against the pool's (attention, norms) between the products
 * (the runs at half speed).
 * Otherwise OpenBLAS: f32 straight to sgemm; 16-bit weights panel by panel,
 * each panel of rows of b widened into `scratch` on the calling thread and handed to sgemm,
 * which runs its own threads (bf16: chunks of rows of `a` rounded into scratch first). Widening is
 * a few percent of the panel's sgemm time at M >= 16;
 * keeping it off the pool means no pool worker spins while OpenBLAS starts, and OpenBLAS's own
 * threads (which spin, yielding, for a while after each sgemm) never delay a pool region here.
 *
 * Measured before gemm_bf16.c read the weights in place (it packed them then), bf16 weights,
 * GFLOP/s (/tmp/gbb/bench.c: Zen 4 EPYC, 2 vCPUs, at a quiet moment
 * (load < 1); best of 5; Qwen3-0.6B shapes K -> N = 1024 -> 2048 / 1024 / 3072, 3072 -> 1024;
 * the weights (2-6 MB) stay in L3 between repetitions), 1 thread / 2 threads:
 *   M = 512:  gemm_bf16 186-199 / 381-412   (widen+sgemm 76-93 / 81-152, f32 sgemm 84-99 / 140-183)
 *   M = 128:  gemm_bf16 175-193 / 370-384   (widen+sgemm 70-80 / 80-98,  f32 sgemm 75-84 / 140-155)
 *   M =  16:  gemm_bf16 105-109 / 204-211   matvec passes 49-85 / 92-161
 *   M =   8:  gemm_bf16  75-78  / 136-153   matvec passes 50-88 / 92-181
 *   M =   6:  gemm_bf16  52-58  / 103-108   matvec passes 50-83 / 97-120
 *   M =   5:  gemm_bf16  44-48  /  87-91    matvec passes 49-79 / 93-118
 * (widen+sgemm at M = 5..16: 11-30 / 10-46). With the weights in L3 the passes and the GEMM are
 * about even at M = 7-8 and the GEMM ahead at 16; in a model the weights come from DRAM, which the
 * grouped matvec reads once (above). Without AVX512_BF16 the passes beat widen+sgemm by 2-4x at
 * M <= 8 too.
 * Measured (/tmp/bench_kernels.c: AMD EPYC Zen 4, 2 vCPUs, OpenBLAS 0.3.21 pthreads; weights
 * rotated over >= 256 MB of random data; best of 7). The machine was shared with other jobs
 * (load average 8-12 on 2 cores) throughout, so 2 threads never beat 1 and a plain one-stream
 * read ran at 11-18 GB/s, not the 40-50 GB/s of an idle machine; runs differed by up to 2x.
 * GB/s of weights, 1 thread / 2 threads:
 *   shape (K -> N)          f32 rlx      f32 sgemv    bf16 rlx
 *   qwen   1024 -> 2048      8.7 /  8.5  13.2 / 13.4  17.3 / 14.6
 *   qwen   1024 -> 1024     12.5 /  9.4  13.6 / 13.7  20.1 / 11.3
 *   qwen   1024 -> 3072     14.8 / 13.3  16.8 / 16.8  21.2 / 16.7
 *   qwen   3072 -> 1024     15.9 / 14.4  20.0 / 19.7  14.8 / 10.8
 *   qwen   1024 -> 151936   17.7 / 18.2  16.8 / 17.5  20.2 / 20.5
 *   llama  2048 -> 2048     19.2 / 13.9  14.6 /  9.2  14.8 / 12.3
 *   llama  2048 -> 512      12.2 /  9.9  14.5 / 12.9  11.3 /  6.6
 *   llama  2048 -> 8192     10.0 / 10.0  10.6 / 10.3  18.6 / 17.8
 *   llama  8192 -> 2048     15.2 / 15.1  18.9 / 19.5   7.9 /  8.5
 *   llama  2048 -> 128256   16.2 / 17.2  14.4 / 19.4  20.2 / 20.3
 * An earlier run of the same f32 pair had rlx ahead on most of these shapes: within this noise
 * the two are even. f32 decode keeps the own matvec for what sgemv lacks: bitwise-identical
 * results across thread counts, M up to 4 in one pass over the weights, pieces dealt
 * dynamically (a descheduled thread does not stall the product) and no hand-over to OpenBLAS's
 * threads, which spin after each call. Re-measure on an idle machine before trusting a ratio.
 *
 * Results: every output element of the matvec path is one row's dot product summed in a fixed
 * order (16 lanes over K, then a fixed lane reduction), whatever the thread count or how rows
 * are grouped, so decode results are bitwise identical across thread counts. So are the GEMM's
 * (gemm_bf16.c). The sgemm paths are OpenBLAS's: equal up to float rounding from its summation
 * order. Every bf16 path computes the same function (bf16(a) . b, f32 sums) up to summation order.
 *
 * Must never allocate, must never hand OpenBLAS an empty dimension (its argument checker would
 * print), and must never let the vector paths run on a machine whose cpuid lacks them.
 */
#include "backends/cpu/cpu.h"

#include "core/core.h"
#include "backends/cpu/pool.h"

#include <cblas.h>
#include <immintrin.h>
#include <string.h>

/* Rows of `a` one matvec kernel instance takes (a group); a matvec call takes up to
 * RLX_MV_PASSES_MAX_M rows, groups of RLX_MV_MAX_M over each block of weight rows in turn, so the
 * block comes from DRAM once and from L1 / L2 for the other groups. f32 products of more than
 * RLX_MV_MAX_M rows go to sgemm (measured: a batched decode step of 8 sequences of Qwen3-0.6B with
 * f32 weights costs 4 times one sequence's there; the grouped matvec would read the weights once,
 * but f32 weights are the reference dtype whose prefill results the tests pin to sgemm's). */
#define RLX_MV_MAX_M       4
/* Weight rows per pool item: 16 floats of out = one cache line. */
#define RLX_MV_BLOCK       16
/* Bytes of weights per piece of rows a thread takes at a time (about 10 us of one thread's
 * bandwidth: the atomic that takes a piece costs nothing next to it). */
#define RLX_MV_GRAIN_BYTES (256 * 1024)
/* Floats of b widened per sgemm panel (4 MiB; f16 weights); the panel holds at least 16 rows. */
#define RLX_PANEL_FLOATS   (1 << 20)
/* bf16 weights without AVX512_BF16: floats of `a` rounded to bf16 per chunk, and of b widened per
 * panel after it (2 MiB each; at least 16 rows each), so both dtypes fit in the same scratch. */
#define RLX_ROUND_FLOATS   (1 << 19)
/* Rows of `a` up to which a 16-bit product runs as passes of the matvec (RLX_MV_MAX_M rows
 * each) over the weights. */
#ifndef RLX_MV_PASSES_MAX_M
#define RLX_MV_PASSES_MAX_M 16
#endif
/* The same for bf16 weights where the machine has AMX: above it the AMX GEMM (gemm_bf16.c), which
 * reads each weight once for all the rows and multiplies 16 of them per tile. Measured on the
 * Intel Xeon, 2 threads, whole batched decode steps (B sequences, one row each), aggregate tok/s,
 * passes / AMX GEMM: Llama-3.2-1B bf16 B = 1 11.0 / 6.5, 2 21.1 / 12.9, 4 33.1 / 25.6, 5 33.5 /
 * 31.1, 6 39.5 / 36.9, 7 38.3 / 42.7, 8 40.6 / 49.5, 16 46.8 / 98.6; Qwen3-0.6B bf16 B = 4 68.8 /
 * 60.9, 8 83.1 / 110.4, 16 99.3 / 177.5 (llama.cpp's own batched decode of Llama-3.2-1B at B = 16:
 * 53.6). At one row the tiles stream the weights at 0.6x the passes' speed (16 rows of W read at
 * once, K * 2 bytes apart), so the passes keep the smaller batches. */
#define RLX_MV_AMX_MAX_M  6
/* The same for bf16 weights where the machine has AVX512_BF16 but not AMX: above it the
 * VDPBF16PS GEMM (gemm_bf16.c), which reads each weight once for all the rows, broadcast against
 * 16 rows of `a` a vector, or up to 8 rows x 2 pairs of k (its lanes path, 4 .. 8 rows). Measured
 * on the Zen 4 EPYC, 2 threads, whole batched decode steps of Qwen3-0.6B bf16 (ms a step, passes /
 * GEMM): 16 sequences 131-140 / 78-86, 12 92-109 / 74-81, 8 83-94 / 71-92, 6 67-86 / 71-81, 4
 * 53-57 / 73-99, 2 37-39 / 64-91; with the lanes path (2026-12-07, alternating, a host at its low
 * read bandwidth: B = 1 38.6-41.0 ms): 8 72.5-90.1 / 55.7-74.4, 6 67.5 / 57.4, 5 65.1 / 54.8;
 * Llama-3.2-1B bf16 8 169-181 / 137-150. With the lanes path's weight pairs broadcast straight from
 * the rows (gemm_bf16.c, 2026-12-07, builds alternating, 2 threads): Qwen3-0.6B bf16 4 44.3-45.1 /
 * 37.8-39.4, 3 37.4-37.8 / 36.6-38.3; Llama-3.2-1B bf16 4 87.6-88.8 / 71.2-72.1, 3 72.5-73.3 /
 * 70.3-71.4. At 3 rows and fewer the passes keep their exactness (a row's bits those it gets alone)
 * for a few percent at most. */
#define RLX_MV_BF16_MAX_M 3

/* ---------------------------------------------------------------------------------------------
 * Matvec kernels: out[m * N + r] = sum_k a[m * K + k] * b[r * K + k] for rows r of a range,
 * m < M <= 4, b of dtype wt (RLX_F32, RLX_BF16, RLX_F16). The work for one (row, m) is the same
 * sequence of operations whatever M or the range, so a result never depends on its neighbours.
 * ------------------------------------------------------------------------------------------- */

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"), always_inline)) static inline
#define AVX2_FN   __attribute__((target("avx2,f16c,fma"), always_inline)) static inline

/* 16 weights from element i of b, widened */
AVX512_FN __m512 ld_512(const void *b, int wt, int64_t i)
{
    if (wt == RLX_F32) return _mm512_loadu_ps((const float *)b + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)b + i));
    if (wt == RLX_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* the lanes of mask m of the 16 weights from element i (others 0) */
AVX512_FN __m512 ld_512_mask(const void *b, int wt, int64_t i, __mmask16 m)
{
    if (wt == RLX_F32) return _mm512_maskz_loadu_ps(m, (const float *)b + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)b + i);
    if (wt == RLX_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* out[m * ldo + r] for m < M (M <= 4, a constant after inlining): row r of b read once, front
 * to back, into four accumulators per m (16-float slices k % 64 / 16), masked tail into the
 * first; summed (acc0 + acc1) + (acc2 + acc3), then across lanes. */
AVX512_FN void mv_row_512(float *out, int64_t ldo, const float *a, const void *b, int wt, int64_t K, int64_t r,
                          const int M)
{
    const void *row =
        wt == RLX_F32 ? (const void *)((const float *)b + r * K) : (const void *)((const uint16_t *)b + r * K);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[u][m] =
        _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
        {
            const __m512 w = ld_512(row, wt, k + 16 * u);
            _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[u][m] =
                _mm512_fmadd_ps(w, _mm512_loadu_ps(a + m * K + k + 16 * u), acc[u][m]);
        }
    for (; k + 16 <= K; k += 16) {
        const __m512 w = ld_512(row, wt, k);
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[0][m] =
            _mm512_fmadd_ps(w, _mm512_loadu_ps(a + m * K + k), acc[0][m]);
    }
    if (k < K) {
        const __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
        const __m512 w = ld_512_mask(row, wt, k, mk);
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[0][m] =
            _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mk, a + m * K + k), acc[0][m]);
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) out[m * ldo + r] =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]), _mm512_add_ps(acc[2][m], acc[3][m])));
}

AVX512_FN void mv_range_512(float *out, const float *a, const void *b, int wt, int64_t K, int64_t N, int64_t r0,
                            int64_t r1, const int M)
{
    for (int64_t r = r0; r < r1; r++) mv_row_512(out, N, a, b, wt, K, r, M);
}

/* One instance per (weight dtype, M): the loops above then hold constants only. */
__attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma"))) static void
mv_rows_512(float *out, const float *a, const void *b, int wt, int64_t M, int64_t K, int64_t N, int64_t r0, int64_t r1)
{
#define MV_CASE(WT, MM)                                                                                                \
    case (WT)*8 + (MM): mv_range_512(out, a, b, WT, K, N, r0, r1, MM); break;
    switch (wt * 8 + (int)M) {
        MV_CASE(RLX_F32, 1)
        MV_CASE(RLX_F32, 2)
        MV_CASE(RLX_F32, 3)
        MV_CASE(RLX_F32, 4)
        MV_CASE(RLX_BF16, 1)
        MV_CASE(RLX_BF16, 2)
        MV_CASE(RLX_BF16, 3)
        MV_CASE(RLX_BF16, 4)
        MV_CASE(RLX_F16, 1)
        MV_CASE(RLX_F16, 2)
        MV_CASE(RLX_F16, 3)
        MV_CASE(RLX_F16, 4)
    default: break;
    }
#undef MV_CASE
}

/* bf16 weights with AVX512_BF16: `a` packed to bf16 (M x K halves) and VDPBF16PS over pairs of
 * k, 32 weights per instruction: half the instructions of widen + FMA per byte of weights, which
 * is what lets one core keep its share of DRAM bandwidth busy. Each 64-byte load also asks for the
 * line rlx_cpu_bf16_prefetch() bytes ahead in the stream (lowp.c has the distances measured per
 * machine: 6 KiB on the Intel Xeon, where it took a 512 MiB matvec from 0.84x the read probe to
 * 0.98-1.0x and Qwen3-0.6B bf16 decode @128 from 12.4 to 14.2-15.7 tok/s; 2 KiB on the Zen 4,
 * where 6 KiB had made 1-thread steps 1.2x slower than 2 KiB).
 * out[m * ldo + r] for m < M (M <= 4):
 * four accumulators per m (32-weight slices k % 128 / 32), masked tail into the first, summed
 * (acc0 + acc1) + (acc2 + acc3), then across lanes. */
#define DP_FN __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"), always_inline)) static inline

DP_FN __m512 dp(__m512 acc, __m512i a, __m512i w) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)w); }

DP_FN void mv_row_dp(float *out, int64_t ldo, const uint16_t *a, const uint16_t *b, int64_t K, int64_t r, int64_t pf,
                     const int M)
{
    const uint16_t *row = b + r * K;
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[u][m] =
        _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 128 <= K; k += 128) _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
        {
            _mm_prefetch((const char *)(row + k + 32 * u) + pf, _MM_HINT_T1);
            const __m512i w = _mm512_loadu_si512(row + k + 32 * u);
            _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[u][m] =
                dp(acc[u][m], _mm512_loadu_si512(a + m * K + k + 32 * u), w);
        }
    for (; k + 32 <= K; k += 32) {
        const __m512i w = _mm512_loadu_si512(row + k);
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[0][m] =
            dp(acc[0][m], _mm512_loadu_si512(a + m * K + k), w);
    }
    if (k < K) {
        const __mmask32 mk = (__mmask32)((1ull << (K - k)) - 1);
        const __m512i w = _mm512_maskz_loadu_epi16(mk, row + k);
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[0][m] =
            dp(acc[0][m], _mm512_maskz_loadu_epi16(mk, a + m * K + k), w);
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) out[m * ldo + r] =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][m], acc[1][m]), _mm512_add_ps(acc[2][m], acc[3][m])));
}

DP_FN void mv_range_dp(float *out, const uint16_t *a, const uint16_t *b, int64_t K, int64_t N, int64_t r0, int64_t r1,
                       int64_t pf, const int M)
{
    for (int64_t r = r0; r < r1; r++) mv_row_dp(out, N, a, b, K, r, pf, M);
}

__attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"))) static void mv_rows_dp(float *out, const uint16_t *a,
                                                                                       const uint16_t *b, int64_t M,
                                                                                       int64_t K, int64_t N, int64_t r0,
                                                                                       int64_t r1, int64_t pf)
{
    switch ((int)M) {
    case 1: mv_range_dp(out, a, b, K, N, r0, r1, pf, 1); break;
    case 2: mv_range_dp(out, a, b, K, N, r0, r1, pf, 2); break;
    case 3: mv_range_dp(out, a, b, K, N, r0, r1, pf, 3); break;
    case 4: mv_range_dp(out, a, b, K, N, r0, r1, pf, 4); break;
    default: break;
    }
}

/* 8 weights from element i of b, widened */
AVX2_FN __m256 ld_256(const void *b, int wt, int64_t i)
{
    if (wt == RLX_F32) return _mm256_loadu_ps((const float *)b + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)b + i));
    if (wt == RLX_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

AVX2_FN float hsum_256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float widen_one(const void *b, int wt, int64_t i)
{
    if (wt == RLX_F32) return ((const float *)b)[i];
    const uint16_t h = ((const uint16_t *)b)[i];
    return wt == RLX_BF16 ? rlx_bf16_to_f32(h) : rlx_f16_to_f32(h);
}

/* out[m * ldo + r] for m < M (M <= 4): as mv_row_512 with four 8-float accumulators (slices
 * k % 32 / 8), summed (acc0 + acc1) + (acc2 + acc3) across lanes, then a scalar tail in k order. */
AVX2_FN void mv_row_256(float *out, int64_t ldo, const float *a, const void *b, int wt, int64_t K, int64_t r,
                        const int M)
{
    const void *row =
        wt == RLX_F32 ? (const void *)((const float *)b + r * K) : (const void *)((const uint16_t *)b + r * K);
    __m256 acc[4][4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[u][m] =
        _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
        {
            const __m256 w = ld_256(row, wt, k + 8 * u);
            _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[u][m] =
                _mm256_fmadd_ps(w, _mm256_loadu_ps(a + m * K + k + 8 * u), acc[u][m]);
        }
    for (; k + 8 <= K; k += 8) {
        const __m256 w = ld_256(row, wt, k);
        _Pragma("GCC unroll 4") for (int m = 0; m < M; m++) acc[0][m] =
            _mm256_fmadd_ps(w, _mm256_loadu_ps(a + m * K + k), acc[0][m]);
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
    {
        float s = hsum_256(_mm256_add_ps(_mm256_add_ps(acc[0][m], acc[1][m]), _mm256_add_ps(acc[2][m], acc[3][m])));
        for (int64_t t = k; t < K; t++) s += a[m * K + t] * widen_one(row, wt, t);
        out[m * ldo + r] = s;
    }
}

AVX2_FN void mv_range_256(float *out, const float *a, const void *b, int wt, int64_t K, int64_t N, int64_t r0,
                          int64_t r1, const int M)
{
    for (int64_t r = r0; r < r1; r++) mv_row_256(out, N, a, b, wt, K, r, M);
}

__attribute__((target("avx2,f16c,fma"))) static void
mv_rows_256(float *out, const float *a, const void *b, int wt, int64_t M, int64_t K, int64_t N, int64_t r0, int64_t r1)
{
#define MV_CASE(WT, MM)                                                                                                \
    case (WT)*8 + (MM): mv_range_256(out, a, b, WT, K, N, r0, r1, MM); break;
    switch (wt * 8 + (int)M) {
        MV_CASE(RLX_F32, 1)
        MV_CASE(RLX_F32, 2)
        MV_CASE(RLX_F32, 3)
        MV_CASE(RLX_F32, 4)
        MV_CASE(RLX_BF16, 1)
        MV_CASE(RLX_BF16, 2)
        MV_CASE(RLX_BF16, 3)
        MV_CASE(RLX_BF16, 4)
        MV_CASE(RLX_F16, 1)
        MV_CASE(RLX_F16, 2)
        MV_CASE(RLX_F16, 3)
        MV_CASE(RLX_F16, 4)
    default: break;
    }
#undef MV_CASE
}

/* The portable path: one row at a time, f32 accumulation in k order. */
static void mv_rows_scalar(float *out, const float *a, const void *b, int wt, int64_t M, int64_t K, int64_t N,
                           int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t m = 0; m < M; m++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += a[m * K + k] * widen_one(b, wt, r * K + k);
            out[m * N + r] = s;
        }
}

struct mv_ctx {
    float *out;
    const float *a;
    const uint16_t *a16; /* bf16 weights on AVX512_BF16: a packed to bf16 (M x K) */
    const void *b;
    int wt, isa;
    int64_t M, K, N;
    int64_t pf; /* bytes ahead the VDPBF16PS rows prefetch (rlx_cpu_bf16_prefetch) */
};

/* One piece of rows [p0, p1) (rlx_parallel_pieces) */
static void mv_piece(void *p, int64_t p0, int64_t p1)
{
    const struct mv_ctx *c = p;
    if (c->isa < RLX_CPU_ISA_AVX2 && !c->a16) {
        mv_rows_scalar(c->out, c->a, c->b, c->wt, c->M, c->K, c->N, p0, p1);
        return;
    }
    /* each block of weight rows for every group of up to 4 rows of a */
    for (int64_t r0 = p0; r0 < p1; r0 += RLX_MV_BLOCK) {
        const int64_t r1 = r0 + RLX_MV_BLOCK < p1 ? r0 + RLX_MV_BLOCK : p1;
        for (int64_t m0 = 0; m0 < c->M; m0 += RLX_MV_MAX_M) {
            const int64_t mm = c->M - m0 < RLX_MV_MAX_M ? c->M - m0 : RLX_MV_MAX_M;
            float *out = c->out + m0 * c->N;
            if (c->a16)
                mv_rows_dp(out, c->a16 + m0 * c->K, c->b, mm, c->K, c->N, r0, r1, c->pf);
            else if (c->isa >= RLX_CPU_ISA_AVX512)
                mv_rows_512(out, c->a + m0 * c->K, c->b, c->wt, mm, c->K, c->N, r0, r1);
            else
                mv_rows_256(out, c->a + m0 * c->K, c->b, c->wt, mm, c->K, c->N, r0, r1);
        }
    }
}

/* out (M, N) = a (M, K) @ b^T, b (N, K) of dtype wt; 1 <= M <= RLX_MV_PASSES_MAX_M, K >= 1; a16: a
 * packed to bf16 for VDPBF16PS (bf16 weights on AVX512_BF16 only), else NULL and `a` is used.
 * Pieces of whole 16-row blocks holding about RLX_MV_GRAIN_BYTES of weights; one task per pool
 * thread while there are at least two pieces per task. */
static void matvec(float *out, const float *a, const uint16_t *a16, const void *b, int wt, int isa, int64_t M,
                   int64_t K, int64_t N)
{
    const int64_t block_bytes = RLX_MV_BLOCK * K * (wt == RLX_F32 ? 4 : 2);
    const int64_t piece = (RLX_MV_GRAIN_BYTES + block_bytes - 1) / block_bytes * RLX_MV_BLOCK;
    struct mv_ctx c = {.out = out, .a = a, .a16 = a16, .b = b, .wt = wt, .isa = isa, .M = M, .K = K, .N = N};
    c.pf = a16 ? rlx_cpu_bf16_prefetch() : 0;
    rlx_parallel_pieces(N, piece, mv_piece, &c);
}

/* ---------------------------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------------------------- */

/* out (M, N) = a (M, K) @ b, with b (N, K) read transposed when trans_b, else b (K, N). */
void rlx_cpu_matmul_f32(float *out, const float *a, const float *b, int64_t M, int64_t K, int64_t N, int trans_b)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
    if (trans_b && M <= RLX_MV_MAX_M) {
        matvec(out, a, NULL, b, RLX_F32, rlx_cpu_isa(), M, K, N);
        return;
    }
    /* the first pool use applies RLX_NUM_THREADS to OpenBLAS too */
    (void)rlx_pool_threads();
    if (M == 1 && !trans_b) {
        /* out (N) = b (K, N)^T @ a (K) */
        cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)K, (blasint)N, 1.0f, b, (blasint)N, a, 1, 0.0f, out, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K,
                1.0f, a, (blasint)K, b, trans_b ? (blasint)K : (blasint)N, 0.0f, out, (blasint)N);
}

/* Rows of b per widened panel: about `floats` floats, at least 16 rows, at most N. */
static int64_t panel_rows(int64_t K, int64_t N, int64_t floats)
{
    int64_t rows = floats / (K > 0 ? K : 1);
    rows = rows < 16 ? 16 : rows / 16 * 16;
    return rows < N ? rows : N;
}

/* Rows of `a` per chunk rounded to bf16 ahead of the widened panels: about RLX_ROUND_FLOATS
 * floats, at least 16 rows, at most M. */
static int64_t round_rows(int64_t M, int64_t K)
{
    int64_t rows = RLX_ROUND_FLOATS / K;
    rows = rows < 16 ? 16 : rows;
    return rows < M ? rows : M;
}

/* The largest of what any path may need (neither the dtype nor the ISA a test may cap to is an
 * argument): the matvec's rounded a (bf16); the widened panel (f16); a chunk of rounded
 * rows of a and the panel after it (bf16 without AVX512_BF16); the GEMM's packing (bf16 with
 * AVX512_BF16). About 4 MiB for the shapes of small LLMs (more when 16 rows of K exceed it). */
size_t rlx_cpu_matmul_lowp_scratch(int64_t M, int64_t K, int64_t N)
{
    if (M <= 0 || K <= 0 || N <= 0) return 0;
    if (M <= RLX_MV_PASSES_MAX_M) {
        const size_t gb = rlx_cpu_gemm_bf16_scratch(M, K, N); /* bf16 with AVX512_BF16: the GEMM */
        return gb > (size_t)(M * K) ? gb : (size_t)(M * K);
    }
    size_t need = (size_t)(panel_rows(K, N, RLX_PANEL_FLOATS) * K);
    const size_t sg = (size_t)((round_rows(M, K) + panel_rows(K, N, RLX_ROUND_FLOATS)) * K);
    const size_t gb = rlx_cpu_gemm_bf16_scratch(M, K, N);
    need = sg > need ? sg : need;
    return gb > need ? gb : need;
}

/* Rows of `a` up to which a 16-bit product runs as passes of the matvec on this machine. */
static int64_t lowp_passes(int bf16, int isa)
{
    return !bf16                            ? RLX_MV_PASSES_MAX_M
           : isa >= RLX_CPU_ISA_AMX         ? RLX_MV_AMX_MAX_M
           : isa >= RLX_CPU_ISA_AVX512_BF16 ? RLX_MV_BF16_MAX_M
                                            : RLX_MV_PASSES_MAX_M;
}

/* The matvec and its passes compute each row as alone, whatever M (up to where they stop); sgemm,
 * the GEMMs and the AMX / lanes kernels do not. Transposed f32 (its matvec) up to RLX_MV_MAX_M
 * rows; b (K, N) f32 always through OpenBLAS (sgemv at one row, sgemm beyond): one row at a time. */
int64_t rlx_cpu_matmul_rows_alone(int b_dtype, int trans_b)
{
    if (b_dtype == RLX_F32) return trans_b ? RLX_MV_MAX_M : 1;
    if (b_dtype == RLX_BF16 || b_dtype == RLX_F16) return lowp_passes(b_dtype == RLX_BF16, rlx_cpu_isa());
    return rlx_cpu_matmul_quant_rows_alone(b_dtype);
}

/* out (M, N) = a (M, K) @ b^T, b (N, K) bf16 / f16 widened exactly, a rounded to bf16 first for
 * bf16 weights; scratch: rlx_cpu_matmul_lowp_scratch(M, K, N) floats. */
void rlx_cpu_matmul_lowp(float *out, const float *a, const void *bv, int b_dtype, int64_t M, int64_t K, int64_t N,
                         float *scratch)
{
    const uint16_t *b = bv; /* raw bf16 / f16 halves */
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
    const int bf16 = b_dtype == RLX_BF16, isa = rlx_cpu_isa();
    if (M <= lowp_passes(bf16, isa)) {
        /* the matvec (groups of up to RLX_MV_MAX_M rows per block of weights); bf16: a rounded once
         * (packed to bf16 halves for VDPBF16PS where the machine has it) */
        uint16_t *a16 = NULL;
        if (bf16 && isa >= RLX_CPU_ISA_AVX512_BF16) {
            a16 = (uint16_t *)scratch;
            rlx_cpu_pack_bf16(a16, a, M * K);
        } else if (bf16) {
            rlx_cpu_round_bf16(scratch, a, M * K);
            a = scratch;
        }
        matvec(out, a, a16, b, b_dtype, isa, M, K, N);
        return;
    }
    if (bf16 && isa >= RLX_CPU_ISA_AVX512_BF16) {
        rlx_cpu_gemm_bf16(out, a, b, M, K, N, scratch);
        return;
    }
    if (isa == RLX_CPU_ISA_AVX2) {
        /* gemm16_avx2.c on the pool; bf16: chunks of rows of a rounded and arranged into scratch */
        if (!bf16) {
            rlx_cpu_gemm16_avx2(out, a, b, b_dtype, M, K, N);
            return;
        }
        const int64_t mc = round_rows(M, K);
        for (int64_t m0 = 0; m0 < M; m0 += mc) {
            const int64_t mr = M - m0 < mc ? M - m0 : mc;
            rlx_cpu_gemm16_prep(scratch, a + m0 * K, mr, K);
            rlx_cpu_gemm16_avx2(out + m0 * N, scratch, b, RLX_BF16, mr, K, N);
        }
        return;
    }
    (void)rlx_pool_threads();
    /* bf16: chunks of rows of a rounded into scratch, then the panels after them; f16: one chunk
     * of all of a as it is, the panels at the start of scratch */
    const int64_t mc = bf16 ? round_rows(M, K) : M;
    const int64_t rows = panel_rows(K, N, bf16 ? RLX_ROUND_FLOATS : RLX_PANEL_FLOATS);
    float *panel = bf16 ? scratch + mc * K : scratch;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t mr = M - m0 < mc ? M - m0 : mc;
        const float *am = a + m0 * K;
        if (bf16) {
            rlx_cpu_round_bf16(scratch, am, mr * K);
            am = scratch;
        }
        for (int64_t n0 = 0; n0 < N; n0 += rows) {
            const int64_t nr = N - n0 < rows ? N - n0 : rows;
            /* panel (nr, K) f32 = b rows n0 .. n0+nr; out[m0.., n0 .. n0+nr] = am @ panel^T */
            rlx_cpu_widen(panel, b + n0 * K, b_dtype, nr * K);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)mr, (blasint)nr, (blasint)K, 1.0f, am,
                        (blasint)K, panel, (blasint)K, 0.0f, out + m0 * N + n0, (blasint)N);
        }
    }
}
