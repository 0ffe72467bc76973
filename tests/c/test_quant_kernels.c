/*
 * test_quant_kernels.c - the cpu table's block-type kernels (matmul_quant, embedding_quant) against
 * the ref table, on every vector path this machine has (rlx_cpu_isa_cap lowered one by one: the
 * AMX-INT8 GEMM where cpuid has it, the VNNI path where cpuid has AVX512_VNNI, AVX2, scalar), at 1
 * and 2 pool threads.
 *
 * The bound. The cpu table quantises each block of `a` (32 elements for Q8_0 .. Q5_1, 256 for the
 * K types) to q = RNE(x * RN(127 / A)) with d = RN(A / 127), A = max |x| of the block (quant.c), and
 * computes with q * d; the ref table multiplies the exact `a` by the dequantised W in double. With
 * u = 2^-24: |x - q d| <= |x| |1 - RN(127/A) RN(A/127)| + |q - x RN(127/A)| d
 *                       <= A (2u + u^2) + (1/2 + 127 u) A (1 + u) / 127 <= A (1 + 765 u) / 254,
 * so c = (1 + 2^-14) / 254 for every type (d is kept in f32, so no f16 rounding of d enters; a
 * block with A < 2^-96 counts as zero: coefficient 1 instead of c). The rest is f32 rounding of
 * the integer sums' scaling and of the sums over blocks (decode, VNNI GEMM), or of the dequantised
 * values and K-long sums (the sgemm prefill): at most gamma * sum_k A (|Ws_k| + |Wz_k|) with
 * gamma = (K + 32) 2^-23, where Wz_k is the value element k would have with its quantised value
 * zero (the type's offset or minimum) and Ws_k = W_k - Wz_k: the kernels round terms as large as
 * the two parts apart (the offset of Q4_0 / Q5_0 / Q3_K / Q6_K is taken in one lane or one sum
 * per block, the minimum in a term of its own), plus the oracle's rounding to f32.
 * Per output (m, n): |cpu - ref| <= sum_b c_b A_mb sum_{k in b} |W_nk| + gamma sum_b A_mb
 * sum_{k in b} (|Ws_nk| + |Wz_nk|) + 2^-23 |ref|.
 * Where ref is not finite (a NaN or infinite scale in random bytes, a NaN / inf in `a`) the cpu
 * must be non-finite too, and finite where ref is.
 *
 * Also: the documented quantisation bit for bit (identity weights: out = RN(q * d) exactly) on
 * every path and M; the AMX GEMM and the lanes kernel (7 .. 128 rows, Q8_0 5 .., VNNI without AMX) bitwise
 * the VNNI GEMM; results bitwise identical at 1 and 2 threads (but for the scalar path's
 * prefill, which is OpenBLAS's sgemm) and, on the blocked passes, each row of M bitwise its product
 * alone (M = 1) (same_outputs: any NaN matches any NaN, whose payload the operands' order decides);
 * weights and `a` placed against
 * an unreadable page (an over-read faults); out and scratch guarded (no write past them); M = 0 /
 * N = 0 leave out alone; embedding_quant bit-exact with the ref table (random bytes, NaN included).
 * Prints one line per failure, then "N passed, M failed".
 */
#include "backends/cpu/cpu.h"
#include "backends/cpu/pool.h"
#include "backends/kernels.h"
#include "core/core.h"
#include "rlx/rlx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GUARD    16
#define SENTINEL 1234.5f

static int n_pass, n_fail;
static const struct rlx_kernels *CPU = &rlx_cpu_kernels, *REF = &rlx_ref_kernels;

static void result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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

static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Buffers
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rng_f(float lo, float hi) { return lo + (hi - lo) * (float)(rng_u32() & 0xFFFFFF) / (float)0x1000000; }

/* n floats followed by GUARD sentinels */
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

static int guard_ok(const float *p, int64_t n)
{
    for (int i = 0; i < GUARD; i++)
        if (p[n + i] != SENTINEL) return 0;
    return 1;
}

/* `bytes` of memory whose end touches a PROT_NONE page: reading past it faults. */
struct tail {
    void *base;
    size_t len;
    void *p;
};

