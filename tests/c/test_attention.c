/*
 * test_attention.c - the cpu table's attention against the ref table (double-precision sums) at
 * the shapes the vector paths cut differently from test_kernels' cases (see attention.c):
 *   - head sizes of real models (64, 80, 96, 128, 256: the vector paths) and odd ones (40, 72,
 *     100: the portable loops), on every ISA this machine has (AMX, whose flash items take f16 /
 *     bf16 K / V with D % 32 == 0 on bf16 tiles, AVX-512, AVX2, scalar: RLX_CPU_ISA caps lowered
 *     one by one; valgrind hides AVX-512);
 *   - pasts and query counts on either side of the tiles' edges: 64-key blocks of the flash path
 *     and 64-key chunks of the decode path (four keys at a time, tails of 1-3), query blocks of
 *     ceil(128 / G) positions, windows that start inside a block;
 *   - thread counts: the flash path (S >= 8) gives the same bits at 1, 2 and 3 pool threads (each
 *     work item is one fixed sequence of operations whichever thread takes it); decode (S == 1)
 *     splits the keys over tasks by thread count and is checked against ref at each;
 *   - decode over a bucket (rows past n hidden by the mask) gives the bits of decode over n rows;
 *   - rows hidden from every query by a mask (the rows of a cache past its filled length) that
 *     hold NaN and inf: no path may let them into the output (a weight 0 times NaN is NaN).
 * Error: max |cpu - ref| / max |ref| <= 1e-4 (test_kernels' bound); NaN / inf must match exactly.
 * Prints one line per failure, then "N passed, M failed".
 */
#include "backends/cpu/cpu.h"
#include "backends/cpu/pool.h"
#include "backends/kernels.h"
#include "check.h"
#include "core/core.h"
#include "rlx/rlx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-4

static const struct rlx_kernels *CPU = &rlx_cpu_kernels, *REF = &rlx_ref_kernels;
static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rng_f(float lo, float hi) { return lo + (hi - lo) * (float)(rng_u32() & 0xFFFFFF) / (float)0x1000000; }

static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fputs("out of memory\n", stderr);
        exit(2);
    }
    return p;
}

/* n random values in [-1, 1) stored as kv_dtype */
static void *kv_buf(int64_t n, int dt)
{
    if (dt == RLX_F32) {
        float *f = xmalloc((size_t)n * sizeof *f);
        for (int64_t i = 0; i < n; i++) f[i] = rng_f(-1, 1);
        return f;
    }
    uint16_t *h = xmalloc((size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = dt == RLX_F16 ? rlx_f32_to_f16(rng_f(-1, 1)) : rlx_f32_to_bf16(rng_f(-1, 1));
    return h;
}

/* Element i of a K / V buffer set to NaN (i + odd even) or +inf (i + odd odd). */
static void poison(void *base, int dt, int64_t i, int odd)
{
    const float x = (i + odd) % 2 ? INFINITY : NAN;
    if (dt == RLX_F32)
        ((float *)base)[i] = x;
    else
        ((uint16_t *)base)[i] = dt == RLX_F16 ? rlx_f32_to_f16(x) : rlx_f32_to_bf16(x);
}

/* max |got - want| / max |want|; INFINITY when a NaN / inf does not match */
static double nerr(const float *got, const float *want, int64_t n)
{
    double maxd = 0.0, maxr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i])) {
            if (!(got[i] == want[i])) return INFINITY;
            continue;
        }
        const double d = fabs((double)got[i] - (double)want[i]);
        maxd = d > maxd ? d : maxd;
        maxr = fabs(want[i]) > maxr ? fabs(want[i]) : maxr;
    }
    return maxr > 0.0 ? maxd / maxr : maxd;
}

struct acase {
    int64_t S, P, Hq, Hkv, D, window;
    int causal, masks, dt;
    int64_t hidden; /* > 0: the last `hidden` rows hold NaN / inf and every query's masks hide them */
};

