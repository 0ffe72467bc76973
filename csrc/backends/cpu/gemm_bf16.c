/*
 * gemm_bf16.c - out (M, N) = bf16(a) (M, K) @ b^T, b (N, K) bf16, for the prefill products of bf16
 * weights on machines whose cpuid reports AVX512_BF16 (rlx_cpu_isa() >= RLX_CPU_ISA_AVX512_BF16;
 * matmul.c decides when to call it): with AMX tiles where the machine has them (RLX_CPU_ISA_AMX,
 * N >= 32, K >= 32; the section "AMX" below), else with AVX-512 BF16 dot products (VDPBF16PS: 32
 * bf16 products per zmm instruction, twice the multiply-adds of an f32 FMA).
 *
 * Semantics (the matmul_lowp contract for bf16 weights): each element of `a` is rounded to bf16
 * (round to nearest even; NaN stays NaN, quieted; a finite value past the largest bf16 becomes
 * inf), the products of two bf16 values are exact in f32 and are summed in f32. VDPBF16PS and
 * TDPBF16PS treat bf16 subnormals (inputs) as zero and flush subnormal f32 sums to zero, so values
 * below 2^-126 may count as 0 here: far below anything a product of LLM weights and activations
 * sums to.
 *
 * Layout. The K dimension is taken in pairs (VDPBF16PS multiplies pairs): a "unit" is 32 bits
 * holding the bf16 values at k and k+1 (k even; the second is 0 past an odd K). `a` is packed
 * (rounded) chunk by chunk (up to RLX_GB_A_UNITS units of rows; all threads pack, in a region of
 * their own before the chunk's product): for each block of mr rows (rows past M are zero), for
 * each pair q of the whole K, mr units: A[i][q][r] (gb_apack; mr = GW_MB = 32 here, GA_MB for AMX).
 * The weights are read where they lie: nothing of b is packed.
 *
 * VDPBF16PS path: the lanes of a vector are rows of `a`, and each weight pair is broadcast (a
 * 32-bit load from the weight row, VPBROADCASTD): per pair, two zmm of A (32 rows) and GW_NB = 8
 * weight rows give 16 VDPBF16PS into 16 accumulators (out^T: 32 rows of a x 8 weight rows), over
 * the whole K, transposed on the way out (a block of at most 16 rows of a takes one zmm of A and
 * 8 instructions a pair). The pool's threads take blocks of 8 weight rows as the matrix-vector
 * products take their pieces (rlx_parallel_pieces: a contiguous range each, then the others'); a
 * block runs over every 32-row block of the chunk (its 8 rows x K stay in L1 / L2 after the first)
 * and fetches the next block's rows into L2, a slice per 32 pairs. Rows past N read row N - 1 and
 * are not stored; an odd K's last value is broadcast alone (nothing read past a row). Products of
 * at most GL_MAX_M = 8 rows (batched decode steps) take the lanes path below instead: 8 rows x 2
 * pairs of k in the lanes, each output the sum of its even pairs' chain and its odd pairs' chain.
 *
 * This replaced (2026-12-06) a GEMM that packed b per thread into 128-column x 512-k blocks and
 * ran an 8 x 32 microkernel on them: at 1 thread the packing (a 16 x 16 transpose of each 16 rows
 * x 32 values of k) took ~13 % of the product at M = 128. Measured on the Zen 4 EPYC (2 vCPUs),
 * whole prefills from a GGUF file (KV f16, best of 3-4, the two kernels alternating in one
 * sitting), tok/s packed -> here: Llama-3.2-1B bf16 pp128 1 thread 87.5-88.6 -> 103.8-104.1, 2
 * threads 165-170 -> 186-203; pp512 2 threads 180-182 -> 187-188; Qwen3-0.6B bf16 pp32 1 / 2
 * threads 134-135 -> 166-197 / 218-222 -> 321-325, pp128 186-188 -> 193-198 / 347-357 -> 351-372,
 * pp512 176 -> 173-178 / 341-344 -> 322-354 (attention a larger share). And batched decode steps
 * of Qwen3-0.6B bf16 (weights from DRAM, read once for all rows) with this GEMM from 9 rows up
 * instead of the matrix-vector passes: 16 sequences 131-140 -> 78-86 ms a step, 12: 92-109 -> 74-81,
 * 13: 101-137 -> 75-93; 8: 83-94 against 71-92 (even), 4: 53-57 against 73-99, 2: 37-39 against
 * 64-91 (the passes win; matmul.c's RLX_MV_BF16_MAX_M).
 *
 * Scratch (floats = 32-bit units): the packed A chunk. Results depend only on K and on whether M
 * <= GL_MAX_M (the lanes path), not on the thread count, M otherwise or N (each out element is one
 * fixed sequence of instructions in its own lanes: its pairs in order over the whole K, or its even
 * and its odd pairs so and then their sum; the AMX path: its tiles of k in order).
 *
 * Must never allocate, and must never run unless cpuid reports AVX512_BF16 (matmul.c checks).
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <immintrin.h>
#include <string.h>

#define GB_FN     __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"), always_inline)) static inline
#define GB_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/* ---------------------------------------------------------------------------------------------
 * Sizes
 * ------------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------------
 * Packing
 * ------------------------------------------------------------------------------------------- */