static struct tail tail_alloc(size_t bytes)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + page - 1) / page * page;
    struct tail t = {.len = data + page};
    t.base = mmap(NULL, t.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t.base == MAP_FAILED) {
        fprintf(stderr, "mmap failed\n");
        exit(2);
    }
    mprotect((char *)t.base + data, page, PROT_NONE);
    t.p = (char *)t.base + data - bytes;
    return t;
}

static void tail_free(struct tail t) { munmap(t.base, t.len); }

/* ---------------------------------------------------------------------------------------------
 * Block types
 * ------------------------------------------------------------------------------------------- */

static const int TYPES[] = {RLX_Q8_0, RLX_Q4_0, RLX_Q4_1, RLX_Q5_0, RLX_Q5_1,
                            RLX_Q2_K, RLX_Q3_K, RLX_Q4_K, RLX_Q5_K, RLX_Q6_K};
#define NTYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

static const struct rlx_dtype_traits *tr(int wt) { return rlx_dtype_traits((enum rlx_dtype)wt); }

/* byte offsets of a block's f16 scale and of its f16 minimum (-1: none) */
static void scale_pos(int wt, int *dpos, int *mpos)
{
    *dpos = wt == RLX_Q2_K ? 80 : wt == RLX_Q3_K ? 108 : wt == RLX_Q6_K ? 208 : 0;
    *mpos = wt == RLX_Q4_1 || wt == RLX_Q5_1 || wt == RLX_Q4_K || wt == RLX_Q5_K ? 2 : wt == RLX_Q2_K ? 82 : -1;
}

static void put_f16(uint8_t *p, float x)
{
    const uint16_t h = rlx_f32_to_f16(x);
    memcpy(p, &h, 2);
}

static void quant_bytes(int wt, int *q0, int *q1);

/* n blocks of random bytes; valid: the f16 scales replaced by finite values of magnitude 2^-7 .. 2^-4
 * (random sign; minimums likewise); valid == 2: and every quantised byte of a block one repeated
 * value (0x88 in Q4_0 is all values 8: W = 0 while the offset terms are not) */
static void rand_blocks(uint8_t *w, int wt, int64_t nblocks, int valid)
{
    const size_t tb = tr(wt)->type_size;
    for (size_t i = 0; i < (size_t)nblocks * tb; i++) w[i] = (uint8_t)rng_u32();
    if (!valid) return;
    int dpos, mpos, q0, q1;
    scale_pos(wt, &dpos, &mpos);
    quant_bytes(wt, &q0, &q1);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *p = w + (size_t)b * tb;
        if (valid == 2) memset(p + q0, b % 3 == 0 ? 0x88 : (int)(rng_u32() & 0xff), (size_t)(q1 - q0));
        put_f16(p + dpos, (rng_u32() & 1 ? -1.0f : 1.0f) * ldexpf(rng_f(1, 2), -7 + (int)(rng_u32() % 3)));
        if (mpos >= 0)
            put_f16(p + mpos, (rng_u32() & 1 ? -1.0f : 1.0f) * ldexpf(rng_f(1, 2), -7 + (int)(rng_u32() % 3)));
    }
}

/* the bytes [*q0, *q1) of a block holding its quantised values (fifth / high bits included) */
static void quant_bytes(int wt, int *q0, int *q1)
{
    switch (wt) {
    case RLX_Q8_0: *q0 = 2, *q1 = 34; break;
    case RLX_Q4_0: *q0 = 2, *q1 = 18; break;
    case RLX_Q4_1: *q0 = 4, *q1 = 20; break;
    case RLX_Q5_0: *q0 = 2, *q1 = 22; break;
    case RLX_Q5_1: *q0 = 4, *q1 = 24; break;
    case RLX_Q2_K: *q0 = 16, *q1 = 80; break;
    case RLX_Q3_K: *q0 = 0, *q1 = 96; break;
    case RLX_Q4_K: *q0 = 16, *q1 = 144; break;
    case RLX_Q5_K: *q0 = 16, *q1 = 176; break;
    default: *q0 = 0, *q1 = 192; break;
    }
}

