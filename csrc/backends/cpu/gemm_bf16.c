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
 * holding the bf16 values at k and k+1 (k even; the second is 0 past an odd K).
 *  - packed A (per chunk of up to RLX_GB_A_UNITS units of rows): for each block of RLX_GB_MR rows
 *    (rows past M are zero), for each pair p of the whole K, RLX_GB_MR units: A[i][p][r].
 *  - packed B (per thread, for one block of up to RLX_GB_NC columns n and RLX_GB_KC values of k):
 *    for each panel of 32 columns (columns past N are zero), for each pair p of the block, 32 units:
 *    B[j][p][c] = (w[n0 + 32 j + c][k0 + 2p], w[..][k0 + 2p + 1]), i.e. two zmm per pair.
 * Microkernel: RLX_GB_MR = 8 rows x 32 columns of out in 16 zmm accumulators; per pair, two zmm
 * of B loaded, each A unit broadcast into two VDPBF16PS. Rows past M and columns past N are
 * computed on zeros and not stored.
 *
 * Blocking (Zen 4: 32 KiB L1d and 1 MiB L2 per core, 32 MiB L3 shared): the pool's threads take
 * blocks of RLX_GB_NC = 128 columns, each a contiguous range of them first, then what is left of
 * the others' (rlx_pieces, so a descheduled thread does not stall the product); for each block of
 * RLX_GB_KC = 512 values of k a thread packs its B block (128 x 512 bf16 = 128 KiB, L2-resident),
 * then for each sub-chunk of RLX_GB_MC = 256 rows of the packed A (256 x 512 bf16 = 256 KiB,
 * L2-resident) and each 32-column panel of the B block (32 KiB) runs the microkernel over the
 * sub-chunk's row blocks. Sums over k blocks accumulate in out
 * (f32): the first k block stores, the next ones add. A is packed (rounded) by all threads in a
 * region of its own before each chunk's product. B is packed once per call (per A chunk: K > 2048
 * with M > 2 * 524288 / K rows takes several chunks). While a block computes, its microkernel
 * calls prefetch the next k block's weight rows into L2, a slice per call, so the next packing
 * reads L2 instead of stalling on DRAM: measured on the Llama-3.2-1B shapes at M = 128 (2 threads,
 * weights rotated through 8 copies, i.e. from DRAM), gate/up 312 -> 342 GFLOP/s, down 302-323 ->
 * 342-346, q/o 312-323 -> 336-339; M = 512 unchanged within noise. The last k block prefetches the
 * first of the next column block (the task's next, unless another task takes it; with the blocks
 * dealt in turn from one counter it was not known, and that first block's packing read DRAM):
 * Zen 4, 2 threads, the same weights from DRAM, builds alternating three times, M = 128 gate/up
 * 352-369 -> 381-383 GFLOP/s, down 350-372 -> 377-380, q/o 363-370 -> 363-377; M = 32 220-251 ->
 * 261-269; 1 thread M = 128 187-188 -> 191-192; Llama-3.2-1B bf16 pp128 at 2 threads (whole
 * prefills, best of 5, six alternating pairs) 159-167 -> 161-173 tok/s, five of the six pairs
 * faster, by 1-6 %.
 *
 * Tuned on the Zen 4 EPYC (2 vCPUs, shared), Qwen3-0.6B shapes, GFLOP/s of the GEMM alone, 1 / 2
 * threads: M = 512: 180-207 / 340-408; M = 128: 170-194 / 310-377 (widen + sgemm: 76-93 / 81-152;
 * f32 sgemm 83-99 / 140-183). MR = 6, 8, 12, KC = 256, 512, NC = 128, 256, MC = 64, 128, 256
 * all measured within noise of each other (+-5%); 8 / 512 / 128 / 256 kept. One thread's 200
 * GFLOP/s is 2x its f32 sgemm, as VDPBF16PS's doubled multiply-adds allow (the VM's clock
 * under boost is not known, so not as a fraction of peak). OpenBLAS threads still spinning after an sgemm
 * elsewhere (attention) halve the 2-thread numbers while they spin.
 *
 * Scratch (floats = 32-bit units): the packed A chunk plus one B block per pool thread; the
 * thread count must not change between rlx_cpu_gemm_bf16_scratch and the call (as attention's).
 * Results depend only on the shapes, not on the thread count (each out element is one fixed
 * sequence of instructions: its k blocks in order).
 *
 * Must never allocate, and must never run unless cpuid reports AVX512_BF16 (matmul.c checks).
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

#define GB_FN     __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl"), always_inline)) static inline
#define GB_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/* ---------------------------------------------------------------------------------------------
 * Sizes
 * ------------------------------------------------------------------------------------------- */

static int64_t gb_a_rows(int64_t K)
{
    /* rows per A chunk: RLX_GB_A_UNITS units, whole row blocks, at least one block */
    const int64_t kp = (K + 1) / 2;
    int64_t rows = RLX_GB_A_UNITS / (kp > 0 ? kp : 1) / RLX_GB_MR * RLX_GB_MR;
    return rows < RLX_GB_MR ? RLX_GB_MR : rows;
}

/* units of one thread's B block */
#define GB_B_UNITS ((int64_t)RLX_GB_NC * (RLX_GB_KC / 2))

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
    int64_t mr, kpp;      /* rows per block (RLX_GB_MR, or GA_MB for AMX), pairs per block */
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

struct gb_ctx {
    float *out;
    const uint16_t *b;
    int64_t N;
    struct gb_apack pa; /* the current chunk (mr = RLX_GB_MR, kpp = (K + 1) / 2) */
    uint32_t *bpack;    /* GB_B_UNITS per task */
    int64_t nblocks;
    struct rlx_pieces blocks; /* the column blocks: a contiguous range per task, then the others' */
};

/* B block: columns n0 .. n0 + nc, values k0 .. k0 + kc (kc even unless it ends at K) into dst,
 * panel by panel. */
GB_TARGET static void gb_pack_b(uint32_t *dst, const uint16_t *b, int64_t K, int64_t N, int64_t n0, int64_t nc,
                                int64_t k0, int64_t kc)
{
    const int64_t kpb = (kc + 1) / 2, full = kc / 2; /* pairs, pairs with both values inside K */
    for (int64_t j = 0; j * 32 < nc; j++, dst += kpb * 32) {
        const int64_t c0 = n0 + j * 32, cols = N - c0 < 32 ? N - c0 : 32;
        int64_t q = 0;
        if (cols == 32)
            for (; q + 16 <= full; q += 16)
                for (int h = 0; h < 2; h++) {
                    __m512i r[16];
                    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(b + (c0 + 16 * h + i) * K + k0 + 2 * q);
                    rlx_cpu_transpose16(r);
                    for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + (q + i) * 32 + 16 * h, r[i]);
                }
        for (; q < kpb; q++)
            for (int64_t cc = 0; cc < 32; cc++) {
                uint32_t u = 0;
                if (cc < cols) {
                    const uint16_t *w = b + (c0 + cc) * K + k0 + 2 * q;
                    u = w[0] | (k0 + 2 * q + 1 < K ? (uint32_t)w[1] << 16 : 0);
                }
                dst[q * 32 + cc] = u;
            }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Microkernel
 * ------------------------------------------------------------------------------------------- */

/* out rows 0 .. rows (<= MR), columns 0 .. cols (<= 32), ld ldc: (+)= A block (kp pairs x MR) .
 * B panel (kp pairs x 32). */
GB_FN void gb_micro(float *c, int64_t ldc, const uint32_t *ap, const uint32_t *bp, int64_t kp, int rows, int cols,
                    int accumulate)
{
    __m512 acc[RLX_GB_MR][2];
    for (int r = 0; r < RLX_GB_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t q = 0; q < kp; q++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * 32);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + q * 32 + 16);
        _Pragma("GCC unroll 16") for (int r = 0; r < RLX_GB_MR; r++)
        {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[q * RLX_GB_MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    const __mmask16 m0 = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? (__mmask16)0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    for (int r = 0; r < rows; r++) {
        float *o = c + r * ldc;
        __m512 v0 = acc[r][0], v1 = acc[r][1];
        if (accumulate) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, o));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, o + 16));
        }
        _mm512_mask_storeu_ps(o, m0, v0);
        _mm512_mask_storeu_ps(o + 16, m1, v1);
    }
}

