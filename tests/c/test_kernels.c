/*
 * test_kernels.c - standalone parity test of the two host kernel tables and of the thread pool.
 * Every kernel of the "cpu" table runs on random inputs of odd sizes and is compared with the
 * "ref" table (normalized max error, max|cpu - ref| / max|ref|), under 1, 2 and 3 pool threads;
 * sizes include some big enough to make the cpu kernels split work. Outputs and scratch are
 * pre-filled with NaN / garbage and guarded at their ends, so an unwritten element, a read of
 * stale scratch or a write past the end fails. The ref table gets a few hand-computed checks of
 * its own (the thread pool itself: test_pool.c). Ends with rlx_set_num_threads(1), which joins every
 * worker, so valgrind sees no leaked thread.
 * Prints one line per failure, then exactly "N passed, M failed"; exits non-zero on failure.
 */
#include "backends/cpu/cpu.h"
#include "backends/kernels.h"
#include "backends/cpu/pool.h"
#include "core/core.h"
#include "rlx/rlx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL      1e-4
#define GUARD    16
#define SENTINEL 1234.5f

static int n_pass, n_fail;
static const struct rlx_kernels *CPU = &rlx_cpu_kernels, *REF = &rlx_ref_kernels;

static void result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int under_valgrind(void); /* or TSan */

static void result(int ok, const char *fmt, ...)
{
    if (ok) {
        n_pass++;
        return;
    }
    n_fail++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------
 * Buffers: random, NaN-filled, guarded
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* uniform in [lo, hi) */
static float rng_f(float lo, float hi) { return lo + (hi - lo) * (float)(rng_u32() & 0xFFFFFF) / (float)0x1000000; }

/* n floats followed by GUARD sentinels; the caller frees. */
static float *buf(int64_t n)
{
    float *p = malloc((size_t)(n + GUARD) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    for (int i = 0; i < GUARD; i++) p[n + i] = SENTINEL;
    return p;
}

static float *rand_buf(int64_t n, float lo, float hi)
{
    float *p = buf(n);
    for (int64_t i = 0; i < n; i++) p[i] = rng_f(lo, hi);
    return p;
}

static int guard_ok(const float *p, int64_t n)
{
    for (int i = 0; i < GUARD; i++)
        if (p[n + i] != SENTINEL) return 0;
    return 1;
}

/* Normalized max error of got vs want (n), or INFINITY on a NaN/inf mismatch or broken guard. */
static double nerr(const float *got, const float *want, int64_t n)
{
    double maxd = 0.0, maxr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i]) || isinf(got[i]) || isinf(want[i])) {
            if (!(got[i] == want[i])) return INFINITY;
            continue;
        }
        double d = fabs((double)got[i] - (double)want[i]);
        maxd = d > maxd ? d : maxd;
        maxr = fabs(want[i]) > maxr ? fabs(want[i]) : maxr;
    }
    if (!guard_ok(got, n) || !guard_ok(want, n)) return INFINITY;
    return maxr > 0.0 ? maxd / maxr : maxd;
}

static void compare(const float *got, const float *want, int64_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void compare(const float *got, const float *want, int64_t n, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    double e = nerr(got, want, n);
    result(e <= TOL, "%s [threads=%d]: normalized error %.3g", what, rlx_pool_threads(), e);
}

/* ---------------------------------------------------------------------------------------------
 * Kernel parity: cpu vs ref
 * ------------------------------------------------------------------------------------------- */

static void test_matmul(void)
{
    const int64_t Ms[] = {1, 3, 17, 64}, Ks[] = {5, 64, 77}, Ns[] = {1, 7, 130};
    for (int mi = 0; mi < 4; mi++)
        for (int ki = 0; ki < 3; ki++)
            for (int ni = 0; ni < 3; ni++)
                for (int tb = 0; tb < 2; tb++) {
                    int64_t M = Ms[mi], K = Ks[ki], N = Ns[ni];
                    float *a = rand_buf(M * K, -1, 1), *b = rand_buf(K * N, -1, 1);
                    float *o1 = buf(M * N), *o2 = buf(M * N);
                    CPU->matmul_f32(o1, a, b, M, K, N, tb);
                    REF->matmul_f32(o2, a, b, M, K, N, tb);
                    compare(o1, o2, M * N, "matmul M=%lld K=%lld N=%lld trans_b=%d", (long long)M, (long long)K,
                            (long long)N, tb);
                    free(a), free(b), free(o1), free(o2);
                }
}

/* n random 16-bit weights of dtype: bf16 the top half of a uniform [-1, 1) float, f16 a random
 * sign and mantissa with exponent 2^-4 .. 2^0; with specials, every 7th value is a subnormal,
 * zero, -0, an infinity or the largest finite f16 / a large bf16. */
static uint16_t *lowp_buf(int64_t n, int dtype, int specials)
{
    uint16_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == RLX_BF16) {
            float f = rng_f(-1, 1);
            uint32_t bits;
            memcpy(&bits, &f, 4);
            p[i] = (uint16_t)(bits >> 16);
        } else {
            p[i] = (uint16_t)((rng_u32() & 0x8000) | ((11 + rng_u32() % 5) << 10) | (rng_u32() & 0x3ff));
        }
        if (specials && i % 7 == 3) {
            const uint16_t f16[] = {0x0001, 0x03ff, 0x8200, 0x0000, 0x8000, 0x7c00, 0xfc00, 0x7bff};
            const uint16_t bf16[] = {0x0001, 0x007f, 0x8040, 0x0000, 0x8000, 0x7f80, 0xff80, 0x7f7f};
            p[i] = (dtype == RLX_BF16 ? bf16 : f16)[rng_u32() % 8];
        }
    }
    return p;
}

/* Normalized error bound for a K-long f32 dot product against the double-accumulated oracle. */
static double dot_tol(int64_t K) { return 1e-5 + 1.2e-7 * (double)K; }

static void lowp_case(int dtype, int64_t M, int64_t K, int64_t N)
{
    const char *dn = dtype == RLX_BF16 ? "bf16" : "f16";
    float *a = rand_buf(M * K, -1, 1), *o1 = buf(M * N), *o2 = buf(M * N);
    uint16_t *b = lowp_buf(N * K, dtype, 0);
    const int64_t ns = (int64_t)CPU->matmul_lowp_scratch(M, K, N);
    float *scratch = buf(ns);
    for (int64_t i = 0; i < ns; i++) scratch[i] = 3.0e38f;
    float *rs = buf((int64_t)REF->matmul_lowp_scratch(M, K, N));
    CPU->matmul_lowp(o1, a, b, dtype, M, K, N, scratch);
    REF->matmul_lowp(o2, a, b, dtype, M, K, N, rs);
    const double e = nerr(o1, o2, M * N), tol = dot_tol(K);
    result(e <= tol, "matmul_lowp %s M=%lld K=%lld N=%lld [threads=%d, isa=%d]: normalized error %.3g > %.3g", dn,
           (long long)M, (long long)K, (long long)N, rlx_pool_threads(), rlx_cpu_isa(), e, tol);
    result(guard_ok(scratch, ns), "matmul_lowp %s M=%lld K=%lld N=%lld: wrote past its scratch", dn, (long long)M,
           (long long)K, (long long)N);
    free(a), free(b), free(o1), free(o2), free(scratch), free(rs);
}