/* W (rows, K) f32 = to_f32 of the blocks; mag (rows, K) = |W - Wz| + |Wz|, Wz the value an element
 * would have with its quantised value zero (the type's offset or minimum: to_f32 of the block with
 * its quantised bytes zeroed), i.e. the part of W that scales the quantised value plus the part
 * that does not, each at full size: what the kernels' f32 rounding is relative to. */
static void dequant(float *W, float *mag, const uint8_t *w, int wt, int64_t rows, int64_t K)
{
    const size_t tb = tr(wt)->type_size, rb = (size_t)(K / tr(wt)->block_size) * tb;
    int q0, q1;
    quant_bytes(wt, &q0, &q1);
    uint8_t *tmp = malloc(rb);
    float *wz = malloc((size_t)K * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        tr(wt)->to_f32(W + r * K, w + (size_t)r * rb, K);
        memcpy(tmp, w + (size_t)r * rb, rb);
        for (size_t b = 0; b < rb / tb; b++) memset(tmp + b * tb + q0, 0, (size_t)(q1 - q0));
        tr(wt)->to_f32(wz, tmp, K);
        for (int64_t k = 0; k < K; k++) mag[r * K + k] = fabsf(W[r * K + k] - wz[k]) + fabsf(wz[k]);
    }
    free(tmp), free(wz);
}

/* ---------------------------------------------------------------------------------------------
 * matmul_quant against the ref table
 * ------------------------------------------------------------------------------------------- */

/* a (M, K): uniform [-1, 1) times a per-row magnitude 10^(m % 3 - 1); with edges, row 1 has a zero
 * block and a block of tiny values (2^-110), row 2 a block of values near 1e20 ... not more (sums
 * stay finite), and (when naninf) row 3 a NaN and row 4 an infinity */
static void rand_act(float *a, int64_t M, int64_t K, int64_t bs, int edges, int naninf)
{
    for (int64_t m = 0; m < M; m++) {
        const float s = m % 3 == 0 ? 0.1f : m % 3 == 1 ? 1.0f : 10.0f;
        for (int64_t k = 0; k < K; k++) a[m * K + k] = s * rng_f(-1, 1);
    }
    if (edges && M > 2 && K >= 2 * bs) {
        for (int64_t k = 0; k < bs; k++) {
            a[1 * K + k] = 0.0f;
            a[1 * K + bs + k] = rng_f(-1, 1) * 0x1p-110f;
            a[2 * K + k] = rng_f(-1, 1) * 1e20f;
        }
    }
    if (naninf && M > 4) {
        a[3 * K + K / 2] = NAN;
        a[4 * K + 1] = -INFINITY;
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

static const char *path_name(void)
{
    return rlx_cpu_amx_int8() ? "amx" : rlx_cpu_avx512_vnni() ? "vnni" : isa_name(rlx_cpu_isa());
}

/* cpu (M, N) at the current thread count into o (guarded), scratch guarded; returns 0 if the
 * scratch guard broke */
/* x and y (n floats) the same: bit for bit, except that any NaN matches any NaN (which NaN an
 * addition of two keeps follows the order of its operands, which the compiler may swap between two
 * instances of one kernel: IEEE 754 leaves the payload open; the weights' random bytes hold NaN
 * scales) */
static int same_outputs(const float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof(float)) != 0 && !(isnan(x[i]) && isnan(y[i]))) return 0;
    return 1;
}

static int run_cpu(float *o, const float *a, const void *w, int wt, int64_t M, int64_t K, int64_t N)
{
    const int64_t ns = (int64_t)CPU->matmul_quant_scratch(wt, M, K, N);
    float *scratch = buf(ns);
    for (int64_t i = 0; i < ns; i++) scratch[i] = 3.0e38f;
    CPU->matmul_quant(o, a, w, wt, M, K, N, scratch);
    const int ok = guard_ok(scratch, ns);
    free(scratch);
    return ok;
}