/* 16 floats rounded to bf16 (RNE, NaN quieted), as 16 bf16 in order = 8 units */
GB_FN __m256i gb_round16(__m512 v)
{
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rlx_cpu_round_bf16_512(_mm512_castps_si512(v)), 16));
}

/* A chunk of rows of `a` packed for a microkernel: blocks of mr rows (rows past the chunk are
 * zero), each block kpp pairs of mr units: unit (pair q, row r) = bf16(a[m0 + mr ib + r][2q]) |
 * bf16(a[..][2q + 1]) << 16, zero past K and for the pairs (K + 1) / 2 .. kpp. */
struct gb_apack {
    const float *a;       /* (M, K) */
    int64_t K, m0, mrows; /* the chunk: rows m0 .. m0 + mrows */
    int64_t mr, kpp;      /* rows per block (GW_MB, or GA_MB for AMX), pairs per block */
    uint32_t *dst;        /* (row blocks, kpp, mr) units */
};

/* Row blocks [begin, end) of the chunk into dst. */
GB_TARGET static void gb_pack_a(void *p, int64_t begin, int64_t end)
{
    const struct gb_apack *c = p;
    const int64_t K = c->K, kp = (K + 1) / 2, mr = c->mr, kpp = c->kpp;
    for (int64_t ib = begin; ib < end; ib++) {
        uint32_t *dst = c->dst + ib * kpp * mr;
        for (int64_t r = 0; r < mr; r++) {
            const int64_t m = c->m0 + ib * mr + r;
            if (m >= c->m0 + c->mrows) {
                for (int64_t q = 0; q < kpp; q++) dst[q * mr + r] = 0;
                continue;
            }
            const float *row = c->a + m * K;
            for (int64_t k = 0; k < K; k += 16) {
                const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
                uint32_t u[8];
                _mm256_storeu_si256((__m256i *)u, gb_round16(_mm512_maskz_loadu_ps(mk, row + k)));
                const int64_t q0 = k / 2, nq = kp - q0 < 8 ? kp - q0 : 8;
                for (int64_t q = 0; q < nq; q++) dst[(q0 + q) * mr + r] = u[q];
            }
            for (int64_t q = kp; q < kpp; q++) dst[q * mr + r] = 0;
        }
    }
}

/* Packs the chunk on the pool (about 64K values of a per task). */
static void gb_pack_chunk(struct gb_apack *pa)
{
    const int64_t nrb = (pa->mrows + pa->mr - 1) / pa->mr;
    rlx_parallel_for(nrb, rlx_cpu_row_grain(65536, pa->mr * pa->K), gb_pack_a, pa);
}

/* ---------------------------------------------------------------------------------------------
 * VDPBF16PS: rows of a in the lanes, weight pairs broadcast
 * ------------------------------------------------------------------------------------------- */

#define GW_MB 32 /* rows of a per microkernel: two zmm of lanes */
#define GW_NB 8  /* weight rows per block */

struct gw_ctx {
    float *out;
    const uint16_t *b;
    int64_t N;
    struct gb_apack pa; /* the current chunk (mr = GW_MB, kpp = (K + 1) / 2) */
};

/* out rows 0 .. min(rows, 16 nv), columns 0 .. cols (<= GW_NB), ld ldo = the block of a at ap
 * (kpp pairs x GW_MB units; the first 16 nv rows used) . the weight rows w[0 .. GW_NB) over all of
 * K; lanes are rows of a, each weight pair broadcast. Prefetches `per_step` lines of `next` (lpr
 * lines a row, rows `stride` bytes apart; lines in all) per 32 pairs, from *line on. */
