/*
 * test_graph.c - the graph builder, the passes and the runtime from C, on both host devices:
 * a transformer-like block (matmul, rmsnorm, residual add, silu * gate) compiled with and
 * without fusion must agree with a direct scalar computation; symbols are inferred from input
 * shapes; memory is reused; bad shapes, dtypes, ids and missing bindings fail with statuses and
 * leave the plan usable; plans sharing one arena (a model's) each get their results, in the larger
 * plan's bytes, and a plan's results are refused once another ran. A weight store shared by
 * several plans is placed once (bytes counted on the ref device, which has memory of its own); a
 * state written by cache_write keeps its rows across runs; sizes that overflow are refused at
 * compile and at run. Runs under valgrind in `make test`.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/backend.h"
#include "backends/host.h"
#include "ir/graph.h"
#include "runtime/plan.h"
#include "rlx/rlx.h"

#include "check.h"

enum { D = 8, F = 12 };

/* h = x + silu(x @ Wg^T) * (x @ Wu^T) @ Wd^T ; y = rmsnorm(h) * w */
static struct rlx_graph *block_graph(void)
{
    struct rlx_graph *g;
    rlx_graph_create(&g);
    struct rlx_dim xs[2] = {rlx_dim_sym(RLX_SYM_SEQ), rlx_dim_const(D)};
    struct rlx_dim wgs[2] = {rlx_dim_const(F), rlx_dim_const(D)}, wds[2] = {rlx_dim_const(D), rlx_dim_const(F)};
    struct rlx_dim ws[1] = {rlx_dim_const(D)};
    int x, wg, wu, wd, w, a, b, s, m, dn, h, y;
    rlx_graph_input(g, "x", RLX_F32, 2, xs, &x);
    rlx_graph_param(g, "wg", RLX_F32, 2, wgs, &wg);
    rlx_graph_param(g, "wu", RLX_F32, 2, wgs, &wu);
    rlx_graph_param(g, "wd", RLX_F32, 2, wds, &wd);
    rlx_graph_param(g, "w", RLX_F32, 1, ws, &w);
    struct rlx_attrs tb = {.trans_b = 1}, norm = {.eps = 1e-5f};
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){x, wg}, &tb, &a);
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){x, wu}, &tb, &b);
    rlx_graph_op(g, RLX_OP_SILU, 1, (int[]){a}, NULL, &s);
    rlx_graph_op(g, RLX_OP_MUL, 2, (int[]){s, b}, NULL, &m);
    rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){m, wd}, &tb, &dn);
    rlx_graph_op(g, RLX_OP_ADD, 2, (int[]){x, dn}, NULL, &h);
    rlx_graph_op(g, RLX_OP_RMSNORM, 2, (int[]){h, w}, &norm, &y);
    rlx_graph_output(g, y, "y");
    rlx_graph_output(g, h, "h");
    return g;
}

static void reference(int seq, const float *x, const float *wg, const float *wu, const float *wd, const float *w,
                      float *y, float *h)
{
    for (int t = 0; t < seq; t++) {
        float m[F];
        for (int f = 0; f < F; f++) {
            double a = 0, b = 0;
            for (int k = 0; k < D; k++) a += x[t * D + k] * wg[f * D + k], b += x[t * D + k] * wu[f * D + k];
            m[f] = (float)(a / (1 + exp(-a)) * b);
        }
        double ss = 0;
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int f = 0; f < F; f++) acc += m[f] * wd[d * F + f];
            h[t * D + d] = (float)(x[t * D + d] + acc);
            ss += (double)h[t * D + d] * h[t * D + d];
        }
        double r = 1.0 / sqrt(ss / D + 1e-5);
        for (int d = 0; d < D; d++) y[t * D + d] = (float)(h[t * D + d] * r * w[d]);
    }
}

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* The block's params bound to p (the same weights every call: fixed seed). */
static void set_block_params(struct rlx_plan *p, const float *wg, const float *wu, const float *wd, const float *w)
{
    const char *names[] = {"wg", "wu", "wd", "w"};
    const float *data[] = {wg, wu, wd, w};
    for (int i = 0; i < 4; i++) {
        int idx;
        struct rlx_host_tensor t = {.data = data[i], .dtype = RLX_F32, .ndim = i == 3 ? 1 : 2};
        t.shape[0] = i == 2 ? D : (i == 3 ? D : F);
        t.shape[1] = i == 2 ? F : D;
        CHECK(rlx_plan_param_index(p, names[i], &idx) == RLX_OK && rlx_plan_set_param(p, idx, &t) == RLX_OK, "set %s",
              names[i]);
    }
}

/* Outputs bound to host memory: the same bits as read_output; on cpu (which wraps host memory)
 * written in place, so they leave the arena; on ref copied after the run, arena unchanged. The
 * binding lasts one run; a wrong size is refused and leaves the plan usable. */