static void test_matmul_lowp(void)
{
    /* M = 4, 5, 7, 8: the bf16 GEMM's lanes path (4 .. 8 rows without AMX); 9, 14: its one-vector
     * blocks; 40: a two-vector block then a one-vector block */
    const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 14, 17, 40, 64}, Ks[] = {1, 5, 16, 33, 77, 300}, Ns[] = {1, 7, 130};
    for (int dt = 0; dt < 2; dt++) {
        const int dtype = dt ? RLX_F16 : RLX_BF16;
        for (int mi = 0; mi < 12; mi++)
            for (int ki = 0; ki < 6; ki++)
                for (int ni = 0; ni < 3; ni++) lowp_case(dtype, Ms[mi], Ks[ki], Ns[ni]);
        lowp_case(dtype, 1, 1000, 701); /* the matvec split over threads */
        lowp_case(dtype, 3, 1031, 333);
        lowp_case(dtype, 5, 4100, 500); /* three panels, the last one short */
    }
}

static const char *isa_name(int isa)
{
    return isa == RLX_CPU_ISA_AMX           ? "amx"
           : isa == RLX_CPU_ISA_AVX512_BF16 ? "avx512bf16"
           : isa == RLX_CPU_ISA_AVX512      ? "avx512"
           : isa == RLX_CPU_ISA_AVX2        ? "avx2"
                                            : "scalar";
}

/* Normalized error of got vs want where want may hold NaN / inf: NaN exactly where want has
 * NaN, the same infinity where want has one, the finite rest within the normalized bound. */
static double nerr_special(const float *got, const float *want, int64_t n)
{
    double maxd = 0.0, maxr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i]) || isnan(got[i])) {
            if (!(isnan(want[i]) && isnan(got[i]))) return INFINITY;
        } else if (isinf(want[i]) || isinf(got[i])) {
            if (got[i] != want[i]) return INFINITY;
        } else {
            const double d = fabs((double)got[i] - (double)want[i]);
            maxd = d > maxd ? d : maxd;
            maxr = fabs(want[i]) > maxr ? fabs(want[i]) : maxr;
        }
    }
    if (!guard_ok(got, n) || !guard_ok(want, n)) return INFINITY;
    return maxr > 0.0 ? maxd / maxr : maxd;
}

/* bf16 rounding of `a` on every path: K = N = 1 with the weight 1.0 gives out = bf16(a) exactly
 * (one product of two bf16 values). M = 20 rows (the GEMM where the machine has AVX512_BF16),
 * the first 6 rows alone (two matvec passes), each row alone (the matvec). VDPBF16PS (the GEMM
 * and the matvec where the machine has AVX512_BF16) counts subnormals as zero: there a
 * subnormal may come out as a zero of its sign. */
static void lowp_rounding_case(void)
{
    const uint32_t bits[20] = {
        0x3f808000,             /* 1 + 2^-8: tie, to even -> 1 */
        0x3f818000,             /* 1 + 3 2^-8: tie, to even -> 1 + 2^-6 */
        0x3f7f8000,             /* 1 - 2^-9: tie between 1 - 2^-8 and 1, to even -> 1 */
        0x3f808001,             /* just past the tie -> 1 + 2^-7 */
        0xbf818000,             /* negative tie */
        0x7f7fffff,             /* FLT_MAX -> inf */
        0xff7fffff,             /* -FLT_MAX -> -inf */
        0x7f7f0000,             /* the largest bf16 */
        0x7f7f7fff,             /* below the midpoint to 2^128: stays the largest bf16 */
        0x7f7f8000,             /* the midpoint, tie, to even -> inf */
        0x7f800000, 0xff800000, /* +-inf */
        0x7fc00000, 0xffc00001, /* NaN */
        0x7f800001,             /* NaN with only a low mantissa bit: must not become inf */
        0x00000000, 0x80000000, /* +-0 */
        0x00018000,             /* f32 subnormal, tie -> bf16 subnormal 0x0002 */
        0x00008000,             /* f32 subnormal tie -> 0 */
        0x3eaaaaab,             /* 1/3 */
    };
    float a[20], w1[20], w2[6], w3[20];
    memcpy(a, bits, sizeof a);
    const uint16_t one = 0x3f80;
    float *ref = buf(20), *got = buf(20), *rs = buf(20), *sc = buf((int64_t)CPU->matmul_lowp_scratch(20, 1, 1));
    REF->matmul_lowp(ref, a, &one, RLX_BF16, 20, 1, 1, rs);
    CPU->matmul_lowp(got, a, &one, RLX_BF16, 20, 1, 1, sc);
    memcpy(w1, got, 20 * sizeof(float));
    CPU->matmul_lowp(got, a, &one, RLX_BF16, 6, 1, 1, sc);
    memcpy(w2, got, 6 * sizeof(float));
    for (int i = 0; i < 20; i++) {
        CPU->matmul_lowp(got, a + i, &one, RLX_BF16, 1, 1, 1, sc);
        w3[i] = got[0];
    }
    const int daz = rlx_cpu_isa() >= RLX_CPU_ISA_AVX512_BF16;
    for (int i = 0; i < 20; i++) {
        const float want = ref[i];
        const float g[3] = {w1[i], i < 6 ? w2[i] : want, w3[i]};
        for (int p = 0; p < 3; p++) {
            const int same = (isnan(want) && isnan(g[p])) || (g[p] == want && signbit(g[p]) == signbit(want)) ||
                             (daz && fabsf(want) < 0x1p-126f && g[p] == 0.0f && signbit(g[p]) == signbit(want));
            uint32_t gb, wb;
            memcpy(&gb, &g[p], 4), memcpy(&wb, &want, 4);
            result(same, "matmul_lowp bf16 rounding of 0x%08x [isa=%s, %s]: got 0x%08x, ref 0x%08x", bits[i],
                   isa_name(rlx_cpu_isa()),
                   p == 0   ? "M=20"
                   : p == 1 ? "M=6"
                            : "M=1",
                   gb, wb);
        }
    }
    free(ref), free(got), free(rs), free(sc);
}

/* NaN / inf / values that round to inf in `a`, in a product with K crossing the GEMM's k block:
 * the rows that hold them come out NaN / inf exactly as the oracle's. */