static const char *dt_name(int dt) { return dt == RLX_F32 ? "f32" : dt == RLX_F16 ? "f16" : "bf16"; }

/* Runs one case on both tables; with threads_bitwise, also at 1, 2 and 3 pool threads, which must
 * give the same bits. Masks: 1 an f32 mask (random penalties in [-2, 0], ~10% -inf), 2 a u8 mask
 * (~20% dropped), 3 both. */
static void run_case(struct acase c, int threads_bitwise)
{
    const int64_t T = c.P + c.S, n = c.S * c.Hq * c.D;
    float *q = xmalloc((size_t)n * sizeof *q);
    for (int64_t i = 0; i < n; i++) q[i] = rng_f(-1, 1);
    void *k = kv_buf(T * c.Hkv * c.D, c.dt), *v = kv_buf(T * c.Hkv * c.D, c.dt);
    float *mf = NULL;
    uint8_t *mu = NULL;
    if (c.masks & 1) {
        mf = xmalloc((size_t)(c.S * T) * sizeof *mf);
        for (int64_t i = 0; i < c.S * T; i++) mf[i] = rng_u32() % 10 == 0 ? -INFINITY : rng_f(-2, 0);
    }
    if (c.masks & 2) {
        mu = xmalloc((size_t)(c.S * T));
        for (int64_t i = 0; i < c.S * T; i++) mu[i] = rng_u32() % 5 != 0;
    }
    for (int64_t j = T - c.hidden; c.hidden > 0 && j < T; j++) {
        for (int64_t i = 0; i < c.S; i++) {
            if (mf) mf[i * T + j] = -INFINITY;
            if (mu) mu[i * T + j] = 0;
        }
        for (int64_t e = 0; e < c.Hkv * c.D; e++) {
            poison(k, c.dt, j * c.Hkv * c.D + e, 0);
            poison(v, c.dt, j * c.Hkv * c.D + e, 1);
        }
    }
    struct rlx_attn_args a = {
        .q = q,
        .k = k,
        .v = v,
        .kv_dtype = c.dt,
        .mask_f32 = mf,
        .mask_u8 = mu,
        .S = c.S,
        .T = T,
        .Hq = c.Hq,
        .Hkv = c.Hkv,
        .D = c.D,
        .scale = 2.0f / sqrtf((float)c.D),
        .causal = c.causal,
        .window = c.window,
    };
    size_t ns = REF->attention_scratch(&a);
    for (int t = 1; t <= 3; t++) {
        rlx_set_num_threads(t);
        const size_t s = CPU->attention_scratch(&a);
        ns = s > ns ? s : ns;
    }
    float *scratch = xmalloc(ns * sizeof *scratch), *want = xmalloc((size_t)n * sizeof *want);
    float *got = xmalloc((size_t)n * sizeof *got), *first = xmalloc((size_t)n * sizeof *first);
    a.scratch = scratch;
    a.out = want;
    REF->attention(&a);
    const int tmax = threads_bitwise ? 3 : 1;
    for (int t = 1; t <= tmax; t++) {
        rlx_set_num_threads(threads_bitwise ? t : 2);
        for (size_t i = 0; i < ns; i++) scratch[i] = 3.0e38f; /* garbage a kernel must not read before writing */
        for (int64_t i = 0; i < n; i++) got[i] = NAN;
        a.out = got;
        CPU->attention(&a);
        const double e = nerr(got, want, n);
        CHECK(e <= TOL,
              "attention isa=%d threads=%d S=%lld P=%lld Hq=%lld Hkv=%lld D=%lld causal=%d window=%lld masks=%d "
              "kv=%s hidden=%lld: error %.3g",
              rlx_cpu_isa(), rlx_pool_threads(), (long long)c.S, (long long)c.P, (long long)c.Hq, (long long)c.Hkv,
              (long long)c.D, c.causal, (long long)c.window, c.masks, dt_name(c.dt), (long long)c.hidden, e);
        if (t == 1)
            memcpy(first, got, (size_t)n * sizeof *got);
        else
            CHECK(memcmp(first, got, (size_t)n * sizeof *got) == 0,
                  "attention isa=%d S=%lld P=%lld D=%lld kv=%s: %d threads differ from 1 thread", rlx_cpu_isa(),
                  (long long)c.S, (long long)c.P, (long long)c.D, dt_name(c.dt), t);
    }
    free(q), free(k), free(v), free(mf), free(mu), free(scratch), free(want), free(got), free(first);
}