static void test_bound_outputs(struct rlx_plan *p, const char *device, bool fuse)
{
    enum { SEQ = 5 };
    float x[SEQ * D], y[SEQ * D], h[SEQ * D], by[SEQ * D], bh[SEQ * D];
    for (int i = 0; i < SEQ * D; i++) x[i] = frand();
    struct rlx_host_tensor t = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {SEQ, D}};
    const size_t bytes = sizeof(float) * SEQ * D;
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "unbound run");
    const size_t arena = rlx_plan_unshared_bytes(p);
    rlx_plan_read_output(p, 0, y, bytes);
    rlx_plan_read_output(p, 1, h, bytes);
    CHECK(rlx_plan_bind_output(p, 0, by, bytes) == RLX_OK && rlx_plan_bind_output(p, 1, bh, bytes) == RLX_OK,
          "bind outputs");
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "bound run");
    CHECK(memcmp(by, y, bytes) == 0 && memcmp(bh, h, bytes) == 0, "%s fuse=%d: bound outputs == read_output", device,
          fuse);
    float again[SEQ * D];
    CHECK(rlx_plan_read_output(p, 0, again, bytes) == RLX_OK && memcmp(again, y, bytes) == 0, "read after bound run");
    const size_t bound_arena = rlx_plan_unshared_bytes(p);
    if (strcmp(device, "cpu") == 0)
        CHECK(bound_arena < arena, "cpu fuse=%d: bound outputs take no arena space (%zu < %zu)", fuse, bound_arena,
              arena);
    else
        CHECK(bound_arena == arena, "%s: arena unchanged (%zu == %zu)", device, bound_arena, arena);
    memset(by, 0, bytes);
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "run after the binding");
    CHECK(by[0] == 0.0f && rlx_plan_unshared_bytes(p) == arena, "the binding lasted one run");
    CHECK(rlx_plan_bind_output(p, 1, bh, bytes - 4) == RLX_OK && rlx_plan_set_input(p, 0, &t) == RLX_OK &&
              rlx_plan_run(p) == RLX_ERR_SHAPE && strstr(rlx_last_error(), "output 'h'"),
          "wrong bound size refused");
    CHECK(rlx_plan_bind_output(p, 7, bh, bytes) == RLX_ERR_INVALID, "output index checked");
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK && rlx_plan_run(p) == RLX_OK, "usable after a bad binding");
}

static void test_block(struct rlx_device *dev, bool fuse)
{
    const char *device = rlx_device_name(dev);
    struct rlx_graph *g = block_graph();
    struct rlx_compile_opts o = rlx_compile_opts_default();
    o.fuse = fuse;
    struct rlx_plan *p = NULL;
    CHECK(rlx_compile(g, dev, &o, &p) == RLX_OK, "compile %s fuse=%d", device, fuse);
    rlx_graph_free(g);
    if (!p) return;
    static float wg[F * D], wu[F * D], wd[D * F], w[D];
    for (int i = 0; i < F * D; i++) wg[i] = frand(), wu[i] = frand(), wd[i] = frand();
    for (int i = 0; i < D; i++) w[i] = 1 + frand();
    set_block_params(p, wg, wu, wd, w);
    for (int seq = 1; seq <= 9; seq += 4) { /* one plan, several SEQ */
        float x[9 * D], y[9 * D], h[9 * D], ry[9 * D], rh[9 * D];
        for (int i = 0; i < seq * D; i++) x[i] = frand() * 2;
        struct rlx_host_tensor t = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {seq, D}};
        CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK, "set x");
        CHECK(rlx_plan_run(p) == RLX_OK, "run %s seq=%d", device, seq);
        enum rlx_dtype dt;
        int nd;
        int64_t shape[RLX_MAX_DIMS];
        CHECK(rlx_plan_output_shape(p, 0, &dt, &nd, shape) == RLX_OK && nd == 2 && shape[0] == seq && shape[1] == D,
              "output shape");
        CHECK(rlx_plan_read_output(p, 0, y, sizeof(float) * (size_t)(seq * D)) == RLX_OK, "read y");
        CHECK(rlx_plan_read_output(p, 1, h, sizeof(float) * (size_t)(seq * D)) == RLX_OK, "read h");
        reference(seq, x, wg, wu, wd, w, ry, rh);
        double err = 0;
        for (int i = 0; i < seq * D; i++) err = fmax(err, fmax(fabs(y[i] - ry[i]), fabs(h[i] - rh[i])));
        CHECK(err < 1e-4, "%s fuse=%d seq=%d max err %g", device, fuse, seq, err);
    }
    CHECK(rlx_plan_planned_bytes(p) > 0 && rlx_plan_planned_bytes(p) < rlx_plan_unshared_bytes(p),
          "memory reused: %zu < %zu", rlx_plan_planned_bytes(p), rlx_plan_unshared_bytes(p));
    test_bound_outputs(p, device, fuse);
    /* errors leave the plan usable */
    float x[D] = {0};
    struct rlx_host_tensor bad = {.data = x, .dtype = RLX_I32, .ndim = 2, .shape = {1, D}};
    CHECK(rlx_plan_set_input(p, 0, &bad) == RLX_ERR_DTYPE, "wrong dtype rejected");
    bad.dtype = RLX_F32;
    bad.shape[1] = D + 1;
    CHECK(rlx_plan_set_input(p, 0, &bad) == RLX_OK && rlx_plan_run(p) == RLX_ERR_SHAPE, "wrong shape rejected");
    CHECK(rlx_plan_run(p) == RLX_ERR_INVALID, "missing input rejected");
    bad.shape[1] = D;
    CHECK(rlx_plan_set_input(p, 0, &bad) == RLX_OK && rlx_plan_run(p) == RLX_OK, "usable after errors");
    /* rlx_interrupt: runs stop with RLX_ERR_INTERRUPTED until the flag is cleared */
    rlx_interrupt();
    CHECK(rlx_interrupted() && rlx_plan_set_input(p, 0, &bad) == RLX_OK && rlx_plan_run(p) == RLX_ERR_INTERRUPTED &&
              strcmp(rlx_status_name(RLX_ERR_INTERRUPTED), "RLX_ERR_INTERRUPTED") == 0,
          "interrupted run");
    rlx_interrupt_clear();
    CHECK(!rlx_interrupted() && rlx_plan_set_input(p, 0, &bad) == RLX_OK && rlx_plan_run(p) == RLX_OK,
          "runs after clear: %s", rlx_last_error());
    rlx_plan_free(p);
}

static int log_count;
static void count_logs(enum rlx_log_level level, const char *msg, void *user)
{
    (void)level;
    if (msg && msg[0]) (*(int *)user)++;
}

