/*
 * quant_act.c - the activations of the block-type products quantised, one row at a time
 * (rlx_cpu_quant_row): x (K) -> q (K) int8, d (K / bs) f32, sums of each 16 q (K / 16), in blocks of
 * bs = 32 or 256, by the rule quant.c's header states, the same bits on every path (scalar, AVX2,
 * AVX-512). Called by quant.c's decode and sgemm paths and by quant_gemm.c's packing tasks.
 */
#include "backends/cpu/cpu.h"

#include <math.h>
#include <string.h>

/* d of a block from the bits of its largest |x|; *id the factor q = x * id is rounded from
 * (0 for a zero, tiny or non-finite block; the caller writes q = 0 where d is NaN). */
static inline float block_scale(uint32_t amax_bits, float *id)
{
    if (amax_bits >= 0x7f800000u) {
        *id = 0.0f;
        return NAN;
    }
    float amax;
    memcpy(&amax, &amax_bits, 4);
    if (amax < 0x1p-96f) {
        *id = 0.0f;
        return 0.0f;
    }
    *id = 127.0f / amax;
    return amax / 127.0f;
}

static void zero_block(int8_t *q, int16_t *sums, int64_t bs)
{
    memset(q, 0, (size_t)bs);
    memset(sums, 0, (size_t)(bs / 16) * sizeof *sums);
}

static void quant_row_scalar(int8_t *q, float *d, int16_t *sums, const float *x, int64_t K, int64_t bs)
{
    for (int64_t b = 0; b < K / bs; b++) {
        const float *xb = x + b * bs;
        uint32_t m = 0;
        for (int64_t i = 0; i < bs; i++) {
            uint32_t u;
            memcpy(&u, &xb[i], 4);
            u &= 0x7fffffffu;
            m = u > m ? u : m;
        }
        float id;
        d[b] = block_scale(m, &id);
        if (d[b] != d[b]) {
            zero_block(q + b * bs, sums + b * bs / 16, bs);
            continue;
        }
        for (int64_t i = 0; i < bs; i += 16) {
            int s = 0;
            for (int64_t j = i; j < i + 16; j++) {
                /* round to nearest even: exact for |v| < 2^22, as the vector conversions */
                const int v = (int)((xb[j] * id + 12582912.0f) - 12582912.0f);
                q[b * bs + j] = (int8_t)v;
                s += v;
            }
            sums[(b * bs + i) / 16] = (int16_t)s;
        }
    }
}

__attribute__((target("avx2,fma"))) static void quant_row_avx2(int8_t *q, float *d, int16_t *sums, const float *x,
                                                               int64_t K, int64_t bs)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    for (int64_t b = 0; b < K / bs; b++) {
        const float *xb = x + b * bs;
        __m256i m = _mm256_setzero_si256();
        for (int64_t i = 0; i < bs; i += 8)
            m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + i)), absmask));
        __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
        m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
        float id;
        d[b] = block_scale((uint32_t)_mm_cvtsi128_si32(m4), &id);
        if (d[b] != d[b]) {
            zero_block(q + b * bs, sums + b * bs / 16, bs);
            continue;
        }
        const __m256 vid = _mm256_set1_ps(id);
        for (int64_t i = 0; i < bs; i += 16) {
            const __m256i v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i), vid));
            const __m256i v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8), vid));
            const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xd8); /* 16 int16 in order */
            _mm_storeu_si128((__m128i *)(q + b * bs + i),
                             _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
            __m256i s = _mm256_add_epi32(v0, v1);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            sums[(b * bs + i) / 16] = (int16_t)_mm_cvtsi128_si32(s4);
        }
    }
}

/* the sums of v0's and v1's 16 int32 (each within int16: 16 values of [-128, 127]) into s[0], s[1]:
 * pairs of lanes added across the two vectors, then the four 128-bit lanes (the same integers as a
 * reduction of each, in fewer shuffles) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void sums2(int16_t *s, __m512i v0, __m512i v1)
{
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    const __m512i c = _mm512_add_epi32(a, _mm512_shuffle_epi32(a, _MM_PERM_BADC)); /* v0 v1 v0 v1 per lane */
    const __m256i x = _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
    const __m128i y = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    const int32_t w = _mm_cvtsi128_si32(_mm_packs_epi32(y, y));
    memcpy(s, &w, 4);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void quant_row_avx512(int8_t *q, float *d, int16_t *sums,
                                                                                  const float *x, int64_t K, int64_t bs)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    for (int64_t b = 0; b < K / bs; b++) {
        const float *xb = x + b * bs;
        __m512i m = _mm512_setzero_si512();
        for (int64_t i = 0; i < bs; i += 16)
            m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(xb + i), absmask));
        float id;
        d[b] = block_scale((uint32_t)_mm512_reduce_max_epu32(m), &id);
        if (d[b] != d[b]) {
            zero_block(q + b * bs, sums + b * bs / 16, bs);
            continue;
        }
        const __m512 vid = _mm512_set1_ps(id);
        for (int64_t i = 0; i < bs; i += 32) { /* bs: a multiple of 32 */
            __m512i v[2];
            for (int h = 0; h < 2; h++) {
                v[h] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + i + 16 * h), vid));
                _mm_storeu_si128((__m128i *)(q + b * bs + i + 16 * h), _mm512_cvtsepi32_epi8(v[h]));
            }
            sums2(sums + (b * bs + i) / 16, v[0], v[1]);
        }
    }
}

/* q, d, sums of one row of K; bs the block (32 or 256) */
void rlx_cpu_quant_row(int8_t *q, float *d, int16_t *sums, const float *x, int64_t K, int64_t bs)
{
    const int isa = rlx_cpu_isa();
    if (isa >= RLX_CPU_ISA_AVX512)
        quant_row_avx512(q, d, sums, x, K, bs);
    else if (isa == RLX_CPU_ISA_AVX2)
        quant_row_avx2(q, d, sums, x, K, bs);
    else
        quant_row_scalar(q, d, sums, x, K, bs);
}