GB_FN void gw_micro(float *o, int64_t ldo, const uint32_t *ap, const uint16_t *const w[GW_NB], int64_t K, int64_t rows,
                    int64_t cols, int nv, const char *next, int64_t stride, int64_t lpr, int64_t lines,
                    int64_t per_step, int64_t *line)
{
    const int64_t full = K / 2;
    __m512 acc[GW_NB][2];
    for (int j = 0; j < GW_NB; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    int64_t l = *line;
    for (int64_t q0 = 0; q0 < full; q0 += 32) {
        for (int64_t e = l + per_step; l < e && l < lines; l++)
            _mm_prefetch(next + l / lpr * stride + 64 * (l % lpr), _MM_HINT_T1);
        const int64_t q1 = full - q0 < 32 ? full : q0 + 32;
        for (int64_t q = q0; q < q1; q++) {
            const __m512bh a0 = (__m512bh)_mm512_loadu_si512(ap + q * GW_MB);
            const __m512bh a1 = nv > 1 ? (__m512bh)_mm512_loadu_si512(ap + q * GW_MB + 16) : a0;
            _Pragma("GCC unroll 8") for (int j = 0; j < GW_NB; j++)
            {
                uint32_t u;
                memcpy(&u, w[j] + 2 * q, sizeof u);
                const __m512bh wv = (__m512bh)_mm512_set1_epi32((int)u);
                acc[j][0] = _mm512_dpbf16_ps(acc[j][0], a0, wv);
                if (nv > 1) acc[j][1] = _mm512_dpbf16_ps(acc[j][1], a1, wv);
            }
        }
    }
    *line = l;
    if (K % 2) { /* the last value of k alone: its pair's second half is zero in a; nothing read past the row */
        const __m512bh a0 = (__m512bh)_mm512_loadu_si512(ap + full * GW_MB);
        const __m512bh a1 = (__m512bh)_mm512_loadu_si512(ap + full * GW_MB + 16);
        for (int j = 0; j < GW_NB; j++) {
            const __m512bh wv = (__m512bh)_mm512_set1_epi32((int)w[j][K - 1]);
            acc[j][0] = _mm512_dpbf16_ps(acc[j][0], a0, wv);
            if (nv > 1) acc[j][1] = _mm512_dpbf16_ps(acc[j][1], a1, wv);
        }
    }
    /* lanes are rows of a: transposed on the way out, cols columns per row of out */
    const __mmask16 mask = (__mmask16)((1u << cols) - 1);
    for (int h = 0; h < nv; h++) {
        __m512i r[16];
        for (int j = 0; j < 16; j++) r[j] = j < GW_NB ? _mm512_castps_si512(acc[j][h]) : _mm512_setzero_si512();
        rlx_cpu_transpose16(r); /* r[i] lane j = row 16 h + i, weight row j */
        for (int i = 0; i < 16 && 16 * h + i < rows; i++)
            _mm512_mask_storeu_ps(o + (16 * h + i) * ldo, mask, _mm512_castsi512_ps(r[i]));
    }
}

/* Blocks [begin, end) of GW_NB weight rows (rows past N read row N - 1 and are not stored) times
 * every block of GW_MB rows of the chunk: lanes are rows of a, each weight pair broadcast. */
GB_TARGET static void gw_blocks(void *p, int64_t begin, int64_t end)
{
    const struct gw_ctx *c = p;
    const int64_t K = c->pa.K, N = c->N, kpp = c->pa.kpp, full = K / 2;
    const int64_t mblocks = (c->pa.mrows + GW_MB - 1) / GW_MB, nblocks = (N + GW_NB - 1) / GW_NB;
    const int64_t stride = K * (int64_t)sizeof(uint16_t), lpr = (stride + 63) / 64;
    for (int64_t nb = begin; nb < end; nb++) {
        const int64_t n0 = nb * GW_NB, cols = N - n0 < GW_NB ? N - n0 : GW_NB;
        const uint16_t *w[GW_NB];
        for (int j = 0; j < GW_NB; j++) w[j] = c->b + (n0 + (j < cols ? j : cols - 1)) * K;
        /* the next block's rows, fetched into L2 a slice per 32 pairs while this block computes */
        const char *next = nb + 1 < nblocks ? (const char *)(c->b + (nb + 1) * GW_NB * K) : NULL;
        const int64_t nrows = next ? (N - (nb + 1) * GW_NB < GW_NB ? N - (nb + 1) * GW_NB : GW_NB) : 0;
        const int64_t lines = nrows * lpr, steps = mblocks * ((full + 31) / 32) + 1;
        const int64_t per_step = (lines + steps - 1) / steps;
        int64_t line = 0;
        for (int64_t ib = 0; ib < mblocks; ib++) {
            const int64_t m0 = c->pa.m0 + ib * GW_MB, mend = c->pa.m0 + c->pa.mrows;
            const uint32_t *ap = c->pa.dst + ib * kpp * GW_MB;
            if (mend - m0 > 16)
                gw_micro(c->out + m0 * N + n0, N, ap, w, K, mend - m0, cols, 2, next, stride, lpr, lines, per_step,
                         &line);
            else
                gw_micro(c->out + m0 * N + n0, N, ap, w, K, mend - m0, cols, 1, next, stride, lpr, lines, per_step,
                         &line);
        }
    }
}

static int64_t gw_a_rows(int64_t K)
{
    const int64_t kp = (K + 1) / 2;
    const int64_t rows = RLX_GB_A_UNITS / (kp > 0 ? kp : 1) / GW_MB * GW_MB;
    return rows < GW_MB ? GW_MB : rows;
}

static void gemm_vdp(float *out, const float *a, const uint16_t *b, int64_t M, int64_t K, int64_t N, float *scratch)
{
    const int64_t chunk = gw_a_rows(K);
    struct gw_ctx c = {.out = out,
                       .b = b,
                       .N = N,
                       .pa = {.a = a, .K = K, .mr = GW_MB, .kpp = (K + 1) / 2, .dst = (uint32_t *)scratch}};
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        c.pa.m0 = m0;
        c.pa.mrows = M - m0 < chunk ? M - m0 : chunk;
        gb_pack_chunk(&c.pa);
        rlx_parallel_pieces((N + GW_NB - 1) / GW_NB, 1, gw_blocks, &c);
    }
}

