/*
 * gemm16_avx2.c - prefill products of 16-bit weights with AVX2 + FMA: out (M, N) = a (M, K) @
 * widen(b)^T, b (N, K) bf16 or f16, on the pool's threads, for machines whose best ISA is AVX2
 * (rlx_cpu_isa() == RLX_CPU_ISA_AVX2; matmul.c decides when to call it). It replaces widening
 * panels of b to f32 for OpenBLAS's sgemm there, whose threads also spun into the pool's next
 * region (attention.c's note).
 *
 * Semantics (the matmul_lowp contract): for bf16 weights `a` has been rounded to bf16 by the caller
 * (rlx_cpu_gemm16_prep), so every product is an exact product of two bf16 values; f16 weights are
 * widened exactly (vcvtph2ps) and multiply `a` as it is. Products are summed in f32.
 *
 * Layout. No packing of b: a tile reads its weight rows where they are, 16 bf16 (one 32-byte load) or
 * 8 f16 (16 bytes) at a time, widened in registers. For bf16 a 32-bit lane of such a load holds the
 * weights of k = 2j (low half) and 2j + 1 (high half), so `bits << 16` gives the even ones as f32 and
 * `bits & 0xffff0000` the odd ones: two instructions widen 16 weights. rlx_cpu_gemm16_prep writes the
 * rows of `a` to match: in each whole group of 16 values of k, the 8 even ones then the 8 odd ones
 * (rounded to bf16); the last K % 16 values in order. f16 rows of `a` are used in place.
 *
 * Tile: RLX_G16_MR = 3 rows of `a` x RLX_G16_NR = 4 weight rows, 12 accumulators of 8 lanes over a
 * block of k (even then odd halves for bf16, in turn per group of 16), then each summed across its
 * lanes; the K % 16 (bf16) / K % 8 (f16) last values are added in order, scalar, in the last block.
 * Each out element = its k blocks' sums added in order (the first stores): one fixed sequence of
 * operations for given shapes, whatever the thread count or the rows around it.
 * Blocking: the pool's threads take pieces of RLX_G16_NB weight rows (rlx_parallel_pieces: each its
 * own contiguous range first, then what is left of the others'); within a piece, for each block of
 * RLX_G16_KC values of k, for each tile row of `a` (3 x KC floats = 12 KiB, L1-resident) every tile
 * of the piece's weight rows (64 x KC 16-bit values = 128 KiB, L2-resident) in turn.
 *
 * Measured: see matmul.c (rlx_cpu_matmul_lowp). Must never allocate, never read past `a` or b, and
 * never run unless cpuid reports AVX2, FMA and F16C (matmul.c checks through rlx_cpu_isa).
 */
#include "backends/cpu/cpu.h"

#include "backends/cpu/pool.h"
#include "core/core.h"

#include <immintrin.h>

#define G16_FN     __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define G16_TARGET __attribute__((target("avx2,fma,f16c")))

#define RLX_G16_MR      3
#define RLX_G16_NR      4    /* f16 */
#define RLX_G16_NR_BF16 3    /* bf16: its even / odd halves need a register more (the mask) */
#define RLX_G16_NB      48   /* weight rows per piece: whole tiles of either width */
#define RLX_G16_KC      1024 /* values of k per block: a multiple of 16 */

/* dst (M, K) = a rounded to bf16 (rlx_cpu_round_bf16_1) and arranged as the bf16 tiles read it:
 * each whole group of 16 values of k as its 8 even then its 8 odd ones, the last K % 16 in order.
 * dst may not alias a. */
G16_TARGET void rlx_cpu_gemm16_prep(float *dst, const float *a, int64_t M, int64_t K)
{
    rlx_cpu_round_bf16(dst, a, M * K);
    const int64_t k16 = K / 16 * 16;
    for (int64_t m = 0; m < M; m++) {
        float *row = dst + m * K;
        for (int64_t k = 0; k < k16; k += 16) {
            const __m256 lo = _mm256_loadu_ps(row + k), hi = _mm256_loadu_ps(row + k + 8);
            /* within each 128-bit lane: [lo0 lo2 hi0 hi2] / [lo1 lo3 hi1 hi3]; then the 64-bit
             * quarters in order 0, 2, 1, 3 */
            const __m256 ev = _mm256_shuffle_ps(lo, hi, 0x88), od = _mm256_shuffle_ps(lo, hi, 0xdd);
            _mm256_storeu_ps(row + k, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xd8)));
            _mm256_storeu_ps(row + k + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xd8)));
        }
    }
}

G16_FN float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float widen1(uint16_t h, int bf16) { return bf16 ? rlx_bf16_to_f32(h) : rlx_f16_to_f32(h); }

/* out[i * ldo + j] (+)= a row i . weight row j over k in [k0, k1), for i < MR, j < NR (both constants
 * after inlining); the vector part covers k0 .. min(k1, kv), kv = the end of whole groups of 16 (bf16)
 * / 8 (f16) values; with `last`, the values from kv to K are added in order after it. */