/* The log callback hears about compiles and memory plans; none is installed by default. */
/* Runs p on seq random rows and checks y against the reference; returns the run's status. */
static rlx_status run_block(struct rlx_plan *p, int seq, const float *wg, const float *wu, const float *wd,
                            const float *w, const char *what)
{
    float x[9 * D], y[9 * D], ry[9 * D], rh[9 * D];
    for (int i = 0; i < seq * D; i++) x[i] = frand() * 2;
    struct rlx_host_tensor t = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {seq, D}};
    CHECK(rlx_plan_set_input(p, 0, &t) == RLX_OK, "set x (%s)", what);
    rlx_status s = rlx_plan_run(p);
    if (s != RLX_OK) return s;
    CHECK(rlx_plan_read_output(p, 0, y, sizeof(float) * (size_t)(seq * D)) == RLX_OK, "read y (%s)", what);
    reference(seq, x, wg, wu, wd, w, ry, rh);
    double err = 0;
    for (int i = 0; i < seq * D; i++) err = fmax(err, fabs(y[i] - ry[i]));
    CHECK(err < 1e-4, "%s: max err %g", what, err);
    return s;
}

/* Two plans sharing one arena (as a model's plans do): each run's results are right; the arena
 * is the larger need, not the sum; a plan's results are refused once the other ran, and readable
 * again after its own next run; a released arena is allocated again by the next run. On the host
 * backends the kernels' scratch is the arena's too, never freed with a plan (valgrind / ASan). */
static void test_shared_arena(struct rlx_device *dev)
{
    const char *device = rlx_device_name(dev);
    struct rlx_shared_arena arena = {0};
    struct rlx_plan *p[2] = {NULL, NULL};
    static float wg[F * D], wu[F * D], wd[D * F], w[D];
    for (int i = 0; i < F * D; i++) wg[i] = frand(), wu[i] = frand(), wd[i] = frand();
    for (int i = 0; i < D; i++) w[i] = 1 + frand();
    for (int k = 0; k < 2; k++) {
        struct rlx_graph *g = block_graph();
        struct rlx_compile_opts o = rlx_compile_opts_default();
        o.fuse = k;
        CHECK(rlx_compile(g, dev, &o, &p[k]) == RLX_OK, "compile %s", device);
        rlx_graph_free(g);
        if (!p[k]) return;
        rlx_plan_share_arena(p[k], &arena);
        set_block_params(p[k], wg, wu, wd, w);
        if (dev->be->plan_share_workspace) {
            const struct rlx_host_state *st = p[k]->be_state;
            CHECK(st->ws == &arena.ws && !st->own.data, "%s: plan %d's kernel scratch is the arena's", device, k);
        }
    }
    CHECK(run_block(p[0], 9, wg, wu, wd, w, "shared, plan 0, 9 rows") == RLX_OK, "%s run 0", device);
    const size_t big = rlx_plan_planned_bytes(p[0]);
    CHECK(arena.buf && arena.cap == big && arena.holder == p[0], "%s: the arena is plan 0's need (%zu, %zu)", device,
          arena.cap, big);
    CHECK(run_block(p[1], 1, wg, wu, wd, w, "shared, plan 1, 1 row") == RLX_OK, "%s run 1", device);
    CHECK(arena.cap == big && rlx_plan_planned_bytes(p[1]) < big, "%s: a smaller run keeps the arena (%zu, %zu)",
          device, arena.cap, rlx_plan_planned_bytes(p[1]));
    float y[9 * D];
    CHECK(rlx_plan_read_output(p[0], 0, y, sizeof(float) * 9 * D) == RLX_ERR_STATE,
          "%s: plan 0's results refused after plan 1 ran", device);
    CHECK(run_block(p[0], 5, wg, wu, wd, w, "shared, plan 0 again") == RLX_OK, "%s run 0 again", device);
    rlx_shared_arena_release(dev, &arena);
    CHECK(!arena.buf && arena.cap == 0 && !arena.ws.data && !arena.ws.bytes, "%s: released", device);
    CHECK(run_block(p[1], 9, wg, wu, wd, w, "shared, after a release") == RLX_OK, "%s run after release", device);
    CHECK(arena.buf && arena.cap == rlx_plan_planned_bytes(p[1]), "%s: allocated again at the run's need", device);
    rlx_plan_free(p[1]);
    CHECK(arena.holder == NULL, "%s: a freed plan holds nothing", device);
    rlx_plan_free(p[0]);
    rlx_shared_arena_release(dev, &arena);
}

/* y (seq, QN) = x (seq, QK) @ W^T, W (QN, QK) of block type wt, on plan p; returns the status */
enum { QK = 1024, QN = 24, QSEQ = 40 };
static rlx_status run_quant(struct rlx_plan *p, int seq, const float *x, float *y)
{
    struct rlx_host_tensor t = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {seq, QK}};
    rlx_status s = rlx_plan_set_input(p, 0, &t);
    if (s == RLX_OK) s = rlx_plan_run(p);
    if (s == RLX_OK) s = rlx_plan_read_output(p, 0, y, sizeof(float) * (size_t)seq * QN);
    return s;
}

/* Two plans of a matmul over packed weights sharing one arena, and so one kernel scratch (the
 * quantised activations, and the GEMM's packed panels at QSEQ rows): run in turn at 1 and QSEQ
 * rows (the scratch grows, and may move, under the plan that ran before), each result bitwise a
 * plan of its own's on the same input (the oracle for the sharing; test_quant_kernels checks the
 * kernels against the ref table) and near the product of the dequantised weights in double (so
 * that both are not equally wrong). A stale scratch pointer is a read of freed memory: valgrind
 * and ASan run this file. */