/* One task t (= begin): takes column blocks from c->blocks; its B block lives at bpack + t *
 * GB_B_UNITS. */
GB_TARGET static void gb_task(void *p, int64_t begin, int64_t end)
{
    struct gb_ctx *c = p;
    (void)end;
    uint32_t *bpack = c->bpack + begin * GB_B_UNITS;
    const int64_t K = c->pa.K, N = c->N, nrb = (c->pa.mrows + RLX_GB_MR - 1) / RLX_GB_MR;
    for (int64_t nb; (nb = rlx_pieces_take(&c->blocks, (int)begin)) >= 0;) {
        const int64_t n0 = nb * RLX_GB_NC, nc = N - n0 < RLX_GB_NC ? N - n0 : RLX_GB_NC;
        for (int64_t k0 = 0; k0 < K; k0 += RLX_GB_KC) {
            const int64_t kc = K - k0 < RLX_GB_KC ? K - k0 : RLX_GB_KC, kpb = (kc + 1) / 2;
            gb_pack_b(bpack, c->b, K, N, n0, nc, k0, kc);
            /* the weights the next packing reads (nc rows from pn0 x kn values from pk0), fetched
             * into L2 a slice per microkernel call while this block computes: the next k block,
             * or after the last one the first k block of the next column block (the task's next
             * unless another task took it) */
            int64_t pn0 = n0, pnc = nc, pk0 = k0 + kc, kn = K - pk0 < RLX_GB_KC ? K - pk0 : RLX_GB_KC;
            if (kn == 0 && nb + 1 < c->nblocks) {
                pn0 = n0 + RLX_GB_NC, pk0 = 0, kn = K < RLX_GB_KC ? K : RLX_GB_KC;
                pnc = N - pn0 < RLX_GB_NC ? N - pn0 : RLX_GB_NC;
            }
            const int64_t lines_per_row = (kn * 2 + 63) / 64, lines = pnc * lines_per_row;
            const int64_t calls = nrb * ((nc + 31) / 32);
            const int64_t per_call = kn > 0 ? (lines + calls - 1) / calls : 0;
            int64_t next_line = 0;
            for (int64_t i0 = 0; i0 < nrb; i0 += RLX_GB_MC / RLX_GB_MR)
                for (int64_t j = 0; j * 32 < nc; j++) {
                    const int cols = (int)(nc - j * 32 < 32 ? nc - j * 32 : 32);
                    const uint32_t *bp = bpack + j * kpb * 32;
                    const int64_t i1 = i0 + RLX_GB_MC / RLX_GB_MR < nrb ? i0 + RLX_GB_MC / RLX_GB_MR : nrb;
                    for (int64_t ib = i0; ib < i1; ib++) {
                        const int64_t r0 = ib * RLX_GB_MR;
                        const int rows = (int)(c->pa.mrows - r0 < RLX_GB_MR ? c->pa.mrows - r0 : RLX_GB_MR);
                        for (int64_t e = next_line + per_call; next_line < e && next_line < lines; next_line++)
                            _mm_prefetch((const char *)(c->b + (pn0 + next_line / lines_per_row) * K + pk0) +
                                             64 * (next_line % lines_per_row),
                                         _MM_HINT_T1);
                        gb_micro(c->out + (c->pa.m0 + r0) * N + n0 + j * 32, N,
                                 c->pa.dst + (ib * c->pa.kpp + k0 / 2) * RLX_GB_MR, bp, kpb, rows, cols, k0 > 0);
                    }
                }
        }
    }
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
 * in cache between repetitions, best of 5), GFLOP/s at 1 / 2 threads, AMX against VDPBF16PS:
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
    /* VDPBF16PS: the packed chunk and a B block per thread */
    int64_t rows = gb_a_rows(K);
    const int64_t mpad = (M + RLX_GB_MR - 1) / RLX_GB_MR * RLX_GB_MR;
    rows = rows < mpad ? rows : mpad;
    const size_t vdp = (size_t)(rows * ((K + 1) / 2) + (int64_t)rlx_pool_threads() * GB_B_UNITS);
    /* AMX: the packed chunk, whole pairs of row blocks */
    int64_t arows = ga_a_rows(K);
    const int64_t apad = (M + 2 * GA_MB - 1) / (2 * GA_MB) * (2 * GA_MB);
    arows = arows < apad ? arows : apad;
    const size_t amx = (size_t)(arows * ga_kpp(K));
    return vdp > amx ? vdp : amx;
}

