/*
 * lowp.c - 16-bit weights on the cpu table: which vector ISA this machine runs (asked once of
 * cpuid, so valgrind, which hides AVX-512, gets the AVX2 path; RLX_CPU_ISA can lower it), the
 * exact widening of bf16 / f16 rows to f32 that the matmul panels and the embedding gather share,
 * the rounding of f32 activations to bf16 that matmul_lowp applies for bf16 weights, and
 * embedding_lowp itself.
 *
 * Widening is exact: bf16 is the top half of an f32 (bits << 16); f16 goes through the IEEE
 * conversion (F16C vcvtph2ps in the vector paths, rlx_f16_to_f32 in the scalar one), subnormals,
 * infinities and NaNs included. Widening never rounds; nothing here may allocate or fail.
 */
#include "backends/cpu/cpu.h"

#include "core/core.h"
#include "backends/cpu/pool.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * ISA
 * ------------------------------------------------------------------------------------------- */

/* AMX tiles with bf16 multiplies, usable by this process: cpuid leaf 7 subleaf 0 EDX bits 22
 * (AMX-BF16) and 24 (AMX-TILE); the OS saves the tile state (XCR0 bits 17 XTILECFG and 18
 * XTILEDATA, read with xgetbv where cpuid reports OSXSAVE); and Linux grants this process the
 * tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: the permission is the
 * process's, every thread's; without it the first tile instruction raises SIGILL). Elsewhere than
 * Linux: not used. */
static int amx_usable(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}

/* From cpuid, capped by the environment variable RLX_CPU_ISA ("scalar", "avx2", "avx512": AVX-512
 * without its BF16 dot products, or "avx512bf16": without AMX; it can only lower the choice),
 * which lets tests run the paths this machine would not pick. AVX512_BF16 is cpuid leaf 7
 * subleaf 1, EAX bit 5 (asked directly: older compilers' __builtin_cpu_supports lacks the name).
 * AMX is asked only where AVX512_BF16 is there and allowed (so RLX_CPU_ISA below it, or valgrind,
 * which hides AVX-512, never asks the kernel for the tile permission). */
static int detect_isa(void)
{
    unsigned a, b, c, d;
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    __builtin_cpu_init();
    int isa = RLX_CPU_ISA_SCALAR;
    if (f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
        isa = RLX_CPU_ISA_AVX512;
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) isa = RLX_CPU_ISA_AVX512_BF16;
    } else if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        isa = RLX_CPU_ISA_AVX2;
    }
    const char *cap = getenv("RLX_CPU_ISA");
    int limit = RLX_CPU_ISA_TOP;
    if (cap && strcmp(cap, "scalar") == 0)
        limit = RLX_CPU_ISA_SCALAR;
    else if (cap && strcmp(cap, "avx2") == 0)
        limit = RLX_CPU_ISA_AVX2;
    else if (cap && strcmp(cap, "avx512") == 0)
        limit = RLX_CPU_ISA_AVX512;
    else if (cap && strcmp(cap, "avx512bf16") == 0)
        limit = RLX_CPU_ISA_AVX512_BF16;
    if (isa == RLX_CPU_ISA_AVX512_BF16 && limit > isa && amx_usable()) isa = RLX_CPU_ISA_AMX;
    return isa < limit ? isa : limit;
}

static atomic_int isa_cap = RLX_CPU_ISA_TOP;

/* What detect_isa finds (cached; a racing first call computes the same value) */
int rlx_cpu_isa_native(void)
{
    static atomic_int isa = -1;
    int v = atomic_load_explicit(&isa, memory_order_relaxed);
    if (v < 0) {
        v = detect_isa();
        atomic_store_explicit(&isa, v, memory_order_relaxed);
    }
    return v;
}

/* The vector paths this machine may take, capped by rlx_cpu_isa_cap. */
int rlx_cpu_isa(void)
{
    const int v = rlx_cpu_isa_native(), cap = atomic_load_explicit(&isa_cap, memory_order_relaxed);
    return v < cap ? v : cap;
}

int rlx_cpu_isa_cap(int cap) { return atomic_exchange_explicit(&isa_cap, cap, memory_order_relaxed); }

/* AVX512_VNNI (cpuid leaf 7 subleaf 0, ECX bit 11), asked once; usable only while rlx_cpu_isa()
 * allows AVX-512 (so valgrind, RLX_CPU_ISA=avx2 and rlx_cpu_isa_cap below AVX-512 turn it off). */