/* One product: cpu at 1 and 2 threads (bitwise equal) against ref within the bound. */
static void quant_case(int wt, int64_t M, int64_t K, int64_t N, int valid, int edges, int naninf)
{
    const int64_t bs = tr(wt)->block_size, nb = K / bs;
    const size_t rb = (size_t)nb * tr(wt)->type_size;
    const char *tn = tr(wt)->name;
    struct tail tw = tail_alloc((size_t)N * rb), ta = tail_alloc((size_t)(M * K) * sizeof(float));
    uint8_t *w = tw.p;
    float *a = ta.p;
    rand_blocks(w, wt, N * nb, valid);
    rand_act(a, M, K, bs, edges, naninf);
    float *o1 = buf(M * N), *o2 = buf(M * N), *want = buf(M * N);
    float *rs = buf((int64_t)REF->matmul_quant_scratch(wt, M, K, N));
    REF->matmul_quant(want, a, w, wt, M, K, N, rs);
    const int threads = rlx_pool_threads();
    rlx_set_num_threads(1);
    const int g1 = run_cpu(o1, a, w, wt, M, K, N);
    rlx_set_num_threads(2);
    const int g2 = run_cpu(o2, a, w, wt, M, K, N);
    rlx_set_num_threads(threads);
    result(g1 && g2, "matmul_quant %s M=%lld K=%lld N=%lld [%s]: wrote past its scratch", tn, (long long)M,
           (long long)K, (long long)N, path_name());
    result(guard_ok(o1, M * N) && guard_ok(o2, M * N), "matmul_quant %s M=%lld K=%lld N=%lld [%s]: wrote past out", tn,
           (long long)M, (long long)K, (long long)N, path_name());
    /* every path but the scalar prefill (sgemm: OpenBLAS's own split of the work) */
    if (rlx_cpu_isa() >= RLX_CPU_ISA_AVX2 || M <= 4)
        result(same_outputs(o1, o2, M * N), "matmul_quant %s M=%lld K=%lld N=%lld [%s]: 2 threads differ from 1", tn,
               (long long)M, (long long)K, (long long)N, path_name());
    /* the AMX GEMM (prefill, M > 16; K types above RLX_CPU_QMV_AMX_MAX_M) computes the VNNI GEMM's
     * integers with its f32 steps (quant_gemm.c): the same bits */
    if (rlx_cpu_amx_int8() && M > 16 && (bs == 32 || M > RLX_CPU_QMV_AMX_MAX_M)) {
        float *o3 = buf(M * N);
        const int prev = rlx_cpu_isa_cap(RLX_CPU_ISA_AVX512_BF16);
        run_cpu(o3, a, w, wt, M, K, N);
        rlx_cpu_isa_cap(prev);
        result(same_outputs(o3, o1, M * N),
               "matmul_quant %s M=%lld K=%lld N=%lld: the AMX GEMM differs from the VNNI GEMM", tn, (long long)M,
               (long long)K, (long long)N);
        free(o3);
    }
    /* on the blocked passes (every decode step, batched ones included) each row of `a` gets the bits it
     * gets alone, whatever group of rows it runs in (quant.c); K types from RLX_CPU_QMV_AMX_MIN_M rows on
     * AMX-INT8 (rlx_cpu_qmv_amx) the bits it gets in any product of as many rows, in any place among
     * them: rows rotated by one give the same rows (the ref bound below holds it to the function) */
    const int64_t passes = rlx_cpu_avx512_vnni() ? 16 : rlx_cpu_isa() >= RLX_CPU_ISA_AVX2 ? 12 : 4;
    const int amx_k = rlx_cpu_amx_int8() && bs == 256 && M >= RLX_CPU_QMV_AMX_MIN_M;
    const int lanes_k = rlx_cpu_avx512_vnni() && !rlx_cpu_amx_int8() && rlx_cpu_qmv_lanes_takes(M, wt);
    if (M > 1 && M <= passes) {
        float *rot = malloc((size_t)(M * K) * sizeof(float)), *orot = buf(M * N);
        memcpy(rot, a + K, (size_t)((M - 1) * K) * sizeof(float));
        memcpy(rot + (M - 1) * K, a, (size_t)K * sizeof(float));
        run_cpu(orot, rot, w, wt, M, K, N);
        result(same_outputs(orot, o1 + N, (M - 1) * N) && same_outputs(orot + (M - 1) * N, o1, N),
               "matmul_quant %s M=%lld K=%lld N=%lld [%s]: rows rotated by one give other bits", tn, (long long)M,
               (long long)K, (long long)N, path_name());
        free(rot);
        free(orot);
    }
    /* the lanes kernel computes the VNNI GEMM's function (quant_lanes.c): the same rows inside a
     * product of more rows than it takes (the GEMM) give the same bits */
    if (lanes_k) {
        const int64_t M2 = RLX_CPU_QMV_LANES_MAX_M + 1;
        float *a2 = malloc((size_t)(M2 * K) * sizeof(float)), *o3 = buf(M2 * N);
        for (int64_t m = 0; m < M2; m++) memcpy(a2 + m * K, a + (m % M) * K, (size_t)K * sizeof(float));
        run_cpu(o3, a2, w, wt, M2, K, N);
        result(same_outputs(o3, o1, M * N),
               "matmul_quant %s M=%lld K=%lld N=%lld: the lanes kernel differs from the VNNI GEMM", tn, (long long)M,
               (long long)K, (long long)N);
        free(a2);
        free(o3);
    }
    if (M > 1 && M <= passes && !amx_k && !lanes_k) {
        float *row = buf(N);
        int same = 1;
        for (int64_t m = 0; m < M && same; m++) {
            run_cpu(row, a + m * K, w, wt, 1, K, N);
            same = same_outputs(row, o1 + m * N, N);
        }
        result(same, "matmul_quant %s M=%lld K=%lld N=%lld [%s]: a row differs from its product alone", tn,
               (long long)M, (long long)K, (long long)N, path_name());
        free(row);
    }

    /* the bound, per output */
    float *W = malloc((size_t)(N * K) * sizeof(float)), *mag = malloc((size_t)(N * K) * sizeof(float));
    dequant(W, mag, w, wt, N, K);
    double *sw = malloc((size_t)(N * nb) * sizeof(double)), *sm = malloc((size_t)(N * nb) * sizeof(double));
    double *amax = malloc((size_t)(M * nb) * sizeof(double));
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            double s1 = 0, s2 = 0;
            for (int64_t k = b * bs; k < (b + 1) * bs; k++)
                s1 += fabs((double)W[n * K + k]), s2 += (double)mag[n * K + k];
            sw[n * nb + b] = s1, sm[n * nb + b] = s2;
        }
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            double x = 0;
            for (int64_t k = b * bs; k < (b + 1) * bs; k++)
                x = fabs((double)a[m * K + k]) > x ? fabs((double)a[m * K + k]) : x;
            amax[m * nb + b] = x;
        }
    const double c = (1.0 + 0x1p-14) / 254.0, gamma = (double)(K + 32) * 0x1p-23;
    int64_t bad = -1, nonfinite = 0;
    double worst = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const double r = want[m * N + n], g = o1[m * N + n];
            if (!isfinite(r)) {
                nonfinite++;
                if (isfinite(g)) bad = m * N + n;
                continue;
            }
            double bound = 0x1p-23 * fabs(r);
            for (int64_t b = 0; b < nb; b++) {
                const double A = amax[m * nb + b];
                bound += (A < 0x1p-96 ? 1.0 : c) * A * sw[n * nb + b] + gamma * A * sm[n * nb + b];
            }
            const double e = fabs(g - r);
            if (!(e <= bound))
                bad = m * N + n;
            else if (bound > 0 && e / bound > worst)
                worst = e / bound;
        }
    result(bad < 0, "matmul_quant %s M=%lld K=%lld N=%lld valid=%d [%s]: element %lld: cpu %.9g ref %.9g", tn,
           (long long)M, (long long)K, (long long)N, valid, path_name(), (long long)bad,
           bad >= 0 ? (double)o1[bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
    if (naninf && M > 4)
        result(nonfinite >= 2 * N, "matmul_quant %s: the NaN / inf rows of a gave %lld non-finite outputs", tn,
               (long long)nonfinite);
    if (getenv("RLX_TEST_VERBOSE"))
        printf("%s M=%lld K=%lld N=%lld [%s]: worst error / bound %.3f\n", tn, (long long)M, (long long)K, (long long)N,
               path_name(), worst);
    free(W), free(mag), free(sw), free(sm), free(amax);
    free(o1), free(o2), free(want), free(rs);
    tail_free(tw), tail_free(ta);
}

/* Identity weights (row j: the value 1 at element j, else 0; Q8_0: d = 1, q = e_j; Q4_K: d = 1,
 * group scales 1, minimums 0, q = e_j): out[m][j] = RN(q_mj * d_mb) exactly, from the documented
 * rule, on every path: one nonzero integer product, scaled once, all else exact zeros. */
static void identity_case(int wt, int64_t M)
{
    const int64_t bs = wt == RLX_Q8_0 ? 32 : 256, K = wt == RLX_Q8_0 ? 96 : 256, N = K, nb = K / bs;
    const size_t tb = tr(wt)->type_size, rb = (size_t)nb * tb;
    uint8_t *w = calloc((size_t)N, rb);
    for (int64_t j = 0; j < N; j++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *p = w + (size_t)j * rb + (size_t)b * tb;
            if (wt == RLX_Q8_0) {
                put_f16(p, 1.0f);
                if (j / bs == b) p[2 + j % bs] = 1;
            } else { /* Q4_K: d = 1, dmin = 0, every group scale 1 and minimum 0, the value 1 at j */
                put_f16(p, 1.0f);
                put_f16(p + 2, 0.0f);
                for (int g = 0; g < 4; g++) p[4 + g] = 1, p[12 + g] = 1;
                const int g = (int)j / 32, l = (int)j % 32;
                p[16 + 32 * (g / 2) + l] = (uint8_t)(g % 2 ? 0x10 : 0x01);
            }
        }
    float *a = malloc((size_t)(M * K) * sizeof(float)), *o = buf(M * N);
    rand_act(a, M, K, bs, 1, 0);
    run_cpu(o, a, w, wt, M, K, N);
    int64_t bad = -1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float *x = a + m * K + b * bs;
            float A = 0;
            for (int64_t i = 0; i < bs; i++) A = fabsf(x[i]) > A ? fabsf(x[i]) : A;
            const float id = A < 0x1p-96f ? 0.0f : 127.0f / A, d = A < 0x1p-96f ? 0.0f : A / 127.0f;
            for (int64_t i = 0; i < bs; i++) {
                const float q = nearbyintf(x[i] * id), want = q * d;
                if (memcmp(&want, &o[m * N + b * bs + i], 4) != 0 && !(want == 0 && o[m * N + b * bs + i] == 0))
                    bad = m * N + b * bs + i;
            }
        }
    result(bad < 0, "%s identity M=%lld [%s]: element %lld is %.9g, the documented quantisation gives another",
           tr(wt)->name, (long long)M, path_name(), (long long)bad, bad >= 0 ? (double)o[bad] : 0.0);
    free(w), free(a), free(o);
}