/* Real models' head sizes and odd ones, at the tiles' edges. */
static void test_head_sizes_and_edges(int vg)
{
    const int64_t Ds[] = {64, 80, 96, 128, 256, 40, 72, 100};
    const int64_t Hs[][2] = {{8, 2}, {6, 2}, {4, 4}, {16, 8}, {14, 2}}; /* G = 4, 3, 1, 2, 7 */
    /* (S, P): decode chunks (64 keys) +-1, four-key tails; flash key blocks (64) and query blocks
     * (ceil(128 / G): 32, 43, 128, 64, 19 rows) cut exactly and one past */
    const int64_t SP[][2] = {{1, 63},  {1, 64},  {1, 65},   {1, 258},  {8, 56},    {8, 57},  {31, 97},
                             {64, 64}, {65, 63}, {43, 130}, {44, 129}, {129, 127}, {19, 200}};
    const int nsp = (int)(sizeof SP / sizeof SP[0]);
    int idx = 0;
    for (int di = 0; di < 8; di++)
        for (int si = 0; si < nsp; si++, idx++) {
            if (vg && idx % 4) continue;
            const int hi = (di + si) % 5;
            struct acase c = {.S = SP[si][0],
                              .P = SP[si][1],
                              .Hq = Hs[hi][0],
                              .Hkv = Hs[hi][1],
                              .D = Ds[di],
                              .causal = 1,
                              .dt = idx % 3 == 0   ? RLX_F32
                                    : idx % 3 == 1 ? RLX_F16
                                                   : RLX_BF16};
            if (c.D == 256 && c.S > 64) c.S = 40; /* keep the ref's double sums quick */
            run_case(c, 0);
            /* the same shape with a window starting inside a block, masks, or not causal */
            c.window = (idx % 4 == 0) ? 0 : (idx % 4 == 1) ? 65 : (idx % 4 == 2) ? 1 : 100;
            c.masks = idx % 4;
            c.causal = idx % 5 != 0;
            run_case(c, 0);
        }
}

/* The flash path at 1, 2 and 3 threads: the same bits; decode and the sgemm path at each count
 * against ref. */
static void test_threads(int vg)
{
    const struct acase cs[] = {
        {.S = 70, .P = 200, .Hq = 16, .Hkv = 8, .D = 128, .causal = 1, .dt = RLX_F16},
        {.S = 129, .P = 0, .Hq = 8, .Hkv = 2, .D = 64, .causal = 1, .dt = RLX_BF16},
        {.S = 33, .P = 300, .Hq = 6, .Hkv = 2, .D = 80, .causal = 1, .window = 100, .masks = 3, .dt = RLX_F32},
        {.S = 20, .P = 100, .Hq = 4, .Hkv = 2, .D = 72, .causal = 1, .dt = RLX_F32}, /* portable (odd D) */
        {.S = 1, .P = 4000, .Hq = 16, .Hkv = 8, .D = 128, .causal = 1, .dt = RLX_F16},
        {.S = 1, .P = 3000, .Hq = 32, .Hkv = 8, .D = 64, .causal = 1, .masks = 1, .dt = RLX_BF16},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        if (vg && i % 2) continue;
        /* bitwise where the split does not depend on the thread count: the flash path (S >= 8 on a
         * vector ISA); decode (S == 1) splits its keys by thread count, and the sgemm path's bits
         * depend on OpenBLAS's thread count (seen on a Zen 5 EPYC: OpenBLAS 0.3.21 with 1 thread
         * against 2), so there each count is checked against ref */
        if (cs[i].S >= 8 && cs[i].D % 16 == 0 && rlx_cpu_isa() >= RLX_CPU_ISA_AVX2)
            run_case(cs[i], 1);
        else
            for (int t = 1; t <= 3; t++) {
                rlx_set_num_threads(t);
                run_case(cs[i], 0);
            }
    }
}