/* ---------------------------------------------------------------------------------------------
 * VDPBF16PS for a few rows: 8 rows of a x 2 pairs of k in the lanes
 * ------------------------------------------------------------------------------------------- */

/* At GL_MAX_M rows or fewer the path above fills at most half its lanes. Here lane 2 i + h holds
 * row i of a against pairs 2 qq + h of k (qq = 0, 1, ...: the even pairs in lane 2 i, the odd ones
 * in 2 i + 1), so every lane is used at 8 rows, and one accumulator serves one weight row: per qq,
 * one zmm of a (gl_pack: row i's pairs 2 qq and 2 qq + 1 at lanes 2 i, 2 i + 1) is multiplied by
 * the 8 bytes of the weight row that hold the same two pairs, broadcast straight from the row
 * (VPBROADCASTQ; nothing of b is copied). Output (i, n) = lane 2 i + lane 2 i + 1 of row n's
 * accumulator: its even pairs in order from zero, plus its odd pairs in order from zero (an odd K's
 * last value with a zero second half, the values past K zero). So these bits are those of the path
 * above run once over a with the odd pairs zeroed and once with the even pairs zeroed, the two
 * summed (test_kernels' lanes test); not the path above's own bits over a.
 * Blocks of GL_NB = 8 weight rows: 16 rows at once, K * 2 bytes apart (a multiple of 2 KiB for
 * the models' K), share the L1's sets too often (16 rows 11.7 cycles against 8 rows' 10.3, 4 rows 14.6).
 * Measured (C harness, Zen 4 EPYC, 8 rows, cycles per 256 values and row of a at 3.64 GHz, min of
 * alternating runs, against the layout before, 8 rows x 2 weight rows in the lanes with each strip of
 * 64 values of 16 weight rows copied into an L1 buffer as pairs of rows): L2-resident 1024 x 256
 * 13.5 -> 10.3; weights from DRAM, 1 thread, 8192 x 2048 15.4 -> 10.9, 2048 x 8192 14.7-15.0 -> 9.8-10.0,
 * 3072 x 1024 13.5-13.6 -> 9.8-9.9; 2 threads 7.8 -> 6.5, 8.0-8.9 -> 5.6-6.6, 7.0-7.4 -> 4.9-5.3; 5 / 6 / 7
 * rows (3072 x 1024, 1 thread) 21.4 / 17.7 / 15.9 -> 15.1 / 12.6 / 11.2. Whole batched decode steps
 * (GGUF files, 2 threads, the two builds alternating, ms a step): Qwen3-0.6B bf16 8 sequences
 * 47.9-49.3 -> 40.9-43.1; Llama-3.2-1B bf16 8 sequences 121-128 -> 70.6-75.9 (its K = 2048 rows are 4
 * KiB apart: all 16 of a block fell in one set of the 8-way L1). */