static void test_shared_scratch_quant(struct rlx_device *dev, enum rlx_dtype wt)
{
    const char *device = rlx_device_name(dev);
    static float wf[QN * QK], wdq[QN * QK], x[QSEQ * QK], y[QSEQ * QN], yo[QSEQ * QN];
    static uint8_t wq[QN * QK * 2];
    for (int i = 0; i < QN * QK; i++) wf[i] = frand();
    CHECK(rlx_quantize(wt, wf, QN, QK, wq) == RLX_OK, "quantize: %s", rlx_last_error());
    rlx_dtype_traits(wt)->to_f32(wdq, wq, QN * QK);
    struct rlx_plan *p[3] = {NULL, NULL, NULL}; /* 0, 1 sharing; 2 alone, the oracle */
    struct rlx_shared_arena arena = {0};
    for (int k = 0; k < 3; k++) {
        struct rlx_graph *g;
        rlx_graph_create(&g);
        int xi, wi, yi;
        rlx_graph_input(g, "x", RLX_F32, 2, (struct rlx_dim[]){rlx_dim_sym(RLX_SYM_SEQ), rlx_dim_const(QK)}, &xi);
        rlx_graph_param(g, "w", wt, 2, (struct rlx_dim[]){rlx_dim_const(QN), rlx_dim_const(QK)}, &wi);
        rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){xi, wi}, &(struct rlx_attrs){.trans_b = 1}, &yi);
        rlx_graph_output(g, yi, "y");
        struct rlx_compile_opts o = rlx_compile_opts_default();
        CHECK(rlx_compile(g, dev, &o, &p[k]) == RLX_OK, "compile %s: %s", device, rlx_last_error());
        rlx_graph_free(g);
        if (!p[k]) goto out;
        if (k < 2) rlx_plan_share_arena(p[k], &arena);
        int idx;
        struct rlx_host_tensor t = {.data = wq, .dtype = wt, .ndim = 2, .shape = {QN, QK}};
        CHECK(rlx_plan_param_index(p[k], "w", &idx) == RLX_OK && rlx_plan_set_param(p[k], idx, &t) == RLX_OK,
              "set w (%s)", device);
    }
    const int seqs[] = {1, QSEQ, 1, 7, QSEQ};
    for (int r = 0; r < 5; r++) {
        const int seq = seqs[r], k = r % 2;
        for (int i = 0; i < seq * QK; i++) x[i] = frand() * 2;
        CHECK(run_quant(p[k], seq, x, y) == RLX_OK && run_quant(p[2], seq, x, yo) == RLX_OK, "%s %s run %d: %s", device,
              rlx_dtype_name(wt), r, rlx_last_error());
        CHECK(memcmp(y, yo, sizeof(float) * (size_t)seq * QN) == 0,
              "%s %s run %d (plan %d, %d rows): bitwise the unshared plan's", device, rlx_dtype_name(wt), r, k, seq);
        /* test_quant_kernels' bound: the cpu rounds each block of bs activations to 8 bits, at most
         * A (1 + 2^-14) / 254 per element (A: the block's largest |x|), and its f32 sums add gamma A
         * (|Ws| + |Wz|) per element, the scaled part and the offset / minimum taken apart; here
         * |Ws| + |Wz| <= 3 max |W| of the block (either part at most the block's range) */
        const int64_t bs = wt == RLX_Q8_0 ? 32 : 256;
        const double gamma = (QK + 32) * 0x1p-23;
        double worst = 0;
        for (int m = 0; m < seq; m++)
            for (int n = 0; n < QN; n++) {
                double ref = 0, bound = 0;
                for (int b = 0; b < QK / bs; b++) {
                    double A = 0, wsum = 0, wmax = 0;
                    for (int64_t i = b * bs; i < (b + 1) * bs; i++) {
                        ref += (double)x[m * QK + i] * wdq[n * QK + i];
                        A = fmax(A, fabs(x[m * QK + i]));
                        wsum += fabs(wdq[n * QK + i]), wmax = fmax(wmax, fabs(wdq[n * QK + i]));
                    }
                    bound += A * (wsum * (1 + 0x1p-14) / 254 + gamma * 3 * (double)bs * wmax);
                }
                worst = fmax(worst, fabs(y[m * QN + n] - ref) / (bound + 1e-30));
            }
        CHECK(worst <= 1, "%s %s run %d: near the dequantised product (%g of the bound)", device, rlx_dtype_name(wt), r,
              worst);
    }
    if (dev->be->plan_share_workspace)
        CHECK(arena.ws.data && arena.ws.bytes > 0, "%s: the kernels' scratch is the arena's", device);
out:
    for (int k = 0; k < 3; k++) rlx_plan_free(p[k]);
    rlx_shared_arena_release(dev, &arena);
}

static void test_log_callback(struct rlx_device *cpu)
{
    rlx_set_log_callback(count_logs, &log_count);
    struct rlx_graph *g = block_graph();
    struct rlx_plan *p = NULL;
    CHECK(rlx_compile(g, cpu, NULL, &p) == RLX_OK && log_count >= 1, "a compile is logged (%d)", log_count);
    rlx_set_log_callback(NULL, NULL);
    int before = log_count;
    rlx_plan_free(p);
    CHECK(rlx_compile(g, cpu, NULL, &p) == RLX_OK && log_count == before, "no callback, no calls");
    rlx_plan_free(p);
    rlx_graph_free(g);
}