int rlx_cpu_avx512_vnni(void)
{
    static atomic_int vnni = -1;
    int v = atomic_load_explicit(&vnni, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) ? 1 : 0;
        atomic_store_explicit(&vnni, v, memory_order_relaxed);
    }
    return v && rlx_cpu_isa() >= RLX_CPU_ISA_AVX512;
}

/* AMX-INT8 (cpuid leaf 7 subleaf 0, EDX bit 25), asked once; usable only while rlx_cpu_isa() is
 * AMX (the tile state granted, and not capped below). */
int rlx_cpu_amx_int8(void)
{
    static atomic_int int8 = -1;
    int v = atomic_load_explicit(&int8, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25)) ? 1 : 0;
        atomic_store_explicit(&int8, v, memory_order_relaxed);
    }
    return v && rlx_cpu_isa() >= RLX_CPU_ISA_AMX;
}

/* How far ahead (bytes) the bf16 VDPBF16PS matvec (matmul.c) asks for weights, by the CPU's
 * vendor (cpuid leaf 0), asked once: each machine's measured best. AMD ("AuthenticAMD", the Zen 4;
 * the Zen 5 not measured): 2 KiB. Others (the Intel Xeon): RLX_QMV_PF, 6 KiB. Measured on the
 * Zen 4, decode steps with the distance switched block by block in one process (the machine's
 * bandwidth drifted between processes by up to 1.6x), tok/s at 1 thread, 6 KiB / none / 1 / 2 / 3 /
 * 4 KiB: Qwen3-0.6B bf16 17.1 / 20.3 / 21.8 / 20.1 / 18.6 / -, Llama-3.2-1B bf16 10.4 / 8.8 / 12.4 /
 * 12.6 / 12.4 / 12.1 (paired, 2 KiB against 6 KiB: 1.22x and 1.20x); at 2 threads 1.02x and 1.04x.
 * On the Xeon 6 KiB took one 512 MiB matvec from 0.84x the read probe (none) to 0.98-1.0x, 12 KiB
 * 0.92-0.99x (2 KiB not measured there). The block-type kernels keep 6 KiB everywhere: on the
 * Zen 4 at 1 thread 2 KiB made Qwen3-0.6B Q4_K_M and Q8_0 steps 0.65x and 0.69x as fast. */
int64_t rlx_cpu_bf16_prefetch(void)
{
    static atomic_int dist = -1;
    int v = atomic_load_explicit(&dist, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        const int amd = __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u &&
                        c == 0x444d4163u; /* "Auth" "enti" "cAMD" */
        v = amd ? 2048 : RLX_QMV_PF;
        atomic_store_explicit(&dist, v, memory_order_relaxed);
    }
    return v;
}

/* ---------------------------------------------------------------------------------------------
 * Rounding to bf16: dst (n) = src (n) rounded to the nearest bf16 (ties to even, NaN quieted),
 * as f32 (rlx_cpu_round_bf16) or as bf16 halves (rlx_cpu_pack_bf16); the same bits as
 * rlx_cpu_round_bf16_1 on every path.
 * ------------------------------------------------------------------------------------------- */

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void round_bf16_avx512(float *dst, const float *src,
                                                                                   int64_t n)
{
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512i r = rlx_cpu_round_bf16_512(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i)));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_and_si512(r, top)));
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pack_bf16_avx512(uint16_t *dst, const float *src,
                                                                                  int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512i r = rlx_cpu_round_bf16_512(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i)));
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
}

__attribute__((target("avx2"))) static void round_bf16_avx2(float *dst, const float *src, int64_t n)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), abs = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x00400000);
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
        const __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
        /* |x| > inf as signed 32-bit (both sides non-negative) */
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
        const __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(x, quiet), nan);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_and_si256(v, top)));
    }
    for (; i < n; i++) dst[i] = rlx_cpu_round_bf16_1(src[i]);
}

void rlx_cpu_round_bf16(float *dst, const float *src, int64_t n)
{
    const int isa = rlx_cpu_isa();
    if (isa >= RLX_CPU_ISA_AVX512)
        round_bf16_avx512(dst, src, n);
    else if (isa == RLX_CPU_ISA_AVX2)
        round_bf16_avx2(dst, src, n);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = rlx_cpu_round_bf16_1(src[i]);
}