#define GL_MAX_M 8
#define GL_NB    8  /* weight rows per block, one accumulator each */
#define GL_QS    16 /* pairs of pairs of k per strip (64 values: 128 bytes of each row) */

struct gl_ctx {
    float *out;
    const uint16_t *b;
    const uint32_t *ap; /* (kq, 16) units: unit (qq, 2 i + h) = row i's pair 2 qq + h (zero past M, K) */
    int64_t M, K, N;
};

/* Rows 0 .. M (<= GL_MAX_M) of a into ap, rounded to bf16: row i's pair q at unit (q / 2, 2 i + q % 2). */
GB_TARGET static void gl_pack(uint32_t *ap, const float *a, int64_t M, int64_t K)
{
    const int64_t kp = (K + 1) / 2, kq = (kp + 1) / 2;
    memset(ap, 0, (size_t)(kq * 16) * sizeof(uint32_t));
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k += 16) {
            const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
            uint32_t u[8];
            _mm256_storeu_si256((__m256i *)u, gb_round16(_mm512_maskz_loadu_ps(mk, a + i * K + k)));
            const int64_t q0 = k / 2, nq = kp - q0 < 8 ? kp - q0 : 8;
            for (int64_t q = 0; q < nq; q++) ap[(q0 + q) / 2 * 16 + 2 * i + (q0 + q) % 2] = u[q];
        }
}

/* acc[j] += the packed rows' units qq against weight row w[j]'s two pairs there (8 bytes) */
GB_FN void gl_step(__m512 acc[GL_NB], const uint32_t *ap, const uint16_t *const *w, int64_t qq)
{
    const __m512bh av = (__m512bh)_mm512_loadu_si512(ap + qq * 16);
    _Pragma("GCC unroll 8") for (int j = 0; j < GL_NB; j++)
    {
        long long x;
        memcpy(&x, w[j] + 4 * qq, sizeof x);
        acc[j] = _mm512_dpbf16_ps(acc[j], av, (__m512bh)_mm512_set1_epi64(x));
    }
}

/* out[m * N + n0 + n] for m < M, n < cols: weight rows n0 .. n0 + cols (rows past cols repeat the
 * last) against the packed rows; prefetches the next block's nn rows from next, strip by strip. */
GB_FN void gl_block(float *out, const struct gl_ctx *c, int64_t n0, int64_t cols, const char *next, int64_t nn)
{
    const int64_t K = c->K, kfull = K / 4, stride = K * (int64_t)sizeof(uint16_t);
    const uint16_t *w[GL_NB];
    for (int j = 0; j < GL_NB; j++) w[j] = c->b + (n0 + (j < cols ? j : cols - 1)) * K;
    __m512 acc[GL_NB];
    for (int j = 0; j < GL_NB; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t qq = 0; qq < kfull; qq += GL_QS) {
        const int64_t qn = kfull - qq < GL_QS ? kfull - qq : GL_QS;
        if (next)
            for (int64_t j = 0; j < nn; j++)
                for (int64_t o = 0; o < 8 * qn; o += 64) _mm_prefetch(next + j * stride + 8 * qq + o, _MM_HINT_T1);
        if (qn == GL_QS) {
            _Pragma("GCC unroll 4") for (int64_t t = 0; t < GL_QS; t++) gl_step(acc, c->ap, w, qq + t);
        } else {
            for (int64_t t = 0; t < qn; t++) gl_step(acc, c->ap, w, qq + t);
        }
    }
    if (4 * kfull < K) { /* the last 1 .. 3 values of k, zero past the row (nothing read past it) */
        const __m512bh av = (__m512bh)_mm512_loadu_si512(c->ap + kfull * 16);
        for (int j = 0; j < GL_NB; j++) {
            long long x = 0;
            memcpy(&x, w[j] + 4 * kfull, (size_t)(K - 4 * kfull) * sizeof(uint16_t));
            acc[j] = _mm512_dpbf16_ps(acc[j], av, (__m512bh)_mm512_set1_epi64(x));
        }
    }
    /* lanes 2 i, 2 i + 1 of acc[n]: row i's even and odd pairs against weight row n */
    _Alignas(64) float t[GL_NB][16];
    for (int j = 0; j < GL_NB; j++) _mm512_store_ps(t[j], acc[j]);
    for (int64_t i = 0; i < c->M; i++)
        for (int64_t n = 0; n < cols; n++) out[i * c->N + n0 + n] = t[n][2 * i] + t[n][2 * i + 1];
}