static void test_errors(struct rlx_device *cpu)
{
    struct rlx_graph *g;
    rlx_graph_create(&g);
    struct rlx_dim s2[2] = {rlx_dim_sym(RLX_SYM_SEQ), rlx_dim_const(4)}, s3[2] = {rlx_dim_const(5), rlx_dim_const(3)};
    int a, b, c, ids, tab, e;
    rlx_graph_input(g, "a", RLX_F32, 2, s2, &a);
    rlx_graph_param(g, "b", RLX_F32, 2, s3, &b);
    CHECK(rlx_graph_op(g, RLX_OP_MATMUL, 2, (int[]){a, b}, NULL, &c) == RLX_ERR_SHAPE, "matmul K mismatch");
    CHECK(strstr(rlx_last_error(), "node 2 (matmul)") && strstr(rlx_last_error(), "(SEQ, 4)"), "message names node");
    CHECK(rlx_graph_node_count(g) == 2, "failed add leaves graph unchanged");
    CHECK(rlx_graph_input(g, "a", RLX_F32, 2, s2, &c) == RLX_ERR_INVALID, "duplicate name");
    struct rlx_dim is[1] = {rlx_dim_sym(RLX_SYM_SEQ)};
    rlx_graph_input(g, "ids", RLX_I32, 1, is, &ids);
    rlx_graph_param(g, "tab", RLX_F32, 2, s3, &tab);
    CHECK(rlx_graph_op(g, RLX_OP_EMBEDDING, 2, (int[]){tab, ids}, NULL, &e) == RLX_OK, "embedding");
    rlx_graph_output(g, e, "e");
    struct rlx_plan *p;
    struct rlx_device *nope = NULL;
    CHECK(rlx_device_open("nope", &nope) == RLX_ERR_INVALID && nope == NULL && strstr(rlx_last_error(), "cpu,ref"),
          "unknown device names the ones compiled in");
    CHECK(rlx_compile(g, NULL, NULL, &p) == RLX_ERR_INVALID, "no device");
    CHECK(rlx_compile(g, cpu, NULL, &p) == RLX_OK, "compile");
    float t[15] = {0};
    struct rlx_host_tensor tt = {.data = t, .dtype = RLX_F32, .ndim = 2, .shape = {5, 3}};
    int32_t idv[3] = {0, 5, 1};
    struct rlx_host_tensor it = {.data = idv, .dtype = RLX_I32, .ndim = 1, .shape = {3}};
    int pi, ii;
    rlx_plan_param_index(p, "tab", &pi);
    rlx_plan_input_index(p, "ids", &ii);
    CHECK(rlx_plan_run(p) == RLX_ERR_INVALID, "param not set");
    CHECK(rlx_plan_set_param(p, pi, &tt) == RLX_OK, "set tab");
    CHECK(rlx_plan_set_input(p, ii, &it) == RLX_OK && rlx_plan_run(p) == RLX_ERR_RANGE, "id out of range");
    CHECK(rlx_plan_input_index(p, "a", &ii) == RLX_OK, "unused input stays in the interface");
    rlx_plan_free(p);
    rlx_graph_free(g);
}

/* One weight store bound into two plans: on ref (memory of its own) each weight is uploaded once,
 * however many plans read it; both plans compute with it. */
static void test_weight_store(void)
{
    struct rlx_device *ref = NULL;
    CHECK(rlx_device_open("ref", &ref) == RLX_OK, "open ref");
    struct rlx_weights *ws = NULL;
    CHECK(rlx_weights_create(ref, &ws) == RLX_OK, "create a store");
    static float wg[F * D], wu[F * D], wd[D * F], w[D];
    for (int i = 0; i < F * D; i++) wg[i] = frand(), wu[i] = frand(), wd[i] = frand();
    for (int i = 0; i < D; i++) w[i] = 1 + frand();
    struct rlx_device_stats st0, st1, st2;
    rlx_device_stats(ref, &st0);
    struct rlx_host_tensor tg = {.data = wg, .dtype = RLX_F32, .ndim = 2, .shape = {F, D}};
    struct rlx_host_tensor tu = tg, td = {.data = wd, .dtype = RLX_F32, .ndim = 2, .shape = {D, F}};
    struct rlx_host_tensor tw = {.data = w, .dtype = RLX_F32, .ndim = 1, .shape = {D}};
    tu.data = wu;
    CHECK(rlx_weights_set(ws, "wg", &tg) == RLX_OK && rlx_weights_set(ws, "wu", &tu) == RLX_OK &&
              rlx_weights_set(ws, "wd", &td) == RLX_OK && rlx_weights_set(ws, "w", &tw) == RLX_OK,
          "store the weights");
    rlx_device_stats(ref, &st1);
    const uint64_t wbytes = sizeof wg + sizeof wu + sizeof wd + sizeof w;
    CHECK(st1.upload_bytes - st0.upload_bytes == wbytes && rlx_weights_bytes(ws) == wbytes &&
              rlx_weights_count(ws) == 4,
          "each weight uploaded once (%llu bytes)", (unsigned long long)(st1.upload_bytes - st0.upload_bytes));
    struct rlx_graph *g = block_graph();
    struct rlx_plan *p[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        CHECK(rlx_compile(g, ref, NULL, &p[i]) == RLX_OK && rlx_plan_bind_weights(p[i], ws) == RLX_OK, "plan %d", i);
    rlx_device_stats(ref, &st2);
    CHECK(st2.upload_bytes == st1.upload_bytes, "binding three plans uploads nothing");
    float x[2 * D], y0[2 * D], y1[2 * D], ry[2 * D], rh[2 * D];
    for (int i = 0; i < 2 * D; i++) x[i] = frand();
    struct rlx_host_tensor tx = {.data = x, .dtype = RLX_F32, .ndim = 2, .shape = {2, D}};
    for (int i = 0; i < 2; i++)
        CHECK(rlx_plan_set_input(p[i], 0, &tx) == RLX_OK && rlx_plan_run(p[i]) == RLX_OK &&
                  rlx_plan_read_output(p[i], 0, i ? y1 : y0, sizeof y0) == RLX_OK,
              "run plan %d", i);
    reference(2, x, wg, wu, wd, w, ry, rh);
    double err = 0;
    for (int i = 0; i < 2 * D; i++) err = fmax(err, fmax(fabs(y0[i] - ry[i]), fabs(y1[i] - ry[i])));
    CHECK(err < 1e-4 && memcmp(y0, y1, sizeof y0) == 0, "both plans compute with the shared weights (err %g)", err);
    /* a weight the store lacks, or of another shape, is named */
    struct rlx_weights *partial = NULL;
    rlx_weights_create(ref, &partial);
    rlx_weights_set(partial, "wg", &tg);
    CHECK(rlx_plan_bind_weights(p[2], partial) == RLX_ERR_INVALID && strstr(rlx_last_error(), "'wu' is missing"),
          "missing weight named (%s)", rlx_last_error());
    rlx_weights_set(partial, "wu", &tw); /* a vector where a matrix belongs */
    rlx_weights_set(partial, "wd", &td);
    rlx_weights_set(partial, "w", &tw);
    CHECK(rlx_plan_bind_weights(p[2], partial) == RLX_ERR_SHAPE && strstr(rlx_last_error(), "'wu'"),
          "mis-shaped weight named (%s)", rlx_last_error());
    CHECK(rlx_plan_set_input(p[2], 0, &tx) == RLX_OK && rlx_plan_run(p[2]) == RLX_OK, "the plan keeps its binding");
    enum rlx_dtype dt;
    CHECK(rlx_weights_info(ws, "nope", &dt, NULL, NULL) == RLX_ERR_INVALID, "info of a missing weight");
    for (int i = 0; i < 3; i++) rlx_plan_free(p[i]);
    rlx_weights_free(partial);
    rlx_weights_free(ws);
    rlx_graph_free(g);
    struct rlx_device_stats end;
    rlx_device_stats(ref, &end);
    CHECK(end.allocated_bytes == 0, "everything freed (%zu bytes left)", end.allocated_bytes);
    rlx_device_free(ref);
}

/* A weight read in place from a mapped file: the store names the file once it is modified in place;
 * a read of a page the file lost (SIGBUS) is absorbed by rlx_guard_fault (the handler a binding
 * installs) and the store's check then fails; memory outside every store is not rlx's. */
static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    if (!rlx_guard_fault(info->si_addr)) signal(sig, SIG_DFL);
}