G16_FN void g16_tile(float *out, int64_t ldo, const float *a, const uint16_t *b, int64_t K, int64_t k0, int64_t k1,
                     int64_t kv, int accumulate, int last, const int bf16, const int MR, const int NR)
{
    __m256 acc[RLX_G16_MR][RLX_G16_NR];
    _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++)
        acc[i][j] = _mm256_setzero_ps();
    const int64_t ke = k1 < kv ? k1 : kv;
    if (bf16) {
        const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
        for (int64_t k = k0; k < ke; k += 16) {
            __m256 x[RLX_G16_MR];
            _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) x[i] = _mm256_loadu_ps(a + i * K + k);
            _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++)
            {
                const __m256i wb = _mm256_loadu_si256((const __m256i *)(b + j * K + k));
                const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(wb, 16));
                _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) acc[i][j] = _mm256_fmadd_ps(x[i], w, acc[i][j]);
            }
            _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) x[i] = _mm256_loadu_ps(a + i * K + k + 8);
            _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++)
            {
                const __m256i wb = _mm256_loadu_si256((const __m256i *)(b + j * K + k));
                const __m256 w = _mm256_castsi256_ps(_mm256_and_si256(wb, hi));
                _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) acc[i][j] = _mm256_fmadd_ps(x[i], w, acc[i][j]);
            }
        }
    } else {
        for (int64_t k = k0; k < ke; k += 8) {
            __m256 x[RLX_G16_MR];
            _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) x[i] = _mm256_loadu_ps(a + i * K + k);
            _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++)
            {
                const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + j * K + k)));
                _Pragma("GCC unroll 3") for (int i = 0; i < MR; i++) acc[i][j] = _mm256_fmadd_ps(x[i], w, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) {
            float s = hsum8(acc[i][j]);
            if (last)
                for (int64_t k = kv; k < K; k++) s += a[i * K + k] * widen1(b[j * K + k], bf16);
            float *o = out + i * ldo + j;
            *o = accumulate ? *o + s : s;
        }
}

struct g16_ctx {
    float *out;
    const float *a;
    const uint16_t *b;
    int bf16;
    int64_t M, K, N;
};

/* One tile of mr x nr (1..3 x 1..4), the sizes made constants. */
G16_FN void g16_any(float *out, int64_t ldo, const float *a, const uint16_t *b, int64_t K, int64_t k0, int64_t k1,
                    int64_t kv, int accumulate, int last, const int bf16, int mr, int nr)
{
#define G16_CASE(MM, NN)                                                                                               \
    case (MM)*8 + (NN): g16_tile(out, ldo, a, b, K, k0, k1, kv, accumulate, last, bf16, MM, NN); break;
    switch (mr * 8 + nr) {
        G16_CASE(3, 4)
        G16_CASE(3, 3)
        G16_CASE(3, 2)
        G16_CASE(3, 1)
        G16_CASE(2, 4)
        G16_CASE(2, 3)
        G16_CASE(2, 2)
        G16_CASE(2, 1)
        G16_CASE(1, 4)
        G16_CASE(1, 3)
        G16_CASE(1, 2)
        G16_CASE(1, 1)
    default: break;
    }
#undef G16_CASE
}

G16_FN void g16_piece(const struct g16_ctx *c, int64_t n0, int64_t n1, const int bf16)
{
    const int64_t K = c->K, N = c->N, kv = bf16 ? K / 16 * 16 : K / 8 * 8;
    const int nrmax = bf16 ? RLX_G16_NR_BF16 : RLX_G16_NR;
    for (int64_t k0 = 0; k0 < K; k0 += RLX_G16_KC) {
        const int64_t k1 = K - k0 < RLX_G16_KC ? K : k0 + RLX_G16_KC;
        const int last = k1 == K;
        for (int64_t m = 0; m < c->M; m += RLX_G16_MR) {
            const int mr = (int)(c->M - m < RLX_G16_MR ? c->M - m : RLX_G16_MR);
            for (int64_t n = n0; n < n1; n += nrmax) {
                const int nr = (int)(n1 - n < nrmax ? n1 - n : nrmax);
                g16_any(c->out + m * N + n, N, c->a + m * K, c->b + n * K, K, k0, k1, kv, k0 > 0, last, bf16, mr, nr);
            }
        }
    }
}

G16_TARGET static void g16_rows(void *p, int64_t n0, int64_t n1)
{
    const struct g16_ctx *c = p;
    if (c->bf16)
        g16_piece(c, n0, n1, 1);
    else
        g16_piece(c, n0, n1, 0);
}

/* out (M, N) = a (M, K) @ widen(b)^T, b (N, K) of dtype wt (RLX_BF16: `a` as rlx_cpu_gemm16_prep
 * wrote it; RLX_F16: `a` as it is); M, K, N >= 1. */
void rlx_cpu_gemm16_avx2(float *out, const float *a, const uint16_t *b, int wt, int64_t M, int64_t K, int64_t N)
{
    struct g16_ctx c = {.out = out, .a = a, .b = b, .bf16 = wt == RLX_BF16, .M = M, .K = K, .N = N};
    rlx_parallel_pieces(N, RLX_G16_NB, g16_rows, &c);
}