/* Blocks [begin, end) of GL_NB weight rows (rows past N read row N - 1 and are not stored). */
GB_TARGET static void gl_blocks(void *p, int64_t begin, int64_t end)
{
    const struct gl_ctx *c = p;
    const int64_t nblocks = (c->N + GL_NB - 1) / GL_NB;
    for (int64_t nb = begin; nb < end; nb++) {
        const int64_t n0 = nb * GL_NB, cols = c->N - n0 < GL_NB ? c->N - n0 : GL_NB;
        const int64_t nn = nb + 1 < nblocks ? (c->N - n0 - GL_NB < GL_NB ? c->N - n0 - GL_NB : GL_NB) : 0;
        gl_block(c->out, c, n0, cols, nn ? (const char *)(c->b + (n0 + GL_NB) * c->K) : NULL, nn);
    }
}

static void gemm_lanes(float *out, const float *a, const uint16_t *b, int64_t M, int64_t K, int64_t N, float *scratch)
{
    struct gl_ctx c = {.out = out, .b = b, .ap = (const uint32_t *)scratch, .M = M, .K = K, .N = N};
    gl_pack((uint32_t *)scratch, a, M, K);
    rlx_parallel_pieces((N + GL_NB - 1) / GL_NB, 1, gl_blocks, &c);
}

/* ---------------------------------------------------------------------------------------------
 * AMX
 * ------------------------------------------------------------------------------------------- */

/* TDPBF16PS multiplies a tile of 16 rows x 32 bf16 values by a tile of 16 pairs x 16 columns into
 * 16 x 16 f32 sums: 8192 multiply-adds an instruction (VDPBF16PS: 32). The weights are the first
 * operand as they lie in memory (16 rows of W x 32 values of k, the rows K * 2 bytes apart: nothing
 * to pack), the packed rows of `a` the second (16 pairs of k x 16 rows of a per tile: gb_apack with
 * mr = GA_MB, kpp a multiple of 16), so a tile of sums is out^T (16 weight rows x 16 rows of a),
 * transposed on the way out. Tiles: 0-3 sums (weight rows 0-15 / 16-31 x rows of a 0-15 / 16-31),
 * 4-5 weights, 6-7 activations; all 16 rows x 64 bytes. A block of 32 weight rows runs over every
 * pair of row blocks of the chunk, the whole K at a time (the sums never leave the tiles until
 * stored: each out element one fixed sequence, the same bits at any thread count); the last K % 32
 * values of k come from a zero-padded copy (a tile load of the rows would read past K, into the
 * next row or past the array), and a last block that would pass N is moved back to end at N, its
 * rows of the block before computed again and not stored. The pool's threads take the blocks as
 * the matrix-vector products take their pieces (rlx_parallel_pieces: a contiguous range each,
 * then the others'), and a block prefetches the next block's rows into L2 while it computes.
 * Each task loads the tile configuration and releases the tiles when done (the tile state is
 * per thread; released, a context switch does not save its 8 KiB).
 *
 * Measured on the Intel Xeon (2 vCPUs, AMX-BF16; /tmp/gemm.py through rlx.compile: bf16 weights
 * in cache between repetitions, best of 5), GFLOP/s at 1 / 2 threads, AMX against the VDPBF16PS
 * GEMM of then (b packed):
 *   M = 128, K 1024 -> N 2048: 444 / 750 against 89 / 90;  1024 -> 3072: 738 / 1086 against 88 / 115
 *   M = 128, 3072 -> 1024: 763 / 1162 against 91 / 113;  2048 -> 8192: 472 / 853 against 89 / 174
 *   M = 512, 1024 -> 3072: 558 / 817 against 93 / 174;  3072 -> 1024: 618 / 1084 against 93 / 183
 * Whole prefills, Qwen3-0.6B bf16 GGUF, KV f16, 2 threads, best of 5: pp128 172 -> 683 tok/s (matmul
 * 682 -> 124 ms of the step), pp512 187 -> 676 tok/s (2440 -> 419 ms; attention is now 30 % of it);
 * the next block's prefetch then took pp128 684-686 -> 712-723, pp512 644-652 -> 683-700 (builds
 * alternated twice). The machine is a shared VM: 10-20 % run to run. */