/* The flash path on AMX-BF16 tiles (attention_amx.c), which takes calls of S x T >= 2^18 only (the
 * shapes above are smaller): prefills past that at its edges (query blocks cut in the middle, G = 4,
 * 3, 2, 1), windows and both masks, rows a u8 mask hides holding NaN / inf, f16 and bf16, and K / V
 * packed for groups of kv heads within 16 MiB (3, 3 and 2 heads at T = 4164); the same bits at 1, 2
 * and 3 threads. Only where the machine has AMX (the f32 items' shapes are covered above). */
static void test_amx_prefills(void)
{
    if (rlx_cpu_isa() != RLX_CPU_ISA_AMX) return;
    const struct acase cs[] = {
        {.S = 512, .P = 0, .Hq = 8, .Hkv = 2, .D = 64, .causal = 1, .dt = RLX_F16},
        {.S = 520, .P = 20, .Hq = 6, .Hkv = 2, .D = 96, .causal = 1, .window = 100, .masks = 3, .dt = RLX_BF16},
        {.S = 300, .P = 900, .Hq = 8, .Hkv = 4, .D = 128, .causal = 1, .dt = RLX_F16},
        {.S = 520, .P = 150, .Hq = 8, .Hkv = 2, .D = 64, .causal = 1, .masks = 2, .dt = RLX_F16, .hidden = 37},
        {.S = 512, .P = 40, .Hq = 4, .Hkv = 4, .D = 32, .causal = 0, .masks = 1, .dt = RLX_BF16},
        {.S = 64, .P = 4100, .Hq = 16, .Hkv = 8, .D = 128, .causal = 1, .dt = RLX_F16},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) run_case(cs[i], i == 2 || i == 5);
}

/* Rows a u8 mask hides from every query (the rows of a cache past its filled length) holding
 * NaN / inf: the ref never reads them, so neither may any vector path (decode, flash) nor the
 * portable decode and per-pair paths (1 < S < 8). Not checked: an f32 mask alone (-inf added to
 * a NaN score is NaN, in the ref too: kv.h's rows past the length are finite), and the portable
 * prefill (sgemm multiplies a hidden row by its weight 0; attention.c's header says so). */
static void test_hidden_rows(int vg)
{
    const int64_t Ss[] = {1, 3, 20, 70}, Ds[] = {64, 72};
    int idx = 0;
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 2; di++)
            for (int dt = RLX_F32; dt <= RLX_BF16; dt++)
                for (int masks = 2; masks <= 3; masks++, idx++) {
                    const int vector = Ds[di] % 16 == 0 && rlx_cpu_isa() >= RLX_CPU_ISA_AVX2;
                    if ((vg && idx % 3) || (Ss[si] >= 8 && !vector)) continue;
                    struct acase c = {.S = Ss[si],
                                      .P = 150,
                                      .Hq = 8,
                                      .Hkv = 2,
                                      .D = Ds[di],
                                      .causal = idx % 2,
                                      .window = idx % 5 == 0 ? 90 : 0,
                                      .masks = masks,
                                      .dt = dt,
                                      .hidden = 37};
                    run_case(c, 0);
                }
}

/* Decode over a bucket: T = n + extra rows, the extra ones hidden by the mask (f32 -inf or u8 0;
 * causal off, as a masked plan runs), gives the bits of decode over exactly n rows (causal, no
 * mask), at one thread (the split over tasks depends on T): a key's score and weight must not
 * depend on where its chunk ends (the last < 4 keys are scored alone). */