static void lowp_special_case(int64_t M, int64_t K, int64_t N)
{
    float *a = rand_buf(M * K, -1, 1), *o1 = buf(M * N), *o2 = buf(M * N);
    uint16_t *b = lowp_buf(N * K, RLX_BF16, 0);
    a[1 * K + 3] = NAN;
    a[2 * K + K - 1] = INFINITY;
    a[3 * K + K / 2] = -3.4e38f; /* rounds to -inf */
    a[(M - 1) * K] = 3.38e38f;   /* rounds to the largest bf16: finite */
    float *sc = buf((int64_t)CPU->matmul_lowp_scratch(M, K, N)), *rs = buf((int64_t)REF->matmul_lowp_scratch(M, K, N));
    CPU->matmul_lowp(o1, a, b, RLX_BF16, M, K, N, sc);
    REF->matmul_lowp(o2, a, b, RLX_BF16, M, K, N, rs);
    const double e = nerr_special(o1, o2, M * N), tol = dot_tol(K);
    result(e <= tol, "matmul_lowp bf16 NaN/inf in a M=%lld K=%lld N=%lld [isa=%s]: normalized error %.3g > %.3g",
           (long long)M, (long long)K, (long long)N, isa_name(rlx_cpu_isa()), e, tol);
    free(a), free(b), free(o1), free(o2), free(sc), free(rs);
}

/* rlx_cpu_pack_bf16 gives the top halves of rlx_cpu_round_bf16_1, bit for bit: ties, NaNs,
 * values rounding to inf, subnormals, random values, a tail shorter than a vector. */
static void pack_bf16_case(void)
{
    const uint32_t special[] = {0x3f808000, 0x3f818000, 0x7f7fffff, 0xff7f8000, 0x7f800001, 0xffc00001,
                                0x7f800000, 0x00018000, 0x80008000, 0x00000000, 0x80000000};
    enum { n = 37 };
    float src[n];
    uint16_t got[n + 1];
    for (int i = 0; i < n; i++) {
        uint32_t u = i < (int)(sizeof special / sizeof *special) ? special[i] : rng_u32() ^ (rng_u32() << 16);
        memcpy(&src[i], &u, 4);
    }
    got[n] = 0xabcd; /* must stay */
    rlx_cpu_pack_bf16(got, src, n);
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        const float r = rlx_cpu_round_bf16_1(src[i]);
        uint32_t u;
        memcpy(&u, &r, 4);
        if (got[i] != (uint16_t)(u >> 16)) bad = i;
    }
    result(bad < 0 && got[n] == 0xabcd, "pack_bf16 [isa=%s]: element %d differs from round_bf16_1",
           isa_name(rlx_cpu_isa()), bad);
}

/* Every vector path this machine has (RLX_CPU_ISA caps lowered one by one, via rlx_cpu_isa_cap):
 * sizes that cross the GEMM's blocks (8-row microkernel, 32-column panels, 128-column blocks,
 * k blocks of 512, odd K; AMX: pairs of 16-row tiles, blocks of 32 weight rows with the last one
 * moved back to end at N, tiles of 32 values of k and a tail) and the matvec-passes / GEMM boundary
 * (M = 16 / 17). Under valgrind (no AVX-512:
 * AVX2 and scalar) a smaller set. */
static void test_matmul_lowp_isas(void)
{
    const int vg = under_valgrind(), native = rlx_cpu_isa();
    const int64_t Ms[] = {5, 7, 16, 17, 64, 130}, Ks[] = {1, 3, 16, 1000, 1001}, Ns[] = {1, 31, 33, 300};
    for (int isa = native; isa >= RLX_CPU_ISA_SCALAR; isa--) {
        rlx_cpu_isa_cap(isa);
        lowp_rounding_case();
        pack_bf16_case();
        for (int dt = 0; dt < 2; dt++) {
            const int dtype = dt ? RLX_F16 : RLX_BF16;
            for (int mi = 0; mi < 6; mi++)
                for (int ki = 0; ki < 5; ki++)
                    for (int ni = 0; ni < 4; ni++) {
                        const int64_t M = Ms[mi], K = Ks[ki], N = Ns[ni];
                        if (vg && (dt || M * K * N > 100000 || mi == 2 || mi == 3 || ni == 1)) continue;
                        lowp_case(dtype, M, K, N);
                    }
        }
        lowp_special_case(9, 1001, 33);
        if (!vg) {
            lowp_special_case(130, 1000, 300);
            lowp_case(RLX_BF16, 130, 8191, 33); /* packed A in two chunks; rounded a in two chunks */
            /* the AMX GEMM's edges: the least it takes (K = N = 32: one tile of k, one block of
             * weight rows), whole tiles everywhere, one whole tile of k and an odd tail */
            lowp_case(RLX_BF16, 32, 32, 32);
            lowp_case(RLX_BF16, 48, 1024, 64);
            lowp_case(RLX_BF16, 17, 33, 32);
        }
    }
    rlx_cpu_isa_cap(RLX_CPU_ISA_TOP);
}

/* The f32 matvec path (trans_b, M <= 4): each output is its row's dot product, the same whatever
 * the other rows of a; compared with the oracle with the K-scaled bound. */
static void test_matvec_f32(void)
{
    const int64_t Ks[] = {1, 15, 16, 17, 100, 1031}, Ns[] = {1, 5, 37, 700};
    for (int64_t M = 1; M <= 4; M++)
        for (int ki = 0; ki < 6; ki++)
            for (int ni = 0; ni < 4; ni++) {
                const int64_t K = Ks[ki], N = Ns[ni];
                float *a = rand_buf(M * K, -1, 1), *b = rand_buf(N * K, -1, 1);
                float *o1 = buf(M * N), *o2 = buf(M * N), *o3 = buf(N);
                CPU->matmul_f32(o1, a, b, M, K, N, 1);
                REF->matmul_f32(o2, a, b, M, K, N, 1);
                const double e = nerr(o1, o2, M * N), tol = dot_tol(K);
                result(e <= tol, "matvec f32 M=%lld K=%lld N=%lld [threads=%d]: normalized error %.3g > %.3g",
                       (long long)M, (long long)K, (long long)N, rlx_pool_threads(), e, tol);
                CPU->matmul_f32(o3, a + (M - 1) * K, b, 1, K, N, 1);
                result(memcmp(o3, o1 + (M - 1) * N, (size_t)N * sizeof(float)) == 0,
                       "matvec f32 M=%lld K=%lld N=%lld: last row differs from the same row alone", (long long)M,
                       (long long)K, (long long)N);
                free(a), free(b), free(o1), free(o2), free(o3);
            }
}

/* bf16 products of 4 .. 8 rows where the machine has AVX512_BF16 without AMX (gemm_bf16.c's lanes
 * path: 8 rows x 2 pairs of k in the lanes): each row the bits of the 17-row product (the VDPBF16PS
 * GEMM, whose results depend on K only) of that row with its odd pairs of k zeroed, plus that of
 * the row with its even pairs zeroed (a zero pair adds +-0 to a sum, which leaves it as it is); and
 * the bits of the same row inside an 8-row product; over odd K, K not a multiple of 4, partial
 * strips and partial blocks of weight rows. The bound against the oracle is lowp_case's. */