/* out (M, N) = bf16(a) (M, K) @ b^T, b (N, K) bf16; M, K, N >= 1; scratch:
 * rlx_cpu_gemm_bf16_scratch(M, K, N) floats. */
void rlx_cpu_gemm_bf16(float *out, const float *a, const uint16_t *b, int64_t M, int64_t K, int64_t N, float *scratch)
{
    if (use_amx(K, N)) {
        gemm_amx(out, a, b, M, K, N, scratch);
        return;
    }
    const int64_t chunk = gb_a_rows(K), kp = (K + 1) / 2;
    const int64_t mpad = (M + RLX_GB_MR - 1) / RLX_GB_MR * RLX_GB_MR;
    const int64_t arows = chunk < mpad ? chunk : mpad;
    struct gb_ctx c = {.out = out,
                       .b = b,
                       .N = N,
                       .pa = {.a = a, .K = K, .mr = RLX_GB_MR, .kpp = kp, .dst = (uint32_t *)scratch},
                       .bpack = (uint32_t *)scratch + arows * kp,
                       .nblocks = (N + RLX_GB_NC - 1) / RLX_GB_NC};
    const int64_t threads = rlx_pool_threads();
    int64_t ntasks = c.nblocks < threads ? c.nblocks : threads;
    ntasks = ntasks < RLX_PIECES_MAX_PARTS ? ntasks : RLX_PIECES_MAX_PARTS;
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        c.pa.m0 = m0;
        c.pa.mrows = M - m0 < chunk ? M - m0 : chunk;
        gb_pack_chunk(&c.pa);
        rlx_pieces_init(&c.blocks, c.nblocks, (int)ntasks);
        rlx_parallel_for(ntasks, 1, gb_task, &c);
    }
}