static void test_bucket_bitwise(int vg)
{
    const int64_t ns[] = {5, 38, 63, 66, 130}, Hq = 8, Hkv = 2;
    rlx_set_num_threads(1);
    int idx = 0;
    for (int ni = 0; ni < 5; ni++)
        for (int64_t extra = 1; extra <= 7; extra += 3)
            for (int D = 64; D <= 128; D += 64, idx++) {
                if (vg && idx % 3) continue;
                const int dt = idx % 3 == 0 ? RLX_F32 : idx % 3 == 1 ? RLX_F16 : RLX_BF16, u8 = idx % 2;
                const int64_t n = ns[ni], T = n + extra;
                float *q = xmalloc((size_t)(Hq * D) * sizeof *q), *mf = xmalloc((size_t)T * sizeof *mf);
                uint8_t *mu = xmalloc((size_t)T);
                for (int64_t i = 0; i < Hq * D; i++) q[i] = rng_f(-1, 1);
                for (int64_t j = 0; j < T; j++) mf[j] = j < n ? 0.0f : -INFINITY, mu[j] = j < n;
                void *k = kv_buf(T * Hkv * D, dt), *v = kv_buf(T * Hkv * D, dt);
                struct rlx_attn_args a = {.q = q,
                                          .k = k,
                                          .v = v,
                                          .kv_dtype = dt,
                                          .S = 1,
                                          .T = n,
                                          .Hq = Hq,
                                          .Hkv = Hkv,
                                          .D = D,
                                          .scale = 0.125f,
                                          .causal = 1};
                float *o1 = xmalloc((size_t)(Hq * D) * sizeof *o1), *o2 = xmalloc((size_t)(Hq * D) * sizeof *o2);
                size_t ns1 = CPU->attention_scratch(&a);
                a.T = T, a.causal = 0, a.mask_f32 = u8 ? NULL : mf, a.mask_u8 = u8 ? mu : NULL;
                const size_t ns2 = CPU->attention_scratch(&a);
                float *scratch = xmalloc((ns1 > ns2 ? ns1 : ns2) * sizeof *scratch);
                a.scratch = scratch, a.out = o2;
                CPU->attention(&a);
                a.T = n, a.causal = 1, a.mask_f32 = NULL, a.mask_u8 = NULL, a.out = o1;
                CPU->attention(&a);
                CHECK(memcmp(o1, o2, (size_t)(Hq * D) * sizeof *o1) == 0,
                      "decode isa=%d n=%lld D=%d kv=%s: %lld rows hidden by a%s mask change the bits", rlx_cpu_isa(),
                      (long long)n, D, dt_name(dt), (long long)extra, u8 ? " u8" : "n f32");
                free(q), free(mf), free(mu), free(k), free(v), free(o1), free(o2), free(scratch);
            }
}

int main(void)
{
    /* Under valgrind and ThreadSanitizer (which look for memory and thread errors, at 20-50x the
     * time) the smaller set of shapes, on one vector path: valgrind's AVX2, TSan's native. */
#ifdef __SANITIZE_THREAD__
    const int vg = 1 || under_valgrind();
#else
    const int vg = under_valgrind();
#endif
    const int native = rlx_cpu_isa();
    /* AMX (the flash items on bf16 tiles, attention_amx.c), AVX-512, AVX2, scalar: AVX512_BF16
     * takes the AVX-512 paths here */
    for (int isa = native; isa >= RLX_CPU_ISA_SCALAR; isa = isa == RLX_CPU_ISA_AMX ? RLX_CPU_ISA_AVX512 : isa - 1) {
        rlx_cpu_isa_cap(isa);
        test_head_sizes_and_edges(vg);
        test_threads(vg);
        test_hidden_rows(vg);
        test_bucket_bitwise(vg);
        if (!vg) test_amx_prefills(); /* the ref's double sums of its shapes take minutes under valgrind */
        if (vg) break;                /* one path (valgrind hides AVX-512); scalar is test_kernels' */
    }
    rlx_cpu_isa_cap(RLX_CPU_ISA_TOP);
    rlx_set_num_threads(1); /* joins the workers: no thread left for valgrind */
    return check_summary();
}