static void test_matmul_lowp_lanes(void)
{
    if (rlx_cpu_isa() != RLX_CPU_ISA_AVX512_BF16) return;
    const int64_t Ks[] = {1, 2, 3, 5, 31, 64, 65, 66, 77, 128, 300, 1031}, Ns[] = {1, 7, 8, 9, 17, 130};
    for (int64_t M = 4; M <= 8; M++)
        for (int ki = 0; ki < 12; ki++)
            for (int ni = 0; ni < 6; ni++) {
                const int64_t K = Ks[ki], N = Ns[ni], big = 17;
                float *a = rand_buf(big * K, -1, 1), *ae = buf(big * K), *ao = buf(big * K);
                float *o1 = buf(M * N), *o8 = buf(8 * N), *oe = buf(big * N), *oo = buf(big * N);
                for (int64_t i = 0; i < big * K; i++) { /* pair (i % K) / 2 of its row: even or odd */
                    const int odd = (int)((i % K) / 2 % 2);
                    ae[i] = odd ? 0.0f : a[i];
                    ao[i] = odd ? a[i] : 0.0f;
                }
                uint16_t *b = lowp_buf(N * K, RLX_BF16, 0);
                const int64_t n1 = (int64_t)CPU->matmul_lowp_scratch(M, K, N);
                const int64_t n2 = (int64_t)CPU->matmul_lowp_scratch(big, K, N);
                float *s1 = buf(n1), *s2 = buf(n2);
                CPU->matmul_lowp(o1, a + 3 * K, b, RLX_BF16, M, K, N, s1); /* rows 3 .. 3 + M of the 17 */
                CPU->matmul_lowp(o8, a + 3 * K, b, RLX_BF16, 8, K, N, s2);
                CPU->matmul_lowp(oe, ae, b, RLX_BF16, big, K, N, s2);
                CPU->matmul_lowp(oo, ao, b, RLX_BF16, big, K, N, s2);
                int same = 1;
                for (int64_t i = 0; i < M * N; i++) {
                    const float want = oe[3 * N + i] + oo[3 * N + i];
                    same &= memcmp(&o1[i], &want, sizeof want) == 0;
                }
                result(same,
                       "matmul_lowp bf16 M=%lld K=%lld N=%lld [threads=%d]: rows differ from the sums of their "
                       "even- and odd-pair products",
                       (long long)M, (long long)K, (long long)N, rlx_pool_threads());
                result(memcmp(o1, o8, (size_t)(M * N) * sizeof(float)) == 0,
                       "matmul_lowp bf16 M=%lld K=%lld N=%lld: rows differ from the same rows of an 8-row product",
                       (long long)M, (long long)K, (long long)N);
                result(guard_ok(s1, n1), "matmul_lowp bf16 M=%lld K=%lld N=%lld: wrote past its scratch", (long long)M,
                       (long long)K, (long long)N);
                free(a), free(ae), free(ao), free(b), free(o1), free(o8), free(oe), free(oo), free(s1), free(s2);
            }
}

static void test_embedding_lowp(void)
{
    const int64_t V = 50, ds[] = {1, 7, 16, 33, 130}, ns[] = {1, 3, 17, 3000};
    for (int dt = 0; dt < 2; dt++)
        for (int di = 0; di < 5; di++)
            for (int ni = 0; ni < 4; ni++) {
                const int dtype = dt ? RLX_F16 : RLX_BF16;
                const int64_t d = ds[di], n = ns[ni];
                uint16_t *table = lowp_buf(V * d, dtype, 1);
                float *o1 = buf(n * d), *o2 = buf(n * d);
                int32_t *ids = malloc((size_t)n * sizeof *ids);
                for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_u32() % V);
                CPU->embedding_lowp(o1, table, dtype, ids, n, d);
                REF->embedding_lowp(o2, table, dtype, ids, n, d);
                result(memcmp(o1, o2, (size_t)(n * d + GUARD) * sizeof(float)) == 0,
                       "embedding_lowp %s n=%lld d=%lld [threads=%d]: not bit-exact", dt ? "f16" : "bf16", (long long)n,
                       (long long)d, rlx_pool_threads());
                free(table), free(o1), free(o2), free(ids);
            }
}

/* Decode products give the same bits at 1, 2 and 3 threads (rows never change hands mid-sum). */
static void test_matvec_threads_bitwise(void)
{
    const int64_t M = 2, K = 1031, N = 2001;
    float *a = rand_buf(M * K, -1, 1), *bf = rand_buf(N * K, -1, 1), *want[3], *got = buf(M * N);
    uint16_t *bl = lowp_buf(N * K, RLX_BF16, 0);
    float *scratch = buf((int64_t)CPU->matmul_lowp_scratch(M, K, N));
    for (int w = 0; w < 3; w++) want[w] = buf(M * N);
    const int counts[] = {1, 2, 3};
    for (int ti = 0; ti < 3; ti++) {
        rlx_set_num_threads(counts[ti]);
        for (int w = 0; w < 2; w++) {
            float *o = ti == 0 ? want[w] : got;
            if (w == 0)
                CPU->matmul_f32(o, a, bf, M, K, N, 1);
            else
                CPU->matmul_lowp(o, a, bl, RLX_BF16, M, K, N, scratch);
            if (ti > 0)
                result(memcmp(o, want[w], (size_t)(M * N) * sizeof(float)) == 0,
                       "matvec %s at %d threads differs from 1 thread", w ? "bf16" : "f32", counts[ti]);
        }
    }
    free(a), free(bf), free(bl), free(got), free(scratch);
    for (int w = 0; w < 3; w++) free(want[w]);
    if (rlx_cpu_isa() < RLX_CPU_ISA_AVX512_BF16) return;
    /* the AVX-512 BF16 GEMM: each out element one fixed sequence whatever the thread count */
    const int64_t GM = 37, GK = 1001, GN = 700;
    float *ga = rand_buf(GM * GK, -1, 1), *g1 = buf(GM * GN), *g2 = buf(GM * GN);
    uint16_t *gb = lowp_buf(GN * GK, RLX_BF16, 0);
    for (int ti = 0; ti < 3; ti++) {
        rlx_set_num_threads(counts[ti]);
        float *gs = buf((int64_t)CPU->matmul_lowp_scratch(GM, GK, GN));
        CPU->matmul_lowp(ti ? g2 : g1, ga, gb, RLX_BF16, GM, GK, GN, gs);
        if (ti > 0)
            result(memcmp(g1, g2, (size_t)(GM * GN) * sizeof(float)) == 0,
                   "bf16 GEMM at %d threads differs from 1 thread", counts[ti]);
        free(gs);
    }
    free(ga), free(gb), free(g1), free(g2);
}