/* M = 0 and N = 0: out untouched */
static void empty_cases(int wt)
{
    const int64_t K = tr(wt)->block_size * 2;
    uint8_t w[2 * 210 * 3];
    rand_blocks(w, wt, 6, 1);
    float a[512 * 3], o[8] = {7, 7, 7, 7, 7, 7, 7, 7}, scratch[4096];
    for (int i = 0; i < 512 * 3; i++) a[i] = rng_f(-1, 1);
    const size_t s0 = CPU->matmul_quant_scratch(wt, 0, K, 3), s1 = CPU->matmul_quant_scratch(wt, 3, K, 0);
    CPU->matmul_quant(o, a, w, wt, 0, K, 3, scratch);
    CPU->matmul_quant(o, a, w, wt, 3, K, 0, scratch);
    int ok = s0 <= 4096 && s1 <= 4096;
    for (int i = 0; i < 8; i++) ok = ok && o[i] == 7;
    result(ok, "matmul_quant %s with M = 0 or N = 0 wrote out", tr(wt)->name);
}

static void test_matmul_quant(void)
{
    const int vg = under_valgrind();
    /* 12 and 15: a VNNI group of 8, then 4 or 7 (quant.c's group_rows); 6 and 10: Q8_0's lanes rows */
    const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 130, 12, 15, 6, 10};
    const int nms = (int)(sizeof Ms / sizeof Ms[0]);
    for (int ti = 0; ti < NTYPES; ti++) {
        const int wt = TYPES[ti];
        const int64_t bs = tr(wt)->block_size;
        const int64_t Ks[] = {bs == 32 ? 96 : 256, bs == 32 ? 320 : 768}, Ns[] = {7, 37};
        for (int mi = 0; mi < nms; mi++)
            for (int ki = 0; ki < 2; ki++)
                for (int ni = 0; ni < 2; ni++) {
                    const int64_t M = Ms[mi], K = Ks[ki], N = Ns[ni];
                    if (vg && (M * K * N > 100000 || (M > 8 && ni == 1)) && !(ki == 0 && ni == 0)) continue;
                    quant_case(wt, M, K, N, 1, mi == 4 || mi == 8, 0);
                }
        quant_case(wt, 8, bs == 32 ? 160 : 512, 33, 0, 0, 0); /* random bytes: NaN / inf scales */
        quant_case(wt, 5, bs == 32 ? 160 : 512, 33, 2, 0, 0); /* repeated quantised bytes */
        quant_case(wt, 20, bs == 32 ? 160 : 512, 33, 2, 0, 0);
        quant_case(wt, 7, bs == 32 ? 160 : 512, 9, 1, 1, 1); /* NaN / inf in a */
        if (!vg) quant_case(wt, 33, 3072, 129, 1, 1, 0);
        if (!vg) quant_case(wt, RLX_CPU_QMV_AMX_MAX_M, 512, 33, 1, 1, 0); /* the AMX kernel's most rows */
        /* the decode split over threads: enough rows for several pieces */
        quant_case(wt, 2, bs == 32 ? 320 : 768, vg ? 1201 : 6001, 1, 0, 0);
        if (!vg) quant_case(wt, 8, bs == 32 ? 320 : 768, 6001, 1, 0, 0); /* and a batch's (AMX: rlx_cpu_qmv_amx) */
        empty_cases(wt);
    }
    for (int mi = 0; mi < nms; mi++) {
        identity_case(RLX_Q8_0, Ms[mi]);
        if (!vg || Ms[mi] < 40) identity_case(RLX_Q4_K, Ms[mi]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * embedding_quant
 * ------------------------------------------------------------------------------------------- */

static void test_embedding_quant(void)
{
    const int64_t V = 40, ns[] = {1, 5, 300};
    for (int ti = 0; ti < NTYPES; ti++) {
        const int wt = TYPES[ti];
        const int64_t bs = tr(wt)->block_size;
        for (int di = 0; di < 2; di++)
            for (int ni = 0; ni < 3; ni++) {
                const int64_t d = bs * (di ? 3 : 1), n = ns[ni], nb = d / bs;
                struct tail tt = tail_alloc((size_t)(V * nb) * tr(wt)->type_size);
                rand_blocks(tt.p, wt, V * nb, ni != 1);
                int32_t *ids = malloc((size_t)n * sizeof *ids);
                for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_u32() % V);
                ids[0] = (int32_t)(V - 1);
                float *o1 = buf(n * d), *o2 = buf(n * d);
                CPU->embedding_quant(o1, tt.p, wt, ids, n, d);
                REF->embedding_quant(o2, tt.p, wt, ids, n, d);
                result(memcmp(o1, o2, (size_t)(n * d + GUARD) * sizeof(float)) == 0,
                       "embedding_quant %s n=%lld d=%lld [threads=%d]: not bit-exact", tr(wt)->name, (long long)n,
                       (long long)d, rlx_pool_threads());
                free(ids), free(o1), free(o2);
                tail_free(tt);
            }
    }
}

int main(void)
{
    const int native = rlx_cpu_isa();
    for (int isa = native; isa >= RLX_CPU_ISA_SCALAR; isa--) {
        if (isa == RLX_CPU_ISA_AVX512_BF16)
            continue; /* the same quant paths as AVX512 (AMX has its own GEMM: AMX-INT8) */
        rlx_cpu_isa_cap(isa);
        test_matmul_quant();
    }
    rlx_cpu_isa_cap(RLX_CPU_ISA_TOP);
    for (int t = 1; t <= 2; t++) {
        rlx_set_num_threads(t);
        test_embedding_quant();
    }
    rlx_set_num_threads(1);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