static void test_mapped_file(struct rlx_device *cpu)
{
    char path[] = "/tmp/rlx-test-mapped-XXXXXX";
    int fd = mkstemp(path);
    const long page = sysconf(_SC_PAGESIZE);
    const size_t bytes = 4 * (size_t)page;
    CHECK(fd >= 0 && ftruncate(fd, (off_t)bytes) == 0, "a file of four pages");
    float *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(map != MAP_FAILED, "mapped");
    struct stat st;
    fstat(fd, &st);
    struct rlx_weights *ws = NULL;
    rlx_weights_create(cpu, &ws);
    struct rlx_host_tensor t = {.data = map, .dtype = RLX_F32, .ndim = 1, .shape = {(int64_t)(bytes / 4)}};
    CHECK(rlx_weights_set(ws, "w", &t) == RLX_OK &&
              rlx_weights_add_source(ws, path, (uint64_t)st.st_dev, (uint64_t)st.st_ino, (int64_t)st.st_size,
                                     (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec) == RLX_OK &&
              rlx_weights_check(ws) == RLX_OK,
          "a mapped weight and its file");
    struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &old);
    CHECK(ftruncate(fd, page) == 0, "truncate to one page");
    CHECK(rlx_weights_check(ws) == RLX_ERR_IO && strstr(rlx_last_error(), "modified in place") &&
              strstr(rlx_last_error(), path),
          "the check names the file (%s)", rlx_last_error());
    volatile float *v = map;
    float sum = v[0] + v[bytes / 4 - 1]; /* the last page is gone: SIGBUS, absorbed; it reads 0 */
    CHECK(sum == 0 && rlx_weights_check(ws) == RLX_ERR_IO && strstr(rlx_last_error(), "truncated while"),
          "a faulting read is absorbed and the store refuses from then on (%s)", rlx_last_error());
    CHECK(!rlx_guard_fault((char *)map - page), "an address outside every store is not rlx's");
    sigaction(SIGBUS, &old, NULL);
    rlx_weights_free(ws);
    CHECK(!rlx_guard_fault(map), "a freed store's memory is not guarded any more");
    munmap(map, bytes);
    close(fd);
    unlink(path);
}

/* A state (a small "cache" of rows) bound per run: cache_write puts each run's rows at their
 * positions, attention reads every row written so far; rows survive between runs, and a position
 * outside the state is RLX_ERR_RANGE. */