/* Distance in units in the last place between two finite floats of the same sign. */
static int64_t ulp_diff(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* The cpu table's vector exp: within 2 ulp of the correctly rounded expf on [-87.3, 88.3], and
 * its documented edges. */
static void test_exp16(void)
{
    int64_t worst = 0;
    float worst_x = 0.0f;
    for (int i = 0; i < 200000; i += 16) {
        rlx_cpu_v16 v, x;
        for (int l = 0; l < 16; l++) x[l] = -87.3f + (87.3f + 88.3f) * (float)(i + l) / 200000.0f;
        x[0] = i == 0 ? 0.0f : x[0];
        v = x;
        rlx_cpu_exp16(&v);
        for (int l = 0; l < 16; l++) {
            const int64_t d = ulp_diff(v[l], (float)exp((double)x[l]));
            if (d > worst) worst = d, worst_x = x[l];
        }
    }
    result(worst <= 2, "exp16: %lld ulp at x = %.9g", (long long)worst, worst_x);
    rlx_cpu_v16 v = {-INFINITY,         INFINITY,           NAN,      89.0f, -88.0f, 0.0f, 1.0f, -1.0f, -NAN,
                     88.3762626647949f, -87.3365478515625f, 88.37627f};
    rlx_cpu_exp16(&v);
    result(isnan(v[8]) && isfinite(v[9]) && v[9] >= 0x1p127f && v[10] > 0x1.fp-127f && v[10] < 0x1.01p-126f &&
               v[11] == INFINITY,
           "exp16 edges: -NaN -> %g, exp(88.3762627) = %g, exp(-87.3365479) = %g, exp(88.37627) = %g", v[8], v[9],
           v[10], v[11]);
    result(v[0] == 0.0f && v[1] == INFINITY && isnan(v[2]) && v[3] == INFINITY && v[4] == 0.0f && v[5] == 1.0f &&
               ulp_diff(v[6], (float)exp(1.0)) <= 1 && ulp_diff(v[7], (float)exp(-1.0)) <= 1,
           "exp16 edges: %g %g %g %g %g %g %.9g %.9g", v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

static void test_embedding(void)
{
    const int64_t V = 50, ds[] = {1, 7, 130}, ns[] = {1, 3, 17, 3000};
    for (int di = 0; di < 3; di++)
        for (int ni = 0; ni < 4; ni++) {
            int64_t d = ds[di], n = ns[ni];
            float *table = rand_buf(V * d, -1, 1), *o1 = buf(n * d), *o2 = buf(n * d);
            int32_t *ids = malloc((size_t)n * sizeof *ids);
            for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_u32() % V);
            CPU->embedding_f32(o1, table, ids, n, d);
            REF->embedding_f32(o2, table, ids, n, d);
            compare(o1, o2, n * d, "embedding n=%lld d=%lld", (long long)n, (long long)d);
            free(table), free(o1), free(o2), free(ids);
        }
}

static void test_norms(void)
{
    const int64_t rows_[] = {1, 3, 17, 5000}, ds[] = {5, 64, 77, 130};
    for (int ri = 0; ri < 4; ri++)
        for (int di = 0; di < 4; di++) {
            int64_t rows = rows_[ri], d = ds[di], n = rows * d;
            const float eps = 1e-6f;
            float *x = rand_buf(n, -2, 2), *y = rand_buf(n, -2, 2), *w = rand_buf(d, 0.5f, 1.5f);
            float *o1 = buf(n), *o2 = buf(n), *s1 = buf(n), *s2 = buf(n);
            CPU->rmsnorm_f32(o1, x, w, rows, d, eps);
            REF->rmsnorm_f32(o2, x, w, rows, d, eps);
            compare(o1, o2, n, "rmsnorm rows=%lld d=%lld", (long long)rows, (long long)d);

            CPU->add_rmsnorm_f32(s1, o1, x, y, w, rows, d, eps);
            REF->add_rmsnorm_f32(s2, o2, x, y, w, rows, d, eps);
            compare(s1, s2, n, "add_rmsnorm sum rows=%lld d=%lld", (long long)rows, (long long)d);
            compare(o1, o2, n, "add_rmsnorm out rows=%lld d=%lld", (long long)rows, (long long)d);

            /* in place: sum written over a */
            memcpy(s1, x, (size_t)n * sizeof(float));
            CPU->add_rmsnorm_f32(s1, o1, s1, y, w, rows, d, eps);
            compare(s1, s2, n, "add_rmsnorm in-place sum rows=%lld d=%lld", (long long)rows, (long long)d);
            compare(o1, o2, n, "add_rmsnorm in-place out rows=%lld d=%lld", (long long)rows, (long long)d);
            free(x), free(y), free(w), free(o1), free(o2), free(s1), free(s2);
        }
}

static void test_rope(void)
{
    const int64_t ss[] = {1, 3, 17, 200}, hs[] = {1, 4, 8}, ds[] = {8, 64, 130};
    for (int il = 0; il < 2; il++) /* rotate-half, then interleaved pairs */
        for (int si = 0; si < 4; si++)
            for (int hi = 0; hi < 3; hi++)
                for (int di = 0; di < 3; di++) {
                    int64_t s = ss[si], h = hs[hi], d = ds[di], n = s * h * d;
                    float *x = rand_buf(n, -1, 1), *o1 = buf(n), *o2 = buf(n), *inv = buf(d / 2);
                    int32_t *pos = malloc((size_t)s * sizeof *pos);
                    for (int64_t i = 0; i < d / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)d);
                    for (int64_t t = 0; t < s; t++) pos[t] = t == 0 ? 0 : (int32_t)(rng_u32() % 40000);
                    CPU->rope_f32(o1, x, pos, inv, s, h, d, il);
                    REF->rope_f32(o2, x, pos, inv, s, h, d, il);
                    compare(o1, o2, n, "rope s=%lld h=%lld d=%lld interleaved=%d", (long long)s, (long long)h,
                            (long long)d, il);
                    /* in place */
                    memcpy(o1, x, (size_t)n * sizeof(float));
                    CPU->rope_f32(o1, o1, pos, inv, s, h, d, il);
                    compare(o1, o2, n, "rope in-place s=%lld h=%lld d=%lld interleaved=%d", (long long)s, (long long)h,
                            (long long)d, il);
                    free(x), free(o1), free(o2), free(inv), free(pos);
                }
}

static void test_softmax(void)
{
    const int64_t rows_[] = {1, 3, 17, 300}, ns[] = {1, 7, 130};
    for (int ri = 0; ri < 4; ri++)
        for (int ni = 0; ni < 3; ni++) {
            int64_t rows = rows_[ri], n = ns[ni];
            float *x = rand_buf(rows * n, -20, 20), *o1 = buf(rows * n), *o2 = buf(rows * n);
            if (n > 1) x[0] = -INFINITY; /* a masked logit */
            CPU->softmax_f32(o1, x, rows, n);
            REF->softmax_f32(o2, x, rows, n);
            compare(o1, o2, rows * n, "softmax rows=%lld n=%lld", (long long)rows, (long long)n);
            free(x), free(o1), free(o2);
        }
}

static void test_pointwise(void)
{
    const int64_t ns[] = {1, 7, 130, 100003};
    for (int ni = 0; ni < 4; ni++) {
        int64_t n = ns[ni];
        float *a = rand_buf(n, -12, 12), *b = rand_buf(n, -2, 2), *o1 = buf(n), *o2 = buf(n);
        CPU->silu_f32(o1, a, n);
        REF->silu_f32(o2, a, n);
        compare(o1, o2, n, "silu n=%lld", (long long)n);
        CPU->silu_mul_f32(o1, a, b, n);
        REF->silu_mul_f32(o2, a, b, n);
        compare(o1, o2, n, "silu_mul n=%lld", (long long)n);
        free(a), free(b), free(o1), free(o2);
    }
    const int64_t shapes[][2] = {{1, 1},         {7, 1},      {7, 7},           {390, 130},
                                 {85, 5},        {100000, 1}, {270000, 270000}, {131 * 2003, 131},
                                 {77 * 999, 77}, {300007, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t n = shapes[si][0], nb = shapes[si][1];
        float *a = rand_buf(n, -2, 2), *b = rand_buf(nb, -2, 2), *o1 = buf(n), *o2 = buf(n);
        CPU->add_f32(o1, a, b, n, nb);
        REF->add_f32(o2, a, b, n, nb);
        compare(o1, o2, n, "add n=%lld nb=%lld", (long long)n, (long long)nb);
        CPU->mul_f32(o1, a, b, n, nb);
        REF->mul_f32(o2, a, b, n, nb);
        compare(o1, o2, n, "mul n=%lld nb=%lld", (long long)n, (long long)nb);
        free(a), free(b), free(o1), free(o2);
    }
}

/* Whether the program runs under valgrind (its preload library is in LD_PRELOAD) or is a
 * ThreadSanitizer build: big shapes are skipped there (both run 20-50x slower, and look for
 * memory and thread errors, which the smaller shapes reach the same code for). */
static int under_valgrind(void)
{
#ifdef __SANITIZE_THREAD__
    return 1;
#else
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
#endif
}

/* K / V of T rows in kv_dtype: f32 values, or the same values rounded to f16 / bf16 halves. */
static void *kv_buf(int64_t n, int kv_dtype)
{
    float *f = rand_buf(n, -1, 1);
    if (kv_dtype == RLX_F32) return f;
    uint16_t *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = kv_dtype == RLX_F16 ? rlx_f32_to_f16(f[i]) : rlx_f32_to_bf16(f[i]);
    free(f);
    return h;
}

/* Masks: 0 none, 1 f32, 2 u8, 3 both. The f32 mask has random penalties and -inf entries; with
 * S > 1 its row 0 is all -inf. The u8 mask drops ~20% of keys; its last row is all zero. Keys
 * and values: T = P + S rows (the queries are the last S positions). */
static void attention_case_dt(int64_t S, int64_t P, int64_t Hq, int64_t Hkv, int64_t D, int causal, int64_t window,
                              int masks, int kv_dtype)
{
    const int64_t T = P + S;
    struct rlx_attn_args a = {
        .q = rand_buf(S * Hq * D, -1, 1),
        .k = kv_buf(T * Hkv * D, kv_dtype),
        .v = kv_buf(T * Hkv * D, kv_dtype),
        .kv_dtype = kv_dtype,
        .S = S,
        .T = T,
        .Hq = Hq,
        .Hkv = Hkv,
        .D = D,
        .scale = 1.0f / sqrtf((float)D) * 2.0f,
        .causal = causal,
        .window = window,
    };
    float *mf = NULL;
    uint8_t *mu = NULL;
    int64_t zero_row = -1; /* a row that must come out all zero */
    if (masks & 1) {
        mf = buf(S * T);
        for (int64_t i = 0; i < S * T; i++) mf[i] = rng_u32() % 10 == 0 ? -INFINITY : rng_f(-2, 0);
        if (S > 1) {
            for (int64_t j = 0; j < T; j++) mf[j] = -INFINITY;
            zero_row = 0;
        }
        a.mask_f32 = mf;
    }
    if (masks & 2) {
        mu = malloc((size_t)(S * T));
        for (int64_t i = 0; i < S * T; i++) mu[i] = rng_u32() % 5 != 0;
        for (int64_t j = 0; j < T; j++) mu[(S - 1) * T + j] = 0;
        zero_row = S - 1;
        a.mask_u8 = mu;
    }
    const int64_t n = S * Hq * D;
    size_t sc_cpu = CPU->attention_scratch(&a), sc_ref = REF->attention_scratch(&a);
    float *scratch = buf((int64_t)(sc_cpu > sc_ref ? sc_cpu : sc_ref));
    for (size_t i = 0; i < (sc_cpu > sc_ref ? sc_cpu : sc_ref); i++)
        scratch[i] = 3.0e38f; /* garbage a kernel must not read before writing */
    float *o1 = buf(n), *o2 = buf(n);

    a.out = o2;
    a.scratch = scratch;
    REF->attention(&a);
    a.out = o1;
    CPU->attention(&a);
    int scratch_ok = guard_ok(scratch, (int64_t)sc_cpu > (int64_t)sc_ref ? (int64_t)sc_cpu : (int64_t)sc_ref);
    compare(o1, o2, n, "attention S=%lld P=%lld Hq=%lld Hkv=%lld D=%lld causal=%d window=%lld masks=%d kv=%s",
            (long long)S, (long long)P, (long long)Hq, (long long)Hkv, (long long)D, causal, (long long)window, masks,
            rlx_dtype_name((enum rlx_dtype)kv_dtype));
    result(scratch_ok, "attention S=%lld P=%lld: wrote past its scratch", (long long)S, (long long)P);
    if (zero_row >= 0) {
        int zeros = 1;
        for (int64_t e = 0; e < Hq * D; e++)
            zeros &= o1[zero_row * Hq * D + e] == 0.0f && o2[zero_row * Hq * D + e] == 0.0f;
        result(zeros, "attention S=%lld P=%lld masks=%d: fully masked row %lld not zero", (long long)S, (long long)P,
               masks, (long long)zero_row);
    }
    free((void *)a.q), free((void *)a.k), free((void *)a.v);
    free(mf), free(mu), free(scratch), free(o1), free(o2);
}

static void attention_case(int64_t S, int64_t P, int64_t Hq, int64_t Hkv, int64_t D, int causal, int64_t window,
                           int masks)
{
    attention_case_dt(S, P, Hq, Hkv, D, causal, window, masks, RLX_F32);
}

static void test_attention(void)
{
    const int64_t Ss[] = {1, 4, 9}, Ps[] = {0, 3, 16}, Hs[][2] = {{4, 4}, {4, 2}, {8, 2}}, Ds[] = {8, 16};
    for (int si = 0; si < 3; si++)
        for (int pi = 0; pi < 3; pi++)
            for (int hi = 0; hi < 3; hi++)
                for (int di = 0; di < 2; di++)
                    for (int causal = 0; causal < 2; causal++)
                        for (int64_t window = 0; window <= 3; window += 3)
                            for (int masks = 0; masks < 4; masks++)
                                attention_case(Ss[si], Ps[pi], Hs[hi][0], Hs[hi][1], Ds[di], causal, window, masks);
    /* f16 / bf16 K and V on every path: decode split, per pair, blocked sgemm */
    for (int dt = 0; dt < 2; dt++) {
        const int kd = dt ? RLX_BF16 : RLX_F16;
        for (int masks = 0; masks < 4; masks += 3) {
            attention_case_dt(1, 0, 4, 2, 16, 1, 0, masks, kd);
            attention_case_dt(1, 300, 8, 2, 64, 1, 0, masks, kd);
            attention_case_dt(1, 1000, 6, 2, 33, 1, 700, masks, kd);
            attention_case_dt(4, 16, 8, 2, 16, 1, 3, masks, kd);
            attention_case_dt(17, 5, 16, 8, 8, 1, 0, masks, kd);
            attention_case_dt(64, 100, 4, 1, 16, 1, 20, masks, kd);
            attention_case_dt(33, 0, 6, 3, 40, 0, 0, masks, kd);
        }
    }
    /* big enough to split over threads */
    for (int masks = 0; masks < 4; masks++) {
        attention_case(64, 64, 8, 2, 16, 1, 0, masks);
        attention_case(64, 64, 8, 2, 16, 1, 20, masks);
        attention_case(1, 300, 8, 2, 64, 1, 0, masks);
        attention_case(33, 0, 6, 3, 40, 0, 0, masks);
        attention_case(3, 1500, 8, 2, 64, 1, 0, masks);  /* long rows: tasks overlap in time */
        attention_case(1, 1500, 16, 8, 40, 1, 0, masks); /* decode: keys split over tasks */
        attention_case(1, 1000, 6, 2, 33, 1, 700, masks);
        attention_case(1, 700, 4, 4, 16, 0, 0, masks);
    }
    /* the blocked sgemm path (S >= 8): query blocks crossing block boundaries, a past, GQA,
     * window, masks with fully masked rows */
    const int64_t Sg[] = {17, 64, 130}, Pg[] = {0, 5, 100}, Hg[][3] = {{16, 8, 8}, {4, 1, 16}};
    const int cfg[][3] = {{1, 0, 0}, {1, 20, 0}, {0, 0, 3},
                          {1, 0, 1}, {1, 0, 2},  {0, 7, 2}}; /* causal, window, masks */
    for (int si = 0; si < 3; si++)
        for (int pi = 0; pi < 3; pi++)
            for (int hi = 0; hi < 2; hi++)
                for (int ci = 0; ci < 6; ci++)
                    attention_case(Sg[si], Pg[pi], Hg[hi][0], Hg[hi][1], Hg[hi][2], cfg[ci][0], cfg[ci][1], cfg[ci][2]);
    /* T long enough that the sgemm path takes fewer rows per block */
    attention_case(40, 20000, 2, 1, 4, 1, 0, 0);
    attention_case(40, 20000, 2, 1, 4, 1, 30, 2);
    attention_case_dt(40, 5000, 2, 1, 4, 1, 30, 2, RLX_F16);
    if (!under_valgrind()) { /* the Qwen3-0.6B shape */
        attention_case(130, 100, 16, 8, 128, 1, 0, 0);
        attention_case(200, 0, 16, 8, 128, 1, 0, 0);
        attention_case_dt(1, 2000, 16, 8, 128, 1, 0, 0, RLX_F16);
        attention_case_dt(200, 50, 16, 8, 128, 1, 0, 0, RLX_BF16);
    }
}

/* The vector attention paths (tiled flash prefill, four-keys-at-a-time decode with prefetch),
 * on every vector ISA this machine has (AVX-512, AVX2: RLX_CPU_ISA caps lowered one by one; the
 * scalar loops are test_attention's): head sizes 16 / 32 / 48
 * (multiples of 16, which the vector paths need), odd query counts that cross the flash blocks
 * (64 keys, ~128 columns) and the decode chunks (64 keys, four at a time, tails), groups of 1 to
 * 8 query heads per kv head (odd ones too), pasts up to 3000 positions, causal or not, windows,
 * both masks, f32 / f16 / bf16 K and V. Under valgrind (AVX2 and scalar) a smaller set. */
static void test_attention_vector_paths(void)
{
    const int vg = under_valgrind(), native = rlx_cpu_isa();
    const int64_t Hs[][2] = {{4, 4}, {6, 3}, {6, 2}, {8, 2}, {12, 3}, {8, 1}};
    const int64_t Ds[] = {16, 32, 48};
    const int64_t SP[][2] = {{1, 0}, {1, 3}, {1, 67}, {1, 258}, {9, 0}, {9, 70}, {17, 130}, {65, 1}, {130, 7}};
    for (int isa = native < RLX_CPU_ISA_AVX512 ? native : RLX_CPU_ISA_AVX512; isa >= RLX_CPU_ISA_AVX2; isa--) {
        rlx_cpu_isa_cap(isa);
        for (int hi = 0; hi < 6; hi++)
            for (int di = 0; di < 3; di++)
                for (int si = 0; si < 9; si++) {
                    if (vg && (hi + di + si) % 3) continue;
                    const int dt = (hi + si) % 3 == 0 ? RLX_F32 : (hi + si) % 3 == 1 ? RLX_F16 : RLX_BF16;
                    attention_case_dt(SP[si][0], SP[si][1], Hs[hi][0], Hs[hi][1], Ds[di], 1, 0, 0, dt);
                    attention_case_dt(SP[si][0], SP[si][1], Hs[hi][0], Hs[hi][1], Ds[di], (si & 1), si % 4 ? 0 : 40,
                                      1 + si % 3, dt);
                }
        /* long pasts: many decode chunks split over tasks; flash items with many key blocks */
        for (int dt = 0; dt < 3; dt++) {
            const int kd = dt == 0 ? RLX_F32 : dt == 1 ? RLX_F16 : RLX_BF16;
            attention_case_dt(1, 3001, 8, 2, 32, 1, 0, 0, kd);
            attention_case_dt(1, 2999, 12, 3, 16, 1, 0, 3, kd);
            attention_case_dt(1, 3000, 8, 8, 16, 1, 500, 0, kd);
            if (!vg) {
                attention_case_dt(33, 1500, 8, 2, 32, 1, 0, 0, kd);
                attention_case_dt(200, 300, 6, 3, 16, 1, 100, 2, kd);
                attention_case_dt(1, 9000, 16, 8, 128, 1, 0, 0, kd);
                attention_case_dt(70, 1000, 32, 8, 64, 1, 0, 0, kd);
            }
        }
    }
    rlx_cpu_isa_cap(RLX_CPU_ISA_TOP);
}

/* convert_f32: the cpu table's narrowing (vcvtps2ph / the bf16 pack, scalar tails) gives the ref
 * table's bits (rounding computed in double) for random values, every exponent range, ties,
 * subnormals, overflow, infinities and NaNs; f32 is a copy. */
static void test_convert(void)
{
    enum { N = 4099 };
    float *src = buf(N);
    for (int i = 0; i < N; i++) {
        uint32_t u = rng_u32();
        float f;
        memcpy(&f, &u, 4);
        src[i] = i % 3 == 0 ? f : rng_f(-70000, 70000) * powf(2.0f, (float)(i % 60) - 40.0f);
    }
    const float specials[] = {0.0f,     -0.0f,           INFINITY,       -INFINITY,     NAN,      65504.0f,
                              65519.0f, 65520.0f,        65536.0f,       5.96e-8f,      2.98e-8f, 2.9802322e-8f,
                              6.1e-5f,  1.0f + 0x1p-11f, 1.0f + 0x1p-8f, 3.3895314e38f, 1e-40f};
    memcpy(src, specials, sizeof specials);
    uint16_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    for (int dt = 0; dt < 2; dt++) {
        const int kd = dt ? RLX_BF16 : RLX_F16;
        for (int isa = RLX_CPU_ISA_SCALAR; isa <= rlx_cpu_isa(); isa++) {
            const int prev = rlx_cpu_isa_cap(isa);
            CPU->convert_f32(a, kd, src, N);
            rlx_cpu_isa_cap(prev);
            REF->convert_f32(b, kd, src, N);
            int same = 1, first = -1;
            for (int i = 0; i < N; i++) {
                const int nan_a = (a[i] & 0x7fff) > (dt ? 0x7f80 : 0x7c00),
                          nan_b = (b[i] & 0x7fff) > (dt ? 0x7f80 : 0x7c00);
                const int ok = a[i] == b[i] || (nan_a && nan_b);
                if (!ok && first < 0) first = i;
                same &= ok;
            }
            result(same, "convert_f32 %s [isa=%d]: first mismatch at %d (%g: 0x%04x vs 0x%04x)", dt ? "bf16" : "f16",
                   isa, first, first >= 0 ? src[first] : 0.0, first >= 0 ? a[first] : 0, first >= 0 ? b[first] : 0);
        }
    }
    float *c = buf(N);
    CPU->convert_f32(c, RLX_F32, src, N);
    result(memcmp(c, src, N * sizeof *c) == 0, "convert_f32 to f32 is a copy");
    free(src), free(a), free(b), free(c);
}

static void test_kernels(void)
{
    test_matmul();
    test_matmul_lowp();
    test_matvec_f32();
    test_matmul_lowp_lanes();
    test_embedding();
    test_embedding_lowp();
    test_norms();
    test_rope();
    test_softmax();
    test_pointwise();
    test_attention();
    test_attention_vector_paths();
    test_convert();
}

/* ---------------------------------------------------------------------------------------------
 * The oracle against hand-computed values
 * ------------------------------------------------------------------------------------------- */

static int close_to(const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-6f * (1.0f + fabsf(want[i])))) return 0;
    return 1;
}