void rlx_cpu_pack_bf16(uint16_t *dst, const float *src, int64_t n)
{
    if (rlx_cpu_isa() >= RLX_CPU_ISA_AVX512) {
        pack_bf16_avx512(dst, src, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const float r = rlx_cpu_round_bf16_1(src[i]);
        uint32_t u;
        memcpy(&u, &r, 4);
        dst[i] = (uint16_t)(u >> 16);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Widening: dst (n) f32 = src (n) bf16 / f16
 * ------------------------------------------------------------------------------------------- */

__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) static void widen_avx512(float *dst, const uint16_t *src,
                                                                                   int dtype, int64_t n)
{
    int64_t i = 0;
    if (dtype == RLX_BF16) {
        for (; i + 16 <= n; i += 16) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
        }
        if (i < n) {
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
            __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
            _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
        }
    } else {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
        if (i < n) {
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
            _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
        }
    }
}

__attribute__((target("avx2,f16c"))) static void widen_avx2(float *dst, const uint16_t *src, int dtype, int64_t n)
{
    int64_t i = 0;
    if (dtype == RLX_BF16) {
        for (; i + 8 <= n; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
        }
        for (; i < n; i++) dst[i] = rlx_bf16_to_f32(src[i]);
    } else {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
        for (; i < n; i++) dst[i] = rlx_f16_to_f32(src[i]);
    }
}

static void widen_scalar(float *dst, const uint16_t *src, int dtype, int64_t n)
{
    if (dtype == RLX_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = rlx_bf16_to_f32(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = rlx_f16_to_f32(src[i]);
}

/* dst (n) f32 = src (n) of dtype RLX_BF16 / RLX_F16, widened exactly */
void rlx_cpu_widen(float *dst, const uint16_t *src, int dtype, int64_t n)
{
    switch (rlx_cpu_isa()) {
    case RLX_CPU_ISA_AMX:
    case RLX_CPU_ISA_AVX512_BF16:
    case RLX_CPU_ISA_AVX512: widen_avx512(dst, src, dtype, n); break;
    case RLX_CPU_ISA_AVX2: widen_avx2(dst, src, dtype, n); break;
    default: widen_scalar(dst, src, dtype, n);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Narrowing: dst (n) f32 / f16 / bf16 = src (n) f32, rounded to nearest even
 * ------------------------------------------------------------------------------------------- */

/* F16C's vcvtps2ph with rounding to nearest even: the IEEE conversion (subnormals, overflow to
 * inf, NaN quieted with its payload's top bits), the same bits as rlx_f32_to_f16. */
__attribute__((target("avx2,f16c"))) static void narrow_f16_avx2(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = rlx_f32_to_f16(src[i]);
}

void rlx_cpu_convert_f32(void *dst, int dtype, const float *src, int64_t n)
{
    if (dtype == RLX_F32)
        memmove(dst, src, (size_t)n * sizeof(float));
    else if (dtype == RLX_BF16)
        rlx_cpu_pack_bf16(dst, src, n);
    else if (rlx_cpu_isa() >= RLX_CPU_ISA_AVX2)
        narrow_f16_avx2(dst, src, n);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = rlx_f32_to_f16(src[i]);
}

/* ---------------------------------------------------------------------------------------------
 * embedding_lowp
 * ------------------------------------------------------------------------------------------- */

struct emb_ctx {
    float *out;
    const uint16_t *table;
    const int32_t *ids;
    int64_t d;
    int dtype;
};

static void emb_rows(void *p, int64_t begin, int64_t end)
{
    const struct emb_ctx *c = p;
    for (int64_t r = begin; r < end; r++)
        rlx_cpu_widen(c->out + r * c->d, c->table + (int64_t)c->ids[r] * c->d, c->dtype, c->d);
}

/* out (n, d) f32 = table (V, d) bf16 / f16 rows ids (n), widened exactly */
void rlx_cpu_embedding_lowp(float *out, const void *table, int dtype, const int32_t *ids, int64_t n, int64_t d)
{
    struct emb_ctx c = {.out = out, .table = table, .ids = ids, .d = d, .dtype = dtype};
    rlx_parallel_for(n, rlx_cpu_row_grain(RLX_CPU_GRAIN_CHEAP, d), emb_rows, &c);
}