static void test_state(struct rlx_device *dev)
{
    enum { R = 6, H = 1, HD = 4 };
    struct rlx_graph *g;
    rlx_graph_create(&g);
    struct rlx_dim seq = rlx_dim_sym(RLX_SYM_SEQ), past = rlx_dim_sym(RLX_SYM_PAST);
    struct rlx_dim rows = rlx_dim_add(&past, &seq);
    struct rlx_dim qs[3] = {seq, rlx_dim_const(H), rlx_dim_const(HD)},
                   cs[3] = {rows, rlx_dim_const(H), rlx_dim_const(HD)};
    struct rlx_dim ps[1] = {seq};
    int q, pos, kc, vc, kw, vw, a;
    rlx_graph_input(g, "q", RLX_F32, 3, qs, &q);
    rlx_graph_input(g, "pos", RLX_I32, 1, ps, &pos);
    CHECK(rlx_graph_state(g, "kc", RLX_F16, 3, cs, &kc) == RLX_OK &&
              rlx_graph_state(g, "vc", RLX_F16, 3, cs, &vc) == RLX_OK,
          "states");
    CHECK(rlx_graph_cache_write(g, q, q, pos, &kw) == RLX_ERR_INVALID, "cache_write into a non-state refused");
    CHECK(rlx_graph_cache_write(g, kc, q, pos, &kw) == RLX_OK && rlx_graph_cache_write(g, vc, q, pos, &vw) == RLX_OK,
          "cache writes");
    int bad;
    CHECK(rlx_graph_op(g, RLX_OP_CACHE_WRITE, 3, (int[]){kc, q, pos}, NULL, &bad) == RLX_ERR_INVALID,
          "cache_write is not a user op");
    struct rlx_attrs aa = {.scale = 0.5f, .causal = 1};
    CHECK(rlx_graph_op(g, RLX_OP_ATTENTION, 3, (int[]){q, kw, vw}, &aa, &a) == RLX_OK, "attention over the states");
    rlx_graph_output(g, a, "a");
    struct rlx_plan *p = NULL;
    CHECK(rlx_compile(g, dev, NULL, &p) == RLX_OK, "compile");
    rlx_graph_free(g);
    if (!p) return;
    struct rlx_buffer *kb = NULL, *vb = NULL;
    CHECK(rlx_dev_alloc(rlx_plan_device(p), R * H * HD * 2, &kb) == RLX_OK &&
              rlx_dev_alloc(rlx_plan_device(p), R * H * HD * 2, &vb) == RLX_OK,
          "state memory");
    int iq, ipos, ik, iv;
    rlx_plan_input_index(p, "q", &iq);
    rlx_plan_input_index(p, "pos", &ipos);
    CHECK(rlx_plan_state_of_node(p, kc, &ik) == RLX_OK && rlx_plan_state_of_node(p, vc, &iv) == RLX_OK,
          "state indices");
    /* q = k = v = rows of one-hot-ish values at positions 0..4, in two runs (3 then 2 rows) */
    float all[5 * HD];
    for (int i = 0; i < 5 * HD; i++) all[i] = (float)(i % 7) * 0.25f;
    float out[5 * HD];
    int starts[2] = {0, 3}, lens[2] = {3, 2};
    for (int r = 0; r < 2; r++) {
        int32_t pv[3];
        for (int i = 0; i < lens[r]; i++) pv[i] = starts[r] + i;
        struct rlx_host_tensor tq = {
            .data = all + starts[r] * HD, .dtype = RLX_F32, .ndim = 3, .shape = {lens[r], H, HD}};
        struct rlx_host_tensor tp = {.data = pv, .dtype = RLX_I32, .ndim = 1, .shape = {lens[r]}};
        CHECK(rlx_plan_set_input(p, iq, &tq) == RLX_OK && rlx_plan_set_input(p, ipos, &tp) == RLX_OK &&
                  rlx_plan_bind_symbol(p, RLX_SYM_PAST, starts[r]) == RLX_OK &&
                  rlx_plan_bind_state(p, ik, kb, 0) == RLX_OK && rlx_plan_bind_state(p, iv, vb, 0) == RLX_OK &&
                  rlx_plan_run(p) == RLX_OK,
              "run %d", r);
        rlx_plan_read_output(p, 0, out + starts[r] * HD, sizeof(float) * (size_t)(lens[r] * HD));
    }
    /* reference: causal attention of each row over rows 0..i, K/V rounded to f16 (exact here:
     * multiples of 0.25 below 2) */
    double err = 0;
    for (int i = 0; i < 5; i++) {
        double sc[5], m = -1e30, sum = 0;
        for (int j = 0; j <= i; j++) {
            sc[j] = 0;
            for (int e = 0; e < HD; e++) sc[j] += 0.5 * all[i * HD + e] * all[j * HD + e];
            m = fmax(m, sc[j]);
        }
        for (int j = 0; j <= i; j++) sum += sc[j] = exp(sc[j] - m);
        for (int e = 0; e < HD; e++) {
            double o = 0;
            for (int j = 0; j <= i; j++) o += sc[j] / sum * all[j * HD + e];
            err = fmax(err, fabs(o - out[i * HD + e]));
        }
    }
    CHECK(err < 1e-5, "%s: rows written by two runs read back by attention (err %g)", rlx_device_name(dev), err);
    /* position 6 is outside a state of 6 rows: refused, plan usable */
    int32_t pv[1] = {6};
    struct rlx_host_tensor tq = {.data = all, .dtype = RLX_F32, .ndim = 3, .shape = {1, H, HD}};
    struct rlx_host_tensor tp = {.data = pv, .dtype = RLX_I32, .ndim = 1, .shape = {1}};
    rlx_plan_set_input(p, iq, &tq);
    rlx_plan_set_input(p, ipos, &tp);
    rlx_plan_bind_symbol(p, RLX_SYM_PAST, 5);
    rlx_plan_bind_state(p, ik, kb, 0);
    rlx_plan_bind_state(p, iv, vb, 0);
    CHECK(rlx_plan_run(p) == RLX_ERR_RANGE, "a write outside the state refused (%s)", rlx_last_error());
    rlx_plan_set_input(p, iq, &tq);
    rlx_plan_set_input(p, ipos, &tp);
    rlx_plan_bind_symbol(p, RLX_SYM_PAST, 6);
    rlx_plan_bind_state(p, ik, kb, 0);
    rlx_plan_bind_state(p, iv, vb, 0);
    CHECK(rlx_plan_run(p) == RLX_ERR_RANGE && strstr(rlx_last_error(), "'kc' needs"), "a state too small refused (%s)",
          rlx_last_error());
    rlx_plan_set_input(p, iq, &tq);
    rlx_plan_set_input(p, ipos, &tp);
    rlx_plan_bind_symbol(p, RLX_SYM_PAST, 5);
    CHECK(rlx_plan_run(p) == RLX_ERR_INVALID && strstr(rlx_last_error(), "not bound"), "an unbound state refused");
    /* the past's length, which no input's shape gives, left unbound: refused naming a node of it */
    rlx_plan_set_input(p, iq, &tq);
    rlx_plan_set_input(p, ipos, &tp);
    rlx_plan_bind_state(p, ik, kb, 0);
    rlx_plan_bind_state(p, iv, vb, 0);
    CHECK(rlx_plan_run(p) == RLX_ERR_INVALID && strstr(rlx_last_error(), "symbol PAST is used by node"),
          "an unbound symbol refused (%s)", rlx_last_error());
    rlx_dev_free(rlx_plan_device(p), kb);
    rlx_dev_free(rlx_plan_device(p), vb);
    rlx_plan_free(p);
}