static void test_ref_by_hand(void)
{
    float out[8];
    {
        const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1}; /* a (2,3), b (3,2) */
        const float want[] = {4, 5, 10, 11};
        REF->matmul_f32(out, a, b, 2, 3, 2, 0);
        result(close_to(out, want, 4), "ref matmul by hand");
        const float bt[] = {1, 0, 1, 0, 1, 1}; /* the same b, stored (2,3) */
        REF->matmul_f32(out, a, bt, 2, 3, 2, 1);
        result(close_to(out, want, 4), "ref matmul trans_b by hand");
    }
    {
        /* bf16 1.0, -2.0; f16 1.0, the smallest subnormal 2^-24, -inf */
        const uint16_t bt[] = {0x3f80, 0xc000}, ht[] = {0x3c00, 0x0001, 0xfc00};
        const int32_t ids[] = {1, 0};
        const float wb[] = {-2.0f, 1.0f}, wh[] = {1.0f, 0x1p-24f, -INFINITY};
        REF->embedding_lowp(out, bt, RLX_BF16, ids, 2, 1);
        result(close_to(out, wb, 2), "ref embedding_lowp bf16 by hand");
        REF->embedding_lowp(out, ht, RLX_F16, ids + 1, 1, 3);
        result(out[0] == wh[0] && out[1] == wh[1] && out[2] == wh[2], "ref embedding_lowp f16 by hand");
        const float a[] = {1, 2}; /* a (1,2) @ [[1, -2]]^T = -3 */
        float rs[2];
        REF->matmul_lowp(out, a, bt, RLX_BF16, 1, 2, 1, rs);
        result(out[0] == -3.0f, "ref matmul_lowp bf16 by hand");
    }
    {
        const float x[] = {3, 4}, w[] = {1, 2};
        const float want[] = {3 / sqrtf(12.5f), 8 / sqrtf(12.5f)};
        REF->rmsnorm_f32(out, x, w, 1, 2, 0.0f);
        result(close_to(out, want, 2), "ref rmsnorm by hand");
    }
    {
        const float x[] = {0, logf(3.0f)}, want[] = {0.25f, 0.75f};
        REF->softmax_f32(out, x, 1, 2);
        result(close_to(out, want, 2), "ref softmax by hand");
    }
    {
        const float x[] = {1, 2, 3, 4}, inv[] = {1.0f, 0.5f};
        const int32_t pos0 = 0, pos1 = 1;
        REF->rope_f32(out, x, &pos0, inv, 1, 1, 4, 0);
        result(close_to(out, x, 4), "ref rope at position 0 is the identity");
        const float c1 = cosf(1), s1 = sinf(1), c2 = cosf(0.5f), s2 = sinf(0.5f);
        const float want[] = {1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2};
        REF->rope_f32(out, x, &pos1, inv, 1, 1, 4, 0);
        result(close_to(out, want, 4), "ref rope at position 1 by hand");
    }
    {
        const float x[] = {0, 2}, want[] = {0, 2 / (1 + expf(-2))};
        REF->silu_f32(out, x, 2);
        result(close_to(out, want, 2), "ref silu by hand");
    }
    {
        /* one query (position 1), two keys: scores 0 and ln 3 -> weights 1/4, 3/4 */
        const float q[] = {1, 0}, k[] = {0, 0, logf(3.0f), 0}, v[] = {4, 8, 0, 4}, want[] = {1, 5};
        float scratch[2];
        struct rlx_attn_args a = {.out = out,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .kv_dtype = RLX_F32,
                                  .S = 1,
                                  .T = 2,
                                  .Hq = 1,
                                  .Hkv = 1,
                                  .D = 2,
                                  .scale = 1.0f,
                                  .scratch = scratch};
        REF->attention(&a);
        result(close_to(out, want, 2), "ref attention by hand");
        a.causal = 1;
        a.window = 1; /* only the query's own key is visible */
        REF->attention(&a);
        result(close_to(out, v + 2, 2), "ref attention window=1 sees only itself");
    }
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

int main(void)
{
    test_ref_by_hand();
    test_exp16();
    const int counts[] = {1, 2, 3};
    for (int ti = 0; ti < 3; ti++) {
        rlx_set_num_threads(counts[ti]);
        test_kernels();
    }
    test_matmul_lowp_isas();
    test_matvec_threads_bitwise();
    rlx_set_num_threads(1);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