#define GA_MB 16 /* rows of a per tile */
#define GA_NB 32 /* weight rows per block: two tiles */

#define GA_FN                                                                                                          \
    __attribute__((target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl"), always_inline)) static inline
#define GA_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl")))

/* pairs per packed row block: whole tiles of 16 pairs */
static int64_t ga_kpp(int64_t K) { return ((K + 1) / 2 + 15) / 16 * 16; }

/* rows per packed chunk: RLX_GB_A_UNITS units, whole pairs of row blocks, at least one pair */
static int64_t ga_a_rows(int64_t K)
{
    const int64_t rows = RLX_GB_A_UNITS / ga_kpp(K) / (2 * GA_MB) * (2 * GA_MB);
    return rows < 2 * GA_MB ? 2 * GA_MB : rows;
}

struct ga_ctx {
    float *out;
    const uint16_t *b;
    int64_t N;
    struct gb_apack pa; /* the current chunk (mr = GA_MB, kpp = ga_kpp(K)), its row blocks padded to an even count */
};

/* A tile of sums t (16 weight rows x 16 rows of a, f32) into out^T: out[m][n] for the rows of a
 * m0 .. m0 + 16 below mend and the weight rows n0 + i for i in [ifrom, 16). */
GA_FN void ga_store(float *out, int64_t ldo, const float t[256], int64_t m0, int64_t mend, int64_t n0, int ifrom)
{
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(t + 16 * i);
    rlx_cpu_transpose16(r); /* r[j] lane i = t[i][j] */
    const __mmask16 mask = (__mmask16)(0xffffu << ifrom);
    for (int j = 0; j < 16 && m0 + j < mend; j++)
        _mm512_mask_storeu_ps(out + (m0 + j) * ldo + n0, mask, _mm512_castsi512_ps(r[j]));
}

/* Weight blocks [begin, end) (GA_NB rows each; the last one moved back to end at N, its rows of
 * earlier blocks computed but not stored) times every row pair of blocks of the chunk. */
GA_TARGET static void ga_blocks(void *p, int64_t begin, int64_t end)
{
    const struct ga_ctx *c = p;
    const int64_t K = c->pa.K, N = c->N, kpp = c->pa.kpp, ksteps = K / 32, tail = K % 32;
    const int64_t stride = K * (int64_t)sizeof(uint16_t), mpairs = (c->pa.mrows + 2 * GA_MB - 1) / (2 * GA_MB);
    struct rlx_cpu_tilecfg cfg = {.palette = 1}; /* tiles 0-7: 16 rows x 64 bytes */
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _Alignas(64) uint16_t wtail[GA_NB * 32]; /* the block's last K % 32 values of k, zero past K */
    _Alignas(64) float sums[256];
    for (int64_t nb = begin; nb < end; nb++) {
        const int64_t n0 = nb * GA_NB + GA_NB <= N ? nb * GA_NB : N - GA_NB; /* N >= GA_NB */
        const int skip = (int)(nb * GA_NB - n0);                             /* rows already stored */
        const uint16_t *w0 = c->b + n0 * K, *w1 = w0 + 16 * K;
        if (tail) {
            memset(wtail, 0, sizeof wtail);
            for (int r = 0; r < GA_NB; r++) memcpy(wtail + 32 * r, w0 + r * K + 32 * ksteps, (size_t)tail * 2);
        }
        /* the next block's weight rows (the next of this task's range, as a rule), fetched into L2
         * a slice per step while this block computes */
        const int64_t nn = (nb + 1) * GA_NB + GA_NB <= N ? (nb + 1) * GA_NB : N - GA_NB;
        const char *next = nb + 1 < (N + GA_NB - 1) / GA_NB ? (const char *)(c->b + nn * K) : NULL;
        const int64_t lpr = (stride + 63) / 64, lines = next ? GA_NB * lpr : 0, steps = mpairs * (ksteps + 1);
        const int64_t per_step = (lines + steps - 1) / steps;
        int64_t line = 0;
        for (int64_t mp = 0; mp < mpairs; mp++) {
            const uint32_t *a0 = c->pa.dst + 2 * mp * kpp * GA_MB, *a1 = a0 + kpp * GA_MB;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t s = 0; s < ksteps; s++) {
                for (int64_t e = line + per_step; line < e && line < lines; line++)
                    _mm_prefetch(next + line / lpr * stride + 64 * (line % lpr), _MM_HINT_T1);
                _tile_loadd(4, w0 + 32 * s, stride);
                _tile_loadd(5, w1 + 32 * s, stride);
                _tile_loadd(6, a0 + 16 * GA_MB * s, 64);
                _tile_loadd(7, a1 + 16 * GA_MB * s, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            if (tail) {
                _tile_loadd(4, wtail, 64);
                _tile_loadd(5, wtail + 16 * 32, 64);
                _tile_loadd(6, a0 + 16 * GA_MB * ksteps, 64);
                _tile_loadd(7, a1 + 16 * GA_MB * ksteps, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            const int64_t m0 = c->pa.m0 + 2 * mp * GA_MB, mend = c->pa.m0 + c->pa.mrows;
            _tile_stored(0, sums, 64);
            ga_store(c->out, N, sums, m0, mend, n0, skip);
            _tile_stored(1, sums, 64);
            ga_store(c->out, N, sums, m0 + GA_MB, mend, n0, skip);
            _tile_stored(2, sums, 64);
            ga_store(c->out, N, sums, m0, mend, n0 + 16, skip > 16 ? skip - 16 : 0);
            _tile_stored(3, sums, 64);
            ga_store(c->out, N, sums, m0 + GA_MB, mend, n0 + 16, skip > 16 ? skip - 16 : 0);
        }
    }
    _tile_release();
}

static void gemm_amx(float *out, const float *a, const uint16_t *b, int64_t M, int64_t K, int64_t N, float *scratch)
{
    const int64_t chunk = ga_a_rows(K);
    struct ga_ctx c = {
        .out = out, .b = b, .N = N, .pa = {.a = a, .K = K, .mr = GA_MB, .kpp = ga_kpp(K), .dst = (uint32_t *)scratch}};
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        c.pa.m0 = m0;
        c.pa.mrows = M - m0 < chunk ? M - m0 : chunk;
        gb_pack_chunk(&c.pa);
        /* an even count of row blocks: a zero block after an odd count */
        const int64_t blocks = (c.pa.mrows + GA_MB - 1) / GA_MB;
        if (blocks % 2) memset(c.pa.dst + blocks * c.pa.kpp * GA_MB, 0, (size_t)(c.pa.kpp * GA_MB) * sizeof(uint32_t));
        rlx_parallel_pieces((N + GA_NB - 1) / GA_NB, 1, ga_blocks, &c);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Entry
 * ------------------------------------------------------------------------------------------- */

/* The AMX path: where the machine has it and the product holds at least one block of weight rows
 * and one tile of k. */
static int use_amx(int64_t K, int64_t N) { return rlx_cpu_isa() >= RLX_CPU_ISA_AMX && N >= GA_NB && K >= 32; }

size_t rlx_cpu_gemm_bf16_scratch(int64_t M, int64_t K, int64_t N)
{
    (void)N;
    if (M <= 0 || K <= 0) return 0;
    /* VDPBF16PS: the packed chunk, whole row blocks */
    int64_t rows = gw_a_rows(K);
    const int64_t mpad = (M + GW_MB - 1) / GW_MB * GW_MB;
    rows = rows < mpad ? rows : mpad;
    const size_t vdp = (size_t)(rows * ((K + 1) / 2));
    /* AMX: the packed chunk, whole pairs of row blocks */
    int64_t arows = ga_a_rows(K);
    const int64_t apad = (M + 2 * GA_MB - 1) / (2 * GA_MB) * (2 * GA_MB);
    arows = arows < apad ? arows : apad;
    const size_t amx = (size_t)(arows * ga_kpp(K));
    /* a few rows: (kq, 16) units */
    const size_t lanes = M <= GL_MAX_M ? (size_t)(16 * ((K + 3) / 4)) : 0;
    const size_t most = vdp > amx ? vdp : amx;
    return most > lanes ? most : lanes;
}

/* out (M, N) = bf16(a) (M, K) @ b^T, b (N, K) bf16; M, K, N >= 1; scratch:
 * rlx_cpu_gemm_bf16_scratch(M, K, N) floats. */
void rlx_cpu_gemm_bf16(float *out, const float *a, const uint16_t *b, int64_t M, int64_t K, int64_t N, float *scratch)
{
    if (use_amx(K, N))
        gemm_amx(out, a, b, M, K, N, scratch);
    else if (M <= GL_MAX_M)
        gemm_lanes(out, a, b, M, K, N, scratch);
    else
        gemm_vdp(out, a, b, M, K, N, scratch);
}