/* Sizes that do not fit: refused at compile (caps) and at run, never wrapped. */
static void test_overflow(struct rlx_device *cpu)
{
    struct rlx_graph *g;
    rlx_graph_create(&g);
    struct rlx_dim ss[2] = {rlx_dim_sym(RLX_SYM_SEQ), rlx_dim_sym(RLX_SYM_SEQ)};
    int x, y;
    rlx_graph_input(g, "x", RLX_F32, 2, ss, &x);
    rlx_graph_op(g, RLX_OP_SILU, 1, (int[]){x}, NULL, &y);
    rlx_graph_output(g, y, "y");
    struct rlx_compile_opts o = rlx_compile_opts_default();
    o.sym_cap[RLX_SYM_SEQ] = (int64_t)1 << 31;
    struct rlx_plan *p = NULL;
    CHECK(rlx_compile(g, cpu, &o, &p) == RLX_ERR_RANGE && p == NULL, "caps of 2^31 on (SEQ, SEQ) f32 refused (%s)",
          rlx_last_error());
    o.sym_cap[RLX_SYM_SEQ] = (int64_t)1 << 33;
    CHECK(rlx_compile(g, cpu, &o, &p) == RLX_ERR_RANGE, "caps of 2^33 refused");
    CHECK(rlx_compile(g, cpu, NULL, &p) == RLX_OK, "no caps: compiles");
    size_t est = 0;
    int64_t vals[RLX_MAX_SYMS] = {0};
    vals[RLX_SYM_SEQ] = (int64_t)1 << 32;
    CHECK(rlx_plan_estimate_bytes(p, vals, &est) == RLX_ERR_RANGE, "an estimate that overflows refused");
    size_t bytes;
    int64_t shape[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
    CHECK(rlx_shape_bytes(RLX_F32, 2, shape, &bytes) == RLX_ERR_RANGE, "shape bytes overflow refused");
    rlx_plan_free(p);
    rlx_graph_free(g);
}

/* Dtype traits: sizes of whole blocks, refusals of partial ones. */
static void test_dtypes(void)
{
    size_t b = 0;
    CHECK(rlx_dtype_bytes(RLX_F32, 3, &b) == RLX_OK && b == 12, "f32 x3");
    CHECK(rlx_dtype_bytes(RLX_Q8_0, 64, &b) == RLX_OK && b == 68, "q8_0 x64 = two blocks of 34 bytes");
    CHECK(rlx_dtype_bytes(RLX_Q8_0, 48, &b) == RLX_ERR_INVALID && strstr(rlx_last_error(), "whole number of blocks"),
          "q8_0 x48 refused");
    CHECK(rlx_dtype_bytes(RLX_F32, -1, &b) == RLX_ERR_INVALID, "negative count refused");
    CHECK(rlx_dtype_bytes((enum rlx_dtype)99, 1, &b) == RLX_ERR_DTYPE, "unknown dtype refused");
    int64_t shape[2] = {3, 48};
    CHECK(rlx_shape_bytes(RLX_Q8_0, 2, shape, &b) == RLX_ERR_SHAPE, "q8_0 rows of 48 refused");
    int named = 0;
    for (int dt = 0; dt < RLX_DTYPE_COUNT; dt++) {
        const struct rlx_dtype_traits *t = rlx_dtype_traits((enum rlx_dtype)dt);
        enum rlx_dtype back;
        named += t && t->name && t->block_size >= 1 && t->type_size >= 1 && t->to_f32 &&
                 rlx_dtype_parse(t->name, &back) == RLX_OK && back == (enum rlx_dtype)dt;
    }
    CHECK(named == RLX_DTYPE_COUNT && rlx_dtype_traits(RLX_DTYPE_COUNT) == NULL, "every dtype row filled and parsed");
    /* q8_0 dequantisation: d = 0.5 (f16 0x3800), q = -3, 7 -> -1.5, 3.5 */
    unsigned char blk[34] = {0x00, 0x38};
    blk[2] = (unsigned char)(signed char)-3;
    blk[3] = 7;
    float f[32];
    rlx_dtype_traits(RLX_Q8_0)->to_f32(f, blk, 32);
    CHECK(f[0] == -1.5f && f[1] == 3.5f && f[2] == 0.0f, "q8_0 to f32 (%g %g)", f[0], f[1]);
}

int main(void)
{
    srand(1);
    const char *names[] = {"cpu", "ref"};
    struct rlx_device *devs[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        CHECK(rlx_device_open(names[d], &devs[d]) == RLX_OK, "open %s", names[d]);
        for (int f = 0; f < 2; f++) test_block(devs[d], f);
        test_state(devs[d]);
        test_shared_arena(devs[d]);
        test_shared_scratch_quant(devs[d], RLX_Q8_0);
        test_shared_scratch_quant(devs[d], RLX_Q4_K);
    }
    test_errors(devs[0]);
    test_log_callback(devs[0]);
    test_weight_store();
    test_mapped_file(devs[0]);
    test_overflow(devs[0]);
    test_dtypes();
    for (int d = 0; d < 2; d++) rlx_device_free(devs[d]);
    rlx_set_num_threads(1); /* joins the pool's workers */
    return check_summary();
}
